"""Read an inference fleet from a synthesized CloudFormation template (``cdk synth``'s ``*.template.json``).

The simulator works from the template, not from the Python that meant to build it: what CloudFormation will
deploy is what Auto Scaling and CloudWatch will do. :func:`read_template` finds the Auto Scaling group that
``GpuInferenceFleet`` marked with its plan (``Metadata["genai-constructs:plan"]``) and gathers, by following
``Ref``/``Fn::GetAtt`` between resources:

* the group (``AWS::AutoScaling::AutoScalingGroup``): MinSize, MaxSize, DesiredCapacity (strings in CDK output),
  HealthCheckType, HealthCheckGracePeriod, DefaultInstanceWarmup, its launch template's EBS volumes;
* its warm pool (``AWS::AutoScaling::WarmPool``: MinSize, PoolState, MaxGroupPreparedCapacity,
  InstanceReusePolicy) and whether a launch lifecycle hook (``AWS::AutoScaling::LifecycleHook`` on
  ``autoscaling:EC2_INSTANCE_LAUNCHING``) holds instances until they serve;
* the target group's health check (interval, thresholds), routing algorithm and deregistration delay, and the load
  balancer's idle timeout;
* every scaling policy (``AWS::AutoScaling::ScalingPolicy``) on the group: target tracking (TargetValue,
  DisableScaleIn, a customized metric, with or without metric math, or a predefined one) and step scaling
  (StepAdjustments, AdjustmentType, MetricAggregationType, EstimatedInstanceWarmup) with every
  ``AWS::CloudWatch::Alarm`` whose AlarmActions invoke it.

Whatever the simulator cannot reproduce (a metric it does not produce, a metric-math function it cannot evaluate,
a Spot or mixed-instances group, a second fleet, a scheduled or predictive policy) is listed in
:attr:`FleetSpec.unmodelled`, never dropped in silence. Defaults for omitted properties are AWS's documented ones,
each named below with its source.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from genai_constructs.planner.startup import time_to_serving
from genai_constructs.simulation.errors import TemplateReadError

PLAN_METADATA_KEY = "genai-constructs:plan"
"""Where ``GpuInferenceFleet`` records the plan on the group's template resource (fleets/inference.py)."""
DEFAULT_METRIC_NAMESPACE = "GenaiConstructs/Inference"
"""The request proxy's namespace (runtime/request_proxy.py DEFAULT_NAMESPACE), when the plan does not name one."""

# ---- AWS defaults for properties a template may omit ----------------------------------------------------------------

DEFAULT_HEALTH_CHECK_INTERVAL_S = 30
"""ELB user guide, "Health checks for Application Load Balancer target groups": HealthCheckIntervalSeconds default
30 for instance targets."""
DEFAULT_UNHEALTHY_THRESHOLD = 2
"""Same page: UnhealthyThresholdCount default 2."""
DEFAULT_HEALTHY_THRESHOLD = 5
"""Same page: HealthyThresholdCount default 5."""
DEFAULT_DEREGISTRATION_DELAY_S = 300
"""ELB user guide, "Edit target group attributes": "By default, Elastic Load Balancing waits 300 seconds before
completing the deregistration process"."""
DEFAULT_IDLE_TIMEOUT_S = 60
"""ELB user guide, "Edit attributes for your Application Load Balancer": connection idle timeout default 60 s."""
DEFAULT_ALARM_PERIOD_S = 60
"""CloudWatch's standard resolution: one datapoint a minute; an alarm without Period in its metric stat uses it."""
DEFAULT_GP3_IOPS = 3000
"""Amazon EBS user guide, "General Purpose SSD volumes": gp3 baseline 3,000 IOPS when Iops is omitted."""
DEFAULT_GP3_THROUGHPUT_MIBPS = 125
"""Same page: gp3 baseline 125 MiB/s when Throughput is omitted."""
DEFAULT_ROOT_VOLUME_GIB = 8
"""A launch template without BlockDeviceMappings gets the AMI's root volume; 8 GiB is the Amazon Linux default."""

