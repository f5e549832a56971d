"""The CPU tiers' planners, on figures set here (never the measured files' numbers): every expectation is worked out
by hand from these inputs."""

import math

import pytest

from genai_constructs.errors import ConfigurationError, DeadlineUnreachableError, UnknownInstanceTypeError
from genai_constructs.planner import cpu_tier
from genai_constructs.planner.cpu_tier import CpuInstance, plan_orchestration, plan_preprocessing
from genai_constructs.workload import BatchTraffic, ModelShape, RagTraffic

MIB = 2**20


def figures(pdf_bytes: float = 1 * MIB) -> dict[str, object]:
    def row(rate: float, mean_bytes: float, tokens: float) -> dict[str, float]:
        return {"documents_per_s_per_vcpu": rate, "mean_document_bytes": mean_bytes,
                "mean_tokens_per_document": tokens, "chunks_per_document": tokens / 512,
                "mib_per_s_per_vcpu": rate * mean_bytes / MIB}

    return {"source": "test table", "measured_on": "2026-12-01", "machine": "none", "chunk_tokens": 512,
            "formats": {"pdf": row(2.0, pdf_bytes, 4000), "html": row(10.0, 100_000, 2000),
                        "txt": row(50.0, 20_000, 5000), "md": row(40.0, 20_000, 5000),
                        "jsonl": row(30.0, 50_000, 10000)}}


INSTANCES = {
    "c7g.xlarge": CpuInstance(instance_type="c7g.xlarge", family="c7g", vcpu=4, memory_gib=8, network_baseline_gbps=2.0,
                              on_demand_usd_per_hour=0.1),
    "c7g.2xlarge": CpuInstance(instance_type="c7g.2xlarge", family="c7g", vcpu=8, memory_gib=16,
                               network_baseline_gbps=4.0, on_demand_usd_per_hour=0.2),
    "x.lowmem": CpuInstance(instance_type="x.lowmem", family="x", vcpu=4, memory_gib=2.5, network_baseline_gbps=2.0),
    "c7g.4xlarge": CpuInstance(instance_type="c7g.4xlarge", family="c7g", vcpu=16, memory_gib=32,
                               network_baseline_gbps=8.0, on_demand_usd_per_hour=None),
}
QUERY = {"source": "test", "machine": "none", "fixed_vcpu_s_per_query": 0.005, "vcpu_s_per_token_per_mparam": 1e-5}


@pytest.fixture(autouse=True)
def tables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_tier, "load_preprocessing_figures", figures)
    monkeypatch.setattr(cpu_tier, "load_cpu_instances", lambda: INSTANCES)
    monkeypatch.setattr(cpu_tier, "load_query_embedding_figures", lambda: QUERY)


MIX = {"pdf": 0.5, "html": 0.3, "txt": 0.2}


def test_preprocessing_vcpus_follow_the_mix_the_deadline_and_headroom():
    traffic = BatchTraffic(documents=360_000, tokens_per_document=3000, deadline_hours=2, headroom=0.2)
    plan = plan_preprocessing(traffic, MIX)
    # A vCPU spends 0.5/2 + 0.3/10 + 0.2/50 = 0.284 s per document; 360,000 in 7,200 s is 50 documents/s.
    assert plan.documents_per_s_per_vcpu == pytest.approx(1 / 0.284)
    assert plan.documents_per_s_needed == pytest.approx(50)
    assert plan.vcpus_needed == pytest.approx(50 * 0.284 / 0.8)  # 17.75
    assert (plan.instance_type, plan.instances, plan.bound) == ("c7g.xlarge", 5, "cpu")
    assert plan.worker_processes_per_instance == 4
    assert plan.hours_to_finish == pytest.approx(360_000 * 0.284 / 20 / 3600)
    assert plan.usd_per_hour == pytest.approx(0.5)
    assert [f.format for f in plan.figures] == ["pdf", "html", "txt"]
    assert plan.figures[0].documents_per_s_per_vcpu == 2.0 and plan.figures_source.startswith("test table")


