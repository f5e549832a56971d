"""Money and capacity: regional instance prices, what a deployed fleet costs per hour, and the vCPU quota it needs.

Pure Python (never imports aws_cdk). Figures come from the package's data files, each carrying its source:

* ``data/regional_prices.json``: per (instance type, region) on-demand price, Spot min/median and AZ count (SkyPilot
  catalog @00148f2), and availability from that catalog and cfn-lint 1.58.0's price-list-derived instance type list;
* ``data/catalog.json``: the us-east-1 on-demand prices, used only when no region is given;
* ``data/ebs_prices.json``: gp3 prices (the same figures the fleet simulator charges);
* ``data/network_prices.json``: the internal ALB and the interface VPC endpoints (us-east-1, used for every region).

A fleet's cost is what the stack deployed from the plan bills at the user's traffic, one labelled line per resource:
the running instances and their root volumes, the Stopped warm-pool instances' root volumes, the ALB (hourly and
LCUs) and the interface endpoints (per AZ-hour and per GB).
"""

from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from genai_constructs.errors import (
    GenaiConstructsError,
    InstanceTypeNotOfferedError,
    PriceUnknownError,
    UnknownRegionError,
)
from genai_constructs.planner.catalog import InstanceType, load_catalog
from genai_constructs.planner.deployment import (
    DEFAULT_AVAILABILITY_ZONES,
    DEFAULT_INTERFACE_ENDPOINTS,
    EMBEDDING_ROOT_VOLUME_IOPS,
    EMBEDDING_ROOT_VOLUME_THROUGHPUT_MIBPS,
    INFERENCE_ROOT_VOLUME_IOPS,
    INFERENCE_ROOT_VOLUME_THROUGHPUT_MIBPS,
    WARM_POOL_MIN_SIZE,
    root_volume_gib,
)
from genai_constructs.workload import DEFAULT_OUTPUT_TOKENS, DEFAULT_PROMPT_TOKENS

SKYPILOT_LABEL = "SkyPilot catalog @00148f2"
"""How a label names the regional price source (skypilot-org/skypilot-catalog, catalogs/v8/aws/vms.csv)."""

BYTES_PER_TOKEN = 4
"""About four characters of English text per token for the BPE tokenizers of current LLMs (OpenAI's tokenizer
guidance: one token is ~4 characters of common English text), one byte per character in UTF-8."""
STREAMED_RESPONSE_OVERHEAD = 50
"""A streamed completion sends every token as its own server-sent event: an OpenAI-compatible
``chat.completion.chunk`` (id, object, created, model, choices[0].delta) of ~200 bytes carrying ~4 bytes of text.
Our estimate from the chunk format vLLM's OpenAI-compatible server writes; it overstates a non-streamed response,
which is the safe side for a bill."""
PROMPT_OVERHEAD = 1.5
"""A request's body is its prompt text plus JSON, chat-template roles and HTTP headers: half as much again (our
judgement; the prompt term is small next to the streamed response)."""
ALB_CONNECTIONS_PER_SESSION = 2
"""A streaming session holds a client-to-ALB and an ALB-to-target connection; counting both (the ALB's
ActiveConnectionCount metric does) overstates the LCU's active-connections dimension at worst by two."""
ALB_MIN_LCU = 1.0
"""At least one LCU-hour is charged: health checks and the hour's bursts keep an in-use ALB above zero, and a floor
of one costs $0.008/h. Our judgement, on the safe side."""
ENDPOINT_GB_PER_INSTANCE_HOUR = 0.01
"""Interface-endpoint traffic per running instance: logs, metrics, SSM and API calls, ~10 MB an hour (our
judgement). Weights and image layers come from S3 through the free gateway endpoint, not through these."""
LARGEST_LIKELY_GRANTED_VCPUS = 4000
"""vCPUs of one quota group (e.g. Running On-Demand P instances) above which a quota increase is unlikely to be
granted without a long negotiation or a capacity reservation. Our judgement, not an AWS figure: AWS publishes no
maximum and reviews increases case by case. 4,000 vCPUs is about 20 p5.48xlarge (160 H100) or 1,000 g5.xlarge."""
LARGEST_KNOWN_QUOTA_NOTE = (
    f"more than {LARGEST_LIKELY_GRANTED_VCPUS:,} vCPUs in one EC2 quota group is more than an account is likely to "
    "be granted without a long negotiation (our judgement; AWS publishes no maximum and reviews each increase); "
    "plan for an EC2 Capacity Reservation or Capacity Blocks for ML, or split the fleet across regions"
)
"""The warning a :class:`QuotaNeed` carries when a fleet needs more than ``LARGEST_LIKELY_GRANTED_VCPUS``."""

