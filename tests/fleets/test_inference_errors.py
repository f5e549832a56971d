"""GpuInferenceFleet bad inputs: each raises ConfigurationError before synthesis, naming argument, value and fix."""

from __future__ import annotations

import itertools
import re
from typing import Any

import pytest
from aws_cdk import App, CfnParameter, Stack, Token
from aws_cdk import aws_certificatemanager as acm
from aws_cdk import aws_ecr as ecr

from genai_constructs.errors import ConfigurationError
from genai_constructs.fleets import GpuInferenceFleet
from genai_constructs.network import PrivateDataPath
from genai_constructs.workload import ModelArtifact, ModelShape, RealtimeTraffic

TRAFFIC = RealtimeTraffic(concurrent_sessions=32, output_tokens_per_s_per_session=20)
ARTIFACT = ModelArtifact(bucket_name="my-models", prefix="llama-3.1-8b/")
_ids = itertools.count()


@pytest.fixture(scope="module")
def scope() -> tuple[Stack, PrivateDataPath]:
    stack = Stack(App(), "Errors")
    return stack, PrivateDataPath(stack, "Net")


def make(scope: tuple[Stack, PrivateDataPath], **overrides: Any) -> GpuInferenceFleet:
    stack, network = scope
    props: dict[str, Any] = dict(network=network, model=ModelShape.preset("llama-3.1-8b"), traffic=TRAFFIC,
                                 model_artifact=ARTIFACT, allow_plain_http=True)
    props.update(overrides)
    return GpuInferenceFleet(stack, f"Fleet{next(_ids)}", **props)


def problems(scope: tuple[Stack, PrivateDataPath], **overrides: Any) -> list[str]:
    with pytest.raises(ConfigurationError) as raised:
        make(scope, **overrides)
    assert raised.value.construct == "GpuInferenceFleet"
    return raised.value.problems


def test_fails_without_a_certificate_or_an_explicit_plain_http_opt_in(scope: Any) -> None:
    assert problems(scope, allow_plain_http=False) == [
        "certificate (None) and allow_plain_http (False): the listener needs one: pass certificate= (an ACM "
        "certificate) for HTTPS, or allow_plain_http=True to serve plain HTTP inside the VPC"]


def test_fails_with_a_certificate_and_plain_http(scope: Any) -> None:
    stack, _ = scope
    cert = acm.Certificate.from_certificate_arn(stack, "Cert", "arn:aws:acm:us-east-1:111122223333:certificate/x")
    assert problems(scope, certificate=cert) == [
        "allow_plain_http (True) with a certificate: the listener serves HTTPS only; drop one"]


def test_fails_when_asking_for_spot_and_a_warm_pool(scope: Any) -> None:
    assert problems(scope, spot=True) == [
        "spot (True) with warm_pool (True): a warm pool cannot be added to a group that launches Spot Instances "
        "(EC2 Auto Scaling user guide); set warm_pool=False to use Spot, or spot=False"]


def test_fails_when_asking_for_spot_without_a_warm_pool(scope: Any) -> None:
    (problem,) = problems(scope, spot=True, warm_pool=False)
    assert problem.startswith("spot (True): a real-time fleet is on-demand only")


def test_fails_when_the_instance_type_cannot_hold_the_model(scope: Any) -> None:
    (problem,) = problems(scope, model=ModelShape.preset("llama-3.1-70b"), instance_type="g5.xlarge")
    match = re.fullmatch(
        r"instance_type \('g5.xlarge'\) cannot hold llama-3.1-70b: it needs ([0-9.]+) GiB of accelerator memory for "
        r"one 1280-token sequence, g5.xlarge has 22.4 GiB: pick a larger instance, a narrower precision, or drop "
        r"instance_type to let the planner choose", problem)
    assert match, problem
    # 70.55 B parameters x 2 bytes = 131.4 GiB of weights alone, plus overhead and the sequence's KV cache.
    assert 131.4 < float(match.group(1)) < 140


def test_fails_on_an_instance_type_not_in_the_catalog(scope: Any) -> None:
    (problem,) = problems(scope, instance_type="g5.huge")
    assert problem.startswith("instance_type 'g5.huge' is not in the accelerator catalog (closest: ")


def test_fails_with_fewer_than_two_instances(scope: Any) -> None:
    assert problems(scope, min_instances=1) == [
        "min_instances (1) must be >= 2: one instance per AZ in two AZs keeps the endpoint up when a zone or an "
        "instance fails"]


def test_fails_with_max_not_above_min(scope: Any) -> None:
    assert problems(scope, min_instances=4, max_instances=4) == [
        "max_instances (4) must be greater than min_instances (4): the fleet scales out on load and latency "
        "(CloudFormation rejects target tracking when max == min); raise max_instances or lower min_instances"]


