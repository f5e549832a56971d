"""How long does a 24-hour replay take? Target: under 30 s on a 2-core machine, under 1 GiB of memory.

The realtime chat example's fleet (examples/realtime_chat.py, read from its synthesized template) replays the
Azure LLM inference trace 2023 (conversation; Microsoft Azure, CC BY 4.0, ``shared/traces/`` beside this checkout)
for 24 hours at 2.6 times its rate, which keeps about 20 instances busy. The template's MaxSize (4) would cap the
fleet long before that, so the run lets the group grow to :data:`MAX_SIZE`. The template is synthesized first when
``--template`` is not given (a few seconds of CDK, not counted in the replay's time).

Run: .venv/bin/python benchmarks/simulate_speed.py [--template cdk.out/GenaiRealtimeChat.template.json]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from genai_constructs.simulation import build_workload, read_template, read_trace, simulate

HOURS = 24.0
RATE_SCALE = 2.6
"""2.6 x the conversation trace (~14 requests/s): about 20 instances in service on average at the template's
in-flight target (it swings between ~15 and the maximum: see docs/fleet-simulator.md)."""
MAX_SIZE = 24
"""Room above the ~20 instances the load needs, so the group is not pinned at its maximum."""


def synthesize() -> Path:
    """Synthesize the examples in a child process (CDK's memory is not the simulator's) and return the realtime
    chat template's path."""
    out = Path(tempfile.mkdtemp(prefix="simulate-speed-"))
    code = ("from aws_cdk import App; from examples import build_app; "
            f"app = App(outdir={str(out)!r}); build_app(app, local=False, nag=False); app.synth()")
    env = {**os.environ, "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20"}
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=Path(__file__).resolve().parents[1],
                          capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"cdk synth failed:\n{done.stderr}")
    return out / "GenaiRealtimeChat.template.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--template", type=Path, default=None)
    args = parser.parse_args()
    template = args.template or synthesize()
    spec = read_template(template).with_max_size(MAX_SIZE)
    start = time.perf_counter()
    workload = build_workload(read_trace("conv"), hours=HOURS, rate_scale=RATE_SCALE)
    report = simulate(spec, workload)
    wall = time.perf_counter() - start
    peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(f"replayed {report.requests:,} requests over {report.hours:g} h at x{RATE_SCALE} "
          f"({report.served:,} served, {report.timed_out:,} timed out)")
    in_service = report.series.in_service_instances
    print(f"fleet: {sum(in_service) / len(in_service):.1f} instances in service on average, peak "
          f"{report.peak_instances}, final {report.final_instances} (max {MAX_SIZE}); "
          f"{report.instance_hours:,.1f} instance-hours, ${report.usd:,.2f}, "
          f"${report.usd_per_million_tokens}/1M output tokens")
    print(f"users: p95 TTFT {report.p95_ttft_ms} ms, p95 TPOT {report.p95_tpot_ms} ms, "
          f"{report.slo_violation_minutes} of {report.minutes} minutes over the SLO")
    print(f"peak memory: {peak_rss_mib:,.0f} MiB (target < 1024)")
    print(f"wall time: {wall:.1f} s (target < 30 s)")


if __name__ == "__main__":
    main()