def test_preprocessing_memory_binds_on_an_instance_short_of_memory():
    traffic = BatchTraffic(documents=360_000, tokens_per_document=3000, deadline_hours=2, headroom=0.2)
    plan = plan_preprocessing(traffic, MIX, instance_type="x.lowmem")
    # 0.5 GiB + 10 x 1 MiB (the largest mean document, PDF) a process; (2.5 - 1) GiB / 0.5098 -> 2 of the 4 vCPUs
    # get a worker; 17.75 vCPUs of work / 2 -> 9 instances.
    assert plan.memory_gib_per_process == pytest.approx(0.5 + 10 / 1024)
    assert (plan.worker_processes_per_instance, plan.instances, plan.bound) == (2, 9, "memory")
    assert plan.reason == "the instance type given"


def test_preprocessing_network_carries_the_raw_bytes():
    traffic = BatchTraffic(documents=360_000, tokens_per_document=3000, deadline_hours=2, headroom=0.2)
    plan = plan_preprocessing(traffic, MIX)
    # In: 0.5 x 1 MiB + 0.3 x 100 kB + 0.2 x 20 kB = 558,288 bytes a document (more than its chunk text out), x 1.25
    # wire overhead x 50 documents/s / (1 - 0.2), over 5 instances.
    assert plan.network_gbps_per_instance == pytest.approx(558_288 * 1.25 * 50 * 8 / 1e9 / 0.8 / 5)


def test_preprocessing_steps_up_the_size_past_the_group_limit():
    # 0.284 s x 14,400,000 documents / 3,600 s / 0.8 = 1,420 vCPUs: 355 xlarge or 178 2xlarge (both past 100),
    # so 89 4xlarge.
    traffic = BatchTraffic(documents=4 * 3_600_000, tokens_per_document=3000, deadline_hours=1, headroom=0.2)
    plan = plan_preprocessing(traffic, MIX)
    assert plan.vcpus_needed == pytest.approx(4 * 355)
    assert (plan.instance_type, plan.instances, plan.usd_per_hour) == ("c7g.4xlarge", 89, None)
    assert "stepped up to c7g.4xlarge" in plan.reason


def test_preprocessing_defaults_to_all_of_the_slowest_format():
    traffic = BatchTraffic(documents=72_000, tokens_per_document=3000, deadline_hours=1, headroom=0.0)
    plan = plan_preprocessing(traffic)
    assert plan.formats == {"pdf": 1.0}  # 2 documents/s per vCPU: the table's slowest
    assert plan.vcpus_needed == pytest.approx(20 / 2)  # 20 documents/s at 2 per vCPU


def test_fails_a_deadline_no_fleet_meets():
    traffic = BatchTraffic(documents=10**9, tokens_per_document=3000, deadline_hours=1)
    with pytest.raises(DeadlineUnreachableError, match=r"past the 1000-instance limit .* extend deadline_hours"):
        plan_preprocessing(traffic, MIX)


def test_fails_bad_formats_with_every_problem_at_once():
    traffic = BatchTraffic(documents=1000, tokens_per_document=100, deadline_hours=1)
    with pytest.raises(ConfigurationError) as error:
        plan_preprocessing(traffic, {"pdf": math.nan, "docx": 0.5, "txt": True}, instance_type="c5.large")
    problems = error.value.problems
    assert any("formats['pdf'] (nan) must be a finite number" in p for p in problems)
    assert any("'docx' is not a measured format (known: pdf, html, txt, md, jsonl)" in p for p in problems)
    assert any("formats['txt'] (True) must be a number, not bool" in p for p in problems)
    assert any("'c5.large' is not a CPU tier size" in p for p in problems)
    assert len(problems) == 4


def test_fails_shares_that_do_not_sum_to_one():
    traffic = BatchTraffic(documents=1000, tokens_per_document=100, deadline_hours=1)
    with pytest.raises(ConfigurationError, match=r"formats' shares sum to 0.9, not 1"):
        plan_preprocessing(traffic, {"pdf": 0.6, "txt": 0.3})


def test_fails_wrong_traffic_type_and_region():
    with pytest.raises(ConfigurationError) as error:
        plan_preprocessing("500k docs", MIX, region=3)  # type: ignore[arg-type]
    assert len(error.value.problems) == 2 and "must be a BatchTraffic" in error.value.problems[0]


