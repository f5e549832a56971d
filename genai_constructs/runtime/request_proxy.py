"""Per-request measuring reverse proxy in front of the model server: what users feel, one record per request.

Why it exists. The load balancer's own latency metric cannot see what a streaming LLM user feels. ALB's
``TargetResponseTime`` "is equivalent to the target_processing_time field in the access logs" (ALB CloudWatch
metrics, https://docs.aws.amazon.com/elasticloadbalancing/latest/application/load-balancer-cloudwatch-metrics.html),
and ``target_processing_time`` runs "from the time the load balancer sent the request to a target until the target
started to send the response headers" (ALB access logs,
https://docs.aws.amazon.com/elasticloadbalancing/latest/application/load-balancer-access-logs.html). vLLM sends the
headers of a streamed completion at once and its first token later, so that metric says nothing about time to first
token (TTFT) or time per output token (TPOT). This proxy sits between the ALB and vLLM on every instance, watches
the response stream as it passes, and writes exactly one structured record per completion request.

Where it sits. vLLM runs in a container published on 127.0.0.1 (``--upstream``); the target group sends to this
proxy (``--listen``). Completion requests (a POST to ``/v1/completions`` or ``/v1/chat/completions``) pass an
admission gate of ``--max-concurrency`` (vLLM's ``--max-num-seqs``: vLLM would queue the rest itself, so the proxy's
queue is where the wait becomes visible as ``queue_ms``); everything else (probes, ``/metrics``, ``/health``) passes
straight through, unmeasured. Each response is forwarded as it arrives: every chunk read from vLLM is written to the
client at once, before it is inspected for tokens (only its chunk framing is read first, to know where the response
ends).

Several replicas. An instance may run several model servers (replicas, each on its own devices and loopback port:
``--upstream`` repeated). Each admitted request goes to the replica with the fewest requests in flight (ties: round
robin), and ``--max-concurrency`` is each replica's own cap (its ``--max-num-seqs``): a request waits here only when
every replica is full. A replica that refuses the connection (its container restarting) is passed over for
``REPLICA_RETRY_S`` and the request goes to the next one; only when every replica has refused it does the caller get a
502. The gauges are the instance's: running and waiting summed over the replicas, KV cache usage averaged.

AWS behaviour relied on:

* Keep-alive longer than the ALB's idle timeout (``--keep-alive-s``; the fleet passes its idle timeout + 60 s, both
  sized from the traffic's longest stream, ``GpuInferenceFleet.drain``; the default, 360 s, is above a 300 s one): "we
  also recommend that you configure the idle timeout of your application to be larger than the idle timeout
  configured for the load balancer. Otherwise ... the load balancer sends an HTTP 502 Bad Gateway error to the
  client" (ALB attributes, connection idle timeout,
  https://docs.aws.amazon.com/elasticloadbalancing/latest/application/edit-load-balancer-attributes.html#connection-idle-timeout).
* Records are CloudWatch embedded metric format documents: a JSON object with ``_aws.Timestamp`` (ms),
  ``_aws.CloudWatchMetrics`` (namespace, dimension sets, metric definitions) and the referenced members at the top
  level; CloudWatch Logs extracts the metrics, and every other member stays queryable in Logs Insights
  (https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch_Embedded_Metric_Format_Specification.html).
  Metrics are extracted from every record, so CloudWatch computes TTFT percentiles over every request.
* The CloudWatch agent's EMF listener (``"logs": {"metrics_collected": {"emf": {}}}``) accepts newline-delimited
  documents on ``tcp:25888`` and ``udp:25888``, and routes each to the log group named in ``_aws.LogGroupName``
  (https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch_Embedded_Metric_Format_Generation_CloudWatch_Agent.html).
* On scale-in the target is deregistered and the ALB stops sending it requests but lets in-flight ones finish for
  the deregistration delay, 300 s by default (target group attributes,
  https://docs.aws.amazon.com/elasticloadbalancing/latest/application/edit-target-group-attributes.html#deregistration-delay);
  on SIGTERM the proxy stops accepting and lets streams finish for ``--drain-s`` (the fleet passes its
  deregistration delay; the default is ELB's 300 s).

vLLM behaviour relied on: it aborts a request whose client goes away (its route handlers are cancelled on
``http.disconnect``), so closing the upstream connection when the caller disconnects frees the GPU at once; its
uvicorn server closes idle keep-alive connections after ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE`` (5 s by default;
``--upstream-keep-alive-s`` tells the proxy the value in force), so pooled upstream connections are reused only
while a second younger than that; it exports the gauges ``vllm:num_requests_running``,
``vllm:num_requests_waiting`` and ``vllm:kv_cache_usage_perc`` (``vllm:gpu_cache_usage_perc`` before v0.10) on
``/metrics`` (https://docs.vllm.ai/en/latest/usage/metrics.html).

Standard library only, Python 3.9+: it runs on the instance's system Python, with nothing to install.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import math
import re
import signal
import socket
import sys
import time
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import IO, Any

# ---- Defaults, each with its reason ---------------------------------------------------------------------------------

DEFAULT_LISTEN = "0.0.0.0:8000"
"""The target group's port: vLLM's conventional 8000, now answered by the proxy (vLLM moves behind it)."""
DEFAULT_KEEP_ALIVE_S = 360.0
"""Above a 300 s ALB idle timeout: the ALB, not the target, must be the side closing idle connections. GpuInferenceFleet
passes its own, its idle timeout + 60 s, both sized from the traffic (``fleet.drain``)."""
DEFAULT_EMF_ADDRESS = "tcp:127.0.0.1:25888"
"""The CloudWatch agent's default EMF listener; TCP so that a record is never silently lost to a full socket buffer."""
DEFAULT_NAMESPACE = "GenaiConstructs/Inference"
"""The library's metric namespace for inference fleets (the dashboards and alarms read it)."""
DEFAULT_METRICS_INTERVAL_S = 10.0
"""Target tracking evaluates one-minute periods; six samples a minute keep it responsive at one scrape per 10 s."""
DEFAULT_UPSTREAM_TIMEOUT_S = 600.0
"""Above the longest completion the fleet serves: silence this long means vLLM is wedged, not busy."""
DEFAULT_DRAIN_S = 300.0
"""The ALB's default deregistration delay: in-flight streams get as long as the load balancer waits for them."""

DEFAULT_UPSTREAM_KEEP_ALIVE_S = 5.0
"""vLLM's uvicorn closes idle keep-alive connections after ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE`` seconds, 5 by default;
give the value the server runs with (``--upstream-keep-alive-s``)."""
UPSTREAM_KEEP_ALIVE_MARGIN_S = 1.0
"""A pooled connection is reused only while this much younger than the server's keep-alive, so the proxy does not
send on a connection the server is closing at that moment (one stale-connection retry covers what slips through)."""
STALE_CLOSES_PER_ITERATION = 16
"""Stale pooled connections are closed a few per event-loop iteration: closing hundreds at once (a pool gone stale
over a quiet spell) would stall every stream for milliseconds."""
UPSTREAM_POOL_SPARE = 16
"""Idle upstream connections kept beyond ``--max-concurrency``: the probes and scrapes that bypass admission."""
UPSTREAM_CONNECT_TIMEOUT_S = 5.0
"""vLLM is on the same host: a connect that takes seconds means it is not listening, so answer 502 instead."""
REPLICA_RETRY_S = 2.0
"""A replica that refused a connection is passed over this long (unless the others are full): a restarting container
refuses at once, and a retry after two seconds costs one loopback connect."""
LISTEN_BACKLOG = 1024
"""Every ALB node opens its own connections; a deep accept queue absorbs a burst of them."""

MAX_HEAD_BYTES = 64 * 1024
"""Request and response heads larger than this are refused (431/502): the ALB itself caps request headers lower."""
MAX_BODY_BYTES = 64 * 1024 * 1024
"""Largest request body accepted (413 above): long prompts with inline images stay well inside it."""
MAX_PIPELINED_BYTES = 1024 * 1024
"""Bytes a client may send ahead while its previous request is in flight before the proxy stops reading from it."""
MAX_SSE_EVENT_BYTES = 1024 * 1024
"""Largest single server-sent event inspected; a larger one is forwarded but no longer parsed."""
MAX_JSON_BODY_BYTES = 16 * 1024 * 1024
"""Largest non-streamed response body kept to read its ``usage`` object; a larger one is forwarded, unparsed."""
MAX_REQUEST_ID_LENGTH = 128
"""A caller's X-Request-Id longer than this is replaced: ids are for correlation, not for carrying data."""
MAX_MODEL_NAME_LENGTH = 256
"""The request's ``model`` field is logged; longer values are cut so a record stays small."""

EMF_BUFFER_RECORDS = 10_000
"""Records kept while the agent is unreachable (about 15 MB at 1.5 KB each); beyond it the oldest are dropped."""
EMF_RECONNECT_INITIAL_S = 0.1
"""First retry of a lost agent connection: soon enough that an agent restart loses nothing."""
EMF_RECONNECT_MAX_S = 10.0
"""Backoff ceiling while the agent stays down: one connect attempt every 10 s costs nothing."""
SHUTDOWN_FLUSH_S = 2.0
"""At exit, how long buffered records may take to reach the agent (the agent is local; this is generous)."""
SCRAPE_TIMEOUT_S = 5.0
"""A ``/metrics`` scrape of a local vLLM takes milliseconds; one slower than this (or than the interval) is dropped."""
MAX_SCRAPE_BYTES = 8 * 1024 * 1024
"""vLLM's Prometheus page is tens of kilobytes (histograms per model); anything larger is not it."""

MEASURED_PATHS = frozenset({b"/v1/completions", b"/v1/chat/completions"})
"""The OpenAI-compatible generation endpoints; a POST to one of them is a measured, admitted request."""
STATUSES = ("ok", "client_error", "server_error", "cancelled", "upstream_unavailable", "timeout")
"""The values of a record's ``status`` (public: the docs and the Logs Insights queries group by them):

* ``ok``: the whole response reached the caller, with a status below 400;
* ``client_error``: the model server answered 4xx (passed through as it was);
* ``server_error``: it answered 5xx, or sent a malformed response, or closed the connection mid-response, or the
  proxy's shutdown cut the stream after the drain;
* ``cancelled``: the caller went away first (while queued, or mid-stream; the model server's request is aborted);
* ``upstream_unavailable``: the model server could not be reached, or closed the connection before answering (502);
* ``timeout``: the model server sent nothing for ``--upstream-timeout-s`` (504, or a cut stream once headers went).

``http_status`` is the status the caller got (null when it left before any)."""

