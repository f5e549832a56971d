import pytest

from genai_constructs.simulation.cloudwatch import Alarm, MetricStore, alarm_state, evaluate_queries, statistic
from genai_constructs.simulation.template import AlarmSpec, MetricQuery, MetricStat

THRESHOLD = 1.0


def _points(text: str) -> list[float | None]:
    """The CloudWatch user guide's notation: 0 not breaching, X breaching, - missing (oldest first)."""
    return [{"0": 0.0, "X": 2.0, "-": None}[c] for c in text.split()]


# CloudWatch user guide, "How alarm state is evaluated when data is missing": both tables, every row and column.
GUIDE_TABLES = [
    (3, 3, "0 - X - X", ("OK", "OK", "OK", "OK")),
    (3, 3, "0 - - - -", ("OK", "OK", "OK", "OK")),
    (3, 3, "- - - - -", ("INSUFFICIENT_DATA", "retain", "ALARM", "OK")),
    (3, 3, "0 X X - X", ("ALARM", "ALARM", "ALARM", "ALARM")),
    (3, 3, "- - - - X", ("INSUFFICIENT_DATA", "retain", "ALARM", "OK")),
    (3, 3, "X - - - -", ("ALARM", "retain", "ALARM", "OK")),
    (3, 2, "0 - X - X", ("ALARM", "ALARM", "ALARM", "ALARM")),
    (3, 2, "0 0 X 0 X", ("ALARM", "ALARM", "ALARM", "ALARM")),
    (3, 2, "0 - X - -", ("OK", "OK", "ALARM", "OK")),
    (3, 2, "- - - - 0", ("OK", "OK", "ALARM", "OK")),
    (3, 2, "- - - - X", ("INSUFFICIENT_DATA", "retain", "ALARM", "OK")),
]


@pytest.mark.parametrize(("n", "m", "points", "expected"), GUIDE_TABLES)
def test_alarm_evaluation_reproduces_the_user_guide_tables(n, m, points, expected):
    for treat, state in zip(("missing", "ignore", "breaching", "notBreaching"), expected, strict=True):
        got = alarm_state(_points(points), evaluation_periods=n, datapoints_to_alarm=m,
                          comparison="GreaterThanThreshold", threshold=THRESHOLD, treat_missing_data=treat,
                          current="retained")
        assert got == ("retained" if state == "retain" else state), (points, treat)


def test_statistics():
    values = [float(v) for v in range(1, 101)]
    assert statistic(values, "Average") == 50.5
    assert statistic(values, "Sum") == 5050
    assert statistic(values, "SampleCount") == 100
    assert (statistic(values, "Minimum"), statistic(values, "Maximum")) == (1, 100)
    assert (statistic(values, "p95"), statistic(values, "p99.9")) == (95, 100)


def test_metric_math_sums_two_averages_and_fills_missing_ones():
    store = MetricStore(retain_minutes=10)
    store.put_many("RequestsInFlight", 0, [10.0, 20.0])
    store.put_many("RequestsWaiting", 0, [2.0, 4.0])
    ns = "GenaiConstructs/Inference"
    queries = (MetricQuery("running", MetricStat(ns, "RequestsInFlight", "Average"), return_data=False),
               MetricQuery("waiting", MetricStat(ns, "RequestsWaiting", "Average"), return_data=False),
               MetricQuery("demand", expression="running + waiting"))
    assert evaluate_queries(queries, store, 60) == 18.0
    assert evaluate_queries(queries, store, 120) is None  # minute 1 has no datapoint
    filled = (*queries[:2], MetricQuery("demand", expression="FILL(running, 0) + 1"))
    assert evaluate_queries(filled, store, 120) == 1.0
    ratio = (*queries[:2], MetricQuery("demand", expression="running / (waiting - 3)"))
    assert evaluate_queries(ratio, store, 60) is None  # division by zero drops the datapoint


def test_a_datapoint_is_evaluated_only_after_the_publishing_delay():
    store = MetricStore(retain_minutes=30)
    query = (MetricQuery("m", MetricStat("GenaiConstructs/Inference", "TimeToFirstToken", "p95")),)
    alarm = Alarm(AlarmSpec("A", query, 60, 1, 1, 2000.0, "GreaterThanOrEqualToThreshold", "notBreaching"))
    store.put_many("TimeToFirstToken", 4, [5000.0] * 20)  # minute 4: 240-300 s
    assert alarm.evaluate(store, 300) == "OK"  # the period just ended: not published yet
    assert alarm.evaluate(store, 360) == "ALARM"  # 60 s later it is
    assert alarm.last_value == 5000.0
    # No requests after minute 4: the guide's note holds, the alarm re-evaluates the last real datapoint while it is
    # inside the evaluation range (EvaluationPeriods + 2 periods), and only then treats the gap as not breaching.
    assert [alarm.evaluate(store, t) for t in (420, 480, 540)] == ["ALARM", "ALARM", "OK"]
