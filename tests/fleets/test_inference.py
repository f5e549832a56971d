"""GpuInferenceFleet: one synthesis per variant (module-scoped), fine-grained assertions per numbered point.

Variants:
- ``chat8b``: the simplest call for an 8B chat (G family) with plain HTTP opted in, cdk-nag AwsSolutions.
- ``chat70b``: a 70B chat (P family, 8 GPUs) over HTTPS, blue/green rolling out to green, cluster placement group, a KMS-encrypted
  artifact, in a stack with a region, cdk-nag AwsSolutions, NIST 800-53 R5 and HIPAA Security.
- ``neuron8b``: an 8B chat on inf2 with its own image and no warm pool, cdk-nag AwsSolutions.
"""

from __future__ import annotations

import json
import math
import os
import re
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

from genai_constructs.errors import ConfigurationError
from genai_constructs.fleets import GpuInferenceFleet
from genai_constructs.fleets import inference as fleet_module
from genai_constructs.network import PrivateDataPath
from genai_constructs.workload import ModelArtifact, ModelShape, RealtimeTraffic
from tests.support import resource_policy_decision, resources_of_type, synth_app

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

    def slot(self, resource_type: str, name: str = "Blue") -> dict[str, Any]:
        """The one resource of a type that belongs to slot ``name`` (green's logical ids carry "Green")."""
        (resource,) = [r for k, r in resources_of_type(self.raw, resource_type).items()
                       if ("Green" in k) == (name == "Green")]
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
            green_model_artifact=GREEN_70B, live_slot="Green", latency_is_the_product=True)
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


def user_data_of(synth: Synth, logical_prefix: str) -> str:  # noqa: D103
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
    assert "/aws/service/neuron/dlami/base/amazon-linux-2023/latest/image_id" in defaults
    script = user_data_of(neuron8b, "ChatLaunchTemplate")
    assert "readonly ACCELERATOR_KIND=neuron" in script
    assert "/vllm-neuron:0.9-neuron" in script
    # The fleet's alarms, then the blue slot's own (what its instance refresh rolls back on): none on GPU metrics.
    assert sorted(k.split("Alarm")[0].removeprefix("Chat") for k in _topic_alarms(neuron8b)) == [
        "BlueHttp5xxRate", "BlueP95TimePerOutputToken", "BlueP95TimeToFirstToken", "BlueUnhealthyHosts",
        "GreenHttp5xxRate", "GreenUnhealthyHosts",  # the idle twin: its target group's alarms only
        "Http5xxRate", "P99TimePerOutputToken", "P99TimeToFirstToken", "UnhealthyHosts", "UnhealthyHostsGreen"]


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
    assert f"--max-num-seqs {plan.server.max_num_seqs}" in script
    # The traffic's longest request (the 8,192-token default), not the model's 131,072: vLLM would refuse to start.
    assert "--max-model-len 8192" in script and "--gpu-memory-utilization 0.9" in script
    assert "readonly MODEL_BUCKET=big-models" in script
    assert "readonly MODEL_PREFIX=llama-3.1-70b/" in script
    assert "readonly MANIFEST_NAME=SHA256SUMS" in script


def test_user_data_runs_at_every_boot_for_warm_pool_instances(chat8b: Synth) -> None:
    parts = chat8b.slot("AWS::EC2::LaunchTemplate")["LaunchTemplateData"]["UserData"]["Fn::Base64"]["Fn::Join"][1]
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


def test_group_uses_elb_health_checks_with_a_short_grace_after_the_launch_hook(chat8b: Synth) -> None:
    # The grace period starts once the hook completes, and the instance completes it only when it serves.
    chat8b.template.has_resource_properties("AWS::AutoScaling::AutoScalingGroup", {
        "HealthCheckType": "ELB", "HealthCheckGracePeriod": 120, "DefaultInstanceWarmup": 120})


def test_every_launch_waits_on_a_hook_the_instance_completes_itself(chat8b: Synth, chat70b: Synth) -> None:
    # Heartbeat timeout = 1.5 x the modelled cold start (data/startup.json):
    # 8B, 14.96 GiB: 90 + 110 + 59.8 + 15.0 + 90 + 30 = 394.8 s -> 593 s; 70B, 131.4 GiB: 977.0 s -> 1466 s.
    for synth, heartbeat in ((chat8b, 593), (chat70b, 1466)):
        hooks = [h["Properties"] for h in resources_of_type(synth.raw, "AWS::AutoScaling::LifecycleHook").values()]
        assert len(hooks) == len(synth.fleet.slots)
        for hook in hooks:
            assert hook["LifecycleHookName"] == "genai-instance-ready"
            assert hook["LifecycleTransition"] == "autoscaling:EC2_INSTANCE_LAUNCHING"
            assert hook["DefaultResult"] == "ABANDON" and hook["HeartbeatTimeout"] == heartbeat
            assert "NotificationTargetARN" not in hook


