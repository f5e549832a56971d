"""Planners: search the whole catalog for the cheapest fleet that meets the traffic's targets, and say why."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from functools import lru_cache

from genai_constructs.errors import (
    DeadlineUnreachableError,
    GenaiConstructsError,
    InstanceTypeNotOfferedError,
    LatencyTargetUnreachableError,
    ModelDoesNotFitError,
    ServerStartupError,
)
from genai_constructs.planner.catalog import InstanceType, load_catalog
from genai_constructs.planner.deployment import SCALE_OUT_ROOM
from genai_constructs.planner.estimate import (
    DEFAULT_RUNTIME,
    GIB,
    RUNTIMES,
    estimate,
    tensor_parallel_ranks,
    valid_device_counts,
)
from genai_constructs.planner.plans import EmbeddingPlan, Estimate, InferencePlan, PlanOption, ServerSettings
from genai_constructs.planner.pricing import (
    FleetCost,
    InstancePrice,
    QuotaNeed,
    batch_job_cost,
    inference_fleet_cost,
    instance_price,
    normalize_region,
    vcpu_quota,
)
from genai_constructs.planner.server_settings import VLLM_VERSION, derive_server_settings, startup_findings
from genai_constructs.planner.startup import time_to_serving
from genai_constructs.workload import (
    DEFAULT_MAX_REQUEST_TOKENS_FACTOR,
    DEFAULT_MAX_REQUEST_TOKENS_FLOOR,
    BatchTraffic,
    ModelShape,
    RealtimeTraffic,
)

ENCODER_COMPUTE_EFFICIENCY = 0.40
"""Encoders at 128-512 tokens run small GEMMs plus memory-bound layernorm/softmax/gather between them: the four
published encoder rows (A100 TensorRT, L4 TEI, two Inferentia2) sustain 37-44 % of dense peak."""
TOKENIZER_TOKENS_PER_S_PER_VCPU = 250_000
"""Fast (Rust) WordPiece tokenization plus chunking on one vCPU; caps a worker whose GPU would outrun its CPU."""
WORKER_VCPUS_RESERVED = 1
"""One vCPU per instance left for the OS, the CloudWatch agent and S3/SQS I/O threads."""
MAX_BATCH_INSTANCES = 64
"""Largest embedding fleet planned: beyond it GPU vCPU quotas and Spot pools, not arithmetic, decide."""
EMBEDDING_BATCH_SIZE = 64
"""Sequences per encoder call: enough to fill the tensor cores at 512 tokens without padding waste dominating."""
WORKER_MESSAGES_IN_FLIGHT = 2
"""Messages a worker holds at once: one on the device, one being read from S3 and tokenized, so the GPU never waits
on I/O and never thrashes between more batches than fit its memory."""
MAX_STARTUP_FAILURES_SHOWN = 6
"""When no option can start the server, the error lists the problems of this many (the roomiest first)."""
INCLUDE_NEURON_DEFAULT = False
"""Inferentia2/Trainium need a model compiled ahead of time for fixed sequence buckets and the Neuron DLAMI; the
planner ranks them only when asked (include_neuron=True) and otherwise notes when one would have been cheaper."""

NEURON_CAVEATS = [
    "Inferentia2/Trainium run only Neuron-compiled models: compile the model with the Neuron SDK (torch-neuronx / "
    "transformers-neuronx or optimum-neuron) for this tensor-parallel degree before deploying.",
    "Compiled models serve fixed sequence-length buckets: prompts are padded up to the next bucket, so choose buckets "
    "near the traffic's prompt and output lengths, and a new maximum length means a recompile.",
    "Instances boot the Neuron DLAMI (its own public SSM parameter), not the NVIDIA one; containers need the Neuron runtime.",
]

# The lesson's family table: what to watch on each family, and the lever that lowers cost there.
FAMILY_GUIDE: dict[str, tuple[str, str]] = {
    "g4dn": (
        "16 GiB of T4 memory at 320 GB/s: decode is bandwidth bound and KV cache room is small.",
        "Quantize (int8/int4) so weights and cache fit one T4; fine for small models and embeddings only.",
    ),
    "g5": (
        "A10G memory bandwidth (600 GB/s) bounds decode; 22 GiB per GPU caps model size and concurrency.",
        "Raise per-instance concurrency up to the latency target (continuous batching); int4/AWQ to fit larger models on one GPU.",
    ),
    "g6": (
        "L4 memory bandwidth (300 GB/s) makes decode slow per token; strong compute per dollar for prefill and encoders.",
        "FP8 weights halve the bytes each decode step reads; best for embeddings and short-output work.",
    ),
    "g6e": (
        "L40S: 45 GiB per GPU but PCIe between GPUs: tensor-parallel all-reduces, not memory, limit multi-GPU decode.",
        "Fit the model on as few GPUs as possible (FP8) to avoid PCIe collectives; a single-GPU replica per instance is cheapest.",
    ),
    "p4d": (
        "A100 40 GiB: memory bandwidth per GPU and NVLink collectives across 8 GPUs; a whole 8-GPU box is the unit of purchase.",
        "Batch aggressively (the box is paid for whole) and use Savings Plans or capacity reservations for steady load.",
    ),
    "p4de": (
        "A100 80 GiB: as p4d, with room for longer contexts and bigger batches.",
        "Batch aggressively; Savings Plans or capacity reservations for steady load.",
    ),
    "p5": (
        "H100: keeping 8 GPUs busy: host overhead, batching and prefill scheduling, not bandwidth, become the limit.",
        "FP8 and large batches; EC2 Capacity Blocks or Savings Plans instead of on-demand.",
    ),
    "p5e": (
        "H200 141 GiB: as p5, with memory for 70B-class models on fewer GPUs.",
        "Capacity Blocks only (no public on-demand price); FP8 and large batches.",
    ),
    "p5en": ("H200 with faster host links: as p5e.", "FP8 and large batches; Capacity Blocks or Savings Plans."),
    "p6-b200": (
        "B200: host overhead and batching dominate; memory is rarely the limit.",
        "FP8/FP4 and very large batches; Capacity Blocks or Savings Plans.",
    ),
    "inf2": (
        "Neuron compile and sequence buckets; NeuronCore collectives at high tensor-parallel degree.",
        "Lowest $/token for supported models with steady traffic; reuse compiled artifacts across deploys.",
    ),
    "trn1": (
        "Neuron compile and sequence buckets; Trainium is sized for training, inference is a secondary fit.",
        "Use only when trn1 capacity is already owned; otherwise inf2 is cheaper for inference.",
    ),
}


def _guide(family: str) -> tuple[str, str]:
    return FAMILY_GUIDE.get(
        family, ("Accelerator memory bandwidth during decode.", "Right-size concurrency per instance.")
    )


@lru_cache(maxsize=64)
def _region_has_prices(region: str) -> bool:
    """Whether the price data carries any on-demand price for ``region`` (cfn-lint-only regions have none)."""
    for instance_type in load_catalog().instances:
        try:
            if instance_price(instance_type, region).on_demand_usd_per_hour is not None:
                return True
        except InstanceTypeNotOfferedError:
            continue
    return False


class _Candidates:
    """The instance types a plan weighs, priced in its region, and the types the region does not offer."""

    def __init__(self, instance_types: Iterable[str] | None, include_neuron: bool, region: str | None) -> None:
        catalog = load_catalog()
        if instance_types is not None:
            if isinstance(instance_types, str):
                raise GenaiConstructsError(
                    f"instance_types ({instance_types!r}) must be a list of instance type names, not one string: "
                    f"write instance_types=[{instance_types!r}]"
                )
            listed = [catalog.instance(name) for name in instance_types]
            if not listed:
                raise GenaiConstructsError(
                    "instance_types ([]) is empty: leave it unset to search the whole catalog, or name at least one "
                    "type, e.g. ['g6e.xlarge']"
                )
        else:
            listed = [i for i in catalog.instances.values() if include_neuron or not i.is_neuron]
        self.region = region
        self.prices: dict[str, InstancePrice] = {}
        self.not_offered: list[str] = []
        self.instances: list[InstanceType] = []
        self.proxied = False
        for instance in listed:
            try:
                price = instance_price(instance.instance_type, region)
            except InstanceTypeNotOfferedError:
                if instance_types is not None:
                    raise  # a type the user named: say where it is offered instead of planning without it
                self.not_offered.append(instance.instance_type)
                continue
            if region is not None and not _region_has_prices(region) and instance.on_demand_usd_per_hour is not None:
                # A region only cfn-lint lists (sa-east-1, the GovCloud and China regions, ...) has no price in the
                # data at all: rank on us-east-1's figure, labelled, rather than refuse to plan there.
                price = price.model_copy(
                    update={
                        "on_demand_usd_per_hour": instance.on_demand_usd_per_hour,
                        "on_demand_label": f"us-east-1 on-demand price used as a proxy: the price data has no "
                        f"prices for {region} (offered there per cfn-lint); expect the real figure to differ",
                    }
                )
                self.proxied = True
            self.prices[instance.instance_type] = price
            if region is not None:
                # Regional figures replace the catalog's us-east-1 price for everything downstream.
                instance = instance.model_copy(update={"on_demand_usd_per_hour": price.on_demand_usd_per_hour})
            self.instances.append(instance)

    def require_some(self, planner: str) -> None:
        """An error when the region offers none of the types to weigh (rather than a plan over nothing)."""
        if self.instances:
            return
        raise InstanceTypeNotOfferedError(
            f"{planner}: region {self.region!r} offers none of the {len(self.not_offered)} instance types weighed "
            f"({', '.join(sorted(self.not_offered)[:8])}{', ...' if len(self.not_offered) > 8 else ''}): plan in "
            "another region, or pass include_neuron=True where only Inferentia2/Trainium are offered"
        )

    def notes(self) -> list[str]:
        if self.region is None:
            return [
                f"Prices are {load_catalog().price_region}'s (no region given): pass region= (--region) to price and "
                "check availability where the fleet runs."
            ]
        notes = []
        if self.proxied:
            notes.append(
                f"The price data has no prices for {self.region}: every figure is us-east-1's, used as a proxy."
            )
        if self.not_offered:
            notes.append(f"Not offered in {self.region}, so not weighed: {', '.join(sorted(self.not_offered))}.")
        return notes


def _quota(chosen: InstanceType, instances: int, *, spot: bool, overrides: Sequence[InstanceType] = ()) -> QuotaNeed:
    """The quota at what can actually run: the group's maximum, each instance the largest type it may launch."""
    largest = max([chosen, *overrides], key=lambda i: (i.vcpu, i.instance_type == chosen.instance_type))
    return vcpu_quota(largest.instance_type, instances, spot=spot)


