import pytest

from genai_constructs.simulation import ScenarioError, TraceReadError, build_workload, read_trace
from genai_constructs.simulation.trace import rate_scale_for_peak_sessions
from tests.simulation.support import steady_trace


def test_reads_the_azure_format_with_seven_fractional_digits(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:15:46.6805900,374,44\n"
                    "2023-11-16 18:15:50.9951690,396,0\n")
    trace = read_trace(path)
    assert trace.arrivals == pytest.approx([0.0, 4.314579])
    assert trace.prompts == [374, 396]
    assert trace.outputs == [44, 1]  # a recorded 0 is served as the one token a server always emits


def test_reads_seconds_and_other_column_names_in_any_order(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("output_tokens,arrival_s,prompt_tokens\n7,12.5,100\n3,10.0,50\n")
    trace = read_trace(path)
    assert (trace.arrivals, trace.prompts, trace.outputs) == ([0.0, 2.5], [50, 100], [3, 7])


def test_fails_on_missing_columns(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("time,prompt\n1,2\n")
    with pytest.raises(TraceReadError) as error:
        read_trace(path)
    assert str(error.value) == (f"trace {path} lacks a column for output tokens (GeneratedTokens or output_tokens): "
                                "its header is time,prompt")


def test_fails_on_negative_lengths(tmp_path):
    path = tmp_path / "negative.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,-3,5\n")
    with pytest.raises(TraceReadError, match=r"line 3: token counts must be >= 0, got prompt -3 and output 5$"):
        read_trace(path)


def test_the_named_azure_traces_resolve():
    try:
        trace = read_trace("code")
    except TraceReadError as error:
        pytest.skip(str(error))  # the traces live in shared/traces beside the checkout, not in the repository
    assert len(trace.arrivals) == 8819  # shared/traces/README.md


def test_longer_runs_repeat_the_trace_and_rate_scale_compresses_it():
    trace = steady_trace(1.0, seconds=600)  # 600 requests over 10 minutes
    assert len(build_workload(trace, hours=1 / 3).arrivals) == 1200
    assert len(build_workload(trace, hours=1 / 6, rate_scale=2.0).arrivals) == 1200


def test_ramp_rises_from_a_fifth_to_the_full_rate():
    workload = build_workload(steady_trace(1.0), hours=1, scenario="ramp")
    first = sum(1 for t in workload.arrivals if t < 600)
    last = sum(1 for t in workload.arrivals if t >= 3000)
    assert first == pytest.approx(600 * (0.2 + 0.8 * 300 / 3600), abs=2)  # the mean probability of minutes 0-10
    assert last == pytest.approx(600 * (0.2 + 0.8 * 3300 / 3600), abs=2)
    assert len(workload.arrivals) == pytest.approx(3600 * 0.6, abs=2)


def test_burst_triples_the_rate_for_twenty_minutes_in_the_middle():
    workload = build_workload(steady_trace(1.0), hours=1, scenario="burst")
    assert workload.burst == (1200.0, 2400.0)
    inside = sum(1 for t in workload.arrivals if 1200 <= t < 2400)
    assert inside == 3600
    assert len(workload.arrivals) - inside == 2400


def test_stop_leaves_two_hours_without_requests_after_the_first():
    workload = build_workload(steady_trace(1.0), hours=4, scenario="stop")
    assert workload.stop == (3600.0, 10800.0)
    assert not [t for t in workload.arrivals if 3600 <= t < 10800]
    assert len(workload.arrivals) == 7200


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"scenario": "spike"}, "scenario 'spike' does not exist: choose one of steady, ramp, burst, stop, failure"),
    ({"rate_scale": float("nan")}, "rate scale must be a positive finite number, got nan"),
    ({"rate_scale": 0}, "rate scale must be a positive finite number, got 0"),
    ({"hours": float("inf")}, "hours must be a positive finite number, got inf"),
    ({"hours": 1, "scenario": "stop"}, "the stop scenario starts after the first hour: give --hours above 1"),
])
def test_fails_on_bad_shapes(kwargs, message):
    with pytest.raises(ScenarioError) as error:
        build_workload(steady_trace(1.0), **{"hours": 2, **kwargs})
    assert str(error.value) == message


def test_rate_scale_for_peak_sessions():
    # 1 request/s, each in flight 0.2 s + 200 tokens x 0.1 s = 20.2 s: 20.2 in flight; 64 sessions need x3.17.
    assert rate_scale_for_peak_sessions(steady_trace(1.0), 64, 200.0, 100.0) == pytest.approx(64 / 20.2)