QUOTA_SOURCE = (
    "EC2 quotas are per Region and per family group, counted in vCPUs of running instances (Amazon EC2 user guide, "
    "'On-Demand Instance quotas' and 'Spot Instance quotas'; Service Quotas console, Amazon EC2)"
)
_QUOTA_GROUPS: dict[str, tuple[str, str]] = {
    "g": ("Running On-Demand G and VT instances", "All G and VT Spot Instance Requests"),
    "p": ("Running On-Demand P instances", "All P Spot Instance Requests"),
    "inf": ("Running On-Demand Inf instances", "All Inf Spot Instance Requests"),
    "trn": ("Running On-Demand Trn instances", "All Trn Spot Instance Requests"),
}
"""Instance family letters -> (On-Demand quota name, Spot quota name)."""
DEFAULT_QUOTA_VCPUS: dict[str, int] = {name: 0 for pair in _QUOTA_GROUPS.values() for name in pair}
"""vCPUs a new account commonly starts with in each accelerated quota group: none. The EC2 user guide's 'Spot
Instance quotas' table gives a default of 0 for the G and VT, Inf, P and Trn groups; for On-Demand the EC2 FAQ lists
128 vCPUs for G, Inf and P but adds that 'new AWS accounts may start with limits that are lower', and new accounts
commonly show 0 in the Service Quotas console until an increase is requested. Check the console: a granted
increase replaces these figures."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class InstancePrice(_Frozen):
    """One instance type's hourly prices in one region, each with where it comes from."""

    instance_type: str
    region: str | None = Field(description="None: no region given; us-east-1 figures are used.")
    on_demand_usd_per_hour: float | None = Field(description="None where AWS publishes no on-demand price.")
    spot_usd_per_hour: float | None = Field(
        description="The regional median of the per-AZ Spot prices of the snapshot; None where none is known."
    )
    spot_usd_per_hour_min: float | None = Field(description="The cheapest AZ's Spot price in the snapshot.")
    availability_zones: int | None = Field(description="Zone IDs the catalog lists for the type in the region.")
    on_demand_label: str
    spot_label: str

    @property
    def label(self) -> str:
        """Both figures' sources in one line."""
        return f"{self.on_demand_label}; {self.spot_label}"


class CostItem(_Frozen):
    """One line of an hourly bill."""

    name: str
    usd_per_hour: float
    basis: str = Field(description="The quantities and unit prices behind the figure, with their sources.")


class FleetCost(_Frozen):
    """What an inference fleet, deployed as planned, costs per hour at the user's traffic."""

    instance_type: str
    region: str | None
    spot: bool
    running_instances: int
    max_instances: int
    warm_pool_instances: int = Field(description="Stopped, pre-loaded instances the warm pool keeps (0: none).")
    root_volume_gib: int
    items: list[CostItem]
    usd_per_hour: float = Field(description="Sum of the items.")
    usd_per_month: float = Field(description="usd_per_hour x 730 hours.")
    instance_price_label: str
    output_tokens_per_hour_at_traffic: float
    usd_per_million_output_tokens_at_traffic: float | None = Field(
        description="The whole bill over the traffic's output tokens; None at zero traffic."
    )
    usd_per_million_output_tokens_at_traffic_label: str
    usd_per_million_output_tokens_at_capacity: float
    usd_per_million_output_tokens_at_capacity_label: str
    notes: list[str]


class JobCostItem(_Frozen):
    """One line of a batch job's bill."""

    name: str
    usd: float
    basis: str


class BatchCost(_Frozen):
    """What an embedding backlog costs from the first worker's launch to the last token."""

    instance_type: str
    region: str | None
    spot: bool
    instances: int
    startup_hours: float = Field(description="Boot, image pull, weights download and model load, per worker.")
    work_hours: float = Field(description="The backlog over the workers' aggregate throughput.")
    hours_wall_clock: float = Field(description="startup_hours + work_hours: every worker runs this long.")
    root_volume_gib: int
    items: list[JobCostItem]
    total_usd: float
    usd_per_million_tokens: float
    instance_price_label: str
    notes: list[str]


class QuotaNeed(_Frozen):
    """The EC2 vCPU quota a fleet needs in its region."""

    instance_type: str
    instances: int
    vcpus_per_instance: int
    vcpus: int = Field(description="instances x vcpus_per_instance.")
    quota_name: str = Field(description="The Service Quotas name, Amazon EC2, in the fleet's region.")
    spot: bool
    default_new_account_vcpus: int = Field(description="See DEFAULT_QUOTA_VCPUS.")
    increase_needed_on_new_account: bool
    advice: str
    warning: str | None = Field(description="Set above LARGEST_LIKELY_GRANTED_VCPUS (see LARGEST_KNOWN_QUOTA_NOTE).")
    source: str = QUOTA_SOURCE


# --------------------------------------------------------------------------------------------------------------- data

PriceRow = tuple[float | None, float | None, float | None, int | None]


@dataclass(frozen=True)
class _Regional:
    prices: dict[str, dict[str, PriceRow]]
    availability: dict[str, dict[str, tuple[bool, bool]]]
    regions: tuple[str, ...]


def _data(name: str) -> Any:
    return json.loads(resources.files("genai_constructs.data").joinpath(name).read_text(encoding="utf-8"))