def test_fails_on_a_health_path_without_a_leading_slash(scope: Any) -> None:
    assert problems(scope, health_check_path="healthz") == [
        "health_check_path ('healthz') must start with '/' and hold no spaces: e.g. '/healthz'"]


def test_fails_on_a_server_port_that_clashes_with_the_sidecar(scope: Any) -> None:
    assert problems(scope, server_port=8081) == [
        "server_port (8081) must be an integer 1-65535 and not 8081 (the health sidecar), 18000 (the model server "
        "behind the request proxy) or 22: use the server's own port, e.g. 8000"]


def test_fails_on_a_server_port_that_clashes_with_the_server_behind_the_proxy(scope: Any) -> None:
    (problem,) = problems(scope, server_port=18000)
    assert problem.startswith("server_port (18000) must be an integer")


def test_fails_on_server_args_given_as_one_string(scope: Any) -> None:
    (problem,) = problems(scope, server_args="-m vllm.entrypoints.openai.api_server --port 8000")
    assert problem.startswith("server_args ('-m vllm.entrypoints.openai.api_server --port 8000') is one string")


def test_fails_on_an_unknown_placeholder_in_server_args(scope: Any) -> None:
    (problem,) = problems(scope, server_args=["--model", "{weights}"])
    assert problem.startswith("server_args item '{weights}' is not a string with known placeholders: allowed are "
                              "{model_dir}")


def test_fails_on_a_tensor_parallel_degree_the_heads_do_not_divide(scope: Any) -> None:
    # Llama 3.1 8B has 32 attention heads: 3 divides neither them nor the plan's one-GPU replica.
    args = ["-m", "vllm.entrypoints.openai.api_server", "--model", "{model_dir}", "--max-model-len", "8192",
            "--tensor-parallel-size", "3"]
    (problem,) = problems(scope, server_args=args)
    assert problem.startswith("server_args --tensor-parallel-size (3): llama-3.1-8b's 32 attention heads do not "
                              "divide it")
    assert '"{tensor_parallel_size}"' in problem


def test_fails_on_a_tensor_parallel_degree_that_is_not_a_number(scope: Any) -> None:
    args = ["--model", "{model_dir}", "--tensor-parallel-size=two"]
    (problem,) = problems(scope, server_args=args)
    assert problem.startswith("server_args --tensor-parallel-size ('two') must be a positive whole number")


def test_fails_on_a_green_share_out_of_range(scope: Any) -> None:
    green = ModelArtifact(bucket_name="my-models", prefix="llama-3.1-8b-v2/", version="2")
    # Fixed weights are for rollout=None only (with a rollout the state machine owns them: next test).
    assert problems(scope, green_model_artifact=green, green_traffic_percent=120, rollout=None) == [
        "green_traffic_percent (120) must be between 0 and 100"]


def test_fails_on_fixed_weights_with_a_rollout_and_on_a_bad_live_slot(scope: Any) -> None:
    green = ModelArtifact(bucket_name="my-models", prefix="llama-3.1-8b-v2/", version="2")
    assert problems(scope, green_model_artifact=green, green_traffic_percent=10) == [
        "green_traffic_percent (10) with a rollout: the rollout owns the listener's weights; choose the serving slot "
        "with live_slot='Green', or pass rollout=None for fixed weights"]
    assert problems(scope, green_model_artifact=green, live_slot="green") == [
        "live_slot ('green') must be 'Blue' or 'Green': the slot that serves every request once the rollout has "
        "finished"]
    assert problems(scope, live_slot="Green") == [
        "live_slot ('Green') without green_model_artifact: name the version the green slot serves"]
    assert problems(scope, green_model_artifact=green, live_slot="Green", rollout=None) == [
        "live_slot ('Green') with rollout=None: without a rollout the weights are green_traffic_percent; pass "
        "green_traffic_percent=100, or keep the default rollout"]
    assert problems(scope, rollout=(5, 100)) == [
        "rollout ((5, 100)) must be a RolloutPolicy or None, not a tuple: e.g. rollout=RolloutPolicy(steps=(5, 25, "
        "50, 100), bake=Duration.minutes(10))"]


def test_fails_on_a_green_share_without_a_green_version(scope: Any) -> None:
    assert problems(scope, green_traffic_percent=10) == [
        "green_traffic_percent (10) without green_model_artifact: name the version the green target group serves"]


def test_fails_when_green_serves_the_same_version(scope: Any) -> None:
    assert problems(scope, green_model_artifact=ARTIFACT) == [
        "green_model_artifact.version ('1') equals model_artifact.version: blue/green needs two different versions"]


def test_fails_on_an_encoder_model(scope: Any) -> None:
    assert problems(scope, model=ModelShape.preset("bge-base-en-v1.5")) == [
        "model ('bge-base-en-v1.5') is an encoder: serve it with the embedding fleet, not GpuInferenceFleet"]


