"""The request proxy against the fake vLLM server, on real sockets on 127.0.0.1: what it measures, forwards and logs.

Expected values are the fake server's configuration, written here: the proxy's own code computes none of them.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from genai_constructs.runtime import request_proxy
from genai_constructs.runtime.request_proxy import RequestProxy, parse_config
from genai_constructs.testing.fake_openai_server import FakeOpenAIServer

PROXY_SCRIPT = Path(request_proxy.__file__)
FLEET, VERSION, LOG_GROUP, INSTANCE, ZONE = "chat", "v7", "/genai/chat", "i-0abc", "us-east-1a"
NAMESPACE = "GenaiConstructs/Inference"
PROMPT_MARKER = "zebra-quartz-prompt-marker"


# ---- harness --------------------------------------------------------------------------------------------------------


class EmfCapture:
    """Stands in for the CloudWatch agent's UDP EMF listener: one JSON document per datagram."""

    def __init__(self) -> None:
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.socket.bind(("127.0.0.1", 0))
        self.socket.settimeout(0.05)
        self.port = self.socket.getsockname()[1]
        self.raw: list[bytes] = []
        self._changed = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while not self._stop:
            try:
                datagram = self.socket.recv(65535)
            except OSError:
                continue
            with self._changed:
                self.raw.append(datagram)
                self._changed.notify_all()

    @property
    def records(self) -> list[dict[str, Any]]:
        with self._changed:
            return [json.loads(datagram) for datagram in self.raw]

    def requests(self) -> list[dict[str, Any]]:
        return [record for record in self.records if "request_id" in record]

    def gauges(self) -> list[dict[str, Any]]:
        return [record for record in self.records if "request_id" not in record]

    def wait_for(self, predicate: Callable[[list[dict[str, Any]]], bool], timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate(self.records):
            assert time.monotonic() < deadline, f"records never matched; got {self.records}"
            with self._changed:
                self._changed.wait(0.02)

    def wait_requests(self, count: int, timeout_s: float = 5.0) -> list[dict[str, Any]]:
        self.wait_for(lambda records: sum("request_id" in r for r in records) >= count, timeout_s)
        return self.requests()

    def close(self) -> None:
        self._stop = True
        self._thread.join(1)
        self.socket.close()


class InProcessProxy:
    """The proxy on its own event loop in a thread, configured through the real command-line parser."""

    def __init__(self, upstream: str, emf_port: int, *flags: str) -> None:
        argv = ["--listen", "127.0.0.1:8000", "--upstream", upstream, "--max-concurrency", "4",
                "--emf-address", f"udp:127.0.0.1:{emf_port}", "--namespace", NAMESPACE, "--fleet", FLEET,
                "--model-version", VERSION, "--log-group", LOG_GROUP, "--instance-id", INSTANCE,
                "--availability-zone", ZONE, "--metrics-interval-s", "60", *flags]
        self.config = dataclasses.replace(parse_config(argv), listen_port=0)  # ephemeral port for the test
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.proxy = RequestProxy(self.config)
        self.call(self.proxy.start())
        self.port = self.proxy.listen_port

    def call(self, coroutine: Any, timeout_s: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    def stats(self) -> dict[str, int]:
        async def read() -> dict[str, int]:
            await asyncio.sleep(0.02)  # let close callbacks queued by the last event run
            stats = self.proxy.stats()
            stats["loop_tasks"] = len(asyncio.all_tasks()) - 1  # less this coroutine's own task
            return stats
        result: dict[str, int] = self.call(read())
        return result

    def close(self) -> None:
        self.call(self.proxy.shutdown(0.5))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(2)
        self.loop.close()


@dataclasses.dataclass
class Response:
    status: int
    headers: dict[str, str]
    raw_body: bytes
    body: bytes

    def events(self) -> list[bytes]:
        return [event for event in self.body.split(b"\n\n") if event]


def send(port: int, payload: Any = None, *, path: str = "/v1/completions", method: str = "POST",
         headers: dict[str, str] | None = None, chunked: bool = False) -> socket.socket:
    body = payload if isinstance(payload, bytes) else b"" if payload is None else json.dumps(payload).encode()
    lines = [f"{method} {path} HTTP/1.1", "Host: proxy.test", "Content-Type: application/json"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    if chunked:
        lines.append("Transfer-Encoding: chunked")
        middle = len(body) // 2
        body = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:middle], body[middle:]) if part)
        body += b"0\r\n\r\n"
    elif body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    connection = socket.create_connection(("127.0.0.1", port), timeout=10)
    connection.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    return connection


