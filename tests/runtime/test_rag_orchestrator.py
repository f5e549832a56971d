"""The RAG request path end to end on 127.0.0.1: two real PostgreSQL + pgvector readers (two zones), the fake
OpenAI-compatible streaming server (the inference fleet), and the orchestrator between them. Nothing is mocked: a
stopped server is a zone's reader gone, a socket that never answers is a reader that hangs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import io
import json
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import psycopg
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from genai_constructs.runtime.rag_orchestrator import (
    OrchestratorConfig,
    RagOrchestrator,
    RetrievalTier,
    parse_config,
)
from genai_constructs.runtime.request_proxy import ChunkedDecoder
from genai_constructs.testing.fake_openai_server import FakeOpenAIServer
from tests.runtime.retrieval_fixtures import (  # noqa: F401
    DIMENSION,
    LOCAL_ZONE,
    OTHER_ZONE,
    Readers,
    readers,
)

RECORD_FIELDS = {"request_id", "status", "embedding_ms", "retrieval_ms", "retrieval_zone", "retrieval_endpoint",
                 "prompt_build_ms", "ttft_ms", "generation_ms", "orchestrator_ms", "total_ms"}


@pytest.fixture(scope="module")
def inference() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(ttft_ms=20, tpot_ms=2, output_tokens=8) as server:
        yield server


def config_for(readers: Readers, inference: FakeOpenAIServer, **changes: Any) -> OrchestratorConfig:  # noqa: F811
    values: dict[str, Any] = dict(
        listen_host="127.0.0.1", listen_port=0, readers=tuple(readers.zones), availability_zone=LOCAL_ZONE,
        database="dbname=postgres user=postgres", table="rag_chunks", encoder=f"hashing:{DIMENSION}",
        inference_host=inference.host, inference_port=inference.port, model="fake-model", top_k=3,
        connect_timeout_s=0.3, query_timeout_s=0.3)
    values.update(changes)
    return OrchestratorConfig(**values)


async def ask(port: int, query: str, request_id: str | None = None) -> tuple[int, dict[str, str], bytes]:
    """POST /v1/rag as a caller would; the decoded body of the (chunked, streamed) response."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps({"query": query}).encode()
    extra = f"X-Request-Id: {request_id}\r\n" if request_id else ""
    writer.write(f"POST /v1/rag HTTP/1.1\r\nHost: rag\r\nContent-Type: application/json\r\nConnection: close\r\n"
                 f"{extra}Content-Length: {len(body)}\r\n\r\n".encode() + body)
    raw = await reader.read()
    writer.close()
    head, _, rest = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    if headers.get("transfer-encoding") == "chunked":
        decoder = ChunkedDecoder()
        pieces, _ = decoder.feed(rest)
        assert decoder.done, "the stream ended without its last chunk"
        rest = b"".join(pieces)
    return int(lines[0].split()[1]), headers, rest


async def run_requests(config: OrchestratorConfig, queries: list[tuple[str, str | None]],
                       ) -> tuple[list[tuple[int, dict[str, str], bytes]], list[dict[str, Any]], dict[str, int]]:
    log = io.StringIO()
    orchestrator = RagOrchestrator(config, log_stream=log)
    await orchestrator.start()
    try:
        answers = [await ask(orchestrator.listen_port, query, request_id) for query, request_id in queries]
    finally:
        await orchestrator.close()
    records = [json.loads(line) for line in log.getvalue().splitlines()]
    return answers, records, orchestrator.retrieval.answered


