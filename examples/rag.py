"""RagStack: retrieval-augmented generation in one private network, every hop kept inside one AZ when it can be.

- an embedding fleet fills the index bucket (its output bucket) from the documents staged in its input bucket;
- the retrieval tier (the vector store serving that index, e.g. a team's service behind AWS PrivateLink) is
  registered with the network, which creates its interface endpoint in the same private subnets and exposes one
  DNS name per AZ;
- the inference fleet serves the chat model in the same subnets, so both fleets share the AZ preference, and code
  on the instances calls the retrieval tier through its own AZ's name first
  (``genai_constructs.runtime.zonal_client.ZonalClient.from_dns_entries``), failing over across zones only when
  the local one fails. A cross-AZ hop adds latency variance on the critical path and costs per GB.
"""

from __future__ import annotations

from typing import Any

from aws_cdk import CfnOutput, Fn, Stack
from constructs import Construct

from examples.certificates import listener_certificate
from genai_constructs.fleets.embedding import EmbeddingBatchFleet
from genai_constructs.fleets.inference import GpuInferenceFleet
from genai_constructs.network import PrivateDataPath
from genai_constructs.testing.local_deploy import stack_synthesizer
from genai_constructs.workload import BatchTraffic, ModelArtifact, ModelShape, RealtimeTraffic

CHAT_MODEL = "llama-3.1-8b"
"""The generator: an 8B chat model on one G-family GPU; retrieved passages lengthen prompts, not outputs."""
ENCODER = "bge-base-en-v1.5"
"""The encoder: 768-dimension vectors, fast enough to re-embed the corpus nightly."""
PROMPT_TOKENS = 3072
"""Question plus retrieved passages (5 passages of ~500 tokens, plus history): RAG prompts are long."""
CONCURRENT_SESSIONS = 32
"""Peak sessions asking at once."""
TOKENS_PER_S_PER_SESSION = 10.0
"""Reading speed plus margin."""
DOCUMENTS = 500_000
"""The corpus re-embedded each night."""
TOKENS_PER_DOCUMENT = 600
"""Mean passage-sized document."""
DEADLINE_HOURS = 6.0
"""The nightly re-index window."""
RETRIEVAL_SERVICE = "vector-search"
"""Name the retrieval tier is registered under in the network (``PrivateDataPath.dns_entries(RETRIEVAL_SERVICE)``)."""
RETRIEVAL_ENVIRONMENT_VARIABLE = "RETRIEVAL_DNS_ENTRIES"
"""Environment variable carrying the retrieval tier's DNS entries into the model server container."""
RETRIEVAL_CONTEXT_KEY = "retrieval_endpoint_service_name"
"""Context key for the retrieval tier's endpoint service name: ``-c retrieval_endpoint_service_name=com.amazonaws...``."""
PLACEHOLDER_RETRIEVAL_SERVICE = "com.amazonaws.vpce.us-east-1.vpce-svc-0123456789abcdef0"
"""A well-formed endpoint service name: synthesizes and deploys to the local emulator; replace it for AWS."""
WEIGHTS_BUCKET = "example-model-weights"
"""Replace with the bucket holding your weights and their SHA256SUMS manifest."""


class RagStack(Stack):
    """Embedding fleet -> index bucket -> retrieval tier (zone-local endpoint) <- inference fleet, in one network.

    :param retrieval_endpoint_service_name: the retrieval tier's VPC endpoint service. Default: the
        ``RETRIEVAL_CONTEXT_KEY`` context value, else ``PLACEHOLDER_RETRIEVAL_SERVICE``.
    :param certificate_arn: see :func:`examples.certificates.listener_certificate`.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        retrieval_endpoint_service_name: str | None = None,
        certificate_arn: str | None = None,
        **kwargs: Any,
    ) -> None:
        if kwargs.get("synthesizer") is None:
            kwargs["synthesizer"] = stack_synthesizer(scope)
        super().__init__(scope, id, **kwargs)
        self.network = PrivateDataPath(self, "Network")
        self.embedding = EmbeddingBatchFleet(
            self,
            "Embed",
            network=self.network,
            model=ModelShape.preset(ENCODER),
            traffic=BatchTraffic(
                documents=DOCUMENTS,
                tokens_per_document=TOKENS_PER_DOCUMENT,
                deadline_hours=DEADLINE_HOURS,
                spot_ok=True,
            ),
        )
        self.index_bucket = self.embedding.output_bucket
        service_name = (
            retrieval_endpoint_service_name
            or self.node.try_get_context(RETRIEVAL_CONTEXT_KEY)
            or PLACEHOLDER_RETRIEVAL_SERVICE
        )
        self.retrieval = self.network.register_retrieval_service(
            RETRIEVAL_SERVICE, endpoint_service_name=str(service_name)
        )
        self.inference = GpuInferenceFleet(
            self,
            "Chat",
            network=self.network,
            model=ModelShape.preset(CHAT_MODEL),
            traffic=RealtimeTraffic(
                concurrent_sessions=CONCURRENT_SESSIONS,
                output_tokens_per_s_per_session=TOKENS_PER_S_PER_SESSION,
                prompt_tokens=PROMPT_TOKENS,
            ),
            model_artifact=ModelArtifact(bucket_name=WEIGHTS_BUCKET, prefix=f"{CHAT_MODEL}/"),
            certificate=listener_certificate(self, certificate_arn),
            # The model server's retrieval client reads these and calls its own AZ's name first (ZonalClient).
            server_environment={RETRIEVAL_ENVIRONMENT_VARIABLE: self.network.dns_entries(RETRIEVAL_SERVICE)},
        )
        CfnOutput(
            self,
            "RetrievalDnsEntries",
            value=self.network.dns_entries(RETRIEVAL_SERVICE),
            description="ZonalClient.from_dns_entries(...): the retrieval tier's names, one per AZ",
        )
        CfnOutput(self, "RetrievalZonalNames", value=Fn.join(",", self.network.zonal_dns_names(RETRIEVAL_SERVICE)))
