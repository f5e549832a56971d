"""The estimator: time and memory of one model replica on one instance type, from physics plus named mechanisms.

Decode reads the weights once per step (memory-bandwidth bound at small batches) plus each sequence's KV cache;
prefill multiplies every active weight by every prompt token (compute bound). On top of that roofline the estimator
adds only mechanisms it can name, each with one constant in :data:`CALIBRATED` (see ``docs/estimator.md``):

* achieved memory bandwidth per accelerator family (HBM GPUs, GDDR GPUs, NeuronCores differ);
* a fixed latency per transformer block per runtime (kernel launches between ~a dozen kernels with CUDA graphs,
  more without; the compiled Neuron graph's per-block engine synchronisation);
* decode attention: KV bytes scale with batch x context; short contexts waste a floor of tokens per sequence (a
  decode attention kernel's split/launch granularity); on Neuron attention is engine-bound, per query head and token;
* tensor-parallel all-reduces per interconnect (NVLink, PCIe, NeuronLink; the two NeuronCores of one chip included);
* per decode step and per sequence scheduling/sampling overhead; a Python host floor for eager runtimes;
* prefill interleaving: every finishing sequence is replaced by a new one whose prompt is prefilled on the same
  devices; runtimes with in-flight batching fold those prompt tokens into the decode step's GEMMs;
* KV overflow: a concurrency whose KV cache does not fit runs at the concurrency memory allows (the rest wait or
  are preempted), and the estimate says so;
* mixture-of-experts: memory holds every expert; a decode step reads the shared weights plus the distinct experts the
  batch touches (E x (1 - (1 - k/E)^b) per layer) and multiplies only the active parameters.

The result is never faster than the physical roofline (bytes / peak bandwidth, FLOPs / peak compute).
The constants in :data:`CALIBRATED` are the output of ``genai_constructs.planner.calibration.fit`` on the calibration
rows of the catalog's ``llm_benchmarks``; ``tests/planner/test_calibration.py`` checks they still are.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from genai_constructs.errors import GenaiConstructsError, ModelDoesNotFitError
from genai_constructs.planner.catalog import InstanceType, load_catalog
from genai_constructs.planner.plans import Estimate, MemoryBreakdown
from genai_constructs.workload import ModelShape, Precision

GIB = 1024**3
ACTIVATION_BYTES = 2.0
"""Activations and all-reduce payloads travel in 16-bit (bf16/fp16) even when weights are fp8 or int4."""


@dataclass(frozen=True)
class RuntimeProfile:
    """A serving runtime: which per-runtime constants of :data:`CALIBRATED` apply, and its memory settings."""

    name: str
    layer_latency_key: str
    """Key of its per-block fixed latency in CALIBRATED (runtimes sharing a launch model share a key)."""
    step_key: str
    """Key prefix of its per-step and per-sequence scheduling overheads in CALIBRATED."""
    runtime_overhead_gib_per_device: float
    """CUDA/Neuron context, workspaces, graph pools and the activation peak, per device (see RUNTIMES)."""
    memory_utilization: float
    """Fraction of device memory the runtime lets itself use (vLLM gpu_memory_utilization=0.90)."""
    max_batch: int
    """The runtime's default cap on sequences decoded together (what a "max" benchmark row reaches at most)."""
    folds_prefill_into_decode: bool
    """In-flight batching / chunked prefill: new prompts' tokens join the decode step's GEMMs (weights read once)."""
    host_floor_key: str | None = None
    """Key prefix of the Python-dispatch host floor (per block, per sequence) for eager runtimes; None with graphs."""
    scheduler_steps: int = 1
    """Decode steps per scheduling round (vLLM 0.6 --num-scheduler-steps): the per-step CPU overhead is paid once
    per round, so each step carries 1/scheduler_steps of it."""


