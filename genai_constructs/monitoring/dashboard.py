"""Dashboard segment for an inference fleet: lays out widgets from the metric factory, creates nothing else."""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import aws_cloudwatch as cw

from genai_constructs.errors import ConfigurationError
from genai_constructs.monitoring.metrics import InferenceFleetMetricFactory
from genai_constructs.network import _checks as checks

WIDGET_WIDTH = 8
"""Three widgets per 24-unit dashboard row."""
WIDGET_HEIGHT = 6


def _graph(title: str, left: Sequence[cw.IMetric], *, right: Sequence[cw.IMetric] = (),
           annotations: Sequence[cw.HorizontalAnnotation] = ()) -> cw.GraphWidget:
    return cw.GraphWidget(title=title, left=list(left), right=list(right), left_annotations=list(annotations),
                          width=WIDGET_WIDTH, height=WIDGET_HEIGHT)


def inference_fleet_segment(
    metrics: InferenceFleetMetricFactory,
    *,
    title: str,
    ttft_target_ms: float,
    tpot_target_ms: float,
    in_flight_target: float | None = None,
    alarms: Sequence[cw.Alarm] = (),
    usd_per_instance_hour: float | None = None,
) -> list[list[cw.IWidget]]:
    """Rows of widgets: what users feel (TTFT, TPOT, errors), capacity (in flight, waiting, KV cache, hosts),
    validation (GPU, host, the load balancer's own timing)."""
    problems: list[str] = []
    checks.instance_of(problems, "metrics", metrics, InferenceFleetMetricFactory,
                       allowed="an InferenceFleetMetricFactory", fix="pass the fleet's metrics (fleet.metrics)")
    checks.text(problems, "title", title, fix="a heading for the segment, e.g. the fleet's name")
    for name, value in (("ttft_target_ms", ttft_target_ms), ("tpot_target_ms", tpot_target_ms)):
        checks.finite_number(problems, name, value, minimum=0, inclusive_minimum=False,
                             fix="the traffic's p95 target in milliseconds, e.g. traffic.p95_ttft_ms")
    checks.finite_number(problems, "in_flight_target", in_flight_target, minimum=0, inclusive_minimum=False,
                         optional=True, fix="the scaling target, e.g. fleet.in_flight_target, or None")
    checks.finite_number(problems, "usd_per_instance_hour", usd_per_instance_hour, minimum=0,
                         inclusive_minimum=False, optional=True, fix="the plan's price, e.g. plan.usd_per_hour")
    if problems:
        raise ConfigurationError("inference_fleet_segment", problems)
    in_flight_annotations = ([cw.HorizontalAnnotation(value=in_flight_target, label="scaling target")]
                             if in_flight_target is not None else [])
    rows: list[list[cw.IWidget]] = [
        [cw.TextWidget(markdown=f"## {title}\nTTFT and TPOT are measured per request on each instance (the request "
                       "proxy); scaling tracks requests in flight per instance and steps out on p95 TTFT and TPOT. "
                       "GPU utilization and ALB `TargetResponseTime` (time to response headers, not TTFT) are shown "
                       "for validation only; neither drives scaling.", width=24, height=2)],
        [
            _graph("Time to first token p50 / p95 / p99 (ms)",
                   [metrics.metric_time_to_first_token(p).with_(label=f"TTFT {p} (ms)") for p in ("p50", "p95", "p99")],
                   annotations=[cw.HorizontalAnnotation(value=ttft_target_ms, label="p95 TTFT target")]),
            _graph("Time per output token p50 / p95 / p99 (ms)",
                   [metrics.metric_time_per_output_token(p).with_(label=f"TPOT {p} (ms)")
                    for p in ("p50", "p95", "p99")],
                   annotations=[cw.HorizontalAnnotation(value=tpot_target_ms, label="p95 TPOT target")]),
            _graph("5XX rate (%) and requests", [metrics.metric_http_5xx_rate()],
                   right=[metrics.metric_request_count()]),
        ],
        [
            _graph("Requests in flight and waiting per instance",
                   [metrics.metric_requests_in_flight().with_(label="In flight per instance"),
                    metrics.metric_requests_waiting().with_(label="Waiting per instance")],
                   annotations=in_flight_annotations),
            _graph("KV cache used (%)", [metrics.metric_kv_cache_usage().with_(label="KV cache used, fullest instance (%)")]),
            _graph("Healthy / unhealthy hosts",
                   [m for tg in metrics.target_groups
                    for m in (metrics.metric_healthy_host_count(tg), metrics.metric_unhealthy_host_count(tg))]),
        ],
        [
            _graph("GPU utilization and memory (%)",
                   [metrics.metric_gpu_utilization(), metrics.metric_gpu_memory_used_percent()]),
            _graph("CPU, host memory, root disk (%)",
                   [metrics.metric_cpu_utilization(), metrics.metric_memory_used_percent(),
                    metrics.metric_disk_used_percent()]),
            _graph("ALB TargetResponseTime p95 (s): to response headers, not TTFT",
                   [metrics.metric_target_response_time("p95")],
                   right=[metrics.metric_request_count_per_target(tg) for tg in metrics.target_groups]),
        ],
        [
            _graph("Network (bytes)", [metrics.metric_network_in_bytes(), metrics.metric_network_out_bytes()]),
            _graph("Instances in service and tokens generated", [metrics.metric_in_service_instances()],
                   right=[metrics.metric_generated_tokens()]),
        ],
    ]
    if usd_per_instance_hour is not None:
        rows[-1].append(_graph("USD per 1M output tokens",
                               [metrics.metric_usd_per_million_tokens(usd_per_instance_hour)]))
    if alarms:
        rows.append([cw.AlarmStatusWidget(title="Alarms", alarms=list(alarms), width=24, height=3)])
    return rows
