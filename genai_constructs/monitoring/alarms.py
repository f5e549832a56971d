"""Alarm factory for an inference fleet: small threshold types in, alarms wired to an SNS topic out."""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_sns as sns
from constructs import Construct

from genai_constructs.monitoring.metrics import InferenceFleetMetricFactory

P99_LATENCY_FACTOR = 2.0
"""p99 alarms at twice the p95 latency target: p95 is what scaling holds; a p99 at twice that means the tail is
escaping scaling (a slow instance, a queue building) rather than the ordinary spread of prompt lengths."""
HTTP_5XX_RATE_PERCENT = 1.0
"""One request in a hundred failing is past ordinary client aborts and worth a page."""
GPU_MEMORY_USED_PERCENT = 97.0
"""vLLM preallocates about 90 % of GPU memory for weights and KV cache by design; above 97 % something outside the
server's pool (a second process, a leak, fragmentation) is taking memory and the next allocation fails."""
EVALUATION_PERIODS = 5
DATAPOINTS_TO_ALARM = 3
"""Three bad minutes out of five: quicker than a human would notice, slower than one noisy minute."""


@dataclass(frozen=True)
class InferenceAlarmThresholds:
    """Where the fleet's alarms trip. Default: each constant above."""

    p99_latency: Duration
    http_5xx_rate_percent: float = HTTP_5XX_RATE_PERCENT
    unhealthy_hosts: int = 1
    gpu_memory_used_percent: float | None = GPU_MEMORY_USED_PERCENT
    """None: no GPU memory alarm (Neuron instances publish no ``nvidia_gpu`` metrics)."""


class InferenceFleetAlarmFactory:
    """Creates the fleet's alarms under ``scope``, each notifying ``topic`` on ALARM and OK."""

    def __init__(self, scope: Construct, *, metrics: InferenceFleetMetricFactory, topic: sns.ITopic) -> None:
        self.scope = scope
        self.metrics = metrics
        self.action = cw_actions.SnsAction(topic)

    def _alarm(self, id: str, metric: cw.IMetric, threshold: float, description: str,
               comparison: cw.ComparisonOperator = cw.ComparisonOperator.GREATER_THAN_THRESHOLD) -> cw.Alarm:
        alarm = cw.Alarm(
            self.scope, id, metric=metric, threshold=threshold, comparison_operator=comparison,
            evaluation_periods=EVALUATION_PERIODS, datapoints_to_alarm=DATAPOINTS_TO_ALARM,
            treat_missing_data=cw.TreatMissingData.NOT_BREACHING, alarm_description=description)
        alarm.add_alarm_action(self.action)
        alarm.add_ok_action(self.action)
        return alarm

    def create(self, thresholds: InferenceAlarmThresholds) -> dict[str, cw.Alarm]:
        """Every alarm, keyed by a short name: p99 latency, 5XX rate, unhealthy hosts per target group, GPU memory."""
        alarms = {
            "p99_latency": self._alarm(
                "P99LatencyAlarm", self.metrics.metric_target_response_time("p99"),
                thresholds.p99_latency.to_seconds(),
                f"p99 TargetResponseTime above {thresholds.p99_latency.to_seconds():g} s"),
            "http_5xx_rate": self._alarm(
                "Http5xxRateAlarm", self.metrics.metric_http_5xx_rate(), thresholds.http_5xx_rate_percent,
                f"More than {thresholds.http_5xx_rate_percent:g} % of requests answered 5XX"),
        }
        for index, target_group in enumerate(self.metrics.target_groups):
            suffix = "" if index == 0 else "Green"
            alarms["unhealthy_hosts" if index == 0 else "unhealthy_hosts_green"] = self._alarm(
                f"UnhealthyHosts{suffix}Alarm", self.metrics.metric_unhealthy_host_count(target_group),
                thresholds.unhealthy_hosts, f"{thresholds.unhealthy_hosts} or more targets unhealthy",
                cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD)
        if thresholds.gpu_memory_used_percent is not None:
            alarms["gpu_memory"] = self._alarm(
                "GpuMemoryAlarm", self.metrics.metric_gpu_memory_used_percent(), thresholds.gpu_memory_used_percent,
                f"A GPU is more than {thresholds.gpu_memory_used_percent:g} % full")
        return alarms
