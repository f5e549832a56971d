"""PrivateNetworkStack: what the example promises a platform team (the construct's own tests cover the rest)."""

from __future__ import annotations

from aws_cdk.assertions import Match, Template

from examples import STACK_NAMES
from tests.support import Synthesized, resources_of_type

STACK = STACK_NAMES["network"]


def test_network_has_no_nat_gateway_and_no_internet_gateway(examples_synth: Synthesized) -> None:
    template = examples_synth.template(STACK)
    assert resources_of_type(template, "AWS::EC2::NatGateway") == {}
    assert resources_of_type(template, "AWS::EC2::InternetGateway") == {}


def test_network_spans_two_zones_of_isolated_subnets(examples_synth: Synthesized) -> None:
    subnets = resources_of_type(examples_synth.template(STACK), "AWS::EC2::Subnet")
    assert len(subnets) == 2
    assert all(s["Properties"]["MapPublicIpOnLaunch"] is False for s in subnets.values())


def test_s3_reaches_the_network_through_a_gateway_endpoint_with_a_policy(examples_synth: Synthesized) -> None:
    Template.from_json(examples_synth.template(STACK)).has_resource_properties(
        "AWS::EC2::VPCEndpoint",
        {"VpcEndpointType": "Gateway", "PolicyDocument": Match.object_like({"Statement": Match.any_value()})},
    )


def test_every_interface_endpoint_has_a_policy_and_private_dns(examples_synth: Synthesized) -> None:
    endpoints = resources_of_type(examples_synth.template(STACK), "AWS::EC2::VPCEndpoint")
    interface = [e["Properties"] for e in endpoints.values() if e["Properties"].get("VpcEndpointType") == "Interface"]
    assert interface
    assert all(p.get("PolicyDocument") and p.get("PrivateDnsEnabled") for p in interface)


def test_flow_logs_capture_all_traffic(examples_synth: Synthesized) -> None:
    Template.from_json(examples_synth.template(STACK)).has_resource_properties(
        "AWS::EC2::FlowLog", {"TrafficType": "ALL", "ResourceType": "VPC"}
    )
