"""Zonal client: IMDSv2 zone lookup against a real HTTP server on 127.0.0.1, ordering, and failover.

No mocks: a local server plays IMDS (token PUT, then placement GET with the token) and local servers play the
per-zone endpoints; a closed port plays a zone that is down.
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from genai_constructs.runtime.zonal_client import (
    FailoverExhaustedError,
    ZonalClient,
    ZonalEndpoints,
    ZoneLookupError,
    availability_zone,
    call_with_failover,
    zone_of,
)

TOKEN = "AQAEAFakeToken=="


@dataclass
class FakeImds:
    zone: str = "us-east-1b"
    delay_s: float = 0.0
    refuse_tokens: bool = False
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)


class _ImdsHandler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self, status: int, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self) -> None:
        state = self.server.state
        state.requests.append(("PUT", self.path, {k.lower(): v for k, v in self.headers.items()}))
        time.sleep(state.delay_s)
        if (
            state.refuse_tokens
            or self.path != "/latest/api/token"
            or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
        ):
            self._answer(403, "Forbidden")
        else:
            self._answer(200, TOKEN)

    def do_GET(self) -> None:
        state = self.server.state
        state.requests.append(("GET", self.path, {k.lower(): v for k, v in self.headers.items()}))
        if self.headers.get("X-aws-ec2-metadata-token") != TOKEN:
            self._answer(401, "Unauthorized")  # IMDSv2 required: no token, no answer
        elif self.path == "/latest/meta-data/placement/availability-zone":
            self._answer(200, state.zone)
        else:
            self._answer(404, "Not Found")


class _Server(ThreadingHTTPServer):
    state: FakeImds
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that timed out and hung up (the timeout test) is expected, not a failure


def _serve(handler: type[BaseHTTPRequestHandler], state: object) -> tuple[_Server, str]:
    server = _Server(("127.0.0.1", 0), handler)
    server.state = state  # type: ignore[assignment]
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture(scope="module")
def imds_server() -> Iterator[tuple[_Server, str]]:
    server, url = _serve(_ImdsHandler, FakeImds())
    yield server, url
    server.shutdown()
    server.server_close()


@pytest.fixture
def imds(imds_server: tuple[_Server, str]) -> Iterator[tuple[FakeImds, str]]:
    server, url = imds_server
    server.state = FakeImds()
    yield server.state, url


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# ---- IMDSv2 ---------------------------------------------------------------------------------------------------------


def test_availability_zone_puts_a_token_then_gets_the_placement_with_it(imds: tuple[FakeImds, str]) -> None:
    state, url = imds
    assert availability_zone(base_url=url) == "us-east-1b"
    (put, get) = state.requests
    assert put[:2] == ("PUT", "/latest/api/token")
    assert put[2]["x-aws-ec2-metadata-token-ttl-seconds"] == "21600"
    assert get[:2] == ("GET", "/latest/meta-data/placement/availability-zone")
    assert get[2]["x-aws-ec2-metadata-token"] == TOKEN


def test_availability_zone_fails_when_imds_refuses_a_token(imds: tuple[FakeImds, str]) -> None:
    state, url = imds
    state.refuse_tokens = True
    with pytest.raises(ZoneLookupError, match="403"):
        availability_zone(base_url=url)


def test_availability_zone_times_out_instead_of_hanging(imds: tuple[FakeImds, str]) -> None:
    state, url = imds
    state.delay_s = 1.0
    started = time.monotonic()
    with pytest.raises(ZoneLookupError, match="timed out"):
        availability_zone(base_url=url, timeout_s=0.2)
    assert time.monotonic() - started < 0.9


def test_availability_zone_fails_when_imds_is_unreachable() -> None:
    with pytest.raises(ZoneLookupError, match="gave no availability zone"):
        availability_zone(base_url=closed_port_url(), timeout_s=0.5)


def test_availability_zone_rejects_an_answer_that_is_not_a_zone(imds: tuple[FakeImds, str]) -> None:
    state, url = imds
    state.zone = "<html>captive portal</html>"
    with pytest.raises(ZoneLookupError, match="not an availability zone name"):
        availability_zone(base_url=url)


# ---- Names ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "zone"),
    [
        ("vpce-0a1b2c3d4e5f6a7b8-abcdefgh-us-east-1a.sqs.us-east-1.vpce.amazonaws.com", "us-east-1a"),
        ("us-west-2c.rerank-123.elb.us-west-2.amazonaws.com", "us-west-2c"),
        ("vpce-0a1-b2c-us-gov-west-1b.kms.us-gov-west-1.vpce.amazonaws.com", "us-gov-west-1b"),
        ("vpce-0a1-b2c-ap-southeast-2c.logs.ap-southeast-2.vpce.amazonaws.com", "ap-southeast-2c"),
        ("vpce-0a1b2c3d4e5f6a7b8-abcdefgh.sqs.us-east-1.vpce.amazonaws.com", None),  # regional
        ("sqs.us-east-1.amazonaws.com", None),  # private DNS name
    ],
)
def test_zone_of_reads_the_zone_from_the_first_label(name: str, zone: str | None) -> None:
    assert zone_of(name) == zone


ENTRIES = ",".join(
    [
        "Z7HUB22UULQXV:vpce-0a1-b2c.search.us-east-1.vpce.amazonaws.com",
        "Z7HUB22UULQXV:vpce-0a1-b2c-us-east-1c.search.us-east-1.vpce.amazonaws.com",
        "Z7HUB22UULQXV:vpce-0a1-b2c-us-east-1a.search.us-east-1.vpce.amazonaws.com",
        "Z7HUB22UULQXV:vpce-0a1-b2c-us-east-1b.search.us-east-1.vpce.amazonaws.com",
    ]
)


def test_dns_entries_lose_their_hosted_zone_and_group_by_zone() -> None:
    endpoints = ZonalEndpoints.from_dns_entries(ENTRIES)
    assert list(endpoints.zonal) == ["us-east-1a", "us-east-1b", "us-east-1c"]
    assert endpoints.zonal["us-east-1b"] == ("vpce-0a1-b2c-us-east-1b.search.us-east-1.vpce.amazonaws.com",)
    assert endpoints.regional == ("vpce-0a1-b2c.search.us-east-1.vpce.amazonaws.com",)


def test_ordered_puts_the_own_zone_first_other_zones_next_and_regional_last() -> None:
    ordered = ZonalEndpoints.from_dns_entries(ENTRIES).ordered("us-east-1b")
    assert [zone_of(n) for n in ordered] == ["us-east-1b", "us-east-1a", "us-east-1c", None]


def test_ordered_without_a_known_zone_keeps_a_stable_zone_order() -> None:
    ordered = ZonalEndpoints.from_dns_entries(ENTRIES).ordered(None)
    assert [zone_of(n) for n in ordered] == ["us-east-1a", "us-east-1b", "us-east-1c", None]


def test_from_dns_entries_rejects_an_empty_string() -> None:
    with pytest.raises(ValueError, match="no DNS names"):
        ZonalEndpoints.from_dns_entries(" , ")


# ---- Failover, against real local servers ---------------------------------------------------------------------------


@dataclass
class Hits:
    count: int = 0


class _ZoneHandler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.server.state.count += 1  # type: ignore[attr-defined]
        body = f"answered by {self.server.server_address[1]}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def zones() -> Iterator[dict[str, tuple[str, Hits]]]:
    """Zone a and c answer; zone b (the instance's own, in these tests) is configured per test."""
    servers = []
    out: dict[str, tuple[str, Hits]] = {}
    for zone in ("us-east-1a", "us-east-1b", "us-east-1c"):
        hits = Hits()
        server, url = _serve(_ZoneHandler, hits)
        servers.append(server)
        out[zone] = (url, hits)
    yield out
    for server in servers:
        server.shutdown()
        server.server_close()


def _hosts() -> list[str]:
    return [f"vpce-0a1-b2c-us-east-1{z}.search.us-east-1.vpce.amazonaws.com" for z in "bac"]


def _caller(urls: dict[str, str]):  # type: ignore[no-untyped-def]
    def call(host: str) -> str:
        with urllib.request.urlopen(urls[zone_of(host) or ""] + "/query", timeout=1) as response:
            return str(response.read().decode())

    return call


def test_local_zone_answers_and_no_other_zone_is_called(zones: dict[str, tuple[str, Hits]]) -> None:
    urls = {zone: url for zone, (url, _) in zones.items()}
    result = call_with_failover(_hosts(), _caller(urls))
    assert result.startswith("answered by")
    assert [zones[z][1].count for z in ("us-east-1a", "us-east-1b", "us-east-1c")] == [0, 1, 0]


def test_fails_over_to_the_next_zone_only_when_the_local_one_refuses(zones: dict[str, tuple[str, Hits]]) -> None:
    urls = {zone: url for zone, (url, _) in zones.items()}
    urls["us-east-1b"] = closed_port_url()  # own zone down
    call_with_failover(_hosts(), _caller(urls))
    assert [zones[z][1].count for z in ("us-east-1a", "us-east-1c")] == [1, 0]


def test_a_non_network_error_is_not_retried_in_other_zones(zones: dict[str, tuple[str, Hits]]) -> None:
    calls: list[str] = []

    def call(host: str) -> str:
        calls.append(host)
        raise KeyError("bad request: same in every zone")

    with pytest.raises(KeyError):
        call_with_failover(_hosts(), call)
    assert len(calls) == 1


def test_every_zone_down_raises_with_each_error_listed() -> None:
    urls = {f"us-east-1{z}": closed_port_url() for z in "abc"}
    with pytest.raises(FailoverExhaustedError, match="all 3 endpoint") as raised:
        call_with_failover(_hosts(), _caller(urls))
    assert [host for host, _ in raised.value.errors] == _hosts()


def test_zonal_client_learns_its_zone_once_and_calls_it_first(
    imds: tuple[FakeImds, str], zones: dict[str, tuple[str, Hits]]
) -> None:
    state, imds_url = imds
    client = ZonalClient.from_dns_entries(ENTRIES, imds_base_url=imds_url)
    urls = {zone: url for zone, (url, _) in zones.items()}
    urls[""] = urls["us-east-1a"]
    client.call(_caller(urls))
    client.call(_caller(urls))
    assert client.zone == "us-east-1b"
    assert zones["us-east-1b"][1].count == 2 and zones["us-east-1a"][1].count == 0
    assert [method for method, _, _ in state.requests] == ["PUT", "GET"]  # looked up once


def test_zonal_client_off_ec2_still_works_without_a_zone_preference() -> None:
    client = ZonalClient.from_dns_entries(ENTRIES, imds_base_url=closed_port_url(), imds_timeout_s=0.2)
    assert client.zone is None
    assert zone_of(client.ordered()[0]) == "us-east-1a"


def test_async_failover_says_which_endpoint_answered_and_avoided_ones_go_last() -> None:
    import asyncio

    from genai_constructs.runtime.zonal_client import call_with_failover_async

    tried: list[str] = []

    async def call(endpoint: str) -> str:
        tried.append(endpoint)
        if endpoint == "a":
            raise ConnectionRefusedError("down")
        return endpoint.upper()

    answer = asyncio.run(call_with_failover_async(["a", "b"], call))
    assert (answer.value, answer.endpoint, [e for e, _ in answer.failures]) == ("B", "b", ["a"])
    client = ZonalClient(ZonalEndpoints(zonal={"us-east-1a": ("a",), "us-east-1b": ("b",)}), own_zone="us-east-1a")
    tried.clear()
    answer = asyncio.run(client.call_async(call, avoid=["a"]))
    assert tried == ["b"] and not client.is_local(answer.endpoint) and client.is_local("a")