@lru_cache(maxsize=1)
def _regional() -> _Regional:
    raw = _data("regional_prices.json")
    prices: dict[str, dict[str, PriceRow]] = {}
    for instance_type, by_region in raw["prices"]["rows"].items():
        prices[instance_type] = {}
        for region, (on_demand, spot_min, spot_median, azs) in by_region.items():
            prices[instance_type][region] = (
                None if on_demand is None else float(on_demand),
                None if spot_min is None else float(spot_min),
                None if spot_median is None else float(spot_median),
                None if azs is None else int(azs),
            )
    availability = {
        instance_type: {region: (bool(a), bool(b)) for region, (a, b) in by_region.items()}
        for instance_type, by_region in raw["availability"]["rows"].items()
    }
    regions = {r for by_region in availability.values() for r in by_region}
    regions |= {r for by_region in prices.values() for r in by_region}
    return _Regional(prices=prices, availability=availability, regions=tuple(sorted(regions)))


@lru_cache(maxsize=1)
def _ebs() -> dict[str, float]:
    """gp3 figures of ``ebs_prices.json`` by name, plus ``hours_per_month`` (the simulator's figures, read here so
    the planner does not import the simulation package)."""
    raw = _data("ebs_prices.json")
    figures = {name: float(entry["value"]) for name, entry in raw["gp3"].items()}
    figures["hours_per_month"] = float(raw["hours_per_month"]["value"])
    return figures


@lru_cache(maxsize=1)
def _network() -> dict[str, float]:
    raw = _data("network_prices.json")
    alb, endpoint = raw["application_load_balancer"], raw["interface_endpoint"]
    return {
        "alb_usd_per_hour": float(alb["usd_per_hour"]["value"]),
        "alb_usd_per_lcu_hour": float(alb["usd_per_lcu_hour"]["value"]),
        "lcu_new_connections_per_s": float(alb["lcu"]["new_connections_per_s"]),
        "lcu_active_connections": float(alb["lcu"]["active_connections_per_minute"]),
        "lcu_gb_per_hour": float(alb["lcu"]["processed_gb_per_hour_ec2_targets"]),
        "endpoint_usd_per_az_hour": float(endpoint["usd_per_endpoint_az_hour"]["value"]),
        "endpoint_usd_per_gb": float(endpoint["usd_per_gb_processed"]["value"]),
    }


NETWORK_PRICE_NOTE = (
    "ALB and interface-endpoint prices are us-east-1 figures, used for every region (AWS Elastic Load Balancing "
    "and AWS PrivateLink pricing pages); EBS gp3 prices likewise (Amazon EBS pricing, us-east-1)"
)


# ------------------------------------------------------------------------------------------------- regions and types


def known_regions() -> list[str]:
    """Every region either source lists (the 24 the SkyPilot catalog prices and 9 more cfn-lint lists), sorted."""
    return list(_regional().regions)


def _region_key(region: str) -> str:
    key = region.strip().lower() if isinstance(region, str) else ""
    regions = _regional().regions
    if key in regions:
        return key
    close = difflib.get_close_matches(key, regions, n=3, cutoff=0.6)
    hint = f"closest: {', '.join(close)}; " if close else ""
    raise UnknownRegionError(
        f"region {region!r} is not in the library's price or availability data ({hint}known: {', '.join(regions)}); "
        "pass one of these, or add the region to shared/reference and rerun scripts/import_regional_prices.py"
    )


def normalize_region(region: str) -> str:
    """The region as the data spells it (``" EU-West-1 "`` -> ``"eu-west-1"``); ``UnknownRegionError`` otherwise."""
    return _region_key(region)


def _type_key(instance_type: str) -> str:
    """The lower-case key; ``UnknownInstanceTypeError`` (closest names) for a type no data file knows."""
    key = instance_type.strip().lower() if isinstance(instance_type, str) else ""
    if key in _regional().availability:
        return key
    return load_catalog().instance(instance_type).instance_type


def regions_offering(instance_type: str) -> list[str]:
    """Regions where either source lists ``instance_type`` (a cfn-lint entry means AWS prices it there; a SkyPilot
    row means its fetcher saw it in an AZ), sorted."""
    by_region = _regional().availability.get(_type_key(instance_type), {})
    return sorted(region for region, (skypilot, cfn_lint) in by_region.items() if skypilot or cfn_lint)


def is_offered(instance_type: str, region: str) -> bool:
    """Whether either source lists ``instance_type`` in ``region``; ``UnknownRegionError`` for an unknown region."""
    return _region_key(region) in regions_offering(instance_type)


def _family(instance_type: str) -> str:
    return instance_type.split(".", 1)[0]


def _alternatives_in(instance_type: str, region: str) -> list[str]:
    """The family's sizes offered in ``region``, nearest first (accelerator count, then vCPUs)."""
    catalog = load_catalog()
    wanted = catalog.instances.get(instance_type)
    family = _family(instance_type)
    offered = [
        t
        for t, by_region in _regional().availability.items()
        if _family(t) == family and t != instance_type and any(by_region.get(region, (False, False)))
    ]

    def distance(other: str) -> tuple[float, float, str]:
        entry = catalog.instances.get(other)
        if wanted is None or entry is None:
            return (math.inf, math.inf, other)
        return (
            abs(math.log(entry.accelerator_count / wanted.accelerator_count)),
            abs(math.log(entry.vcpu / wanted.vcpu)),
            other,
        )

    return sorted(offered, key=distance)


