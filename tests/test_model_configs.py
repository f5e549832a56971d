"""ModelShape.from_hf_config: real config.json files (tests/data/hf_configs, see its README) against published counts."""

import json
from pathlib import Path

import pytest

from genai_constructs.errors import GenaiConstructsError
from genai_constructs.workload import ModelShape, Precision, list_presets

CONFIGS = Path(__file__).parent / "data" / "hf_configs"


def config(name):
    return CONFIGS / f"{name}.json"


# Published parameter counts, in billions: total, and active per token for mixture-of-experts.
@pytest.mark.parametrize(
    ("fixture", "total", "active"),
    [
        ("meta-llama--Meta-Llama-3.1-8B", 8.03, None),  # model card: 8B; 8.03 B on the Hub
        ("meta-llama--Meta-Llama-3.1-405B", 405.0, None),  # model card: 405B
        ("Qwen--Qwen3-8B", 8.2, None),  # model card: 8.2B
        ("Qwen--Qwen3-30B-A3B", 30.5, 3.3),  # model card: 30.5B total, 3.3B activated
        ("mistralai--Mixtral-8x7B-v0.1", 46.7, 12.9),  # Mistral AI, "Mixtral of experts": 46.7B total, 12.9B per token
        ("mistralai--Mixtral-8x22B-v0.1", 141.0, 39.0),  # Mistral AI, Mixtral 8x22B post: 39B active of 141B
        ("deepseek-ai--DeepSeek-V3", 671.0, 37.0),  # DeepSeek-V3 model card: 671B total, 37B activated
        ("openai--gpt-oss-120b", 116.83, None),  # OpenAI gpt-oss model card: 116.83B total
        ("openai--gpt-oss-20b", 20.91, None),  # OpenAI gpt-oss model card: 20.91B total
        ("sentence-transformers--all-MiniLM-L6-v2", 0.0227, None),  # Hub: 22.7M
    ],
)
def test_counted_parameters_match_published_counts_within_3_percent(fixture, total, active):
    shape = ModelShape.from_hf_config(config(fixture))
    assert shape.parameters_billion == pytest.approx(total, rel=0.03)
    if active is not None:
        assert shape.active_parameters_billion == pytest.approx(active, rel=0.03)


@pytest.mark.parametrize(
    ("fixture", "published_active"), [("openai--gpt-oss-120b", 5.13), ("openai--gpt-oss-20b", 3.61)]
)
def test_gpt_oss_active_count_is_openais_plus_the_input_embedding(fixture, published_active):
    # OpenAI's active count (model card: 5.13B, 3.61B) leaves out the input embedding, a table lookup:
    # vocab_size 201,088 x hidden_size 2,880 from the config. The shape counts it, as Mixtral's and Qwen's do.
    input_embedding = 201088 * 2880 / 1e9
    shape = ModelShape.from_hf_config(config(fixture))
    assert shape.active_parameters_billion == pytest.approx(published_active + input_embedding, rel=0.03)


def test_reads_the_architecture_of_a_mixture_of_experts_config():
    shape = ModelShape.from_hf_config(config("Qwen--Qwen3-30B-A3B"))
    # config.json: 48 layers, hidden 2048, 32 heads, 4 KV heads, head_dim 128, vocab 151936, 40960 positions,
    # 128 experts, 8 per token, bfloat16.
    assert (shape.layers, shape.hidden_size, shape.attention_heads, shape.kv_heads, shape.head_dim) == (
        48,
        2048,
        32,
        4,
        128,
    )
    assert (shape.vocabulary, shape.max_context, shape.experts, shape.experts_per_token) == (151936, 40960, 128, 8)
    assert shape.precision is Precision.BF16 and shape.kind == "decoder" and shape.is_moe


def test_explicit_head_dim_wins_over_hidden_over_heads():
    # gpt-oss: hidden_size 2880 / 64 heads would be 45; the config sets head_dim 64.
    assert ModelShape.from_hf_config(config("openai--gpt-oss-120b")).head_dim == 64


def test_gpt_oss_experts_per_token_and_mxfp4_weights():
    shape = ModelShape.from_hf_config(config("openai--gpt-oss-20b"))
    assert (shape.experts, shape.experts_per_token, shape.precision) == (32, 4, Precision.INT4)