KNOWN_CUSTOM_METRICS = frozenset(
    {"RequestsInFlight", "RequestsWaiting", "TimeToFirstToken", "TimePerOutputToken", "nvidia_smi_utilization_gpu"}
)
"""Metrics of the fleet's namespace the simulator produces: the request proxy's gauges (every 10 s, zero included),
its per-request latencies (one value per completed request), and the CloudWatch agent's GPU utilization."""
KNOWN_ALB_METRICS = frozenset({"RequestCount", "RequestCountPerTarget"})
"""AWS/ApplicationELB metrics the simulator produces (published only when requests flow: ELB user guide,
"CloudWatch metrics for your Application Load Balancer")."""
PREDEFINED_METRICS = {"ALBRequestCountPerTarget": ("AWS/ApplicationELB", "RequestCountPerTarget", "Sum")}
"""Predefined target-tracking metrics the simulator produces, as (namespace, metric, statistic)."""
KNOWN_STATISTICS = frozenset({"Average", "Sum", "SampleCount", "Minimum", "Maximum"})
"""CloudWatch statistics the metric store computes; percentiles ``pNN`` / ``pNN.N`` are handled apart."""
PERCENTILE = re.compile(r"^p(\d{1,2}(\.\d+)?|100)$")
COMPARISONS = frozenset(
    {"GreaterThanOrEqualToThreshold", "GreaterThanThreshold", "LessThanThreshold", "LessThanOrEqualToThreshold"}
)
TREAT_MISSING = frozenset({"missing", "notBreaching", "breaching", "ignore"})
ALLOWED_MATH_FUNCTIONS = frozenset({"FILL"})
"""Metric-math functions the evaluator implements (besides + - * / and parentheses)."""


@dataclass(frozen=True)
class MetricStat:
    """One CloudWatch metric with the statistic and period a policy or alarm reads it at."""

    namespace: str
    metric_name: str
    stat: str
    period_s: int = DEFAULT_ALARM_PERIOD_S


@dataclass(frozen=True)
class MetricQuery:
    """One entry of a ``Metrics`` list: a metric stat or a metric-math expression over the other ids."""

    id: str
    metric: MetricStat | None = None
    expression: str | None = None
    return_data: bool = True


@dataclass(frozen=True)
class AlarmSpec:
    """A CloudWatch alarm that invokes a step scaling policy."""

    logical_id: str
    queries: tuple[MetricQuery, ...]
    period_s: int
    evaluation_periods: int
    datapoints_to_alarm: int
    threshold: float
    comparison: str
    treat_missing_data: str = "missing"
    """CloudWatch user guide, "Configuring how CloudWatch alarms treat missing data": "The default behavior is
    missing"."""


@dataclass(frozen=True)
class StepAdjustment:
    """A step: bounds are relative to the alarm threshold (None = unbounded), as StepAdjustments writes them."""

    lower: float | None
    upper: float | None
    adjustment: int


@dataclass(frozen=True)
class StepPolicy:
    logical_id: str
    adjustment_type: str
    steps: tuple[StepAdjustment, ...]
    alarms: tuple[AlarmSpec, ...]
    min_adjustment_magnitude: int | None = None
    metric_aggregation_type: str = "Average"
    estimated_instance_warmup_s: int | None = None


@dataclass(frozen=True)
class TargetTrackingPolicy:
    logical_id: str
    target_value: float
    queries: tuple[MetricQuery, ...]
    disable_scale_in: bool = False
    estimated_instance_warmup_s: int | None = None


@dataclass(frozen=True)
class WarmPoolSpec:
    min_size: int = 0
    """AWS::AutoScaling::WarmPool MinSize default 0."""
    pool_state: str = "Stopped"
    """PoolState default Stopped (EC2 Auto Scaling user guide, "Warm pools for Amazon EC2 Auto Scaling")."""
    max_group_prepared_capacity: int | None = None
    """None: the pool holds MaxSize - desired (PutWarmPool API reference, MaxGroupPreparedCapacity)."""
    reuse_on_scale_in: bool = False


@dataclass(frozen=True)
class Volume:
    size_gib: float
    iops: int = DEFAULT_GP3_IOPS
    throughput_mibps: int = DEFAULT_GP3_THROUGHPUT_MIBPS
    volume_type: str = "gp3"


@dataclass(frozen=True)
class PlanFigures:
    """What ``GpuInferenceFleet`` recorded of its plan (fleets/inference.py ``_plan_metadata``)."""

    model: str
    instance_type: str
    devices_per_replica: int
    weights_gib: float
    concurrency_per_instance: int
    in_flight_target: float
    max_num_seqs: int
    max_model_len: int
    kv_cache_gib_available: float
    block_size: int
    prompt_tokens: int
    output_tokens: int
    p95_ttft_ms: float
    p95_tpot_ms: float
    concurrent_sessions: int
    usd_per_hour: float
    cold_start_s: float
    warm_start_s: float
    estimate_ttft_ms: float
    estimate_tpot_ms: float
    model_version: str = ""
    metric_namespace: str = DEFAULT_METRIC_NAMESPACE
    fleet: str = ""
    replicas_per_instance: int = 1
    """Model servers per instance, each with max_num_seqs and kv_cache_gib_available of its own."""