RUNTIMES: dict[str, RuntimeProfile] = {
    # Current vLLM (V1 engine, CUDA graphs, chunked prefill): what GpuInferenceFleet runs. 1.65 GiB per rank is the
    # measured non-KV overhead of an 8B model at 8,192 batched tokens (activation peak 1.26 GiB, vllm PR #10511;
    # non-torch 0.20-0.35 GiB, vllm PR #14447 / issue #10517), as tests/planner/vllm_startup_rules.py uses.
    # max_num_seqs defaults to 256 (vLLM EngineArgs). The calibration rows ran vLLM 0.4.3/0.6.0, whose V0 scheduler
    # also ran prefills in the same forward pass as running decodes only with chunked prefill, so they use "vllm-v0".
    "vllm": RuntimeProfile("vllm", "graphs", "overlapped", 1.65, 0.90, 256, True),
    "vllm-v0": RuntimeProfile("vllm-v0", "graphs", "vllm-v0", 1.65, 0.90, 256, False),
    # vLLM 0.6 with --num-scheduler-steps 10 (what the sglang benchmark_vllm_060 rows ran): one scheduling round per
    # ten decode steps.
    "vllm-v0-multistep": RuntimeProfile(
        "vllm-v0-multistep", "graphs", "vllm-v0", 1.65, 0.90, 256, False, scheduler_steps=10
    ),
    # TensorRT-LLM (PyTorch backend, CUDA graphs, in-flight batching). LlmArgs default max_batch_size 2048.
    "tensorrt-llm": RuntimeProfile("tensorrt-llm", "graphs", "overlapped", 1.0, 0.90, 2048, True),
    # TGI 1.0 (2023): every op dispatched from Python without CUDA graphs, and a Python loop over the batch's requests
    # after each step (per-request top-k/top-p sorts, stop checks, detokenize).
    "tgi-1.0": RuntimeProfile("tgi-1.0", "graphs", "vllm-v0", 1.0, 0.90, 128, False, host_floor_key="tgi-1.0"),
    # FasterTransformer: C++ kernel launches without graphs: no Python floor, but a dozen launch gaps per block.
    "fastertransformer": RuntimeProfile("fastertransformer", "eager-cpp", "overlapped", 1.0, 0.90, 64, False),
    # transformers-neuronx / NxD Inference: a compiled graph per bucket on NeuronCores; a static batch.
    "neuronx": RuntimeProfile("neuronx", "neuron", "neuronx", 1.0, 0.90, 64, False),
}
DEFAULT_RUNTIME = "vllm"

ACCELERATOR_FAMILY: dict[str, str] = {
    # Memory technology decides how close a decode GEMV gets to the datasheet bandwidth.
    "H100": "hbm",
    "H200": "hbm",
    "B200": "hbm",
    "A100-40GB": "hbm",
    "A100-80GB": "hbm",
    "A10G": "gddr",
    "L4": "gddr",
    "L40S": "gddr",
    "T4": "gddr",
    "Inferentia2": "neuron",
    "Trainium": "neuron",
}
INTERCONNECT_KIND = {"NVLink": "nvlink", "PCIe": "pcie", "NeuronLink": "neuronlink"}

