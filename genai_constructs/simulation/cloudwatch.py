"""CloudWatch as the fleet's scaling sees it: datapoints per period, a publishing delay, alarm evaluation.

* **Datapoints.** The store keeps each metric's raw values per minute and computes a period's statistic (Average,
  Sum, SampleCount, Minimum, Maximum, pNN) over the minutes of the period. A period with no value is *missing*: the
  request proxy's gauges are published every 10 s zero included (runtime/request_proxy.py), but per-request
  latencies only when requests complete, and ALB metrics only "when requests are flowing through the load
  balancer ... If there are no requests flowing through the load balancer or no data for a metric, the metric is
  not reported" (ELB user guide, "CloudWatch metrics for your Application Load Balancer").
* **Publishing delay.** A period's datapoint becomes visible :data:`PUBLISH_DELAY_S` after the period ends:
  embedded-metric-format metrics exist only once "CloudWatch Logs needs to process logs so they can be
  transformed into metrics" (CloudWatch user guide, "Setting alarms on metrics created with the embedded metric
  format"; the agent flushes every 5 s by default), and the ALB "measures and sends its metrics in 60-second
  intervals" (ELB user guide, as above).
* **Alarm evaluation**, exactly as the CloudWatch user guide's "How alarm state is evaluated when data is missing"
  describes it (and its two tables are reproduced in the tests): CloudWatch retrieves more datapoints than
  EvaluationPeriods (the *evaluation range*, :data:`EXTRA_RETRIEVED_DATAPOINTS` more); with enough real datapoints
  it evaluates the most recent N of them and ignores the missing-data setting; with fewer it fills the missing ones
  with the TreatMissingData result; ALARM when at least DatapointsToAlarm breach, else OK; all missing gives
  INSUFFICIENT_DATA (``missing``), keeps the state (``ignore``), ALARM (``breaching``) or OK (``notBreaching``).
* **Metric math**: + - * / and ``FILL(m, value)`` over the query's ids (template.expression_problem lists what is
  refused).
"""

from __future__ import annotations

import ast
import math
from collections.abc import Iterable
from dataclasses import dataclass

from genai_constructs.simulation.template import PERCENTILE, AlarmSpec, MetricQuery

PUBLISH_DELAY_S = 60
"""Seconds from a period's end until its datapoint can be evaluated (see the module docstring)."""
EXTRA_RETRIEVED_DATAPOINTS = 2
"""The evaluation range: the user guide's example retrieves the 5 most recent datapoints for 3 evaluation periods."""

OK, ALARM, INSUFFICIENT_DATA = "OK", "ALARM", "INSUFFICIENT_DATA"


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of unsorted values; CloudWatch's own is an estimate of the same."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def statistic(values: list[float], stat: str) -> float:
    if stat == "Average":
        return sum(values) / len(values)
    if stat == "Sum":
        return sum(values)
    if stat == "SampleCount":
        return float(len(values))
    if stat == "Minimum":
        return min(values)
    if stat == "Maximum":
        return max(values)
    match = PERCENTILE.match(stat)
    if match is None:
        raise ValueError(f"statistic {stat} is not computed")
    return percentile(values, float(match.group(1)))


class MetricStore:
    """Raw values per (metric name, minute). Old minutes are dropped once no alarm can look at them."""

    def __init__(self, retain_minutes: int) -> None:
        self.minutes: dict[str, dict[int, list[float]]] = {}
        self.retain_minutes = retain_minutes
        self._cache: dict[tuple[str, str, int, int], float | None] = {}

    def put(self, name: str, minute: int, value: float) -> None:
        series = self.minutes.setdefault(name, {})
        bucket = series.get(minute)
        if bucket is None:
            series[minute] = [value]
        else:
            bucket.append(value)

    def put_many(self, name: str, minute: int, values: Iterable[float]) -> None:
        self.minutes.setdefault(name, {}).setdefault(minute, []).extend(values)

    def value(self, name: str, stat: str, first_minute: int, minutes: int) -> float | None:
        """The statistic over ``minutes`` minutes from ``first_minute``; None when the period has no value."""
        key = (name, stat, first_minute, minutes)
        if key in self._cache:
            return self._cache[key]
        series = self.minutes.get(name, {})
        values: list[float] = []
        for m in range(first_minute, first_minute + minutes):
            values.extend(series.get(m, ()))
        result = statistic(values, stat) if values else None
        self._cache[key] = result
        return result

    def prune(self, now_minute: int) -> None:
        oldest = now_minute - self.retain_minutes
        for series in self.minutes.values():
            for m in [m for m in series if m < oldest]:
                del series[m]
        self._cache = {k: v for k, v in self._cache.items() if k[2] >= oldest}


