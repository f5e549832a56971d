"""Bring your own VPC: literal CIDRs read from the tree, NAT and internet routes found and answered, bad input refused
before the construct joins the tree. Construct-level checks only (no synthesis)."""

from __future__ import annotations

from typing import Any

import pytest
from aws_cdk import App, Fn, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_logs as logs
from aws_cdk.assertions import Annotations, Match

from genai_constructs.errors import ConfigurationError
from genai_constructs.network import PrivateDataPath
from genai_constructs.network.private_data_path import (
    EGRESS_DESCRIPTIONS,
    INTERNET_ROUTES_WARNING_ID,
    ROUTES_UNKNOWN_WARNING_ID,
)


def warnings_of(stack: Stack, message_part: str) -> list[Any]:
    return Annotations.from_stack(stack).find_warning("*", Match.string_like_regexp(message_part))


@pytest.fixture(scope="module")
def nat_vpc() -> tuple[Stack, ec2.Vpc, PrivateDataPath]:
    stack = Stack(App(), "Nat")
    vpc = ec2.Vpc(stack, "Vpc", ip_addresses=ec2.IpAddresses.cidr("10.4.0.0/16"))  # CDK default: a NAT per AZ
    return stack, vpc, PrivateDataPath(stack, "Net", vpc=vpc)


def test_same_stack_vpc_gives_its_literal_cidr_without_vpc_cidr(nat_vpc: Any) -> None:
    _, _, net = nat_vpc
    assert net.vpc_cidr == "10.4.0.0/16"


def test_nat_routes_of_the_chosen_subnets_are_found_and_warned_about(nat_vpc: Any) -> None:
    stack, _, net = nat_vpc
    assert net.internet_routes is True
    assert len(net.internet_route_findings) == 2
    assert all(f.endswith("0.0.0.0/0 -> a NAT gateway") for f in net.internet_route_findings)
    (warning,) = warnings_of(stack, "route to the internet")
    text = warning.entry.data
    assert INTERNET_ROUTES_WARNING_ID in text
    for part in ("What stays on that path", "DynamoDB", "PRIVATE_ISOLATED", "refuse_internet_routes=True"):
        assert part in text
    assert net.instance_egress_description == EGRESS_DESCRIPTIONS[True]
    assert "no route to the internet" not in net.instance_egress_description


def test_refuse_internet_routes_makes_the_nat_route_an_error_and_adds_nothing() -> None:
    stack = Stack(App(), "Refuse")
    vpc = ec2.Vpc(stack, "Vpc")
    with pytest.raises(ConfigurationError) as raised:
        PrivateDataPath(stack, "Net", vpc=vpc, refuse_internet_routes=True)
    (problem,) = raised.value.problems
    assert problem.startswith("refuse_internet_routes (True): the chosen subnets route to the internet")
    assert "-> a NAT gateway" in problem and "vpc_subnets=" in problem
    assert stack.node.try_find_child("Net") is None


def test_isolated_only_vpc_has_no_internet_route_and_no_warning() -> None:
    stack = Stack(App(), "Isolated")
    vpc = ec2.Vpc(stack, "Vpc", ip_addresses=ec2.IpAddresses.cidr("10.5.0.0/16"), nat_gateways=0,
                  subnet_configuration=[ec2.SubnetConfiguration(name="Data",
                                                                subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)])
    net = PrivateDataPath(stack, "Net", vpc=vpc, refuse_internet_routes=True)
    assert (net.vpc_cidr, net.internet_routes, net.internet_route_findings) == ("10.5.0.0/16", False, [])
    assert warnings_of(stack, "route") == []
    assert net.instance_egress_description == EGRESS_DESCRIPTIONS[False]


def test_nat_vpc_with_isolated_subnets_chosen_has_no_internet_route() -> None:
    stack = Stack(App(), "Mixed")
    vpc = ec2.Vpc(stack, "Vpc", subnet_configuration=[
        ec2.SubnetConfiguration(name="Public", subnet_type=ec2.SubnetType.PUBLIC),
        ec2.SubnetConfiguration(name="App", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
        ec2.SubnetConfiguration(name="Data", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)])
    net = PrivateDataPath(stack, "Net", vpc=vpc)
    assert net.internet_routes is False


def test_public_subnets_chosen_are_found_as_internet_gateway_routes() -> None:
    stack = Stack(App(), "Public")
    vpc = ec2.Vpc(stack, "Vpc")
    net = PrivateDataPath(stack, "Net", vpc=vpc,
                          vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PUBLIC))
    assert net.internet_routes is True
    assert all(f.endswith("-> an internet gateway") for f in net.internet_route_findings)


def test_imported_vpc_with_token_cidr_needs_vpc_cidr_and_warns_that_routes_are_unknown() -> None:
    stack = Stack(App(), "Imported")
    vpc = ec2.Vpc.from_vpc_attributes(
        stack, "Vpc", vpc_id=Fn.import_value("VpcId"), vpc_cidr_block=Fn.import_value("VpcCidr"),
        availability_zones=["us-east-1a", "us-east-1b"], private_subnet_ids=["subnet-a", "subnet-b"],
        private_subnet_route_table_ids=["rtb-a", "rtb-b"])
    with pytest.raises(ConfigurationError, match=r"vpc_cidr \(None\) is required when the vpc's CIDR is a token"):
        PrivateDataPath(stack, "Refused", vpc=vpc)
    assert stack.node.try_find_child("Refused") is None
    net = PrivateDataPath(stack, "Net", vpc=vpc, vpc_cidr="10.6.0.0/16")
    assert (net.vpc_cidr, net.internet_routes) == ("10.6.0.0/16", None)
    (warning,) = warnings_of(stack, "routes cannot be read")
    assert ROUTES_UNKNOWN_WARNING_ID in warning.entry.data
    assert "no route to the internet" not in net.instance_egress_description
    with pytest.raises(ConfigurationError, match=r"refuse_internet_routes \(True\): the VPC is imported"):
        PrivateDataPath(stack, "Strict", vpc=vpc, vpc_cidr="10.6.0.0/16", refuse_internet_routes=True)


