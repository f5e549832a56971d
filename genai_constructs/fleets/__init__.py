"""Fleets: the GPU inference and embedding fleets, the CPU preprocessing and RAG orchestration tiers (and the shared
launch pieces in ``_launch``)."""

from genai_constructs.fleets.embedding import EmbeddingBatchFleet
from genai_constructs.fleets.inference import GpuInferenceFleet
from genai_constructs.fleets.orchestration import RagOrchestrationFleet
from genai_constructs.fleets.preprocessing import DocumentPreprocessingFleet, VectorStoreConnection

__all__ = [
    "DocumentPreprocessingFleet",
    "EmbeddingBatchFleet",
    "GpuInferenceFleet",
    "RagOrchestrationFleet",
    "VectorStoreConnection",
]
