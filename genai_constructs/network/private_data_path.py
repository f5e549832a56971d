"""PrivateDataPath: a VPC whose data path never touches a NAT gateway.

S3 traffic through a NAT gateway pays per GB processed and shares one throughput choke point per AZ; an S3
gateway endpoint (free) plus interface endpoints for the AWS APIs the fleets call remove both, and endpoint
policies bound what instances can reach. See docs/private-data-path.md for the defaults and the cost trade.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass

from aws_cdk import Annotations, Aws, Fn, Stack, Token
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from constructs import Construct

from genai_constructs.errors import ConfigurationError
from genai_constructs.planner.deployment import DEFAULT_AVAILABILITY_ZONES
from genai_constructs.planner.deployment import DEFAULT_INTERFACE_ENDPOINTS as DEPLOYMENT_INTERFACE_ENDPOINTS

_NAME = "PrivateDataPath"

# ---- Defaults, each with its reason -------------------------------------------------------------------------------
# Two AZs survive the loss of one zone; each further AZ adds one ENI-hour per interface endpoint (see the docs).
# The planner's cost counts the same figure (planner/deployment.py).
DEFAULT_MAX_AZS = DEFAULT_AVAILABILITY_ZONES
# A /16 of RFC 1918 space unlikely to collide with the 10.0.0.0/16 most examples and peered VPCs use.
DEFAULT_VPC_CIDR = "10.80.0.0/16"
# /20 = 4,091 usable addresses per AZ: room for large GPU fleets and endpoint ENIs, and leaves most of the /16 free
# for subnet groups added later.
DEFAULT_SUBNET_CIDR_MASK = 20
# A year of flow logs: the cdk-nag NIST 800-53 R5 and HIPAA packs ask for a set retention; a year covers audits.
DEFAULT_FLOW_LOG_RETENTION = logs.RetentionDays.ONE_YEAR
# ALL rather than REJECT: accepted flows are what show which AWS APIs the fleet reaches and through which path.
DEFAULT_FLOW_LOG_TRAFFIC = ec2.FlowLogTrafficType.ALL
# Interface endpoints are HTTPS-only (AWS APIs); the endpoint security group admits nothing else.
ENDPOINT_PORT = 443

#: Interface endpoints every PrivateDataPath gets (short name -> the reason it is there): what the inference and
#: embedding fleets call. Kept in the planner's deployment facts so the plan's cost counts the same endpoints.
DEFAULT_INTERFACE_ENDPOINTS = DEPLOYMENT_INTERFACE_ENDPOINTS

#: Optional interface endpoints by name (``extra_interface_endpoints=[...]``): short name -> AWS service name suffix.
KNOWN_EXTRA_INTERFACE_ENDPOINTS: dict[str, str] = {
    "bedrock": "bedrock",
    "bedrock-runtime": "bedrock-runtime",
    "bedrock-agent": "bedrock-agent",
    "bedrock-agent-runtime": "bedrock-agent-runtime",
    "sagemaker-runtime": "sagemaker.runtime",
    "sagemaker-api": "sagemaker.api",
    "secretsmanager": "secretsmanager",
    "sns": "sns",
    "events": "events",
    "states": "states",
    "lambda": "lambda",
    "xray": "xray",
    "ec2": "ec2",
    "autoscaling": "autoscaling",
    "application-autoscaling": "application-autoscaling",
    "elasticloadbalancing": "elasticloadbalancing",
    "execute-api": "execute-api",
    "kinesis-streams": "kinesis-streams",
    "firehose": "kinesis-firehose",
    "dynamodb": "dynamodb",
    "elasticfilesystem": "elasticfilesystem",
    "ebs": "ebs",
    "cloudformation": "cloudformation",
    "aps-workspaces": "aps-workspaces",
}

# AWS-owned S3 buckets instances in a NAT-less VPC need through the S3 gateway endpoint, each with its reason.
# Source: the "Amazon Linux repositories" and "ECR interface VPC endpoints" pages of the AWS docs (checked 2026-11).
_AWS_OWNED_BUCKETS: tuple[tuple[str, str, str], ...] = (
    # (statement id, bucket name pattern with {region}, reason)
    (
        "AmazonLinux2023Repositories",
        "al2023-repos-{region}-de612dc2",
        "dnf on Amazon Linux 2023 (the DLAMI base) reads its package repositories from this bucket",
    ),
    (
        "AmazonLinux2Repositories",
        "amazonlinux-2-repos-{region}",
        "yum on Amazon Linux 2 based AMIs (older Neuron DLAMIs) reads its repositories from this bucket",
    ),
    (
        "EcrImageLayers",
        "prod-{region}-starport-layer-bucket",
        "ECR serves image layers from this bucket through pre-signed URLs; image pulls fail without it",
    ),
    ("SsmAgentUpdates", "amazon-ssm-{region}", "SSM Agent updates (AWS-UpdateSSMAgent) download from this bucket"),
    ("SsmAgentDocuments", "aws-ssm-{region}", "SSM Agent reads AWS-owned documents and plugins from this bucket"),
)

_READ_ACTIONS = ("s3:GetObject", "s3:GetObjectVersion", "s3:ListBucket", "s3:GetBucketLocation")
_WRITE_ACTIONS = (
    "s3:PutObject",
    "s3:AbortMultipartUpload",
    "s3:ListMultipartUploadParts",
    "s3:ListBucketMultipartUploads",
)

_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_SERVICE_NAME = re.compile(r"^com\.amazonaws\.vpce\.[a-z0-9-]+\.vpce-svc-[0-9a-f]+$")
_RETRIEVAL_NAME = re.compile(r"^[a-z][a-z0-9-]{0,39}$")


@dataclass(frozen=True)
class RetrievalService:
    """A retrieval service the user registered: its zonal DNS names, and the endpoint when one was created."""

    name: str
    zonal_dns_names: list[str]
    dns_entries: str
    endpoint: ec2.InterfaceVpcEndpoint | None


def _construct_id(short_name: str) -> str:
    return "".join(part.capitalize() for part in re.split(r"[.\-_]", short_name)) + "Endpoint"


def _select(vpc: ec2.IVpc, selection: ec2.SubnetSelection, **overrides: object) -> ec2.SelectedSubnets:
    # jsii takes a struct's fields as keyword arguments; SubnetSelection keeps them in _values.
    return vpc.select_subnets(**{**selection._values, **overrides})


def _check_cidr(argument: str, value: object, problems: list[str]) -> ipaddress.IPv4Network | None:
    if not isinstance(value, str):
        problems.append(f"{argument} ({value!r}) must be an IPv4 CIDR string such as {DEFAULT_VPC_CIDR!r}")
        return None
    try:
        network = ipaddress.IPv4Network(value, strict=True)
    except ValueError as error:
        problems.append(
            f"{argument} ({value!r}) is not an IPv4 network CIDR ({error}): give one such as {DEFAULT_VPC_CIDR!r}"
        )
        return None
    if not 16 <= network.prefixlen <= 28:
        problems.append(
            f"{argument} ({value!r}) has prefix /{network.prefixlen}; a VPC CIDR must be /16 to /28: "
            f"pick a prefix in that range"
        )
        return None
    return network


class PrivateDataPath(Construct):
    """A VPC whose data path never touches a NAT gateway: private subnets, gateway and interface endpoints.

    ``PrivateDataPath(stack, "Net")`` alone gives a network both fleets run in: PRIVATE_ISOLATED subnets across
    ``max_azs`` AZs (no internet gateway, no NAT gateway, no public subnet), an S3 gateway endpoint on every route
    table, interface endpoints with private DNS for the AWS APIs the fleets call, one security group admitting 443
    from the VPC CIDR, endpoint policies on every endpoint, and flow logs to a KMS-encrypted log group.

    :param vpc: an existing VPC to add the endpoints to (its private subnets). Default: a new VPC.
    :param max_azs: AZs of the new VPC. Default: ``DEFAULT_MAX_AZS``. Not allowed with ``vpc``.
    :param cidr: CIDR of the new VPC. Default: ``DEFAULT_VPC_CIDR``. Not allowed with ``vpc``.
    :param subnet_cidr_mask: prefix length of each private subnet of the new VPC. Default:
        ``DEFAULT_SUBNET_CIDR_MASK``. Not allowed with ``vpc``.
    :param vpc_cidr: the CIDR of an existing ``vpc`` when its ``vpc_cidr_block`` is a token (a VPC from another
        stack); security group rules and cdk-nag need a literal. Only with ``vpc``.
    :param vpc_subnets: the subnets of an existing ``vpc`` to use. Default: its isolated subnets, else its private
        subnets. Only with ``vpc``.
    :param extra_interface_endpoints: more interface endpoints by short name (``KNOWN_EXTRA_INTERFACE_ENDPOINTS``),
        e.g. ``["bedrock-runtime", "secretsmanager"]``. Default: none.
    :param dynamodb_gateway_endpoint: add a DynamoDB gateway endpoint (free). Default: False.
    :param flow_logs: VPC flow logs to an encrypted log group. Default: True; turning them off warns.
    :param flow_log_retention: Default: ``DEFAULT_FLOW_LOG_RETENTION``.
    :param restrict_default_security_group: strip the rules of the VPC's default security group (a CDK custom
        resource). Default: True for a new VPC (the NIST 800-53 and HIPAA packs require it); ignored with ``vpc``.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        vpc: ec2.IVpc | None = None,
        max_azs: int | None = None,
        cidr: str | None = None,
        subnet_cidr_mask: int | None = None,
        vpc_cidr: str | None = None,
        vpc_subnets: ec2.SubnetSelection | None = None,
        extra_interface_endpoints: Sequence[str] = (),
        dynamodb_gateway_endpoint: bool = False,
        flow_logs: bool = True,
        flow_log_retention: logs.RetentionDays = DEFAULT_FLOW_LOG_RETENTION,
        restrict_default_security_group: bool = True,
    ) -> None:
        extra = _validate(
            vpc=vpc,
            max_azs=max_azs,
            cidr=cidr,
            subnet_cidr_mask=subnet_cidr_mask,
            vpc_cidr=vpc_cidr,
            vpc_subnets=vpc_subnets,
            extra_interface_endpoints=extra_interface_endpoints,
        )
        super().__init__(scope, id)

        if vpc is None:
            self.vpc_cidr: str = cidr or DEFAULT_VPC_CIDR
            azs = max_azs or DEFAULT_MAX_AZS
            if azs > 2 and Token.is_unresolved(Stack.of(self).region):
                Annotations.of(self).add_warning_v2(
                    "genai-constructs:PrivateDataPathEnvAgnosticAzs",
                    f"max_azs={azs} in an environment-agnostic stack: CDK can only use 2 AZs there. "
                    "Give the stack an env (account and region) to get more.",
                )
            new_vpc = ec2.Vpc(
                self,
                "Vpc",
                ip_addresses=ec2.IpAddresses.cidr(self.vpc_cidr),
                max_azs=azs,
                nat_gateways=0,
                create_internet_gateway=False,
                restrict_default_security_group=restrict_default_security_group,
                subnet_configuration=[
                    ec2.SubnetConfiguration(
                        name="Private",
                        subnet_type=ec2.SubnetType.PRIVATE_ISOLATED,
                        cidr_mask=subnet_cidr_mask or DEFAULT_SUBNET_CIDR_MASK,
                    )
                ],
            )
            if not restrict_default_security_group:
                Annotations.of(self).add_warning_v2(
                    "genai-constructs:PrivateDataPathDefaultSecurityGroupOpen",
                    "restrict_default_security_group=False leaves the default security group's rules in place.",
                )
            self.vpc: ec2.IVpc = new_vpc
            self.subnet_selection = ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)
        else:
            self.vpc = vpc
            self.vpc_cidr = vpc_cidr or vpc.vpc_cidr_block
            if vpc_subnets is not None:
                self.subnet_selection = vpc_subnets
            elif vpc.isolated_subnets:
                self.subnet_selection = ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)
            else:
                self.subnet_selection = ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)

        self.subnets: list[ec2.ISubnet] = list(_select(self.vpc, self.subnet_selection).subnets)
        self._zones: list[str] = [
            s.availability_zone for s in _select(self.vpc, self.subnet_selection, one_per_az=True).subnets
        ]

        self.endpoint_security_group = ec2.SecurityGroup(
            self,
            "EndpointSecurityGroup",
            vpc=self.vpc,
            allow_all_outbound=False,
            description=f"Interface VPC endpoints: HTTPS ({ENDPOINT_PORT}) from the VPC CIDR only",
        )
        self.endpoint_security_group.add_ingress_rule(
            ec2.Peer.ipv4(self.vpc_cidr), ec2.Port.tcp(ENDPOINT_PORT), "HTTPS to the endpoints from inside the VPC"
        )

        # S3 gateway endpoint: on every route table of the chosen subnets. Its policy grows as fleets call
        # allow_bucket: the endpoint renders its PolicyDocument lazily, so later statements appear at synth.
        self.s3_gateway_endpoint = ec2.GatewayVpcEndpoint(
            self,
            "S3GatewayEndpoint",
            vpc=self.vpc,
            service=ec2.GatewayVpcEndpointAwsService.S3,
            subnets=[self.subnet_selection],
        )
        for sid, pattern, _reason in _AWS_OWNED_BUCKETS:
            bucket = pattern.format(region=Aws.REGION)
            self.s3_gateway_endpoint.add_to_policy(
                iam.PolicyStatement(
                    sid=sid,
                    principals=[iam.AnyPrincipal()],
                    actions=["s3:GetObject"],
                    resources=[f"arn:{Aws.PARTITION}:s3:::{bucket}/*"],
                )
            )
        self._read_statement: iam.PolicyStatement | None = None
        self._write_statement: iam.PolicyStatement | None = None
        self._allowed: dict[str, bool] = {}

        # One statement object serves every endpoint's policy: it is never changed after this, and each endpoint
        # renders its own copy at synth (one construct call instead of three per endpoint).
        this_account = self._this_account_statement()
        self.dynamodb_gateway_endpoint: ec2.GatewayVpcEndpoint | None = None
        if dynamodb_gateway_endpoint:
            self.dynamodb_gateway_endpoint = ec2.GatewayVpcEndpoint(
                self,
                "DynamoDbGatewayEndpoint",
                vpc=self.vpc,
                service=ec2.GatewayVpcEndpointAwsService.DYNAMODB,
                subnets=[self.subnet_selection],
            )
            self.dynamodb_gateway_endpoint.add_to_policy(this_account)

        self.interface_endpoints: dict[str, ec2.InterfaceVpcEndpoint] = {}
        for short_name in [*DEFAULT_INTERFACE_ENDPOINTS, *extra]:
            service = KNOWN_EXTRA_INTERFACE_ENDPOINTS.get(short_name, short_name)
            endpoint = ec2.InterfaceVpcEndpoint(
                self,
                _construct_id(short_name),
                vpc=self.vpc,
                service=ec2.InterfaceVpcEndpointAwsService(service),
                subnets=self.subnet_selection,
                security_groups=[self.endpoint_security_group],
                private_dns_enabled=True,
                open=False,
            )
            endpoint.add_to_policy(this_account)
            self.interface_endpoints[short_name] = endpoint

        self.retrieval_services: dict[str, RetrievalService] = {}

        self.flow_log: ec2.FlowLog | None = None
        self.flow_log_group: logs.LogGroup | None = None
        self.flow_log_key: kms.Key | None = None
        if flow_logs:
            self._add_flow_logs(flow_log_retention)
        else:
            Annotations.of(self).add_warning_v2(
                "genai-constructs:PrivateDataPathNoFlowLogs",
                "flow_logs=False: no record of which flows left the instances; keep them on unless the VPC "
                "already has flow logs.",
            )

    # ---- Buckets ----------------------------------------------------------------------------------------------------

    def allow_bucket(self, bucket: s3.IBucket, *, write: bool = False) -> None:
        """Let instances reach ``bucket`` through the S3 gateway endpoint.

        Adds to the endpoint policy: ``s3:GetObject``, ``s3:GetObjectVersion``, ``s3:ListBucket``,
        ``s3:GetBucketLocation``; with ``write=True`` also ``s3:PutObject``, ``s3:AbortMultipartUpload``,
        ``s3:ListMultipartUploadParts``, ``s3:ListBucketMultipartUploads``. The instance role still needs its own
        grant: the endpoint policy only bounds what can pass through the endpoint.
        """
        self._allow(bucket.bucket_arn, write=write)

    def allow_bucket_name(self, bucket_name: str, *, write: bool = False) -> None:
        """Same as :meth:`allow_bucket` for a bucket known only by its name."""
        if not Token.is_unresolved(bucket_name) and not _BUCKET_NAME.match(bucket_name or ""):
            raise ConfigurationError(
                _NAME,
                [
                    f"allow_bucket_name: bucket_name ({bucket_name!r}) is not an S3 bucket name (3-63 characters of "
                    "lower-case letters, digits, '.' and '-', starting and ending with a letter or digit): pass the "
                    "bucket's name, not its ARN or URL"
                ],
            )
        self._allow(f"arn:{Aws.PARTITION}:s3:::{bucket_name}", write=write)

    def _allow(self, bucket_arn: str, *, write: bool) -> None:
        if self._read_statement is None:
            self._read_statement = iam.PolicyStatement(
                sid="RegisteredBucketsRead", principals=[iam.AnyPrincipal()], actions=list(_READ_ACTIONS)
            )
            self.s3_gateway_endpoint.add_to_policy(self._read_statement)
        if bucket_arn not in self._allowed:
            self._read_statement.add_resources(bucket_arn, f"{bucket_arn}/*")
            self._allowed[bucket_arn] = False
        if write and not self._allowed[bucket_arn]:
            if self._write_statement is None:
                self._write_statement = iam.PolicyStatement(
                    sid="RegisteredBucketsWrite", principals=[iam.AnyPrincipal()], actions=list(_WRITE_ACTIONS)
                )
                self.s3_gateway_endpoint.add_to_policy(self._write_statement)
            self._write_statement.add_resources(bucket_arn, f"{bucket_arn}/*")
            self._allowed[bucket_arn] = True

    # ---- Zonal names ------------------------------------------------------------------------------------------------

    def dns_entries(self, name: str) -> str:
        """Every DNS name of an interface endpoint or retrieval service, as one comma-separated token.

        For a VPC endpoint this is CloudFormation's ``DnsEntries`` joined: ``"hostedzone:dnsname"`` items, the
        regional name and one zonal name per AZ (the zonal ones carry their AZ, e.g. ``vpce-0a1-b2-us-east-1a.sqs...``).
        Pass it to the instance (user data, an environment variable) and give it to
        :class:`genai_constructs.runtime.zonal_client.ZonalEndpoints`, which groups the names by AZ.
        """
        if name in self.retrieval_services:
            return self.retrieval_services[name].dns_entries
        return Fn.join(",", self._endpoint(name).vpc_endpoint_dns_entries)

    def zonal_dns_names(self, name: str) -> list[str]:
        """The zonal DNS names of an interface endpoint or retrieval service, one per AZ, as tokens.

        VPC endpoints: CloudFormation lists the regional name first, then one zonal name per subnet; these are
        items 1..N of ``DnsEntries`` with the hosted zone stripped. The AZ is part of each name, which is what the
        runtime client keys on, so the order among them does not matter. Internal NLBs: ``<az>.<dns name>``.
        """
        if name in self.retrieval_services:
            return list(self.retrieval_services[name].zonal_dns_names)
        return self._zonal_names_of(self._endpoint(name))

    def register_retrieval_service(
        self,
        name: str,
        *,
        endpoint_service_name: str | None = None,
        load_balancer: elbv2.INetworkLoadBalancer | None = None,
        port: int = ENDPOINT_PORT,
    ) -> RetrievalService:
        """Register the retrieval tier so its zonal DNS names are exposed like the AWS endpoints'.

        Give exactly one of ``endpoint_service_name`` (a VPC endpoint service, ``com.amazonaws.vpce.<region>.
        vpce-svc-...``: an interface endpoint is created in the private subnets, without private DNS, and the
        endpoint security group admits ``port`` from the VPC CIDR; endpoint services take no endpoint policy) or
        ``load_balancer`` (an internal NLB reachable in this VPC: its zonal names are ``<az>.<dns name>``, with
        cross-zone load balancing off a zonal name reaches only that zone's targets).
        """
        problems: list[str] = []
        if not isinstance(name, str) or not _RETRIEVAL_NAME.match(name):
            problems.append(
                f"register_retrieval_service: name ({name!r}) must be 1-40 lower-case letters, digits "
                "or '-', starting with a letter: e.g. 'vector-search'"
            )
        elif name in self.retrieval_services or name in self.interface_endpoints:
            problems.append(f"register_retrieval_service: name ({name!r}) is already registered: pick another name")
        if (endpoint_service_name is None) == (load_balancer is None):
            problems.append(
                "register_retrieval_service: give exactly one of endpoint_service_name and "
                f"load_balancer (got {'both' if load_balancer is not None else 'neither'})"
            )
        if (
            endpoint_service_name is not None
            and not Token.is_unresolved(endpoint_service_name)
            and not _SERVICE_NAME.match(endpoint_service_name)
        ):
            problems.append(
                f"register_retrieval_service: endpoint_service_name ({endpoint_service_name!r}) must "
                "look like 'com.amazonaws.vpce.<region>.vpce-svc-<id>': copy the service name of the "
                "endpoint service"
            )
        if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
            problems.append(f"register_retrieval_service: port ({port!r}) must be an integer 1-65535")
        if problems:
            raise ConfigurationError(_NAME, problems)

        if endpoint_service_name is not None:
            endpoint = ec2.InterfaceVpcEndpoint(
                self,
                "Retrieval" + _construct_id(name),
                vpc=self.vpc,
                service=ec2.InterfaceVpcEndpointService(endpoint_service_name, port),
                subnets=self.subnet_selection,
                security_groups=[self.endpoint_security_group],
                private_dns_enabled=False,
                open=False,
            )
            if port != ENDPOINT_PORT:
                self.endpoint_security_group.add_ingress_rule(
                    ec2.Peer.ipv4(self.vpc_cidr), ec2.Port.tcp(port), f"retrieval service {name} from the VPC"
                )
            service = RetrievalService(
                name=name,
                zonal_dns_names=self._zonal_names_of(endpoint),
                dns_entries=Fn.join(",", endpoint.vpc_endpoint_dns_entries),
                endpoint=endpoint,
            )
        else:
            assert load_balancer is not None
            dns = load_balancer.load_balancer_dns_name
            zonal = [f"{zone}.{dns}" for zone in self._zones]
            service = RetrievalService(
                name=name, zonal_dns_names=zonal, dns_entries=",".join([dns, *zonal]), endpoint=None
            )
        self.retrieval_services[name] = service
        return service

    def _endpoint(self, name: str) -> ec2.InterfaceVpcEndpoint:
        try:
            return self.interface_endpoints[name]
        except KeyError:
            known = sorted([*self.interface_endpoints, *self.retrieval_services])
            raise ConfigurationError(
                _NAME,
                [
                    f"name ({name!r}) is not an interface endpoint or retrieval service of this network; known: "
                    f"{', '.join(known)}"
                ],
            ) from None

    def _zonal_names_of(self, endpoint: ec2.InterfaceVpcEndpoint) -> list[str]:
        return [
            Fn.select(1, Fn.split(":", Fn.select(index, endpoint.vpc_endpoint_dns_entries)))
            for index in range(1, len(self._zones) + 1)
        ]

    # ---- Internals --------------------------------------------------------------------------------------------------

    @staticmethod
    def _this_account_statement() -> iam.PolicyStatement:
        # Any action, but only by principals of this account: credentials from elsewhere cannot use the endpoint
        # to reach (or exfiltrate to) other accounts' resources through this VPC's private path.
        return iam.PolicyStatement(
            sid="PrincipalsOfThisAccount",
            principals=[iam.AnyPrincipal()],
            actions=["*"],
            resources=["*"],
            conditions={"StringEquals": {"aws:PrincipalAccount": Aws.ACCOUNT_ID}},
        )

    def _add_flow_logs(self, retention: logs.RetentionDays) -> None:
        key = kms.Key(
            self,
            "FlowLogKey",
            enable_key_rotation=True,
            description="Encrypts the VPC flow log group of a PrivateDataPath",
        )
        # CloudWatch Logs encrypts with the key on the log group's behalf; the condition keeps it to log groups
        # of this account and region (the group's own ARN would make a circular reference).
        key.add_to_resource_policy(
            iam.PolicyStatement(
                principals=[iam.ServicePrincipal(f"logs.{Aws.REGION}.amazonaws.com")],
                actions=["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"],
                resources=["*"],
                conditions={
                    "ArnLike": {
                        "kms:EncryptionContext:aws:logs:arn": f"arn:{Aws.PARTITION}:logs:{Aws.REGION}:{Aws.ACCOUNT_ID}:log-group:*"
                    }
                },
            )
        )
        group = logs.LogGroup(self, "FlowLogGroup", encryption_key=key, retention=retention)

        role = iam.Role(
            self,
            "FlowLogRole",
            assumed_by=iam.ServicePrincipal(
                "vpc-flow-logs.amazonaws.com", conditions={"StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID}}
            ),
            description="VPC flow logs deliver to the PrivateDataPath flow log group",
        )
        delivery_policy = iam.ManagedPolicy(
            self,
            "FlowLogDeliveryPolicy",
            roles=[role],
            description="Write VPC flow log records to the PrivateDataPath flow log group only",
            statements=[
                iam.PolicyStatement(
                    actions=["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
                    resources=[group.log_group_arn],
                )
            ],
        )
        self.flow_log = ec2.FlowLog(
            self,
            "FlowLog",
            resource_type=ec2.FlowLogResourceType.from_vpc(self.vpc),
            # without_policy_updates: the destination would otherwise add an inline policy to the role;
            # the customer-managed policy above carries the same grants.
            destination=ec2.FlowLogDestination.to_cloud_watch_logs(group, role.without_policy_updates()),
            traffic_type=DEFAULT_FLOW_LOG_TRAFFIC,
        )
        # Deliveries start at creation; without the policy in place they would fail until it attaches.
        self.flow_log.node.add_dependency(delivery_policy)
        self.flow_log_group = group
        self.flow_log_key = key


def _validate(
    *,
    vpc: ec2.IVpc | None,
    max_azs: int | None,
    cidr: str | None,
    subnet_cidr_mask: int | None,
    vpc_cidr: str | None,
    vpc_subnets: ec2.SubnetSelection | None,
    extra_interface_endpoints: Sequence[str],
) -> list[str]:
    """Check every argument, gather every problem, raise once. Returns the extra endpoint names, deduplicated."""
    problems: list[str] = []
    if max_azs is not None and (not isinstance(max_azs, int) or isinstance(max_azs, bool) or max_azs < 1):
        problems.append(
            f"max_azs ({max_azs!r}) must be an integer >= 1: use {DEFAULT_MAX_AZS} (the default) "
            "for a network that survives losing one zone"
        )
    if vpc is not None:
        for argument, value in (("max_azs", max_azs), ("cidr", cidr), ("subnet_cidr_mask", subnet_cidr_mask)):
            if value is not None:
                problems.append(
                    f"{argument} ({value!r}) shapes a new VPC and cannot be used with vpc=: drop "
                    f"{argument}, or drop vpc to create a new VPC"
                )
        if vpc_cidr is not None:
            network = _check_cidr("vpc_cidr", vpc_cidr, problems)
            actual = vpc.vpc_cidr_block
            if network is not None and not Token.is_unresolved(actual) and actual != vpc_cidr:
                problems.append(
                    f"vpc_cidr ({vpc_cidr!r}) differs from the VPC's own CIDR ({actual!r}): drop "
                    "vpc_cidr or make it match"
                )
        elif Token.is_unresolved(vpc.vpc_cidr_block):
            problems.append(
                "vpc_cidr (None) is required when the vpc's CIDR is a token (a VPC from another stack): "
                "pass its literal CIDR, e.g. vpc_cidr='10.0.0.0/16', for the 443 rule and cdk-nag"
            )
        if vpc_subnets is None and not vpc.isolated_subnets and not vpc.private_subnets:
            problems.append(
                "vpc has no private or isolated subnets: endpoints never go in public subnets; add "
                "private subnets or pass vpc_subnets"
            )
    else:
        if vpc_cidr is not None:
            problems.append(
                f"vpc_cidr ({vpc_cidr!r}) describes an existing vpc= and is not used for a new VPC: "
                "use cidr= to set the new VPC's CIDR"
            )
        if vpc_subnets is not None:
            problems.append("vpc_subnets selects subnets of an existing vpc= and is not used for a new VPC: drop it")
        network = _check_cidr("cidr", cidr, problems) if cidr is not None else ipaddress.IPv4Network(DEFAULT_VPC_CIDR)
        mask = subnet_cidr_mask if subnet_cidr_mask is not None else DEFAULT_SUBNET_CIDR_MASK
        if not isinstance(mask, int) or isinstance(mask, bool) or not 16 <= mask <= 28:
            problems.append(f"subnet_cidr_mask ({mask!r}) must be an integer 16-28 (a subnet is /16 to /28)")
        elif network is not None:
            azs = max_azs if isinstance(max_azs, int) and max_azs >= 1 else DEFAULT_MAX_AZS
            if mask < network.prefixlen:
                problems.append(
                    f"subnet_cidr_mask ({mask}) is wider than the VPC CIDR ({network}): use a mask "
                    f">= {network.prefixlen}"
                )
            elif 2 ** (mask - network.prefixlen) < azs:
                problems.append(
                    f"cidr ({network}) holds {2 ** (mask - network.prefixlen)} /{mask} subnet(s), "
                    f"fewer than max_azs ({azs}): use a larger cidr or a longer subnet_cidr_mask"
                )

    if isinstance(extra_interface_endpoints, str):
        problems.append(
            f"extra_interface_endpoints ({extra_interface_endpoints!r}) must be a list of names, "
            f"not one string: write [{extra_interface_endpoints!r}]"
        )
        extra_interface_endpoints = ()
    extra: list[str] = []
    for name in extra_interface_endpoints:
        if name in DEFAULT_INTERFACE_ENDPOINTS or name in extra:
            continue
        if name in KNOWN_EXTRA_INTERFACE_ENDPOINTS:
            extra.append(name)
            continue
        known = [*DEFAULT_INTERFACE_ENDPOINTS, *KNOWN_EXTRA_INTERFACE_ENDPOINTS]
        close = difflib.get_close_matches(str(name), known, n=3, cutoff=0.5)
        hint = (
            f"did you mean {', '.join(repr(c) for c in close)}?"
            if close
            else f"known: {', '.join(sorted(KNOWN_EXTRA_INTERFACE_ENDPOINTS))}"
        )
        problems.append(f"extra_interface_endpoints: unknown service name {name!r}; {hint}")
    if problems:
        raise ConfigurationError(_NAME, problems)
    return extra