def test_the_boot_script_names_the_group_and_hook_the_instance_may_complete(chat70b: Synth) -> None:
    statements = _statements(chat70b)
    allowed = json.dumps(statements["CompleteOwnLaunchHook"]["Resource"])
    assert statements["CompleteOwnLaunchHook"]["Action"] == [
        "autoscaling:CompleteLifecycleAction", "autoscaling:RecordLifecycleActionHeartbeat"]
    for template_id, group in (("ChatLaunchTemplate", chat70b.fleet.auto_scaling_group),
                               ("ChatLaunchTemplateGreen", chat70b.fleet.green_auto_scaling_group)):
        assert group is not None
        name = chat70b.raw["Resources"][logical_id(group)]["Properties"]["AutoScalingGroupName"]
        script = user_data_of(chat70b, template_id)
        assert f"readonly AUTO_SCALING_GROUP_NAME={name}" in script
        assert "readonly LIFECYCLE_HOOK_NAME=genai-instance-ready" in script
        assert f"autoScalingGroupName/{name}" in allowed


def test_keep_alive_on_the_instance_outlasts_the_load_balancers_idle_timeout(chat8b: Synth) -> None:
    attributes = {a["Key"]: a["Value"] for a in
                  chat8b.only("AWS::ElasticLoadBalancingV2::LoadBalancer")["LoadBalancerAttributes"]}
    script = user_data_of(chat8b, "ChatLaunchTemplate")
    keep_alive = int(script.split("readonly KEEP_ALIVE_S=")[1].split("\n")[0])
    assert keep_alive > int(attributes["idle_timeout.timeout_seconds"]) == chat8b.fleet.drain.idle_timeout.to_seconds()


# ---- 4. Auto Scaling group ------------------------------------------------------------------------------------


def test_group_keeps_at_least_two_instances_across_two_zones(chat8b: Synth) -> None:
    group = chat8b.slot("AWS::AutoScaling::AutoScalingGroup")
    assert int(group["MinSize"]) >= 2
    assert int(group["MaxSize"]) == max(chat8b.fleet.plan.max_instances, int(group["MinSize"]) + 1)
    assert len(group["VPCZoneIdentifier"]) == 2
    assert group["DefaultInstanceWarmup"] == chat8b.fleet.health_check_grace_period.to_seconds()


def test_replacements_launch_before_the_old_instance_goes(chat8b: Synth) -> None:
    group = chat8b.slot("AWS::AutoScaling::AutoScalingGroup")
    assert group["InstanceMaintenancePolicy"] == {"MinHealthyPercentage": 100, "MaxHealthyPercentage": 200}


def test_warm_pool_is_stopped_and_reused_on_scale_in_by_default(chat8b: Synth) -> None:
    chat8b.template.has_resource_properties("AWS::AutoScaling::WarmPool", {
        "PoolState": "Stopped", "InstanceReusePolicy": {"ReuseOnScaleIn": True}, "MinSize": 1})


def test_az_rebalance_is_suspended_while_the_warm_pool_is_on(chat8b: Synth) -> None:
    calls = [json.dumps(r["Properties"]["Create"]) for r in resources_of_type(chat8b.raw, "Custom::AWS").values()]
    assert any('suspendProcesses' in c and 'AZRebalance' in c for c in calls)


def test_no_spot_and_no_mixed_instances(chat8b: Synth) -> None:
    group = chat8b.slot("AWS::AutoScaling::AutoScalingGroup")
    assert "MixedInstancesPolicy" not in group
    data = chat8b.slot("AWS::EC2::LaunchTemplate")["LaunchTemplateData"]
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
    group = chat8b.slot("AWS::AutoScaling::AutoScalingGroup")
    (notification,) = group["NotificationConfigurations"]
    assert "autoscaling:EC2_INSTANCE_LAUNCH_ERROR" in notification["NotificationTypes"]
    assert notification["TopicARN"]["Ref"].startswith("ChatTopic")


# ---- 5. Scaling ---------------------------------------------------------------------------------------------------


def _target_tracking(synth: Synth) -> list[dict[str, Any]]:
    return [p["Properties"]["TargetTrackingConfiguration"]
            for p in resources_of_type(synth.raw, "AWS::AutoScaling::ScalingPolicy").values()
            if p["Properties"]["PolicyType"] == "TargetTrackingScaling"]


def test_target_tracking_holds_requests_in_flight_or_waiting_per_instance_at_the_plan(chat8b: Synth) -> None:
    (config,) = _target_tracking(chat8b)
    plan = chat8b.fleet.plan
    # The planned per-instance concurrency, below the server's cap so that the headroom absorbs a burst.
    assert config["TargetValue"] == plan.concurrency_per_instance < plan.server.max_num_seqs
    queries = {q["Id"]: q for q in config["CustomizedMetricSpecification"]["Metrics"]}
    assert queries["demand"] == {"Id": "demand", "Expression": "running + waiting", "ReturnData": True,
                                 "Label": "Requests in flight or waiting per instance"}
    for query_id, name in (("running", "RequestsInFlight"), ("waiting", "RequestsWaiting")):
        stat = queries[query_id]["MetricStat"]
        assert stat["Stat"] == "Average" and queries[query_id]["ReturnData"] is False
        assert stat["Metric"]["Namespace"] == "GenaiConstructs/Inference" and stat["Metric"]["MetricName"] == name
        assert stat["Metric"]["Dimensions"] == [{"Name": "Fleet", "Value": chat8b.fleet.fleet_name},
                                                {"Name": "ModelVersion", "Value": ARTIFACT_8B.version}]