def test_a_question_is_answered_end_to_end_with_one_record(readers: Readers, inference: FakeOpenAIServer,  # noqa: F811
                                                           ) -> None:
    chunk_id, text = sorted(readers.corpus.chunks.items())[5]
    seen_before = len(inference.requests)
    answers, records, answered = asyncio.run(run_requests(config_for(readers, inference), [(text, "rag-req-1")]))
    status, headers, body = answers[0]
    assert status == 200 and headers["content-type"] == "text/event-stream"
    assert headers["x-request-id"] == "rag-req-1" and headers["x-genai-retrieval-zone"] == "local"
    events = [line[6:] for line in body.decode().split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and len(events) >= 8  # every token streamed through

    assert len(records) == 1
    record = records[0]
    assert RECORD_FIELDS <= set(record) and all(record[name] is not None for name in RECORD_FIELDS)
    assert record["status"] == "ok" and record["request_id"] == "rag-req-1"
    assert record["retrieval_zone"] == "local" and record["retrieval_endpoint"] == readers.local.endpoint
    assert record["retrieved_ids"][0] == chunk_id  # the question is that chunk's text: its nearest neighbour
    assert record["ttft_ms"] >= 15  # the fake server's 20 ms, timed from the upstream request
    assert record["total_ms"] >= record["orchestrator_ms"] + record["ttft_ms"]
    assert answered == {"local": 1, "failover": 0, "failed": 0}

    (upstream,) = inference.requests[seen_before:]
    assert upstream.headers["x-request-id"] == "rag-req-1"  # the request proxy logs the same id
    assert float(upstream.headers["x-genai-retrieval-ms"]) == record["retrieval_ms"]
    prompt = upstream.json["messages"][-1]["content"]
    assert text.strip() in prompt and "[1]" in prompt and prompt.endswith(f"Question: {text}")


def test_a_caller_without_a_request_id_gets_a_fresh_one_forwarded(readers: Readers,  # noqa: F811
                                                                  inference: FakeOpenAIServer) -> None:
    seen_before = len(inference.requests)
    answers, records, _ = asyncio.run(run_requests(config_for(readers, inference),
                                                   [("spot interruptions", None), ("nat", "bad id with spaces")]))
    ids = [record["request_id"] for record in records]
    assert len(set(ids)) == 2 and "bad id with spaces" not in ids
    assert [r.headers["x-request-id"] for r in inference.requests[seen_before:]] == ids
    assert [a[1]["x-request-id"] for a in answers] == ids


def test_bad_bodies_are_400_and_logged(readers: Readers, inference: FakeOpenAIServer) -> None:  # noqa: F811
    async def go() -> tuple[int, list[dict[str, Any]]]:
        log = io.StringIO()
        orchestrator = RagOrchestrator(config_for(readers, inference), log_stream=log)
        await orchestrator.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", orchestrator.listen_port)
        writer.write(b"POST /v1/rag HTTP/1.1\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}")
        raw = await reader.read()
        await orchestrator.close()
        return int(raw.split()[1]), [json.loads(line) for line in log.getvalue().splitlines()]
    status, records = asyncio.run(go())
    assert status == 400 and records[0]["status"] == "client_error"


def test_a_hanging_local_reader_times_out_into_failover(readers: Readers) -> None:  # noqa: F811
    # A listening socket that never accepts: TCP connects (the kernel's backlog) but the server never speaks.
    with socket.socket() as hanging:
        hanging.bind(("127.0.0.1", 0))
        hanging.listen(8)
        endpoint = f"127.0.0.1:{hanging.getsockname()[1]}"
        config = OrchestratorConfig(
            listen_host="127.0.0.1", listen_port=0, readers=((LOCAL_ZONE, endpoint), (OTHER_ZONE, readers.other.endpoint)),
            availability_zone=LOCAL_ZONE, database="dbname=postgres user=postgres", table="rag_chunks",
            encoder=f"hashing:{DIMENSION}", inference_host="127.0.0.1", inference_port=9, model="m",
            connect_timeout_s=0.2, query_timeout_s=0.2, zone_retry_s=30)

        async def go() -> list[tuple[str, int]]:
            tier = RetrievalTier(config)
            try:
                results = [await tier.retrieve([1.0] * DIMENSION, 2) for _ in range(3)]
            finally:
                await tier.close()
            return [(r.zone, r.failures) for r in results]
        # The first query pays the timeout; the next ones skip the failed reader for --zone-retry-s.
        assert asyncio.run(go()) == [("failover", 1), ("failover", 0), ("failover", 0)]


def test_a_stopped_local_reader_fails_over_and_says_so(readers: Readers, inference: FakeOpenAIServer,  # noqa: F811
                                                      ) -> None:
    config = config_for(readers, inference, zone_retry_s=0.05)

    async def go() -> tuple[list[dict[str, Any]], dict[str, int]]:
        log = io.StringIO()
        orchestrator = RagOrchestrator(config, log_stream=log)
        await orchestrator.start()
        try:
            await ask(orchestrator.listen_port, "aurora replicas")  # pools a connection to the local reader
            await asyncio.to_thread(readers.local.stop)
            failed_over = await ask(orchestrator.listen_port, "aurora replicas")
            assert failed_over[0] == 200 and failed_over[1]["x-genai-retrieval-zone"] == "failover"
            await asyncio.to_thread(readers.local.start)
            await asyncio.sleep(0.06)  # past --zone-retry-s: the local reader is first again
            await ask(orchestrator.listen_port, "aurora replicas")
        finally:
            await orchestrator.close()
            if not (readers.local.data_dir / "postmaster.pid").exists():
                readers.local.start()
        return [json.loads(line) for line in log.getvalue().splitlines()], orchestrator.retrieval.answered

    records, answered = asyncio.run(go())
    assert [r["retrieval_zone"] for r in records] == ["local", "failover", "local"]
    assert records[1]["retrieval_endpoint"] == readers.other.endpoint and records[1]["status"] == "ok"
    assert records[1]["retrieved_ids"] == records[0]["retrieved_ids"]  # the same data in both zones
    assert answered == {"local": 2, "failover": 1, "failed": 0}


@pytest.mark.parametrize(("argv", "message"), [
    (["--reader", "us-east-1a"], "argument --reader: 'us-east-1a' is not ZONE=HOST:PORT"),
    (["--reader", "us-east-1a=h:5432", "--reader", "us-east-1a=g:5432"], "zone us-east-1a is given twice"),
    (["--reader", "us-east-1a=h:5432", "--availability-zone", "us-east-1c"],
     "argument --availability-zone: us-east-1c has no --reader; give this zone's reader"),
    (["--reader", "us-east-1a=h:5432", "--top-k", "0"], "argument --top-k: '0' is not a whole number from 1 to 1000"),
    (["--reader", "us-east-1a=h:5432", "--query-timeout-s", "nan"],
     "argument --query-timeout-s: 'nan' is not a finite number of seconds greater than 0"),
    (["--reader", "us-east-1a=h:notaport"], "is not HOST:PORT with a port from 1 to 65535"),
])
def test_bad_command_lines_exit_2_naming_the_flag_and_the_fix(argv: list[str], message: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--encoder", "hashing:8", "--inference", "127.0.0.1:8000", "--model", "m"]
    if "--availability-zone" not in argv:
        base += ["--availability-zone", "us-east-1a"]
    with pytest.raises(SystemExit) as exit_info:
        parse_config(base + argv)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert message in error and len(error.strip().splitlines()) == 1


def test_a_good_command_line_parses() -> None:
    config = parse_config(["--reader", "us-east-1a=10.0.1.5:5432", "--reader", "us-east-1b=10.0.2.5:5432",
                           "--availability-zone", "us-east-1b", "--encoder", "hashing:8",
                           "--inference", "internal-alb:80", "--model", "m"])
    assert config.readers == (("us-east-1a", "10.0.1.5:5432"), ("us-east-1b", "10.0.2.5:5432"))
    assert (config.inference_host, config.inference_port, config.top_k) == ("internal-alb", 80, 4)


def test_inference_failures_are_answered_and_logged(readers: Readers, inference: FakeOpenAIServer,  # noqa: F811
                                                    ) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead_port = closed.getsockname()[1]  # nothing listens once the socket closes
    answers, records, _ = asyncio.run(run_requests(config_for(readers, inference, inference_port=dead_port),
                                                   [("nat gateways", "rag-dead")]))
    assert answers[0][0] == 502 and answers[0][1]["x-request-id"] == "rag-dead"
    assert records[0]["status"] == "upstream_unavailable" and records[0]["retrieval_zone"] == "local"

    inference.reconfigure(behaviour="bad_request")
    try:
        answers, records, _ = asyncio.run(run_requests(config_for(readers, inference), [("nat gateways", None)]))
    finally:
        inference.reconfigure(behaviour="normal")
    assert answers[0][0] == 400 and records[0]["status"] == "upstream_error" and records[0]["upstream_status"] == 400


# ---- TLS to the inference endpoint: a real TLS listener on 127.0.0.1 with a throwaway CA -------------------------

TLS_NAME = "chat.internal.example"
"""The name the inference certificate is issued for; the orchestrator connects to 127.0.0.1, as it connects to the
ALB's own DNS name in a deployment, which the certificate does not cover."""


@dataclass(frozen=True)
class TlsMaterial:
    ca_file: Path
    """The CA that issued the server certificate."""
    other_ca_file: Path
    """A CA that issued nothing the server presents: trusting only it must fail."""
    server_context: ssl.SSLContext


def _certificate(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Certificate | None,
                 issuer_key: ec.EllipticCurvePrivateKey) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (x509.CertificateBuilder().subject_name(name)
               .issuer_name(issuer.subject if issuer else name).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
                              critical=False))
    if issuer is None:  # a CA
        builder = (builder.add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                   .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                content_commitment=False, key_encipherment=False,
                                                data_encipherment=False, key_agreement=False, encipher_only=False,
                                                decipher_only=False), critical=True))
    else:
        builder = (builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.SubjectAlternativeName([x509.DNSName(subject)]), critical=False)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False))
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="module")
def tls_material(tmp_path_factory: pytest.TempPathFactory) -> TlsMaterial:
    directory = tmp_path_factory.mktemp("tls")
    pem = serialization.Encoding.PEM
    ca_key, other_key, server_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    ca = _certificate("Test Inference CA", ca_key, None, ca_key)
    other_ca = _certificate("Some Other CA", other_key, None, other_key)
    server = _certificate(TLS_NAME, server_key, ca, ca_key)
    (directory / "ca.pem").write_bytes(ca.public_bytes(pem))
    (directory / "other-ca.pem").write_bytes(other_ca.public_bytes(pem))
    (directory / "server.pem").write_bytes(server.public_bytes(pem))
    (directory / "server.key").write_bytes(server_key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(directory / "server.pem", directory / "server.key")
    return TlsMaterial(directory / "ca.pem", directory / "other-ca.pem", context)


@pytest.fixture(scope="module")
def tls_inference(tls_material: TlsMaterial) -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(ttft_ms=20, tpot_ms=2, output_tokens=8, ssl_context=tls_material.server_context) as server:
        yield server


def tls_config(readers: Readers, inference_address: str, ca_file: Path,  # noqa: F811
               server_name: str | None = TLS_NAME) -> OrchestratorConfig:
    argv = ["--reader", f"{LOCAL_ZONE}={readers.local.endpoint}", "--reader", f"{OTHER_ZONE}={readers.other.endpoint}",
            "--availability-zone", LOCAL_ZONE, "--encoder", f"hashing:{DIMENSION}", "--table", "rag_chunks",
            "--inference", inference_address, "--model", "fake-model", "--listen", "127.0.0.1:1",
            "--inference-tls", "--inference-ca-file", str(ca_file)]
    if server_name is not None:
        argv += ["--inference-server-name", server_name]
    # Through the parser, as a deployment configures it; only the listen port is made ephemeral.
    return dataclasses.replace(parse_config(argv), listen_port=0, connect_timeout_s=0.3, query_timeout_s=0.3)


def test_the_answer_streams_over_tls_verified_against_the_server_name(
        readers: Readers, tls_inference: FakeOpenAIServer, tls_material: TlsMaterial) -> None:  # noqa: F811
    seen_before = len(tls_inference.requests)
    config = tls_config(readers, tls_inference.address, tls_material.ca_file)
    answers, records, _ = asyncio.run(run_requests(config, [("spot interruptions", "rag-tls-1")]))
    status, headers, body = answers[0]
    assert status == 200 and headers["x-request-id"] == "rag-tls-1"
    events = [line[6:] for line in body.decode().split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and len(events) >= 8
    assert records[0]["status"] == "ok" and records[0]["ttft_ms"] >= 15
    (upstream,) = tls_inference.requests[seen_before:]
    assert upstream.headers["x-request-id"] == "rag-tls-1"
    assert upstream.headers["host"] == f"{TLS_NAME}:{tls_inference.port}"


@pytest.mark.parametrize(("server_name", "ca", "reason"), [
    ("wrong.internal.example", "ca_file", "Hostname mismatch"),  # the certificate does not cover that name
    (None, "ca_file", "IP address mismatch"),  # no name given: verified against the host connected to
    (TLS_NAME, "other_ca_file", "unable to get local issuer certificate"),  # issued by a CA not trusted
])
def test_a_certificate_that_fails_verification_is_a_502_with_the_reason(
        readers: Readers, tls_inference: FakeOpenAIServer, tls_material: TlsMaterial,  # noqa: F811
        server_name: str | None, ca: str, reason: str) -> None:
    seen_before = len(tls_inference.requests)
    config = tls_config(readers, tls_inference.address, getattr(tls_material, ca), server_name)
    answers, records, _ = asyncio.run(asyncio.wait_for(run_requests(config, [("nat gateways", "rag-tls-bad")]), 5))
    status, headers, body = answers[0]
    assert status == 502 and headers["x-request-id"] == "rag-tls-bad"
    assert json.loads(body) == {"error": "inference endpoint's TLS certificate was not accepted"}
    record = records[0]
    assert record["status"] == "upstream_tls_failed" and record["retrieval_zone"] == "local"
    assert reason in record["error"] and f"verifying the certificate as {server_name or '127.0.0.1'!r}" in record["error"]
    assert tls_inference.requests[seen_before:] == []  # no request (no prompt) left over an unverified connection


def test_tls_to_a_plain_http_listener_is_a_tls_error_not_a_hang(readers: Readers,  # noqa: F811
                                                                tls_material: TlsMaterial) -> None:
    async def plain_http_listener(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)  # the ClientHello: an HTTP listener answers it as a malformed request and closes
        writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    async def go() -> tuple[list[tuple[int, dict[str, str], bytes]], list[dict[str, Any]]]:
        listener = await asyncio.start_server(plain_http_listener, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        config = tls_config(readers, f"127.0.0.1:{port}", tls_material.ca_file)
        try:
            answers, records, _ = await asyncio.wait_for(run_requests(config, [("nat gateways", None)]), 5)
        finally:
            listener.close()
        return answers, records

    answers, records = asyncio.run(go())
    assert answers[0][0] == 502 and records[0]["status"] == "upstream_tls_failed"
    assert "WRONG_VERSION_NUMBER" in records[0]["error"] or "wrong version number" in records[0]["error"]


def test_tls_flags_parse(tls_material: TlsMaterial) -> None:
    base = ["--reader", "us-east-1a=10.0.1.5:5432", "--availability-zone", "us-east-1a", "--encoder", "hashing:8",
            "--model", "m", "--inference", "internal-chat-123.us-east-1.elb.amazonaws.com:443"]
    config = parse_config(base + ["--inference-tls", "--inference-server-name", "chat.internal.example.com",
                                  "--inference-ca-file", str(tls_material.ca_file)])
    assert (config.inference_tls, config.inference_tls_name, config.inference_ca_file) == (
        True, "chat.internal.example.com", str(tls_material.ca_file))
    # Without a name the certificate must cover the host connected to; without --inference-tls there is no TLS.
    assert parse_config(base + ["--inference-tls"]).inference_tls_name == "internal-chat-123.us-east-1.elb.amazonaws.com"
    assert parse_config(base).inference_tls_name is None


@pytest.mark.parametrize(("extra", "message"), [
    (["--inference-server-name", "chat.internal.example.com"],
     "argument --inference-server-name: given without --inference-tls, so the connection would be plain HTTP; add "
     "--inference-tls"),
    (["--inference-ca-file", "ca.pem"], "argument --inference-ca-file: given without --inference-tls"),
    (["--inference-tls", "--inference-server-name", "https://chat.internal.example.com"],
     "argument --inference-server-name: 'https://chat.internal.example.com' is not a DNS name; give the name the "
     "inference certificate is issued for"),
    (["--inference-tls", "--inference-server-name", "chat.internal.example.com:443"], "is not a DNS name"),
    (["--inference-tls", "--inference-ca-file", "/nonexistent/ca.pem"],
     "argument --inference-ca-file: cannot load '/nonexistent/ca.pem' as PEM CA certificates (No such file or "
     "directory); give a readable PEM file"),
    (["--inference-tls", "--inference-ca-file", "NOT_PEM"], "argument --inference-ca-file: cannot load"),
])
def test_bad_tls_flags_exit_2_naming_the_flag_and_the_fix(extra: list[str], message: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("this is not a certificate\n")
    extra = [str(not_pem) if value == "NOT_PEM" else value for value in extra]
    with pytest.raises(SystemExit) as exit_info:
        parse_config(["--reader", "us-east-1a=h:5432", "--availability-zone", "us-east-1a", "--encoder", "hashing:8",
                      "--inference", "alb:443", "--model", "m", *extra])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert message in error and len(error.strip().splitlines()) == 1


# ---- Credentials that survive a rotation: the secret in moto's Secrets Manager, password logins on both readers ----

ROTATING_USER = "rag_rotating"


def _require_password(server: Any, password: str) -> None:
    """``ROTATING_USER`` logs in to ``server`` with ``password`` only (scram, ahead of the trust rules)."""
    with psycopg.connect(server.conninfo, autocommit=True) as connection:
        exists = connection.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (ROTATING_USER,)).fetchone()
        verb = "ALTER" if exists else "CREATE"
        connection.execute(f"{verb} ROLE {ROTATING_USER} LOGIN PASSWORD '{password}'")
        connection.execute(f"GRANT SELECT ON rag_chunks TO {ROTATING_USER}")
        hba = server.data_dir / "pg_hba.conf"
        rule = f"host all {ROTATING_USER} 127.0.0.1/32 scram-sha-256\n"
        if not hba.read_text().startswith(rule):
            hba.write_text(rule + hba.read_text())
            connection.execute("SELECT pg_reload_conf()")
    for _ in range(50):  # the reload is a signal: wait until a login without the password is refused
        try:
            psycopg.connect(host=server.host, port=server.port, user=ROTATING_USER, dbname="postgres").close()
        except psycopg.OperationalError:
            return
        time.sleep(0.02)
    raise AssertionError("the password rule did not take effect")


def test_a_rotated_password_is_read_again_and_the_question_still_answered_locally(
        readers: Readers, inference: FakeOpenAIServer, aws_env: dict[str, str]) -> None:  # noqa: F811
    secrets = boto3.client("secretsmanager")
    arn = secrets.create_secret(Name="rag-db-rotating", SecretString=json.dumps(
        {"username": ROTATING_USER, "password": "before-rotation"}))["ARN"]
    for server in (readers.local, readers.other):
        _require_password(server, "before-rotation")
    # No user in --database and no PGPASSWORD: the secret is the only source of the credentials.
    config = config_for(readers, inference, database="dbname=postgres", secret_arn=arn, region="us-east-1")

    async def go() -> tuple[list[int], list[dict[str, Any]], int]:
        log = io.StringIO()
        orchestrator = RagOrchestrator(config, log_stream=log)
        await orchestrator.start()
        try:
            statuses = [(await ask(orchestrator.listen_port, "aurora replicas"))[0]]
            # Single-user rotation: the database's password changes, then the secret's (setSecret, finishSecret).
            for server in (readers.local, readers.other):
                await asyncio.to_thread(_require_password, server, "after-rotation")
            await asyncio.to_thread(secrets.put_secret_value, SecretId=arn, SecretString=json.dumps(
                {"username": ROTATING_USER, "password": "after-rotation"}))
            await orchestrator.retrieval.close()  # open connections survive a rotation; the next ones are new
            statuses += [(await ask(orchestrator.listen_port, "aurora replicas"))[0] for _ in range(2)]
        finally:
            await orchestrator.close()
        assert orchestrator.credentials is not None
        return statuses, [json.loads(line) for line in log.getvalue().splitlines()], orchestrator.credentials.reads

    statuses, records, reads = asyncio.run(go())
    assert statuses == [200, 200, 200]
    # The local reader refused the old password once; the secret was read again and the same reader answered.
    assert [(r["status"], r["retrieval_zone"], r["retrieval_failures"]) for r in records] == [("ok", "local", 0)] * 3
    assert reads == 2  # at start, and once after the refusal (not per request)


def test_a_wrong_password_in_an_unchanged_secret_is_a_503_not_a_loop(
        readers: Readers, inference: FakeOpenAIServer, aws_env: dict[str, str]) -> None:  # noqa: F811
    secrets = boto3.client("secretsmanager")
    arn = secrets.create_secret(Name="rag-db-wrong", SecretString=json.dumps(
        {"username": ROTATING_USER, "password": "never-set"}))["ARN"]
    for server in (readers.local, readers.other):
        _require_password(server, "after-rotation")
    config = config_for(readers, inference, database="dbname=postgres", secret_arn=arn, region="us-east-1")
    answers, records, answered = asyncio.run(asyncio.wait_for(run_requests(config, [("nat", "rag-wrong")]), 5))
    assert answers[0][0] == 503 and records[0]["status"] == "retrieval_unavailable"
    assert "password authentication failed" in records[0]["error"]
    assert answered["failed"] == 1


def test_a_secret_that_cannot_be_read_fails_the_start_with_one_line(
        aws_env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    from genai_constructs.runtime.rag_orchestrator import main
    from genai_constructs.testing.local_postgres import free_port

    missing = "arn:aws:secretsmanager:us-east-1:123456789012:secret:nope-AbCdEf"
    assert main(["--reader", "us-east-1a=127.0.0.1:9", "--availability-zone", "us-east-1a", "--encoder", "hashing:8",
                 "--inference", "127.0.0.1:9", "--model", "m", "--listen", f"127.0.0.1:{free_port()}", "--secret-arn", missing,
                 "--region", "us-east-1"]) == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"rag_orchestrator: cannot read the database secret {missing} (ResourceNotFoundException")
    assert len(error.splitlines()) == 1
