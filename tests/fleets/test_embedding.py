"""EmbeddingBatchFleet: one synthesis per configuration (module scope), then one assertion per point and default."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pytest
from aws_cdk import App, Duration, Stack
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_s3 as s3

from genai_constructs.errors import ConfigurationError
from genai_constructs.fleets import EmbeddingBatchFleet
from genai_constructs.fleets import embedding as E
from genai_constructs.network import PrivateDataPath
from genai_constructs.planner import load_catalog, plan_embedding
from genai_constructs.runtime import batch_worker
from genai_constructs.workload import BatchTraffic, ModelShape
from tests.support import resources_of_type, synth_app

MODEL = ModelShape.preset("bge-large-en-v1.5")
SPOT = BatchTraffic(documents=2_000_000, tokens_per_document=800, deadline_hours=12, spot_ok=True)
ON_DEMAND = BatchTraffic(documents=200_000, tokens_per_document=400, deadline_hours=6)


class Built:
    fleet: EmbeddingBatchFleet
    template: dict[str, Any]
    violations: list[str]


def _synth(**kwargs: Any) -> Built:
    built = Built()

    def build(app: App) -> Stack:
        stack = Stack(app, "Embedding")
        network = PrivateDataPath(stack, "Net")
        extra = {k: (v(stack) if callable(v) else v) for k, v in kwargs.items()}
        built.fleet = EmbeddingBatchFleet(stack, "Embed", network=network, **extra)
        return stack

    result = synth_app(build)
    built.template = result.template("Embedding")
    built.violations = result.violation_summary()
    return built


@pytest.fixture(scope="module")
def spot() -> Built:
    """The issue's simplest call, exactly."""
    return _synth(model=MODEL, traffic=SPOT)


@pytest.fixture(scope="module")
def on_demand() -> Built:
    """On-demand with a warm pool, a host command instead of an image, and an existing input bucket."""
    return _synth(model=MODEL, traffic=ON_DEMAND, warm_pool=True, worker_command="/opt/worker/bin/run",
                  input_bucket=lambda stack: s3.Bucket.from_bucket_name(stack, "Existing", "my-documents"),
                  input_prefix="docs/", max_receive_count=3)


def _one(template: dict[str, Any], resource_type: str, match: Any = None) -> dict[str, Any]:
    found = [r["Properties"] for r in resources_of_type(template, resource_type).values()
             if match is None or match(r["Properties"])]
    assert len(found) == 1, f"expected one {resource_type}, found {len(found)}"
    return found[0]


