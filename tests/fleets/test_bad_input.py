"""Both fleets refuse wrong types and nonsense numbers before ``super().__init__``: one ConfigurationError naming the
argument, the value, what is allowed and the fix, and no half-built construct left in the stack."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from aws_cdk import App, Stack
from aws_cdk import aws_ec2 as ec2

from genai_constructs.errors import ConfigurationError
from genai_constructs.fleets import EmbeddingBatchFleet, GpuInferenceFleet
from genai_constructs.network import PrivateDataPath
from genai_constructs.network.private_data_path import EGRESS_DESCRIPTIONS
from genai_constructs.workload import BatchTraffic, ModelArtifact, ModelShape, RealtimeTraffic

_ids = itertools.count()


@pytest.fixture(scope="module")
def scope() -> tuple[Stack, PrivateDataPath]:
    stack = Stack(App(), "BadInput")
    return stack, PrivateDataPath(stack, "Net")


def refused(cls: type, scope: tuple[Stack, PrivateDataPath], **overrides: Any) -> list[str]:
    stack, network = scope
    if cls is GpuInferenceFleet:
        props: dict[str, Any] = dict(
            network=network, model=ModelShape.preset("llama-3.1-8b"), allow_plain_http=True,
            traffic=RealtimeTraffic(concurrent_sessions=32, output_tokens_per_s_per_session=20),
            model_artifact=ModelArtifact(bucket_name="my-models", prefix="llama-3.1-8b/"))
    else:
        props = dict(network=network, model=ModelShape.preset("bge-large-en-v1.5"),
                     traffic=BatchTraffic(documents=1000, tokens_per_document=500, deadline_hours=12))
    props.update(overrides)
    id = f"Fleet{next(_ids)}"
    with pytest.raises(ConfigurationError) as raised:
        cls(stack, id, **props)
    assert stack.node.try_find_child(id) is None, "a half-built construct was left in the stack"
    return raised.value.problems


INFERENCE_CASES = [
    ({"network": "net.vpc"}, "network ('net.vpc') must be a PrivateDataPath, not a str: pass the PrivateDataPath "
                             "itself (network=net, not net.vpc)"),
    ({"model_artifact": None}, "model_artifact (None) must be a ModelArtifact, not a NoneType: e.g. "
                               "model_artifact=ModelArtifact(bucket_name="),
    ({"min_instances": "2"}, "min_instances ('2') must be a whole number, not a str: e.g. min_instances=2"),
    ({"min_instances": 2.5}, "min_instances (2.5) must be a whole number, not a float"),
    ({"min_instances": True}, "min_instances (True) must be a whole number, not a bool"),
    ({"max_instances": float("inf")}, "max_instances (inf) must be a whole number, not a float"),
    ({"max_instances": float("nan")}, "max_instances (nan) must be a whole number, not a float"),
    ({"server_args": "--port 8000"}, "server_args ('--port 8000') is one string, which would be read character by "
                                     "character: pass a list, e.g. ['--port', '8000']"),
    ({"server_args": ["--port", 8000]}, "server_args (['--port', 8000]) must be a list of strings"),
    ({"server_port": 8000.0}, "server_port (8000.0) must be a whole number between 1 and 65535, not a float"),
    ({"green_traffic_percent": True}, "green_traffic_percent (True) must be a whole number, not a bool"),
    ({"warm_pool": "false"}, "warm_pool ('false') must be True or False, not a str: write warm_pool=True"),
    ({"allow_plain_http": 1}, "allow_plain_http (1) must be True, False or None, not an int"),
    ({"health_check_grace_period": 120}, "health_check_grace_period (120) must be a Duration, not an int: e.g. "
                                         "health_check_grace_period=Duration.seconds(120)"),
    ({"certificate": "arn:aws:acm:us-east-1:111122223333:certificate/x"},
     "certificate ('arn:aws:acm:us-east-1:111122223333:certificate/x') must be an acm.ICertificate, not a str"),
    ({"server_environment": {"PORT": 8000}}, "server_environment ({'PORT': 8000}) must be a mapping of strings to "
                                             "strings"),
    ({"traffic": {"concurrent_sessions": 32}}, "traffic ({'concurrent_sessions': 32}) must be a RealtimeTraffic, "
                                               "not a dict"),
    ({"health_check_path": None}, "health_check_path (None) must be a string, not a NoneType: e.g. '/healthz'"),
]


@pytest.mark.parametrize(("overrides", "expected"), INFERENCE_CASES, ids=[next(iter(c[0])) + str(i)
                                                                          for i, c in enumerate(INFERENCE_CASES)])
def test_inference_fleet_refuses_wrong_types(scope: Any, overrides: dict[str, Any], expected: str) -> None:
    found = refused(GpuInferenceFleet, scope, **overrides)
    assert any(p.startswith(expected) for p in found), found


def test_inference_fleet_lists_every_type_problem_at_once(scope: Any) -> None:
    found = refused(GpuInferenceFleet, scope, min_instances="2", warm_pool="no", server_args="--x",
                    health_check_grace_period=60)
    assert [p.split(" ")[0] for p in found] == ["min_instances", "server_args", "warm_pool",
                                                "health_check_grace_period"]


EMBEDDING_CASES = [
    ({"network": "vpc"}, "network ('vpc') must be a PrivateDataPath, not a str"),
    ({"model": "bge-large-en-v1.5"}, "model ('bge-large-en-v1.5') must be a ModelShape, not a str: e.g. "
                                     "model=ModelShape.preset('bge-large-en-v1.5')"),
    ({"input_bucket": "my-docs"}, "input_bucket ('my-docs') must be an s3.IBucket, not a str: pass the bucket "
                                  "construct"),
    ({"input_prefix": "s3://docs/incoming/"}, "input_prefix ('s3://docs/incoming/') is a key prefix inside the "
                                              "bucket, not a URL"),
    ({"output_prefix": "out/*/"}, "output_prefix ('out/*/') holds '*', '?', '$' or a control character"),
    ({"documents_per_message": 2.5}, "documents_per_message (2.5) must be a whole number, not a float"),
    ({"max_receive_count": True}, "max_receive_count (True) must be a whole number, not a bool"),
    ({"max_instances": float("inf")}, "max_instances (inf) must be a whole number, not a float"),
    ({"scale_in_after": 900}, "scale_in_after (900) must be a Duration, not an int: e.g. "
                              "scale_in_after=Duration.minutes(15)"),
    ({"warm_pool": "yes"}, "warm_pool ('yes') must be True or False, not a str"),
    ({"model_prefix": 7}, "model_prefix (7) must be a string, not an int: e.g. model_prefix='docs/'"),
]


@pytest.mark.parametrize(("overrides", "expected"), EMBEDDING_CASES, ids=[next(iter(c[0])) + str(i)
                                                                          for i, c in enumerate(EMBEDDING_CASES)])
def test_embedding_fleet_refuses_wrong_types(scope: Any, overrides: dict[str, Any], expected: str) -> None:
    found = refused(EmbeddingBatchFleet, scope, **overrides)
    assert any(p.startswith(expected) for p in found), found


def test_fleets_do_not_claim_no_route_to_the_internet_in_a_nat_vpc() -> None:
    stack = Stack(App(), "NatFleet")
    network = PrivateDataPath(stack, "Net", vpc=ec2.Vpc(stack, "Vpc"))
    fleet = EmbeddingBatchFleet(stack, "Embed", network=network, model=ModelShape.preset("bge-large-en-v1.5"),
                                traffic=BatchTraffic(documents=1000, tokens_per_document=500, deadline_hours=12))
    egress = stack.resolve(fleet.security_group.node.default_child.security_group_egress)  # type: ignore[union-attr]
    assert [rule["description"] for rule in egress] == [EGRESS_DESCRIPTIONS[True]]
    assert "no route to the internet" not in EGRESS_DESCRIPTIONS[True]
