"""genai-constructs: AWS CDK v2 constructs for GPU and ML inference on EC2, and the planner behind them.

The workload model and planner import without aws_cdk (planning is pure Python and starts no jsii process);
the constructs load on first use of their names.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from genai_constructs.errors import (
    ConfigurationError,
    DeadlineUnreachableError,
    GenaiConstructsError,
    LatencyTargetUnreachableError,
    ModelDoesNotFitError,
    ServerStartupError,
    UnknownInstanceTypeError,
    UnknownPresetError,
)
from genai_constructs.planner import (
    EmbeddingPlan,
    Estimate,
    InferencePlan,
    OrchestrationPlan,
    PreprocessingPlan,
    ServerSettings,
    VectorStorePlan,
    estimate,
    load_catalog,
    plan_embedding,
    plan_inference,
    plan_orchestration,
    plan_preprocessing,
    plan_vector_store,
)
from genai_constructs.planner.startup import StartupEstimate, time_to_serving
from genai_constructs.workload import BatchTraffic, ModelArtifact, ModelShape, Precision, RagTraffic, RealtimeTraffic

if TYPE_CHECKING:
    from genai_constructs.fleets import (
        DocumentPreprocessingFleet,
        EmbeddingBatchFleet,
        GpuInferenceFleet,
        RagOrchestrationFleet,
    )
    from genai_constructs.network import PrivateDataPath, RetrievalService
    from genai_constructs.retrieval import AuroraVectorStore

_CONSTRUCTS = {
    "AuroraVectorStore": "genai_constructs.retrieval",
    "DocumentPreprocessingFleet": "genai_constructs.fleets",
    "RagOrchestrationFleet": "genai_constructs.fleets",
    "EmbeddingBatchFleet": "genai_constructs.fleets",
    "GpuInferenceFleet": "genai_constructs.fleets",
    "PrivateDataPath": "genai_constructs.network",
    "RetrievalService": "genai_constructs.network",
}

__all__ = [
    "AuroraVectorStore",
    "BatchTraffic",
    "ConfigurationError",
    "DeadlineUnreachableError",
    "DocumentPreprocessingFleet",
    "EmbeddingBatchFleet",
    "EmbeddingPlan",
    "Estimate",
    "GenaiConstructsError",
    "GpuInferenceFleet",
    "InferencePlan",
    "LatencyTargetUnreachableError",
    "ModelArtifact",
    "ModelDoesNotFitError",
    "ModelShape",
    "OrchestrationPlan",
    "Precision",
    "PreprocessingPlan",
    "PrivateDataPath",
    "RagOrchestrationFleet",
    "RagTraffic",
    "RealtimeTraffic",
    "RetrievalService",
    "ServerSettings",
    "ServerStartupError",
    "StartupEstimate",
    "UnknownInstanceTypeError",
    "UnknownPresetError",
    "VectorStorePlan",
    "estimate",
    "load_catalog",
    "plan_embedding",
    "plan_inference",
    "plan_orchestration",
    "plan_preprocessing",
    "plan_vector_store",
    "time_to_serving",
]


def __getattr__(name: str) -> Any:
    if name in _CONSTRUCTS:
        return getattr(importlib.import_module(_CONSTRUCTS[name]), name)
    raise AttributeError(f"module 'genai_constructs' has no attribute {name!r}")
