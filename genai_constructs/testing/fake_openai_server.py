"""A fake OpenAI-compatible model server shaped like vLLM, on real sockets, with exact and configurable timing.

For the request proxy's tests and benchmark (``genai_constructs.runtime.request_proxy``): it answers
``POST /v1/completions`` and ``POST /v1/chat/completions`` (streamed as ``text/event-stream`` with chunked transfer
encoding and ``data: {...}`` events in vLLM's chunk shape, or whole as JSON with ``usage``), ``GET /metrics``
(Prometheus text with vLLM's gauges, reflecting its live state), ``GET /health`` and ``GET /v1/models``.

Timing is what a test asserts on, so it is exact: the first token leaves ``ttft_ms`` after the request is admitted,
token *i* at ``ttft_ms + i * tpot_ms`` (an absolute schedule: a late timer does not delay the tokens after it). Like
vLLM, a stream's response headers leave at once and its first chunk (the chat role chunk with it) only with the first
token; at most ``max_num_seqs`` requests run, the rest wait (``vllm:num_requests_waiting``).

Behaviours (server-wide ``behaviour``, or per request with the ``X-Fake-Behaviour`` header):

* ``normal``;
* ``slow``: the first token after ``slow_ttft_ms`` instead;
* ``wedged``: accepts the request and never sends a byte (an engine loop that died);
* ``bad_request``: answers ``error_status`` (400) with an OpenAI-style error body. Invalid requests get the same
  answer as from vLLM in any behaviour: no ``prompt``/``messages`` or a bad ``max_tokens`` is 400, an unknown
  ``model`` is 404.

Every request is recorded (``requests``): its headers, body, and outcome; ``cancelled`` when the client went away
before the response was complete, which is how tests assert that the server saw the disconnect. Output is a pure
function of the request body (ids, token text and ``created`` included), so the same request gives the same bytes.

Use it in a test as a context manager (it runs its own event loop in a daemon thread, on 127.0.0.1 and an ephemeral
port)::

    with FakeOpenAIServer(ttft_ms=50, tpot_ms=10, output_tokens=8) as server:
        ...  # server.address == "127.0.0.1:<port>"

or as a process of its own (the benchmark does): ``python fake_openai_server.py --port 0 --ttft-ms 100`` prints
``listening on 127.0.0.1:<port>`` and serves until SIGTERM.

Pass ``ssl_context`` (a server-side ``ssl.SSLContext`` with its certificate loaded) to serve HTTPS, as an inference
listener with a certificate does; ``url`` then starts with ``https``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import email.utils
import hashlib
import json
import signal
import ssl
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

BEHAVIOURS = ("normal", "slow", "wedged", "bad_request")
BEHAVIOUR_HEADER = b"x-fake-behaviour"

DEFAULT_TTFT_MS = 100.0
"""A short prompt's prefill plus one decode step for a mid-size model on one GPU."""
DEFAULT_TPOT_MS = 20.0
"""50 tokens/s per stream: a batched 8B model's decode speed."""
DEFAULT_OUTPUT_TOKENS = 16
"""Short, so tests finish quickly; the benchmark asks for more."""
DEFAULT_SLOW_TTFT_MS = 1500.0
"""``slow``: a long prefill (a huge prompt, or a queue inside the engine)."""
DEFAULT_MAX_NUM_SEQS = 256
"""vLLM's default ``--max-num-seqs``."""
DEFAULT_KV_CAPACITY_TOKENS = 131_072
"""KV cache size in tokens that ``vllm:kv_cache_usage_perc`` is reported against."""
DEFAULT_KEEP_ALIVE_S = 5.0
"""vLLM's uvicorn closes idle keep-alive connections after ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE`` = 5 s."""
DEFAULT_MODEL = "fake-model"
CREATED = 1_700_000_000
"""The ``created`` of every response: fixed, so that equal requests give equal bytes."""
MAX_REQUEST_BYTES = 64 * 1024 * 1024

VOCABULARY = (
    " The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog", ".", "\n\n", " data:",
    ' "text":"x"', " [DONE]", ' "usage":{', "\\", " caf\u00e9", " \u2603", "\r\n", " end",
)
"""Token texts; some look like SSE framing or JSON keys on purpose, to catch a proxy that parses sloppily."""


