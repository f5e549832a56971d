"""``genai-constructs simulate``: the arguments and the command (the top-level CLI only registers the subcommand).

Every bad input ends in one sentence on stderr (or ``{"error": {"type": ..., "message": ...}}`` on stdout with ``--json``) and exit code 2,
never a traceback: arguments are taken as strings here and checked by the simulator's own functions, so argparse's
multi-line usage errors never stand in for a message.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from genai_constructs.errors import GenaiConstructsError

if TYPE_CHECKING:
    from genai_constructs.simulation.report import SimulationReport

COMPARE_GPU_TARGET_PERCENT = 70.0
"""The GPU-utilization target of the comparison policy: the figure most first attempts pick (70 % is also the
CPU example of the EC2 Auto Scaling target-tracking guide's walk-throughs)."""
DEFAULT_HOURS = "1"
"""A one-hour run: the length of the Azure traces, and quick."""


def add_simulate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("template", help="a synthesized template: cdk.out/<Stack>.template.json")
    parser.add_argument("--trace", default="conv", help="conv, code (the Azure 2023 traces) or a CSV path")
    parser.add_argument("--rate-scale", default=None, help="multiply the trace's request rate (default 1)")
    parser.add_argument("--peak-sessions", default=None,
                        help="instead of --rate-scale: scale the trace so its busiest minute holds this many "
                             "requests in flight at the plan's estimated TTFT and TPOT")
    parser.add_argument("--scenario", default="steady", help="steady, ramp, burst, stop or failure")
    parser.add_argument("--hours", default=DEFAULT_HOURS, help=f"simulated hours (default {DEFAULT_HOURS})")
    parser.add_argument("--max-size", default=None, help="override the group's MaxSize (a what-if for sizing)")
    parser.add_argument("--plot", default=None, help="write a PNG of rate, p95 latencies and fleet size")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--series", action="store_true", help="with --json: include the per-minute series")
    parser.add_argument("--compare", action="store_true",
                        help="also run GPU-utilization tracking at 70 %% and the template without its warm pool")


def _positive(name: str, text: str | None, default: float | None) -> float | None:
    from genai_constructs.simulation.errors import ScenarioError

    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ScenarioError(f"{name} must be a positive finite number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ScenarioError(f"{name} must be a positive finite number, got {text!r}")
    return value


class _Progress:
    """A one-line progress indication on stderr, only when stderr is a terminal."""

    def __init__(self, stream: TextIO, label: str) -> None:
        self.stream, self.label = stream, label

    def __call__(self, fraction: float) -> None:
        self.stream.write(f"\rsimulating {self.label}: {fraction * 100:3.0f} %")
        self.stream.flush()
        if fraction >= 1:
            self.stream.write("\r" + " " * (len(self.label) + 20) + "\r")


def run_simulate(args: argparse.Namespace) -> int:
    """Run the command; returns the exit code (0, or 2 on bad input)."""
    try:
        return _run(args)
    except GenaiConstructsError as error:
        message = str(error)
        if args.json:
            # The same shape as every other subcommand's --json error (genai_constructs/cli.py).
            print(json.dumps({"error": {"type": type(error).__name__, "message": message}}))
        else:
            print(f"error: {message}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    from genai_constructs.simulation.engine import simulate
    from genai_constructs.simulation.errors import ScenarioError
    from genai_constructs.simulation.report import plot
    from genai_constructs.simulation.template import read_template
    from genai_constructs.simulation.trace import SCENARIOS, build_workload, rate_scale_for_peak_sessions, read_trace

    if args.scenario not in SCENARIOS:
        raise ScenarioError(f"scenario {args.scenario!r} does not exist: choose one of {', '.join(SCENARIOS)}")
    hours = _positive("--hours", args.hours, 1.0)
    assert hours is not None
    rate_scale = _positive("--rate-scale", args.rate_scale, None)
    peak = _positive("--peak-sessions", args.peak_sessions, None)
    max_size = _positive("--max-size", args.max_size, None)
    if rate_scale is not None and peak is not None:
        raise ScenarioError("give --rate-scale or --peak-sessions, not both")
    if max_size is not None and max_size != int(max_size):
        raise ScenarioError(f"--max-size must be a whole number of instances, got {args.max_size!r}")
    spec = read_template(args.template)
    if max_size is not None:
        spec = spec.with_max_size(int(max_size))
    trace = read_trace(args.trace)
    if peak is not None:
        rate_scale = rate_scale_for_peak_sessions(trace, peak, spec.plan.estimate_ttft_ms, spec.plan.estimate_tpot_ms)
    workload = build_workload(trace, hours=hours, rate_scale=rate_scale or 1.0, scenario=args.scenario)
    variants = [("template", spec)]
    if args.compare:
        variants.append((f"gpu-utilization-{COMPARE_GPU_TARGET_PERCENT:g}",
                         spec.with_gpu_utilization_tracking(COMPARE_GPU_TARGET_PERCENT)))
        if spec.warm_pool is not None:
            variants.append(("no-warm-pool", spec.without_warm_pool()))
    reports: list[SimulationReport] = []
    for label, variant in variants:
        progress = _Progress(sys.stderr, label) if sys.stderr.isatty() else None
        reports.append(simulate(variant, workload, label=label, progress=progress))
    if args.plot:
        plot(reports, args.plot)
    if args.json:
        if args.compare:
            print(json.dumps({"variants": [r.to_dict(series=args.series) for r in reports]}, indent=2))
        else:
            print(reports[0].to_json(series=args.series))
    else:
        _print_tables(reports)
    return 0


def _fmt(value: float | None, digits: int = 0, prefix: str = "") -> str:
    if value is None:
        return "n/a"
    return f"{prefix}{value:,.{digits}f}"


def _print_tables(reports: list[SimulationReport]) -> None:
    from rich.console import Console
    from rich.table import Table

    # Piped output gets a wide table (rich would wrap at 80 columns), a terminal its own width.
    console = Console(width=None if sys.stdout.isatty() else 150)
    first = reports[0]
    table = Table(title=f"{first.trace}, {first.scenario}, rate x{first.rate_scale:.3g}, {first.hours:g} h "
                        f"(targets: p95 TTFT {first.ttft_target_ms:g} ms, p95 TPOT {first.tpot_target_ms:g} ms)",
                  title_justify="left")
    table.add_column("figure", style="bold")
    for r in reports:
        table.add_column(r.label, justify="right")
    rows: list[tuple[str, list[str]]] = []

    def row(name: str, cell: Callable[[SimulationReport], str]) -> None:
        rows.append((name, [cell(r) for r in reports]))

    row("SLO-violation minutes", lambda r: f"{r.slo_violation_minutes} of {r.minutes}")
    row("p50 / p95 / p99 TTFT (ms)", lambda r: f"{_fmt(r.p50_ttft_ms)} / {_fmt(r.p95_ttft_ms)} / {_fmt(r.p99_ttft_ms)}")
    row("p50 / p95 / p99 TPOT (ms)",
        lambda r: f"{_fmt(r.p50_tpot_ms, 1)} / {_fmt(r.p95_tpot_ms, 1)} / {_fmt(r.p99_tpot_ms, 1)}")
    row("requests (served)", lambda r: f"{r.requests:,} ({r.served:,})")
    row("rejected / timed out / lost", lambda r: f"{r.rejected:,} / {r.timed_out:,} / {r.failed:,}")
    if first.burst_recovery_minutes is not None or first.scenario == "burst":
        row("burst recovery (min)", lambda r: _fmt(r.burst_recovery_minutes, 0) if r.burst_recovery_minutes is not None
            else "not within the burst")
    row("instance-hours", lambda r: f"{r.instance_hours:,.1f}")
    row("cost (instances + EBS)", lambda r: f"${r.usd:,.2f} (${r.usd_instances:,.2f} + ${r.usd_volumes:,.2f})")
    row("$ per 1M output tokens", lambda r: _fmt(r.usd_per_million_tokens, 3, "$"))
    row("peak / final instances", lambda r: f"{r.peak_instances} / {r.final_instances} (of {r.min_size}-{r.max_size})")
    row("launches cold / from pool", lambda r: f"{r.cold_launches} / {r.warm_pool_resumes}")
    row("scale-out / scale-in", lambda r: f"{r.scale_out_activities} / {r.scale_in_activities}")
    for name, cells in rows:
        table.add_row(name, *cells)
    console.print(table)
    notes = sorted({n for r in reports for n in r.unmodelled})
    for note in notes:
        console.print(f"[yellow]not modelled:[/] {note}", highlight=False)
