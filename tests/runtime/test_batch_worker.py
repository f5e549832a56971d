"""The batch worker's pieces: message format, chunking, keys, decoding, ranged reads, IMDS, and the pipeline in-process.

No network: S3 and SQS are moto's in-process fakes, the instance metadata service is a stub on 127.0.0.1.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from genai_constructs.runtime.batch_worker import (
    MESSAGE_FORMAT,
    BatchWorker,
    DocumentError,
    MalformedMessageError,
    WorkerConfig,
    WorkMessage,
    chunk_text,
    decode_document,
    interruption_notice,
    output_key,
    parse_message,
    read_object,
)
from genai_constructs.runtime.encoders import EncoderSpecError, HashingEncoder, load_encoder

boto3 = pytest.importorskip("boto3")
moto = pytest.importorskip("moto")


# ---- Message format ---------------------------------------------------------------------------------------------

def test_work_message_round_trips_through_json() -> None:
    message = WorkMessage("docs", ("a.txt", "b/c.txt"), "out", "vectors/")
    assert parse_message(message.to_json()) == message


def test_duplicate_keys_in_a_message_are_processed_once() -> None:
    body = json.dumps({"format": MESSAGE_FORMAT, "version": 1, "bucket": "b", "keys": ["k", "k", "j"]})
    parsed = parse_message(body)
    assert parsed is not None and parsed.keys == ("k", "j") and parsed.output_prefix is None


def test_s3_event_notification_becomes_a_work_message_with_decoded_keys() -> None:
    event = {"Records": [{"eventName": "ObjectCreated:Put",
                          "s3": {"bucket": {"name": "docs"}, "object": {"key": "incoming/a+b%2Bc.txt"}}}]}
    assert parse_message(json.dumps(event)) == WorkMessage("docs", ("incoming/a b+c.txt",))


def test_s3_test_event_carries_no_work() -> None:
    assert parse_message(json.dumps({"Event": "s3:TestEvent", "Bucket": "docs"})) is None


@pytest.mark.parametrize("body, reason", [
    ("not json", "body is not JSON"),
    ("[1]", "expected an object"),
    (json.dumps({"format": "other"}), "format 'other' is not"),
    (json.dumps({"format": MESSAGE_FORMAT, "version": 2, "bucket": "b", "keys": ["k"]}), "version 2 is not 1"),
    (json.dumps({"format": MESSAGE_FORMAT, "version": 1, "bucket": "", "keys": ["k"]}), "bucket '' must be"),
    (json.dumps({"format": MESSAGE_FORMAT, "version": 1, "bucket": "b", "keys": []}), "keys must be a non-empty"),
    (json.dumps({"Records": [{"s3": {}}]}), "lacks s3.bucket.name"),
])
def test_malformed_messages_are_rejected_with_the_reason(body: str, reason: str) -> None:
    with pytest.raises(MalformedMessageError, match=reason):
        parse_message(body)


# ---- Keys, chunks, decoding -------------------------------------------------------------------------------------

def test_output_key_is_deterministic_so_a_retry_overwrites() -> None:
    assert output_key("vectors/", "incoming/a.txt") == "vectors/incoming/a.txt.embeddings.jsonl"
    assert output_key("vectors/", "incoming/a.txt") == output_key("vectors/", "incoming/a.txt")


def test_chunks_cover_the_text_with_offsets() -> None:
    text = " ".join(f"w{i}" for i in range(100))
    chunks = chunk_text(text, chunk_tokens=40)  # 30 words per chunk
    assert [len(c.text.split()) for c in chunks] == [30, 30, 30, 10]
    assert all(text[c.start:c.end] == c.text for c in chunks)
    assert " ".join(c.text for c in chunks) == text


def test_chunks_overlap_when_asked() -> None:
    chunks = chunk_text(" ".join(str(i) for i in range(60)), chunk_tokens=40, overlap_tokens=8)
    assert chunks[1].text.split()[0] == "24"  # 30 words per chunk, 6 words of overlap


def test_short_text_is_one_chunk() -> None:
    assert [c.text for c in chunk_text("  hello   world \n")] == ["hello   world"]


@pytest.mark.parametrize("data, reason", [
    (b"\xff\xfe\xfa", "not UTF-8 text"), (b"", "empty"), (b"  \n", "empty"), (b"a\x00b", "NUL bytes"),
])
def test_documents_that_are_not_text_are_errors(data: bytes, reason: str) -> None:
    with pytest.raises(DocumentError, match=reason):
        decode_document(data, "k")


def test_utf8_bom_is_dropped() -> None:
    assert decode_document("\ufeffhé".encode(), "k") == "hé"


# ---- Encoders ---------------------------------------------------------------------------------------------------

def test_hashing_encoder_is_deterministic_and_unit_length() -> None:
    encoder = load_encoder("hashing:48")
    a, b = encoder.encode(["x", "x"], batch_size=2)
    assert a == b and len(a) == 48 and abs(sum(v * v for v in a) - 1) < 1e-9


@pytest.mark.parametrize("spec, reason", [
    ("nope:1", "kind 'nope' is not one of"), ("hashing:x", "dimension must be an integer"),
    ("package:not_a_model_package_xyz", "is not installed"), ("/does/not/exist", "does not exist"),
])
def test_bad_encoder_specs_say_what_to_do(spec: str, reason: str) -> None:
    with pytest.raises(EncoderSpecError, match=reason):
        load_encoder(spec)


# ---- S3 and SQS (moto in-process) -------------------------------------------------------------------------------

@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Any]]:
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with moto.mock_aws():
        yield boto3.client("s3"), boto3.client("sqs")


def test_large_objects_are_read_in_ranged_parts(aws: tuple[Any, Any]) -> None:
    s3, _ = aws
    s3.create_bucket(Bucket="docs")
    body = bytes(range(256)) * 40  # 10,240 bytes
    s3.put_object(Bucket="docs", Key="big", Body=body)
    calls: list[str] = []
    original = s3.get_object

    def spy(**kwargs: Any) -> Any:
        calls.append(kwargs["Range"])
        return original(**kwargs)

    s3.get_object = spy
    data, etag = read_object(s3, "docs", "big", part_bytes=4096)
    assert data == body and etag
    assert calls == ["bytes=0-4095", "bytes=4096-8191", "bytes=8192-10239"]


def test_missing_and_oversized_objects_are_document_errors(aws: tuple[Any, Any]) -> None:
    s3, _ = aws
    s3.create_bucket(Bucket="docs")
    s3.put_object(Bucket="docs", Key="big", Body=b"x" * 100)
    with pytest.raises(DocumentError, match="cannot be read"):
        read_object(s3, "docs", "gone")
    with pytest.raises(DocumentError, match="100 bytes is more than the 50"):
        read_object(s3, "docs", "big", part_bytes=10, max_bytes=50)


def _queue(sqs: Any, visibility: int = 30) -> str:
    return str(sqs.create_queue(QueueName="q", Attributes={"VisibilityTimeout": str(visibility)})["QueueUrl"])


def _run(worker: BatchWorker, until: Any, timeout_s: float = 20) -> None:
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not until():
        time.sleep(0.05)
    worker.request_stop("test over")
    thread.join(timeout=15)
    assert not thread.is_alive()


def _depth(sqs: Any, url: str) -> int:
    a = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return int(a["ApproximateNumberOfMessages"]) + int(a["ApproximateNumberOfMessagesNotVisible"])


def test_worker_writes_good_documents_and_re_sends_a_bad_one_alone(aws: tuple[Any, Any]) -> None:
    s3, sqs = aws
    s3.create_bucket(Bucket="docs")
    s3.create_bucket(Bucket="vectors")
    s3.put_object(Bucket="docs", Key="in/a.txt", Body=b"alpha beta")
    s3.put_object(Bucket="docs", Key="in/b.txt", Body=b"gamma " * 50)
    s3.put_object(Bucket="docs", Key="in/bad.bin", Body=b"\xff\xfe")
    url = _queue(sqs)
    sqs.send_message(QueueUrl=url, MessageBody=WorkMessage("docs", ("in/a.txt", "in/bad.bin", "in/b.txt")).to_json())
    config = WorkerConfig(queue_url=url, output_bucket="vectors", output_prefix="out/", chunk_tokens=40,
                          wait_time_seconds=0, imds_url=None, failure_backoff_s=0)
    worker = BatchWorker(config, encoder=HashingEncoder(8), sqs=sqs, s3=s3)

    def re_sent() -> bool:
        return worker.counters["documents"] == 2 and worker.counters["messages"] == 1

    _run(worker, re_sent)
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="vectors").get("Contents", []))
    assert keys == ["out/in/a.txt.embeddings.jsonl", "out/in/b.txt.embeddings.jsonl"]
    lines = s3.get_object(Bucket="vectors", Key=keys[1])["Body"].read().decode().splitlines()
    assert len(lines) == 2 and all(len(json.loads(line)["embedding"]) == 8 for line in lines)  # 50 words, 30/chunk
    # the original message is deleted; only the bad key remains queued, alone
    messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=0,
                                   WaitTimeSeconds=0).get("Messages", [])
    assert [parse_message(m["Body"]) for m in messages] == [WorkMessage("docs", ("in/bad.bin",))]


def test_a_spot_interruption_notice_stops_the_worker_and_hands_messages_back(aws: tuple[Any, Any]) -> None:
    s3, sqs = aws
    s3.create_bucket(Bucket="docs")
    url = _queue(sqs, visibility=600)
    for i in range(3):
        s3.put_object(Bucket="docs", Key=f"k{i}", Body=b"some text")
        sqs.send_message(QueueUrl=url, MessageBody=WorkMessage("docs", (f"k{i}",)).to_json())

    class SlowEncoder(HashingEncoder):
        def encode(self, texts: Any, *, batch_size: int) -> list[list[float]]:
            time.sleep(60)
            return super().encode(texts, batch_size=batch_size)

    with _imds(action=True) as base:
        config = WorkerConfig(queue_url=url, output_bucket="vectors", wait_time_seconds=0, imds_url=base,
                              imds_poll_s=0.1, drain_timeout_s=1)
        worker = BatchWorker(config, encoder=SlowEncoder(4), sqs=sqs, s3=s3)
        started = time.monotonic()
        worker.run()
    assert worker.stop_reason is not None and worker.stop_reason.startswith("Spot interruption notice")
    assert time.monotonic() - started < 10
    # every message is visible again at once (ChangeMessageVisibility 0), not after the 600 s timeout
    visible = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])["Attributes"]
    assert int(visible["ApproximateNumberOfMessages"]) == 3


class _Imds(http.server.BaseHTTPRequestHandler):
    action = False
    rebalance = False

    def log_message(self, *args: Any) -> None:
        pass

    def do_PUT(self) -> None:  # noqa: N802
        ok = self.path == "/latest/api/token" and "X-aws-ec2-metadata-token-ttl-seconds" in self.headers
        self._reply(200 if ok else 400, b"token")

    def do_GET(self) -> None:  # noqa: N802
        if self.headers.get("X-aws-ec2-metadata-token") != "token":
            self._reply(401, b"")
        elif self.path.endswith("/spot/instance-action") and self.action:
            self._reply(200, b'{"action": "terminate", "time": "2026-11-30T10:00:00Z"}')
        elif self.path.endswith("/recommendations/rebalance") and self.rebalance:
            self._reply(200, b'{"noticeTime": "2026-11-30T10:00:00Z"}')
        else:
            self._reply(404, b"")

    def _reply(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _imds:  # noqa: N801 - a context manager used like a function
    def __init__(self, action: bool = False, rebalance: bool = False) -> None:
        handler = type("Handler", (_Imds,), {"action": action, "rebalance": rebalance})
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)

    def __enter__(self) -> str:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *args: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_imds_quiet_means_no_notice() -> None:
    with _imds() as base:
        assert interruption_notice(base) is None


def test_imds_rebalance_recommendation_is_a_reason_to_stop() -> None:
    with _imds(rebalance=True) as base:
        notice = interruption_notice(base)
    assert notice is not None and notice.startswith("rebalance recommendation")