def _unpriced_note(unpriced: Sequence[PlanOption]) -> list[str]:
    if not unpriced:
        return []
    names = ", ".join(sorted({o.instance_type for o in unpriced}))
    return [f"No public on-demand price, so not ranked on cost: {names}."]


def _quota_notes(quota: QuotaNeed, chosen: InstanceType) -> list[str]:
    largest = (
        ""
        if quota.instance_type == chosen.instance_type
        else f", counting every instance as {quota.instance_type}, the largest Spot override"
    )
    notes = [
        f"Quota: '{quota.quota_name}' must allow {quota.vcpus:,} vCPUs ({quota.instances} x {quota.instance_type} at "
        f"{quota.vcpus_per_instance} vCPUs: the group's maximum{largest}); a new account commonly has "
        f"{quota.default_new_account_vcpus}: request the increase in the Service Quotas console (Amazon EC2) before "
        "deploying, or the group cannot launch its instances."
    ]
    if quota.warning:
        notes.append(quota.warning)
    return notes


def _check_positive(name: str, **values: float) -> None:
    bad = [f"{field} ({value}) must be > 0" for field, value in values.items() if value <= 0]
    if bad:
        raise GenaiConstructsError(f"{name}: " + "; ".join(bad))


def _max_concurrency_meeting(
    model: ModelShape, instance: InstanceType, traffic: RealtimeTraffic, runtime: str, limit: int, *, devices: int
) -> tuple[int, Estimate]:
    """Largest concurrency whose TPOT and loaded TTFT meet the targets (TPOT grows monotonically with batch)."""

    def at(concurrency: int) -> Estimate:
        return estimate(
            model,
            instance,
            devices=devices,
            concurrency=concurrency,
            prompt_tokens=traffic.prompt_tokens,
            output_tokens=traffic.output_tokens,
            runtime=runtime,
        )

    def meets(e: Estimate) -> bool:
        # A request arriving under load waits for the step in flight, then its own prefill.
        loaded_ttft = e.ttft_ms + e.decode_step_ms
        return e.tpot_ms <= traffic.tpot_target_ms and loaded_ttft <= traffic.p95_ttft_ms

    first = at(1)
    if not meets(first):
        return 0, first
    low, high = 1, max(1, limit)
    best = first
    while low < high:
        mid = (low + high + 1) // 2
        e = at(mid)
        if meets(e):
            low, best = mid, e
        else:
            high = mid - 1
    return low, best


