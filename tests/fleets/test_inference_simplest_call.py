"""The issue's simplest call, exactly as written, must synthesize (no certificate, no explicit opt-in)."""

import pytest
from aws_cdk import App, Stack
from aws_cdk.assertions import Annotations, Match, Template

from genai_constructs import GpuInferenceFleet, ModelArtifact, ModelShape, PrivateDataPath, RealtimeTraffic


@pytest.fixture(scope="module")
def simplest():
    stack = Stack(App(), "Simplest")
    fleet = GpuInferenceFleet(
        stack, "Chat", network=PrivateDataPath(stack, "Net"),
        model=ModelShape.preset("llama-3.1-8b"),
        traffic=RealtimeTraffic(concurrent_sessions=32, output_tokens_per_s_per_session=20),
        model_artifact=ModelArtifact(bucket_name="my-models", prefix="llama-3.1-8b/"),
    )
    return stack, fleet, Template.from_stack(stack)


def test_simplest_call_uses_the_plan(simplest):
    _, fleet, template = simplest
    template.has_resource_properties("AWS::EC2::LaunchTemplate", {
        "LaunchTemplateData": Match.object_like({"InstanceType": fleet.plan.instance_type})})


def test_simplest_call_serves_http_inside_the_vpc_and_warns(simplest):
    stack, _, template = simplest
    template.has_resource_properties("AWS::ElasticLoadBalancingV2::Listener", {"Port": 80, "Protocol": "HTTP"})
    Annotations.from_stack(stack).has_warning("*", Match.string_like_regexp("no certificate given.*plain HTTP"))


def test_simplest_call_load_balancer_is_internal(simplest):
    _, _, template = simplest
    template.has_resource_properties("AWS::ElasticLoadBalancingV2::LoadBalancer", {"Scheme": "internal"})
