import pytest
from pydantic import ValidationError

from genai_constructs.errors import GenaiConstructsError, UnknownPresetError
from genai_constructs.workload import MODEL_PRESETS, BatchTraffic, ModelArtifact, ModelShape, Precision, RealtimeTraffic

REQUIRED_PRESETS = [
    "llama-2-7b",
    "llama-2-13b",
    "llama-2-70b",
    "llama-13b",
    "llama-3-8b",
    "llama-3-70b",
    "llama-3.1-8b",
    "llama-3.1-70b",
    "llama-3.3-70b",
    "mistral-7b",
    "bge-base-en-v1.5",
    "bge-large-en-v1.5",
    "all-minilm-l6-v2",
    "e5-large-v2",
    # Issue 12: models people serve now (another engineer's benchmark rows use these names).
    "llama-3.2-1b",
    "llama-3.2-3b",
    "llama-3.1-405b",
    "qwen2.5-7b",
    "qwen2.5-32b",
    "qwen2.5-72b",
    "qwen3-8b",
    "qwen3-32b",
    "mistral-small-24b",
    "gemma-3-27b",
    "mixtral-8x7b",
    "mixtral-8x22b",
    "qwen3-30b-a3b",
    "gpt-oss-20b",
    "gpt-oss-120b",
]


@pytest.mark.parametrize("name", REQUIRED_PRESETS)
def test_every_required_preset_exists(name):
    assert ModelShape.preset(name).name == name


# Published config.json values (Hugging Face Hub), typed in here independently of the preset table.
@pytest.mark.parametrize(
    ("name", "layers", "hidden", "heads", "kv_heads", "vocab", "context"),
    [
        ("llama-3.1-8b", 32, 4096, 32, 8, 128256, 131072),
        ("llama-2-70b", 80, 8192, 64, 8, 32000, 4096),
        ("llama-2-13b", 40, 5120, 40, 40, 32000, 4096),
        ("mistral-7b", 32, 4096, 32, 8, 32000, 32768),
        ("bge-large-en-v1.5", 24, 1024, 16, 16, 30522, 512),
        ("all-minilm-l6-v2", 6, 384, 12, 12, 30522, 512),
        ("llama-3.1-405b", 126, 16384, 128, 8, 128256, 131072),
        ("qwen3-8b", 36, 4096, 32, 8, 151936, 40960),
        ("qwen3-32b", 64, 5120, 64, 8, 151936, 40960),
        ("qwen3-30b-a3b", 48, 2048, 32, 4, 151936, 40960),
        ("mixtral-8x7b", 32, 4096, 32, 8, 32000, 32768),
        ("mixtral-8x22b", 56, 6144, 48, 8, 32000, 65536),
        ("gpt-oss-20b", 24, 2880, 64, 8, 201088, 131072),
        ("gpt-oss-120b", 36, 2880, 64, 8, 201088, 131072),
        ("gemma-3-27b", 62, 5376, 32, 16, 262208, 131072),
    ],
)
def test_presets_match_published_configs(name, layers, hidden, heads, kv_heads, vocab, context):
    m = ModelShape.preset(name)
    assert (m.layers, m.hidden_size, m.attention_heads, m.kv_heads, m.vocabulary, m.max_context) == (
        layers,
        hidden,
        heads,
        kv_heads,
        vocab,
        context,
    )


def test_preset_precision_override():
    assert ModelShape.preset("llama-3.1-70b", precision="fp8").precision is Precision.FP8


def test_kv_bytes_per_token_counts_keys_and_values_of_every_layer():
    # Llama 3.1 8B: 2 x 32 layers x 8 KV heads x 128 dims x 2 bytes = 131072 bytes per token.
    assert ModelShape.preset("llama-3.1-8b").kv_bytes_per_token == 131072


def test_encoders_have_no_kv_cache():
    assert ModelShape.preset("bge-base-en-v1.5").kv_bytes_per_token == 0


def test_models_are_frozen():
    with pytest.raises(ValidationError, match="frozen"):
        ModelShape.preset("mistral-7b").layers = 3  # type: ignore[misc]


def test_realtime_defaults_carry_their_targets():
    t = RealtimeTraffic(concurrent_sessions=10, output_tokens_per_s_per_session=20)
    assert t.tpot_target_ms == 50.0  # 1000 ms / 20 tokens per second
    assert t.min_instances == 2 and 0 < t.headroom < 1


def test_explicit_tpot_target_wins():
    assert (
        RealtimeTraffic(concurrent_sessions=1, output_tokens_per_s_per_session=20, p95_tpot_ms=30).tpot_target_ms == 30
    )


def test_batch_total_tokens():
    assert BatchTraffic(documents=1000, tokens_per_document=800, deadline_hours=1).total_tokens == 800_000


# --- bad input: the field, the value, the fix ------------------------------------------------------------------------


