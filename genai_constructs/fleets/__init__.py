"""Fleets: the real-time inference fleet (and the shared GPU launch pieces in ``_launch``)."""

from genai_constructs.fleets.embedding import EmbeddingBatchFleet
from genai_constructs.fleets.inference import GpuInferenceFleet

__all__ = ["EmbeddingBatchFleet", "GpuInferenceFleet"]
