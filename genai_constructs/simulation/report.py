"""What a run answers: the users' latency against the traffic's targets, and the bill. Plus the plot.

Latency percentiles are over the requests that were answered; requests refused, timed out or lost are counted
apart and, in the per-minute SLO verdict, count as answered never (an infinite TTFT in the minute they arrived).
A minute violates the SLO when the p95 TTFT or the p95 TPOT of the requests that arrived in it exceeds the
traffic's targets (the plan's ``p95_ttft_ms`` and ``p95_tpot_ms``); minutes without requests do not.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from genai_constructs.simulation.errors import SimulationInputError


@dataclass(frozen=True)
class MinuteSeries:
    """One value per simulated minute (None: no request arrived, so no latency)."""

    request_rate_per_s: tuple[float, ...]
    p95_ttft_ms: tuple[float | None, ...]
    p95_tpot_ms: tuple[float | None, ...]
    in_service_instances: tuple[int, ...]
    desired_capacity: tuple[int, ...]
    warm_pool_instances: tuple[int, ...]


@dataclass(frozen=True)
class SimulationReport:
    label: str
    scenario: str
    trace: str
    rate_scale: float
    hours: float
    requests: int
    served: int
    rejected: int
    """Refused: no healthy target (the ALB answers 503) or prompt + output above --max-model-len (vLLM's 400)."""
    timed_out: int
    """Waited in an instance's queue longer than the load balancer's idle timeout (the ALB answers 504)."""
    failed: int
    """Held by a wedged or terminated instance when it went away (connection reset)."""
    unfinished: int
    slo_violation_minutes: int
    minutes: int
    ttft_target_ms: float
    tpot_target_ms: float
    p50_ttft_ms: float | None
    p95_ttft_ms: float | None
    p99_ttft_ms: float | None
    p50_tpot_ms: float | None
    p95_tpot_ms: float | None
    p99_tpot_ms: float | None
    burst_recovery_minutes: float | None
    """From the burst's start to the minute after which in-service capacity (instances x concurrency per instance)
    covers the requests in flight or waiting for the rest of the burst; 0 when it never fell short; None when it
    was still short at the burst's end, or the scenario has no burst."""
    instance_hours: float
    warm_pool_stopped_hours: float
    usd: float
    usd_instances: float
    usd_volumes: float
    output_tokens: int
    usd_per_million_tokens: float | None
    peak_instances: int
    final_instances: int
    min_size: int
    max_size: int
    cold_launches: int
    warm_pool_resumes: int
    instances_replaced: int
    scale_out_activities: int
    scale_in_activities: int
    unmodelled: tuple[str, ...]
    series: MinuteSeries = field(repr=False)

    def to_dict(self, *, series: bool = False) -> dict[str, Any]:
        data = asdict(self)
        if not series:
            data.pop("series")
        data["unmodelled"] = list(self.unmodelled)
        return data

    def to_json(self, *, series: bool = False) -> str:
        return json.dumps(self.to_dict(series=series), indent=2)


def plot(reports: list[SimulationReport], path: str | Path) -> None:
    """A PNG of request rate, p95 TTFT and TPOT against their targets, and in-service instances, per minute.

    :raises SimulationInputError: matplotlib is not installed (it is in the ``dev`` extra).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SimulationInputError("--plot needs matplotlib: pip install 'genai-constructs[dev]' or matplotlib") from None
    figure, axes = plt.subplots(4, 1, figsize=(11, 10), sharex=True)
    first = reports[0]
    # A minute whose p95 is a request never answered (timed out, refused, lost) is drawn at the top of the axis.
    finite = [v for r in reports for v in r.series.p95_ttft_ms if v is not None and not math.isinf(v)]
    ttft_ceiling = max([first.ttft_target_ms * 10, *finite])
    for report in reports:
        minutes = [m / 60 for m in range(len(report.series.request_rate_per_s))]
        axes[0].plot(minutes, report.series.request_rate_per_s, label=report.label)
        ttft = [math.nan if v is None else min(v, ttft_ceiling) for v in report.series.p95_ttft_ms]
        tpot = [math.nan if v is None else v for v in report.series.p95_tpot_ms]
        for axis, values in ((axes[1], ttft), (axes[2], tpot)):
            axis.plot(minutes, values, label=report.label)
        axes[3].step(minutes, report.series.in_service_instances, where="post", label=report.label)
    axes[1].axhline(first.ttft_target_ms, color="red", linestyle="--", label="p95 target")
    axes[2].axhline(first.tpot_target_ms, color="red", linestyle="--", label="p95 target")
    axes[1].set_yscale("log")
    for axis, label in zip(axes, ("requests/s", "p95 TTFT (ms; top: unanswered)", "p95 TPOT (ms)",
                                  "instances in service"),
                           strict=True):
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
        axis.legend(loc="upper right", fontsize="small")
    axes[3].set_xlabel("hours")
    figure.suptitle(f"{first.trace}, {first.scenario}, rate x{first.rate_scale:g}")
    figure.tight_layout()
    try:
        figure.savefig(path, dpi=100)
    except OSError as error:
        raise SimulationInputError(f"--plot {path} cannot be written ({error.strerror})") from None
    finally:
        plt.close(figure)