def _check_arguments(
    planner: str, model: object, traffic: object, traffic_type: type, *, include_neuron: object, region: object
) -> None:
    """Types before use: every problem at once, each naming the argument, the value and the fix."""
    problems = []
    if not isinstance(model, ModelShape):
        problems.append(
            f"model ({model!r}) must be a ModelShape, not a {type(model).__name__}: e.g. "
            "ModelShape.preset('llama-3.1-8b') or ModelShape.from_hf_config('config.json')"
        )
    if not isinstance(traffic, traffic_type):
        other = "plan_embedding" if traffic_type is RealtimeTraffic else "plan_inference"
        hint = (
            f"; {type(traffic).__name__} is planned by {other}"
            if isinstance(traffic, (RealtimeTraffic, BatchTraffic))
            else ""
        )
        problems.append(
            f"traffic ({type(traffic).__name__}) must be a {traffic_type.__name__}{hint}: e.g. "
            + (
                "RealtimeTraffic(concurrent_sessions=32, output_tokens_per_s_per_session=20)"
                if traffic_type is RealtimeTraffic
                else "BatchTraffic(documents=1_000_000, tokens_per_document=500, deadline_hours=12)"
            )
        )
    if not isinstance(include_neuron, bool):
        problems.append(f"include_neuron ({include_neuron!r}) must be True or False")
    if region is not None and not isinstance(region, str):
        problems.append(f"region ({region!r}) must be a region name such as 'us-east-1', or None for us-east-1 prices")
    if problems:
        raise GenaiConstructsError(f"{planner}: " + "; ".join(problems))


def _replica_widths(model: ModelShape, instance: InstanceType) -> list[int]:
    """Devices one replica may span on ``instance``: every count that divides the instance's devices (so replicas
    tile it exactly) and whose tensor-parallel ranks divide the attention heads (vLLM refuses otherwise:
    ``ModelConfig.verify_with_parallel_config``), widest first.

    Narrow replicas avoid tensor-parallel all-reduces and each brings its own step overhead in parallel; a wide one
    pools the KV cache and, for a model that barely fits, is the only choice. The planner prices each layout.
    """
    return sorted(valid_device_counts(model, instance), reverse=True)