def test_fails_unknown_preset_lists_closest_names():
    with pytest.raises(UnknownPresetError, match=r"unknown model 'llama-3.1-7b'; did you mean .*llama-3.1-8b"):
        ModelShape.preset("llama-3.1-7b")


def test_fails_unknown_precision():
    with pytest.raises(GenaiConstructsError, match=r"precision 'fp6' is not one of fp32, bf16"):
        ModelShape.preset("llama-3.1-8b", precision="fp6")


def test_fails_zero_sessions():
    with pytest.raises(GenaiConstructsError, match=r"RealtimeTraffic.concurrent_sessions \(got 0\): .*greater than 0"):
        RealtimeTraffic(concurrent_sessions=0, output_tokens_per_s_per_session=20)


def test_fails_negative_token_rate():
    with pytest.raises(GenaiConstructsError, match=r"output_tokens_per_s_per_session \(got -5\)"):
        RealtimeTraffic(concurrent_sessions=3, output_tokens_per_s_per_session=-5)


def test_fails_single_instance_fleet():
    with pytest.raises(
        GenaiConstructsError, match=r"RealtimeTraffic.min_instances \(got 1\): .*greater than or equal to 2"
    ):
        RealtimeTraffic(concurrent_sessions=3, output_tokens_per_s_per_session=5, min_instances=1)


def test_fails_headroom_of_one():
    with pytest.raises(GenaiConstructsError, match=r"RealtimeTraffic.headroom \(got 1.0\)"):
        RealtimeTraffic(concurrent_sessions=3, output_tokens_per_s_per_session=5, headroom=1.0)


def test_fails_zero_deadline():
    with pytest.raises(GenaiConstructsError, match=r"BatchTraffic.deadline_hours \(got 0\)"):
        BatchTraffic(documents=10, tokens_per_document=10, deadline_hours=0)


def test_fails_negative_documents():
    with pytest.raises(GenaiConstructsError, match=r"BatchTraffic.documents \(got -1\)"):
        BatchTraffic(documents=-1, tokens_per_document=10, deadline_hours=1)


def test_fails_kv_heads_not_dividing_heads():
    with pytest.raises(GenaiConstructsError, match=r"attention_heads \(32\) must be a multiple of kv_heads \(5\)"):
        ModelShape(
            name="x",
            parameters_billion=1,
            layers=2,
            hidden_size=64,
            attention_heads=32,
            kv_heads=5,
            head_dim=2,
            vocabulary=10,
            max_context=10,
        )


def test_fails_unknown_field_is_named():
    with pytest.raises(GenaiConstructsError, match=r"RealtimeTraffic.sessions .*Extra inputs are not permitted"):
        RealtimeTraffic(sessions=3, concurrent_sessions=3, output_tokens_per_s_per_session=5)  # type: ignore[call-arg]


def test_fails_artifact_prefix_without_slash():
    with pytest.raises(GenaiConstructsError, match=r"prefix 'llama' must end in '/'"):
        ModelArtifact(bucket_name="my-models", prefix="llama")


def test_fails_artifact_bucket_name_invalid():
    with pytest.raises(GenaiConstructsError, match=r"ModelArtifact.bucket_name \(got 'My_Models'\)"):
        ModelArtifact(bucket_name="My_Models", prefix="x/")


# Published head_dim where the config sets it (not hidden_size / heads): Qwen3-32B 128 (5120 / 64 = 80),
# gpt-oss 64 (2880 / 64 = 45), Gemma 3 27B 128 (5376 / 32 = 168), Mistral Small 24B 128 (5120 / 32 = 160).
@pytest.mark.parametrize(
    ("name", "head_dim"), [("qwen3-32b", 128), ("gpt-oss-120b", 64), ("gemma-3-27b", 128), ("mistral-small-24b", 128)]
)
def test_presets_keep_the_configs_explicit_head_dim(name, head_dim):
    assert ModelShape.preset(name).head_dim == head_dim


# Published counts: Mixtral 8x7B 46.7B / 12.9B (Mistral AI), Qwen3-30B-A3B 30.5B / 3.3B (model card), gpt-oss-120b
# 116.83B / 5.13B and gpt-oss-20b 20.91B / 3.61B (OpenAI model card).
@pytest.mark.parametrize(
    ("name", "experts", "per_token", "total", "active"),
    [
        ("mixtral-8x7b", 8, 2, 46.7, 12.9),
        ("mixtral-8x22b", 8, 2, 141.0, 39.0),
        ("qwen3-30b-a3b", 128, 8, 30.5, 3.3),
        ("gpt-oss-20b", 32, 4, 20.91, 3.61),
        ("gpt-oss-120b", 128, 4, 116.83, 5.13),
    ],
)
def test_mixture_of_experts_presets(name, experts, per_token, total, active):
    m = ModelShape.preset(name)
    assert (m.experts, m.experts_per_token, m.parameters_billion, m.active_parameters_billion) == (
        experts,
        per_token,
        total,
        active,
    )