def _similar_in(instance_type: str, region: str, limit: int = 4) -> list[str]:
    """Other families' types offered in ``region`` with the same accelerator count: same accelerator kind first,
    then nearest in accelerator memory, then in vCPUs."""
    catalog = load_catalog()
    wanted = catalog.instances.get(instance_type)
    if wanted is None:
        return []
    offered = [
        entry
        for t, entry in catalog.instances.items()
        if entry.accelerator_count == wanted.accelerator_count
        and _family(t) != _family(instance_type)
        and any(_regional().availability.get(t, {}).get(region, (False, False)))
    ]
    # Same kind of accelerator first: a Neuron type is no drop-in for a GPU (it runs Neuron-compiled models only).
    offered.sort(
        key=lambda e: (
            e.is_neuron != wanted.is_neuron,
            abs(e.total_accelerator_memory_gib - wanted.total_accelerator_memory_gib),
            abs(math.log(e.vcpu / wanted.vcpu)),
            e.instance_type,
        )
    )
    return [e.instance_type for e in offered[:limit]]


def _require_offered(instance_type: str, region: str) -> None:
    if region in regions_offering(instance_type):
        return
    regions = regions_offering(instance_type)
    alternatives = _alternatives_in(instance_type, region)
    family = _family(instance_type)
    if alternatives:
        there = f"{family} sizes offered in {region}: {', '.join(alternatives)}"
    else:
        similar = _similar_in(instance_type, region)
        there = f"no {family} size is offered in {region}" + (
            f"; similar types offered there: {', '.join(similar)}" if similar else ""
        )
    raise InstanceTypeNotOfferedError(
        f"instance_type {instance_type!r} is not offered in {region} (neither the SkyPilot catalog nor cfn-lint "
        f"lists it there); regions that offer it: {', '.join(regions) or 'none'}; {there}. Pick one of those "
        "regions or types"
    )


# ------------------------------------------------------------------------------------------------------------ prices


def instance_price(instance_type: str, region: str | None) -> InstancePrice:
    """``instance_type``'s on-demand price and Spot estimate in ``region``.

    With ``region=None`` the on-demand figure is the catalog's us-east-1 price and the Spot estimate us-east-1's;
    the labels say so.

    :raises UnknownRegionError: ``region`` is in no source (the message names the closest).
    :raises InstanceTypeNotOfferedError: the type is not offered there (the message names where it is).
    """
    key = _type_key(instance_type)
    if region is None:
        entry = load_catalog().instance(key)
        catalog = load_catalog()
        on_demand = entry.on_demand_usd_per_hour
        on_demand_label = (
            f"on-demand, {catalog.price_region} (no region given), catalog price table dated {catalog.price_date}"
            if on_demand is not None
            else f"no on-demand price: AWS publishes none for {key} in {catalog.price_region} (no region given)"
        )
        row = _regional().prices.get(key, {}).get(catalog.price_region)
        where = f"{catalog.price_region} (no region given)"
    else:
        region_key = _region_key(region)
        _require_offered(key, region_key)
        row = _regional().prices.get(key, {}).get(region_key)
        where = region_key
        on_demand = row[0] if row else None
        if on_demand is not None:
            on_demand_label = f"on-demand, {region_key}, {SKYPILOT_LABEL}"
        elif row is not None:
            on_demand_label = (
                f"no on-demand price: {SKYPILOT_LABEL} lists {key} in {region_key} without one "
                "(capacity blocks only, or not sold on demand there)"
            )
        else:
            on_demand_label = (
                f"no on-demand price: {key} is listed in {region_key} by cfn-lint only, and the "
                f"{SKYPILOT_LABEL} has no row for it there"
            )
    spot_min = row[1] if row else None
    spot = row[2] if row else None
    azs = row[3] if row else None
    if spot is not None:
        spot_label = (
            f"Spot estimate: median over up to {azs} AZs in {where} of a snapshot of unknown date "
            f"({SKYPILOT_LABEL}); Spot prices move, this is not a quote"
        )
    else:
        spot_label = f"no Spot estimate for {key} in {where} ({SKYPILOT_LABEL} has no Spot price there)"
    return InstancePrice(
        instance_type=key,
        region=None if region is None else where,
        on_demand_usd_per_hour=on_demand,
        spot_usd_per_hour=spot,
        spot_usd_per_hour_min=spot_min,
        availability_zones=azs,
        on_demand_label=on_demand_label,
        spot_label=spot_label,
    )


def _hourly_price(price: InstancePrice, spot: bool) -> tuple[float, str]:
    figure, label = (
        (price.spot_usd_per_hour, price.spot_label) if spot else (price.on_demand_usd_per_hour, price.on_demand_label)
    )
    if figure is None:
        where = price.region or "us-east-1 (no region given)"
        other = "on-demand (spot=False)" if spot else "Spot (spot=True), or another region or type"
        raise PriceUnknownError(
            f"{price.instance_type} has no {'Spot estimate' if spot else 'on-demand price'} in {where} ({label}); "
            f"price it as {other}, or reserve capacity (EC2 Capacity Blocks for ML) and price that yourself"
        )
    return figure, label


