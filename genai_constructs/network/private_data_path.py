"""PrivateDataPath: a VPC whose data path never touches a NAT gateway.

S3 traffic through a NAT gateway pays per GB processed and shares one throughput choke point per AZ; an S3
gateway endpoint (free) plus interface endpoints for the AWS APIs the fleets call remove both, and endpoint
policies bound what instances can reach. See docs/private-data-path.md for the defaults and the cost trade.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
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
from genai_constructs.network import _checks as checks
from genai_constructs.planner.deployment import DEFAULT_AVAILABILITY_ZONES
from genai_constructs.planner.deployment import DEFAULT_INTERFACE_ENDPOINTS as DEPLOYMENT_INTERFACE_ENDPOINTS
from genai_constructs.workload import s3_bucket_name_problem

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

INTERNET_ROUTES_WARNING_ID = "genai-constructs:PrivateDataPathInternetRoutes"
"""The warning on a VPC whose chosen subnets route to a NAT gateway, internet gateway or NAT instance."""
ROUTES_UNKNOWN_WARNING_ID = "genai-constructs:PrivateDataPathRoutesUnknown"
"""The warning on an imported VPC whose chosen subnets are PRIVATE_WITH_EGRESS (routes not readable)."""
EGRESS_DESCRIPTIONS: dict[bool | None, str] = {
    False: "HTTPS to the VPC endpoints and the S3 gateway endpoint (the VPC has no route to the internet)",
    True: "HTTPS to the VPC endpoints and the S3 gateway endpoint; the subnets also route to the internet (NAT)",
    None: "HTTPS to the VPC endpoints and the S3 gateway endpoint (the imported VPC's routes are not checked)",
}
"""The fleets' instance egress rule description by ``PrivateDataPath.internet_routes``: it claims no route to the
internet only when none was found."""

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
    :param refuse_internet_routes: with ``vpc``, make a route from the chosen subnets to a NAT gateway, an internet
        gateway or a NAT instance an error instead of a warning (``INTERNET_ROUTES_WARNING_ID``); with an imported VPC
        whose routes cannot be read, refuse its PRIVATE_WITH_EGRESS subnets. Default: False. See
        docs/bring-your-own-vpc.md.

    Bring your own VPC: an ``ec2.Vpc`` built in the same app gives its literal CIDR (its ``CfnVPC``'s
    ``CidrBlock``), so ``vpc_cidr`` is needed only for an imported VPC whose CIDR is a token or an IPAM-allocated
    one. The routes of the chosen subnets are read from the construct tree when the VPC is an ``ec2.Vpc``
    (routes added after this construct is built are not seen); ``internet_routes`` says what was found:
    False (none), True (a NAT gateway, internet gateway or NAT instance route: a warning names what stays on that
    path and how to remove it), None (an imported VPC: not knowable at synthesis).
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
        refuse_internet_routes: bool = False,
    ) -> None:
        checked = _validate(
            scope=scope,
            id=id,
            vpc=vpc,
            max_azs=max_azs,
            cidr=cidr,
            subnet_cidr_mask=subnet_cidr_mask,
            vpc_cidr=vpc_cidr,
            vpc_subnets=vpc_subnets,
            extra_interface_endpoints=extra_interface_endpoints,
            dynamodb_gateway_endpoint=dynamodb_gateway_endpoint,
            flow_logs=flow_logs,
            flow_log_retention=flow_log_retention,
            restrict_default_security_group=restrict_default_security_group,
            refuse_internet_routes=refuse_internet_routes,
        )
        extra = checked.extra_interface_endpoints
        super().__init__(scope, id)
        self.internet_routes: bool | None = checked.internet_routes
        """False: the chosen subnets have no route to a NAT gateway, internet gateway or NAT instance (always so for
        a new VPC); True: they have one (see the warning); None: an imported VPC, whose routes are not known."""
        self.internet_route_findings: list[str] = list(checked.route_findings)

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
            self.vpc_cidr = vpc_cidr or checked.literal_cidr or vpc.vpc_cidr_block
            assert checked.subnet_selection is not None
            self.subnet_selection = checked.subnet_selection
            if checked.internet_routes:
                Annotations.of(self).add_warning_v2(INTERNET_ROUTES_WARNING_ID, _internet_routes_warning(
                    checked.route_findings, [*DEFAULT_INTERFACE_ENDPOINTS, *extra], dynamodb_gateway_endpoint))
            elif checked.internet_routes is None and checked.egress_typed_subnets:
                Annotations.of(self).add_warning_v2(ROUTES_UNKNOWN_WARNING_ID, _routes_unknown_warning())

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

    @property
    def instance_egress_description(self) -> str:
        """The description of a fleet's HTTPS egress rule: it says "no route to the internet" only when none was
        found (``internet_routes`` is False)."""
        return EGRESS_DESCRIPTIONS[self.internet_routes]

    # ---- Buckets ----------------------------------------------------------------------------------------------------

    def allow_bucket(self, bucket: s3.IBucket, *, write: bool = False) -> None:
        """Let instances reach ``bucket`` through the S3 gateway endpoint.

        Adds to the endpoint policy: ``s3:GetObject``, ``s3:GetObjectVersion``, ``s3:ListBucket``,
        ``s3:GetBucketLocation``; with ``write=True`` also ``s3:PutObject``, ``s3:AbortMultipartUpload``,
        ``s3:ListMultipartUploadParts``, ``s3:ListBucketMultipartUploads``. The instance role still needs its own
        grant: the endpoint policy only bounds what can pass through the endpoint.
        """
        problems: list[str] = []
        checks.cdk_interface(problems, "allow_bucket: bucket", bucket, attributes=("bucket_arn", "bucket_name"),
                             allowed="an s3.IBucket", optional=False,
                             fix="pass the bucket construct, or allow_bucket_name('name') for a name")
        checks.flag(problems, "allow_bucket: write", write)
        if problems:
            raise ConfigurationError(_NAME, problems)
        self._allow(bucket.bucket_arn, write=write)

    def allow_bucket_name(self, bucket_name: str, *, write: bool = False) -> None:
        """Same as :meth:`allow_bucket` for a bucket known only by its name."""
        problems: list[str] = []
        if not isinstance(bucket_name, str):
            problems.append(f"allow_bucket_name: bucket_name ({bucket_name!r}) must be a string: pass the bucket's "
                            "name, or allow_bucket(bucket) for a bucket construct")
        elif not Token.is_unresolved(bucket_name):
            problem = s3_bucket_name_problem(bucket_name)
            if problem:
                problems.append(f"allow_bucket_name: bucket_name ({bucket_name!r}) is not an S3 bucket name: {problem}"
                                "; pass the bucket's name, not its ARN or URL")
        checks.flag(problems, "allow_bucket_name: write", write)
        if problems:
            raise ConfigurationError(_NAME, problems)
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


@dataclass(frozen=True)
class _Checked:
    """What validation learnt about the arguments, for the constructor to use."""

    extra_interface_endpoints: list[str]
    literal_cidr: str | None = None
    subnet_selection: ec2.SubnetSelection | None = None
    internet_routes: bool | None = False
    route_findings: tuple[str, ...] = ()
    egress_typed_subnets: bool = False


def _literal_cidr(vpc: ec2.IVpc) -> str | None:
    """The VPC's primary CIDR as a literal, when it is one: an imported VPC's attribute, or the ``CidrBlock`` of an
    ``ec2.Vpc`` built in this app (its ``vpc_cidr_block`` is a ``Fn::GetAtt`` token, its ``CfnVPC`` holds the
    literal that was asked for). None for a token, or an IPAM-allocated VPC (no ``CidrBlock``)."""
    if not Token.is_unresolved(vpc.vpc_cidr_block):
        return vpc.vpc_cidr_block
    if isinstance(vpc, ec2.Vpc):
        resource = vpc.node.default_child
        block = resource.cidr_block if isinstance(resource, ec2.CfnVPC) else None
        if isinstance(block, str) and not Token.is_unresolved(block):
            return block
    return None


def _default_selection(vpc: ec2.IVpc, vpc_subnets: ec2.SubnetSelection | None) -> ec2.SubnetSelection:
    if vpc_subnets is not None:
        return vpc_subnets
    if vpc.isolated_subnets:
        return ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)
    return ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)


def _has_route_table(subnet: ec2.ISubnet) -> bool:
    try:  # jsii raises on the missing id of a subnet imported without its route table
        return subnet.route_table is not None and subnet.route_table.route_table_id is not None
    except RuntimeError:
        return False


def _internet_routes(vpc: ec2.IVpc, subnets: Sequence[ec2.ISubnet]) -> list[str] | None:
    """Each route from ``subnets`` to a NAT gateway, an internet gateway (or egress-only one), a carrier gateway or
    an instance (a NAT instance), as "<subnet>: <destination> -> <target>"; None when they cannot be read.

    Routes are read from the construct tree of the VPC's stack, so only for an ``ec2.Vpc`` built in this app: an
    imported VPC (``from_lookup``, ``from_vpc_attributes``) carries no routes. A subnet's route table sends traffic
    for a destination to the most specific matching route ("Route priority", Amazon VPC user guide), so a default
    route to a NAT gateway carries everything that no endpoint route or private DNS name claims first.
    """
    if not isinstance(vpc, ec2.Vpc) or not subnets or not all(isinstance(s, Construct) for s in subnets):
        return None
    stack = Stack.of(vpc)

    def key(value: object) -> str:
        return json.dumps(stack.resolve(value), sort_keys=True)

    tables = {key(subnet.route_table.route_table_id): subnet.node.path for subnet in subnets}
    everything = stack.node.find_all()
    internet_gateways = {key(c.ref) for c in everything if isinstance(c, ec2.CfnInternetGateway)}
    found: list[str] = []
    for route in everything:
        if not isinstance(route, ec2.CfnRoute):
            continue
        subnet = tables.get(key(route.route_table_id))
        if subnet is None:
            continue
        target: str | None = None
        gateway = route.gateway_id
        if route.nat_gateway_id is not None:
            target = "a NAT gateway"
        elif gateway is not None and (key(gateway) in internet_gateways
                                      or (isinstance(gateway, str) and gateway.startswith("igw-"))):
            target = "an internet gateway"
        elif route.egress_only_internet_gateway_id is not None:
            target = "an egress-only internet gateway (IPv6)"
        elif route.carrier_gateway_id is not None:
            target = "a carrier gateway"
        elif route.instance_id is not None:
            target = "an instance (a NAT instance)"
        if target is not None:
            destination = (route.destination_cidr_block or route.destination_ipv6_cidr_block
                           or route.destination_prefix_list_id or "?")
            if not isinstance(destination, str) or Token.is_unresolved(destination):
                destination = "(a token)"
            found.append(f"{subnet}: {destination} -> {target}")
    return found


def _internet_routes_warning(findings: Sequence[str], endpoints: Sequence[str], dynamodb: bool) -> str:
    listed = ", ".join(endpoints)
    return (
        f"the chosen subnets route to the internet ({'; '.join(findings)}). What stays on that path: every "
        "destination without an endpoint here, billed per GB processed on a NAT gateway (Amazon VPC pricing) - AWS "
        f"APIs other than S3 (gateway endpoint) and {listed} (interface endpoints with private DNS)"
        + ("" if dynamodb else ", e.g. DynamoDB (dynamodb_gateway_endpoint=True adds it)")
        + ", Bedrock unless extra_interface_endpoints=['bedrock-runtime'], and anything on the internet (container "
        "registries other than ECR, the Hugging Face Hub, package mirrors); the fleets' instances allow HTTPS out "
        "to 0.0.0.0/0, which this route carries. To remove it: pass vpc_subnets= with subnets that have no default "
        "route (PRIVATE_ISOLATED), or build the VPC with nat_gateways=0 and PRIVATE_ISOLATED subnets; pass "
        "refuse_internet_routes=True to make this an error, or acknowledge it with "
        f"Annotations.of(network).acknowledge_warning({INTERNET_ROUTES_WARNING_ID!r}). See docs/bring-your-own-vpc.md"
    )


def _routes_unknown_warning() -> str:
    return (
        "the VPC is imported, so its routes cannot be read at synthesis, and the chosen subnets are "
        "PRIVATE_WITH_EGRESS (their type says they route 0.0.0.0/0 to a NAT gateway or similar). If they do, every "
        "destination without an endpoint here stays on the NAT path, billed per GB processed. Select subnets without "
        "a default route (vpc_subnets=, or import them as isolated_subnet_ids), pass refuse_internet_routes=True to "
        "refuse egress subnets, or acknowledge with "
        f"Annotations.of(network).acknowledge_warning({ROUTES_UNKNOWN_WARNING_ID!r}). See docs/bring-your-own-vpc.md"
    )


def _validate(
    *,
    scope: object,
    id: object,
    vpc: ec2.IVpc | None,
    max_azs: int | None,
    cidr: str | None,
    subnet_cidr_mask: int | None,
    vpc_cidr: str | None,
    vpc_subnets: ec2.SubnetSelection | None,
    extra_interface_endpoints: Sequence[str],
    dynamodb_gateway_endpoint: bool,
    flow_logs: bool,
    flow_log_retention: logs.RetentionDays,
    restrict_default_security_group: bool,
    refuse_internet_routes: bool,
) -> _Checked:
    """Check every argument, gather every problem, raise once (before the construct joins the tree)."""
    problems: list[str] = []
    checks.instance_of(problems, "scope", scope, Construct, allowed="a construct (a Stack or a Construct)",
                       fix="pass the stack: PrivateDataPath(stack, 'Net')")
    checks.text(problems, "id", id, fix="pass the construct id: PrivateDataPath(stack, 'Net')")
    vpc_ok = checks.cdk_interface(
        problems, "vpc", vpc, attributes=("vpc_id", "select_subnets", "vpc_cidr_block"), allowed="an ec2.IVpc",
        fix="pass an ec2.Vpc, or ec2.Vpc.from_lookup / from_vpc_attributes for an existing one")
    max_azs_ok = checks.whole_number(problems, "max_azs", max_azs, minimum=1, optional=True,
                                     fix=f"use {DEFAULT_MAX_AZS} (the default) for a network that survives losing one "
                                         "zone")
    cidr_typed = cidr is None or checks.text(problems, "cidr", cidr, fix=f"give one such as {DEFAULT_VPC_CIDR!r}")
    mask_ok = checks.whole_number(problems, "subnet_cidr_mask", subnet_cidr_mask, minimum=16, maximum=28,
                                  optional=True, fix=f"a subnet is /16 to /28; the default is {DEFAULT_SUBNET_CIDR_MASK}")
    vpc_cidr_typed = vpc_cidr is None or checks.text(problems, "vpc_cidr", vpc_cidr,
                                                     fix="give the VPC's primary CIDR, e.g. '10.0.0.0/16'")
    subnets_ok = checks.instance_of(
        problems, "vpc_subnets", vpc_subnets, ec2.SubnetSelection, optional=True, allowed="an ec2.SubnetSelection",
        fix="e.g. vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)")
    endpoints_ok = checks.string_list(problems, "extra_interface_endpoints", extra_interface_endpoints,
                                      example="['bedrock-runtime', 'secretsmanager']")
    for argument, value in (("dynamodb_gateway_endpoint", dynamodb_gateway_endpoint), ("flow_logs", flow_logs),
                            ("restrict_default_security_group", restrict_default_security_group),
                            ("refuse_internet_routes", refuse_internet_routes)):
        checks.flag(problems, argument, value)
    checks.instance_of(problems, "flow_log_retention", flow_log_retention, logs.RetentionDays,
                       allowed="a logs.RetentionDays", fix="e.g. flow_log_retention=logs.RetentionDays.ONE_YEAR "
                                                         "(365 days), the default")
    if max_azs_ok and mask_ok and cidr_typed and vpc_cidr_typed and subnets_ok and vpc_ok:
        result = _check_shape(problems, vpc=vpc, max_azs=max_azs, cidr=cidr, subnet_cidr_mask=subnet_cidr_mask,
                              vpc_cidr=vpc_cidr, vpc_subnets=vpc_subnets,
                              refuse_internet_routes=refuse_internet_routes is True)
    else:
        result = _Checked(extra_interface_endpoints=[])
    extra = _check_endpoints(problems, extra_interface_endpoints) if endpoints_ok else []
    if problems:
        raise ConfigurationError(_NAME, problems)
    return _Checked(extra_interface_endpoints=extra, literal_cidr=result.literal_cidr,
                    subnet_selection=result.subnet_selection, internet_routes=result.internet_routes,
                    route_findings=result.route_findings, egress_typed_subnets=result.egress_typed_subnets)


def _check_shape(
    problems: list[str], *, vpc: ec2.IVpc | None, max_azs: int | None, cidr: str | None,
    subnet_cidr_mask: int | None, vpc_cidr: str | None, vpc_subnets: ec2.SubnetSelection | None,
    refuse_internet_routes: bool,
) -> _Checked:
    """The new VPC's shape, or what an existing VPC offers: CIDR, subnets, routes."""
    if vpc is not None:
        for argument, value in (("max_azs", max_azs), ("cidr", cidr), ("subnet_cidr_mask", subnet_cidr_mask)):
            if value is not None:
                problems.append(
                    f"{argument} ({value!r}) shapes a new VPC and cannot be used with vpc=: drop "
                    f"{argument}, or drop vpc to create a new VPC"
                )
        literal = _literal_cidr(vpc)
        if vpc_cidr is not None:
            network = _check_cidr("vpc_cidr", vpc_cidr, problems)
            if network is not None and literal is not None and literal != vpc_cidr:
                problems.append(
                    f"vpc_cidr ({vpc_cidr!r}) differs from the VPC's own CIDR ({literal!r}): drop "
                    "vpc_cidr or make it match"
                )
        elif literal is None:
            problems.append(
                "vpc_cidr (None) is required when the vpc's CIDR is a token (an imported VPC whose CIDR is a "
                "reference, or an IPAM-allocated one): pass its literal CIDR, e.g. vpc_cidr='10.0.0.0/16', for the "
                "443 rule and cdk-nag"
            )
        if vpc_subnets is None and not vpc.isolated_subnets and not vpc.private_subnets:
            problems.append(
                "vpc has no private or isolated subnets: endpoints never go in public subnets; add "
                "private subnets or pass vpc_subnets"
            )
            return _Checked(extra_interface_endpoints=[], literal_cidr=literal)
        selection = _default_selection(vpc, vpc_subnets)
        try:
            subnets = list(_select(vpc, selection).subnets)
        except RuntimeError as error:  # jsii: "There are no 'Private' subnet groups in this VPC..."
            problems.append(f"vpc_subnets selects no subnets of this VPC ({error}): select subnets it has")
            return _Checked(extra_interface_endpoints=[], literal_cidr=literal)
        missing = [s.subnet_id for s in subnets if not _has_route_table(s)]
        if missing:
            # The S3 gateway endpoint is a route in each subnet's route table ("Gateway endpoints", Amazon VPC
            # PrivateLink guide): without the table ids CDK cannot place it and fails mid-construction.
            problems.append(
                f"vpc: the chosen subnets {missing!r} have no route table id: import the VPC with "
                "*_subnet_route_table_ids=[...] (e.g. isolated_subnet_route_table_ids) so the S3 gateway endpoint "
                "can be added to their route tables"
            )
            return _Checked(extra_interface_endpoints=[], literal_cidr=literal)
        routes = _internet_routes(vpc, subnets)
        private_ids = {s.subnet_id for s in vpc.private_subnets}
        egress_typed = routes is None and any(s.subnet_id in private_ids for s in subnets)
        if refuse_internet_routes and routes:
            problems.append(
                f"refuse_internet_routes (True): the chosen subnets route to the internet ({'; '.join(routes)}): "
                "pass vpc_subnets= with subnets that have no default route (PRIVATE_ISOLATED), remove the NAT or "
                "internet gateway routes, or drop refuse_internet_routes to be warned instead"
            )
        if refuse_internet_routes and egress_typed:
            problems.append(
                "refuse_internet_routes (True): the VPC is imported, so its routes cannot be read, and the chosen "
                "subnets are PRIVATE_WITH_EGRESS: pass vpc_subnets= with isolated subnets (import them as "
                "isolated_subnet_ids), or drop refuse_internet_routes"
            )
        return _Checked(extra_interface_endpoints=[], literal_cidr=literal, subnet_selection=selection,
                        internet_routes=None if routes is None else bool(routes), route_findings=tuple(routes or ()),
                        egress_typed_subnets=egress_typed)
    if vpc_cidr is not None:
        problems.append(
            f"vpc_cidr ({vpc_cidr!r}) describes an existing vpc= and is not used for a new VPC: "
            "use cidr= to set the new VPC's CIDR"
        )
    if vpc_subnets is not None:
        problems.append("vpc_subnets selects subnets of an existing vpc= and is not used for a new VPC: drop it")
    network = _check_cidr("cidr", cidr, problems) if cidr is not None else ipaddress.IPv4Network(DEFAULT_VPC_CIDR)
    mask = subnet_cidr_mask if subnet_cidr_mask is not None else DEFAULT_SUBNET_CIDR_MASK
    if network is not None:
        azs = max_azs if isinstance(max_azs, int) else DEFAULT_MAX_AZS
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
    return _Checked(extra_interface_endpoints=[])


def _check_endpoints(problems: list[str], extra_interface_endpoints: Sequence[str]) -> list[str]:
    """The extra endpoint names, deduplicated; unknown ones with the closest known names."""
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
    return extra