def test_imported_subnets_without_route_tables_are_refused_before_construction() -> None:
    stack = Stack(App(), "NoTables")
    vpc = ec2.Vpc.from_vpc_attributes(stack, "Vpc", vpc_id="vpc-1", vpc_cidr_block="10.0.0.0/16",
                                      availability_zones=["us-east-1a"], isolated_subnet_ids=["subnet-1"])
    with pytest.raises(ConfigurationError, match=r"have no route table id: import the VPC with"):
        PrivateDataPath(stack, "Net", vpc=vpc)
    assert stack.node.try_find_child("Net") is None


def test_a_vpc_cidr_that_contradicts_a_same_stack_vpc_is_refused() -> None:
    stack = Stack(App(), "Contradict")
    vpc = ec2.Vpc(stack, "Vpc")  # 10.0.0.0/16, CDK's default
    with pytest.raises(ConfigurationError, match=r"vpc_cidr \('10.1.0.0/16'\) differs from the VPC's own CIDR"):
        PrivateDataPath(stack, "Net", vpc=vpc, vpc_cidr="10.1.0.0/16")


# ---- Wrong types and nonsense numbers: one ConfigurationError, nothing added to the stack -----------------------

@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"flow_log_retention": 365}, "flow_log_retention (365) must be a logs.RetentionDays, not an int: e.g. "
                                      "flow_log_retention=logs.RetentionDays.ONE_YEAR"),
        ({"max_azs": True}, "max_azs (True) must be a whole number >= 1, not a bool: use 2"),
        ({"max_azs": 2.5}, "max_azs (2.5) must be a whole number >= 1, not a float"),
        ({"max_azs": float("inf")}, "max_azs (inf) must be a whole number >= 1, not a float"),
        ({"max_azs": "2"}, "max_azs ('2') must be a whole number >= 1, not a str"),
        ({"subnet_cidr_mask": 30}, "subnet_cidr_mask (30) must be a whole number between 16 and 28: a subnet is"),
        ({"cidr": 10}, "cidr (10) must be a string, not an int: give one such as '10.80.0.0/16'"),
        ({"flow_logs": "no"}, "flow_logs ('no') must be True or False, not a str: write flow_logs=True"),
        ({"refuse_internet_routes": 1}, "refuse_internet_routes (1) must be True or False, not an int"),
        ({"vpc": "vpc-0123"}, "vpc ('vpc-0123') must be an ec2.IVpc, not a str: pass an ec2.Vpc"),
        ({"vpc_subnets": ["subnet-1"]}, "vpc_subnets (['subnet-1']) must be an ec2.SubnetSelection, not a list"),
        ({"extra_interface_endpoints": [1]}, "extra_interface_endpoints ([1]) must be a list of strings"),
    ],
)
def test_fails_on_wrong_types_naming_the_argument_value_and_fix(kwargs: dict[str, Any], expected: str) -> None:
    stack = Stack(App(), "Types")
    with pytest.raises(ConfigurationError) as raised:
        PrivateDataPath(stack, "Net", **kwargs)
    assert any(p.startswith(expected) for p in raised.value.problems), raised.value.problems
    assert stack.node.try_find_child("Net") is None


def test_fails_with_every_type_problem_at_once() -> None:
    stack = Stack(App(), "All")
    with pytest.raises(ConfigurationError) as raised:
        PrivateDataPath(stack, "Net", flow_log_retention=365, max_azs=2.5, flow_logs="yes",  # type: ignore[arg-type]
                        extra_interface_endpoints="sns")
    assert [p.split(" ")[0] for p in raised.value.problems] == [
        "max_azs", "extra_interface_endpoints", "flow_logs", "flow_log_retention"]


def test_fails_on_a_scope_that_is_not_a_construct() -> None:
    with pytest.raises(ConfigurationError, match=r"scope \('stack'\) must be a construct"):
        PrivateDataPath("stack", "Net")  # type: ignore[arg-type]


def test_fails_allow_bucket_name_on_names_s3_refuses() -> None:
    net = PrivateDataPath(Stack(App(), "Buckets"), "Net")
    for name, fix in (("my..models", "write 'my.models'"), ("192.168.5.4", "IP address"),
                      ("s3://my-models", "give bucket_name='my-models'")):
        with pytest.raises(ConfigurationError, match=r"allow_bucket_name: bucket_name") as raised:
            net.allow_bucket_name(name)
        assert fix in str(raised.value)
    with pytest.raises(ConfigurationError, match=r"allow_bucket: bucket \('my-models'\) must be an s3.IBucket"):
        net.allow_bucket("my-models")  # type: ignore[arg-type]
    assert logs.RetentionDays.ONE_YEAR  # the enum the retention check names