def test_an_idle_fleet_scales_in_on_the_gauge_it_publishes_at_zero(chat8b: Synth) -> None:
    # Target tracking scales in only on data; the proxy publishes RequestsInFlight every 10 s, 0 included
    # (tests/runtime/test_request_proxy.py), so an idle fleet reads 0 and returns to its minimum.
    (config,) = _target_tracking(chat8b)
    assert config["DisableScaleIn"] is False
    assert not [a for a in resources_of_type(chat8b.raw, "AWS::CloudWatch::Alarm").values()
                if a["Properties"].get("MetricName") == "RequestCountPerTarget"]


def _scaling_alarm(synth: Synth, metric_name: str) -> dict[str, Any]:
    (alarm,) = [a["Properties"] for a in resources_of_type(synth.raw, "AWS::CloudWatch::Alarm").values()
                if a["Properties"].get("MetricName") == metric_name
                and "ScaleOut" in json.dumps(a["Properties"].get("AlarmActions", []))]
    return alarm


def test_steps_out_on_p95_time_to_first_token_and_time_per_output_token(chat8b: Synth) -> None:
    for metric_name, threshold in (("TimeToFirstToken", TRAFFIC_8B.p95_ttft_ms),
                                   ("TimePerOutputToken", 1000 / 20)):  # 20 tokens/s per session -> 50 ms
        alarm = _scaling_alarm(chat8b, metric_name)
        assert alarm["ExtendedStatistic"] == "p95" and alarm["Threshold"] == threshold
        assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
        assert alarm["EvaluationPeriods"] == 3 and alarm["DatapointsToAlarm"] == 2
        assert {"Name": "ModelVersion", "Value": ARTIFACT_8B.version} in alarm["Dimensions"]
        # No requests means no latency: missing data never adds a GPU.
        assert alarm["TreatMissingData"] == "notBreaching"


def test_load_balancer_response_time_drives_nothing(chat8b: Synth) -> None:
    for alarm in resources_of_type(chat8b.raw, "AWS::CloudWatch::Alarm").values():
        assert "TargetResponseTime" not in json.dumps(alarm["Properties"])


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
            {"Key": "idle_timeout.timeout_seconds", "Value": str(int(chat8b.fleet.drain.idle_timeout.to_seconds()))},
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
            {"Key": "deregistration_delay.timeout_seconds",
             "Value": str(int(chat8b.fleet.drain.deregistration_delay.to_seconds()))},
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
                  if k.startswith("ChatInstanceRefresh") and "Green" not in k]
    update = json.dumps(refresh["Update"])
    assert "startInstanceRefresh" in update
    assert '\\"MinHealthyPercentage\\":100' in update
    assert '\\"CheckpointPercentages\\":[50,100]' in update
    assert "LatestVersionNumber" in update  # a new version changes the call, so CloudFormation runs it again


def test_an_instance_refresh_rolls_back_on_the_slots_own_alarms(chat8b: Synth) -> None:
    (refresh,) = [r["Properties"] for k, r in resources_of_type(chat8b.raw, "Custom::AWS").items()
                  if k.startswith("ChatInstanceRefresh") and "Green" not in k]
    update = json.dumps(refresh["Update"])
    assert '\\"AutoRollback\\":true' in update
    alarm_ids = [k for k in resources_of_type(chat8b.raw, "AWS::CloudWatch::Alarm") if k.startswith("ChatBlue")]
    assert len(alarm_ids) == 4 and all(f'"Ref": "{k}"' in update for k in alarm_ids)


def test_drain_covers_the_longest_stream_the_traffic_allows(chat8b: Synth) -> None:
    fleet = chat8b.fleet
    longest = (TRAFFIC_8B.p95_ttft_ms + fleet.plan.server.max_model_len * TRAFFIC_8B.tpot_target_ms) / 1000
    assert fleet.drain.longest_stream_s == longest
    assert fleet.drain.deregistration_delay.to_seconds() == math.ceil(longest * fleet_module.DRAIN_MARGIN)
    assert fleet.drain.idle_timeout.to_seconds() == fleet.drain.deregistration_delay.to_seconds()
    assert fleet.drain.server_keep_alive.to_seconds() == fleet.drain.idle_timeout.to_seconds() + 60
    script = user_data_of(chat8b, "ChatLaunchTemplate")
    assert f"readonly DRAIN_S={int(fleet.drain.deregistration_delay.to_seconds())}" in script