def test_fails_on_a_neuron_instance_without_a_neuron_image(scope: Any) -> None:
    (problem,) = problems(scope, instance_type="inf2.xlarge")
    assert problem.startswith("instance_type ('inf2.xlarge') is Neuron: the default vLLM image is for NVIDIA GPUs")


def test_fails_on_an_image_repository_without_a_tag(scope: Any) -> None:
    stack, _ = scope
    repository = ecr.Repository.from_repository_name(stack, "Repo", "my-server")
    assert problems(scope, image_repository=repository) == [
        "image_repository given without image_tag: pin the server image with image_tag='...'"]


def test_fails_with_every_problem_at_once(scope: Any) -> None:
    found = problems(scope, allow_plain_http=False, spot=True, min_instances=1, health_check_path="x")
    assert len(found) == 4


def test_validation_is_not_performed_on_tokens(scope: Any) -> None:
    stack, _ = scope
    low = CfnParameter(stack, "MinInstances", type="Number", default=1).value_as_number
    fleet = make(scope, min_instances=low, max_instances=CfnParameter(stack, "Max", type="Number").value_as_number)
    assert Token.is_unresolved(fleet.min_instances)


def test_instance_type_override_replaces_the_planned_one(scope: Any) -> None:
    fleet = make(scope, instance_type="g5.12xlarge")
    assert fleet.plan.instance_type == "g5.12xlarge"
    # Its four GPUs, as one wide replica or as several narrower ones: the replicas tile the instance.
    assert fleet.plan.devices_per_replica * fleet.plan.replicas_per_instance == 4


def test_fails_on_an_invalid_server_environment_name(scope: Any) -> None:
    assert problems(scope, server_environment={"RETRIEVAL-DNS": "x"}) == [
        "server_environment key ('RETRIEVAL-DNS') is not a valid environment variable name: use letters, digits "
        "and underscores, not starting with a digit"]


def test_fails_on_vllm_args_that_leave_the_model_length_to_vllm_when_it_cannot_fit(scope: Any) -> None:
    args = ["-m", "vllm.entrypoints.openai.api_server", "--model", "{model_dir}", "--port", "{port}"]
    slow = RealtimeTraffic(concurrent_sessions=8, output_tokens_per_s_per_session=10)  # what one L4 can serve
    (problem,) = problems(scope, server_args=args, instance_type="g6.xlarge", traffic=slow)
    # Llama 3.1 8B: 131,072 tokens x 128 KiB per token = 16.00 GiB; one L4 leaves about 4 GiB after the weights.
    assert problem.startswith("server_args has no --max-model-len, so vLLM would take llama-3.1-8b's own maximum "
                              "(131,072 tokens), whose KV cache (16.00 GiB) exceeds the ")
    assert problem.endswith('Add "--max-model-len", "{max_model_len}" (the plan\'s 8,192)')
    fleet = make(scope, server_args=[*args, "--max-model-len", "{max_model_len}"], instance_type="g6.xlarge",
                 traffic=slow)
    assert fleet.plan.server.max_model_len == 8192


def test_fails_on_a_release_history_that_cannot_be_placed(scope: Any) -> None:
    v1, v2 = (ModelArtifact(bucket_name="my-models", prefix=f"llama-3.1-8b/{v}/", version=v) for v in ("v1", "v2"))
    green = ModelArtifact(bucket_name="my-models", prefix="llama-3.1-8b-v9/", version="9")
    assert problems(scope, model_artifact=[v1, v2], live_slot="Green", green_model_artifact=green) == [
        "model_artifact is a release history of 2 versions and green_model_artifact and live_slot are given too: the "
        "history decides each slot's version and the live slot; drop green_model_artifact and live_slot"]
    assert problems(scope, model_artifact=[v1, v2], rollout=None) == [
        "model_artifact is a release history and rollout is None: a history ships each version by a blue/green "
        "rollout; keep the default rollout, or pass one ModelArtifact with rollout=None"]
    assert problems(scope, model_artifact=(v1, v2, v2.model_copy(update={"prefix": "llama-3.1-8b/v2b/"}))) == [
        "model_artifact[-1].version ('v2') equals model_artifact[-2].version: a release is a new version; give it "
        "its own version (and prefix), or replace the last entry (a retry after a rollback) instead of appending"]
    assert problems(scope, model_artifact=[v1, "llama-3.1-8b/v2/"]) == [
        "model_artifact (a list) must be a ModelArtifact or a non-empty release history of ModelArtifacts, oldest "
        "first: not [1] (str): e.g. model_artifact=[v1, v2] (v2 serves; appending v3 rolls it out)"]
    assert problems(scope, model_artifact=[]) == [
        "model_artifact (a list) must be a ModelArtifact or a non-empty release history of ModelArtifacts, oldest "
        "first: e.g. model_artifact=[v1, v2] (v2 serves; appending v3 rolls it out)"]