# RFC 9110 section 7.6.1: fields that describe one connection, never forwarded (plus those Connection names).
HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"te", b"transfer-encoding", b"upgrade"})
_REQUEST_FIELDS_REPLACED = frozenset({b"content-length", b"x-request-id", b"expect"})
_RESPONSE_FIELDS_REPLACED = frozenset({b"x-request-id"})
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEX = re.compile(rb"[0-9A-Fa-f]{1,15}")
_HEX_DIGITS = b"0123456789abcdefABCDEF"
_DIGITS = re.compile(rb"[0-9]{1,18}")
_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:+=/@~-]{1,%d}" % MAX_REQUEST_ID_LENGTH)
_REASONS = {400: b"Bad Request", 404: b"Not Found", 413: b"Content Too Large", 431: b"Request Header Fields Too Large",
            501: b"Not Implemented", 502: b"Bad Gateway", 503: b"Service Unavailable", 504: b"Gateway Timeout",
            505: b"HTTP Version Not Supported"}
_TIMING_HEADERS = ((b"x-genai-retrieval-ms", "retrieval_ms"), (b"x-genai-preprocess-ms", "preprocess_ms"))
"""Timings the caller measured before calling (retrieval, prompt building), joined into the request's record."""


async def _stop_task(task: asyncio.Task[None] | None) -> None:
    """Cancel a background loop and wait (briefly) for it to end.

    The loops also check a closing flag: on Python 3.9 to 3.11 ``asyncio.wait_for`` can swallow a cancellation that
    arrives just as its inner operation completes, and a loop must not then run on (and shutdown wait on it) forever.
    """
    if task is None or task.done():
        return
    task.cancel()
    await asyncio.wait({task}, timeout=1.0)


def _diagnose(message: str) -> None:
    """Operational messages (not records) go to stderr, i.e. the unit's journal."""
    sys.stderr.write(f"request_proxy: {message}\n")
    sys.stderr.flush()


# ---- Configuration -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EmfAddress:
    """Where EMF records go: the agent over ``tcp`` or ``udp``, or ``none``."""

    transport: str
    host: str = ""
    port: int = 0


@dataclass(frozen=True)
class ProxyConfig:
    """Everything the command line sets (see ``parse_config``)."""

    listen_host: str
    listen_port: int
    upstreams: tuple[tuple[str, int], ...]
    """(host, port) of every replica's model server, in replica order."""
    max_concurrency: int
    """Requests forwarded at once to each replica."""
    keep_alive_s: float
    emf: EmfAddress
    namespace: str
    fleet: str
    model_version: str
    log_group: str
    instance_id: str
    availability_zone: str
    metrics_interval_s: float
    upstream_timeout_s: float
    drain_s: float
    log_file: str | None
    upstream_keep_alive_s: float = DEFAULT_UPSTREAM_KEEP_ALIVE_S


def _host_port(flag: str, example: str) -> Any:
    def parse(text: str) -> tuple[str, int]:
        host, sep, port_text = text.rpartition(":")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if not sep or not host or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not HOST:PORT with a port from 1 to 65535; give e.g. {flag} {example}")
        return host, int(port_text)
    return parse


def _positive_int(flag: str, fix: str) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1; {fix}")
        return value
    return parse


def _seconds(flag: str, fix: str, *, allow_zero: bool = False) -> Any:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
            bound = "0 or more" if allow_zero else "greater than 0"
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of seconds {bound}; {fix}")
        return value
    return parse


def check_log_file(parser: argparse.ArgumentParser, path: str | None) -> None:
    """``--log-file`` must be appendable now: a path that is not fails at start (exit 2), not at the first record."""
    if path is None:
        return
    try:
        with open(path, "ab"):
            pass
    except OSError as error:
        parser.error(f"argument --log-file: cannot append to {path!r} ({error.strerror}); give a writable path")


def _emf_address(text: str) -> EmfAddress:
    if text == "none":
        return EmfAddress("none")
    transport, _, rest = text.partition(":")
    host, sep, port_text = rest.rpartition(":")
    if transport not in ("tcp", "udp") or not sep or not host or not port_text.isdigit() \
            or not 1 <= int(port_text) <= 65535:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not tcp:HOST:PORT, udp:HOST:PORT or none; give e.g. {DEFAULT_EMF_ADDRESS} "
            "(the CloudWatch agent's EMF listener)")
    return EmfAddress(transport, host, int(port_text))


def _non_empty(flag: str) -> Any:
    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"an empty value is not allowed; give the {flag[2:].replace('-', ' ')}")
        return text
    return parse


class _Parser(argparse.ArgumentParser):
    """argparse that prints one line (the error, naming the flag, the value and the fix) instead of the usage."""

    def error(self, message: str) -> Any:
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="request_proxy", description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--listen", type=_host_port("--listen", DEFAULT_LISTEN), default=DEFAULT_LISTEN,
                        help=f"HOST:PORT the load balancer connects to (default {DEFAULT_LISTEN}).")
    parser.add_argument("--upstream", type=_host_port("--upstream", "127.0.0.1:18000"), required=True,
                        action="append",
                        help="HOST:PORT of a model server (vLLM), e.g. 127.0.0.1:18000; repeat it once per replica.")
    parser.add_argument("--max-concurrency", required=True,
                        type=_positive_int("--max-concurrency", "give each replica's vLLM --max-num-seqs, e.g. 64"),
                        help="Requests forwarded at once to each replica (its vLLM --max-num-seqs); the rest wait "
                             "here, FIFO.")
    parser.add_argument("--keep-alive-s", default=DEFAULT_KEEP_ALIVE_S,
                        type=_seconds("--keep-alive-s", "give e.g. 360 (above the load balancer's idle timeout)"),
                        help=f"Idle client connections are kept this long (default {DEFAULT_KEEP_ALIVE_S:g}).")
    parser.add_argument("--emf-address", type=_emf_address, default=DEFAULT_EMF_ADDRESS,
                        help=f"tcp:HOST:PORT, udp:HOST:PORT or none (default {DEFAULT_EMF_ADDRESS}).")
    parser.add_argument("--namespace", type=_non_empty("--namespace"), default=DEFAULT_NAMESPACE)
    parser.add_argument("--fleet", type=_non_empty("--fleet"), required=True, help="Value of the Fleet dimension.")
    parser.add_argument("--model-version", type=_non_empty("--model-version"), required=True,
                        help="Value of the ModelVersion dimension.")
    parser.add_argument("--log-group", type=_non_empty("--log-group"), required=True,
                        help="Log group the agent writes the records to (_aws.LogGroupName).")
    parser.add_argument("--instance-id", type=_non_empty("--instance-id"), required=True)
    parser.add_argument("--availability-zone", type=_non_empty("--availability-zone"), required=True)
    parser.add_argument("--metrics-interval-s", default=DEFAULT_METRICS_INTERVAL_S,
                        type=_seconds("--metrics-interval-s", "give e.g. 10"),
                        help=f"Fleet gauges are published this often (default {DEFAULT_METRICS_INTERVAL_S:g}).")
    parser.add_argument("--upstream-timeout-s", default=DEFAULT_UPSTREAM_TIMEOUT_S,
                        type=_seconds("--upstream-timeout-s", "give e.g. 600 (above the longest completion)"),
                        help=f"Upstream silence that ends a request with 504 (default {DEFAULT_UPSTREAM_TIMEOUT_S:g}).")
    parser.add_argument("--upstream-keep-alive-s", default=DEFAULT_UPSTREAM_KEEP_ALIVE_S, type=_seconds(
        "--upstream-keep-alive-s", "give the model server's VLLM_HTTP_TIMEOUT_KEEP_ALIVE, e.g. 5"),
        help="The model server's idle keep-alive (vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE); pooled connections are "
             f"reused up to {UPSTREAM_KEEP_ALIVE_MARGIN_S:g} s short of it "
             f"(default {DEFAULT_UPSTREAM_KEEP_ALIVE_S:g}).")
    parser.add_argument("--drain-s", default=DEFAULT_DRAIN_S, type=_seconds(
        "--drain-s", "give e.g. 300 (the load balancer's deregistration delay)", allow_zero=True),
        help=f"On SIGTERM, in-flight streams may finish for this long (default {DEFAULT_DRAIN_S:g}).")
    parser.add_argument("--log-file", default=None,
                        help="Also append every record to this file (with --emf-address none: instead of stdout).")
    return parser


def parse_config(argv: list[str] | None = None) -> ProxyConfig:
    """The configuration from the command line; a bad value exits 2 with one line naming the flag and the fix."""
    parser = build_parser()
    args = parser.parse_args(argv)
    seen: set[tuple[str, int]] = set()
    for host, port in args.upstream:
        if (host, port) in seen:
            parser.error(f"argument --upstream: '{host}:{port}' is given twice; give each replica's HOST:PORT once "
                         "(replica N listens on the base port + N)")
        seen.add((host, port))
    check_log_file(parser, args.log_file)
    return ProxyConfig(
        listen_host=args.listen[0], listen_port=args.listen[1],
        upstreams=tuple(args.upstream),
        max_concurrency=args.max_concurrency, keep_alive_s=args.keep_alive_s, emf=args.emf_address,
        namespace=args.namespace, fleet=args.fleet, model_version=args.model_version, log_group=args.log_group,
        instance_id=args.instance_id, availability_zone=args.availability_zone,
        metrics_interval_s=args.metrics_interval_s, upstream_timeout_s=args.upstream_timeout_s,
        drain_s=args.drain_s, log_file=args.log_file, upstream_keep_alive_s=args.upstream_keep_alive_s,
    )


# ---- Record shipping: never awaited on the request path -----------------------------------------------------------


