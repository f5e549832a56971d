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
    assert "concurrent_sessions" in err and "Traceback" not in err


def test_fails_unknown_model_from_cli(capsys):
    assert main(["estimate", "--model", "gpt-5", "--instance", "g5.xlarge"]) == 2
    assert "unknown model 'gpt-5'" in capsys.readouterr().err


def test_enqueue_subcommand_reaches_the_enqueue_tool(capsys):
    import pytest

    with pytest.raises(SystemExit) as exit_info:
        main(["enqueue", "--help"])
    assert exit_info.value.code == 0
    assert "--queue-url" in capsys.readouterr().out
