"""The health sidecar against real stub model servers on 127.0.0.1: healthy, slow, wedged, busy, down."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from genai_constructs.runtime.health_sidecar import Checker, EmfPublisher, make_server, parse_prometheus

PROBE_TIMEOUT_S = 0.5


class StubModelServer:
    """An OpenAI-compatible stub: answers /v1/models, /v1/completions (after ``delay_s``) and /metrics."""

    def __init__(self, *, delay_s: float = 0.0, status: int = 200, tokens_per_scrape: float = 0.0) -> None:
        self.delay_s = delay_s
        self.status = status
        self.tokens = 100.0
        self.tokens_per_scrape = tokens_per_scrape
        self.completions: list[dict[str, Any]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                if self.path == "/v1/models":
                    self._reply(200, json.dumps({"data": [{"id": "stub-model"}]}).encode())
                elif self.path == "/metrics":
                    stub.tokens += stub.tokens_per_scrape
                    body = (
                        "# TYPE vllm:generation_tokens_total counter\n"
                        f'vllm:generation_tokens_total{{model_name="stub-model"}} {stub.tokens}\n'
                        'vllm:num_requests_running{model_name="stub-model"} 3.0\n'
                        'vllm:num_requests_waiting{model_name="stub-model"} 2.0\n'
                    )
                    self._reply(200, body.encode())
                else:
                    self._reply(404, b"{}")

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers["Content-Length"])
                stub.completions.append(json.loads(self.rfile.read(length)))
                time.sleep(stub.delay_s)
                self._reply(stub.status, json.dumps({"choices": [{"text": "o"}]}).encode())

            def _reply(self, status: int, body: bytes) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the sidecar gave up on a slow answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class WedgedServer:
    """Accepts TCP connections and never answers: a process whose engine loop is stuck."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.held: list[socket.socket] = []
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self.listener.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
                self.held.append(conn)
            except OSError:
                continue

    def close(self) -> None:
        self._stop.set()
        for conn in self.held:
            conn.close()
        self.listener.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def stub() -> Iterator[StubModelServer]:
    server = StubModelServer()
    yield server
    server.close()


def serve(checker: Checker) -> tuple[str, ThreadingHTTPServer]:
    server = make_server(checker, "127.0.0.1", 0, "/healthz")
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", server