def test_quantization_config_wins_over_torch_dtype():
    # DeepSeek-V3's config says torch_dtype bfloat16 and ships fp8 weights (quantization_config quant_method fp8).
    assert ModelShape.from_hf_config(config("deepseek-ai--DeepSeek-V3")).precision is Precision.FP8


def test_latent_attention_caches_one_latent_per_token_per_layer():
    # DeepSeek-V3: kv_lora_rank 512 + qk_rope_head_dim 64 = 576 cached values per token per layer, 61 layers, fp8.
    assert ModelShape.from_hf_config(config("deepseek-ai--DeepSeek-V3")).kv_bytes_per_token == 576 * 61 * 1


def test_encoder_config_is_an_encoder():
    shape = ModelShape.from_hf_config(config("sentence-transformers--all-MiniLM-L6-v2"))
    assert (shape.kind, shape.layers, shape.hidden_size, shape.max_context) == ("encoder", 6, 384, 512)
    assert shape.kv_bytes_per_token == 0
    assert shape.precision is Precision.FP32  # the config names no dtype: transformers loads it as float32


def test_gemma3_reads_the_nested_text_config_and_its_defaults():
    # The shape of google/gemma-3-27b-it's config.json: the language model sits in text_config, which omits
    # vocab_size (262,208), max_position_embeddings (131,072) and tie_word_embeddings (true), Gemma3TextConfig's
    # defaults; the dtype is at the top level.
    gemma = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "text_config": {
            "head_dim": 128,
            "hidden_size": 5376,
            "intermediate_size": 21504,
            "model_type": "gemma3_text",
            "num_attention_heads": 32,
            "num_hidden_layers": 62,
            "num_key_value_heads": 16,
            "query_pre_attn_scalar": 168,
            "sliding_window": 1024,
        },
        "torch_dtype": "bfloat16",
        "vision_config": {"model_type": "siglip_vision_model"},
    }
    shape = ModelShape.from_hf_config(gemma, name="gemma-3-27b-it")
    assert (shape.layers, shape.head_dim, shape.kv_heads, shape.vocabulary, shape.max_context) == (
        62,
        128,
        16,
        262208,
        131072,
    )
    assert shape.precision is Precision.BF16 and shape.name == "gemma-3-27b-it"
    # Model card: 27B, of which the SigLIP vision encoder is about 0.4B; the text decoder is counted here.
    assert shape.parameters_billion == pytest.approx(27.0, rel=0.03)


def test_xlm_roberta_position_table_holds_two_fewer_tokens():
    # BAAI/bge-m3 (xlm-roberta): max_position_embeddings 8194, of which the first two are padding offsets.
    bge_m3 = {
        "model_type": "xlm-roberta",
        "architectures": ["XLMRobertaModel"],
        "num_hidden_layers": 24,
        "hidden_size": 1024,
        "num_attention_heads": 16,
        "intermediate_size": 4096,
        "vocab_size": 250002,
        "max_position_embeddings": 8194,
        "type_vocab_size": 1,
        "torch_dtype": "float32",
    }
    shape = ModelShape.from_hf_config(bge_m3)
    assert (shape.kind, shape.max_context) == ("encoder", 8192)
    assert shape.parameters_billion == pytest.approx(0.568, rel=0.03)  # bge-m3 model card: 568M


def test_falcon_multi_query_has_one_kv_head():
    # tiiuae/falcon-7b config.json: 32 layers, hidden 4544, 71 heads, multi_query true, vocab 65024.
    falcon = {
        "model_type": "falcon",
        "architectures": ["FalconForCausalLM"],
        "num_hidden_layers": 32,
        "hidden_size": 4544,
        "num_attention_heads": 71,
        "multi_query": True,
        "new_decoder_architecture": False,
        "vocab_size": 65024,
        "max_position_embeddings": 2048,
        "torch_dtype": "bfloat16",
    }
    shape = ModelShape.from_hf_config(falcon)
    assert shape.kv_heads == 1
    assert shape.parameters_billion == pytest.approx(7.22, rel=0.03)  # Hub: 7.22B


@pytest.mark.parametrize(
    ("quantization", "expected"),
    [
        ({"quant_method": "awq", "bits": 4}, Precision.INT4),
        ({"quant_method": "gptq", "bits": 8}, Precision.INT8),
        ({"quant_method": "fp8"}, Precision.FP8),
        ({"quant_method": "mxfp4"}, Precision.INT4),
    ],
)
def test_precision_from_quantization_config(quantization, expected):
    raw = json.loads(config("meta-llama--Meta-Llama-3.1-8B").read_text())
    raw["quantization_config"] = quantization
    assert ModelShape.from_hf_config(raw).precision is expected


