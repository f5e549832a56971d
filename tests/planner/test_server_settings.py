"""The server settings the planner derives must pass vLLM 0.13's own start-up checks.

The checks come from ``vllm_startup_rules`` (an independent reading of the vLLM 0.13.0 source, with its own figure for
the memory vLLM measures); the library's check is never used to compute an expected value here.
"""

from __future__ import annotations

import itertools
import math
import re
import subprocess
import sys
import time

import pytest

from genai_constructs.errors import GenaiConstructsError, ServerStartupError
from genai_constructs.planner import load_catalog, plan_inference
from genai_constructs.planner.catalog import InstanceType
from genai_constructs.workload import MODEL_PRESETS, ModelShape, RealtimeTraffic
from tests.planner import vllm_startup_rules as vllm

GIB = 1024**3
# Bytes per parameter as served, and the checkpoint dtype vLLM's --dtype auto picks (typed here, not imported).
WEIGHT_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}
CHECKPOINT_DTYPE = {"fp32": ("float32", 4), "fp16": ("float16", 2)}  # everything else: a bf16 checkpoint
# CUDA compute capability, NVIDIA's CUDA GPUs table (developer.nvidia.com/cuda-gpus).
CAPABILITY = {"T4": 7.5, "A10G": 8.6, "L4": 8.9, "L40S": 8.9, "A100-40GB": 8.0, "A100-80GB": 8.0, "H100": 9.0}
CAPABILITY |= {"H200": 9.0, "B200": 10.0}
DECODERS = sorted(name for name, row in MODEL_PRESETS.items() if row["kind"] == "decoder")
GPU_TYPES = sorted(name for name, i in load_catalog().instances.items() if not i.is_neuron)


def rules_model(model: ModelShape) -> vllm.Model:
    dtype, dtype_bytes = CHECKPOINT_DTYPE.get(model.precision.value, ("bfloat16", 2))
    return vllm.Model(
        layers=model.layers,
        attention_heads=model.attention_heads,
        kv_heads=model.kv_heads,
        head_dim=model.head_dim,
        dtype_bytes=dtype_bytes,
        max_context=model.max_context,
        vocabulary=model.vocabulary,
        dtype=dtype,
    )


def rules_gpu(instance: InstanceType) -> vllm.Gpu:
    return vllm.Gpu(
        name=instance.accelerator.name,
        memory_gib=instance.accelerator_memory_gib,
        count=instance.accelerator_count,
        compute_capability=CAPABILITY[instance.accelerator.name],
        host_memory_gib=instance.memory_gib,
    )


def non_kv_gib_per_rank(model: ModelShape, tensor_parallel_size: int) -> float:
    weights = model.parameters_billion * 1e9 * WEIGHT_BYTES[model.precision.value] / tensor_parallel_size / GIB
    return weights + vllm.NON_KV_OVERHEAD_GIB_PER_RANK


def vllm_failures(model: ModelShape, instance: InstanceType, argv: list[str], tensor_parallel_size: int) -> list[str]:
    return vllm.startup_failures(
        rules_model(model),
        rules_gpu(instance),
        argv,
        non_kv_gib_per_rank=non_kv_gib_per_rank(model, tensor_parallel_size),
    )


# --- (a) round 1's command line ---------------------------------------------------------------------------------------

ROUND_1_ARGV = [
    "-m", "vllm.entrypoints.openai.api_server",
    "--model", "/opt/models/llama-3.1-8b/1",
    "--served-model-name", "llama-3.1-8b",
    "--tensor-parallel-size", "1",
    "--max-num-seqs", "17",
    "--port", "8000",
]  # fmt: skip


def test_round_1_default_server_args_fail_vllms_check_on_g6_xlarge():
    """Round 1 started vLLM with no --max-model-len, so vLLM takes Llama 3.1 8B's own 131,072 tokens.

    One such request needs 32 layers x 8,192 blocks x (2 x 16 tokens x 8 KV heads x 128 x 2 bytes) = 16.00 GiB of KV
    cache. One L4 (22.35 GiB) at gpu_memory_utilization 0.9 gives 20.12 GiB; less 14.96 GiB of weights (8.03 B x 2
    bytes) and 1.65 GiB measured overhead leaves 3.51 GiB. vLLM refuses to start.
    """
    instance = load_catalog().instance("g6.xlarge")
    model = ModelShape.preset("llama-3.1-8b")
    failures = vllm_failures(model, instance, ROUND_1_ARGV, 1)
    assert failures == ["one 131072-token request needs 16.00 GiB of KV cache per rank, 3.51 GiB available"]