class _TcpLineShipper:
    """Newline-delimited records to the agent over one TCP connection, reconnecting with backoff.

    ``send`` writes straight to the socket when it is connected and not backed up (one non-blocking send); otherwise
    the line waits in a bounded buffer that drops its oldest line (counted in ``dropped``) when full. Lines already
    handed to the kernel when a connection breaks are lost with it: EMF is at-least-once only while the agent is up.
    """

    def __init__(self, host: str, port: int, capacity: int = EMF_BUFFER_RECORDS) -> None:
        self.host = host
        self.port = port
        self.pending: collections.deque[bytes] = collections.deque()
        self.capacity = capacity
        self.dropped = 0
        self._transport: asyncio.Transport | None = None
        self._paused = False
        self._lost: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._unreachable_since: float | None = None
        self._closing = False

    def start(self) -> None:
        self._lost = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._connect_forever())

    def send(self, line: bytes) -> None:
        if self._transport is not None and not self._paused and not self.pending:
            self._transport.write(line)
            return
        if len(self.pending) >= self.capacity:
            self.pending.popleft()
            self.dropped += 1
        self.pending.append(line)

    def _flush(self) -> None:
        if self._transport is not None and not self._paused and self.pending:
            batch = b"".join(self.pending)
            self.pending.clear()
            self._transport.write(batch)

    async def _connect_forever(self) -> None:
        assert self._lost is not None
        loop = asyncio.get_running_loop()
        backoff = EMF_RECONNECT_INITIAL_S
        while not self._closing:
            try:
                transport, _ = await asyncio.wait_for(
                    loop.create_connection(lambda: _ShipperProtocol(self), self.host, self.port),
                    UPSTREAM_CONNECT_TIMEOUT_S)
            except (OSError, asyncio.TimeoutError) as error:  # noqa: UP041 (distinct classes on Python 3.9)
                if self._unreachable_since is None:
                    self._unreachable_since = time.monotonic()
                    _diagnose(f"EMF agent at tcp:{self.host}:{self.port} unreachable ({error or 'timeout'}); "
                              f"buffering up to {self.capacity} records and retrying")
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, EMF_RECONNECT_MAX_S)
                continue
            if self._unreachable_since is not None:
                _diagnose(f"EMF agent at tcp:{self.host}:{self.port} reachable again; "
                          f"{len(self.pending)} buffered records sent, {self.dropped} dropped so far")
                self._unreachable_since = None
            backoff = EMF_RECONNECT_INITIAL_S
            self._transport = transport
            self._paused = False
            self._flush()
            await self._lost.wait()
            self._lost.clear()

    def _connection_lost(self) -> None:
        self._transport = None
        if self._lost is not None:
            self._lost.set()

    def _set_paused(self, paused: bool) -> None:
        self._paused = paused
        if not paused:
            self._flush()

    async def close(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and (
                self.pending or (self._transport is not None and self._transport.get_write_buffer_size())):
            if self._transport is None and self._unreachable_since is not None:
                break  # the agent is down: waiting cannot deliver anything
            await asyncio.sleep(0.01)
        self._closing = True
        await _stop_task(self._task)
        if self._transport is not None:
            self._transport.close()


class _ShipperProtocol(asyncio.Protocol):
    def __init__(self, shipper: _TcpLineShipper) -> None:
        self.shipper = shipper

    def connection_lost(self, exc: Exception | None) -> None:
        self.shipper._connection_lost()

    def eof_received(self) -> bool:
        return False  # the agent closed its side: reconnect

    def pause_writing(self) -> None:
        self.shipper._set_paused(True)

    def resume_writing(self) -> None:
        self.shipper._set_paused(False)


class _UdpLineSender:
    """One datagram per record (the agent's UDP listener reads one document per datagram); a failed send is a drop."""

    def __init__(self, host: str, port: int) -> None:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        self.address = address
        self.socket = socket.socket(family, kind, proto)
        self.socket.setblocking(False)
        self.dropped = 0

    def send(self, line: bytes) -> None:
        try:
            self.socket.sendto(line, self.address)
        except OSError:
            self.dropped += 1

    def close(self) -> None:
        self.socket.close()


class _FileLineWriter:
    """Records appended to a file (or stdout) from a worker thread, so a slow disk or pipe never stalls a request."""

    def __init__(self, stream: IO[bytes], capacity: int = EMF_BUFFER_RECORDS) -> None:
        self.stream = stream
        self.pending: collections.deque[bytes] = collections.deque()
        self.capacity = capacity
        self.dropped = 0
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._writing = False
        self._closing = False

    def start(self) -> None:
        self._wakeup = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._write_forever())

    def send(self, line: bytes) -> None:
        if len(self.pending) >= self.capacity:
            self.pending.popleft()
            self.dropped += 1
        self.pending.append(line)
        if self._wakeup is not None:
            self._wakeup.set()

    def _write(self, batch: bytes) -> None:
        self.stream.write(batch)
        self.stream.flush()

    async def _write_forever(self) -> None:
        assert self._wakeup is not None
        loop = asyncio.get_running_loop()
        while not self._closing:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self.pending:
                batch = b"".join(self.pending)
                self.pending.clear()
                self._writing = True
                try:
                    await loop.run_in_executor(None, self._write, batch)
                except OSError as error:
                    _diagnose(f"cannot write records to {getattr(self.stream, 'name', 'stdout')}: {error}")
                finally:
                    self._writing = False

    async def close(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while (self.pending or self._writing) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        self._closing = True
        await _stop_task(self._task)


class RecordSink:
    """Fans each record out to the EMF transport and, optionally, a local file (or stdout when EMF is off)."""

    def __init__(self, config: ProxyConfig) -> None:
        self.tcp: _TcpLineShipper | None = None
        self.udp: _UdpLineSender | None = None
        self.file: _FileLineWriter | None = None
        self._log_file: IO[bytes] | None = None
        if config.emf.transport == "tcp":
            self.tcp = _TcpLineShipper(config.emf.host, config.emf.port)
        elif config.emf.transport == "udp":
            self.udp = _UdpLineSender(config.emf.host, config.emf.port)
        if config.log_file is not None:
            self._log_file = open(config.log_file, "ab")  # noqa: SIM115 (closed in close())
            self.file = _FileLineWriter(self._log_file)
        elif config.emf.transport == "none":
            self.file = _FileLineWriter(sys.stdout.buffer)
        self._reported_drops = 0

    def start(self) -> None:
        if self.tcp is not None:
            self.tcp.start()
        if self.file is not None:
            self.file.start()

    def emit(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":")).encode() + b"\n"
        if self.tcp is not None:
            self.tcp.send(line)
        if self.udp is not None:
            self.udp.send(line)
        if self.file is not None:
            self.file.send(line)

    @property
    def dropped(self) -> int:
        return sum(part.dropped for part in (self.tcp, self.udp, self.file) if part is not None)

    def report_drops(self) -> None:
        """Say on stderr how many records were lost since the last report (called once per gauge interval)."""
        dropped = self.dropped
        if dropped > self._reported_drops:
            _diagnose(f"{dropped - self._reported_drops} records dropped (agent unreachable or slow), "
                      f"{dropped} since start")
            self._reported_drops = dropped

    async def close(self, timeout_s: float) -> None:
        if self.tcp is not None:
            await self.tcp.close(timeout_s)
        if self.udp is not None:
            self.udp.close()
        if self.file is not None:
            await self.file.close(timeout_s)
        if self._log_file is not None:
            self._log_file.close()


def _emf_metadata(config: ProxyConfig, metrics: list[dict[str, str]]) -> dict[str, Any]:
    return {
        "Timestamp": int(time.time() * 1000),
        "LogGroupName": config.log_group,
        "CloudWatchMetrics": [{
            "Namespace": config.namespace,
            "Dimensions": [["Fleet"], ["Fleet", "ModelVersion"]],
            "Metrics": metrics,
        }],
    }


# ---- Admission ----------------------------------------------------------------------------------------------------


class Replica:
    """One model server behind the proxy: its pool of connections, the admitted requests it runs, and until when it
    is passed over after refusing a connection."""

    __slots__ = ("index", "host", "port", "authority", "pool", "active", "down_until")

    def __init__(self, index: int, host: str, port: int, *, max_idle: int, keep_alive_s: float) -> None:
        self.index = index
        self.host = host
        self.port = port
        self.authority = f"{host}:{port}".encode()
        self.pool = UpstreamPool(host, port, max_idle=max_idle, keep_alive_s=keep_alive_s)
        self.active = 0
        self.down_until = 0.0

    @property
    def label(self) -> str:
        return f"{self.host}:{self.port}"

    def mark_down(self) -> None:
        self.down_until = time.monotonic() + REPLICA_RETRY_S

    def mark_up(self) -> None:
        self.down_until = 0.0


class Admission:
    """At most ``limit`` requests upstream at once on each replica; the rest wait first come, first served.

    An admitted request is given the replica with the fewest requests in flight, replicas passed over after a refused
    connection last, ties in turn (round robin). A free slot is taken without awaiting anything; a released slot
    passes straight to the oldest waiter that may use that replica (not one it was refused by), so a request arriving
    at that moment cannot jump the queue.
    """

    def __init__(self, replicas: list[Replica], limit: int) -> None:
        self.replicas = replicas
        self.limit = limit
        self.waiters: collections.deque[tuple[asyncio.Future[Replica], frozenset[int]]] = collections.deque()
        self._next = 0

    @property
    def waiting(self) -> int:
        return len(self.waiters)

    @property
    def active(self) -> int:
        return sum(replica.active for replica in self.replicas)

    def route(self, exclude: frozenset[int] = frozenset(), *, capped: bool = True) -> Replica | None:
        """The replica for the next request, not one in ``exclude``; with ``capped``, only one with a free slot."""
        now = time.monotonic()
        count = len(self.replicas)
        best: Replica | None = None
        best_key = (True, 0)
        for offset in range(count):
            replica = self.replicas[(self._next + offset) % count]
            if replica.index in exclude or (capped and replica.active >= self.limit):
                continue
            key = (now < replica.down_until, replica.active)
            if best is None or key < best_key:
                best, best_key = replica, key
        if best is not None:
            self._next = (best.index + 1) % count
        return best

    def try_acquire(self, exclude: frozenset[int] = frozenset()) -> Replica | None:
        """Take a free slot if there is one and nobody is waiting for it."""
        if self.waiters:
            return None
        replica = self.route(exclude)
        if replica is not None:
            replica.active += 1
        return replica

    async def acquire(self, exclude: frozenset[int] = frozenset()) -> Replica:
        replica = self.try_acquire(exclude)
        if replica is not None:
            return replica
        waiter: asyncio.Future[Replica] = asyncio.get_running_loop().create_future()
        entry = (waiter, exclude)
        self.waiters.append(entry)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release(waiter.result())  # the slot was handed over just as the caller went away: pass it on
            else:
                try:
                    self.waiters.remove(entry)
                except ValueError:
                    pass
            raise

    def release(self, replica: Replica) -> None:
        replica.active -= 1
        kept: collections.deque[tuple[asyncio.Future[Replica], frozenset[int]]] = collections.deque()
        while self.waiters:
            waiter, exclude = self.waiters.popleft()
            if waiter.done():
                continue
            chosen = self.route(exclude)
            if chosen is None:
                kept.append((waiter, exclude))
                if all(other.active >= self.limit for other in self.replicas):
                    break  # no free slot left for anyone behind it either
                continue
            chosen.active += 1
            waiter.set_result(chosen)
            if all(other.active >= self.limit for other in self.replicas):
                break
        kept.extend(self.waiters)
        self.waiters = kept


