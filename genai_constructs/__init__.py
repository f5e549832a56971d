"""genai-constructs: AWS CDK v2 constructs for GPU and ML inference on EC2, and the planner behind them."""

from genai_constructs.errors import (
    ConfigurationError,
    DeadlineUnreachableError,
    GenaiConstructsError,
    LatencyTargetUnreachableError,
    ModelDoesNotFitError,
    UnknownInstanceTypeError,
    UnknownPresetError,
)
from genai_constructs.network import PrivateDataPath, RetrievalService
from genai_constructs.planner import (
    EmbeddingPlan,
    Estimate,
    InferencePlan,
    estimate,
    load_catalog,
    plan_embedding,
    plan_inference,
)
from genai_constructs.workload import BatchTraffic, ModelArtifact, ModelShape, Precision, RealtimeTraffic

__all__ = [
    "BatchTraffic",
    "ConfigurationError",
    "DeadlineUnreachableError",
    "EmbeddingPlan",
    "Estimate",
    "GenaiConstructsError",
    "InferencePlan",
    "LatencyTargetUnreachableError",
    "ModelArtifact",
    "ModelDoesNotFitError",
    "ModelShape",
    "Precision",
    "PrivateDataPath",
    "RealtimeTraffic",
    "RetrievalService",
    "UnknownInstanceTypeError",
    "UnknownPresetError",
    "estimate",
    "load_catalog",
    "plan_embedding",
    "plan_inference",
]