def gp3_volume_usd_per_hour(size_gib: float, iops: int | None = None, throughput_mibps: int | None = None) -> float:
    """One gp3 volume's hourly cost: storage plus IOPS and throughput provisioned above the baseline (Amazon EBS
    pricing; figures in ``data/ebs_prices.json``). ``None`` means gp3's baseline (3,000 IOPS, 125 MiB/s)."""
    p = _ebs()
    monthly = size_gib * p["usd_per_gib_month"]
    monthly += max(0.0, (iops or 0) - p["free_iops"]) * p["usd_per_iops_month"]
    monthly += max(0.0, (throughput_mibps or 0) - p["free_throughput_mibps"]) * p["usd_per_mibps_month"]
    return monthly / p["hours_per_month"]


def _volume_basis(size_gib: int, iops: int | None, throughput_mibps: int | None) -> str:
    p = _ebs()
    provisioned = f"{iops or p['free_iops']:.0f} IOPS, {throughput_mibps or p['free_throughput_mibps']:.0f} MiB/s"
    return (
        f"{size_gib} GiB gp3, {provisioned}: ${p['usd_per_gib_month']}/GiB-month + ${p['usd_per_iops_month']} "
        f"per IOPS-month over {p['free_iops']:.0f} + ${p['usd_per_mibps_month']} per MiB/s-month over "
        f"{p['free_throughput_mibps']:.0f}, over {p['hours_per_month']:.0f} h a month (Amazon EBS pricing, "
        f"us-east-1) = ${gp3_volume_usd_per_hour(size_gib, iops, throughput_mibps):.5f}/h each"
    )


# --------------------------------------------------------------------------------------------------------- checks


def _number(name: str, value: object, *, minimum: float = 0.0, strict: bool = False, whole: bool = False) -> float:
    ok = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (value > minimum if strict else value >= minimum)
        and (not whole or float(value).is_integer())
    )
    if not ok:
        kind = "a whole number" if whole else "a finite number"
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise GenaiConstructsError(f"{name} ({value!r}) must be {kind} {bound}")
    return float(value)  # type: ignore[arg-type]


# -------------------------------------------------------------------------------------------------- inference fleet


def alb_lcus(*, requests_per_s: float, concurrent_sessions: float, processed_gb_per_hour: float) -> tuple[float, str]:
    """LCUs an ALB consumes for the given load, with the dimension that sets them.

    One LCU is 25 new connections/s, 3,000 active connections per minute, 1 GB/h processed for EC2 targets or
    1,000 rule evaluations/s; the hour is billed on the largest (Elastic Load Balancing pricing). Every request is
    counted as a new connection (clients that keep connections alive open fewer), every session as
    ``ALB_CONNECTIONS_PER_SESSION`` active connections; the fleet's listener has one default action, within the 10
    free rules, so rule evaluations add nothing. At least ``ALB_MIN_LCU``.
    """
    n = _network()
    dimensions = {
        "new connections": requests_per_s / n["lcu_new_connections_per_s"],
        "active connections": concurrent_sessions * ALB_CONNECTIONS_PER_SESSION / n["lcu_active_connections"],
        "processed bytes": processed_gb_per_hour / n["lcu_gb_per_hour"],
    }
    name, largest = max(dimensions.items(), key=lambda item: item[1])
    if largest < ALB_MIN_LCU:
        return ALB_MIN_LCU, f"the floor of {ALB_MIN_LCU:g} LCU (largest dimension: {name}, {largest:.3f} LCU)"
    return largest, f"{name}: {largest:.3f} LCU"


