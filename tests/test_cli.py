import json

from genai_constructs.cli import main


def test_plan_json_is_a_plan(capsys):
    assert main(["plan", "--model", "llama-3.1-8b", "--sessions", "8", "--tokens-per-s", "20", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["kind"] == "inference" and plan["instance_type"] and plan["reasons"]


def test_estimate_table_shows_tpot(capsys):
    assert main(["estimate", "--model", "llama-3.1-8b", "--instance", "g5.2xlarge"]) == 0
    assert "TPOT" in capsys.readouterr().out


def test_embedding_plan_from_cli(capsys):
    assert (
        main(
            [
                "plan",
                "--model",
                "bge-large-en-v1.5",
                "--documents",
                "1000",
                "--tokens-per-document",
                "500",
                "--deadline-hours",
                "1",
                "--json",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["kind"] == "embedding"


def test_demo_prints_three_plans(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "8B chat" in out and "70B chat" in out and "Batch embedding" in out


def test_fails_bad_input_is_a_sentence_not_a_traceback(capsys):
    assert main(["plan", "--model", "llama-3.1-8b", "--sessions", "0", "--tokens-per-s", "20"]) == 2
    err = capsys.readouterr().err
    assert "--sessions must be a positive whole number, got '0'" in err and "Traceback" not in err


def test_fails_model_level_error_reaches_the_user_as_a_sentence(capsys):
    # 25 tokens/s means a token every 40 ms: a 100 ms p95 TPOT target cannot deliver it.
    argv = ["plan", "--model", "llama-3.1-8b", "--sessions", "4", "--tokens-per-s", "25", "--p95-tpot-ms", "100"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "p95_tpot_ms" in err and "output_tokens_per_s_per_session" in err and "Traceback" not in err


def test_fails_json_errors_are_json_on_stdout_with_a_non_zero_exit(capsys):
    assert main(["plan", "--model", "gpt-5", "--sessions", "4", "--tokens-per-s", "20", "--json"]) == 2
    out = capsys.readouterr().out
    error = json.loads(out)["error"]
    assert error["type"] == "UnknownPresetError" and "gpt-5" in error["message"]


def test_fails_json_usage_errors_are_json_too(capsys):
    assert main(["plan", "--model", "llama-3.1-8b", "--sessions", "many", "--tokens-per-s", "20", "--json"]) == 2
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["type"] == "UsageError" and "--sessions must be a whole number, got 'many'" in error["message"]


def test_fails_flags_of_the_other_workload_kind(capsys):
    argv = ["plan", "--model", "llama-3.1-8b", "--sessions", "4", "--tokens-per-s", "20", "--documents", "10"]
    assert main(argv) == 2
    assert "--documents describe batch embedding traffic and do not apply to a decoder" in capsys.readouterr().err


def test_fails_estimate_that_does_not_fit_exits_non_zero(capsys):
    assert main(["estimate", "--model", "llama-3.1-70b", "--instance", "g5.xlarge"]) == 2
    captured = capsys.readouterr()
    assert "needs" in captured.err and "larger --instance" in captured.err


def test_version_names_the_package(capsys):
    import pytest

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("genai-constructs ")


def test_models_lists_moe_presets_with_active_parameters(capsys):
    assert main(["models", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["mixtral-8x7b"]["active_parameters_billion"] == 12.9  # Mistral AI: 12.9 B active of 46.7 B
    assert rows["llama-3.1-8b"]["active_parameters_billion"] is None


def test_plan_from_a_hugging_face_config(capsys, tmp_path):
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "vocab_size": 128256, "max_position_embeddings": 131072, "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
    }  # meta-llama/Llama-3.1-8B-Instruct config.json  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    argv = ["plan", "--hf-config", str(path), "--sessions", "8", "--tokens-per-s", "20", "--json"]
    assert main(argv) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["kind"] == "inference" and 7.9 < plan["model"]["parameters_billion"] < 8.1


def test_fails_unknown_model_from_cli(capsys):
    assert main(["estimate", "--model", "gpt-5", "--instance", "g5.xlarge"]) == 2
    assert "unknown model 'gpt-5'" in capsys.readouterr().err


def test_enqueue_subcommand_reaches_the_enqueue_tool(capsys):
    import pytest

    with pytest.raises(SystemExit) as exit_info:
        main(["enqueue", "--help"])
    assert exit_info.value.code == 0
    assert "--queue-url" in capsys.readouterr().out