def get(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_healthy_server_answers_200_over_http(stub: StubModelServer) -> None:
    url, server = serve(Checker(stub.url, timeout_s=PROBE_TIMEOUT_S))
    try:
        status, body = get(f"{url}/healthz")
    finally:
        server.shutdown()
    assert status == 200
    assert body["status"] == "ok"
    assert body["reason"] == "one-token completion answered"


def test_probe_is_a_one_token_completion_for_the_served_model(stub: StubModelServer) -> None:
    Checker(stub.url, timeout_s=PROBE_TIMEOUT_S).verdict()
    assert stub.completions == [{"model": "stub-model", "prompt": "ping", "max_tokens": 1, "temperature": 0}]


def test_verdict_is_cached_between_checks(stub: StubModelServer) -> None:
    now = [0.0]
    checker = Checker(stub.url, timeout_s=PROBE_TIMEOUT_S, cache_s=5.0, clock=lambda: now[0])
    checker.verdict()
    now[0] = 4.9
    checker.verdict()
    assert len(stub.completions) == 1
    now[0] = 5.0
    checker.verdict()
    assert len(stub.completions) == 2


def test_slow_server_is_unhealthy_with_the_timeout_as_reason() -> None:
    slow = StubModelServer(delay_s=PROBE_TIMEOUT_S * 4)
    try:
        url, server = serve(Checker(slow.url, model="stub-model", timeout_s=PROBE_TIMEOUT_S))
        status, body = get(f"{url}/healthz")
        server.shutdown()
    finally:
        slow.close()
    assert status == 503
    assert body["status"] == "unhealthy"
    assert body["reason"] == "one-token completion did not finish within 0.5 s"


def test_busy_server_that_keeps_generating_stays_healthy() -> None:
    busy = StubModelServer(delay_s=PROBE_TIMEOUT_S * 4, tokens_per_scrape=64)
    try:
        checker = Checker(busy.url, model="stub-model", timeout_s=PROBE_TIMEOUT_S, cache_s=0)
        checker.verdict()  # first check only learns the counter
        verdict = checker.verdict()
    finally:
        busy.close()
    assert verdict.healthy
    assert verdict.reason.startswith("busy: one-token completion did not finish within 0.5 s")
    assert "generated 64 tokens" in verdict.reason


def test_wedged_server_is_unhealthy_within_bounded_time() -> None:
    wedged = WedgedServer()
    try:
        checker = Checker(wedged.url, model="stub-model", timeout_s=PROBE_TIMEOUT_S)
        started = time.monotonic()
        verdict = checker.verdict()
        elapsed = time.monotonic() - started
    finally:
        wedged.close()
    assert not verdict.healthy
    assert verdict.reason == "one-token completion did not finish within 0.5 s"
    assert elapsed < PROBE_TIMEOUT_S * 2 + 0.5  # the probe and the progress scrape, each bounded


def test_down_server_is_unhealthy_and_says_unreachable() -> None:
    port = free_port()
    verdict = Checker(f"http://127.0.0.1:{port}", model="m", timeout_s=PROBE_TIMEOUT_S).verdict()
    assert not verdict.healthy
    assert verdict.reason.startswith(f"model server unreachable at http://127.0.0.1:{port}")


def test_server_error_is_unhealthy_with_the_status() -> None:
    broken = StubModelServer(status=500)
    try:
        verdict = Checker(broken.url, model="stub-model", timeout_s=PROBE_TIMEOUT_S).verdict()
    finally:
        broken.close()
    assert not verdict.healthy
    assert verdict.reason == "model server answered HTTP 500 to a one-token completion"


def test_other_paths_are_not_found(stub: StubModelServer) -> None:
    url, server = serve(Checker(stub.url))
    try:
        status, _ = get(f"{url}/")
    finally:
        server.shutdown()
    assert status == 404


def test_parse_prometheus_sums_label_sets_and_skips_comments() -> None:
    text = "# HELP x\nx{a=\"1\"} 2\nx{a=\"2\"} 3.5\ny 7\nbad line\n"
    assert parse_prometheus(text, ("x", "y", "z")) == {"x": 5.5, "y": 7.0}


def test_emf_records_reach_the_agent_listener_over_udp() -> None:
    agent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    agent.bind(("127.0.0.1", 0))
    agent.settimeout(2)
    busy = StubModelServer(tokens_per_scrape=10)
    try:
        emf = EmfPublisher(f"127.0.0.1:{agent.getsockname()[1]}", namespace="NS", fleet="chat", log_group="/lg")
        checker = Checker(busy.url, model="stub-model", cache_s=0, emf=emf)
        checker.verdict()
        checker.verdict()
        agent.recv(65535)
        record = json.loads(agent.recv(65535))
    finally:
        busy.close()
        agent.close()
    assert record["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "NS"
    assert record["_aws"]["LogGroupName"] == "/lg"
    assert record["Fleet"] == "chat"
    assert record["GeneratedTokens"] == 10
    # Requests in flight are the request proxy's metrics now (RequestsInFlight, RequestsWaiting), not the sidecar's.
    assert record["_aws"]["CloudWatchMetrics"][0]["Metrics"] == [{"Name": "GeneratedTokens", "Unit": "Count"}]
    assert "InFlightRequests" not in record


# ---- several replicas: every one must answer ----------------------------------------------------------------------


def test_every_replica_answering_is_healthy() -> None:
    replicas = [StubModelServer(), StubModelServer()]
    try:
        url, server = serve(Checker([r.url for r in replicas], model="stub-model", timeout_s=PROBE_TIMEOUT_S))
        status, body = get(f"{url}/healthz")
        server.shutdown()
    finally:
        for replica in replicas:
            replica.close()
    assert (status, body["reason"]) == (200, "all 2 replicas answered")
    assert [r["status"] for r in body["replicas"]] == ["ok", "ok"]
    assert all(len(r.completions) == 1 for r in replicas)  # each replica probed itself


def test_one_wedged_replica_of_two_makes_the_instance_unhealthy_naming_it() -> None:
    """The decision: a wedged replica is never reported up, even with the other serving (module docstring: the proxy
    cannot route around a hung server, and the load balancer replaces the instance with a whole one)."""
    healthy, wedged = StubModelServer(), WedgedServer()
    try:
        url, server = serve(Checker([healthy.url, wedged.url], model="stub-model", timeout_s=PROBE_TIMEOUT_S))
        started = time.monotonic()
        status, body = get(f"{url}/healthz")
        elapsed = time.monotonic() - started
        server.shutdown()
    finally:
        healthy.close()
        wedged.close()
    assert status == 503
    assert body["reason"] == (f"1 of 2 replicas unhealthy: replica 1 ({wedged.url}): one-token completion did not "
                              "finish within 0.5 s")
    assert [r["status"] for r in body["replicas"]] == ["ok", "unhealthy"]
    assert elapsed < PROBE_TIMEOUT_S * 2 + 0.5  # probed at once, not one after the other


def test_generated_tokens_are_summed_over_the_replicas() -> None:
    agent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    agent.bind(("127.0.0.1", 0))
    agent.settimeout(2)
    replicas = [StubModelServer(tokens_per_scrape=10), StubModelServer(tokens_per_scrape=5)]
    try:
        emf = EmfPublisher(f"127.0.0.1:{agent.getsockname()[1]}", namespace="NS", fleet="chat", log_group="/lg")
        checker = Checker([r.url for r in replicas], model="stub-model", cache_s=0, emf=emf)
        checker.verdict()
        checker.verdict()
        agent.recv(65535)
        record = json.loads(agent.recv(65535))
    finally:
        for replica in replicas:
            replica.close()
        agent.close()
    assert record["GeneratedTokens"] == 15