def test_rules_accept_a_short_enough_max_model_len_on_the_same_gpu():
    # 8,192 tokens: 32 x 512 blocks x 65,536 bytes = 1.00 GiB, under the 3.51 GiB above.
    argv = [*ROUND_1_ARGV, "--max-model-len", "8K"]
    assert vllm_failures(ModelShape.preset("llama-3.1-8b"), load_catalog().instance("g6.xlarge"), argv, 1) == []


# --- (b) every option the planner can pick starts -------------------------------------------------------------------

SESSIONS = (4, 64, 600)
TOKENS_PER_S = (5.0, 20.0, 50.0)
LENGTHS = ((128, 128), (1024, 256), (3000, 1000), (12000, 2000))
REQUEST_LIMITS = (None, "mean", 32768, 131072)
TTFT_MS = (500.0, 2000.0)
SHAPES = 24
"""Traffic shapes: each dimension cycles at its own stride, so every value of each appears with several of the others
(the full product, 288 shapes x 10 presets x 38 GPU types, takes half a minute)."""


DECODERS_PER_SHAPE = 4
"""Each traffic shape is planned for this many presets, rotating, so every preset meets several shapes and the grid
stays a few seconds as the preset list grows."""


def decoders_for(shape_index: int) -> list[str]:
    start = shape_index * DECODERS_PER_SHAPE
    return [DECODERS[(start + k) % len(DECODERS)] for k in range(DECODERS_PER_SHAPE)]


