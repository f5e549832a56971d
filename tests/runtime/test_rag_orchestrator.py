"""The RAG request path end to end on 127.0.0.1: two real PostgreSQL + pgvector readers (two zones), the fake
OpenAI-compatible streaming server (the inference fleet), and the orchestrator between them. Nothing is mocked: a
stopped server is a zone's reader gone, a socket that never answers is a reader that hangs.
"""

from __future__ import annotations

import asyncio
import io
import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest

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