def inference_fleet_cost(
    instance_type: str,
    *,
    region: str | None,
    running_instances: int,
    max_instances: int,
    weights_gib: float,
    output_tokens_per_s_at_traffic: float,
    output_tokens_per_s_per_instance_at_capacity: float,
    concurrent_sessions: int,
    prompt_tokens_per_request: int = DEFAULT_PROMPT_TOKENS,
    output_tokens_per_request: int = DEFAULT_OUTPUT_TOKENS,
    warm_pool: bool = True,
    spot: bool = False,
    availability_zones: int = DEFAULT_AVAILABILITY_ZONES,
    interface_endpoints: int = len(DEFAULT_INTERFACE_ENDPOINTS),
    price: InstancePrice | None = None,
) -> FleetCost:
    """The fleet's hourly bill as deployed, at the user's traffic.

    :param running_instances: the planned desired size (instances in service).
    :param max_instances: the group's maximum; with a warm pool, Auto Scaling keeps ``max - desired`` Stopped
        instances in it ("By default, the size of the warm pool is calculated as the difference between the Auto
        Scaling group's maximum capacity and its desired capacity": EC2 Auto Scaling user guide, "Warm pools for
        Amazon EC2 Auto Scaling"; the fleet leaves MaxGroupPreparedCapacity unset), at least WARM_POOL_MIN_SIZE.
        A Stopped instance pays for its EBS volumes only, not for compute (same guide; Amazon EC2 user guide,
        "Stop and start Amazon EC2 instances").
    :param weights_gib: the model's weights, cached on every root volume (``deployment.root_volume_gib``).
    :param output_tokens_per_s_at_traffic: the whole fleet's output tokens/s at the user's traffic.
    :param output_tokens_per_s_per_instance_at_capacity: one instance's output tokens/s at its planned concurrency.
    :param concurrent_sessions: sessions streaming at once at that traffic (the ALB's active connections).
    :param spot: price instances at the regional Spot estimate (a warm pool cannot be used with Spot).
    :param price: the instance's price as the planner ranked it (e.g. a labelled proxy where the region has no
        price data); default ``instance_price(instance_type, region)``.
    :raises PriceUnknownError: no on-demand price (or Spot estimate, with ``spot``) for the type there.
    """
    running = int(_number("running_instances", running_instances, minimum=1, whole=True))
    maximum = int(_number("max_instances", max_instances, minimum=running, whole=True))
    _number("weights_gib", weights_gib)
    traffic = _number("output_tokens_per_s_at_traffic", output_tokens_per_s_at_traffic)
    capacity = _number(
        "output_tokens_per_s_per_instance_at_capacity", output_tokens_per_s_per_instance_at_capacity, strict=True
    )
    sessions = _number("concurrent_sessions", concurrent_sessions, whole=True)
    prompt_tokens = _number("prompt_tokens_per_request", prompt_tokens_per_request, whole=True)
    output_tokens = _number("output_tokens_per_request", output_tokens_per_request, minimum=1, whole=True)
    azs = int(_number("availability_zones", availability_zones, minimum=1, whole=True))
    endpoints = int(_number("interface_endpoints", interface_endpoints, whole=True))
    if spot and warm_pool:
        raise GenaiConstructsError(
            "spot=True with warm_pool=True: a warm pool cannot be added to an Auto Scaling group that launches Spot "
            "Instances (EC2 Auto Scaling user guide, warm pools limitations); pass warm_pool=False to price Spot"
        )

    price = price if price is not None else instance_price(instance_type, region)
    usd_per_instance_hour, price_label = _hourly_price(price, spot)
    n = _network()
    size_gib = root_volume_gib(weights_gib)
    volume_usd = gp3_volume_usd_per_hour(size_gib, INFERENCE_ROOT_VOLUME_IOPS, INFERENCE_ROOT_VOLUME_THROUGHPUT_MIBPS)
    volume_basis = _volume_basis(size_gib, INFERENCE_ROOT_VOLUME_IOPS, INFERENCE_ROOT_VOLUME_THROUGHPUT_MIBPS)
    pool = max(maximum - running, WARM_POOL_MIN_SIZE) if warm_pool else 0

    requests_per_s = traffic / output_tokens
    response_gb_h = traffic * BYTES_PER_TOKEN * STREAMED_RESPONSE_OVERHEAD * 3600 / 1e9
    prompt_gb_h = requests_per_s * prompt_tokens * BYTES_PER_TOKEN * PROMPT_OVERHEAD * 3600 / 1e9
    lcus, lcu_reason = alb_lcus(
        requests_per_s=requests_per_s, concurrent_sessions=sessions, processed_gb_per_hour=response_gb_h + prompt_gb_h
    )
    endpoint_gb_h = running * ENDPOINT_GB_PER_INSTANCE_HOUR
    purchase = "Spot" if spot else "on-demand"

    items = [
        CostItem(
            name="instances running",
            usd_per_hour=running * usd_per_instance_hour,
            basis=f"{running} x {price.instance_type} at ${usd_per_instance_hour:g}/h ({price_label})",
        ),
        CostItem(
            name="root volumes of running instances",
            usd_per_hour=running * volume_usd,
            basis=f"{running} x {volume_basis}",
        ),
    ]
    if warm_pool:
        items.append(
            CostItem(
                name="warm pool (Stopped instances: root volumes only)",
                usd_per_hour=pool * volume_usd,
                basis=(
                    f"{pool} Stopped instance(s): max {maximum} - desired {running}, at least WARM_POOL_MIN_SIZE "
                    f"{WARM_POOL_MIN_SIZE} (EC2 Auto Scaling user guide, 'Warm pools': the pool holds max - desired "
                    f"when MaxGroupPreparedCapacity is unset; a Stopped instance pays for its EBS volumes, not "
                    f"compute); {pool} x {volume_basis}"
                ),
            )
        )
    items += [
        CostItem(
            name="application load balancer (hourly)",
            usd_per_hour=n["alb_usd_per_hour"],
            basis=f"one internal ALB at ${n['alb_usd_per_hour']}/h (Elastic Load Balancing pricing, us-east-1)",
        ),
        CostItem(
            name="application load balancer (LCUs)",
            usd_per_hour=lcus * n["alb_usd_per_lcu_hour"],
            basis=(
                f"{lcus:.3f} LCU x ${n['alb_usd_per_lcu_hour']}/LCU-hour, set by {lcu_reason}; estimated "
                f"from {requests_per_s:.3f} requests/s (one new connection each), {sessions:.0f} sessions x "
                f"{ALB_CONNECTIONS_PER_SESSION} active connections, {response_gb_h + prompt_gb_h:.4f} GB/h "
                f"processed ({traffic:g} output tokens/s x {BYTES_PER_TOKEN} bytes x "
                f"{STREAMED_RESPONSE_OVERHEAD} streamed-event overhead, plus prompts at {prompt_tokens:.0f} "
                f"tokens x {BYTES_PER_TOKEN} bytes x {PROMPT_OVERHEAD})"
            ),
        ),
        CostItem(
            name="interface VPC endpoints (hourly)",
            usd_per_hour=endpoints * azs * n["endpoint_usd_per_az_hour"],
            basis=(
                f"{endpoints} endpoints x {azs} AZs x ${n['endpoint_usd_per_az_hour']} per endpoint-AZ-hour "
                "(AWS PrivateLink pricing, us-east-1)"
            ),
        ),
        CostItem(
            name="interface VPC endpoints (data processed)",
            usd_per_hour=endpoint_gb_h * n["endpoint_usd_per_gb"],
            basis=(
                f"{running} running x {ENDPOINT_GB_PER_INSTANCE_HOUR} GB/h of logs, metrics and API calls x "
                f"${n['endpoint_usd_per_gb']}/GB (AWS PrivateLink pricing, first 1 PB); weights and image "
                "layers come through the free S3 gateway endpoint"
            ),
        ),
    ]
    total = sum(item.usd_per_hour for item in items)
    tokens_per_hour = traffic * 3600
    at_traffic = total / tokens_per_hour * 1e6 if tokens_per_hour > 0 else None
    at_capacity = usd_per_instance_hour / (capacity * 3600) * 1e6
    notes = [NETWORK_PRICE_NOTE, "no NAT gateway: the private data path reaches AWS APIs through its endpoints"]
    if spot:
        notes.append(f"instance prices are a Spot estimate, not a quote: {price.spot_label}")
    return FleetCost(
        instance_type=price.instance_type,
        region=price.region,
        spot=spot,
        running_instances=running,
        max_instances=maximum,
        warm_pool_instances=pool,
        root_volume_gib=size_gib,
        items=items,
        usd_per_hour=total,
        usd_per_month=total * _ebs()["hours_per_month"],
        instance_price_label=price_label,
        output_tokens_per_hour_at_traffic=tokens_per_hour,
        usd_per_million_output_tokens_at_traffic=at_traffic,
        usd_per_million_output_tokens_at_traffic_label=(
            f"the whole bill (${total:.4f}/h, every line above) over the traffic's {tokens_per_hour:,.0f} output "
            "tokens an hour"
            if at_traffic is not None
            else "no traffic: no cost per token"
        ),
        usd_per_million_output_tokens_at_capacity=at_capacity,
        usd_per_million_output_tokens_at_capacity_label=(
            f"one instance's {purchase} price (${usd_per_instance_hour:g}/h) over its {capacity:g} output tokens/s "
            "at full planned concurrency x 3600; instances only, no volumes, ALB or endpoints"
        ),
        notes=notes,
    )


