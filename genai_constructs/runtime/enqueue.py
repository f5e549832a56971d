"""``genai-constructs enqueue s3://bucket/prefix --queue-url URL``: put existing objects on the embedding queue.

New objects reach the queue by S3 event notification, one key per message; a backlog that already sits in S3 is
listed here and batched into messages of moderate size (:data:`~genai_constructs.runtime.batch_worker.
DEFAULT_DOCUMENTS_PER_MESSAGE` keys or :data:`~genai_constructs.runtime.batch_worker.DEFAULT_BYTES_PER_MESSAGE`
source bytes, whichever comes first), so each receive gives a worker a full GPU batch and a retry redoes little.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from genai_constructs.runtime.batch_worker import (
    DEFAULT_BYTES_PER_MESSAGE,
    DEFAULT_DOCUMENTS_PER_MESSAGE,
    MAX_MESSAGE_BODY_BYTES,
    WorkMessage,
    bucket_name_problem,
    explain_aws_error,
    http_url_problem,
    queue_url_problem,
    region_problem,
)

SEND_ATTEMPTS = 5
"""send_message_batch entries that fail (throttling) are retried this many times before the command gives up."""


def parse_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` as (bucket, prefix); ValueError with the fix otherwise."""
    if not url.startswith("s3://") or len(url) <= 5:
        raise ValueError(f"{url!r} is not an S3 URL: write s3://bucket/prefix (prefix optional)")
    bucket, _, prefix = url[5:].partition("/")
    if not bucket:
        raise ValueError(f"{url!r} names no bucket: write s3://bucket/prefix")
    problem = bucket_name_problem(bucket)
    if problem:
        raise ValueError(f"{url!r}: {problem}; write s3://bucket/prefix with the bucket's name")
    return bucket, prefix


def batch_keys(
    objects: Iterable[tuple[str, int]],
    *,
    bucket: str,
    documents_per_message: int = DEFAULT_DOCUMENTS_PER_MESSAGE,
    bytes_per_message: int = DEFAULT_BYTES_PER_MESSAGE,
    output_bucket: str | None = None,
    output_prefix: str | None = None,
) -> Iterator[WorkMessage]:
    """Group (key, size) pairs into messages of at most ``documents_per_message`` keys and ``bytes_per_message``
    source bytes (a larger object goes alone), each body under SQS's size limit. Folder markers are skipped."""
    if documents_per_message < 1 or bytes_per_message < 1:
        raise ValueError("documents_per_message and bytes_per_message must be >= 1")
    template = WorkMessage(bucket, (), output_bucket, output_prefix)
    keys: list[str] = []
    size = 0
    body = len(template.to_json())
    for key, object_size in objects:
        if key.endswith("/"):
            continue
        key_bytes = len(key.encode()) + 4  # quotes, comma, JSON escaping margin
        if keys and (
            len(keys) >= documents_per_message
            or size + object_size > bytes_per_message
            or body + key_bytes > MAX_MESSAGE_BODY_BYTES
        ):
            yield template.with_keys(keys)
            keys, size, body = [], 0, len(template.to_json())
        keys.append(key)
        size += object_size
        body += key_bytes
    if keys:
        yield template.with_keys(keys)


def list_objects(s3: Any, bucket: str, prefix: str) -> Iterator[tuple[str, int]]:
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            yield item["Key"], int(item.get("Size", 0))


def send_messages(sqs: Any, queue_url: str, messages: Iterable[WorkMessage]) -> int:
    """Send in batches of ten, retrying failed entries; returns how many messages were sent."""
    sent = 0
    pending: list[WorkMessage] = []

    def flush(batch: list[WorkMessage]) -> None:
        nonlocal sent
        entries = {str(i): m for i, m in enumerate(batch)}
        for _ in range(SEND_ATTEMPTS):
            response = sqs.send_message_batch(
                QueueUrl=queue_url, Entries=[{"Id": i, "MessageBody": m.to_json()} for i, m in entries.items()]
            )
            sent += len(response.get("Successful", []))
            entries = {f["Id"]: entries[f["Id"]] for f in response.get("Failed", [])}
            if not entries:
                return
        raise RuntimeError(f"{len(entries)} message(s) could not be sent after {SEND_ATTEMPTS} attempts")

    for message in messages:
        pending.append(message)
        if len(pending) == 10:
            flush(pending)
            pending = []
    if pending:
        flush(pending)
    return sent


REGION_FIX = "set AWS_REGION (or AWS_DEFAULT_REGION, or a profile's region) or pass --region, e.g. --region us-east-1"
ENDPOINT_FIX = "check --endpoint-url (or AWS_ENDPOINT_URL), the Region and the network (proxy, VPN, VPC endpoints)"


