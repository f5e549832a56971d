"""pgvector HNSW top-k throughput per backend (one vCPU), and the loader's rows/s: the figure the vector store's sizing
(``genai_constructs.planner.vector_store``) divides a request rate by.

Everything is real and on 127.0.0.1: one PostgreSQL + pgvector server (pgserver's binaries, via
``genai_constructs.testing.local_postgres``), loaded with ``--rows`` chunks through the library's own loader
(``runtime.vector_store.load_outputs``: batched upserts, then the HNSW cosine index built once the rows are in), each
chunk ``--text-bytes`` of text beside a ``--dimension`` unit vector. Vectors are random directions around
``--clusters`` centres (a corpus has topics; uniformly random vectors are HNSW's worst case and not what a real
encoder produces).

* Load: rows/s through ``load_outputs`` (upserts plus the index build, wall clock), as a first load runs it.
* Queries: ``--queries`` top-``--top-k`` searches (``runtime.vector_store.top_k``, ef_search at pgvector's default
  40) one after another on ONE connection, after ``--warmup`` unmeasured ones. One connection is one PostgreSQL
  backend process, which runs one query at a time on one CPU (PostgreSQL "process per user" model,
  https://www.postgresql.org/docs/current/tutorial-arch.html), so queries/s on one connection is queries/s per vCPU
  of the database instance. It is taken as 1 / mean time of the ``top_k`` call, which also holds the loopback round
  trip and psycopg's parsing of the rows: a lower bound for the backend, the safe side for sizing. The vector's
  conversion to a list is timed apart and left out.

Run: .venv/bin/python benchmarks/vector_store_qps.py   (about 2-3 minutes on a 2-core machine; the last line is the
figure)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import psycopg  # noqa: E402

from genai_constructs.runtime.vector_store import DEFAULT_TABLE, load_outputs, top_k  # noqa: E402
from genai_constructs.testing.local_postgres import LocalPostgres  # noqa: E402

CHUNKS_PER_DOCUMENT = 20
"""Chunks per synthetic source document (the loader reads each source once for all its chunks)."""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def corpus(rows: int, dimension: int, clusters: int, seed: int) -> np.ndarray:
    """``rows`` unit vectors scattered around ``clusters`` random centres (float32)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, dimension)).astype(np.float32)
    vectors = centres[rng.integers(0, clusters, rows)] + 0.6 * rng.standard_normal((rows, dimension)).astype(
        np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors


def output_objects(vectors: np.ndarray, text_bytes: int, seed: int,
                   ) -> tuple[Iterator[tuple[str, str]], dict[str, str]]:
    """The batch worker's ``*.embeddings.jsonl`` objects for ``vectors``, and the source documents they cut.

    The text is random lower-case letters and spaces: PostgreSQL compresses long text (TOAST), and a repeated letter
    would shrink to nothing and understate the table; random letters barely compress, the safe side for sizing."""
    rng = np.random.default_rng(seed)
    alphabet = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz     ", dtype=np.uint8)
    documents: dict[str, str] = {}
    count = len(vectors)
    for first in range(0, count, CHUNKS_PER_DOCUMENT):
        letters = alphabet[rng.integers(0, len(alphabet), text_bytes * CHUNKS_PER_DOCUMENT)]
        documents[f"s3://bench/doc-{first // CHUNKS_PER_DOCUMENT}.txt"] = letters.tobytes().decode()

    def objects() -> Iterator[tuple[str, str]]:
        for first in range(0, count, CHUNKS_PER_DOCUMENT):
            source = f"s3://bench/doc-{first // CHUNKS_PER_DOCUMENT}.txt"
            lines = []
            for chunk, row in enumerate(range(first, min(count, first + CHUNKS_PER_DOCUMENT))):
                lines.append(json.dumps({
                    "source": source, "etag": '"bench"', "model": "bench", "chunk": chunk,
                    "start": chunk * text_bytes, "end": (chunk + 1) * text_bytes,
                    "embedding": [round(float(v), 6) for v in vectors[row]]}))
            yield f"{source}.embeddings.jsonl", "\n".join(lines) + "\n"

    return objects(), documents


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dimension", type=int, default=384)
    parser.add_argument("--text-bytes", type=int, default=2048, help="chunk text: 512 tokens x 4 bytes")
    parser.add_argument("--clusters", type=int, default=200)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    vectors = corpus(args.rows, args.dimension, args.clusters, args.seed)
    queries = corpus(args.queries + args.warmup, args.dimension, args.clusters, args.seed + 1)
    objects, documents = output_objects(vectors, args.text_bytes, args.seed)

    with LocalPostgres() as server, psycopg.connect(server.conninfo, autocommit=True) as connection:
        # Room for the index build in memory (pgvector: "Indexes build significantly faster when the graph fits into
        # maintenance_work_mem", https://github.com/pgvector/pgvector#index-build-time); Aurora's default is larger.
        connection.execute("SET maintenance_work_mem = '1GB'")
        started = time.perf_counter()
        report = load_outputs(connection, objects, lambda source: (documents[source], '"bench"'),
                              dimension=args.dimension)
        load_s = time.perf_counter() - started
        total_bytes, index_bytes = connection.execute(
            "SELECT pg_total_relation_size(%s), pg_relation_size(%s)",
            (DEFAULT_TABLE, f"{DEFAULT_TABLE}_embedding_hnsw")).fetchone()
        table_bytes = total_bytes - index_bytes  # heap, TOAST and the two btrees (id, (source, chunk))
        print(f"loaded {report.records} rows in {load_s:.1f} s ({report.records / load_s:,.0f} rows/s, index build "
              f"included); table with TOAST and btrees {table_bytes / 2**20:.0f} MiB "
              f"({table_bytes / report.records:,.0f} B/row), HNSW index {index_bytes / 2**20:.0f} MiB "
              f"({index_bytes / report.records:,.0f} B/row)", flush=True)

        for query in queries[: args.warmup]:
            top_k(connection, query.tolist(), args.top_k)
        latencies_ms: list[float] = []
        client_s = 0.0
        loop_started = time.perf_counter()
        for query in queries[args.warmup:]:
            prepared = time.perf_counter()
            as_list = query.tolist()
            sent = time.perf_counter()
            chunks = top_k(connection, as_list, args.top_k)
            done = time.perf_counter()
            client_s += sent - prepared
            latencies_ms.append((done - sent) * 1000)
            assert len(chunks) == args.top_k
        loop_s = time.perf_counter() - loop_started

    measured = len(latencies_ms)
    busy_s = sum(latencies_ms) / 1000
    qps_per_backend = measured / busy_s
    print(f"{measured} top-{args.top_k} queries on one connection: p50 {percentile(latencies_ms, 0.5):.2f} ms, "
          f"p99 {percentile(latencies_ms, 0.99):.2f} ms, mean {statistics.fmean(latencies_ms):.2f} ms; loop "
          f"{measured / loop_s:,.0f} queries/s including {client_s * 1000 / measured:.3f} ms/query of client work")
    print(f"FIGURE: {qps_per_backend:,.0f} HNSW top-{args.top_k} queries/s per backend (vCPU), "
          f"{args.rows:,} rows x {args.dimension} dims, ef_search 40; load {report.records / load_s:,.0f} rows/s")


if __name__ == "__main__":
    main()
