"""Alarm factory for an inference fleet: small threshold types in, alarms wired to an SNS topic out."""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from aws_cdk import aws_sns as sns
from constructs import Construct

from genai_constructs.errors import ConfigurationError
from genai_constructs.monitoring.metrics import InferenceFleetMetricFactory
from genai_constructs.network import _checks as checks

P99_LATENCY_FACTOR = 2.0
"""p99 alarms at twice the p95 TTFT and TPOT targets: p95 is what scaling holds; a p99 at twice that means the tail
is escaping scaling (a slow instance, a queue building) rather than the ordinary spread of prompt lengths."""
GPU_UNDERUSED_PERCENT = 15.0
"""Over-provisioning: the fleet runs above its minimum while its GPUs average under 15 % busy. A decode-bound server
at its planned batch keeps the GPU far busier; under 15 % for an hour the extra instances are paid for nothing."""
OVERPROVISIONED_PERIOD = Duration.minutes(15)
OVERPROVISIONED_EVALUATION_PERIODS = 4
"""An hour (4 x 15 minutes) of low use: scale-in takes 15 minutes by design, so only a lasting surplus alarms."""
HTTP_5XX_RATE_PERCENT = 1.0
"""One request in a hundred failing is past ordinary client aborts and worth a page."""
GPU_MEMORY_USED_PERCENT = 97.0
"""vLLM preallocates about 90 % of GPU memory for weights and KV cache by design; above 97 % something outside the
server's pool (a second process, a leak, fragmentation) is taking memory and the next allocation fails."""
EVALUATION_PERIODS = 5
DATAPOINTS_TO_ALARM = 3
"""Three bad minutes out of five: quicker than a human would notice, slower than one noisy minute."""
SLOT_EVALUATION_PERIODS = 3
SLOT_DATAPOINTS_TO_ALARM = 2
"""A slot's own alarms, which stop a rollout or an instance refresh: two bad minutes out of three. Quicker than the
fleet's paging alarms (a bad version should lose its traffic before most users notice), still not one noisy minute;
at the 5 % step the new slot's p95 is computed from every request it served in the minute (CloudWatch percentiles
over the per-request values), so it is not noisier than the fleet's."""


@dataclass(frozen=True)
class InferenceAlarmThresholds:
    """Where the fleet's alarms trip. Default: each constant above."""

    p99_time_to_first_token: Duration
    p99_time_per_output_token: Duration | None = None
    """None: no TPOT alarm."""
    http_5xx_rate_percent: float = HTTP_5XX_RATE_PERCENT
    unhealthy_hosts: int = 1
    gpu_memory_used_percent: float | None = GPU_MEMORY_USED_PERCENT
    """None: no GPU memory alarm (Neuron instances publish no ``nvidia_gpu`` metrics)."""
    gpu_underused_percent: float | None = GPU_UNDERUSED_PERCENT
    """None: no over-provisioning alarm (Neuron instances publish no ``nvidia_gpu`` metrics)."""
    min_instances: int = 2
    """The group's minimum: running above it with idle GPUs is what the over-provisioning alarm reports."""

    def __post_init__(self) -> None:
        # Every threshold becomes an alarm's number: a bool, nan or inf would reach CloudWatch as nonsense (or fail
        # jsii's type check after the alarm factory has begun adding alarms).
        problems: list[str] = []
        checks.instance_of(problems, "p99_time_to_first_token", self.p99_time_to_first_token, Duration,
                           allowed="a Duration", fix="e.g. Duration.millis(1000)")
        checks.instance_of(problems, "p99_time_per_output_token", self.p99_time_per_output_token, Duration,
                           optional=True, allowed="a Duration or None", fix="e.g. Duration.millis(100)")
        checks.finite_number(problems, "http_5xx_rate_percent", self.http_5xx_rate_percent, minimum=0, maximum=100,
                             inclusive_minimum=False, fix=f"a percentage, e.g. {HTTP_5XX_RATE_PERCENT:g}")
        checks.whole_number(problems, "unhealthy_hosts", self.unhealthy_hosts, minimum=1,
                            fix="the count of unhealthy targets that alarms, e.g. 1")
        for name, value, default in (("gpu_memory_used_percent", self.gpu_memory_used_percent, GPU_MEMORY_USED_PERCENT),
                                     ("gpu_underused_percent", self.gpu_underused_percent, GPU_UNDERUSED_PERCENT)):
            checks.finite_number(problems, name, value, minimum=0, maximum=100, inclusive_minimum=False,
                                 optional=True, fix=f"a percentage, e.g. {default:g}, or None for no alarm")
        checks.whole_number(problems, "min_instances", self.min_instances, minimum=0,
                            fix="the Auto Scaling group's minimum, e.g. 2")
        if problems:
            raise ConfigurationError("InferenceAlarmThresholds", problems)


