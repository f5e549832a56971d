"""The local deploy: every example deployed with the real CDK CLI to moto and verified through boto3."""

from __future__ import annotations

import copy
import json

import pytest
from aws_cdk import App, Stack

from examples import STACK_NAMES
from genai_constructs.testing import is_local, local_synthesizer, stack_synthesizer
from genai_constructs.testing.moto_copy import LOCAL_ASSETS_BUCKET, assembly_stacks, strip_custom_resources
from genai_constructs.testing.verifiers import verify_stack
from tests.examples.conftest import LocalDeploy
from tests.examples.minimal_stack import MAX_RECEIVE_COUNT

MINIMAL = "GenaiMinimal"
LOCAL_DEPLOY_BUDGET_S = 60.0  # the whole flow runs inside `make test`


def test_every_example_deploys_to_moto_and_passes_every_check(local_deploy: LocalDeploy) -> None:
    report = local_deploy.report
    print("\n" + report.render())
    assert sorted(report.stacks) == sorted([MINIMAL, *STACK_NAMES.values()])
    assert report.failures == [], report.render()


def test_local_deploy_is_quick_enough_for_make_test(local_deploy: LocalDeploy) -> None:
    assert local_deploy.report.deploy_seconds < LOCAL_DEPLOY_BUDGET_S, local_deploy.report.render()


@pytest.mark.parametrize("stack", [MINIMAL, *STACK_NAMES.values()])
def test_each_vpc_has_no_nat_and_no_internet_gateway(local_deploy: LocalDeploy, stack: str) -> None:
    (vpc,) = [c for c in local_deploy.report.checks if c.stack == stack and c.subject == "VPC"]
    assert vpc.ok and "no NAT, no IGW" in vpc.detail


def test_queue_redrive_is_read_back_from_moto(local_deploy: LocalDeploy) -> None:
    queues = [c for c in local_deploy.report.checks if c.stack == MINIMAL and c.subject == "SQS queue"]
    assert any(f"redrive after {MAX_RECEIVE_COUNT} receives" in c.detail for c in queues)


def test_a_template_moto_disagrees_with_fails_the_check(local_deploy: LocalDeploy) -> None:
    # GIVEN the deployed minimal stack, WHEN its template claims another receive count and another CIDR
    template = copy.deepcopy(assembly_stacks(local_deploy.assembly)[MINIMAL])
    for resource in template["Resources"].values():
        if resource["Type"] == "AWS::SQS::Queue" and "RedrivePolicy" in resource["Properties"]:
            resource["Properties"]["RedrivePolicy"]["maxReceiveCount"] = MAX_RECEIVE_COUNT + 1
        if resource["Type"] == "AWS::EC2::VPC":
            resource["Properties"]["CidrBlock"] = "10.99.0.0/16"
    # THEN the verifiers report both
    checks = verify_stack(local_deploy.server.session(), MINIMAL, template)
    failed = {c.subject: c.detail for c in checks if not c.ok}
    assert "maxReceiveCount 3 != template 4" in failed["SQS queue"]
    assert "!= template 10.99.0.0/16" in failed["VPC"]


def test_custom_resource_provider_assets_were_published_to_moto(local_deploy: LocalDeploy) -> None:
    objects = local_deploy.server.session().client("s3").list_objects_v2(Bucket=LOCAL_ASSETS_BUCKET)
    assert objects.get("KeyCount", 0) > 0


def test_stacks_users_deploy_keep_the_default_synthesizer(examples_synth) -> None:  # type: ignore[no-untyped-def]
    for name in STACK_NAMES.values():
        assert "BootstrapVersion" in examples_synth.template(name).get("Parameters", {}), name


def test_local_stacks_need_no_bootstrap_stack(local_deploy: LocalDeploy) -> None:
    for name, template in assembly_stacks(local_deploy.assembly).items():
        assert "BootstrapVersion" not in template.get("Parameters", {}), name
        assert "CheckBootstrapVersion" not in template.get("Rules", {}), name