def plan_inference(
    model: ModelShape,
    traffic: RealtimeTraffic,
    *,
    runtime: str = DEFAULT_RUNTIME,
    instance_types: Iterable[str] | None = None,
    include_neuron: bool = INCLUDE_NEURON_DEFAULT,
    region: str | None = None,
) -> InferencePlan:
    """The cheapest fleet that serves ``traffic`` within its p95 targets with headroom, over the whole catalog.

    Each instance type is weighed with every replica layout its devices allow (one wide tensor-parallel replica, or
    several narrower ones side by side; see ``_replica_widths``). ``instance_types`` restricts the search
    (e.g. an override); ``include_neuron`` lets Inferentia2/Trainium compete (see INCLUDE_NEURON_DEFAULT).
    """
    _check_arguments("plan_inference", model, traffic, RealtimeTraffic, include_neuron=include_neuron, region=region)
    region = None if region is None else normalize_region(region)
    if model.kind != "decoder":
        raise GenaiConstructsError(
            f"plan_inference: model {model.name!r} is an encoder; plan embedding work with plan_embedding(model, BatchTraffic(...))"
        )
    if runtime not in RUNTIMES:
        raise GenaiConstructsError(f"plan_inference: runtime {runtime!r} is not one of {', '.join(RUNTIMES)}")
    sequence = traffic.prompt_tokens + traffic.output_tokens
    if sequence > model.max_context:
        raise GenaiConstructsError(
            f"RealtimeTraffic: prompt_tokens + output_tokens ({sequence}) exceeds {model.name}'s max_context "
            f"({model.max_context}): shorten prompts or outputs"
        )
    pool = _Candidates(instance_types, include_neuron, region)
    pool.require_some("plan_inference")
    candidates = pool.instances
    ranked: list[tuple[tuple[float, float, float], InstanceType, int, Estimate, ServerSettings, int]] = []
    unpriced: list[PlanOption] = []
    refused: list[tuple[ServerSettings, InstanceType, list[tuple[str, str]]]] = []
    best_fitting: tuple[float, InstanceType] | None = None
    largest_shortfall: tuple[float, InstanceType, float] | None = None
    best_tpot: tuple[float, InstanceType] | None = None
    best_ttft: tuple[float, InstanceType] | None = None
    for instance in candidates:
        for devices in _replica_widths(model, instance):
            probe = estimate(
                model,
                instance,
                devices=devices,
                concurrency=1,
                prompt_tokens=traffic.prompt_tokens,
                output_tokens=traffic.output_tokens,
                runtime=runtime,
            )
            if not probe.fits:
                if devices == instance.accelerator_count:
                    shortfall = -probe.memory.free_gib
                    if largest_shortfall is None or probe.memory.total_gib > largest_shortfall[2]:
                        largest_shortfall = (shortfall, instance, probe.memory.total_gib)
                continue
            if best_fitting is None or probe.memory.total_gib > best_fitting[0]:
                best_fitting = (probe.memory.total_gib, instance)
            if best_tpot is None or probe.tpot_ms < best_tpot[0]:
                best_tpot = (probe.tpot_ms, instance)
            loaded_ttft = probe.ttft_ms + probe.decode_step_ms
            if best_ttft is None or loaded_ttft < best_ttft[0]:
                best_ttft = (loaded_ttft, instance)
            max_ok, _ = _max_concurrency_meeting(
                model, instance, traffic, runtime, probe.memory.max_concurrency, devices=devices
            )
            if max_ok == 0:
                continue
            planned = max(1, math.floor(max_ok * (1 - traffic.headroom)))
            e = estimate(
                model,
                instance,
                devices=devices,
                concurrency=planned,
                prompt_tokens=traffic.prompt_tokens,
                output_tokens=traffic.output_tokens,
                runtime=runtime,
            )
            # The server's cap is the highest concurrency that still meets both p95 targets: above it, requests wait
            # rather than slow everyone down. Scaling aims below it, at the planned concurrency (the headroom is the
            # room a burst uses while the fleet scales out).
            server = derive_server_settings(
                model, traffic, instance, devices=devices, max_num_seqs=max_ok, runtime=runtime
            )
            findings = startup_findings(server, model, instance)
            if findings:
                refused.append((server, instance, findings))
                continue
            replicas = instance.accelerator_count // devices
            per_instance = planned * replicas
            instances = max(traffic.min_instances, math.ceil(traffic.concurrent_sessions / per_instance))
            if instance.on_demand_usd_per_hour is None:
                unpriced.append(
                    PlanOption(
                        instance_type=instance.instance_type,
                        devices_per_replica=devices,
                        replicas_per_instance=replicas,
                        instances=instances,
                        usd_per_hour=None,
                        usd_per_million_tokens=None,
                        tpot_ms=e.tpot_ms,
                        note="no public on-demand price: not ranked on cost",
                    )
                )
                continue
            fleet_cost = instance.on_demand_usd_per_hour * instances
            per_million = instance.on_demand_usd_per_hour / (e.output_tokens_per_s * replicas * 3600) * 1e6
            ranked.append(((fleet_cost, per_million, e.tpot_ms), instance, instances, e, server, replicas))

    # One unpriced line per instance type (its layout needing the fewest instances), not one per layout.
    fewest: dict[str, PlanOption] = {}
    for option in unpriced:
        kept = fewest.get(option.instance_type)
        if kept is None or option.instances < kept.instances:
            fewest[option.instance_type] = option
    unpriced = list(fewest.values())
    unpriced_note = _unpriced_note(unpriced)
    if not ranked and refused:
        refused.sort(key=lambda item: -item[0].kv_cache_gib_available)
        shown = [f"  - {sentence}" for _, _, found in refused[:MAX_STARTUP_FAILURES_SHOWN] for _, sentence in found]
        more = len(refused) - MAX_STARTUP_FAILURES_SHOWN
        tail = f"\n  ... and {more} more instance type(s) refused likewise" if more > 0 else ""
        unpriced_count = f"; {len(unpriced)} more have no public price" if unpriced else ""
        raise ServerStartupError(
            f"plan_inference: vLLM {VLLM_VERSION} would refuse to start on every priced instance type that meets the "
            f"latency targets for {model.name} ({len(refused)} refused{unpriced_count}):\n" + "\n".join(shown) + tail
        )
    if not ranked:
        if best_fitting is None:
            raise _does_not_fit(model, candidates, traffic, runtime, largest_shortfall)
        assert best_tpot is not None and best_ttft is not None
        raise _latency_unreachable(model, traffic, best_tpot, best_ttft)

    ranked.sort(key=lambda item: item[0])
    (fleet_cost, per_million, _), chosen, instances, e, server, replicas = ranked[0]
    price = pool.prices[chosen.instance_type]
    # The group as GpuInferenceFleet deploys it: the plan's size in service at this traffic, a maximum at least one
    # above the minimum, and a Stopped warm pool holding the difference.
    group_max = max(instances, traffic.min_instances + SCALE_OUT_ROOM)
    cost = inference_fleet_cost(
        chosen.instance_type,
        region=region,
        running_instances=instances,
        max_instances=group_max,
        weights_gib=e.memory.weights_gib,
        output_tokens_per_s_at_traffic=traffic.concurrent_sessions * traffic.output_tokens_per_s_per_session,
        output_tokens_per_s_per_instance_at_capacity=e.output_tokens_per_s * replicas,
        concurrent_sessions=traffic.concurrent_sessions,
        prompt_tokens_per_request=traffic.prompt_tokens,
        output_tokens_per_request=traffic.output_tokens,
        price=price,
    )
    quota = _quota(chosen, group_max, spot=False)
    bottleneck_family, cost_lever = _guide(chosen.family)
    dominant = max(
        ("weights", "kv_cache", "tensor_parallel", "prefill_interleave", "gemm_compute", "host_floor"),
        key=lambda k: e.terms_ms.get(k, 0.0),
    )
    bottleneck = (
        f"{_TERM_LABEL[dominant]} ({e.terms_ms[dominant]:.1f} ms of a {e.tpot_ms:.1f} ms token). {bottleneck_family}"
    )
    reasons = [
        f"{model.name} in {model.precision.value} needs {e.memory.weights_gib:.1f} GiB of weights; "
        f"{chosen.instance_type} has {chosen.total_accelerator_memory_gib:.1f} GiB over {chosen.accelerator_count} "
        f"{chosen.accelerator.name} device(s); "
        + (
            f"one replica spans all {e.devices} ({e.memory.total_gib:.1f} GiB)."
            if replicas == 1
            else f"it runs {replicas} replicas of {e.devices} device(s) each ({e.memory.total_gib:.1f} GiB per "
            f"replica), cheaper than one replica over all {chosen.accelerator_count}: no all-reduce between replicas "
            "and each steps its own batch."
        ),
        f"At {e.concurrency} concurrent sequences per replica "
        + (f"({e.concurrency * replicas} per instance) " if replicas > 1 else "")
        + f"the predicted TPOT is {e.tpot_ms:.1f} ms "
        f"(target {traffic.tpot_target_ms:.1f} ms) and TTFT {e.ttft_ms:.0f} ms unloaded (target {traffic.p95_ttft_ms:.0f} ms).",
        f"Per-instance concurrency is planned at {1 - traffic.headroom:.0%} of the highest that meets the targets "
        f"({traffic.headroom:.0%} headroom), so {traffic.concurrent_sessions} sessions need {instances} instance(s) "
        f"(at least {traffic.min_instances}, across AZs).",
        f"{chosen.instance_type} at ${chosen.on_demand_usd_per_hour:.3f}/h ({price.on_demand_label}) makes "
        f"{instances} instances ${fleet_cost:.2f}/h of compute, the cheapest of {len(ranked)} options that meet the "
        f"targets, at ${per_million:.2f} per 1M output tokens at capacity (every instance as busy as planned).",
        _cost_reason(cost, traffic),
        _server_reason(model, traffic, server),
    ]
    notes = _quota_notes(quota, chosen) + unpriced_note + pool.notes() + list(cost.notes)
    if refused:
        notes.append(
            f"Left out because vLLM {VLLM_VERSION} would refuse to start there: "
            + "; ".join(f"{i.instance_type} ({', '.join(label for label, _ in found)})" for _, i, found in refused)
            + "."
        )
    if not include_neuron and instance_types is None:
        notes.append("Inferentia2/Trainium were not ranked (include_neuron=False): they need a Neuron-compiled model.")
    alternatives = [
        PlanOption(
            instance_type=i.instance_type,
            devices_per_replica=alt.devices,
            replicas_per_instance=alt_replicas,
            instances=n,
            usd_per_hour=i.on_demand_usd_per_hour,
            usd_per_million_tokens=round(key[1], 3),
            tpot_ms=alt.tpot_ms,
            note=f"${key[0]:.2f}/h at peak",
        )
        for key, i, n, alt, _, alt_replicas in ranked[1:6]
    ] + unpriced
    return InferencePlan(
        model=model,
        traffic=traffic,
        instance_type=chosen.instance_type,
        family=chosen.family,
        accelerator=chosen.accelerator.name,
        devices_per_replica=e.devices,
        replicas_per_instance=replicas,
        concurrency_per_instance=e.concurrency * replicas,
        min_instances=traffic.min_instances,
        max_instances=instances,
        estimate=e,
        server=server,
        usd_per_hour=chosen.on_demand_usd_per_hour,
        region=region,
        price_label=price.on_demand_label,
        spot_usd_per_hour=price.spot_usd_per_hour,
        spot_price_label=price.spot_label,
        quota=quota,
        usd_per_hour_at_peak=round(fleet_cost, 4),
        usd_per_million_output_tokens=round(per_million, 4),
        cost_at_traffic=cost,
        weights_gib=e.memory.weights_gib,
        is_neuron=chosen.is_neuron,
        bottleneck=bottleneck,
        cost_lever=cost_lever,
        neuron_caveats=NEURON_CAVEATS if chosen.is_neuron else [],
        reasons=reasons,
        alternatives=alternatives,
        notes=notes,
    )