def test_blue_green_rollout_state_machine_is_deployed_with_the_stack(chat70b: Synth) -> None:
    from genai_constructs.fleets.rollout import rollout_definition

    fleet = chat70b.fleet
    assert fleet.rollout is not None and fleet.rollout_policy is not None
    machine = chat70b.only("AWS::StepFunctions::StateMachine")
    assert json.loads(machine["DefinitionString"]) == rollout_definition(
        fleet.rollout_policy, ready_timeout_s=fleet.rollout.definition["States"]["NewSlotReady"]["Choices"][1][
            "NumericGreaterThanEquals"])
    assert machine["LoggingConfiguration"]["Level"] == "ALL" and machine["TracingConfiguration"]["Enabled"]
    role = chat70b.raw["Resources"][machine["RoleArn"]["Fn::GetAtt"][0]]["Properties"]
    assert "Policies" not in role and len(role["ManagedPolicyArns"]) == 1
    # The green slot is created idle; the trigger starts the rollout towards live_slot.
    groups = {k: g["Properties"] for k, g in resources_of_type(chat70b.raw, "AWS::AutoScaling::AutoScalingGroup")
              .items()}
    assert sorted(g["MinSize"] for g in groups.values()) == ["0", str(fleet.min_instances)]
    (trigger,) = [r["Properties"] for k, r in resources_of_type(chat70b.raw, "Custom::AWS").items()
                  if k.startswith("ChatStartRollout")]
    update = json.dumps(trigger["Update"])
    assert "startExecution" in update and "Rollout-Green-2024-09-" in update and "ChatGreenP95TimeToFirstToken" in update


def test_the_model_version_is_in_the_user_data(chat70b: Synth) -> None:
    assert "readonly MODEL_VERSION=2024-07" in user_data_of(chat70b, "ChatLaunchTemplate")
    assert "readonly MODEL_VERSION=2024-09" in user_data_of(chat70b, "ChatLaunchTemplateGreen")


def test_blue_green_weights_two_target_groups_behind_one_listener(chat70b: Synth) -> None:
    # With a rollout the template's weights never follow live_slot (every request on blue when first created):
    # the rollout state machine moves them, so a deploy that names a new live slot moves nothing by itself.
    listener = chat70b.only("AWS::ElasticLoadBalancingV2::Listener")
    (action,) = listener["DefaultActions"]
    groups = action["ForwardConfig"]["TargetGroups"]
    assert [g["Weight"] for g in groups] == [100, 0]
    refs = {g["TargetGroupArn"]["Ref"] for g in groups}
    assert len(refs) == 2
    assert len(resources_of_type(chat70b.raw, "AWS::AutoScaling::AutoScalingGroup")) == 2


# ---- Blue/green by default: the idle twin, and a release history ---------------------------------------------------

V1, V2, V3 = (ModelArtifact(bucket_name="my-models", prefix=f"llama-3.1-8b/{v}/", version=v) for v in ("v1", "v2", "v3"))


@pytest.fixture(scope="module")
def history() -> Synth:
    """The third release of a fleet: v3 appended to the history, so it goes to blue (v1's slot) and green keeps v2."""
    def make(app: App) -> GpuInferenceFleet:
        stack = Stack(app, "History")
        return GpuInferenceFleet(
            stack, "Chat", network=PrivateDataPath(stack, "Net"), model=ModelShape.preset("llama-3.1-8b"),
            traffic=TRAFFIC_8B, model_artifact=[V1, V2, V3], allow_plain_http=True)
    return _synth(make)


def _scaling_policies_of(synth: Synth, group: Any) -> list[dict[str, Any]]:
    ref = logical_id(group)
    return [p["Properties"] for p in resources_of_type(synth.raw, "AWS::AutoScaling::ScalingPolicy").values()
            if p["Properties"]["AutoScalingGroupName"] == {"Ref": ref}]


def test_the_default_fleet_has_two_slots_and_a_rollout_with_every_request_on_blue(chat8b: Synth) -> None:
    fleet = chat8b.fleet
    assert fleet.rollout is not None and fleet.idle_twin and fleet.live_slot == "Blue"
    (action,) = chat8b.only("AWS::ElasticLoadBalancingV2::Listener")["DefaultActions"]
    assert [g["Weight"] for g in action["ForwardConfig"]["TargetGroups"]] == [100, 0]
    assert len(resources_of_type(chat8b.raw, "AWS::ElasticLoadBalancingV2::TargetGroup")) == 2
    chat8b.template.resource_count_is("AWS::StepFunctions::StateMachine", 1)
    # The twin holds blue's version (nothing to roll), so the first deploy's trigger finds nothing to move.
    assert "readonly MODEL_VERSION=1" in user_data_of(chat8b, "ChatLaunchTemplateGreen")
    (trigger,) = [r["Properties"] for k, r in resources_of_type(chat8b.raw, "Custom::AWS").items()
                  if k.startswith("ChatStartRollout")]
    assert "Rollout-Blue-1-" in json.dumps(trigger["Create"])


def test_the_idle_slot_costs_nothing_no_instances_no_warm_pool_no_scaling(chat8b: Synth) -> None:
    green = chat8b.slot("AWS::AutoScaling::AutoScalingGroup", "Green")
    assert (green["MinSize"], green.get("DesiredCapacity", "0")) == ("0", "0")
    assert chat8b.slot("AWS::AutoScaling::WarmPool", "Green") | {"AutoScalingGroupName": None} == {
        "AutoScalingGroupName": None, "MaxGroupPreparedCapacity": 0, "MinSize": 0, "PoolState": "Stopped",
        "InstanceReusePolicy": {"ReuseOnScaleIn": True}}
    blue_pool = chat8b.slot("AWS::AutoScaling::WarmPool")
    assert blue_pool["MinSize"] == 1 and "MaxGroupPreparedCapacity" not in blue_pool
    # A twin scaling on blue's version would start instances that get no traffic.
    assert _scaling_policies_of(chat8b, chat8b.fleet.green_auto_scaling_group) == []
    assert len(_scaling_policies_of(chat8b, chat8b.fleet.auto_scaling_group)) == 3


