import pytest
from pydantic import ValidationError

from genai_constructs.errors import GenaiConstructsError, UnknownPresetError
from genai_constructs.workload import BatchTraffic, ModelArtifact, ModelShape, Precision, RealtimeTraffic

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
