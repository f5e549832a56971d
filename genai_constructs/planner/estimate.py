"""The estimator: time and memory of one model replica on one instance type, from physics.

Decode reads every weight once per step (memory-bandwidth bound at small batches) plus each sequence's KV cache;
prefill multiplies every weight by every prompt token (compute bound). On top of the roofline the estimator adds
only overheads it can name, each from a runtime profile rather than a per-benchmark factor:

* achieved fractions of peak memory bandwidth and of dense tensor throughput (kernels never reach the datasheet);
* kernel gaps per transformer block (launch latency between ~a dozen kernels), and for runtimes that dispatch each
  op from Python without CUDA graphs, a host-side floor per block: the GPU cannot run faster than the CPU feeds it;
* tensor-parallel collectives: two all-reduces per block, latency ~ 2·log2(ranks) hops plus bytes over the link;
* prefill interleaving: in steady state every sequence that finishes is replaced by a new one whose prompt is
  prefilled on the same devices, so each decode step also pays concurrency/output_tokens prefills.

The result is never faster than the physical roofline (bytes / peak bandwidth, FLOPs / peak compute).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from genai_constructs.errors import GenaiConstructsError, ModelDoesNotFitError
from genai_constructs.planner.catalog import InstanceType, load_catalog
from genai_constructs.planner.plans import Estimate, MemoryBreakdown
from genai_constructs.workload import ModelShape, Precision

GIB = 1024**3


@dataclass(frozen=True)
class RuntimeProfile:
    """How efficiently one serving runtime turns hardware into tokens. Values are per runtime, never per benchmark."""

    name: str
    bandwidth_efficiency: float
    """Fraction of peak memory bandwidth a decode GEMV/attention kernel sustains (STREAM-like kernels reach ~85-90 %)."""
    compute_efficiency: float
    """Fraction of peak dense tensor throughput a large GEMM sustains."""
    kernel_gap_us_per_layer: float
    """GPU idle time per block between kernels (launch latency; small with CUDA graphs or compiled graphs)."""
    host_us_per_layer: float
    """CPU time to dispatch one block's ops when not captured in a graph; 0 where graphs replay the whole step."""
    collective_hop_us: float
    """Latency of one hop of a small all-reduce (NCCL LL/tree on NVLink ~5 us; NeuronLink collectives similar)."""
    step_overhead_ms: float
    """Per decode step: sampling, scheduling, detokenization that the GPU waits for."""
    runtime_overhead_gib_per_device: float
    """CUDA/Neuron context, cuBLAS workspaces, graph pools, activations for the largest batch."""
    memory_utilization: float
    """Fraction of device memory the runtime lets itself use (vLLM gpu_memory_utilization=0.90)."""
    host_us_per_sequence: float = 0.0
    """CPU time per sequence per step that the next step waits for: runtimes that loop over requests in Python
    (sampling warpers launched per request, stopping criteria, incremental detokenization). 0 where sampling is
    batched on the GPU and output processing overlaps the next step."""


# The default is a current vLLM (CUDA graphs, continuous batching): what GpuInferenceFleet runs.
RUNTIMES: dict[str, RuntimeProfile] = {
    "vllm": RuntimeProfile("vllm", 0.88, 0.60, 15.0, 0.0, 5.0, 1.0, 1.0, 0.90),
    "tensorrt-llm": RuntimeProfile("tensorrt-llm", 0.88, 0.60, 10.0, 0.0, 5.0, 0.5, 1.0, 0.90),
    # TGI 1.0 (2023): flash/paged attention kernels, but every op dispatched from Python, no CUDA graphs, and a
    # Python loop over the batch's requests after each step (per-request top-k/top-p sorts, stop checks, detokenize).
    "tgi-1.0": RuntimeProfile("tgi-1.0", 0.88, 0.60, 15.0, 400.0, 5.0, 1.0, 1.0, 0.90, host_us_per_sequence=800.0),
    # FasterTransformer: C++ launches without graphs: no Python floor, but ~a dozen launch gaps per block.
    "fastertransformer": RuntimeProfile("fastertransformer", 0.88, 0.60, 85.0, 0.0, 5.0, 0.5, 1.0, 0.90),
    # transformers-neuronx: a compiled graph per bucket; collectives over NeuronLink dominate small models at TP 24.
    "neuronx": RuntimeProfile("neuronx", 0.88, 0.60, 10.0, 0.0, 8.0, 0.5, 1.0, 0.90),
}
DEFAULT_RUNTIME = "vllm"
ACTIVATION_BYTES = 2.0
"""Activations and all-reduce payloads travel in 16-bit (bf16/fp16) even when weights are fp8 or int4."""


def _peak_tflops(instance: InstanceType, precision: Precision) -> float:
    accelerator = instance.accelerator
    if precision.is_float8 and accelerator.dense_fp8_tflops:
        return accelerator.dense_fp8_tflops
    return accelerator.dense_bf16_tflops


def tensor_parallel_ranks(instance: InstanceType, devices: int) -> int:
    """Ranks the runtime shards over: an Inferentia2/Trainium chip runs one rank per NeuronCore (two per chip)."""
    return devices * 2 if instance.is_neuron else devices