@dataclass(frozen=True)
class FakeServerConfig:
    """How the fake server behaves; ``FakeOpenAIServer.reconfigure`` swaps it while running."""

    ttft_ms: float = DEFAULT_TTFT_MS
    tpot_ms: float = DEFAULT_TPOT_MS
    output_tokens: int = DEFAULT_OUTPUT_TOKENS
    behaviour: str = "normal"
    slow_ttft_ms: float = DEFAULT_SLOW_TTFT_MS
    error_status: int = 400
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    kv_capacity_tokens: int = DEFAULT_KV_CAPACITY_TOKENS
    keep_alive_s: float = DEFAULT_KEEP_ALIVE_S
    model: str = DEFAULT_MODEL
    legacy_metric_names: bool = False
    """Export ``vllm:gpu_cache_usage_perc`` (vLLM before v0.10) instead of ``vllm:kv_cache_usage_perc``."""

    def __post_init__(self) -> None:
        if self.behaviour not in BEHAVIOURS:
            raise ValueError(f"behaviour {self.behaviour!r} is not one of {', '.join(BEHAVIOURS)}")


@dataclass
class ObservedRequest:
    """One request as the server saw it, and what became of it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    behaviour: str
    received_at: float
    outcome: str = "pending"
    """``pending``, then ``completed``, ``cancelled`` (the client went away first) or ``rejected`` (4xx)."""
    status: int = 0
    tokens_sent: int = 0
    prompt_tokens: int = 0
    finished_at: float | None = None
    first_token_at: float | None = None

    @property
    def cancelled(self) -> bool:
        return self.outcome == "cancelled"

    @property
    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None


class _Rejection(Exception):
    def __init__(self, status: int, message: str, kind: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


def error_body(status: int, message: str, kind: str = "BadRequestError") -> bytes:
    """An OpenAI-style error (vLLM's shape): ``{"error": {"message", "type", "param", "code"}}``."""
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": status}}).encode()


def _count_words(value: Any) -> int:
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, list):
        return sum(_count_words(item) if not isinstance(item, int) else 1 for item in value)
    if isinstance(value, dict):
        return _count_words(value.get("content")) + _count_words(value.get("text"))
    return 0


def _http_date() -> bytes:
    return email.utils.formatdate(usegmt=True).encode()


