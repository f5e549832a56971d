"""Metric factory for an inference fleet: builds CloudWatch metrics, creates nothing.

Load balancer metrics come from ``AWS/ApplicationELB``; instance metrics from ``AWS/EC2`` (detailed monitoring,
aggregated per Auto Scaling group) and ``AWS/AutoScaling`` (group metrics); GPU, memory and disk from the
CloudWatch agent and generated tokens from the health sidecar, under the fleet's own namespace with a ``Fleet``
dimension (see ``genai_constructs.fleets._launch.cloudwatch_agent_config``); and what users feel, measured per request
by the request proxy on each instance (``genai_constructs.runtime.request_proxy``) as CloudWatch embedded metric
format, so CloudWatch computes the percentiles itself from every request's value.

The proxy's names are public API (dashboards and alarms outside this library read them): in ``METRIC_NAMESPACE`` of
the fleet, with dimension sets ``[Fleet]`` and ``[Fleet, ModelVersion]``:

* ``TimeToFirstToken`` and ``TimePerOutputToken`` (milliseconds, one value per request);
* ``RequestsInFlight`` and ``RequestsWaiting`` (per instance, sampled every 10 s from the server's own gauges, and
  published at zero traffic too, so an idle fleet reports 0 rather than nothing), ``KvCacheUsage`` (percent).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_elasticloadbalancingv2 as elbv2

from genai_constructs.errors import ConfigurationError
from genai_constructs.network import _checks as checks

DEFAULT_PERIOD = Duration.minutes(1)
"""One minute: ALB metrics and detailed monitoring are per minute, and the alarms act within minutes."""
COST_PERIOD = Duration.hours(1)
"""Cost per token is read hourly: per-minute token counts are too noisy to price."""


class InferenceFleetMetricFactory:
    """Every metric the inference fleet's dashboard, alarms and scaling use.

    :param load_balancer: the fleet's load balancer.
    :param target_groups: the target groups behind its listener (blue first).
    :param auto_scaling_group_names: the groups' names (tokens are fine), one per target group.
    :param namespace: the fleet's own namespace (CloudWatch agent and sidecar metrics).
    :param fleet: the value of the ``Fleet`` dimension those metrics carry.
    """

    def __init__(
        self,
        *,
        load_balancer: elbv2.IApplicationLoadBalancer,
        target_groups: Sequence[elbv2.ApplicationTargetGroup],
        auto_scaling_group_names: Sequence[str],
        namespace: str,
        fleet: str,
    ) -> None:
        problems: list[str] = []
        checks.cdk_interface(problems, "load_balancer", load_balancer, attributes=("load_balancer_arn", "metrics"),
                             optional=False, allowed="an elbv2.IApplicationLoadBalancer",
                             fix="pass the fleet's load balancer")
        if not isinstance(target_groups, (list, tuple)) or not target_groups or not all(
                isinstance(t, elbv2.ApplicationTargetGroup) for t in target_groups):
            problems.append(f"target_groups ({target_groups!r}) must be a non-empty list of "
                            "elbv2.ApplicationTargetGroup (blue first): pass [fleet.target_group]")
        if checks.string_list(problems, "auto_scaling_group_names", auto_scaling_group_names,
                              example="[group.auto_scaling_group_name]") and isinstance(target_groups, (list, tuple)) \
                and len(auto_scaling_group_names) != len(target_groups):
            problems.append(f"auto_scaling_group_names has {len(auto_scaling_group_names)} name(s) for "
                            f"{len(target_groups)} target group(s): give one group name per target group")
        checks.text(problems, "namespace", namespace, fix="the fleet's CloudWatch namespace, e.g. 'GenaiConstructs/"
                                                          "Inference'")
        checks.text(problems, "fleet", fleet, fix="the value of the fleets' Fleet dimension")
        if problems:
            raise ConfigurationError("InferenceFleetMetricFactory", problems)
        self.load_balancer = load_balancer
        self.target_groups = list(target_groups)
        self.auto_scaling_group_names = list(auto_scaling_group_names)
        self.namespace = namespace
        self.fleet = fleet

    # ---- Load balancer ------------------------------------------------------------------------------------------

    def metric_target_response_time(self, statistic: str = "p95", **options: object) -> cw.Metric:
        """ALB ``TargetResponseTime`` at ``statistic`` (seconds), for the dashboard only.

        It is the time until the target starts sending response headers (the access log's
        ``target_processing_time``; Elastic Load Balancing user guide, "CloudWatch metrics for your Application Load
        Balancer"): a streaming server sends its headers before the first token, and a non-streaming one after the
        last, so it is neither the time to first token nor the completion time. Never a scaling signal.
        """
        options.setdefault("label", f"TargetResponseTime {statistic} (to response headers, not TTFT)")
        return self.load_balancer.metrics.target_response_time(
            statistic=statistic, period=DEFAULT_PERIOD, **options)  # type: ignore[arg-type]

    def metric_request_count(self) -> cw.Metric:
        return self.load_balancer.metrics.request_count(period=DEFAULT_PERIOD, statistic="Sum")

    def metric_request_count_per_target(self, target_group: elbv2.ApplicationTargetGroup) -> cw.Metric:
        """``RequestCountPerTarget`` of one target group (the scaling signal)."""
        return target_group.metrics.request_count_per_target(period=DEFAULT_PERIOD, statistic="Sum")

    def metric_http_5xx_rate(self) -> cw.MathExpression:
        """Percent of requests answered 5XX, by the targets or by the load balancer itself."""
        return cw.MathExpression(
            expression="100 * (FILL(target5xx, 0) + FILL(elb5xx, 0)) / requests",
            using_metrics={
                "target5xx": self.load_balancer.metrics.http_code_target(
                    elbv2.HttpCodeTarget.TARGET_5XX_COUNT, period=DEFAULT_PERIOD, statistic="Sum"),
                "elb5xx": self.load_balancer.metrics.http_code_elb(
                    elbv2.HttpCodeElb.ELB_5XX_COUNT, period=DEFAULT_PERIOD, statistic="Sum"),
                "requests": self.metric_request_count(),
            },
            label="5XX rate (%)",
            period=DEFAULT_PERIOD,
        )

    def metric_target_group_5xx_rate(self, target_group: elbv2.ApplicationTargetGroup) -> cw.MathExpression:
        """Percent of one target group's requests its targets answered 5XX: one slot's own error rate (the load
        balancer's own 5XX carry no target group, so a blue/green rollout judges a slot by its targets' answers)."""
        return cw.MathExpression(
            expression="100 * FILL(target5xx, 0) / requests",
            using_metrics={
                "target5xx": target_group.metrics.http_code_target(
                    elbv2.HttpCodeTarget.TARGET_5XX_COUNT, period=DEFAULT_PERIOD, statistic="Sum"),
                "requests": target_group.metrics.request_count(period=DEFAULT_PERIOD, statistic="Sum"),
            },
            label="Target 5XX rate (%)", period=DEFAULT_PERIOD)

    def metric_healthy_host_count(self, target_group: elbv2.ApplicationTargetGroup) -> cw.Metric:
        return target_group.metrics.healthy_host_count(period=DEFAULT_PERIOD, statistic="Minimum")

    def metric_unhealthy_host_count(self, target_group: elbv2.ApplicationTargetGroup) -> cw.Metric:
        return target_group.metrics.unhealthy_host_count(period=DEFAULT_PERIOD, statistic="Maximum")

    # ---- Instances ----------------------------------------------------------------------------------------------

    def _agent(self, name: str, statistic: str, label: str) -> cw.Metric:
        return cw.Metric(namespace=self.namespace, metric_name=name, dimensions_map={"Fleet": self.fleet},
                         statistic=statistic, period=DEFAULT_PERIOD, label=label)

    def metric_gpu_utilization(self) -> cw.Metric:
        """GPU utilization (%), average over the fleet's GPUs (validation only: never a scaling signal)."""
        return self._agent("nvidia_smi_utilization_gpu", "Average", "GPU utilization (%)")

    def metric_gpu_memory_used_percent(self) -> cw.MathExpression:
        """GPU memory in use (%), the fullest GPU of the fleet."""
        return cw.MathExpression(
            expression="100 * used / total",
            using_metrics={"used": self._agent("nvidia_smi_memory_used", "Maximum", "used"),
                           "total": self._agent("nvidia_smi_memory_total", "Maximum", "total")},
            label="GPU memory used (%)", period=DEFAULT_PERIOD)

    def metric_memory_used_percent(self) -> cw.Metric:
        return self._agent("mem_used_percent", "Maximum", "Host memory used (%)")

    def metric_disk_used_percent(self) -> cw.Metric:
        return self._agent("disk_used_percent", "Maximum", "Root disk used (%)")

    # ---- What users feel: the request proxy's per-request and per-instance metrics -----------------------------

    def _proxy(self, name: str, statistic: str, model_version: str | None) -> cw.Metric:
        """One of the proxy's metrics, unlabelled: an alarm on a labelled metric renders as a metric-math query, and
        a plain ``MetricName`` is easier for people and tools (the fleet simulator) to read; graphs add labels."""
        dimensions = {"Fleet": self.fleet}
        if model_version is not None:
            dimensions["ModelVersion"] = model_version
        return cw.Metric(namespace=self.namespace, metric_name=name, dimensions_map=dimensions, statistic=statistic,
                         period=DEFAULT_PERIOD)

    def metric_time_to_first_token(self, statistic: str = "p95", *, model_version: str | None = None) -> cw.Metric:
        """``TimeToFirstToken`` (ms) at ``statistic``: request read to the first token event, streaming requests."""
        return self._proxy("TimeToFirstToken", statistic, model_version)

    def metric_time_per_output_token(self, statistic: str = "p95", *, model_version: str | None = None
                                     ) -> cw.Metric:
        """``TimePerOutputToken`` (ms) at ``statistic``: first to last token over the tokens after the first."""
        return self._proxy("TimePerOutputToken", statistic, model_version)

    def metric_requests_in_flight(self, statistic: str = "Average", *, model_version: str | None = None
                                  ) -> cw.Metric:
        """``RequestsInFlight``: sequences in the server's running batch, per instance (the server's gauge)."""
        return self._proxy("RequestsInFlight", statistic, model_version)

    def metric_requests_waiting(self, statistic: str = "Average", *, model_version: str | None = None) -> cw.Metric:
        """``RequestsWaiting``: requests queued (the server's queue plus the proxy's admission queue), per instance."""
        return self._proxy("RequestsWaiting", statistic, model_version)

    def metric_kv_cache_usage(self, statistic: str = "Maximum", *, model_version: str | None = None) -> cw.Metric:
        """``KvCacheUsage`` (%): the fullest instance's KV cache; near 100 % the server preempts and recomputes."""
        return self._proxy("KvCacheUsage", statistic, model_version)

    def metric_in_flight_requests(self) -> cw.Metric:
        """Requests in flight per instance, averaged over the fleet (``RequestsInFlight``)."""
        return self.metric_requests_in_flight()

    def metric_generated_tokens(self, period: Duration = COST_PERIOD) -> cw.Metric:
        """Output tokens the model servers generated (the servers' own counter, via the sidecar)."""
        return cw.Metric(namespace=self.namespace, metric_name="GeneratedTokens", dimensions_map={"Fleet": self.fleet},
                         statistic="Sum", period=period, label="Generated tokens")

    def _per_group(self, namespace: str, name: str, statistic: str, period: Duration = DEFAULT_PERIOD
                   ) -> dict[str, cw.IMetric]:
        prefix = re.sub(r"[^a-z0-9]", "", name.lower())
        return {
            f"{prefix}{i}": cw.Metric(namespace=namespace, metric_name=name, statistic=statistic, period=period,
                               dimensions_map={"AutoScalingGroupName": group})
            for i, group in enumerate(self.auto_scaling_group_names)
        }

    def _summed(self, namespace: str, name: str, statistic: str, label: str,
                period: Duration = DEFAULT_PERIOD) -> cw.MathExpression:
        metrics = self._per_group(namespace, name, statistic, period)
        return cw.MathExpression(expression=" + ".join(f"FILL({k}, 0)" for k in metrics), using_metrics=metrics,
                                 label=label, period=period)

    def metric_cpu_utilization(self) -> cw.MathExpression:
        metrics = self._per_group("AWS/EC2", "CPUUtilization", "Average")
        return cw.MathExpression(expression=f"MAX([{', '.join(metrics)}])", using_metrics=metrics,
                                 label="CPU utilization (%)", period=DEFAULT_PERIOD)

    def metric_network_in_bytes(self) -> cw.MathExpression:
        return self._summed("AWS/EC2", "NetworkIn", "Sum", "Network in (bytes)")

    def metric_network_out_bytes(self) -> cw.MathExpression:
        return self._summed("AWS/EC2", "NetworkOut", "Sum", "Network out (bytes)")

    def metric_in_service_instances(self, period: Duration = DEFAULT_PERIOD) -> cw.MathExpression:
        """Instances in service across the fleet's groups (``GroupInServiceInstances``)."""
        return self._summed("AWS/AutoScaling", "GroupInServiceInstances", "Average", "Instances in service", period)

    def metric_usd_per_million_tokens(self, usd_per_instance_hour: float) -> cw.MathExpression:
        """On-demand cost of one million generated tokens: instance hours times price over the tokens generated.

        Per ``COST_PERIOD``: (average instances in service x ``usd_per_instance_hour`` x hours in the period) /
        tokens generated in the period x 1e6. Counts on-demand compute only (no EBS, load balancer or transfer).
        """
        hours = COST_PERIOD.to_seconds() / 3600
        instances = self._per_group("AWS/AutoScaling", "GroupInServiceInstances", "Average", COST_PERIOD)
        expression = (f"1000000 * ({' + '.join(f'FILL({k}, 0)' for k in instances)}) * {usd_per_instance_hour:g}"
                      f" * {hours:g} / tokens")
        return cw.MathExpression(
            expression=expression,
            using_metrics={**instances, "tokens": self.metric_generated_tokens(COST_PERIOD)},
            label="USD per 1M output tokens (on-demand compute)", period=COST_PERIOD)
