"""Pre-cut chunks in the vector store, and the loader service's command line, on real PostgreSQL + pgvector
(127.0.0.1) and moto's S3, SQS and Secrets Manager. The queue-fed service runs in the end-to-end pipeline test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

from genai_constructs.runtime.batch_worker import OUTPUT_SUFFIX, Chunk, output_lines
from genai_constructs.runtime.encoders import HashingEncoder
from genai_constructs.runtime.vector_store import load_outputs

psycopg = pytest.importorskip("psycopg")
boto3 = pytest.importorskip("boto3")
pytest.importorskip("pgserver", reason="pgserver ships the PostgreSQL + pgvector binaries")

from genai_constructs.testing.local_postgres import LocalPostgres  # noqa: E402

DIMENSION = 16
SOURCE = "s3://raw/docs/report.pdf"


@pytest.fixture(scope="module")
def database() -> Iterator[LocalPostgres]:
    with LocalPostgres() as server:
        yield server


def _part(texts: dict[int, str], total: int, etag: str = '"v1"') -> tuple[str, str]:
    """One embeddings object of pre-cut chunks, as the batch worker writes it for a chunk object."""
    encoder = HashingEncoder(DIMENSION)
    chunks = [Chunk(10 * i, 10 * i + len(t), t, source=SOURCE, etag=etag, index=i, chunks_total=total)
              for i, t in texts.items()]
    lines = output_lines("s3://embed-in/chunks/x.chunks.jsonl", "", encoder.name, chunks,
                         encoder.encode([c.text for c in chunks], batch_size=8))
    return f"part-{min(texts)}{OUTPUT_SUFFIX}", "\n".join(lines)


def _no_source_read(source: str) -> tuple[str, str]:
    raise AssertionError(f"the loader read {source}: pre-cut chunks carry their text")


def _rows(database: LocalPostgres, table: str) -> dict[int, str]:
    with psycopg.connect(database.conninfo) as connection:
        return dict(connection.execute(f"SELECT chunk, content FROM {table} ORDER BY chunk").fetchall())


def test_pre_cut_chunks_are_stored_with_their_own_text_without_reading_the_source(database: LocalPostgres) -> None:
    parts = [_part({0: "alpha one", 1: "bravo two"}, 3), _part({2: "charlie three"}, 3)]
    with psycopg.connect(database.conninfo) as connection:
        first = load_outputs(connection, parts, _no_source_read, dimension=DIMENSION, table="precut")
        again = load_outputs(connection, parts, _no_source_read, dimension=DIMENSION, table="precut")
    assert _rows(database, "precut") == {0: "alpha one", 1: "bravo two", 2: "charlie three"}
    assert first.records == 3 and first.rows_written == 3
    assert again.rows_written == 0 and again.rows_removed == 0  # idempotent: a reload rewrites nothing


def test_a_document_that_shrinks_loses_only_rows_past_its_new_count_whatever_the_part(database: LocalPostgres,
                                                                                     ) -> None:
    old = [_part({0: "a0", 1: "a1", 2: "a2"}, 6), _part({3: "a3", 4: "a4", 5: "a5"}, 6)]
    new = [_part({0: "b0", 1: "b1", 2: "b2"}, 4, '"v2"'), _part({3: "b3"}, 4, '"v2"')]
    with psycopg.connect(database.conninfo) as connection:
        load_outputs(connection, old, _no_source_read, dimension=DIMENSION, table="shrink")
        # the new version's first part alone: chunks 4 and 5 go, chunk 3 (the other part's) stays until it arrives
        report = load_outputs(connection, new[:1], _no_source_read, dimension=DIMENSION, table="shrink")
        assert report.rows_removed == 2
        assert _rows(database, "shrink") == {0: "b0", 1: "b1", 2: "b2", 3: "a3"}
        load_outputs(connection, new[1:], _no_source_read, dimension=DIMENSION, table="shrink")
    assert _rows(database, "shrink") == {0: "b0", 1: "b1", 2: "b2", 3: "b3"}


def _loader(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "genai_constructs.runtime.vector_loader", *args],
                          capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})})


def test_fails_bad_flags_with_one_line_each_and_exit_2() -> None:
    result = _loader("load-queue", "--queue-url", "arn:aws:sqs:us-east-1:123456789012:q", "--dimension", "3000",
                     "--secret-arn", "rag-db", "--sslmode", "prefer", "--port", "0", "--table", "Bad-Name")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "vector_loader: error: argument --queue-url: 'arn:aws:sqs:us-east-1:123456789012:q' is a queue ARN, not its "
        "URL: give the URL, e.g. https://sqs.us-east-1.amazonaws.com/123456789012/my-queue (the stack output QueueUrl)",
        "vector_loader: error: argument --secret-arn: 'rag-db' is not a Secrets Manager secret ARN; give the "
        "cluster's secret, e.g. --secret-arn arn:aws:secretsmanager:us-east-1:123456789012:secret:rag-db-AbCdEf",
        "vector_loader: error: argument --sslmode: 'prefer' is not one of require, verify-ca, verify-full, disable; "
        "give --sslmode require",
        "vector_loader: error: argument --table: 'Bad-Name' is not a lower-case SQL identifier of at most 51 "
        "characters (letters, digits, _); give e.g. --table rag_chunks",
        "vector_loader: error: argument --port: '0' is not a whole number from 1 to 65535; give e.g. --port 5432",
        "vector_loader: error: argument --dimension: '3000' is not a whole number from 1 to 2000; give the encoder's "
        "dimension, e.g. --dimension 384",
    ]


def test_the_backfill_loads_every_embeddings_object_once_and_a_rerun_changes_nothing(
        aws_env: dict[str, str], database: LocalPostgres) -> None:
    s3 = boto3.client("s3")
    bucket = f"vectors-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    for name, text in [_part({0: "x0", 1: "x1"}, 3), _part({2: "x2"}, 3)]:
        s3.put_object(Bucket=bucket, Key=f"embeddings/{name}", Body=text.encode())
    s3.put_object(Bucket=bucket, Key="embeddings/_manifest.json", Body=b"{}")  # not an embeddings object: skipped
    secret = boto3.client("secretsmanager").create_secret(Name=f"db-{bucket}", SecretString=json.dumps(
        {"username": "postgres", "password": "unused", "host": database.host, "port": database.port}))["ARN"]
    args = ["load-s3", "--bucket", bucket, "--prefix", "embeddings/", "--database", "postgres", "--table", "backfill",
            "--dimension", str(DIMENSION), "--secret-arn", secret, "--sslmode", "disable"]
    first, second = _loader(*args, env=aws_env), _loader(*args, env=aws_env)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert "'records': 3, 'rows_written': 3" in first.stderr
    assert "'records': 3, 'rows_written': 0, 'rows_removed': 0" in second.stderr
    assert _rows(database, "backfill") == {0: "x0", 1: "x1", 2: "x2"}


def test_fails_a_secret_that_does_not_exist_with_exit_1(aws_env: dict[str, str],
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from genai_constructs.runtime.vector_loader import main

    assert main(["load-s3", "--bucket", "b-1", "--dimension", "8", "--secret-arn",
                 "arn:aws:secretsmanager:us-east-1:123456789012:secret:nope-AbCdEf"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "vector_loader: error: the secret arn:aws:secretsmanager:us-east-1:123456789012:secret:nope-AbCdEf does not "
        "exist (or is in another Region or account): give the database's secret ARN and its Region; pass --region or "
        "set AWS_DEFAULT_REGION"]


def test_a_dropped_database_connection_stops_the_service_with_status_1(
        aws_env: dict[str, str], database: LocalPostgres) -> None:
    # GIVEN a queue-fed loader with a live connection, and one embeddings object announced on its queue
    from genai_constructs.runtime.vector_loader import Loader, loader_settings

    s3, sqs = boto3.client("s3"), boto3.client("sqs")
    bucket = f"vectors-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    name, text = _part({0: "x0"}, 1)
    s3.put_object(Bucket=bucket, Key=f"embeddings/{name}", Body=text.encode())
    queue_url = sqs.create_queue(QueueName=bucket)["QueueUrl"]
    sqs.send_message(QueueUrl=queue_url, MessageBody=json.dumps({"Records": [{
        "eventName": "ObjectCreated:Put", "s3": {"bucket": {"name": bucket}, "object": {"key": f"embeddings/{name}"}}}]}))
    settings, problems = loader_settings(
        ["load-queue", "--queue-url", queue_url, "--dimension", str(DIMENSION), "--table", "dropped",
         "--secret-arn", "arn:aws:secretsmanager:us-east-1:123456789012:secret:unused-AbCdEf", "--wait-time", "1",
         "--failure-backoff", "0"])
    assert settings is not None, problems
    connection = psycopg.connect(host=database.host, port=database.port, dbname="postgres", user="postgres",
                                 autocommit=True)
    # WHEN the server drops that connection (a writer failover or a reboot does the same)
    with psycopg.connect(host=database.host, port=database.port, dbname="postgres", user="postgres",
                         autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (connection.info.backend_pid,))
    loader = Loader(settings, connection=connection, s3=s3, sqs=sqs)
    # THEN the service stops with status 1 (systemd restarts it with a fresh connection), the message stays queued
    assert loader.run_queue() == 1
    assert loader.lost_connection and loader.counters["messages"] == 0
    attributes = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["ApproximateNumberOfMessages",
                                                                              "ApproximateNumberOfMessagesNotVisible"])
    assert sum(int(v) for v in attributes["Attributes"].values()) == 1
