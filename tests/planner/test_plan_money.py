"""Plans in money and capacity: regional prices, cost at the user's traffic, quotas, replica layouts."""

from __future__ import annotations

import pytest

from genai_constructs.errors import InstanceTypeNotOfferedError, UnknownRegionError
from genai_constructs.planner import load_catalog, plan_embedding, plan_inference
from genai_constructs.workload import BatchTraffic, ModelShape, RealtimeTraffic

LLAMA_8B = ModelShape.preset("llama-3.1-8b")
CHAT = RealtimeTraffic(concurrent_sessions=32, output_tokens_per_s_per_session=20)
BACKLOG = BatchTraffic(documents=2_000_000, tokens_per_document=800, deadline_hours=12, spot_ok=True)


@pytest.fixture(scope="module")
def chat_plan():
    return plan_inference(LLAMA_8B, CHAT)


def test_fails_unknown_region_naming_the_closest() -> None:
    with pytest.raises(UnknownRegionError, match=r"eu-west-9.*eu-west-1"):
        plan_inference(LLAMA_8B, CHAT, region="eu-west-9")


def test_fails_a_named_type_the_region_does_not_offer_naming_where_it_is() -> None:
    # ec2_accelerator_regions.csv: no g6e size in eu-west-1; g6e.xlarge is in us-east-1 among others.
    with pytest.raises(InstanceTypeNotOfferedError) as error:
        plan_inference(LLAMA_8B, CHAT, instance_types=["g6e.xlarge"], region="eu-west-1")
    assert "'g6e.xlarge' is not offered in eu-west-1" in str(error.value)
    assert "us-east-1" in str(error.value)


def test_a_region_prices_the_plan_with_its_own_figures() -> None:
    plan = plan_inference(LLAMA_8B, CHAT, instance_types=["g5.xlarge"], region="eu-west-1")
    # ec2_accelerator_regional_prices.csv: g5.xlarge on-demand is 1.123 in eu-west-1 and 1.006 in us-east-1.
    assert plan.usd_per_hour == pytest.approx(1.123)
    assert "eu-west-1" in plan.price_label
    assert plan.spot_usd_per_hour is not None and "Spot estimate" in plan.spot_price_label
    assert plan.cost_at_traffic is not None and plan.cost_at_traffic.region == "eu-west-1"


def test_types_not_offered_in_the_region_are_left_out_and_said() -> None:
    plan = plan_inference(LLAMA_8B, CHAT, region="eu-west-1")
    assert not plan.instance_type.startswith(("g6.", "g6e."))  # neither family is offered in eu-west-1
    assert any("Not offered in eu-west-1" in note and "g6e.xlarge" in note for note in plan.notes)


def test_a_region_without_price_data_plans_on_labelled_us_east_1_proxies() -> None:
    plan = plan_inference(LLAMA_8B, CHAT, region="sa-east-1")  # listed by cfn-lint only: no prices at all
    assert "proxy" in plan.price_label
    assert any("us-east-1's, used as a proxy" in note for note in plan.notes)


def test_cost_at_traffic_counts_what_the_fleet_deploys(chat_plan) -> None:
    cost = chat_plan.cost_at_traffic
    names = {item.name for item in cost.items}
    assert {"instances running", "application load balancer (hourly)", "interface VPC endpoints (hourly)"} <= names
    assert any("warm pool" in name for name in names)
    # 11 interface endpoints in 2 AZs at $0.01 per endpoint-AZ-hour (AWS PrivateLink pricing, us-east-1).
    endpoints = next(item for item in cost.items if item.name == "interface VPC endpoints (hourly)")
    assert endpoints.usd_per_hour == pytest.approx(0.22)
    # The deployed fleet costs more than its instances alone.
    assert cost.usd_per_hour > chat_plan.usd_per_hour * cost.running_instances


def test_per_million_tokens_at_traffic_is_dearer_than_at_capacity(chat_plan) -> None:
    # 32 sessions x 20 tokens/s is below what the planned instances serve (headroom, min_instances), and the fleet
    # pays for its ALB, endpoints and warm pool too: a token at the user's rate costs more than at capacity.
    cost = chat_plan.cost_at_traffic
    assert cost.output_tokens_per_hour_at_traffic == pytest.approx(32 * 20 * 3600)
    assert cost.usd_per_million_output_tokens_at_traffic > cost.usd_per_million_output_tokens_at_capacity
    assert cost.usd_per_million_output_tokens_at_capacity == pytest.approx(chat_plan.usd_per_million_output_tokens,
                                                                            rel=0.01)
    assert any("At the traffic's own rate" in reason for reason in chat_plan.reasons)


def test_quota_is_sized_at_the_groups_maximum(chat_plan) -> None:
    instance = load_catalog().instance(chat_plan.instance_type)
    group_max = max(chat_plan.max_instances, chat_plan.min_instances + 1)  # GpuInferenceFleet's SCALE_OUT_ROOM
    assert chat_plan.quota.instances == group_max
    assert chat_plan.quota.vcpus == group_max * instance.vcpu
    assert chat_plan.quota.quota_name.startswith("Running On-Demand")


def test_spot_batch_quota_counts_the_largest_spot_override() -> None:
    plan = plan_embedding(ModelShape.preset("bge-large-en-v1.5"), BACKLOG)
    assert plan.spot and plan.spot_instance_types
    largest = max(load_catalog().instance(t).vcpu for t in [plan.instance_type, *plan.spot_instance_types])
    assert plan.quota.vcpus == plan.max_instances * largest
    assert "Spot" in plan.quota.quota_name


def test_batch_job_cost_includes_start_up_and_is_spot_priced_when_allowed() -> None:
    plan = plan_embedding(ModelShape.preset("bge-large-en-v1.5"), BACKLOG, region="us-east-1")
    job = plan.job_cost
    assert job.startup_hours == pytest.approx(plan.worker_startup_s / 3600)
    assert job.hours_wall_clock == pytest.approx(job.startup_hours + job.work_hours)
    assert job.spot and "Spot estimate" in job.instance_price_label


def test_fleet_beyond_any_likely_quota_warns() -> None:
    huge = RealtimeTraffic(concurrent_sessions=200_000, output_tokens_per_s_per_session=20)
    plan = plan_inference(ModelShape.preset("llama-3.1-70b"), huge)
    assert plan.quota.warning
    assert plan.quota.warning in plan.notes


def test_an_8b_model_on_an_8_gpu_box_runs_narrow_replicas() -> None:
    # One 8B replica per H100 avoids eight-way all-reduces: several replicas beat one wide one on p5.48xlarge.
    busy = RealtimeTraffic(concurrent_sessions=3000, output_tokens_per_s_per_session=20)
    plan = plan_inference(LLAMA_8B, busy, instance_types=["p5.48xlarge"])
    assert plan.replicas_per_instance > 1
    assert plan.replicas_per_instance * plan.devices_per_replica == 8
    assert plan.server.tensor_parallel_size == plan.devices_per_replica
    assert plan.concurrency_per_instance == plan.replicas_per_instance * plan.estimate.concurrency
    assert any(f"runs {plan.replicas_per_instance} replicas" in reason for reason in plan.reasons)


def test_a_region_spelled_loosely_is_the_regions_own_name() -> None:
    plan = plan_inference(LLAMA_8B, CHAT, instance_types=["g5.xlarge"], region=" EU-West-1 ")
    assert plan.region == "eu-west-1"
