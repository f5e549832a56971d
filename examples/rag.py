"""RagStack: retrieval-augmented generation in one private network: raw documents in, answers out.

The batch path (CPU, then GPU, then CPU again), each tier scaling on its own queue:

- raw documents land in the preprocessing tier's raw bucket; S3 queues each one for the **CPU preprocessing
  fleet** (Graviton), which parses it (txt, Markdown, HTML, PDF, JSONL), chunks it with the encoder's own
  tokenizer and writes chunk objects into the embedding fleet's input bucket;
- those objects queue themselves for the **GPU embedding fleet**, which only embeds (no parsing on the GPU
  instance's CPU) and writes vectors to its output bucket;
- the vectors queue themselves for the **loader** on the preprocessing instances, which upserts them into the
  **Aurora PostgreSQL + pgvector store** (idempotent: a re-run adds no rows).

The request path (CPU, then GPU):

- a client calls the **orchestration fleet** behind its internal load balancer; per request it embeds the question
  on its CPU, reads the top-k chunks from the store's reader **in its own AZ** (``ZonalClient``; another zone only
  when the local reader fails or times out), builds the prompt and streams the answer from the **inference fleet**,
  logging one line with the time each step took and the request id the inference fleet logs too.

One encoder, all-MiniLM-L6-v2, everywhere: the CPU tiers carry its tokenizer and weights in their image
(``fleets._launch.PACKAGED_ENCODERS``), and the GPU fleet loads the same checkpoint from its model prefix, so queries
and passages are embedded by the same model and chunks are cut to the length it reads.
"""

from __future__ import annotations

from typing import Any

from aws_cdk import CfnOutput, Stack
from constructs import Construct

from examples.certificates import listener_certificate
from genai_constructs.fleets.embedding import EmbeddingBatchFleet
from genai_constructs.fleets.inference import GpuInferenceFleet
from genai_constructs.fleets.orchestration import RagOrchestrationFleet
from genai_constructs.fleets.preprocessing import DocumentPreprocessingFleet
from genai_constructs.network import PrivateDataPath
from genai_constructs.retrieval import AuroraVectorStore
from genai_constructs.testing.local_deploy import stack_synthesizer
from genai_constructs.workload import BatchTraffic, ModelArtifact, ModelShape, RagTraffic, RealtimeTraffic

CHAT_MODEL = "llama-3.1-8b"
"""The generator: an 8B chat model on one G-family GPU; retrieved passages lengthen prompts, not outputs."""
ENCODER = "all-minilm-l6-v2"
"""The encoder: 384-dimension vectors; the one the CPU tiers' image ships (tokenizer for chunking, weights for the
query), so the orchestrators need no model download and the chunks fit the encoder's window."""
CHUNK_TOKENS = 254
"""all-MiniLM-L6-v2 reads at most 256 tokens (its ``max_seq_length``), two of them [CLS] and [SEP]: a longer chunk
would be cut silently by the encoder, so the preprocessing tier cuts at 254."""
TOP_K = 8
"""Eight 254-token chunks: about 2,000 tokens of context, the same context as four 512-token chunks."""
PROMPT_TOKENS = 2_300
"""Question plus the retrieved passages (8 x 254 tokens) plus the instructions: RAG prompts are long."""
CONCURRENT_SESSIONS = 32
"""Peak sessions asking at once."""
TOKENS_PER_S_PER_SESSION = 10.0
"""Reading speed plus margin."""
ANSWERS_PER_S = 4.0
"""RAG answers started per second at peak: 32 sessions, each asking about every 8 s while it reads an answer."""
STORED_CHUNKS = 2_000_000
"""Chunks held by the store: the corpus below at about four chunks a document, with room to grow."""
DOCUMENTS = 500_000
"""The corpus re-processed each night."""
TOKENS_PER_DOCUMENT = 1_000
"""Mean document length after parsing."""
DEADLINE_HOURS = 6.0
"""The nightly re-index window (parse, chunk, embed and load)."""
FORMAT_MIX = {"pdf": 0.5, "html": 0.3, "txt": 0.2}
"""Share of documents per format; sizes the CPU tier from each format's measured documents/s per vCPU."""
CHAT_SERVER_NAME = "chat.genai.internal"
"""The name the certificate covers, which the orchestrators verify the chat fleet's certificate against (they connect
to its load balancer's own DNS name). Replace with a name your certificate covers."""
WEIGHTS_BUCKET = "example-model-weights"
"""Replace with the bucket holding your weights and their SHA256SUMS manifest."""

RAG_TRAFFIC = RagTraffic(requests_per_s=ANSWERS_PER_S, top_k=TOP_K, chunk_tokens=CHUNK_TOKENS,
                         stored_chunks=STORED_CHUNKS)
"""The request path's load: sizes the orchestrators and the store's readers from the bytes retrieved per second."""
CORPUS = BatchTraffic(documents=DOCUMENTS, tokens_per_document=TOKENS_PER_DOCUMENT, deadline_hours=DEADLINE_HOURS,
                      sequence_tokens=CHUNK_TOKENS, spot_ok=True)
"""The nightly corpus: sizes the preprocessing tier (documents/s) and the embedding fleet (tokens in chunks)."""


class RagStack(Stack):
    """Raw documents -> preprocessing (CPU) -> embedding (GPU) -> loader -> pgvector; question -> orchestrator (CPU)
    -> zone-local reader + inference fleet (GPU) -> streamed answer.

    :param certificate_arn: see :func:`examples.certificates.listener_certificate`; both listeners serve HTTPS with
        it: the orchestrators' (the one clients call) and the chat fleet's (which only the orchestrators call).
    """

    def __init__(self, scope: Construct, id: str, *, certificate_arn: str | None = None, **kwargs: Any) -> None:
        if kwargs.get("synthesizer") is None:
            kwargs["synthesizer"] = stack_synthesizer(scope)
        super().__init__(scope, id, **kwargs)
        encoder = ModelShape.preset(ENCODER)
        certificate = listener_certificate(self, certificate_arn)
        # The CPU tiers read the store's secret from private subnets: Secrets Manager needs its interface endpoint.
        self.network = PrivateDataPath(self, "Network", extra_interface_endpoints=["secretsmanager"])
        self.embedding = EmbeddingBatchFleet(self, "Embed", network=self.network, model=encoder, traffic=CORPUS)
        self.vector_store = AuroraVectorStore(self, "VectorStore", network=self.network, traffic=RAG_TRAFFIC,
                                              dimension=encoder.embedding_dimension)
        self.preprocessing = DocumentPreprocessingFleet(
            self, "Prep", network=self.network, embedding=self.embedding, traffic=CORPUS, formats=FORMAT_MIX,
            chunk_tokens=CHUNK_TOKENS, vector_store=self.vector_store)
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
            certificate=certificate,
        )
        self.orchestration = RagOrchestrationFleet(
            self, "Rag", network=self.network, inference=self.inference, vector_store=self.vector_store,
            traffic=RAG_TRAFFIC, encoder=ENCODER, certificate=certificate,
            inference_server_name=CHAT_SERVER_NAME)
        CfnOutput(self, "RawDocumentsBucket", value=self.preprocessing.raw_bucket.bucket_name,
                  description="Upload raw documents under the raw prefix: they are parsed, embedded and loaded")
        CfnOutput(self, "AnswersUrl", value=self.orchestration.url,
                  description="POST /v1/rag {\"query\": ...}: the streamed answer (inside the VPC)")
