"""Model-server settings derived from the plan, checked against the rules vLLM applies when it starts.

The fleet starts vLLM (the AWS vLLM DLC ``vllm:0.13-gpu-py312-ec2``, vLLM 0.13.0) with flags taken from the plan. Left
to itself vLLM takes the model's own maximum length as ``--max-model-len`` (131,072 tokens for Llama 3.1 8B: 16 GiB of
KV cache for one sequence) and refuses to start when one such sequence does not fit the KV cache it has left. So the
settings here are derived from the plan's inputs, and ``startup_problems`` re-applies, before any CDK, every start-up
check of vLLM 0.13 that the plan can decide (source: the vllm 0.13.0 wheel, commit 72506c983):

1. KV cache for one request at ``max_model_len`` fits what is left: ``vllm/v1/core/kv_cache_utils.py``
   ``check_enough_kv_cache_memory``, with the need from ``max_memory_usage_bytes`` summing, over the layers of a rank,
   ``FullAttentionSpec.max_memory_usage_bytes`` = ceil(max_model_len / block_size) x ``AttentionSpec.page_size_bytes``
   (2 x block_size x kv heads per rank x head size x dtype bytes) in ``vllm/v1/kv_cache_interface.py``. KV heads per
   rank are max(1, kv_heads // tensor_parallel_size) (``ModelConfig.get_num_kv_heads``, ``vllm/config/model.py``). What
   is left is total x gpu_memory_utilization - weights - measured activation peak and non-torch memory
   (``Worker.determine_available_memory``, ``vllm/v1/worker/gpu_worker.py``); here it is the estimator's
   ``memory_breakdown`` figure, less ``STARTUP_MEMORY_MARGIN_GIB_PER_RANK``.
2. Some memory is left at all (same function: "No available memory for the cache blocks").
3. ``max_model_len`` is at most the model's derived maximum (``_get_and_verify_max_len``, ``vllm/config/model.py``;
   only ``VLLM_ALLOW_LONG_MAX_MODEL_LEN=1`` overrides it).
4. ``max_num_seqs`` is at most ``max_num_batched_tokens`` (``SchedulerConfig.verify_max_model_len``,
   ``vllm/config/scheduler.py``), whose OpenAI-server default depends on the GPU (``EngineArgs.get_batch_defaults``,
   ``vllm/engine/arg_utils.py``).
5. Attention heads divide by the tensor-parallel size (``ModelConfig.verify_with_parallel_config``).
6. fp8 weights need compute capability 8.0 (``Fp8Config.get_min_capability``, checked in
   ``VllmConfig._get_quantization_config``, ``vllm/config/vllm.py``). A bf16 checkpoint on a T4 is not refused: with
   ``--dtype auto`` (the fleet passes no ``--dtype``) ``_resolve_auto_dtype`` falls back to float16;
   ``CudaPlatform.check_if_supports_dtype`` refuses only an explicit ``--dtype bfloat16``.
7. ``gpu_memory_utilization`` lies in (0, 1] (``CacheConfig``, ``vllm/config/cache.py``).
8. The CPU swap space, 4 GiB per rank by default, stays under 70 % of host memory
   (``CacheConfig.verify_with_parallel_config``).

Rule 6 is a CUDA-platform rule and, with rule 5, is applied to GPU instances only (the Neuron plugin's own checks are
not modelled). Pure Python; never imports aws_cdk.
"""

from __future__ import annotations

import math

from genai_constructs.errors import ServerStartupError
from genai_constructs.planner.catalog import InstanceType
from genai_constructs.planner.estimate import GIB, RUNTIMES, RuntimeProfile, memory_breakdown, tensor_parallel_ranks
from genai_constructs.planner.plans import ServerSettings
from genai_constructs.workload import ModelShape, Precision, RealtimeTraffic