def read_response(connection: socket.socket) -> Response:
    reader = connection.makefile("rb")
    status_line = reader.readline()
    headers: dict[str, str] = {}
    while (line := reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    raw, body = b"", b""
    if headers.get("transfer-encoding") == "chunked":
        while True:
            size_line = reader.readline()
            size = int(size_line.split(b";")[0], 16)
            data = reader.read(size + 2)
            raw += size_line + data
            body += data[:size]
            if size == 0:
                break
    elif "content-length" in headers:
        raw = body = reader.read(int(headers["content-length"]))
    else:
        raw = body = reader.read()
    reader.close()
    return Response(int(status_line.split()[1]), headers, raw, body)


def call(port: int, payload: Any = None, **options: Any) -> Response:
    with send(port, payload, **options) as connection:
        return read_response(connection)


def completion(*, stream: bool = True, usage: bool = True, prompt: str = "one two three", **extra: Any) -> Any:
    payload: dict[str, Any] = {"model": "fake-model", "prompt": prompt, "stream": stream, **extra}
    if stream and usage:
        payload["stream_options"] = {"include_usage": True}
    return payload


@pytest.fixture
def emf() -> Iterator[EmfCapture]:
    capture = EmfCapture()
    yield capture
    capture.close()


@pytest.fixture
def stack(emf: EmfCapture) -> Iterator[Callable[..., tuple[FakeOpenAIServer, InProcessProxy]]]:
    """Start a fake server (keyword settings) and a proxy in front of it (extra command-line flags)."""
    started: list[tuple[FakeOpenAIServer, InProcessProxy]] = []

    def start(*flags: str, **fake_settings: Any) -> tuple[FakeOpenAIServer, InProcessProxy]:
        fake = FakeOpenAIServer(**fake_settings)
        fake.start()
        proxy = InProcessProxy(fake.address, emf.port, *flags)
        started.append((fake, proxy))
        return fake, proxy

    yield start
    for fake, proxy in started:
        proxy.close()
        fake.close()


# ---- what the records measure ---------------------------------------------------------------------------------------


def test_streamed_completion_record_carries_the_servers_ttft_tpot_and_tokens(stack: Any, emf: EmfCapture) -> None:
    fake, proxy = stack(ttft_ms=80, tpot_ms=15, output_tokens=12)
    response = call(proxy.port, completion())
    assert response.status == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    [record] = emf.wait_requests(1)

    assert 80 <= record["ttft_ms"] < 100
    assert 13 <= record["tpot_ms"] <= 17
    assert record["completion_tokens"] == 12
    assert record["prompt_tokens"] == 3  # "one two three", counted by the fake server's usage chunk
    assert record["TimeToFirstToken"] == record["ttft_ms"]
    assert record["TimePerOutputToken"] == record["tpot_ms"]
    assert 80 + 11 * 15 <= record["e2e_ms"] < 80 + 11 * 15 + 40
    assert record["queue_ms"] < 5
    assert record["upstream_ms"] == pytest.approx(record["e2e_ms"] - record["queue_ms"], abs=0.002)
    assert {key: record[key] for key in ("status", "http_status", "stream", "model", "path", "Fleet",
                                         "ModelVersion", "model_version", "instance_id", "availability_zone")} == {
        "status": "ok", "http_status": 200, "stream": True, "model": "fake-model", "path": "/v1/completions",
        "Fleet": FLEET, "ModelVersion": VERSION, "model_version": VERSION, "instance_id": INSTANCE,
        "availability_zone": ZONE}
    assert record["_aws"]["LogGroupName"] == LOG_GROUP
    assert abs(record["_aws"]["Timestamp"] - time.time() * 1000) < 10_000
    assert record["_aws"]["CloudWatchMetrics"] == [{
        "Namespace": NAMESPACE,
        "Dimensions": [["Fleet"], ["Fleet", "ModelVersion"]],
        "Metrics": [{"Name": "TimeToFirstToken", "Unit": "Milliseconds"},
                    {"Name": "TimePerOutputToken", "Unit": "Milliseconds"}],
    }]


def test_chat_stream_without_usage_counts_token_events_not_the_role_chunk(stack: Any, emf: EmfCapture) -> None:
    fake, proxy = stack(ttft_ms=60, tpot_ms=10, output_tokens=9)
    payload = {"model": "fake-model", "messages": [{"role": "user", "content": "hi there"}], "stream": True}
    response = call(proxy.port, payload, path="/v1/chat/completions")
    assert b'"role":"assistant","content":""' in response.events()[0]  # the role chunk came, and is not a token
    [record] = emf.wait_requests(1)
    assert record["completion_tokens"] == 9
    assert record["prompt_tokens"] is None
    assert 60 <= record["ttft_ms"] < 80
    assert 8 <= record["tpot_ms"] <= 12
    assert record["path"] == "/v1/chat/completions"


def test_non_streamed_completion_has_tokens_from_usage_and_no_ttft(stack: Any, emf: EmfCapture) -> None:
    fake, proxy = stack(ttft_ms=30, tpot_ms=5, output_tokens=7)
    response = call(proxy.port, completion(stream=False, prompt="a b c d"))
    assert json.loads(response.body)["usage"]["completion_tokens"] == 7
    [record] = emf.wait_requests(1)
    assert (record["ttft_ms"], record["tpot_ms"], record["stream"]) == (None, None, False)
    assert (record["prompt_tokens"], record["completion_tokens"]) == (4, 7)
    assert "TimeToFirstToken" not in record and "TimePerOutputToken" not in record
    assert record["_aws"]["CloudWatchMetrics"][0]["Metrics"] == []
    assert 30 + 6 * 5 <= record["e2e_ms"] < 30 + 6 * 5 + 30


@pytest.mark.parametrize(("path", "payload"), [
    ("/v1/completions", completion()),
    ("/v1/completions", completion(stream=False)),
    ("/v1/chat/completions", {"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "stream": True}),
])
def test_response_bytes_are_identical_with_and_without_the_proxy(stack: Any, path: str, payload: Any) -> None:
    fake, proxy = stack(ttft_ms=5, tpot_ms=1, output_tokens=20)
    direct = call(fake.port, payload, path=path)
    proxied = call(proxy.port, payload, path=path)
    assert proxied.status == direct.status == 200
    assert proxied.raw_body == direct.raw_body  # chunk framing included
    assert proxied.headers["content-type"] == direct.headers["content-type"]
    assert "x-request-id" in proxied.headers


def test_a_slow_server_is_measured_slow_and_still_ok(stack: Any, emf: EmfCapture) -> None:
    fake, proxy = stack(ttft_ms=10, tpot_ms=5, output_tokens=3, slow_ttft_ms=600)
    response = call(proxy.port, completion(), headers={"X-Fake-Behaviour": "slow"})
    assert response.status == 200
    [record] = emf.wait_requests(1)
    assert 600 <= record["ttft_ms"] < 650
    assert record["status"] == "ok"


# ---- request ids, caller timings, privacy -----------------------------------------------------------------------


def test_a_callers_request_id_is_kept_end_to_end(stack: Any, emf: EmfCapture) -> None:
    fake, proxy = stack(ttft_ms=5, tpot_ms=1, output_tokens=2)
    response = call(proxy.port, completion(), headers={"X-Request-Id": "caller-id.42"})
    assert response.headers["x-request-id"] == "caller-id.42"
    assert fake.requests[0].headers["x-request-id"] == "caller-id.42"
    assert emf.wait_requests(1)[0]["request_id"] == "caller-id.42"


@pytest.mark.parametrize("caller_id", [None, "has spaces in it", "x" * 129, "quote\"d"])
def test_a_missing_or_unfit_request_id_is_replaced_by_a_new_one(stack: Any, emf: EmfCapture,
                                                                caller_id: str | None) -> None:
    fake, proxy = stack(ttft_ms=5, tpot_ms=1, output_tokens=2)
    headers = {} if caller_id is None else {"X-Request-Id": caller_id}
    response = call(proxy.port, completion(), headers=headers)
    generated = response.headers["x-request-id"]
    assert len(generated) == 32 and int(generated, 16) >= 0  # a uuid4 in hex
    assert fake.requests[0].headers["x-request-id"] == generated
    assert emf.wait_requests(1)[0]["request_id"] == generated


def test_caller_timing_headers_are_joined_into_the_record(stack: Any, emf: EmfCapture) -> None:
    fake, proxy = stack(ttft_ms=5, tpot_ms=1, output_tokens=2)
    call(proxy.port, completion(), headers={"X-Genai-Retrieval-Ms": "12.5", "X-Genai-Preprocess-Ms": "3"})
    call(proxy.port, completion(), headers={"X-Genai-Retrieval-Ms": "soon", "X-Genai-Preprocess-Ms": "nan"})
    first, second = emf.wait_requests(2)
    assert (first["retrieval_ms"], first["preprocess_ms"]) == (12.5, 3.0)
    assert "retrieval_ms" not in second and "preprocess_ms" not in second


def test_prompt_and_completion_text_never_reach_a_record(stack: Any, emf: EmfCapture) -> None:
    fake, proxy = stack(ttft_ms=5, tpot_ms=1, output_tokens=6)
    streamed = call(proxy.port, completion(prompt=f"secret {PROMPT_MARKER} text"))
    whole = call(proxy.port, completion(stream=False, prompt=f"secret {PROMPT_MARKER} text"))
    chat = {"model": "fake-model", "messages": [{"role": "user", "content": PROMPT_MARKER}], "stream": True}
    call(proxy.port, chat, path="/v1/chat/completions")
    emf.wait_requests(3)
    completion_text = json.loads(whole.body)["choices"][0]["text"]
    assert completion_text.strip() and b'"text":' in streamed.body
    everything = b"".join(emf.raw).decode()
    assert PROMPT_MARKER not in everything
    assert json.dumps(completion_text)[1:-1] not in everything


# ---- failures -------------------------------------------------------------------------------------------------------


def test_a_wedged_server_times_out_with_504(stack: Any, emf: EmfCapture) -> None:
    fake, proxy = stack("--upstream-timeout-s", "0.3", ttft_ms=5, tpot_ms=1, output_tokens=2)
    started = time.monotonic()
    response = call(proxy.port, completion(), headers={"X-Fake-Behaviour": "wedged"})
    elapsed = time.monotonic() - started
    assert response.status == 504
    assert 0.3 <= elapsed < 1.0
    assert "sent nothing for 0.3 s" in json.loads(response.body)["error"]["message"]
    [record] = emf.wait_requests(1)
    assert (record["status"], record["http_status"], record["ttft_ms"]) == ("timeout", 504, None)
    assert record["_aws"]["CloudWatchMetrics"][0]["Metrics"] == []
    assert fake.wait_until(lambda server: server.requests[0].cancelled)  # the proxy hung up on it


def test_an_unreachable_server_gives_502(emf: EmfCapture) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    proxy = InProcessProxy(f"127.0.0.1:{port}", emf.port)
    try:
        response = call(proxy.port, completion())
        [record] = emf.wait_requests(1)
    finally:
        proxy.close()
    assert response.status == 502
    assert (record["status"], record["http_status"], record["model"]) == ("upstream_unavailable", 502, "fake-model")


def test_a_4xx_is_passed_through_and_logged_as_client_error(stack: Any, emf: EmfCapture) -> None:
    fake, proxy = stack(ttft_ms=5, tpot_ms=1, output_tokens=2)
    direct = call(fake.port, completion(max_tokens=0))
    proxied = call(proxy.port, completion(max_tokens=0))
    assert proxied.status == direct.status == 400
    assert proxied.body == direct.body
    assert json.loads(proxied.body)["error"]["type"] == "BadRequestError"
    [record] = emf.wait_requests(1)
    assert (record["status"], record["http_status"], record["ttft_ms"]) == ("client_error", 400, None)


def test_a_client_that_disconnects_mid_stream_cancels_upstream_and_leaks_nothing(stack: Any, emf: EmfCapture) -> None:
    fake, proxy = stack("--max-concurrency", "1", ttft_ms=20, tpot_ms=20, output_tokens=50)
    call(proxy.port, completion(max_tokens=2))  # warm: one pooled upstream connection, records flowing
    emf.wait_requests(1)
    before = proxy.stats()

    connection = send(proxy.port, completion())
    reader = connection.makefile("rb")
    while b'"text":' not in reader.readline():  # read up to the first token, then walk away
        pass
    reader.close()
    connection.close()

    assert fake.wait_until(lambda server: server.requests[-1].cancelled, timeout_s=2)
    assert fake.requests[-1].tokens_sent < 50
    record = emf.wait_requests(2)[-1]
    assert record["status"] == "cancelled"
    assert record["http_status"] == 200
    assert 20 <= record["ttft_ms"] < 40  # the first token did reach the caller

    started = time.monotonic()
    follow_up = call(proxy.port, completion(max_tokens=2))  # max-concurrency 1: served only if the slot was freed
    assert follow_up.status == 200
    assert time.monotonic() - started < 0.5
    after = proxy.stats()
    assert after["exchanges"] == after["tasks"] == after["admission_active"] == after["admission_waiting"] == 0
    assert after["loop_tasks"] == before["loop_tasks"]
    assert after["clients"] == 0
    assert after["upstream_open"] == after["upstream_idle"] <= 1  # the aborted connection is gone
    assert fake.wait_until(lambda server: server.open_connections == after["upstream_open"])


def test_a_pooled_connection_closed_by_the_server_is_retried_on_a_fresh_one(emf: EmfCapture) -> None:
    """The keep-alive race: the server closes an idle connection just as the proxy sends on it."""
    listener = socket.create_server(("127.0.0.1", 0))
    answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
    served: list[int] = []
    requests: list[bytes] = []

    def handle(connection: socket.socket) -> None:
        with connection:
            request = connection.recv(65536)
            if request.startswith(b"GET /metrics"):  # the proxy's gauge scrape
                connection.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                return
            requests.append(request)
            served.append(len(served) + 1)
            connection.sendall(answer)  # keep-alive: the proxy pools this connection
            if served == [1]:
                connection.recv(65536)  # the second request arrives on it, and the server closes unanswered

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(connection,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    proxy = InProcessProxy(f"127.0.0.1:{listener.getsockname()[1]}", emf.port)
    try:
        assert call(proxy.port, completion(stream=False)).status == 200
        assert call(proxy.port, completion(stream=False)).status == 200
    finally:
        proxy.close()
        listener.close()
    assert served == [1, 2]  # the second request was answered on a second connection
    body = requests[-1].split(b"\r\n\r\n", 1)[1]
    assert json.loads(body) == completion(stream=False)  # sent again whole, body included
    assert [record["status"] for record in emf.wait_requests(2)] == ["ok", "ok"]


# ---- admission and gauges -------------------------------------------------------------------------------------------


def test_at_max_concurrency_the_second_request_waits_for_the_first(stack: Any, emf: EmfCapture) -> None:
    fake, proxy = stack("--max-concurrency", "1", "--metrics-interval-s", "0.05", ttft_ms=50, tpot_ms=10,
                        output_tokens=16)
    duration_ms = 50 + 15 * 10
    responses: list[Response] = []
    threads = [threading.Thread(target=lambda: responses.append(call(proxy.port, completion()))) for _ in range(2)]
    for thread in threads:
        thread.start()
        time.sleep(0.02)
    emf.wait_for(lambda records: any(r.get("RequestsWaiting") == 1 and r.get("RequestsInFlight") == 1
                                     for r in records), timeout_s=2)
    for thread in threads:
        thread.join(5)
    assert [response.status for response in responses] == [200, 200]
    first, second = sorted(emf.wait_requests(2), key=lambda record: record["queue_ms"])
    assert first["queue_ms"] < 5
    assert duration_ms - 30 <= second["queue_ms"] <= duration_ms + 20  # it started 20 ms after the first
    assert second["queue_ms"] == pytest.approx(first["e2e_ms"] - 20, abs=15)
    assert second["ttft_ms"] >= second["queue_ms"] + 50  # TTFT counts from arrival, so it includes the wait
    assert len(fake.requests) == 2 and all(r.outcome == "completed" for r in fake.requests)


def test_gauges_are_published_with_zero_traffic(stack: Any, emf: EmfCapture) -> None:
    fake, proxy = stack("--metrics-interval-s", "0.1")
    emf.wait_for(lambda records: len(records) >= 3, timeout_s=2)
    gauge = emf.gauges()[-1]
    assert (gauge["RequestsInFlight"], gauge["RequestsWaiting"], gauge["KvCacheUsage"]) == (0, 0, 0)
    assert gauge["_aws"]["CloudWatchMetrics"] == [{
        "Namespace": NAMESPACE,
        "Dimensions": [["Fleet"], ["Fleet", "ModelVersion"]],
        "Metrics": [{"Name": "RequestsInFlight", "Unit": "Count"}, {"Name": "RequestsWaiting", "Unit": "Count"},
                    {"Name": "KvCacheUsage", "Unit": "Percent"}],
    }]
    assert (gauge["Fleet"], gauge["ModelVersion"], gauge["_aws"]["LogGroupName"]) == (FLEET, VERSION, LOG_GROUP)


def test_gauges_read_the_legacy_kv_cache_name_and_survive_a_failed_scrape(stack: Any, emf: EmfCapture) -> None:
    fake, proxy = stack("--metrics-interval-s", "0.1", legacy_metric_names=True, kv_capacity_tokens=100,
                        ttft_ms=5, tpot_ms=200, output_tokens=10)
    connection = send(proxy.port, completion(prompt="one two three four five"))  # 5 prompt tokens of 100
    emf.wait_for(lambda records: any(r.get("RequestsInFlight") == 1 for r in records), timeout_s=2)
    busy = [r for r in emf.gauges() if r.get("RequestsInFlight") == 1][-1]
    assert 5 <= busy["KvCacheUsage"] <= 7  # 5 prompt + up to 2 generated, of 100 tokens
    connection.close()
    fake.close()
    emf.wait_for(lambda records: "scrape_error" in records[-1], timeout_s=2)
    failed = emf.records[-1]
    assert [m["Name"] for m in failed["_aws"]["CloudWatchMetrics"][0]["Metrics"]] == ["RequestsWaiting"]
    assert failed["RequestsWaiting"] == 0 and "RequestsInFlight" not in failed


# ---- HTTP -----------------------------------------------------------------------------------------------------------


def test_forwarding_drops_hop_by_hop_fields_and_keeps_the_connection_alive(stack: Any) -> None:
    fake, proxy = stack(ttft_ms=5, tpot_ms=1, output_tokens=3)
    headers = {"Connection": "keep-alive, X-Hop", "X-Hop": "1", "Keep-Alive": "timeout=5", "TE": "trailers",
               "X-End-To-End": "kept"}
    with send(proxy.port, completion(), headers=headers) as connection:
        first = read_response(connection)
        body = json.dumps(completion()).encode()
        connection.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: proxy.test\r\nContent-Length: %d\r\n\r\n%s"
                           % (len(body), body))
        second = read_response(connection)
    assert first.status == second.status == 200
    assert "connection" not in first.headers  # HTTP/1.1 keep-alive is the default: nothing to say
    seen = fake.requests[0].headers
    assert seen["x-end-to-end"] == "kept" and seen["host"] == "proxy.test"
    assert not {"connection", "x-hop", "keep-alive", "te"} & set(seen)


def test_a_chunked_request_body_is_forwarded_whole(stack: Any) -> None:
    fake, proxy = stack(ttft_ms=5, tpot_ms=1, output_tokens=3)
    payload = completion(prompt="chunked " * 50)
    response = call(proxy.port, payload, chunked=True)
    assert response.status == 200
    assert fake.requests[0].json == payload
    assert fake.requests[0].headers["content-length"] == str(len(json.dumps(payload)))


def test_probes_and_metrics_bypass_admission_and_are_not_recorded(stack: Any, emf: EmfCapture) -> None:
    fake, proxy = stack("--max-concurrency", "1", ttft_ms=5, tpot_ms=100, output_tokens=5)
    busy = send(proxy.port, completion())  # holds the only slot
    assert fake.wait_until(lambda server: len(server.requests) == 1)
    assert call(proxy.port, path="/health", method="GET").status == 200
    assert b"vllm:num_requests_running" in call(proxy.port, path="/metrics", method="GET").body
    busy.close()
    emf.wait_requests(1)
    assert [record["path"] for record in emf.requests()] == ["/v1/completions"]


def test_records_reach_a_tcp_agent_that_starts_late(stack: Any) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        agent_port = probe.getsockname()[1]
    fake, proxy = stack("--emf-address", f"tcp:127.0.0.1:{agent_port}", ttft_ms=5, tpot_ms=1, output_tokens=2)
    assert call(proxy.port, completion()).status == 200  # the agent is down: the record waits in the buffer
    agent = socket.create_server(("127.0.0.1", agent_port))
    agent.settimeout(3)
    connection, _ = agent.accept()
    connection.settimeout(3)
    received = b""
    while received.count(b"\n") < 2:
        received += connection.recv(65536)
    connection.close()
    agent.close()
    records = [json.loads(line) for line in received.splitlines()]
    assert any(record.get("status") == "ok" for record in records)


# ---- the command line -----------------------------------------------------------------------------------------------


BASE_ARGS = ["--upstream", "127.0.0.1:18000", "--max-concurrency", "64", "--fleet", FLEET, "--model-version",
             VERSION, "--log-group", LOG_GROUP, "--instance-id", INSTANCE, "--availability-zone", ZONE]


@pytest.mark.parametrize(("flag", "value"), [
    ("--listen", "0.0.0.0:0"),
    ("--upstream", "127.0.0.1:0"),
    ("--max-concurrency", "0"),
    ("--keep-alive-s", "nan"),
    ("--keep-alive-s", "-1"),
    ("--emf-address", "carrier-pigeon:25888"),
    ("--metrics-interval-s", "inf"),
    ("--upstream", "127.0.0.1:18000"),  # a second time: every replica has a port of its own
])
def test_bad_values_exit_2_naming_the_flag_and_the_value(flag: str, value: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_config([*BASE_ARGS, flag, value])
    assert exit_info.value.code == 2
    message = capsys.readouterr().err
    assert message.count("\n") == 1
    assert flag in message and repr(value) in message and "; give " in message
    assert "Traceback" not in message


def test_the_script_itself_rejects_a_bad_value_without_a_traceback() -> None:
    result = subprocess.run([sys.executable, str(PROXY_SCRIPT), *BASE_ARGS, "--keep-alive-s", "nan"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert result.stderr == ("request_proxy: error: argument --keep-alive-s: 'nan' is not a finite number of "
                             "seconds greater than 0; give e.g. 360 (above the load balancer's idle timeout)\n")


def test_sigterm_lets_the_stream_in_flight_finish_then_exits_0(tmp_path: Path) -> None:
    with FakeOpenAIServer(ttft_ms=20, tpot_ms=20, output_tokens=15) as fake, socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()
        log_file = tmp_path / "records.jsonl"
        process = subprocess.Popen(
            [sys.executable, str(PROXY_SCRIPT), *BASE_ARGS, "--upstream", fake.address, "--listen",
             f"127.0.0.1:{port}", "--emf-address", "none", "--log-file", str(log_file), "--drain-s", "5"],
            stderr=subprocess.PIPE, text=True)
        try:
            assert process.stderr is not None
            assert "listening on" in process.stderr.readline()
            connection = send(port, completion())
            reader = connection.makefile("rb")
            while b'"text":' not in reader.readline():
                pass
            process.send_signal(signal.SIGTERM)
            rest = reader.read()  # the stream runs to its end ...
            assert rest.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
            assert process.wait(5) == 0  # ... and then the proxy exits cleanly
        finally:
            if process.poll() is None:
                process.kill()
            process.wait(5)
            if process.stderr is not None:
                process.stderr.close()
        records = [json.loads(line) for line in log_file.read_text().splitlines()]
        [request] = [record for record in records if "request_id" in record]
        assert (request["status"], request["completion_tokens"]) == ("ok", 15)
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_the_proxy_runs_on_the_instances_python_3_9_standard_library_only() -> None:
    source = PROXY_SCRIPT.read_text()
    tree = ast.parse(source, feature_version=(3, 9))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}


# ---- several replicas behind one proxy ------------------------------------------------------------------------------


@pytest.fixture
def two_replicas(emf: EmfCapture) -> Iterator[Callable[..., tuple[list[FakeOpenAIServer], InProcessProxy]]]:
    """Two fake servers (the instance's replicas) and one proxy in front of both."""
    started: list[tuple[list[FakeOpenAIServer], InProcessProxy]] = []

    def start(*flags: str, **fake_settings: Any) -> tuple[list[FakeOpenAIServer], InProcessProxy]:
        fakes = [FakeOpenAIServer(**fake_settings) for _ in range(2)]
        for fake in fakes:
            fake.start()
        proxy = InProcessProxy(fakes[0].address, emf.port, "--upstream", fakes[1].address, *flags)
        started.append((fakes, proxy))
        return fakes, proxy

    yield start
    for fakes, proxy in started:
        proxy.close()
        for fake in fakes:
            fake.close()


def test_requests_go_to_the_least_busy_replica_each_capped_and_the_gauges_are_the_instances(
        two_replicas: Any, emf: EmfCapture) -> None:
    fakes, proxy = two_replicas("--max-concurrency", "2", "--metrics-interval-s", "0.05", ttft_ms=50, tpot_ms=10,
                                output_tokens=16)
    responses: list[Response] = []
    threads = [threading.Thread(target=lambda: responses.append(call(proxy.port, completion()))) for _ in range(5)]
    for thread in threads:
        thread.start()
        time.sleep(0.02)
    # Four run (two per replica, each replica's cap), the fifth waits in the proxy; the gauges add both replicas.
    emf.wait_for(lambda records: any(r.get("RequestsInFlight") == 4 and r.get("RequestsWaiting") == 1
                                     for r in records), timeout_s=2)
    assert [len(fake.requests) for fake in fakes] == [2, 2]
    for thread in threads:
        thread.join(5)
    assert [response.status for response in responses] == [200] * 5
    assert sorted(len(fake.requests) for fake in fakes) == [2, 3]
    assert all(r.outcome == "completed" for fake in fakes for r in fake.requests)
    assert [record["status"] for record in emf.wait_requests(5)] == ["ok"] * 5


def test_ties_alternate_between_replicas(two_replicas: Any) -> None:
    fakes, proxy = two_replicas(ttft_ms=1, tpot_ms=1, output_tokens=2)
    for _ in range(4):  # one at a time: both replicas idle each time, so the turn decides
        assert call(proxy.port, completion()).status == 200
    assert [len(fake.requests) for fake in fakes] == [2, 2]


def test_a_replica_that_is_down_is_skipped_while_the_other_serves(emf: EmfCapture) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{unused.getsockname()[1]}"
    with FakeOpenAIServer(ttft_ms=5, tpot_ms=1, output_tokens=4) as alive:
        proxy = InProcessProxy(dead, emf.port, "--upstream", alive.address, "--metrics-interval-s", "0.05")
        try:
            statuses = [call(proxy.port, completion()).status for _ in range(3)]
            records = emf.wait_requests(3)
            done = len(emf.records)  # every request has ended: the gauges from here on are of an idle instance
            emf.wait_for(lambda found: any("scrape_error" in r and "RequestsInFlight" in r for r in found[done:]))
            gauge = next(r for r in emf.records[done:] if "scrape_error" in r and "RequestsInFlight" in r)
        finally:
            proxy.close()
    assert statuses == [200, 200, 200]
    assert len(alive.requests) == 3
    assert [record["status"] for record in records] == ["ok"] * 3
    assert gauge["scrape_error"].startswith(f"{dead}: ")  # the instance's gauges still come from the live one
    assert gauge["RequestsInFlight"] == 0


def test_when_every_replica_is_down_the_caller_gets_502_naming_each(emf: EmfCapture) -> None:
    ports = []
    for _ in range(2):
        with socket.socket() as unused:
            unused.bind(("127.0.0.1", 0))
            ports.append(unused.getsockname()[1])
    proxy = InProcessProxy(f"127.0.0.1:{ports[0]}", emf.port, "--upstream", f"127.0.0.1:{ports[1]}")
    try:
        response = call(proxy.port, completion())
        [record] = emf.wait_requests(1)
        stats = proxy.stats()
    finally:
        proxy.close()
    assert response.status == 502
    message = json.loads(response.body)["error"]["message"]
    assert message.startswith("no model server replica reachable: ")
    assert f"127.0.0.1:{ports[0]}: " in message and f"127.0.0.1:{ports[1]}: " in message
    assert (record["status"], record["http_status"]) == ("upstream_unavailable", 502)
    assert stats["admission_active"] == stats["admission_waiting"] == 0
