"""PrivateDataPath: a VPC whose data path never touches a NAT gateway.

Each synthesized app is built once per module (a synth costs seconds); failure cases construct without synthesizing.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from aws_cdk import App, Fn, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from aws_cdk import aws_s3 as s3
from aws_cdk.assertions import Annotations, Match, Template

from genai_constructs.errors import ConfigurationError
from genai_constructs.network import DEFAULT_INTERFACE_ENDPOINTS, PrivateDataPath
from genai_constructs.network.private_data_path import DEFAULT_VPC_CIDR
from tests.support import resources_of_type, synth_app

ALL_PACKS = ("AwsSolutions", "NIST.800.53.R5", "HIPAA.Security")
ACCOUNT_POLICY = {
    "Statement": [
        {
            "Action": "*",
            "Effect": "Allow",
            "Principal": {"AWS": "*"},
            "Resource": "*",
            "Condition": {"StringEquals": {"aws:PrincipalAccount": {"Ref": "AWS::AccountId"}}},
            "Sid": "PrincipalsOfThisAccount",
        }
    ],
    "Version": "2012-10-17",
}


def service_suffix(endpoint: dict[str, Any]) -> str:
    """'sqs' from {"Fn::Join": ["", ["com.amazonaws.", {"Ref": "AWS::Region"}, ".sqs"]]}."""
    name = endpoint["Properties"]["ServiceName"]
    if isinstance(name, str):  # an env-specific stack writes the region in: "com.amazonaws.us-east-1.sqs"
        return re.sub(r"^com\.amazonaws\.[a-z]{2}(-gov)?-[a-z]+-\d\.", "", name)
    return name["Fn::Join"][1][-1].lstrip(".")


def interface_endpoints(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        k: v
        for k, v in resources_of_type(template, "AWS::EC2::VPCEndpoint").items()
        if v["Properties"]["VpcEndpointType"] == "Interface"
    }


def gateway_endpoint(template: dict[str, Any], service: str) -> dict[str, Any]:
    (endpoint,) = [
        v
        for v in resources_of_type(template, "AWS::EC2::VPCEndpoint").values()
        if v["Properties"]["VpcEndpointType"] == "Gateway" and service_suffix(v) == service
    ]
    return endpoint


def statements_by_sid(endpoint: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["Sid"]: s for s in endpoint["Properties"]["PolicyDocument"]["Statement"]}


# ---- Defaults: PrivateDataPath(stack, "Net") and nothing else, under all three cdk-nag packs ----------------------


@pytest.fixture(scope="module")
def defaults() -> tuple[Any, PrivateDataPath]:
    built: dict[str, PrivateDataPath] = {}

    def build(app: App) -> Stack:
        stack = Stack(app, "Net")
        built["net"] = PrivateDataPath(stack, "Net")
        return stack

    synthesized = synth_app(build, packs=ALL_PACKS)
    return synthesized, built["net"]


@pytest.fixture(scope="module")
def template(defaults: tuple[Any, PrivateDataPath]) -> dict[str, Any]:
    return defaults[0].template()


@pytest.mark.parametrize("pack", ALL_PACKS)
def test_default_network_is_cdk_nag_clean(defaults: tuple[Any, PrivateDataPath], pack: str) -> None:
    synthesized, _ = defaults
    found = [line for line in synthesized.violation_summary() if line.startswith(pack + "-")]
    assert found == []


def test_no_nat_gateway_internet_gateway_or_route_out(template: dict[str, Any]) -> None:
    t = Template.from_json(template)
    t.resource_count_is("AWS::EC2::NatGateway", 0)
    t.resource_count_is("AWS::EC2::InternetGateway", 0)
    t.resource_count_is("AWS::EC2::VPCGatewayAttachment", 0)
    t.resource_count_is("AWS::EC2::EgressOnlyInternetGateway", 0)
    t.resource_count_is("AWS::EC2::Route", 0)


def test_default_subnets_are_private_isolated_only(
    defaults: tuple[Any, PrivateDataPath], template: dict[str, Any]
) -> None:
    _, net = defaults
    subnets = resources_of_type(template, "AWS::EC2::Subnet")
    assert all(s["Properties"]["MapPublicIpOnLaunch"] is False for s in subnets.values())
    assert {
        tag["Value"] for s in subnets.values() for tag in s["Properties"]["Tags"] if tag["Key"] == "aws-cdk:subnet-type"
    } == {"Isolated"}
    assert net.subnet_selection.subnet_type == ec2.SubnetType.PRIVATE_ISOLATED


def test_default_max_azs_is_two(defaults: tuple[Any, PrivateDataPath], template: dict[str, Any]) -> None:
    _, net = defaults
    assert len(resources_of_type(template, "AWS::EC2::Subnet")) == 2
    assert len(net.subnets) == 2


def test_default_cidr_is_a_literal_on_vpc_and_member(defaults: tuple[Any, PrivateDataPath]) -> None:
    synthesized, net = defaults
    Template.from_json(synthesized.template()).has_resource_properties("AWS::EC2::VPC", {"CidrBlock": "10.80.0.0/16"})
    assert net.vpc_cidr == DEFAULT_VPC_CIDR == "10.80.0.0/16"


def test_default_subnet_mask_is_20(template: dict[str, Any]) -> None:
    blocks = sorted(s["Properties"]["CidrBlock"] for s in resources_of_type(template, "AWS::EC2::Subnet").values())
    assert blocks == ["10.80.0.0/20", "10.80.16.0/20"]


def test_s3_gateway_endpoint_on_every_route_table(template: dict[str, Any]) -> None:
    route_tables = set(resources_of_type(template, "AWS::EC2::RouteTable"))
    refs = {ref["Ref"] for ref in gateway_endpoint(template, "s3")["Properties"]["RouteTableIds"]}
    assert route_tables and refs == route_tables


def test_default_has_no_dynamodb_gateway_endpoint(template: dict[str, Any]) -> None:
    gateways = [
        service_suffix(v)
        for v in resources_of_type(template, "AWS::EC2::VPCEndpoint").values()
        if v["Properties"]["VpcEndpointType"] == "Gateway"
    ]
    assert gateways == ["s3"]


def test_default_interface_endpoints_are_what_the_fleets_call(
    defaults: tuple[Any, PrivateDataPath], template: dict[str, Any]
) -> None:
    _, net = defaults
    expected = {"sqs", "logs", "monitoring", "ssm", "ssmmessages", "ec2messages", "ecr.api", "ecr.dkr", "sts", "kms",
                "autoscaling"}
    assert {service_suffix(v) for v in interface_endpoints(template).values()} == expected
    assert set(net.interface_endpoints) == expected == set(DEFAULT_INTERFACE_ENDPOINTS)


def test_every_interface_endpoint_has_private_dns_account_policy_and_the_endpoint_group(
    template: dict[str, Any],
) -> None:
    (group_id,) = resources_of_type(template, "AWS::EC2::SecurityGroup")
    route_subnets = set(resources_of_type(template, "AWS::EC2::Subnet"))
    for logical_id, endpoint in interface_endpoints(template).items():
        props = endpoint["Properties"]
        assert props["PrivateDnsEnabled"] is True, logical_id
        assert props["PolicyDocument"] == ACCOUNT_POLICY, logical_id
        assert props["SecurityGroupIds"] == [{"Fn::GetAtt": [group_id, "GroupId"]}], logical_id
        assert {ref["Ref"] for ref in props["SubnetIds"]} == route_subnets, logical_id


def test_endpoint_security_group_admits_443_from_the_vpc_cidr_only(template: dict[str, Any]) -> None:
    (group,) = resources_of_type(template, "AWS::EC2::SecurityGroup").values()
    (rule,) = group["Properties"]["SecurityGroupIngress"]
    assert (rule["CidrIp"], rule["IpProtocol"], rule["FromPort"], rule["ToPort"]) == ("10.80.0.0/16", "tcp", 443, 443)
    assert [e["CidrIp"] for e in group["Properties"]["SecurityGroupEgress"]] == ["255.255.255.255/32"]
    assert resources_of_type(template, "AWS::EC2::SecurityGroupIngress") == {}


def test_s3_gateway_endpoint_policy_allows_only_named_aws_owned_buckets_by_default(template: dict[str, Any]) -> None:
    statements = statements_by_sid(gateway_endpoint(template, "s3"))
    assert set(statements) == {
        "AmazonLinux2023Repositories",
        "AmazonLinux2Repositories",
        "EcrImageLayers",
        "SsmAgentUpdates",
        "SsmAgentDocuments",
    }
    for statement in statements.values():
        assert statement["Action"] == "s3:GetObject"
        assert statement["Effect"] == "Allow"
    assert statements["AmazonLinux2023Repositories"]["Resource"] == {
        "Fn::Join": [
            "",
            ["arn:", {"Ref": "AWS::Partition"}, ":s3:::al2023-repos-", {"Ref": "AWS::Region"}, "-de612dc2/*"],
        ]
    }
    assert statements["EcrImageLayers"]["Resource"] == {
        "Fn::Join": [
            "",
            ["arn:", {"Ref": "AWS::Partition"}, ":s3:::prod-", {"Ref": "AWS::Region"}, "-starport-layer-bucket/*"],
        ]
    }


def test_flow_logs_capture_all_traffic_of_the_vpc(template: dict[str, Any]) -> None:
    (vpc_id,) = resources_of_type(template, "AWS::EC2::VPC")
    (group_id,) = resources_of_type(template, "AWS::Logs::LogGroup")
    Template.from_json(template).has_resource_properties(
        "AWS::EC2::FlowLog",
        {
            "ResourceId": {"Ref": vpc_id},
            "ResourceType": "VPC",
            "TrafficType": "ALL",
            "LogDestinationType": "cloud-watch-logs",
            "LogGroupName": {"Ref": group_id},
        },
    )


def test_flow_log_group_is_kms_encrypted_with_a_rotated_key(template: dict[str, Any]) -> None:
    (key_id,) = resources_of_type(template, "AWS::KMS::Key")
    t = Template.from_json(template)
    t.has_resource_properties("AWS::Logs::LogGroup", {"KmsKeyId": {"Fn::GetAtt": [key_id, "Arn"]}})
    t.has_resource_properties("AWS::KMS::Key", {"EnableKeyRotation": True})


def test_default_flow_log_retention_is_one_year(template: dict[str, Any]) -> None:
    Template.from_json(template).has_resource_properties("AWS::Logs::LogGroup", {"RetentionInDays": 365})


def test_flow_log_role_uses_a_customer_managed_policy_on_the_log_group_only(template: dict[str, Any]) -> None:
    assert resources_of_type(template, "AWS::IAM::Policy") == {}  # no inline policies
    (group_id,) = resources_of_type(template, "AWS::Logs::LogGroup")
    (policy,) = resources_of_type(template, "AWS::IAM::ManagedPolicy").values()
    (statement,) = policy["Properties"]["PolicyDocument"]["Statement"]
    assert statement["Resource"] == {"Fn::GetAtt": [group_id, "Arn"]}
    assert sorted(statement["Action"]) == ["logs:CreateLogStream", "logs:DescribeLogStreams", "logs:PutLogEvents"]
    Template.from_json(template).has_resource_properties(
        "AWS::IAM::Role",
        {
            "AssumeRolePolicyDocument": {
                "Statement": [
                    Match.object_like(
                        {
                            "Principal": {"Service": "vpc-flow-logs.amazonaws.com"},
                            "Condition": {"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}},
                        }
                    )
                ]
            }
        },
    )


def test_default_security_group_of_the_vpc_is_restricted_by_default(template: dict[str, Any]) -> None:
    Template.from_json(template).resource_count_is("Custom::VpcRestrictDefaultSG", 1)


# ---- Configured: extras, DynamoDB, registered buckets and retrieval services ---------------------------------------


@pytest.fixture(scope="module")
def configured() -> tuple[dict[str, Any], PrivateDataPath, Stack]:
    built: dict[str, Any] = {}

    def build(app: App) -> Stack:
        app.node.set_context(
            "availability-zones:account=111111111111:region=us-east-1", ["us-east-1a", "us-east-1b", "us-east-1c"]
        )
        stack = Stack(app, "Configured", env={"account": "111111111111", "region": "us-east-1"})
        net = PrivateDataPath(
            stack,
            "Net",
            max_azs=3,
            extra_interface_endpoints=["bedrock-runtime", "sagemaker-runtime", "sqs"],
            dynamodb_gateway_endpoint=True,
        )
        # Registered after construction, as the fleets do: the policy must still show them.
        net.allow_bucket(s3.Bucket.from_bucket_name(stack, "Models", "my-models"))
        net.allow_bucket_name("my-results", write=True)
        net.allow_bucket_name("my-models")  # a second registration of the same bucket lists it once
        net.register_retrieval_service(
            "vector-search", endpoint_service_name="com.amazonaws.vpce.us-east-1.vpce-svc-0123456789abcdef0", port=8443
        )
        nlb = elbv2.NetworkLoadBalancer.from_network_load_balancer_attributes(
            stack,
            "Nlb",
            load_balancer_arn="arn:aws:elasticloadbalancing:us-east-1:111111111111:"
            "loadbalancer/net/rerank/0123456789abcdef",
            load_balancer_dns_name="rerank-123.elb.us-east-1.amazonaws.com",
        )
        net.register_retrieval_service("rerank", load_balancer=nlb)
        built.update(net=net, stack=stack)
        return stack

    synthesized = synth_app(build, packs=())
    return synthesized.template(), built["net"], built["stack"]


def test_max_azs_sets_the_number_of_private_subnets(configured: tuple[dict[str, Any], PrivateDataPath, Stack]) -> None:
    template, net, _ = configured
    assert len(resources_of_type(template, "AWS::EC2::Subnet")) == 3
    assert len(net.subnets) == 3


def test_extra_interface_endpoints_by_name_with_private_dns_and_policy(
    configured: tuple[dict[str, Any], PrivateDataPath, Stack],
) -> None:
    template, net, _ = configured
    by_service = {service_suffix(v): v for v in interface_endpoints(template).values()}
    for service in ("bedrock-runtime", "sagemaker.runtime"):
        assert by_service[service]["Properties"]["PrivateDnsEnabled"] is True
        assert by_service[service]["Properties"]["PolicyDocument"] == ACCOUNT_POLICY
    assert list(net.interface_endpoints)[-2:] == ["bedrock-runtime", "sagemaker-runtime"]
    services = [service_suffix(v) for v in interface_endpoints(template).values()]
    assert services.count("sqs") == 1  # a default named again is not duplicated


def test_dynamodb_gateway_endpoint_on_every_route_table_with_account_policy(
    configured: tuple[dict[str, Any], PrivateDataPath, Stack],
) -> None:
    template, _, _ = configured
    endpoint = gateway_endpoint(template, "dynamodb")
    assert {r["Ref"] for r in endpoint["Properties"]["RouteTableIds"]} == set(
        resources_of_type(template, "AWS::EC2::RouteTable")
    )
    assert endpoint["Properties"]["PolicyDocument"] == ACCOUNT_POLICY


def test_buckets_registered_after_construction_appear_in_the_s3_endpoint_policy(
    configured: tuple[dict[str, Any], PrivateDataPath, Stack],
) -> None:
    template, _, _ = configured
    statements = statements_by_sid(gateway_endpoint(template, "s3"))
    read, write = statements["RegisteredBucketsRead"], statements["RegisteredBucketsWrite"]

    def arn(suffix: str) -> dict[str, Any]:
        return {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, f":s3:::{suffix}"]]}

    assert read["Resource"] == [arn("my-models"), arn("my-models/*"), arn("my-results"), arn("my-results/*")]
    assert set(read["Action"]) == {"s3:GetObject", "s3:GetObjectVersion", "s3:ListBucket", "s3:GetBucketLocation"}
    assert write["Resource"] == [arn("my-results"), arn("my-results/*")]
    assert "s3:PutObject" in write["Action"] and "s3:DeleteObject" not in write["Action"]


def test_retrieval_endpoint_service_gets_an_endpoint_without_private_dns_and_a_port_rule(
    configured: tuple[dict[str, Any], PrivateDataPath, Stack],
) -> None:
    template, net, _ = configured
    t = Template.from_json(template)
    t.has_resource_properties(
        "AWS::EC2::VPCEndpoint",
        {
            "ServiceName": "com.amazonaws.vpce.us-east-1.vpce-svc-0123456789abcdef0",
            "PrivateDnsEnabled": False,
            "PolicyDocument": Match.absent(),
        },
    )
    t.has_resource_properties(
        "AWS::EC2::SecurityGroup",
        {
            "SecurityGroupIngress": Match.array_with(
                [Match.object_like({"CidrIp": "10.80.0.0/16", "FromPort": 8443, "ToPort": 8443})]
            )
        },
    )
    assert net.retrieval_services["vector-search"].endpoint is not None


def test_zonal_dns_names_of_an_interface_endpoint_are_dns_entries_one_per_az(
    configured: tuple[dict[str, Any], PrivateDataPath, Stack],
) -> None:
    _, net, stack = configured
    logical_id = stack.resolve(net.interface_endpoints["sqs"].vpc_endpoint_id)["Ref"]
    names = stack.resolve(net.zonal_dns_names("sqs"))
    assert names == [
        {"Fn::Select": [1, {"Fn::Split": [":", {"Fn::Select": [index, {"Fn::GetAtt": [logical_id, "DnsEntries"]}]}]}]}
        for index in (1, 2, 3)
    ]
    assert stack.resolve(net.dns_entries("sqs")) == {"Fn::Join": [",", {"Fn::GetAtt": [logical_id, "DnsEntries"]}]}


def test_zonal_dns_names_of_an_internal_nlb_are_az_prefixed(
    configured: tuple[dict[str, Any], PrivateDataPath, Stack],
) -> None:
    _, net, stack = configured
    assert stack.resolve(net.zonal_dns_names("rerank")) == [
        f"us-east-1{z}.rerank-123.elb.us-east-1.amazonaws.com" for z in "abc"
    ]
    assert net.dns_entries("rerank").split(",")[0] == "rerank-123.elb.us-east-1.amazonaws.com"
    assert net.retrieval_services["rerank"].endpoint is None


def test_allow_bucket_name_accepts_a_token_without_checking_it() -> None:
    stack = Stack(App(), "S")
    net = PrivateDataPath(stack, "Net")
    net.allow_bucket_name(Fn.import_value("DataBucketName"))  # no ConfigurationError: a token is not checked


def test_turning_off_secure_defaults_warns_and_drops_them() -> None:
    stack = Stack(App(), "Loose")
    PrivateDataPath(stack, "Net", max_azs=3, flow_logs=False, restrict_default_security_group=False)
    warnings = Annotations.from_stack(stack).find_warning("*", Match.any_value())
    text = " ".join(str(w.entry.data) for w in warnings)
    assert "flow_logs=False" in text
    assert "restrict_default_security_group=False" in text
    assert "max_azs=3 in an environment-agnostic stack" in text
    template = Template.from_stack(stack)
    template.resource_count_is("AWS::EC2::FlowLog", 0)
    template.resource_count_is("Custom::VpcRestrictDefaultSG", 0)


# ---- Existing VPC -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def existing() -> tuple[dict[str, Any], PrivateDataPath]:
    built: dict[str, PrivateDataPath] = {}

    def build(app: App) -> Stack:
        stack = Stack(app, "Existing", env={"account": "111111111111", "region": "us-east-1"})
        vpc = ec2.Vpc.from_vpc_attributes(
            stack,
            "Vpc",
            vpc_id="vpc-0123456789abcdef0",
            vpc_cidr_block="10.0.0.0/16",
            availability_zones=["us-east-1a", "us-east-1b"],
            public_subnet_ids=["subnet-pub-a", "subnet-pub-b"],
            public_subnet_route_table_ids=["rtb-pub", "rtb-pub"],
            private_subnet_ids=["subnet-priv-a", "subnet-priv-b"],
            private_subnet_route_table_ids=["rtb-priv-a", "rtb-priv-b"],
        )
        built["net"] = PrivateDataPath(stack, "Net", vpc=vpc)
        return stack

    synthesized = synth_app(build, packs=("AwsSolutions",))
    assert synthesized.violation_summary() == []
    return synthesized.template(), built["net"]


def test_existing_vpc_creates_no_vpc_and_takes_its_literal_cidr(
    existing: tuple[dict[str, Any], PrivateDataPath],
) -> None:
    template, net = existing
    Template.from_json(template).resource_count_is("AWS::EC2::VPC", 0)
    Template.from_json(template).resource_count_is("Custom::VpcRestrictDefaultSG", 0)
    assert net.vpc_cidr == "10.0.0.0/16"
    assert net.vpc.vpc_id == "vpc-0123456789abcdef0"


def test_existing_vpc_endpoints_go_into_its_private_subnets_only(
    existing: tuple[dict[str, Any], PrivateDataPath],
) -> None:
    template, net = existing
    for endpoint in interface_endpoints(template).values():
        assert endpoint["Properties"]["SubnetIds"] == ["subnet-priv-a", "subnet-priv-b"]
        assert endpoint["Properties"]["VpcId"] == "vpc-0123456789abcdef0"
    assert gateway_endpoint(template, "s3")["Properties"]["RouteTableIds"] == ["rtb-priv-a", "rtb-priv-b"]
    assert [s.subnet_id for s in net.subnets] == ["subnet-priv-a", "subnet-priv-b"]


def test_existing_vpc_gets_the_443_rule_from_its_cidr_and_flow_logs(
    existing: tuple[dict[str, Any], PrivateDataPath],
) -> None:
    template, _ = existing
    t = Template.from_json(template)
    t.has_resource_properties(
        "AWS::EC2::SecurityGroup",
        {"SecurityGroupIngress": [Match.object_like({"CidrIp": "10.0.0.0/16", "FromPort": 443, "ToPort": 443})]},
    )
    t.has_resource_properties("AWS::EC2::FlowLog", {"ResourceId": "vpc-0123456789abcdef0", "TrafficType": "ALL"})


def test_existing_vpc_with_a_token_cidr_takes_vpc_cidr_from_the_caller() -> None:
    stack = Stack(App(), "Consumer")
    vpc = ec2.Vpc.from_vpc_attributes(
        stack, "Vpc", vpc_id=Fn.import_value("VpcId"), vpc_cidr_block=Fn.import_value("VpcCidr"),
        availability_zones=["us-east-1a"], isolated_subnet_ids=["subnet-1"],
        isolated_subnet_route_table_ids=["rtb-1"])
    net = PrivateDataPath(stack, "Net", vpc=vpc, vpc_cidr="10.1.0.0/16")
    assert net.vpc_cidr == "10.1.0.0/16"
    assert net.subnet_selection.subnet_type == ec2.SubnetType.PRIVATE_ISOLATED


def test_existing_vpc_prefers_isolated_subnets() -> None:
    stack = Stack(App(), "S")
    vpc = ec2.Vpc(
        stack,
        "Vpc",
        ip_addresses=ec2.IpAddresses.cidr("10.2.0.0/16"),
        nat_gateways=1,
        subnet_configuration=[
            ec2.SubnetConfiguration(name="Public", subnet_type=ec2.SubnetType.PUBLIC),
            ec2.SubnetConfiguration(name="App", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
            ec2.SubnetConfiguration(name="Data", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED),
        ],
    )
    net = PrivateDataPath(stack, "Net", vpc=vpc, vpc_cidr="10.2.0.0/16")
    assert {s.subnet_id for s in net.subnets} == {s.subnet_id for s in vpc.isolated_subnets}


# ---- Bad input: one ConfigurationError before synthesis, every problem listed -------------------------------------


def _net(**kwargs: Any) -> PrivateDataPath:
    return PrivateDataPath(Stack(App(), "S"), "Net", **kwargs)


def test_fails_max_azs_below_one() -> None:
    with pytest.raises(ConfigurationError, match=re.escape("max_azs (0) must be a whole number >= 1")):
        _net(max_azs=0)


def test_fails_unknown_service_name_with_close_names() -> None:
    with pytest.raises(
        ConfigurationError,
        match=re.escape(
            "extra_interface_endpoints: unknown service name 'bedrock-runtme'; did you mean 'bedrock-runtime'"
        ),
    ):
        _net(extra_interface_endpoints=["bedrock-runtme"])


def test_fails_extra_interface_endpoints_given_as_one_string() -> None:
    with pytest.raises(
        ConfigurationError,
        match=re.escape("extra_interface_endpoints ('secretsmanager') is one string, which would be read character "
                        "by character: pass a list"),
    ):
        _net(extra_interface_endpoints="secretsmanager")


def test_fails_vpc_with_max_azs_or_cidr() -> None:
    stack = Stack(App(), "S")
    vpc = ec2.Vpc(stack, "Vpc", ip_addresses=ec2.IpAddresses.cidr("10.3.0.0/16"))
    with pytest.raises(ConfigurationError) as raised:
        PrivateDataPath(stack, "Net", vpc=vpc, vpc_cidr="10.3.0.0/16", max_azs=3, cidr="10.9.0.0/16")
    assert raised.value.problems == [
        "max_azs (3) shapes a new VPC and cannot be used with vpc=: drop max_azs, or drop vpc to create a new VPC",
        "cidr ('10.9.0.0/16') shapes a new VPC and cannot be used with vpc=: drop cidr, or drop vpc to create a "
        "new VPC",
    ]


def test_fails_existing_vpc_with_a_token_cidr_and_no_vpc_cidr() -> None:
    stack = Stack(App(), "S")
    vpc = ec2.Vpc.from_vpc_attributes(stack, "Vpc", vpc_id="vpc-1", vpc_cidr_block=Fn.import_value("Cidr"),
                                      availability_zones=["us-east-1a"], isolated_subnet_ids=["subnet-1"])
    with pytest.raises(
        ConfigurationError, match=re.escape("vpc_cidr (None) is required when the vpc's CIDR is a token")
    ):
        PrivateDataPath(stack, "Net", vpc=vpc)


def test_fails_vpc_cidr_that_differs_from_the_vpcs_literal_cidr() -> None:
    stack = Stack(App(), "S")
    vpc = ec2.Vpc.from_vpc_attributes(
        stack,
        "Vpc",
        vpc_id="vpc-1",
        vpc_cidr_block="10.0.0.0/16",
        availability_zones=["us-east-1a"],
        private_subnet_ids=["subnet-1"],
    )
    with pytest.raises(
        ConfigurationError, match=re.escape("vpc_cidr ('10.7.0.0/16') differs from the VPC's own CIDR ('10.0.0.0/16')")
    ):
        PrivateDataPath(stack, "Net", vpc=vpc, vpc_cidr="10.7.0.0/16")


def test_fails_existing_vpc_with_only_public_subnets() -> None:
    stack = Stack(App(), "S")
    vpc = ec2.Vpc.from_vpc_attributes(
        stack,
        "Vpc",
        vpc_id="vpc-1",
        vpc_cidr_block="10.0.0.0/16",
        availability_zones=["us-east-1a"],
        public_subnet_ids=["subnet-1"],
    )
    with pytest.raises(ConfigurationError, match=re.escape("vpc has no private or isolated subnets")):
        PrivateDataPath(stack, "Net", vpc=vpc)


def test_fails_vpc_cidr_without_vpc() -> None:
    with pytest.raises(
        ConfigurationError,
        match=re.escape("vpc_cidr ('10.1.0.0/16') describes an existing vpc= and is not used for a new VPC: use cidr="),
    ):
        _net(vpc_cidr="10.1.0.0/16")


def test_fails_cidr_that_is_not_a_network_address() -> None:
    with pytest.raises(ConfigurationError, match=re.escape("cidr ('10.80.0.1/16') is not an IPv4 network CIDR")):
        _net(cidr="10.80.0.1/16")


def test_fails_cidr_prefix_outside_16_to_28() -> None:
    with pytest.raises(
        ConfigurationError, match=re.escape("cidr ('10.0.0.0/8') has prefix /8; a VPC CIDR must be /16 to /28")
    ):
        _net(cidr="10.0.0.0/8")


def test_fails_cidr_too_small_for_max_azs() -> None:
    with pytest.raises(
        ConfigurationError, match=re.escape("cidr (10.80.0.0/20) holds 1 /20 subnet(s), fewer than max_azs (2)")
    ):
        _net(cidr="10.80.0.0/20")


def test_fails_with_every_problem_listed_at_once() -> None:
    with pytest.raises(ConfigurationError, match=re.escape("PrivateDataPath: 2 problem(s)")) as raised:
        _net(max_azs=0, extra_interface_endpoints=["nope-nothing"])
    assert [p.split(" ")[0] for p in raised.value.problems] == ["max_azs", "extra_interface_endpoints:"]


def test_fails_allow_bucket_name_given_an_arn() -> None:
    net = _net()
    with pytest.raises(
        ConfigurationError,
        match=re.escape("allow_bucket_name: bucket_name ('arn:aws:s3:::my-models') is not an S3 bucket name"),
    ):
        net.allow_bucket_name("arn:aws:s3:::my-models")


def test_fails_register_retrieval_service_with_neither_or_both_targets() -> None:
    net = _net()
    with pytest.raises(
        ConfigurationError, match=re.escape("give exactly one of endpoint_service_name and load_balancer (got neither)")
    ):
        net.register_retrieval_service("search")


def test_fails_register_retrieval_service_with_a_malformed_service_name() -> None:
    net = _net()
    with pytest.raises(
        ConfigurationError,
        match=re.escape(
            "endpoint_service_name ('vpce-svc-123') must look like 'com.amazonaws.vpce.<region>.vpce-svc-<id>'"
        ),
    ):
        net.register_retrieval_service("search", endpoint_service_name="vpce-svc-123")


def test_fails_zonal_dns_names_of_an_unknown_name() -> None:
    net = _net()
    with pytest.raises(
        ConfigurationError,
        match=re.escape("name ('sqs-fips') is not an interface endpoint or retrieval service of this network; known: "),
    ):
        net.zonal_dns_names("sqs-fips")
