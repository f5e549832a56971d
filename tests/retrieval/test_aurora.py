"""AuroraVectorStore: one synthesis (three cdk-nag packs, the local synthesizer) serves the template assertions, the
gates and the deploy to moto; bad input fails before anything joins the tree."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from aws_cdk import App, Stack
from aws_cdk import aws_ec2 as ec2

from genai_constructs.errors import ConfigurationError
from genai_constructs.network import PrivateDataPath
from genai_constructs.network.private_data_path import DEFAULT_VPC_CIDR
from genai_constructs.retrieval import AuroraVectorStore
from genai_constructs.runtime.rag_orchestrator import parse_config
from genai_constructs.testing import local_synthesizer
from genai_constructs.workload import RagTraffic
from tests.fleets.cpu_tier_support import refs as _refs
from tests.support import Synthesized, resources_of_type, synth_app

TRAFFIC = RagTraffic(requests_per_s=50)
STACK = "VectorStoreTest"


class Built:
    store: AuroraVectorStore
    synth: Synthesized
    template: dict[str, Any]


@pytest.fixture(scope="module")
def built() -> Built:
    result = Built()

    def build(app: App) -> Stack:
        stack = Stack(app, STACK, synthesizer=local_synthesizer())
        network = PrivateDataPath(stack, "Net", extra_interface_endpoints=["secretsmanager"])
        result.store = AuroraVectorStore(stack, "VectorStore", network=network, traffic=TRAFFIC, dimension=384)
        consumer = ec2.SecurityGroup(stack, "Orchestrators", vpc=network.vpc, allow_all_outbound=False,
                                     description="test consumer")
        result.store.allow_from(consumer, description="RAG orchestrators")
        return stack

    result.synth = synth_app(build, packs=("AwsSolutions", "NIST.800.53.R5", "HIPAA.Security"))
    result.template = result.synth.template(STACK)
    return result


def _only(template: dict[str, Any], kind: str) -> dict[str, Any]:
    (found,) = resources_of_type(template, kind).values()
    return dict(found["Properties"])


def _instances(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {k: v["Properties"] for k, v in resources_of_type(template, "AWS::RDS::DBInstance").items()}


# ---- Gates ------------------------------------------------------------------------------------------------------

def test_three_nag_packs_are_clean(built: Built) -> None:
    assert built.synth.violation_summary() == []


def test_storage_is_encrypted_with_the_stores_rotating_key(built: Built) -> None:
    cluster = _only(built.template, "AWS::RDS::DBCluster")
    key_id = cluster["KmsKeyId"]["Fn::GetAtt"][0]
    assert cluster["StorageEncrypted"] is True
    assert built.template["Resources"][key_id]["Properties"]["EnableKeyRotation"] is True
    assert cluster["PerformanceInsightsKmsKeyId"]["Fn::GetAtt"][0] == key_id


def test_engine_is_aurora_postgresql_16_with_pgvector_hnsw(built: Built) -> None:
    cluster = _only(built.template, "AWS::RDS::DBCluster")
    assert cluster["Engine"] == "aurora-postgresql"
    assert cluster["EngineVersion"].startswith("16.")


def test_force_ssl_is_on_in_the_cluster_parameter_group(built: Built) -> None:
    group = _only(built.template, "AWS::RDS::DBClusterParameterGroup")
    assert group["Parameters"]["rds.force_ssl"] == "1"


def test_deletion_protection_backups_iam_auth_and_log_export_by_default(built: Built) -> None:
    cluster = _only(built.template, "AWS::RDS::DBCluster")
    assert cluster["DeletionProtection"] is True
    assert cluster["BackupRetentionPeriod"] == 7
    assert cluster["EnableIAMDatabaseAuthentication"] is True
    assert cluster["EnableCloudwatchLogsExports"] == ["postgresql"]
    (resource,) = resources_of_type(built.template, "AWS::RDS::DBCluster").values()
    assert resource["DeletionPolicy"] == "Snapshot"


def test_exported_log_group_exists_first_encrypted_with_retention(built: Built) -> None:
    cluster = _only(built.template, "AWS::RDS::DBCluster")
    groups = [g["Properties"] for g in resources_of_type(built.template, "AWS::Logs::LogGroup").values()
              if g["Properties"].get("LogGroupName") == f"/aws/rds/cluster/{cluster['DBClusterIdentifier']}/postgresql"]
    assert len(groups) == 1 and "KmsKeyId" in groups[0] and groups[0]["RetentionInDays"] == 365


def test_secret_is_kms_encrypted_and_attached_to_the_cluster(built: Built) -> None:
    secret = _only(built.template, "AWS::SecretsManager::Secret")
    assert "KmsKeyId" in secret
    attachment = _only(built.template, "AWS::SecretsManager::SecretTargetAttachment")
    assert attachment["TargetType"] == "AWS::RDS::DBCluster"


def test_one_reader_per_zone_each_pinned_to_its_zone_no_public_access(built: Built) -> None:
    instances = _instances(built.template)
    readers = [p for p in instances.values() if p["PromotionTier"] >= 1]
    zones = sorted(json.dumps(p["AvailabilityZone"]) for p in readers)
    assert len(readers) == 2 and len(set(zones)) == 2  # Fn::Select 0 and 1 of the Region's zones
    assert all(p["PubliclyAccessible"] is False for p in instances.values())
    assert {p["DBInstanceClass"] for p in instances.values()} == {built.store.plan.instance_class}


def test_security_group_admits_only_the_allowed_peer_and_the_rotation_function_on_5432(built: Built) -> None:
    store = _logical(built, "VectorStoreSecurityGroup")
    assert "SecurityGroupIngress" not in built.template["Resources"][store]["Properties"]
    rules = [r["Properties"] for r in resources_of_type(built.template, "AWS::EC2::SecurityGroupIngress").values()
             if _refs(r["Properties"]["GroupId"]) == {store}]
    assert sorted((r["FromPort"], r["ToPort"], r["IpProtocol"], next(iter(_refs(r["SourceSecurityGroupId"]))))
                  for r in rules) == [(5432, 5432, "tcp", _logical(built, "Orchestrators")),
                                      (5432, 5432, "tcp", _logical(built, "VectorStoreRotationSecurityGroup"))]


def _logical(built: Built, prefix: str) -> str:
    (found,) = [k for k in resources_of_type(built.template, "AWS::EC2::SecurityGroup") if k.startswith(prefix)]
    return found


def test_the_master_secret_rotates_monthly_by_the_hosted_postgresql_function_inside_the_vpc(built: Built) -> None:
    assert built.template["Transform"] == "AWS::SecretsManager-2024-09-16"  # the transform that builds the function
    schedule = _only(built.template, "AWS::SecretsManager::RotationSchedule")
    assert schedule["RotationRules"] == {"ScheduleExpression": "rate(30 days)"}
    assert _refs(schedule["SecretId"]) == set(resources_of_type(built.template,
                                                                "AWS::SecretsManager::SecretTargetAttachment"))
    hosted = schedule["HostedRotationLambda"]
    assert hosted["RotationType"] == "PostgreSQLSingleUser"
    assert _refs(hosted["KmsKeyArn"]) == {_key_of_the_secret(built)}
    assert _refs(hosted["VpcSecurityGroupIds"]) == {_logical(built, "VectorStoreRotationSecurityGroup")}
    private = {k for k, v in resources_of_type(built.template, "AWS::EC2::Subnet").items() if "Private" in k}
    assert _refs(hosted["VpcSubnetIds"]) == private and len(private) == 2


def test_the_rotation_function_reaches_only_postgresql_and_the_endpoints(built: Built) -> None:
    rotation = _logical(built, "VectorStoreRotationSecurityGroup")
    group = built.template["Resources"][rotation]["Properties"]
    assert [(e["FromPort"], e["CidrIp"]) for e in group["SecurityGroupEgress"]] == [(443, DEFAULT_VPC_CIDR)]  # the endpoints' ingress
    egress = [r["Properties"] for r in resources_of_type(built.template, "AWS::EC2::SecurityGroupEgress").values()
              if _refs(r["Properties"]["GroupId"]) == {rotation}]
    assert [(e["FromPort"], _refs(e["DestinationSecurityGroupId"])) for e in egress] == [
        (5432, {_logical(built, "VectorStoreSecurityGroup")})]
    assert "SecurityGroupIngress" not in group


def _key_of_the_secret(built: Built) -> str:
    (secret,) = resources_of_type(built.template, "AWS::SecretsManager::Secret").values()
    (key,) = _refs(secret["Properties"]["KmsKeyId"])
    return key


def test_no_rotation_finding_is_acknowledged(built: Built) -> None:
    # The findings are fixed (the schedule above), not silenced: no acknowledgment names them anywhere.
    text = json.dumps(built.template) + (built.synth.outdir / f"{STACK}.metadata.json").read_text()
    assert "SMG4" not in text and "SecretsManagerRotationEnabled" not in text
    assert "RDS11" in text  # acknowledgments do land where this looks (the port's, kept on purpose)


def test_enhanced_monitoring_role_has_only_a_customer_managed_policy(built: Built) -> None:
    roles = [r["Properties"] for r in resources_of_type(built.template, "AWS::IAM::Role").values()
             if "monitoring.rds.amazonaws.com" in json.dumps(r["Properties"]["AssumeRolePolicyDocument"])]
    assert len(roles) == 1 and "ManagedPolicyArns" not in roles[0] and "Policies" not in roles[0]
    assert all(p["MonitoringInterval"] == 60 for p in _instances(built.template).values())


def test_alarms_per_reader_go_to_the_encrypted_topic(built: Built) -> None:
    alarms = [a["Properties"] for a in resources_of_type(built.template, "AWS::CloudWatch::Alarm").values()]
    assert sorted(a["MetricName"] for a in alarms) == sorted(["CPUUtilization", "FreeableMemory",
                                                              "AuroraReplicaLag"] * 2)
    assert all(a["AlarmActions"] for a in alarms)
    assert "KmsMasterKeyId" in _only(built.template, "AWS::SNS::Topic")


# ---- The attributes consumers code against ------------------------------------------------------------------------

def test_public_attributes(built: Built) -> None:
    store = built.store
    assert (store.port, store.database_name, store.table, store.dimension) == (5432, "rag", "rag_chunks", 384)
    assert len(store.reader_endpoints) == 2 and len(store.reader_arguments()) == 2
    assert all(argument.endswith(":5432") and "=" in argument for argument in store.reader_arguments())


def test_reader_arguments_parse_in_the_orchestrator() -> None:
    # The shape reader_arguments() produces, with literal zones and hosts as a deployed stack resolves them.
    arguments = ["us-east-1a=a.abc.us-east-1.rds.amazonaws.com:5432", "us-east-1b=b.abc.us-east-1.rds.amazonaws.com:5432"]
    config = parse_config([f"--reader={a}" for a in arguments] + [
        "--availability-zone", "us-east-1a", "--database", "dbname=rag user=rag_admin", "--encoder", "hashing",
        "--inference", "127.0.0.1:8000", "--model", "m"])
    assert dict(config.readers) == {"us-east-1a": "a.abc.us-east-1.rds.amazonaws.com:5432",
                                    "us-east-1b": "b.abc.us-east-1.rds.amazonaws.com:5432"}


def test_credential_statements_name_the_exact_secret_and_key_through_secrets_manager(built: Built) -> None:
    stack = Stack.of(built.store)
    read, decrypt = (stack.resolve(s.to_statement_json()) for s in built.store.credential_statements())
    assert sorted(read["Action"]) == ["secretsmanager:DescribeSecret", "secretsmanager:GetSecretValue"]
    assert read["Resource"] == stack.resolve(built.store.secret.secret_arn)
    assert decrypt["Action"] == "kms:Decrypt"
    assert decrypt["Resource"] == stack.resolve(built.store.encryption_key.key_arn)
    assert "kms:ViaService" in decrypt["Condition"]["StringEquals"]


# ---- Bad input ----------------------------------------------------------------------------------------------------

def _bad(**overrides: Any) -> tuple[str, Stack]:
    app = App()
    stack = Stack(app, "Bad")
    endpoints = overrides.pop("endpoints", ["secretsmanager"])
    network = PrivateDataPath(stack, "Net", extra_interface_endpoints=endpoints)
    arguments: dict[str, Any] = {"network": network, "traffic": TRAFFIC, "dimension": 384, **overrides}
    with pytest.raises(ConfigurationError) as raised:
        AuroraVectorStore(stack, "Store", **arguments)
    assert stack.node.try_find_child("Store") is None
    return str(raised.value), stack


@pytest.mark.parametrize(("dimension", "words"), [(0, "between 1 and 2000"), (True, "not a bool"),
                                                  (math.nan, "not a float"), (2001, "between 1 and 2000")])
def test_fails_on_a_dimension_that_is_not_a_width(dimension: object, words: str) -> None:
    message, _ = _bad(dimension=dimension)
    assert f"dimension ({dimension!r})" in message and words in message


def test_fails_on_everything_at_once() -> None:
    message, _ = _bad(traffic={"requests_per_s": 5}, readers_per_zone=0, instance_class="db.r5.large")
    assert "3 problem(s)" in message
    assert "traffic" in message and "RagTraffic" in message
    assert "readers_per_zone (0)" in message and "db.r5.large" in message


def test_fails_on_a_network_without_the_secrets_manager_endpoint() -> None:
    message, _ = _bad(endpoints=[])
    assert "extra_interface_endpoints=['secretsmanager']" in message
