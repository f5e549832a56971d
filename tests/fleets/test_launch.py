"""The shared launch pieces: user data rendering (shellcheck, and run for real against a stub aws/docker), the
CloudWatch agent config, the DLAMI parameters and the launch template."""

from __future__ import annotations

import ast
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from aws_cdk import App, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk.assertions import Match, Template

from genai_constructs.fleets import _launch

SHELLCHECK = Path(sys.executable).parent / "shellcheck"
USER_DATA_LIMIT_BYTES = 16 * 1024


def settings(**overrides: Any) -> _launch.ServingUserData:
    values: dict[str, Any] = dict(
        model_bucket="my-models", model_prefix="llama-3.1-8b/", model_version="7", manifest_name="SHA256SUMS",
        image_uri="763104351884.dkr.ecr.us-east-1.amazonaws.com/vllm:0.13-gpu-py312-ec2",
        server_entrypoint="python3",
        server_args=["-m", "vllm.entrypoints.openai.api_server", "--model", "{model_dir}",
                     "--tensor-parallel-size", "{tensor_parallel_size}", "--max-num-seqs", "{max_num_seqs}",
                     "--port", "{port}", "--served-model-name", "{served_model_name}",
                     "--max-model-len", "{max_model_len}", "--gpu-memory-utilization", "{gpu_memory_utilization}"],
        served_model_name="llama-3.1-8b", server_port=8000, tensor_parallel_size=4, max_num_seqs=37,
        health_port=8081, health_path="/healthz", health_probe_timeout_s=5.0, accelerator="nvidia",
        region="us-east-1", metric_namespace="NS", fleet_name="chat", log_group_name="/genai/chat",
        cloudwatch_agent_config=_launch.cloudwatch_agent_config(
            namespace="NS", log_group_name="/genai/chat", fleet="chat",
            log_files={"/var/log/genai/model-server.log": "model-server"}, accelerator="nvidia"),
        fetch_timeout_s=3600, upstream_port=18000, keep_alive_s=360, drain_s=300, max_model_len=8192,
        gpu_memory_utilization=0.9, lifecycle_hook_name="genai-instance-ready",
        auto_scaling_group_name="Serving-ChatFleet-1A2B3C4D-AutoScalingGroup", lifecycle_heartbeat_s=1800,
    )
    values.update(overrides)
    return _launch.ServingUserData(**values)


@pytest.fixture(scope="module")
def rendered() -> str:
    return _launch.render_serving_user_data(settings())


# ---- Rendering ------------------------------------------------------------------------------------------------


