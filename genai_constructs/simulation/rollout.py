"""A blue/green rollout replayed: the fleet's two slots behind one listener, the traffic split by the listener's
weights, the weights moved by the rollout state machine's own steps, bakes and alarm reads, as the template defines
them (``AWS::StepFunctions::StateMachine``, fleets/rollout.py ``rollout_definition``).

What is modelled, and its source:

* **Weighted routing** (Elastic Load Balancing user guide, "Listener rules", forward action with weighted target
  groups): each request goes to a target group in proportion to its weight; here deterministically (a running sum),
  so a 5 % step sends exactly every twentieth request to the new slot. Inside each target group, the group's own
  routing (least outstanding requests) as in ``engine.py``.
* **The deploy that names the new slot live** (``GpuInferenceFleet``: the idle slot keeps no warm pool): the new
  slot's warm pool is filled (each instance prepared under the launch hook, the plan's cold time) and the old slot's
  pool is emptied, at the rollout's start.
* **The state machine**: hold the old slot at its capacity (MinSize = desired); wait, every ``ready_poll_s``, for
  the new slot's pool to hold that many prepared instances; size the new slot like the old one (instances resume
  from the pool: the plan's warm time); wait for that many healthy targets (at most ``ready_timeout_s``); then each
  step's weights, baked ``bake_s`` with the new slot's own alarms read every ``alarm_poll_s``; an alarm in ALARM
  sends every request back to the old slot at once. After the last bake the new slot keeps the fleet's minimum and
  the old one scales to zero (its instances drain for the deregistration delay).
* **Each slot scales itself** on its own version's metrics (the template's policies, per slot: their ``ModelVersion``
  dimension keeps the versions apart), so each slot has its own metric store here.

Not modelled: the slots' 5XX-rate and unhealthy-host alarms (the simulator publishes no ALB error metrics: a slot
here fails only by latency), and the instance refresh of the new slot (it has nothing in service to replace).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from genai_constructs.simulation.cloudwatch import ALARM, Alarm, percentile
from genai_constructs.simulation.engine import _Fleet
from genai_constructs.simulation.errors import ScenarioError, TemplateReadError
from genai_constructs.simulation.model import DONE, INF, REJECTED
from genai_constructs.simulation.template import PLAN_METADATA_KEY, AlarmSpec, FleetSpec, _load, _Reader
from genai_constructs.simulation.trace import Workload


@dataclass(frozen=True)
class RolloutSpec:
    """The rollout as the template's state machine runs it."""

    steps: tuple[int, ...]
    """Percent of requests on the new slot at each step, in order."""
    bake_s: int
    alarm_poll_s: int
    ready_poll_s: int
    ready_timeout_s: int
    min_instances: int
    """The floor the new slot keeps after the rollout (``minInstances`` of the execution input)."""
    alarms: tuple[AlarmSpec, ...]
    """The new slot's own alarms the bakes read (those the simulator can evaluate)."""


@dataclass(frozen=True)
class RolloutReport:
    """What users saw during the replay, and what the rollout did."""

    outcome: str
    """"complete", "rolled back" (``rolled_back_because`` says which alarm), "not ready" or "unfinished"."""
    started_at_s: float
    shifted_at_s: tuple[tuple[float, int], ...]
    """(seconds, percent on the new slot) of every weight change, the rollback's included."""
    ended_at_s: float | None
    rolled_back_because: tuple[str, ...]
    ttft_target_ms: float
    tpot_target_ms: float
    p95_ttft_ms: float | None
    p95_tpot_ms: float | None
    rollout_p95_ttft_ms: float | None
    """p95 over the requests that arrived between the rollout's start and its end."""
    rollout_p95_tpot_ms: float | None
    slo_violation_minutes: int
    """Minutes whose p95 TTFT or TPOT (over the requests arriving in that minute) missed the target."""
    requests: int
    served: int
    rejected: int
    new_slot_resumes: int
    new_slot_cold_launches: int
    peak_instances: tuple[int, int]
    """(old slot, new slot)."""

    @property
    def duration_s(self) -> float | None:
        return None if self.ended_at_s is None else self.ended_at_s - self.started_at_s


