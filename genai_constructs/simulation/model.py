"""One instance's model server, replayed in continuous time: continuous batching, the KV cache, a FIFO queue.

The execution-time predictor is the planner's own estimator (``genai_constructs.planner.estimate``), tabulated once
per run (:func:`serving_model`): the decode step of ``b`` live sequences at the trace's mean context, for every
``b`` up to ``--max-num-seqs``, and the time to first token of a prompt at a grid of lengths (interpolated). A run
never calls the estimator per request.

How a server with continuous batching behaves (vLLM's scheduler, which GpuInferenceFleet runs), as modelled:

* **Admission.** A request waits in one FIFO queue per instance (the request proxy's admission gate at
  ``--max-num-seqs``, runtime/request_proxy.py) and is admitted when a sequence slot is free and its KV cache fits:
  the simulator reserves the blocks of prompt + output at admission (``block_size`` tokens a block), so what runs
  always fits. vLLM admits on the prompt and preempts when the cache runs out; the ceiling on tokens in flight is the
  same, the recompute after a preemption is not modelled. The queue is first come, first served with head-of-line
  blocking, as vLLM's default FCFS policy.
* **Prefill.** An admitted prompt's prefill holds the devices (decode waits): the estimator's prefill interleaving
  term, made explicit. TTFT = queue wait + prefills ahead of it + its own prefill (+ the step overhead).
* **Decode.** Every running sequence gets one token per decode step, and a step of ``b`` sequences takes the
  table's time for ``b``; so each sequence advances on one shared token clock and a request's completion is an
  event on that clock. TPOT = (completion - first token) / (output - 1), the step time at the live batch plus the
  prefills that interrupted it.
* **GPU busy time.** Any sequence in decode or a prefill keeps the GPU busy: decode is memory-bandwidth bound and
  runs kernels at any batch size, so ``nvidia-smi`` utilization ("percent of time over the past sample period
  during which one or more kernels was executing", NVIDIA nvidia-smi documentation) reads ~100 % whenever an
  instance holds a sequence and 0 % when idle. That is the assumption the GPU-utilization policy variant rests on.
"""

from __future__ import annotations

import bisect
import heapq
import math
from array import array
from collections import deque
from dataclasses import dataclass

from genai_constructs.planner import estimate
from genai_constructs.simulation.errors import TemplateReadError
from genai_constructs.simulation.template import PlanFigures
from genai_constructs.workload import ModelShape, Precision

GIB = 1024**3
PREFILL_GRID = (1, 16, 64, 128, 256, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 32768, 65536, 131072)
"""Prompt lengths the estimator is asked for; TTFT in between is interpolated linearly (prefill is linear in tokens
for GEMMs and quadratic only in attention, so a grid this dense stays within a few percent)."""
WEIGHTS_MATCH_TOLERANCE = 0.02
"""The plan records weights_gib, not the precision: the preset precision whose weights match within 2 % is used."""

INF = math.inf
PENDING, DONE, REJECTED, TIMED_OUT, FAILED, UNFINISHED = 0, 1, 2, 3, 4, 5
"""Request outcomes: answered; refused (no healthy target, or longer than --max-model-len); waited past the load
balancer's idle timeout; lost on a wedged or terminated instance; still running when the run ended."""


