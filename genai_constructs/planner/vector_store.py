"""Size the retrieval tier's vector store (Aurora PostgreSQL with pgvector) from the RAG request path's load.

Pure Python; never imports aws_cdk. :func:`plan_vector_store` takes a :class:`~genai_constructs.workload.RagTraffic`
and the embedding dimension and picks the Aurora instance class and the readers per zone, checking three terms on
every reader and saying which one bound the choice:

1. Memory. Every reader holds the whole corpus: a query walks the HNSW graph from page to page, and a page that is
   not cached is a storage read on the request path. pgvector: "Indexes build significantly faster when the graph
   fits into maintenance_work_mem" and queries need the index in memory to be fast; an HNSW index "uses more memory"
   than IVFFlat (https://github.com/pgvector/pgvector#hnsw). The model, per row:

   * heap: ``ROW_OVERHEAD_BYTES`` (tuple header, item pointer, the id/source/etag/model/offset columns) + the vector
     (``4 x dimension + 8``: pgvector stores float4 elements behind an 8-byte header, "Each vector takes 4 *
     dimensions + 8 bytes of storage", https://github.com/pgvector/pgvector#vector-type) + the chunk's text
     (``chunk_tokens x bytes_per_token``);
   * HNSW index: a copy of the vector plus its neighbour lists. pgvector keeps ``m`` neighbours per upper layer and
     ``2 x m`` on layer 0 (``m`` 16 by default, https://github.com/pgvector/pgvector#index-options), each a 6-byte
     item pointer, and few elements reach an upper layer (a fraction ``1/m`` per layer up); ``HNSW_ELEMENT_OVERHEAD_
     BYTES`` covers the element's tuple header and level data. Pages are not full, ``HNSW_PAGE_FILL`` of each.

   The sum, times ``1 + MEMORY_MARGIN``, must fit ``USABLE_MEMORY_FRACTION`` of the class's memory.

2. Network. Each reader returns ``top_k`` chunks of text per query (``RagTraffic.retrieved_bytes_per_s``) and receives
   the query vector in pgvector's text form (``QUERY_VECTOR_TEXT_BYTES_PER_DIMENSION`` per element). The lesson
   warns that teams shrink retrieval to hide a bandwidth limit, so the plan carries the full bytes, sized against
   the class's *baseline* bandwidth (the burst figure lasts minutes), of which ``NETWORK_SHARE`` is given to
   retrieval.

3. Queries. One query runs on one PostgreSQL backend, one process on one vCPU ("process per user",
   https://www.postgresql.org/docs/current/tutorial-arch.html); the rate one vCPU sustains was measured
   (``benchmarks/vector_store_qps.py``, in ``data/aurora_instances.json``).

Failover. The orchestrators read from their own zone's reader and fail over to another zone's when it is gone
(``runtime.zonal_client``). So that a zone's loss does not starve the rest, each zone is sized to carry
``1 / (zones - 1)`` of the load (with one zone, all of it), and the traffic's ``headroom`` on top.

The class: the first family of ``data/aurora_instances.json`` (db.r7g), smallest size first; for each size whose
memory holds the corpus, readers per zone = the larger of the network and query terms (at least
``min_readers_per_zone``). The fewest readers per zone wins, then the fewest vCPU-hours (the data carries no prices;
see its sources): the orchestrator reaches one reader endpoint per zone (``--reader ZONE=HOST:PORT``), so the plan
scales a zone's reader up before it adds a second one. An Aurora cluster has at most ``MAX_READERS_PER_CLUSTER`` readers.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from importlib import resources
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from genai_constructs.errors import GenaiConstructsError
from genai_constructs.planner.deployment import DEFAULT_AVAILABILITY_ZONES
from genai_constructs.workload import RagTraffic

__all__ = [
    "HNSW_M",
    "MAX_READERS_PER_CLUSTER",
    "AuroraInstanceClass",
    "VectorStoreDoesNotFitError",
    "VectorStorePlan",
    "aurora_instance_classes",
    "measured_queries_per_s_per_vcpu",
    "plan_vector_store",
    "vector_store_bytes",
]

ROW_OVERHEAD_BYTES = 400
"""Bytes of a row besides its vector and text: the 24-byte tuple header and 4-byte item pointer, the id
(``<source>#<chunk>``) and source URI (~60 bytes each for an S3 key), the ETag (34), the model name and three
integers (``runtime.vector_store.create_schema``), and the row's entries in the two btrees (id; source, chunk)."""
TABLE_PAGE_FILL = 0.78
"""Fraction of heap and TOAST pages holding row data (a 2 KB chunk is moved out of line into TOAST chunks; pages keep
headers and free space); set so the model is at or above the measured table (4,992 B/row for 384 dimensions and
2,048 bytes of text: data/aurora_instances.json, model 5,118)."""
HNSW_M = 16
"""pgvector's default ``m`` (https://github.com/pgvector/pgvector#index-options), which the loader's index uses."""
HNSW_NEIGHBOUR_BYTES = 6
"""One neighbour is an ItemPointerData (block number and offset: 6 bytes)."""
HNSW_ELEMENT_OVERHEAD_BYTES = 64
"""Per element: index tuple headers of the element and its neighbour tuple, level, heap pointers."""
HNSW_PAGE_FILL = 0.85
"""Fraction of each 8 KiB index page holding elements (an element does not span pages); set so the model is at or
above the index measured by benchmarks/vector_store_qps.py (2,048 B/row at 384 dimensions, model 2,125)."""
QUERY_VECTOR_TEXT_BYTES_PER_DIMENSION = 10
"""The orchestrator sends the query as pgvector text (``runtime.vector_store.vector_literal``): about ten bytes per
element ("-0.0123456," with its separator)."""
RESULT_OVERHEAD_BYTES_PER_CHUNK = 200
"""Besides its text, each returned row carries id, source, chunk number and distance, plus the row's protocol framing."""
MEMORY_MARGIN = 0.25
"""A quarter on top of the modelled bytes: dead tuples between vacuums, the btree on (source, chunk), model error."""
USABLE_MEMORY_FRACTION = 0.5
"""Half the class's memory for the corpus: the rest is the engine, connections (work_mem per sort), the OS."""
NETWORK_SHARE = 0.5
"""Half the baseline bandwidth for retrieval: the same interface carries the writer's redo stream to the reader and
Aurora storage reads of any page that is not cached."""
MAX_READERS_PER_CLUSTER = 15
"""An Aurora DB cluster has "up to 15 Aurora Replicas" (Replication with Amazon Aurora,
https://docs.aws.amazon.com/AmazonRDS/latest/AuroraUserGuide/Aurora.Replication.html)."""

Bound = Literal["memory", "network", "queries", "minimum"]


class VectorStoreDoesNotFitError(GenaiConstructsError):
    """No Aurora instance class in the data holds the corpus, or carries the load within the cluster's reader limit."""


class AuroraInstanceClass(BaseModel):
    """One Aurora DB instance class (``data/aurora_instances.json``)."""

    model_config = ConfigDict(frozen=True)

    instance_class: str
    vcpu: int
    memory_gib: float
    network_baseline_gbps: float = Field(description="Sustained bandwidth; the 'up to' figure is a burst.")
    usd_per_hour: float | None = Field(default=None, description="None: no price in the stored sources.")

    @property
    def family(self) -> str:
        return self.instance_class.rsplit(".", 1)[0]


class VectorStorePlan(BaseModel):
    """The vector store's instance class and readers, and every term that sized them (per reader and per zone)."""

    model_config = ConfigDict(frozen=True)

    instance_class: str
    vcpu: int
    memory_gib: float
    zones: int = Field(description="Availability zones with readers (one reader endpoint set per zone).")
    readers_per_zone: int
    reader_instances: int = Field(description="readers_per_zone x zones; the writer is one more instance.")
    bound_by: Bound = Field(description="The term that set the class (memory) or the readers per zone.")
    dimension: int
    stored_chunks: int
    table_bytes: float = Field(description="Modelled heap bytes of the table (rows: vector, text, columns).")
    index_bytes: float = Field(description="Modelled bytes of the HNSW index.")
    memory_needed_gib: float = Field(description="(table + index) x (1 + MEMORY_MARGIN).")
    memory_usable_gib: float = Field(description="USABLE_MEMORY_FRACTION of the class's memory.")
    zone_share: float = Field(description="Fraction of the load one zone carries: 1 / (zones - 1) (failover).")
    network_bytes_per_s_needed: float = Field(
        description="One zone's bytes/s in and out (retrieved text, rows' framing, query vectors), with headroom.")
    network_bytes_per_s_capacity: float = Field(
        description="NETWORK_SHARE of the baseline bandwidth of the zone's readers.")
    queries_per_s_needed: float = Field(description="One zone's top-k queries/s, with headroom.")
    queries_per_s_capacity: float = Field(description="vCPUs x measured queries/s per vCPU, the zone's readers.")
    queries_per_s_per_vcpu: float = Field(description="The measured figure used (data/aurora_instances.json).")
    usd_per_hour: float | None = Field(description="Writer plus readers, where prices are known; else None.")
    explanation: str = Field(description="Each term with its numbers, and what bound the choice.")


@lru_cache(maxsize=1)
def _data() -> dict[str, Any]:
    text = resources.files("genai_constructs.data").joinpath("aurora_instances.json").read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def aurora_instance_classes() -> tuple[AuroraInstanceClass, ...]:
    """Every class of ``data/aurora_instances.json``, in its order (families in preference order, sizes ascending)."""
    return tuple(AuroraInstanceClass(**row) for row in _data()["classes"])


def measured_queries_per_s_per_vcpu() -> float:
    """pgvector HNSW top-k queries/s one vCPU sustained in ``benchmarks/vector_store_qps.py``."""
    return float(_data()["measured_queries"]["queries_per_s_per_vcpu"])


def vector_store_bytes(traffic: RagTraffic, dimension: int) -> tuple[float, float]:
    """Modelled (table bytes, HNSW index bytes) for ``traffic.stored_chunks`` rows of ``dimension`` (module doc)."""
    vector = 4 * dimension + 8
    text = traffic.chunk_tokens * traffic.bytes_per_token
    row = (ROW_OVERHEAD_BYTES + vector + text) / TABLE_PAGE_FILL
    upper_layers = 1 / (HNSW_M - 1)  # sum over levels l >= 1 of (1/m)^l
    neighbours = (2 * HNSW_M + HNSW_M * upper_layers) * HNSW_NEIGHBOUR_BYTES
    element = (vector + neighbours + HNSW_ELEMENT_OVERHEAD_BYTES) / HNSW_PAGE_FILL
    return traffic.stored_chunks * row, traffic.stored_chunks * element


def _check(traffic: object, dimension: object, zones: object, min_readers_per_zone: object,
           instance_class: object, region: object) -> list[str]:
    problems: list[str] = []
    if not isinstance(traffic, RagTraffic):
        problems.append(f"traffic ({type(traffic).__name__}) must be a RagTraffic: e.g. "
                        "RagTraffic(requests_per_s=50, stored_chunks=2_000_000)")
    for name, value, low, high, fix in (
            ("dimension", dimension, 1, 2000, "the encoder's output width, e.g. 384 for all-MiniLM-L6-v2 (pgvector's "
                                              "HNSW indexes vectors of up to 2,000 dimensions)"),
            ("zones", zones, 1, 6, f"the availability zones with readers, e.g. {DEFAULT_AVAILABILITY_ZONES}"),
            ("min_readers_per_zone", min_readers_per_zone, 1, MAX_READERS_PER_CLUSTER, "e.g. 1")):
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"{name} ({value!r}) must be a whole number from {low} to {high}, not a "
                            f"{type(value).__name__}: {fix}")
        elif not low <= value <= high:
            problems.append(f"{name} ({value!r}) must be a whole number from {low} to {high}: {fix}")
    known = [c.instance_class for c in aurora_instance_classes()]
    if instance_class is not None and instance_class not in known:
        problems.append(f"instance_class ({instance_class!r}) is not in data/aurora_instances.json: use one of "
                        f"{', '.join(known)}, or None to let the plan choose")
    if region is not None and not isinstance(region, str):
        problems.append(f"region ({region!r}) must be a Region name such as 'us-east-1', or None")
    return problems


