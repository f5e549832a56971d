"""The simulator's per-instance model against published throughput-latency measurements it was never fitted to.

The fleet simulator (``genai_constructs.simulation.model``) serves requests on one instance with continuous batching,
prefills that stall decode, and the estimator's decode step at the live batch. This replays each published
benchmark row of ``../shared/reference/published_llm_benchmarks.csv`` as the benchmark ran it: a closed loop of
``concurrency`` clients, each sending its next request (the row's prompt and output lengths) as soon as the previous
one finishes, through one simulated instance, and compares the mean TPOT, mean TTFT or aggregate output tokens/s
with the measured value.

Each row is timed with the runtime profile of the runtime that measured it (the same mapping the estimator's own
accuracy check uses, ``planner.validation``): the simulator's dynamics are what this checks, on top of the step
times. Rows whose concurrency is "max" (the benchmark's own saturation point) are left out: the loop needs a count. The
rows the estimator's check leaves out are printed but not counted, for the same reason: the 64 sequences of row 7 do
not fit the A10G's KV cache and the benchmark measured vLLM preempting and recomputing, which the simulator does not
model (it admits a request only when its whole KV fits, so it predicts the throughput without the thrash).

Run: .venv/bin/python benchmarks/simulator_validation.py
"""

from __future__ import annotations

import csv
import math
import statistics
from array import array
from pathlib import Path

from genai_constructs.planner import estimate
from genai_constructs.planner.validation import (
    DECODE_ONLY_OUTPUT_TOKENS,
    EXCLUDED_ROWS,
    SHAREGPT_PROMPT_TOKENS,
    _runtime,
)
from genai_constructs.simulation.model import PREFILL_GRID, Instance, Requests, ServingModel
from genai_constructs.workload import ModelShape, Precision

ROWS = Path(__file__).resolve().parents[2] / "shared" / "reference" / "published_llm_benchmarks.csv"
GIB = 1024**3
ROUNDS_PER_CLIENT = 6
"""Each client sends this many requests; the first round (all prefills at once) is left out of the means."""
TICK_S = 0.005
"""The loop hands a finished client its next request at the end of the tick it finished in (5 ms)."""


def serving_model(model: ModelShape, instance_type: str, devices: int, runtime: str, concurrency: int,
                  prompt: int, output: int) -> ServingModel:
    steps = [0.0] + [estimate(model, instance_type, devices=devices, concurrency=b, prompt_tokens=prompt,
                              output_tokens=output, runtime=runtime).decode_step_ms / 1000 for b in
                     range(1, concurrency + 1)]
    grid = tuple(p for p in PREFILL_GRID if p < model.max_context)
    prefill = tuple(estimate(model, instance_type, devices=devices, prompt_tokens=p, output_tokens=1,
                             runtime=runtime).ttft_ms / 1000 for p in grid)
    probe = estimate(model, instance_type, devices=devices, concurrency=1, prompt_tokens=prompt,
                     output_tokens=output, runtime=runtime)
    room_gib = probe.memory.free_gib + probe.memory.kv_cache_gib
    return ServingModel(step_s=tuple(steps), prefill_grid=grid, prefill_s=prefill, max_num_seqs=concurrency,
                        kv_capacity_tokens=int(room_gib * GIB // model.kv_bytes_per_token), block_size=16,
                        max_model_len=model.max_context, precision=model.precision.value)


def closed_loop(serving: ServingModel, concurrency: int, prompt: int, output: int) -> dict[str, float]:
    """Mean TTFT and TPOT (ms) and aggregate output tokens/s of ``concurrency`` clients in a closed loop."""
    total = concurrency * ROUNDS_PER_CLIENT
    arrivals = array("d", [math.inf]) * total
    requests = Requests(arrivals, array("l", [prompt]) * total, array("l", [output]) * total, serving)
    instance = Instance(0, serving, requests, launched_at=0.0)
    instance.state = "serving"
    next_request = 0
    for _ in range(concurrency):
        arrivals[next_request] = 0.0
        instance.inbox.append(next_request)
        next_request += 1
    t = 0.0
    first_round_end = math.inf
    while len(requests.completed) < total and t < 3600:
        t += TICK_S
        instance.advance(t, idle_timeout_s=math.inf)
        finished = len(requests.completed)
        if finished >= concurrency and first_round_end == math.inf:
            first_round_end = t
        while next_request < total and next_request < concurrency + finished:
            arrivals[next_request] = t
            instance.inbox.append(next_request)
            next_request += 1
    measured = [i for i in requests.completed if i >= concurrency]
    done_at = [requests.arrival[i] + requests.ttft[i] + requests.tpot[i] * (output - 1) for i in measured]
    span = max(done_at) - first_round_end if done_at else math.nan
    return {
        "ttft_ms": statistics.fmean(requests.ttft[i] for i in measured) * 1000,
        "tpot_ms": statistics.fmean(requests.tpot[i] for i in measured) * 1000 if output > 1 else math.nan,
        "output_tokens_per_s": len(measured) * output / span if span and span > 0 else math.nan,
    }


def main() -> None:
    rows = list(csv.DictReader(ROWS.open()))
    errors = []
    print(f"{'row':>3}  {'workload':<50}{'runtime':<30}{'metric':<21}{'measured':>10}{'simulated':>11}{'error':>8}")
    for row in rows:
        if row["concurrency"] == "max" or ModelShape.preset(row["model"]).kind != "decoder":
            print(f"{row['id']:>3}  left out: concurrency {row['concurrency']!r} (the benchmark's own saturation)")
            continue
        model = ModelShape.preset(row["model"], precision=Precision(row["precision"]))
        prompt = int(row["prompt_tokens"] or SHAREGPT_PROMPT_TOKENS)
        output = int(row["output_tokens"] or DECODE_ONLY_OUTPUT_TOKENS)
        concurrency, devices = int(row["concurrency"]), int(row["devices_used"])
        runtime = _runtime(row["runtime"])
        serving = serving_model(model, row["instance_type"], devices, runtime, concurrency, prompt, output)
        simulated = closed_loop(serving, concurrency, prompt, output)[row["metric"]]
        measured = float(row["value"])
        error = (simulated - measured) / measured
        note = EXCLUDED_ROWS.get(int(row["id"]))
        if note is None:
            errors.append(abs(error))
        label = f"{row['model']} {row['precision']} {row['instance_type']} x{devices} c={concurrency} {prompt}/{output}"
        print(f"{row['id']:>3}  {label:<50}{row['runtime']:<30}{row['metric']:<21}{measured:>10.2f}"
              f"{simulated:>11.2f}{error:>+8.1%}" + (f"  (left out: {note})" if note else ""))
    print(f"simulator per-instance model: median absolute error {statistics.median(errors):.1%}, "
          f"worst {max(errors):.1%} over {len(errors)} rows")


if __name__ == "__main__":
    main()
