"""The retrieval tier's store: the embedding fleet's output loaded into PostgreSQL with pgvector, and top-k search.

What is loaded. The batch worker (``genai_constructs.runtime.batch_worker``) writes one ``<key>.embeddings.jsonl``
object per source document, one JSON line per chunk::

    {"source": "s3://bucket/docs/a.txt", "etag": "\\"9b2c...\\"", "model": "all-MiniLM-L6-v2",
     "chunk": 0, "start": 0, "end": 1843, "embedding": [0.0123, ...]}

It does not carry the chunk's text, only its character offsets in the source; the loader reads each source document
once (``read_source``) and stores ``text[start:end]`` beside the vector, so the request path never reads S3. A source
whose ETag is no longer the one the vectors were computed from is skipped and reported: its offsets would cut the
new text in the wrong places (S3 changes an object's ETag whenever its content changes, "The ETag reflects changes
only to the contents of an object", https://docs.aws.amazon.com/AmazonS3/latest/API/API_Object.html).

Pre-cut chunks. Output of chunks the CPU preprocessing tier cut (``preprocess_worker``) carries each chunk's ``text``
and the document's ``chunks_total``::

    {"source": "s3://raw/docs/a.pdf", "etag": "\"...\"", "model": "...", "chunk": 300, "chunks_total": 412,
     "start": 90211, "end": 91390, "text": "...", "embedding": [...]}

Such a record is stored with its own text: no source read and no ETag check, since the text is the very string the
vector was computed from (its offsets are into the *extracted* text of a PDF or HTML page, which a raw read could not
reproduce), so the row is consistent whatever the source became since. One document's chunks arrive in several
objects (parts), so the rows removed when a document shrinks are those of chunk ``>= chunks_total``, never the chunks
of the document's other parts.

Idempotent. A row's id is ``<source>#<chunk>``, stable across re-runs and re-embeddings of the same document, and
each row is upserted with ``INSERT ... ON CONFLICT (id) DO UPDATE ... WHERE`` the stored row differs ("ON CONFLICT
DO UPDATE guarantees an atomic INSERT or UPDATE outcome", https://www.postgresql.org/docs/current/sql-insert.html):
loading the same objects twice leaves the row count, and the rows, as they were, and rewrites nothing. A document
re-embedded into fewer chunks loses its extra rows in the same transaction.

Batched. Rows go in ``batch_rows`` at a time with psycopg's ``executemany``, which sends them in pipeline mode (one
round trip per batch, not per row; https://www.psycopg.org/psycopg3/docs/advanced/pipeline.html), each batch its own
transaction so a failed load resumes where it stopped.

Index. HNSW (``vector_cosine_ops``), not IVFFlat. pgvector: HNSW "has better query performance than IVFFlat (in terms
of speed-recall tradeoff), but has slower build times and uses more memory. Also, an index can be created without any
data in the table since there isn't a training step like IVFFlat" (https://github.com/pgvector/pgvector#hnsw). The
table is created empty and filled incrementally by every batch run, so IVFFlat's lists would be trained on no data
(or on the first run's) and its recall would drift as the corpus grows; HNSW stays right as rows arrive (a first load into an empty table still builds it
after the rows, which is several times faster; see :func:`load_outputs`). Cosine
distance (``<=>``) ranks correctly whether or not the encoder normalised its vectors (the library's encoders do, where
inner product would be as good and a little cheaper).

Search. ``ORDER BY embedding <=> %s LIMIT k`` is the form the index serves (pgvector: "Supported distance functions
... <=> cosine distance", and an index is used for ``ORDER BY ... LIMIT``). An HNSW scan returns at most
``hnsw.ef_search`` rows, 40 by default, so a query for more raises it for its own transaction (``SET LOCAL``;
https://github.com/pgvector/pgvector#query-options).

The driver is psycopg 3 (``psycopg[binary]``); vectors travel as pgvector's text form (``'[1,2,3]'::vector``), so
the ``pgvector`` Python package is not needed.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from genai_constructs.errors import GenaiConstructsError
from genai_constructs.runtime.batch_worker import OUTPUT_SUFFIX

__all__ = [
    "DEFAULT_BATCH_ROWS",
    "DEFAULT_TABLE",
    "MAX_TOP_K",
    "EmbeddingRecord",
    "LoadReport",
    "RetrievedChunk",
    "VectorStoreError",
    "chunk_id",
    "create_schema",
    "load_outputs",
    "parse_output_object",
    "rows_to_chunks",
    "search_sql",
    "top_k",
    "top_k_async",
    "top_k_statements",
    "vector_literal",
]

DEFAULT_TABLE = "rag_chunks"
DEFAULT_BATCH_ROWS = 500
"""Rows per transaction: 500 rows of 1024 floats are ~5 MB of SQL text, one pipeline round trip, a short lock."""
MAX_TOP_K = 1000
"""The most chunks one query may ask for; a prompt holds far fewer, and ef_search above 1000 is pgvector's maximum."""
HNSW_DEFAULT_EF_SEARCH = 40
"""pgvector's default ``hnsw.ef_search``: an HNSW scan returns at most this many rows unless it is raised."""
MAX_DIMENSION = 16000
"""pgvector's ``vector`` type holds up to 16,000 dimensions; an HNSW index up to 2,000 (the table checks the first)."""
MAX_HNSW_DIMENSION = 2000

