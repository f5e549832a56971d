"""Workload planner: catalog, estimator and planners. Pure Python; never imports aws_cdk."""

from genai_constructs.planner.catalog import Accelerator, Catalog, InstanceType, load_catalog
from genai_constructs.planner.estimate import DEFAULT_RUNTIME, RUNTIMES, RuntimeProfile, estimate
from genai_constructs.planner.planning import plan_embedding, plan_inference
from genai_constructs.planner.plans import (
    EmbeddingPlan,
    Estimate,
    InferencePlan,
    MemoryBreakdown,
    PlanOption,
)

__all__ = [
    "DEFAULT_RUNTIME",
    "RUNTIMES",
    "Accelerator",
    "Catalog",
    "EmbeddingPlan",
    "Estimate",
    "InferencePlan",
    "InstanceType",
    "MemoryBreakdown",
    "PlanOption",
    "RuntimeProfile",
    "estimate",
    "load_catalog",
    "plan_embedding",
    "plan_inference",
]
