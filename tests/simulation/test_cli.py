import json

import pytest

from genai_constructs.cli import main
from tests.simulation.support import CHAT


@pytest.fixture
def trace(tmp_path):
    """Ten minutes at 1 request/s."""
    path = tmp_path / "trace.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(f"{i},512,100\n" for i in range(600)))
    return str(path)


def _error(capsys, argv, *, as_json=False):
    code = main(argv + (["--json"] if as_json else []))
    captured = capsys.readouterr()
    assert code == 2
    if as_json:
        assert captured.err == ""
        error = json.loads(captured.out)["error"]
        assert error["type"].endswith("Error")
        return error["message"]
    assert captured.out == "" and "Traceback" not in captured.err
    assert captured.err.count("\n") == 1  # one sentence, one line
    return captured.err.removeprefix("error: ").rstrip("\n")


def test_fails_on_a_template_with_no_fleet(capsys, tmp_path, trace):
    path = tmp_path / "empty.template.json"
    path.write_text(json.dumps({"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}}}))
    message = ("the template holds no inference fleet to simulate: it has no AWS::AutoScaling::AutoScalingGroup; "
               "synthesize a stack with a GpuInferenceFleet")
    assert _error(capsys, ["simulate", str(path), "--trace", trace]) == message
    assert _error(capsys, ["simulate", str(path), "--trace", trace], as_json=True) == message


def test_fails_on_a_trace_with_missing_columns(capsys, tmp_path):
    path = tmp_path / "short.csv"
    path.write_text("TIMESTAMP,ContextTokens\n1,2\n")
    assert _error(capsys, ["simulate", str(CHAT), "--trace", str(path)]) == (
        f"trace {path} lacks a column for output tokens (GeneratedTokens or output_tokens): its header is "
        "TIMESTAMP,ContextTokens")


def test_fails_on_a_trace_with_negative_lengths(capsys, tmp_path):
    path = tmp_path / "negative.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,-1\n")
    assert _error(capsys, ["simulate", str(CHAT), "--trace", str(path)], as_json=True) == (
        f"trace {path} line 2: token counts must be >= 0, got prompt 10 and output -1")


def test_fails_on_an_unknown_scenario(capsys, trace):
    assert _error(capsys, ["simulate", str(CHAT), "--trace", trace, "--scenario", "spike"]) == (
        "scenario 'spike' does not exist: choose one of steady, ramp, burst, stop, failure")


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "fast"])
def test_fails_on_a_rate_scale_that_is_not_a_positive_finite_number(capsys, trace, value):
    assert _error(capsys, ["simulate", str(CHAT), "--trace", trace, "--rate-scale", value]) == (
        f"--rate-scale must be a positive finite number, got {value!r}")


def test_json_report_has_the_issue_fields(capsys, trace):
    assert main(["simulate", str(CHAT), "--trace", trace, "--hours", "0.25", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    for field in ("slo_violation_minutes", "p95_ttft_ms", "p95_tpot_ms", "instance_hours", "usd",
                  "usd_per_million_tokens", "peak_instances", "final_instances", "unmodelled"):
        assert field in report
    assert (report["requests"], report["minutes"], report["final_instances"]) == (900, 15, 2)


def test_compare_runs_three_policies_in_one_table(capsys, trace):
    assert main(["simulate", str(CHAT), "--trace", trace, "--hours", "0.25", "--compare"]) == 0
    out = capsys.readouterr().out
    for label in ("template", "gpu-utilization-70", "no-warm-pool", "SLO-violation minutes", "$ per 1M output tokens"):
        assert label in out


def test_plot_writes_a_png(tmp_path, trace):
    pytest.importorskip("matplotlib")
    path = tmp_path / "run.png"
    assert main(["simulate", str(CHAT), "--trace", trace, "--hours", "0.25", "--plot", str(path), "--json"]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