# ------------------------------------------------------------------------------------------------------- batch job


def batch_job_cost(
    instance_type: str,
    *,
    region: str | None,
    instances: int,
    total_tokens: float,
    tokens_per_s_per_instance: float,
    startup_s: float,
    weights_gib: float,
    spot: bool = False,
    availability_zones: int = DEFAULT_AVAILABILITY_ZONES,
    interface_endpoints: int = len(DEFAULT_INTERFACE_ENDPOINTS),
    root_volume_iops: int | None = EMBEDDING_ROOT_VOLUME_IOPS,
    root_volume_throughput_mibps: int | None = EMBEDDING_ROOT_VOLUME_THROUGHPUT_MIBPS,
    price: InstancePrice | None = None,
) -> BatchCost:
    """What an embedding backlog costs: ``instances`` workers, each running from launch to the backlog's end.

    Every worker pays for its start-up (boot, image pull, weights download, model load: pass
    ``planner.startup``'s figure as ``startup_s``) and then its share of the work; EC2 bills Linux instances per
    second (Amazon EC2 On-Demand pricing, per-second billing, one-minute minimum). Root volumes are charged for the
    same hours, and the interface endpoints for every hour or partial hour of the job ("each partial VPC
    endpoint-hour consumed is billed as a full hour": AWS PrivateLink pricing).

    :raises PriceUnknownError: no on-demand price (or Spot estimate, with ``spot``) for the type there.
    """
    workers = int(_number("instances", instances, minimum=1, whole=True))
    tokens = _number("total_tokens", total_tokens, strict=True)
    throughput = _number("tokens_per_s_per_instance", tokens_per_s_per_instance, strict=True)
    startup_hours = _number("startup_s", startup_s) / 3600
    _number("weights_gib", weights_gib)
    azs = int(_number("availability_zones", availability_zones, minimum=1, whole=True))
    endpoints = int(_number("interface_endpoints", interface_endpoints, whole=True))

    price = price if price is not None else instance_price(instance_type, region)
    usd_per_instance_hour, price_label = _hourly_price(price, spot)
    n = _network()
    work_hours = tokens / (workers * throughput) / 3600
    hours = startup_hours + work_hours
    billed_endpoint_hours = math.ceil(hours)
    size_gib = root_volume_gib(weights_gib)
    volume_usd = gp3_volume_usd_per_hour(size_gib, root_volume_iops, root_volume_throughput_mibps)
    items = [
        JobCostItem(
            name="instances",
            usd=workers * hours * usd_per_instance_hour,
            basis=(
                f"{workers} x {price.instance_type} x {hours:.3f} h ({startup_hours:.3f} h start-up + "
                f"{work_hours:.3f} h work) at ${usd_per_instance_hour:g}/h ({price_label})"
            ),
        ),
        JobCostItem(
            name="root volumes",
            usd=workers * hours * volume_usd,
            basis=f"{workers} x {hours:.3f} h x {_volume_basis(size_gib, root_volume_iops, root_volume_throughput_mibps)}",
        ),
        JobCostItem(
            name="interface VPC endpoints (hourly)",
            usd=endpoints * azs * billed_endpoint_hours * n["endpoint_usd_per_az_hour"],
            basis=(
                f"{endpoints} endpoints x {azs} AZs x {billed_endpoint_hours} h (partial hours billed "
                f"whole) x ${n['endpoint_usd_per_az_hour']} (AWS PrivateLink pricing, us-east-1)"
            ),
        ),
        JobCostItem(
            name="interface VPC endpoints (data processed)",
            usd=workers * hours * ENDPOINT_GB_PER_INSTANCE_HOUR * n["endpoint_usd_per_gb"],
            basis=(
                f"{workers} x {hours:.3f} h x {ENDPOINT_GB_PER_INSTANCE_HOUR} GB/h of logs, metrics, queue "
                f"and API calls x ${n['endpoint_usd_per_gb']}/GB; documents and weights come through the "
                "free S3 gateway endpoint"
            ),
        ),
    ]
    total = sum(item.usd for item in items)
    notes = [NETWORK_PRICE_NOTE]
    if spot:
        notes.append(
            f"instance prices are a Spot estimate, not a quote: {price.spot_label}; interrupted work is "
            "retried, which this figure does not include"
        )
    return BatchCost(
        instance_type=price.instance_type,
        region=price.region,
        spot=spot,
        instances=workers,
        startup_hours=startup_hours,
        work_hours=work_hours,
        hours_wall_clock=hours,
        root_volume_gib=size_gib,
        items=items,
        total_usd=total,
        usd_per_million_tokens=total / tokens * 1e6,
        instance_price_label=price_label,
        notes=notes,
    )