def read_rollout(source: str | Path | Mapping[str, Any]) -> tuple[FleetSpec, FleetSpec, RolloutSpec]:
    """(the old slot, the new slot, the rollout) of a template whose last release names a slot live: the live slot
    is the new one (the release puts its version there), the other serves until the rollout moves its traffic.

    :raises TemplateReadError: the fleet has one slot, or no rollout state machine the simulator can read.
    """
    template = _load(source)
    reader = _Reader(template)
    new, old = reader.fleet(0), _Reader(template).fleet(1)  # a reader each: each slot's own unmodelled notes
    machines = reader.of_type("AWS::StepFunctions::StateMachine")
    definition: Any = None
    for _, machine in machines:
        text = reader.props(machine).get("DefinitionString")
        if isinstance(text, str) and "Blue/green rollout" in text:
            definition = json.loads(text)
    if definition is None:
        raise TemplateReadError("the template has no rollout state machine (a GpuInferenceFleet with rollout=None): "
                                "nothing to replay a rollout with")
    states: Mapping[str, Any] = definition["States"]
    steps = tuple(sorted(int(name.removeprefix("Shift")) for name in states if name.startswith("Shift")
                         and name.removeprefix("Shift").isdigit()))
    judge = states[f"Bake{steps[0]}Judge"]["Choices"]
    bake_s = int(next(c["NumericGreaterThanEquals"] for c in judge if "NumericGreaterThanEquals" in c))
    ready_choices = states["NewSlotReady"]["Choices"]
    ready_timeout_s = int(next(c["NumericGreaterThanEquals"] for c in ready_choices
                               if "NumericGreaterThanEquals" in c))
    new_slot = _slot_name(reader, new)
    alarms = tuple(spec for lid, alarm in reader.of_type("AWS::CloudWatch::Alarm")
                   if str(reader.props(alarm).get("AlarmDescription", "")).startswith(f"Slot {new_slot} (")
                   and (spec := reader.alarm(lid, reader.props(alarm))) is not None)
    rollout = RolloutSpec(
        steps=steps, bake_s=bake_s, alarm_poll_s=int(states[f"Bake{steps[0]}Wait"]["Seconds"]),
        ready_poll_s=int(states["WaitForNewSlot"]["Seconds"]), ready_timeout_s=ready_timeout_s,
        min_instances=max(old.min_size, new.min_size), alarms=alarms)
    return old, new, rollout


def _slot_name(reader: _Reader, spec: FleetSpec) -> str:
    meta = reader.resources[spec.group_logical_id]["Metadata"][PLAN_METADATA_KEY]
    return str(meta.get("slot", ""))