def _does_not_fit(
    model: ModelShape,
    candidates: Sequence[InstanceType],
    traffic: RealtimeTraffic,
    runtime: str,
    largest_shortfall: tuple[float, InstanceType, float] | None,
) -> GenaiConstructsError:
    """Why nothing fits: the memory, or the attention heads that divide no device count that would hold it."""
    sequence = traffic.prompt_tokens + traffic.output_tokens
    if largest_shortfall is None:
        # Every full-width layout was refused for its heads; see whether memory would have allowed one.
        for instance in sorted(candidates, key=lambda i: -i.total_accelerator_memory_gib):
            probe = estimate(
                model, instance, concurrency=1, prompt_tokens=traffic.prompt_tokens,
                output_tokens=traffic.output_tokens, runtime=runtime,
            )  # fmt: skip
            if probe.fits:
                ranks = tensor_parallel_ranks(instance, instance.accelerator_count)
                return ModelDoesNotFitError(
                    f"{model.name}'s attention_heads ({model.attention_heads}) divide no tensor-parallel degree "
                    f"that holds its {model.weight_bytes / GIB:.1f} GiB of weights: {instance.instance_type} would "
                    f"hold it over all {instance.accelerator_count} devices ({ranks} ranks), but vLLM shards heads "
                    f"evenly over the ranks; check attention_heads, or use a narrower precision so fewer devices "
                    "hold it"
                )
        largest = max(candidates, key=lambda i: i.total_accelerator_memory_gib)
        return ModelDoesNotFitError(
            f"{model.name} ({model.precision.value}, {model.weight_bytes / GIB:.1f} GiB of weights) fits no instance "
            f"weighed: the largest, {largest.instance_type}, has {largest.total_accelerator_memory_gib:.0f} GiB; use "
            "a narrower precision (fp8, int4) or a smaller model"
        )
    shortfall, instance, total = largest_shortfall
    return ModelDoesNotFitError(
        f"{model.name} ({model.precision.value}, {model.weight_bytes / GIB:.1f} GiB of weights) fits no "
        f"instance in the catalog: the largest, {instance.instance_type} with {total:.0f} GiB of accelerator "
        f"memory, falls short by {shortfall:.1f} GiB for one {sequence}-token sequence; use a narrower "
        "precision (fp8, int4) or a smaller model"
    )


