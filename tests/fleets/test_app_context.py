"""A hand-made app gets the same security-relevant resources as the examples, and plain HTTP brings exactly the
documented cdk-nag findings (docs/security.md). Two synthesized apps, built once for the module."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from aws_cdk import App, Stack, Validations

from genai_constructs.errors import ConfigurationError
from genai_constructs.fleets import EmbeddingBatchFleet, GpuInferenceFleet
from genai_constructs.fleets.inference import PLAIN_HTTP_FINDINGS
from genai_constructs.network import PrivateDataPath
from genai_constructs.workload import BatchTraffic, ModelArtifact, ModelShape, RealtimeTraffic
from tests.support import PACKS

REPO_CONTEXT: dict[str, Any] = json.loads((Path(__file__).resolve().parents[2] / "cdk.json").read_text())["context"]
SECURITY_TYPES = ("AWS::S3::Bucket", "AWS::S3::BucketPolicy", "AWS::KMS::Key", "AWS::EC2::SecurityGroup",
                  "AWS::EC2::LaunchTemplate", "AWS::SNS::TopicPolicy", "AWS::SQS::QueuePolicy",
                  "AWS::EC2::VPCEndpoint", "AWS::IAM::ManagedPolicy")


def _synth(context: dict[str, Any], *, packs: bool) -> tuple[dict[str, Any], list[str]]:
    outdir = Path(tempfile.mkdtemp(prefix="cdk-context-"))
    app = App(context=context, outdir=str(outdir))
    if packs:
        Validations.of(app).add_plugins(*(make(app) for make in PACKS.values()))
    stack = Stack(app, "Context")
    network = PrivateDataPath(stack, "Net")
    EmbeddingBatchFleet(stack, "Embed", network=network, model=ModelShape.preset("bge-large-en-v1.5"),
                        traffic=BatchTraffic(documents=1000, tokens_per_document=500, deadline_hours=12))
    for id in ("Plain", "Acknowledged"):
        fleet = GpuInferenceFleet(
            stack, id, network=network, model=ModelShape.preset("llama-3.1-8b"), allow_plain_http=True,
            traffic=RealtimeTraffic(concurrent_sessions=32, output_tokens_per_s_per_session=20),
            model_artifact=ModelArtifact(bucket_name="my-models", prefix=f"{id.lower()}/"))
        if id == "Acknowledged":
            fleet.acknowledge_plain_http("TLS terminates at the service mesh sidecar on every client")
    try:
        app.synth()
    except RuntimeError:
        if not (outdir / "validation-report.json").exists():
            raise
    template = json.loads((outdir / "Context.template.json").read_text())
    findings: list[str] = []
    report = outdir / "validation-report.json"
    if report.exists():
        for plugin in json.loads(report.read_text()).get("pluginReports", []):
            findings += [f"{v['ruleName']} at {c['constructPath']}" for v in plugin.get("violations", [])
                         for c in v.get("violatingConstructs", [])]
    return template, findings


@pytest.fixture(scope="module")
def with_repo_context() -> tuple[dict[str, Any], list[str]]:
    return _synth(REPO_CONTEXT, packs=True)


@pytest.fixture(scope="module")
def without_context() -> dict[str, Any]:
    return _synth({}, packs=False)[0]


def _security(template: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] in SECURITY_TYPES}


def test_the_repo_context_is_what_this_test_exercises() -> None:
    assert "@aws-cdk/aws-s3:serverAccessLogsUseBucketPolicy" in REPO_CONTEXT


def test_security_resources_do_not_depend_on_the_apps_feature_flags(
    with_repo_context: tuple[dict[str, Any], list[str]], without_context: dict[str, Any],
) -> None:
    flagged, bare = _security(with_repo_context[0]), _security(without_context)
    assert set(flagged) == set(bare)
    assert [k for k in flagged if flagged[k] != bare[k]] == []
    logs = next(v for k, v in bare.items() if k.startswith("EmbedAccessLogs") and v["Type"] == "AWS::S3::Bucket")
    assert "AccessControl" not in logs["Properties"]  # no LogDeliveryWrite ACL: delivery is by bucket policy


def test_plain_http_brings_exactly_the_documented_findings(
    with_repo_context: tuple[dict[str, Any], list[str]],
) -> None:
    _, findings = with_repo_context
    assert sorted(findings) == sorted(f"{rule} at Context/Plain/LoadBalancer/Listener/Resource"
                                      for rule in PLAIN_HTTP_FINDINGS)


def test_acknowledge_plain_http_needs_a_reason() -> None:
    stack = Stack(App(), "Reason")
    fleet = GpuInferenceFleet(
        stack, "Chat", network=PrivateDataPath(stack, "Net"), model=ModelShape.preset("llama-3.1-8b"),
        allow_plain_http=True, traffic=RealtimeTraffic(concurrent_sessions=32, output_tokens_per_s_per_session=20),
        model_artifact=ModelArtifact(bucket_name="my-models", prefix="llama/"))
    with pytest.raises(ConfigurationError, match=r"acknowledge_plain_http: reason \('ok'\) must say why"):
        fleet.acknowledge_plain_http("ok")