_TABLE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,50}")


class VectorStoreError(GenaiConstructsError):
    """Bad input to the loader or the search: a malformed output line, a wrong dimension, a bad table name."""


@dataclass(frozen=True)
class EmbeddingRecord:
    """One line of a ``*.embeddings.jsonl`` object."""

    source: str
    etag: str
    model: str
    chunk: int
    start: int
    end: int
    embedding: tuple[float, ...]
    text: str | None = None
    """The chunk's text, when the output carries it (pre-cut chunks); None: a slice of the source at the offsets."""
    chunks_total: int | None = None
    """The source's chunk count, when the output carries it: rows of chunk >= it are removed."""

    @property
    def id(self) -> str:
        return chunk_id(self.source, self.chunk)


@dataclass(frozen=True)
class RetrievedChunk:
    id: str
    source: str
    chunk: int
    text: str
    distance: float


@dataclass
class LoadReport:
    """What a load did; ``rows_written`` counts inserts and real updates (an unchanged row is not rewritten)."""

    objects: int = 0
    records: int = 0
    rows_written: int = 0
    rows_removed: int = 0
    skipped_sources: list[str] = field(default_factory=list)
    """Sources changed since they were embedded (ETag differs) or unreadable, with the reason."""


def chunk_id(source: str, chunk: int) -> str:
    """The row id of a chunk: its source URI and index, stable across re-runs (so an upsert replaces, never adds)."""
    return f"{source}#{chunk}"


def _check_table(table: str) -> str:
    if not isinstance(table, str) or not _TABLE_NAME.fullmatch(table):
        raise VectorStoreError(f"table={table!r} is not a lower-case SQL identifier of at most 51 characters "
                               f"(letters, digits, _); give e.g. table={DEFAULT_TABLE!r}")
    return table


def _check_dimension(dimension: object) -> int:
    if isinstance(dimension, bool) or not isinstance(dimension, int) or not 1 <= dimension <= MAX_HNSW_DIMENSION:
        raise VectorStoreError(f"dimension={dimension!r} is not a whole number from 1 to {MAX_HNSW_DIMENSION} (the "
                               "largest vector an HNSW index takes); give the encoder's dimension, e.g. 384")
    return dimension


def vector_literal(vector: Sequence[float]) -> str:
    """pgvector's text form of a vector, ``[x1,x2,...]``; ``repr`` keeps every float exactly."""
    return "[" + ",".join(repr(float(x)) for x in vector) + "]"