# Every fitted constant, one place. Values are what calibration.fit() returns on the calibration rows (rounded to
# 3 significant figures); the comment says what each one is and what bounds it physically. FITTED lists the keys
# the fit may move; the others are fixed from the cited source because no calibration row measures them.
CALIBRATED: dict[str, float] = {
    # Fraction of datasheet memory bandwidth a decode GEMV sustains. STREAM-like kernels reach 85-92 % of HBM peak
    # (NVIDIA H100 / A100 STREAM results); GDDR6 parts reach less; NeuronCore DMA has its own figure.
    "bandwidth_efficiency.hbm": 0.92,
    "bandwidth_efficiency.gddr": 0.92,
    "bandwidth_efficiency.neuron": 0.504,
    # Fraction of dense tensor peak a large prefill / big-batch GEMM sustains (cuBLAS/cuBLASLt reach 60-75 % on
    # large bf16 GEMMs; fp8 GEMMs and whole-model passes with norms and activations less).
    "gemm_efficiency.nvidia": 0.6,
    # FP8 tensor-core GEMMs reach a smaller fraction of their (doubled) peak than 16-bit ones: scaling, casts and
    # the same memory system feed twice the math (cuBLASLt FP8 runs ~1.3-1.6x, not 2x, bf16 on H100).
    "gemm_efficiency.nvidia-fp8": 0.516,
    "gemm_efficiency.neuron": 0.5,
    # Decode attention reads each sequence's KV cache; a paged/flash-decoding kernel also pays a floor of this many
    # tokens per sequence per step (launch, split-k reduction, one KV block minimum), so short contexts cost more per
    # token than long ones.
    "attention_floor_tokens": 16.0,
    # Decode attention gathers KV pages and runs a softmax per head: it reaches only this fraction of the bandwidth
    # a weight GEMV reaches (paged-attention kernels lose to page indirection and split-k reductions at long
    # contexts; the FlashInfer and FlashDecoding++ papers report 50-90 % of peak depending on context and batch).
    "attention_bandwidth_ratio": 0.92,
    # NeuronCore decode attention is engine-bound, not bandwidth-bound: ns per query head per context token per block
    # on one NeuronCore (transformers-neuronx issue #64: TPOT grows 35 -> 55 ms with sequence length on one chip).
    "neuron_attention_ns_per_head_token": 2.7,
    # Fixed GPU/NeuronCore time per transformer block that no byte or FLOP count explains: kernel launch gaps
    # (~1 us per kernel x ~12 kernels when a CUDA graph replays), plus the small kernels (norms, rotary, activation,
    # sampling-side gathers) that never reach streaming bandwidth. The fit puts "graphs" (vLLM, TensorRT-LLM, TGI's
    # GPU side) at ~80 us, above launch latency alone: it is where per-block work at large batch and long context
    # lands. "eager-cpp" (FasterTransformer) is fitted on three A100 rows only; "neuron" sits at its lower bound
    # (the Neuron rows' overhead is explained by collectives and attention instead).
    "layer_latency_us.graphs": 78.4,
    "layer_latency_us.eager-cpp": 41.2,
    "layer_latency_us.neuron": 5.0,
    # Latency of one hop of a small all-reduce; two all-reduces per block, 2 log2(ranks) hops each. NCCL's LL
    # protocol on NVLink measures ~3-8 us per hop for small messages; the fit's ~16 us also carries the runtime's
    # synchronisation around each all-reduce. PCIe (no row measures it): the same runtime synchronisation plus a
    # slower link: nccl-tests report 42-54 us for an 8-byte all-reduce over 8 PCIe GPUs without NVLink (NVIDIA/nccl
    # issues #1530, RTX 4090, and #1439, RTX 3090), 7-9 us for each of this model's 2 log2(8) = 6 hops, so the NVLink
    # figure plus 8 us. NeuronLink also serves the two NeuronCores of one Inferentia2/Trainium chip (TP 2 on one
    # chip: one hop, through the chip's memory).
    "collective_hop_us.nvlink": 16.4,
    "collective_hop_us.pcie": 24.4,
    "collective_hop_us.neuronlink": 4.38,
    # Per decode step the devices wait for scheduling, sampling and output processing; per sequence a little more.
    # "overlapped": runtimes whose CPU work runs while the GPU computes the next step (TensorRT-LLM's C++ executor,
    # vLLM V1's separate engine-core process: vLLM blog "vLLM V1", 2025-01-27), so only a residue is exposed;
    # FasterTransformer's C++ loop shares it. "vllm-v0": vLLM 0.4-0.6, whose Python scheduler, sampler and detokenizer
    # ran between GPU steps (the vLLM 0.6.0 release notes and Lambda's benchmark report GPU busy ~60 % on 8B).
    "step_ms.overlapped": 0.001,
    "step_ms.vllm-v0": 0.554,
    "step_ms.neuronx": 0.5,
    "sequence_us.overlapped": 0.001,
    "sequence_us.vllm-v0": 111.0,
    "sequence_us.neuronx": 20.0,
    # TGI 1.0's Python dispatch: CPU time per block (the GPU cannot run faster) and per request per step.
    "host_us_per_layer.tgi-1.0": 457.0,
    "host_us_per_sequence.tgi-1.0": 520.0,
}
FITTED: tuple[str, ...] = (
    "bandwidth_efficiency.hbm",
    "bandwidth_efficiency.gddr",
    "bandwidth_efficiency.neuron",
    "gemm_efficiency.nvidia",
    "gemm_efficiency.nvidia-fp8",
    "attention_floor_tokens",
    "attention_bandwidth_ratio",
    "neuron_attention_ns_per_head_token",
    "layer_latency_us.graphs",
    "layer_latency_us.eager-cpp",
    "layer_latency_us.neuron",
    "collective_hop_us.nvlink",
    "collective_hop_us.neuronlink",
    "step_ms.overlapped",
    "step_ms.vllm-v0",
    "sequence_us.overlapped",
    "sequence_us.vllm-v0",
    "host_us_per_layer.tgi-1.0",
    "host_us_per_sequence.tgi-1.0",
)
"""Constants calibration.fit() moves. Not fitted (no row measures them): gemm_efficiency.neuron (no Neuron prefill
row; the NVIDIA figure), collective_hop_us.pcie (no multi-GPU PCIe row; the NVLink hop plus nccl-tests' PCIe per-hop latency),
step_ms.neuronx and sequence_us.neuronx (absorbed into layer_latency_us.neuron at batch 1)."""


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