class _Generation:
    """One completion being generated: its token schedule, its bytes, its place in the engine."""

    def __init__(self, connection: _FakeConnection, observed: ObservedRequest, payload: dict[str, Any],
                 chat: bool, config: FakeServerConfig, body: bytes) -> None:
        self.connection = connection
        self.observed = observed
        self.chat = chat
        self.stream = payload.get("stream") is True
        options = payload.get("stream_options")
        self.include_usage = isinstance(options, dict) and options.get("include_usage") is True
        max_tokens = payload.get("max_tokens", payload.get("max_completion_tokens"))
        self.count = config.output_tokens if max_tokens is None else min(config.output_tokens, max_tokens)
        self.finish_reason = "length" if max_tokens is not None and max_tokens <= config.output_tokens else "stop"
        self.prompt_tokens = max(1, _count_words(payload.get("messages") if chat else payload.get("prompt")))
        observed.prompt_tokens = self.prompt_tokens
        ttft_ms = config.slow_ttft_ms if observed.behaviour == "slow" else config.ttft_ms
        self.ttft_s = ttft_ms / 1000.0
        self.tpot_s = config.tpot_ms / 1000.0
        digest = hashlib.sha256(body).hexdigest()
        self.id = ("chatcmpl-" if chat else "cmpl-") + digest[:32]
        seed = int(digest[32:40], 16)
        self.tokens = [VOCABULARY[(seed + i) % len(VOCABULARY)] for i in range(self.count)]
        model = json.dumps(payload.get("model") or config.model)
        if chat:
            self.prefix = (f'data: {{"id":"{self.id}","object":"chat.completion.chunk","created":{CREATED},'
                           f'"model":{model},"choices":[{{"index":0,"delta":').encode()
        else:
            self.prefix = (f'data: {{"id":"{self.id}","object":"text_completion","created":{CREATED},'
                           f'"model":{model},"choices":[{{"index":0,"text":').encode()
        self.model = model
        self.sent = 0
        self.started_at: float | None = None
        self.handle: asyncio.TimerHandle | None = None
        self.done = False

    # -- bytes --

    @staticmethod
    def _chunk(data: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(data), data)

    def _token_event(self, index: int) -> bytes:
        text = json.dumps(self.tokens[index]).encode()
        last = index == self.count - 1
        finish = f'"{self.finish_reason}"'.encode() if last else b"null"
        if self.chat:
            return self.prefix + b'{"content":' + text + b'},"logprobs":null,"finish_reason":' + finish + b"}]}\n\n"
        return (self.prefix + text + b',"logprobs":null,"finish_reason":' + finish
                + b',"stop_reason":null}],"usage":null}\n\n')

    def _role_event(self) -> bytes:
        return self.prefix + b'{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'

    def _usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "total_tokens": self.prompt_tokens + self.count,
                "completion_tokens": self.count}

    def _usage_event(self) -> bytes:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        usage = json.dumps(self._usage(), separators=(",", ":"))
        return (f'data: {{"id":"{self.id}","object":"{kind}","created":{CREATED},"model":{self.model},'
                f'"choices":[],"usage":{usage}}}\n\n').encode()

    def full_body(self) -> bytes:
        text = "".join(self.tokens)
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text, "tool_calls": []},
                                      "logprobs": None, "finish_reason": self.finish_reason}
            kind = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": self.finish_reason,
                      "stop_reason": None, "prompt_logprobs": None}
            kind = "text_completion"
        return json.dumps({"id": self.id, "object": kind, "created": CREATED, "model": json.loads(self.model),
                           "choices": [choice], "usage": self._usage()}, separators=(",", ":")).encode()

    # -- schedule --

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.started_at = loop.time()
        if self.observed.behaviour == "wedged":
            return  # holds its engine slot and never produces anything
        if self.stream:
            self.handle = loop.call_at(self.started_at + self.ttft_s, self._emit_next, loop)
        else:
            total_s = self.ttft_s + max(0, self.count - 1) * self.tpot_s
            self.handle = loop.call_at(self.started_at + total_s, self._emit_whole)

    def _emit_next(self, loop: asyncio.AbstractEventLoop) -> None:
        self.handle = None
        index = self.sent
        out = []
        if index == 0:
            self.observed.first_token_at = time.monotonic()
            if self.chat:
                out.append(self._chunk(self._role_event()))
        if index < self.count:
            out.append(self._chunk(self._token_event(index)))
            self.sent += 1
            self.observed.tokens_sent = self.sent
        if self.sent >= self.count:
            if self.include_usage:
                out.append(self._chunk(self._usage_event()))
            out.append(self._chunk(b"data: [DONE]\n\n"))
            out.append(b"0\r\n\r\n")
            self.connection.write(b"".join(out))
            self.connection.generation_finished(self, "completed")
            return
        self.connection.write(b"".join(out))
        assert self.started_at is not None
        self.handle = loop.call_at(self.started_at + self.ttft_s + self.sent * self.tpot_s, self._emit_next, loop)

    def _emit_whole(self) -> None:
        self.handle = None
        self.sent = self.count
        self.observed.tokens_sent = self.count
        self.observed.first_token_at = time.monotonic()
        self.connection.write_response(200, b"application/json", self.full_body())
        self.connection.generation_finished(self, "completed")

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None


