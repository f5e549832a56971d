"""EBS volume prices, from ``genai_constructs/data/ebs_prices.json`` (each figure there carries its source).

EC2 bills a running instance per second at its On-Demand price and its EBS volumes per GB-month, provisioned IOPS
and throughput above the gp3 baseline included; a Stopped warm-pool instance pays for its volumes only ("you pay
for ... the EBS volumes" of stopped instances: EC2 Auto Scaling user guide, "Warm pools for Amazon EC2 Auto
Scaling"). The simulator charges both from the template's launch template volumes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import lru_cache
from importlib import resources

from genai_constructs.simulation.template import Volume


@lru_cache(maxsize=1)
def ebs_prices() -> dict[str, float]:
    """The gp3 figures by name, plus ``hours_per_month``."""
    data = json.loads(resources.files("genai_constructs.data").joinpath("ebs_prices.json").read_text())
    figures = {name: float(entry["value"]) for name, entry in data["gp3"].items()}
    figures["hours_per_month"] = float(data["hours_per_month"]["value"])
    return figures


def volumes_usd_per_hour(volumes: Iterable[Volume]) -> float:
    """What one instance's EBS volumes cost per hour (gp3 prices for every volume)."""
    p = ebs_prices()
    monthly = 0.0
    for v in volumes:
        monthly += v.size_gib * p["usd_per_gib_month"]
        monthly += max(0, v.iops - p["free_iops"]) * p["usd_per_iops_month"]
        monthly += max(0, v.throughput_mibps - p["free_throughput_mibps"]) * p["usd_per_mibps_month"]
    return monthly / p["hours_per_month"]