def plan_vector_store(
    traffic: RagTraffic,
    dimension: int,
    region: str | None = None,
    *,
    zones: int = DEFAULT_AVAILABILITY_ZONES,
    min_readers_per_zone: int = 1,
    instance_class: str | None = None,
) -> VectorStorePlan:
    """The Aurora instance class and readers per zone that hold ``traffic``'s corpus and carry its load (module doc).

    :param region: recorded in the explanation only: the class data is the us-east-1 offer (see the data's sources).
    :param zones: zones with readers. Default: ``DEFAULT_AVAILABILITY_ZONES`` (the network's default).
    :param min_readers_per_zone: the fewest readers per zone. Default: 1.
    :param instance_class: evaluate this class only (it must hold the corpus). Default: the plan's choice.
    :raises VectorStoreDoesNotFitError: nothing in the data fits; the message names the term and what to change.
    """
    problems = _check(traffic, dimension, zones, min_readers_per_zone, instance_class, region)
    if problems:
        raise GenaiConstructsError("plan_vector_store: " + "; ".join(problems))
    per_vcpu = measured_queries_per_s_per_vcpu()
    table, index = vector_store_bytes(traffic, dimension)
    needed_gib = (table + index) * (1 + MEMORY_MARGIN) / 2**30
    share = 1.0 if zones == 1 else 1 / (zones - 1)
    scale = share / (1 - traffic.headroom)
    queries = traffic.requests_per_s * scale
    bytes_out = traffic.retrieved_bytes_per_s + traffic.requests_per_s * traffic.top_k * RESULT_OVERHEAD_BYTES_PER_CHUNK
    bytes_in = traffic.requests_per_s * dimension * QUERY_VECTOR_TEXT_BYTES_PER_DIMENSION
    network = (bytes_out + bytes_in) * scale
    family = aurora_instance_classes()[0].family
    candidates = [c for c in aurora_instance_classes()
                  if (c.instance_class == instance_class if instance_class else c.family == family)]

    def readers_needed(option: AuroraInstanceClass) -> tuple[int, int]:
        """(readers by the query term, readers by the network term) per zone on ``option``."""
        return (math.ceil(queries / (option.vcpu * per_vcpu)),
                math.ceil(network / (option.network_baseline_gbps * 1e9 / 8 * NETWORK_SHARE)))

    fitting = [c for c in candidates if needed_gib <= c.memory_gib * USABLE_MEMORY_FRACTION]
    best: tuple[tuple[int, int], AuroraInstanceClass, int] | None = None
    for option in fitting:
        readers = max(*readers_needed(option), min_readers_per_zone)
        if readers * zones > MAX_READERS_PER_CLUSTER:
            continue
        # Fewest readers per zone first (the orchestrator reaches one reader per zone: scale up before out), then
        # vCPU-hours (the cost proxy: within a family price is proportional to vCPUs).
        key = (readers, (readers * zones + 1) * option.vcpu)
        if best is None or key < best[0]:
            best = (key, option, readers)
    if best is None:
        raise VectorStoreDoesNotFitError(_nothing_fits(
            traffic, dimension, zones, needed_gib, queries, network, per_vcpu, candidates[-1], instance_class))
    _, chosen, readers = best
    by_queries, by_network = readers_needed(fitting[0] if chosen is not fitting[0] else chosen)
    bound: Bound
    if chosen is not fitting[0] or readers > min_readers_per_zone:
        bound = "network" if by_network >= by_queries else "queries"  # what pushed it past the smallest that fits
    elif len(fitting) < len(candidates):
        bound = "memory"
    else:
        bound = "minimum"
    capacity_network = readers * chosen.network_baseline_gbps * 1e9 / 8 * NETWORK_SHARE
    capacity_queries = readers * chosen.vcpu * per_vcpu
    usable = chosen.memory_gib * USABLE_MEMORY_FRACTION
    price = None if chosen.usd_per_hour is None else chosen.usd_per_hour * (readers * zones + 1)
    explanation = (
        f"{chosen.instance_class} x {readers} reader(s) in each of {zones} zone(s) + 1 writer, bound by {bound}. "
        f"Memory: {traffic.stored_chunks:,} rows x {dimension} dims = table {table / 2**30:.2f} GiB + HNSW "
        f"{index / 2**30:.2f} GiB, {needed_gib:.2f} GiB with margin vs {usable:.1f} GiB usable of "
        f"{chosen.memory_gib:g}. Network (one zone carries {share:.0%} of the load, headroom "
        f"{traffic.headroom:.0%}): {network / 1e6:.2f} MB/s vs {capacity_network / 1e6:.1f} MB/s "
        f"({NETWORK_SHARE:.0%} of {chosen.network_baseline_gbps:g} Gbps baseline x {readers}). Queries: "
        f"{queries:.1f}/s vs {capacity_queries:,.0f}/s ({chosen.vcpu} vCPU x {per_vcpu:,.0f}/s measured x {readers})."
        + ("" if region in (None, "us-east-1") else f" Region {region}: class data is the us-east-1 offer.")
    )
    return VectorStorePlan(
        instance_class=chosen.instance_class, vcpu=chosen.vcpu, memory_gib=chosen.memory_gib, zones=zones,
        readers_per_zone=readers, reader_instances=readers * zones, bound_by=bound, dimension=dimension,
        stored_chunks=traffic.stored_chunks, table_bytes=table, index_bytes=index,
        memory_needed_gib=needed_gib, memory_usable_gib=usable, zone_share=share,
        network_bytes_per_s_needed=network, network_bytes_per_s_capacity=capacity_network,
        queries_per_s_needed=queries, queries_per_s_capacity=capacity_queries, queries_per_s_per_vcpu=per_vcpu,
        usd_per_hour=price, explanation=explanation,
    )