def parse_output_object(name: str, text: str) -> list[EmbeddingRecord]:
    """The records of one output object; a malformed line is an error naming the object and the line."""
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            record = EmbeddingRecord(
                source=str(raw["source"]), etag=str(raw.get("etag", "")), model=str(raw["model"]),
                chunk=int(raw["chunk"]), start=int(raw["start"]), end=int(raw["end"]),
                embedding=tuple(float(x) for x in raw["embedding"]),
                text=None if raw.get("text") is None else str(raw["text"]),
                chunks_total=None if raw.get("chunks_total") is None else int(raw["chunks_total"]),
            )
        except (ValueError, KeyError, TypeError) as error:
            raise VectorStoreError(f"{name} line {number} is not a batch worker output line ({type(error).__name__}: "
                                   f"{error}); load only the objects the embedding fleet wrote (*{OUTPUT_SUFFIX})"
                                   ) from None
        if not all(math.isfinite(x) for x in record.embedding) or not 0 <= record.start <= record.end:
            raise VectorStoreError(f"{name} line {number} has a non-finite embedding or bad offsets; re-run the "
                                   "embedding batch for its source")
        records.append(record)
    return records


def create_schema(connection: Any, *, dimension: int, table: str = DEFAULT_TABLE, vector_index: bool = True) -> None:
    """The extension, the table and its indexes, each created only if missing (so every load may call it).

    ``vector_index=False`` leaves the HNSW index out (a first load builds it once its rows are in)."""
    table = _check_table(table)
    dimension = _check_dimension(dimension)
    with connection.transaction():
        connection.execute("CREATE EXTENSION IF NOT EXISTS vector")
        connection.execute(
            f"CREATE TABLE IF NOT EXISTS {table} ("
            " id text PRIMARY KEY, source text NOT NULL, etag text NOT NULL, model text NOT NULL,"
            " chunk integer NOT NULL, start_char integer NOT NULL, end_char integer NOT NULL, content text NOT NULL,"
            f" embedding vector({dimension}) NOT NULL)")
        if vector_index:
            _create_vector_index(connection, table)
        # Replacing a re-embedded document deletes its chunks past the new count: by source, not a table scan.
        connection.execute(f"CREATE INDEX IF NOT EXISTS {table}_source ON {table} (source, chunk)")
        row = connection.execute(
            "SELECT atttypmod FROM pg_attribute WHERE attrelid = %s::regclass AND attname = 'embedding'",
            (table,)).fetchone()
    if row is not None and int(row[0]) != dimension:
        raise VectorStoreError(f"table {table} holds {row[0]}-dimensional vectors, not {dimension}; load this "
                               "encoder's output into a table of its own (table=...) or drop the old one")


def _create_vector_index(connection: Any, table: str) -> None:
    connection.execute(f"CREATE INDEX IF NOT EXISTS {table}_embedding_hnsw ON {table} "
                       "USING hnsw (embedding vector_cosine_ops)")


def _upsert_sql(table: str) -> str:
    # WHERE ... IS DISTINCT FROM: a re-load of unchanged rows updates nothing (no dead tuples, no index churn).
    return (
        f"INSERT INTO {table} AS t (id, source, etag, model, chunk, start_char, end_char, content, embedding) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s::vector) "
        "ON CONFLICT (id) DO UPDATE SET etag = EXCLUDED.etag, model = EXCLUDED.model, "
        "start_char = EXCLUDED.start_char, end_char = EXCLUDED.end_char, content = EXCLUDED.content, "
        "embedding = EXCLUDED.embedding "
        "WHERE (t.etag, t.model, t.start_char, t.end_char, t.content, t.embedding) IS DISTINCT FROM "
        "(EXCLUDED.etag, EXCLUDED.model, EXCLUDED.start_char, EXCLUDED.end_char, EXCLUDED.content, EXCLUDED.embedding)"
    )