BGE_BASE = ModelShape.preset("bge-base-en-v1.5")
# 109 M parameters less (30,522 + 512) x 768 embedding weights = 85.165888 M multiplied per token.
BGE_BASE_MPARAMS = 109 - (30_522 + 512) * 768 / 1e6


def test_orchestration_cpu_term_from_the_query_embedding():
    traffic = RagTraffic(requests_per_s=50, query_tokens=64, headroom=0.3)
    plan = plan_orchestration(traffic, BGE_BASE)
    encode = 0.005 + 1e-5 * BGE_BASE_MPARAMS * 64  # 0.05951 vCPU-s
    assert plan.encode_vcpu_s_per_query == pytest.approx(encode)
    assert plan.vcpu_s_per_request == pytest.approx(encode + 0.00484)
    assert plan.vcpus_needed == pytest.approx(50 * (encode + 0.00484) / 0.7)  # 4.6 vCPUs: 2 x 4
    assert (plan.instances, plan.bound) == (2, "cpu")
    assert plan.requests_per_s_per_instance == pytest.approx(4 * 0.7 / (encode + 0.00484))
    assert plan.store_bytes_per_s == pytest.approx(50 * 4 * 512 * 4)
    assert plan.concurrent_streams == pytest.approx(500)


def test_orchestration_keeps_two_instances_in_two_zones_at_low_load():
    plan = plan_orchestration(RagTraffic(requests_per_s=1), BGE_BASE)
    assert (plan.instances, plan.bound) == (2, "minimum")


def test_orchestration_network_binds_for_wide_retrieval():
    traffic = RagTraffic(requests_per_s=200, top_k=500, chunk_tokens=512, bytes_per_token=4, query_tokens=8,
                         headroom=0.2)
    plan = plan_orchestration(traffic, ModelShape.preset("all-minilm-l6-v2"), answer_tokens=1, model_name_bytes=0)
    sse = len('data: {"id":"chatcmpl-00000000000000000000000000000000","object":"chat.completion.chunk",'
              '"created":1700000000,"model":"","choices":[{"index":0,"delta":{"content":""},"finish_reason":null}]}'
              '\n\n')
    per_request = 500 * 512 * 4 + (4 + sse) + 8 * 4
    gbps = 200 * per_request * 1.25 * 8 / 1e9 / 0.8  # 2.56 Gbps of chunks, with wire overhead and headroom
    assert plan.network_gbps_needed == pytest.approx(gbps)
    assert (plan.instances, plan.bound) == (math.ceil(gbps / 2.0), "network")
    # The ALB target asks no more of an instance than its network term planned.
    assert plan.request_count_per_target_per_minute == pytest.approx(2.0e9 * 0.8 / (per_request * 1.25 * 8) * 60)


def test_fails_orchestration_with_a_decoder_and_bad_numbers():
    decoder = ModelShape.preset("llama-3.1-8b")
    with pytest.raises(ConfigurationError) as error:
        plan_orchestration(RagTraffic(requests_per_s=1), decoder, answer_tokens=True, answer_seconds=math.inf)
    problems = error.value.problems
    assert len(problems) == 3
    assert "is a decoder" in problems[0] and "answer_tokens (True)" in problems[1]
    assert "answer_seconds (inf) must be a finite number" in problems[2]


def test_unknown_instance_type_names_the_known_sizes():
    with pytest.raises(UnknownInstanceTypeError, match=r"'m5.large' is not a CPU tier size \(known: c7g.xlarge"):
        cpu_tier.cpu_instance("m5.large")


def test_the_data_files_name_their_sources():
    import json
    from importlib import resources

    data = resources.files("genai_constructs.data")
    instances = json.loads(data.joinpath("cpu_instances.json").read_text())
    assert {"specs", "prices"} <= set(instances["sources"]) and instances["checked"] == "2026-12-01"
    assert all(row["price_source"] for row in instances["rows"])
    assert {r["family"] for r in instances["rows"]} >= {"c7g", "m7g"}
    query = json.loads(data.joinpath("query_embedding.json").read_text())
    assert query["source"].startswith("benchmarks/query_embedding.py") and query["caveats"]
