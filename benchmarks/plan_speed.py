"""How long does planning one workload over the whole catalog take, in every region? Target: < 50 ms per plan.

Each workload is planned over all 44 instance types (every replica layout each allows), once without a region (the
catalog's us-east-1 prices) and once in each of the regions the price data covers. The figure printed last is the
slowest region's median plan time for the slowest workload.

Run: .venv/bin/python benchmarks/plan_speed.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from genai_constructs.errors import GenaiConstructsError
from genai_constructs.planner import load_catalog, plan_embedding, plan_inference
from genai_constructs.planner.pricing import known_regions
from genai_constructs.workload import BatchTraffic, ModelShape, RealtimeTraffic

TARGET_MS = 50.0
REPEATS = 7

WORKLOADS: list[tuple[str, Callable[[str | None], object]]] = [
    (
        "llama-3.1-8b chat",
        lambda region: plan_inference(
            ModelShape.preset("llama-3.1-8b"),
            RealtimeTraffic(concurrent_sessions=32, output_tokens_per_s_per_session=20),
            region=region,
        ),
    ),
    (
        "llama-3.1-70b chat",
        lambda region: plan_inference(
            ModelShape.preset("llama-3.1-70b"),
            RealtimeTraffic(concurrent_sessions=64, output_tokens_per_s_per_session=15),
            region=region,
        ),
    ),
    (
        "mixtral-8x7b chat incl. Neuron",
        lambda region: plan_inference(
            ModelShape.preset("mixtral-8x7b"),
            RealtimeTraffic(concurrent_sessions=500, output_tokens_per_s_per_session=10),
            include_neuron=True,
            region=region,
        ),
    ),
    (
        "bge-large embedding",
        lambda region: plan_embedding(
            ModelShape.preset("bge-large-en-v1.5"),
            BatchTraffic(documents=2_000_000, tokens_per_document=800, deadline_hours=12, spot_ok=True),
            region=region,
        ),
    ),
]


def _median_ms(run: Callable[[str | None], object], region: str | None) -> float | None:
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        try:
            run(region)
        except GenaiConstructsError:
            return None  # nothing in that region can serve it (e.g. no large GPU offered there)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    load_catalog()  # parsed once per process; not part of a plan's cost
    regions: list[str | None] = [None, *known_regions()]
    for _, run in WORKLOADS:
        run(None)  # first call loads the price and model data
    print(
        f"{'workload':<34}{'no region':>10}{'median':>9}{'slowest':>9}  slowest region  (ms, {len(regions) - 1} regions)"
    )
    worst_ms, worst_at = 0.0, ""
    for name, run in WORKLOADS:
        per_region = {region: _median_ms(run, region) for region in regions}
        timed = {r: ms for r, ms in per_region.items() if ms is not None}
        slowest = max(timed, key=lambda r: timed[r])
        unplannable = [r for r, ms in per_region.items() if ms is None]
        print(
            f"{name:<34}{timed.get(None, float('nan')):>10.2f}{statistics.median(timed.values()):>9.2f}"
            f"{timed[slowest]:>9.2f}  {slowest or 'none'}"
            + (f"  (no plan possible in {len(unplannable)})" if unplannable else "")
        )
        if timed[slowest] > worst_ms:
            worst_ms, worst_at = timed[slowest], f"{name} in {slowest or 'no region'}"
    verdict = "meets" if worst_ms < TARGET_MS else "MISSES"
    print(
        f"slowest plan over the whole catalog in any region: {worst_ms:.1f} ms ({worst_at}); {verdict} the {TARGET_MS:.0f} ms target"
    )


if __name__ == "__main__":
    main()
