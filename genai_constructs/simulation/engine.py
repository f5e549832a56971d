"""The fleet on one clock: load balancer, Auto Scaling group, warm pool, CloudWatch, and each instance's server.

The control plane ticks every second; each instance's server (model.Instance) runs in continuous time between
ticks, so latencies are exact to the estimator's figures while routing, health checks and scaling move in 1-second
steps. Each behaviour and its source:

* **Routing** (Elastic Load Balancing user guide, "Edit target group attributes", routing algorithm): with
  ``least_outstanding_requests`` a request goes to the healthy registered target with the fewest requests in
  flight (ties in turn), else round robin. The simulator's counts lag completions by at most a tick; each ALB node
  keeps its own counts too. No healthy target: the ALB answers 503 (rejected).
* **Health checks** (ELB user guide, "Health checks for Application Load Balancer target groups"; EC2 Auto Scaling
  user guide, "Health checks for instances in an Auto Scaling group"): a wedged instance accepts connections and
  never answers; after ``UnhealthyThresholdCount`` failed checks ``HealthCheckIntervalSeconds`` apart the ALB stops
  routing to it, and with ``HealthCheckType: ELB`` Auto Scaling replaces it ("When Amazon EC2 Auto Scaling
  determines that an InService instance is unhealthy, it replaces it"); with EC2 health checks it stays, billed.
* **Instance start** (EC2 Auto Scaling user guide, "Warm pools for Amazon EC2 Auto Scaling" and "Use lifecycle
  hooks with a warm pool"): a cold launch serves after the plan's ``time_to_serving_s.cold``; a warm-pool resume
  after ``time_to_serving_s.warm`` when a launch lifecycle hook held the instance until its bootstrap finished;
  without the hook "Amazon EC2 Auto Scaling does not wait for user data to finish running, so the stop ... can
  interrupt a script that is still running", and the resume redoes the image pull and download: the cold time less
  the faster boot (planner/startup.py ``warm-without-hook``). The pool refills itself to MaxGroupPreparedCapacity
  (default: MaxSize) minus the desired capacity, at least its MinSize (PutWarmPool API reference); a pool launch
  is usable after the cold time with the hook (it runs its bootstrap, then stops) and after the boot without it.
  ``ReuseOnScaleIn`` returns scaled-in instances to the pool.
* **Scale-in** (ELB user guide, "Deregistration delay"): a removed instance stops receiving requests and finishes
  those it holds for up to the deregistration delay, then stops (pool) or terminates.
* **Target tracking** (EC2 Auto Scaling user guide, "Target tracking scaling policies for Amazon EC2 Auto
  Scaling"): Auto Scaling "creates and manages the CloudWatch alarms"; modelled as the two it creates, a high alarm
  of :data:`TT_HIGH_DATAPOINTS` one-minute datapoints above the target and a low alarm of
  :data:`TT_LOW_DATAPOINTS` below it, both treating missing data as missing, so "a target tracking scaling policy
  does not perform scaling when the specified metric has insufficient data" (the same rule in the ECS and
  Application Auto Scaling guides). Both ways the new capacity is proportional: the metric is a per-instance
  average over the instances that published in its period, so the demand it stands for is metric x those
  instances and the capacity asked is ceil(demand / target). Instances already launching or warming up count as
  capacity, so a metric that stays high while they start does not add more ("The intention is to continuously
  (but not excessively) scale out", default instance warmup page), and a cut is not repeated on datapoints from
  before it. With several policies, the group scales out if any asks for more and in only if all ask for less ("The
  intention is to prioritize availability").
* **Instance warmup** (EC2 Auto Scaling user guide, "Set the default instance warmup for an Auto Scaling group"):
  instances warming up count as current capacity, scale-in is blocked "until the new instances finish warming
  up", and a step policy's repeated breaches "that fall in the range of the same step adjustment result in a
  single scaling activity". The warmup is the policy's EstimatedInstanceWarmup, else DefaultInstanceWarmup, else
  the default cooldown (300 s).
* **Step scaling** (EC2 Auto Scaling user guide, "Step and simple scaling policies"): the step whose bounds, relative
  to the threshold, hold the breach; ChangeInCapacity, PercentChangeInCapacity (MinAdjustmentMagnitude) or
  ExactCapacity. "For Amazon EC2 Auto Scaling actions, the alarm continues to invoke the action for every period
  that the alarm remains in the new state" (CloudWatch user guide, "Using Amazon CloudWatch alarms").
* **The group** clamps the desired capacity to MinSize..MaxSize.
* **Cost**: running instances (launching, serving, draining, a pool launch preparing) by the plan's
  ``usd_per_hour``; every instance's EBS volumes, running or stopped in the pool, at gp3 prices (costs.py).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter

from genai_constructs.planner.startup import startup_figures
from genai_constructs.simulation.cloudwatch import ALARM, PUBLISH_DELAY_S, Alarm, MetricStore, percentile
from genai_constructs.simulation.costs import volumes_usd_per_hour
from genai_constructs.simulation.model import (
    DONE,
    FAILED,
    INF,
    PENDING,
    REJECTED,
    TIMED_OUT,
    UNFINISHED,
    Instance,
    Requests,
    serving_model,
)
from genai_constructs.simulation.report import MinuteSeries, SimulationReport
from genai_constructs.simulation.template import AlarmSpec, FleetSpec, StepPolicy, TargetTrackingPolicy
from genai_constructs.simulation.trace import Workload

TT_HIGH_DATAPOINTS = 3
"""Datapoints (of one minute) above the target before target tracking scales out: the managed high alarm's
3 of 3, as the CloudWatch console lists it for every target-tracking policy (AWS does not document the figure)."""
TT_LOW_DATAPOINTS = 15
"""...and below it before it scales in: the managed low alarm's 15 of 15 (ditto): scale out fast, in slowly."""
DEFAULT_COOLDOWN_S = 300
"""EC2 Auto Scaling's default cooldown, the warmup when neither the policy nor the group sets one (PutScalingPolicy
API reference, EstimatedInstanceWarmup)."""
GAUGE_INTERVAL_S = 10
"""The request proxy publishes its gauges every 10 s (runtime/request_proxy.py DEFAULT_METRICS_INTERVAL_S); the
GPU utilization sample is taken at the same moments."""
GPU_METRIC = "nvidia_smi_utilization_gpu"
_OUTSTANDING = attrgetter("outstanding")

