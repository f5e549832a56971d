"""Health sidecar for an OpenAI-compatible model server: proves the model answers, not just that a port is open.

Runs on every inference instance next to the model server (the user data installs it as a systemd unit). The
load balancer's target group checks this sidecar instead of the server's own liveness path, because a server can
accept connections while its GPU is wedged, its weights are half loaded, or its engine loop has died.

On each check (cached for ``--cache-s`` seconds so the load balancer's checks cost at most one probe per period):

1. send a one-token completion (``POST /v1/completions``, ``max_tokens=1``) under ``--timeout-s``;
2. answer 200 if it completed, 503 with the reason if not;
3. if the probe timed out but the server's Prometheus counter (``--progress-metric``) rose since the previous check,
   the server is busy, not wedged: a full batch queues the probe behind real work. Answer 200 ("busy") so that a
   fleet under load does not mark its own instances unhealthy and cascade.

Several replicas (``--upstream`` repeated: one model server per replica, each on its own loopback port) are probed
at once, each with its own progress counter, so a check takes one probe timeout however many replicas there are. The
instance is healthy only when every replica is: one wedged replica (or one that is down) makes the answer 503, naming
the replica. Why not stay up on the others: the request proxy skips a replica that refuses connections, but it cannot
tell a wedged one from a slow one, so a wedged replica keeps taking its share of requests, which then wait out the
proxy's upstream timeout, and a hung container does not exit, so systemd never restarts it; the instance also serves
below the per-instance concurrency the scaling policy counts on. Reporting 503 takes the instance out of rotation
after the target group's unhealthy threshold (three checks), and the group's ELB health check replaces it with a whole
one (a warm-pool instance when there is one): a wedged model is never reported up (Elastic Load Balancing user guide,
"Health checks for Application Load Balancer target groups"; EC2 Auto Scaling user guide, "Health checks for instances
in an Auto Scaling group": ELB health checks). The same rule makes the boot script's wait for the first 200 a wait for
every replica.

Optionally (``--emf-address``) it publishes, every check, a CloudWatch embedded-metric-format record to the local
CloudWatch agent: ``GeneratedTokens`` (the rise of the server's token counter), which the fleet's cost-per-token
figure reads. Requests in flight and waiting are the request proxy's to publish (``RequestsInFlight`` and
``RequestsWaiting``, see ``request_proxy.py``): it samples them on a fixed interval, also at zero traffic, and counts
its own admission queue as well.

Standard library only, Python 3.9+: it runs on the instance's system Python, with nothing to install.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DEFAULT_PORT = 8081
"""Next to the model server's conventional 8000; the target group checks this port."""
DEFAULT_TIMEOUT_S = 5.0
"""A one-token request on a loaded model returns in well under a second; 5 s leaves room for a busy batch while
staying inside the load balancer's health check timeout (HEALTH_CHECK_TIMEOUT in fleets/inference.py)."""
DEFAULT_CACHE_S = 5.0
"""The load balancer checks from every node of the ALB (several per AZ); caching keeps it to one probe per 5 s."""
DEFAULT_PROGRESS_METRIC = "vllm:generation_tokens_total"
"""vLLM's counter of generated tokens; its rise proves the engine loop is making progress."""


@dataclass(frozen=True)
class Verdict:
    """The outcome of one check."""

    healthy: bool
    reason: str
    checked_at: float
    probe_ms: float | None = None
    replicas: list[dict[str, str]] | None = None
    """With several replicas: each one's upstream, status and reason (the slowest probe is ``probe_ms``)."""

    def as_json(self) -> bytes:
        body: dict[str, Any] = {
            "status": "ok" if self.healthy else "unhealthy",
            "reason": self.reason,
            "checked_at": round(self.checked_at, 3),
            "probe_ms": None if self.probe_ms is None else round(self.probe_ms, 1),
        }
        if self.replicas is not None:
            body["replicas"] = self.replicas
        return json.dumps(body).encode()