# ------------------------------------------------------------------------------------------------------------ quota


def quota_name(instance_type: str | InstanceType, *, spot: bool = False) -> str:
    """The EC2 Service Quotas name that counts ``instance_type``'s vCPUs (On-Demand, or Spot with ``spot``)."""
    key = instance_type.instance_type if isinstance(instance_type, InstanceType) else _type_key(instance_type)
    letters = re.match(r"[a-z]+", _family(key))
    group = _QUOTA_GROUPS.get(letters.group(0) if letters else "")
    if group is None:
        raise GenaiConstructsError(f"instance_type {key!r}: no accelerated EC2 quota group is known for its family")
    return group[1] if spot else group[0]


def vcpu_quota(instance_type: str, instances: int, *, spot: bool = False) -> QuotaNeed:
    """The vCPU quota ``instances`` of ``instance_type`` need running at once in one region.

    Pass the fleet's maximum size: scale-out launches up to it, and each running instance counts its vCPUs
    against its family group's quota (Amazon EC2 user guide, "On-Demand Instance quotas"). Stopped warm-pool
    instances are not running and count against no running-instance quota.
    """
    entry = load_catalog().instance(instance_type)
    count = int(_number("instances", instances, minimum=1, whole=True))
    name = quota_name(entry, spot=spot)
    vcpus = count * entry.vcpu
    default = DEFAULT_QUOTA_VCPUS[name]
    increase = vcpus > default
    advice = (
        f"{count} x {entry.instance_type} ({entry.vcpu} vCPUs each) need {vcpus:,} vCPUs of "
        f"'{name}' in the fleet's region; a new account commonly has {default}: "
        + (
            "request an increase to at least that figure in the Service Quotas console (Amazon EC2) before "
            "deploying, or the group cannot launch its instances"
            if increase
            else "no increase needed"
        )
    )
    warning = (
        f"{vcpus:,} vCPUs of '{name}': {LARGEST_KNOWN_QUOTA_NOTE}" if vcpus > LARGEST_LIKELY_GRANTED_VCPUS else None
    )
    return QuotaNeed(
        instance_type=entry.instance_type,
        instances=count,
        vcpus_per_instance=entry.vcpu,
        vcpus=vcpus,
        quota_name=name,
        spot=spot,
        default_new_account_vcpus=default,
        increase_needed_on_new_account=increase,
        advice=advice,
        warning=warning,
    )
