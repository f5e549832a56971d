"""An independent reimplementation of the start-up checks vLLM 0.13 applies, for testing the planner's settings.

Written from the vLLM 0.13.0 source (the ``vllm-0.13.0`` wheel on PyPI, ``vllm/_version.py`` commit ``72506c983``),
not from ``genai_constructs``: it imports nothing from the library, and it takes the server's command line as argv
strings, the way the instance's user data hands it to vLLM. Each rule, where it lives in vLLM 0.13.0:

* KV cache for one request at max_model_len must fit: ``vllm/v1/core/kv_cache_utils.py``
  ``check_enough_kv_cache_memory`` raises when ``max_memory_usage_bytes`` (the sum over the rank's attention layers of
  ``KVCacheSpec.max_memory_usage_bytes``) exceeds the available memory. For a full-attention layer
  ``vllm/v1/kv_cache_interface.py`` ``FullAttentionSpec.max_memory_usage_bytes`` is
  ``cdiv(max_model_len, block_size) * page_size_bytes`` and ``AttentionSpec.page_size_bytes`` is
  ``2 * block_size * num_kv_heads * head_size * dtype_size``. ``get_kv_cache_configs`` runs the check once per worker,
  so it holds per tensor-parallel rank.
* KV heads per rank: ``vllm/config/model.py`` ``ModelConfig.get_num_kv_heads`` = ``max(1, total_kv_heads // tp)``
  (replicated when there are fewer KV heads than ranks).
* Available memory: ``vllm/v1/worker/gpu_worker.py`` ``Worker.init_device`` sets ``requested_memory = total_memory *
  gpu_memory_utilization`` and ``Worker.determine_available_memory`` returns ``requested_memory -
  non_kv_cache_memory``, where ``non_kv_cache_memory`` (``vllm/utils/mem_utils.py`` ``memory_profiling``) is weights +
  PyTorch activation peak of a profile run + non-torch memory growth. ``check_enough_kv_cache_memory`` also refuses
  ``available_memory <= 0`` ("No available memory for the cache blocks").
* max_model_len: ``vllm/config/model.py`` ``_get_and_verify_max_len`` uses the model's derived maximum when none is
  given, and raises for a larger one unless ``VLLM_ALLOW_LONG_MAX_MODEL_LEN`` is set. ``--max-model-len`` is parsed by
  ``vllm/engine/arg_utils.py`` ``human_readable_int`` ("8k" = 8,000, "8K" = 8,192).
* Scheduler: ``vllm/config/scheduler.py`` ``SchedulerConfig.verify_max_model_len`` raises when
  ``max_num_batched_tokens < max_num_seqs`` (and, with chunked prefill off, when it is below max_model_len; chunked
  prefill is on by default for generative models, ``EngineArgs._set_default_chunked_prefill_and_prefix_caching_args``).
  Unset, ``EngineArgs.get_batch_defaults`` gives the OpenAI server 8,192 batched tokens / 1,024 sequences on a device
  of at least 70 GiB whose name lacks "a100", else 2,048 / 256; ``_set_default_max_num_seqs_and_batched_tokens_args``
  then caps the default batched tokens at ``max_num_seqs * max_model_len``.
* Parallelism: ``ModelConfig.verify_with_parallel_config`` raises when attention heads do not divide by tp.
* ``vllm/config/cache.py``: ``CacheConfig.gpu_memory_utilization`` is ``Field(default=0.9, gt=0, le=1)``;
  ``block_size`` must be one of 1, 8, 16, 32, 64, 128, 256 (CUDA sets 16 when unset, ``vllm/platforms/cuda.py``
  ``check_and_update_config``); ``verify_with_parallel_config`` raises when ``swap_space`` (default 4 GiB) x tp exceeds
  70 % of host memory.
* ``vllm/platforms/cuda.py`` ``check_if_supports_dtype``: bfloat16 needs compute capability 8.0, but only an explicit
  ``--dtype bfloat16`` reaches it: with ``--dtype auto`` ``vllm/config/model.py`` ``_resolve_auto_dtype`` falls back
  to float16 on a GPU whose ``CudaPlatform.supported_dtypes`` lack bfloat16 (below 8.0).

The non-KV memory is an input (weights per rank plus the activation and non-torch overhead vLLM would measure); see
``NON_KV_OVERHEAD_GIB_PER_RANK`` for this test's own conservative figure and its sources.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

GIB = 1024**3

NON_KV_OVERHEAD_GIB_PER_RANK = 1.65
"""Activation peak + non-torch memory vLLM measures on a rank, besides the weights. Sources: vllm-project/vllm PR
#10511 (youkaichao, 2024-12-14, "Memory profiling results"): Meta-Llama-3-8B on an H100, PyTorch activation peak
1.26 GiB at 8,192 batched tokens and 256 sequences, the same at tp 2; vllm issue #10517 (2024-12-02): Llama-3.1-8B on
an RTX 3090, non_torch_memory 0.35 GiB. 1.26 + 0.35 = 1.61, rounded up. vLLM 0.13 takes its baseline snapshot after
NCCL is up (``Worker.init_device``), so the CUDA context is not in it."""
PROFILED_SAMPLER_ROWS = 256
"""The cited activation peak includes a sampler pass over 256 rows (max_num_seqs at the time)."""
SAMPLER_BYTES_PER_LOGIT = 8
"""Beyond those rows, ``GPUModelRunner._dummy_sampler_run`` adds a [rows, vocab] logits tensor and its probabilities,
fp32 each (4 + 4 bytes per vocabulary entry per row)."""
VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
VLLM_DEFAULT_BLOCK_SIZE = 16
VLLM_BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)
VLLM_DEFAULT_SWAP_SPACE_GIB = 4.0


@dataclass(frozen=True)
class Model:
    """What vLLM reads from config.json, and the checkpoint's activation dtype."""

    layers: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    """Bytes of the model's dtype (bf16/fp16: 2); the KV cache dtype under --kv-cache-dtype auto."""
    max_context: int
    """The derived maximum length (max_position_embeddings; llama3 rope scaling does not stretch it)."""
    vocabulary: int = 0
    dtype: str = "bfloat16"


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_gib: float
    """Total memory of one device, as torch.cuda.mem_get_info reports it."""
    count: int
    compute_capability: float
    host_memory_gib: float


