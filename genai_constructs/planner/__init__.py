"""Workload planner: catalog, estimator and planners. Pure Python; never imports aws_cdk."""

from genai_constructs.planner.catalog import Accelerator, Catalog, InstanceType, load_catalog
from genai_constructs.planner.cpu_tier import (
    CpuInstance,
    FormatFigures,
    OrchestrationPlan,
    PreprocessingPlan,
    load_cpu_instances,
    plan_orchestration,
    plan_preprocessing,
)
from genai_constructs.planner.estimate import DEFAULT_RUNTIME, RUNTIMES, RuntimeProfile, estimate
from genai_constructs.planner.planning import plan_embedding, plan_inference
from genai_constructs.planner.plans import (
    EmbeddingPlan,
    Estimate,
    InferencePlan,
    MemoryBreakdown,
    PlanOption,
    ServerSettings,
)
from genai_constructs.planner.server_settings import (
    STARTUP_MEMORY_MARGIN_GIB_PER_RANK,
    VLLM_VERSION,
    check_server_settings,
    derive_server_settings,
    startup_problems,
)
from genai_constructs.planner.startup import StartupEstimate, time_to_serving
from genai_constructs.planner.vector_store import VectorStoreDoesNotFitError, VectorStorePlan, plan_vector_store

__all__ = [
    "DEFAULT_RUNTIME",
    "RUNTIMES",
    "STARTUP_MEMORY_MARGIN_GIB_PER_RANK",
    "VLLM_VERSION",
    "Accelerator",
    "Catalog",
    "CpuInstance",
    "EmbeddingPlan",
    "Estimate",
    "FormatFigures",
    "InferencePlan",
    "InstanceType",
    "MemoryBreakdown",
    "OrchestrationPlan",
    "PlanOption",
    "PreprocessingPlan",
    "RuntimeProfile",
    "ServerSettings",
    "StartupEstimate",
    "VectorStoreDoesNotFitError",
    "VectorStorePlan",
    "check_server_settings",
    "derive_server_settings",
    "estimate",
    "load_catalog",
    "load_cpu_instances",
    "plan_embedding",
    "plan_inference",
    "plan_orchestration",
    "plan_preprocessing",
    "plan_vector_store",
    "startup_problems",
    "time_to_serving",
]
