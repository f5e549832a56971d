"""GpuInferenceFleet: real-time model serving on EC2 that stays predictable under load.

The plan (``plan_inference``) picks the instance, how its devices are split into model replicas (one server container
per replica, each tensor-parallel over its own devices), each replica's concurrency cap and the per-instance
concurrency; this construct turns it into an Auto Scaling group behind an internal Application Load Balancer, with a health
check that proves the model answers, scaling on what users feel, a warm pool for fast starts, deployments that
never mix model versions behind one target group, and a dashboard and alarms. See docs/gpu-inference-fleet.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from aws_cdk import (
    Annotations,
    ArnFormat,
    Aws,
    Duration,
    Names,
    RemovalPolicy,
    Stack,
    Token,
)
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_certificatemanager as acm
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import aws_sns as sns
from aws_cdk import aws_wafv2 as wafv2
from aws_cdk import custom_resources as cr
from constructs import Construct, IConstruct

from genai_constructs.errors import ConfigurationError, GenaiConstructsError
from genai_constructs.fleets import _launch, _region
from genai_constructs.fleets.rollout import NO_RELEASE_YET, BlueGreenRollout, RolloutPolicy, RolloutSlot
from genai_constructs.monitoring import (
    InferenceAlarmThresholds,
    InferenceFleetAlarmFactory,
    InferenceFleetMetricFactory,
    inference_fleet_segment,
)
from genai_constructs.monitoring.alarms import P99_LATENCY_FACTOR
from genai_constructs.network import PrivateDataPath
from genai_constructs.network import _checks as checks
from genai_constructs.planner import estimate, load_catalog, plan_inference
from genai_constructs.planner.deployment import (  # the plan's cost prices the same volumes and warm pool
    INFERENCE_ROOT_VOLUME_IOPS as ROOT_VOLUME_IOPS,
)
from genai_constructs.planner.deployment import (
    INFERENCE_ROOT_VOLUME_THROUGHPUT_MIBPS as ROOT_VOLUME_THROUGHPUT_MIBPS,
)
from genai_constructs.planner.deployment import SCALE_OUT_ROOM, WARM_POOL_MIN_SIZE
from genai_constructs.planner.estimate import tensor_parallel_ranks
from genai_constructs.planner.plans import InferencePlan
from genai_constructs.planner.server_settings import kv_gib_one_request
from genai_constructs.planner.startup import StartupEstimate, time_to_serving
from genai_constructs.workload import ModelArtifact, ModelShape, RealtimeTraffic

_NAME = "GpuInferenceFleet"

# ---- Defaults, each with its reason ---------------------------------------------------------------------------------
DEFAULT_SERVER_PORT = 8000
"""vLLM's OpenAI-compatible server listens on 8000 by default."""
DEFAULT_HEALTH_PORT = 8081
"""The health sidecar's port (genai_constructs.runtime.health_sidecar.DEFAULT_PORT)."""
DEFAULT_UPSTREAM_PORT = 18000
"""The model server's port on the instance's loopback only (the container's server_port published on 127.0.0.1):
the request proxy listens on server_port and forwards here. Far from the usual 8000-8100 so that a custom
server_port does not collide with it."""
DEFAULT_HEALTH_PATH = "/healthz"
"""The sidecar's path: 200 only when a one-token completion answered within the probe timeout."""
HEALTH_PROBE_TIMEOUT = Duration.seconds(5)
"""The sidecar's probe timeout; a one-token completion on a loaded model takes well under a second."""
HEALTH_CHECK_TIMEOUT = Duration.seconds(12)
"""Above the sidecar's worst case (probe + progress scrape, each bounded by HEALTH_PROBE_TIMEOUT)."""
HEALTH_CHECK_INTERVAL = Duration.seconds(15)
"""Must exceed HEALTH_CHECK_TIMEOUT; with UNHEALTHY_THRESHOLD a wedged instance leaves rotation in 45 s."""
HEALTHY_THRESHOLD = 2
UNHEALTHY_THRESHOLD = 3
"""Three failed checks: one slow probe under a burst does not take an instance out."""
HEALTH_CHECK_GRACE_AFTER_HOOK = Duration.seconds(120)
"""The grace period starts only once the launch hook completes (EC2 Auto Scaling user guide, "Set the health check
grace period"), and the boot script completes it only after the health sidecar answers 200; what is left is the load
balancer's first healthy checks (HEALTHY_THRESHOLD x HEALTH_CHECK_INTERVAL = 30 s), with room to spare."""
INSTANCE_WARMUP = Duration.seconds(120)
"""An instance joins the group already serving (the launch hook waits for it); two one-minute datapoints later its
RequestsInFlight samples are representative, so scaling counts it from then on."""
LAUNCH_HOOK_MARGIN = 1.5
"""The launch hook's heartbeat timeout is the modelled cold start (planner.startup) times 1.5: the boot script sends
heartbeats while it works, so the timeout only matters when the script has died; then the instance is abandoned
and replaced after at most one and a half cold starts."""
DRAIN_MARGIN = 1.2
"""The drain covers the longest stream times 1.2: the p95 time per token is a target, and the slowest streams of a
loaded instance run somewhat slower than it while they finish."""
MIN_DRAIN = Duration.seconds(60)
"""Never drain for less than a minute, however short the traffic's streams: a health-check round and a retry."""
MAX_DEREGISTRATION_DELAY = Duration.seconds(3600)
"""Elastic Load Balancing's upper bound for deregistration_delay.timeout_seconds (0-3600 s)."""
MAX_IDLE_TIMEOUT = Duration.seconds(4000)
"""Elastic Load Balancing's upper bound for idle_timeout.timeout_seconds (1-4000 s)."""
KEEP_ALIVE_ABOVE_IDLE = Duration.seconds(60)
"""The instance's HTTP keep-alive (the request proxy's, and vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE behind it) must
exceed the load balancer's idle timeout, or the ALB reuses a connection the target has just closed and answers 502
(Elastic Load Balancing user guide, "Connection idle timeout": configure the application's idle timeout to be larger
than the load balancer's): the idle timeout + 60 s."""
SCALE_OUT_EVALUATION_MINUTES = 3
SCALE_OUT_DATAPOINTS = 2
"""Latency-driven scale-out after two bad minutes out of three: fast, but not on a single slow minute."""
LATENCY_STEP_FACTOR = 2.0
"""p95 TTFT or TPOT above its target adds one instance; above twice the target, two."""
INSTANCE_REFRESH_MIN_HEALTHY_PERCENT = 100
"""Never drop below the serving capacity while replacing instances (a refresh, or a wedged instance found by the
health check): launch the replacement first. Also the group's instance maintenance policy."""
INSTANCE_REFRESH_MAX_HEALTHY_PERCENT = 200
INSTANCE_REFRESH_CHECKPOINTS = (50, 100)
"""Pause at half the fleet so the alarms (and a human) can stop a bad version before it takes everything."""
INSTANCE_REFRESH_CHECKPOINT_DELAY = Duration.minutes(10)
DEFAULT_DELETION_PROTECTION = False
"""The internal load balancer holds no data and is recreated by a deploy; protection would make the stack
impossible to destroy without a manual step. Production stacks under NIST 800-53 or HIPAA may want True."""
_ACCESS_LOG_BUCKET_ACKNOWLEDGMENTS = {
    **{f"{rule}": ("This bucket is the destination of the load balancer's access logs; logging its own access into "
                   "itself would loop, and a second bucket would need the same exemption")
       for rule in ("AwsSolutions-S1", "NIST.800.53.R5-S3BucketLoggingEnabled", "HIPAA.Security-S3BucketLoggingEnabled")},
    **{f"{pack}-S3DefaultEncryptionKMS": ("ALB access-log delivery supports only SSE-S3 (AES-256) on the "
                                          "destination bucket, not SSE-KMS")
       for pack in ("NIST.800.53.R5", "HIPAA.Security")},
    **{f"{pack}-S3BucketReplicationEnabled": ("Access logs kept 90 days for incident review; a replica would double "
                                              "their cost for data that is not a system of record")
       for pack in ("NIST.800.53.R5", "HIPAA.Security")},
}
"""Findings on the access-log bucket, each with its reason."""
PLAIN_HTTP_FINDINGS: tuple[str, ...] = (
    "NIST.800.53.R5-ALBHttpToHttpsRedirection",
    "NIST.800.53.R5-ELBv2ACMCertificateRequired",
    "HIPAA.Security-ALBHttpToHttpsRedirection",
    "HIPAA.Security-ELBv2ACMCertificateRequired",
)
"""The cdk-nag findings a listener without a certificate brings (``allow_plain_http`` True or None), all on
``<fleet>/LoadBalancer/Listener/Resource``: the NIST 800-53 R5 and HIPAA Security packs want HTTP redirected to HTTPS
and an ACM certificate on every listener; AwsSolutions has none. Acknowledge them with
``GpuInferenceFleet.acknowledge_plain_http(reason)`` (docs/security.md)."""
ACCESS_LOG_PREFIX = "alb"
ACCESS_LOG_RETENTION = Duration.days(90)
"""Three months of ALB access logs covers incident reviews; S3 lifecycle deletes older objects."""
METRIC_NAMESPACE = "GenaiConstructs/Inference"
"""One namespace for every fleet's agent and sidecar metrics; the Fleet dimension tells fleets apart."""
FETCH_TIMEOUT = Duration.hours(1)
"""Downloading and verifying the largest catalog model (hundreds of GiB) fits in an hour."""
DEFAULT_IMAGE_ACCOUNT = "763104351884"
"""AWS Deep Learning Containers registry: private ECR, reachable through the VPC's ECR endpoints (no internet)."""
DEFAULT_IMAGE_REPOSITORY = "vllm"
DEFAULT_IMAGE_TAG = "0.13-gpu-py312-ec2"
"""The AWS vLLM DLC for EC2 (OpenAI-compatible server); pin another with image_tag."""
DEFAULT_SERVER_ENTRYPOINT = "python3"
DEFAULT_SERVER_ARGS: tuple[str, ...] = (
    "-m", "vllm.entrypoints.openai.api_server",
    "--model", "{model_dir}",
    "--served-model-name", "{served_model_name}",
    "--tensor-parallel-size", "{tensor_parallel_size}",
    "--max-num-seqs", "{max_num_seqs}",
    "--max-model-len", "{max_model_len}",
    "--gpu-memory-utilization", "{gpu_memory_utilization}",
    "--kv-cache-dtype", "{kv_cache_dtype}",
    "--port", "{port}",
)
"""vLLM with the plan's server settings (``plan.server``, one replica's): tensor-parallel degree, the cap on sequences
(--max-num-seqs), the longest request the traffic allows (--max-model-len: without it vLLM takes the model's own
maximum, whose KV cache for one sequence may not fit, and refuses to start) and the fraction of device memory the
estimator assumed (--gpu-memory-utilization), and a one-byte KV cache where the plan assumed one
(--kv-cache-dtype fp8 for fp8 models, else auto). Only flags every vLLM release since 0.4 accepts: an unknown flag stops
the server from starting."""
SERVER_ARG_PLACEHOLDERS = ("model_dir", "served_model_name", "tensor_parallel_size", "max_num_seqs", "max_model_len",
                           "gpu_memory_utilization", "kv_cache_dtype", "port")
"""What ``server_args`` may name in braces; the user data fills each from the plan (fleets/_launch.py)."""
PLAN_METADATA_KEY = "genai-constructs:plan"
"""Template metadata key on each Auto Scaling group: the plan figures the group was built from (JSON literals)."""
BLUE, GREEN = "Blue", "Green"
DEFAULT_ROLLOUT = RolloutPolicy()
"""Blue/green by default, for every fleet: 5, 25, 50, 100 % with a 10-minute bake (fleets/rollout.py)."""
ROLLOUT_READY_MARGIN = 2.0
"""The rollout waits for the new slot's targets up to twice the modelled cold start (its instance refresh, then the
launch through the warm pool and the launch hook): past that, something is wrong with the new version and traffic
stays where it is."""
_SDK_PROVIDER_ID = "AWS679f53fac002430cb0da5b7982bd2287"
"""Construct id of CDK's singleton AwsCustomResource provider function (aws-cdk-lib custom-resources)."""