def _latency_unreachable(
    model: ModelShape,
    traffic: RealtimeTraffic,
    best_tpot: tuple[float, InstanceType],
    best_ttft: tuple[float, InstanceType],
) -> LatencyTargetUnreachableError:
    """Name the target that cannot be met and the lever that moves it: TTFT is prefill (prompt length, compute),
    TPOT is decode (the session's token rate, memory bandwidth)."""
    ttft_ms, ttft_on = best_ttft
    tpot_ms, tpot_on = best_tpot
    problems = []
    if ttft_ms > traffic.p95_ttft_ms:
        problems.append(
            f"p95_ttft_ms ({traffic.p95_ttft_ms:g}) is below the fastest first token for a {traffic.prompt_tokens}-token "
            f"prompt, {ttft_ms:.0f} ms on {ttft_on.instance_type} (prefill is compute bound): raise p95_ttft_ms to "
            f"at least {math.ceil(ttft_ms * 1.1)}, or shorten prompt_tokens"
        )
    if tpot_ms > traffic.tpot_target_ms:
        target = (
            f"p95_tpot_ms ({traffic.p95_tpot_ms:g})"
            if traffic.p95_tpot_ms is not None
            else f"output_tokens_per_s_per_session ({traffic.output_tokens_per_s_per_session:g}, a token every "
            f"{traffic.tpot_target_ms:.1f} ms)"
        )
        problems.append(
            f"{target} is faster than the best decode, {tpot_ms:.1f} ms per token on {tpot_on.instance_type} at "
            f"concurrency 1: lower output_tokens_per_s_per_session to at most {1000 / tpot_ms:.0f}, or use a "
            "narrower precision (fp8) so each step reads fewer bytes"
        )
    if not problems:
        problems.append(
            f"p95_ttft_ms ({traffic.p95_ttft_ms:g}) and a {traffic.tpot_target_ms:.1f} ms TPOT are each reachable but "
            f"on no instance together: the fastest first token is on {ttft_on.instance_type}, the fastest token on "
            f"{tpot_on.instance_type}; relax either target"
        )
    return LatencyTargetUnreachableError(f"RealtimeTraffic for {model.name}: " + "; ".join(problems))


def _cost_reason(cost: FleetCost, traffic: RealtimeTraffic) -> str:
    items = ", ".join(f"{item.name} ${item.usd_per_hour:.3f}" for item in cost.items)
    at_traffic = cost.usd_per_million_output_tokens_at_traffic
    return (
        f"As deployed at this traffic the fleet costs ${cost.usd_per_hour:.2f}/h (${cost.usd_per_month:,.0f}/month): "
        f"{items}. At the traffic's own rate ({traffic.concurrent_sessions} sessions x "
        f"{traffic.output_tokens_per_s_per_session:g} tokens/s = {cost.output_tokens_per_hour_at_traffic / 1e6:.2f}M "
        "output tokens/h) that is "
        + ("n/a" if at_traffic is None else f"${at_traffic:.2f}")
        + f" per 1M output tokens, against ${cost.usd_per_million_output_tokens_at_capacity:.2f} at capacity."
    )


def _server_reason(model: ModelShape, traffic: RealtimeTraffic, server: ServerSettings) -> str:
    if traffic.max_request_tokens is not None:
        why_len = "the traffic's max_request_tokens"
    elif server.max_model_len < traffic.request_tokens_limit:
        why_len = f"the default longest request, {traffic.request_tokens_limit:,} tokens, capped at {model.name}'s max_context"
    else:
        why_len = (
            f"the default longest request: the larger of {DEFAULT_MAX_REQUEST_TOKENS_FLOOR:,} tokens and "
            f"{DEFAULT_MAX_REQUEST_TOKENS_FACTOR} x the mean prompt + output"
        )
    return (
        f"vLLM starts with --max-model-len {server.max_model_len:,} ({why_len}), --max-num-seqs {server.max_num_seqs} "
        f"(the highest per-replica concurrency that meets both p95 targets; scaling aims below it, at the planned "
        f"concurrency, so the headroom absorbs a burst while the fleet scales out) and --gpu-memory-utilization {server.gpu_memory_utilization:g} (the "
        f"fraction the memory estimate assumes): one {server.max_model_len:,}-token request needs "
        f"{server.kv_cache_gib_one_max_request:.2f} GiB of KV cache of the {server.kv_cache_gib_available:.2f} GiB left "
        f"after weights and overhead ({server.kv_cache_gib_reserved:.2f} GiB of it kept for vLLM's measured overhead), "
        f"so {server.max_concurrent_max_requests} such requests fit at once."
    )


_TERM_LABEL = {
    "weights": "Memory bandwidth: each decode step streams every weight",
    "kv_cache": "KV cache reads: long contexts times concurrency",
    "tensor_parallel": "Tensor-parallel all-reduces between devices",
    "prefill_interleave": "Prefill of new prompts interleaved with decode (watch TTFT and prompt length)",
    "gemm_compute": "Compute: the batch is large enough that GEMMs are compute bound",
    "host_floor": "Host-side dispatch: the CPU cannot feed the GPU fast enough",
}