def test_a_release_history_puts_each_new_version_in_the_slot_the_one_before_does_not_serve(history: Synth) -> None:
    assert history.violations == []
    fleet = history.fleet
    assert (fleet.live_slot, fleet.idle_twin) == ("Blue", False)
    assert "readonly MODEL_VERSION=v3" in user_data_of(history, "ChatLaunchTemplate")
    assert "readonly MODEL_VERSION=v2" in user_data_of(history, "ChatLaunchTemplateGreen")
    (trigger,) = [r["Properties"] for k, r in resources_of_type(history.raw, "Custom::AWS").items()
                  if k.startswith("ChatStartRollout")]
    update = json.dumps(trigger["Update"])
    # From green (v2, serving) to blue (v3), judged by blue's alarms.
    assert "Rollout-Blue-v3-" in update
    assert re.search(r"oldSlot\W+name\W+Green\W+version\W+v2\W", update)
    assert re.search(r"newSlot\W+name\W+Blue\W+version\W+v3\W", update)
    # The slot the release leaves (green) gives up its warm pool; the new one gets the full pool.
    assert history.slot("AWS::AutoScaling::WarmPool", "Green")["MaxGroupPreparedCapacity"] == 0
    assert history.slot("AWS::AutoScaling::WarmPool")["MinSize"] == 1
    # Both slots scale on their own version's requests.
    for group, version in ((fleet.auto_scaling_group, "v3"), (fleet.green_auto_scaling_group, "v2")):
        (tracking,) = [p for p in _scaling_policies_of(history, group) if p["PolicyType"] == "TargetTrackingScaling"]
        dimensions = [d for m in tracking["TargetTrackingConfiguration"]["CustomizedMetricSpecification"]["Metrics"]
                      if "MetricStat" in m for d in m["MetricStat"]["Metric"]["Dimensions"]]
        assert {d["Value"] for d in dimensions if d["Name"] == "ModelVersion"} == {version}
    statements = json.dumps(history.fleet.instance_policy.document.to_json())
    assert "llama-3.1-8b/v3/" in statements and "llama-3.1-8b/v2/" in statements and "/v1/" not in statements


def test_a_release_during_a_rollout_is_stopped_before_any_launch_template_changes(chat8b: Synth) -> None:
    resources = chat8b.raw["Resources"]
    (check_id,) = [k for k in resources if k.startswith("ChatRolloutLockCheck") and
                   resources[k]["Type"] == "Custom::AWS"]
    check = resources[check_id]["Properties"]
    lock = chat8b.fleet.rollout.lock_parameter_name  # type: ignore[union-attr]
    assert '"getParameter"' in json.dumps(check["Update"]).replace('\\', '') and lock in json.dumps(check["Update"])
    assert '"putParameter"' in json.dumps(check["Create"]).replace('\\', '')
    templates = [k for k, r in resources.items() if r["Type"] == "AWS::EC2::LaunchTemplate"]
    assert len(templates) == 2 and all(check_id in resources[k].get("DependsOn", []) for k in templates)
    trigger = next(k for k in resources if k.startswith("ChatStartRollout") and resources[k]["Type"] == "Custom::AWS")
    assert check_id in resources[trigger]["DependsOn"]
    # The state machine takes and gives back that one parameter, nothing else in Systems Manager.
    statements = chat8b.fleet.rollout.policy_document.document.to_json()["Statement"]  # type: ignore[union-attr]
    (lock_statement,) = [st for st in statements if st.get("Sid") == "OneRolloutAtATime"]
    assert sorted(lock_statement["Action"]) == ["ssm:DeleteParameter", "ssm:GetParameter", "ssm:PutParameter"]
    # The slots' refreshes start before the execution, so it can undo one that changed the serving slot's version.
    refreshes = [k for k in resources if k.startswith("ChatInstanceRefresh") and resources[k]["Type"] == "Custom::AWS"]
    assert len(refreshes) == 2 and set(refreshes) <= set(resources[trigger]["DependsOn"])
    assert json.dumps(Stack.of(chat8b.fleet).resolve(lock_statement["Resource"])).endswith(f'parameter{lock}"]]}}')


def test_the_fleet_simulator_reads_the_release_from_the_synthesized_template(history: Synth) -> None:
    # The simulator's release fixture (tests/simulation/fixtures/release.template.json) is trimmed from such a
    # template; this keeps the reader honest against the construct as it synthesizes today.
    from genai_constructs.simulation.rollout import read_rollout

    old, new, rollout = read_rollout(history.raw)
    assert (new.plan.model_version, old.plan.model_version) == ("v3", "v2")  # v3 goes to blue, green serves v2
    assert rollout.steps == history.fleet.rollout_policy.steps  # type: ignore[union-attr]
    assert rollout.bake_s == history.fleet.rollout_policy.bake.to_seconds()  # type: ignore[union-attr]
    assert len(rollout.alarms) == 2 and old.unmodelled == () and new.unmodelled == ()