# --- the step model, on plain floats (the calibration calls it thousands of times) ---------------------------------


@dataclass(frozen=True)
class StepInputs:
    """Everything the step model needs about one (model, instance, devices, runtime), as plain numbers."""

    layers: int
    hidden_size: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    weight_bytes: float
    shared_weight_bytes: float
    """Bytes every token reads (all of a dense model; attention, embeddings, shared experts of an MoE)."""
    expert_bytes_per_layer: float
    """One routed expert of one MoE layer, bytes (0 for a dense model)."""
    experts: int
    experts_per_token: int
    active_parameters: float
    kv_bytes_per_token: float
    devices: int
    ranks: int
    bandwidth_bytes_s: float
    """Peak memory bandwidth of one device."""
    peak_flops: float
    """Dense tensor peak of one device at the weights' precision."""
    interconnect_bytes_s: float
    family: str
    interconnect: str
    runtime: RuntimeProfile
    float8: bool = False
    """Weights and GEMMs in FP8 (on a device with an FP8 peak)."""


def _interconnect_kind(name: str) -> str:
    for prefix, kind in INTERCONNECT_KIND.items():
        if name.startswith(prefix):
            return kind
    return "pcie"


def _peak_tflops(instance: InstanceType, precision: Precision) -> float:
    accelerator = instance.accelerator
    if precision.is_float8 and accelerator.dense_fp8_tflops:
        return accelerator.dense_fp8_tflops
    return accelerator.dense_bf16_tflops


def step_inputs(model: ModelShape, instance: InstanceType, devices: int, runtime: RuntimeProfile) -> StepInputs:
    accelerator = instance.accelerator
    bytes_per_parameter = model.precision.bytes_per_parameter
    experts = model.experts or 1
    chosen = model.experts_per_token or 1
    expert_bytes = model.expert_parameters_billion * 1e9 * bytes_per_parameter / model.layers
    return StepInputs(
        layers=model.layers,
        hidden_size=model.hidden_size,
        attention_heads=model.attention_heads,
        kv_heads=model.kv_heads,
        head_dim=model.head_dim,
        weight_bytes=model.weight_bytes,
        shared_weight_bytes=model.shared_parameters_billion * 1e9 * bytes_per_parameter,
        expert_bytes_per_layer=expert_bytes if model.is_moe else 0.0,
        experts=experts,
        experts_per_token=chosen,
        active_parameters=model.decode_parameters_billion * 1e9,
        kv_bytes_per_token=model.kv_bytes_per_token,
        devices=devices,
        ranks=tensor_parallel_ranks(instance, devices),
        bandwidth_bytes_s=accelerator.memory_bandwidth_gb_s * 1e9,
        peak_flops=_peak_tflops(instance, model.precision) * 1e12,
        interconnect_bytes_s=accelerator.interconnect_gb_s * 1e9,
        family=ACCELERATOR_FAMILY.get(accelerator.name, "hbm"),
        interconnect=_interconnect_kind(accelerator.interconnect),
        runtime=runtime,
        float8=model.precision.is_float8 and bool(accelerator.dense_fp8_tflops),
    )