def test_local_flag_comes_from_context_or_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GENAI_CONSTRUCTS_LOCAL", raising=False)
    assert not is_local(App())
    assert stack_synthesizer(App()) is None
    assert is_local(App(context={"local": "true"}))
    monkeypatch.setenv("GENAI_CONSTRUCTS_LOCAL", "1")
    assert is_local(App())


def test_custom_resources_and_what_refers_to_them_are_left_out_of_moto_s_copy() -> None:
    template = {
        "Resources": {
            "Provider": {"Type": "AWS::Lambda::Function", "Properties": {}},
            "Restrict": {
                "Type": "Custom::VpcRestrictDefaultSG",
                "Properties": {"ServiceToken": {"Fn::GetAtt": ["Provider", "Arn"]}},
            },
            "UsesIt": {"Type": "AWS::SSM::Parameter", "Properties": {"Value": {"Fn::GetAtt": ["Restrict", "Out"]}}},
            "Waits": {"Type": "AWS::SQS::Queue", "DependsOn": ["Restrict", "Provider"]},
        },
        "Outputs": {"Out": {"Value": {"Ref": "UsesIt"}}, "Keep": {"Value": {"Ref": "Waits"}}},
    }
    removed = strip_custom_resources(template)
    assert removed == [("Restrict", "Custom::VpcRestrictDefaultSG"), ("UsesIt", "AWS::SSM::Parameter")]
    assert sorted(template["Resources"]) == ["Provider", "Waits"]
    assert template["Resources"]["Waits"]["DependsOn"] == ["Provider"]
    assert list(template["Outputs"]) == ["Keep"]


def test_local_synthesizer_accepts_assets() -> None:
    app = App()
    stack = Stack(app, "WithAsset", synthesizer=local_synthesizer())
    from aws_cdk import aws_ec2 as ec2

    ec2.Vpc(
        stack,
        "Vpc",
        restrict_default_security_group=True,
        nat_gateways=0,
        max_azs=1,
        subnet_configuration=[ec2.SubnetConfiguration(name="i", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)],
    )
    template = json.dumps(app.synth().get_stack_by_name("WithAsset").template)
    assert LOCAL_ASSETS_BUCKET in template


EXPECTED_SUBJECTS = {
    "network": {"VPC", "VPC endpoint"},
    "realtime_chat": {
        "VPC",
        "VPC endpoint",
        "launch template",
        "Auto Scaling group",
        "target group",
        "warm pool",
        "scaling policy",
        "alarms",
        "S3 bucket",
    },
    "large_model_chat": {"launch template", "Auto Scaling group", "target group", "placement group", "scaling policy"},
    "batch_embedding": {"launch template", "Auto Scaling group", "SQS queue", "S3 bucket", "scaling policy", "alarms"},
    "rag": {"launch template", "Auto Scaling group", "target group", "SQS queue", "S3 bucket", "warm pool"},
}


@pytest.mark.parametrize("example", sorted(EXPECTED_SUBJECTS))
def test_each_example_s_resources_were_verified(local_deploy: LocalDeploy, example: str) -> None:
    stack = STACK_NAMES[example]
    subjects = {c.subject for c in local_deploy.report.checks if c.stack == stack}
    assert EXPECTED_SUBJECTS[example] <= subjects


def test_rag_store_instances_are_created_and_the_cluster_checked_in_the_template(local_deploy: LocalDeploy) -> None:
    # moto creates Aurora's DB instances but not the cluster, its parameter group or the rotation schedule: the
    # instances are read back from moto, the rest is checked in the template (and said so in the report).
    checks = [c for c in local_deploy.report.checks if c.stack == STACK_NAMES["rag"]]
    subjects = [(c.subject, c.source) for c in checks]
    assert subjects.count(("Aurora instance", "moto")) == 3  # the writer and one reader per zone
    assert ("Aurora readers", "moto") in subjects and ("Aurora cluster", "template") in subjects
    (rotation,) = [c for c in checks if c.subject == "secret rotation"]
    assert rotation.ok and rotation.source == "template"
    assert "hosted PostgreSQLSingleUser, rate(30 days), in the VPC" in rotation.detail