# ---- HTTP/1.1 framing ----------------------------------------------------------------------------------------------

_SIZE, _DATA, _DATA_END, _TRAILER = 0, 1, 2, 3


class ChunkedDecoder:
    """Incremental ``Transfer-Encoding: chunked`` decoder (RFC 9112 section 7.1).

    ``feed`` returns the payload pieces found in the bytes given and how many of them belong to this message, so the
    caller can forward exactly the message's bytes; ``done`` turns true after the last chunk and its trailers.
    """

    __slots__ = ("_state", "_remaining", "_line", "done")

    def __init__(self) -> None:
        self._state = _SIZE
        self._remaining = 0
        self._line = b""
        self.done = False

    def feed(self, data: bytes) -> tuple[list[bytes], int]:
        pieces: list[bytes] = []
        position = 0
        end = len(data)
        while position < end and not self.done:
            state = self._state
            if state == _SIZE and not self._line:
                # The common case, a whole chunk (size line, data, CRLF) in the bytes at hand: one pass, no copies
                # beyond the payload slice.
                newline = data.find(b"\r\n", position, position + 18)
                if newline > position:
                    size_field = data[position:newline]
                    if not size_field.strip(_HEX_DIGITS):
                        size = int(size_field, 16)
                        data_end = newline + 2 + size
                        if size and data[data_end:data_end + 2] == b"\r\n":
                            pieces.append(data[newline + 2:data_end])
                            position = data_end + 2
                            continue
            if state == _DATA:
                take = min(self._remaining, end - position)
                pieces.append(data if take == end and position == 0 else data[position:position + take])
                position += take
                self._remaining -= take
                if not self._remaining:
                    self._state = _DATA_END
            elif state == _DATA_END:
                taken = data[position:position + 2 - len(self._line)]
                position += len(taken)
                self._line += taken
                if len(self._line) == 2:
                    if self._line != b"\r\n":
                        raise ValueError("chunk data not followed by CRLF")
                    self._line = b""
                    self._state = _SIZE
            else:
                newline = data.find(b"\n", position)
                if newline < 0:
                    self._line += data[position:]
                    if len(self._line) > MAX_HEAD_BYTES:
                        raise ValueError("chunk size line or trailer too long")
                    return pieces, end
                line = data[position:newline]
                if self._line:
                    line = self._line + line
                    self._line = b""
                position = newline + 1
                if line.endswith(b"\r"):
                    line = line[:-1]
                if state == _SIZE:
                    size_field = line.split(b";", 1)[0].strip(b" \t")
                    if not _HEX.fullmatch(size_field):
                        raise ValueError(f"bad chunk size {size_field[:20]!r}")
                    self._remaining = int(size_field, 16)
                    self._state = _DATA if self._remaining else _TRAILER
                elif not line:
                    self.done = True
        return pieces, position


@dataclass
class RequestHead:
    """A parsed request line and its header fields (lower-cased name, value, the line as received)."""

    method: bytes
    target: bytes
    version: bytes
    fields: list[tuple[bytes, bytes, bytes]]

    def get(self, name: bytes) -> bytes | None:
        for lower, value, _ in self.fields:
            if lower == name:
                return value
        return None


class BadRequest(ValueError):
    """A message the proxy refuses itself (status and a message for the caller); the connection is then closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _parse_fields(lines: list[bytes]) -> list[tuple[bytes, bytes, bytes]]:
    fields = []
    for line in lines:
        name, sep, value = line.partition(b":")
        if not sep or not _TOKEN.fullmatch(name):
            raise ValueError(f"malformed header line {line[:40]!r}")
        fields.append((name.lower(), value.strip(b" \t"), line))
    return fields


def parse_request_head(head: bytes) -> RequestHead:
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or not parts[1]:
        raise BadRequest(400, "malformed request line")
    if parts[2] not in (b"HTTP/1.1", b"HTTP/1.0"):
        raise BadRequest(505, "only HTTP/1.1 and HTTP/1.0 are served")
    try:
        fields = _parse_fields(lines[1:])
    except ValueError as error:
        raise BadRequest(400, str(error)) from None
    return RequestHead(parts[0], parts[1], parts[2], fields)


def _connection_tokens(fields: list[tuple[bytes, bytes, bytes]]) -> set[bytes]:
    tokens: set[bytes] = set()
    for lower, value, _ in fields:
        if lower == b"connection":
            tokens.update(token.strip().lower() for token in value.split(b","))
    return tokens


def _body_framing(fields: list[tuple[bytes, bytes, bytes]]) -> tuple[bool, int | None]:
    """(chunked, content length) of a message; both given, several differing lengths or a bad one is refused."""
    codings = [value for lower, value, _ in fields if lower == b"transfer-encoding"]
    lengths = {value for lower, value, _ in fields if lower == b"content-length"}
    if codings:
        if lengths:
            raise BadRequest(400, "both Transfer-Encoding and Content-Length given")
        if [c.strip().lower() for c in b",".join(codings).split(b",")] != [b"chunked"]:
            raise BadRequest(501, "only the chunked transfer coding is supported")
        return True, None
    if not lengths:
        return False, None
    if len(lengths) > 1 or not _DIGITS.fullmatch(next(iter(lengths))):
        raise BadRequest(400, "malformed Content-Length")
    return False, int(next(iter(lengths)))


# ---- Response stream measurement ------------------------------------------------------------------------------------

_TOKEN_EVENT = re.compile(
    rb'"(?:text|content|reasoning_content|reasoning)": ?"[^"]|"tool_calls": ?\[ ?\{')
"""A choice carrying generated output: a non-empty ``text`` (completions), ``content`` or ``reasoning``/
``reasoning_content`` (chat deltas) string, or a non-empty ``tool_calls`` list.