def traffic_grid() -> list[RealtimeTraffic]:
    shapes = []
    for i in range(SHAPES):
        prompt, output = LENGTHS[i % len(LENGTHS)]
        limit = REQUEST_LIMITS[(i // 2) % len(REQUEST_LIMITS)]
        shapes.append(
            RealtimeTraffic(
                concurrent_sessions=SESSIONS[i % len(SESSIONS)],
                output_tokens_per_s_per_session=TOKENS_PER_S[(i // 3) % len(TOKENS_PER_S)],
                prompt_tokens=prompt,
                output_tokens=output,
                max_request_tokens=prompt + output if limit == "mean" else limit,
                p95_ttft_ms=TTFT_MS[(i // 4) % len(TTFT_MS)],
            )
        )
    return shapes


@pytest.fixture(scope="module")
def every_pick():
    """Every (preset, GPU instance, traffic) the planner returns a plan for, forcing each GPU type in turn."""
    started = time.perf_counter()
    picks, refused_beyond_context = [], []
    for index, traffic in enumerate(traffic_grid()):
        for name, instance_type in itertools.product(decoders_for(index), GPU_TYPES):
            picks_for(name, traffic, instance_type, picks, refused_beyond_context)
    return picks, refused_beyond_context, time.perf_counter() - started


def picks_for(name, traffic, instance_type, picks, refused_beyond_context):
    model = ModelShape.preset(name)
    try:
        plan = plan_inference(model, traffic, instance_types=[instance_type])
    except ServerStartupError:
        if (traffic.max_request_tokens or 0) > model.max_context:
            refused_beyond_context.append((name, traffic, instance_type))
        return
    except GenaiConstructsError:
        return  # does not fit, or misses the latency targets: not a pick
    picks.append((model, traffic, load_catalog().instance(instance_type), plan))


def test_grid_reaches_every_preset_and_many_instance_types(every_pick):
    picks, _, _ = every_pick
    assert {m.name for m, *_ in picks} == set(DECODERS)
    assert len({(m.name, i.instance_type) for m, _, i, _ in picks}) >= 200
    assert {p.server.max_model_len for *_, p in picks} >= {8192, 32768, 131072, 4096}


def test_grid_runs_in_a_few_seconds(every_pick):
    assert every_pick[2] < 5.0


def test_every_picked_setting_passes_vllms_startup_checks(every_pick):
    picks, _, _ = every_pick
    failing = []
    for model, traffic, instance, plan in picks:
        s = plan.server
        full = ["-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--port", "8000", *s.vllm_args()]
        # What the fleet's default command line passes: vLLM picks max_num_batched_tokens for the GPU itself.
        fleet = ["--tensor-parallel-size", str(s.tensor_parallel_size), "--max-num-seqs", str(s.max_num_seqs)]
        fleet += ["--max-model-len", str(s.max_model_len), "--gpu-memory-utilization", str(s.gpu_memory_utilization)]
        for argv in (full, fleet):
            failures = vllm_failures(model, instance, argv, plan.devices_per_replica)
            if failures:
                failing.append((model.name, instance.instance_type, traffic.max_request_tokens, failures))
    assert failing == []


def test_settings_follow_the_plan(every_pick):
    picks, _, _ = every_pick
    for model, traffic, _, plan in picks:
        server = plan.server
        # The server's cap is the highest concurrency meeting the targets; the plan (and scaling) sit below it.
        assert server.max_num_seqs >= plan.concurrency_per_instance // plan.replicas_per_instance
        assert plan.concurrency_per_instance % plan.replicas_per_instance == 0
        assert server.max_num_seqs <= plan.estimate.memory.max_concurrency
        assert server.tensor_parallel_size == plan.devices_per_replica
        assert server.gpu_memory_utilization == 0.9
        expected_len = traffic.max_request_tokens or min(
            max(8192, 4 * (traffic.prompt_tokens + traffic.output_tokens)), model.max_context
        )
        assert server.max_model_len == expected_len


def test_one_max_request_kv_is_whole_blocks_of_every_layer(every_pick):
    picks, _, _ = every_pick
    for model, _, _, plan in picks[::37]:
        s = plan.server
        heads = max(1, model.kv_heads // s.tensor_parallel_size)
        per_rank = model.layers * math.ceil(s.max_model_len / 16) * 2 * 16 * heads * model.head_dim * 2
        assert s.kv_cache_gib_one_max_request == pytest.approx(per_rank * s.tensor_parallel_size / GIB, abs=1e-3)


def test_request_longer_than_the_model_is_refused_everywhere(every_pick):
    _, refused, _ = every_pick
    assert refused and all(
        t.max_request_tokens > ModelShape.preset(n).max_context for n, t, _ in refused if t.max_request_tokens
    )


def test_default_plan_reason_states_the_server_settings():
    plan = plan_inference(
        ModelShape.preset("llama-3.1-8b"),
        RealtimeTraffic(concurrent_sessions=8, output_tokens_per_s_per_session=10),
        instance_types=["g6.xlarge"],
    )
    assert plan.server.max_model_len == 8192  # the 8,192 floor: 4 x (1,024 + 256) = 5,120 is shorter
    reason = plan.reasons[-1]
    assert "--max-model-len 8,192" in reason and f"--max-num-seqs {plan.server.max_num_seqs}" in reason
    assert "--gpu-memory-utilization 0.9" in reason and "1.00 GiB of KV cache" in reason


# --- (c) a request too long for the forced instance ------------------------------------------------------------------


def test_fails_request_too_long_for_the_forced_instance_names_gib_and_fix():
    traffic = RealtimeTraffic(concurrent_sessions=8, output_tokens_per_s_per_session=10, max_request_tokens=131072)
    with pytest.raises(ServerStartupError) as error:
        plan_inference(ModelShape.preset("llama-3.1-8b"), traffic, instance_types=["g6.xlarge"])
    message = str(error.value)
    assert "one 131,072-token request (max_model_len) needs 16.00 GiB of KV cache" in message
    assert "GiB can be counted on" in message and "g6.xlarge" in message
    assert "lower max_request_tokens to" in message and "more accelerator memory" in message
    assert "more tensor parallelism" in message


def test_fails_request_longer_than_max_context_names_both_numbers():
    traffic = RealtimeTraffic(concurrent_sessions=8, output_tokens_per_s_per_session=10, max_request_tokens=16384)
    with pytest.raises(
        ServerStartupError, match=r"max_model_len \(16,384\) exceeds llama-2-7b's max_context \(4,096\)"
    ):
        plan_inference(ModelShape.preset("llama-2-7b"), traffic)


def test_the_refusal_comes_before_any_cdk():
    code = (
        "import sys\n"
        "from genai_constructs.errors import ServerStartupError\n"
        "from genai_constructs.planner import plan_inference\n"
        "from genai_constructs.workload import ModelShape, RealtimeTraffic\n"
        "t = RealtimeTraffic(concurrent_sessions=8, output_tokens_per_s_per_session=10, max_request_tokens=131072)\n"
        "try:\n"
        "    plan_inference(ModelShape.preset('llama-3.1-8b'), t, instance_types=['g6.xlarge'])\n"
        "except ServerStartupError:\n"
        "    print('refused', 'aws_cdk' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "refused False"


def test_planner_skips_instances_vllm_refuses_and_says_so():
    # 32,768 tokens of Llama 3.1 8B: 32 x 2,048 blocks x 65,536 bytes = 4.00 GiB of KV cache; one 22.35 GiB A10G or
    # L4 at 0.9 leaves 20.12 - 14.96 = 5.16 GiB less overhead, under 4 GiB by vLLM's measure (3.51 GiB, see (a)).
    traffic = RealtimeTraffic(concurrent_sessions=8, output_tokens_per_s_per_session=10, max_request_tokens=32768)
    plan = plan_inference(ModelShape.preset("llama-3.1-8b"), traffic)
    assert plan.instance_type not in {"g5.xlarge", "g6.xlarge"}
    note = next(n for n in plan.notes if n.startswith("Left out because vLLM"))
    assert "g6.xlarge (one 32,768-token request needs 4.00 GiB of KV cache" in note
    assert plan.server.max_model_len == 32768


def test_bf16_on_a_t4_is_not_refused_vllm_falls_back_to_fp16():
    argv = ["--tensor-parallel-size", "4", "--max-num-seqs", "16", "--max-model-len", "8192"]
    t4 = load_catalog().instance("g4dn.12xlarge")
    assert vllm_failures(ModelShape.preset("mistral-7b"), t4, argv, 4) == []
    assert vllm_failures(ModelShape.preset("mistral-7b"), t4, [*argv, "--dtype", "bfloat16"], 4) == [
        "bfloat16 on compute capability 7.5"
    ]


# --- (d) validation of max_request_tokens -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "pattern"),
    [
        (True, r"RealtimeTraffic.max_request_tokens \(got True\): must be a whole number of tokens, not a bool"),
        (float("nan"), r"RealtimeTraffic.max_request_tokens \(got nan\): must be a finite whole number"),
        (float("inf"), r"RealtimeTraffic.max_request_tokens \(got inf\): must be a finite whole number"),
        (0, r"RealtimeTraffic.max_request_tokens \(got 0\): .*greater than 0"),
        (-8192, r"RealtimeTraffic.max_request_tokens \(got -8192\): .*greater than 0"),
        (4096.5, r"RealtimeTraffic.max_request_tokens \(got 4096.5\): .*valid integer"),
        (
            1000,
            r"max_request_tokens \(1000\) is shorter than prompt_tokens \+ output_tokens \(1024 \+ 256 = 1280\).*"
            r"raise max_request_tokens to at least 1280",
        ),
    ],
)
def test_fails_bad_max_request_tokens_names_the_field(value, pattern):
    with pytest.raises(GenaiConstructsError, match=pattern):
        RealtimeTraffic(concurrent_sessions=4, output_tokens_per_s_per_session=10, max_request_tokens=value)


def test_max_request_tokens_default_and_explicit():
    short = RealtimeTraffic(concurrent_sessions=4, output_tokens_per_s_per_session=10)
    long = RealtimeTraffic(concurrent_sessions=4, output_tokens_per_s_per_session=10, prompt_tokens=6000)
    exact = RealtimeTraffic(concurrent_sessions=4, output_tokens_per_s_per_session=10, max_request_tokens=1280)
    assert (short.max_request_tokens, short.request_tokens_limit) == (None, 8192)
    assert long.request_tokens_limit == 4 * (6000 + 256)
    assert exact.request_tokens_limit == 1280


# --- the command line shows them ---------------------------------------------------------------------------------------


def test_cli_plan_prints_the_server_settings(capsys, monkeypatch):
    from genai_constructs.cli import main

    monkeypatch.setenv("COLUMNS", "240")  # rich sizes the table to the terminal; wide enough not to cut a flag

    args = ["plan", "--model", "llama-3.1-8b", "--sessions", "8", "--tokens-per-s", "10"]
    assert main([*args, "--max-request-tokens", "16384"]) == 0
    out = re.sub(r"[│\s]+", " ", capsys.readouterr().out)  # the table may wrap a row at any width
    assert "--max-model-len 16384" in out and "--gpu-memory-utilization 0.9" in out


def test_cli_plan_json_carries_the_server_settings(capsys):
    import json

    from genai_constructs.cli import main

    assert main(["plan", "--model", "llama-3.1-8b", "--sessions", "8", "--tokens-per-s", "10", "--json"]) == 0
    server = json.loads(capsys.readouterr().out)["server"]
    assert server["max_model_len"] == 8192 and server["gpu_memory_utilization"] == 0.9
    assert server["kv_cache_gib_one_max_request"] == 1.0 and server["max_num_seqs"] >= 1
