"""What the estimator and planners return: frozen models the constructs consume.

These hold no CDK objects; a construct takes a plan and turns it into resources.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from genai_constructs.workload import BatchTraffic, ModelShape, RealtimeTraffic


class _Result(BaseModel):
    model_config = ConfigDict(frozen=True)


class MemoryBreakdown(_Result):
    """Accelerator memory of one model replica (all its devices together), GiB."""

    total_gib: float = Field(description="Memory of the devices the replica uses.")
    weights_gib: float
    kv_cache_gib: float = Field(description="KV cache the requested concurrency and context occupy.")
    runtime_overhead_gib: float = Field(description="CUDA/Neuron context, activations, graph captures, fragmentation.")
    free_gib: float = Field(description="Left for more concurrency; negative means it does not fit.")
    max_concurrency: int = Field(
        description="Sequences of the given length that fit at once (0: weights alone overflow)."
    )


class Estimate(_Result):
    """Predicted performance of one model replica on one instance type."""

    model_name: str
    instance_type: str
    runtime: str
    devices: int = Field(description="Accelerator devices used for tensor parallelism.")
    concurrency: int = Field(description="Sequences decoded together.")
    prompt_tokens: int
    output_tokens: int
    tpot_ms: float = Field(description="Time per output token per sequence at this concurrency.")
    ttft_ms: float = Field(description="Time to first token: prefill of one prompt, unloaded.")
    output_tokens_per_s: float = Field(description="Aggregate output tokens/s across all concurrent sequences.")
    decode_step_ms: float = Field(description="One decode step of the whole batch, excluding prefill interleaving.")
    prefill_ms: float
    roofline_tpot_ms: float = Field(description="Physical lower bound: bytes moved / peak bandwidth (or FLOPs / peak).")
    bound: Literal["memory-bandwidth", "compute"]
    memory: MemoryBreakdown
    fits: bool
    terms_ms: dict[str, float] = Field(description="Decode step broken into its terms, for review.")


class PlanOption(_Result):
    """One ranked candidate the planner considered."""

    instance_type: str
    devices_per_replica: int
    instances: int
    usd_per_hour: float | None
    usd_per_million_tokens: float | None
    tpot_ms: float | None = None
    note: str = ""


class _Plan(_Result):
    """What every plan says: where it runs, how many, what it costs, and why."""

    model: ModelShape
    instance_type: str
    family: str
    accelerator: str
    min_instances: int
    max_instances: int
    usd_per_hour: float | None = Field(description="One instance, on-demand (None where AWS publishes no price).")
    weights_gib: float
    is_neuron: bool
    bottleneck: str = Field(description="What to watch on this fleet: the dominant term and the family's limit.")
    cost_lever: str = Field(description="What lowers cost on this family.")
    neuron_caveats: list[str]
    reasons: list[str] = Field(description="Sentences a reviewer can check against the numbers.")
    alternatives: list[PlanOption] = Field(description="The next options, cheapest first; unpriced ones last.")
    notes: list[str] = Field(description="Quota to request, unranked types, options left out.")


class InferencePlan(_Plan):
    """Real-time serving plan: one model replica per instance, tensor-parallel across its devices."""

    kind: Literal["inference"] = "inference"
    traffic: RealtimeTraffic
    devices_per_replica: int = Field(description="Tensor-parallel degree; every device of the instance.")
    concurrency_per_instance: int = Field(description="Sequences one instance serves at planned load (server cap).")
    estimate: Estimate = Field(description="At the planned per-instance concurrency.")
    usd_per_hour_at_peak: float | None = Field(description="max_instances on-demand.")
    usd_per_million_output_tokens: float | None


class EmbeddingPlan(_Plan):
    """Batch embedding plan: one encoder worker per accelerator device."""

    kind: Literal["embedding"] = "embedding"
    traffic: BatchTraffic
    workers_per_instance: int = Field(description="One worker process per device.")
    batch_size: int = Field(description="Sequences per encoder call.")
    max_concurrency_per_worker: int = Field(
        description="Messages a worker holds at once (keeps its GPU fed, not thrashed)."
    )
    tokens_per_s_per_instance: float
    documents_per_s_per_instance: float
    seconds_per_document: float = Field(description="One document through one worker, for visibility timeouts.")
    hours_to_finish: float = Field(description="Backlog time at max_instances; min_instances is 0 (scale to zero).")
    usd_per_million_tokens: float | None
    spot: bool
    spot_instance_types: list[str] = Field(description="Equivalent types for a Spot mixed-instances policy.")