def distinct_experts(experts: int, experts_per_token: int, tokens: float) -> float:
    """Expected distinct experts one MoE layer runs when ``tokens`` tokens each pick ``experts_per_token`` of
    ``experts`` uniformly: E x (1 - (1 - k/E)^b). 1 token: k experts; many tokens: all E."""
    return float(experts * (1.0 - (1.0 - experts_per_token / experts) ** tokens))


def weight_bytes_read(inputs: StepInputs, tokens: float) -> float:
    """Bytes of weights one forward pass over ``tokens`` tokens reads, all devices together."""
    if inputs.expert_bytes_per_layer == 0.0:
        return inputs.weight_bytes
    routed = distinct_experts(inputs.experts, inputs.experts_per_token, tokens)
    return inputs.shared_weight_bytes + routed * inputs.expert_bytes_per_layer * inputs.layers


def _allreduce_ms(inputs: StepInputs, payload_bytes: float, constants: Mapping[str, float]) -> float:
    """Two all-reduces per block (after attention and after the MLP), over every block."""
    ranks = inputs.ranks
    if ranks <= 1:
        return 0.0
    hop_us = constants[f"collective_hop_us.{inputs.interconnect}"]
    latency_us = 2 * math.log2(ranks) * hop_us
    link = inputs.interconnect_bytes_s
    if inputs.devices == 1:
        # The ranks are the NeuronCores of one chip: they exchange through the chip's own memory, not the link.
        link = inputs.bandwidth_bytes_s
    transfer_us = 2 * (ranks - 1) / ranks * payload_bytes / link * 1e6
    return 2 * inputs.layers * (latency_us + transfer_us) / 1e3


def _attention_ms(inputs: StepInputs, batch: float, context: float, constants: Mapping[str, float]) -> float:
    """Decode attention of ``batch`` sequences holding ``context`` tokens each."""
    bandwidth = (  # one device
        inputs.bandwidth_bytes_s
        * constants[f"bandwidth_efficiency.{inputs.family}"]
        * constants["attention_bandwidth_ratio"]
    )
    # KV heads shard across ranks (replicated past them); a device holding several ranks (the two NeuronCores of a
    # chip) reads every one of its ranks' shards.
    kv_total = batch * (context + constants["attention_floor_tokens"]) * inputs.kv_bytes_per_token
    per_device = kv_total / min(inputs.ranks, inputs.kv_heads) * (inputs.ranks / inputs.devices)
    kv_ms = per_device / bandwidth * 1e3
    if inputs.family != "neuron":
        return kv_ms
    heads_per_core = math.ceil(inputs.attention_heads / inputs.ranks)
    engine_ms = inputs.layers * heads_per_core * batch * context * constants["neuron_attention_ns_per_head_token"] / 1e6
    return kv_ms + engine_ms


