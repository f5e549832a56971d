"""Two real PostgreSQL + pgvector servers on 127.0.0.1 (two zones' readers) and a corpus in the worker's format.

The corpus goes through the batch worker's own chunker and output format (``chunk_text``, ``output_lines``) with the
hashing encoder, so what the loader reads is byte for byte what the embedding fleet writes, and a query equal to a
chunk's text embeds to exactly that chunk's vector (a known nearest neighbour).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

pytest.importorskip("pgserver", reason="pgserver ships the PostgreSQL + pgvector binaries these tests run")
psycopg = pytest.importorskip("psycopg")

from genai_constructs.runtime.batch_worker import OUTPUT_SUFFIX, chunk_text, output_lines  # noqa: E402
from genai_constructs.runtime.encoders import HashingEncoder  # noqa: E402
from genai_constructs.runtime.vector_store import load_outputs  # noqa: E402
from genai_constructs.testing.local_postgres import LocalPostgres  # noqa: E402

DIMENSION = 32
LOCAL_ZONE = "us-east-1a"
OTHER_ZONE = "us-east-1b"
TOPICS = ["aurora replicas", "spot interruptions", "vllm batching", "hnsw indexes", "nat gateways", "sqs visibility"]
DOCUMENTS = {
    f"s3://corpus/docs/{n}.txt": " ".join(f"{topic} paragraph {n}-{i} about {topic} word{i}" for i in range(12))
    for n, topic in enumerate(TOPICS)
}
ETAGS = {source: f'"etag-{n}"' for n, source in enumerate(DOCUMENTS)}
CHUNK_TOKENS = 24


@dataclass
class Corpus:
    objects: list[tuple[str, str]]
    """(name, text) of each output object, as the worker writes them."""
    chunks: dict[str, str]
    """chunk id -> chunk text."""
    encoder: HashingEncoder

    def read_source(self, source: str) -> tuple[str, str]:
        return DOCUMENTS[source], ETAGS[source]


def build_corpus() -> Corpus:
    encoder = HashingEncoder(DIMENSION)
    objects: list[tuple[str, str]] = []
    chunks: dict[str, str] = {}
    for source, text in DOCUMENTS.items():
        pieces = chunk_text(text, chunk_tokens=CHUNK_TOKENS)
        vectors = encoder.encode([c.text for c in pieces], batch_size=16)
        lines = output_lines(source, ETAGS[source], encoder.name, pieces, vectors)
        objects.append((source.replace("s3://corpus/", "out/") + OUTPUT_SUFFIX, "\n".join(lines) + "\n"))
        chunks.update({f"{source}#{i}": c.text for i, c in enumerate(pieces)})
    return Corpus(objects, chunks, encoder)


@dataclass
class Readers:
    local: LocalPostgres
    other: LocalPostgres
    corpus: Corpus

    @property
    def zones(self) -> list[tuple[str, str]]:
        return [(LOCAL_ZONE, self.local.endpoint), (OTHER_ZONE, self.other.endpoint)]


@pytest.fixture(scope="module")
def readers() -> Iterator[Readers]:
    corpus = build_corpus()
    local, other = LocalPostgres(), LocalPostgres()
    try:
        for server in (local, other):
            server.start()
            with psycopg.connect(server.conninfo) as connection:
                load_outputs(connection, corpus.objects, corpus.read_source, dimension=DIMENSION, batch_rows=7)
        yield Readers(local, other, corpus)
    finally:
        local.close()
        other.close()