def _nothing_fits(traffic: RagTraffic, dimension: int, zones: int, needed_gib: float, queries: float,
                  network: float, per_vcpu: float, biggest: AuroraInstanceClass, instance_class: str | None) -> str:
    usable = biggest.memory_gib * USABLE_MEMORY_FRACTION
    if needed_gib > usable:
        return (f"plan_vector_store: {traffic.stored_chunks:,} chunks of {dimension} dims need {needed_gib:.1f} GiB "
                f"of memory with margin; {biggest.instance_class} offers {usable:.0f} GiB usable "
                f"({USABLE_MEMORY_FRACTION:.0%} of {biggest.memory_gib:g}): "
                + ("pass instance_class=None to let the plan pick a larger class, or " if instance_class else "")
                + "shard the corpus across stores, store halfvec or fewer dimensions, or shorter chunk text")
    limit = MAX_READERS_PER_CLUSTER // zones
    return (f"plan_vector_store: one zone's load ({queries:.0f} queries/s, {network / 1e6:.0f} MB/s) needs more than "
            f"{limit} readers per zone even on {biggest.instance_class} ({biggest.vcpu} vCPU x {per_vcpu:,.0f} "
            f"queries/s, {biggest.network_baseline_gbps:g} Gbps baseline); an Aurora cluster has at most "
            f"{MAX_READERS_PER_CLUSTER} readers: split the traffic across clusters, use more zones, or lower top_k "
            "only if the answers allow it (the retrieved bytes are what is being carried)")
