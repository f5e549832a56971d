"""Replay a real production trace through a planned fleet: does the plan hold its p95 targets under real arrivals?

Data: the Azure LLM inference trace 2023 (conversation), Microsoft Azure, CC BY 4.0, from the Azure Public Dataset
(`shared/traces/`, beside this checkout). Each request arrives at its timestamp with its own prompt and output lengths.

The fleet is the plan's peak fleet (max_instances, each capped at concurrency_per_instance, least-outstanding-requests
routing as the ALB does); a request that finds every instance at its cap waits in line. Every 20 ms of simulated time
each instance advances its sequences by one token per TPOT at its current concurrency (the estimator's figure for
that batch), after a prefill of the request's own prompt. Arrivals are scaled so the trace's mean concurrency meets
the plan's concurrent sessions.

Run: .venv/bin/python benchmarks/trace_replay.py [path/to/azure_llm_inference_2023_conv.csv]
"""

from __future__ import annotations

import csv
import statistics
import sys
from datetime import datetime
from pathlib import Path

from genai_constructs.planner import estimate, plan_inference
from genai_constructs.workload import ModelShape, RealtimeTraffic

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure_llm_inference_2023_conv.csv"
STEP_S = 0.02


def load(path: Path) -> list[tuple[float, int, int]]:
    rows = []
    with path.open() as f:
        for row in csv.DictReader(f):
            stamp = datetime.fromisoformat(row["TIMESTAMP"][:26])
            rows.append((stamp.timestamp(), int(row["ContextTokens"]), max(1, int(row["GeneratedTokens"]))))
    start = rows[0][0]
    return [(t - start, p, o) for t, p, o in rows]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else TRACE
    requests = load(path)
    prompt = round(statistics.mean(p for _, p, _ in requests))
    output = round(statistics.mean(o for _, _, o in requests))
    model = ModelShape.preset("llama-3.1-8b")
    traffic = RealtimeTraffic(
        concurrent_sessions=32, output_tokens_per_s_per_session=20, prompt_tokens=prompt, output_tokens=output
    )
    plan = plan_inference(model, traffic)
    cap, instances = plan.concurrency_per_instance, plan.max_instances
    at = {
        k: estimate(model, plan.instance_type, concurrency=k, prompt_tokens=prompt, output_tokens=output)
        for k in range(1, cap + 1)
    }
    prefill_s: dict[int, float] = {}  # filled lazily per power-of-two prompt length

    def prefill(tokens: int) -> float:
        bucket = min(8192, max(64, 1 << (tokens - 1).bit_length()))
        if bucket not in prefill_s:
            prefill_s[bucket] = (
                estimate(model, plan.instance_type, prompt_tokens=bucket, output_tokens=1).prefill_ms / 1e3
            )
        return prefill_s[bucket]

    # Scale arrival times so that mean concurrency (arrival rate x mean duration) matches the planned sessions.
    duration = requests[-1][0]
    mean_life = prefill(prompt) + output * at[max(1, cap // 2)].tpot_ms / 1e3
    scale = (len(requests) / duration) * mean_life / traffic.concurrent_sessions
    arrivals = [(t * scale, p, o) for t, p, o in requests]

    queue: list[tuple[float, int, int]] = []
    # per sequence: [arrived, ttft, tokens left, prefill left, generation time, tokens]
    active: list[list[list[float]]] = [[] for _ in range(instances)]
    ttft, tpot = [], []
    now, i = 0.0, 0
    while i < len(arrivals) or queue or any(active):
        while i < len(arrivals) and arrivals[i][0] <= now:
            queue.append(arrivals[i])
            i += 1
        while queue:
            target = min(range(instances), key=lambda n: len(active[n]))
            if len(active[target]) >= cap:
                break
            arrived, p, o = queue.pop(0)
            active[target].append([arrived, -1.0, float(o), prefill(p), 0.0, float(o)])
        for seqs in active:
            if not seqs:
                continue
            step_tpot = at[len(seqs)].tpot_ms / 1e3
            for seq in seqs:
                if seq[3] > 0:
                    seq[3] -= STEP_S
                    if seq[3] <= 0:
                        seq[1] = now - seq[0]
                    continue
                seq[2] -= STEP_S / step_tpot
                seq[4] += STEP_S
            for seq in [s for s in seqs if s[2] <= 0]:
                ttft.append(seq[1] * 1e3)
                tpot.append(seq[4] * 1e3 / seq[5])
                seqs.remove(seq)
        now += STEP_S

    print(f"trace {path.name}: {len(requests)} requests, mean prompt {prompt}, mean output {output} tokens")
    print(
        f"plan: {instances} x {plan.instance_type}, cap {cap} sequences each "
        f"(targets: p95 TPOT {traffic.tpot_target_ms:.0f} ms, p95 TTFT {traffic.p95_ttft_ms:.0f} ms)"
    )
    print(f"replayed {len(ttft)} requests over {now / 60:.0f} simulated minutes (arrival times x {scale:.2f})")
    print(
        f"TTFT p50 {percentile(ttft, 0.5):.0f} ms, p95 {percentile(ttft, 0.95):.0f} ms, p99 {percentile(ttft, 0.99):.0f} ms"
    )
    print(f"TPOT p50 {percentile(tpot, 0.5):.1f} ms, p95 {percentile(tpot, 0.95):.1f} ms")


if __name__ == "__main__":
    main()
