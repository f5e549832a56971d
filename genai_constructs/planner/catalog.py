"""The accelerator instance catalog: typed, loaded once from ``genai_constructs/data/catalog.json``."""

from __future__ import annotations

import difflib
import json
from functools import lru_cache
from importlib import resources
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from genai_constructs.errors import UnknownInstanceTypeError

_NEURON_ACCELERATORS = frozenset({"Inferentia2", "Trainium"})


class Accelerator(BaseModel):
    """One accelerator device (a GPU, or an Inferentia2/Trainium chip of two NeuronCores)."""

    model_config = ConfigDict(frozen=True)

    name: str
    memory_gib: float = Field(description="Usable device memory as the EC2 API reports it.")
    memory_bandwidth_gb_s: float
    dense_bf16_tflops: float
    dense_fp8_tflops: float | None = None
    interconnect: str
    interconnect_gb_s: float = Field(description="One-way bandwidth to the other devices of the instance.")
    confidence: str = ""
    notes: str = ""

    @property
    def is_neuron(self) -> bool:
        return self.name in _NEURON_ACCELERATORS

    @property
    def family_kind(self) -> str:
        return "neuron" if self.is_neuron else "nvidia"


class InstanceType(BaseModel):
    """An EC2 accelerated instance size."""

    model_config = ConfigDict(frozen=True)

    instance_type: str
    accelerator: Accelerator
    accelerator_count: int
    accelerator_memory_gib: float = Field(description="Per device, as the EC2 API reports it.")
    vcpu: int
    memory_gib: float
    network_gbps: float
    network_burst_gbps: float | None = None
    efa: bool
    instance_store_gb: float
    on_demand_usd_per_hour: float | None = Field(default=None, description="None where AWS publishes no price.")

    @property
    def family(self) -> str:
        return self.instance_type.split(".", 1)[0]

    @property
    def size(self) -> str:
        return self.instance_type.split(".", 1)[1]

    @property
    def total_accelerator_memory_gib(self) -> float:
        return self.accelerator_memory_gib * self.accelerator_count

    @property
    def is_neuron(self) -> bool:
        return self.accelerator.is_neuron

    @property
    def has_price(self) -> bool:
        return self.on_demand_usd_per_hour is not None


class Catalog(BaseModel):
    model_config = ConfigDict(frozen=True)

    accelerators: dict[str, Accelerator]
    instances: dict[str, InstanceType]
    price_region: str
    price_date: str
    sources: dict[str, str]
    llm_benchmarks: list[dict[str, Any]]
    llm_benchmark_notes: dict[str, str]
    embedding_benchmarks: list[dict[str, Any]]

    def instance(self, instance_type: str) -> InstanceType:
        """The catalog entry for ``instance_type``; ``UnknownInstanceTypeError`` lists the closest names."""
        key = instance_type.strip().lower()
        if key in self.instances:
            return self.instances[key]
        close = difflib.get_close_matches(key, self.instances, n=4, cutoff=0.5)
        hint = f"closest: {', '.join(close)}" if close else f"known: {', '.join(sorted(self.instances))}"
        raise UnknownInstanceTypeError(
            f"instance_type {instance_type!r} is not in the accelerator catalog ({hint}); "
            "add it to genai_constructs/data/catalog.json with its source to use it"
        )

    def family_sizes(self, family: str) -> list[InstanceType]:
        return [i for i in self.instances.values() if i.family == family]


@lru_cache(maxsize=1)
def load_catalog() -> Catalog:
    """Parse the package's catalog data once per process."""
    raw = json.loads(resources.files("genai_constructs.data").joinpath("catalog.json").read_text())
    accelerators = {row["name"]: Accelerator(**row) for row in raw["accelerators"]["rows"]}
    instances = {
        row["instance_type"]: InstanceType(**{**row, "accelerator": accelerators[row["accelerator"]]})
        for row in raw["instances"]["rows"]
    }
    return Catalog(
        accelerators=accelerators,
        instances=instances,
        price_region=raw["instances"]["price_region"],
        price_date=raw["instances"]["price_date"],
        sources={k: v["source"] for k, v in raw.items() if isinstance(v, dict) and "source" in v},
        llm_benchmarks=raw["llm_benchmarks"]["rows"],
        llm_benchmark_notes=raw["llm_benchmarks"]["notes"],
        embedding_benchmarks=raw["embedding_benchmarks"]["rows"],
    )