def _human_readable_int(text: str) -> int:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", text.strip())
    if not match:
        return int(text)
    number, suffix = match.groups()
    if suffix.islower():
        decimal: int = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}[suffix]
        return int(float(number) * decimal)
    binary: int = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[suffix]
    return int(number) * binary


def parse_argv(argv: list[str]) -> dict[str, str]:
    """``--flag value`` and ``--flag=value`` pairs; flags without a value map to ``""``. Unknown flags are kept and
    ignored by the checks."""
    parsed: dict[str, str] = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        if token.startswith("--"):
            if "=" in token:
                name, value = token[2:].split("=", 1)
                parsed[name] = value
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                parsed[token[2:]] = argv[i + 1]
                i += 1
            else:
                parsed[token[2:]] = ""
        elif token == "-tp" and i + 1 < len(argv):
            parsed["tensor-parallel-size"] = argv[i + 1]
            i += 1
        i += 1
    return parsed


@dataclass(frozen=True)
class Resolved:
    """The settings vLLM would run with, after its defaults."""

    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float
    tensor_parallel_size: int
    block_size: int
    kv_bytes: int
    swap_space_gib: float
    dtype: str


def resolve(model: Model, gpu: Gpu, argv: list[str]) -> Resolved:
    """vLLM 0.13's values for the flags argv gives or leaves out (OpenAI API server usage context)."""
    args = parse_argv(argv)
    tp = int(args.get("tensor-parallel-size", "1"))
    max_model_len = _human_readable_int(args["max-model-len"]) if "max-model-len" in args else model.max_context
    large = gpu.memory_gib >= 70 and "a100" not in gpu.name.lower()
    default_batched, default_seqs = (8192, 1024) if large else (2048, 256)
    max_num_seqs = int(args["max-num-seqs"]) if "max-num-seqs" in args else default_seqs
    if "max-num-batched-tokens" in args:
        batched = _human_readable_int(args["max-num-batched-tokens"])
    else:
        batched = min(max_num_seqs * max_model_len, default_batched)
    if "max-num-seqs" not in args:
        max_num_seqs = min(max_num_seqs, batched)
    dtype = args.get("dtype", "auto")
    dtype = {"bf16": "bfloat16", "half": "float16", "fp16": "float16", "float": "float32"}.get(dtype, dtype)
    if dtype == "auto":
        dtype = "float16" if model.dtype == "bfloat16" and gpu.compute_capability < 8.0 else model.dtype
    kv_dtype = args.get("kv-cache-dtype", "auto")
    kv_bytes = model.dtype_bytes if kv_dtype == "auto" else 1
    return Resolved(
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=batched,
        gpu_memory_utilization=float(args.get("gpu-memory-utilization", VLLM_DEFAULT_GPU_MEMORY_UTILIZATION)),
        tensor_parallel_size=tp,
        block_size=int(args.get("block-size", VLLM_DEFAULT_BLOCK_SIZE)),
        kv_bytes=kv_bytes,
        swap_space_gib=float(args.get("swap-space", VLLM_DEFAULT_SWAP_SPACE_GIB)),
        dtype=dtype,
    )