def valid_device_counts(model: ModelShape, instance: InstanceType) -> list[int]:
    """Tensor-parallel degrees the model's attention heads divide evenly, up to the instance's devices."""
    counts = []
    for devices in range(1, instance.accelerator_count + 1):
        if instance.accelerator_count % devices:
            continue
        ranks = tensor_parallel_ranks(instance, devices)
        if model.attention_heads % ranks == 0 or ranks == 1:
            counts.append(devices)
    return counts


def memory_breakdown(
    model: ModelShape,
    instance: InstanceType,
    devices: int,
    concurrency: int,
    sequence_tokens: int,
    runtime: RuntimeProfile,
) -> MemoryBreakdown:
    total = instance.accelerator_memory_gib * devices
    weights = model.weight_bytes / GIB
    overhead = runtime.runtime_overhead_gib_per_device * devices + total * (1 - runtime.memory_utilization)
    per_sequence = model.kv_bytes_per_token * sequence_tokens / GIB
    kv = per_sequence * concurrency
    room = total - weights - overhead
    if model.kind == "encoder":
        max_concurrency = 1 << 20 if room > 0 else 0
    else:
        max_concurrency = max(0, math.floor(room / per_sequence)) if room > 0 else 0
    return MemoryBreakdown(
        total_gib=round(total, 3),
        weights_gib=round(weights, 3),
        kv_cache_gib=round(kv, 3),
        runtime_overhead_gib=round(overhead, 3),
        free_gib=round(room - kv, 3),
        max_concurrency=max_concurrency,
    )


def _allreduce_ms(ranks: int, payload_bytes: float, link_gb_s: float, runtime: RuntimeProfile) -> float:
    if ranks <= 1:
        return 0.0
    latency_us = 2 * math.log2(ranks) * runtime.collective_hop_us
    transfer_us = 2 * (ranks - 1) / ranks * payload_bytes / (link_gb_s * 1e3)
    return (latency_us + transfer_us) / 1e3


def prefill_ms(
    model: ModelShape, instance: InstanceType, devices: int, prompt_tokens: int, runtime: RuntimeProfile
) -> float:
    """Time to run one prompt through the model: GEMMs and attention compute bound, weights read once."""
    ranks = tensor_parallel_ranks(instance, devices)
    peak_flops = _peak_tflops(instance, model.precision) * 1e12 * devices
    # 2 FLOPs per weight per token for the GEMMs; causal attention adds 2·layers·P²·(heads·head_dim) (QK and AV).
    gemm_flops = 2 * model.parameters_billion * 1e9 * prompt_tokens
    attention_flops = 2 * model.layers * prompt_tokens**2 * model.attention_heads * model.head_dim
    compute = (gemm_flops + attention_flops) / (peak_flops * runtime.compute_efficiency) * 1e3
    weights_read = model.weight_bytes / devices / (instance.accelerator.memory_bandwidth_gb_s * 1e9) * 1e3
    gaps = model.layers * runtime.kernel_gap_us_per_layer / 1e3
    payload = prompt_tokens * model.hidden_size * ACTIVATION_BYTES
    comm = 2 * model.layers * _allreduce_ms(ranks, payload, instance.accelerator.interconnect_gb_s, runtime)
    host = model.layers * runtime.host_us_per_layer / 1e3
    return max(max(compute, weights_read) + gaps + comm, host)


def decode_step_terms(
    model: ModelShape, instance: InstanceType, devices: int, batch: int, context_tokens: float, runtime: RuntimeProfile
) -> dict[str, float]:
    """One decode step of ``batch`` sequences holding ``context_tokens`` each on average, broken into terms (ms)."""
    accelerator = instance.accelerator
    ranks = tensor_parallel_ranks(instance, devices)
    bandwidth = accelerator.memory_bandwidth_gb_s * 1e9 * runtime.bandwidth_efficiency  # per device
    peak_flops = _peak_tflops(instance, model.precision) * 1e12 * runtime.compute_efficiency  # per device
    # GEMMs: each device streams its shard of the weights once and multiplies it by the batch: per-kernel roofline.
    weight_read = model.weight_bytes / devices / bandwidth * 1e3
    gemm_compute = 2 * model.parameters_billion * 1e9 * batch / devices / peak_flops * 1e3
    # Attention: each sequence's KV cache is read once per step; KV heads shard across ranks (replicated past them).
    kv_shards = min(ranks, model.kv_heads) if ranks > 1 else 1
    kv_read = batch * context_tokens * model.kv_bytes_per_token / kv_shards / bandwidth * 1e3
    gaps = model.layers * runtime.kernel_gap_us_per_layer / 1e3
    payload = batch * model.hidden_size * ACTIVATION_BYTES
    comm = 2 * model.layers * _allreduce_ms(ranks, payload, accelerator.interconnect_gb_s, runtime)
    gpu = max(weight_read, gemm_compute) + kv_read + gaps + comm
    host_floor = model.layers * runtime.host_us_per_layer / 1e3
    return {
        "weights": weight_read,
        "gemm_compute": gemm_compute,
        "kv_cache": kv_read,
        "kernel_gaps": gaps,
        "tensor_parallel": comm,
        "host_floor": host_floor,
        "step_overhead": runtime.step_overhead_ms + batch * runtime.host_us_per_sequence / 1e3,
        "step": max(gpu, host_floor) + runtime.step_overhead_ms + batch * runtime.host_us_per_sequence / 1e3,
    }