class _Engine:
    """vLLM's scheduler, reduced to what its gauges show: at most ``max_num_seqs`` running, the rest waiting."""

    def __init__(self, server: FakeOpenAIServer) -> None:
        self.server = server
        self.running: set[_Generation] = set()
        self.waiting: collections.deque[_Generation] = collections.deque()
        self.generated_tokens = 0
        self.prompt_tokens = 0

    def submit(self, generation: _Generation, loop: asyncio.AbstractEventLoop) -> None:
        if len(self.running) < self.server.config.max_num_seqs and not self.waiting:
            self._run(generation, loop)
        else:
            self.waiting.append(generation)

    def _run(self, generation: _Generation, loop: asyncio.AbstractEventLoop) -> None:
        self.running.add(generation)
        self.prompt_tokens += generation.prompt_tokens
        generation.start(loop)

    def finished(self, generation: _Generation, loop: asyncio.AbstractEventLoop) -> None:
        self.generated_tokens += generation.sent
        if generation in self.running:
            self.running.discard(generation)
        else:
            try:
                self.waiting.remove(generation)
            except ValueError:
                pass
        while self.waiting and len(self.running) < self.server.config.max_num_seqs:
            self._run(self.waiting.popleft(), loop)

    def metrics_page(self) -> bytes:
        config = self.server.config
        labels = f'{{engine="0",model_name="{config.model}"}}'
        kv_used = sum(g.prompt_tokens + g.sent for g in self.running)
        kv_name = "vllm:gpu_cache_usage_perc" if config.legacy_metric_names else "vllm:kv_cache_usage_perc"
        generated = self.generated_tokens + sum(g.sent for g in self.running)
        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{labels} {float(len(self.running))}",
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{labels} {float(len(self.waiting))}",
            f"# HELP {kv_name} KV-cache usage. 1 means 100 percent usage.",
            f"# TYPE {kv_name} gauge",
            f"{kv_name}{labels} {min(1.0, kv_used / config.kv_capacity_tokens)}",
            "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
            "# TYPE vllm:prompt_tokens_total counter",
            f"vllm:prompt_tokens_total{labels} {float(self.prompt_tokens)}",
            "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{labels} {float(generated)}",
        ]
        return ("\n".join(lines) + "\n").encode()