class _Replay:
    def __init__(self, old: FleetSpec, new: FleetSpec, rollout: RolloutSpec, workload: Workload,
                 start_s: float, decode_factor: float) -> None:
        self.rollout, self.workload, self.start_s = rollout, workload, start_s
        # Before the release the old slot served with the warm pool the template now gives the new slot.
        self.old_pool_after, self.new_pool_after = old.warm_pool, new.warm_pool
        self.old = _Fleet(replace(old, warm_pool=new.warm_pool), workload, "old")
        self.new = _Fleet(replace(new, warm_pool=old.warm_pool), workload, "new", requests=self.old.req,
                          serving=False)
        if decode_factor != 1.0:  # before the new slot has any instance: they all decode at this pace
            self.new.model = replace(self.new.model, step_s=tuple(s * decode_factor for s in self.new.model.step_s))
        self.alarms = [Alarm(spec) for spec in rollout.alarms]
        self.percent_new = 0
        self.acc = 0
        self.phase = "before"
        self.next_at = start_s
        self.waited = 0.0
        self.capacity = 0
        self.step = 0
        self.baked = 0.0
        self.shifts: list[tuple[float, int]] = []
        self.outcome = "unfinished"
        self.ended_at: float | None = None
        self.because: tuple[str, ...] = ()
        self.peak = [0, 0]

    def _shift(self, now: float, percent: int) -> None:
        self.percent_new = percent
        self.shifts.append((now, percent))

    def _roll_back(self, now: float, because: tuple[str, ...], outcome: str = "rolled back") -> None:
        self._shift(now, 0)
        self.old.min_size = self.rollout.min_instances
        self.new.min_size = 0
        self.new._set_desired(0)
        self.old.warm_pool, self.new.warm_pool = self.new_pool_after, self.old_pool_after
        self.old._refill_pool()
        self.new._refill_pool()
        self.outcome, self.ended_at, self.because, self.phase = outcome, now, because, "done"

    def _wait_for_new_slot(self, now: float) -> None:
        """WaitForNewSlot (one poll), or roll back once the ready timeout has passed (NewSlotNotReady)."""
        if self.waited >= self.rollout.ready_timeout_s:
            self._roll_back(now, ("NewSlotNotReady",), "not ready")
        else:
            self.waited += self.rollout.ready_poll_s
            self.next_at = now + self.rollout.ready_poll_s

    def _machine(self, now: float) -> None:
        """The state machine's next action, when it is due (its Wait states are the polls)."""
        if self.phase == "done" or now < self.next_at:
            return
        r = self.rollout
        if self.phase == "before":  # the deploy: pools swap, then HoldOldSlot
            self.old.warm_pool, self.new.warm_pool = self.old_pool_after, self.new_pool_after
            self.old._refill_pool()
            self.new._refill_pool()
            self.capacity = self.old.desired
            self.old.min_size = self.capacity
            self.phase, self.next_at = "pool", now
        if self.phase == "pool":
            ready = sum(p.state == "pool" for p in self.new.pool)
            if self.new.warm_pool is None or ready >= self.capacity:
                self.new.min_size = self.capacity
                self.new._set_desired(self.capacity)
                self.phase = "health"
            else:
                self._wait_for_new_slot(now)
                return
        if self.phase == "health":
            if len(self.new.targets) >= self.capacity:
                self.phase, self.step, self.baked = "bake", 0, 0.0
                self._shift(now, r.steps[0])
                self.next_at = now
            else:
                self._wait_for_new_slot(now)
                return
        if self.phase == "bake":
            # An alarm's state is what its last evaluation (at a minute boundary) left.
            firing = tuple(a.spec.logical_id for a in self.alarms if a.state == ALARM)
            if firing:
                self._roll_back(now, firing)
            elif self.baked >= r.bake_s:
                self.step += 1
                if self.step < len(r.steps):
                    self.baked = 0.0
                    self._shift(now, r.steps[self.step])
                    self.next_at = now
                    self._machine(now)  # the next step's first alarm read follows at once
                else:
                    self.new.min_size = r.min_instances
                    self.old.min_size = 0
                    self.old._set_desired(0)
                    self.outcome, self.ended_at, self.phase = "complete", now, "done"
            else:
                self.baked += r.alarm_poll_s
                self.next_at = now + r.alarm_poll_s

    def run(self) -> RolloutReport:
        req = self.old.req
        arrival = req.arrival
        n_req = len(arrival)
        duration = int(math.ceil(self.workload.duration_s))
        ri = 0
        for sec in range(duration):
            self.old.begin_second(sec)
            self.new.begin_second(sec)
            self._machine(float(sec))
            t1 = sec + 1.0
            while ri < n_req and arrival[ri] < t1:
                self.acc += self.percent_new
                if self.acc >= 100:
                    self.acc -= 100
                    self.new._route(ri)
                else:
                    self.old._route(ri)
                ri += 1
            self.old.end_second(sec)
            self.new.end_second(sec)
            if (sec + 1) % 60 == 0:
                for alarm in self.alarms:
                    if (sec + 1) % alarm.spec.period_s == 0:
                        alarm.evaluate(self.new.store, sec + 1)
            self.peak = [max(self.peak[0], len(self.old._in_group())), max(self.peak[1], len(self.new._in_group()))]
        return self._report(duration)

    def _report(self, duration: int) -> RolloutReport:
        req = self.old.req
        plan = self.old.spec.plan
        minutes = int(math.ceil(duration / 60))
        per_minute: list[tuple[list[float], list[float]]] = [([], []) for _ in range(minutes)]
        ttft: list[float] = []
        tpot: list[float] = []
        during_ttft: list[float] = []
        during_tpot: list[float] = []
        end = self.ended_at if self.ended_at is not None else float(duration)
        served = rejected = 0
        for i in range(len(req.arrival)):
            minute = min(minutes - 1, int(req.arrival[i] // 60))
            inside = self.start_s <= req.arrival[i] < end
            if req.status[i] == DONE:
                served += 1
                first = req.ttft[i] * 1000.0
                ttft.append(first)
                per_minute[minute][0].append(first)
                if inside:
                    during_ttft.append(first)
                if req.tpot[i] == req.tpot[i]:
                    per_token = req.tpot[i] * 1000.0
                    tpot.append(per_token)
                    per_minute[minute][1].append(per_token)
                    if inside:
                        during_tpot.append(per_token)
            elif req.status[i] == REJECTED:
                rejected += 1
                per_minute[minute][0].append(INF)
        violations = sum(1 for first, per_token in per_minute
                         if (first and percentile(first, 95) > plan.p95_ttft_ms)
                         or (per_token and percentile(per_token, 95) > plan.p95_tpot_ms))

        def p95(values: list[float]) -> float | None:
            return round(percentile(values, 95), 1) if values else None

        return RolloutReport(
            outcome=self.outcome, started_at_s=self.start_s, shifted_at_s=tuple(self.shifts),
            ended_at_s=self.ended_at, rolled_back_because=self.because, ttft_target_ms=plan.p95_ttft_ms,
            tpot_target_ms=plan.p95_tpot_ms, p95_ttft_ms=p95(ttft), p95_tpot_ms=p95(tpot),
            rollout_p95_ttft_ms=p95(during_ttft), rollout_p95_tpot_ms=p95(during_tpot),
            slo_violation_minutes=violations, requests=len(req.arrival), served=served, rejected=rejected,
            new_slot_resumes=self.new.resumes, new_slot_cold_launches=self.new.cold_launches,
            peak_instances=(self.peak[0], self.peak[1]))


def simulate_rollout(old: FleetSpec, new: FleetSpec, rollout: RolloutSpec, workload: Workload, *,
                     start_s: float, new_version_decode_factor: float = 1.0) -> RolloutReport:
    """Replay ``workload`` through both slots, with a rollout from ``old`` to ``new`` deployed at ``start_s``.

    :param new_version_decode_factor: a what-if for a regression: the new version's decode steps take this many
        times the plan's (2.0: its time per output token doubles). Default 1.0: the plan's figures.
    """
    problems = []
    if not 0 <= start_s < workload.duration_s:
        problems.append(f"start_s ({start_s:g}) must fall inside the workload's {workload.duration_s:g} s")
    factor = new_version_decode_factor
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor) or factor <= 0:
        problems.append(f"new_version_decode_factor ({factor!r}) must be a positive finite number, e.g. 2.0")
    if problems:
        raise ScenarioError("; ".join(problems))
    return _Replay(old, new, rollout, workload, start_s, float(factor)).run()