VLLM_VERSION = "0.13.0"
"""The vLLM release these rules were read from: the one in the fleet's default image (vllm:0.13-gpu-py312-ec2)."""
VLLM_BLOCK_SIZE = 16
"""KV cache block size when none is given: ``CudaPlatform.check_and_update_config`` sets 16 (vLLM 0.13)."""
VLLM_LARGE_GPU_MIN_GIB = 70.0
"""``EngineArgs.get_batch_defaults``: a device of at least 70 GiB (other than an A100) gets the larger batch defaults."""
VLLM_MAX_NUM_BATCHED_TOKENS_LARGE_GPU = 8192
"""OpenAI-server default ``max_num_batched_tokens`` on H100/H200/B200-class devices (vLLM 0.13)."""
VLLM_MAX_NUM_BATCHED_TOKENS_DEFAULT = 2048
"""OpenAI-server default ``max_num_batched_tokens`` on every other GPU, A100 80GB included (vLLM PR #17885)."""
VLLM_SWAP_SPACE_GIB_PER_RANK = 4.0
"""``CacheConfig.swap_space`` default: CPU memory reserved per rank for swapped-out KV blocks."""
VLLM_SWAP_MAX_HOST_FRACTION = 0.7
"""``CacheConfig.verify_with_parallel_config`` refuses swap space above 70 % of host memory."""
VLLM_MIN_CAPABILITY_FP8 = 8.0
"""``Fp8Config.get_min_capability`` returns 80: fp8 weights (Marlin on Ampere, native on Ada/Hopper) need 8.0."""
COMPUTE_CAPABILITY: dict[str, float] = {
    "T4": 7.5,
    "A10G": 8.6,
    "L4": 8.9,
    "L40S": 8.9,
    "A100-40GB": 8.0,
    "A100-80GB": 8.0,
    "H100": 9.0,
    "H200": 9.0,
    "B200": 10.0,
}
"""CUDA compute capability of each catalog GPU (NVIDIA's CUDA GPUs table, developer.nvidia.com/cuda-gpus)."""
STARTUP_MEMORY_MARGIN_GIB_PER_RANK = 0.15
"""KV memory per rank the check keeps unclaimed. vLLM does not assume its overhead, it measures it: the activation
peak of a profile run at max_num_batched_tokens plus non-torch allocations. Published start-up logs for 8B models show
1.26 GiB of activation peak at 8,192 batched tokens (vllm PR #10511, Llama-3-8B) and 0.20-0.35 GiB of non-torch memory
(vllm PR #14447, issue #10517): about 1.6 GiB per rank, which the estimator now assumes (its vLLM profile's 1.65 GiB per
rank). The margin covers what still varies: rounding to whole KV blocks and the spread between vLLM versions and
models (the non-torch figure alone spans 0.15 GiB in those reports), so a plan that passes here is not refused by vLLM
for want of KV cache."""


def default_max_num_batched_tokens(instance: InstanceType) -> int:
    """vLLM 0.13's OpenAI-server ``max_num_batched_tokens`` when none is given, for this instance's devices."""
    accelerator = instance.accelerator
    large = accelerator.memory_gib >= VLLM_LARGE_GPU_MIN_GIB and "a100" not in accelerator.name.lower()
    return (
        VLLM_MAX_NUM_BATCHED_TOKENS_LARGE_GPU
        if large and not accelerator.is_neuron
        else VLLM_MAX_NUM_BATCHED_TOKENS_DEFAULT
    )


def max_model_len_for(model: ModelShape, traffic: RealtimeTraffic) -> int:
    """The server's --max-model-len: max_request_tokens as given, or its default rule capped at max_context.

    An explicit max_request_tokens is kept as given, so one above max_context is reported by ``startup_problems``
    rather than silently shortened.
    """
    if traffic.max_request_tokens is not None:
        return traffic.max_request_tokens
    return min(traffic.request_tokens_limit, model.max_context)