def roofline_tpot_ms(
    model: ModelShape, instance: InstanceType, devices: int, batch: int, context_tokens: float
) -> float:
    """The physical floor: weights and KV at peak bandwidth, or FLOPs at peak compute, whichever is slower."""
    accelerator = instance.accelerator
    bytes_moved = model.weight_bytes + batch * context_tokens * model.kv_bytes_per_token
    memory = bytes_moved / (accelerator.memory_bandwidth_gb_s * 1e9 * devices) * 1e3
    flops = 2 * model.parameters_billion * 1e9 * batch
    compute = flops / (_peak_tflops(instance, model.precision) * 1e12 * devices) * 1e3
    return max(memory, compute)


def estimate(
    model: ModelShape,
    instance_type: str | InstanceType,
    *,
    devices: int | None = None,
    concurrency: int = 1,
    prompt_tokens: int = 128,
    output_tokens: int = 128,
    runtime: str = DEFAULT_RUNTIME,
    require_fit: bool = False,
) -> Estimate:
    """Predict TPOT, TTFT, throughput and memory of ``model`` on ``instance_type``.

    ``devices``: accelerator devices used for tensor parallelism (an Inferentia2/Trainium chip is one device);
    default all devices of the instance. ``concurrency``: sequences decoded together. With ``require_fit`` a model
    that does not fit raises ``ModelDoesNotFitError`` naming the memory needed and available.
    """
    instance = instance_type if isinstance(instance_type, InstanceType) else load_catalog().instance(instance_type)
    problems = []
    for name, value in (
        ("concurrency", concurrency),
        ("prompt_tokens", prompt_tokens),
        ("output_tokens", output_tokens),
    ):
        if value <= 0:
            problems.append(f"{name} ({value}) must be a positive integer")
    if runtime not in RUNTIMES:
        problems.append(f"runtime {runtime!r} is not one of {', '.join(RUNTIMES)}")
    if devices is None:
        devices = instance.accelerator_count
    elif not 1 <= devices <= instance.accelerator_count:
        problems.append(
            f"devices ({devices}) must be between 1 and {instance.accelerator_count} on {instance.instance_type}"
        )
    if problems:
        raise GenaiConstructsError("estimate: " + "; ".join(problems))
    profile = RUNTIMES[runtime]
    if prompt_tokens + output_tokens > model.max_context and model.kind == "decoder":
        raise GenaiConstructsError(
            f"estimate: prompt_tokens + output_tokens ({prompt_tokens + output_tokens}) exceeds {model.name}'s "
            f"max_context ({model.max_context}): shorten the prompt or the output"
        )

    sequence_tokens = prompt_tokens + output_tokens
    memory = memory_breakdown(model, instance, devices, concurrency, sequence_tokens, profile)
    fits = memory.free_gib >= 0
    if require_fit and not fits:
        needed = memory.weights_gib + memory.runtime_overhead_gib + memory.kv_cache_gib
        raise ModelDoesNotFitError(
            f"{model.name} ({model.precision.value}) at concurrency {concurrency} needs {needed:.1f} GiB of accelerator "
            f"memory on {devices} device(s) of {instance.instance_type}, which have {memory.total_gib:.1f} GiB: "
            "choose a larger instance, more devices, lower concurrency, or a narrower precision"
        )

    # Average context while decoding: the prompt plus half the output already generated.
    context = prompt_tokens + output_tokens / 2
    terms = decode_step_terms(model, instance, devices, concurrency, context, profile)
    prefill = prefill_ms(model, instance, devices, prompt_tokens, profile)
    # Steady state: concurrency/output_tokens sequences finish per step and are replaced; their prefills run on the
    # same devices, stalling (or sharing) the decode step.
    interleave = concurrency / output_tokens * prefill
    terms["prefill_interleave"] = interleave
    tpot = terms["step"] + interleave
    roofline = roofline_tpot_ms(model, instance, devices, concurrency, context)
    tpot = max(tpot, roofline)
    bound = "compute" if terms["gemm_compute"] > terms["weights"] + terms["kv_cache"] else "memory-bandwidth"
    return Estimate(
        model_name=model.name,
        instance_type=instance.instance_type,
        runtime=profile.name,
        devices=devices,
        concurrency=concurrency,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        tpot_ms=round(tpot, 3),
        ttft_ms=round(prefill + profile.step_overhead_ms, 3),
        output_tokens_per_s=round(concurrency * 1000.0 / tpot, 2),
        decode_step_ms=round(terms["step"], 3),
        prefill_ms=round(prefill, 3),
        roofline_tpot_ms=round(roofline, 3),
        bound=bound,
        memory=memory,
        fits=fits,
        terms_ms={k: round(v, 4) for k, v in terms.items()},
    )