def test_release_slots_alternate_and_the_last_release_is_live() -> None:
    slots = fleet_module._release_slots
    assert slots((V1,), green_model_artifact=None, live_slot=None, rollout=fleet_module.DEFAULT_ROLLOUT,
                 problems=[]) == (V1, None, None)
    assert slots((V1, V2), green_model_artifact=None, live_slot=None, rollout=fleet_module.DEFAULT_ROLLOUT,
                 problems=[]) == (V1, V2, "Green")
    assert slots((V1, V2, V3), green_model_artifact=None, live_slot=None, rollout=fleet_module.DEFAULT_ROLLOUT,
                 problems=[]) == (V3, V2, "Blue")
    assert [fleet_module.slot_of_release(i) for i in range(4)] == ["Blue", "Green", "Blue", "Green"]


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
    assert len(fleet_roles) == 3  # the instance role, the SDK provider's role, the rollout state machine's role
    for role in fleet_roles.values():
        for arn in role["Properties"].get("ManagedPolicyArns", []):
            assert "Ref" in arn, arn  # a policy from this stack, never arn:aws:iam::aws:policy/...
    sdk_policies = [k for k in resources_of_type(chat8b.raw, "AWS::IAM::ManagedPolicy") if "SuspendAzRebalance" in k
                    or "InstanceRefresh" in k]
    assert len(sdk_policies) == 4  # per slot: AZRebalance suspended, the instance refresh
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
        "PullServerImage", "EcrAuthorizationToken", "SessionManagerRegister", "SessionManagerChannels",
        "CompleteOwnLaunchHook", "ReadRuntimeCode"}


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


def test_fleet_alarms_and_each_slots_own_alarms_notify_the_topic(chat8b: Synth) -> None:
    alarms = _topic_alarms(chat8b)
    assert sorted(k.split("Alarm")[0].removeprefix("Chat") for k in alarms) == [
        "BlueHttp5xxRate", "BlueP95TimePerOutputToken", "BlueP95TimeToFirstToken", "BlueUnhealthyHosts",
        "GpuMemory", "GreenHttp5xxRate", "GreenUnhealthyHosts", "Http5xxRate", "Overprovisioned", "P99TimePerOutputToken", "P99TimeToFirstToken",
        "UnhealthyHosts", "UnhealthyHostsGreen"]


def test_slot_alarms_judge_the_slots_own_version_at_the_p95_targets(chat8b: Synth) -> None:
    alarms = _topic_alarms(chat8b)
    (ttft,) = [a for k, a in alarms.items() if "BlueP95TimeToFirstToken" in k]
    (tpot,) = [a for k, a in alarms.items() if "BlueP95TimePerOutputToken" in k]
    for alarm, target in ((ttft, TRAFFIC_8B.p95_ttft_ms), (tpot, TRAFFIC_8B.tpot_target_ms)):
        assert alarm["ExtendedStatistic"] == "p95" and alarm["Threshold"] == target
        assert {"Name": "ModelVersion", "Value": ARTIFACT_8B.version} in alarm["Dimensions"]
        assert (alarm["EvaluationPeriods"], alarm["DatapointsToAlarm"]) == (3, 2)


def test_p99_latency_alarms_are_at_twice_the_p95_targets_in_milliseconds(chat8b: Synth) -> None:
    alarms = _topic_alarms(chat8b)
    (ttft,) = [a for k, a in alarms.items() if "P99TimeToFirstToken" in k]
    (tpot,) = [a for k, a in alarms.items() if "P99TimePerOutputToken" in k]
    assert ttft["ExtendedStatistic"] == tpot["ExtendedStatistic"] == "p99"
    assert ttft["MetricName"] == "TimeToFirstToken" and ttft["Threshold"] == 2 * TRAFFIC_8B.p95_ttft_ms
    assert tpot["MetricName"] == "TimePerOutputToken" and tpot["Threshold"] == 100  # 2 x 50 ms
    assert ttft["Namespace"] == "GenaiConstructs/Inference"


def test_gpu_utilization_appears_only_in_the_overprovisioning_alarm(chat8b: Synth) -> None:
    with_gpu = [k for k, a in _topic_alarms(chat8b).items() if "nvidia_smi_utilization_gpu" in json.dumps(a)]
    assert [k.split("Alarm")[0].removeprefix("Chat") for k in with_gpu] == ["Overprovisioned"]
    (alarm,) = [a for k, a in _topic_alarms(chat8b).items() if "Overprovisioned" in k]
    returned = [m["Expression"] for m in alarm["Metrics"] if m.get("ReturnData", True) and "Expression" in m]
    assert returned == ["IF(instances > 2 AND gpu < 15, 1, 0)"]  # above the minimum (2) with GPUs under 15 % busy
    assert alarm["EvaluationPeriods"] == alarm["DatapointsToAlarm"] == 4