def _kv_heads_per_rank(model: ModelShape, ranks: int) -> int:
    return max(1, model.kv_heads // ranks)


def _page_bytes_all_layers(model: ModelShape, ranks: int, block_size: int) -> float:
    """One KV block of every layer on one rank (vLLM allocates a block across all layers of its group)."""
    page = (
        2 * block_size * _kv_heads_per_rank(model, ranks) * model.head_dim * model.precision.kv_cache_bytes_per_element
    )
    return page * model.layers


def kv_gib_one_request(model: ModelShape, ranks: int, tokens: int, block_size: int = VLLM_BLOCK_SIZE) -> float:
    """KV cache one ``tokens``-long request holds on the whole replica: whole blocks, every layer, every rank."""
    blocks = math.ceil(tokens / block_size)
    return blocks * _page_bytes_all_layers(model, ranks, block_size) * ranks / GIB


def derive_server_settings(
    model: ModelShape,
    traffic: RealtimeTraffic,
    instance: InstanceType,
    *,
    devices: int,
    max_num_seqs: int,
    runtime: str = "vllm",
) -> ServerSettings:
    """The server settings for ``model`` on ``devices`` devices of ``instance`` serving ``traffic``.

    ``gpu_memory_utilization`` is the runtime profile's ``memory_utilization`` and the KV memory available is what
    ``memory_breakdown`` leaves, so the settings and the estimate describe the same memory.
    """
    profile: RuntimeProfile = RUNTIMES[runtime]
    ranks = tensor_parallel_ranks(instance, devices)
    max_model_len = max_model_len_for(model, traffic)
    room = memory_breakdown(model, instance, devices, 0, 1, profile).free_gib
    reserved = STARTUP_MEMORY_MARGIN_GIB_PER_RANK * ranks
    one_request = kv_gib_one_request(model, ranks, max_model_len)
    per_block = _page_bytes_all_layers(model, ranks, VLLM_BLOCK_SIZE) / GIB
    # vLLM: num_blocks = available // page // layers per rank; a request needs ceil(max_model_len / block) blocks.
    blocks = max(0, math.floor((room - reserved) / ranks / per_block)) if room > reserved else 0
    concurrent = blocks // math.ceil(max_model_len / VLLM_BLOCK_SIZE)
    return ServerSettings(
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        gpu_memory_utilization=profile.memory_utilization,
        tensor_parallel_size=ranks,
        block_size=VLLM_BLOCK_SIZE,
        max_num_batched_tokens=default_max_num_batched_tokens(instance),
        kv_cache_dtype="fp8" if model.precision is Precision.FP8 else "auto",
        kv_cache_gib_available=round(room, 3),
        kv_cache_gib_reserved=round(reserved, 3),
        kv_cache_gib_one_max_request=round(one_request, 3),
        max_concurrent_max_requests=concurrent,
    )


def longest_request_that_fits(model: ModelShape, settings: ServerSettings) -> int:
    """The largest max_model_len (whole blocks) whose one-request KV cache fits what the check allows."""
    ranks = settings.tensor_parallel_size
    room = settings.kv_cache_gib_available - settings.kv_cache_gib_reserved
    if room <= 0:
        return 0
    per_block = _page_bytes_all_layers(model, ranks, settings.block_size) * ranks / GIB
    return math.floor(room / per_block) * settings.block_size


def startup_findings(settings: ServerSettings, model: ModelShape, instance: InstanceType) -> list[tuple[str, str]]:
    """Every reason vLLM 0.13 would refuse to start with ``settings``, as (short label, sentence with its numbers
    and the fix); empty when it starts. See the module docstring for the rule behind each."""
    found: list[tuple[str, str]] = []
    where = f"{model.name} ({model.precision.value}) on {instance.instance_type} at tensor parallel {settings.tensor_parallel_size}"
    available = settings.kv_cache_gib_available
    usable = available - settings.kv_cache_gib_reserved
    if available <= 0:
        found.append(
            (
                f"no KV cache memory left ({available:.2f} GiB)",
                f"{where}: no memory is left for the KV cache ({available:.2f} GiB after "
                f"{model.weight_bytes / GIB:.1f} GiB of weights and runtime overhead at gpu_memory_utilization "
                f"{settings.gpu_memory_utilization:g}), and vLLM refuses to start: choose a larger instance, more tensor "
                "parallelism, or a narrower precision",
            )
        )
    elif settings.kv_cache_gib_one_max_request > usable:
        fits = longest_request_that_fits(model, settings)
        shorter = f"lower max_request_tokens to {fits:,} tokens or fewer" if fits > 0 else "no request length fits"
        found.append(
            (
                f"one {settings.max_model_len:,}-token request needs {settings.kv_cache_gib_one_max_request:.2f} GiB of KV "
                f"cache, {usable:.2f} GiB usable",
                f"{where}: one {settings.max_model_len:,}-token request (max_model_len) needs "
                f"{settings.kv_cache_gib_one_max_request:.2f} GiB of KV cache, but only {usable:.2f} GiB can be "
                f"counted on ({available:.2f} GiB left after weights and overhead, less {settings.kv_cache_gib_reserved:.2f} "
                f"GiB kept for vLLM's measured overhead), and vLLM refuses to start: {shorter}, choose an instance with "
                "more accelerator memory, or more tensor parallelism",
            )
        )
    if settings.max_model_len > model.max_context:
        found.append(
            (
                f"max_model_len {settings.max_model_len:,} above max_context {model.max_context:,}",
                f"{where}: max_model_len ({settings.max_model_len:,}) exceeds {model.name}'s max_context "
                f"({model.max_context:,}), which vLLM refuses unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (positions past it "
                f"give NaNs): lower max_request_tokens to {model.max_context:,} or fewer",
            )
        )
    if settings.max_num_seqs > settings.max_num_batched_tokens:
        found.append(
            (
                f"max_num_seqs {settings.max_num_seqs:,} above max_num_batched_tokens {settings.max_num_batched_tokens:,}",
                f"{where}: max_num_seqs ({settings.max_num_seqs:,}) exceeds max_num_batched_tokens "
                f"({settings.max_num_batched_tokens:,}, vLLM {VLLM_VERSION}'s default on {instance.accelerator.name}), "
                "which vLLM refuses: lower the per-instance concurrency (a stricter latency target or more headroom) or "
                "use more, smaller instances",
            )
        )
    if not 0 < settings.gpu_memory_utilization <= 1:
        found.append(
            (
                f"gpu_memory_utilization {settings.gpu_memory_utilization} outside (0, 1]",
                f"{where}: gpu_memory_utilization ({settings.gpu_memory_utilization}) must be in (0, 1]: use the runtime "
                "profile's memory_utilization (vLLM's default is 0.9)",
            )
        )
    swap = VLLM_SWAP_SPACE_GIB_PER_RANK * settings.tensor_parallel_size
    if swap > VLLM_SWAP_MAX_HOST_FRACTION * instance.memory_gib:
        found.append(
            (
                f"{swap:.0f} GiB of swap space over {VLLM_SWAP_MAX_HOST_FRACTION:.0%} of host memory",
                f"{where}: vLLM reserves {swap:.0f} GiB of CPU swap space ({VLLM_SWAP_SPACE_GIB_PER_RANK:g} GiB per rank), "
                f"over {VLLM_SWAP_MAX_HOST_FRACTION:.0%} of the instance's {instance.memory_gib:g} GiB, and refuses to "
                "start: choose an instance with more host memory or pass a smaller --swap-space",
            )
        )
    if not instance.is_neuron:
        if model.attention_heads % settings.tensor_parallel_size:
            found.append(
                (
                    f"{model.attention_heads} heads not divisible by tensor parallel {settings.tensor_parallel_size}",
                    f"{where}: {model.attention_heads} attention heads do not divide by tensor_parallel_size "
                    f"{settings.tensor_parallel_size}, which vLLM refuses: use a tensor-parallel degree that divides "
                    f"{model.attention_heads}",
                )
            )
        capability = COMPUTE_CAPABILITY.get(instance.accelerator.name)
        if capability is not None:
            if model.precision is Precision.FP8 and capability < VLLM_MIN_CAPABILITY_FP8:
                found.append(
                    (
                        f"fp8 weights on compute capability {capability:g}",
                        f"{where}: fp8 weights need compute capability {VLLM_MIN_CAPABILITY_FP8:g}, "
                        f"{instance.accelerator.name} has {capability:g}, and vLLM refuses to start: use int8/int4 "
                        "weights or an Ampere or newer GPU",
                    )
                )
    return found


def startup_problems(settings: ServerSettings, model: ModelShape, instance: InstanceType) -> list[str]:
    """Every reason vLLM 0.13 would refuse to start with ``settings``, each a sentence with its numbers and the fix
    (empty: it starts)."""
    return [sentence for _, sentence in startup_findings(settings, model, instance)]


def check_server_settings(settings: ServerSettings, model: ModelShape, instance: InstanceType) -> None:
    """Raise ``ServerStartupError`` listing every start-up check of vLLM 0.13 that ``settings`` would fail."""
    problems = startup_problems(settings, model, instance)
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise ServerStartupError(
            f"vLLM {VLLM_VERSION} would refuse to start with these server settings ({len(problems)} problem(s)):\n{lines}"
        )