def test_precision_argument_wins():
    assert (
        ModelShape.from_hf_config(config("meta-llama--Meta-Llama-3.1-8B"), precision="fp8").precision is Precision.FP8
    )


def test_reads_a_model_folder_and_names_the_shape_after_it(tmp_path):
    folder = tmp_path / "Llama-3.1-8B"
    folder.mkdir()
    (folder / "config.json").write_text(config("meta-llama--Meta-Llama-3.1-8B").read_text())
    shape = ModelShape.from_hf_config(folder)
    assert shape.name == "llama-3.1-8b" and shape.layers == 32


# --- bad input: every problem at once, each with the field, the value and the fix ----------------------------------


def test_fails_listing_every_problem_of_the_config():
    raw = json.loads(config("meta-llama--Meta-Llama-3.1-8B").read_text())
    del raw["num_hidden_layers"]
    raw["hidden_size"] = 4096.5
    raw["num_attention_heads"] = True
    with pytest.raises(GenaiConstructsError) as error:
        ModelShape.from_hf_config(raw)
    message = str(error.value)
    assert "3 problem(s)" in message
    assert "num_hidden_layers is missing" in message
    assert "hidden_size = 4096.5 is not a positive whole number" in message
    assert "num_attention_heads = True is not a positive whole number" in message


def test_fails_an_encoder_decoder_model():
    with pytest.raises(
        GenaiConstructsError,
        match=r"model_type 't5' .* is not a decoder-only language model or a "
        r"BERT-style encoder",
    ):
        ModelShape.from_hf_config({"model_type": "t5", "architectures": ["T5ForConditionalGeneration"]})


def test_fails_an_unknown_architecture_without_a_key_error():
    with pytest.raises(GenaiConstructsError, match=r"model_type None .* is not a decoder-only"):
        ModelShape.from_hf_config({})


def test_fails_an_unreadable_file(tmp_path):
    with pytest.raises(GenaiConstructsError, match=r"cannot read .*config.json.*give the path of a Hugging Face"):
        ModelShape.from_hf_config(tmp_path)


def test_fails_a_json_syntax_error_naming_its_line(tmp_path):
    broken = tmp_path / "config.json"
    broken.write_text('{\n  "num_hidden_layers": 32,\n  "hidden_size": 4096\n  "vocab_size": 128256\n}\n')
    with pytest.raises(GenaiConstructsError, match=r"is not valid JSON: Expecting ',' delimiter at line 4 column 3"):
        ModelShape.from_hf_config(broken)


def test_fails_a_json_array(tmp_path):
    listed = tmp_path / "config.json"
    listed.write_text("[1, 2]")
    with pytest.raises(GenaiConstructsError, match=r"holds a JSON list, not an object"):
        ModelShape.from_hf_config(listed)


def test_fails_a_dtype_it_cannot_serve():
    raw = json.loads(config("meta-llama--Meta-Llama-3.1-8B").read_text())
    raw["torch_dtype"] = "float8_e4m3fn"
    with pytest.raises(GenaiConstructsError, match=r"torch_dtype = 'float8_e4m3fn' .* pass precision="):
        ModelShape.from_hf_config(raw)


# --- the preset table ----------------------------------------------------------------------------------------------


def test_list_presets_has_a_row_per_preset_with_its_source():
    rows = {row.name: row for row in list_presets()}
    assert rows["gpt-oss-120b"].source == "openai/gpt-oss-120b"
    assert (rows["gpt-oss-120b"].parameters_billion, rows["gpt-oss-120b"].active_parameters_billion) == (116.83, 5.13)
    assert rows["llama-3.1-8b"].active_parameters_billion is None and rows["llama-3.1-8b"].precision == "bf16"
    assert rows["bge-large-en-v1.5"].kind == "encoder"


def test_every_preset_entry_says_where_its_numbers_come_from():
    from importlib import resources

    entries = json.loads(resources.files("genai_constructs.data").joinpath("models.json").read_text())["models"]
    assert len(entries) == len(list_presets())
    for name, entry in entries.items():
        assert entry["retrieved"] == "2026-12-01", name
        assert entry["hf_repo"] and entry["parameters_source"] and entry["read_from"], name
        assert entry["config_fields"]["num_hidden_layers"] == entry["shape"]["layers"], name