def prefill_ms(inputs: StepInputs, prompt_tokens: float, constants: Mapping[str, float], prompts: float = 1.0) -> float:
    """``prompts`` prompts batched into one pass: GEMMs and attention compute bound, the weights touched read once."""
    devices = inputs.devices
    flops_s = inputs.peak_flops * devices * _gemm_efficiency(inputs, constants)
    tokens = prompts * prompt_tokens
    # 2 FLOPs per active weight per token; causal attention adds 2·layers·P²·heads·head_dim per prompt (QK and AV,
    # halved by the causal mask).
    gemm_flops = 2 * inputs.active_parameters * tokens
    attention_flops = prompts * 2 * inputs.layers * prompt_tokens**2 * inputs.attention_heads * inputs.head_dim
    compute = (gemm_flops + attention_flops) / flops_s * 1e3
    bandwidth = inputs.bandwidth_bytes_s * devices * constants[f"bandwidth_efficiency.{inputs.family}"]
    weights = weight_bytes_read(inputs, tokens) / bandwidth * 1e3
    fixed = inputs.layers * constants[f"layer_latency_us.{inputs.runtime.layer_latency_key}"] / 1e3
    comm = _allreduce_ms(inputs, tokens * inputs.hidden_size * ACTIVATION_BYTES, constants)
    return max(compute, weights) + fixed + comm


def _gemm_efficiency(inputs: StepInputs, constants: Mapping[str, float]) -> float:
    if inputs.family == "neuron":
        return float(constants["gemm_efficiency.neuron"])
    return float(constants["gemm_efficiency.nvidia-fp8" if inputs.float8 else "gemm_efficiency.nvidia"])


def decode_terms(
    inputs: StepInputs,
    batch: float,
    prompt_tokens: float,
    output_tokens: float,
    constants: Mapping[str, float] = CALIBRATED,
) -> dict[str, float]:
    """One steady-state decode step of ``batch`` sequences, broken into terms (ms); "tpot" is their total.

    Average context while decoding is the prompt plus half the output. In steady state batch/output sequences finish
    per step and are replaced: their prompts are prefilled on the same devices ("prefill_interleave")."""
    runtime = inputs.runtime
    context = prompt_tokens + output_tokens / 2
    devices = inputs.devices
    bandwidth = inputs.bandwidth_bytes_s * devices * constants[f"bandwidth_efficiency.{inputs.family}"]
    flops_s = inputs.peak_flops * devices * _gemm_efficiency(inputs, constants)
    new_prompts = batch / output_tokens
    folded_tokens = new_prompts * prompt_tokens if runtime.folds_prefill_into_decode else 0.0
    weights = weight_bytes_read(inputs, batch + folded_tokens) / bandwidth * 1e3
    gemm = 2 * inputs.active_parameters * (batch + folded_tokens) / flops_s * 1e3
    kv = _attention_ms(inputs, batch, context, constants)
    fixed = inputs.layers * constants[f"layer_latency_us.{runtime.layer_latency_key}"] / 1e3
    comm = _allreduce_ms(inputs, batch * inputs.hidden_size * ACTIVATION_BYTES, constants)
    host_floor = 0.0
    host_sequences = 0.0
    if runtime.host_floor_key:
        host_floor = inputs.layers * constants[f"host_us_per_layer.{runtime.host_floor_key}"] / 1e3
        host_sequences = batch * constants[f"host_us_per_sequence.{runtime.host_floor_key}"] / 1e3
    step_overhead = (
        constants[f"step_ms.{runtime.step_key}"] + batch * constants[f"sequence_us.{runtime.step_key}"] / 1e3
    ) / runtime.scheduler_steps
    gpu = max(weights, gemm) + kv + fixed + comm
    step = max(gpu, host_floor) + step_overhead + host_sequences
    if runtime.folds_prefill_into_decode:
        # The new prompts' GEMM tokens are already in "gemm"; their causal attention is not.
        attention_flops = 2 * inputs.layers * prompt_tokens**2 * inputs.attention_heads * inputs.head_dim
        interleave = new_prompts * attention_flops / flops_s * 1e3
    else:
        # Separate prefill passes: below one new prompt per step, a fraction of the steps pays one prompt's pass;
        # above it, the step's new prompts are batched into one pass that reads the weights once.
        if new_prompts < 1:
            interleave = new_prompts * prefill_ms(inputs, prompt_tokens, constants)
        else:
            interleave = prefill_ms(inputs, prompt_tokens, constants, prompts=new_prompts)
    return {
        "weights": weights,
        "gemm_compute": gemm,
        "kv_cache": kv,
        "kernel_gaps": fixed,
        "tensor_parallel": comm,
        "host_floor": host_floor,
        "step_overhead": step_overhead + host_sequences,
        "step": step,
        "prefill_interleave": interleave,
        "tpot": step + interleave,
    }