Progress = Callable[[float], None]


def _warmup_of(policy_warmup: int | None, spec: FleetSpec) -> float:
    if policy_warmup is not None:
        return float(policy_warmup)
    if spec.default_instance_warmup_s is not None:
        return float(spec.default_instance_warmup_s)
    return float(DEFAULT_COOLDOWN_S)


@dataclass
class _Tracking:
    policy: TargetTrackingPolicy
    high: Alarm
    low: Alarm


@dataclass
class _Step:
    policy: StepPolicy
    alarms: list[Alarm]
    warmup_s: float
    last_adjustment: int = 0
    launched: tuple[Instance, ...] = ()
    """The instances this policy's last activity brought in: the activity is still warming while any of them is
    launching, resuming, or inside its warmup after it started serving."""

    def warming(self, now: float) -> bool:
        return any(i.state == "pending" or (i.state == "serving" and i.serving_at + self.warmup_s > now)
                   for i in self.launched)


class _Fleet:
    """One Auto Scaling group with its target group. ``requests`` shares one request stream between two groups (the
    blue/green slots behind one listener: simulation/rollout.py); ``serving=False`` starts the group empty."""

    def __init__(self, spec: FleetSpec, workload: Workload, label: str, *, requests: Requests | None = None,
                 serving: bool = True) -> None:
        self.spec = spec
        self.workload = workload
        self.label = label
        plan = spec.plan
        self.model, notes = serving_model(plan, workload.mean_prompt, workload.mean_output)
        self.unmodelled = [*spec.unmodelled, *notes]
        self.req = requests or Requests(workload.arrivals, workload.prompts, workload.outputs, self.model)
        self.min_size = spec.min_size
        """MinSize now: the template's, until a rollout sizes the group (UpdateAutoScalingGroup)."""
        self.warm_pool = spec.warm_pool
        """The warm pool now: the template's, until a rollout swaps it (PutWarmPool)."""
        self.instances: list[Instance] = []
        self.servers: list[Instance] = []
        """Instances whose model server runs (serving or draining, wedged included)."""
        self.targets: list[Instance] = []
        """Healthy registered targets the load balancer routes to."""
        self.pending: list[Instance] = []
        self.pool: list[Instance] = []
        """Warm-pool instances: state pool-preparing (running its bootstrap) or pool (stopped, ready)."""
        self.events: list[tuple[float, int, str, Instance]] = []
        self._seq = 0
        self.now = 0.0
        self.desired = spec.desired_capacity if serving else 0
        self.rr = 0
        figures = startup_figures()
        self.boot_s = figures["instance_boot_s"]
        # No hook: the pool instance stopped before its download; resuming redoes it, and boots faster than a launch.
        self.resume_without_hook_s = max(0.0, plan.cold_start_s - (figures["instance_boot_s"]
                                                                     - figures["warm_resume_boot_s"]))
        self.volume_usd_per_hour = volumes_usd_per_hour(spec.volumes)
        self.running_s = 0.0
        self.stopped_s = 0.0
        self.cold_launches = self.resumes = self.replaced = 0
        self.scale_outs = self.scale_ins = 0
        self.peak = 0
        self.tracking = [self._tracking(p) for p in spec.target_tracking]
        self.steps = [_Step(p, [Alarm(a) for a in p.alarms], _warmup_of(p.estimated_instance_warmup_s, spec))
                      for p in spec.step_policies]
        self.tt_warmup = max([_warmup_of(p.estimated_instance_warmup_s, spec) for p in spec.target_tracking],
                             default=_warmup_of(None, spec))
        lookback = [TT_LOW_DATAPOINTS + 2] + [
            (a.spec.evaluation_periods + 3) * max(1, a.spec.period_s // 60) for s in self.steps for a in s.alarms]
        self.reporters: dict[int, int] = {}
        """Instances that published gauges, by minute: the capacity a per-instance average metric stands for."""
        self.store = MetricStore(retain_minutes=max(lookback) + PUBLISH_DELAY_S // 60 + 2)
        self.minute_demand: list[float] = []
        self.minute_capacity: list[float] = []
        self.in_service: list[int] = []
        self.desired_series: list[int] = []
        self.pool_series: list[int] = []
        self.alb_requests = 0
        for _ in range(self.desired):
            self._start_serving(self._new_instance(0.0), warmed=True)
        self.peak = self.desired
        self._refill_pool(initial=True)

    # ---- lifecycle ----------------------------------------------------------------------------------------------

    def _tracking(self, policy: TargetTrackingPolicy) -> _Tracking:
        def alarm(kind: str, datapoints: int, comparison: str) -> Alarm:
            return Alarm(AlarmSpec(f"{policy.logical_id}-{kind}", policy.queries, 60, datapoints, datapoints,
                                   policy.target_value, comparison, "missing"))

        return _Tracking(policy, alarm("AlarmHigh", TT_HIGH_DATAPOINTS, "GreaterThanThreshold"),
                         alarm("AlarmLow", TT_LOW_DATAPOINTS, "LessThanThreshold"))

    def _new_instance(self, at: float) -> Instance:
        inst = Instance(len(self.instances), self.model, self.req, at)
        self.instances.append(inst)
        return inst

    def _schedule(self, at: float, kind: str, inst: Instance) -> None:
        self._seq += 1
        heapq.heappush(self.events, (at, self._seq, kind, inst))

    def _start_serving(self, inst: Instance, warmed: bool = False) -> None:
        inst.state = "serving"
        inst.serving_at = self.now
        inst.t = self.now
        inst.warm_until = -INF if warmed else self.now + self.tt_warmup
        self.servers.append(inst)
        self.targets.append(inst)

    def _launch(self, count: int) -> None:
        """Bring ``count`` instances into the group: from the warm pool's ready instances first, then cold."""
        ready = [p for p in self.pool if p.state == "pool"]
        for _ in range(count):
            if ready:
                inst = ready.pop(0)
                self.pool.remove(inst)
                inst.from_pool = True
                wait = self.spec.plan.warm_start_s if self.spec.launch_hook else self.resume_without_hook_s
                self.resumes += 1
            else:
                inst = self._new_instance(self.now)
                wait = self.spec.plan.cold_start_s
                self.cold_launches += 1
            inst.state = "pending"
            inst.warm_until = self.now + wait + self.tt_warmup
            self.pending.append(inst)
            self._schedule(self.now + wait, "serve", inst)

    def _pool_target(self) -> int:
        pool = self.warm_pool
        if pool is None:
            return 0
        prepared = pool.max_group_prepared_capacity
        ceiling = self.spec.max_size if prepared is None else prepared
        return max(pool.min_size, ceiling - self.desired)

    def _refill_pool(self, initial: bool = False) -> None:
        target = self._pool_target()
        pool = self.warm_pool
        # Instances draining on their way back to the pool (ReuseOnScaleIn) fill it without a launch.
        returning = (sum(1 for s in self.servers if s.state == "draining" and not s.wedged)
                     if pool is not None and pool.reuse_on_scale_in else 0)
        while len(self.pool) + returning < target:
            inst = self._new_instance(self.now)
            if initial:
                inst.state = "pool"
            else:
                inst.state = "pool-preparing"
                ready_in = self.spec.plan.cold_start_s if self.spec.launch_hook else self.boot_s
                self._schedule(self.now + ready_in, "pooled", inst)
            self.pool.append(inst)
        while len(self.pool) > target:
            extra = next((p for p in self.pool if p.state == "pool"), self.pool[-1])
            self.pool.remove(extra)
            extra.state = "terminated"

    def _remove_target(self, inst: Instance) -> None:
        if inst in self.targets:
            self.targets.remove(inst)

    def _finish(self, inst: Instance) -> None:
        """A drained (or replaced) instance leaves: to the stopped warm pool, or terminated."""
        inst.lose_all()
        if inst in self.servers:
            self.servers.remove(inst)
        self._remove_target(inst)
        pool = self.warm_pool
        if pool is not None and pool.reuse_on_scale_in and not inst.wedged and len(self.pool) < self._pool_target():
            inst.state = "pool"
            inst.g, inst.stall, inst.busy_s, inst.busy_sampled_s = 0.0, 0.0, 0.0, 0.0
            self.pool.append(inst)
        else:
            inst.state = "terminated"

    def _in_group(self) -> list[Instance]:
        """Instances counted against the desired capacity: launching, resuming and serving (not draining)."""
        return self.pending + [s for s in self.servers if s.state == "serving"]

    def _reconcile(self) -> None:
        group = self._in_group()
        if len(group) < self.desired:
            self._launch(self.desired - len(group))
        elif len(group) > self.desired:
            excess = len(group) - self.desired
            # Instances not yet serving go first, then those with the least in flight.
            for inst in sorted(group, key=lambda i: (i.state == "serving", i.outstanding))[:excess]:
                if inst.state == "pending":
                    self.pending.remove(inst)
                    inst.state = "terminated"
                    if inst.from_pool and self.warm_pool and self.warm_pool.reuse_on_scale_in:
                        inst.state = "pool"
                        self.pool.append(inst)
                else:
                    inst.state = "draining"
                    inst.drain_until = self.now + self.spec.deregistration_delay_s
                    self._remove_target(inst)
        self._refill_pool()
        self.peak = max(self.peak, len(self._in_group()))

    def _set_desired(self, desired: int) -> None:
        desired = min(max(desired, self.min_size), self.spec.max_size)
        if desired > self.desired:
            self.scale_outs += 1
        elif desired < self.desired:
            self.scale_ins += 1
        self.desired = desired
        self._reconcile()

    def _handle(self, kind: str, inst: Instance) -> None:
        if kind == "serve" and inst.state == "pending":
            self.pending.remove(inst)
            self._start_serving(inst)
        elif kind == "pooled" and inst.state == "pool-preparing":
            inst.state = "pool"
        elif kind == "unhealthy" and inst.state in ("serving", "draining"):
            self._remove_target(inst)
            if self.spec.health_check_type.upper() == "ELB":
                self.replaced += 1
                self._finish(inst)
                self._reconcile()

    def _wedge(self) -> None:
        victims = [s for s in self.targets if not s.wedged]
        if not victims:
            return
        inst = victims[0]
        inst.wedged = True
        detect = self.spec.health_check_interval_s * self.spec.unhealthy_threshold
        self._schedule(self.now + detect, "unhealthy", inst)

    # ---- scaling ------------------------------------------------------------------------------------------------

    def _reporting(self, now_s: int) -> int:
        """Instances behind the latest period an evaluation at ``now_s`` reads (at least one)."""
        minute = (now_s - PUBLISH_DELAY_S) // 60 - 1
        return max(1, self.reporters.get(minute, 0))

    def _any_warming(self) -> bool:
        return bool(self.pending) or any(s.warm_until > self.now for s in self.servers if s.state == "serving")

    def _step_adjustment(self, step: _Step, alarm: Alarm) -> int | None:
        if alarm.last_value is None:
            return None
        # Above the threshold a step's lower bound is inclusive and its upper bound exclusive; below it, the other
        # way round (EC2 Auto Scaling user guide, "Step and simple scaling policies").
        breach = alarm.last_value - alarm.spec.threshold
        for s in step.policy.steps:
            lower = -INF if s.lower is None else s.lower
            upper = INF if s.upper is None else s.upper
            if (lower <= breach < upper) if breach >= 0 else (lower < breach <= upper):
                return s.adjustment
        return None

    def _step_desired(self, step: _Step, adjustment: int) -> int:
        kind = step.policy.adjustment_type
        if kind == "ExactCapacity":
            return adjustment
        if kind == "PercentChangeInCapacity":
            change = self.desired * adjustment / 100.0
            rounded = int(change) if abs(change) >= 1 else (1 if change > 0 else -1 if change < 0 else 0)
            magnitude = step.policy.min_adjustment_magnitude
            if magnitude is not None and abs(rounded) < magnitude:
                rounded = magnitude if rounded > 0 else -magnitude
            adjustment = rounded
        if adjustment > 0 and step.warming(self.now):
            # Breaches in the same step while its instances warm up are one activity: add only the difference.
            if adjustment <= step.last_adjustment:
                return self.desired
            return self.desired + adjustment - step.last_adjustment
        return self.desired + adjustment

    def _control(self, now_s: int) -> None:
        """One minute boundary: evaluate every alarm due, apply the policies, reconcile the group."""
        out: list[int] = []
        ins: list[int] = []
        tracking_in: list[int] = []
        stepping: list[tuple[_Step, int]] = []
        tracking_in_agree = bool(self.tracking)
        for tt in self.tracking:
            high = tt.high.evaluate(self.store, now_s)
            low = tt.low.evaluate(self.store, now_s)
            target = tt.policy.target_value
            if high == ALARM and tt.high.last_value is not None:
                out.append(math.ceil(tt.high.last_value * self._reporting(now_s) / target - 1e-9))
                tracking_in_agree = False
            elif low == ALARM and not tt.policy.disable_scale_in and tt.low.last_value is not None:
                tracking_in.append(math.ceil(tt.low.last_value * self._reporting(now_s) / target - 1e-9))
            elif not tt.policy.disable_scale_in:
                tracking_in_agree = False
        for step in self.steps:
            for alarm in step.alarms:
                if now_s % alarm.spec.period_s:
                    continue
                if alarm.evaluate(self.store, now_s) != ALARM:
                    continue
                adjustment = self._step_adjustment(step, alarm)
                if adjustment is None:
                    continue
                desired = self._step_desired(step, adjustment)
                if desired < self.desired:
                    ins.append(desired)
                elif desired > self.desired:
                    out.append(desired)
                    stepping.append((step, adjustment))
        out = [d for d in out if d > self.desired]
        if out:
            before = set(self.pending)
            self._set_desired(max(out))
            launched = tuple(i for i in self.pending if i not in before)
            for step, adjustment in stepping:
                step.launched, step.last_adjustment = launched, adjustment
            return
        if self._any_warming():
            return
        if tracking_in_agree and tracking_in:
            ins.append(max(tracking_in))
        ins = [d for d in ins if d < self.desired]
        if ins:
            self._set_desired(max(ins))

    # ---- the run ------------------------------------------------------------------------------------------------

    def _route(self, idx: int) -> None:
        req = self.req
        if req.status[idx] == REJECTED:
            return  # longer than --max-model-len: vLLM answers 400 at once
        targets = self.targets
        n = len(targets)
        if not n:
            req.status[idx] = REJECTED
            return
        self.rr += 1
        if self.spec.routing_algorithm == "least_outstanding_requests":
            start = self.rr % n
            # The first of the least loaded, searched from a rotating start so that ties go round in turn.
            best = min(targets[start:] + targets[:start], key=_OUTSTANDING) if n > 1 else targets[0]
        else:
            best = targets[self.rr % n]
        best.inbox.append(idx)
        best.outstanding += 1
        self.alb_requests += 1

    def _sample_gauges(self, now_s: int) -> None:
        minute = (now_s - 1) // 60
        store = self.store
        reporting = 0
        for inst in self.servers:
            if inst.wedged:
                continue  # a hung host publishes nothing
            running = len(inst.running)
            store.put("RequestsInFlight", minute, float(running))
            store.put("RequestsWaiting", minute, float(len(inst.waiting)))
            busy = inst.busy_s - inst.busy_sampled_s
            inst.busy_sampled_s = inst.busy_s
            store.put(GPU_METRIC, minute, min(100.0, 100.0 * busy / GAUGE_INTERVAL_S))
            reporting += 1
        self.reporters[minute] = max(self.reporters.get(minute, 0), reporting)

    def _close_minute(self, now_s: int) -> None:
        minute = now_s // 60 - 1
        healthy = len(self.targets)
        if self.alb_requests:
            self.store.put("RequestCount", minute, float(self.alb_requests))
            if healthy:
                self.store.put("RequestCountPerTarget", minute, self.alb_requests / healthy)
        self.alb_requests = 0
        demand = sum(len(s.running) + len(s.waiting) for s in self.servers if s.state == "serving")
        serving = [s for s in self.targets if not s.wedged]
        self.minute_demand.append(float(demand))
        self.minute_capacity.append(float(len(serving) * self.spec.plan.concurrency_per_instance))
        self.in_service.append(len(self.targets))
        self.desired_series.append(self.desired)
        self.pool_series.append(len(self.pool))
        self.store.prune(minute)
        for m in [m for m in self.reporters if m < minute - self.store.retain_minutes]:
            del self.reporters[m]

    def begin_second(self, sec: int) -> None:
        """The start of second ``sec``: a scheduled wedge, then the events due (starts, health, the pool)."""
        self.now = float(sec)
        wedge_at = self.workload.wedge_at_s
        if wedge_at is not None and sec == int(wedge_at):
            self._wedge()
        events = self.events
        while events and events[0][0] <= sec:
            _, _, kind, inst = heapq.heappop(events)
            self._handle(kind, inst)

    def end_second(self, sec: int) -> None:
        """The rest of second ``sec``, once its arrivals are routed: the servers run, their completions become
        metrics, drained instances leave, gauges every 10 s, and at each minute the alarms and the policies."""
        req = self.req
        completed = req.completed
        t1 = sec + 1.0
        idle = float(self.spec.idle_timeout_s)
        for inst in self.servers:
            inst.advance(t1, idle)
        if completed:
            # Only this group's instances ran since the list was last emptied: these are its requests.
            minute = sec // 60
            ttft, tpot = req.ttft, req.tpot
            self.store.put_many("TimeToFirstToken", minute, [ttft[i] * 1000.0 for i in completed])
            self.store.put_many("TimePerOutputToken", minute,
                                [tpot[i] * 1000.0 for i in completed if tpot[i] == tpot[i]])
            completed.clear()
        for inst in [s for s in self.servers if s.state == "draining"]:
            if inst.outstanding <= 0 or t1 >= inst.drain_until:
                self._finish(inst)
        now_s = sec + 1
        if now_s % GAUGE_INTERVAL_S == 0:
            self._sample_gauges(now_s)
        if now_s % 60 == 0:
            self.now = float(now_s)
            self._close_minute(now_s)
            self._control(now_s)
        preparing = sum(p.state == "pool-preparing" for p in self.pool)
        self.running_s += len(self.servers) + len(self.pending) + preparing
        self.stopped_s += len(self.pool) - preparing

    def run(self, progress: Progress | None) -> SimulationReport:
        arrival = self.req.arrival
        n_req = len(arrival)
        duration = int(math.ceil(self.workload.duration_s))
        ri = 0
        report_every = max(60, duration // 100)
        for sec in range(duration):
            self.begin_second(sec)
            t1 = sec + 1.0
            while ri < n_req and arrival[ri] < t1:
                self._route(ri)
                ri += 1
            self.end_second(sec)
            if progress is not None and (sec + 1) % report_every == 0:
                progress((sec + 1) / duration)
        if progress is not None:
            progress(1.0)
        return self._report(duration)

    def _report(self, duration: int) -> SimulationReport:
        req = self.req
        plan = self.spec.plan
        status, ttft, tpot, arrival, output = req.status, req.ttft, req.tpot, req.arrival, req.output
        minutes = int(math.ceil(duration / 60))
        per_minute_ttft: list[list[float]] = [[] for _ in range(minutes)]
        per_minute_tpot: list[list[float]] = [[] for _ in range(minutes)]
        answered_ttft: list[float] = []
        answered_tpot: list[float] = []
        counts = dict.fromkeys((DONE, REJECTED, TIMED_OUT, FAILED, UNFINISHED), 0)
        tokens = 0
        end = float(duration)
        for i in range(len(arrival)):
            s = status[i]
            if s == PENDING:
                s = UNFINISHED
            counts[s] += 1
            minute = min(minutes - 1, int(arrival[i] // 60))
            if s == DONE:
                value = ttft[i] * 1000.0
                answered_ttft.append(value)
                per_minute_ttft[minute].append(value)
                tokens += output[i]
                if tpot[i] == tpot[i]:
                    answered_tpot.append(tpot[i] * 1000.0)
                    per_minute_tpot[minute].append(tpot[i] * 1000.0)
            elif s == UNFINISHED:
                if ttft[i] < INF:
                    per_minute_ttft[minute].append(ttft[i] * 1000.0)
                elif (end - arrival[i]) * 1000.0 > plan.p95_ttft_ms:
                    per_minute_ttft[minute].append(INF)
            else:
                per_minute_ttft[minute].append(INF)
        p95_ttft = tuple(percentile(v, 95) if v else None for v in per_minute_ttft)
        p95_tpot = tuple(percentile(v, 95) if v else None for v in per_minute_tpot)
        violations = sum(
            1 for a, b in zip(p95_ttft, p95_tpot, strict=True)
            if (a is not None and a > plan.p95_ttft_ms) or (b is not None and b > plan.p95_tpot_ms))
        rate = [0.0] * minutes
        for t in arrival:
            rate[min(minutes - 1, int(t // 60))] += 1 / 60.0
        instance_hours = self.running_s / 3600.0
        stopped_hours = self.stopped_s / 3600.0
        usd_instances = instance_hours * plan.usd_per_hour
        usd_volumes = (instance_hours + stopped_hours) * self.volume_usd_per_hour
        usd = usd_instances + usd_volumes

        def pct(values: list[float], q: float) -> float | None:
            return round(percentile(values, q), 1) if values else None

        return SimulationReport(
            label=self.label, scenario=self.workload.scenario, trace=self.workload.trace,
            rate_scale=self.workload.rate_scale, hours=round(duration / 3600.0, 4), requests=len(arrival),
            served=counts[DONE], rejected=counts[REJECTED], timed_out=counts[TIMED_OUT], failed=counts[FAILED],
            unfinished=counts[UNFINISHED], slo_violation_minutes=violations, minutes=minutes,
            ttft_target_ms=plan.p95_ttft_ms, tpot_target_ms=plan.p95_tpot_ms,
            p50_ttft_ms=pct(answered_ttft, 50), p95_ttft_ms=pct(answered_ttft, 95), p99_ttft_ms=pct(answered_ttft, 99),
            p50_tpot_ms=pct(answered_tpot, 50), p95_tpot_ms=pct(answered_tpot, 95), p99_tpot_ms=pct(answered_tpot, 99),
            burst_recovery_minutes=self._burst_recovery(),
            instance_hours=round(instance_hours, 3), warm_pool_stopped_hours=round(stopped_hours, 3),
            usd=round(usd, 2), usd_instances=round(usd_instances, 2), usd_volumes=round(usd_volumes, 2),
            output_tokens=tokens, usd_per_million_tokens=round(usd / tokens * 1e6, 3) if tokens else None,
            peak_instances=self.peak, final_instances=len(self._in_group()),
            min_size=self.min_size, max_size=self.spec.max_size, cold_launches=self.cold_launches,
            warm_pool_resumes=self.resumes, instances_replaced=self.replaced,
            scale_out_activities=self.scale_outs, scale_in_activities=self.scale_ins,
            unmodelled=tuple(self.unmodelled),
            series=MinuteSeries(
                request_rate_per_s=tuple(round(r, 3) for r in rate),
                p95_ttft_ms=tuple(None if v is None else (v if math.isinf(v) else round(v, 1)) for v in p95_ttft),
                p95_tpot_ms=tuple(None if v is None else round(v, 2) for v in p95_tpot),
                in_service_instances=tuple(self.in_service), desired_capacity=tuple(self.desired_series),
                warm_pool_instances=tuple(self.pool_series)),
        )

    def _burst_recovery(self) -> float | None:
        burst = self.workload.burst
        if burst is None:
            return None
        first, last = int(burst[0] // 60), min(len(self.minute_demand), int(math.ceil(burst[1] / 60)))
        short = [m for m in range(first, last) if self.minute_demand[m] > self.minute_capacity[m]]
        if not short:
            return 0.0
        if short[-1] >= last - 1:
            return None
        return float(short[-1] + 1 - first)


def simulate(spec: FleetSpec, workload: Workload, *, label: str = "template",
             progress: Progress | None = None) -> SimulationReport:
    """Replay ``workload`` through the fleet ``spec`` describes and report what users saw and what it cost."""
    return _Fleet(spec, workload, label).run(progress)
