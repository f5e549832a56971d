"""How long does planning one workload over the whole catalog take? Target: < 50 ms.

Run: .venv/bin/python benchmarks/plan_speed.py
"""

from __future__ import annotations

import statistics
import time

from genai_constructs.planner import load_catalog, plan_embedding, plan_inference
from genai_constructs.workload import BatchTraffic, ModelShape, RealtimeTraffic

WORKLOADS = [
    (
        "llama-3.1-8b chat",
        lambda: plan_inference(
            ModelShape.preset("llama-3.1-8b"),
            RealtimeTraffic(concurrent_sessions=32, output_tokens_per_s_per_session=20),
        ),
    ),
    (
        "llama-3.1-70b chat",
        lambda: plan_inference(
            ModelShape.preset("llama-3.1-70b"),
            RealtimeTraffic(concurrent_sessions=64, output_tokens_per_s_per_session=15),
        ),
    ),
    (
        "llama-3.1-8b chat incl. Neuron",
        lambda: plan_inference(
            ModelShape.preset("llama-3.1-8b"),
            RealtimeTraffic(concurrent_sessions=500, output_tokens_per_s_per_session=10),
            include_neuron=True,
        ),
    ),
    (
        "bge-large embedding",
        lambda: plan_embedding(
            ModelShape.preset("bge-large-en-v1.5"),
            BatchTraffic(documents=2_000_000, tokens_per_document=800, deadline_hours=12, spot_ok=True),
        ),
    ),
]


def main() -> None:
    load_catalog()  # parsed once per process; not part of a plan's cost
    print(f"{'workload':<34}{'median ms':>10}{'max ms':>10}  (over {len(load_catalog().instances)} instance types)")
    for name, run in WORKLOADS:
        times = []
        for _ in range(30):
            start = time.perf_counter()
            run()
            times.append((time.perf_counter() - start) * 1e3)
        print(f"{name:<34}{statistics.median(times):>10.2f}{max(times):>10.2f}")


if __name__ == "__main__":
    main()