A byte pattern, not a JSON decode: inside a JSON string every quote is escaped, so ``"text":"`` can only be a key
followed by a string value, and an empty string is ``""``. Measured on vLLM-shaped chunks on the development machine:
0.45 us per event, against 3.8 us for ``json.loads`` (``benchmarks/request_path_overhead.py --micro``); it runs for
every event of every stream."""
_USAGE_KEY = b'"usage":'
_USAGE_OBJECT = re.compile(rb'"usage": ?\{')


def _usage_object_at(data: bytes, start: int = 0) -> int:
    """Offset of the ``{`` of a ``"usage": {...}`` member in ``data`` (searching from the end), or -1."""
    at = data.rfind(_USAGE_KEY, start)
    while at >= start:
        value_at = at + len(_USAGE_KEY)
        while data[value_at:value_at + 1] in (b" ", b"\t", b"\r", b"\n"):
            value_at += 1
        if data[value_at:value_at + 1] == b"{":
            return value_at
        at = data.rfind(_USAGE_KEY, start, at)
    return -1


def _read_usage(data: bytes, at: int) -> tuple[int | None, int | None]:
    """(prompt_tokens, completion_tokens) of the usage object starting at ``at``; a malformed one gives (None, None)."""
    try:
        usage, _ = json.JSONDecoder().raw_decode(data[at:].decode("utf-8", "replace"))
    except ValueError:
        return None, None
    if not isinstance(usage, dict):
        return None, None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return (prompt if isinstance(prompt, int) else None, completion if isinstance(completion, int) else None)


class SseMeter:
    """Watches a ``text/event-stream`` body: when token-carrying events arrive, how many, and the last usage object.

    Events are split on the blank line that ends them (``\\n\\n``, or ``\\r\\n\\r\\n`` when the stream uses CRLF);
    each is matched in place against ``_TOKEN_EVENT``; the one JSON decode per stream is of the last event without
    tokens that carried a ``usage`` object (vLLM's final chunk when ``stream_options.include_usage`` is set), done
    once the stream ended.
    """

    __slots__ = ("_tail", "_delimiter", "first_token_at", "last_token_at", "token_events", "_usage_event", "overflow")

    def __init__(self) -> None:
        self._tail = b""
        self._delimiter: bytes | None = None
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.token_events = 0
        self._usage_event = b""
        self.overflow = False

    def feed(self, payload: bytes, now: float) -> None:
        if self.overflow:
            return
        if self._tail:
            payload = self._tail + payload
            self._tail = b""
        delimiter = self._delimiter
        if delimiter is None:
            newline = payload.find(b"\n")
            if newline < 0:
                self._keep_tail(payload)
                return
            delimiter = self._delimiter = b"\r\n\r\n" if payload[newline - 1:newline] == b"\r" else b"\n\n"
        start = 0
        while True:
            boundary = payload.find(delimiter, start)
            if boundary < 0:
                break
            if _TOKEN_EVENT.search(payload, start, boundary) is not None:
                if self.first_token_at is None:
                    self.first_token_at = now
                self.last_token_at = now
                self.token_events += 1
            elif _USAGE_OBJECT.search(payload, start, boundary) is not None:
                # The usage chunk is the stream's last data event and has no choices (vLLM's and OpenAI's shape).
                self._usage_event = payload[start:boundary]
            start = boundary + len(delimiter)
        if start < len(payload):
            self._keep_tail(payload[start:] if start else payload)

    def _keep_tail(self, rest: bytes) -> None:
        if len(rest) > MAX_SSE_EVENT_BYTES:
            self.overflow = True
        else:
            self._tail = rest

    def usage(self) -> tuple[int | None, int | None]:
        if not self._usage_event:
            return None, None
        return _read_usage(self._usage_event, _usage_object_at(self._usage_event))


class JsonMeter:
    """Keeps a non-streamed response body to read its ``usage`` object once it is complete."""

    __slots__ = ("_pieces", "_size", "overflow")

    def __init__(self) -> None:
        self._pieces: list[bytes] = []
        self._size = 0
        self.overflow = False

    def feed(self, payload: bytes, now: float) -> None:
        self._size += len(payload)
        if self._size > MAX_JSON_BODY_BYTES:
            self.overflow = True
            self._pieces.clear()
        elif not self.overflow:
            self._pieces.append(payload)

    def usage(self) -> tuple[int | None, int | None]:
        body = b"".join(self._pieces)
        at = _usage_object_at(body)
        return _read_usage(body, at) if at >= 0 else (None, None)


# ---- Upstream connections -------------------------------------------------------------------------------------------


class UpstreamConnection(asyncio.Protocol):
    """One keep-alive connection to the model server, lent to one exchange at a time."""

    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.exchange: Exchange | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.pool.open.add(self)

    def data_received(self, data: bytes) -> None:
        exchange = self.exchange
        if exchange is None:
            self.abort()  # bytes nobody asked for: the connection's framing can no longer be trusted
            return
        exchange.on_upstream_data(data)

    def eof_received(self) -> bool:
        exchange = self.exchange
        if exchange is not None:
            exchange.on_upstream_eof()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        exchange, self.exchange = self.exchange, None
        if exchange is not None:
            exchange.on_upstream_lost()

    def abort(self) -> None:
        """Close at once, dropping whatever is unsent: vLLM sees the disconnect and aborts the request."""
        self.exchange = None
        if self.transport is not None and not self.closed:
            self.transport.abort()


class UpstreamPool:
    """Idle keep-alive connections to the model server, most recently used first (its socket is warmest)."""

    def __init__(self, host: str, port: int, max_idle: int, keep_alive_s: float) -> None:
        self.host = host
        self.port = port
        self.max_idle = max_idle
        self.max_idle_s = max(0.0, keep_alive_s - UPSTREAM_KEEP_ALIVE_MARGIN_S)
        self.idle: dict[UpstreamConnection, float] = {}
        self.open: set[UpstreamConnection] = set()
        self._purging = False

    def take_idle(self) -> UpstreamConnection | None:
        """The most recently used idle connection young enough to trust, or None."""
        while self.idle:
            connection, idle_since = self.idle.popitem()
            if connection.closed or connection.transport is None or connection.transport.is_closing():
                continue  # the server closed it (its close callback may not have run yet)
            if time.monotonic() - idle_since <= self.max_idle_s:
                return connection
            connection.abort()
            self.purge_stale()  # the newest was stale, so every older one is too: none is handed out
            return None
        return None

    def purge_stale(self) -> None:
        """Close idle connections past their age, a few per loop iteration (oldest first)."""
        if self._purging:
            return
        deadline = time.monotonic() - self.max_idle_s
        closed = 0
        while self.idle and closed < STALE_CLOSES_PER_ITERATION:
            oldest = next(iter(self.idle))
            if self.idle[oldest] > deadline:
                return
            del self.idle[oldest]
            oldest.abort()
            closed += 1
        if self.idle and closed:
            self._purging = True
            asyncio.get_running_loop().call_soon(self._purge_more)

    def _purge_more(self) -> None:
        self._purging = False
        self.purge_stale()

    async def acquire(self, *, fresh: bool = False) -> tuple[UpstreamConnection, bool]:
        """A connection and whether it was reused; raises OSError or TimeoutError when the server cannot be reached."""
        pooled = None if fresh else self.take_idle()
        if pooled is not None:
            return pooled, True
        loop = asyncio.get_running_loop()
        _, connection = await asyncio.wait_for(
            loop.create_connection(lambda: UpstreamConnection(self), self.host, self.port),
            UPSTREAM_CONNECT_TIMEOUT_S)
        return connection, False

    def release(self, connection: UpstreamConnection) -> None:
        connection.exchange = None
        if connection.closed or connection.transport is None:
            return
        connection.transport.resume_reading()  # it may have been paused for a slow caller as the response ended
        self.idle[connection] = time.monotonic()
        while len(self.idle) > self.max_idle:
            oldest = next(iter(self.idle))
            del self.idle[oldest]
            oldest.abort()

    def forget(self, connection: UpstreamConnection) -> None:
        self.idle.pop(connection, None)
        self.open.discard(connection)

    def close(self) -> None:
        for connection in list(self.open):
            connection.abort()
        self.idle.clear()


# ---- One request and its response -----------------------------------------------------------------------------------

_HEAD, _BODY_CHUNKED, _BODY_FIXED, _BODY_UNTIL_CLOSE, _COMPLETE = 0, 1, 2, 3, 4


class Exchange:
    """One request forwarded upstream and its response streamed back; measured requests end in one record.

    Timing (monotonic clock, all in ms in the record):

    * origin: the moment the proxy finished reading the request (head and body) from the caller;
    * ``queue_ms``: origin to the admission slot (0 when a slot was free);
    * ``ttft_ms``: origin to the arrival of the first SSE ``data:`` event whose choices carry generated output (see
      ``_TOKEN_EVENT``); vLLM emits its first chunk only after the first token exists, so this is time to first
      token including queueing. A non-streamed response arrives whole, so its TTFT is undefined (null);
    * ``tpot_ms``: (last token event - first token event) / (completion_tokens - 1), defined with at least two token
      events and two tokens;
    * ``e2e_ms``: origin to the last byte forwarded (or to the failure); ``upstream_ms`` = e2e - queue.

    ``completion_tokens`` and ``prompt_tokens`` come from the response's ``usage`` object (the final usage chunk of a
    stream, or the JSON body); a stream without one counts its token events as ``completion_tokens`` and leaves
    ``prompt_tokens`` null. TTFT and TPOT are published whenever observed, also for a stream that was later cancelled
    or cut off (its first token did reach the caller then); an error answered before any token has neither.
    """

    __slots__ = (
        "proxy", "client", "head", "body", "request_id", "measured", "read_done_at", "admitted_at", "task",
        "upstream", "reused", "finished", "holds_slot", "resend", "phase", "response_head",
        "status_code", "decoder", "remaining", "forward_decoded", "meter", "upstream_reusable", "last_upstream_at",
        "timeout_handle", "client_paused", "headers_sent", "model", "stream", "timings", "response_started",
        "fields_read", "replica", "refused_by", "_loop",
    )

    def __init__(self, proxy: RequestProxy, client: ClientConnection, head: RequestHead, body: bytes,
                 read_done_at: float) -> None:
        self.proxy = proxy
        self.client = client
        self.head = head
        self.body = body
        self.read_done_at = read_done_at
        self.measured = head.method == b"POST" and head.target.split(b"?", 1)[0] in MEASURED_PATHS
        caller_id = head.get(b"x-request-id")
        self.request_id = caller_id if caller_id is not None and _REQUEST_ID.fullmatch(caller_id) \
            else uuid.uuid4().hex.encode()
        self.admitted_at = read_done_at
        self.task: asyncio.Task[None] | None = None
        self.upstream: UpstreamConnection | None = None
        self.reused = False
        self.finished = False
        self.holds_slot = False
        self.resend = b""
        self.phase = _HEAD
        self.response_head = bytearray()
        self.status_code = 0
        self.decoder: ChunkedDecoder | None = None
        self.remaining = 0
        self.forward_decoded = False
        self.meter: SseMeter | JsonMeter | None = None
        self.upstream_reusable = True
        self.last_upstream_at = read_done_at
        self.timeout_handle: asyncio.TimerHandle | None = None
        self.client_paused = False
        self.headers_sent = False
        self.response_started = False
        self.model: str | None = None
        self.stream = False
        self.timings: dict[str, float] = {}
        self.fields_read = False
        self.replica: Replica | None = None
        self.refused_by: list[tuple[int, str]] = []
        """Replicas that refused this request's connection (index, and what was refused), in order."""
        self._loop = asyncio.get_running_loop()

    # -- starting: synchronously when a slot and a pooled connection are free, else in a task that waits --

    def start(self) -> None:
        """Forward the request now if it can go without waiting (the common case: no task, no loop iteration
        between reading the request and writing it upstream); otherwise a task waits for a slot or a connection."""
        proxy = self.proxy
        if self.measured:
            replica = proxy.admission.try_acquire()
            if replica is None:
                self._spawn(self._wait_and_send())
                return
            self.holds_slot = True
            self.admitted_at = time.monotonic()
        else:  # probes and scrapes: the least busy replica, outside the cap
            replica = proxy.admission.route(capped=False)
            assert replica is not None
        self.replica = replica
        upstream = replica.pool.take_idle()
        if upstream is None:
            self._spawn(self._wait_and_send())
            return
        self._send(upstream, reused=True)

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = self._loop.create_task(coroutine)
        self.task = task
        self.proxy.tasks.add(task)
        task.add_done_callback(self.proxy.tasks.discard)

    async def _wait_and_send(self, *, fresh: bool = False) -> None:
        admission = self.proxy.admission
        try:
            while not self.finished:
                refused = frozenset(index for index, _ in self.refused_by)
                if self.measured and not self.holds_slot:
                    self.replica = await admission.acquire(refused)
                    self.holds_slot = True
                    self.admitted_at = time.monotonic()
                    if self.finished:  # handed a slot just as the caller went away
                        self._release_slot()
                        return
                elif self.replica is None:
                    self.replica = admission.route(refused, capped=False)
                replica = self.replica
                assert replica is not None
                try:
                    upstream, reused = await replica.pool.acquire(fresh=fresh)
                except (OSError, asyncio.TimeoutError) as error:  # noqa: UP041 (distinct classes on Python 3.9)
                    # Nothing was sent: the request may go to another replica. Passed over for a while, so that the
                    # requests after it do not knock on a restarting server first.
                    replica.mark_down()
                    self.refused_by.append((replica.index, f"{replica.label}: {error or 'connect timed out'}"))
                    if len(self.refused_by) < len(admission.replicas):
                        self._release_slot()
                        self.replica = None
                        fresh = False
                        continue
                    if len(admission.replicas) == 1:
                        message = f"model server unreachable: {error or 'connect timed out'}"
                    else:
                        message = ("no model server replica reachable: "
                                   + "; ".join(reason for _, reason in self.refused_by))
                    self._fail_before_response(502, "upstream_unavailable", message)
                    return
                replica.mark_up()
                if self.finished:  # the caller went away while the connection was being made
                    replica.pool.release(upstream)
                    return
                self._send(upstream, reused)
                return
        except asyncio.CancelledError:
            if not self.finished:  # shutdown, not the caller leaving (that finishes the exchange first)
                self._fail_before_response(503, "server_error", "the proxy is shutting down")
            raise
        finally:
            self.task = None

    def _send(self, upstream: UpstreamConnection, reused: bool) -> None:
        self.upstream = upstream
        self.reused = reused
        upstream.exchange = self
        assert upstream.transport is not None
        request = self.resend or self._upstream_request()
        upstream.transport.write(request)
        # On a pooled connection the request may have to go again (see on_upstream_lost): kept until the answer starts.
        self.resend = request if reused else b""
        self.last_upstream_at = time.monotonic()
        self._arm_timeout()
        if not self.fields_read:
            self._read_request_fields()

    def _upstream_request(self) -> bytes:
        head = self.head
        skip = HOP_BY_HOP | _REQUEST_FIELDS_REPLACED | _connection_tokens(head.fields)
        lines = [b"%s %s HTTP/1.1\r\n" % (head.method, head.target)]
        has_host = False
        for lower, _, raw in head.fields:
            if lower not in skip:
                lines.append(raw + b"\r\n")
                has_host = has_host or lower == b"host"
        if not has_host:
            assert self.replica is not None
            lines.append(b"Host: %s\r\n" % self.replica.authority)
        lines.append(b"X-Request-Id: " + self.request_id + b"\r\n")
        if self.body or head.method in (b"POST", b"PUT", b"PATCH"):
            lines.append(b"Content-Length: %d\r\n" % len(self.body))
        lines.append(b"\r\n")
        lines.append(self.body)
        return b"".join(lines)

    def _read_request_fields(self) -> None:
        """The record's request fields, read after the request went upstream so the decode adds nothing to TTFT."""
        self.fields_read = True
        if not self.measured:
            self.body = b""
            return
        for header, field in _TIMING_HEADERS:
            value = self.head.get(header)
            if value is not None:
                try:
                    number = float(value)
                except ValueError:
                    continue
                if math.isfinite(number) and number >= 0:
                    self.timings[field] = number
        try:
            payload = json.loads(self.body)
        except ValueError:
            payload = None
        if isinstance(payload, dict):
            model = payload.get("model")
            self.model = model[:MAX_MODEL_NAME_LENGTH] if isinstance(model, str) else None
            self.stream = payload.get("stream") is True
        self.body = b""  # the prompt is not kept (and never logged)

    # -- upstream callbacks (the hot path: one call per chunk read from vLLM) --

    def on_upstream_data(self, data: bytes) -> None:
        now = time.monotonic()
        self.last_upstream_at = now
        if not self.response_started:
            self.response_started = True
            self.resend = b""
        try:
            if self.phase == _HEAD:
                self._on_head_data(data, now)
            else:
                self._on_body_data(data, now)
        except ValueError as error:  # malformed response from the model server
            if self.headers_sent:
                self._fail_after_headers("server_error", f"malformed response body from the model server: {error}")
            else:
                self._fail_before_response(502, "server_error", f"malformed response from the model server: {error}")

    def _on_head_data(self, data: bytes, now: float) -> None:
        self.response_head += data
        while True:
            end = self.response_head.find(b"\r\n\r\n")
            if end < 0:
                if len(self.response_head) > MAX_HEAD_BYTES:
                    raise ValueError("response head too large")
                return
            head = bytes(self.response_head[:end])
            rest = bytes(self.response_head[end + 4:])
            lines = head.split(b"\r\n")
            status_line = lines[0].split(b" ", 2)
            if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/1.") or not _DIGITS.fullmatch(
                    status_line[1]) or len(status_line[1]) != 3:
                raise ValueError(f"bad status line {lines[0][:40]!r}")
            status = int(status_line[1])
            if 100 <= status < 200:  # interim response (e.g. 103): not forwarded, the final one follows
                self.response_head = bytearray(rest)
                continue
            break
        self.status_code = status
        fields = _parse_fields(lines[1:])
        chunked, length = _body_framing(fields)
        tokens = _connection_tokens(fields)
        if status_line[0] != b"HTTP/1.1" or b"close" in tokens:
            self.upstream_reusable = False
        client_http11 = self.head.version == b"HTTP/1.1"
        no_body = self.head.method == b"HEAD" or status in (204, 304)
        skip = HOP_BY_HOP | _RESPONSE_FIELDS_REPLACED | tokens
        if no_body:
            self.phase = _COMPLETE
        elif chunked:
            self.phase = _BODY_CHUNKED
            self.decoder = ChunkedDecoder()
            self.forward_decoded = not client_http11
            skip = skip | {b"content-length"}
        elif length is not None:
            self.phase = _BODY_FIXED
            self.remaining = length
        else:
            self.phase = _BODY_UNTIL_CLOSE
            self.upstream_reusable = False
            skip = skip | {b"content-length"}
        close_client = self.client.close_after_response or not client_http11 or (
            self.phase == _BODY_UNTIL_CLOSE or self.forward_decoded)
        if close_client:
            self.client.close_after_response = True
        out = [b"HTTP/1.1 %d %s\r\n" % (status, status_line[2] if len(status_line) > 2 else b"")]
        for lower, _, raw in fields:
            if lower not in skip:
                out.append(raw + b"\r\n")
        out.append(b"X-Request-Id: " + self.request_id + b"\r\n")
        if self.phase == _BODY_CHUNKED and client_http11:
            out.append(b"Transfer-Encoding: chunked\r\n")
        if close_client:
            out.append(b"Connection: close\r\n")
        out.append(b"\r\n")
        if self.measured and 200 <= status < 300 and not no_body:
            content_type = next((value for lower, value, _ in fields if lower == b"content-type"), b"")
            self.meter = SseMeter() if content_type.lower().startswith(b"text/event-stream") else JsonMeter()
        self.headers_sent = True
        if self.phase == _COMPLETE:
            self._write_client(b"".join(out))
            self._complete()
            return
        self._write_client(b"".join(out))  # the head at once, as vLLM sent it: it must not wait for a token
        if rest:
            self._on_body_data(rest, now)

    def _on_body_data(self, data: bytes, now: float) -> None:
        phase = self.phase
        if phase == _BODY_CHUNKED:
            decoder = self.decoder
            assert decoder is not None
            pieces, used = decoder.feed(data)
            if self.forward_decoded:
                for piece in pieces:
                    self._write_client(piece)
            else:
                transport = self.client.transport
                if transport is not None:  # forwarded before it is inspected: the meter never delays a byte
                    transport.write(data if used == len(data) else data[:used])
            meter = self.meter
            if meter is not None:
                for piece in pieces:
                    meter.feed(piece, now)
            if decoder.done:
                if used != len(data):
                    self.upstream_reusable = False
                self._complete()
        elif phase == _BODY_FIXED:
            if len(data) > self.remaining:
                data = data[:self.remaining]
                self.upstream_reusable = False
            self.remaining -= len(data)
            self._write_client(data)
            if self.meter is not None:
                self.meter.feed(data, now)
            if not self.remaining:
                self._complete()
        elif phase == _BODY_UNTIL_CLOSE:
            self._write_client(data)
            if self.meter is not None:
                self.meter.feed(data, now)

    def on_upstream_eof(self) -> None:
        if self.phase == _BODY_UNTIL_CLOSE:
            self.upstream_reusable = False
            self._complete()

    def on_upstream_lost(self) -> None:
        if self.finished or self.phase == _COMPLETE:
            return
        self.upstream = None
        if self.phase == _BODY_UNTIL_CLOSE:
            self._complete()
        elif not self.response_started and self.reused:
            # A pooled connection that closed before a single response byte: almost always the keep-alive race (the
            # server closed it idle as the request went out, and never read it), so the request goes again, once, on
            # a fresh connection. A server that died mid-request refuses that connection (502): at worst a request a
            # dead server had begun is begun again.
            self.reused = False
            if self.timeout_handle is not None:
                self.timeout_handle.cancel()
                self.timeout_handle = None
            self._spawn(self._wait_and_send(fresh=True))
        elif self.headers_sent:
            self._fail_after_headers("server_error", "model server closed the connection mid-response")
        else:
            self._fail_before_response(502, "upstream_unavailable", "model server closed the connection")

    # -- client side --

    def _write_client(self, data: bytes) -> None:
        transport = self.client.transport
        if transport is not None and data:
            transport.write(data)

    def pause_upstream(self) -> None:
        self.client_paused = True
        upstream = self.upstream
        if upstream is not None and upstream.transport is not None and not upstream.closed:
            upstream.transport.pause_reading()

    def resume_upstream(self) -> None:
        self.client_paused = False
        self.last_upstream_at = time.monotonic()
        upstream = self.upstream
        if upstream is not None and upstream.transport is not None and not upstream.closed:
            upstream.transport.resume_reading()

    def client_gone(self) -> None:
        """The caller disconnected (or half-closed) before the response was complete: abandon the request."""
        if self.finished:
            return
        if self.upstream is not None:
            self.upstream.abort()
            self.upstream = None
        task = self.task
        self._finish("cancelled")
        if task is not None:  # waiting for a slot or a connection: stop waiting
            task.cancel()

    # -- endings --

    def _arm_timeout(self) -> None:
        if self.timeout_handle is not None:
            self.timeout_handle.cancel()
        self.timeout_handle = self._loop.call_at(
            self.last_upstream_at + self.proxy.config.upstream_timeout_s, self._check_timeout)

    def _check_timeout(self) -> None:
        self.timeout_handle = None
        if self.finished:
            return
        now = time.monotonic()
        if self.client_paused:  # the caller is not reading: the silence is not the server's
            self.last_upstream_at = now
        if now < self.last_upstream_at + self.proxy.config.upstream_timeout_s:
            self._arm_timeout()
            return
        timeout_s = self.proxy.config.upstream_timeout_s
        if self.headers_sent:
            self._fail_after_headers("timeout", f"model server sent nothing for {timeout_s:g} s")
        else:
            self._fail_before_response(504, "timeout", f"model server sent nothing for {timeout_s:g} s")

    def _complete(self) -> None:
        """The whole response reached the caller's socket: pool the connection, record, serve the next request."""
        self.phase = _COMPLETE
        upstream, self.upstream = self.upstream, None
        if upstream is not None:
            if self.upstream_reusable and not self.proxy.draining:
                upstream.pool.release(upstream)
            else:
                upstream.abort()
        status = "ok" if self.status_code < 400 else "client_error" if self.status_code < 500 else "server_error"
        self._finish(status)

    def _fail_before_response(self, http_status: int, status: str, message: str) -> None:
        if self.finished:
            return
        if self.upstream is not None:
            self.upstream.abort()
            self.upstream = None
        self.status_code = http_status
        self.client.send_error(http_status, message, self.request_id)
        self._finish(status)

    def _fail_after_headers(self, status: str, message: str) -> None:
        """The caller already has a status line: cut its connection so it sees an incomplete body, not a clean end."""
        if self.finished:
            return
        if self.upstream is not None:
            self.upstream.abort()
            self.upstream = None
        self._abort_client()
        self._finish(status)

    def _abort_client(self) -> None:
        self.client.close_after_response = True
        if self.client.transport is not None:
            self.client.transport.abort()

    def _finish(self, status: str) -> None:
        if self.finished:
            return
        self.finished = True
        ended_at = time.monotonic()
        if self.timeout_handle is not None:
            self.timeout_handle.cancel()
            self.timeout_handle = None
        self._release_slot()
        self.proxy.exchanges.discard(self)
        if self.measured:
            if not self.fields_read:  # ended before it went upstream (queued, or the server unreachable)
                self._read_request_fields()
            self.proxy.sink.emit(self.record(status, ended_at))
        self.client.exchange_finished(self)
        self.proxy.note_idle()

    def _release_slot(self) -> None:
        if self.holds_slot:
            self.holds_slot = False
            assert self.replica is not None
            self.proxy.admission.release(self.replica)

    def cut(self) -> None:
        """Shutdown after the drain: end this exchange now, however far it got."""
        if self.headers_sent:
            self._fail_after_headers("server_error", "the proxy shut down mid-response")
        else:
            self._fail_before_response(503, "server_error", "the proxy is shutting down")

    def record(self, status: str, ended_at: float) -> dict[str, Any]:
        """The request's EMF document (see the class docstring for what each timing means)."""
        config = self.proxy.config
        meter = self.meter
        prompt_tokens: int | None = None
        completion_tokens: int | None = None
        ttft_ms: float | None = None
        tpot_ms: float | None = None
        if meter is not None and not meter.overflow:
            prompt_tokens, completion_tokens = meter.usage()
        if isinstance(meter, SseMeter):
            if completion_tokens is None and not meter.overflow:
                completion_tokens = meter.token_events
            if meter.first_token_at is not None:
                ttft_ms = round((meter.first_token_at - self.read_done_at) * 1000.0, 3)
                if meter.last_token_at is not None and meter.token_events >= 2 and (completion_tokens or 0) >= 2:
                    assert completion_tokens is not None
                    tpot_ms = round((meter.last_token_at - meter.first_token_at) * 1000.0
                                    / (completion_tokens - 1), 3)
        e2e_ms = round((ended_at - self.read_done_at) * 1000.0, 3)
        queue_ms = round((self.admitted_at - self.read_done_at) * 1000.0, 3)
        metrics = []
        record: dict[str, Any] = {"_aws": {}, "Fleet": config.fleet, "ModelVersion": config.model_version}
        if ttft_ms is not None:
            metrics.append({"Name": "TimeToFirstToken", "Unit": "Milliseconds"})
            record["TimeToFirstToken"] = ttft_ms
        if tpot_ms is not None:
            metrics.append({"Name": "TimePerOutputToken", "Unit": "Milliseconds"})
            record["TimePerOutputToken"] = tpot_ms
        record["_aws"] = _emf_metadata(config, metrics)
        record.update({
            "request_id": self.request_id.decode(),
            "model_version": config.model_version,
            "instance_id": config.instance_id,
            "availability_zone": config.availability_zone,
            "path": self.head.target.split(b"?", 1)[0].decode("latin-1"),
            "model": self.model,
            "stream": self.stream,
            "status": status,
            "http_status": self.status_code or None,
            "ttft_ms": ttft_ms,
            "tpot_ms": tpot_ms,
            "e2e_ms": e2e_ms,
            "queue_ms": queue_ms,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "upstream_ms": round(e2e_ms - queue_ms, 3),
        })
        record.update(self.timings)
        return record