def _rows_for(records: list[EmbeddingRecord], text: str | None) -> list[tuple[Any, ...]]:
    """Rows of one source's records: each record's own text where it has one, else the source's slice."""
    return [(r.id, r.source, r.etag, r.model, r.chunk, r.start, r.end,
             r.text if r.text is not None else (text or "")[r.start:r.end], vector_literal(r.embedding))
            for r in records]


def load_outputs(
    connection: Any,
    objects: Iterable[tuple[str, str]],
    read_source: Callable[[str], tuple[str, str]],
    *,
    dimension: int,
    table: str = DEFAULT_TABLE,
    batch_rows: int = DEFAULT_BATCH_ROWS,
) -> LoadReport:
    """Upsert the chunks of every output object into ``table``; safe to re-run (see the module's doc).

    :param connection: a psycopg 3 ``Connection`` to the writer (autocommit off or on: batches are transactions).
    :param objects: ``(name, text)`` of each ``*.embeddings.jsonl`` object (the name is for messages).
    :param read_source: ``source URI -> (text, etag)`` of the document the vectors came from (S3 GetObject's body
        decoded as UTF-8, as the worker did, and its ``ETag``); raising ``OSError`` or ``KeyError`` skips the source.
        Not called for records that carry their ``text`` (pre-cut chunks).
    """
    table = _check_table(table)
    dimension = _check_dimension(dimension)
    if isinstance(batch_rows, bool) or not isinstance(batch_rows, int) or batch_rows < 1:
        raise VectorStoreError(f"batch_rows={batch_rows!r} is not a whole number of at least 1; give e.g. "
                               f"batch_rows={DEFAULT_BATCH_ROWS}")
    # A first load (an empty table) builds the HNSW index after its rows are in: pgvector, "it's faster to create the
    # index after loading your initial data" (https://github.com/pgvector/pgvector#index-build-time); measured here,
    # 1,000 rows of 384 dimensions load in 0.3 s and index in 0.25 s, against 3.1 s inserted into the index row by
    # row. Later loads are incremental and keep the index. A first load that fails midway leaves rows without the
    # index; the next load finds the table not empty, so it creates the index before loading.
    create_schema(connection, dimension=dimension, table=table, vector_index=False)
    with connection.transaction():
        first_load = connection.execute(f"SELECT NOT EXISTS (SELECT 1 FROM {table})").fetchone()[0]
        if first_load:
            connection.execute(f"DROP INDEX IF EXISTS {table}_embedding_hnsw")
        else:
            _create_vector_index(connection, table)
    report = LoadReport()
    upsert = _upsert_sql(table)
    pending: list[tuple[Any, ...]] = []
    trims: list[tuple[str, int]] = []

    def flush() -> None:
        if not pending and not trims:
            return
        with connection.transaction(), connection.cursor() as cursor:
            if pending:
                cursor.executemany(upsert, pending, returning=False)
                report.rows_written += max(cursor.rowcount, 0)
            for source, count in trims:
                cursor.execute(f"DELETE FROM {table} WHERE source = %s AND chunk >= %s", (source, count))
                report.rows_removed += max(cursor.rowcount, 0)
        pending.clear()
        trims.clear()

    for name, text in objects:
        report.objects += 1
        records = parse_output_object(name, text)
        by_source: dict[str, list[EmbeddingRecord]] = {}
        for record in records:
            if len(record.embedding) != dimension:
                raise VectorStoreError(f"{name} chunk {record.chunk} has {len(record.embedding)} dimensions, not "
                                       f"{dimension}; give dimension={len(record.embedding)} (the encoder's) or load "
                                       "this model's output into a table of its own")
            by_source.setdefault(record.source, []).append(record)
        for source, mine in by_source.items():
            if all(r.text is not None for r in mine):
                report.records += len(mine)
                pending.extend(_rows_for(mine, None))
                totals = {r.chunks_total for r in mine if r.chunks_total is not None}
                if totals:  # a part of a document: trim past the whole document's count, never its other parts
                    trims.append((source, min(totals)))
                if len(pending) >= batch_rows:
                    flush()
                continue
            try:
                document, etag = read_source(source)
            except (OSError, KeyError) as error:
                report.skipped_sources.append(f"{source}: unreadable ({type(error).__name__}: {error})")
                continue
            stale = {r.etag for r in mine if r.etag and r.etag != etag}
            if stale:
                report.skipped_sources.append(f"{source}: changed since it was embedded (ETag {etag}, vectors from "
                                              f"{sorted(stale)[0]}); re-embed it")
                continue
            report.records += len(mine)
            pending.extend(_rows_for(mine, document))
            trims.append((source, max(r.chunk for r in mine) + 1))
            if len(pending) >= batch_rows:
                flush()
    flush()
    if first_load:
        with connection.transaction():
            _create_vector_index(connection, table)
    return report


