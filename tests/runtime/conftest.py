"""Fixtures the runtime tests share: a real moto server on 127.0.0.1 and the AWS environment that points boto3 (in
the test and in the worker processes it starts) at it. Module-scoped: each test module gets its own server, so no
module sees another's queues and buckets."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.runtime.process_helpers import free_port


@pytest.fixture(scope="module")
def moto_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    server = Path(sys.executable).parent / "moto_server"
    with log.open("wb") as out:
        process = subprocess.Popen([str(server), "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=0.5)
                break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail(f"moto server did not start: {log.read_text()[-2000:]}")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture(scope="module")
def aws_env(moto_endpoint: str, monkeypatch_module: pytest.MonkeyPatch) -> dict[str, str]:
    env = {
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": moto_endpoint,
    }
    for name, value in env.items():
        monkeypatch_module.setenv(name, value)
    return env


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    patch = pytest.MonkeyPatch()
    yield patch
    patch.undo()
