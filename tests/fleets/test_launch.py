"""The shared launch pieces: user data rendering (shellcheck, and run for real against a stub aws/docker), the
CloudWatch agent config, the DLAMI parameters and the launch template."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
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
                     "--port", "{port}", "--served-model-name", "{served_model_name}"],
        served_model_name="llama-3.1-8b", server_port=8000, tensor_parallel_size=4, max_num_seqs=37,
        health_port=8081, health_path="/healthz", health_probe_timeout_s=5.0, accelerator="nvidia",
        region="us-east-1", metric_namespace="NS", fleet_name="chat", log_group_name="/genai/chat",
        cloudwatch_agent_config=_launch.cloudwatch_agent_config(
            namespace="NS", log_group_name="/genai/chat", fleet="chat",
            log_files={"/var/log/genai/model-server.log": "model-server"}, accelerator="nvidia"),
        fetch_timeout_s=3600,
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


def test_rendered_user_data_fits_the_16_kib_limit_with_room_for_tokens(rendered: str) -> None:
    assert len(rendered.encode()) < USER_DATA_LIMIT_BYTES - 2048


def test_server_gets_the_plans_tensor_parallel_degree_and_concurrency_cap(rendered: str) -> None:
    args_line = next(line for line in rendered.splitlines() if line.startswith("readonly -a SERVER_ARGS="))
    assert "--tensor-parallel-size 4" in args_line
    assert "--max-num-seqs 37" in args_line
    assert "--model /models/current" in args_line
    assert "readonly TENSOR_PARALLEL_SIZE=4" in rendered
    assert "readonly MAX_NUM_SEQS=37" in rendered


def test_values_are_shell_quoted_so_they_cannot_inject_code() -> None:
    script = _launch.render_serving_user_data(settings(served_model_name="x'; rm -rf / #"))
    assert "readonly SERVED_MODEL_NAME='x'\"'\"'; rm -rf / #'" in script


def test_user_data_starts_the_sidecar_and_configures_the_agent(rendered: str) -> None:
    assert "health_sidecar.py" in rendered
    assert "amazon-cloudwatch-agent-ctl -a fetch-config -m ec2 -s" in rendered
    assert "systemctl enable genai-model-fetch.service genai-model-server.service genai-health-sidecar.service" \
        in rendered


def test_neuron_user_data_passes_neuron_devices_not_gpus() -> None:
    script = _launch.render_serving_user_data(settings(accelerator="neuron"))
    assert "readonly ACCELERATOR_KIND=neuron" in script
    assert 'accelerators+=(--device "${device}")' in script


# ---- Running the rendered script for real: fetch verifies against the manifest --------------------------------

STUB_AWS = """#!/bin/bash
# aws s3 sync [flags] s3://bucket/prefix DEST  -> copy from $FAKE_S3/bucket/prefix
if [[ "$1" == s3 && "$2" == sync ]]; then
  for arg in "$@"; do case "$arg" in s3://*) src="${arg#s3://}";; esac; done
  dest="${*: -1}"; mkdir -p "$dest"; cp -R "$FAKE_S3/$src/." "$dest/"; exit 0
fi
if [[ "$1" == ecr ]]; then echo token; exit 0; fi
exit 2
"""
STUB_DOCKER = """#!/bin/bash
echo "docker $*" >> "$DOCKER_LOG"
if [[ "$1" == login ]]; then cat > /dev/null; fi  # like docker, read the password from stdin (else: SIGPIPE)
if [[ "$1" == image && "$2" == inspect ]]; then exit 1; fi  # not pulled yet
exit 0
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
    s3 = tmp_path / "s3"
    weights = s3 / "my-models" / "llama-3.1-8b"
    (weights / "sub").mkdir(parents=True)
    (weights / "model.safetensors").write_bytes(b"weights" * 100)
    (weights / "sub" / "config.json").write_text('{"layers": 32}')
    return {"tmp": tmp_path, "bin": bin_dir, "s3": s3, "weights": weights, "models": tmp_path / "models"}


def _write_manifest(weights: Path) -> None:
    lines = []
    for path in sorted(p for p in weights.rglob("*") if p.is_file() and p.name != "SHA256SUMS"):
        lines.append(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  ./{path.relative_to(weights)}")
    (weights / "SHA256SUMS").write_text("\n".join(lines) + "\n")


def _fetch(world: dict[str, Path]) -> subprocess.CompletedProcess[str]:
    script = world["tmp"] / "user-data.sh"
    script.write_text(_launch.render_serving_user_data(settings(models_root=str(world["models"]))))
    env = {**os.environ, "PATH": f"{world['bin']}:{os.environ['PATH']}", "FAKE_S3": str(world["s3"]),
           "DOCKER_LOG": str(world["tmp"] / "docker.log")}
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
        "/aws/service/neuron/dlami/multi-framework/amazon-linux-2023/latest/image_id")


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