def _parser() -> argparse.ArgumentParser:
    # Numbers are read as text and checked in _problems, so that every bad value is reported at once.
    parser = argparse.ArgumentParser(
        prog="genai-constructs enqueue",
        description="Batch the objects under an S3 prefix into work messages on the embedding queue.",
    )
    parser.add_argument("source", help="s3://bucket/prefix of the documents")
    parser.add_argument("--queue-url", required=True, help="the fleet's input queue (stack output QueueUrl)")
    parser.add_argument("--output-bucket", default=None, help="default: the worker's own output bucket")
    parser.add_argument("--output-prefix", default=None, help="default: the worker's own output prefix")
    parser.add_argument("--documents-per-message", default=str(DEFAULT_DOCUMENTS_PER_MESSAGE))
    parser.add_argument("--bytes-per-message", default=str(DEFAULT_BYTES_PER_MESSAGE))
    parser.add_argument("--dry-run", action="store_true", help="count the messages without sending them")
    parser.add_argument("--endpoint-url", default=None, help="S3 and SQS endpoint (e.g. a local moto server)")
    parser.add_argument("--region", default=None, help="default: AWS_REGION, AWS_DEFAULT_REGION or the profile's")
    return parser


def _problems(args: argparse.Namespace) -> list[str]:
    """Every bad value on the command line, each naming the argument, the value, what is allowed and the fix."""
    problems: list[str] = []
    try:
        parse_s3_url(args.source)
    except ValueError as error:
        problems.append(f"source: {error}")
    problem = queue_url_problem(args.queue_url)
    if problem:
        problems.append(f"argument --queue-url: {problem}")
    if args.output_bucket is not None:
        problem = bucket_name_problem(args.output_bucket)
        if problem:
            problems.append(f"argument --output-bucket: {problem}; give the bucket name alone, e.g. "
                            "--output-bucket my-vectors")
    if args.output_prefix is not None and args.output_prefix.startswith("s3://"):
        problems.append(f"argument --output-prefix: {args.output_prefix!r} is a location, not a key prefix; give the "
                        "prefix alone, e.g. --output-prefix embeddings/ (the bucket is --output-bucket)")
    for flag, name, example in (("--documents-per-message", "documents_per_message", DEFAULT_DOCUMENTS_PER_MESSAGE),
                                ("--bytes-per-message", "bytes_per_message", DEFAULT_BYTES_PER_MESSAGE)):
        text = getattr(args, name)
        if not (text.isascii() and text.isdigit()) or int(text) < 1:
            problems.append(f"argument {flag}: {text!r} is not a whole number >= 1; give e.g. {flag} {example}")
        else:
            setattr(args, name, int(text))
    if args.endpoint_url is not None:
        problem = http_url_problem(args.endpoint_url)
        if problem:
            problems.append(f"argument --endpoint-url: {problem}; give e.g. --endpoint-url http://127.0.0.1:5000 "
                            "(a local moto server), or leave it out for AWS")
    if args.region is not None:
        problem = region_problem(args.region)
        if problem:
            problems.append(f"argument --region: {problem}; give e.g. --region us-east-1 (the fleet's Region)")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``genai-constructs enqueue``; returns the process exit status.

    2 for a bad command line (every problem, one line each), 1 when AWS refuses or cannot be reached (one sentence
    naming what was missing and the fix), 0 when every message was sent.
    """
    args = _parser().parse_args(argv)
    problems = _problems(args)
    if problems:
        for problem in problems:
            print(f"enqueue: {problem}", file=sys.stderr)
        return 2
    bucket, prefix = parse_s3_url(args.source)
    try:
        import boto3  # type: ignore[import-untyped]
    except ImportError:
        print("enqueue: boto3 is needed: pip install 'genai-constructs[worker]'", file=sys.stderr)
        return 2
    try:
        return _run(boto3, args, bucket, prefix)
    except RuntimeError as error:  # send_messages: entries still failing after SEND_ATTEMPTS
        print(f"enqueue: {error}", file=sys.stderr)
        return 1
    except Exception as error:  # boto3's errors: one sentence and the fix, never a traceback
        sentence = explain_aws_error(error, region_fix=REGION_FIX, endpoint_fix=ENDPOINT_FIX, bucket=bucket,
                                     queue_url=args.queue_url)
        print(f"enqueue: {sentence}", file=sys.stderr)
        return 1


def _run(boto3: Any, args: argparse.Namespace, bucket: str, prefix: str) -> int:
    session = boto3.session.Session(region_name=args.region)
    s3 = session.client("s3", endpoint_url=args.endpoint_url)
    messages = batch_keys(
        list_objects(s3, bucket, prefix), bucket=bucket, documents_per_message=args.documents_per_message,
        bytes_per_message=args.bytes_per_message, output_bucket=args.output_bucket, output_prefix=args.output_prefix,
    )
    if args.dry_run:
        counted = list(messages)
        keys = sum(len(m.keys) for m in counted)
        print(f"would send {len(counted)} message(s) for {keys} object(s) under s3://{bucket}/{prefix}")
        return 0
    sqs = session.client("sqs", endpoint_url=args.endpoint_url)
    sent = send_messages(sqs, args.queue_url, messages)
    print(f"sent {sent} message(s) for the objects under s3://{bucket}/{prefix}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
