"""A moto server on 127.0.0.1 for the local deploy, and what moto's CloudFormation can and cannot do."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOOPBACK = "127.0.0.1"
"""moto listens on loopback only: nothing leaves the machine."""
REGION = "us-east-1"
"""moto's default region; its default VPC and AMIs live there."""
FAKE_ACCOUNT = "123456789012"
"""The account moto reports for any credentials."""
MOTO_START_TIMEOUT_S = 30.0
"""moto_server imports every service backend on start; 30 s covers a cold start on a 2-core machine."""


class LocalDeployError(RuntimeError):
    """The emulator did not start or the CDK CLI failed; the message carries the tail of its output."""


# --------------------------------------------------------------------------------------------------- moto server


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def _moto_server_bin() -> str:
    beside = Path(sys.executable).with_name("moto_server")
    if beside.exists():
        return str(beside)
    found = shutil.which("moto_server")
    if found is None:
        raise LocalDeployError("moto_server not found: install the dev extras (pip install -e '.[dev]')")
    return found


@dataclass
class MotoServer:
    """A moto server process on 127.0.0.1; use :func:`moto_server` to start and stop one."""

    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def endpoint_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def reset(self) -> None:
        """Drop every resource (``cdk destroy`` of a VPC stack fails on moto; a reset is the clean-up)."""
        request = urllib.request.Request(f"{self.endpoint_url}/moto-api/reset", method="POST")
        with urllib.request.urlopen(request, timeout=10):
            pass

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment for a process that must talk to this server only: fake credentials, endpoint, region."""
        env = dict(os.environ if base is None else base)
        for key in (
            "AWS_PROFILE",
            "AWS_SESSION_TOKEN",
            "AWS_SECURITY_TOKEN",
            "AWS_CONFIG_FILE",
            "AWS_SHARED_CREDENTIALS_FILE",
            "AWS_ROLE_ARN",
            "AWS_WEB_IDENTITY_TOKEN_FILE",
        ):
            env.pop(key, None)
        env.update(
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            AWS_REGION=REGION,
            AWS_DEFAULT_REGION=REGION,
            AWS_ENDPOINT_URL=self.endpoint_url,
            AWS_EC2_METADATA_DISABLED="true",
        )
        return env

    def session(self) -> Any:
        """A boto3 session whose clients all go to this server."""
        import boto3  # type: ignore[import-untyped]

        return _EndpointSession(
            boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing", region_name=REGION),
            self.endpoint_url,
        )


@dataclass
class _EndpointSession:
    inner: Any
    endpoint_url: str

    def client(self, service: str) -> Any:
        return self.inner.client(service, endpoint_url=self.endpoint_url)


@contextmanager
def moto_server(port: int | None = None) -> Iterator[MotoServer]:
    """Start ``moto_server`` on 127.0.0.1 (a free port unless given), wait until it answers, stop it on exit."""
    port = port or _free_port()
    log_dir = Path(tempfile.mkdtemp(prefix="moto-"))
    log_path = log_dir / "moto.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [_moto_server_bin(), "-H", LOOPBACK, "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = MotoServer(port=port, process=process, log_path=log_path)
    try:
        deadline = time.monotonic() + MOTO_START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                raise LocalDeployError(f"moto_server exited with {process.returncode}:\n{tail(log_path.read_text())}")
            try:
                with urllib.request.urlopen(f"{server.endpoint_url}/moto-api/data.json", timeout=1):
                    break
            except OSError as error:
                if time.monotonic() > deadline:
                    raise LocalDeployError(
                        f"moto_server did not answer on port {port} within {MOTO_START_TIMEOUT_S} s"
                    ) from error
                time.sleep(0.1)
        yield server
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        shutil.rmtree(log_dir, ignore_errors=True)


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def moto_creates(resource_type: str) -> bool:
    """Whether moto's CloudFormation creates this resource type (asks moto's own model table)."""
    from moto.cloudformation import parsing

    if is_custom_resource(resource_type) or resource_type in parsing.NULL_MODELS:
        return False
    return resource_type in parsing.get_model_map()


def moto_resolves(resource_type: str, attribute: str) -> bool:
    """Whether moto's CloudFormation can resolve ``Fn::GetAtt`` of this attribute (it fails the stack otherwise)."""
    from moto.cloudformation import parsing

    model = parsing.get_model_map().get(resource_type)
    return model is not None and hasattr(model, "get_cfn_attribute") and bool(model.has_cfn_attr(attribute))


CUSTOM_RESOURCE_TYPES = ("AWS::CloudFormation::CustomResource",)
"""Plus every ``Custom::*`` type: moto runs a custom resource's Lambda only in Docker and waits for its answer."""


def is_custom_resource(resource_type: str) -> bool:
    return resource_type.startswith("Custom::") or resource_type in CUSTOM_RESOURCE_TYPES