# ---- Client connections ---------------------------------------------------------------------------------------------


class ClientConnection(asyncio.Protocol):
    """One connection from the load balancer: reads requests one at a time and hands each to an ``Exchange``."""

    def __init__(self, proxy: RequestProxy) -> None:
        self.proxy = proxy
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.head: RequestHead | None = None
        self.body_length = 0
        self.decoder: ChunkedDecoder | None = None
        self.body_pieces: list[bytes] = []
        self.body_size = 0
        self.exchange: Exchange | None = None
        self.close_after_response = False
        self.idle_handle: asyncio.TimerHandle | None = None
        self.reading_paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.proxy.clients.add(self)
        self._arm_idle()

    def _arm_idle(self) -> None:
        self.idle_handle = asyncio.get_running_loop().call_later(self.proxy.config.keep_alive_s, self._idle_expired)

    def _idle_expired(self) -> None:
        self.idle_handle = None
        if self.exchange is None and self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.exchange is not None:
            if len(self.buffer) > MAX_PIPELINED_BYTES and self.transport is not None:
                self.transport.pause_reading()
                self.reading_paused = True
            return
        self._parse()

    def _parse(self) -> None:
        try:
            while self.exchange is None and self.transport is not None and not self.transport.is_closing():
                if self.head is None:
                    while self.buffer[:2] == b"\r\n":  # RFC 9112 2.2: ignore empty lines before a request line
                        del self.buffer[:2]
                    end = self.buffer.find(b"\r\n\r\n")
                    if end < 0:
                        if len(self.buffer) > MAX_HEAD_BYTES:
                            raise BadRequest(431, "request head too large")
                        return
                    head = parse_request_head(bytes(self.buffer[:end]))
                    del self.buffer[:end + 4]
                    chunked, length = _body_framing(head.fields)
                    if length is not None and length > MAX_BODY_BYTES:
                        raise BadRequest(413, f"request body over {MAX_BODY_BYTES} bytes")
                    self.head = head
                    self.decoder = ChunkedDecoder() if chunked else None
                    self.body_length = length or 0
                    self.body_pieces = []
                    self.body_size = 0
                    expect = head.get(b"expect")
                    if expect is not None and expect.lower() == b"100-continue" and head.version == b"HTTP/1.1" \
                            and (chunked or self.body_length) and not self.buffer and self.transport is not None:
                        self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                body = self._take_body()
                if body is None:
                    return
                self._dispatch(body)
        except BadRequest as error:
            self.close_after_response = True
            self.send_error(error.status, str(error), uuid.uuid4().hex.encode())
            if self.transport is not None:
                self.transport.close()

    def _take_body(self) -> bytes | None:
        """The complete body when it has all arrived, else None (and the bytes so far are kept)."""
        if self.decoder is not None:
            pieces, used = self.decoder.feed(bytes(self.buffer))
            del self.buffer[:used]
            self.body_pieces.extend(pieces)
            self.body_size += sum(len(piece) for piece in pieces)
            if self.body_size > MAX_BODY_BYTES:
                raise BadRequest(413, f"request body over {MAX_BODY_BYTES} bytes")
            if not self.decoder.done:
                return None
            return b"".join(self.body_pieces)
        if len(self.buffer) < self.body_length:
            return None
        body = bytes(self.buffer[:self.body_length])
        del self.buffer[:self.body_length]
        return body

    def _dispatch(self, body: bytes) -> None:
        head = self.head
        assert head is not None
        self.head = None
        self.decoder = None
        self.body_pieces = []
        read_done_at = time.monotonic()
        if self.idle_handle is not None:
            self.idle_handle.cancel()
            self.idle_handle = None
        if head.version != b"HTTP/1.1" or b"close" in _connection_tokens(head.fields) or self.proxy.draining:
            self.close_after_response = True
        exchange = Exchange(self.proxy, self, head, body, read_done_at)
        self.exchange = exchange
        self.proxy.start_exchange(exchange)

    def send_error(self, status: int, message: str, request_id: bytes) -> None:
        """A response made by the proxy itself (its own errors, and the model server being unreachable or silent)."""
        if self.transport is None or self.transport.is_closing():
            return
        body = json.dumps({"error": {"message": message, "type": _REASONS.get(status, b"Error").decode(),
                                     "code": status}}).encode()
        head = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Error")),
                b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body),
                b"X-Request-Id: " + request_id + b"\r\n"]
        if self.close_after_response:
            head.append(b"Connection: close\r\n")
        self.transport.write(b"".join(head) + b"\r\n" + body)

    def exchange_finished(self, exchange: Exchange) -> None:
        if self.exchange is not exchange:
            return
        self.exchange = None
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self.close_after_response or self.proxy.draining:
            transport.close()  # after the buffered response bytes are sent
            return
        self._arm_idle()
        if self.reading_paused:
            self.reading_paused = False
            transport.resume_reading()
        if self.buffer:
            self._parse()

    def begin_drain(self) -> None:
        """Shutdown: an idle connection closes now; a busy one closes after its response."""
        self.close_after_response = True
        if self.exchange is None and self.transport is not None:
            self.transport.close()

    def eof_received(self) -> bool:
        # HTTP clients do not half-close while waiting for a response: a FIN means the caller went away.
        self.close_after_response = True
        if self.exchange is not None:
            self.exchange.client_gone()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.proxy.clients.discard(self)
        if self.idle_handle is not None:
            self.idle_handle.cancel()
            self.idle_handle = None
        exchange = self.exchange
        self.transport = None
        if exchange is not None:
            exchange.client_gone()

    def pause_writing(self) -> None:
        if self.exchange is not None:
            self.exchange.pause_upstream()

    def resume_writing(self) -> None:
        if self.exchange is not None:
            self.exchange.resume_upstream()


