"""``genai-constructs enqueue``: batching existing keys into work messages (moto in-process, no network)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from genai_constructs.runtime.batch_worker import DEFAULT_DOCUMENTS_PER_MESSAGE, MAX_MESSAGE_BODY_BYTES, parse_message
from genai_constructs.runtime.enqueue import batch_keys, main, parse_s3_url

boto3 = pytest.importorskip("boto3")
moto = pytest.importorskip("moto")


def test_s3_url_is_split_into_bucket_and_prefix() -> None:
    assert parse_s3_url("s3://docs/incoming/") == ("docs", "incoming/")
    assert parse_s3_url("s3://docs") == ("docs", "")


@pytest.mark.parametrize("url", ["docs/incoming", "s3://", "s3:///x", "https://docs.s3.amazonaws.com/x"])
def test_fails_on_a_url_that_is_not_s3(url: str) -> None:
    with pytest.raises(ValueError, match="s3://bucket/prefix"):
        parse_s3_url(url)


def test_keys_are_batched_by_count_by_default() -> None:
    objects = [(f"k{i}", 10) for i in range(DEFAULT_DOCUMENTS_PER_MESSAGE * 2 + 1)]
    sizes = [len(m.keys) for m in batch_keys(objects, bucket="b")]
    assert sizes == [DEFAULT_DOCUMENTS_PER_MESSAGE, DEFAULT_DOCUMENTS_PER_MESSAGE, 1]


def test_keys_are_batched_by_bytes_and_a_large_object_goes_alone() -> None:
    objects = [("a", 40), ("b", 40), ("c", 40), ("huge", 500), ("d", 10)]
    batches = [m.keys for m in batch_keys(objects, bucket="b", bytes_per_message=100)]
    assert batches == [("a", "b"), ("c",), ("huge",), ("d",)]


def test_folder_markers_are_skipped() -> None:
    assert [m.keys for m in batch_keys([("dir/", 0), ("dir/a", 1)], bucket="b")] == [("dir/a",)]


def test_message_bodies_stay_under_the_sqs_limit() -> None:
    objects = [("k" * 1000 + str(i), 1) for i in range(1000)]
    messages = list(batch_keys(objects, bucket="b", documents_per_message=10_000))
    assert len(messages) > 1 and all(len(m.to_json()) <= MAX_MESSAGE_BODY_BYTES for m in messages)
    assert sum(len(m.keys) for m in messages) == 1000


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Any]]:
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with moto.mock_aws():
        yield boto3.client("s3"), boto3.client("sqs")


def test_enqueue_sends_every_key_under_the_prefix_once(aws: tuple[Any, Any], capsys: Any) -> None:
    s3, sqs = aws
    s3.create_bucket(Bucket="docs")
    for i in range(25):
        s3.put_object(Bucket="docs", Key=f"incoming/{i}.txt", Body=b"text")
    s3.put_object(Bucket="docs", Key="elsewhere/x.txt", Body=b"text")
    url = sqs.create_queue(QueueName="q")["QueueUrl"]
    assert main(["s3://docs/incoming/", "--queue-url", url, "--documents-per-message", "10",
                 "--output-prefix", "v/"]) == 0
    keys: list[str] = []
    while messages := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", []):
        for message in messages:
            work = parse_message(message["Body"])
            assert work is not None and work.bucket == "docs" and work.output_prefix == "v/"
            keys.extend(work.keys)
            sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    assert sorted(keys) == sorted(f"incoming/{i}.txt" for i in range(25))
    assert "sent 3 message(s)" in capsys.readouterr().out


def test_dry_run_sends_nothing(aws: tuple[Any, Any], capsys: Any) -> None:
    s3, sqs = aws
    s3.create_bucket(Bucket="docs")
    s3.put_object(Bucket="docs", Key="incoming/a", Body=b"x")
    url = sqs.create_queue(QueueName="q")["QueueUrl"]
    assert main(["s3://docs/incoming/", "--queue-url", url, "--dry-run"]) == 0
    assert "would send 1 message(s) for 1 object(s)" in capsys.readouterr().out
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
    assert attributes["Attributes"]["ApproximateNumberOfMessages"] == "0"


def test_fails_with_exit_status_2_on_a_bad_url(capsys: Any) -> None:
    assert main(["docs/incoming", "--queue-url", "https://q"]) == 2
    assert "is not an S3 URL" in capsys.readouterr().err


def test_fails_with_exit_status_2_on_zero_documents_per_message(capsys: Any) -> None:
    assert main(["s3://docs/", "--queue-url", "https://q", "--documents-per-message", "0"]) == 2
    assert json.dumps(">= 1").strip('"') in capsys.readouterr().err