def _post_json(url: str, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 (local URL only)
        body: dict[str, Any] = json.loads(response.read() or b"{}")
        return body


def _get_text(url: str, timeout_s: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 (local URL only)
        text: str = response.read().decode("utf-8", "replace")
        return text


def parse_prometheus(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """Sum each named metric over its label sets (``name{labels} value`` lines); absent names are left out."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_part, _, rest = line.partition(" ")
        name = name_part.split("{", 1)[0]
        if name not in names:
            continue
        try:
            value = float(rest.split()[0])
        except (IndexError, ValueError):
            continue
        totals[name] = totals.get(name, 0.0) + value
    return totals


class Checker:
    """Probes every replica's model server (in parallel) and caches the verdict; thread-safe (one check at a time).

    Healthy only when every replica is (see the module docstring for why one wedged replica fails the instance).
    """

    def __init__(
        self,
        upstream: str | Sequence[str],
        *,
        model: str = "",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        cache_s: float = DEFAULT_CACHE_S,
        progress_metric: str = DEFAULT_PROGRESS_METRIC,
        emf: EmfPublisher | None = None,
        clock: Any = time.monotonic,
    ) -> None:
        upstreams = [upstream] if isinstance(upstream, str) else list(upstream)
        if not upstreams:
            raise ValueError("at least one upstream is needed")
        # A library caller gets the command line's rules: a nan or negative timeout would make every probe fail (or
        # block forever), and a nan cache would never expire.
        for name, value, allow_zero in (("timeout_s", timeout_s, False), ("cache_s", cache_s, True)):
            problem = _seconds_problem(value, allow_zero=allow_zero)
            if problem:
                raise ValueError(f"{name}={value!r}: {problem}")
        self.replicas = [ReplicaProbe(url, model=model, timeout_s=timeout_s, progress_metric=progress_metric,
                                      scrape_always=emf is not None) for url in upstreams]
        self.cache_s = cache_s
        self.emf = emf
        self._clock = clock
        self._lock = threading.Lock()
        self._verdict: Verdict | None = None
        self._verdict_at = float("-inf")

    def verdict(self) -> Verdict:
        with self._lock:
            if self._verdict is None or self._clock() - self._verdict_at >= self.cache_s:
                self._verdict = self._check()
                self._verdict_at = self._clock()
            return self._verdict

    def _check(self) -> Verdict:
        if len(self.replicas) == 1:
            outcomes = [self.replicas[0].check()]
        else:  # at once: a check takes one probe's time, not one per replica (the load balancer's timeout is fixed)
            outcomes = [ReplicaOutcome(Verdict(False, "probe did not run", 0.0), 0.0, False)] * len(self.replicas)

            def run(index: int) -> None:
                outcomes[index] = self.replicas[index].check()

            threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(self.replicas))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        if self.emf is not None and any(outcome.scraped for outcome in outcomes):
            self.emf.publish(sum(outcome.progressed for outcome in outcomes))
        verdicts = [outcome.verdict for outcome in outcomes]
        if len(verdicts) == 1:
            return verdicts[0]
        now = time.time()
        probe_ms = max((v.probe_ms for v in verdicts if v.probe_ms is not None), default=None)
        failed = [(i, v) for i, v in enumerate(verdicts) if not v.healthy]
        replicas = [{"upstream": self.replicas[i].upstream, "status": "ok" if v.healthy else "unhealthy",
                     "reason": v.reason} for i, v in enumerate(verdicts)]
        if not failed:
            return Verdict(True, f"all {len(verdicts)} replicas answered", now, probe_ms, replicas)
        named = "; ".join(f"replica {i} ({self.replicas[i].upstream}): {v.reason}" for i, v in failed)
        return Verdict(False, f"{len(failed)} of {len(verdicts)} replicas unhealthy: {named}", now, probe_ms, replicas)


@dataclass(frozen=True)
class ReplicaOutcome:
    """One replica's check: its verdict, the tokens it generated since its previous check, whether it was scraped."""

    verdict: Verdict
    progressed: float
    scraped: bool


class ReplicaProbe:
    """One model server (one replica): the one-token probe, and the progress counter that tells busy from wedged."""

    def __init__(self, upstream: str, *, model: str, timeout_s: float, progress_metric: str,
                 scrape_always: bool) -> None:
        self.upstream = upstream.rstrip("/")
        self.model = model
        self.timeout_s = timeout_s
        self.progress_metric = progress_metric
        self.scrape_always = scrape_always
        self._last_progress: float | None = None

    def _model_name(self) -> str:
        if not self.model:  # learned once: the served model does not change under a running server
            listing = json.loads(_get_text(f"{self.upstream}/v1/models", self.timeout_s))
            self.model = str(listing["data"][0]["id"])
        return self.model

    def _scrape(self) -> dict[str, float] | None:
        if not self.progress_metric:
            return None
        try:
            return parse_prometheus(_get_text(f"{self.upstream}/metrics", self.timeout_s), (self.progress_metric,))
        except (OSError, ValueError):
            return None

    def check(self) -> ReplicaOutcome:
        started = time.monotonic()
        probe_error: str | None = None
        try:
            reply = _post_json(
                f"{self.upstream}/v1/completions",
                {"model": self._model_name(), "prompt": "ping", "max_tokens": 1, "temperature": 0},
                self.timeout_s,
            )
            if not reply.get("choices"):
                probe_error = f"completion returned no choices: {json.dumps(reply)[:200]}"
        except urllib.error.HTTPError as error:
            probe_error = f"model server answered HTTP {error.code} to a one-token completion"
        except (TimeoutError, socket.timeout):  # noqa: UP041 (distinct classes on the instance's Python 3.9)
            probe_error = f"one-token completion did not finish within {self.timeout_s:g} s"
        except urllib.error.URLError as error:
            reason = error.reason
            if isinstance(reason, (TimeoutError, socket.timeout)):  # noqa: UP041
                probe_error = f"one-token completion did not finish within {self.timeout_s:g} s"
            else:
                probe_error = f"model server unreachable at {self.upstream}: {reason}"
        except (OSError, ValueError, KeyError, IndexError) as error:
            probe_error = f"model server gave an unusable answer: {type(error).__name__}: {error}"
        probe_ms = (time.monotonic() - started) * 1000.0

        sample = self._scrape() if (probe_error is None or "within" in probe_error or self.scrape_always) else None
        progressed = self._note_progress(sample)

        now = time.time()
        if probe_error is None:
            verdict = Verdict(True, "one-token completion answered", now, probe_ms)
        elif "within" in probe_error and progressed:
            verdict = Verdict(True, f"busy: {probe_error}, but the server generated {progressed:g} tokens since the "
                                    "last check", now, probe_ms)
        else:
            verdict = Verdict(False, probe_error, now, probe_ms)
        return ReplicaOutcome(verdict, progressed, sample is not None)

    def _note_progress(self, sample: dict[str, float] | None) -> float:
        """Tokens generated since the previous sample (0 on the first sample or when the counter is absent)."""
        if not sample or self.progress_metric not in sample:
            return 0.0
        current = sample[self.progress_metric]
        previous, self._last_progress = self._last_progress, current
        if previous is None or current < previous:  # first sample, or the server restarted
            return 0.0
        return current - previous


class EmfPublisher:
    """Sends CloudWatch embedded-metric-format records to the CloudWatch agent's EMF listener over UDP."""

    def __init__(self, address: str, *, namespace: str, fleet: str, log_group: str) -> None:
        host, _, port = address.rpartition(":")
        self.target = (host or "127.0.0.1", int(port))
        self.namespace = namespace
        self.fleet = fleet
        self.log_group = log_group
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    def record(self, generated: float) -> dict[str, Any]:
        return {
            "_aws": {
                "Timestamp": int(time.time() * 1000),
                "LogGroupName": self.log_group,
                "CloudWatchMetrics": [{
                    "Namespace": self.namespace,
                    "Dimensions": [["Fleet"]],
                    "Metrics": [{"Name": "GeneratedTokens", "Unit": "Count"}],
                }],
            },
            "Fleet": self.fleet,
            "GeneratedTokens": generated,
        }

    def publish(self, generated: float) -> None:
        line = json.dumps(self.record(generated)) + "\n"
        try:
            self._socket.sendto(line.encode(), self.target)
        except OSError:
            pass  # metrics are best effort; health must not depend on the agent


def make_server(checker: Checker, host: str, port: int, path: str) -> ThreadingHTTPServer:
    """An HTTP server answering ``path`` with the checker's verdict (200 or 503, JSON body) and 404 elsewhere."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server API)
            if self.path.split("?", 1)[0] != path:
                self._send(404, b'{"status": "not found"}')
                return
            verdict = checker.verdict()
            self._send(200 if verdict.healthy else 503, verdict.as_json())

        def _send(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server API)
            pass  # the load balancer checks several times a second; access logs would be noise

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


# ---- Command line: every value checked before the sidecar starts, every problem reported at once ----------------

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
"""A Prometheus metric name (Prometheus data model, "Metric names and labels")."""


def _seconds_problem(value: object, *, allow_zero: bool) -> str | None:
    """Why ``value`` is not a usable number of seconds (a bool, a string, nan, inf, negative, or zero), or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{type(value).__name__} is not a number of seconds"
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        return f"not a finite number of seconds {'0 or more' if allow_zero else 'greater than 0'}"
    return None


def _seconds(flag: str, text: str, fix: str, *, allow_zero: bool = False) -> tuple[float, str | None]:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    problem = _seconds_problem(value, allow_zero=allow_zero)
    return value, (f"argument {flag}: {text!r} is {problem}; {fix}" if problem else None)


def _port_problem(text: str) -> str | None:
    """Port 0 would bind a random port the load balancer never checks: 1 to 65535 only."""
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 65535:
        return f"{text!r} is not a port from 1 to 65535"
    return None


def _upstream_problem(url: str) -> str | None:
    """Why ``url`` is not a model server's base URL (http or https, a host, an optional port, no query), or None."""
    try:
        parts = urllib.parse.urlsplit(url)
        usable = (parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
                  and not parts.query and not parts.fragment)  # .port: ValueError unless a number up to 65535
    except ValueError:
        usable = False
    if not usable:
        return f"{url!r} is not a base URL like http://127.0.0.1:8000 (http or https, a host, a port from 1 to 65535)"
    return None


def _host_port_problem(text: str) -> str | None:
    _, sep, port = text.rpartition(":")  # an empty HOST is the local agent, 127.0.0.1 (EmfPublisher)
    if not sep or _port_problem(port):
        return f"{text!r} is not HOST:PORT with a port from 1 to 65535"
    return None


class _Parser(argparse.ArgumentParser):
    """argparse that prints its error on one line (naming the flag, the value and the fix), without the usage."""

    def error(self, message: str) -> Any:
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    # Every value is read as text and checked in parse_args below, so that every problem is reported at once.
    parser = _Parser(prog="health_sidecar", description="Health sidecar for an OpenAI-compatible model server.")
    parser.add_argument("--upstream", action="append", default=None,
                        help="A model server's base URL; repeat it once per replica (default http://127.0.0.1:8000).")
    parser.add_argument("--model", default="", help="Model name for the probe; default: the first of /v1/models.")
    parser.add_argument("--host", default="0.0.0.0")  # noqa: S104 (the load balancer must reach it)
    parser.add_argument("--port", default=str(DEFAULT_PORT))
    parser.add_argument("--path", default="/healthz")
    parser.add_argument("--timeout-s", default=str(DEFAULT_TIMEOUT_S))
    parser.add_argument("--cache-s", default=str(DEFAULT_CACHE_S))
    parser.add_argument("--progress-metric", default=DEFAULT_PROGRESS_METRIC, help="Empty to disable.")
    parser.add_argument("--emf-address", default="", help="host:port of the CloudWatch agent's EMF listener.")
    parser.add_argument("--namespace", default="GenaiConstructs/Inference")
    parser.add_argument("--fleet", default="fleet")
    parser.add_argument("--log-group", default="")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, checked; any bad value exits 2 with one line per problem (flag, value, what is allowed, fix)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    problems: list[str] = []
    args.upstream = args.upstream or ["http://127.0.0.1:8000"]
    seen: set[str] = set()
    for url in args.upstream:
        problem = _upstream_problem(url)
        if problem:
            problems.append(f"argument --upstream: {problem}; give e.g. --upstream http://127.0.0.1:8000 "
                            "(one per replica)")
        elif url.rstrip("/") in seen:
            problems.append(f"argument --upstream: {url!r} is given twice; give each replica's URL once")
        seen.add(url.rstrip("/"))
    if not args.host.strip():
        problems.append("argument --host: an empty value is not allowed; give e.g. --host 0.0.0.0")
    port_problem = _port_problem(args.port)
    if port_problem:
        problems.append(f"argument --port: {port_problem}; give e.g. --port {DEFAULT_PORT} (the target group's "
                        "health check port)")
    if not args.path.startswith("/") or any(c.isspace() for c in args.path):
        problems.append(f"argument --path: {args.path!r} is not a URL path starting with '/'; give e.g. "
                        "--path /healthz (the target group's health check path)")
    args.timeout_s, problem = _seconds("--timeout-s", args.timeout_s,
                                       f"give e.g. --timeout-s {DEFAULT_TIMEOUT_S:g} (below the load balancer's "
                                       "health check timeout)")
    problems += [problem] if problem else []
    args.cache_s, problem = _seconds("--cache-s", args.cache_s, f"give e.g. --cache-s {DEFAULT_CACHE_S:g} "
                                     "(0 probes on every check)", allow_zero=True)
    problems += [problem] if problem else []
    if args.progress_metric and not _METRIC_NAME.fullmatch(args.progress_metric):
        problems.append(f"argument --progress-metric: {args.progress_metric!r} is not a Prometheus metric name; "
                        f"give e.g. --progress-metric {DEFAULT_PROGRESS_METRIC}, or '' to disable")
    if args.emf_address:
        problem = _host_port_problem(args.emf_address)
        if problem:
            problems.append(f"argument --emf-address: {problem}; give e.g. --emf-address 127.0.0.1:25888 (the "
                            "CloudWatch agent's EMF listener), or '' to disable")
        if not args.namespace.strip():
            problems.append("argument --namespace: an empty value is not allowed with --emf-address; give e.g. "
                            "--namespace GenaiConstructs/Inference")
        if not args.fleet.strip():
            problems.append("argument --fleet: an empty value is not allowed with --emf-address; give the fleet's "
                            "name (the Fleet dimension)")
    if problems:
        parser.exit(2, "".join(f"{parser.prog}: error: {problem}\n" for problem in problems))
    args.port = int(args.port)
    return args


def main(argv: list[str] | None = None) -> int:
    """Serve until killed; 2 on a bad command line, 1 when the port cannot be opened."""
    args = parse_args(argv)
    emf = (
        EmfPublisher(args.emf_address, namespace=args.namespace, fleet=args.fleet, log_group=args.log_group)
        if args.emf_address else None
    )
    checker = Checker(args.upstream, model=args.model, timeout_s=args.timeout_s, cache_s=args.cache_s,
                      progress_metric=args.progress_metric, emf=emf)
    try:
        server = make_server(checker, args.host, args.port, args.path)
    except OSError as error:  # the port is taken (a second sidecar), or the host is not an address of this machine
        sys.stderr.write(f"health_sidecar: error: cannot listen on {args.host}:{args.port} "
                         f"({error.strerror or error}); free the port or give another with --port and --host\n")
        return 1
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