class _FakeConnection(asyncio.Protocol):
    """One client connection: HTTP/1.1 with keep-alive, Content-Length or chunked request bodies."""

    def __init__(self, server: FakeOpenAIServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.generation: _Generation | None = None
        self.observed: ObservedRequest | None = None
        self.close_after = False
        self.idle_handle: asyncio.TimerHandle | None = None
        self.loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server._connections.add(self)
        self._arm_idle()

    def _arm_idle(self) -> None:
        self.idle_handle = self.loop.call_later(self.server.config.keep_alive_s, self._idle_expired)

    def _idle_expired(self) -> None:
        if self.observed is None and self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.observed is None:
            self._parse()

    def eof_received(self) -> bool:
        self._client_gone()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.server._connections.discard(self)
        if self.idle_handle is not None:
            self.idle_handle.cancel()
        self._client_gone()
        self.transport = None

    def _client_gone(self) -> None:
        generation, self.generation = self.generation, None
        if generation is not None and not generation.done:
            generation.cancel()
            generation.done = True
            self.server._engine.finished(generation, self.loop)
            self.server._settle(generation.observed, "cancelled")
        elif self.observed is not None and self.observed.outcome == "pending":
            self.server._settle(self.observed, "cancelled")
        self.observed = None

    # -- requests --

    def _parse(self) -> None:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        lines = bytes(self.buffer[:end]).split(b"\r\n")
        method, target, _version = (lines[0].split(b" ") + [b"", b""])[:3]
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
        rest = bytes(self.buffer[end + 4:])
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = self._dechunk(rest)
            if body is None:
                return
            body_bytes, used = body
        else:
            length = int(headers.get("content-length", "0") or 0)
            if len(rest) < length:
                return
            body_bytes, used = rest[:length], length
        del self.buffer[:end + 4 + used]
        if self.idle_handle is not None:
            self.idle_handle.cancel()
            self.idle_handle = None
        if headers.get("connection", "").lower() == "close":
            self.close_after = True
        self._handle(method.decode("latin-1"), target.decode("latin-1"), headers, body_bytes)

    @staticmethod
    def _dechunk(data: bytes) -> tuple[bytes, int] | None:
        pieces: list[bytes] = []
        position = 0
        while True:
            newline = data.find(b"\r\n", position)
            if newline < 0:
                return None
            size = int(data[position:newline].split(b";")[0], 16)
            start = newline + 2
            if size == 0:
                trailer_end = data.find(b"\r\n\r\n", newline)
                return (b"".join(pieces), trailer_end + 4) if trailer_end >= 0 else None
            if len(data) < start + size + 2:
                return None
            pieces.append(data[start:start + size])
            position = start + size + 2

    def _handle(self, method: str, target: str, headers: dict[str, str], body: bytes) -> None:
        server = self.server
        config = server.config
        path = target.split("?", 1)[0]
        behaviour = headers.get(BEHAVIOUR_HEADER.decode(), config.behaviour)
        if behaviour not in BEHAVIOURS:
            behaviour = config.behaviour
        if path in ("/v1/completions", "/v1/chat/completions"):
            observed = ObservedRequest(method, path, headers, body, behaviour, time.monotonic())
            server._record(observed)
            self.observed = observed
            if method != "POST":
                self._reject(405, "Method Not Allowed", "MethodNotAllowed")
                return
            try:
                payload = self._validate(body, path == "/v1/chat/completions", behaviour)
            except _Rejection as rejection:
                self._reject(rejection.status, str(rejection), rejection.kind)
                return
            generation = _Generation(self, observed, payload, path == "/v1/chat/completions", config, body)
            self.generation = generation
            if generation.stream and behaviour != "wedged":
                self.write(b"HTTP/1.1 200 OK\r\ndate: %s\r\nserver: uvicorn\r\n"
                           b"content-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"
                           % _http_date())
            server._engine.submit(generation, self.loop)
            return
        if method == "GET" and path == "/metrics":
            self.write_response(200, b"text/plain; version=0.0.4; charset=utf-8", server._engine.metrics_page())
        elif method == "GET" and path == "/health":
            self.write_response(200, b"application/json", b"")
        elif method == "GET" and path == "/v1/models":
            self.write_response(200, b"application/json", json.dumps(
                {"object": "list", "data": [{"id": config.model, "object": "model", "owned_by": "vllm"}]}).encode())
        else:
            self.write_response(404, b"application/json", b'{"detail":"Not Found"}')
        self._next()

    def _validate(self, body: bytes, chat: bool, behaviour: str) -> dict[str, Any]:
        config = self.server.config
        if behaviour == "bad_request":
            raise _Rejection(config.error_status, "the fake server was told to refuse this request",
                             "BadRequestError")
        try:
            payload = json.loads(body)
        except ValueError:
            raise _Rejection(400, "request body is not valid JSON", "BadRequestError") from None
        if not isinstance(payload, dict):
            raise _Rejection(400, "request body must be a JSON object", "BadRequestError")
        model = payload.get("model")
        if model is not None and model != config.model:
            raise _Rejection(404, f"The model `{model}` does not exist.", "NotFoundError")
        if chat and not isinstance(payload.get("messages"), list):
            raise _Rejection(400, "'messages' is a required list", "BadRequestError")
        if not chat and not isinstance(payload.get("prompt"), (str, list)):
            raise _Rejection(400, "'prompt' is required", "BadRequestError")
        max_tokens = payload.get("max_tokens", payload.get("max_completion_tokens"))
        if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)
                                       or max_tokens < 1):
            raise _Rejection(400, f"max_tokens must be at least 1, got {max_tokens!r}", "BadRequestError")
        return payload

    def _reject(self, status: int, message: str, kind: str) -> None:
        observed = self.observed
        self.write_response(status, b"application/json", error_body(status, message, kind))
        if observed is not None:
            observed.status = status
            self.server._settle(observed, "rejected")
        self.observed = None
        self._next()

    # -- responses --

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def write_response(self, status: int, content_type: bytes, body: bytes) -> None:
        reason = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 405: b"Method Not Allowed"}.get(status, b"Error")
        self.write(b"HTTP/1.1 %d %s\r\ndate: %s\r\nserver: uvicorn\r\ncontent-length: %d\r\n"
                   b"content-type: %s\r\n%s\r\n%s"
                   % (status, reason, _http_date(), len(body), content_type,
                      b"connection: close\r\n" if self.close_after else b"", body))

    def generation_finished(self, generation: _Generation, outcome: str) -> None:
        generation.done = True
        self.generation = None
        self.server._engine.finished(generation, self.loop)
        generation.observed.status = 200
        self.server._settle(generation.observed, outcome)
        self.observed = None
        self._next()

    def _next(self) -> None:
        if self.close_after:
            if self.transport is not None:
                self.transport.close()
            return
        self._arm_idle()
        if self.buffer:
            self._parse()


