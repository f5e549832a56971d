"""What the CPU tier fleet tests share: one synthesis with all three nag packs, and template lookups."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from aws_cdk import App, Stack
from aws_cdk import aws_certificatemanager as acm

from genai_constructs import GpuInferenceFleet, ModelArtifact, ModelShape, PrivateDataPath, RealtimeTraffic
from genai_constructs.fleets import EmbeddingBatchFleet
from genai_constructs.fleets.orchestration import RagOrchestrationFleet
from genai_constructs.fleets.preprocessing import DocumentPreprocessingFleet
from genai_constructs.planner import cpu_tier
from genai_constructs.retrieval import AuroraVectorStore
from genai_constructs.workload import BatchTraffic, RagTraffic
from tests.support import resources_of_type, synth_app

ALL_PACKS = ("AwsSolutions", "NIST.800.53.R5", "HIPAA.Security")


class Synthesized:
    """A stack synthesized once: its template, its unacknowledged nag findings and the template's path."""

    def __init__(self, stack_name: str, build: Callable[[Stack], None]) -> None:
        def make(app: App) -> Stack:
            stack = Stack(app, stack_name)
            build(stack)
            return stack

        synth = synth_app(make, packs=ALL_PACKS)
        self.template: dict[str, Any] = synth.template(stack_name)
        self.violations: list[str] = synth.violation_summary()
        self.path: Path = synth.outdir / f"{stack_name}.template.json"


def props(template: dict[str, Any], resource_type: str, prefix: str) -> dict[str, dict[str, Any]]:
    """Properties of the resources of ``resource_type`` whose logical id starts with ``prefix``."""
    return {k: v["Properties"] for k, v in resources_of_type(template, resource_type).items() if k.startswith(prefix)}


def logical(template: dict[str, Any], resource_type: str, prefix: str) -> str:
    """The one logical id of ``resource_type`` under ``prefix``."""
    (found,) = props(template, resource_type, prefix)
    return found


def refs(value: Any) -> set[str]:
    """Logical ids ``value`` points at through Ref or Fn::GetAtt."""
    return set(re.findall(r'"(?:Ref|Fn::GetAtt)": \[?"([A-Za-z0-9]+)"', json.dumps(value)))


STACK = "CpuTiers"
ENCODER = ModelShape.preset("all-minilm-l6-v2")
BATCH = BatchTraffic(documents=500_000, tokens_per_document=2_000, deadline_hours=6, headroom=0.2)
MIX = {"pdf": 0.5, "html": 0.3, "txt": 0.2}
RAG = RagTraffic(requests_per_s=50, top_k=4, chunk_tokens=256, headroom=0.3)
FIGURES = {"source": "test table", "measured_on": "2026-12-01", "machine": "none", "formats": {
    name: {"documents_per_s_per_vcpu": rate, "mean_document_bytes": 200_000, "mean_tokens_per_document": 2000,
           "chunks_per_document": 8, "mib_per_s_per_vcpu": rate * 0.2}
    for name, rate in (("pdf", 2.0), ("html", 10.0), ("txt", 50.0), ("md", 40.0), ("jsonl", 30.0))}}
"""Preprocessing figures set here (not the measured file), so expectations can be worked out by hand."""
CHAT_CERTIFICATE_ARN = "arn:aws:acm:us-east-1:111122223333:certificate/0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"
CHAT_SERVER_NAME = "chat.internal.example.com"
"""The name the inference fleet's certificate is issued for (an imported certificate does not say)."""


def preprocessing_plan() -> cpu_tier.PreprocessingPlan:
    original = cpu_tier.load_preprocessing_figures
    cpu_tier.load_preprocessing_figures = lambda: FIGURES  # type: ignore[assignment]
    try:
        return cpu_tier.plan_preprocessing(BATCH, MIX)
    finally:
        cpu_tier.load_preprocessing_figures = original  # type: ignore[method-assign]


@dataclass
class CpuTiers:
    """Both CPU tiers in one stack beside the fleets and store they use: one synthesis, one template to lint."""

    synthesized: Synthesized
    prep: DocumentPreprocessingFleet
    rag: RagOrchestrationFleet
    inference: GpuInferenceFleet
    store: AuroraVectorStore
    network: PrivateDataPath


@cache
def cpu_tiers() -> CpuTiers:
    """Synthesized once per test session (both test modules use it)."""
    made: dict[str, Any] = {}

    def build(stack: Stack) -> None:
        made["network"] = network = PrivateDataPath(stack, "Net", extra_interface_endpoints=["secretsmanager"])
        embed = EmbeddingBatchFleet(stack, "Embed", network=network, model=ENCODER,
                                    traffic=BatchTraffic(documents=4_000_000, tokens_per_document=250,
                                                         deadline_hours=6))
        made["store"] = store = AuroraVectorStore(stack, "Store", network=network, traffic=RAG,
                                                  dimension=ENCODER.hidden_size)
        made["prep"] = DocumentPreprocessingFleet(stack, "Prep", network=network, embedding=embed, traffic=BATCH,
                                                  formats=MIX, vector_store=store, plan=preprocessing_plan())
        made["inference"] = inference = GpuInferenceFleet(
            stack, "Chat", network=network, model=ModelShape.preset("llama-3.1-8b"),
            traffic=RealtimeTraffic(concurrent_sessions=32, output_tokens_per_s_per_session=20),
            model_artifact=ModelArtifact(bucket_name="my-models", prefix="llama-3.1-8b/"),
            certificate=acm.Certificate.from_certificate_arn(stack, "ChatCertificate", CHAT_CERTIFICATE_ARN))
        made["rag"] = rag = RagOrchestrationFleet(
            stack, "Rag", network=network, inference=inference, vector_store=store, traffic=RAG,
            encoder="all-minilm-l6-v2", inference_server_name=CHAT_SERVER_NAME, allow_plain_http=True)
        rag.acknowledge_plain_http("Test stack: clients reach the orchestrators inside the VPC only")

    return CpuTiers(synthesized=Synthesized(STACK, build), **made)


CONCRETE = {
    "--queue-url": "https://sqs.us-east-1.amazonaws.com/123456789012/work",
    "--dead-letter-queue-url": "https://sqs.us-east-1.amazonaws.com/123456789012/work-dlq",
    "--output-bucket": "embedding-input", "--region": "us-east-1", "--host": "writer.cluster.example",
    "--secret-arn": "arn:aws:secretsmanager:us-east-1:123456789012:secret:rag-db-AbCdEf",
    "--inference": "internal-chat-123.us-east-1.elb.amazonaws.com:443",
}
"""What a deploy resolves each token-valued flag to (a plausible value of the right shape)."""


def concrete(arguments: list[str] | tuple[str, ...], *, zone: str = "us-east-1a",
             zones: tuple[str, ...] = ("us-east-1a", "us-east-1b")) -> list[str]:
    """``arguments`` as an instance runs them: tokens resolved (``CONCRETE``; ``--reader`` per zone in order), the
    zone placeholder replaced by ``zone``."""
    result: list[str] = []
    readers = iter(zones)
    for i, argument in enumerate(arguments):
        flag = arguments[i - 1] if i else ""
        if "${Token[" in argument:
            argument = (f"{next(readers)}=reader.example:5432" if flag == "--reader" else CONCRETE[flag])
        result.append(argument.replace("@AVAILABILITY_ZONE@", zone))
    return result