def test_cloudwatch_may_publish_this_accounts_alarms_to_the_topic_over_tls_only(chat8b: Synth) -> None:
    document = chat8b.only("AWS::SNS::TopicPolicy")["PolicyDocument"]
    pseudo = {"AWS::AccountId": "111122223333"}

    def decision(service: str, account: str, tls: bool) -> str:
        return resource_policy_decision(
            document, service=service, action="sns:Publish", pseudo=pseudo,
            context={"aws:SourceAccount": account, "aws:SecureTransport": "true" if tls else "false"})

    # Round 1's policy held only the TLS Deny: this was "implicit deny", so no alarm was ever delivered.
    assert decision("cloudwatch.amazonaws.com", "111122223333", tls=True) == "allow"
    assert decision("cloudwatch.amazonaws.com", "444455556666", tls=True) == "implicit deny"  # another account's alarm
    assert decision("cloudwatch.amazonaws.com", "111122223333", tls=False) == "deny"
    assert decision("events.amazonaws.com", "111122223333", tls=True) == "implicit deny"


def test_two_saved_queries_read_the_per_request_lines(chat8b: Synth) -> None:
    queries = {q["Properties"]["Name"].rsplit("/", 1)[1]: q["Properties"]
               for q in resources_of_type(chat8b.raw, "AWS::Logs::QueryDefinition").values()}
    assert sorted(queries) == ["p95 TTFT and TPOT by model version", "slowest requests with their breakdown"]
    for query in queries.values():
        assert query["LogGroupNames"] == [{"Ref": logical_id(chat8b.fleet.log_group)}]
    by_version = queries["p95 TTFT and TPOT by model version"]["QueryString"]
    assert "pct(ttft_ms, 95)" in by_version and "pct(tpot_ms, 95)" in by_version
    assert "by model_version, bin(5m)" in by_version
    slowest = queries["slowest requests with their breakdown"]["QueryString"]
    assert "sort e2e_ms desc" in slowest and "retrieval_ms" in slowest and "queue_ms" in slowest


def test_gpu_memory_alarm_reads_the_agents_nvidia_metrics(chat8b: Synth) -> None:
    (alarm,) = [a for k, a in _topic_alarms(chat8b).items() if "GpuMemory" in k]
    names = {m.get("MetricStat", {}).get("Metric", {}).get("MetricName") for m in alarm["Metrics"]}
    assert {"nvidia_smi_memory_used", "nvidia_smi_memory_total"} <= names
    assert alarm["Threshold"] == 97


def test_blue_green_alarms_on_both_target_groups(chat70b: Synth) -> None:
    # The fleet's seven (unhealthy hosts per target group) and four of each slot's own.
    assert len(_topic_alarms(chat70b)) == 7 + 2 * 4


def test_dashboard_shows_latency_errors_hosts_gpu_and_cost_per_million_tokens(chat8b: Synth) -> None:
    body = json.dumps(chat8b.only("AWS::CloudWatch::Dashboard")["DashboardBody"])
    for needle in ("TimeToFirstToken", "TimePerOutputToken", "RequestsInFlight", "RequestsWaiting", "KvCacheUsage",
                   "TargetResponseTime", "not TTFT", "p50", "p99", "HTTPCode_Target_5XX_Count", "HealthyHostCount",
                   "nvidia_smi_utilization_gpu", "CPUUtilization", "NetworkIn",
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
    assert fleet.plan.instance_type == chat8b.slot("AWS::EC2::LaunchTemplate")["LaunchTemplateData"]["InstanceType"]
    for name in ("auto_scaling_group", "load_balancer", "target_group", "listener", "role", "security_group",
                 "connections", "dashboard"):
        assert getattr(fleet, name) is not None, name
    assert fleet.connections.default_port is not None
    assert fleet.metric_target_response_time("p99").statistic == "p99"
    assert fleet.metric_request_count_per_target().metric_name == "RequestCountPerTarget"


def test_each_group_records_the_plan_it_was_built_from_as_literals(chat70b: Synth) -> None:
    for group in (chat70b.fleet.auto_scaling_group, chat70b.fleet.green_auto_scaling_group):
        assert group is not None
        recorded = chat70b.raw["Resources"][logical_id(group)]["Metadata"]["genai-constructs:plan"]
        assert "${Token" not in json.dumps(recorded) and '"Ref"' not in json.dumps(recorded)
        assert recorded["instance_type"] == chat70b.fleet.plan.instance_type
        assert recorded["server"]["max_num_seqs"] == chat70b.fleet.plan.server.max_num_seqs
        assert recorded["in_flight_target"] == chat70b.fleet.plan.concurrency_per_instance
        assert recorded["time_to_serving_s"]["cold"] == 977.0 and recorded["traffic"]["p95_tpot_ms"] == 50
    versions = {chat70b.raw["Resources"][logical_id(g)]["Metadata"]["genai-constructs:plan"]["model_version"]
                for g in (chat70b.fleet.auto_scaling_group, chat70b.fleet.green_auto_scaling_group) if g}
    assert versions == {"2024-07", "2024-09"}


# ---- Several replicas per instance -------------------------------------------------------------------------------

P5_REPLICAS, P5_SEQS_PER_REPLICA = 8, 32


def _eight_replica_plan(real: Any) -> Any:
    """plan_inference on p5.48xlarge, laid out as 8 one-GPU replicas (what the planner picks for an 8B there)."""
    def plan(*args: Any, **kwargs: Any) -> Any:
        one_wide = real(*args, **kwargs)
        server = one_wide.server.model_copy(update={"tensor_parallel_size": 1, "max_num_seqs": P5_SEQS_PER_REPLICA})
        return one_wide.model_copy(update={
            "replicas_per_instance": P5_REPLICAS, "devices_per_replica": 1, "server": server,
            "concurrency_per_instance": P5_REPLICAS * 24})
    return plan


@pytest.fixture(scope="module")
def p5_eight_replicas() -> Synth:
    def make(app: App) -> GpuInferenceFleet:
        stack = Stack(app, "P5Replicas")
        return GpuInferenceFleet(
            stack, "Chat", network=PrivateDataPath(stack, "Net"), model=ModelShape.preset("llama-3.1-8b"),
            traffic=TRAFFIC_8B, model_artifact=ARTIFACT_8B, allow_plain_http=True, instance_type="p5.48xlarge")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fleet_module, "plan_inference", _eight_replica_plan(fleet_module.plan_inference))
        return _synth(make, packs=())


