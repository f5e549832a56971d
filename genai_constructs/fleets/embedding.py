"""EmbeddingBatchFleet: batch embedding that keeps the GPU fed and loses no document.

Staging buckets -> S3 event notifications (and ``genai-constructs enqueue`` for a backlog) -> an SQS queue with a
dead-letter queue -> an Auto Scaling group of GPU workers (Spot when the traffic allows) running
``genai_constructs.runtime.batch_worker``, one per GPU -> vectors under a deterministic key in the output bucket.
See docs/embedding-batch-fleet.md for the defaults and how to size objects.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import cast

from aws_cdk import Aws, CfnElement, CfnOutput, Duration, Names, RemovalPolicy, Stack
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import aws_s3_notifications as s3n
from aws_cdk import aws_sns as sns
from constructs import Construct

from genai_constructs.errors import ConfigurationError
from genai_constructs.fleets import _launch, _region
from genai_constructs.network import PrivateDataPath
from genai_constructs.network import _checks as checks
from genai_constructs.planner import load_catalog, plan_embedding
from genai_constructs.planner.plans import EmbeddingPlan
from genai_constructs.runtime import batch_worker
from genai_constructs.workload import BatchTraffic, ModelShape

_NAME = "EmbeddingBatchFleet"

# ---- Defaults, each with its reason ---------------------------------------------------------------------------------
DEFAULT_INPUT_PREFIX = "incoming/"
"""New objects under this prefix of the input bucket are queued by S3 event notification."""
DEFAULT_OUTPUT_PREFIX = "embeddings/"
"""Vectors go under this prefix of the output bucket, at the input key plus ``.embeddings.jsonl``."""
DEFAULT_MODEL_PREFIX_TEMPLATE = "models/{model}/"
"""The sentence-transformers model directory in the input bucket; the instances have no route to the Hub."""
DEFAULT_MAX_RECEIVE_COUNT = 5
"""Receives before a message moves to the dead-letter queue: survives a few Spot interruptions and transient S3
errors, while a malformed document (retried alone, see the worker) is set aside within minutes."""
VISIBILITY_MARGIN = 5.0
"""The visibility timeout is five times a message's planned work: a slow batch or cold cache does not expose it to a
second worker (the worker's heartbeat extends it anyway while it is alive)."""
MIN_VISIBILITY_TIMEOUT = Duration.minutes(2)
"""Floor on the timeout: a worker's first batch includes loading the model onto the GPU."""
MAX_VISIBILITY_TIMEOUT = Duration.hours(12)
"""SQS's maximum visibility timeout."""
QUEUE_RETENTION = _launch.WORK_QUEUE_RETENTION
"""SQS's maximum: a backlog waiting for Spot capacity or a paused fleet must not expire (``_launch.work_queues``)."""
LONG_POLL = _launch.WORK_QUEUE_LONG_POLL
"""SQS's maximum long-poll wait: fewest empty receives, lowest cost (``_launch.work_queues``)."""
INPUT_EXPIRATION = Duration.days(30)
"""Objects under the input prefix are staging copies: deleted a month after upload, far past any deadline."""
NONCURRENT_VERSION_EXPIRATION = _launch.NONCURRENT_VERSION_EXPIRATION
"""A retried message overwrites its output; the superseded version is kept a week for audit, then deleted."""
ABORT_INCOMPLETE_UPLOADS = Duration.days(1)
"""Parts of a multipart upload that never completed cost storage and are invisible: drop them after a day."""
ACCESS_LOG_RETENTION = _launch.ACCESS_LOG_RETENTION
"""Three months of server access logs for the staging buckets (``_launch.access_log_bucket``)."""
METRIC_PERIOD = Duration.minutes(1)
"""SQS and Auto Scaling group metrics are per minute, and the workers publish every minute."""
METRIC_NAMESPACE = "GenaiConstructs/Embedding"
"""One namespace for the CloudWatch agent's and the workers' metrics; the Fleet dimension tells fleets apart."""
WORKER_START = Duration.minutes(10)
"""Boot, image pull, model download and load before a new instance takes work: the scaling warm-up."""
SCALE_OUT_AGE = Duration.minutes(2)
"""Work waiting this long with too few workers starts the age-based scale-out (and the first worker from zero)."""
AGE_STEP_FRACTIONS = (0.25, 0.5)
"""Oldest message at a quarter, then half of the deadline: add a quarter of max_instances, then go to the maximum."""
DEFAULT_SCALE_IN_AFTER = Duration.minutes(15)
"""Scale to zero only after the queue has been empty this long: S3 events trickle in, and a GPU instance takes
minutes to come back, so a brief lull must not stop the fleet."""
AGE_ALARM_FRACTION = 0.5
"""Alarm when the oldest message is half the deadline old: time enough to act (raise max_instances, on-demand)."""
STARVED_GPU_UTILIZATION = 20.0
"""Under 20 % GPU utilization with a backlog means the workers wait on S3 or the CPU, not on the GPU."""
STARVED_MINUTES = 30
INSTANCE_STORE_MOUNT = "/mnt/cache"
"""Instance-store NVMe is formatted and mounted here as a disposable cache (model copy, scratch)."""
DEFAULT_WORKER_IMAGE_ACCOUNT = "763104351884"
"""AWS Deep Learning Containers registry: private ECR, reachable through the VPC's ECR endpoints (no internet)."""
DEFAULT_WORKER_IMAGE_REPOSITORY = "huggingface-pytorch-inference"
DEFAULT_WORKER_IMAGE_TAG = "2.6.0-transformers4.51.3-gpu-py312-cu124-ubuntu22.04"
"""Hugging Face PyTorch inference DLC (GPU): torch, transformers and sentence-transformers; the worker's own code is
shipped in the user data. Pin another tag (or your own image) with worker_image_tag / worker_image_repository."""
WORKER_STOP_TIMEOUT_S = 100
"""A worker gets 100 s after SIGTERM to hand messages back: inside Spot's two-minute notice."""
NOTIFICATIONS_HANDLER_ID = _launch.NOTIFICATIONS_HANDLER_ID
"""The stack-level singleton CDK creates for bucket notifications (aws-s3 NotificationsResourceHandler)."""
USER_DATA_LIMIT_BYTES = 16 * 1024
"""EC2's limit on raw user data."""


def worker_code_directory() -> Path:
    """The runtime folder; the fleet ships only batch_worker.py and encoders.py from it (``WORKER_CODE_FILES``)."""
    return Path(batch_worker.__file__).resolve().parent


WORKER_CODE_FILES = ("batch_worker.py", "encoders.py")
"""The worker's code, shipped as a CDK asset (S3) rather than in the user data, which EC2 caps at 16 KB."""


LIFECYCLE_HEARTBEAT_S = 900
"""What the boot script takes as the launch hook's heartbeat timeout (it heartbeats every third of it): the encoder
is small (a few GiB at most), so 15 minutes covers its download and verification several times over."""
MANIFEST_NAME = "SHA256SUMS"
"""The encoder's sha256 manifest at the top of the model prefix, in ``sha256sum`` format: the same format and rules
as the inference fleet's (every file listed, every listed file matching)."""
_USER_DATA_BODY = _launch.user_data_template("embed_worker.sh")
"""The boot script below the settings: the shared ``runtime/userdata/common.sh`` (manifest check, instance metadata,
launch hook), then ``runtime/userdata/embed_worker.sh``."""


class EmbeddingBatchFleet(Construct):
    """Batch embedding on GPU instances: staging buckets, an SQS queue with a DLQ, a scale-to-zero worker group.

    The simplest call::

        EmbeddingBatchFleet(stack, "Embed", network=PrivateDataPath(stack, "Net"),
                            model=ModelShape.preset("bge-large-en-v1.5"),
                            traffic=BatchTraffic(documents=2_000_000, tokens_per_document=800, deadline_hours=12,
                                                 spot_ok=True))

    :param network: the PrivateDataPath the workers launch into.
    :param model: the encoder (``kind="encoder"``).
    :param traffic: the backlog and its deadline.
    :param plan: a plan to use. Default: ``plan_embedding(model, traffic)``.
    :param input_bucket: the bucket documents are staged in. Default: a new KMS-encrypted bucket.
    :param output_bucket: the bucket vectors are written to. Default: a new KMS-encrypted, versioned bucket.
    :param input_prefix: Default: ``DEFAULT_INPUT_PREFIX``.
    :param output_prefix: Default: ``DEFAULT_OUTPUT_PREFIX``.
    :param model_prefix: where the sentence-transformers model directory sits in the input bucket.
        Default: ``DEFAULT_MODEL_PREFIX_TEMPLATE`` with the model's name.
    :param worker_image_repository: ECR repository of a worker image (torch + sentence-transformers).
        Default: the Hugging Face PyTorch inference DLC (``DEFAULT_WORKER_IMAGE_REPOSITORY``).
    :param worker_image_tag: Default: ``DEFAULT_WORKER_IMAGE_TAG`` (only with the default repository or yours).
    :param worker_command: a shell command that runs one worker on the host instead of a container (e.g. a venv
        baked into ``machine_image``); it gets the ``GENAI_*`` settings and ``CUDA_VISIBLE_DEVICES``. Not with
        ``worker_image_repository``.
    :param documents_per_message: keys per message the timeout is sized for.
        Default: ``batch_worker.DEFAULT_DOCUMENTS_PER_MESSAGE`` (what ``genai-constructs enqueue`` sends).
    :param max_receive_count: receives before the dead-letter queue. Default: ``DEFAULT_MAX_RECEIVE_COUNT``.
    :param max_instances: Default: the plan's. :param scale_in_after: Default: ``DEFAULT_SCALE_IN_AFTER``.
    :param warm_pool: a stopped warm pool. Default: False; not allowed with Spot (EC2 Auto Scaling refuses it).
    :param machine_image: Default: the DLAMI (``_launch.gpu_machine_image``).
    :param notifications_topic: SNS topic for alarms. Default: a new KMS-encrypted topic.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        network: PrivateDataPath,
        model: ModelShape,
        traffic: BatchTraffic,
        plan: EmbeddingPlan | None = None,
        input_bucket: s3.IBucket | None = None,
        output_bucket: s3.IBucket | None = None,
        input_prefix: str = DEFAULT_INPUT_PREFIX,
        output_prefix: str = DEFAULT_OUTPUT_PREFIX,
        model_prefix: str | None = None,
        worker_image_repository: ecr.IRepository | None = None,
        worker_image_tag: str | None = None,
        worker_command: str | None = None,
        documents_per_message: int = batch_worker.DEFAULT_DOCUMENTS_PER_MESSAGE,
        max_receive_count: int = DEFAULT_MAX_RECEIVE_COUNT,
        max_instances: int | None = None,
        scale_in_after: Duration = DEFAULT_SCALE_IN_AFTER,
        warm_pool: bool = False,
        machine_image: ec2.IMachineImage | None = None,
        notifications_topic: sns.ITopic | None = None,
    ) -> None:
        _argument_types(
            scope=scope, id=id, network=network, model=model, traffic=traffic, plan=plan, input_bucket=input_bucket,
            output_bucket=output_bucket, input_prefix=input_prefix, output_prefix=output_prefix,
            model_prefix=model_prefix, worker_image_repository=worker_image_repository,
            worker_image_tag=worker_image_tag, worker_command=worker_command,
            documents_per_message=documents_per_message, max_receive_count=max_receive_count,
            max_instances=max_instances, scale_in_after=scale_in_after, warm_pool=warm_pool,
            machine_image=machine_image, notifications_topic=notifications_topic)
        model_prefix = model_prefix if model_prefix is not None else DEFAULT_MODEL_PREFIX_TEMPLATE.format(
            model=model.name)
        _validate(model=model, traffic=traffic, plan=plan, input_bucket=input_bucket, output_bucket=output_bucket,
                  input_prefix=input_prefix, output_prefix=output_prefix, model_prefix=model_prefix,
                  worker_image_repository=worker_image_repository, worker_image_tag=worker_image_tag,
                  worker_command=worker_command, documents_per_message=documents_per_message,
                  max_receive_count=max_receive_count, max_instances=max_instances, scale_in_after=scale_in_after,
                  warm_pool=warm_pool)
        # The stack's region when it is concrete: prices and availability there (fleets/_region.py).
        plan = plan or plan_embedding(model, traffic, region=_region.stack_region(scope))
        problems = _region.region_problems(scope, instance_types=[plan.instance_type, *plan.spot_instance_types])
        if warm_pool and plan.spot and not traffic.spot_ok:
            problems.append(
                "warm_pool=True cannot be combined with Spot: EC2 Auto Scaling does not allow a warm pool on a group "
                "that launches Spot Instances or uses a mixed instances policy. Either set warm_pool=False (Spot "
                "workers start from scratch, which a batch tolerates) or pass BatchTraffic(spot_ok=False)")
        timeout_s = math.ceil(max(MIN_VISIBILITY_TIMEOUT.to_seconds(),
                                  plan.seconds_per_document * documents_per_message * VISIBILITY_MARGIN))
        if timeout_s > MAX_VISIBILITY_TIMEOUT.to_seconds():
            problems.append(
                f"documents_per_message ({documents_per_message}) x seconds_per_document "
                f"({plan.seconds_per_document:g}) x margin {VISIBILITY_MARGIN:g} = {timeout_s} s exceeds SQS's "
                f"{int(MAX_VISIBILITY_TIMEOUT.to_seconds())} s visibility limit: lower documents_per_message")
        if problems:
            raise ConfigurationError(_NAME, problems)
        super().__init__(scope, id)
        _region.warn_about_prices(self, plan_region=plan.region)
        _region.warn_about_quota(self, quota_warning=plan.quota.warning if plan.quota else None)
        self.plan = plan
        self.network = network
        self.input_prefix, self.output_prefix, self.model_prefix = input_prefix, output_prefix, model_prefix
        self.max_receive_count = max_receive_count
        self.documents_per_message = documents_per_message
        self.max_instances = max_instances if max_instances is not None else plan.max_instances
        self.fleet_name = Names.unique_resource_name(self, max_length=64)
        self.visibility_timeout = Duration.seconds(timeout_s)
        catalog = load_catalog()
        accelerator: _launch.AcceleratorKind = "neuron" if plan.is_neuron else "nvidia"

        # ---- Key, topic, logs ----------------------------------------------------------------------------------
        foundations = _launch.fleet_foundations(
            self, key_description=f"{_NAME} {self.node.path}: buckets, EBS, topic, logs",
            topic_display_name=f"{_NAME} alarms and scaling notifications", notifications_topic=notifications_topic)
        self.encryption_key = foundations.encryption_key
        self.topic: sns.ITopic = foundations.topic
        self.log_group = foundations.log_group

        # ---- 1. Staging ----------------------------------------------------------------------------------------
        self.access_log_bucket: s3.Bucket | None = None
        if input_bucket is None or output_bucket is None:
            self.access_log_bucket = _launch.access_log_bucket(
                self, "AccessLogs", source="the staging buckets' server access logs",
                delivery="S3 server access logs",
                encryption_reason="S3 server access log delivery supports only SSE-S3 on the destination bucket, "
                                  "not SSE-KMS")
        self.input_bucket: s3.IBucket = input_bucket or s3.Bucket(
            self, "InputBucket", encryption=s3.BucketEncryption.KMS, encryption_key=self.encryption_key,
            bucket_key_enabled=True, enforce_ssl=True, block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED, removal_policy=RemovalPolicy.RETAIN,
            versioned=True,
            lifecycle_rules=[
                s3.LifecycleRule(id="ExpireStagedDocuments", prefix=input_prefix, expiration=INPUT_EXPIRATION),
                s3.LifecycleRule(id="ExpireOverwrittenDocuments",
                                 noncurrent_version_expiration=NONCURRENT_VERSION_EXPIRATION),
                s3.LifecycleRule(id="AbortIncompleteUploads", abort_incomplete_multipart_upload_after=ABORT_INCOMPLETE_UPLOADS),
            ])
        self.output_bucket: s3.IBucket = output_bucket or s3.Bucket(
            self, "OutputBucket", encryption=s3.BucketEncryption.KMS, encryption_key=self.encryption_key,
            bucket_key_enabled=True, enforce_ssl=True, block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED, removal_policy=RemovalPolicy.RETAIN,
            versioned=True,
            lifecycle_rules=[s3.LifecycleRule(
                id="ExpireSupersededVectors", noncurrent_version_expiration=NONCURRENT_VERSION_EXPIRATION,
                abort_incomplete_multipart_upload_after=ABORT_INCOMPLETE_UPLOADS)])
        for created_bucket, log_prefix in ((input_bucket is None and self.input_bucket, "input/"),
                                           (output_bucket is None and self.output_bucket, "output/")):
            if isinstance(created_bucket, s3.Bucket):
                assert self.access_log_bucket is not None  # made above whenever the fleet makes a bucket
                _launch.log_server_access(created_bucket, self.access_log_bucket, log_prefix)
        for created, why in (
            (input_bucket is None and self.input_bucket,
             "Staged copies of documents whose system of record is elsewhere; a lost region means re-staging them"),
            (output_bucket is None and self.output_bucket,
             "Vectors are derived data: re-embedding the input rebuilds them; a replica would double storage"),
        ):
            if created:
                _launch.acknowledge(created, {f"{pack}-S3BucketReplicationEnabled": why
                                              for pack in ("NIST.800.53.R5", "HIPAA.Security")})
        network.allow_bucket(self.input_bucket)
        network.allow_bucket(self.output_bucket, write=True)

        # ---- 2. Queue ------------------------------------------------------------------------------------------
        # A key of its own: S3 must use it to deliver notifications, so its policy names the input bucket, while the
        # bucket is encrypted with the fleet key; one key for both would make the key and the bucket a cycle.
        self.queue_key = kms.Key(self, "QueueKey", enable_key_rotation=True,
                                 description=f"{_NAME} {self.node.path}: input and dead-letter queues")
        self.queue, self.dead_letter_queue = _launch.work_queues(
            self, key=self.queue_key, visibility_timeout=self.visibility_timeout, max_receive_count=max_receive_count)
        # S3 -> SQS for new objects under the input prefix; SqsDestination also lets s3.amazonaws.com use the
        # queue's key (GenerateDataKey, Decrypt) in the key policy, without which S3 cannot deliver.
        self.input_bucket.add_event_notification(
            s3.EventType.OBJECT_CREATED, s3n.SqsDestination(self.queue), s3.NotificationKeyFilter(prefix=input_prefix))
        _launch.acknowledge_bucket_notifications(self.input_bucket)

        # ---- 6. IAM --------------------------------------------------------------------------------------------
        if worker_command:
            self.worker_image_uri = ""
            repository: ecr.IRepository | None = None
        else:
            repository = worker_image_repository or ecr.Repository.from_repository_attributes(
                self, "DefaultWorkerImageRepository", repository_name=DEFAULT_WORKER_IMAGE_REPOSITORY,
                repository_arn=f"arn:{Aws.PARTITION}:ecr:{Aws.REGION}:{DEFAULT_WORKER_IMAGE_ACCOUNT}:repository/"
                               f"{DEFAULT_WORKER_IMAGE_REPOSITORY}")
            self.worker_image_uri = repository.repository_uri_for_tag(worker_image_tag or DEFAULT_WORKER_IMAGE_TAG)
        self.worker_code = s3_assets.Asset(
            self, "WorkerCode", path=str(worker_code_directory()),
            exclude=["*", *(f"!{name}" for name in WORKER_CODE_FILES)])
        network.allow_bucket_name(self.worker_code.s3_bucket_name)
        # A warm-pool instance completes the launch hook itself once the encoder and image are on its EBS root
        # (Auto Scaling would otherwise stop it mid-download); without a warm pool there is no hook to complete.
        self.lifecycle_hook_name = _launch.LAUNCH_HOOK_NAME if warm_pool else ""
        self.auto_scaling_group_physical_name = _launch.auto_scaling_group_name(self, "AutoScalingGroup")
        self.instance_policy = self._instance_policy(repository)
        self.role = iam.Role(
            self, "InstanceRole", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            managed_policies=[self.instance_policy],
            description=f"{_NAME} workers: read staged documents, write vectors, consume the queue, logs, metrics")
        self.security_group = ec2.SecurityGroup(
            self, "InstanceSecurityGroup", vpc=network.vpc, allow_all_outbound=False,
            description=f"{_NAME} workers: no inbound; HTTPS out to the VPC endpoints only"
            if network.internet_routes is False else
            f"{_NAME} workers: no inbound; HTTPS out (the VPC endpoints, and wherever the VPC routes)")
        self.security_group.add_egress_rule(
            ec2.Peer.any_ipv4(), ec2.Port.tcp(443), network.instance_egress_description)

        # ---- 3. Workers ----------------------------------------------------------------------------------------
        instance = catalog.instance(plan.instance_type)
        self.instance_store_cache = instance.instance_store_gb > 0
        agent_config = _launch.cloudwatch_agent_config(
            namespace=METRIC_NAMESPACE, log_group_name=self.log_group.log_group_name, fleet=self.fleet_name,
            log_files={"/var/log/genai/worker.log": "worker", "/var/log/genai/bootstrap.log": "bootstrap"},
            accelerator=accelerator, emf_listener=False)
        self.warm_pool = warm_pool
        self.user_data_script = self._user_data(agent_config, worker_command)
        self.launch_template = _launch.build_gpu_launch_template(
            self, "LaunchTemplate", instance_type=plan.instance_type, accelerator=accelerator, role=self.role,
            security_group=self.security_group,
            # A Stopped warm-pool instance boots again when it is put in service: the script must run then too.
            user_data=_launch.user_data_from_script(self.user_data_script, every_boot=warm_pool),
            root_volume_size_gib=_launch.root_volume_gib(plan.weights_gib), encryption_key=self.encryption_key,
            machine_image=machine_image)
        spot_types = list(dict.fromkeys([plan.instance_type, *plan.spot_instance_types]))
        mixed = autoscaling.MixedInstancesPolicy(
            launch_template=self.launch_template,
            launch_template_overrides=[autoscaling.LaunchTemplateOverrides(instance_type=ec2.InstanceType(t))
                                       for t in spot_types],
            instances_distribution=autoscaling.InstancesDistribution(
                on_demand_base_capacity=0, on_demand_percentage_above_base_capacity=0,
                spot_allocation_strategy=autoscaling.SpotAllocationStrategy.PRICE_CAPACITY_OPTIMIZED),
        ) if plan.spot else None
        self.auto_scaling_group = autoscaling.AutoScalingGroup(
            self, "AutoScalingGroup", vpc=network.vpc, vpc_subnets=network.subnet_selection,
            auto_scaling_group_name=self.auto_scaling_group_physical_name,
            launch_template=None if mixed else self.launch_template, mixed_instances_policy=mixed,
            capacity_rebalance=True if mixed else None,
            min_capacity=0, max_capacity=self.max_instances, default_instance_warmup=WORKER_START,
            group_metrics=[autoscaling.GroupMetrics.all()],
            notifications=[autoscaling.NotificationConfiguration(topic=self.topic)])
        if mixed:
            _launch.acknowledge(self.auto_scaling_group, {
                "AwsSolutions-EC26":
                    "The rule cannot follow a mixed instances policy to its launch template (it throws on the "
                    "intrinsic); the launch template's only volume is the KMS-encrypted gp3 root",
                **{f"{pack}-EC2IMDSv2Enabled":
                   "The rule cannot follow a mixed instances policy to its launch template; the launch template "
                   "requires IMDSv2 (HttpTokens=required, checked by the local deploy)"
                   for pack in ("NIST.800.53.R5", "HIPAA.Security")},
            })
        if warm_pool:
            # The hook holds a warm-pool launch until the encoder is verified on the EBS root; the script heartbeats
            # every third of LIFECYCLE_HEARTBEAT_S while it works.
            _launch.add_launch_hook(self.auto_scaling_group, heartbeat_s=LIFECYCLE_HEARTBEAT_S)
            self.auto_scaling_group.add_warm_pool(pool_state=autoscaling.PoolState.STOPPED, min_size=0)

        # ---- 4. Scaling ----------------------------------------------------------------------------------------
        self.backlog_per_instance_target = max(1, math.floor(
            plan.documents_per_s_per_instance * traffic.deadline_hours * 3600 * (1 - traffic.headroom)
            / documents_per_message))
        self._scaling(traffic, scale_in_after)

        # ---- 7. Observability ----------------------------------------------------------------------------------
        self.alarms = self._alarms(traffic)
        self.dashboard = self._dashboard(traffic)
        CfnOutput(self, "QueueUrl", value=self.queue.queue_url, description="genai-constructs enqueue --queue-url")
        CfnOutput(self, "InputLocation", value=f"s3://{self.input_bucket.bucket_name}/{input_prefix}")
        CfnOutput(self, "ModelLocation", value=f"s3://{self.input_bucket.bucket_name}/{model_prefix}",
                  description="Upload the sentence-transformers model directory here before the first document")
        CfnOutput(self, "OutputLocation", value=f"s3://{self.output_bucket.bucket_name}/{output_prefix}")

    # ---- IAM ------------------------------------------------------------------------------------------------------
    def _instance_policy(self, repository: ecr.IRepository | None) -> iam.ManagedPolicy:
        """The instance role's only permissions: one customer-managed policy on exact prefixes, queue and key."""
        ib, ob = self.input_bucket.bucket_arn, self.output_bucket.bucket_arn
        statements = [
            iam.PolicyStatement(sid="ReadStagedDocumentsAndModel", actions=["s3:GetObject"],
                                resources=[f"{ib}/{self.input_prefix}*", f"{ib}/{self.model_prefix}*"]),
            iam.PolicyStatement(sid="ListModel", actions=["s3:ListBucket"], resources=[ib],
                                conditions={"StringLike": {"s3:prefix": [self.model_prefix, f"{self.model_prefix}*"]}}),
            iam.PolicyStatement(sid="ReadWorkerCode", actions=["s3:GetObject"],
                                resources=[self.worker_code.bucket.arn_for_objects(self.worker_code.s3_object_key)]),
            iam.PolicyStatement(sid="WriteVectors", actions=["s3:PutObject"], resources=[f"{ob}/{self.output_prefix}*"]),
            iam.PolicyStatement(
                sid="ConsumeQueue", resources=[self.queue.queue_arn],
                actions=["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility",
                         "sqs:GetQueueAttributes", "sqs:GetQueueUrl", "sqs:SendMessage"]),
            iam.PolicyStatement(
                sid="UseFleetKeys", resources=[self.encryption_key.key_arn, self.queue_key.key_arn],
                actions=["kms:Decrypt", "kms:GenerateDataKey"]),
        ]
        for name, bucket in (("Input", self.input_bucket), ("Output", self.output_bucket)):
            key = bucket.encryption_key
            if key is not None and key is not self.encryption_key:
                statements.append(iam.PolicyStatement(
                    sid=f"Use{name}BucketKey", resources=[key.key_arn],
                    actions=["kms:Decrypt"] + (["kms:GenerateDataKey"] if name == "Output" else [])))
        hook_findings: dict[str, str] = {}
        if self.lifecycle_hook_name:
            hook_statement, hook_findings = _launch.launch_hook_statement([self.auto_scaling_group_physical_name])
            statements.append(hook_statement)
        policy = _launch.instance_policy(
            self, statements=statements, log_group_arn=self.log_group.log_group_arn, metric_namespace=METRIC_NAMESPACE,
            image_repository=repository, image_sid="PullWorkerImage",
            description=f"{_NAME} workers: staged documents, vectors, queue, key, logs, metrics")
        acknowledgments: dict[str, str] = {}
        for bucket, prefix, why in (
            (self.input_bucket, self.input_prefix, "every staged document under the input prefix: keys are data"),
            (self.input_bucket, self.model_prefix, "the model directory's files (names vary by model)"),
            (self.output_bucket, self.output_prefix, "one vectors object per input key under the output prefix"),
        ):
            resource = (f"<{self._logical_id(bucket)}.Arn>" if isinstance(bucket, s3.Bucket) and bucket.node.scope is self
                        else f"arn:<AWS::Partition>:s3:::{bucket.bucket_name}")
            acknowledgments[f"AwsSolutions-IAM5[Resource::{resource}/{prefix}*]"] = f"Objects under an exact prefix: {why}"
        _launch.acknowledge(policy, {**acknowledgments, **hook_findings})
        return policy

    def _logical_id(self, bucket: s3.IBucket) -> str:
        return Stack.of(self).get_logical_id(cast(CfnElement, bucket.node.default_child))

    # ---- User data ------------------------------------------------------------------------------------------------
    def _user_data(self, agent_config: dict[str, object], worker_command: str | None) -> str:
        settings = {
            "QUEUE_URL": self.queue.queue_url,
            "OUTPUT_BUCKET": self.output_bucket.bucket_name,
            "OUTPUT_PREFIX": self.output_prefix,
            "MODEL_BUCKET": self.input_bucket.bucket_name,
            "MODEL_PREFIX": self.model_prefix,
            "MANIFEST_NAME": MANIFEST_NAME,
            "BATCH_SIZE": str(self.plan.batch_size),
            "MAX_CONCURRENCY": str(self.plan.max_concurrency_per_worker),
            "CHUNK_TOKENS": str(self.plan.traffic.sequence_tokens),
            "VISIBILITY_TIMEOUT_S": str(int(self.visibility_timeout.to_seconds())),
            "METRIC_NAMESPACE": METRIC_NAMESPACE,
            "FLEET_NAME": self.fleet_name,
            "AWS_REGION_NAME": Aws.REGION,
            "INSTANCE_STORE_MOUNT": INSTANCE_STORE_MOUNT,
            "WORKER_STOP_TIMEOUT_S": str(WORKER_STOP_TIMEOUT_S),
            "MODEL_CACHE_ON_EBS": "1" if self.warm_pool else "0",
            "WORKER_IMAGE": self.worker_image_uri,
            "WORKER_COMMAND": worker_command or "",
            "CW_AGENT_CONFIG": json.dumps(agent_config, sort_keys=True, separators=(",", ":")),
            "WORKER_CODE_BUCKET": self.worker_code.s3_bucket_name,
            "WORKER_CODE_KEY": self.worker_code.s3_object_key,
            "LIFECYCLE_HOOK_NAME": self.lifecycle_hook_name,
            "AUTO_SCALING_GROUP_NAME": self.auto_scaling_group_physical_name,
            "LIFECYCLE_HEARTBEAT_S": str(LIFECYCLE_HEARTBEAT_S),
        }
        return _launch.render_boot_script("genai_constructs.fleets.embedding", settings, _USER_DATA_BODY)

    # ---- Scaling --------------------------------------------------------------------------------------------------
    def metric_approximate_number_of_messages_visible(self) -> cw.Metric:
        return self.queue.metric_approximate_number_of_messages_visible(period=Duration.minutes(1), statistic="Maximum")

    def metric_approximate_age_of_oldest_message(self) -> cw.Metric:
        return self.queue.metric_approximate_age_of_oldest_message(period=Duration.minutes(1), statistic="Maximum")

    def metric_group_in_service_instances(self) -> cw.Metric:
        return cw.Metric(namespace="AWS/AutoScaling", metric_name="GroupInServiceInstances", statistic="Average",
                         period=Duration.minutes(1),
                         dimensions_map={"AutoScalingGroupName": self.auto_scaling_group.auto_scaling_group_name})

    def metric_backlog_per_instance(self) -> cw.MathExpression:
        """Visible messages per in-service worker instance (the scaling signal)."""
        return cw.MathExpression(
            expression="visible / IF(inservice < 1, 1, inservice)", label="Backlog per instance (messages)",
            using_metrics={"visible": self.metric_approximate_number_of_messages_visible(),
                           "inservice": self.metric_group_in_service_instances()},
            period=Duration.minutes(1))

    def _scaling(self, traffic: BatchTraffic, scale_in_after: Duration) -> None:
        """The three policies of ``_launch.queue_scaling``: backlog per instance against the deadline (scale-in left to
        the empty-queue policy), the oldest message's age (also what starts the first worker from zero), and to zero
        once the queue (visible and in flight) has been empty ``scale_in_after``."""
        scaling = _launch.queue_scaling(
            self, group=self.auto_scaling_group, queue=self.queue,
            backlog_per_instance=self.backlog_per_instance_target, deadline_s=traffic.deadline_hours * 3600,
            max_instances=self.max_instances, warmup=WORKER_START, scale_out_age=SCALE_OUT_AGE,
            age_step_fractions=AGE_STEP_FRACTIONS, scale_in_after=scale_in_after, name=_NAME,
            scale_out_action="add workers", scale_in_action="scale the workers to zero")
        self.backlog_policy = scaling.backlog_policy
        self.age_scale_out = scaling.age_scale_out
        self.age_step_thresholds_s = scaling.age_step_thresholds_s
        self.age_alarm_for_scaling = scaling.age_alarm
        self.scale_in_to_zero = scaling.scale_in_to_zero
        self.queue_empty_alarm = scaling.queue_empty_alarm

    # ---- Observability --------------------------------------------------------------------------------------------
    def _fleet_metric(self, name: str, statistic: str, label: str, period: Duration = METRIC_PERIOD) -> cw.Metric:
        return cw.Metric(namespace=METRIC_NAMESPACE, metric_name=name, dimensions_map={"Fleet": self.fleet_name},
                         statistic=statistic, period=period, label=label)

    def metric_documents_embedded(self) -> cw.Metric:
        """Documents the workers wrote vectors for, per minute."""
        return self._fleet_metric("DocumentsEmbedded", "Sum", "Documents per minute")

    def metric_vectors_written(self, period: Duration = METRIC_PERIOD) -> cw.Metric:
        """Vectors (chunks) written, per period."""
        return self._fleet_metric("VectorsWritten", "Sum", "Vectors per minute", period)

    def metric_gpu_utilization(self) -> cw.Metric:
        return self._fleet_metric("nvidia_smi_utilization_gpu", "Average", "GPU utilization (%)")

    def metric_gpu_memory_used_percent(self) -> cw.MathExpression:
        return cw.MathExpression(
            expression="100 * used / total", label="GPU memory used (%)", period=Duration.minutes(1),
            using_metrics={"used": self._fleet_metric("nvidia_smi_memory_used", "Maximum", "used"),
                           "total": self._fleet_metric("nvidia_smi_memory_total", "Maximum", "total")})

    def metric_usd_per_million_vectors(self) -> cw.MathExpression | None:
        """Compute cost of a million vectors per hour: instances x price / vectors x 1e6.

        The price is the one the fleet buys at: the plan's regional Spot estimate for a Spot fleet where one is known
        (labelled an estimate: Spot prices move), else its on-demand price.
        """
        spot_price = self.plan.spot_usd_per_hour if self.plan.spot else None
        price = spot_price if spot_price is not None else self.plan.usd_per_hour
        if price is None:
            return None
        hour = Duration.hours(1)
        label = "USD per 1M vectors" + (" (Spot estimate)" if spot_price is not None else " (on-demand)")
        return cw.MathExpression(
            expression=f"IF(vectors > 0, inservice * {price:g} / vectors * 1000000, 0)",
            label=label, period=hour,
            using_metrics={"inservice": cw.Metric(
                namespace="AWS/AutoScaling", metric_name="GroupInServiceInstances", statistic="Average", period=hour,
                dimensions_map={"AutoScalingGroupName": self.auto_scaling_group.auto_scaling_group_name}),
                "vectors": self.metric_vectors_written(hour)})

    def _alarms(self, traffic: BatchTraffic) -> dict[str, cw.Alarm]:
        deadline_s = traffic.deadline_hours * 3600
        action = cw_actions.SnsAction(self.topic)
        alarms = {
            "OldestMessageAgainstDeadline": _launch.oldest_message_alarm(
                self, queue=self.queue, threshold_s=AGE_ALARM_FRACTION * deadline_s,
                description=f"{_NAME}: the oldest message is half the {traffic.deadline_hours:g} h deadline old; "
                            "raise max_instances or allow on-demand capacity"),
            "DeadLetterQueueNotEmpty": _launch.queue_not_empty_alarm(
                self, "DeadLetterQueueNotEmptyAlarm", queue=self.dead_letter_queue,
                description=f"{_NAME}: a document failed {self.max_receive_count} times and sits in the "
                            "dead-letter queue; the worker log names the key and the reason"),
            "QueueDepth": cw.Alarm(
                self, "QueueDepthAlarm", metric=self.metric_approximate_number_of_messages_visible(),
                threshold=self.backlog_per_instance_target * self.max_instances, evaluation_periods=15,
                comparison_operator=cw.ComparisonOperator.GREATER_THAN_THRESHOLD,
                treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
                alarm_description=f"{_NAME}: more messages wait than max_instances can finish by the deadline"),
            "NoWorkersInService": cw.Alarm(
                self, "NoWorkersInServiceAlarm",
                metric=cw.MathExpression(
                    expression="IF(FILL(visible, 0) > 0 AND FILL(inservice, 0) < 1, 1, 0)",
                    label="Work waiting with no worker in service", period=Duration.minutes(1),
                    using_metrics={"visible": self.metric_approximate_number_of_messages_visible(),
                                   "inservice": self.metric_group_in_service_instances()}),
                threshold=1, evaluation_periods=int(WORKER_START.to_minutes()) + 5,
                comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
                alarm_description=f"{_NAME}: work has waited with no worker in service past the start-up time "
                                  "(no Spot capacity, a failing launch, or a worker that cannot start)"),
            "GpuStarved": cw.Alarm(
                self, "GpuStarvedAlarm",
                metric=cw.MathExpression(
                    expression=f"IF(FILL(visible, 0) > 0 AND gpu < {STARVED_GPU_UTILIZATION:g}, 1, 0)",
                    label="Backlog while the GPUs idle", period=Duration.minutes(1),
                    using_metrics={"visible": self.metric_approximate_number_of_messages_visible(),
                                   "gpu": self.metric_gpu_utilization()}),
                threshold=1, evaluation_periods=STARVED_MINUTES,
                comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
                alarm_description=f"{_NAME}: a backlog waits while GPU utilization stays under "
                                  f"{STARVED_GPU_UTILIZATION:g} %: the workers wait on S3 or CPU (object sizes?)"),
        }
        for alarm in alarms.values():
            alarm.add_alarm_action(action)
        return alarms

    def _dashboard(self, traffic: BatchTraffic) -> cw.Dashboard:
        deadline = cw.HorizontalAnnotation(value=traffic.deadline_hours * 3600, label="deadline")
        width, height = 8, 6

        def graph(title: str, left: list[cw.IMetric], right: list[cw.IMetric] | None = None,
                  annotations: list[cw.HorizontalAnnotation] | None = None) -> cw.GraphWidget:
            return cw.GraphWidget(title=title, left=left, right=right or [], left_annotations=annotations or [],
                                  width=width, height=height)

        cost = self.metric_usd_per_million_vectors()
        dashboard = cw.Dashboard(self, "Dashboard", default_interval=Duration.hours(12))
        dashboard.add_widgets(
            graph("Queue depth (messages)", [self.metric_approximate_number_of_messages_visible(),
                                             self.queue.metric_approximate_number_of_messages_not_visible()]),
            graph("Age of oldest message (s)", [self.metric_approximate_age_of_oldest_message()],
                  annotations=[deadline]),
            graph("Dead-letter queue (messages)",
                  [self.dead_letter_queue.metric_approximate_number_of_messages_visible()]))
        dashboard.add_widgets(
            graph("Workers in service", [self.metric_group_in_service_instances()],
                  right=[self.metric_backlog_per_instance()]),
            graph("GPU utilization and memory (%)", [self.metric_gpu_utilization(),
                                                     self.metric_gpu_memory_used_percent()]),
            graph("Documents and vectors per minute", [self.metric_documents_embedded(),
                                                       self.metric_vectors_written()]))
        if cost is not None:
            dashboard.add_widgets(graph("Cost per 1M vectors (USD, compute)", [cost]))
        return dashboard


def _prefix_problem(argument: str, value: str) -> str | None:
    """A key prefix that S3 notifications, lifecycle rules and IAM ARNs take literally, or why not."""
    if not isinstance(value, str) or (value and (not value.endswith("/") or value.startswith("/"))):
        return (f"{argument} ({value!r}) must end in '/' and not start with '/' (or be '' for the whole bucket): "
                f"e.g. {argument}='docs/'")
    if value.startswith(("s3://", "arn:")) or "//" in value:
        return (f"{argument} ({value!r}) is a key prefix inside the bucket, not a URL, an ARN or a path with an "
                f"empty segment: e.g. {argument}='docs/'")
    if any(c in value for c in "*?$") or any(ord(c) < 32 or ord(c) == 127 for c in value):
        return (f"{argument} ({value!r}) holds '*', '?', '$' or a control character: in the workers' IAM ARNs '*' "
                "and '?' are wildcards that widen the grant, and S3 event filters take them literally; use "
                "letters, digits and '-_./'")
    return None


def _argument_types(
    *, scope: object, id: object, network: object, model: object, traffic: object, plan: object,
    input_bucket: object, output_bucket: object, input_prefix: object, output_prefix: object, model_prefix: object,
    worker_image_repository: object, worker_image_tag: object, worker_command: object,
    documents_per_message: object, max_receive_count: object, max_instances: object, scale_in_after: object,
    warm_pool: object, machine_image: object, notifications_topic: object,
) -> None:
    """Every argument's type and finiteness, before anything uses it; raises with all of them at once. Ranges are
    ``_validate``'s, which lists them together with the other problems."""
    problems: list[str] = []
    checks.instance_of(problems, "scope", scope, Construct, allowed="a construct (a Stack)",
                       fix=f"pass the stack: {_NAME}(stack, 'Embed', ...)")
    checks.text(problems, "id", id, fix=f"pass the construct id: {_NAME}(stack, 'Embed', ...)")
    checks.id_in_use(problems, scope, id, construct=_NAME)
    checks.instance_of(problems, "network", network, PrivateDataPath, allowed="a PrivateDataPath",
                       fix="pass the PrivateDataPath itself (network=net, not net.vpc); for a VPC of your own, wrap "
                           "it: PrivateDataPath(stack, 'Net', vpc=vpc)")
    checks.instance_of(problems, "model", model, ModelShape, allowed="a ModelShape",
                       fix="e.g. model=ModelShape.preset('bge-large-en-v1.5')")
    checks.instance_of(problems, "traffic", traffic, BatchTraffic, allowed="a BatchTraffic",
                       fix="e.g. traffic=BatchTraffic(documents=2_000_000, tokens_per_document=800, deadline_hours=12)")
    checks.instance_of(problems, "plan", plan, EmbeddingPlan, optional=True, allowed="an EmbeddingPlan",
                       fix="pass plan=plan_embedding(model, traffic), or omit it")
    for argument, value in (("input_bucket", input_bucket), ("output_bucket", output_bucket)):
        checks.cdk_interface(problems, argument, value, attributes=("bucket_arn", "bucket_name"),
                             allowed="an s3.IBucket",
                             fix=f"pass the bucket construct, e.g. s3.Bucket.from_bucket_name(stack, 'Docs', "
                                 f"'my-docs'), not its name; or omit {argument} for a new one")
    for argument, value, optional in (("input_prefix", input_prefix, False), ("output_prefix", output_prefix, False),
                                      ("model_prefix", model_prefix, True)):
        checks.text(problems, argument, value, optional=optional, empty=True, fix=f"e.g. {argument}='docs/'")
    checks.cdk_interface(problems, "worker_image_repository", worker_image_repository,
                         attributes=("repository_uri_for_tag", "repository_arn"), allowed="an ecr.IRepository",
                         fix="e.g. ecr.Repository.from_repository_name(stack, 'Repo', 'my-worker')")
    checks.text(problems, "worker_image_tag", worker_image_tag, optional=True, fix="e.g. worker_image_tag='1.0'")
    checks.text(problems, "worker_command", worker_command, optional=True, empty=True,
                fix="the shell command that starts one worker, e.g. '/opt/venv/bin/python -m worker'")
    checks.whole_number(problems, "documents_per_message", documents_per_message, minimum=None,
                        fix=f"the enqueue CLI sends {batch_worker.DEFAULT_DOCUMENTS_PER_MESSAGE}")
    checks.whole_number(problems, "max_receive_count", max_receive_count, minimum=None,
                        fix=f"SQS's range; the default is {DEFAULT_MAX_RECEIVE_COUNT}")
    checks.whole_number(problems, "max_instances", max_instances, minimum=None, optional=True,
                        fix="the most workers at once, e.g. 8, or None for the plan's")
    checks.instance_of(problems, "scale_in_after", scale_in_after, Duration, allowed="a Duration",
                       fix="e.g. scale_in_after=Duration.minutes(15)")
    checks.flag(problems, "warm_pool", warm_pool)
    checks.cdk_interface(problems, "machine_image", machine_image, attributes=("get_image",),
                         allowed="an ec2.IMachineImage", fix="e.g. ec2.MachineImage.generic_linux({...})")
    checks.cdk_interface(problems, "notifications_topic", notifications_topic, attributes=("topic_arn",),
                         allowed="an sns.ITopic", fix="e.g. sns.Topic.from_topic_arn(stack, 'Topic', 'arn:aws:sns:...')")
    if problems:
        raise ConfigurationError(_NAME, problems)


def _validate(*, model: ModelShape, traffic: BatchTraffic, plan: EmbeddingPlan | None,
              input_bucket: s3.IBucket | None, output_bucket: s3.IBucket | None, input_prefix: str,
              output_prefix: str, model_prefix: str, worker_image_repository: ecr.IRepository | None,
              worker_image_tag: str | None, worker_command: str | None, documents_per_message: int,
              max_receive_count: int, max_instances: int | None, scale_in_after: Duration, warm_pool: bool) -> None:
    """Every problem with the arguments at once, each naming the argument, the value, what is allowed and the fix."""
    problems: list[str] = []
    if model.kind != "encoder":
        problems.append(f"model ({model.name!r}) is a {model.kind}; an embedding fleet runs an encoder: pass an "
                        "encoder preset such as ModelShape.preset('bge-large-en-v1.5') or kind='encoder'")
    if plan is not None and (plan.model.name != model.name or plan.traffic != traffic):
        problems.append(f"plan was made for model {plan.model.name!r} and other traffic, not for model "
                        f"{model.name!r} and the traffic given: pass plan=plan_embedding(model, traffic) or omit plan")
    for argument, value in (("input_prefix", input_prefix), ("output_prefix", output_prefix),
                            ("model_prefix", model_prefix)):
        problem = _prefix_problem(argument, value)
        if problem:
            problems.append(problem)
    if model_prefix == "" or (isinstance(model_prefix, str) and model_prefix.startswith(input_prefix)):
        problems.append(f"model_prefix ({model_prefix!r}) lies under input_prefix ({input_prefix!r}): the model's "
                        "files would be queued as documents; use a separate prefix such as 'models/<name>/'")
    if input_bucket is not None and input_bucket is output_bucket and (
            output_prefix.startswith(input_prefix) or input_prefix.startswith(output_prefix)):
        problems.append(f"output_prefix ({output_prefix!r}) and input_prefix ({input_prefix!r}) overlap in the same "
                        "bucket: every output would be queued as a new document, forever; use disjoint prefixes")
    if worker_image_repository is not None and worker_command is not None:
        problems.append("worker_image_repository and worker_command were both given: a worker runs either the "
                        "image or the command; pass one")
    if worker_image_tag is not None and worker_command is not None:
        problems.append(f"worker_image_tag ({worker_image_tag!r}) was given with worker_command: the tag only "
                        "applies to an image; drop worker_image_tag or worker_command")
    if worker_command is not None and not worker_command.strip():
        problems.append("worker_command ('') is empty: give the command that starts one worker, or omit it to run "
                        "the worker image")
    if not 1 <= documents_per_message <= 10_000:
        problems.append(f"documents_per_message ({documents_per_message}) must be between 1 and 10000: "
                        f"the enqueue CLI sends {batch_worker.DEFAULT_DOCUMENTS_PER_MESSAGE}")
    if not 1 <= max_receive_count <= 1000:
        problems.append(f"max_receive_count ({max_receive_count}) must be between 1 and 1000 (SQS's range): "
                        f"the default is {DEFAULT_MAX_RECEIVE_COUNT}")
    if max_instances is not None and max_instances < 1:
        problems.append(f"max_instances ({max_instances}) must be >= 1: the group scales between 0 and it")
    minutes = scale_in_after.to_seconds() / 60 if not scale_in_after.is_unresolved() else 1
    if not 1 <= minutes <= 24 * 60:
        problems.append(f"scale_in_after ({scale_in_after.to_human_string()}) must be between 1 minute and 1 day: "
                        "it is how long the queue must stay empty before the workers stop")
    if warm_pool and traffic.spot_ok:
        problems.append(
            "warm_pool=True cannot be combined with Spot (traffic.spot_ok=True): EC2 Auto Scaling does not allow a "
            "warm pool on a group that launches Spot Instances or uses a mixed instances policy. Either set "
            "warm_pool=False (Spot workers start from scratch, which a batch tolerates) or pass "
            "BatchTraffic(spot_ok=False)")
    if problems:
        raise ConfigurationError(_NAME, problems)