@dataclass(frozen=True)
class ServingModel:
    """The estimator's figures for one run, tabulated."""

    step_s: tuple[float, ...]
    """Decode step seconds by live batch size (index 0 unused)."""
    prefill_grid: tuple[int, ...]
    prefill_s: tuple[float, ...]
    max_num_seqs: int
    kv_capacity_tokens: int
    block_size: int
    max_model_len: int
    precision: str

    def ttft_s(self, prompt_tokens: int) -> float:
        """Unloaded time to first token of a prompt (prefill + one step overhead), interpolated on the grid."""
        grid, values = self.prefill_grid, self.prefill_s
        if prompt_tokens <= grid[0]:
            return values[0]
        i = bisect.bisect_left(grid, prompt_tokens)
        if i >= len(grid):
            return values[-1] * prompt_tokens / grid[-1]
        lo, hi = grid[i - 1], grid[i]
        return values[i - 1] + (values[i] - values[i - 1]) * (prompt_tokens - lo) / (hi - lo)

    def kv_tokens(self, prompt: int, output: int) -> int:
        """KV cache tokens a request holds at its longest: whole blocks of prompt + output."""
        blocks = -(-(prompt + output) // self.block_size)
        return blocks * self.block_size


def model_shape(plan: PlanFigures) -> tuple[ModelShape, str | None]:
    """The plan's model preset at the precision whose weights match ``weights_gib``; a note when none does."""
    try:
        shape = ModelShape.preset(plan.model)
    except ValueError as error:
        raise TemplateReadError(f"the fleet serves {plan.model!r}, which is not a model preset the simulator can "
                                f"time ({error})") from None
    for precision in [shape.precision, *Precision]:
        candidate = shape.with_precision(precision)
        if abs(candidate.weight_bytes / GIB - plan.weights_gib) <= WEIGHTS_MATCH_TOLERANCE * max(plan.weights_gib, 1e-9):
            return candidate, None
    return shape, (f"no precision of {plan.model} has the plan's {plan.weights_gib} GiB of weights: timed at "
                   f"{shape.precision.value}")


def serving_model(plan: PlanFigures, mean_prompt: float, mean_output: float) -> tuple[ServingModel, list[str]]:
    """Tabulate the estimator for the plan's model, instance type and server settings at the trace's mean lengths."""
    notes: list[str] = []
    shape, note = model_shape(plan)
    if note:
        notes.append(note)
    prompt = max(1, min(round(mean_prompt), shape.max_context - 2))
    output = max(1, min(round(mean_output), shape.max_context - prompt))
    # Several replicas per instance are modelled as one server R times as wide: the request proxy sends each request
    # to the replica with the fewest in flight (runtime/request_proxy.py), so b sequences on the instance run as
    # ceil(b / R) per replica, each replica stepping its own batch in parallel; its KV cache is R caches.
    replicas = max(1, plan.replicas_per_instance)
    per_replica: dict[int, float] = {}
    steps = [0.0]
    for batch in range(1, plan.max_num_seqs * replicas + 1):
        width = -(-batch // replicas)
        if width not in per_replica:
            e = estimate(shape, plan.instance_type, devices=plan.devices_per_replica, concurrency=width,
                         prompt_tokens=prompt, output_tokens=output)
            per_replica[width] = e.decode_step_ms / 1000.0
        steps.append(per_replica[width])
    grid = tuple(p for p in PREFILL_GRID if p < shape.max_context)
    prefill = tuple(estimate(shape, plan.instance_type, devices=plan.devices_per_replica, prompt_tokens=p,
                             output_tokens=1).ttft_ms / 1000.0 for p in grid)
    kv_tokens = (int(plan.kv_cache_gib_available * GIB // shape.kv_bytes_per_token) * replicas
                 if shape.kv_bytes_per_token else 0)
    return ServingModel(step_s=tuple(steps), prefill_grid=grid, prefill_s=prefill,
                        max_num_seqs=plan.max_num_seqs * replicas,
                        kv_capacity_tokens=kv_tokens, block_size=max(1, plan.block_size),
                        max_model_len=plan.max_model_len, precision=shape.precision.value), notes


class Requests:
    """The run's requests as flat arrays (8 bytes each: a 24-hour replay holds a million and more)."""

    __slots__ = ("arrival", "output", "prefill", "kv", "ttft", "tpot", "status", "completed")

    def __init__(self, arrivals: array[float], prompts: array[int], outputs: array[int], model: ServingModel) -> None:
        """Tabulate each request's prefill and KV need; one longer than ``--max-model-len`` is rejected up front
        (vLLM validates prompt + max_tokens against it and answers 400)."""
        n = len(arrivals)
        self.arrival = arrivals
        self.output = outputs
        cache: dict[int, float] = {}
        prefill = array("d", bytes(8 * n))
        kv = array("l", bytes(array("l").itemsize * n))
        for i in range(n):
            p = prompts[i]
            value = cache.get(p)
            if value is None:
                value = cache[p] = model.ttft_s(p)
            prefill[i] = value
            kv[i] = model.kv_tokens(p, outputs[i])
        self.prefill = prefill
        self.kv = kv
        self.ttft = array("d", [INF]) * n
        self.tpot = array("d", [math.nan]) * n
        self.status = array("b", bytes(n))
        for i in range(n):
            if prompts[i] + outputs[i] > model.max_model_len or kv[i] > model.kv_capacity_tokens:
                self.status[i] = REJECTED
        self.completed: list[int] = []
        """Requests answered since the engine last collected them (for the per-request metrics)."""


class Instance:
    """One EC2 instance of the group: its lifecycle fields (set by the engine) and its model server."""

    __slots__ = ("id", "state", "launched_at", "serving_at", "warm_until", "drain_until", "wedged", "detect_at",
                 "from_pool", "t", "g", "stall", "running", "waiting", "inbox", "kv", "outstanding", "busy_s",
                 "busy_sampled_s", "model", "req")

    def __init__(self, iid: int, model: ServingModel, requests: Requests, launched_at: float) -> None:
        self.id = iid
        self.state = "pending"
        """pending (launching or resuming) -> serving -> draining -> terminated; or pool-preparing -> pool."""
        self.launched_at = launched_at
        self.serving_at = INF
        self.warm_until = INF
        self.drain_until = INF
        self.wedged = False
        self.detect_at = INF
        self.from_pool = False
        self.t = launched_at
        self.g = 0.0
        """The token clock: tokens each running sequence has received (sequences finish at fixed clock values)."""
        self.stall = 0.0
        """Decode is held until this time by prefills."""
        self.running: list[tuple[float, int]] = []
        """Heap of (token clock at which the sequence finishes, request)."""
        self.waiting: deque[int] = deque()
        self.inbox: list[int] = []
        """Requests the load balancer sent this tick, in arrival order."""
        self.kv = 0
        self.outstanding = 0
        """Requests sent and not yet answered, as the load balancer counts them for least outstanding requests."""
        self.busy_s = 0.0
        self.busy_sampled_s = 0.0
        self.model = model
        self.req = requests

    def advance(self, t_end: float, idle_timeout_s: float) -> None:
        """Run the server from ``self.t`` to ``t_end``: arrivals from the inbox at their times, admissions,
        prefills and completions in time order."""
        inbox = self.inbox
        waiting = self.waiting
        if self.wedged:
            # A wedged server accepts connections (the proxy queues them) and never answers.
            waiting.extend(inbox)
            inbox.clear()
            self.t = t_end
            return
        running = self.running
        if not running and not waiting and not inbox and self.stall <= self.t:
            self.t = t_end
            return
        req = self.req
        arrival, output, prefill, kvneed = req.arrival, req.output, req.prefill, req.kv
        ttft, tpot, status, completed = req.ttft, req.tpot, req.status, req.completed
        model = self.model
        step = model.step_s
        max_seqs = model.max_num_seqs
        kv_cap = model.kv_capacity_tokens
        heappush, heappop = heapq.heappush, heapq.heappop
        t, g, stall, kv = self.t, self.g, self.stall, self.kv
        busy = 0.0
        done = 0
        ai, na = 0, len(inbox)
        while True:
            b = len(running)
            if b:
                start = stall if stall > t else t
                tc = start + (running[0][0] - g) * step[b]
            else:
                tc = INF
            ta = arrival[inbox[ai]] if ai < na else INF
            tn = tc if tc < ta else ta
            stop = tn > t_end
            upto = t_end if stop else tn
            if b:
                start = stall if stall > t else t
                if upto > start:
                    g += (upto - start) / step[b]
                busy += upto - t
            elif stall > t:
                busy += (stall if stall < upto else upto) - t
            t = upto
            if stop:
                break
            if tc <= ta:
                g, idx = heappop(running)
                kv -= kvneed[idx]
                first = arrival[idx] + ttft[idx]
                out = output[idx]
                if out > 1:
                    tpot[idx] = (t - first) / (out - 1)
                status[idx] = DONE
                completed.append(idx)
                done += 1
            else:
                waiting.append(inbox[ai])
                ai += 1
            while waiting and len(running) < max_seqs:
                idx = waiting[0]
                need = kvneed[idx]
                if kv + need > kv_cap:
                    break
                waiting.popleft()
                if t - arrival[idx] > idle_timeout_s:
                    status[idx] = TIMED_OUT
                    done += 1
                    continue
                kv += need
                start = stall if stall > t else t
                stall = start + prefill[idx]
                ttft[idx] = stall - arrival[idx]
                heappush(running, (g + output[idx] - 1, idx))
        inbox.clear()
        self.t, self.g, self.stall, self.kv = t, g, stall, kv
        self.busy_s += busy
        self.outstanding -= done

    def lose_all(self) -> int:
        """The instance goes away: every request it holds fails (connections reset). Returns how many."""
        status = self.req.status
        lost = 0
        for _, idx in self.running:
            status[idx] = FAILED
            lost += 1
        for idx in (*self.waiting, *self.inbox):
            status[idx] = FAILED
            lost += 1
        self.running.clear()
        self.waiting.clear()
        self.inbox.clear()
        self.outstanding = 0
        self.kv = 0
        return lost