def roofline_ms(inputs: StepInputs, batch: float, context: float) -> float:
    """The physical floor: the bytes a step must move at peak bandwidth, or its FLOPs at peak compute."""
    bytes_moved = weight_bytes_read(inputs, batch) + batch * context * inputs.kv_bytes_per_token
    memory = bytes_moved / (inputs.bandwidth_bytes_s * inputs.devices) * 1e3
    compute = 2 * inputs.active_parameters * batch / (inputs.peak_flops * inputs.devices) * 1e3
    return max(memory, compute)


def predict_tpot_ms(
    inputs: StepInputs, batch: float, prompt_tokens: float, output_tokens: float, constants: Mapping[str, float]
) -> float:
    """TPOT at ``batch`` sequences: the step model, never under the roofline."""
    terms = decode_terms(inputs, batch, prompt_tokens, output_tokens, constants)
    return max(terms["tpot"], roofline_ms(inputs, batch, prompt_tokens + output_tokens / 2))


def predict_ttft_ms(inputs: StepInputs, prompt_tokens: float, constants: Mapping[str, float]) -> float:
    """Time to first token unloaded: one prefill plus one step's scheduling overhead."""
    return prefill_ms(inputs, prompt_tokens, constants) + constants[f"step_ms.{inputs.runtime.step_key}"]


def roofline_tpot_ms(
    model: ModelShape, instance: InstanceType, devices: int, batch: int, context_tokens: float
) -> float:
    """The physical floor for ``model`` (kept for callers that hold a model, not StepInputs)."""
    return roofline_ms(step_inputs(model, instance, devices, RUNTIMES[DEFAULT_RUNTIME]), batch, context_tokens)


def _whole(name: str, value: object, example: str) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return f"{name} ({value!r}) must be a positive whole number, e.g. {example}"
    return None