def evaluate_queries(queries: tuple[MetricQuery, ...], store: MetricStore, period_end_s: int) -> float | None:
    """The query's returned value for the period ending at ``period_end_s``; None when a needed metric is missing."""
    values: dict[str, float | None] = {}
    for q in queries:
        if q.metric is not None:
            minutes = max(1, q.metric.period_s // 60)
            first = period_end_s // 60 - minutes
            values[q.id] = store.value(q.metric.metric_name, q.metric.stat, first, minutes)
    for q in queries:
        if q.expression is not None:
            values[q.id] = _evaluate_expression(q.expression, values)
    returned = next(q for q in queries if q.return_data)
    return values.get(returned.id)


class _Missing(Exception):
    pass


def _evaluate_expression(expression: str, values: dict[str, float | None]) -> float | None:
    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return float(node.value)
        if isinstance(node, ast.Name):
            value = values.get(node.id)
            if value is None:
                raise _Missing
            return value
        if isinstance(node, ast.UnaryOp):
            operand = walk(node.operand)
            return -operand if isinstance(node.op, ast.USub) else operand
        if isinstance(node, ast.BinOp):
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Add):
                return left + right
            if isinstance(node.op, ast.Sub):
                return left - right
            if isinstance(node.op, ast.Mult):
                return left * right
            if right == 0:
                raise _Missing  # CloudWatch drops a datapoint whose expression divides by zero
            return left / right
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "FILL":
            try:
                return walk(node.args[0])
            except _Missing:
                return walk(node.args[1])
        raise ValueError(f"metric math node {type(node).__name__} is not supported")

    try:
        return walk(ast.parse(expression, mode="eval"))
    except _Missing:
        return None


def breaches(value: float, comparison: str, threshold: float) -> bool:
    if comparison == "GreaterThanOrEqualToThreshold":
        return value >= threshold
    if comparison == "GreaterThanThreshold":
        return value > threshold
    if comparison == "LessThanThreshold":
        return value < threshold
    return value <= threshold


def alarm_state(points: list[float | None], *, evaluation_periods: int, datapoints_to_alarm: int, comparison: str,
                threshold: float, treat_missing_data: str, current: str) -> str:
    """The state CloudWatch sets from the datapoints of the evaluation range (oldest first); see the module doc."""
    n, m = evaluation_periods, datapoints_to_alarm
    real = [p for p in points if p is not None]
    if len(real) >= n:
        hits = sum(breaches(v, comparison, threshold) for v in real[-n:])
        return ALARM if hits >= m else OK
    if not real:
        return {"missing": INSUFFICIENT_DATA, "ignore": current, "breaching": ALARM, "notBreaching": OK}[
            treat_missing_data]
    hits = sum(breaches(v, comparison, threshold) for v in real)
    fill = n - len(real)
    if treat_missing_data == "breaching":
        return ALARM if hits + fill >= m else OK
    if treat_missing_data == "notBreaching" or hits >= m:
        return ALARM if hits >= m else OK
    if hits < len(real):
        return OK  # a real non-breaching datapoint among too few breaching ones
    # Only breaching datapoints, fewer than DatapointsToAlarm: the guide's tables give INSUFFICIENT_DATA for
    # "- - - - X" and ALARM for "X - - - -" (the metric stopped after breaching) when missing data is missing.
    if treat_missing_data == "ignore":
        return current
    return ALARM if points[-1] is None else INSUFFICIENT_DATA


@dataclass
class Alarm:
    """An alarm's configuration and its current state (INSUFFICIENT_DATA until first evaluated, as PutMetricAlarm
    sets it)."""

    spec: AlarmSpec
    state: str = INSUFFICIENT_DATA
    last_value: float | None = None

    def evaluate(self, store: MetricStore, now_s: int) -> str:
        """Evaluate at ``now_s`` on the periods already published; returns the new state."""
        period = self.spec.period_s
        latest_end = (now_s - PUBLISH_DELAY_S) // period * period
        count = self.spec.evaluation_periods + EXTRA_RETRIEVED_DATAPOINTS
        points = [evaluate_queries(self.spec.queries, store, latest_end - k * period) if latest_end - k * period > 0
                  else None for k in range(count - 1, -1, -1)]
        self.last_value = next((p for p in reversed(points) if p is not None), None)
        self.state = alarm_state(points, evaluation_periods=self.spec.evaluation_periods,
                                 datapoints_to_alarm=self.spec.datapoints_to_alarm, comparison=self.spec.comparison,
                                 threshold=self.spec.threshold, treat_missing_data=self.spec.treat_missing_data,
                                 current=self.state)
        return self.state