def encoder_tokens_per_s(model: ModelShape, instance: InstanceType, sequence_tokens: int) -> float:
    """Embedded tokens per second on one instance: compute bound on its devices, capped by CPU tokenization."""
    flops_per_token = 2 * model.parameters_billion * 1e9 + 4 * model.layers * sequence_tokens * model.hidden_size
    peak = instance.accelerator.dense_bf16_tflops * 1e12
    device_rate = peak * ENCODER_COMPUTE_EFFICIENCY / flops_per_token
    cpu_rate = max(1, instance.vcpu - WORKER_VCPUS_RESERVED) * TOKENIZER_TOKENS_PER_S_PER_VCPU
    return min(device_rate * instance.accelerator_count, cpu_rate)


def _duration(hours: float) -> str:
    """Hours as a reader wants them: minutes (or seconds) below an hour, so a short job never reads "0.0 h"."""
    if hours >= 1:
        return f"{hours:.1f} h"
    if hours * 60 >= 1:
        return f"{hours * 60:.0f} min"
    return f"{max(1, round(hours * 3600))} s"


def _spot_equivalents(chosen: InstanceType, candidates: list[InstanceType], rates: dict[str, float]) -> list[str]:
    """Types a Spot mixed-instances policy can substitute: same device count, throughput within 25 %, priced."""
    base = rates[chosen.instance_type]
    scored = []
    for other in candidates:
        if other.instance_type not in rates or other.accelerator_count != chosen.accelerator_count:
            continue
        if other.is_neuron != chosen.is_neuron or not 0.75 <= rates[other.instance_type] / base <= 1.25:
            continue
        scored.append(
            (abs(rates[other.instance_type] / base - 1), other.on_demand_usd_per_hour or 0, other.instance_type)
        )
    names = [name for *_, name in sorted(scored)]
    return [chosen.instance_type] + [n for n in names if n != chosen.instance_type][:3]


