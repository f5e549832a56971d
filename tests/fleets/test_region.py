"""The fleets and the stack's region: plan and price there, refuse what it does not offer, warn when agnostic."""

from __future__ import annotations

import pytest
from aws_cdk import App, Environment, Stack
from aws_cdk.assertions import Annotations, Match

from genai_constructs.errors import ConfigurationError
from genai_constructs.fleets import EmbeddingBatchFleet, _region
from genai_constructs.network import PrivateDataPath
from genai_constructs.planner import plan_embedding
from genai_constructs.workload import BatchTraffic, ModelShape

MODEL = ModelShape.preset("bge-base-en-v1.5")
BACKLOG = BatchTraffic(documents=100_000, tokens_per_document=400, deadline_hours=6)


def _stack(region: str | None) -> Stack:
    env = Environment(account="111122223333", region=region) if region else None
    return Stack(App(), "Embed", env=env)


def test_a_concrete_region_plans_and_prices_there() -> None:
    stack = _stack("eu-west-1")
    fleet = EmbeddingBatchFleet(stack, "Fleet", network=PrivateDataPath(stack, "Net"), model=MODEL, traffic=BACKLOG)
    assert fleet.plan.region == "eu-west-1"
    assert "eu-west-1" in fleet.plan.price_label
    # No g6 size is offered in eu-west-1 (shared/reference/ec2_accelerator_regions.csv), so none can be planned.
    assert not fleet.plan.instance_type.startswith("g6.")
    Annotations.from_stack(stack).has_no_warning("*", Match.string_like_regexp("environment-agnostic"))


def test_fails_a_type_the_stacks_region_does_not_offer_naming_where_it_is() -> None:
    stack = _stack("eu-west-1")
    plan = plan_embedding(MODEL, BACKLOG, instance_types=["g6.xlarge"])  # planned without a region: us-east-1
    with pytest.raises(ConfigurationError) as error:
        EmbeddingBatchFleet(stack, "Fleet", network=PrivateDataPath(stack, "Net"), model=MODEL, traffic=BACKLOG,
                            plan=plan)
    message = str(error.value)
    assert "'g6.xlarge' is not offered in the stack's region eu-west-1" in message
    assert "us-east-1" in message and "env=Environment(region=...)" in message
    # Refused before the construct was added: nothing half-built is left in the stack.
    assert stack.node.try_find_child("Fleet") is None


def test_an_environment_agnostic_stack_warns_that_prices_are_us_east_1s() -> None:
    stack = _stack(None)
    EmbeddingBatchFleet(stack, "Fleet", network=PrivateDataPath(stack, "Net"), model=MODEL, traffic=BACKLOG)
    Annotations.from_stack(stack).has_warning(
        "/Embed/Fleet", Match.string_like_regexp("environment-agnostic, so the plan's prices are us-east-1's"))


def test_a_plan_priced_elsewhere_is_named_in_a_warning() -> None:
    stack = _stack("us-west-2")
    plan = plan_embedding(MODEL, BACKLOG, region="eu-west-1")
    EmbeddingBatchFleet(stack, "Fleet", network=PrivateDataPath(stack, "Net"), model=MODEL, traffic=BACKLOG,
                        plan=plan)
    Annotations.from_stack(stack).has_warning(
        "/Embed/Fleet", Match.string_like_regexp("priced for eu-west-1 but the stack deploys to us-west-2"))


def test_stack_region_is_none_when_agnostic() -> None:
    assert _region.stack_region(_stack(None)) is None
    assert _region.stack_region(_stack("ap-south-1")) == "ap-south-1"


def test_a_fleet_beyond_any_likely_quota_warns_at_synth() -> None:
    stack = _stack("us-east-1")
    # A backlog that needs tens of p5.48xlarge (192 vCPUs each) in 3 hours: far past 4,000 P vCPUs.
    huge = BatchTraffic(documents=700_000_000, tokens_per_document=5000, deadline_hours=3)
    plan = plan_embedding(MODEL, huge, instance_types=["p5.48xlarge"])
    assert plan.quota is not None and plan.quota.vcpus > 4000 and plan.quota.warning
    EmbeddingBatchFleet(stack, "Fleet", network=PrivateDataPath(stack, "Net"), model=MODEL, traffic=huge, plan=plan)
    Annotations.from_stack(stack).has_warning("/Embed/Fleet", Match.string_like_regexp("vCPUs"))
