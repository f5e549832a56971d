"""plan_vector_store: each term computed by hand here from the published figures, and which one bound the class."""

from __future__ import annotations

import math

import pytest

from genai_constructs.errors import GenaiConstructsError
from genai_constructs.planner.vector_store import (
    VectorStoreDoesNotFitError,
    measured_queries_per_s_per_vcpu,
    plan_vector_store,
    vector_store_bytes,
)
from genai_constructs.workload import RagTraffic

GIB = 2**30


def test_row_and_index_model_is_at_least_what_was_measured() -> None:
    # benchmarks/vector_store_qps.py: 384 dims, 2,048 bytes of text: table 4,992 B/row, HNSW 2,048 B/row.
    table, index = vector_store_bytes(RagTraffic(requests_per_s=1, chunk_tokens=512, stored_chunks=1), 384)
    assert 4992 <= table <= 4992 * 1.1
    assert 2048 <= index <= 2048 * 1.1


def test_a_small_corpus_takes_the_smallest_graviton_class() -> None:
    # 100k rows x ~7.2 kB x 1.25 margin = 0.84 GiB, well inside half of db.r7g.large's 16 GiB.
    plan = plan_vector_store(RagTraffic(requests_per_s=50, stored_chunks=100_000), 384)
    assert (plan.instance_class, plan.readers_per_zone, plan.zones, plan.bound_by) == ("db.r7g.large", 1, 2, "minimum")


def test_a_corpus_that_does_not_fit_r7g_large_memory_picks_a_larger_class() -> None:
    # 1.5M rows x (5,118 + 2,125) B x 1.25 = 12.6 GiB > 8 GiB usable on r7g.large (16), <= 16 on r7g.xlarge (32).
    plan = plan_vector_store(RagTraffic(requests_per_s=50, stored_chunks=1_500_000), 384)
    assert 12.0 < plan.memory_needed_gib < 13.0
    assert (plan.instance_class, plan.bound_by) == ("db.r7g.xlarge", "memory")
    assert plan.memory_usable_gib == 16.0


def test_huge_retrieved_bytes_carry_every_byte_within_capacity() -> None:
    # 3,000 answers/s x 16 chunks x 512 tokens x 4 B = 98 MB/s of text; one zone carries all of it on failover, /0.7
    # for headroom: at least 140 MB/s, which r7g.large (58.6 MB/s: half its 0.937 Gbps baseline) cannot carry.
    plan = plan_vector_store(RagTraffic(requests_per_s=3000, top_k=16, stored_chunks=100_000), 384)
    assert plan.network_bytes_per_s_needed >= 3000 * 16 * 512 * 4.0 / 0.7
    assert plan.network_bytes_per_s_needed <= plan.network_bytes_per_s_capacity
    assert plan.instance_class != "db.r7g.large" and plan.bound_by in ("network", "queries")


def test_a_top_k_of_forty_is_network_bound() -> None:
    # 200 answers/s x 40 chunks x 2,048 B = 16.4 MB/s, x 1/0.7 = 23.4 MB/s + framing; queries only 286/s.
    # r7g.large: network half-baseline 58.6 MB/s holds it; make the chunks 8x longer (4,096 tokens) -> 187 MB/s.
    traffic = RagTraffic(requests_per_s=200, top_k=40, chunk_tokens=4096, stored_chunks=10_000)
    plan = plan_vector_store(traffic, 384)
    assert plan.bound_by == "network"
    assert plan.queries_per_s_needed == pytest.approx(200 / 0.7)
    # 187 MB/s needs r7g.2xlarge (3.75 Gbps -> 234 MB/s); r7g.xlarge offers 117 MB/s.
    assert plan.instance_class == "db.r7g.2xlarge"


def test_query_capacity_uses_the_measured_rate_per_vcpu() -> None:
    plan = plan_vector_store(RagTraffic(requests_per_s=50, stored_chunks=100_000), 384)
    assert plan.queries_per_s_capacity == 2 * measured_queries_per_s_per_vcpu()
    assert plan.queries_per_s_needed == pytest.approx(50 / 0.7)


def test_three_zones_each_carry_half_the_load() -> None:
    plan = plan_vector_store(RagTraffic(requests_per_s=70, stored_chunks=100_000), 384, zones=3)
    assert plan.zone_share == 0.5 and plan.queries_per_s_needed == pytest.approx(70 * 0.5 / 0.7)
    assert plan.reader_instances == 3


def test_fails_when_no_class_holds_the_corpus() -> None:
    # 200M rows x 7.2 kB = 1.3 TiB x 1.25: beyond half of db.r7g.16xlarge's 512 GiB.
    with pytest.raises(VectorStoreDoesNotFitError, match=r"db\.r7g\.16xlarge offers 256 GiB usable.*shard"):
        plan_vector_store(RagTraffic(requests_per_s=1, stored_chunks=200_000_000), 384)


def test_fails_when_the_load_needs_more_readers_than_a_cluster_has() -> None:
    # 1M answers/s: 1.43M queries/s per zone / (64 x 433) = 52 readers per zone > 15 // 2.
    with pytest.raises(VectorStoreDoesNotFitError, match="at most 15 readers"):
        plan_vector_store(RagTraffic(requests_per_s=1_000_000, stored_chunks=100_000), 384)


def test_a_given_class_that_is_too_small_names_the_fix() -> None:
    with pytest.raises(VectorStoreDoesNotFitError, match="instance_class=None"):
        plan_vector_store(RagTraffic(requests_per_s=1, stored_chunks=5_000_000), 384, instance_class="db.r7g.large")


@pytest.mark.parametrize(("dimension", "words"), [(0, "from 1 to 2000"), (True, "not a bool"), (math.nan, "float")])
def test_fails_on_a_bad_dimension(dimension: object, words: str) -> None:
    with pytest.raises(GenaiConstructsError, match="dimension") as raised:
        plan_vector_store(RagTraffic(requests_per_s=1), dimension)  # type: ignore[arg-type]
    assert words in str(raised.value)


def test_fails_on_traffic_of_the_wrong_type() -> None:
    with pytest.raises(GenaiConstructsError, match="must be a RagTraffic"):
        plan_vector_store({"requests_per_s": 1}, 384)  # type: ignore[arg-type]
