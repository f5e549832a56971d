"""What the estimator and planners return: frozen models the constructs consume.

These hold no CDK objects; a construct takes a plan and turns it into resources.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from genai_constructs.planner.pricing import BatchCost, FleetCost, QuotaNeed
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
    kv_cache_overflows: bool = Field(
        default=False,
        description="The requested concurrency's KV cache exceeds the memory left after weights and overhead: the "
        "runtime runs only sequences_running at once (the rest wait or are preempted and recomputed), and tpot_ms and "
        "output_tokens_per_s are for those.",
    )
    sequences_running: int = Field(
        default=0,
        description="Sequences decoded together: the concurrency, or on KV overflow the sequences that fit.",
    )
    warnings: list[str] = Field(default_factory=list, description="What the estimate could not honour, with numbers.")


class ServerSettings(_Result):
    """The model server's start-up settings for one replica, derived from the plan and checked against vLLM 0.13's
    own start-up checks (see ``genai_constructs.planner.server_settings``).

    KV cache figures are for the whole replica (all tensor-parallel ranks together); vLLM checks each rank, and every
    rank holds the same share, so the comparison is the same.
    """

    max_model_len: int = Field(
        description="--max-model-len: the longest prompt + output one request may carry (the traffic's "
        "max_request_tokens, or its default capped at the model's max_context)."
    )
    max_num_seqs: int = Field(
        description="--max-num-seqs: sequences one replica runs at once (the planned concurrency)."
    )
    gpu_memory_utilization: float = Field(
        description="--gpu-memory-utilization: the fraction of each device's memory vLLM may use; exactly what the "
        "memory estimate assumed."
    )
    tensor_parallel_size: int = Field(
        description="--tensor-parallel-size: ranks the model is sharded over (one per GPU; one per NeuronCore, two "
        "per Inferentia2/Trainium chip)."
    )
    block_size: int = Field(
        default=16,
        description="Tokens per KV cache block (vLLM's CUDA default, not passed); KV is allocated in whole blocks.",
    )
    max_num_batched_tokens: int = Field(
        description="--max-num-batched-tokens: vLLM 0.13's OpenAI-server default for this GPU (8,192 at 70 GiB or more "
        "per device except A100, else 2,048); passed so that the check does not depend on vLLM's device detection."
    )
    kv_cache_dtype: Literal["auto", "fp8"] = Field(
        default="auto",
        description="--kv-cache-dtype: fp8 for fp8 plans (the estimate assumes a 1-byte cache), else auto (the "
        "model's dtype).",
    )
    kv_cache_gib_available: float = Field(
        description="KV cache memory the estimator's memory model leaves on the replica: total x gpu_memory_utilization "
        "- weights - runtime overhead, i.e. what vLLM computes after profiling."
    )
    kv_cache_gib_reserved: float = Field(
        description="Part of kv_cache_gib_available the start-up check keeps unclaimed "
        "(STARTUP_MEMORY_MARGIN_GIB_PER_RANK per rank): vLLM measures its overhead, the estimate assumes it."
    )
    kv_cache_gib_one_max_request: float = Field(
        description="KV cache one max_model_len request needs: whole blocks of block_size tokens, every layer, every rank."
    )
    max_concurrent_max_requests: int = Field(
        description="max_model_len requests whose KV cache fits at once (vLLM logs it as 'Maximum concurrency')."
    )

    def vllm_args(self) -> list[str]:
        """The settings as ``vllm.entrypoints.openai.api_server`` flags (vLLM 0.13 ``EngineArgs.add_cli_args``)."""
        args = [
            "--tensor-parallel-size", str(self.tensor_parallel_size),
            "--max-num-seqs", str(self.max_num_seqs),
            "--max-model-len", str(self.max_model_len),
            "--gpu-memory-utilization", f"{self.gpu_memory_utilization:g}",
            "--max-num-batched-tokens", str(self.max_num_batched_tokens),
        ]  # fmt: skip
        if self.kv_cache_dtype != "auto":
            args += ["--kv-cache-dtype", self.kv_cache_dtype]
        return args


class PlanOption(_Result):
    """One ranked candidate the planner considered."""

    instance_type: str
    devices_per_replica: int
    replicas_per_instance: int = 1
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
    usd_per_hour: float | None = Field(
        description="One instance, on-demand, in ``region`` (None where AWS publishes no price)."
    )
    region: str | None = Field(
        default=None, description="Where prices and availability were read; None: us-east-1 prices, any region."
    )
    price_label: str = Field(default="", description="Where usd_per_hour comes from (region, source, date).")
    spot_usd_per_hour: float | None = Field(
        default=None, description="One instance at the regional Spot estimate (None where none is known)."
    )
    spot_price_label: str = Field(
        default="", description="Where the Spot estimate comes from; an estimate, not a quote."
    )
    quota: QuotaNeed | None = Field(
        default=None,
        description="The vCPU quota the fleet needs at its group maximum (and, with Spot, its largest override).",
    )
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
    devices_per_replica: int = Field(description="Tensor-parallel degree of one model replica (devices it spans).")
    replicas_per_instance: int = Field(
        default=1,
        description="Model replicas (one server process each) per instance: accelerator_count / devices_per_replica "
        "when the planner finds several narrow replicas cheaper than one wide one.",
    )
    concurrency_per_instance: int = Field(
        description="Sequences one instance serves at planned load: replicas_per_instance x the planned concurrency "
        "of one replica (the scaling target)."
    )
    estimate: Estimate = Field(description="At the planned per-instance concurrency.")
    server: ServerSettings = Field(description="The model server's start-up settings, checked against vLLM's rules.")
    usd_per_hour_at_peak: float | None = Field(description="max_instances x usd_per_hour: compute only.")
    usd_per_million_output_tokens: float | None = Field(
        description="At capacity: one instance's price over its output tokens at the planned concurrency, i.e. "
        "what a token costs when every instance is as busy as planned. See cost_at_traffic for the bill at the "
        "user's own token rate."
    )
    cost_at_traffic: FleetCost | None = Field(
        default=None,
        description="The fleet's $/hour as deployed at the traffic (instances, warm-pool and root volumes, the load "
        "balancer, the interface endpoints), each a labelled item, and $/1M output tokens at the traffic's own "
        "token rate beside the at-capacity figure. None where the instance has no price.",
    )


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
    hours_to_finish: float = Field(
        description="Wall-clock hours at max_instances, worker start-up included; min_instances is 0 (scale to zero)."
    )
    worker_startup_s: float = Field(
        default=0.0, description="Seconds from launch until a worker takes work (planner/startup.py, cold path)."
    )
    usd_per_million_tokens: float | None
    job_cost: BatchCost | None = Field(
        default=None,
        description="The whole job: every worker's start-up and work hours, root volumes and endpoints, labelled; "
        "at the Spot estimate when spot. None where the instance has no price.",
    )
    spot: bool
    spot_instance_types: list[str] = Field(description="Equivalent types for a Spot mixed-instances policy.")