def test_an_eight_replica_plan_starts_eight_one_gpu_servers_on_their_own_gpus_and_ports(
        p5_eight_replicas: Synth, tmp_path: Path) -> None:
    script_text = user_data_of(p5_eight_replicas, "ChatLaunchTemplate")
    for setting in ("REPLICAS_PER_INSTANCE=8", "DEVICES_PER_REPLICA=1", "TENSOR_PARALLEL_SIZE=1",
                    f"MAX_NUM_SEQS={P5_SEQS_PER_REPLICA}"):
        assert f"readonly {setting}\n" in script_text
    # Run the synthesized script's serve step for every replica against a recording docker.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text('#!/bin/bash\necho "docker $*" >> "$DOCKER_LOG"\n')
    (bin_dir / "docker").chmod(0o755)
    models = tmp_path / "models"
    script = tmp_path / "user-data.sh"
    script.write_text(script_text.replace("readonly MODELS_ROOT=/opt/models", f"readonly MODELS_ROOT={models}"))
    version_dir = models / ARTIFACT_8B.version
    version_dir.mkdir(parents=True)
    (version_dir / f".verified-{ARTIFACT_8B.version}").touch()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "DOCKER_LOG": str(tmp_path / "docker.log")}
    for replica in range(P5_REPLICAS):
        result = subprocess.run(["bash", str(script), "serve", str(replica)], capture_output=True, text=True,
                                env=env, timeout=30)
        assert result.returncode == 0, result.stderr
    runs = [line.split() for line in (tmp_path / "docker.log").read_text().splitlines() if line.startswith("docker run")]
    assert [run[run.index("--gpus") + 1] for run in runs] == [f'"device={gpu}"' for gpu in range(P5_REPLICAS)]
    assert [run[run.index("--publish") + 1] for run in runs] == [
        f"127.0.0.1:{18000 + replica}:8000" for replica in range(P5_REPLICAS)]
    assert all(" ".join(run).count("--tensor-parallel-size 1 ") == 1 for run in runs)
    assert all(f"--max-num-seqs {P5_SEQS_PER_REPLICA} " in " ".join(run) for run in runs)


def test_an_eight_replica_fleet_records_its_layout_and_scales_on_the_whole_instance(p5_eight_replicas: Synth) -> None:
    fleet = p5_eight_replicas.fleet
    recorded = p5_eight_replicas.raw["Resources"][logical_id(fleet.auto_scaling_group)]["Metadata"][
        "genai-constructs:plan"]
    assert (recorded["replicas_per_instance"], recorded["devices_per_replica"]) == (P5_REPLICAS, 1)
    assert recorded["server"]["tensor_parallel_size"] == 1
    # The proxy sums its replicas' gauges, so the per-instance target is the plan's per-instance concurrency.
    assert recorded["in_flight_target"] == fleet.in_flight_target == P5_REPLICAS * 24
    for template in resources_of_type(p5_eight_replicas.raw, "AWS::EC2::LaunchTemplate").values():
        parts = template["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]["Fn::Join"][1]
        assert len("".join(p if isinstance(p, str) else "x" * 100 for p in parts).encode()) < 16 * 1024


def test_a_layout_that_does_not_fit_the_instance_is_refused_naming_the_devices(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real = fleet_module.plan_inference

    def sixteen(*args: Any, **kwargs: Any) -> Any:
        return _eight_replica_plan(real)(*args, **kwargs).model_copy(update={"replicas_per_instance": 16})

    monkeypatch.setattr(fleet_module, "plan_inference", sixteen)
    stack = Stack(App(), "Misfit")
    with pytest.raises(ConfigurationError) as raised:
        GpuInferenceFleet(stack, "Chat", network=PrivateDataPath(stack, "Net"), model=ModelShape.preset("llama-3.1-8b"),
                          traffic=TRAFFIC_8B, model_artifact=ARTIFACT_8B, allow_plain_http=True,
                          instance_type="p5.48xlarge")
    assert ("instance_type ('p5.48xlarge') has 8 accelerator devices, but the plan runs 16 replicas of 1 devices "
            "(16): drop instance_type to let the planner choose, or pick one with more devices") in str(raised.value)