def search_sql(table: str = DEFAULT_TABLE) -> str:
    table = _check_table(table)
    return (f"SELECT id, source, chunk, content, embedding <=> %s::vector AS distance FROM {table} "
            "ORDER BY distance LIMIT %s")


def _check_top_k(k: object) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_TOP_K:
        raise VectorStoreError(f"top_k={k!r} is not a whole number from 1 to {MAX_TOP_K}; give e.g. top_k=4")
    return k


def top_k_statements(query: Sequence[float], k: int, table: str = DEFAULT_TABLE,
                     ) -> Iterator[tuple[str, tuple[Any, ...]]]:
    """The statements of one search, in order (shared by the blocking and the asyncio callers)."""
    k = _check_top_k(k)
    if k > HNSW_DEFAULT_EF_SEARCH:
        # SET LOCAL lasts for the transaction only, so a pooled connection goes back with the default.
        yield f"SET LOCAL hnsw.ef_search = {int(k)}", ()
    yield search_sql(table), (vector_literal(query), k)


def rows_to_chunks(rows: Iterable[Sequence[Any]]) -> list[RetrievedChunk]:
    return [RetrievedChunk(id=str(r[0]), source=str(r[1]), chunk=int(r[2]), text=str(r[3]), distance=float(r[4]))
            for r in rows]


def top_k(connection: Any, query: Sequence[float], k: int, *, table: str = DEFAULT_TABLE) -> list[RetrievedChunk]:
    """The ``k`` chunks nearest ``query`` (cosine distance, nearest first), on a psycopg 3 ``Connection``."""
    rows: list[Any] = []
    with connection.transaction(), connection.cursor() as cursor:
        for sql, params in top_k_statements(query, k, table):
            cursor.execute(sql, params or None)
        rows = cursor.fetchall()
    return rows_to_chunks(rows)


async def top_k_async(connection: Any, query: Sequence[float], k: int, *, table: str = DEFAULT_TABLE,
                      ) -> list[RetrievedChunk]:
    """:func:`top_k` on a psycopg 3 ``AsyncConnection`` (the orchestrator's request path).

    On an autocommit connection a query for at most ``hnsw.ef_search`` rows is one statement, one round trip: no
    BEGIN/COMMIT around it (two round trips more, on the critical path of every answer). A larger ``k`` needs its
    ``SET LOCAL``, so it runs in a transaction.
    """
    statements = list(top_k_statements(query, k, table))
    if len(statements) == 1 and connection.autocommit:
        async with connection.cursor() as cursor:
            await cursor.execute(*statements[0])
            return rows_to_chunks(await cursor.fetchall())
    async with connection.transaction(), connection.cursor() as cursor:
        for sql, params in statements:
            await cursor.execute(sql, params or None)
        rows = await cursor.fetchall()
    return rows_to_chunks(rows)


if __name__ == "__main__":
    # ``python -m genai_constructs.runtime.vector_store load-queue|load-s3 ...`` is the loader service
    # (genai_constructs.runtime.vector_loader, where its command line is documented).
    import sys

    from genai_constructs.runtime.vector_loader import main

    sys.exit(main())
