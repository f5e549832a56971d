"""Dashboard segment for an inference fleet: lays out widgets from the metric factory, creates nothing else."""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import aws_cloudwatch as cw

from genai_constructs.monitoring.metrics import InferenceFleetMetricFactory

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
    latency_target_s: float,
    alarms: Sequence[cw.Alarm] = (),
    usd_per_instance_hour: float | None = None,
) -> list[list[cw.IWidget]]:
    """Rows of widgets: what users feel (latency, errors), capacity (hosts, in-flight), validation (GPU, host)."""
    target = cw.HorizontalAnnotation(value=latency_target_s, label="p95 latency target")
    rows: list[list[cw.IWidget]] = [
        [cw.TextWidget(markdown=f"## {title}\nLatency is ALB `TargetResponseTime` (time to first byte: TTFT when "
                       "streaming). GPU utilization is shown for validation only; it never drives scaling.",
                       width=24, height=2)],
        [
            _graph("Latency p50 / p95 / p99 (s)",
                   [metrics.metric_target_response_time(p) for p in ("p50", "p95", "p99")], annotations=[target]),
            _graph("5XX rate (%) and requests", [metrics.metric_http_5xx_rate()],
                   right=[metrics.metric_request_count()]),
            _graph("Healthy / unhealthy hosts",
                   [m for tg in metrics.target_groups
                    for m in (metrics.metric_healthy_host_count(tg), metrics.metric_unhealthy_host_count(tg))]),
        ],
        [
            _graph("In-flight requests and requests per target",
                   [metrics.metric_in_flight_requests()],
                   right=[metrics.metric_request_count_per_target(tg) for tg in metrics.target_groups]),
            _graph("GPU utilization and memory (%)",
                   [metrics.metric_gpu_utilization(), metrics.metric_gpu_memory_used_percent()]),
            _graph("CPU, host memory, root disk (%)",
                   [metrics.metric_cpu_utilization(), metrics.metric_memory_used_percent(),
                    metrics.metric_disk_used_percent()]),
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
