"""Sizing the CPU tiers: document preprocessing (parse + chunk) and RAG orchestration (query embedding + relay).

Pure Python: never imports aws_cdk. The figures are data with their sources:

* ``data/preprocessing.json``: measured documents/s per vCPU, per format (the preprocessing worker's own parsers and
  the encoder's tokenizer, ``benchmarks/`` script named in the file).
* ``data/query_embedding.json``: vCPU-seconds to embed one question (``benchmarks/query_embedding.py``).
* ``data/cpu_instances.json``: Graviton sizes (vCPUs, memory, baseline network) and us-east-1 on-demand prices.

Each plan says which term bound its instance count, and cites the figures it used.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from functools import lru_cache
from importlib import resources
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from genai_constructs.errors import (
    ConfigurationError,
    DeadlineUnreachableError,
    GenaiConstructsError,
    UnknownInstanceTypeError,
)
from genai_constructs.workload import DEFAULT_UTF8_BYTES_PER_TOKEN, BatchTraffic, ModelShape, RagTraffic

FORMATS = ("txt", "md", "html", "pdf", "jsonl")
"""The document formats the preprocessing worker parses (``runtime.documents``), as ``preprocessing.json`` names them."""
DEFAULT_FORMATS: Mapping[str, float] | None = None
"""An unknown mix (None) is planned as all of the slowest format in ``preprocessing.json`` (fewest documents/s per
vCPU), so a plan made without knowing the mix never misses its deadline; pass the real shares (e.g.
{"pdf": 0.5, "html": 0.3, "txt": 0.2}) to pay for less."""
DEFAULT_PREPROCESSING_INSTANCE = "c7g.xlarge"
"""Graviton3 compute-optimized, 4 vCPUs and 2 GiB per vCPU: one worker process per vCPU (the parsers are
single-threaded Python) with room for a large PDF each. c7g has the lowest on-demand price per vCPU of the sizes in
``cpu_instances.json`` (0.03625 USD/vCPU-h in us-east-1, against 0.0446 for c7i and 0.0513 for c7a, the x86 rows in the
same file), and xlarge keeps the group's steps small; a backlog that needs more than ``MAX_GROUP_INSTANCES`` steps up
to a larger c7g size."""
DEFAULT_ORCHESTRATION_INSTANCE = "c7g.xlarge"
"""Graviton3, 4 vCPUs: query embedding is single-threaded CPU work per request (the cheapest vCPU wins), and 1.876
Gbps of baseline network per 4 vCPUs carries a typical context (bandwidth per vCPU is the same at every c7g size)."""
MAX_GROUP_INSTANCES = 100
"""A plan past 100 instances of one size steps to a larger size: fewer instances to boot and pull the image on."""
MAX_PLANNED_INSTANCES = 1000
"""The most instances a plan proposes (before any account quota): past it the deadline is called unreachable."""
MIN_ORCHESTRATION_INSTANCES = 2
"""Two instances in two Availability Zones: the request path survives the loss of one instance or one zone."""
PROCESS_BASE_MEMORY_GIB = 0.5
"""One worker process at rest: Python, boto3, the parsers and the tokenizer loaded (resident set of the worker on the
development machine, rounded up)."""
DOCUMENT_MEMORY_FACTOR = 10.0
"""A document in memory while parsed: the raw bytes, the extracted text (PDF text is a fraction of its bytes, HTML
several), its tokens and the chunk objects being written; ten times the document covers the measured formats."""
SYSTEM_MEMORY_GIB = 1.0
"""The OS, docker and the CloudWatch agent on a CPU tier instance."""
DEFAULT_ANSWER_TOKENS = 512
"""The orchestrator's default ``--max-tokens`` (``runtime.rag_orchestrator.DEFAULT_MAX_TOKENS``): the answer is
sized at its longest."""
DEFAULT_ANSWER_SECONDS = 10.0
"""How long one answer streams: 512 tokens at about 20 ms per output token (an interactive TPOT target). Used for the
number of streams open at once (Little's law), not for CPU."""
SSE_CHUNK_OVERHEAD_BYTES = len(
    'data: {"id":"chatcmpl-00000000000000000000000000000000","object":"chat.completion.chunk","created":1700000000,'
    '"model":"","choices":[{"index":0,"delta":{"content":""},"finish_reason":null}]}\n\n')
"""Bytes around one streamed token in an OpenAI-compatible chat stream (one server-sent event per token, model name
added separately): the event's JSON envelope, counted from its literal form."""
ORCHESTRATION_OVERHEAD_VCPU_S = 0.00484
"""CPU per request besides the query embedding: the orchestrator's added time to first token with the dependency-free
hashing encoder, p50 4.84 ms (benchmarks/rag_path.py, docs/rag-request-path.md), all of it counted as CPU (an upper
bound: part of it is the database's). Not counted: relaying the streamed answer's chunks (unmeasured)."""
WIRE_OVERHEAD = 1.25
"""Bytes on the wire per byte of chunk text: PostgreSQL row framing, TLS records, TCP/IP headers, JSON escaping of the
prompt (a quarter more covers them for ~2 KiB chunks)."""

Bound = Literal["cpu", "memory", "network", "minimum"]


class _Plan(BaseModel):
    model_config = ConfigDict(frozen=True)


class FormatFigures(_Plan):
    """One format's measured figures, as ``preprocessing.json`` gives them."""

    format: str
    share: float = Field(description="Share of the documents in this format.")
    documents_per_s_per_vcpu: float
    mean_document_bytes: float
    mean_tokens_per_document: float
    chunks_per_document: float
    mib_per_s_per_vcpu: float


class CpuInstance(_Plan):
    """One Graviton size from ``cpu_instances.json``."""

    instance_type: str
    family: str
    vcpu: int
    memory_gib: float
    network_baseline_gbps: float
    network_burst_gbps: float | None = None
    on_demand_usd_per_hour: float | None = None
    price_source: str = ""


class PreprocessingPlan(_Plan):
    """How many CPU instances parse and chunk the backlog before the deadline, and why that many."""

    traffic: BatchTraffic
    formats: dict[str, float]
    figures: list[FormatFigures] = Field(description="The measured figures per format used (preprocessing.json).")
    figures_source: str
    instance_type: str
    vcpus_per_instance: int
    instances: int = Field(description="Instances that finish the backlog by the deadline (the group's maximum).")
    bound: Bound = Field(description="The term that set the instance count.")
    documents_per_s_per_vcpu: float = Field(description="Mix-weighted: 1 / sum(share / rate) over the formats.")
    documents_per_s_needed: float = Field(description="Documents / deadline, before headroom.")
    vcpus_needed: float = Field(description="documents_per_s_needed / documents_per_s_per_vcpu / (1 - headroom).")
    memory_gib_per_process: float
    worker_processes_per_instance: int
    network_gbps_per_instance: float = Field(description="Raw bytes in plus chunk objects out, per instance.")
    hours_to_finish: float = Field(description="At the planned instance count, without headroom.")
    usd_per_hour: float | None = Field(description="On-demand compute at full size; None where no price is known.")
    price_region: str
    region: str | None
    reason: str = Field(description="Why this instance type.")


class OrchestrationPlan(_Plan):
    """How many CPU instances serve the RAG request path at peak, and which term bound them."""

    traffic: RagTraffic
    encoder: str
    instance_type: str
    vcpus_per_instance: int
    instances: int
    bound: Bound
    vcpu_s_per_request: float = Field(description="Query embedding plus the orchestrator's own work, per request.")
    encode_vcpu_s_per_query: float
    vcpus_needed: float
    requests_per_s_per_instance: float = Field(description="What one instance sustains at (1 - headroom) of its CPU.")
    network_requests_per_s_per_instance: float = Field(
        description="What one instance's baseline network carries at (1 - headroom).")
    network_bytes_per_s_per_direction: float = Field(
        description="The busier direction at peak, whole tier: in = retrieved chunks + the streamed answer from the "
        "inference fleet; out = the prompt (chunks again) + the answer streamed to the caller.")
    network_gbps_needed: float = Field(description="Whole tier, with WIRE_OVERHEAD and headroom.")
    network_gbps_per_instance: float = Field(description="The instance type's baseline.")
    store_bytes_per_s: float = Field(description="Chunk text the readers must return per second at peak (all zones).")
    concurrent_streams: float = Field(description="Answers streaming at once at peak (Little's law).")
    answer_tokens: int
    answer_seconds: float
    request_count_per_target_per_minute: float = Field(
        description="ALB RequestCountPerTarget target (per minute) that keeps each instance at its planned rate.")
    usd_per_hour: float | None
    price_region: str
    region: str | None
    figures_source: str
    reason: str


# ---- Data ----------------------------------------------------------------------------------------------------------
def _read(name: str) -> Any:
    return json.loads(resources.files("genai_constructs.data").joinpath(name).read_text())


@lru_cache(maxsize=1)
def load_cpu_instances() -> dict[str, CpuInstance]:
    """The Graviton sizes of ``cpu_instances.json`` by name."""
    return {row["instance_type"]: CpuInstance(**row) for row in _read("cpu_instances.json")["rows"]}


@lru_cache(maxsize=1)
def load_preprocessing_figures() -> dict[str, Any]:
    """``preprocessing.json`` (the preprocessing worker's measured figures), parsed once."""
    try:
        data: dict[str, Any] = _read("preprocessing.json")
    except FileNotFoundError:
        raise GenaiConstructsError(
            "genai_constructs/data/preprocessing.json is missing: it holds the measured documents/s per vCPU per "
            "format that the preprocessing plan is sized from; run the preprocessing benchmark to write it") from None
    return data


@lru_cache(maxsize=1)
def load_query_embedding_figures() -> dict[str, Any]:
    """``query_embedding.json`` (``benchmarks/query_embedding.py``'s figures), parsed once."""
    data: dict[str, Any] = _read("query_embedding.json")
    return data


def cpu_instance(instance_type: str) -> CpuInstance:
    """The size named ``instance_type``; ``UnknownInstanceTypeError`` names the known ones."""
    instances = load_cpu_instances()
    key = instance_type.strip().lower() if isinstance(instance_type, str) else instance_type
    if key not in instances:
        raise UnknownInstanceTypeError(
            f"instance_type {instance_type!r} is not a CPU tier size (known: {', '.join(instances)}); add it to "
            "genai_constructs/data/cpu_instances.json with its source to use it")
    return instances[key]


# ---- Checks --------------------------------------------------------------------------------------------------------
def _number_problem(field: str, value: object, *, fix: str) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{field} ({value!r}) must be a number, not {type(value).__name__}: {fix}"
    if not math.isfinite(value):
        return f"{field} ({value!r}) must be a finite number: {fix}"
    return None


def _format_problems(formats: object, known: Mapping[str, Any]) -> list[str]:
    fix = 'e.g. formats={"pdf": 0.5, "html": 0.3, "txt": 0.2}'
    if not isinstance(formats, Mapping) or not formats:
        return [f"formats ({formats!r}) must be a non-empty mapping of format to share of the documents: {fix}"]
    problems: list[str] = []
    total_ok = True
    for name, share in formats.items():
        if name not in known:
            problems.append(f"formats: {name!r} is not a measured format (known: {', '.join(known)}): {fix}")
        problem = _number_problem(f"formats[{name!r}]", share, fix="a share between 0 and 1")
        if problem:
            problems.append(problem)
            total_ok = False
        elif not 0 <= share <= 1:
            problems.append(f"formats[{name!r}] ({share!r}) must be between 0 and 1: it is a share of the documents")
            total_ok = False
    if total_ok:
        total = sum(float(s) for s in formats.values())
        if not math.isclose(total, 1.0, abs_tol=1e-6):
            problems.append(f"formats' shares sum to {total:g}, not 1: give each format's share of the documents "
                            f"so they add up to 1 ({fix})")
    return problems


def _instance_problem(instance_type: object) -> str | None:
    if instance_type is None:
        return None
    if not isinstance(instance_type, str):
        return (f"instance_type ({instance_type!r}) must be a string such as 'c7g.xlarge', not "
                f"{type(instance_type).__name__}")
    try:
        cpu_instance(instance_type)
    except UnknownInstanceTypeError as error:
        return str(error)
    return None


def _region_problem(region: object) -> str | None:
    if region is not None and (not isinstance(region, str) or not region.strip()):
        return f"region ({region!r}) must be a Region name such as 'us-east-1', or None"
    return None


# ---- Preprocessing -------------------------------------------------------------------------------------------------
def _preprocessing_instances(vcpus_needed: float, memory_per_process: float, network_gbps_total: float,
                             instance: CpuInstance) -> tuple[int, Bound, int]:
    """Instances of ``instance`` for each term; the largest, the term that set it, and processes per instance."""
    processes = min(instance.vcpu, max(0, math.floor((instance.memory_gib - SYSTEM_MEMORY_GIB) / memory_per_process)))
    terms: dict[Bound, int] = {"minimum": 1}
    terms["cpu"] = math.ceil(vcpus_needed / instance.vcpu)
    if processes < instance.vcpu:
        terms["memory"] = math.ceil(vcpus_needed / processes) if processes else MAX_PLANNED_INSTANCES + 1
    terms["network"] = math.ceil(network_gbps_total / instance.network_baseline_gbps)
    bound = max(terms, key=lambda term: (terms[term], term == "cpu"))
    return terms[bound], bound, processes


def plan_preprocessing(
    traffic: BatchTraffic,
    formats: Mapping[str, float] | None = DEFAULT_FORMATS,
    instance_type: str | None = None,
    region: str | None = None,
) -> PreprocessingPlan:
    """Size the preprocessing tier: vCPUs = documents / (deadline_s x documents/s/vCPU of the mix) / (1 - headroom).

    The mix's rate is the harmonic mean weighted by share (a vCPU spends ``share / rate`` seconds per document on each
    format). Per instance: one worker process per vCPU, fewer where memory (``PROCESS_BASE_MEMORY_GIB`` plus
    ``DOCUMENT_MEMORY_FACTOR`` x the mix's largest mean document) does not fit; its network carries the raw bytes in
    and the chunk objects out. The instance count is the largest of the CPU, memory and network terms (``bound``).
    Default instance type: ``DEFAULT_PREPROCESSING_INSTANCE``, stepped up within c7g past ``MAX_GROUP_INSTANCES``.
    """
    figures_file = load_preprocessing_figures()
    known = figures_file.get("formats", {})
    if formats is None:
        formats = {min(known, key=lambda name: float(known[name]["documents_per_s_per_vcpu"])): 1.0}
    problems: list[str] = []
    if not isinstance(traffic, BatchTraffic):
        problems.append(f"traffic ({traffic!r}) must be a BatchTraffic, e.g. BatchTraffic(documents=500_000, "
                        "tokens_per_document=2_000, deadline_hours=6)")
    problems += _format_problems(formats, known)
    for problem in (_instance_problem(instance_type), _region_problem(region)):
        if problem:
            problems.append(problem)
    if problems:
        raise ConfigurationError("plan_preprocessing", problems)
    assert isinstance(traffic, BatchTraffic) and formats is not None
    shares = {name: float(share) for name, share in formats.items() if share > 0}
    figures = [FormatFigures(format=name, share=share, **{k: float(known[name][k]) for k in (
        "documents_per_s_per_vcpu", "mean_document_bytes", "mean_tokens_per_document", "chunks_per_document",
        "mib_per_s_per_vcpu")}) for name, share in shares.items()]
    seconds_per_document = sum(f.share / f.documents_per_s_per_vcpu for f in figures)
    rate_per_vcpu = 1 / seconds_per_document
    deadline_s = traffic.deadline_hours * 3600
    documents_per_s = traffic.documents / deadline_s
    vcpus_needed = documents_per_s / rate_per_vcpu / (1 - traffic.headroom)
    memory_per_process = PROCESS_BASE_MEMORY_GIB + DOCUMENT_MEMORY_FACTOR * max(
        f.mean_document_bytes for f in figures) / 2**30
    # Bytes per document in (the raw object) and out (its chunks: text at the file's bytes per token, JSON framing).
    bytes_per_document = sum(f.share * f.mean_document_bytes for f in figures)
    chunk_bytes_per_document = sum(f.share * f.mean_tokens_per_document for f in figures) * DEFAULT_UTF8_BYTES_PER_TOKEN
    network_gbps_total = (max(bytes_per_document, chunk_bytes_per_document) * WIRE_OVERHEAD * documents_per_s * 8
                          / 1e9 / (1 - traffic.headroom))
    candidates = [cpu_instance(instance_type)] if instance_type else _c7g_sizes_from(DEFAULT_PREPROCESSING_INSTANCE)
    chosen = None
    for instance in candidates:
        count, bound, processes = _preprocessing_instances(vcpus_needed, memory_per_process, network_gbps_total,
                                                           instance)
        chosen = (instance, count, bound, processes)
        if count <= MAX_GROUP_INSTANCES:
            break
    assert chosen is not None
    instance, count, bound, processes = chosen
    if count > MAX_PLANNED_INSTANCES or processes == 0:
        raise DeadlineUnreachableError(
            f"plan_preprocessing: {traffic.documents} documents in {traffic.deadline_hours:g} h need "
            f"{vcpus_needed:,.0f} vCPUs at {rate_per_vcpu:.3g} documents/s per vCPU (bound: {bound}), "
            f"{count} x {instance.instance_type}, past the {MAX_PLANNED_INSTANCES}-instance limit of a plan"
            + (" (one document does not fit in the instance's memory)" if processes == 0 else "")
            + ": extend deadline_hours, split the backlog across fleets, or pass a larger instance_type")
    hours = traffic.documents / (rate_per_vcpu * processes * count) / 3600
    price = instance.on_demand_usd_per_hour
    return PreprocessingPlan(
        traffic=traffic, formats=shares, figures=figures,
        figures_source=f"{figures_file.get('source', '?')} (measured {figures_file.get('measured_on', '?')} on "
                       f"{figures_file.get('machine', '?')})",
        instance_type=instance.instance_type, vcpus_per_instance=instance.vcpu, instances=count, bound=bound,
        documents_per_s_per_vcpu=rate_per_vcpu, documents_per_s_needed=documents_per_s, vcpus_needed=vcpus_needed,
        memory_gib_per_process=memory_per_process, worker_processes_per_instance=processes,
        network_gbps_per_instance=network_gbps_total / count, hours_to_finish=hours,
        usd_per_hour=price * count if price is not None else None, price_region=_price_region(), region=region,
        reason=("the instance type given" if instance_type else
                f"{DEFAULT_PREPROCESSING_INSTANCE} (DEFAULT_PREPROCESSING_INSTANCE: Graviton has the lowest price per "
                "vCPU for single-threaded parsers)" + (f", stepped up to {instance.instance_type} to stay within "
                                                        f"{MAX_GROUP_INSTANCES} instances"
                                                        if instance.instance_type != DEFAULT_PREPROCESSING_INSTANCE
                                                        else "")))


def _c7g_sizes_from(start: str) -> list[CpuInstance]:
    """``start`` and every larger size of its family, smallest first."""
    first = cpu_instance(start)
    return sorted((i for i in load_cpu_instances().values() if i.family == first.family and i.vcpu >= first.vcpu),
                  key=lambda i: i.vcpu)


def _price_region() -> str:
    return str(_read("cpu_instances.json")["price_region"])


# ---- Orchestration -------------------------------------------------------------------------------------------------
def non_embedding_mparams(encoder: ModelShape) -> float:
    """Parameters a forward pass multiplies, in millions: all of them less the word and position embeddings (a BERT
    encoder's token-type embeddings are negligible)."""
    embeddings = encoder.vocabulary * encoder.hidden_size + encoder.max_context * encoder.hidden_size
    return max(0.0, encoder.parameters_billion * 1e3 - embeddings / 1e6)


def encode_vcpu_s_per_query(encoder: ModelShape, query_tokens: int) -> float:
    """vCPU-seconds to embed one question of ``query_tokens`` with ``encoder``: the measured fixed cost plus the
    measured cost per token per million non-embedding parameters, scaled to this encoder (query_embedding.json)."""
    figures = load_query_embedding_figures()
    return float(figures["fixed_vcpu_s_per_query"]) + float(
        figures["vcpu_s_per_token_per_mparam"]) * non_embedding_mparams(encoder) * query_tokens


def plan_orchestration(
    traffic: RagTraffic,
    encoder: ModelShape,
    instance_type: str | None = None,
    region: str | None = None,
    *,
    answer_tokens: int = DEFAULT_ANSWER_TOKENS,
    answer_seconds: float = DEFAULT_ANSWER_SECONDS,
    model_name_bytes: int = 32,
) -> OrchestrationPlan:
    """Size the orchestration tier from three terms; the largest sets the instance count (``bound``):

    * cpu: requests/s x (query embedding + ``ORCHESTRATION_OVERHEAD_VCPU_S``) / (1 - headroom) vCPUs;
    * network: the busier direction per second (retrieved chunk text, or the prompt carrying it, plus the streamed
      answer as server-sent events) x ``WIRE_OVERHEAD`` / (1 - headroom), against each instance's baseline Gbps (the
      EC2 bandwidth figure applies to inbound and outbound separately: EC2 user guide, "Amazon EC2 instance network
      bandwidth"; a sustained flow gets the baseline, not the burst);
    * minimum: ``MIN_ORCHESTRATION_INSTANCES`` in two zones.

    The store must return ``store_bytes_per_s`` of chunk text at peak; ``concurrent_streams`` (requests/s x
    ``answer_seconds``) is what the load balancer and the inference fleet hold open.
    """
    problems: list[str] = []
    if not isinstance(traffic, RagTraffic):
        problems.append(f"traffic ({traffic!r}) must be a RagTraffic, e.g. RagTraffic(requests_per_s=50)")
    if not isinstance(encoder, ModelShape):
        problems.append(f"encoder ({encoder!r}) must be a ModelShape, e.g. ModelShape.preset('bge-base-en-v1.5')")
    elif encoder.kind != "encoder":
        problems.append(f"encoder ({encoder.name!r}) is a {encoder.kind}: the orchestrator embeds questions with the "
                        "embedding fleet's encoder; pass that encoder's ModelShape")
    for problem in (_instance_problem(instance_type), _region_problem(region)):
        if problem:
            problems.append(problem)
    for field, value, minimum in (("answer_tokens", answer_tokens, 1), ("model_name_bytes", model_name_bytes, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            problems.append(f"{field} ({value!r}) must be a whole number >= {minimum}")
    problem = _number_problem("answer_seconds", answer_seconds, fix="seconds one answer streams, e.g. 10")
    if problem or answer_seconds <= 0:
        problems.append(problem or f"answer_seconds ({answer_seconds!r}) must be > 0: seconds one answer streams")
    if problems:
        raise ConfigurationError("plan_orchestration", problems)
    instance = cpu_instance(instance_type or DEFAULT_ORCHESTRATION_INSTANCE)
    headroom = traffic.headroom
    encode_s = encode_vcpu_s_per_query(encoder, traffic.query_tokens)
    vcpu_s = encode_s + ORCHESTRATION_OVERHEAD_VCPU_S
    vcpus_needed = traffic.requests_per_s * vcpu_s / (1 - headroom)
    answer_bytes = answer_tokens * (traffic.bytes_per_token + SSE_CHUNK_OVERHEAD_BYTES + model_name_bytes)
    query_bytes = traffic.query_tokens * traffic.bytes_per_token
    per_direction = traffic.retrieved_bytes_per_s + traffic.requests_per_s * (answer_bytes + query_bytes)
    network_gbps = per_direction * WIRE_OVERHEAD * 8 / 1e9 / (1 - headroom)
    terms: dict[Bound, int] = {
        "minimum": MIN_ORCHESTRATION_INSTANCES,
        "cpu": math.ceil(vcpus_needed / instance.vcpu),
        "network": math.ceil(network_gbps / instance.network_baseline_gbps),
    }
    bound = max(terms, key=lambda term: (terms[term], term != "minimum"))
    count = terms[bound]
    if count > MAX_PLANNED_INSTANCES:
        raise GenaiConstructsError(
            f"plan_orchestration: {traffic.requests_per_s:g} requests/s need {count} x {instance.instance_type} "
            f"(bound: {bound}), past the {MAX_PLANNED_INSTANCES}-instance limit of a plan: lower top_k or "
            "chunk_tokens, or pass a larger instance_type")
    per_instance_rps = instance.vcpu * (1 - headroom) / vcpu_s
    # What one instance's baseline carries at (1 - headroom): the ALB target must not ask for more per instance than
    # the network term planned for, or target tracking would scale in below it.
    bytes_per_request = per_direction / traffic.requests_per_s
    per_instance_network_rps = instance.network_baseline_gbps * 1e9 * (1 - headroom) / (
        bytes_per_request * WIRE_OVERHEAD * 8)
    price = instance.on_demand_usd_per_hour
    figures = load_query_embedding_figures()
    return OrchestrationPlan(
        traffic=traffic, encoder=encoder.name, instance_type=instance.instance_type, vcpus_per_instance=instance.vcpu,
        instances=count, bound=bound, vcpu_s_per_request=vcpu_s, encode_vcpu_s_per_query=encode_s,
        vcpus_needed=vcpus_needed, requests_per_s_per_instance=per_instance_rps,
        network_requests_per_s_per_instance=per_instance_network_rps,
        network_bytes_per_s_per_direction=per_direction, network_gbps_needed=network_gbps,
        network_gbps_per_instance=instance.network_baseline_gbps, store_bytes_per_s=traffic.retrieved_bytes_per_s,
        concurrent_streams=traffic.requests_per_s * answer_seconds, answer_tokens=answer_tokens,
        answer_seconds=answer_seconds,
        request_count_per_target_per_minute=min(per_instance_rps, per_instance_network_rps) * 60,
        usd_per_hour=price * count if price is not None else None, price_region=_price_region(), region=region,
        figures_source=f"{figures.get('source', '?')} ({figures.get('machine', '?')})",
        reason="the instance type given" if instance_type else
        f"{DEFAULT_ORCHESTRATION_INSTANCE} (DEFAULT_ORCHESTRATION_INSTANCE: single-threaded embedding per request on "
        "the cheapest vCPU)")