def _buckets(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {k: v["Properties"] for k, v in resources_of_type(template, "AWS::S3::Bucket").items()
            if k.startswith("EmbedInputBucket") or k.startswith("EmbedOutputBucket")}


def _user_data(template: dict[str, Any]) -> str:
    lt = _one(template, "AWS::EC2::LaunchTemplate")
    parts = lt["LaunchTemplateData"]["UserData"]["Fn::Base64"]
    if isinstance(parts, str):
        return parts
    return "".join(p if isinstance(p, str) else "<token>" for p in parts["Fn::Join"][1])


def _policy_statements(template: dict[str, Any]) -> list[dict[str, Any]]:
    policy = _one(template, "AWS::IAM::ManagedPolicy", lambda p: "EmbeddingBatchFleet" in p.get("Description", ""))
    return policy["PolicyDocument"]["Statement"]


# ---- The simplest call and the plan -----------------------------------------------------------------------------

def test_simplest_call_takes_its_plan_from_plan_embedding(spot: Built) -> None:
    assert spot.fleet.plan == plan_embedding(MODEL, SPOT)


def test_is_cdk_nag_aws_solutions_clean(spot: Built, on_demand: Built) -> None:
    assert spot.violations == []
    assert on_demand.violations == []


# ---- 1. Staging -------------------------------------------------------------------------------------------------

def test_buckets_are_kms_encrypted_by_default(spot: Built) -> None:
    for props in _buckets(spot.template).values():
        rule = props["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]["ServerSideEncryptionByDefault"]
        assert rule["SSEAlgorithm"] == "aws:kms" and "KMSMasterKeyID" in rule


def test_buckets_block_public_access_and_deny_plain_http(spot: Built) -> None:
    for props in _buckets(spot.template).values():
        assert all(props["PublicAccessBlockConfiguration"][k] for k in
                   ("BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets"))
    denies = [s for p in resources_of_type(spot.template, "AWS::S3::BucketPolicy").values()
              for s in p["Properties"]["PolicyDocument"]["Statement"]
              if s["Effect"] == "Deny" and s.get("Condition", {}).get("Bool", {}).get("aws:SecureTransport") == "false"]
    assert len(denies) >= 2


def test_output_bucket_is_versioned_and_expires_superseded_versions(spot: Built) -> None:
    (output,) = [p for k, p in _buckets(spot.template).items() if k.startswith("EmbedOutputBucket")]
    assert output["VersioningConfiguration"] == {"Status": "Enabled"}
    rule = output["LifecycleConfiguration"]["Rules"][0]
    assert rule["NoncurrentVersionExpiration"]["NoncurrentDays"] == E.NONCURRENT_VERSION_EXPIRATION.to_days()


def test_staged_documents_expire_under_the_input_prefix(spot: Built) -> None:
    (inp,) = [p for k, p in _buckets(spot.template).items() if k.startswith("EmbedInputBucket")]
    rules = {r["Id"]: r for r in inp["LifecycleConfiguration"]["Rules"]}
    assert rules["ExpireStagedDocuments"]["Prefix"] == E.DEFAULT_INPUT_PREFIX
    assert rules["ExpireStagedDocuments"]["ExpirationInDays"] == E.INPUT_EXPIRATION.to_days()
    assert rules["AbortIncompleteUploads"]["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"] == 1


def test_new_objects_under_the_input_prefix_notify_the_queue(spot: Built) -> None:
    notification = _one(spot.template, "Custom::S3BucketNotifications")
    (config,) = notification["NotificationConfiguration"]["QueueConfigurations"]
    assert config["Events"] == ["s3:ObjectCreated:*"]
    assert config["Filter"]["Key"]["FilterRules"] == [{"Name": "prefix", "Value": "incoming/"}]


def test_s3_may_use_the_queue_key_to_deliver_notifications(spot: Built) -> None:
    key = _one(spot.template, "AWS::KMS::Key", lambda p: "input and dead-letter queues" in p.get("Description", ""))
    statements = key["KeyPolicy"]["Statement"]
    assert any(s.get("Principal") == {"Service": "s3.amazonaws.com"} and "kms:GenerateDataKey*" in s["Action"]
               for s in statements)


def test_buckets_are_registered_with_the_s3_gateway_endpoint(spot: Built) -> None:
    endpoint = _one(spot.template, "AWS::EC2::VPCEndpoint", lambda p: "PolicyDocument" in p
                    and any(s.get("Sid") == "RegisteredBucketsWrite" for s in p["PolicyDocument"]["Statement"]))
    write = next(s for s in endpoint["PolicyDocument"]["Statement"] if s["Sid"] == "RegisteredBucketsWrite")
    assert any("EmbedOutputBucket" in json.dumps(r) for r in write["Resource"])


# ---- 2. Queue ---------------------------------------------------------------------------------------------------

def _queues(template: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    queues = resources_of_type(template, "AWS::SQS::Queue")
    main = next(v["Properties"] for k, v in queues.items() if k.startswith("EmbedQueue"))
    dlq = next(v["Properties"] for k, v in queues.items() if k.startswith("EmbedDeadLetterQueue"))
    return main, dlq


def test_queues_are_kms_encrypted_and_long_poll(spot: Built) -> None:
    main, dlq = _queues(spot.template)
    assert "KmsMasterKeyId" in main and "KmsMasterKeyId" in dlq
    assert main["ReceiveMessageWaitTimeSeconds"] == 20


def test_queues_deny_plain_http(spot: Built) -> None:
    policies = resources_of_type(spot.template, "AWS::SQS::QueuePolicy")
    denies = [s for p in policies.values() for s in p["Properties"]["PolicyDocument"]["Statement"]
              if s["Effect"] == "Deny" and s["Condition"]["Bool"]["aws:SecureTransport"] == "false"]
    assert len(denies) == 2


def test_dead_letter_queue_after_the_documented_receive_count_by_default(spot: Built, on_demand: Built) -> None:
    assert _queues(spot.template)[0]["RedrivePolicy"]["maxReceiveCount"] == E.DEFAULT_MAX_RECEIVE_COUNT
    assert _queues(on_demand.template)[0]["RedrivePolicy"]["maxReceiveCount"] == 3


def test_visibility_timeout_is_derived_from_the_plan(spot: Built) -> None:
    plan = spot.fleet.plan
    derived = math.ceil(max(E.MIN_VISIBILITY_TIMEOUT.to_seconds(), plan.seconds_per_document
                            * batch_worker.DEFAULT_DOCUMENTS_PER_MESSAGE * E.VISIBILITY_MARGIN))
    assert _queues(spot.template)[0]["VisibilityTimeout"] == derived
    assert f"readonly VISIBILITY_TIMEOUT_S={derived}" in _user_data(spot.template)


def test_visibility_timeout_grows_with_documents_per_message() -> None:
    slow = plan_embedding(MODEL, SPOT).model_copy(update={"seconds_per_document": 2.0})
    built = _synth(model=MODEL, traffic=SPOT, plan=slow, documents_per_message=100)
    assert _queues(built.template)[0]["VisibilityTimeout"] == math.ceil(2.0 * 100 * E.VISIBILITY_MARGIN)


# ---- 3. Workers -------------------------------------------------------------------------------------------------

def test_group_scales_to_zero_and_up_to_the_plan(spot: Built) -> None:
    group = _one(spot.template, "AWS::AutoScaling::AutoScalingGroup")
    assert group["MinSize"] == "0" and group["MaxSize"] == str(spot.fleet.plan.max_instances)


def test_spot_uses_a_mixed_instances_policy_without_on_demand_above_base(spot: Built) -> None:
    group = _one(spot.template, "AWS::AutoScaling::AutoScalingGroup")
    distribution = group["MixedInstancesPolicy"]["InstancesDistribution"]
    assert distribution["OnDemandBaseCapacity"] == 0
    assert distribution["OnDemandPercentageAboveBaseCapacity"] == 0
    overrides = [o["InstanceType"] for o in group["MixedInstancesPolicy"]["LaunchTemplate"]["Overrides"]]
    assert overrides == spot.fleet.plan.spot_instance_types and len(overrides) >= 2
    assert group["CapacityRebalance"] is True


def test_on_demand_uses_the_launch_template_alone(on_demand: Built) -> None:
    group = _one(on_demand.template, "AWS::AutoScaling::AutoScalingGroup")
    assert "MixedInstancesPolicy" not in group and "LaunchTemplate" in group
    assert len(resources_of_type(on_demand.template, "AWS::AutoScaling::WarmPool")) == 1


def test_workers_use_the_shared_gpu_launch_template(spot: Built) -> None:
    data = _one(spot.template, "AWS::EC2::LaunchTemplate")["LaunchTemplateData"]
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    (root,) = data["BlockDeviceMappings"]
    assert root["Ebs"]["Encrypted"] is True and "KmsKeyId" in root["Ebs"]
    assert data["Monitoring"] == {"Enabled": True}
    assert "amazon-cloudwatch-agent-ctl" in _user_data(spot.template)


def test_instance_store_nvme_becomes_a_disposable_cache(spot: Built) -> None:
    assert load_catalog().instance(spot.fleet.plan.instance_type).instance_store_gb > 0
    assert spot.fleet.instance_store_cache
    script = _user_data(spot.template)
    assert "Amazon EC2 NVMe Instance Storage" in script and "mkfs.xfs" in script
    assert f"readonly INSTANCE_STORE_MOUNT={E.INSTANCE_STORE_MOUNT}" in script


def test_worker_runs_the_default_image_one_per_gpu(spot: Built) -> None:
    script = _user_data(spot.template)
    assert E.DEFAULT_WORKER_IMAGE_REPOSITORY in json.dumps(spot.template) and "--gpus device=%i" in script
    assert "nvidia-smi -L" in script


def test_worker_command_replaces_the_image(on_demand: Built) -> None:
    script = _user_data(on_demand.template)
    assert "readonly WORKER_COMMAND=/opt/worker/bin/run" in script
    assert not any(s["Sid"] == "PullWorkerImage" for s in _policy_statements(on_demand.template))


# ---- 4. Scaling -------------------------------------------------------------------------------------------------

def _policies(template: dict[str, Any]) -> list[dict[str, Any]]:
    return [v["Properties"] for v in resources_of_type(template, "AWS::AutoScaling::ScalingPolicy").values()]


def test_scales_on_backlog_per_instance_with_metric_math(spot: Built) -> None:
    (tracking,) = [p for p in _policies(spot.template) if p["PolicyType"] == "TargetTrackingScaling"]
    config = tracking["TargetTrackingConfiguration"]
    metrics = {m["Id"]: m for m in config["CustomizedMetricSpecification"]["Metrics"]}
    assert metrics["backlog"]["Expression"] == "visible / inservice"
    assert metrics["visible"]["MetricStat"]["Metric"]["MetricName"] == "ApproximateNumberOfMessagesVisible"
    assert metrics["inservice"]["MetricStat"]["Metric"]["MetricName"] == "GroupInServiceInstances"
    assert config["TargetValue"] == spot.fleet.backlog_per_instance_target and config["DisableScaleIn"] is True


def test_steps_out_on_the_age_of_the_oldest_message_against_the_deadline(spot: Built) -> None:
    alarm = _one(spot.template, "AWS::CloudWatch::Alarm",
                 lambda p: p.get("MetricName") == "ApproximateAgeOfOldestMessage" and p["Threshold"] == 120)
    assert alarm["AlarmActions"]
    deadline = SPOT.deadline_hours * 3600
    assert spot.fleet.age_step_thresholds_s == [120, 0.25 * deadline, 0.5 * deadline]


def test_scales_in_to_zero_only_after_the_queue_was_empty_a_while(spot: Built) -> None:
    (to_zero,) = [p for p in _policies(spot.template) if p.get("AdjustmentType") == "ExactCapacity"]
    assert to_zero["StepAdjustments"] == [{"MetricIntervalUpperBound": 0, "ScalingAdjustment": 0}]
    alarm = _one(spot.template, "AWS::CloudWatch::Alarm", lambda p: "empty" in p.get("AlarmDescription", ""))
    assert alarm["EvaluationPeriods"] == E.DEFAULT_SCALE_IN_AFTER.to_minutes()
    assert alarm["ComparisonOperator"] == "LessThanOrEqualToThreshold" and alarm["Threshold"] == 0


def test_workers_get_the_plans_concurrency_cap_and_batch_size(spot: Built) -> None:
    script = _user_data(spot.template)
    assert f"readonly MAX_CONCURRENCY={spot.fleet.plan.max_concurrency_per_worker}" in script
    assert f"readonly BATCH_SIZE={spot.fleet.plan.batch_size}" in script


# ---- 6. IAM -----------------------------------------------------------------------------------------------------

def test_role_has_only_a_customer_managed_policy(spot: Built) -> None:
    role = _one(spot.template, "AWS::IAM::Role", lambda p: p["AssumeRolePolicyDocument"]["Statement"][0]
                ["Principal"].get("Service") == "ec2.amazonaws.com")
    (arn,) = role["ManagedPolicyArns"]
    assert "Ref" in arn and "Policies" not in role
    inline = [p for p in resources_of_type(spot.template, "AWS::IAM::Policy").values()
              if "EmbedInstanceRole" in json.dumps(p["Properties"].get("Roles", []))]
    assert inline == []


def test_policy_is_scoped_to_the_exact_prefixes(spot: Built) -> None:
    statements = {s["Sid"]: s for s in _policy_statements(spot.template)}
    read = json.dumps(statements["ReadStagedDocumentsAndModel"]["Resource"])
    assert "/incoming/*" in read and f"/models/{MODEL.name}/*" in read
    assert "/embeddings/*" in json.dumps(statements["WriteVectors"]["Resource"])
    assert statements["WriteVectors"]["Action"] == "s3:PutObject"
    assert "QueueArn" in json.dumps(statements["ConsumeQueue"]["Resource"]) or "Arn" in json.dumps(
        statements["ConsumeQueue"]["Resource"])


# ---- 7. Observability -------------------------------------------------------------------------------------------

def test_alarms_cover_depth_age_dlq_workers_and_gpu(spot: Built) -> None:
    assert set(spot.fleet.alarms) == {"OldestMessageAgainstDeadline", "DeadLetterQueueNotEmpty", "QueueDepth",
                                      "NoWorkersInService", "GpuStarved"}
    dlq = _one(spot.template, "AWS::CloudWatch::Alarm", lambda p: "dead-letter" in p.get("AlarmDescription", ""))
    assert dlq["Threshold"] == 1 and dlq["AlarmActions"]
    age = _one(spot.template, "AWS::CloudWatch::Alarm", lambda p: "half the" in p.get("AlarmDescription", ""))
    assert age["Threshold"] == E.AGE_ALARM_FRACTION * SPOT.deadline_hours * 3600


def test_dashboard_shows_the_batch_signals(spot: Built) -> None:
    body = json.dumps(_one(spot.template, "AWS::CloudWatch::Dashboard")["DashboardBody"])
    for title in ("Queue depth", "Age of oldest message", "Dead-letter queue", "Workers in service",
                  "GPU utilization and memory", "Documents and vectors per minute", "Cost per 1M vectors"):
        assert title in body, title


# ---- Bad inputs -------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def scope() -> tuple[Stack, PrivateDataPath]:
    stack = Stack(App(), "Bad")
    return stack, PrivateDataPath(stack, "Net")


def _fails(scope: tuple[Stack, PrivateDataPath], match: str, **kwargs: Any) -> ConfigurationError:
    stack, network = scope
    args: dict[str, Any] = {"model": MODEL, "traffic": SPOT, **kwargs}
    with pytest.raises(ConfigurationError, match=re.escape(match)) as error:
        EmbeddingBatchFleet(stack, "Fleet", network=network, **args)
    assert error.value.construct == "EmbeddingBatchFleet"
    return error.value


def test_fails_warm_pool_with_spot_in_plain_words(scope: Any) -> None:
    _fails(scope, "warm_pool=True cannot be combined with Spot (traffic.spot_ok=True): EC2 Auto Scaling does not "
                  "allow a warm pool on a group that launches Spot Instances", warm_pool=True)


def test_fails_decoder_model(scope: Any) -> None:
    _fails(scope, "model ('llama-3.1-8b') is a decoder; an embedding fleet runs an encoder",
           model=ModelShape.preset("llama-3.1-8b"))


def test_fails_plan_for_another_model(scope: Any) -> None:
    other = plan_embedding(ModelShape.preset("bge-base-en-v1.5"), SPOT)
    _fails(scope, "plan was made for model 'bge-base-en-v1.5'", plan=other)


def test_fails_input_prefix_without_trailing_slash(scope: Any) -> None:
    _fails(scope, "input_prefix ('docs') must end in '/'", input_prefix="docs")


def test_fails_output_prefix_with_leading_slash(scope: Any) -> None:
    _fails(scope, "output_prefix ('/out/') must end in '/' and not start with '/'", output_prefix="/out/")


def test_fails_model_prefix_under_the_input_prefix(scope: Any) -> None:
    _fails(scope, "model_prefix ('incoming/model/') lies under input_prefix ('incoming/')",
           model_prefix="incoming/model/")


def test_fails_overlapping_prefixes_in_one_bucket(scope: Any) -> None:
    stack, _ = scope
    bucket = s3.Bucket.from_bucket_name(stack, "Shared", "shared-bucket")
    _fails(scope, "output_prefix ('incoming/vectors/') and input_prefix ('incoming/') overlap in the same bucket",
           input_bucket=bucket, output_bucket=bucket, output_prefix="incoming/vectors/")


def test_fails_image_and_command_together(scope: Any) -> None:
    stack, _ = scope
    repo = ecr.Repository.from_repository_name(stack, "Repo", "worker")
    _fails(scope, "worker_image_repository and worker_command were both given", worker_image_repository=repo,
           worker_command="run")


def test_fails_image_tag_with_command(scope: Any) -> None:
    _fails(scope, "worker_image_tag ('v1') was given with worker_command", worker_image_tag="v1",
           worker_command="run")


def test_fails_empty_worker_command(scope: Any) -> None:
    _fails(scope, "worker_command ('') is empty", worker_command=" ")


def test_fails_max_receive_count_out_of_range(scope: Any) -> None:
    _fails(scope, "max_receive_count (0) must be between 1 and 1000", max_receive_count=0)


def test_fails_documents_per_message_out_of_range(scope: Any) -> None:
    _fails(scope, "documents_per_message (0) must be between 1 and 10000", documents_per_message=0)


def test_fails_max_instances_below_one(scope: Any) -> None:
    _fails(scope, "max_instances (0) must be >= 1", max_instances=0)


def test_fails_scale_in_after_too_short(scope: Any) -> None:
    _fails(scope, "scale_in_after (30 seconds) must be between 1 minute and 1 day", scale_in_after=Duration.seconds(30))


def test_fails_visibility_timeout_beyond_the_sqs_limit(scope: Any) -> None:
    slow = plan_embedding(MODEL, SPOT).model_copy(update={"seconds_per_document": 100.0})
    _fails(scope, "exceeds SQS's 43200 s visibility limit: lower documents_per_message", plan=slow,
           documents_per_message=1000)


def test_fails_lists_every_problem_at_once(scope: Any) -> None:
    error = _fails(scope, "3 problem(s)", input_prefix="a", output_prefix="b", max_receive_count=0)
    assert len(error.problems) == 3


# ---- user data: shellcheck, and a warm pool that survives Stopped -------------------------------------------------

def _shellcheck(script: str, tmp_path: Any) -> None:
    import subprocess
    import sys
    from pathlib import Path

    # CloudFormation substitutes the tokens (queue URL, bucket names, region) with literal values at deploy time.
    path = tmp_path / "user-data.sh"
    path.write_text(re.sub(r"\$\{Token\[[^\]]+\]\}", "resolved-at-deploy", script))
    shellcheck = Path(sys.executable).parent / "shellcheck"
    result = subprocess.run([str(shellcheck), "--shell=bash", "--severity=style", str(path)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_rendered_user_data_is_shellcheck_clean(spot: Built, on_demand: Built, tmp_path: Any) -> None:
    _shellcheck(spot.fleet.user_data_script, tmp_path)
    _shellcheck(on_demand.fleet.user_data_script, tmp_path)


def test_warm_pool_caches_the_model_on_ebs_and_runs_at_every_boot(on_demand: Built) -> None:
    assert "readonly MODEL_CACHE_ON_EBS=1" in on_demand.fleet.user_data_script
    lt = _one(on_demand.template, "AWS::EC2::LaunchTemplate")
    assert "[scripts-user, always]" in json.dumps(lt["LaunchTemplateData"]["UserData"])


def test_a_warm_pool_launch_waits_on_a_hook_the_worker_completes_for_its_own_group(on_demand: Built) -> None:
    hook = _one(on_demand.template, "AWS::AutoScaling::LifecycleHook")
    assert hook["LifecycleHookName"] == "genai-instance-ready" and hook["DefaultResult"] == "ABANDON"
    assert hook["LifecycleTransition"] == "autoscaling:EC2_INSTANCE_LAUNCHING" and hook["HeartbeatTimeout"] == 900
    group = _one(on_demand.template, "AWS::AutoScaling::AutoScalingGroup")
    script = on_demand.fleet.user_data_script
    assert f"readonly AUTO_SCALING_GROUP_NAME={group['AutoScalingGroupName']}" in script
    assert "readonly LIFECYCLE_HOOK_NAME=genai-instance-ready" in script
    policy = _one(on_demand.template, "AWS::IAM::ManagedPolicy",
                  lambda p: "CompleteOwnLaunchHook" in json.dumps(p["PolicyDocument"]))
    (statement,) = [s for s in policy["PolicyDocument"]["Statement"] if s["Sid"] == "CompleteOwnLaunchHook"]
    assert group["AutoScalingGroupName"] in json.dumps(statement["Resource"])


def test_without_a_warm_pool_there_is_no_hook_to_complete(spot: Built) -> None:
    assert not resources_of_type(spot.template, "AWS::AutoScaling::LifecycleHook")
    assert "readonly LIFECYCLE_HOOK_NAME=''" in spot.fleet.user_data_script
    assert "CompleteOwnLaunchHook" not in json.dumps(spot.template)


def test_without_a_warm_pool_the_model_may_use_instance_store(spot: Built) -> None:
    assert "readonly MODEL_CACHE_ON_EBS=0" in spot.fleet.user_data_script
    lt = _one(spot.template, "AWS::EC2::LaunchTemplate")
    assert "[scripts-user, always]" not in json.dumps(lt["LaunchTemplateData"]["UserData"])


def test_rendered_user_data_fits_the_16_kib_limit_with_room_for_tokens(spot: Built, on_demand: Built) -> None:
    for built in (spot, on_demand):
        assert len(built.fleet.user_data_script.encode()) < E.USER_DATA_LIMIT_BYTES - 2048


# ---- user data, run for real (stub aws/docker/systemctl, a fake IMDS): the encoder's manifest and the launch hook --

def _run_embedding_script(built: Built, tmp_path: Any, *, state: str, tamper: bool = False) -> dict[str, Any]:
    """Run the fleet's rendered boot script under a scratch root; returns its exit status, log and recorded calls."""
    import hashlib
    import os
    import subprocess
    import zipfile

    from tests.fleets.test_launch import STUB_AWS, STUB_DOCKER, STUB_RECORDER, FakeImds, _executable

    root, bin_dir, s3 = tmp_path / "root", tmp_path / "bin", tmp_path / "s3"
    stubs = {"aws": STUB_AWS, "docker": STUB_DOCKER, "systemctl": STUB_RECORDER,
             "lsblk": "#!/bin/bash\nexit 0\n",  # no instance store: never touch this machine's disks
             "nvidia-smi": "#!/bin/bash\necho 'GPU 0: NVIDIA A10G'\necho 'GPU 1: NVIDIA A10G'\n",
             **{name: "#!/bin/bash\nexit 99\n" for name in ("mdadm", "mkfs.xfs", "mount", "blkid")}}
    bin_dir.mkdir()
    for name, text in stubs.items():
        _executable(bin_dir / name, text)
    agent = root / "opt" / "aws" / "amazon-cloudwatch-agent"
    (agent / "etc").mkdir(parents=True)
    (agent / "bin").mkdir()
    _executable(agent / "bin" / "amazon-cloudwatch-agent-ctl", "#!/bin/bash\nexit 0\n")
    (root / "etc" / "systemd" / "system").mkdir(parents=True)
    encoder = s3 / "models" / built.fleet.model_prefix
    encoder.mkdir(parents=True)
    (encoder / "model.safetensors").write_bytes(b"encoder" * 100)
    (encoder / "config.json").write_text('{"hidden_size": 1024}')
    (encoder / "SHA256SUMS").write_text("".join(
        f"{hashlib.sha256(path.read_bytes()).hexdigest()}  ./{path.name}\n"
        for path in sorted(encoder.iterdir()) if path.name != "SHA256SUMS"))
    if tamper:
        (encoder / "model.safetensors").write_bytes(b"tampered")
    (s3 / "code").mkdir()
    with zipfile.ZipFile(s3 / "code" / "worker.zip", "w") as archive:
        archive.writestr("batch_worker.py", "")
    # The settings CloudFormation fills in at deploy time, here pointing at the scratch world.
    script = re.sub(r"\$\{Token\[[^\]]+\]\}", "resolved-at-deploy", built.fleet.user_data_script)
    for name, value in (("MODEL_BUCKET", "models"), ("WORKER_CODE_BUCKET", "code"), ("WORKER_CODE_KEY", "worker.zip"),
                        ("INSTANCE_STORE_MOUNT", str(tmp_path / "instance-store"))):
        script = re.sub(rf"(?m)^readonly {name}=.*$", f"readonly {name}={value}", script)
    path = tmp_path / "user-data.sh"
    path.write_text(script)
    imds = FakeImds(state)
    try:
        env = {key: value for key, value in os.environ.items() if "proxy" not in key.lower()}
        env.update({"PATH": f"{bin_dir}:{os.environ['PATH']}", "GENAI_FS_ROOT": str(root), "IMDS_ENDPOINT": imds.url,
                    "FAKE_S3": str(s3), "AWS_LOG": str(tmp_path / "aws.log"),
                    "DOCKER_LOG": str(tmp_path / "docker.log"), "CALLS_LOG": str(tmp_path / "calls.log")})
        result = subprocess.run(["bash", str(path)], capture_output=True, text=True, env=env, timeout=30)
    finally:
        imds.close()

    def lines(name: str) -> list[str]:
        return (tmp_path / name).read_text().splitlines() if (tmp_path / name).exists() else []

    return {"status": result.returncode, "log": (root / "var" / "log" / "genai" / "bootstrap.log").read_text(),
            "aws": lines("aws.log"), "docker": lines("docker.log"), "systemctl": lines("calls.log"),
            "stamp": root / "opt" / "genai" / "cache" / "model" / ".verified-encoder",
            "unit": root / "etc" / "systemd" / "system" / "genai-embed@.service"}


def test_workers_start_once_the_encoder_passes_its_manifest(spot: Built, tmp_path: Any) -> None:
    run = _run_embedding_script(spot, tmp_path, state="InService")
    assert run["status"] == 0, run["log"]
    assert run["stamp"].exists()
    assert "systemctl enable --now genai-embed@0" in run["systemctl"]
    assert "systemctl enable --now genai-embed@1" in run["systemctl"]
    assert f"ConditionPathExists={run['stamp']}" in run["unit"].read_text()
    assert any(line.startswith("docker pull ") for line in run["docker"])
    assert not any(" autoscaling " in line for line in run["aws"])  # no warm pool, no hook


def test_workers_refuse_an_encoder_that_fails_its_manifest(spot: Built, tmp_path: Any) -> None:
    run = _run_embedding_script(spot, tmp_path, state="InService", tamper=True)
    assert run["status"] == 1
    assert "sha256 mismatch against SHA256SUMS for the encoder under s3://models/models/bge-large-en-v1.5/; " \
        "refusing to start" in run["log"]
    assert not run["stamp"].exists()
    assert not any(" enable " in line for line in run["systemctl"])


def test_warm_pool_launch_caches_the_encoder_and_continues_without_starting_workers(
        on_demand: Built, tmp_path: Any) -> None:
    run = _run_embedding_script(on_demand, tmp_path, state="Warmed:Stopped")
    assert run["status"] == 0, run["log"]
    assert run["stamp"].exists() and run["unit"].exists()
    assert not any(" enable " in line for line in run["systemctl"])
    (complete,) = [line for line in run["aws"] if " complete-lifecycle-action " in line]
    assert complete.endswith(
        f"--lifecycle-hook-name genai-instance-ready --auto-scaling-group-name "
        f"{on_demand.fleet.auto_scaling_group_physical_name} --instance-id i-0123456789abcdef0 "
        "--lifecycle-action-result CONTINUE")


def test_warm_pool_launch_abandons_an_encoder_that_fails_its_manifest(on_demand: Built, tmp_path: Any) -> None:
    run = _run_embedding_script(on_demand, tmp_path, state="Warmed:Stopped", tamper=True)
    assert run["status"] == 1
    assert "sha256 mismatch" in run["log"] and "ABANDON" in run["log"]
    (complete,) = [line for line in run["aws"] if " complete-lifecycle-action " in line]
    assert complete.endswith("--lifecycle-action-result ABANDON")