def _argument_problems(
    model: object,
    instance_type: object,
    devices: object,
    concurrency: object,
    prompt_tokens: object,
    output_tokens: object,
    runtime: object,
) -> list[str]:
    """Every problem with estimate()'s arguments, each naming the argument, the value and the fix."""
    problems = []
    if not isinstance(model, ModelShape):
        problems.append(
            f"model ({model!r}) must be a ModelShape, not a {type(model).__name__}: e.g. "
            "ModelShape.preset('llama-3.1-8b') or ModelShape.from_hf_config('config.json')"
        )
    instance: InstanceType | None = None
    if isinstance(instance_type, InstanceType):
        instance = instance_type
    elif isinstance(instance_type, str):
        try:
            instance = load_catalog().instance(instance_type)
        except GenaiConstructsError as error:
            problems.append(str(error))
    else:
        problems.append(f"instance_type ({instance_type!r}) must be an EC2 instance type name, e.g. 'g6e.xlarge'")
    for name, value, example in (
        ("concurrency", concurrency, "16"),
        ("prompt_tokens", prompt_tokens, "1024"),
        ("output_tokens", output_tokens, "256"),
    ):
        problem = _whole(name, value, example)
        if problem:
            problems.append(problem)
    if not isinstance(runtime, str) or runtime not in RUNTIMES:
        problems.append(f"runtime ({runtime!r}) is not one of {', '.join(RUNTIMES)}")
    if devices is not None and instance is not None:
        count = instance.accelerator_count
        problem = _whole("devices", devices, "1")
        if problem:
            problems.append(problem)
        elif not isinstance(devices, int) or not 1 <= devices <= count or count % devices:
            allowed = [d for d in range(1, count + 1) if count % d == 0]
            problems.append(
                f"devices ({devices}) must divide {instance.instance_type}'s {count} accelerator devices (replicas "
                f"tile the instance in equal groups): use one of {', '.join(map(str, allowed))}"
            )
        elif isinstance(model, ModelShape) and not instance.is_neuron and devices > 1:
            # vLLM shards attention heads evenly over the ranks ("Total number of attention heads must be divisible
            # by tensor parallel size": ModelConfig.verify_with_parallel_config). transformers-neuronx pads heads, so
            # Neuron ranks need not divide them (the published TP 24 rows of 32-head models run).
            if model.attention_heads % devices:
                valid = [d for d in valid_device_counts(model, instance)]
                problems.append(
                    f"devices ({devices}): {model.name}'s {model.attention_heads} attention heads do not divide "
                    f"{devices} tensor-parallel ranks, which vLLM refuses: use one of {', '.join(map(str, valid))}"
                )
    return problems


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
    that does not fit raises ``ModelDoesNotFitError`` naming the memory needed and available. When the weights fit
    but the KV cache of ``concurrency`` sequences does not, the runtime runs (and the estimate predicts) only the
    sequences that fit; ``kv_cache_overflows`` and ``warnings`` say so.
    """
    problems = _argument_problems(model, instance_type, devices, concurrency, prompt_tokens, output_tokens, runtime)
    if problems:
        raise GenaiConstructsError("estimate: " + "; ".join(problems))
    instance = instance_type if isinstance(instance_type, InstanceType) else load_catalog().instance(instance_type)
    if devices is None:
        devices = instance.accelerator_count
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

    warnings: list[str] = []
    running = concurrency
    overflows = model.kind == "decoder" and 0 < memory.max_concurrency < concurrency
    if overflows:
        # The runtime admits what its KV cache holds and preempts (recomputes) or queues the rest: the sequences
        # in flight, and so the speed, are those that fit.
        running = memory.max_concurrency
        warnings.append(
            f"KV cache overflow: {concurrency} sequences of {sequence_tokens} tokens need {memory.kv_cache_gib:.2f} GiB "
            f"of KV cache, but {memory.kv_cache_gib + memory.free_gib:.2f} GiB is left after weights and overhead: "
            f"{memory.max_concurrency} sequences fit, so the runtime runs {memory.max_concurrency} at once and the rest "
            "wait (or are preempted and recomputed); TPOT and throughput are for the sequences that fit. Lower the "
            "concurrency, shorten the sequences, or add devices"
        )
    elif model.kind == "decoder" and memory.max_concurrency == 0:
        warnings.append(
            f"the weights ({memory.weights_gib:.1f} GiB) and runtime overhead ({memory.runtime_overhead_gib:.1f} GiB) "
            f"leave no memory for KV cache on {devices} device(s) of {instance.instance_type}: the server cannot start"
        )

    inputs = step_inputs(model, instance, devices, profile)
    context = prompt_tokens + output_tokens / 2
    terms = decode_terms(inputs, running, prompt_tokens, output_tokens)
    prefill = prefill_ms(inputs, prompt_tokens, CALIBRATED)
    roofline = roofline_ms(inputs, running, context)
    tpot = max(terms["tpot"], roofline)
    bound: Literal["memory-bandwidth", "compute"] = (
        "compute" if terms["gemm_compute"] > terms["weights"] + terms["kv_cache"] else "memory-bandwidth"
    )
    terms.pop("tpot")
    return Estimate(
        model_name=model.name,
        instance_type=instance.instance_type,
        runtime=profile.name,
        devices=devices,
        concurrency=concurrency,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        tpot_ms=round(tpot, 3),
        ttft_ms=round(predict_ttft_ms(inputs, prompt_tokens, CALIBRATED), 3),
        output_tokens_per_s=round(running * 1000.0 / tpot, 2),
        decode_step_ms=round(terms["step"], 3),
        prefill_ms=round(prefill, 3),
        roofline_tpot_ms=round(roofline, 3),
        bound=bound,
        memory=memory,
        fits=fits,
        terms_ms={k: round(v, 4) for k, v in terms.items()},
        kv_cache_overflows=overflows,
        sequences_running=running,
        warnings=warnings,
    )
