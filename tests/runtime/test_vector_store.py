"""The vector store loader and search against real PostgreSQL + pgvector servers on 127.0.0.1 (pgserver's binaries).

The corpus is written in the batch worker's own output format (see ``retrieval_fixtures``); nothing is mocked.
"""

from __future__ import annotations

import json
import math

import pytest

from genai_constructs.runtime.batch_worker import OUTPUT_SUFFIX, chunk_text, output_lines
from genai_constructs.runtime.encoders import HashingEncoder
from genai_constructs.runtime.vector_store import (
    VectorStoreError,
    create_schema,
    load_outputs,
    parse_output_object,
    top_k,
)
from tests.runtime.retrieval_fixtures import DIMENSION, DOCUMENTS, ETAGS, Readers, psycopg, readers  # noqa: F401


def _count(server_conninfo: str, table: str = "rag_chunks") -> int:
    with psycopg.connect(server_conninfo) as connection:
        row = connection.execute(f"SELECT count(*) FROM {table}").fetchone()
    assert row is not None
    return int(row[0])


def _cosine_distance(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return 1.0 - dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def test_every_chunk_is_loaded_into_both_readers(readers: Readers) -> None:  # noqa: F811
    assert _count(readers.local.conninfo) == len(readers.corpus.chunks) == _count(readers.other.conninfo)
    with psycopg.connect(readers.local.conninfo) as connection:
        rows = dict(connection.execute("SELECT id, content FROM rag_chunks").fetchall())
    assert rows == readers.corpus.chunks  # the text is the source's slice at the worker's offsets


def test_reloading_the_same_objects_adds_and_rewrites_nothing(readers: Readers) -> None:  # noqa: F811
    before = _count(readers.local.conninfo)
    with psycopg.connect(readers.local.conninfo) as connection:
        report = load_outputs(connection, readers.corpus.objects, readers.corpus.read_source, dimension=DIMENSION)
    assert report.records == before
    assert report.rows_written == 0 and report.rows_removed == 0
    assert _count(readers.local.conninfo) == before


def test_top_k_is_the_exact_nearest_chunks_in_order(readers: Readers) -> None:  # noqa: F811
    corpus = readers.corpus
    chunk_id, text = sorted(corpus.chunks.items())[3]
    query = corpus.encoder.encode([text], batch_size=1)[0]
    vectors = dict(zip(corpus.chunks, corpus.encoder.encode(list(corpus.chunks.values()), batch_size=64),
                       strict=True))
    expected = sorted(vectors, key=lambda cid: _cosine_distance(query, vectors[cid]))[:5]
    with psycopg.connect(readers.local.conninfo) as connection:
        found = top_k(connection, query, 5)
    assert found[0].id == chunk_id and found[0].distance == pytest.approx(0.0, abs=1e-5)
    assert [c.id for c in found] == expected
    assert [c.distance for c in found] == sorted(c.distance for c in found)


def test_top_k_above_the_hnsw_default_candidate_list_returns_every_row(readers: Readers) -> None:  # noqa: F811
    # 45 > hnsw.ef_search's default 40: without SET LOCAL the index scan would stop at 40 rows.
    rows = len(readers.corpus.chunks)
    assert rows < 45
    with psycopg.connect(readers.local.conninfo) as connection:
        assert len(top_k(connection, [1.0] * DIMENSION, 45)) == rows
        assert connection.execute("SHOW hnsw.ef_search").fetchone() == ("40",)  # SET LOCAL did not outlive it


def test_a_document_re_embedded_into_fewer_chunks_loses_its_extra_rows(readers: Readers) -> None:  # noqa: F811
    encoder = HashingEncoder(DIMENSION)
    source = "s3://corpus/docs/shrinks.txt"
    texts = {"long": " ".join(f"w{i}" for i in range(90)), "short": " ".join(f"w{i}" for i in range(20))}

    def output(version: str) -> tuple[str, str]:
        pieces = chunk_text(texts[version], chunk_tokens=CHUNK_TOKENS_SMALL)
        lines = output_lines(source, f'"{version}"', encoder.name, pieces, encoder.encode([p.text for p in pieces],
                                                                                           batch_size=8))
        return "shrinks" + OUTPUT_SUFFIX, "\n".join(lines)

    with psycopg.connect(readers.local.conninfo) as connection:
        first = load_outputs(connection, [output("long")], lambda s: (texts["long"], '"long"'),
                             dimension=DIMENSION, table="shrinking")
        second = load_outputs(connection, [output("short")], lambda s: (texts["short"], '"short"'),
                              dimension=DIMENSION, table="shrinking")
    assert first.records > second.records
    assert second.rows_removed == first.records - second.records
    assert _count(readers.local.conninfo, "shrinking") == second.records


CHUNK_TOKENS_SMALL = 20


def test_a_source_changed_since_it_was_embedded_is_skipped_not_mis_sliced(readers: Readers) -> None:  # noqa: F811
    name, text = readers.corpus.objects[0]
    source = next(iter(DOCUMENTS))
    with psycopg.connect(readers.local.conninfo) as connection:
        report = load_outputs(connection, [(name, text)], lambda s: ("new text", '"a-new-etag"'),
                              dimension=DIMENSION, table="changed_sources")
    assert report.records == 0 and len(report.skipped_sources) == 1
    assert source in report.skipped_sources[0] and ETAGS[source] in report.skipped_sources[0]


def test_bad_input_names_the_problem_and_the_fix(readers: Readers) -> None:  # noqa: F811
    with pytest.raises(VectorStoreError, match=r"line 2 is not a batch worker output line"):
        parse_output_object("x" + OUTPUT_SUFFIX, json.dumps({"source": "s", "model": "m", "chunk": 0, "start": 0,
                                                              "end": 1, "embedding": [1.0]}) + "\n{not json}\n")
    with psycopg.connect(readers.local.conninfo) as connection:
        with pytest.raises(VectorStoreError, match=r"has 32 dimensions, not 8; give dimension=32"):
            load_outputs(connection, readers.corpus.objects[:1], readers.corpus.read_source, dimension=8,
                         table="wrong_dimension")
        with pytest.raises(VectorStoreError, match=r"table='Bad-Name' is not a lower-case SQL identifier"):
            create_schema(connection, dimension=DIMENSION, table="Bad-Name")
        with pytest.raises(VectorStoreError, match=r"holds 32-dimensional vectors, not 16"):
            create_schema(connection, dimension=16)
        with pytest.raises(VectorStoreError, match=r"top_k=0 is not a whole number from 1 to 1000"):
            top_k(connection, [1.0] * DIMENSION, 0)


def test_the_hnsw_index_exists_after_a_first_load_and_serves_the_search(readers: Readers) -> None:  # noqa: F811
    with psycopg.connect(readers.other.conninfo) as connection:
        indexes = {row[0] for row in connection.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'rag_chunks'").fetchall()}
        connection.execute("SET enable_seqscan = off")  # so the plan shows the index is usable, even on 30 rows
        plan = "\n".join(row[0] for row in connection.execute(
            "EXPLAIN SELECT id FROM rag_chunks ORDER BY embedding <=> %s::vector LIMIT 3",
            (str([1.0] * DIMENSION),)).fetchall())
    assert "rag_chunks_embedding_hnsw" in indexes
    assert "rag_chunks_embedding_hnsw" in plan