class FakeOpenAIServer:
    """The fake server on its own event loop in a daemon thread; a context manager (``with FakeOpenAIServer(...)``)."""

    def __init__(self, config: FakeServerConfig | None = None, *, host: str = "127.0.0.1", port: int = 0,
                 ssl_context: ssl.SSLContext | None = None, **overrides: Any) -> None:
        self.config = dataclasses.replace(config or FakeServerConfig(), **overrides)
        self.ssl_context = ssl_context
        self.host = host
        self.port = port
        self._requests: list[ObservedRequest] = []
        self._changed = threading.Condition()
        self._connections: set[_FakeConnection] = set()
        self._engine = _Engine(self)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None

    # -- lifecycle --

    def __enter__(self) -> FakeOpenAIServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> None:
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            try:
                asyncio.run(self.serve(on_ready=ready.set))
            except BaseException as error:  # noqa: BLE001 (reported to the starting thread)
                failure.append(error)
                ready.set()

        self._thread = threading.Thread(target=run, name="fake-openai-server", daemon=True)
        self._thread.start()
        ready.wait(10)
        if failure:
            raise failure[0]

    async def serve(self, on_ready: Callable[[], None] | None = None) -> None:
        """Serve until ``close`` (or, as a process, SIGTERM)."""
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        server = await self._loop.create_server(lambda: _FakeConnection(self), self.host, self.port,
                                                ssl=self.ssl_context)
        self.port = server.sockets[0].getsockname()[1]
        if on_ready is not None:
            on_ready()
        try:
            await self._stopped.wait()
        finally:
            server.close()
            for connection in list(self._connections):
                if connection.transport is not None:
                    connection.transport.abort()
            await asyncio.sleep(0)

    def close(self) -> None:
        """Stop serving and drop every connection (idempotent)."""
        loop, self._loop = self._loop, None
        if loop is not None and self._stopped is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._stopped.set)
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def stop_soon(self) -> None:
        """Stop from inside the server's own loop (a signal handler)."""
        if self._stopped is not None:
            self._stopped.set()

    def reconfigure(self, **changes: Any) -> None:
        """Change the behaviour of requests that arrive from now on (e.g. ``reconfigure(behaviour="wedged")``)."""
        self.config = dataclasses.replace(self.config, **changes)

    # -- observation --

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{'https' if self.ssl_context else 'http'}://{self.host}:{self.port}"

    @property
    def requests(self) -> list[ObservedRequest]:
        with self._changed:
            return list(self._requests)

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    def wait_until(self, predicate: Callable[[FakeOpenAIServer], bool], timeout_s: float = 5.0) -> bool:
        """Wait until ``predicate(server)`` holds (re-checked whenever a request arrives or settles)."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not predicate(self):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(min(left, 0.05))
        return True

    def _record(self, observed: ObservedRequest) -> None:
        with self._changed:
            self._requests.append(observed)
            self._changed.notify_all()

    def _settle(self, observed: ObservedRequest, outcome: str) -> None:
        with self._changed:
            if observed.outcome == "pending":
                observed.outcome = outcome
                observed.finished_at = time.monotonic()
            self._changed.notify_all()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A fake OpenAI-compatible (vLLM-shaped) server.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: an ephemeral port (printed once listening).")
    parser.add_argument("--ttft-ms", type=float, default=DEFAULT_TTFT_MS)
    parser.add_argument("--tpot-ms", type=float, default=DEFAULT_TPOT_MS)
    parser.add_argument("--output-tokens", type=int, default=DEFAULT_OUTPUT_TOKENS)
    parser.add_argument("--behaviour", choices=BEHAVIOURS, default="normal")
    parser.add_argument("--max-num-seqs", type=int, default=DEFAULT_MAX_NUM_SEQS)
    parser.add_argument("--keep-alive-s", type=float, default=DEFAULT_KEEP_ALIVE_S)
    args = parser.parse_args(argv)
    server = FakeOpenAIServer(FakeServerConfig(
        ttft_ms=args.ttft_ms, tpot_ms=args.tpot_ms, output_tokens=args.output_tokens, behaviour=args.behaviour,
        max_num_seqs=args.max_num_seqs, keep_alive_s=args.keep_alive_s), host=args.host, port=args.port)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, server.stop_soon)

        def ready() -> None:
            print(f"listening on {server.address}", flush=True)

        await server.serve(on_ready=ready)

    asyncio.run(run())
    sys.exit(0)


if __name__ == "__main__":
    main()