# ---- Fleet gauges ---------------------------------------------------------------------------------------------------

VLLM_RUNNING = "vllm:num_requests_running"
VLLM_WAITING = "vllm:num_requests_waiting"
VLLM_KV_CACHE = "vllm:kv_cache_usage_perc"
VLLM_KV_CACHE_LEGACY = "vllm:gpu_cache_usage_perc"
"""vLLM's KV cache gauge before it was renamed (v0.10); read when the new name is absent."""


def parse_vllm_gauges(text: str) -> dict[str, float]:
    """vLLM's running/waiting counts summed over engines, and its KV cache usage (0-1) averaged over engines."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    wanted = (VLLM_RUNNING, VLLM_WAITING, VLLM_KV_CACHE, VLLM_KV_CACHE_LEGACY)
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        brace, space = line.find("{"), line.find(" ")
        if brace >= 0 and (space < 0 or brace < space):
            name, rest = line[:brace], line[line.rfind("}") + 1:]
        else:
            name, rest = line[:space], line[space:]
        if name not in wanted:
            continue
        try:
            value = float(rest.split()[0])
        except (IndexError, ValueError):
            continue
        if math.isfinite(value):
            sums[name] = sums.get(name, 0.0) + value
            counts[name] = counts.get(name, 0) + 1
    gauges = {name: sums[name] for name in (VLLM_RUNNING, VLLM_WAITING) if name in sums}
    kv_name = VLLM_KV_CACHE if VLLM_KV_CACHE in sums else VLLM_KV_CACHE_LEGACY
    if kv_name in sums:
        gauges[VLLM_KV_CACHE] = sums[kv_name] / counts[kv_name]
    return gauges


async def fetch_metrics_page(host: str, port: int, timeout_s: float) -> str:
    """GET /metrics from the model server on a connection of its own (so a scrape never queues behind a stream)."""
    async def fetch() -> bytes:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\n\r\n" % (host.encode(), port))
            response = b""
            while len(response) <= MAX_SCRAPE_BYTES:
                piece = await reader.read(65536)
                if not piece:
                    break
                response += piece
            return response
        finally:
            writer.close()
    response = await asyncio.wait_for(fetch(), timeout_s)
    head, sep, body = response.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = lines[0].split(b" ")
    if not sep or len(status) < 2 or status[1] != b"200":
        raise ValueError(f"/metrics answered {lines[0][:60]!r}")
    chunked, _ = _body_framing(_parse_fields(lines[1:]))
    if chunked:
        decoder = ChunkedDecoder()
        pieces, _ = decoder.feed(body)
        body = b"".join(pieces)
    return body.decode("utf-8", "replace")


# ---- The proxy ------------------------------------------------------------------------------------------------------


class RequestProxy:
    """The listener, the admission gate, the upstream pool, the record sink and the gauge loop, started together."""

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.replicas = [Replica(index, host, port, max_idle=config.max_concurrency + UPSTREAM_POOL_SPARE,
                                 keep_alive_s=config.upstream_keep_alive_s)
                         for index, (host, port) in enumerate(config.upstreams)]
        self.admission = Admission(self.replicas, config.max_concurrency)
        self.sink = RecordSink(config)
        self.clients: set[ClientConnection] = set()
        self.exchanges: set[Exchange] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.draining = False
        self._closing = False
        self.listen_port = config.listen_port
        self._server: asyncio.AbstractServer | None = None
        self._gauge_task: asyncio.Task[None] | None = None
        self._idle: asyncio.Event | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._idle = asyncio.Event()
        self._idle.set()
        self.sink.start()
        self._server = await loop.create_server(
            lambda: ClientConnection(self), self.config.listen_host, self.config.listen_port,
            backlog=LISTEN_BACKLOG, reuse_address=True)
        sockets = getattr(self._server, "sockets", None) or []
        if sockets:
            self.listen_port = sockets[0].getsockname()[1]
        self._gauge_task = loop.create_task(self._publish_gauges())
        # Startup's objects (modules, functions, classes) live as long as the process: keeping them out of the
        # collector's generations makes its occasional full pass, a pause for every stream, that much shorter.
        gc.freeze()

    def start_exchange(self, exchange: Exchange) -> None:
        self.exchanges.add(exchange)
        if self._idle is not None:
            self._idle.clear()
        exchange.start()

    def note_idle(self) -> None:
        if not self.exchanges and self._idle is not None:
            self._idle.set()

    def stats(self) -> dict[str, int]:
        """Live counts, for tests and diagnostics (call on the proxy's loop)."""
        return {
            "clients": len(self.clients),
            "exchanges": len(self.exchanges),
            "tasks": len(self.tasks),
            "admission_active": self.admission.active,
            "admission_waiting": self.admission.waiting,
            "upstream_open": sum(len(replica.pool.open) for replica in self.replicas),
            "upstream_idle": sum(len(replica.pool.idle) for replica in self.replicas),
            "records_dropped": self.sink.dropped,
        }

    def gauge_record(self, gauges: dict[str, float] | None, scrape_error: str | None) -> dict[str, Any]:
        """The fleet-gauge EMF document; without a scrape, only RequestsWaiting (the proxy's own queue)."""
        config = self.config
        queued = self.admission.waiting
        metrics = []
        values: dict[str, Any] = {}
        if gauges is not None and VLLM_RUNNING in gauges:
            metrics.append({"Name": "RequestsInFlight", "Unit": "Count"})
            values["RequestsInFlight"] = gauges[VLLM_RUNNING]
        metrics.append({"Name": "RequestsWaiting", "Unit": "Count"})
        values["RequestsWaiting"] = (gauges or {}).get(VLLM_WAITING, 0.0) + queued
        if gauges is not None and VLLM_KV_CACHE in gauges:
            metrics.append({"Name": "KvCacheUsage", "Unit": "Percent"})
            values["KvCacheUsage"] = round(gauges[VLLM_KV_CACHE] * 100.0, 3)
        record: dict[str, Any] = {"_aws": _emf_metadata(config, metrics), "Fleet": config.fleet,
                                  "ModelVersion": config.model_version}
        record.update(values)
        record.update({"model_version": config.model_version, "instance_id": config.instance_id,
                       "availability_zone": config.availability_zone, "proxy_waiting": queued})
        if scrape_error is not None:
            record["scrape_error"] = scrape_error
        return record

    async def _publish_gauges(self) -> None:
        """One gauge record every interval, from the first second on and at zero traffic too (an idle fleet must
        report 0 for target tracking to scale in), on an absolute schedule so the interval does not drift."""
        interval = self.config.metrics_interval_s
        next_at = time.monotonic()
        while not self._closing:  # a draining instance still reports: its streams still run
            scrapes = await asyncio.gather(*(self._scrape(replica, min(SCRAPE_TIMEOUT_S, interval))
                                             for replica in self.replicas))
            if self._closing:
                return
            self.sink.emit(self.gauge_record(*self._instance_gauges(scrapes)))
            self.sink.report_drops()
            for replica in self.replicas:
                replica.pool.purge_stale()
            now = time.monotonic()
            next_at += interval
            if next_at < now:  # a slow scrape: skip the missed ticks rather than publish a burst
                next_at = now + interval - (now - next_at) % interval
            await asyncio.sleep(next_at - now)

    async def _scrape(self, replica: Replica, timeout_s: float) -> tuple[dict[str, float] | None, str | None]:
        """One replica's gauges, or the reason there are none."""
        try:
            page = await fetch_metrics_page(replica.host, replica.port, timeout_s)
        except (OSError, ValueError, asyncio.TimeoutError) as failure:  # noqa: UP041 (Python 3.9)
            return None, f"{type(failure).__name__}: {failure}"[:200]
        replica.mark_up()
        return parse_vllm_gauges(page), None

    def _instance_gauges(
            self, scrapes: list[tuple[dict[str, float] | None, str | None]],
    ) -> tuple[dict[str, float] | None, str | None]:
        """The instance's gauges from every replica's: running and waiting summed, KV cache usage averaged.

        The scaling policy holds running + waiting per instance at the plan's per-instance concurrency (replicas x
        each one's), so the sum keeps the metric meaning what it meant with one replica. A replica whose scrape failed
        counts the requests the proxy has in flight on it (a refused replica runs none); with no scrape at all there is
        no RequestsInFlight, as with one replica.
        """
        if len(scrapes) == 1:
            return scrapes[0]
        errors = [f"{self.replicas[i].label}: {error}" for i, (_, error) in enumerate(scrapes) if error is not None]
        scraped = [gauges for gauges, _ in scrapes if gauges is not None]
        error_text = "; ".join(errors)[:600] if errors else None
        if not scraped:
            return None, error_text
        gauges: dict[str, float] = {}
        for name in (VLLM_RUNNING, VLLM_WAITING):
            if any(name in one for one in scraped):
                gauges[name] = sum(one.get(name, 0.0) for one in scraped)
        if VLLM_RUNNING in gauges:
            gauges[VLLM_RUNNING] += sum(self.replicas[i].active for i, (g, _) in enumerate(scrapes) if g is None)
        kv = [one[VLLM_KV_CACHE] for one in scraped if VLLM_KV_CACHE in one]
        if kv:
            gauges[VLLM_KV_CACHE] = sum(kv) / len(kv)
        return gauges, error_text

    async def shutdown(self, drain_s: float) -> None:
        """Stop accepting, let in-flight exchanges finish for up to ``drain_s``, cut the rest, flush the records."""
        self.draining = True
        if self._server is not None:
            self._server.close()
        for client in list(self.clients):
            client.begin_drain()
        if self._idle is not None and self.exchanges:
            try:
                await asyncio.wait_for(self._idle.wait(), drain_s)
            except asyncio.TimeoutError:  # noqa: UP041 (distinct classes on Python 3.9)
                _diagnose(f"drain of {drain_s:g} s over; cutting {len(self.exchanges)} streams")
        for exchange in list(self.exchanges):
            exchange.cut()
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=1.0)
        for client in list(self.clients):
            if client.transport is not None:
                client.transport.abort()
        for replica in self.replicas:
            replica.pool.close()
        self._closing = True
        await _stop_task(self._gauge_task)
        await self.sink.close(SHUTDOWN_FLUSH_S)
        await asyncio.sleep(0)  # let the transports' close callbacks run


async def serve(config: ProxyConfig) -> int:
    """Run until SIGTERM or SIGINT, then drain; 0 on a clean exit, 1 when the listener cannot be opened."""
    proxy = RequestProxy(config)
    try:
        await proxy.start()
    except OSError as error:
        _diagnose(f"cannot listen on {config.listen_host}:{config.listen_port}: {error.strerror or error}")
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    upstreams = ", ".join(replica.label for replica in proxy.replicas)
    _diagnose(f"listening on {config.listen_host}:{proxy.listen_port}, upstream {upstreams}, max concurrency "
              f"{config.max_concurrency}{' per replica' if len(proxy.replicas) > 1 else ''}")
    await stop.wait()
    _diagnose(f"stopping: draining {len(proxy.exchanges)} in-flight requests for up to {config.drain_s:g} s")
    await proxy.shutdown(config.drain_s)
    return 0


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(serve(parse_config(argv)))


if __name__ == "__main__":
    sys.exit(main())