class InferenceFleetAlarmFactory:
    """Creates the fleet's alarms under ``scope``, each notifying ``topic`` on ALARM and OK."""

    def __init__(self, scope: Construct, *, metrics: InferenceFleetMetricFactory, topic: sns.ITopic) -> None:
        problems: list[str] = []
        checks.instance_of(problems, "scope", scope, Construct, allowed="a construct", fix="pass the fleet or stack")
        checks.instance_of(problems, "metrics", metrics, InferenceFleetMetricFactory,
                           allowed="an InferenceFleetMetricFactory", fix="pass the fleet's metrics (fleet.metrics)")
        checks.cdk_interface(problems, "topic", topic, attributes=("topic_arn",), allowed="an sns.ITopic",
                             optional=False, fix="pass the topic alarms notify, e.g. fleet.topic")
        if problems:
            raise ConfigurationError("InferenceFleetAlarmFactory", problems)
        self.scope = scope
        self.metrics = metrics
        self.action = cw_actions.SnsAction(topic)

    def _alarm(self, id: str, metric: cw.IMetric, threshold: float, description: str,
               comparison: cw.ComparisonOperator = cw.ComparisonOperator.GREATER_THAN_THRESHOLD,
               evaluation_periods: int = EVALUATION_PERIODS, datapoints_to_alarm: int = DATAPOINTS_TO_ALARM,
               ) -> cw.Alarm:
        # Missing data is not breaching: no requests means no latency and no errors to page about.
        alarm = cw.Alarm(
            self.scope, id, metric=metric, threshold=threshold, comparison_operator=comparison,
            evaluation_periods=evaluation_periods, datapoints_to_alarm=datapoints_to_alarm,
            treat_missing_data=cw.TreatMissingData.NOT_BREACHING, alarm_description=description)
        alarm.add_alarm_action(self.action)
        alarm.add_ok_action(self.action)
        return alarm

    def create_slot(self, slot: str, *, model_version: str, target_group: elbv2.ApplicationTargetGroup,
                    p95_time_to_first_token: Duration, p95_time_per_output_token: Duration,
                    http_5xx_rate_percent: float = HTTP_5XX_RATE_PERCENT, unhealthy_hosts: int = 1,
                    version_alarms: bool = True) -> dict[str, cw.Alarm]:
        """One slot's own alarms, judged on its version's requests only (the ``ModelVersion`` dimension) and its own
        target group: p95 TTFT and p95 TPOT above the traffic's targets, its targets' 5XX rate, unhealthy hosts.

        These are what a blue/green rollout bakes against and what an instance refresh rolls back on. They notify
        the topic too, on ALARM and OK. Missing data is not breaching: a slot at zero instances serves nothing.
        ``version_alarms=False`` leaves out the two latency alarms (a slot holding another slot's version would
        judge that slot's requests again); the target-group alarms are the slot's own either way.
        """
        ttft_ms = p95_time_to_first_token.to_milliseconds()
        tpot_ms = p95_time_per_output_token.to_milliseconds()

        def alarm(id: str, metric: cw.IMetric, threshold: float, description: str,
                  comparison: cw.ComparisonOperator = cw.ComparisonOperator.GREATER_THAN_THRESHOLD) -> cw.Alarm:
            return self._alarm(f"{slot}{id}", metric, threshold, f"Slot {slot} ({model_version}): {description}",
                               comparison, evaluation_periods=SLOT_EVALUATION_PERIODS,
                               datapoints_to_alarm=SLOT_DATAPOINTS_TO_ALARM)

        target_group_alarms = {
            "http_5xx_rate": alarm("Http5xxRateAlarm", self.metrics.metric_target_group_5xx_rate(target_group),
                                   http_5xx_rate_percent,
                                   f"more than {http_5xx_rate_percent:g} % of its requests answered 5XX"),
            "unhealthy_hosts": alarm("UnhealthyHostsAlarm", self.metrics.metric_unhealthy_host_count(target_group),
                                     unhealthy_hosts, f"{unhealthy_hosts} or more of its targets unhealthy",
                                     cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD),
        }
        if not version_alarms:
            return target_group_alarms
        return {
            "p95_ttft": alarm("P95TimeToFirstTokenAlarm",
                              self.metrics.metric_time_to_first_token("p95", model_version=model_version), ttft_ms,
                              f"p95 time to first token above the {ttft_ms:g} ms target"),
            "p95_tpot": alarm("P95TimePerOutputTokenAlarm",
                              self.metrics.metric_time_per_output_token("p95", model_version=model_version), tpot_ms,
                              f"p95 time per output token above the {tpot_ms:g} ms target"),
            **target_group_alarms,
        }

    def create(self, thresholds: InferenceAlarmThresholds) -> dict[str, cw.Alarm]:
        """Every alarm, keyed by a short name: p99 TTFT and TPOT, 5XX rate, unhealthy hosts per target group, GPU
        memory, and over-provisioning."""
        if not isinstance(thresholds, InferenceAlarmThresholds):
            raise ConfigurationError("InferenceFleetAlarmFactory", [
                f"thresholds ({thresholds!r}) must be an InferenceAlarmThresholds, not a {type(thresholds).__name__}: "
                "e.g. InferenceAlarmThresholds(p99_time_to_first_token=Duration.millis(1000))"])
        ttft_ms = thresholds.p99_time_to_first_token.to_milliseconds()
        alarms = {
            "p99_ttft": self._alarm(
                "P99TimeToFirstTokenAlarm", self.metrics.metric_time_to_first_token("p99"), ttft_ms,
                f"p99 time to first token above {ttft_ms:g} ms (twice the p95 target): the tail is escaping "
                "scaling; see the slowest-requests query"),
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
        if thresholds.p99_time_per_output_token is not None:
            tpot_ms = thresholds.p99_time_per_output_token.to_milliseconds()
            alarms["p99_tpot"] = self._alarm(
                "P99TimePerOutputTokenAlarm", self.metrics.metric_time_per_output_token("p99"), tpot_ms,
                f"p99 time per output token above {tpot_ms:g} ms (twice the p95 target): batches are too large "
                "or an instance is slow")
        if thresholds.gpu_underused_percent is not None:
            gpu = self.metrics.metric_gpu_utilization().with_(period=OVERPROVISIONED_PERIOD)
            instances = self.metrics.metric_in_service_instances(OVERPROVISIONED_PERIOD)
            alarms["overprovisioned"] = self._alarm(
                "OverprovisionedAlarm",
                cw.MathExpression(
                    expression=(f"IF(instances > {thresholds.min_instances} AND gpu < "
                                f"{thresholds.gpu_underused_percent:g}, 1, 0)"),
                    using_metrics={"gpu": gpu, "instances": instances}, period=OVERPROVISIONED_PERIOD,
                    label="Above the minimum with idle GPUs (1 = yes)"),
                0,
                f"The fleet runs above its minimum ({thresholds.min_instances}) with GPUs under "
                f"{thresholds.gpu_underused_percent:g} % busy for an hour: capacity is paid for and unused "
                "(check the scale-in policy, or lower max_instances)",
                evaluation_periods=OVERPROVISIONED_EVALUATION_PERIODS,
                datapoints_to_alarm=OVERPROVISIONED_EVALUATION_PERIODS)
        return alarms