def plan_embedding(
    model: ModelShape,
    traffic: BatchTraffic,
    *,
    instance_types: Iterable[str] | None = None,
    include_neuron: bool = INCLUDE_NEURON_DEFAULT,
    region: str | None = None,
) -> EmbeddingPlan:
    """The cheapest fleet per million embedded tokens that finishes the backlog within the deadline (less headroom)."""
    _check_arguments("plan_embedding", model, traffic, BatchTraffic, include_neuron=include_neuron, region=region)
    region = None if region is None else normalize_region(region)
    if model.kind != "encoder":
        raise GenaiConstructsError(
            f"plan_embedding: model {model.name!r} is a decoder; plan chat/completion with plan_inference(model, RealtimeTraffic(...))"
        )
    if traffic.sequence_tokens > model.max_context:
        raise GenaiConstructsError(
            f"BatchTraffic.sequence_tokens ({traffic.sequence_tokens}) exceeds {model.name}'s max_context "
            f"({model.max_context}): chunk documents to at most {model.max_context} tokens"
        )
    pool = _Candidates(instance_types, include_neuron, region)
    pool.require_some("plan_embedding")
    candidates = pool.instances
    sequence = min(traffic.sequence_tokens, traffic.tokens_per_document)
    # Every worker boots, pulls the image, downloads and loads the encoder before it takes work: that time comes out
    # of the deadline (a fleet that scales from zero starts all its workers at once).
    startup = time_to_serving(model.weight_bytes / GIB, "cold")
    startup_hours = startup.total_s / 3600
    usable_hours = traffic.deadline_hours * (1 - traffic.headroom) - startup_hours
    if usable_hours <= 0:
        raise DeadlineUnreachableError(
            f"BatchTraffic.deadline_hours ({traffic.deadline_hours:g}) leaves no time to work: less "
            f"{traffic.headroom:.0%} headroom it is {traffic.deadline_hours * (1 - traffic.headroom) * 60:.1f} min, "
            f"and a worker needs {startup.total_s / 60:.1f} min to start ("
            + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in startup.terms_s.items())
            + f"); give a deadline of at least {(startup_hours / (1 - traffic.headroom)) * 60 * 1.5:.0f} min"
        )
    rates: dict[str, float] = {}
    ranked = []
    unpriced: list[PlanOption] = []
    fastest: tuple[float, InstanceType] | None = None
    for instance in candidates:
        if model.weight_bytes / GIB + 1.0 > instance.accelerator_memory_gib:
            continue
        rate = encoder_tokens_per_s(model, instance, sequence)
        rates[instance.instance_type] = rate
        hours_one = traffic.total_tokens / rate / 3600
        instances = max(1, math.ceil(hours_one / usable_hours))
        if fastest is None or hours_one / MAX_BATCH_INSTANCES < fastest[0]:
            fastest = (hours_one / MAX_BATCH_INSTANCES, instance)
        if instances > MAX_BATCH_INSTANCES:
            continue
        if instance.on_demand_usd_per_hour is None:
            unpriced.append(
                PlanOption(
                    instance_type=instance.instance_type,
                    devices_per_replica=1,
                    instances=instances,
                    usd_per_hour=None,
                    usd_per_million_tokens=None,
                    note="no public on-demand price: not ranked on cost",
                )
            )
            continue
        per_million = instance.on_demand_usd_per_hour / (rate * 3600) * 1e6
        ranked.append(((per_million, instances), instance, instances, rate))
    if not ranked:
        if fastest is None:
            raise ModelDoesNotFitError(f"{model.name} fits no accelerator in the catalog")
        raise DeadlineUnreachableError(
            f"BatchTraffic.deadline_hours ({traffic.deadline_hours:g}) cannot be met for {traffic.total_tokens:,} tokens "
            f"of {model.name}: the fastest option, {MAX_BATCH_INSTANCES} x {fastest[1].instance_type}, needs "
            f"{(fastest[0] + startup_hours) / (1 - traffic.headroom):.1f} h with {traffic.headroom:.0%} headroom "
            f"({startup.total_s / 60:.0f} min of it worker start-up); extend the deadline or split the backlog"
        )
    ranked.sort(key=lambda item: item[0])
    (per_million, _), chosen, instances, rate = ranked[0]
    workers = chosen.accelerator_count
    documents_per_s = rate / traffic.tokens_per_document
    work_hours = traffic.total_tokens / (rate * instances) / 3600
    hours = work_hours + startup_hours
    bottleneck_family, cost_lever = _guide(chosen.family)
    cpu_bound = rate < encoder_tokens_per_s(model, chosen.model_copy(update={"vcpu": 10**6}), sequence)
    bottleneck = (
        "CPU tokenization feeds the devices slower than they encode: watch GPU utilization. "
        if cpu_bound
        else "Encoder compute on the devices, if documents arrive steadily: watch GPU "
        "utilization and the age of the oldest message. "
    ) + bottleneck_family
    spot = traffic.spot_ok
    if spot:
        cost_lever = "Spot capacity across several equivalent types (a batch retries interruptions). " + cost_lever
    price = pool.prices[chosen.instance_type]
    spot_instance_types = _spot_equivalents(chosen, candidates, rates) if spot else []
    # A Spot job is costed at the regional Spot estimate where one is known; on-demand otherwise, and said so.
    spot_priced = spot and price.spot_usd_per_hour is not None
    job_cost = batch_job_cost(
        chosen.instance_type,
        region=region,
        instances=instances,
        total_tokens=traffic.total_tokens,
        tokens_per_s_per_instance=rate,
        startup_s=startup.total_s,
        weights_gib=model.weight_bytes / GIB,
        spot=spot_priced,
        price=price,
    )
    catalog = load_catalog()
    overrides = [catalog.instance(name) for name in spot_instance_types]
    quota = _quota(chosen, instances, spot=spot, overrides=overrides)
    reasons = [
        f"{traffic.documents:,} documents x {traffic.tokens_per_document} tokens = {traffic.total_tokens:,} tokens.",
        f"{chosen.instance_type} embeds ~{rate:,.0f} tokens/s ({workers} worker(s), one per {chosen.accelerator.name}, "
        f"at {ENCODER_COMPUTE_EFFICIENCY:.0%} of dense peak for {sequence}-token chunks).",
        f"{instances} instance(s) finish in {_duration(hours)} ({startup.total_s / 60:.0f} min of worker start-up, "
        f"then {_duration(work_hours)} of work), inside {traffic.deadline_hours:g} h less "
        f"{traffic.headroom:.0%} headroom and the start-up ({_duration(usable_hours)} of work at most).",
        f"${chosen.on_demand_usd_per_hour:.3f}/h ({price.on_demand_label}) gives ${per_million:.4f} per 1M tokens "
        f"of compute, the cheapest of {len(ranked)} options that meet the deadline.",
        f"The whole job costs ${job_cost.total_usd:,.2f} over {_duration(job_cost.hours_wall_clock)} of wall clock "
        f"({job_cost.startup_hours * 60:.0f} min start-up + {_duration(job_cost.work_hours)} work per worker), "
        f"${job_cost.usd_per_million_tokens:.4f} per 1M tokens all in, "
        + (f"at the Spot estimate ({price.spot_label})." if spot_priced else f"at {job_cost.instance_price_label}.")
        + ("" if spot_priced or not spot else " No Spot estimate is known there, so on-demand is charged."),
    ]
    notes = _quota_notes(quota, chosen) + _unpriced_note(unpriced) + pool.notes() + list(job_cost.notes)
    if not include_neuron and instance_types is None:
        notes.append("Inferentia2 was not ranked (include_neuron=False): it needs a Neuron-compiled encoder.")
    alternatives = [
        PlanOption(
            instance_type=i.instance_type,
            devices_per_replica=1,
            instances=n,
            usd_per_hour=i.on_demand_usd_per_hour,
            usd_per_million_tokens=round(key[0], 5),
        )
        for key, i, n, _ in ranked[1:6]
    ] + unpriced
    return EmbeddingPlan(
        model=model,
        traffic=traffic,
        instance_type=chosen.instance_type,
        family=chosen.family,
        accelerator=chosen.accelerator.name,
        workers_per_instance=workers,
        batch_size=EMBEDDING_BATCH_SIZE,
        max_concurrency_per_worker=WORKER_MESSAGES_IN_FLIGHT,
        tokens_per_s_per_instance=round(rate, 1),
        documents_per_s_per_instance=round(documents_per_s, 3),
        seconds_per_document=round(workers / documents_per_s, 4),
        min_instances=0,
        max_instances=instances,
        hours_to_finish=round(hours, 2),
        worker_startup_s=startup.total_s,
        usd_per_hour=chosen.on_demand_usd_per_hour,
        usd_per_million_tokens=round(per_million, 5),
        job_cost=job_cost,
        region=region,
        price_label=price.on_demand_label,
        spot_usd_per_hour=price.spot_usd_per_hour,
        spot_price_label=price.spot_label,
        quota=quota,
        spot=spot,
        spot_instance_types=spot_instance_types,
        weights_gib=round(model.weight_bytes / GIB, 3),
        is_neuron=chosen.is_neuron,
        bottleneck=bottleneck,
        cost_lever=cost_lever,
        neuron_caveats=NEURON_CAVEATS if chosen.is_neuron else [],
        reasons=reasons,
        alternatives=alternatives,
        notes=notes,
    )