def kv_bytes_one_request_per_rank(model: Model, settings: Resolved) -> int:
    """``max_memory_usage_bytes`` over one rank's layers at max_model_len."""
    heads = max(1, model.kv_heads // settings.tensor_parallel_size)
    page = 2 * settings.block_size * heads * model.head_dim * settings.kv_bytes
    return model.layers * math.ceil(settings.max_model_len / settings.block_size) * page


def sampler_overhead_gib(model: Model, settings: Resolved) -> float:
    rows = min(settings.max_num_seqs, settings.max_num_batched_tokens)
    return max(0, rows - PROFILED_SAMPLER_ROWS) * model.vocabulary * SAMPLER_BYTES_PER_LOGIT / GIB


def available_kv_gib_per_rank(model: Model, gpu: Gpu, settings: Resolved, non_kv_gib_per_rank: float) -> float:
    """``requested_memory - non_kv_cache_memory`` on one rank."""
    return (
        gpu.memory_gib * settings.gpu_memory_utilization - non_kv_gib_per_rank - sampler_overhead_gib(model, settings)
    )


def startup_failures(
    model: Model,
    gpu: Gpu,
    argv: list[str],
    *,
    non_kv_gib_per_rank: float,
    allow_long_max_model_len: bool = False,
) -> list[str]:
    """Why vLLM 0.13 would not start with ``argv`` on ``gpu`` (empty: it starts).

    ``non_kv_gib_per_rank``: weights on one rank plus the activation and non-torch memory vLLM would measure.
    """
    s = resolve(model, gpu, argv)
    failures: list[str] = []
    if not 0 < s.gpu_memory_utilization <= 1:
        failures.append(f"gpu_memory_utilization {s.gpu_memory_utilization} not in (0, 1]")
    if s.block_size not in VLLM_BLOCK_SIZES:
        failures.append(f"block_size {s.block_size} not one of {VLLM_BLOCK_SIZES}")
    if s.tensor_parallel_size > gpu.count:
        failures.append(f"tensor_parallel_size {s.tensor_parallel_size} > {gpu.count} GPUs")
    if model.attention_heads % s.tensor_parallel_size:
        failures.append(f"{model.attention_heads} attention heads not divisible by tp {s.tensor_parallel_size}")
    if s.dtype == "bfloat16" and gpu.compute_capability < 8.0:
        failures.append(f"bfloat16 on compute capability {gpu.compute_capability}")
    if s.max_model_len > model.max_context and not allow_long_max_model_len:
        failures.append(f"max_model_len {s.max_model_len} > derived max_model_len {model.max_context}")
    if s.max_num_batched_tokens < s.max_num_seqs:
        failures.append(f"max_num_batched_tokens {s.max_num_batched_tokens} < max_num_seqs {s.max_num_seqs}")
    if s.swap_space_gib * s.tensor_parallel_size > 0.7 * gpu.host_memory_gib:
        failures.append(f"swap space {s.swap_space_gib * s.tensor_parallel_size} GiB > 70% of host memory")
    available = available_kv_gib_per_rank(model, gpu, s, non_kv_gib_per_rank)
    if available <= 0:
        failures.append(f"no available memory for the cache blocks ({available:.2f} GiB per rank)")
    else:
        needed = kv_bytes_one_request_per_rank(model, s) / GIB
        if needed > available:
            failures.append(
                f"one {s.max_model_len}-token request needs {needed:.2f} GiB of KV cache per rank, "
                f"{available:.2f} GiB available"
            )
    return failures