def test_gpt_oss_is_served_at_the_nearest_precision_to_mxfp4():
    assert ModelShape.preset("gpt-oss-120b").precision is Precision.INT4


# --- honest input ----------------------------------------------------------------------------------------------------


def test_fails_tpot_target_slower_than_the_session_rate():
    # 25 tokens/s per session is a token every 40 ms; a p95 TPOT of 100 ms cannot deliver it.
    with pytest.raises(
        GenaiConstructsError,
        match=r"p95_tpot_ms \(100\) allows a token every 100 ms, but output_tokens_per_s_per_session \(25\) asks "
        r"for one every 40 ms: the session rate cannot be met; set p95_tpot_ms to at most 40",
    ):
        RealtimeTraffic(concurrent_sessions=4, output_tokens_per_s_per_session=25, p95_tpot_ms=100)


def test_tpot_target_equal_to_the_session_interval_is_allowed():
    assert (
        RealtimeTraffic(concurrent_sessions=4, output_tokens_per_s_per_session=25, p95_tpot_ms=40).tpot_target_ms == 40
    )


LLAMA_31_8B = dict(
    name="m",
    parameters_billion=8.03,
    layers=32,
    hidden_size=4096,
    attention_heads=32,
    kv_heads=8,
    head_dim=128,
    vocabulary=128256,
    max_context=131072,
)
CHAT = dict(concurrent_sessions=4, output_tokens_per_s_per_session=20)
BACKLOG = dict(documents=10, tokens_per_document=10, deadline_hours=1)


@pytest.mark.parametrize("bad", [True, float("nan"), float("inf")])
@pytest.mark.parametrize(
    ("model", "base", "field"),
    [
        (ModelShape, LLAMA_31_8B, "layers"),
        (ModelShape, LLAMA_31_8B, "parameters_billion"),
        (ModelShape, LLAMA_31_8B, "max_context"),
        (RealtimeTraffic, CHAT, "concurrent_sessions"),
        (RealtimeTraffic, CHAT, "output_tokens_per_s_per_session"),
        (RealtimeTraffic, CHAT, "p95_ttft_ms"),
        (RealtimeTraffic, CHAT, "headroom"),
        (BatchTraffic, BACKLOG, "documents"),
        (BatchTraffic, BACKLOG, "deadline_hours"),
    ],
)
def test_fails_bools_and_non_finite_numbers_naming_the_field(model, base, field, bad):
    expected = "not a bool" if bad is True else "must be a finite"
    with pytest.raises(GenaiConstructsError, match=rf"{model.__name__}\.{field} \(got {bad!r}\): .*{expected}.*: give"):
        model(**{**base, field: bad})


def test_fails_parameter_count_in_the_wrong_unit():
    with pytest.raises(
        GenaiConstructsError,
        match=r"parameters_billion \(8030\) is over twice the [0-9.]+ B that 32 layers of width 4096",
    ):
        ModelShape(**{**LLAMA_31_8B, "parameters_billion": 8030})


def test_fails_parameter_count_below_what_attention_and_embeddings_hold():
    # Llama 3.1 70B's shape: attention and the embedding table alone are 13.1 B.
    with pytest.raises(GenaiConstructsError, match=r"parameters_billion \(0\.7\) is under half of the 13\.1 B"):
        ModelShape(
            **{**LLAMA_31_8B, "layers": 80, "hidden_size": 8192, "attention_heads": 64, "parameters_billion": 0.7}
        )


def test_every_preset_passes_the_consistency_checks():
    from genai_constructs.workload import MODEL_PRESETS

    for name in MODEL_PRESETS:
        assert ModelShape.preset(name).name == name


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"head_dim": 1280}, "attention_heads x head_dim (32 x 1280 = 40,960) is 10x hidden_size (4,096)"),
        ({"max_context": 10**9}, "max_context (1,000,000,000) is beyond any published model"),
        ({"layers": 5000, "parameters_billion": 1000}, "layers (5,000) is beyond any published model"),
    ],
)
def test_fails_shapes_no_real_model_has(change, expected):
    shape = dict(ModelShape.preset("llama-3.1-8b").model_dump(exclude={"weight_bytes", "kv_bytes_per_token"}))
    with pytest.raises(GenaiConstructsError) as error:
        ModelShape(**(shape | change))
    assert expected in str(error.value) and "check" in str(error.value).lower()


def test_every_preset_and_real_config_passes_the_shape_checks():
    # Qwen3-32B (64 x 128 over 5,120), Gemma 3 27B (32 x 128 over 5,376), DeepSeek-V3's latent: all real, all accepted.
    for name in MODEL_PRESETS:
        ModelShape.preset(name)
    ModelShape.from_hf_config("tests/data/hf_configs/deepseek-ai--DeepSeek-V3.json")