def test_rendered_user_data_is_shellcheck_clean(rendered: str, tmp_path: Path) -> None:
    script = tmp_path / "user-data.sh"
    script.write_text(rendered)
    result = subprocess.run([str(SHELLCHECK), "--shell=bash", "--severity=info", str(script)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_rendered_user_data_fits_the_16_kib_limit_with_room_for_tokens(tmp_path: Path) -> None:
    # The request proxy's payload alone is larger than EC2's 16 KB: a deployable fleet ships the runtime from S3.
    script = _launch.render_serving_user_data(settings(runtime_code_bucket="cdk-hnb659fds-assets-123456789012-us-east-1",
                                                       runtime_code_key=f"{'0' * 64}.zip"))
    assert len(script.encode()) < USER_DATA_LIMIT_BYTES - 2048
    (tmp_path / "user-data.sh").write_text(script)
    result = subprocess.run([str(SHELLCHECK), "--shell=bash", "--severity=info", str(tmp_path / "user-data.sh")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_server_gets_the_plans_tensor_parallel_degree_and_concurrency_cap(rendered: str) -> None:
    args_line = next(line for line in rendered.splitlines() if line.startswith("readonly -a SERVER_ARGS="))
    assert "--tensor-parallel-size 4" in args_line
    assert "--max-num-seqs 37" in args_line
    assert "--model /models/current" in args_line
    assert "--max-model-len 8192 --gpu-memory-utilization 0.9" in args_line
    assert "readonly TENSOR_PARALLEL_SIZE=4" in rendered
    assert "readonly MAX_NUM_SEQS=37" in rendered


def test_values_are_shell_quoted_so_they_cannot_inject_code() -> None:
    script = _launch.render_serving_user_data(settings(served_model_name="x'; rm -rf / #"))
    assert "readonly SERVED_MODEL_NAME='x'\"'\"'; rm -rf / #'" in script


def test_user_data_ships_the_sidecar_and_proxy_and_configures_the_agent(rendered: str) -> None:
    assert "health_sidecar.py" in rendered and "request_proxy.py" in rendered
    assert 'amazon-cloudwatch-agent-ctl" -a fetch-config -m ec2 -s' in rendered
    # Only the lifecycle step is enabled: it decides, at each boot, whether the server, sidecar and proxy start.
    assert "systemctl enable genai-lifecycle.service" in rendered
    assert "systemctl start --no-block genai-lifecycle.service" in rendered


def test_neuron_user_data_passes_neuron_devices_not_gpus() -> None:
    script = _launch.render_serving_user_data(settings(accelerator="neuron"))
    assert "readonly ACCELERATOR_KIND=neuron" in script
    assert "readonly REPLICAS_PER_INSTANCE=1" in script


def test_several_replicas_need_their_devices_per_replica() -> None:
    with pytest.raises(ValueError, match=r"devices_per_replica \(0\) must be at least 1 with 8 replicas"):
        settings(replicas_per_instance=8)


# ---- Running the rendered script for real: fetch verifies against the manifest --------------------------------

STUB_AWS = """#!/bin/bash
# Every call is recorded in $AWS_LOG (if set) with its time: "<epoch seconds> <arguments>".
[[ -z "${AWS_LOG:-}" ]] || echo "$(date +%s.%N) $*" >> "$AWS_LOG"
# aws s3 sync [flags] s3://bucket/prefix DEST  -> copy from $FAKE_S3/bucket/prefix (after $FAKE_S3_DELAY seconds)
if [[ "$1" == s3 && "$2" == sync ]]; then
  sleep "${FAKE_S3_DELAY:-0}"
  for arg in "$@"; do case "$arg" in s3://*) src="${arg#s3://}";; esac; done
  dest="${*: -1}"; mkdir -p "$dest"; cp -R "$FAKE_S3/$src/." "$dest/"; exit 0
fi
# aws s3 cp [flags] s3://bucket/key DEST [flags]  -> copy $FAKE_S3/bucket/key
if [[ "$1" == s3 && "$2" == cp ]]; then
  args=("$@"); for i in "${!args[@]}"; do [[ "${args[i]}" == s3://* ]] && src="${args[i]#s3://}" && dest="${args[i+1]}"; done
  cp "$FAKE_S3/$src" "$dest"; exit 0
fi
if [[ "$1" == ecr ]]; then echo token; exit 0; fi
if [[ "$1" == autoscaling ]]; then exit 0; fi
exit 2
"""
STUB_DOCKER = """#!/bin/bash
echo "docker $*" >> "$DOCKER_LOG"
if [[ "$1" == login ]]; then cat > /dev/null; fi  # like docker, read the password from stdin (else: SIGPIPE)
if [[ "$1" == image && "$2" == inspect ]]; then [[ -n "${DOCKER_HAS_IMAGE:-}" ]]; exit; fi  # pulled already?
exit 0
"""
STUB_RECORDER = """#!/bin/bash
echo "$(basename "$0") $*" >> "$CALLS_LOG"
"""


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _executable(bin_dir / "aws", STUB_AWS)
    _executable(bin_dir / "docker", STUB_DOCKER)
    _executable(bin_dir / "systemctl", STUB_RECORDER)
    s3 = tmp_path / "s3"
    weights = s3 / "my-models" / "llama-3.1-8b"
    (weights / "sub").mkdir(parents=True)
    (weights / "model.safetensors").write_bytes(b"weights" * 100)
    (weights / "sub" / "config.json").write_text('{"layers": 32}')
    return {"tmp": tmp_path, "bin": bin_dir, "s3": s3, "weights": weights, "models": tmp_path / "models",
            "root": tmp_path / "root"}


def _write_manifest(weights: Path) -> None:
    lines = []
    for path in sorted(p for p in weights.rglob("*") if p.is_file() and p.name != "SHA256SUMS"):
        lines.append(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  ./{path.relative_to(weights)}")
    (weights / "SHA256SUMS").write_text("\n".join(lines) + "\n")


def _fetch(world: dict[str, Path]) -> subprocess.CompletedProcess[str]:
    script = world["tmp"] / "user-data.sh"
    script.write_text(_launch.render_serving_user_data(settings(models_root=str(world["models"]))))
    env = {**os.environ, "PATH": f"{world['bin']}:{os.environ['PATH']}", "FAKE_S3": str(world["s3"]),
           "DOCKER_LOG": str(world["tmp"] / "docker.log"), "GENAI_FS_ROOT": str(world["root"])}
    return subprocess.run(["bash", str(script), "fetch"], capture_output=True, text=True, env=env, timeout=30)


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="needs coreutils")
def test_fetch_downloads_verifies_and_marks_the_version(world: dict[str, Path]) -> None:
    _write_manifest(world["weights"])
    result = _fetch(world)
    assert result.returncode == 0, result.stderr
    assert (world["models"] / "7" / ".verified-7").exists()
    assert (world["models"] / "7" / "sub" / "config.json").exists()
    assert "docker pull --quiet 763104351884.dkr.ecr.us-east-1.amazonaws.com/vllm:0.13-gpu-py312-ec2" in \
        (world["tmp"] / "docker.log").read_text()


def test_fetch_refuses_a_file_that_does_not_match_the_manifest(world: dict[str, Path]) -> None:
    _write_manifest(world["weights"])
    (world["weights"] / "model.safetensors").write_bytes(b"tampered")
    result = _fetch(world)
    assert result.returncode == 1
    assert "sha256 mismatch against SHA256SUMS for model version 7; refusing to start" in result.stderr
    assert not (world["models"] / "7" / ".verified-7").exists()


def test_fetch_refuses_a_file_missing_from_the_manifest(world: dict[str, Path]) -> None:
    _write_manifest(world["weights"])
    (world["weights"] / "extra.bin").write_bytes(b"smuggled")
    result = _fetch(world)
    assert result.returncode == 1
    assert "files not in SHA256SUMS: extra.bin; refusing to start" in result.stderr


def test_fetch_refuses_when_the_manifest_is_missing(world: dict[str, Path]) -> None:
    result = _fetch(world)
    assert result.returncode == 1
    assert "manifest SHA256SUMS is missing under s3://my-models/llama-3.1-8b/; refusing to start" in result.stderr


def test_serve_refuses_an_unverified_version(world: dict[str, Path]) -> None:
    script = world["tmp"] / "user-data.sh"
    script.write_text(_launch.render_serving_user_data(settings(models_root=str(world["models"]))))
    result = subprocess.run(["bash", str(script), "serve"], capture_output=True, text=True,
                            env={**os.environ, "PATH": f"{world['bin']}:{os.environ['PATH']}"}, timeout=30)
    assert result.returncode == 1
    assert "model version 7 is not verified; refusing to start" in result.stderr


# ---- The launch lifecycle step, run for real against a fake IMDS and a fake health sidecar ----------------------


class _FakeServer:
    """A local HTTP server on 127.0.0.1 (a free port) answering with ``respond(method, path, headers)``."""

    def __init__(self, respond: Callable[[str, str, Any], tuple[int, str]]) -> None:
        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                code, body = respond(self.command, self.path, self.headers)
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PUT = _answer

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class FakeImds(_FakeServer):
    """IMDSv2: a token from PUT /latest/api/token, then metadata only with that token. ``state`` None: the
    autoscaling/target-lifecycle-state item does not exist (an instance outside an Auto Scaling group)."""

    TOKEN = "fake-imds-token"

    def __init__(self, state: str | None, instance_id: str = "i-0123456789abcdef0", zone: str = "us-east-1b") -> None:
        items = {"instance-id": instance_id, "placement/availability-zone": zone}
        if state is not None:
            items["autoscaling/target-lifecycle-state"] = state

        def respond(method: str, path: str, headers: Any) -> tuple[int, str]:
            if method == "PUT" and path == "/latest/api/token":
                return 200, self.TOKEN
            if headers.get("X-aws-ec2-metadata-token") != self.TOKEN:
                return 401, ""
            value = items.get(path.removeprefix("/latest/meta-data/"))
            return (404, "") if value is None else (200, value)

        super().__init__(respond)


class FakeSidecar(_FakeServer):
    """The health sidecar: 503 for the first ``unhealthy_polls`` checks, then 200; remembers when it first said 200."""

    def __init__(self, unhealthy_polls: int) -> None:
        self.polls = 0
        self.first_200_at: float | None = None

        def respond(method: str, path: str, headers: Any) -> tuple[int, str]:
            if path != "/healthz":
                return 404, ""
            self.polls += 1
            if self.polls <= unhealthy_polls:
                return 503, "loading"
            if self.first_200_at is None:
                self.first_200_at = time.time()
            return 200, "ok"

        super().__init__(respond)


@pytest.fixture
def imds_server() -> Iterator[Callable[..., FakeImds]]:
    servers: list[FakeImds] = []

    def start(state: str | None, **kwargs: Any) -> FakeImds:
        servers.append(FakeImds(state, **kwargs))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def _calls(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _hook_calls(world: dict[str, Path], action: str) -> list[str]:
    return [line for line in _calls(world["tmp"] / "aws.log") if f" autoscaling {action} " in line]


def _processes_running(script: Path) -> list[str]:
    """Processes whose command line names ``script``: a heartbeat loop left behind would be one."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(script) in text:
            found.append(text)
    return found


def _lifecycle(world: dict[str, Path], imds: FakeImds | None, *, extra_env: dict[str, str] | None = None,
               **overrides: Any) -> subprocess.CompletedProcess[str]:
    """Run the rendered script's lifecycle step (what genai-lifecycle.service runs at boot)."""
    script = world["tmp"] / "user-data.sh"
    values: dict[str, Any] = dict(models_root=str(world["models"]), lifecycle_heartbeat_s=3)
    values.update(overrides)
    script.write_text(_launch.render_serving_user_data(settings(**values)))
    env = {key: value for key, value in os.environ.items() if "proxy" not in key.lower()}
    env.update({"PATH": f"{world['bin']}:{os.environ['PATH']}", "FAKE_S3": str(world["s3"]),
                "DOCKER_LOG": str(world["tmp"] / "docker.log"), "AWS_LOG": str(world["tmp"] / "aws.log"),
                "CALLS_LOG": str(world["tmp"] / "calls.log"), "GENAI_FS_ROOT": str(world["root"]),
                # no IMDS at all: a closed port, so curl fails at once rather than timing out
                "IMDS_ENDPOINT": imds.url if imds else "http://127.0.0.1:9", **(extra_env or {})})
    return subprocess.run(["bash", str(script), "lifecycle"], capture_output=True, text=True, env=env, timeout=30)


HOOK_ARGS = ("--region us-east-1 --lifecycle-hook-name genai-instance-ready "
             "--auto-scaling-group-name Serving-ChatFleet-1A2B3C4D-AutoScalingGroup --instance-id i-0123456789abcdef0")


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_warm_pool_launch_fetches_pulls_and_continues_without_starting_the_server(
        world: dict[str, Path], imds_server: Callable[..., FakeImds]) -> None:
    _write_manifest(world["weights"])
    result = _lifecycle(world, imds_server("Warmed:Stopped"))
    assert result.returncode == 0, result.stderr
    assert (world["models"] / "7" / ".verified-7").exists()
    assert any(" s3 sync " in line for line in _calls(world["tmp"] / "aws.log"))
    assert any(line.startswith("docker pull ") for line in _calls(world["tmp"] / "docker.log"))
    (complete,) = _hook_calls(world, "complete-lifecycle-action")
    assert complete.endswith(f"complete-lifecycle-action {HOOK_ARGS} --lifecycle-action-result CONTINUE")
    # The instance is about to be stopped: no server, sidecar or proxy.
    assert not any(" start " in line for line in _calls(world["tmp"] / "calls.log"))
    assert not any(line.startswith("docker run") for line in _calls(world["tmp"] / "docker.log"))


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_resume_to_in_service_downloads_nothing_and_continues_only_once_the_sidecar_answers(
        world: dict[str, Path], imds_server: Callable[..., FakeImds]) -> None:
    _write_manifest(world["weights"])
    weights = world["models"] / "7"  # what the warm-pool launch left on the EBS root
    shutil.copytree(world["weights"], weights)
    (weights / ".verified-7").touch()
    sidecar = FakeSidecar(unhealthy_polls=3)
    try:
        result = _lifecycle(world, imds_server("InService"), health_port=sidecar.port,
                            extra_env={"DOCKER_HAS_IMAGE": "1"})
    finally:
        sidecar.close()
    assert result.returncode == 0, result.stderr
    assert not any(" s3 " in line for line in _calls(world["tmp"] / "aws.log"))
    assert not any(line.startswith("docker pull ") for line in _calls(world["tmp"] / "docker.log"))
    assert "systemctl start --no-block genai-model-server.service genai-health-sidecar.service " \
        "genai-request-proxy.service" in _calls(world["tmp"] / "calls.log")
    (complete,) = _hook_calls(world, "complete-lifecycle-action")
    assert complete.endswith("--lifecycle-action-result CONTINUE")
    assert sidecar.polls == 4 and sidecar.first_200_at is not None
    assert float(complete.split()[0]) >= sidecar.first_200_at


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_in_service_launch_abandons_when_the_sidecar_never_answers(
        world: dict[str, Path], imds_server: Callable[..., FakeImds]) -> None:
    _write_manifest(world["weights"])
    sidecar = FakeSidecar(unhealthy_polls=10_000)
    try:
        result = _lifecycle(world, imds_server("InService"), health_port=sidecar.port, lifecycle_heartbeat_s=1)
    finally:
        sidecar.close()
    assert result.returncode == 1
    assert "did not answer 200" in result.stderr
    (complete,) = _hook_calls(world, "complete-lifecycle-action")
    assert complete.endswith("--lifecycle-action-result ABANDON")


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_manifest_mismatch_abandons_the_launch_and_says_why(
        world: dict[str, Path], imds_server: Callable[..., FakeImds]) -> None:
    _write_manifest(world["weights"])
    (world["weights"] / "model.safetensors").write_bytes(b"tampered")
    result = _lifecycle(world, imds_server("Warmed:Stopped"))
    assert result.returncode == 1
    assert "sha256 mismatch against SHA256SUMS for model version 7; refusing to start" in result.stderr
    assert "ABANDON" in result.stderr
    (complete,) = _hook_calls(world, "complete-lifecycle-action")
    assert complete.endswith(f"{HOOK_ARGS} --lifecycle-action-result ABANDON")
    assert not any(line.startswith("docker pull ") for line in _calls(world["tmp"] / "docker.log"))


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_heartbeats_keep_a_slow_fetch_alive_and_stop_with_the_step(
        world: dict[str, Path], imds_server: Callable[..., FakeImds]) -> None:
    _write_manifest(world["weights"])
    # Heartbeat timeout 1 s: a heartbeat every 0.33 s; the download takes 0.8 s.
    result = _lifecycle(world, imds_server("Warmed:Stopped"), lifecycle_heartbeat_s=1,
                        extra_env={"FAKE_S3_DELAY": "0.8"})
    assert result.returncode == 0, result.stderr
    heartbeats = _hook_calls(world, "record-lifecycle-action-heartbeat")
    assert len(heartbeats) >= 2
    assert all(line.endswith(HOOK_ARGS) for line in heartbeats)
    (complete,) = _hook_calls(world, "complete-lifecycle-action")
    assert all(float(line.split()[0]) < float(complete.split()[0]) for line in heartbeats)
    # The loop ended with the step: nothing of the script is left running, and no heartbeat follows.
    assert _processes_running(world["tmp"] / "user-data.sh") == []
    time.sleep(0.7)
    assert len(_hook_calls(world, "record-lifecycle-action-heartbeat")) == len(heartbeats)


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_without_a_hook_name_no_hook_call_is_made(
        world: dict[str, Path], imds_server: Callable[..., FakeImds]) -> None:
    _write_manifest(world["weights"])
    sidecar = FakeSidecar(unhealthy_polls=0)
    try:
        result = _lifecycle(world, imds_server("InService"), lifecycle_hook_name="", health_port=sidecar.port)
    finally:
        sidecar.close()
    assert result.returncode == 0, result.stderr
    assert not any(" autoscaling " in line for line in _calls(world["tmp"] / "aws.log"))
    assert sidecar.polls == 1


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_outside_an_auto_scaling_group_the_instance_serves_and_skips_the_hook(
        world: dict[str, Path], imds_server: Callable[..., FakeImds]) -> None:
    _write_manifest(world["weights"])
    sidecar = FakeSidecar(unhealthy_polls=0)
    try:
        result = _lifecycle(world, imds_server(None), health_port=sidecar.port)
    finally:
        sidecar.close()
    assert result.returncode == 0, result.stderr
    assert "not in an Auto Scaling group" in result.stderr
    assert not any(" autoscaling " in line for line in _calls(world["tmp"] / "aws.log"))
    assert any("genai-model-server.service" in line for line in _calls(world["tmp"] / "calls.log"))


# ---- The server container, the sidecar and the request proxy ---------------------------------------------------


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="needs coreutils")
def test_server_container_is_on_a_bridge_network_published_on_loopback_only(world: dict[str, Path]) -> None:
    _write_manifest(world["weights"])
    assert _fetch(world).returncode == 0
    script = world["tmp"] / "user-data.sh"
    env = {**os.environ, "PATH": f"{world['bin']}:{os.environ['PATH']}", "DOCKER_LOG": str(world["tmp"] / "docker.log")}
    result = subprocess.run(["bash", str(script), "serve"], capture_output=True, text=True, env=env, timeout=30)
    assert result.returncode == 0, result.stderr
    run = next(line for line in _calls(world["tmp"] / "docker.log") if line.startswith("docker run"))
    assert "--network" not in run and "--net=" not in run
    assert "--publish 127.0.0.1:18000:8000 " in run
    assert "--ipc host" in run
    assert "--env VLLM_HTTP_TIMEOUT_KEEP_ALIVE=360 " in run
    assert run.endswith("--port 8000 --served-model-name llama-3.1-8b --max-model-len 8192 "
                        "--gpu-memory-utilization 0.9")


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_request_proxy_and_sidecar_start_with_the_contracts_flags(
        world: dict[str, Path], imds_server: Callable[..., FakeImds]) -> None:
    _executable(world["bin"] / "python3", STUB_RECORDER)
    script = world["tmp"] / "user-data.sh"
    script.write_text(_launch.render_serving_user_data(settings()))
    imds = imds_server("InService")
    env = {**{k: v for k, v in os.environ.items() if "proxy" not in k.lower()},
           "PATH": f"{world['bin']}:{os.environ['PATH']}", "CALLS_LOG": str(world["tmp"] / "calls.log"),
           "IMDS_ENDPOINT": imds.url}
    for subcommand in ("proxy", "sidecar"):
        result = subprocess.run(["bash", str(script), subcommand], capture_output=True, text=True, env=env, timeout=30)
        assert result.returncode == 0, result.stderr
    proxy, sidecar = _calls(world["tmp"] / "calls.log")
    assert proxy.split() == [
        "python3", "/opt/genai/request_proxy.py", "--listen", "0.0.0.0:8000", "--upstream", "127.0.0.1:18000",
        "--max-concurrency", "37", "--keep-alive-s", "360", "--upstream-keep-alive-s", "360", "--drain-s", "300",
        "--emf-address", "tcp:127.0.0.1:25888", "--namespace", "NS", "--fleet", "chat", "--model-version", "7",
        "--log-group", "/genai/chat", "--instance-id", "i-0123456789abcdef0", "--availability-zone", "us-east-1b",
        "--metrics-interval-s", "10"]
    assert "--upstream http://127.0.0.1:18000 " in sidecar  # the sidecar probes vLLM directly, not the proxy


def _installed_matches_the_source(installed: Path, name: str) -> bool:
    source = (Path(_launch.__file__).parent.parent / "runtime" / name).read_text()
    return ast.dump(ast.parse(installed.read_text())) == ast.dump(ast.parse(_launch._minified_python(source)))


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="needs coreutils")
def test_fetch_installs_the_real_sidecar_and_proxy_from_the_user_data(world: dict[str, Path]) -> None:
    _write_manifest(world["weights"])
    result = _fetch(world)
    assert result.returncode == 0, result.stderr
    for name in ("health_sidecar.py", "request_proxy.py"):
        assert _installed_matches_the_source(world["root"] / "opt" / "genai" / name, name)


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="needs coreutils")
def test_fetch_installs_the_sidecar_and_proxy_from_s3_when_the_runtime_is_an_s3_object(world: dict[str, Path]) -> None:
    _write_manifest(world["weights"])
    runtime = Path(_launch.__file__).parent.parent / "runtime"
    (world["s3"] / "assets").mkdir()
    with zipfile.ZipFile(world["s3"] / "assets" / "runtime.zip", "w") as archive:
        for name in ("health_sidecar.py", "request_proxy.py"):
            archive.write(runtime / name, name)
    script = world["tmp"] / "user-data.sh"
    script.write_text(_launch.render_serving_user_data(settings(
        models_root=str(world["models"]), runtime_code_bucket="assets", runtime_code_key="runtime.zip")))
    assert "readonly PROXY_PY_GZ_B64=''" in script.read_text()
    env = {**os.environ, "PATH": f"{world['bin']}:{os.environ['PATH']}", "FAKE_S3": str(world["s3"]),
           "DOCKER_LOG": str(world["tmp"] / "docker.log"), "GENAI_FS_ROOT": str(world["root"])}
    result = subprocess.run(["bash", str(script), "fetch"], capture_output=True, text=True, env=env, timeout=30)
    assert result.returncode == 0, result.stderr
    for name in ("health_sidecar.py", "request_proxy.py"):
        assert (world["root"] / "opt" / "genai" / name).read_bytes() == (runtime / name).read_bytes()


def test_setup_enables_only_the_lifecycle_step_and_the_proxy_drains_on_sigterm(world: dict[str, Path]) -> None:
    units = world["root"] / "etc" / "systemd" / "system"
    units.mkdir(parents=True)
    script = world["tmp"] / "user-data.sh"
    script.write_text(_launch.render_serving_user_data(settings(models_root=str(world["models"]))))
    env = {**os.environ, "PATH": f"{world['bin']}:{os.environ['PATH']}", "GENAI_FS_ROOT": str(world["root"]),
           "CALLS_LOG": str(world["tmp"] / "calls.log")}
    for _ in range(2):  # cloud-init runs it at every boot
        result = subprocess.run(["bash", str(script), "setup"], capture_output=True, text=True, env=env, timeout=30)
        assert result.returncode == 0, result.stderr
    assert (world["root"] / "opt" / "genai" / "bootstrap.sh").read_text() == script.read_text()
    lifecycle = (units / "genai-lifecycle.service").read_text()
    assert "Type=oneshot" in lifecycle and "WantedBy=multi-user.target" in lifecycle
    assert f"ExecStart={world['root']}/opt/genai/bootstrap.sh lifecycle" in lifecycle
    assert "TimeoutStartSec=5700" in lifecycle  # fetch 3600 + heartbeat budget 1800 + 300
    proxy = (units / "genai-request-proxy.service").read_text()
    assert "ExecStart=" in proxy and " proxy\n" in proxy
    assert "Restart=always" in proxy and "KillSignal=SIGTERM" in proxy
    assert "TimeoutStopSec=330" in proxy  # above the 300 s drain
    for unit in ("model-server", "health-sidecar", "request-proxy"):
        assert "[Install]" not in (units / f"genai-{unit}.service").read_text()  # started by the lifecycle step only
    assert _calls(world["tmp"] / "calls.log")[:3] == [
        "systemctl daemon-reload", "systemctl enable genai-lifecycle.service",
        "systemctl start --no-block genai-lifecycle.service"]


# ---- Agent config, AMI, root volume --------------------------------------------------------------------------


def test_agent_config_collects_gpu_memory_disk_network_and_the_server_log() -> None:
    config = settings().cloudwatch_agent_config
    collected = config["metrics"]["metrics_collected"]
    assert set(collected) == {"nvidia_gpu", "mem", "disk", "net"}
    assert {"utilization_gpu", "memory_used", "memory_total"} <= set(collected["nvidia_gpu"]["measurement"])
    assert all(section["append_dimensions"] == {"Fleet": "chat"} for section in collected.values())
    assert config["metrics"]["aggregation_dimensions"] == [["Fleet"]]
    files = config["logs"]["logs_collected"]["files"]["collect_list"]
    assert files[0]["file_path"] == "/var/log/genai/model-server.log"
    assert files[0]["log_group_name"] == "/genai/chat"
    assert "emf" in config["logs"]["metrics_collected"]


def test_neuron_agent_config_has_no_nvidia_section() -> None:
    config = _launch.cloudwatch_agent_config(namespace="NS", log_group_name="/lg", fleet="f", log_files={},
                                             accelerator="neuron")
    assert "nvidia_gpu" not in config["metrics"]["metrics_collected"]


def test_dlami_parameters_are_the_public_al2023_ones() -> None:
    assert _launch.dlami_parameter_name("nvidia") == (
        "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-amazon-linux-2023/latest/ami-id")
    assert _launch.dlami_parameter_name("neuron") == (
        "/aws/service/neuron/dlami/base/amazon-linux-2023/latest/image_id")


def test_root_volume_holds_os_image_and_weights_with_headroom() -> None:
    assert _launch.root_volume_gib(131.4) == 326  # (100 + 40 + 131.4) * 1.2, rounded up


@pytest.fixture(scope="module")
def neuron_template() -> Template:
    stack = Stack(App(), "Launch")
    vpc = ec2.Vpc(stack, "Vpc", max_azs=1, nat_gateways=0, subnet_configuration=[
        ec2.SubnetConfiguration(name="p", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)])
    role = iam.Role(stack, "Role", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"))
    _launch.build_gpu_launch_template(
        stack, "Template", instance_type="inf2.xlarge", accelerator="neuron", role=role,
        security_group=ec2.SecurityGroup(stack, "Sg", vpc=vpc), user_data=ec2.UserData.custom("#!/bin/bash"),
        root_volume_size_gib=200, encryption_key=kms.Key(stack, "Key"))
    return Template.from_stack(stack)


def test_launch_template_uses_the_neuron_dlami_for_inferentia(neuron_template: Template) -> None:
    parameters = neuron_template.to_json()["Parameters"]
    assert any(p.get("Default") == _launch.NEURON_DLAMI_PARAMETER for p in parameters.values())


def test_launch_template_requires_imdsv2_encrypts_gp3_root_and_hides_the_instance(neuron_template: Template) -> None:
    neuron_template.has_resource_properties("AWS::EC2::LaunchTemplate", {"LaunchTemplateData": Match.object_like({
        "InstanceType": "inf2.xlarge",
        "MetadataOptions": {"HttpTokens": "required", "HttpPutResponseHopLimit": 1},
        "Monitoring": {"Enabled": True},
        "NetworkInterfaces": [Match.object_like({"AssociatePublicIpAddress": False})],
        "BlockDeviceMappings": [{"DeviceName": "/dev/xvda", "Ebs": Match.object_like({
            "Encrypted": True, "VolumeType": "gp3", "VolumeSize": 200, "KmsKeyId": Match.any_value()})}],
    })})


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="needs coreutils")
def test_serve_passes_the_server_environment_to_the_container(world: dict[str, Path]) -> None:
    _write_manifest(world["weights"])
    assert _fetch(world).returncode == 0
    script = world["tmp"] / "serve.sh"
    environment = {"RETRIEVAL_DNS_ENTRIES": "Z1:vpce-1-a.example,Z2:vpce-1-b.example", "MODE": "it's quoted"}
    script.write_text(_launch.render_serving_user_data(
        settings(models_root=str(world["models"]), server_environment=environment)))
    env = {**os.environ, "PATH": f"{world['bin']}:{os.environ['PATH']}", "DOCKER_LOG": str(world["tmp"] / "docker.log")}
    result = subprocess.run(["bash", str(script), "serve"], capture_output=True, text=True, env=env, timeout=30)
    assert result.returncode == 0, result.stderr
    run = next(line for line in (world["tmp"] / "docker.log").read_text().splitlines() if line.startswith("docker run"))
    assert "--env RETRIEVAL_DNS_ENTRIES=Z1:vpce-1-a.example,Z2:vpce-1-b.example --env MODE=it's quoted" in run


def test_rendered_user_data_with_a_server_environment_is_shellcheck_clean(tmp_path: Path) -> None:
    script = tmp_path / "user-data.sh"
    script.write_text(_launch.render_serving_user_data(settings(server_environment={"A": "b c", "D": "$HOME"})))
    result = subprocess.run([str(SHELLCHECK), "--shell=bash", "--severity=info", str(script)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


# ---- Several replicas per instance: each container pinned to its own devices and loopback port -------------------


def _serve_replicas(world: dict[str, Path], replicas: int, **overrides: Any) -> list[str]:
    """Run ``serve N`` for every replica against the recording docker stub; the ``docker run`` line of each."""
    (world["models"] / "7").mkdir(parents=True)
    (world["models"] / "7" / ".verified-7").touch()  # what fetch leaves behind
    script = world["tmp"] / "user-data.sh"
    script.write_text(_launch.render_serving_user_data(settings(
        models_root=str(world["models"]), replicas_per_instance=replicas, **overrides)))
    env = {**os.environ, "PATH": f"{world['bin']}:{os.environ['PATH']}", "DOCKER_LOG": str(world["tmp"] / "docker.log")}
    for replica in range(replicas):
        result = subprocess.run(["bash", str(script), "serve", str(replica)], capture_output=True, text=True, env=env,
                                timeout=30)
        assert result.returncode == 0, result.stderr
    runs = [line for line in _calls(world["tmp"] / "docker.log") if line.startswith("docker run")]
    assert len(runs) == replicas
    return runs


def _flag_values(run: str, flag: str) -> list[str]:
    words = run.split()
    return [words[i + 1] for i, word in enumerate(words) if word == flag]


@pytest.mark.parametrize(("replicas", "devices", "gpu_sets"), [
    (2, 2, ['"device=0,1"', '"device=2,3"']),
    (4, 1, ['"device=0"', '"device=1"', '"device=2"', '"device=3"']),
])
def test_each_gpu_replica_gets_its_own_gpus_port_and_container(
        world: dict[str, Path], replicas: int, devices: int, gpu_sets: list[str]) -> None:
    runs = _serve_replicas(world, replicas, devices_per_replica=devices, tensor_parallel_size=devices)
    assert [_flag_values(run, "--gpus") for run in runs] == [[gpus] for gpus in gpu_sets]
    assert [_flag_values(run, "--publish") for run in runs] == [
        [f"127.0.0.1:{18000 + replica}:8000"] for replica in range(replicas)]
    assert [_flag_values(run, "--name") for run in runs] == [[f"model-server-{r}"] for r in range(replicas)]
    for run in runs:  # each replica is one tensor-parallel group of its own devices
        assert f"--tensor-parallel-size {devices} " in run and "--max-num-seqs 37 " in run
        assert "--port 8000 " in run  # inside its own network namespace; published on its own host port


def test_each_neuron_replica_gets_its_own_chips_and_neuron_cores(world: dict[str, Path]) -> None:
    # inf2.48xlarge as 4 replicas of 3 chips: 6 NeuronCores (tensor-parallel ranks) each.
    runs = _serve_replicas(world, 4, accelerator="neuron", devices_per_replica=3, tensor_parallel_size=6)
    assert [_flag_values(run, "--device") for run in runs] == [
        [f"/dev/neuron{chip}" for chip in range(3 * replica, 3 * replica + 3)] for replica in range(4)]
    assert [[e for e in _flag_values(run, "--env") if e.startswith("NEURON_RT_")] for run in runs] == [
        ["NEURON_RT_VISIBLE_CORES=0-5"], ["NEURON_RT_VISIBLE_CORES=6-11"], ["NEURON_RT_VISIBLE_CORES=12-17"],
        ["NEURON_RT_VISIBLE_CORES=18-23"]]
    assert not any("--gpus" in run for run in runs)


def test_one_replica_takes_every_gpu_under_the_plain_names(world: dict[str, Path]) -> None:
    (run,) = _serve_replicas(world, 1)
    assert _flag_values(run, "--gpus") == ["all"] and _flag_values(run, "--name") == ["model-server"]
    assert _flag_values(run, "--publish") == ["127.0.0.1:18000:8000"]


def test_a_replica_outside_the_instance_is_refused(world: dict[str, Path]) -> None:
    script = world["tmp"] / "user-data.sh"
    script.write_text(_launch.render_serving_user_data(settings(replicas_per_instance=2, devices_per_replica=2)))
    result = subprocess.run(["bash", str(script), "serve", "2"], capture_output=True, text=True, timeout=30,
                            env={**os.environ, "PATH": f"{world['bin']}:{os.environ['PATH']}"})
    assert result.returncode == 1
    assert "replica 2 does not exist: this instance runs replicas 0 to 1" in result.stderr


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_with_four_replicas_setup_writes_a_unit_each_and_the_proxy_and_sidecar_front_all_of_them(
        world: dict[str, Path], imds_server: Callable[..., FakeImds]) -> None:
    units = world["root"] / "etc" / "systemd" / "system"
    units.mkdir(parents=True)
    _executable(world["bin"] / "python3", STUB_RECORDER)
    script = world["tmp"] / "user-data.sh"
    script.write_text(_launch.render_serving_user_data(settings(
        models_root=str(world["models"]), replicas_per_instance=4, devices_per_replica=1, tensor_parallel_size=1)))
    imds = imds_server("InService")
    env = {**{k: v for k, v in os.environ.items() if "proxy" not in k.lower()},
           "PATH": f"{world['bin']}:{os.environ['PATH']}", "GENAI_FS_ROOT": str(world["root"]),
           "CALLS_LOG": str(world["tmp"] / "calls.log"), "IMDS_ENDPOINT": imds.url}
    for subcommand in ("setup", "proxy", "sidecar"):
        result = subprocess.run(["bash", str(script), subcommand], capture_output=True, text=True, env=env, timeout=30)
        assert result.returncode == 0, result.stderr
    for replica in range(4):
        unit = (units / f"genai-model-server-{replica}.service").read_text()
        assert f"/opt/genai/bootstrap.sh serve {replica}\n" in unit and "Restart=always" in unit
        assert "[Install]" not in unit  # started by the lifecycle step only
    assert not (units / "genai-model-server.service").exists()
    proxy = next(line for line in _calls(world["tmp"] / "calls.log") if "request_proxy.py" in line).split()
    sidecar = next(line for line in _calls(world["tmp"] / "calls.log") if "health_sidecar.py" in line).split()
    assert _flag_values(" ".join(proxy), "--upstream") == [f"127.0.0.1:{18000 + r}" for r in range(4)]
    assert _flag_values(" ".join(proxy), "--max-concurrency") == ["37"]  # per replica: each one's --max-num-seqs
    assert _flag_values(" ".join(sidecar), "--upstream") == [f"http://127.0.0.1:{18000 + r}" for r in range(4)]


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_the_in_service_launch_starts_every_replica_and_waits_for_the_sidecar(
        world: dict[str, Path], imds_server: Callable[..., FakeImds]) -> None:
    _write_manifest(world["weights"])
    sidecar = FakeSidecar(unhealthy_polls=1)
    try:
        result = _lifecycle(world, imds_server("InService"), health_port=sidecar.port, replicas_per_instance=2,
                            devices_per_replica=2)
    finally:
        sidecar.close()
    assert result.returncode == 0, result.stderr
    assert "systemctl start --no-block genai-model-server-0.service genai-model-server-1.service " \
        "genai-health-sidecar.service genai-request-proxy.service" in _calls(world["tmp"] / "calls.log")
    assert sidecar.polls == 2