@dataclass(frozen=True)
class _Slot:
    name: str
    artifact: ModelArtifact
    auto_scaling_group: autoscaling.AutoScalingGroup
    target_group: elbv2.ApplicationTargetGroup
    launch_template: ec2.LaunchTemplate


class GpuInferenceFleet(Construct):
    """A fleet of GPU (or Neuron) instances serving an OpenAI-compatible model server behind an internal ALB.

    :param network: the PrivateDataPath the fleet launches into (its private subnets and endpoints).
    :param model: the model served.
    :param traffic: the real-time traffic the fleet is planned for.
    :param model_artifact: where the weights and their sha256 manifest live; its ``version`` is the deployed version.
        A sequence is the fleet's **release history**, oldest first: the last entry is the version that serves, and
        release ``i`` lives in slot Blue when ``i`` is even, Green when odd (``slot_of_release``), so appending a
        version puts it in the idle slot and starts a blue/green rollout, with no slot to name (docs/rollouts.md).
        One ``ModelArtifact`` is a one-release history: Blue serves it, Green is idle.
    :param instance_type: override the planned instance type. Default: the plan's. An instance that cannot hold the
        model is an error naming the memory needed and available.
    :param min_instances: Default: the plan's (at least 2, across 2 AZs).
    :param max_instances: Default: the plan's, and at least ``min_instances + SCALE_OUT_ROOM``.
    :param image_repository: ECR repository of the server image. Default: the AWS vLLM Deep Learning Container
        (``DEFAULT_IMAGE_ACCOUNT``/``DEFAULT_IMAGE_REPOSITORY``); Neuron plans must name one.
    :param image_tag: Default: ``DEFAULT_IMAGE_TAG`` for the default repository; required with ``image_repository``.
    :param server_entrypoint: Default: ``DEFAULT_SERVER_ENTRYPOINT``.
    :param server_args: arguments after the image. Default: ``DEFAULT_SERVER_ARGS``. The placeholders in
        ``SERVER_ARG_PLACEHOLDERS`` (``{max_model_len}``, ``{max_num_seqs}``, ...) are filled in from the plan.
    :param server_port: Default: ``DEFAULT_SERVER_PORT``.
    :param server_environment: environment variables for the model server container (values may be tokens), e.g.
        a retrieval tier's ``PrivateDataPath.dns_entries(...)`` for ``ZonalClient.from_dns_entries``. Default: none.
    :param health_check_path: path of the health sidecar. Default: ``DEFAULT_HEALTH_PATH``.
    :param certificate: ACM certificate: the listener serves HTTPS on 443 with a TLS 1.2+ restricted policy.
    :param allow_plain_http: plain HTTP on 80 when no certificate is given. Default: None: without a certificate
        the listener serves HTTP inside the VPC and the construct warns (so the simplest call deploys); True says
        plain HTTP is intended (no warning); False makes a missing certificate an error.
    :param warm_pool: keep stopped, pre-loaded instances for fast scale-out. Default: True.
    :param spot: Spot instances. Default: False; not allowed with a warm pool.
    :param latency_is_the_product: place the fleet in a cluster placement group (one AZ). Default: False.
    :param green_model_artifact: the explicit form of a two-slot fleet: the version the green slot serves (with a
        release history, the construct derives it). Default: none: the green slot is the idle twin of blue.
    :param green_traffic_percent: with ``rollout=None`` only: a fixed share of requests for the green target
        group, 0-100. Default: 0.
    :param live_slot: the explicit form: the slot that should serve every request ("Blue" or "Green"). Changing it
        starts a blue/green rollout from the other slot (docs/rollouts.md). Default: None: the slot of the last
        release (Blue for one ``ModelArtifact``).
    :param rollout: how a new version takes traffic (steps, bake). Default: ``DEFAULT_ROLLOUT``: every fleet has two
        slots (Blue, Green) and the idle one costs nothing. None is the explicit opt-out, for a fleet that may mix
        versions while it refreshes (a development stack): one slot, no rollout machinery, a new version rolls in
        place by instance refresh; with ``green_model_artifact`` it keeps fixed weights (``green_traffic_percent``).
    :param health_check_grace_period: Default: ``HEALTH_CHECK_GRACE_AFTER_HOOK`` (the launch hook holds the
        instance until it serves, and the grace period starts after the hook).
    :param machine_image: pin an AMI. Default: the DLAMI from its public SSM parameter (see fleets/_launch.py).
    :param allow_from_vpc: admit the whole VPC CIDR to the listener. Default: True; else use ``connections``.
    :param notifications_topic: existing SNS topic for alarms and lifecycle notifications. Default: a new,
        KMS-encrypted topic.
    :param deletion_protection: the load balancer's deletion protection. Default: ``DEFAULT_DELETION_PROTECTION``.
    :param web_acl: a regional WAFv2 web ACL to associate with the load balancer. Default: none (internal ALB).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        network: PrivateDataPath,
        model: ModelShape,
        traffic: RealtimeTraffic,
        model_artifact: ModelArtifact | Sequence[ModelArtifact],
        instance_type: str | None = None,
        min_instances: int | None = None,
        max_instances: int | None = None,
        image_repository: ecr.IRepository | None = None,
        image_tag: str | None = None,
        server_entrypoint: str = DEFAULT_SERVER_ENTRYPOINT,
        server_args: Sequence[str] | None = None,
        server_port: int = DEFAULT_SERVER_PORT,
        server_environment: Mapping[str, str] | None = None,
        health_check_path: str = DEFAULT_HEALTH_PATH,
        certificate: acm.ICertificate | None = None,
        allow_plain_http: bool | None = None,
        warm_pool: bool = True,
        spot: bool = False,
        latency_is_the_product: bool = False,
        green_model_artifact: ModelArtifact | None = None,
        green_traffic_percent: int = 0,
        live_slot: str | None = None,
        rollout: RolloutPolicy | None = DEFAULT_ROLLOUT,
        health_check_grace_period: Duration | None = None,
        machine_image: ec2.IMachineImage | None = None,
        allow_from_vpc: bool = True,
        notifications_topic: sns.ITopic | None = None,
        deletion_protection: bool = DEFAULT_DELETION_PROTECTION,
        web_acl: wafv2.CfnWebACL | None = None,
    ) -> None:
        problems, bad = _argument_types(
            scope=scope, id=id, network=network, model=model, traffic=traffic, model_artifact=model_artifact,
            instance_type=instance_type, min_instances=min_instances, max_instances=max_instances,
            image_repository=image_repository, image_tag=image_tag, server_entrypoint=server_entrypoint,
            server_args=server_args, server_port=server_port, server_environment=server_environment,
            health_check_path=health_check_path, certificate=certificate, allow_plain_http=allow_plain_http,
            warm_pool=warm_pool, spot=spot, latency_is_the_product=latency_is_the_product,
            green_model_artifact=green_model_artifact, green_traffic_percent=green_traffic_percent,
            live_slot=live_slot, rollout=rollout,
            health_check_grace_period=health_check_grace_period, machine_image=machine_image,
            allow_from_vpc=allow_from_vpc, notifications_topic=notifications_topic,
            deletion_protection=deletion_protection, web_acl=web_acl)
        if "scope" in bad:  # nothing below can ask a stack for its region
            raise ConfigurationError(_NAME, problems)
        blue_artifact = cast(ModelArtifact, model_artifact)  # checked just below, or reported among the problems
        if "model_artifact" not in bad:
            blue_artifact, green_model_artifact, live_slot = _release_slots(
                tuple(model_artifact) if isinstance(model_artifact, (list, tuple)) else (cast(ModelArtifact,
                                                                                             model_artifact),),
                green_model_artifact=green_model_artifact, live_slot=live_slot, rollout=rollout, problems=problems)
        live_slot = BLUE if live_slot is None else live_slot
        plan = _validate(
            problems=problems, bad=bad,
            model=model, traffic=traffic, model_artifact=blue_artifact, instance_type=instance_type,
            min_instances=min_instances, max_instances=max_instances, image_repository=image_repository,
            image_tag=image_tag, server_port=server_port, health_check_path=health_check_path,
            certificate=certificate, allow_plain_http=allow_plain_http, warm_pool=warm_pool, spot=spot,
            green_model_artifact=green_model_artifact, green_traffic_percent=green_traffic_percent,
            live_slot=live_slot, rollout=rollout, server_args=server_args, server_environment=server_environment,
            region=_region.stack_region(scope),
        )
        super().__init__(scope, id)
        _region.warn_about_prices(self, plan_region=plan.region)
        _region.warn_about_quota(self, quota_warning=plan.quota.warning if plan.quota else None)
        self.plan: InferencePlan = plan
        self.server_environment: dict[str, str] = dict(server_environment or {})
        self.network = network
        self.min_instances = min_instances if min_instances is not None else plan.min_instances
        self.max_instances = max_instances if max_instances is not None else plan.max_instances
        if (max_instances is None and not Token.is_unresolved(self.min_instances)
                and not Token.is_unresolved(self.max_instances)):
            self.max_instances = max(self.max_instances, self.min_instances + SCALE_OUT_ROOM)
        self.fleet_name = Names.unique_resource_name(self, max_length=64, separator="-")
        self.drain: DrainTimes = drain_times(plan)
        """The deregistration delay, ALB idle timeout and keep-alive, sized from the traffic (``drain_times``)."""
        accelerator: _launch.AcceleratorKind = "neuron" if plan.is_neuron else "nvidia"

        if latency_is_the_product:
            Annotations.of(self).add_warning_v2(
                "genai-constructs:GpuInferenceFleetSingleAz",
                "latency_is_the_product=True: the fleet runs in one cluster placement group, so in one AZ; it trades "
                "the two-AZ spread for lower network jitter, and scale-out may fail with InsufficientInstanceCapacity")

        # ---- Shared resources: key, topic, logs, security groups, role --------------------------------------
        foundations = _launch.fleet_foundations(
            self, key_description=f"{_NAME} {self.node.path}: EBS root volumes, SNS topic, log group",
            topic_display_name=f"{_NAME} alarms and lifecycle notifications", notifications_topic=notifications_topic)
        self.encryption_key = foundations.encryption_key
        self.topic: sns.ITopic = foundations.topic
        self.log_group = foundations.log_group

        self.load_balancer_security_group = ec2.SecurityGroup(
            self, "LoadBalancerSecurityGroup", vpc=network.vpc, allow_all_outbound=False,
            description=f"{_NAME} internal load balancer")
        self.security_group = ec2.SecurityGroup(
            self, "InstanceSecurityGroup", vpc=network.vpc, allow_all_outbound=False,
            description=f"{_NAME} instances: the load balancer on the serving and health ports only")
        self.security_group.add_egress_rule(
            ec2.Peer.any_ipv4(), ec2.Port.tcp(443), network.instance_egress_description)
        self.security_group.connections.allow_from(
            self.load_balancer_security_group, ec2.Port.tcp(server_port), "Load balancer to the model server")
        self.security_group.connections.allow_from(
            self.load_balancer_security_group, ec2.Port.tcp(DEFAULT_HEALTH_PORT), "Load balancer health checks")

        repository = image_repository or ecr.Repository.from_repository_attributes(
            self, "DefaultImageRepository", repository_name=DEFAULT_IMAGE_REPOSITORY,
            repository_arn=f"arn:{Aws.PARTITION}:ecr:{Aws.REGION}:{DEFAULT_IMAGE_ACCOUNT}:repository/"
                           f"{DEFAULT_IMAGE_REPOSITORY}")
        self.image_uri = repository.repository_uri_for_tag(image_tag or DEFAULT_IMAGE_TAG)

        two_slots = rollout is not None or green_model_artifact is not None
        self.idle_twin = two_slots and green_model_artifact is None
        """True when the green slot only exists to receive the next release: it holds blue's version, idle at zero
        instances, with no scaling policies and no warm pool (so it costs nothing)."""
        artifacts = [blue_artifact] + ([green_model_artifact] if green_model_artifact else [])
        for artifact in artifacts:
            network.allow_bucket_name(artifact.bucket_name)
        # The health sidecar and the request proxy travel as a CDK asset: the proxy alone is larger than EC2's 16 KB
        # user data. The instances fetch the zip through the S3 gateway endpoint.
        self.runtime_code = s3_assets.Asset(
            self, "RuntimeCode", path=str(_launch.RUNTIME_DIR),
            exclude=["*", *(f"!{name}" for name in _launch.SERVING_RUNTIME_FILES)])
        network.allow_bucket_name(self.runtime_code.s3_bucket_name)
        # Physical names fixed at synthesis: the boot script completes the launch hook of its own group by name.
        self._group_names = {
            slot: _launch.auto_scaling_group_name(self, f"AutoScalingGroup{'' if slot == BLUE else slot}")
            for slot in ([BLUE, GREEN] if two_slots else [BLUE])}
        self.instance_policy = self._instance_policy(artifacts, repository)
        self.role = iam.Role(
            self, "InstanceRole", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            managed_policies=[self.instance_policy],
            description=f"{_NAME} instances: read the model, write logs and metrics, pull the image, SSM")

        # ---- Load balancer and listener ------------------------------------------------------------------------
        self.load_balancer = elbv2.ApplicationLoadBalancer(
            self, "LoadBalancer", vpc=network.vpc, vpc_subnets=network.subnet_selection, internet_facing=False,
            security_group=self.load_balancer_security_group, idle_timeout=self.drain.idle_timeout,
            drop_invalid_header_fields=True, deletion_protection=deletion_protection)
        load_balancer_findings: dict[str, str] = {}
        if not deletion_protection:
            for pack in ("NIST.800.53.R5", "HIPAA.Security"):
                load_balancer_findings[f"{pack}-ELBDeletionProtectionEnabled"] = (
                    "deletion_protection=False (DEFAULT_DELETION_PROTECTION): the internal load balancer holds no data "
                    "and the stack must be destroyable; pass deletion_protection=True to keep it")
        if web_acl is not None:
            wafv2.CfnWebACLAssociation(self, "WebAclAssociation", resource_arn=self.load_balancer.load_balancer_arn,
                                       web_acl_arn=web_acl.attr_arn)
        else:
            load_balancer_findings["NIST.800.53.R5-ALBWAFEnabled"] = (
                "An internal load balancer reached only from inside the VPC; pass web_acl= to attach a WAFv2 web ACL "
                "(e.g. with size and rate rules for prompts)")
        _launch.acknowledge(self.load_balancer, load_balancer_findings)
        self.access_log_bucket = s3.Bucket(
            self, "AccessLogs", encryption=s3.BucketEncryption.S3_MANAGED, enforce_ssl=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            versioned=True, removal_policy=RemovalPolicy.RETAIN,
            lifecycle_rules=[s3.LifecycleRule(expiration=ACCESS_LOG_RETENTION,
                                              noncurrent_version_expiration=Duration.days(1))])
        _launch.acknowledge(self.access_log_bucket, _ACCESS_LOG_BUCKET_ACKNOWLEDGMENTS)
        self._log_access(ACCESS_LOG_PREFIX)

        listener_port = 443 if certificate else 80
        self.listener_port = listener_port
        self.connections = ec2.Connections(
            security_groups=[self.load_balancer_security_group], default_port=ec2.Port.tcp(listener_port))
        if allow_from_vpc:
            self.connections.allow_default_port_from(ec2.Peer.ipv4(network.vpc_cidr), "Clients inside the VPC")

        # ---- One slot (blue) or two (blue, green): ASG + launch template + target group each -----------------
        grace = health_check_grace_period or HEALTH_CHECK_GRACE_AFTER_HOOK
        self.health_check_grace_period = grace
        self.time_to_serving: dict[str, StartupEstimate] = {"cold": time_to_serving(plan.weights_gib, "cold")}
        """The modelled seconds from launch (``cold``) and, with a warm pool, from resume (``warm``) to serving."""
        if warm_pool:
            self.time_to_serving["warm"] = time_to_serving(plan.weights_gib, "warm")
        self.launch_hook_heartbeat_s = math.ceil(self.time_to_serving["cold"].total_s * LAUNCH_HOOK_MARGIN)
        self.in_flight_target = float(plan.concurrency_per_instance)
        """Target tracking holds requests in flight or waiting per instance here: the plan's per-instance
        concurrency, which already keeps the traffic's headroom free below the server's cap (--max-num-seqs)."""
        placement_group = (
            ec2.PlacementGroup(self, "PlacementGroup", strategy=ec2.PlacementGroupStrategy.CLUSTER)
            if latency_is_the_product else None)
        self.placement_group = placement_group
        subnets = (ec2.SubnetSelection(subnets=network.subnets[:1]) if latency_is_the_product
                   else network.subnet_selection)

        self.rollout_policy: RolloutPolicy | None = rollout
        """The blue/green rollout policy (None: the explicit opt-out)."""
        self.live_slot = live_slot
        self.slots: list[_Slot] = []
        versions: list[tuple[str, ModelArtifact]] = [(BLUE, blue_artifact)]
        if two_slots:
            versions.append((GREEN, green_model_artifact or blue_artifact))
        for name, artifact in versions:
            self.slots.append(self._slot(
                name, artifact, plan=plan, accelerator=accelerator, server_entrypoint=server_entrypoint,
                server_args=tuple(server_args) if server_args is not None else DEFAULT_SERVER_ARGS,
                server_port=server_port, health_check_path=health_check_path, grace=grace,
                machine_image=machine_image, placement_group=placement_group, subnets=subnets,
                warm_pool=warm_pool, model=model))

        blue = self.slots[0]
        self.auto_scaling_group = blue.auto_scaling_group
        self.target_group = blue.target_group
        self.launch_template = blue.launch_template
        self.green_auto_scaling_group = self.slots[1].auto_scaling_group if len(self.slots) > 1 else None
        self.green_target_group = self.slots[1].target_group if len(self.slots) > 1 else None

        if self.green_target_group is not None and self.rollout_policy is not None:
            # The template's weights are where the first deploy starts (every request on blue) and never depend on
            # live_slot: a template change to them would move all traffic at once, in the middle of CloudFormation's
            # update. After the first deploy the rollout state machine owns the weights.
            action = elbv2.ListenerAction.weighted_forward([
                elbv2.WeightedTargetGroup(target_group=blue.target_group, weight=100),
                elbv2.WeightedTargetGroup(target_group=self.green_target_group, weight=0),
            ])
        elif self.green_target_group is not None:
            action = elbv2.ListenerAction.weighted_forward([
                elbv2.WeightedTargetGroup(target_group=blue.target_group, weight=100 - green_traffic_percent),
                elbv2.WeightedTargetGroup(target_group=self.green_target_group, weight=green_traffic_percent),
            ])
        else:
            action = elbv2.ListenerAction.forward([blue.target_group])
        if certificate is not None:
            self.listener = self.load_balancer.add_listener(
                "Listener", port=443, protocol=elbv2.ApplicationProtocol.HTTPS, certificates=[certificate],
                ssl_policy=elbv2.SslPolicy.TLS13_RES, default_action=action, open=False)
        else:
            if allow_plain_http is None:
                Annotations.of(self).add_warning_v2(
                    "genai-constructs:GpuInferenceFleetPlainHttp",
                    "no certificate given, so the listener serves plain HTTP inside the VPC: prompts and completions "
                    "cross the VPC unencrypted. Pass certificate= for HTTPS, allow_plain_http=True to state that plain "
                    "HTTP is intended, or allow_plain_http=False to make a missing certificate an error")
            self.listener = self.load_balancer.add_listener(
                "Listener", port=80, protocol=elbv2.ApplicationProtocol.HTTP, default_action=action, open=False)
        # ---- Measurement, scaling, alarms ---------------------------------------------------------------------
        self.metrics = InferenceFleetMetricFactory(
            load_balancer=self.load_balancer, target_groups=[s.target_group for s in self.slots],
            auto_scaling_group_names=[s.auto_scaling_group.auto_scaling_group_name for s in self.slots],
            namespace=METRIC_NAMESPACE, fleet=self.fleet_name)
        for slot in self.slots:
            if not (self.idle_twin and slot.name == GREEN):
                # The twin's version is blue's: scaling it on that version's load would start instances that get
                # no traffic. It scales once a release gives it a version of its own.
                self._scaling(slot, traffic)
        self.latency_target = Duration.millis(traffic.p95_ttft_ms)
        self.alarms = InferenceFleetAlarmFactory(self, metrics=self.metrics, topic=self.topic).create(
            InferenceAlarmThresholds(
                p99_time_to_first_token=Duration.millis(traffic.p95_ttft_ms * P99_LATENCY_FACTOR),
                p99_time_per_output_token=Duration.millis(traffic.tpot_target_ms * P99_LATENCY_FACTOR),
                gpu_memory_used_percent=None if plan.is_neuron else InferenceAlarmThresholds.gpu_memory_used_percent,
                gpu_underused_percent=None if plan.is_neuron else InferenceAlarmThresholds.gpu_underused_percent,
                min_instances=self.min_instances if not Token.is_unresolved(self.min_instances) else 2,
            ))
        alarm_factory = InferenceFleetAlarmFactory(self, metrics=self.metrics, topic=self.topic)
        self.slot_alarms: dict[str, dict[str, cw.Alarm]] = {
            slot.name: alarm_factory.create_slot(
                slot.name, model_version=slot.artifact.version, target_group=slot.target_group,
                p95_time_to_first_token=Duration.millis(traffic.p95_ttft_ms),
                p95_time_per_output_token=Duration.millis(traffic.tpot_target_ms),
                # The twin's version alarms would judge blue's requests a second time, under green's name.
                version_alarms=not (self.idle_twin and slot.name == GREEN))
            for slot in self.slots}
        """Each slot's own alarms (p95 TTFT and TPOT against the targets, its 5XX rate, unhealthy hosts): what a
        rollout bakes against and what an instance refresh of the slot rolls back on."""
        self._refreshes: list[cr.AwsCustomResource] = []
        for slot in self.slots:
            self._instance_refresh(slot.auto_scaling_group, slot.launch_template, grace,
                                   "" if slot.name == BLUE else slot.name,
                                   alarm_names=[a.alarm_name for a in self.slot_alarms[slot.name].values()])
        self.rollout: BlueGreenRollout | None = None
        if self.rollout_policy is not None:
            self.rollout = self._blue_green_rollout(self.rollout_policy)
        self.dashboard = cw.Dashboard(self, "Dashboard", widgets=inference_fleet_segment(
            self.metrics, title=f"{_NAME} {self.node.path}: {model.name} on {plan.instance_type}",
            ttft_target_ms=traffic.p95_ttft_ms, tpot_target_ms=traffic.tpot_target_ms,
            in_flight_target=self.in_flight_target, alarms=list(self.alarms.values()),
            usd_per_instance_hour=plan.usd_per_hour))
        self.queries = self._saved_queries()

    def acknowledge_plain_http(self, reason: str) -> None:
        """Acknowledge the four cdk-nag findings a plain-HTTP listener brings (``PLAIN_HTTP_FINDINGS``), with the
        caller's reason: the construct never acknowledges them itself, since whether plain HTTP inside the VPC is
        acceptable is the application's call under NIST 800-53 SC-8 and HIPAA 164.312(e)(1), not the library's.

        Uses ``Validations.of(listener).acknowledge(...)`` (aws-cdk-lib validations, cdk-nag v3).
        """
        _launch.acknowledge_plain_http(
            self.listener, fleet=_NAME, listener_port=self.listener_port, reason=reason, findings=PLAIN_HTTP_FINDINGS,
            https_fix="there is nothing to acknowledge; drop the call",
            reason_fix=": e.g. 'TLS terminates at the service mesh sidecar'")

    # ---- Building blocks --------------------------------------------------------------------------------------

    def _instance_policy(self, artifacts: list[ModelArtifact], repository: ecr.IRepository) -> iam.ManagedPolicy:
        """The instance role's only permissions, as one customer-managed policy on exact ARNs."""
        statements = []
        for index, artifact in enumerate(artifacts):
            bucket_arn = f"arn:{Aws.PARTITION}:s3:::{artifact.bucket_name}"
            statements.append(iam.PolicyStatement(
                sid=f"ReadModelArtifact{index}", actions=["s3:GetObject"],
                resources=[f"{bucket_arn}/{artifact.prefix}*"]))
            statements.append(iam.PolicyStatement(
                sid=f"ListModelArtifact{index}", actions=["s3:ListBucket"], resources=[bucket_arn],
                conditions={"StringLike": {"s3:prefix": [artifact.prefix, f"{artifact.prefix}*"]}}))
            if artifact.kms_key_arn:
                statements.append(iam.PolicyStatement(
                    sid=f"DecryptModelArtifact{index}", actions=["kms:Decrypt"], resources=[artifact.kms_key_arn],
                    conditions={"StringEquals": {"kms:ViaService": f"s3.{Aws.REGION}.amazonaws.com"}}))
        hook_statement, hook_findings = _launch.launch_hook_statement(list(self._group_names.values()))
        statements.append(hook_statement)
        statements.append(iam.PolicyStatement(
            sid="ReadRuntimeCode", actions=["s3:GetObject"],
            resources=[self.runtime_code.bucket.arn_for_objects(self.runtime_code.s3_object_key)]))
        policy = _launch.instance_policy(
            self, statements=statements, log_group_arn=self.log_group.log_group_arn, metric_namespace=METRIC_NAMESPACE,
            image_repository=repository, image_sid="PullServerImage",
            description=f"{_NAME} instances: the model, logs, metrics, image pull, launch hook, SSM")
        _launch.acknowledge(policy, {
            **{f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:s3:::{artifact.bucket_name}/{artifact.prefix}*]":
               "Every object under the model version's prefix: the weights' file names vary by model"
               for artifact in artifacts},
            **hook_findings})
        return policy

    def _slot(self, name: str, artifact: ModelArtifact, *, plan: InferencePlan, accelerator: _launch.AcceleratorKind,
              server_entrypoint: str, server_args: tuple[str, ...], server_port: int, health_check_path: str,
              grace: Duration, machine_image: ec2.IMachineImage | None,
              placement_group: ec2.IPlacementGroup | None, subnets: ec2.SubnetSelection, warm_pool: bool,
              model: ModelShape) -> _Slot:
        suffix = "" if name == BLUE else name
        fleet = self.fleet_name
        agent_config = _launch.cloudwatch_agent_config(
            namespace=METRIC_NAMESPACE, log_group_name=self.log_group.log_group_name, fleet=fleet,
            log_files={"/var/log/genai/model-server.log": "model-server",
                       "/var/log/genai/bootstrap.log": "bootstrap",
                       "/var/log/genai/health-sidecar.log": "health-sidecar",
                       "/var/log/genai/request-proxy.log": "request-proxy"},
            accelerator=accelerator)
        script = _launch.render_serving_user_data(_launch.ServingUserData(
            model_bucket=artifact.bucket_name, model_prefix=artifact.prefix, model_version=artifact.version,
            manifest_name=artifact.manifest_name, image_uri=self.image_uri, server_entrypoint=server_entrypoint,
            server_args=server_args, served_model_name=model.name, server_port=server_port,
            tensor_parallel_size=plan.server.tensor_parallel_size, max_num_seqs=plan.server.max_num_seqs,
            replicas_per_instance=plan.replicas_per_instance, devices_per_replica=plan.devices_per_replica,
            health_port=DEFAULT_HEALTH_PORT, health_path=health_check_path,
            health_probe_timeout_s=HEALTH_PROBE_TIMEOUT.to_seconds(), accelerator=accelerator,
            region=Aws.REGION, metric_namespace=METRIC_NAMESPACE, fleet_name=fleet,
            log_group_name=self.log_group.log_group_name, cloudwatch_agent_config=agent_config,
            fetch_timeout_s=int(FETCH_TIMEOUT.to_seconds()), server_environment=self.server_environment,
            upstream_port=DEFAULT_UPSTREAM_PORT, keep_alive_s=int(self.drain.server_keep_alive.to_seconds()),
            drain_s=int(self.drain.deregistration_delay.to_seconds()), max_model_len=plan.server.max_model_len,
            gpu_memory_utilization=plan.server.gpu_memory_utilization, kv_cache_dtype=plan.server.kv_cache_dtype,
            lifecycle_hook_name=_launch.LAUNCH_HOOK_NAME, auto_scaling_group_name=self._group_names[name],
            lifecycle_heartbeat_s=self.launch_hook_heartbeat_s,
            runtime_code_bucket=self.runtime_code.s3_bucket_name, runtime_code_key=self.runtime_code.s3_object_key))
        launch_template = _launch.build_gpu_launch_template(
            self, f"LaunchTemplate{suffix}", instance_type=plan.instance_type, accelerator=accelerator,
            role=self.role, security_group=self.security_group,
            user_data=_launch.user_data_from_script(script, every_boot=True),
            root_volume_size_gib=_launch.root_volume_gib(plan.weights_gib), encryption_key=self.encryption_key,
            machine_image=machine_image, placement_group=placement_group,
            root_volume_iops=ROOT_VOLUME_IOPS, root_volume_throughput_mibps=ROOT_VOLUME_THROUGHPUT_MIBPS)

        group = autoscaling.AutoScalingGroup(
            self, f"AutoScalingGroup{suffix}", vpc=self.network.vpc, vpc_subnets=subnets,
            auto_scaling_group_name=self._group_names[name],
            launch_template=launch_template, max_capacity=self.max_instances,
            # With a rollout the green slot is created idle, at zero: the rollout state machine sizes both slots
            # from then on (a rollout brings the new slot up to the old one's capacity, then scales the old to zero).
            min_capacity=0 if name == GREEN and self.rollout_policy is not None else self.min_instances,
            health_checks=autoscaling.HealthChecks.with_additional_checks(
                additional_types=[autoscaling.AdditionalHealthCheckType.ELB], grace_period=grace),
            default_instance_warmup=INSTANCE_WARMUP,
            min_healthy_percentage=INSTANCE_REFRESH_MIN_HEALTHY_PERCENT,
            max_healthy_percentage=INSTANCE_REFRESH_MAX_HEALTHY_PERCENT,
            group_metrics=[autoscaling.GroupMetrics.all()],
            notifications=[autoscaling.NotificationConfiguration(topic=self.topic)],
            termination_policies=[autoscaling.TerminationPolicy.OLDEST_LAUNCH_TEMPLATE,
                                  autoscaling.TerminationPolicy.DEFAULT],
        )
        # Every launch waits for the instance to say it is ready: warm-pool launches once weights and image are on
        # the EBS root, in-service launches (and resumes) once the server answers.
        _launch.add_launch_hook(group, heartbeat_s=self.launch_hook_heartbeat_s)
        if warm_pool:
            idle = self.rollout_policy is not None and name != self.live_slot
            # The idle slot (the one the last release does not name) keeps no stopped instances: their EBS volumes
            # would be paid for a slot that serves nothing. The deploy that names it live (the next release) gives
            # it the full pool, filled with the new version before the rollout takes instances from it.
            group.add_warm_pool(pool_state=autoscaling.PoolState.STOPPED, reuse_on_scale_in=True,
                                min_size=0 if idle else WARM_POOL_MIN_SIZE,
                                max_group_prepared_capacity=0 if idle else None)
            self._suspend_az_rebalance(group, suffix)

        target_group = elbv2.ApplicationTargetGroup(
            self, f"TargetGroup{suffix}", vpc=self.network.vpc, port=server_port,
            protocol=elbv2.ApplicationProtocol.HTTP, target_type=elbv2.TargetType.INSTANCE,
            deregistration_delay=self.drain.deregistration_delay,
            load_balancing_algorithm_type=elbv2.TargetGroupLoadBalancingAlgorithmType.LEAST_OUTSTANDING_REQUESTS,
            health_check=elbv2.HealthCheck(
                path=health_check_path, port=str(DEFAULT_HEALTH_PORT), protocol=elbv2.Protocol.HTTP,
                healthy_http_codes="200", interval=HEALTH_CHECK_INTERVAL, timeout=HEALTH_CHECK_TIMEOUT,
                healthy_threshold_count=HEALTHY_THRESHOLD, unhealthy_threshold_count=UNHEALTHY_THRESHOLD))
        target_group.add_target(group)
        cast(autoscaling.CfnAutoScalingGroup, group.node.default_child).add_metadata(
            PLAN_METADATA_KEY, self._plan_metadata(plan, artifact, warm_pool, name))
        return _Slot(name=name, artifact=artifact, auto_scaling_group=group, target_group=target_group,
                     launch_template=launch_template)

    def _plan_metadata(self, plan: InferencePlan, artifact: ModelArtifact, warm_pool: bool,
                       slot: str) -> dict[str, object]:
        """What the plan assumed, recorded on the group's template resource for tools that read the template (the
        fleet simulator, reviewers): plain literals only, never tokens."""
        traffic = plan.traffic
        return {
            "model": plan.model.name, "model_version": artifact.version, "instance_type": plan.instance_type,
            "devices_per_replica": plan.devices_per_replica, "replicas_per_instance": plan.replicas_per_instance,
            "weights_gib": plan.weights_gib,
            "concurrency_per_instance": plan.concurrency_per_instance, "in_flight_target": self.in_flight_target,
            "server": plan.server.model_dump(mode="json"),
            "traffic": {"concurrent_sessions": traffic.concurrent_sessions,
                        "output_tokens_per_s_per_session": traffic.output_tokens_per_s_per_session,
                        "prompt_tokens": traffic.prompt_tokens, "output_tokens": traffic.output_tokens,
                        "p95_ttft_ms": traffic.p95_ttft_ms, "p95_tpot_ms": traffic.tpot_target_ms,
                        "headroom": traffic.headroom},
            "estimate": {"ttft_ms": plan.estimate.ttft_ms, "tpot_ms": plan.estimate.tpot_ms,
                         "output_tokens_per_s": plan.estimate.output_tokens_per_s},
            "usd_per_hour": plan.usd_per_hour, "warm_pool": warm_pool,
            "time_to_serving_s": {path: estimate.total_s for path, estimate in self.time_to_serving.items()},
            "launch_hook_heartbeat_s": self.launch_hook_heartbeat_s,
            "metric_namespace": METRIC_NAMESPACE, "fleet": self.fleet_name,
            # Which slot this group is, and which one the last release names (the simulator replays that one, and
            # a rollout from the other).
            "slot": slot, "live_slot": self.live_slot,
        }

    def _log_access(self, prefix: str) -> None:
        """Access logs to the SSE-S3 bucket (ALB log delivery supports only SSE-S3, not SSE-KMS, on the bucket).

        With a known region CDK grants the region's ELB account. In an environment-agnostic stack the region is a
        token, so this grants the log-delivery service principal AWS uses in Regions launched from August 2022 on,
        and warns: older Regions still deliver as their regional ELB account (give the stack an env).
        """
        if not Token.is_unresolved(Stack.of(self).region):
            self.load_balancer.log_access_logs(self.access_log_bucket, prefix=prefix)
            return
        Annotations.of(self).add_warning_v2(
            "genai-constructs:GpuInferenceFleetAccessLogsRegion",
            "environment-agnostic stack: ALB access log delivery is granted to logdelivery.elasticloadbalancing."
            "amazonaws.com, which Regions launched before August 2022 do not use; give the stack an env (region)")
        self.load_balancer.set_attribute("access_logs.s3.enabled", "true")
        self.load_balancer.set_attribute("access_logs.s3.bucket", self.access_log_bucket.bucket_name)
        self.load_balancer.set_attribute("access_logs.s3.prefix", prefix)
        self.access_log_bucket.add_to_resource_policy(iam.PolicyStatement(
            sid="AlbAccessLogDelivery", actions=["s3:PutObject"],
            principals=[iam.ServicePrincipal("logdelivery.elasticloadbalancing.amazonaws.com")],
            resources=[self.access_log_bucket.arn_for_objects(f"{prefix}/AWSLogs/{Aws.ACCOUNT_ID}/*")]))
        policy = self.access_log_bucket.policy
        if policy is not None:
            self.load_balancer.node.add_dependency(policy)

    def _scaling(self, slot: _Slot, traffic: RealtimeTraffic) -> None:
        """Scale on what users feel, measured per request on the instances, never on GPU utilization.

        1. Target tracking on requests in flight or waiting per instance (the server's own gauges, published by the
           request proxy every 10 s, zero included), aimed at ``in_flight_target``. It scales in too: an idle fleet
           publishes 0, so it returns to its minimum (target tracking scales in only on data, never on its absence:
           EC2 Auto Scaling user guide, "Target tracking scaling policies"). Metric math (running + waiting) keeps
           the demand visible when the server's batch is full (EC2 Auto Scaling user guide, "Create a target
           tracking scaling policy using metric math").
        2. Step scale-out on p95 ``TimeToFirstToken`` and p95 ``TimePerOutputToken`` against the traffic's targets:
           one instance above the target, two above ``LATENCY_STEP_FACTOR`` times it. Missing data (no requests) is
           not breaching, on purpose: no traffic is no reason to add GPUs.
        """
        group = slot.auto_scaling_group
        version = slot.artifact.version
        dimensions = [autoscaling.CfnScalingPolicy.MetricDimensionProperty(name="Fleet", value=self.fleet_name),
                      autoscaling.CfnScalingPolicy.MetricDimensionProperty(name="ModelVersion", value=version)]

        def gauge(id: str, name: str) -> autoscaling.CfnScalingPolicy.TargetTrackingMetricDataQueryProperty:
            return autoscaling.CfnScalingPolicy.TargetTrackingMetricDataQueryProperty(
                id=id, return_data=False, metric_stat=autoscaling.CfnScalingPolicy.TargetTrackingMetricStatProperty(
                    stat="Average", metric=autoscaling.CfnScalingPolicy.MetricProperty(
                        namespace=METRIC_NAMESPACE, metric_name=name, dimensions=dimensions)))

        autoscaling.CfnScalingPolicy(
            group, "ScalingPolicyInFlightPerInstance", auto_scaling_group_name=group.auto_scaling_group_name,
            policy_type="TargetTrackingScaling",
            target_tracking_configuration=autoscaling.CfnScalingPolicy.TargetTrackingConfigurationProperty(
                target_value=self.in_flight_target, disable_scale_in=False,
                customized_metric_specification=autoscaling.CfnScalingPolicy.CustomizedMetricSpecificationProperty(
                    metrics=[
                        gauge("running", "RequestsInFlight"),
                        gauge("waiting", "RequestsWaiting"),
                        autoscaling.CfnScalingPolicy.TargetTrackingMetricDataQueryProperty(
                            id="demand", expression="running + waiting", return_data=True,
                            label="Requests in flight or waiting per instance"),
                    ])))
        for id, metric, target_ms in (
            ("TimeToFirstTokenScaleOut",
             self.metrics.metric_time_to_first_token("p95", model_version=version), traffic.p95_ttft_ms),
            ("TimePerOutputTokenScaleOut",
             self.metrics.metric_time_per_output_token("p95", model_version=version), traffic.tpot_target_ms),
        ):
            policy = group.scale_on_metric(
                id, metric=metric,
                scaling_steps=[autoscaling.ScalingInterval(upper=target_ms, change=0),
                               autoscaling.ScalingInterval(lower=target_ms, upper=LATENCY_STEP_FACTOR * target_ms,
                                                           change=1),
                               autoscaling.ScalingInterval(lower=LATENCY_STEP_FACTOR * target_ms, change=2)],
                adjustment_type=autoscaling.AdjustmentType.CHANGE_IN_CAPACITY,
                evaluation_periods=SCALE_OUT_EVALUATION_MINUTES, datapoints_to_alarm=SCALE_OUT_DATAPOINTS)
            alarm = policy.upper_alarm
            if alarm is not None:
                cast(cw.CfnAlarm, alarm.node.default_child).treat_missing_data = "notBreaching"

    def _saved_queries(self) -> dict[str, logs.CfnQueryDefinition]:
        """Two CloudWatch Logs Insights queries over the per-request lines, saved with the stack.

        The request proxy's embedded-metric-format records are the log lines: each carries the fields below at top
        level (CloudWatch user guide, "Embedded metric format specification"), so Logs Insights reads them as fields.
        """
        log_group_names = [self.log_group.log_group_name]
        prefix = f"{_NAME}/{self.node.path}"
        by_version = logs.CfnQueryDefinition(
            self, "QueryLatencyByModelVersion", name=f"{prefix}/p95 TTFT and TPOT by model version",
            log_group_names=log_group_names, query_string=(
                "filter ispresent(request_id)\n"
                "| stats pct(ttft_ms, 95) as p95_ttft_ms, pct(tpot_ms, 95) as p95_tpot_ms, count(*) as requests, "
                "sum(status != 'ok') as not_ok by model_version, bin(5m) as window\n"
                "| sort window desc, model_version"))
        slowest = logs.CfnQueryDefinition(
            self, "QuerySlowestRequests", name=f"{prefix}/slowest requests with their breakdown",
            log_group_names=log_group_names, query_string=(
                "filter ispresent(request_id)\n"
                "| fields @timestamp, request_id, model_version, instance_id, availability_zone, status, e2e_ms, "
                "queue_ms, ttft_ms, tpot_ms, prompt_tokens, completion_tokens, retrieval_ms, preprocess_ms\n"
                "| sort e2e_ms desc\n"
                "| limit 50"))
        return {"latency_by_model_version": by_version, "slowest_requests": slowest}

    def _group_arn(self, group: autoscaling.AutoScalingGroup) -> str:
        return (f"arn:{Aws.PARTITION}:autoscaling:{Aws.REGION}:{Aws.ACCOUNT_ID}:autoScalingGroup:*:"
                f"autoScalingGroupName/{group.auto_scaling_group_name}")

    def _suspend_az_rebalance(self, group: autoscaling.AutoScalingGroup, suffix: str) -> None:
        """Suspend AZRebalance while the warm pool is on (CloudFormation has no property for it: an SDK call).

        AZ rebalancing terminates running instances to even out the zones. On a GPU fleet that cuts streams in
        flight and throws away loaded weights, and the launch it makes in the short zone is the one most likely to
        fail for capacity; with a warm pool it also churns pre-loaded instances. Availability still comes from
        min_instances >= 2 across two zones, and scale-out already launches into the zone with fewer instances.
        """
        call = cr.AwsSdkCall(
            service="AutoScaling", action="suspendProcesses",
            parameters={"AutoScalingGroupName": group.auto_scaling_group_name, "ScalingProcesses": ["AZRebalance"]},
            physical_resource_id=cr.PhysicalResourceId.of(f"{group.node.path}/AZRebalanceSuspended"))
        self._sdk_call(f"SuspendAzRebalance{suffix}", group, on_create=call, on_update=call, statements=[
            iam.PolicyStatement(actions=["autoscaling:SuspendProcesses"], resources=[self._group_arn(group)])])

    def _instance_refresh(self, group: autoscaling.AutoScalingGroup, launch_template: ec2.LaunchTemplate,
                          warmup: Duration, suffix: str, *, alarm_names: Sequence[str]) -> None:
        """Roll the group through an instance refresh whenever its launch template gets a new version.

        What is not a model version (an AMI, the agent configuration, server flags), and every change of a fleet
        with ``rollout=None``, changes the user data or the image, hence the launch template; CloudFormation
        points the group at the new version without touching running instances, and this SDK call (re-run because
        the version number it carries changed) starts the refresh: new instances first (min healthy 100 %),
        checkpoints at 50 and 100 %, and the slot's own alarms as the rollback condition: with ``AutoRollback`` and an
        ``AlarmSpecification``, Auto Scaling rolls the group back to the previous launch template version when any
        of them goes to ALARM during the refresh (EC2 Auto Scaling user guide, "Undo changes with a rollback" and
        "Use an alarm to start a rollback"; StartInstanceRefresh API reference, ``RefreshPreferences``). An instance
        replaced is first deregistered from the target group and waits the deregistration delay (sized from the
        traffic's longest stream, ``drain_times``) before it terminates, so its streams finish (EC2 Auto Scaling user
        guide, "Instance refresh": "the instance is deregistered from the load balancer ... waits for the
        deregistration delay"; ELB user guide, "Deregistration delay").
        """
        preferences: dict[str, object] = {
            "MinHealthyPercentage": INSTANCE_REFRESH_MIN_HEALTHY_PERCENT,
            "MaxHealthyPercentage": INSTANCE_REFRESH_MAX_HEALTHY_PERCENT,
            "InstanceWarmup": int(warmup.to_seconds()),
            "CheckpointPercentages": list(INSTANCE_REFRESH_CHECKPOINTS),
            "CheckpointDelay": int(INSTANCE_REFRESH_CHECKPOINT_DELAY.to_seconds()),
            "SkipMatching": True,
            "AutoRollback": True,
            "AlarmSpecification": {"Alarms": list(alarm_names)},
        }
        call = cr.AwsSdkCall(
            service="AutoScaling", action="startInstanceRefresh",
            # A rollback needs a desired configuration naming a launch template version, not $Latest or $Default
            # (EC2 Auto Scaling API reference, RollbackInstanceRefresh: "A rollback is not supported ... no desired
            # configuration specified"); the group's own version number is exactly what CloudFormation just set.
            parameters={"AutoScalingGroupName": group.auto_scaling_group_name, "Strategy": "Rolling",
                        "DesiredConfiguration": {"LaunchTemplate": {
                            "LaunchTemplateId": launch_template.launch_template_id,
                            "Version": launch_template.latest_version_number}},
                        "Preferences": preferences},
            # The launch template's version is part of the call, so a new version changes this resource's
            # properties and CloudFormation runs on_update again.
            physical_resource_id=cr.PhysicalResourceId.of(
                f"InstanceRefresh-{launch_template.launch_template_id}-{launch_template.latest_version_number}"),
            ignore_error_codes_matching="InstanceRefreshInProgress")
        self._refreshes.append(self._sdk_call(
            f"InstanceRefresh{suffix}", group,
            # Nothing to roll when the group is created: its instances already run the first version.
            on_create=cr.AwsSdkCall(
                service="AutoScaling", action="describeInstanceRefreshes",
                parameters={"AutoScalingGroupName": group.auto_scaling_group_name, "MaxRecords": 1},
                physical_resource_id=cr.PhysicalResourceId.of(
                    f"InstanceRefresh-{launch_template.launch_template_id}-{launch_template.latest_version_number}")),
            on_update=call,
            statements=[
                iam.PolicyStatement(actions=["autoscaling:StartInstanceRefresh"], resources=[self._group_arn(group)]),
                iam.PolicyStatement(actions=["autoscaling:DescribeInstanceRefreshes"], resources=["*"]),
                # Naming a launch template in a request makes Auto Scaling check that the caller may launch from it
                # (EC2 Auto Scaling user guide, "Launch template support" and "Control the use of launch templates
                # in Auto Scaling groups"): RunInstances only through this template, PassRole only of its role.
                iam.PolicyStatement(
                    actions=["ec2:RunInstances"], resources=["*"],
                    conditions={"ArnLike": {"ec2:LaunchTemplate": (
                        f"arn:{Aws.PARTITION}:ec2:{Aws.REGION}:{Aws.ACCOUNT_ID}:launch-template/"
                        f"{launch_template.launch_template_id}")},
                        "Bool": {"ec2:IsLaunchTemplateResource": "true"}}),
                iam.PolicyStatement(actions=["iam:PassRole"], resources=[self.role.role_arn],
                                    conditions={"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}),
            ],
            wildcard_reason="autoscaling:DescribeInstanceRefreshes (the no-op when the group is created) has no "
                            "resource-level permissions; ec2:RunInstances is limited by condition to launches "
                            "through this group's launch template (the check Auto Scaling makes when a request "
                            "names one), since its other resources (instance, volume, interface) have no ARN "
                            "before launch"))

    def _sdk_call(self, id: str, group: autoscaling.AutoScalingGroup | None, *, on_create: cr.AwsSdkCall | None = None,
                  on_update: cr.AwsSdkCall | None = None, statements: list[iam.PolicyStatement],
                  wildcard_reason: str | None = None) -> cr.AwsCustomResource:
        """An AWS SDK call at deploy time whose permissions are a customer-managed policy, not an inline one.

        CDK's ``AwsCustomResource`` writes its ``policy`` as an inline policy on its provider's role, and gives that
        role an AWS-managed policy (flagged by AwsSolutions-IAM4 and by the NIST 800-53 R5 and HIPAA packs). Here the
        provider (one per stack, shared) gets a role of its own with one customer-managed policy for its log group,
        and each call's statements go into a customer-managed policy attached to the provider's role; the call waits
        for the attachment. If the stack's provider already exists, its role is used as it is.
        """
        existing = Stack.of(self).node.try_find_child(_SDK_PROVIDER_ID)
        log_group: logs.ILogGroup | None = None
        if existing is None:
            role, log_group = self._new_sdk_provider_role()
        else:
            role = existing.role  # type: ignore[attr-defined]
        resource = cr.AwsCustomResource(
            self, id, on_create=on_create, on_update=on_update, install_latest_aws_sdk=False, role=role,
            log_group=log_group)
        provider = Stack.of(self).node.find_child(_SDK_PROVIDER_ID)
        policy = iam.ManagedPolicy(self, f"{id}Policy", statements=statements, roles=[role],
                                   description=f"{_NAME} {self.node.path}: the {id} SDK call")
        resource.node.add_dependency(policy)
        policy_findings: dict[str, str] = {}
        if group is not None:
            group_ref = Stack.of(self).resolve(group.auto_scaling_group_name)["Ref"]
            policy_findings[
                "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:autoscaling:<AWS::Region>:<AWS::AccountId>:"
                f"autoScalingGroup:*:autoScalingGroupName/<{group_ref}>]"] = (
                "An Auto Scaling group ARN embeds a UUID CloudFormation does not return; the group name pins it")
        if wildcard_reason:
            policy_findings["AwsSolutions-IAM5[Resource::*]"] = wildcard_reason
        _launch.acknowledge(policy, policy_findings)
        _acknowledge_sdk_provider(provider)
        return resource

    def _blue_green_rollout(self, policy: RolloutPolicy) -> BlueGreenRollout:
        """The rollout state machine, and the deploy-time trigger that starts it towards ``live_slot``.

        The trigger is an SDK call (``StartExecution``) whose properties are the live slot, its version and its
        launch template version: CloudFormation re-runs it (on_update) only when one of those changes, i.e. when a
        deploy names a new live slot or changes what it runs. A trigger that finds the other slot already at zero
        (the first deploy, a redeploy after a finished rollout) ends without moving traffic (``AnythingToRollFrom``).
        """
        rollout_slots = tuple(
            RolloutSlot(name=slot.name, version=slot.artifact.version,
                        group_name=slot.auto_scaling_group.auto_scaling_group_name,
                        target_group_arn=slot.target_group.target_group_arn,
                        alarm_names=tuple(a.alarm_name for a in self.slot_alarms[slot.name].values()),
                        # Built from the name, not GetAtt: the same ARN (CloudWatch API reference, "Amazon
                        # Resource Names": arn:aws:cloudwatch:region:account:alarm:name), and one an emulator that
                        # creates no alarm can still put in a policy.
                        alarm_arns=tuple(Stack.of(self).format_arn(
                            service="cloudwatch", resource="alarm", resource_name=a.alarm_name,
                            arn_format=ArnFormat.COLON_RESOURCE_NAME) for a in self.slot_alarms[slot.name].values()))
            for slot in self.slots)
        blue, green = rollout_slots
        ready_timeout_s = math.ceil(self.time_to_serving["cold"].total_s * ROLLOUT_READY_MARGIN
                                    + self.health_check_grace_period.to_seconds())
        rollout = BlueGreenRollout(
            self, "Rollout", policy=policy, state_machine_name=f"{self.fleet_name[:71]}-rollout",
            listener_arn=self.listener.listener_arn, slots=(blue, green), topic_arn=self.topic.topic_arn,
            min_instances=self.min_instances, ready_timeout_s=ready_timeout_s, encryption_key=self.encryption_key,
            lock_parameter_name=f"/genai-constructs/{self.fleet_name}/no-rollout-running",
            warm_pool="warm" in self.time_to_serving)
        check = self._rollout_lock_check(rollout)
        new, old = (green, blue) if self.live_slot == GREEN else (blue, green)
        live = self.slots[1] if self.live_slot == GREEN else self.slots[0]
        start = cr.AwsSdkCall(
            service="SFN", action="startExecution",
            parameters={"stateMachineArn": rollout.state_machine_arn, "input": rollout.execution_input(old, new)},
            physical_resource_id=cr.PhysicalResourceId.of(
                f"Rollout-{self.live_slot}-{live.artifact.version}-{live.launch_template.latest_version_number}"))
        trigger = self._sdk_call("StartRollout", None, on_create=start, on_update=start, statements=[
            iam.PolicyStatement(actions=["states:StartExecution"], resources=[rollout.state_machine_arn])])
        # The state machine must exist (the call names it by a constructed ARN, not a Ref); the listener and the
        # groups it will change are already dependencies through the Refs in the input. The slots' instance refreshes
        # start first, so an execution that finds the serving slot's version changed in place can roll its refresh
        # back (rollout_definition, step 1b).
        trigger.node.add_dependency(rollout.state_machine, check, *self._refreshes)
        return rollout

    def _rollout_lock_check(self, rollout: BlueGreenRollout) -> cr.AwsCustomResource:
        """Refuse a release while a rollout runs, before any launch template changes.

        The rollout lock is an SSM parameter that exists only while no rollout runs (``rollout_definition``, step 1:
        an execution deletes it, and puts it back when it ends). This deploy-time call reads it (``GetParameter``),
        and both slots' launch templates depend on the call: during a rollout the parameter is gone, the read fails
        with ``ParameterNotFound`` (Systems Manager API reference, GetParameter), and CloudFormation stops the update
        before it gives any slot a new version (AWS CloudFormation user guide, "DependsOn attribute": a resource is
        updated only after the resources it depends on). It re-runs whenever a release changes a slot's version or
        the live slot (its physical id names them). Creating it writes the parameter: no rollout runs yet.
        """
        release = "-".join(f"{slot.name}={slot.artifact.version}" for slot in self.slots)
        physical_id = cr.PhysicalResourceId.of(f"RolloutLockCheck-{release}-live={self.live_slot}")
        check = self._sdk_call(
            "RolloutLockCheck", None,
            on_create=cr.AwsSdkCall(service="SSM", action="putParameter", physical_resource_id=physical_id,
                                    parameters={"Name": rollout.lock_parameter_name, "Value": NO_RELEASE_YET,
                                                "Type": "String", "Overwrite": True}),
            on_update=cr.AwsSdkCall(service="SSM", action="getParameter", physical_resource_id=physical_id,
                                    parameters={"Name": rollout.lock_parameter_name}),
            statements=[iam.PolicyStatement(actions=["ssm:PutParameter", "ssm:GetParameter"],
                                            resources=[rollout.lock_parameter_arn])])
        for slot in self.slots:
            slot.launch_template.node.add_dependency(check)
        return check

    def _new_sdk_provider_role(self) -> tuple[iam.Role, logs.LogGroup]:
        """A role for CDK's SDK provider function with one customer-managed policy: write its own log group."""
        log_group = logs.LogGroup(self, "SdkProviderLogs", retention=_launch.FLEET_LOG_RETENTION,
                                  encryption_key=self.encryption_key, removal_policy=RemovalPolicy.RETAIN)
        policy = iam.ManagedPolicy(self, "SdkProviderLogsPolicy", statements=[iam.PolicyStatement(
            actions=["logs:CreateLogStream", "logs:PutLogEvents"], resources=[log_group.log_group_arn])],
            description=f"{_NAME} {self.node.path}: the SDK provider function's logs")
        role = iam.Role(self, "SdkProviderRole", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
                        managed_policies=[policy],
                        description="CDK's AwsCustomResource provider: Auto Scaling calls at deploy time")
        return role, log_group

    # ---- Metric helpers ---------------------------------------------------------------------------------------

    def metric_target_response_time(self, statistic: str = "p95") -> cw.Metric:
        """ALB ``TargetResponseTime`` at ``statistic`` (time to first byte: TTFT when streaming)."""
        return self.metrics.metric_target_response_time(statistic)

    def metric_http_5xx_rate(self) -> cw.MathExpression:
        return self.metrics.metric_http_5xx_rate()

    def metric_request_count_per_target(self) -> cw.Metric:
        return self.metrics.metric_request_count_per_target(self.target_group)

    def metric_gpu_utilization(self) -> cw.Metric:
        return self.metrics.metric_gpu_utilization()

    def metric_gpu_memory_used_percent(self) -> cw.MathExpression:
        return self.metrics.metric_gpu_memory_used_percent()

    def metric_in_flight_requests(self) -> cw.Metric:
        return self.metrics.metric_in_flight_requests()

    def metric_usd_per_million_tokens(self) -> cw.MathExpression | None:
        """Cost per 1M output tokens (on-demand compute); None when the catalog has no price for the instance."""
        if self.plan.usd_per_hour is None:
            return None
        return self.metrics.metric_usd_per_million_tokens(self.plan.usd_per_hour)


@dataclass(frozen=True)
class DrainTimes:
    """How long a stream may last, and the load balancer settings sized from it (``drain_times``)."""

    longest_stream_s: float
    deregistration_delay: Duration
    idle_timeout: Duration
    server_keep_alive: Duration


def drain_times(plan: InferencePlan) -> DrainTimes:
    """The deregistration delay, the ALB idle timeout and the instances' keep-alive, sized from the traffic.

    The longest stream the traffic allows is one that fills the server's ``--max-model-len`` (the plan's
    ``max_model_len``: the server refuses anything longer) with output at the p95 time per token, after a p95 first
    token. A draining target keeps its in-flight requests for the deregistration delay and is then cut off (Elastic
    Load Balancing user guide, "Deregistration delay"); Auto Scaling deregisters an instance from its target groups and
    waits for that delay before terminating it, on scale-in and on an instance refresh alike (EC2 Auto Scaling user
    guide, "Add Elastic Load Balancing health checks" and "Instance refresh": instances are deregistered and drained
    before termination). So the delay is that stream times ``DRAIN_MARGIN``, at least ``MIN_DRAIN``, at most
    ELB's 3600 s.

    The idle timeout is the same span: a non-streaming completion sends no byte until its last token, and the ALB
    closes a connection idle for longer than the timeout (ELB user guide, "Connection idle timeout"); a streaming one
    sends a token every p95 TPOT, far inside it. The keep-alive is the idle timeout + ``KEEP_ALIVE_ABOVE_IDLE``.
    """
    traffic = plan.traffic
    longest_s = (traffic.p95_ttft_ms + plan.server.max_model_len * traffic.tpot_target_ms) / 1000.0
    drain_s = max(MIN_DRAIN.to_seconds(), math.ceil(longest_s * DRAIN_MARGIN))
    delay_s = min(drain_s, MAX_DEREGISTRATION_DELAY.to_seconds())
    idle_s = min(drain_s, MAX_IDLE_TIMEOUT.to_seconds())
    return DrainTimes(longest_stream_s=longest_s, deregistration_delay=Duration.seconds(delay_s),
                      idle_timeout=Duration.seconds(idle_s),
                      server_keep_alive=Duration.seconds(idle_s + KEEP_ALIVE_ABOVE_IDLE.to_seconds()))


def _acknowledge_sdk_provider(provider: IConstruct) -> None:
    """Narrow acknowledgments for CDK's shared AwsCustomResource provider function (one per stack)."""
    reasons: dict[str, str] = {}
    for pack in ("NIST.800.53.R5", "HIPAA.Security"):
        reasons[f"{pack}-LambdaConcurrency"] = (
            "CDK's provider runs once per deploy, invoked by CloudFormation; reserved concurrency would only cap it")
        reasons[f"{pack}-LambdaDLQ"] = (
            "CloudFormation invokes CDK's provider synchronously and reports a failure as a failed deploy; no event "
            "is left to park in a queue")
        reasons[f"{pack}-LambdaInsideVPC"] = (
            "CDK's provider calls the Auto Scaling API; inside the NAT-less VPC it would need an extra "
            "interface endpoint for one call per deploy")
    _launch.acknowledge(provider, reasons)


def _vllm_default_length_problems(model: ModelShape, plan: InferencePlan, server_args: list[str]) -> list[str]:
    """Custom vLLM arguments without ``--max-model-len`` make vLLM take the model's own maximum; say so when one such
    request's KV cache cannot fit what the plan leaves (vLLM's start-up check, planner/server_settings.py)."""
    if plan.is_neuron or not any("vllm" in arg for arg in server_args):
        return []
    if any(arg == "--max-model-len" or arg.startswith("--max-model-len=") for arg in server_args):
        return []
    server = plan.server
    needed = kv_gib_one_request(model, server.tensor_parallel_size, model.max_context)
    usable = server.kv_cache_gib_available - server.kv_cache_gib_reserved
    if needed <= usable:
        return []
    return [f"server_args has no --max-model-len, so vLLM would take {model.name}'s own maximum "
            f"({model.max_context:,} tokens), whose KV cache ({needed:.2f} GiB) exceeds the {usable:.2f} GiB "
            f"{plan.instance_type} leaves after the weights: vLLM would refuse to start. Add \"--max-model-len\", "
            f"\"{{max_model_len}}\" (the plan's {server.max_model_len:,})"]


def _tensor_parallel_arg_problems(model: ModelShape, plan: InferencePlan, server_args: list[str]) -> list[str]:
    """A literal ``--tensor-parallel-size`` (or ``-tp``) in custom server_args must be one replica's ranks, and the
    attention heads must divide it: vLLM refuses otherwise ("Total number of attention heads must be divisible by
    tensor parallel size", ``ModelConfig.verify_with_parallel_config``), and the replica's container sees only its
    own devices, so any other degree fails at start-up on the instance."""
    problems = []
    for index, arg in enumerate(server_args):
        if arg in ("--tensor-parallel-size", "-tp") and index + 1 < len(server_args):
            text = server_args[index + 1]
        elif arg.startswith("--tensor-parallel-size="):
            text = arg.split("=", 1)[1]
        else:
            continue
        if "{" in text:
            continue  # the {tensor_parallel_size} placeholder: the plan's own degree
        ranks = plan.server.tensor_parallel_size
        if not text.isdigit() or int(text) < 1:
            problems.append(f"server_args --tensor-parallel-size ({text!r}) must be a positive whole number: use "
                            "\"{tensor_parallel_size}\" for the plan's degree")
        elif int(text) != ranks or model.attention_heads % int(text):
            divides = "" if model.attention_heads % int(text) == 0 else (
                f"{model.name}'s {model.attention_heads} attention heads do not divide it, and ")
            problems.append(f"server_args --tensor-parallel-size ({text}): {divides}one replica of this plan runs "
                            f"{ranks} rank(s) on {plan.devices_per_replica} device(s) of {plan.instance_type}; use "
                            "\"{tensor_parallel_size}\" (the plan's degree) or re-plan with instance_type=")
    return problems


def _replica_layout_problems(plan: InferencePlan, *, overridden: bool) -> list[str]:
    """The plan's replicas must tile the instance's devices: each replica's server container is pinned to
    ``devices_per_replica`` devices of its own (the boot script), so replicas x devices may not exceed what the
    instance has, and each replica's tensor-parallel ranks must be its devices' (one per GPU, two per Neuron chip)."""
    try:
        instance = load_catalog().instance(plan.instance_type)
    except GenaiConstructsError as error:
        return [str(error)]
    replicas, devices = plan.replicas_per_instance, plan.devices_per_replica
    fix = "drop instance_type to let the planner choose, or pick one with more devices" if overridden else \
        "re-plan (plan_inference) rather than editing the plan"
    problems = []
    if replicas < 1 or devices < 1 or replicas * devices > instance.accelerator_count:
        problems.append(
            f"instance_type ({plan.instance_type!r}) has {instance.accelerator_count} accelerator devices, but the "
            f"plan runs {replicas} replicas of {devices} devices ({replicas * devices}): {fix}")
    ranks = tensor_parallel_ranks(instance, devices)
    if plan.server.tensor_parallel_size != ranks:
        problems.append(
            f"plan.server.tensor_parallel_size ({plan.server.tensor_parallel_size}) is not the {ranks} ranks of one "
            f"replica of {devices} {'Neuron chips (two NeuronCores each)' if instance.is_neuron else 'GPUs'} on "
            f"{plan.instance_type}: each replica's server is one tensor-parallel group of its own devices; {fix}")
    return problems


def slot_of_release(index: int) -> str:
    """The slot of release ``index`` of a release history (0 = the oldest): Blue when even, Green when odd.

    Consecutive releases always land in different slots, so the newest goes to the slot the one before it does not
    serve (the idle slot, once the previous rollout has finished) and the live slot's launch template never changes
    version with a release: no deploy can put a new version behind the target group that serves."""
    return BLUE if index % 2 == 0 else GREEN


def _release_slots(
    releases: tuple[ModelArtifact, ...], *, green_model_artifact: ModelArtifact | None, live_slot: str | None,
    rollout: RolloutPolicy | None, problems: list[str],
) -> tuple[ModelArtifact, ModelArtifact | None, str | None]:
    """(blue's artifact, green's artifact or None, the live slot or None) from ``model_artifact``: one artifact
    leaves the explicit arguments as they are; a release history of two or more decides all three."""
    if len(releases) == 1:
        return releases[0], green_model_artifact, live_slot
    explicit = [name for name, value in (("green_model_artifact", green_model_artifact), ("live_slot", live_slot))
                if value is not None]
    if explicit:
        problems.append(f"model_artifact is a release history of {len(releases)} versions and {' and '.join(explicit)} "
                        f"{'is' if len(explicit) == 1 else 'are'} given too: the history decides each slot's version "
                        f"and the live slot; drop {' and '.join(explicit)}")
    if rollout is None:
        problems.append("model_artifact is a release history and rollout is None: a history ships each version by a "
                        "blue/green rollout; keep the default rollout, or pass one ModelArtifact with rollout=None")
    last, before = releases[-1], releases[-2]
    if last.version == before.version:
        problems.append(f"model_artifact[-1].version ({last.version!r}) equals model_artifact[-2].version: a release "
                        "is a new version; give it its own version (and prefix), or replace the last entry (a retry "
                        "after a rollback) instead of appending")
    latest = {slot_of_release(index): artifact for index, artifact in enumerate(releases)}  # later entries win
    if last.version == before.version:  # said once, above: no green slot and no live slot to complain about too
        return latest[BLUE], None, None
    return latest[BLUE], latest[GREEN], slot_of_release(len(releases) - 1) if rollout is not None else None


def _validate(
    *, model: ModelShape, traffic: RealtimeTraffic, model_artifact: ModelArtifact, instance_type: str | None,
    min_instances: int | None, max_instances: int | None, image_repository: ecr.IRepository | None,
    image_tag: str | None, server_port: int, health_check_path: str, certificate: acm.ICertificate | None,
    allow_plain_http: bool | None, warm_pool: bool, spot: bool, green_model_artifact: ModelArtifact | None,
    green_traffic_percent: int, live_slot: str, rollout: RolloutPolicy | None, server_args: Sequence[str] | None, server_environment: Mapping[str, str] | None,
    region: str | None, problems: list[str], bad: set[str],
) -> InferencePlan:
    """Check every argument, gather every problem, raise once; return the plan (planned in the stack's ``region``
    when it is concrete: fleets/_region.py). ``problems`` holds the type problems found first; the arguments in
    ``bad`` had the wrong type, so the checks below skip them."""
    for name in (server_environment or {}) if "server_environment" not in bad else ():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            problems.append(f"server_environment key ({name!r}) is not a valid environment variable name: use "
                            "letters, digits and underscores, not starting with a digit")
    plan: InferencePlan | None = None
    if bad & {"model", "traffic", "instance_type"}:
        pass  # nothing to plan from
    elif model.kind != "decoder":
        problems.append(f"model ({model.name!r}) is an encoder: serve it with the embedding fleet, not {_NAME}")
    elif instance_type is not None:
        try:
            instance = load_catalog().instance(instance_type)
        except GenaiConstructsError as error:
            problems.append(str(error))
        else:
            probe = estimate(model, instance, concurrency=1, prompt_tokens=traffic.prompt_tokens,
                             output_tokens=traffic.output_tokens)
            needed = probe.memory.total_gib - probe.memory.free_gib
            if not probe.fits:
                problems.append(
                    f"instance_type ({instance_type!r}) cannot hold {model.name}: it needs {needed:.1f} GiB of "
                    f"accelerator memory for one {traffic.prompt_tokens + traffic.output_tokens}-token sequence, "
                    f"{instance_type} has {probe.memory.total_gib:.1f} GiB: pick a larger instance, a narrower "
                    "precision, or drop instance_type to let the planner choose")
            else:
                try:
                    plan = plan_inference(model, traffic, instance_types=[instance.instance_type],
                                          include_neuron=instance.is_neuron, region=region)
                except GenaiConstructsError as error:
                    problems.append(f"instance_type ({instance_type!r}): {error}")
    else:
        try:
            plan = plan_inference(model, traffic, region=region)
        except GenaiConstructsError as error:
            problems.append(str(error))

    if bad & {"spot", "warm_pool", "allow_plain_http", "min_instances", "max_instances", "server_port",
               "health_check_path", "image_tag", "green_traffic_percent", "model_artifact", "green_model_artifact",
               "live_slot", "rollout"}:
        if problems:
            raise ConfigurationError(_NAME, problems)
    if spot and warm_pool:
        problems.append("spot (True) with warm_pool (True): a warm pool cannot be added to a group that launches "
                        "Spot Instances (EC2 Auto Scaling user guide); set warm_pool=False to use Spot, or spot=False")
    elif spot:
        problems.append("spot (True): a real-time fleet is on-demand only (an interruption drops the streams in "
                        f"flight); {_NAME} does not launch Spot: use the embedding fleet for interruptible work")
    if certificate is None and allow_plain_http is False:
        problems.append("certificate (None) and allow_plain_http (False): the listener needs one: pass certificate= "
                        "(an ACM certificate) for HTTPS, or allow_plain_http=True to serve plain HTTP inside the VPC")
    if certificate is not None and allow_plain_http:
        problems.append("allow_plain_http (True) with a certificate: the listener serves HTTPS only; drop one")
    if min_instances is not None and not Token.is_unresolved(min_instances) and min_instances < 2:
        problems.append(f"min_instances ({min_instances}) must be >= 2: one instance per AZ in two AZs keeps the "
                        "endpoint up when a zone or an instance fails")
    if (min_instances is not None and max_instances is not None and not Token.is_unresolved(min_instances)
            and not Token.is_unresolved(max_instances) and max_instances <= min_instances):
        problems.append(f"max_instances ({max_instances}) must be greater than min_instances ({min_instances}): the "
                        "fleet scales out on load and latency (CloudFormation rejects target tracking when max == "
                        "min); raise max_instances or lower min_instances")
    if (isinstance(server_port, bool) or not isinstance(server_port, int) or not 1 <= server_port <= 65535
            or server_port in (DEFAULT_HEALTH_PORT, DEFAULT_UPSTREAM_PORT, 22)):
        problems.append(f"server_port ({server_port!r}) must be an integer 1-65535 and not {DEFAULT_HEALTH_PORT} (the "
                        f"health sidecar), {DEFAULT_UPSTREAM_PORT} (the model server behind the request proxy) or 22: "
                        "use the server's own port, e.g. 8000")
    if not health_check_path.startswith("/") or any(c.isspace() for c in health_check_path):
        problems.append(f"health_check_path ({health_check_path!r}) must start with '/' and hold no spaces: "
                        f"e.g. {DEFAULT_HEALTH_PATH!r}")
    if image_repository is not None and not image_tag:
        problems.append("image_repository given without image_tag: pin the server image with image_tag='...'")
    if plan is not None:
        problems.extend(_replica_layout_problems(plan, overridden=instance_type is not None))
    if plan is not None and plan.is_neuron and image_repository is None:
        problems.append(f"instance_type ({plan.instance_type!r}) is Neuron: the default vLLM image is for NVIDIA "
                        "GPUs; pass image_repository= and image_tag= of a Neuron vLLM image and a Neuron-compiled "
                        "model_artifact")
    if "server_args" in bad:
        pass
    elif server_args is not None:
        placeholders = dict.fromkeys(SERVER_ARG_PLACEHOLDERS, "")
        for arg in server_args:
            try:
                arg.format(**placeholders)
            except (KeyError, IndexError, ValueError, AttributeError):
                allowed = ", ".join(f"{{{name}}}" for name in SERVER_ARG_PLACEHOLDERS)
                problems.append(f"server_args item {arg!r} is not a string with known placeholders: allowed are "
                                f"{allowed} (double braces for a literal brace)")
    if plan is not None and server_args is not None and "server_args" not in bad:
        problems.extend(_vllm_default_length_problems(model, plan, [str(a) for a in server_args]))
        problems.extend(_tensor_parallel_arg_problems(model, plan, [str(a) for a in server_args]))
    if not 0 <= green_traffic_percent <= 100:
        problems.append(f"green_traffic_percent ({green_traffic_percent}) must be between 0 and 100")
    if green_traffic_percent and green_model_artifact is None:
        problems.append(f"green_traffic_percent ({green_traffic_percent}) without green_model_artifact: name the "
                        "version the green target group serves")
    if green_traffic_percent and green_model_artifact is not None and rollout is not None:
        problems.append(f"green_traffic_percent ({green_traffic_percent}) with a rollout: the rollout owns the "
                        "listener's weights; choose the serving slot with live_slot='Green', or pass rollout=None for "
                        "fixed weights")
    if live_slot not in (BLUE, GREEN):
        problems.append(f"live_slot ({live_slot!r}) must be {BLUE!r} or {GREEN!r}: the slot that serves every request "
                        "once the rollout has finished")
    elif live_slot == GREEN and green_model_artifact is None:
        problems.append(f"live_slot ({GREEN!r}) without green_model_artifact: name the version the green slot serves")
    elif live_slot == GREEN and rollout is None:
        problems.append(f"live_slot ({GREEN!r}) with rollout=None: without a rollout the weights are "
                        "green_traffic_percent; pass green_traffic_percent=100, or keep the default rollout")
    if green_model_artifact is not None and green_model_artifact.version == model_artifact.version:
        problems.append(f"green_model_artifact.version ({green_model_artifact.version!r}) equals "
                        "model_artifact.version: blue/green needs two different versions")
    if problems:
        raise ConfigurationError(_NAME, problems)
    assert plan is not None
    return plan


def _argument_types(
    *, scope: object, id: object, network: object, model: object, traffic: object, model_artifact: object,
    instance_type: object, min_instances: object, max_instances: object, image_repository: object,
    image_tag: object, server_entrypoint: object, server_args: object, server_port: object,
    server_environment: object, health_check_path: object, certificate: object, allow_plain_http: object,
    warm_pool: object, spot: object, latency_is_the_product: object, green_model_artifact: object,
    green_traffic_percent: object, live_slot: object, rollout: object, health_check_grace_period: object, machine_image: object, allow_from_vpc: object,
    notifications_topic: object, deletion_protection: object, web_acl: object,
) -> tuple[list[str], set[str]]:
    """Every argument's type and finiteness, before anything uses it: (problems, the arguments that failed)."""
    problems: list[str] = []
    bad: set[str] = set()

    def record(argument: str, ok: bool) -> None:
        if not ok:
            bad.add(argument)

    record("scope", checks.instance_of(problems, "scope", scope, Construct, allowed="a construct (a Stack)",
                                       fix=f"pass the stack: {_NAME}(stack, 'Chat', ...)"))
    record("id", checks.text(problems, "id", id, fix=f"pass the construct id: {_NAME}(stack, 'Chat', ...)"))
    checks.id_in_use(problems, scope, id, construct=_NAME)
    record("network", checks.instance_of(
        problems, "network", network, PrivateDataPath, allowed="a PrivateDataPath",
        fix="pass the PrivateDataPath itself (network=net, not net.vpc); for a VPC of your own, wrap it: "
            "PrivateDataPath(stack, 'Net', vpc=vpc)"))
    record("model", checks.instance_of(problems, "model", model, ModelShape, allowed="a ModelShape",
                                       fix="e.g. model=ModelShape.preset('llama-3.1-8b')"))
    record("traffic", checks.instance_of(
        problems, "traffic", traffic, RealtimeTraffic, allowed="a RealtimeTraffic",
        fix="e.g. traffic=RealtimeTraffic(concurrent_sessions=32, output_tokens_per_s_per_session=20)"))
    if isinstance(model_artifact, (list, tuple)):
        wrong = [f"[{i}] ({type(a).__name__})" for i, a in enumerate(model_artifact) if not isinstance(a, ModelArtifact)]
        record("model_artifact", bool(model_artifact) and not wrong)
        if not model_artifact or wrong:
            problems.append(f"model_artifact (a {type(model_artifact).__name__}) must be a ModelArtifact or a non-empty "
                            f"release history of ModelArtifacts, oldest first{': not ' + ', '.join(wrong) if wrong else ''}"
                            ": e.g. model_artifact=[v1, v2] (v2 serves; appending v3 rolls it out)")
    for argument, value, optional in (("model_artifact", model_artifact, False),
                                      ("green_model_artifact", green_model_artifact, True)):
        if argument == "model_artifact" and isinstance(value, (list, tuple)):
            continue
        record(argument, checks.instance_of(
            problems, argument, value, ModelArtifact, allowed="a ModelArtifact", optional=optional,
            fix=f"e.g. {argument}=ModelArtifact(bucket_name='my-models', prefix='llama-3.1-8b/') (the weights and "
                "their SHA256SUMS manifest)"))
    record("instance_type", checks.text(problems, "instance_type", instance_type, optional=True,
                                        fix="an EC2 instance type such as 'g6e.xlarge', or None to let the planner "
                                            "choose"))
    for argument, value in (("min_instances", min_instances), ("max_instances", max_instances)):
        record(argument, checks.whole_number(problems, argument, value, minimum=None, optional=True,
                                             fix=f"e.g. {argument}=2, or None for the plan's"))
    record("green_traffic_percent", checks.whole_number(
        problems, "green_traffic_percent", green_traffic_percent, minimum=None,
        fix="the share of requests for the green version, e.g. 10"))
    record("live_slot", checks.text(problems, "live_slot", live_slot, optional=True,
                                    fix=f"{BLUE!r} or {GREEN!r}, or None for the slot of the last release"))
    record("rollout", checks.instance_of(
        problems, "rollout", rollout, RolloutPolicy, optional=True, allowed="a RolloutPolicy or None",
        fix="e.g. rollout=RolloutPolicy(steps=(5, 25, 50, 100), bake=Duration.minutes(10))"))
    record("server_port", checks.whole_number(problems, "server_port", server_port, minimum=1, maximum=65535,
                                              fix=f"the model server's own port, e.g. {DEFAULT_SERVER_PORT}"))
    record("image_repository", checks.cdk_interface(
        problems, "image_repository", image_repository, attributes=("repository_uri_for_tag", "repository_arn"),
        allowed="an ecr.IRepository", fix="e.g. ecr.Repository.from_repository_name(stack, 'Repo', 'my-server')"))
    record("image_tag", checks.text(problems, "image_tag", image_tag, optional=True, fix="e.g. image_tag='0.13'"))
    record("server_entrypoint", checks.text(problems, "server_entrypoint", server_entrypoint,
                                            fix=f"e.g. {DEFAULT_SERVER_ENTRYPOINT!r}"))
    example = repr(server_args.split()) if isinstance(server_args, str) else repr(list(DEFAULT_SERVER_ARGS[:2]))
    record("server_args", checks.string_list(problems, "server_args", server_args, optional=True, example=example))
    record("server_environment", checks.string_map(problems, "server_environment", server_environment,
                                                   example="{'RETRIEVAL_DNS': network.dns_entries('search')}"))
    record("health_check_path", checks.text(problems, "health_check_path", health_check_path,
                                            fix=f"e.g. {DEFAULT_HEALTH_PATH!r}"))
    record("certificate", checks.cdk_interface(
        problems, "certificate", certificate, attributes=("certificate_arn",), allowed="an acm.ICertificate",
        fix="e.g. acm.Certificate.from_certificate_arn(stack, 'Cert', 'arn:aws:acm:...')"))
    record("allow_plain_http", checks.flag(problems, "allow_plain_http", allow_plain_http, optional=True))
    for argument, value in (("warm_pool", warm_pool), ("spot", spot), ("latency_is_the_product",
                                                                        latency_is_the_product),
                            ("allow_from_vpc", allow_from_vpc), ("deletion_protection", deletion_protection)):
        record(argument, checks.flag(problems, argument, value))
    record("health_check_grace_period", checks.instance_of(
        problems, "health_check_grace_period", health_check_grace_period, Duration, optional=True,
        allowed="a Duration", fix="e.g. health_check_grace_period=Duration.seconds(120)"))
    record("machine_image", checks.cdk_interface(
        problems, "machine_image", machine_image, attributes=("get_image",), allowed="an ec2.IMachineImage",
        fix="e.g. ec2.MachineImage.generic_linux({'us-east-1': 'ami-...'})"))
    record("notifications_topic", checks.cdk_interface(
        problems, "notifications_topic", notifications_topic, attributes=("topic_arn",), allowed="an sns.ITopic",
        fix="e.g. sns.Topic.from_topic_arn(stack, 'Topic', 'arn:aws:sns:...')"))
    record("web_acl", checks.instance_of(problems, "web_acl", web_acl, wafv2.CfnWebACL, optional=True,
                                         allowed="a wafv2.CfnWebACL (REGIONAL scope)",
                                         fix="pass the CfnWebACL construct, or None"))
    return problems, bad
