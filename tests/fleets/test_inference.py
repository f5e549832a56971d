"""GpuInferenceFleet: one synthesis per variant (module-scoped), fine-grained assertions per numbered point.

Variants:
- ``chat8b``: the simplest call for an 8B chat (G family) with plain HTTP opted in, cdk-nag AwsSolutions.
- ``chat70b``: a 70B chat (P family, 8 GPUs) over HTTPS, blue/green at 10 %, cluster placement group, a KMS-encrypted
  artifact, in a stack with a region, cdk-nag AwsSolutions, NIST 800-53 R5 and HIPAA Security.
- ``neuron8b``: an 8B chat on inf2 with its own image and no warm pool, cdk-nag AwsSolutions.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aws_cdk import App, Environment, Stack
from aws_cdk import aws_certificatemanager as acm
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_wafv2 as wafv2
from aws_cdk.assertions import Match, Template

from genai_constructs.fleets import GpuInferenceFleet
from genai_constructs.fleets import inference as fleet_module
from genai_constructs.network import PrivateDataPath
from genai_constructs.workload import ModelArtifact, ModelShape, RealtimeTraffic
from tests.support import resources_of_type, synth_app

SHELLCHECK = Path(sys.executable).parent / "shellcheck"
TRAFFIC_8B = RealtimeTraffic(concurrent_sessions=32, output_tokens_per_s_per_session=20)
TRAFFIC_70B = RealtimeTraffic(concurrent_sessions=64, output_tokens_per_s_per_session=20)
ARTIFACT_8B = ModelArtifact(bucket_name="my-models", prefix="llama-3.1-8b/")
KEY_ARN = "arn:aws:kms:us-east-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab"
ARTIFACT_70B = ModelArtifact(bucket_name="big-models", prefix="llama-3.1-70b/", version="2024-07", kms_key_arn=KEY_ARN)
GREEN_70B = ModelArtifact(bucket_name="big-models", prefix="llama-3.1-70b-v2/", version="2024-09", kms_key_arn=KEY_ARN)
CERT_ARN = "arn:aws:acm:us-east-1:111122223333:certificate/abcd"


@dataclass
class Synth:
    fleet: GpuInferenceFleet
    template: Template
    raw: dict[str, Any]
    violations: list[str]

    def only(self, resource_type: str) -> dict[str, Any]:
        (resource,) = resources_of_type(self.raw, resource_type).values()
        return dict(resource["Properties"])


def _synth(make: Any, packs: tuple[str, ...] = ("AwsSolutions",)) -> Synth:
    built: dict[str, GpuInferenceFleet] = {}

    def build(app: App) -> None:
        built["fleet"] = make(app)

    result = synth_app(build, packs=packs)
    raw = result.template()
    return Synth(built["fleet"], Template.from_json(raw), raw, result.violation_summary())


@pytest.fixture(scope="module")
def chat8b() -> Synth:
    def make(app: App) -> GpuInferenceFleet:
        stack = Stack(app, "Chat8b")
        return GpuInferenceFleet(
            stack, "Chat", network=PrivateDataPath(stack, "Net"), model=ModelShape.preset("llama-3.1-8b"),
            traffic=TRAFFIC_8B, model_artifact=ARTIFACT_8B, allow_plain_http=True)
    return _synth(make)


@pytest.fixture(scope="module")
def chat70b() -> Synth:
    def make(app: App) -> GpuInferenceFleet:
        stack = Stack(app, "Chat70b", env=Environment(account="111122223333", region="us-east-1"))
        return GpuInferenceFleet(
            stack, "Chat", network=PrivateDataPath(stack, "Net"), model=ModelShape.preset("llama-3.1-70b"),
            traffic=TRAFFIC_70B, model_artifact=ARTIFACT_70B,
            certificate=acm.Certificate.from_certificate_arn(stack, "Cert", CERT_ARN),
            green_model_artifact=GREEN_70B, green_traffic_percent=10, latency_is_the_product=True)
    return _synth(make, packs=("AwsSolutions", "NIST.800.53.R5", "HIPAA.Security"))


@pytest.fixture(scope="module")
def neuron8b() -> Synth:
    def make(app: App) -> GpuInferenceFleet:
        stack = Stack(app, "Neuron8b")
        return GpuInferenceFleet(
            stack, "Chat", network=PrivateDataPath(stack, "Net"), model=ModelShape.preset("llama-3.1-8b"),
            traffic=TRAFFIC_8B, model_artifact=ARTIFACT_8B, allow_plain_http=True, instance_type="inf2.8xlarge",
            image_repository=ecr.Repository.from_repository_name(stack, "Image", "vllm-neuron"),
            image_tag="0.9-neuron", warm_pool=False, deletion_protection=True,
            web_acl=wafv2.CfnWebACL(stack, "Acl", scope="REGIONAL", default_action={"allow": {}},
                                    visibility_config={"cloudWatchMetricsEnabled": True, "metricName": "acl",
                                                       "sampledRequestsEnabled": True}))
    return _synth(make)


def logical_id(construct: Any) -> str:
    return str(Stack.of(construct).get_logical_id(construct.node.default_child))


def user_data_of(synth: Synth, logical_prefix: str) -> str:
    """The launch template's user data with every CloudFormation token replaced by a placeholder word."""
    for logical_id, resource in resources_of_type(synth.raw, "AWS::EC2::LaunchTemplate").items():
        if logical_id.startswith(logical_prefix):
            parts = resource["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]["Fn::Join"][1]
            mime = "".join(p if isinstance(p, str) else "tokenvalue" for p in parts)
            script = mime.split('Content-Type: text/x-shellscript; charset="utf-8"\n\n', 1)[1]
            return script.split("\n--+AWS+CDK+User+Data+Separator==", 1)[0]
    raise AssertionError(f"no launch template {logical_prefix}*")


# ---- cdk-nag and the two model sizes ------------------------------------------------------------------------------


def test_8b_chat_lands_on_a_g_family_instance_and_is_nag_clean(chat8b: Synth) -> None:
    assert chat8b.fleet.plan.family.startswith("g")
    assert chat8b.violations == []


def test_70b_chat_lands_on_a_p_family_instance_with_several_gpus_and_is_clean_in_three_nag_packs(
        chat70b: Synth) -> None:
    assert chat70b.fleet.plan.family.startswith("p")
    assert chat70b.fleet.plan.devices_per_replica > 1
    assert chat70b.violations == []


def test_neuron_fleet_uses_the_neuron_dlami_its_own_image_and_no_gpu_alarm(neuron8b: Synth) -> None:
    assert neuron8b.violations == []
    defaults = [p.get("Default") for p in neuron8b.raw["Parameters"].values()]
    assert "/aws/service/neuron/dlami/multi-framework/amazon-linux-2023/latest/image_id" in defaults
    script = user_data_of(neuron8b, "ChatLaunchTemplate")
    assert "readonly ACCELERATOR_KIND=neuron" in script
    assert "/vllm-neuron:0.9-neuron" in script
    assert sorted(k.split("Alarm")[0].removeprefix("Chat") for k in _topic_alarms(neuron8b)) == [
        "Http5xxRate", "P99Latency", "UnhealthyHosts"]


def test_deletion_protection_and_web_acl_when_asked(neuron8b: Synth, chat8b: Synth) -> None:
    neuron8b.template.has_resource_properties("AWS::ElasticLoadBalancingV2::LoadBalancer", {
        "LoadBalancerAttributes": Match.array_with([{"Key": "deletion_protection.enabled", "Value": "true"}])})
    neuron8b.template.resource_count_is("AWS::WAFv2::WebACLAssociation", 1)
    chat8b.template.has_resource_properties("AWS::ElasticLoadBalancingV2::LoadBalancer", {
        "LoadBalancerAttributes": Match.array_with([{"Key": "deletion_protection.enabled", "Value": "false"}])})
    chat8b.template.resource_count_is("AWS::WAFv2::WebACLAssociation", 0)


def test_without_a_warm_pool_az_rebalancing_stays_on(neuron8b: Synth) -> None:
    neuron8b.template.resource_count_is("AWS::AutoScaling::WarmPool", 0)
    calls = json.dumps([r["Properties"] for r in resources_of_type(neuron8b.raw, "Custom::AWS").values()])
    assert "suspendProcesses" not in calls


# ---- 1. Launch template ---------------------------------------------------------------------------------------


def test_ami_comes_from_the_public_nvidia_dlami_parameter_by_default(chat8b: Synth) -> None:
    defaults = [p.get("Default") for p in chat8b.raw["Parameters"].values()]
    assert "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-amazon-linux-2023/latest/ami-id" in defaults


def test_launch_template_requires_imdsv2_and_detailed_monitoring_without_public_ip(chat8b: Synth) -> None:
    chat8b.template.has_resource_properties("AWS::EC2::LaunchTemplate", {"LaunchTemplateData": Match.object_like({
        "InstanceType": chat8b.fleet.plan.instance_type,
        "MetadataOptions": {"HttpTokens": "required", "HttpPutResponseHopLimit": 1},
        "Monitoring": {"Enabled": True},
        "NetworkInterfaces": [Match.object_like({"AssociatePublicIpAddress": False})],
    })})


def test_root_volume_is_encrypted_gp3_with_the_fleet_key_and_sized_for_the_weights(chat70b: Synth) -> None:
    weights = chat70b.fleet.plan.weights_gib
    size = math.ceil((100 + 40 + weights) * 1.2)
    ebs = chat70b.raw["Resources"]
    (template,) = [r for k, r in ebs.items() if k.startswith("ChatLaunchTemplate") and
                   r["Type"] == "AWS::EC2::LaunchTemplate" and "Green" not in k]
    (mapping,) = template["Properties"]["LaunchTemplateData"]["BlockDeviceMappings"]
    assert mapping["DeviceName"] == "/dev/xvda"
    assert mapping["Ebs"]["VolumeType"] == "gp3"
    assert mapping["Ebs"]["Encrypted"] is True
    assert mapping["Ebs"]["VolumeSize"] == size > weights
    assert mapping["Ebs"]["Throughput"] == fleet_module.ROOT_VOLUME_THROUGHPUT_MIBPS
    assert mapping["Ebs"]["KmsKeyId"]["Fn::GetAtt"][0].startswith("ChatKey")


def test_ebs_key_rotates_and_lets_auto_scaling_launch_with_it(chat8b: Synth) -> None:
    chat8b.template.has_resource_properties("AWS::KMS::Key", {
        "EnableKeyRotation": True,
        "KeyPolicy": {"Statement": Match.array_with([Match.object_like({
            "Sid": "AutoScalingGrantsForEbs", "Action": "kms:CreateGrant",
            "Condition": {"Bool": {"kms:GrantIsForAWSResource": True}}})])},
    })


def test_instance_security_group_admits_only_the_load_balancer(chat8b: Synth) -> None:
    fleet = chat8b.fleet
    instance_sg = logical_id(fleet.security_group)
    alb_sg = logical_id(fleet.load_balancer_security_group)
    ingress = [r["Properties"] for r in resources_of_type(chat8b.raw, "AWS::EC2::SecurityGroupIngress").values()
               if r["Properties"]["GroupId"]["Fn::GetAtt"][0] == instance_sg]
    assert sorted(rule["FromPort"] for rule in ingress) == [8000, 8081]
    assert all(rule["SourceSecurityGroupId"]["Fn::GetAtt"][0] == alb_sg for rule in ingress)
    inline = chat8b.raw["Resources"][instance_sg]["Properties"]
    assert "SecurityGroupIngress" not in inline
    assert len(inline["SecurityGroupEgress"]) == 1
    assert inline["SecurityGroupEgress"][0]["FromPort"] == 443


# ---- 2. User data ---------------------------------------------------------------------------------------------


def test_synthesized_user_data_is_shellcheck_clean(chat70b: Synth, tmp_path: Path) -> None:
    script = tmp_path / "user-data.sh"
    script.write_text(user_data_of(chat70b, "ChatLaunchTemplate"))
    result = subprocess.run([str(SHELLCHECK), "--shell=bash", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_user_data_starts_the_server_with_the_plans_parallelism_and_concurrency_cap(chat70b: Synth) -> None:
    plan = chat70b.fleet.plan
    script = user_data_of(chat70b, "ChatLaunchTemplate")
    assert f"--tensor-parallel-size {plan.devices_per_replica}" in script
    assert f"--max-num-seqs {plan.concurrency_per_instance}" in script
    assert "readonly MODEL_BUCKET=big-models" in script
    assert "readonly MODEL_PREFIX=llama-3.1-70b/" in script
    assert "readonly MANIFEST_NAME=SHA256SUMS" in script


def test_user_data_runs_at_every_boot_for_warm_pool_instances(chat8b: Synth) -> None:
    parts = chat8b.only("AWS::EC2::LaunchTemplate")["LaunchTemplateData"]["UserData"]["Fn::Base64"]["Fn::Join"][1]
    assert "- [scripts-user, always]" in parts[0]


def test_user_data_stays_under_the_16_kib_limit_with_long_resolved_names(chat70b: Synth) -> None:
    for template in resources_of_type(chat70b.raw, "AWS::EC2::LaunchTemplate").values():
        parts = template["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]["Fn::Join"][1]
        assert len("".join(p if isinstance(p, str) else "x" * 100 for p in parts).encode()) < 16 * 1024


def test_default_server_image_is_the_aws_vllm_container_from_private_ecr(chat8b: Synth) -> None:
    script = user_data_of(chat8b, "ChatLaunchTemplate")
    assert "readonly IMAGE_URI='763104351884.dkr.ecr.tokenvalue.tokenvalue/vllm:0.13-gpu-py312-ec2'" in script


# ---- 3. Health --------------------------------------------------------------------------------------------------


def test_target_group_checks_the_sidecar_that_proves_the_model_answers(chat8b: Synth) -> None:
    chat8b.template.has_resource_properties("AWS::ElasticLoadBalancingV2::TargetGroup", {
        "HealthCheckPath": "/healthz", "HealthCheckPort": "8081", "HealthCheckProtocol": "HTTP",
        "Matcher": {"HttpCode": "200"}, "HealthCheckTimeoutSeconds": 12, "HealthCheckIntervalSeconds": 15,
        "UnhealthyThresholdCount": 3, "Port": 8000,
    })


def test_group_uses_elb_health_checks_with_a_grace_period_sized_to_model_load(chat8b: Synth, chat70b: Synth) -> None:
    for synth in (chat8b, chat70b):
        expected = 300 + math.ceil(synth.fleet.plan.weights_gib / 0.25)
        assert synth.fleet.health_check_grace_period.to_seconds() == expected
    chat8b.template.has_resource_properties("AWS::AutoScaling::AutoScalingGroup", {
        "HealthCheckType": "ELB",
        "HealthCheckGracePeriod": 300 + math.ceil(chat8b.fleet.plan.weights_gib / 0.25)})


# ---- 4. Auto Scaling group ------------------------------------------------------------------------------------


def test_group_keeps_at_least_two_instances_across_two_zones(chat8b: Synth) -> None:
    group = chat8b.only("AWS::AutoScaling::AutoScalingGroup")
    assert int(group["MinSize"]) >= 2
    assert int(group["MaxSize"]) == max(chat8b.fleet.plan.max_instances, int(group["MinSize"]) + 1)
    assert len(group["VPCZoneIdentifier"]) == 2
    assert group["DefaultInstanceWarmup"] == chat8b.fleet.health_check_grace_period.to_seconds()


def test_replacements_launch_before_the_old_instance_goes(chat8b: Synth) -> None:
    group = chat8b.only("AWS::AutoScaling::AutoScalingGroup")
    assert group["InstanceMaintenancePolicy"] == {"MinHealthyPercentage": 100, "MaxHealthyPercentage": 200}


def test_warm_pool_is_stopped_and_reused_on_scale_in_by_default(chat8b: Synth) -> None:
    chat8b.template.has_resource_properties("AWS::AutoScaling::WarmPool", {
        "PoolState": "Stopped", "InstanceReusePolicy": {"ReuseOnScaleIn": True}, "MinSize": 1})


def test_az_rebalance_is_suspended_while_the_warm_pool_is_on(chat8b: Synth) -> None:
    calls = [json.dumps(r["Properties"]["Create"]) for r in resources_of_type(chat8b.raw, "Custom::AWS").values()]
    assert any('suspendProcesses' in c and 'AZRebalance' in c for c in calls)


def test_no_spot_and_no_mixed_instances(chat8b: Synth) -> None:
    group = chat8b.only("AWS::AutoScaling::AutoScalingGroup")
    assert "MixedInstancesPolicy" not in group
    data = chat8b.only("AWS::EC2::LaunchTemplate")["LaunchTemplateData"]
    assert "InstanceMarketOptions" not in data


def test_no_placement_group_by_default(chat8b: Synth) -> None:
    chat8b.template.resource_count_is("AWS::EC2::PlacementGroup", 0)


def test_latency_is_the_product_uses_one_cluster_placement_group_in_one_zone(chat70b: Synth) -> None:
    chat70b.template.has_resource_properties("AWS::EC2::PlacementGroup", {"Strategy": "cluster"})
    for group in resources_of_type(chat70b.raw, "AWS::AutoScaling::AutoScalingGroup").values():
        assert len(group["Properties"]["VPCZoneIdentifier"]) == 1
    for template in resources_of_type(chat70b.raw, "AWS::EC2::LaunchTemplate").values():
        assert "Placement" in template["Properties"]["LaunchTemplateData"]


def test_lifecycle_notifications_go_to_an_encrypted_topic(chat8b: Synth) -> None:
    topic = chat8b.only("AWS::SNS::Topic")
    assert "KmsMasterKeyId" in topic
    group = chat8b.only("AWS::AutoScaling::AutoScalingGroup")
    (notification,) = group["NotificationConfigurations"]
    assert "autoscaling:EC2_INSTANCE_LAUNCH_ERROR" in notification["NotificationTypes"]
    assert notification["TopicARN"]["Ref"].startswith("ChatTopic")


# ---- 5. Scaling ---------------------------------------------------------------------------------------------------


def test_scales_out_on_requests_per_target_at_the_planned_in_flight_load(chat8b: Synth) -> None:
    plan = chat8b.fleet.plan
    seconds = (plan.estimate.ttft_ms + plan.traffic.output_tokens * plan.estimate.tpot_ms) / 1000
    chat8b.template.has_resource_properties("AWS::AutoScaling::ScalingPolicy", {
        "PolicyType": "TargetTrackingScaling",
        "TargetTrackingConfiguration": Match.object_like({
            "PredefinedMetricSpecification": Match.object_like({"PredefinedMetricType": "ALBRequestCountPerTarget"}),
            "TargetValue": int(plan.concurrency_per_instance * 60 / seconds),
            "DisableScaleIn": True,
        }),
    })


def test_scales_out_on_p95_response_time_against_the_latency_target(chat8b: Synth) -> None:
    chat8b.template.has_resource_properties("AWS::CloudWatch::Alarm", {
        "MetricName": "TargetResponseTime", "ExtendedStatistic": "p95",
        "Threshold": TRAFFIC_8B.p95_ttft_ms / 1000, "ComparisonOperator": "GreaterThanOrEqualToThreshold",
        "EvaluationPeriods": 3, "AlarmActions": [{"Ref": Match.string_like_regexp("LatencyScaleOutUpperPolicy")}],
    })


def test_scales_in_slower_than_it_scales_out(chat8b: Synth) -> None:
    alarms = resources_of_type(chat8b.raw, "AWS::CloudWatch::Alarm").values()
    scale_in = [a["Properties"] for a in alarms if "ScaleInLower" in json.dumps(a["Properties"]["AlarmActions"])]
    scale_out = [a["Properties"] for a in alarms if "ScaleOutUpper" in json.dumps(a["Properties"]["AlarmActions"])]
    assert scale_in[0]["MetricName"] == "RequestCountPerTarget"
    assert scale_in[0]["EvaluationPeriods"] == 15 > scale_out[0]["EvaluationPeriods"]


def test_gpu_utilization_never_drives_scaling(chat8b: Synth) -> None:
    for alarm in resources_of_type(chat8b.raw, "AWS::CloudWatch::Alarm").values():
        if "ScalingPolicy" in json.dumps(alarm["Properties"].get("AlarmActions", [])) or "Scale" in json.dumps(
                alarm["Properties"].get("AlarmActions", [])):
            assert "nvidia" not in json.dumps(alarm["Properties"])


# ---- 6. Load balancer -----------------------------------------------------------------------------------------


def test_load_balancer_is_internal_with_a_streaming_idle_timeout(chat8b: Synth) -> None:
    chat8b.template.has_resource_properties("AWS::ElasticLoadBalancingV2::LoadBalancer", {
        "Scheme": "internal",
        "LoadBalancerAttributes": Match.array_with([
            {"Key": "idle_timeout.timeout_seconds", "Value": "300"},
            {"Key": "access_logs.s3.enabled", "Value": "true"}]),
    })


def test_access_logs_go_to_an_sse_s3_bucket(chat8b: Synth) -> None:
    bucket = chat8b.only("AWS::S3::Bucket")
    (rule,) = bucket["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    assert rule["ServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"  # ALB delivery supports only SSE-S3
    assert bucket["PublicAccessBlockConfiguration"]["BlockPublicPolicy"] is True


def test_deregistration_delay_lets_a_stream_finish(chat8b: Synth) -> None:
    chat8b.template.has_resource_properties("AWS::ElasticLoadBalancingV2::TargetGroup", {
        "TargetGroupAttributes": Match.array_with([
            {"Key": "deregistration_delay.timeout_seconds", "Value": "300"},
            {"Key": "load_balancing.algorithm.type", "Value": "least_outstanding_requests"}])})


def test_plain_http_only_when_opted_in(chat8b: Synth) -> None:
    listener = chat8b.only("AWS::ElasticLoadBalancingV2::Listener")
    assert (listener["Port"], listener["Protocol"]) == (80, "HTTP")


def test_https_with_a_modern_tls_policy_when_a_certificate_is_given(chat70b: Synth) -> None:
    chat70b.template.has_resource_properties("AWS::ElasticLoadBalancingV2::Listener", {
        "Port": 443, "Protocol": "HTTPS", "Certificates": [{"CertificateArn": CERT_ARN}],
        "SslPolicy": Match.string_like_regexp("ELBSecurityPolicy-TLS13-1-2-Res")})


def test_listener_admits_the_vpc_cidr_on_its_port(chat70b: Synth) -> None:
    sg = chat70b.raw["Resources"][logical_id(chat70b.fleet.load_balancer_security_group)]
    (rule,) = sg["Properties"]["SecurityGroupIngress"]
    assert (rule["CidrIp"], rule["FromPort"]) == ("10.80.0.0/16", 443)


# ---- 7. Deployments ----------------------------------------------------------------------------------------------


def test_a_new_launch_template_version_starts_an_instance_refresh(chat8b: Synth) -> None:
    (refresh,) = [r["Properties"] for k, r in resources_of_type(chat8b.raw, "Custom::AWS").items()
                  if k.startswith("ChatInstanceRefresh")]
    update = json.dumps(refresh["Update"])
    assert "startInstanceRefresh" in update
    assert '\\"MinHealthyPercentage\\":100' in update
    assert '\\"CheckpointPercentages\\":[50,100]' in update
    assert "LatestVersionNumber" in update  # a new version changes the call, so CloudFormation runs it again


def test_the_model_version_is_in_the_user_data(chat70b: Synth) -> None:
    assert "readonly MODEL_VERSION=2024-07" in user_data_of(chat70b, "ChatLaunchTemplate")
    assert "readonly MODEL_VERSION=2024-09" in user_data_of(chat70b, "ChatLaunchTemplateGreen")


def test_blue_green_weights_two_target_groups_behind_one_listener(chat70b: Synth) -> None:
    listener = chat70b.only("AWS::ElasticLoadBalancingV2::Listener")
    (action,) = listener["DefaultActions"]
    groups = action["ForwardConfig"]["TargetGroups"]
    assert sorted(g["Weight"] for g in groups) == [10, 90]
    refs = {g["TargetGroupArn"]["Ref"] for g in groups}
    assert len(refs) == 2
    assert len(resources_of_type(chat70b.raw, "AWS::AutoScaling::AutoScalingGroup")) == 2


def test_each_version_has_its_own_group_and_target_group(chat70b: Synth) -> None:
    groups = resources_of_type(chat70b.raw, "AWS::AutoScaling::AutoScalingGroup")
    target_groups = {json.dumps(g["Properties"]["TargetGroupARNs"]) for g in groups.values()}
    templates = {json.dumps(g["Properties"]["LaunchTemplate"]["LaunchTemplateId"]) for g in groups.values()}
    assert len(target_groups) == 2 and len(templates) == 2


# ---- 8. IAM -----------------------------------------------------------------------------------------------------


def _instance_role(synth: Synth) -> dict[str, Any]:
    return synth.raw["Resources"][logical_id(synth.fleet.role)]["Properties"]


def test_deploy_time_sdk_calls_use_customer_managed_policies_only(chat8b: Synth) -> None:
    provider = chat8b.raw["Resources"][next(k for k in chat8b.raw["Resources"] if k.startswith(
        "AWS679f53fac002430cb0da5b7982bd2287"))]
    assert provider["Properties"]["Role"]["Fn::GetAtt"][0].startswith("ChatSdkProviderRole")
    fleet_roles = {k: r for k, r in resources_of_type(chat8b.raw, "AWS::IAM::Role").items() if k.startswith("Chat")}
    assert len(fleet_roles) == 2  # the instance role and the SDK provider's role
    for role in fleet_roles.values():
        for arn in role["Properties"].get("ManagedPolicyArns", []):
            assert "Ref" in arn, arn  # a policy from this stack, never arn:aws:iam::aws:policy/...
    sdk_policies = [k for k in resources_of_type(chat8b.raw, "AWS::IAM::ManagedPolicy") if "SuspendAzRebalance" in k
                    or "InstanceRefresh" in k]
    assert len(sdk_policies) == 2
    inline = [k for k in resources_of_type(chat8b.raw, "AWS::IAM::Policy") if k.startswith("Chat")]
    assert inline == []


def test_instance_role_has_only_a_customer_managed_policy_from_the_stack(chat8b: Synth) -> None:
    role = _instance_role(chat8b)
    (policy,) = role["ManagedPolicyArns"]
    assert chat8b.raw["Resources"][policy["Ref"]]["Type"] == "AWS::IAM::ManagedPolicy"
    assert "Policies" not in role
    role_id = logical_id(chat8b.fleet.role)
    for inline in resources_of_type(chat8b.raw, "AWS::IAM::Policy").values():
        assert {"Ref": role_id} not in inline["Properties"].get("Roles", [])


def _statements(synth: Synth) -> dict[str, dict[str, Any]]:
    policy = synth.raw["Resources"][logical_id(synth.fleet.instance_policy)]
    return {s["Sid"]: s for s in policy["Properties"]["PolicyDocument"]["Statement"]}


def test_instance_policy_is_exactly_what_the_instance_needs(chat8b: Synth) -> None:
    assert set(_statements(chat8b)) == {
        "ReadModelArtifact0", "ListModelArtifact0", "WriteOwnLogGroup", "PutMetricsInOwnNamespace",
        "PullServerImage", "EcrAuthorizationToken", "SessionManagerRegister", "SessionManagerChannels"}


def test_instance_reads_only_the_artifact_prefix(chat8b: Synth) -> None:
    statements = _statements(chat8b)
    assert statements["ReadModelArtifact0"]["Resource"]["Fn::Join"][1][-1] == ":s3:::my-models/llama-3.1-8b/*"
    assert statements["ListModelArtifact0"]["Condition"] == {
        "StringLike": {"s3:prefix": ["llama-3.1-8b/", "llama-3.1-8b/*"]}}


def test_instance_decrypts_with_the_artifact_key_through_s3_only(chat70b: Synth) -> None:
    statements = _statements(chat70b)
    assert statements["DecryptModelArtifact0"]["Resource"] == KEY_ARN
    assert statements["DecryptModelArtifact0"]["Action"] == "kms:Decrypt"
    assert "kms:ViaService" in statements["DecryptModelArtifact0"]["Condition"]["StringEquals"]
    assert "ReadModelArtifact1" in statements  # the green version's prefix too


def test_metrics_only_in_the_fleet_namespace_and_logs_only_to_its_group(chat8b: Synth) -> None:
    statements = _statements(chat8b)
    assert statements["PutMetricsInOwnNamespace"]["Condition"] == {
        "StringEquals": {"cloudwatch:namespace": fleet_module.METRIC_NAMESPACE}}
    assert statements["WriteOwnLogGroup"]["Resource"]["Fn::GetAtt"][0].startswith("ChatLogGroup")


def test_image_pull_only_from_the_named_repository(chat8b: Synth) -> None:
    statements = _statements(chat8b)
    assert statements["PullServerImage"]["Resource"]["Fn::Join"][1][-1] == ":763104351884:repository/vllm"
    assert statements["EcrAuthorizationToken"]["Action"] == "ecr:GetAuthorizationToken"


def test_artifact_bucket_is_admitted_by_the_s3_gateway_endpoint(chat8b: Synth) -> None:
    endpoints = resources_of_type(chat8b.raw, "AWS::EC2::VPCEndpoint")
    assert any(":s3:::my-models/*" in json.dumps(e["Properties"].get("PolicyDocument", {}))
               for e in endpoints.values())


# ---- 9. Observability ---------------------------------------------------------------------------------------------


def _topic_alarms(synth: Synth) -> dict[str, dict[str, Any]]:
    topic = logical_id(synth.fleet.topic)
    return {k: a["Properties"] for k, a in resources_of_type(synth.raw, "AWS::CloudWatch::Alarm").items()
            if {"Ref": topic} in a["Properties"].get("AlarmActions", [])}


def test_four_alarms_notify_the_topic(chat8b: Synth) -> None:
    alarms = _topic_alarms(chat8b)
    assert sorted(k.split("Alarm")[0].removeprefix("Chat") for k in alarms) == [
        "GpuMemory", "Http5xxRate", "P99Latency", "UnhealthyHosts"]


def test_p99_latency_alarm_is_at_twice_the_p95_target(chat8b: Synth) -> None:
    (alarm,) = [a for k, a in _topic_alarms(chat8b).items() if "P99Latency" in k]
    assert alarm["ExtendedStatistic"] == "p99"
    assert alarm["Threshold"] == 2 * TRAFFIC_8B.p95_ttft_ms / 1000


def test_gpu_memory_alarm_reads_the_agents_nvidia_metrics(chat8b: Synth) -> None:
    (alarm,) = [a for k, a in _topic_alarms(chat8b).items() if "GpuMemory" in k]
    names = {m.get("MetricStat", {}).get("Metric", {}).get("MetricName") for m in alarm["Metrics"]}
    assert {"nvidia_smi_memory_used", "nvidia_smi_memory_total"} <= names
    assert alarm["Threshold"] == 97


def test_blue_green_alarms_on_both_target_groups(chat70b: Synth) -> None:
    assert len(_topic_alarms(chat70b)) == 5


def test_dashboard_shows_latency_errors_hosts_gpu_and_cost_per_million_tokens(chat8b: Synth) -> None:
    body = json.dumps(chat8b.only("AWS::CloudWatch::Dashboard")["DashboardBody"])
    for needle in ("TargetResponseTime", "p50", "p99", "HTTPCode_Target_5XX_Count", "HealthyHostCount",
                   "InFlightRequests", "nvidia_smi_utilization_gpu", "CPUUtilization", "NetworkIn",
                   "disk_used_percent", "GeneratedTokens", "USD per 1M output tokens"):
        assert needle in body, needle


def test_cost_per_million_tokens_uses_instance_hours_and_the_token_counter(chat8b: Synth) -> None:
    metric = chat8b.fleet.metric_usd_per_million_tokens()
    assert metric is not None
    assert f"* {chat8b.fleet.plan.usd_per_hour:g} * 1 / tokens" in metric.expression
    assert "GroupInServiceInstances" in json.dumps(
        {k: m.metric_name for k, m in metric.using_metrics.items()})  # type: ignore[attr-defined]


# ---- 10. Members ----------------------------------------------------------------------------------------------


def test_members_are_exposed(chat8b: Synth) -> None:
    fleet = chat8b.fleet
    assert fleet.plan.instance_type == chat8b.only("AWS::EC2::LaunchTemplate")["LaunchTemplateData"]["InstanceType"]
    for name in ("auto_scaling_group", "load_balancer", "target_group", "listener", "role", "security_group",
                 "connections", "dashboard"):
        assert getattr(fleet, name) is not None, name
    assert fleet.connections.default_port is not None
    assert fleet.metric_target_response_time("p99").statistic == "p99"
    assert fleet.metric_request_count_per_target().metric_name == "RequestCountPerTarget"