@dataclass(frozen=True)
class FleetSpec:
    """Everything the simulator replays, read from one template."""

    group_logical_id: str
    min_size: int
    max_size: int
    desired_capacity: int
    plan: PlanFigures
    health_check_type: str = "EC2"
    health_check_grace_s: int = 0
    default_instance_warmup_s: int | None = None
    warm_pool: WarmPoolSpec | None = None
    launch_hook: bool = False
    health_check_interval_s: int = DEFAULT_HEALTH_CHECK_INTERVAL_S
    unhealthy_threshold: int = DEFAULT_UNHEALTHY_THRESHOLD
    routing_algorithm: str = "round_robin"
    """ELB user guide, "Edit target group attributes": the routing algorithm default is round robin."""
    deregistration_delay_s: int = DEFAULT_DEREGISTRATION_DELAY_S
    idle_timeout_s: int = DEFAULT_IDLE_TIMEOUT_S
    volumes: tuple[Volume, ...] = (Volume(DEFAULT_ROOT_VOLUME_GIB),)
    target_tracking: tuple[TargetTrackingPolicy, ...] = ()
    step_policies: tuple[StepPolicy, ...] = ()
    unmodelled: tuple[str, ...] = field(default_factory=tuple)

    def without_warm_pool(self) -> FleetSpec:
        """The same fleet with no warm pool: every scale-out is a cold launch."""
        return replace(self, warm_pool=None)

    def with_gpu_utilization_tracking(self, target_percent: float) -> FleetSpec:
        """The policy most teams write first: one target-tracking policy on average GPU utilization, no others."""
        metric = MetricStat(self.plan.metric_namespace, "nvidia_smi_utilization_gpu", "Average")
        policy = TargetTrackingPolicy("GpuUtilizationTracking", target_percent, (MetricQuery("gpu", metric),))
        return replace(self, target_tracking=(policy,), step_policies=())

    def with_warm_pool_of(self, other: FleetSpec) -> FleetSpec:
        """The same group with ``other``'s warm pool (a slot as it served before a release moved its pool)."""
        return replace(self, warm_pool=other.warm_pool)

    def with_max_size(self, max_size: int) -> FleetSpec:
        """The same fleet allowed to grow to ``max_size`` (for sizing questions the template's maximum hides)."""
        return replace(self, max_size=max(max_size, self.min_size))


def read_template(source: str | Path | Mapping[str, Any]) -> FleetSpec:
    """The inference fleet of a synthesized template (a path to ``*.template.json`` or the parsed JSON).

    :raises TemplateReadError: the file is missing or not JSON, has no ``Resources``, or holds no group carrying
        the plan metadata.
    """
    template = _load(source)
    return _Reader(template).fleet()


def _load(source: str | Path | Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(source, Mapping):
        template: Any = source
        name = "the template given"
    else:
        path = Path(source)
        name = str(path)
        try:
            template = json.loads(path.read_text())
        except FileNotFoundError:
            raise TemplateReadError(f"template {name} does not exist: give the path of a *.template.json that "
                                    "cdk synth wrote (cdk.out/<Stack>.template.json)") from None
        except (OSError, UnicodeDecodeError) as error:
            raise TemplateReadError(f"template {name} cannot be read ({error}): give a *.template.json file") from None
        except json.JSONDecodeError as error:
            raise TemplateReadError(f"template {name} is not JSON (line {error.lineno}: {error.msg}): give the "
                                    "*.template.json that cdk synth wrote") from None
    if not isinstance(template, Mapping) or not isinstance(template.get("Resources"), Mapping):
        raise TemplateReadError(f"{name} has no Resources section: give a CloudFormation template from cdk synth")
    return template


def _ref_target(value: Any) -> str | None:
    """The logical id a ``Ref`` or ``Fn::GetAtt`` points at, else None."""
    if isinstance(value, Mapping):
        if isinstance(value.get("Ref"), str):
            return str(value["Ref"])
        get_att = value.get("Fn::GetAtt")
        if isinstance(get_att, list) and get_att and isinstance(get_att[0], str):
            return str(get_att[0])
    return None


class _Reader:
    def __init__(self, template: Mapping[str, Any]) -> None:
        self.resources: Mapping[str, Any] = template["Resources"]
        self.parameters: Mapping[str, Any] = template.get("Parameters") or {}
        self.unmodelled: list[str] = []

    def of_type(self, kind: str) -> list[tuple[str, Mapping[str, Any]]]:
        return [(lid, r) for lid, r in self.resources.items() if isinstance(r, Mapping) and r.get("Type") == kind]

    def props(self, resource: Mapping[str, Any]) -> Mapping[str, Any]:
        value = resource.get("Properties") or {}
        return value if isinstance(value, Mapping) else {}

    def number(self, value: Any, what: str, default: float | None = None) -> float:
        """A literal (numbers may be strings in CDK output) or a Ref to a parameter with a literal Default."""
        if value is None:
            if default is None:
                raise TemplateReadError(f"{what} is missing: the simulator needs a literal number there")
            return default
        ref = _ref_target(value)
        if ref is not None and ref in self.parameters and "Default" in self.parameters[ref]:
            value = self.parameters[ref]["Default"]
        if isinstance(value, bool):
            raise TemplateReadError(f"{what} is {value!r}, not a number")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise TemplateReadError(f"{what} is {json.dumps(value)}, which the simulator cannot resolve to a "
                                    "number: synthesize with literal values") from None
        if not math.isfinite(number):
            raise TemplateReadError(f"{what} is {value!r}: it must be a finite number")
        return number

    def refers_to_group(self, value: Any, group_id: str, group_name: Any) -> bool:
        return _ref_target(value) == group_id or (isinstance(value, str) and value == group_name)

    # ---- the fleet ----------------------------------------------------------------------------------------------

    def slots(self) -> list[tuple[str, Mapping[str, Any]]]:
        """The first fleet's slots (its groups carrying the plan metadata, one per slot), the live slot first."""
        groups = self.of_type("AWS::AutoScaling::AutoScalingGroup")
        fleets = [(lid, g) for lid, g in groups if isinstance((g.get("Metadata") or {}).get(PLAN_METADATA_KEY), Mapping)]
        if not fleets:
            detail = (f"its {len(groups)} Auto Scaling group(s) carry no {PLAN_METADATA_KEY} metadata" if groups
                      else "it has no AWS::AutoScaling::AutoScalingGroup")
            raise TemplateReadError(f"the template holds no inference fleet to simulate: {detail}; synthesize a "
                                    "stack with a GpuInferenceFleet")
        first = fleets[0][1]["Metadata"][PLAN_METADATA_KEY].get("fleet")
        # A blue/green fleet's two groups are its slots (same "fleet" in their metadata), not two fleets.
        slots = [(lid, g) for lid, g in fleets
                 if first and g["Metadata"][PLAN_METADATA_KEY].get("fleet") == first] or fleets[:1]
        for other_id, _ in fleets:
            if all(other_id != lid for lid, _ in slots):
                self.unmodelled.append(f"second fleet {other_id}: only the first fleet ({slots[0][0]}) is simulated")
        for other_id, other in groups:
            if (other.get("Metadata") or {}).get(PLAN_METADATA_KEY) is None:
                self.unmodelled.append(f"Auto Scaling group {other_id} has no {PLAN_METADATA_KEY} metadata (not an "
                                       "inference fleet): not simulated")
        # The slot the last release names serves (metadata "live_slot"); the other waits at zero, so simulating the
        # live one alone is exact outside a rollout.
        return sorted(slots, key=lambda item: item[1]["Metadata"][PLAN_METADATA_KEY].get("slot") !=
                      item[1]["Metadata"][PLAN_METADATA_KEY].get("live_slot", item[1]["Metadata"][
                          PLAN_METADATA_KEY].get("slot")))

    def fleet(self, slot: int = 0) -> FleetSpec:
        """The fleet's live slot (``slot=0``), or its other slot (``slot=1``)."""
        slots = self.slots()
        if slot >= len(slots):
            raise TemplateReadError("the template's fleet has one slot only: a rollout needs two (synthesize the "
                                    "GpuInferenceFleet with its default rollout)")
        group_id, group = slots[slot]
        props = self.props(group)
        group_name = props.get("AutoScalingGroupName")
        plan = self.plan(group_id, group["Metadata"][PLAN_METADATA_KEY])
        min_size = int(self.number(props.get("MinSize"), f"{group_id} MinSize"))
        max_size = int(self.number(props.get("MaxSize"), f"{group_id} MaxSize"))
        desired = int(self.number(props.get("DesiredCapacity"), f"{group_id} DesiredCapacity", float(min_size)))
        if "MixedInstancesPolicy" in props:
            self.unmodelled.append(f"{group_id} has a MixedInstancesPolicy (Spot or several instance types): "
                                   f"simulated as On-Demand {plan.instance_type} only, without Spot interruptions")
        warmup = props.get("DefaultInstanceWarmup")
        spec = FleetSpec(
            group_logical_id=group_id, min_size=min_size, max_size=max_size,
            desired_capacity=min(max(desired, min_size), max_size), plan=plan,
            health_check_type=str(props.get("HealthCheckType") or "EC2"),
            health_check_grace_s=int(self.number(props.get("HealthCheckGracePeriod"), "HealthCheckGracePeriod", 0)),
            default_instance_warmup_s=None if warmup is None else int(self.number(warmup, "DefaultInstanceWarmup")),
            warm_pool=self.warm_pool(group_id, group_name),
            launch_hook=self.launch_hook(group_id, group_name, props),
            volumes=self.volumes(group_id, props),
            **self.target_group(group_id, props),
            target_tracking=(), step_policies=(),
        )
        tracking, steps = self.policies(group_id, group_name, plan)
        for kind in ("AWS::AutoScaling::ScheduledAction",):
            for lid, r in self.of_type(kind):
                if self.refers_to_group(self.props(r).get("AutoScalingGroupName"), group_id, group_name):
                    self.unmodelled.append(f"scheduled action {lid}: schedules are not replayed")
        return replace(spec, target_tracking=tuple(tracking), step_policies=tuple(steps),
                       unmodelled=tuple(self.unmodelled))

    def plan(self, group_id: str, meta: Mapping[str, Any]) -> PlanFigures:
        server = meta.get("server") if isinstance(meta.get("server"), Mapping) else {}
        traffic = meta.get("traffic") if isinstance(meta.get("traffic"), Mapping) else {}
        assert isinstance(server, Mapping) and isinstance(traffic, Mapping)
        missing = [k for k in ("model", "instance_type", "weights_gib", "concurrency_per_instance", "usd_per_hour")
                   if k not in meta]
        missing += [f"server.{k}" for k in ("max_num_seqs", "max_model_len", "kv_cache_gib_available") if k not in server]
        missing += [f"traffic.{k}" for k in ("p95_ttft_ms", "p95_tpot_ms") if k not in traffic]
        if missing:
            raise TemplateReadError(f"{group_id}'s {PLAN_METADATA_KEY} metadata lacks {', '.join(missing)}: "
                                    "synthesize it again with the current GpuInferenceFleet")
        weights = self.number(meta["weights_gib"], "plan weights_gib")
        starts = meta.get("time_to_serving_s") if isinstance(meta.get("time_to_serving_s"), Mapping) else {}
        assert isinstance(starts, Mapping)
        cold = starts.get("cold", time_to_serving(weights, "cold").total_s)
        warm = starts.get("warm", time_to_serving(weights, "warm").total_s)
        concurrency = int(self.number(meta["concurrency_per_instance"], "plan concurrency_per_instance"))
        figures = meta.get("estimate") if isinstance(meta.get("estimate"), Mapping) else {}
        assert isinstance(figures, Mapping)
        return PlanFigures(
            model=str(meta["model"]), instance_type=str(meta["instance_type"]),
            devices_per_replica=int(self.number(meta.get("devices_per_replica"), "plan devices_per_replica", 1)),
            replicas_per_instance=int(
                self.number(meta.get("replicas_per_instance"), "plan replicas_per_instance", 1)),
            weights_gib=weights, concurrency_per_instance=concurrency,
            in_flight_target=self.number(meta.get("in_flight_target"), "plan in_flight_target", float(concurrency)),
            max_num_seqs=int(self.number(server["max_num_seqs"], "server max_num_seqs")),
            max_model_len=int(self.number(server["max_model_len"], "server max_model_len")),
            kv_cache_gib_available=self.number(server["kv_cache_gib_available"], "server kv_cache_gib_available"),
            block_size=int(self.number(server.get("block_size"), "server block_size", 16)),
            prompt_tokens=int(self.number(traffic.get("prompt_tokens"), "traffic prompt_tokens", 1024)),
            output_tokens=int(self.number(traffic.get("output_tokens"), "traffic output_tokens", 256)),
            p95_ttft_ms=self.number(traffic["p95_ttft_ms"], "traffic p95_ttft_ms"),
            p95_tpot_ms=self.number(traffic["p95_tpot_ms"], "traffic p95_tpot_ms"),
            concurrent_sessions=int(self.number(traffic.get("concurrent_sessions"), "traffic concurrent_sessions",
                                                float(concurrency))),
            usd_per_hour=self.number(meta["usd_per_hour"], "plan usd_per_hour"),
            cold_start_s=self.number(cold, "time_to_serving_s.cold"),
            warm_start_s=self.number(warm, "time_to_serving_s.warm"),
            estimate_ttft_ms=self.number(figures.get("ttft_ms"), "estimate ttft_ms", self.number(traffic["p95_ttft_ms"], "")),
            estimate_tpot_ms=self.number(figures.get("tpot_ms"), "estimate tpot_ms", self.number(traffic["p95_tpot_ms"], "")),
            model_version=str(meta.get("model_version", "")),
            metric_namespace=str(meta.get("metric_namespace") or DEFAULT_METRIC_NAMESPACE),
            fleet=str(meta.get("fleet", "")),
        )

    def warm_pool(self, group_id: str, group_name: Any) -> WarmPoolSpec | None:
        for lid, r in self.of_type("AWS::AutoScaling::WarmPool"):
            p = self.props(r)
            if not self.refers_to_group(p.get("AutoScalingGroupName"), group_id, group_name):
                continue
            state = str(p.get("PoolState") or "Stopped")
            if state != "Stopped":
                self.unmodelled.append(f"warm pool {lid} PoolState {state}: simulated as Stopped (resume time and "
                                       "EBS-only cost)")
            prepared = p.get("MaxGroupPreparedCapacity")
            reuse = p.get("InstanceReusePolicy") or {}
            return WarmPoolSpec(
                min_size=int(self.number(p.get("MinSize"), f"{lid} MinSize", 0)), pool_state=state,
                max_group_prepared_capacity=None if prepared in (None, -1) else int(self.number(prepared, lid)),
                reuse_on_scale_in=bool(isinstance(reuse, Mapping) and reuse.get("ReuseOnScaleIn")),
            )
        return None

    def launch_hook(self, group_id: str, group_name: Any, props: Mapping[str, Any]) -> bool:
        hooks = [self.props(r) for _, r in self.of_type("AWS::AutoScaling::LifecycleHook")]
        hooks = [h for h in hooks if self.refers_to_group(h.get("AutoScalingGroupName"), group_id, group_name)]
        inline = props.get("LifecycleHookSpecificationList") or []
        hooks += [h for h in inline if isinstance(h, Mapping)]
        return any(h.get("LifecycleTransition") == "autoscaling:EC2_INSTANCE_LAUNCHING" for h in hooks)

    def volumes(self, group_id: str, props: Mapping[str, Any]) -> tuple[Volume, ...]:
        ref = props.get("LaunchTemplate") or {}
        lt_id = _ref_target(ref.get("LaunchTemplateId")) if isinstance(ref, Mapping) else None
        lt = self.resources.get(lt_id) if lt_id else None
        if not isinstance(lt, Mapping):
            self.unmodelled.append(f"{group_id}'s launch template is not in the template: EBS charged as one "
                                   f"{DEFAULT_ROOT_VOLUME_GIB} GiB gp3 volume")
            return (Volume(DEFAULT_ROOT_VOLUME_GIB),)
        data = self.props(lt).get("LaunchTemplateData") or {}
        volumes = []
        for mapping in data.get("BlockDeviceMappings") or []:
            ebs = mapping.get("Ebs") if isinstance(mapping, Mapping) else None
            if not isinstance(ebs, Mapping):
                continue
            kind = str(ebs.get("VolumeType") or "gp3")
            if kind != "gp3":
                self.unmodelled.append(f"volume {mapping.get('DeviceName')} is {kind}: charged at gp3 prices")
            volumes.append(Volume(
                size_gib=self.number(ebs.get("VolumeSize"), "VolumeSize", DEFAULT_ROOT_VOLUME_GIB),
                iops=int(self.number(ebs.get("Iops"), "Iops", DEFAULT_GP3_IOPS)),
                throughput_mibps=int(self.number(ebs.get("Throughput"), "Throughput", DEFAULT_GP3_THROUGHPUT_MIBPS)),
                volume_type=kind))
        return tuple(volumes) or (Volume(DEFAULT_ROOT_VOLUME_GIB),)

    def target_group(self, group_id: str, props: Mapping[str, Any]) -> dict[str, Any]:
        arns = props.get("TargetGroupARNs") or []
        tg_ids = [t for t in (_ref_target(a) for a in arns) if t and t in self.resources]
        if not tg_ids:
            self.unmodelled.append(f"{group_id} has no target group in the template: no load balancer health "
                                   "checks, round-robin routing assumed")
            return {}
        if len(tg_ids) > 1:
            self.unmodelled.append(f"{group_id} has {len(tg_ids)} target groups: only {tg_ids[0]} is simulated")
        tg = self.props(self.resources[tg_ids[0]])
        attributes = {a.get("Key"): a.get("Value") for a in tg.get("TargetGroupAttributes") or []
                      if isinstance(a, Mapping)}
        algorithm = str(attributes.get("load_balancing.algorithm.type") or "round_robin")
        if algorithm not in ("round_robin", "least_outstanding_requests"):
            self.unmodelled.append(f"routing algorithm {algorithm}: simulated as round robin")
            algorithm = "round_robin"
        return {
            "health_check_interval_s": int(self.number(tg.get("HealthCheckIntervalSeconds"), "HealthCheckInterval",
                                                       DEFAULT_HEALTH_CHECK_INTERVAL_S)),
            "unhealthy_threshold": int(self.number(tg.get("UnhealthyThresholdCount"), "UnhealthyThresholdCount",
                                                   DEFAULT_UNHEALTHY_THRESHOLD)),
            "routing_algorithm": algorithm,
            "deregistration_delay_s": int(self.number(attributes.get("deregistration_delay.timeout_seconds"),
                                                      "deregistration delay", DEFAULT_DEREGISTRATION_DELAY_S)),
            "idle_timeout_s": self.idle_timeout(tg_ids[0]),
        }

    def idle_timeout(self, tg_id: str) -> int:
        for _, listener in self.of_type("AWS::ElasticLoadBalancingV2::Listener"):
            p = self.props(listener)
            if any(_ref_target(a.get("TargetGroupArn")) == tg_id for a in p.get("DefaultActions") or []
                   if isinstance(a, Mapping)):
                lb = self.resources.get(_ref_target(p.get("LoadBalancerArn")) or "")
                if isinstance(lb, Mapping):
                    for a in self.props(lb).get("LoadBalancerAttributes") or []:
                        if isinstance(a, Mapping) and a.get("Key") == "idle_timeout.timeout_seconds":
                            return int(self.number(a.get("Value"), "idle timeout"))
        return DEFAULT_IDLE_TIMEOUT_S

    # ---- policies and alarms ------------------------------------------------------------------------------------

    def policies(self, group_id: str, group_name: Any, plan: PlanFigures
                 ) -> tuple[list[TargetTrackingPolicy], list[StepPolicy]]:
        tracking: list[TargetTrackingPolicy] = []
        steps: list[StepPolicy] = []
        for lid, r in self.of_type("AWS::AutoScaling::ScalingPolicy"):
            p = self.props(r)
            if not self.refers_to_group(p.get("AutoScalingGroupName"), group_id, group_name):
                continue
            kind = str(p.get("PolicyType") or "SimpleScaling")
            warmup = p.get("EstimatedInstanceWarmup")
            warmup_s = None if warmup is None else int(self.number(warmup, f"{lid} EstimatedInstanceWarmup"))
            if kind == "TargetTrackingScaling":
                policy = self.target_tracking(lid, p.get("TargetTrackingConfiguration") or {}, warmup_s)
                if policy is not None:
                    tracking.append(policy)
            elif kind == "StepScaling":
                step = self.step_policy(lid, p, warmup_s)
                if step is not None:
                    steps.append(step)
            else:
                self.unmodelled.append(f"{kind} policy {lid}: only target tracking and step scaling are simulated")
        return tracking, steps

    def target_tracking(self, lid: str, config: Mapping[str, Any], warmup_s: int | None) -> TargetTrackingPolicy | None:
        target = self.number(config.get("TargetValue"), f"{lid} TargetValue")
        predefined = config.get("PredefinedMetricSpecification")
        custom = config.get("CustomizedMetricSpecification")
        queries: tuple[MetricQuery, ...] | None
        if isinstance(predefined, Mapping):
            kind = str(predefined.get("PredefinedMetricType"))
            if kind not in PREDEFINED_METRICS:
                self.unmodelled.append(f"target tracking policy {lid} tracks {kind}, which the simulator does not "
                                       "produce: policy not simulated")
                return None
            namespace, name, stat = PREDEFINED_METRICS[kind]
            queries = (MetricQuery("m1", MetricStat(namespace, name, stat)),)
        elif isinstance(custom, Mapping):
            if custom.get("Metrics"):
                queries = self.queries(lid, custom["Metrics"], DEFAULT_ALARM_PERIOD_S)
            else:
                stat = str(custom.get("Statistic") or "Average")
                queries = self.queries(lid, [{"Id": "m1", "MetricStat": {"Metric": custom, "Stat": stat}}],
                                       DEFAULT_ALARM_PERIOD_S)
        else:
            self.unmodelled.append(f"target tracking policy {lid} names no metric: policy not simulated")
            return None
        if queries is None:
            return None
        return TargetTrackingPolicy(lid, target, queries, bool(config.get("DisableScaleIn", False)), warmup_s)

    def step_policy(self, lid: str, p: Mapping[str, Any], warmup_s: int | None) -> StepPolicy | None:
        steps = []
        for s in p.get("StepAdjustments") or []:
            lower, upper = s.get("MetricIntervalLowerBound"), s.get("MetricIntervalUpperBound")
            steps.append(StepAdjustment(None if lower is None else self.number(lower, f"{lid} lower bound"),
                                        None if upper is None else self.number(upper, f"{lid} upper bound"),
                                        int(self.number(s.get("ScalingAdjustment"), f"{lid} ScalingAdjustment"))))
        alarms = []
        for alarm_id, r in self.of_type("AWS::CloudWatch::Alarm"):
            a = self.props(r)
            if any(_ref_target(action) == lid for action in a.get("AlarmActions") or []):
                alarm = self.alarm(alarm_id, a)
                if alarm is not None:
                    alarms.append(alarm)
        if not alarms:
            self.unmodelled.append(f"step policy {lid} has no alarm the simulator can evaluate: policy not simulated")
            return None
        magnitude = p.get("MinAdjustmentMagnitude")
        return StepPolicy(
            logical_id=lid, adjustment_type=str(p.get("AdjustmentType") or "ChangeInCapacity"), steps=tuple(steps),
            alarms=tuple(alarms),
            min_adjustment_magnitude=None if magnitude is None else int(self.number(magnitude, f"{lid} magnitude")),
            metric_aggregation_type=str(p.get("MetricAggregationType") or "Average"),
            estimated_instance_warmup_s=warmup_s)

    def alarm(self, lid: str, a: Mapping[str, Any]) -> AlarmSpec | None:
        comparison = str(a.get("ComparisonOperator"))
        treat = str(a.get("TreatMissingData") or "missing")
        if comparison not in COMPARISONS:
            self.unmodelled.append(f"alarm {lid} compares with {comparison}: alarm not simulated")
            return None
        if treat not in TREAT_MISSING:
            self.unmodelled.append(f"alarm {lid} TreatMissingData {treat}: alarm not simulated")
            return None
        period = int(self.number(a.get("Period"), f"{lid} Period", DEFAULT_ALARM_PERIOD_S))
        if a.get("Metrics"):
            queries = self.queries(lid, a["Metrics"], period)
            periods = [q.metric.period_s for q in queries or () if q.metric is not None]
            period = periods[0] if periods else period
        else:
            stat = a.get("ExtendedStatistic") or a.get("Statistic") or "Average"
            metric = {"Namespace": a.get("Namespace"), "MetricName": a.get("MetricName")}
            queries = self.queries(lid, [{"Id": "m1", "MetricStat": {"Metric": metric, "Stat": stat,
                                                                      "Period": period}}], period)
        if queries is None:
            return None
        evaluation = int(self.number(a.get("EvaluationPeriods"), f"{lid} EvaluationPeriods"))
        return AlarmSpec(
            logical_id=lid, queries=queries, period_s=period, evaluation_periods=evaluation,
            datapoints_to_alarm=int(self.number(a.get("DatapointsToAlarm"), f"{lid} DatapointsToAlarm", evaluation)),
            threshold=self.number(a.get("Threshold"), f"{lid} Threshold"), comparison=comparison,
            treat_missing_data=treat)

    def queries(self, owner: str, entries: Any, period: int) -> tuple[MetricQuery, ...] | None:
        """Parse a ``Metrics`` list; None (and an unmodelled entry) when any metric or expression is unknown."""
        out: list[MetricQuery] = []
        for entry in entries if isinstance(entries, list) else []:
            if not isinstance(entry, Mapping):
                continue
            qid = str(entry.get("Id"))
            return_data = bool(entry.get("ReturnData", True))
            if entry.get("Expression") is not None:
                out.append(MetricQuery(qid, expression=str(entry["Expression"]), return_data=return_data))
                continue
            stat_entry = entry.get("MetricStat") or {}
            metric = stat_entry.get("Metric") or {}
            namespace, name = str(metric.get("Namespace")), str(metric.get("MetricName"))
            stat = str(stat_entry.get("Stat") or "Average")
            known = name in KNOWN_CUSTOM_METRICS if namespace != "AWS/ApplicationELB" else name in KNOWN_ALB_METRICS
            if not known:
                self.unmodelled.append(f"{owner} reads {namespace} {name}, which the simulator does not produce: "
                                       f"{owner} not simulated")
                return None
            if stat not in KNOWN_STATISTICS and not PERCENTILE.match(stat):
                self.unmodelled.append(f"{owner} uses statistic {stat}, which the simulator does not compute: "
                                       f"{owner} not simulated")
                return None
            metric_period = int(self.number(stat_entry.get("Period"), f"{owner} Period", period))
            out.append(MetricQuery(qid, MetricStat(namespace, name, stat, metric_period), return_data=return_data))
        if not out:
            self.unmodelled.append(f"{owner} has no metric: not simulated")
            return None
        ids = {q.id for q in out}
        for q in out:
            if q.expression is not None:
                problem = expression_problem(q.expression, ids - {q.id})
                if problem:
                    self.unmodelled.append(f"{owner} metric math {q.expression!r}: {problem}: {owner} not simulated")
                    return None
        if sum(q.return_data for q in out) != 1:
            self.unmodelled.append(f"{owner} returns {sum(q.return_data for q in out)} series (one expected): "
                                   f"{owner} not simulated")
            return None
        return tuple(out)


def expression_problem(expression: str, ids: set[str]) -> str | None:
    """Why the evaluator cannot compute ``expression`` over ``ids`` (None: it can)."""
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        return "not an arithmetic expression the simulator can parse"
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in ALLOWED_MATH_FUNCTIONS:
                return f"function {ast.unparse(node.func)} is not implemented (only {', '.join(ALLOWED_MATH_FUNCTIONS)})"
        elif isinstance(node, ast.Name):
            if node.id not in ids and node.id not in ALLOWED_MATH_FUNCTIONS:
                return f"{node.id} is not a metric id of the query"
        elif not isinstance(node, (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.Load, ast.Add, ast.Sub,
                                   ast.Mult, ast.Div, ast.USub, ast.UAdd)):
            return f"{type(node).__name__} is not supported"
        if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float)):
            return f"constant {node.value!r} is not a number"
    return None
