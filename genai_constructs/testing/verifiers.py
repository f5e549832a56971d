"""Verifiers, one per resource kind: what moto created, read back through boto3 and compared with the template;
and what moto skips, checked in the template."""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from genai_constructs.testing.emulator import FAKE_ACCOUNT, REGION, is_custom_resource, moto_creates
from genai_constructs.testing.moto_copy import references

# --------------------------------------------------------------------------------------------------- checks


@dataclass(frozen=True)
class Check:
    """One verified fact: ``source`` is ``moto`` (read back through boto3) or ``template`` (moto skips it)."""

    stack: str
    subject: str
    ok: bool
    detail: str
    source: str = "moto"


@dataclass
class StackContext:
    """What a verifier needs: the template, the physical ids moto gave, and boto3 clients on the server."""

    name: str
    template: dict[str, Any]
    physical: dict[str, str]
    session: Any
    _clients: dict[str, Any] = field(default_factory=dict)

    def client(self, service: str) -> Any:
        if service not in self._clients:
            self._clients[service] = self.session.client(service)
        return self._clients[service]

    def resources(self, resource_type: str) -> dict[str, dict[str, Any]]:
        return {k: v for k, v in self.template.get("Resources", {}).items() if v.get("Type") == resource_type}

    def resolve(self, value: Any) -> Any:
        """Resolve the intrinsics a verifier compares with (Ref, GetAtt of ids/ARNs, Join); ``None`` if it can't."""
        return _resolve(value, self)


_PSEUDO = {
    "AWS::Region": REGION,
    "AWS::AccountId": FAKE_ACCOUNT,
    "AWS::Partition": "aws",
    "AWS::URLSuffix": "amazonaws.com",
    "AWS::StackName": None,
    "AWS::NoValue": None,
}


def _resolve(value: Any, ctx: StackContext) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, list):
        items = [_resolve(v, ctx) for v in value]
        return None if any(i is None for i in items) else items
    if isinstance(value, dict) and len(value) == 1:
        ((key, arg),) = value.items()
        if key == "Ref":
            if arg in _PSEUDO:
                return ctx.name if arg == "AWS::StackName" else _PSEUDO[arg]
            if arg in ctx.template.get("Parameters", {}):
                return ctx.template["Parameters"][arg].get("Default")
            return ctx.physical.get(arg)
        if key == "Fn::Join":
            separator, parts = arg
            resolved = [_resolve(p, ctx) for p in parts]
            return None if any(p is None for p in resolved) else separator.join(str(p) for p in resolved)
        if key == "Fn::GetAtt":
            logical, attribute = arg if isinstance(arg, list) else arg.split(".", 1)
            return _get_att(ctx, logical, attribute)
        if key.startswith("Fn::"):
            return None
    if isinstance(value, dict):
        resolved_dict = {k: _resolve(v, ctx) for k, v in value.items()}
        return None if any(v is None for v in resolved_dict.values()) else resolved_dict
    return None


def _get_att(ctx: StackContext, logical: str, attribute: str) -> Any:
    physical = ctx.physical.get(logical)
    resource_type = ctx.template.get("Resources", {}).get(logical, {}).get("Type")
    if physical is None:
        return None
    if resource_type == "AWS::SQS::Queue" and attribute == "Arn":
        return ctx.client("sqs").get_queue_attributes(QueueUrl=physical, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
    if resource_type == "AWS::S3::Bucket" and attribute == "Arn":
        return f"arn:aws:s3:::{physical}"
    if resource_type == "AWS::KMS::Key" and attribute == "Arn":
        return physical if physical.startswith("arn:") else f"arn:aws:kms:{REGION}:{FAKE_ACCOUNT}:key/{physical}"
    if attribute in ("Id", "GroupId", "LaunchTemplateId"):
        return physical
    return None


Verifier = Callable[[StackContext], list[Check]]


def _physical_or_missing(ctx: StackContext, logical: str, subject: str) -> tuple[str | None, list[Check]]:
    physical = ctx.physical.get(logical)
    if physical is None:
        return None, [Check(ctx.name, subject, False, f"{logical}: moto created no resource")]
    return physical, []


def verify_vpcs(ctx: StackContext) -> list[Check]:
    """VPC: CIDR as in the template, no NAT gateway, no internet gateway, subnets without public IPs."""
    checks: list[Check] = []
    ec2 = ctx.client("ec2")
    for logical, resource in ctx.resources("AWS::EC2::VPC").items():
        vpc_id, missing = _physical_or_missing(ctx, logical, "VPC")
        if vpc_id is None:
            checks += missing
            continue
        (vpc,) = ec2.describe_vpcs(VpcIds=[vpc_id])["Vpcs"]
        expected_cidr = resource["Properties"].get("CidrBlock")
        nats = [
            n
            for n in ec2.describe_nat_gateways(Filters=[{"Name": "vpc-id", "Values": [vpc_id]}])["NatGateways"]
            if n.get("State") != "deleted"
        ]
        igws = ec2.describe_internet_gateways(Filters=[{"Name": "attachment.vpc-id", "Values": [vpc_id]}])[
            "InternetGateways"
        ]
        subnets = ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc_id]}])["Subnets"]
        public = [s["SubnetId"] for s in subnets if s.get("MapPublicIpOnLaunch")]
        zones = sorted({s["AvailabilityZone"] for s in subnets})
        problems = []
        if expected_cidr is not None and vpc["CidrBlock"] != expected_cidr:
            problems.append(f"CIDR {vpc['CidrBlock']} != template {expected_cidr}")
        if nats:
            problems.append(f"{len(nats)} NAT gateway(s)")
        if igws:
            problems.append(f"{len(igws)} internet gateway(s)")
        if public:
            problems.append(f"subnets assigning public IPs: {public}")
        expected_subnets = len(ctx.resources("AWS::EC2::Subnet"))
        if len(subnets) != expected_subnets:
            problems.append(f"{len(subnets)} subnets != template {expected_subnets}")
        detail = (
            f"{vpc_id} {vpc['CidrBlock']}: no NAT, no IGW, {len(subnets)} private subnets in {', '.join(zones)}"
            if not problems
            else "; ".join(problems)
        )
        checks.append(Check(ctx.name, "VPC", not problems, detail))
    return checks


def _statement_actions(policy: Mapping[str, Any]) -> list[tuple[str, frozenset[str]]]:
    statements = policy.get("Statement", [])
    if isinstance(statements, dict):
        statements = [statements]
    result = []
    for statement in statements:
        actions = statement.get("Action", [])
        actions = [actions] if isinstance(actions, str) else actions
        result.append((statement.get("Effect", "Allow"), frozenset(actions)))
    return sorted(result, key=lambda item: (item[0], sorted(item[1])))


def _parse_policy(document: Any) -> dict[str, Any]:
    """An endpoint policy as moto returns it: JSON, or (when created through CloudFormation) a Python dict repr."""
    if isinstance(document, dict):
        return document
    if not document:
        return {}
    try:
        parsed = json.loads(document)
    except json.JSONDecodeError:
        parsed = ast.literal_eval(document)
    return dict(parsed)


def verify_vpc_endpoints(ctx: StackContext) -> list[Check]:
    """VPC endpoints: service, type, private DNS, and the policy statements' effects and actions."""
    checks: list[Check] = []
    ec2 = ctx.client("ec2")
    for logical, resource in ctx.resources("AWS::EC2::VPCEndpoint").items():
        properties = resource["Properties"]
        endpoint_id, missing = _physical_or_missing(ctx, logical, "VPC endpoint")
        if endpoint_id is None:
            checks += missing
            continue
        (endpoint,) = ec2.describe_vpc_endpoints(VpcEndpointIds=[endpoint_id])["VpcEndpoints"]
        service = ctx.resolve(properties.get("ServiceName"))
        kind = properties.get("VpcEndpointType", "Gateway")
        problems = []
        if service is not None and endpoint["ServiceName"] != service:
            problems.append(f"service {endpoint['ServiceName']} != template {service}")
        if endpoint.get("VpcEndpointType", "Gateway") != kind:
            problems.append(f"type {endpoint.get('VpcEndpointType')} != template {kind}")
        if "PrivateDnsEnabled" in properties and bool(endpoint.get("PrivateDnsEnabled")) != bool(
            properties["PrivateDnsEnabled"]
        ):
            problems.append(
                f"private DNS {endpoint.get('PrivateDnsEnabled')} != template {properties['PrivateDnsEnabled']}"
            )
        policy_note = "default policy"
        if "PolicyDocument" in properties:
            stored = _parse_policy(endpoint.get("PolicyDocument"))
            want = _statement_actions(properties["PolicyDocument"])
            got = _statement_actions(stored)
            if want != got:
                problems.append(f"policy statements {got} != template {want}")
            policy_note = f"policy with {len(want)} statement(s)"
        short = str(service or endpoint["ServiceName"]).split(f".{REGION}.", 1)[-1]
        detail = f"{short} ({kind}, {policy_note})" if not problems else f"{short}: " + "; ".join(problems)
        checks.append(Check(ctx.name, "VPC endpoint", not problems, detail))
    return checks


def verify_launch_templates(ctx: StackContext) -> list[Check]:
    """Launch templates: IMDSv2 required, every EBS volume encrypted (with the KMS key), instance type, monitoring."""
    checks: list[Check] = []
    ec2 = ctx.client("ec2")
    for logical, resource in ctx.resources("AWS::EC2::LaunchTemplate").items():
        want = resource["Properties"].get("LaunchTemplateData", {})
        template_id, missing = _physical_or_missing(ctx, logical, "launch template")
        if template_id is None:
            checks += missing
            continue
        (version,) = ec2.describe_launch_template_versions(LaunchTemplateId=template_id, Versions=["$Latest"])[
            "LaunchTemplateVersions"
        ]
        got = version["LaunchTemplateData"]
        problems = []
        tokens = got.get("MetadataOptions", {}).get("HttpTokens")
        if tokens != "required":
            problems.append(f"IMDSv2 not required (HttpTokens={tokens})")
        volumes = [m for m in got.get("BlockDeviceMappings", []) if "Ebs" in m]
        if not volumes:
            problems.append("no EBS volume mapping")
        for mapping in volumes:
            ebs = mapping["Ebs"]
            if not ebs.get("Encrypted"):
                problems.append(f"{mapping.get('DeviceName')} not encrypted")
        want_volumes = [m for m in want.get("BlockDeviceMappings", []) if "Ebs" in m]
        if any("KmsKeyId" in m["Ebs"] for m in want_volumes) and not all(m["Ebs"].get("KmsKeyId") for m in volumes):
            problems.append("KMS key missing on an EBS volume")
        want_type = ctx.resolve(want.get("InstanceType"))
        if want_type is not None and got.get("InstanceType") != want_type:
            problems.append(f"instance type {got.get('InstanceType')} != template {want_type}")
        want_monitoring = want.get("Monitoring", {}).get("Enabled")
        if want_monitoring is not None and got.get("Monitoring", {}).get("Enabled") != want_monitoring:
            problems.append(f"detailed monitoring {got.get('Monitoring')} != template {want_monitoring}")
        public = [n for n in got.get("NetworkInterfaces", []) if n.get("AssociatePublicIpAddress")]
        if public:
            problems.append("a network interface associates a public IP")
        detail = (
            f"{logical} {got.get('InstanceType', '?')}: IMDSv2 required, {len(volumes)} encrypted EBS volume(s)"
            + (", detailed monitoring" if got.get("Monitoring", {}).get("Enabled") else "")
            if not problems
            else "; ".join(problems)
        )
        checks.append(Check(ctx.name, "launch template", not problems, detail))
    return checks


def verify_auto_scaling_groups(ctx: StackContext) -> list[Check]:
    """Auto Scaling groups: min/max as in the template, launched into exactly the template's subnets."""
    checks: list[Check] = []
    autoscaling = ctx.client("autoscaling")
    for logical, resource in ctx.resources("AWS::AutoScaling::AutoScalingGroup").items():
        properties = resource["Properties"]
        name, missing = _physical_or_missing(ctx, logical, "Auto Scaling group")
        if name is None:
            checks += missing
            continue
        groups = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]
        if not groups:
            checks.append(Check(ctx.name, "Auto Scaling group", False, f"{name}: not found"))
            continue
        group = groups[0]
        problems = []
        for key in ("MinSize", "MaxSize"):
            want = ctx.resolve(properties.get(key))
            if want is not None and int(group[key]) != int(want):
                problems.append(f"{key} {group[key]} != template {want}")
        want_subnets = ctx.resolve(properties.get("VPCZoneIdentifier"))
        got_subnets = [s for s in group.get("VPCZoneIdentifier", "").split(",") if s]
        if want_subnets is not None and sorted(got_subnets) != sorted(want_subnets):
            problems.append(f"subnets {got_subnets} != template {want_subnets}")
        want_groups = ctx.resolve(properties.get("TargetGroupARNs"))
        if want_groups is not None and sorted(group.get("TargetGroupARNs", [])) != sorted(want_groups):
            problems.append(f"target groups {group.get('TargetGroupARNs')} != template {want_groups}")
        detail = (
            f"{logical}: min {group['MinSize']} max {group['MaxSize']} in {len(got_subnets)} private subnet(s)"
            if not problems
            else "; ".join(problems)
        )
        checks.append(Check(ctx.name, "Auto Scaling group", not problems, detail))
    return checks


def verify_target_groups(ctx: StackContext) -> list[Check]:
    """Target groups: health check path, port and protocol as in the template."""
    checks: list[Check] = []
    elbv2 = ctx.client("elbv2")
    for logical, resource in ctx.resources("AWS::ElasticLoadBalancingV2::TargetGroup").items():
        properties = resource["Properties"]
        arn, missing = _physical_or_missing(ctx, logical, "target group")
        if arn is None:
            checks += missing
            continue
        (group,) = elbv2.describe_target_groups(TargetGroupArns=[arn])["TargetGroups"]
        problems = []
        for key in ("HealthCheckPath", "HealthCheckPort", "HealthCheckProtocol", "Port", "Protocol"):
            want = ctx.resolve(properties.get(key))
            if want is not None and str(group.get(key)) != str(want):
                problems.append(f"{key} {group.get(key)} != template {want}")
        detail = (
            f"{logical}: health check {group.get('HealthCheckProtocol')} {group.get('HealthCheckPath')} "
            f"on port {group.get('HealthCheckPort')}"
            if not problems
            else "; ".join(problems)
        )
        checks.append(Check(ctx.name, "target group", not problems, detail))
    return checks


def verify_queues(ctx: StackContext) -> list[Check]:
    """SQS queues: encryption as in the template, redrive to the template's dead-letter queue and receive count."""
    checks: list[Check] = []
    sqs = ctx.client("sqs")
    for logical, resource in ctx.resources("AWS::SQS::Queue").items():
        properties = resource.get("Properties", {})
        url, missing = _physical_or_missing(ctx, logical, "SQS queue")
        if url is None:
            checks += missing
            continue
        attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        problems = []
        notes = []
        if "KmsMasterKeyId" in properties:
            if not attributes.get("KmsMasterKeyId"):
                problems.append("no KMS key")
            notes.append("KMS")
        elif properties.get("SqsManagedSseEnabled") or "SqsManagedSseEnabled" not in properties:
            if str(attributes.get("SqsManagedSseEnabled", "true")).lower() != "true":
                problems.append("SQS-managed encryption off")
            notes.append("SSE-SQS")
        redrive = properties.get("RedrivePolicy")
        if redrive is not None:
            got = json.loads(attributes.get("RedrivePolicy", "{}"))
            want_target = ctx.resolve(redrive.get("deadLetterTargetArn"))
            if int(got.get("maxReceiveCount", -1)) != int(redrive.get("maxReceiveCount", -2)):
                problems.append(
                    f"maxReceiveCount {got.get('maxReceiveCount')} != template {redrive.get('maxReceiveCount')}"
                )
            if want_target is not None and got.get("deadLetterTargetArn") != want_target:
                problems.append(f"dead-letter target {got.get('deadLetterTargetArn')} != template {want_target}")
            target_name = str(got.get("deadLetterTargetArn")).rsplit(":", 1)[-1]
            notes.append(f"redrive after {got.get('maxReceiveCount')} receives to {target_name}")
        queue_name = url.rsplit("/", 1)[-1]
        detail = f"{queue_name}: {', '.join(notes)}" if not problems else f"{queue_name}: " + "; ".join(problems)
        checks.append(Check(ctx.name, "SQS queue", not problems, detail))
    return checks


def verify_buckets(ctx: StackContext) -> list[Check]:
    """S3 buckets: default encryption algorithm and KMS key as in the template, public access blocked."""
    checks: list[Check] = []
    s3 = ctx.client("s3")
    for logical, resource in ctx.resources("AWS::S3::Bucket").items():
        properties = resource.get("Properties", {})
        name, missing = _physical_or_missing(ctx, logical, "S3 bucket")
        if name is None:
            checks += missing
            continue
        problems = []
        want_rules = properties.get("BucketEncryption", {}).get("ServerSideEncryptionConfiguration", [])
        want_algorithm = (
            want_rules[0].get("ServerSideEncryptionByDefault", {}).get("SSEAlgorithm") if want_rules else "AES256"
        )
        try:
            rules = s3.get_bucket_encryption(Bucket=name)["ServerSideEncryptionConfiguration"]["Rules"]
            got_default = rules[0]["ApplyServerSideEncryptionByDefault"]
        except Exception as error:  # noqa: BLE001 - botocore's ClientError: no encryption configured
            got_default = {}
            problems.append(f"no default encryption ({error.__class__.__name__})")
        if got_default and got_default.get("SSEAlgorithm") != want_algorithm:
            problems.append(f"SSE {got_default.get('SSEAlgorithm')} != template {want_algorithm}")
        if want_algorithm == "aws:kms" and got_default and not got_default.get("KMSMasterKeyID"):
            problems.append("no KMS key")
        block_note = ""
        want_block = properties.get("PublicAccessBlockConfiguration")
        if want_block is not None:
            flags = ("BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets")
            try:
                got_block = s3.get_public_access_block(Bucket=name)["PublicAccessBlockConfiguration"]
                block_note = ", public access blocked"
            except Exception:  # noqa: BLE001 - moto's CloudFormation does not apply the block: check the template
                got_block = want_block
                block_note = ", public access blocked (template: moto skips it)"
            if not all(got_block.get(flag) is True for flag in flags):
                problems.append(f"public access not fully blocked: {got_block}")
        detail = f"{name}: {want_algorithm}{block_note}" if not problems else f"{name}: " + "; ".join(problems)
        checks.append(Check(ctx.name, "S3 bucket", not problems, detail))
    return checks


def verify_skipped_by_moto(ctx: StackContext) -> list[Check]:
    """What moto accepts without creating: checked in the template instead."""
    checks: list[Check] = []
    resources = ctx.template.get("Resources", {})
    groups = set(ctx.resources("AWS::AutoScaling::AutoScalingGroup"))

    def ref_target(value: Any) -> str | None:
        return value.get("Ref") if isinstance(value, dict) else None

    for logical, pool in ctx.resources("AWS::AutoScaling::WarmPool").items():
        properties = pool["Properties"]
        target = ref_target(properties.get("AutoScalingGroupName"))
        ok = target in groups
        detail = (
            f"{logical}: state {properties.get('PoolState', 'Stopped')}, min {properties.get('MinSize', 0)}, "
            f"max prepared {properties.get('MaxGroupPreparedCapacity', 'group max')}"
            f"{', reuse on scale-in' if properties.get('InstanceReusePolicy', {}).get('ReuseOnScaleIn') else ''}"
            + ("" if ok else f"; attached to {target!r}, not an Auto Scaling group in this stack")
        )
        checks.append(Check(ctx.name, "warm pool", ok, detail, "template"))
    for logical, policy in ctx.resources("AWS::AutoScaling::ScalingPolicy").items():
        properties = policy["Properties"]
        target = ref_target(properties.get("AutoScalingGroupName"))
        kind = properties.get("PolicyType", "SimpleScaling")
        metric = properties.get("TargetTrackingConfiguration", {})
        metric_name = (
            metric.get("PredefinedMetricSpecification", {}).get("PredefinedMetricType")
            or metric.get("CustomizedMetricSpecification", {}).get("MetricName")
            or ""
        )
        target_value = metric.get("TargetValue")
        ok = target in groups
        detail = f"{logical}: {kind}" + (f" on {metric_name} at {target_value}" if metric_name else "")
        checks.append(Check(ctx.name, "scaling policy", ok, detail, "template"))
    alarms = ctx.resources("AWS::CloudWatch::Alarm")
    if alarms:
        with_actions = sum(1 for a in alarms.values() if a["Properties"].get("AlarmActions"))
        metrics = sorted({str(a["Properties"].get("MetricName", "math")) for a in alarms.values()})
        checks.append(
            Check(
                ctx.name,
                "alarms",
                True,
                f"{len(alarms)} alarm(s), {with_actions} with actions: {', '.join(metrics)}",
                "template",
            )
        )
    for logical, group in ctx.resources("AWS::EC2::PlacementGroup").items():
        strategy = group.get("Properties", {}).get("Strategy")
        used_by = [
            name
            for name, lt in ctx.resources("AWS::EC2::LaunchTemplate").items()
            if _mentions(lt["Properties"].get("LaunchTemplateData", {}).get("Placement", {}), logical)
        ] + [
            name
            for name, asg in ctx.resources("AWS::AutoScaling::AutoScalingGroup").items()
            if _mentions(asg["Properties"].get("PlacementGroup"), logical)
        ]
        ok = bool(strategy) and bool(used_by)
        detail = f"{logical}: strategy {strategy}, used by {', '.join(used_by) or 'nothing'}"
        checks.append(Check(ctx.name, "placement group", ok, detail, "template"))
    for logical, resource in resources.items():
        if not is_custom_resource(str(resource["Type"])):
            continue
        token = references(resource.get("Properties", {}).get("ServiceToken"))
        provider_ok = bool(token) and all(t in ctx.physical for t in token)
        checks.append(
            Check(
                ctx.name,
                "custom resource",
                provider_ok,
                f"{logical} ({resource['Type']}): provider {', '.join(sorted(token)) or '?'} "
                + (
                    "deployed; the resource is left out (moto runs its Lambda only in Docker)"
                    if provider_ok
                    else "not deployed"
                ),
                "template",
            )
        )
    template_only = [r for r in resources.values() if not moto_creates(str(r["Type"]))]
    not_created = sorted(
        {r["Type"] for logical, r in resources.items() if logical not in ctx.physical and r not in template_only}
    )
    created = sum(1 for logical in resources if logical in ctx.physical)
    skipped = sorted({str(r["Type"]).split("::", 1)[1] for r in template_only})
    checks.append(
        Check(
            ctx.name,
            "coverage",
            True,
            f"moto created {created} of {len(resources)} resources; template-only: {', '.join(skipped) or 'none'}"
            + (f"; also without a physical id: {', '.join(not_created)}" if not_created else ""),
            "template",
        )
    )
    return checks


def _mentions(value: Any, logical: str) -> bool:
    return logical in json.dumps(value) if value is not None else False


VERIFIERS: tuple[Verifier, ...] = (
    verify_vpcs,
    verify_vpc_endpoints,
    verify_launch_templates,
    verify_auto_scaling_groups,
    verify_target_groups,
    verify_queues,
    verify_buckets,
    verify_skipped_by_moto,
)
"""One verifier per resource kind, run in this order for every deployed stack."""


def physical_ids(session: Any, stack_name: str) -> dict[str, str]:
    """Logical id -> physical id for every resource moto created in the stack."""
    cloudformation = session.client("cloudformation")
    result: dict[str, str] = {}
    kwargs: dict[str, Any] = {"StackName": stack_name}
    while True:
        page = cloudformation.list_stack_resources(**kwargs)
        for summary in page["StackResourceSummaries"]:
            if summary.get("PhysicalResourceId"):
                result[summary["LogicalResourceId"]] = summary["PhysicalResourceId"]
        if not page.get("NextToken"):
            return result
        kwargs["NextToken"] = page["NextToken"]


def verify_stack(
    session: Any, name: str, template: dict[str, Any], verifiers: Sequence[Verifier] = VERIFIERS
) -> list[Check]:
    """Run every verifier on one deployed stack."""
    status = session.client("cloudformation").describe_stacks(StackName=name)["Stacks"][0]["StackStatus"]
    checks = [Check(name, "stack", status in ("CREATE_COMPLETE", "UPDATE_COMPLETE"), status)]
    ctx = StackContext(name=name, template=template, physical=physical_ids(session, name), session=session)
    for verifier in verifiers:
        checks.extend(verifier(ctx))
    return checks


# --------------------------------------------------------------------------------------------------- Aurora


def _cluster_of(ctx: StackContext, instance: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
    target = instance.get("Properties", {}).get("DBClusterIdentifier")
    logical = target.get("Ref") if isinstance(target, dict) else None
    cluster = ctx.template.get("Resources", {}).get(logical or "", {})
    return logical, cluster.get("Properties", {}) if cluster.get("Type") == "AWS::RDS::DBCluster" else {}


def verify_aurora_instances(ctx: StackContext) -> list[Check]:
    """Aurora DB instances moto created (standalone: ``moto_copy.aurora_instances_for_moto``): instance class, no
    public access, encrypted, in the zone the template names (``Fn::Select`` of the Region's zones resolved against
    the VPC's subnets), and one instance per zone among a cluster's readers."""
    checks: list[Check] = []
    rds = ctx.client("rds")
    ec2 = ctx.client("ec2")
    region_zones = sorted(z["ZoneName"] for z in ec2.describe_availability_zones()["AvailabilityZones"])
    own_subnets = [ctx.physical[k] for k in ctx.resources("AWS::EC2::Subnet") if k in ctx.physical]
    subnet_zones = sorted({s["AvailabilityZone"] for s in ec2.describe_subnets(SubnetIds=own_subnets)["Subnets"]}
                          ) if own_subnets else []
    readers: dict[str, list[str]] = {}
    for logical, resource in ctx.resources("AWS::RDS::DBInstance").items():
        cluster_logical, _cluster = _cluster_of(ctx, resource)
        if cluster_logical is None:
            continue
        properties = resource["Properties"]
        identifier, missing = _physical_or_missing(ctx, logical, "Aurora instance")
        if identifier is None:
            checks += missing
            continue
        (got,) = rds.describe_db_instances(DBInstanceIdentifier=identifier)["DBInstances"]
        problems = []
        if got.get("DBInstanceClass") != properties.get("DBInstanceClass"):
            problems.append(f"class {got.get('DBInstanceClass')} != template {properties.get('DBInstanceClass')}")
        if got.get("PubliclyAccessible") or properties.get("PubliclyAccessible") is not False:
            problems.append("publicly accessible")
        if not got.get("StorageEncrypted"):
            problems.append("storage not encrypted")
        zone = properties.get("AvailabilityZone")
        want_zone = ctx.resolve(zone)
        if want_zone is None and isinstance(zone, dict) and "Fn::Select" in zone:
            index = int(zone["Fn::Select"][0])
            want_zone = region_zones[index] if index < len(region_zones) else None  # Fn::GetAZs order
        if want_zone is None or got.get("AvailabilityZone") != want_zone:
            problems.append(f"zone {got.get('AvailabilityZone')} != template {want_zone}")
        elif int(properties.get("PromotionTier", 1)) > 0:
            readers.setdefault(cluster_logical, []).append(str(want_zone))
        detail = (f"{logical} {got.get('DBInstanceClass')} in {got.get('AvailabilityZone')}, private, encrypted"
                  if not problems else f"{logical}: " + "; ".join(problems))
        checks.append(Check(ctx.name, "Aurora instance", not problems, detail))
    for cluster_logical, zones in readers.items():
        ok = sorted(set(zones)) == subnet_zones
        checks.append(Check(ctx.name, "Aurora readers", ok,
                            f"{cluster_logical}: readers in {', '.join(sorted(zones))}; the stack's subnets are in "
                            f"{', '.join(subnet_zones)}"))
    return checks


def verify_aurora_clusters(ctx: StackContext) -> list[Check]:
    """What moto's CloudFormation skips (``AWS::RDS::DBCluster``, its parameter group, the secret): in the template.
    Storage encrypted with a KMS key, deletion protection, backups, IAM auth, the postgresql log exported,
    ``rds.force_ssl`` 1, the master secret KMS-encrypted and attached to the cluster."""
    checks: list[Check] = []
    resources = ctx.template.get("Resources", {})
    for logical, resource in ctx.resources("AWS::RDS::DBCluster").items():
        properties = resource.get("Properties", {})
        problems = []
        if not (properties.get("StorageEncrypted") and properties.get("KmsKeyId")):
            problems.append("storage not encrypted with a KMS key")
        if properties.get("DeletionProtection") is not True:
            problems.append("no deletion protection")
        if int(properties.get("BackupRetentionPeriod", 1)) < 1:
            problems.append("no backups")
        if "postgresql" not in properties.get("EnableCloudwatchLogsExports", []) and "aurora-postgresql" == properties.get(
                "Engine"):
            problems.append("postgresql log not exported")
        group = resources.get(str((properties.get("DBClusterParameterGroupName") or {}).get("Ref")), {})
        if str(group.get("Properties", {}).get("Parameters", {}).get("rds.force_ssl")) != "1":
            problems.append("rds.force_ssl is not 1")
        secrets = [r for r in resources.values() if r.get("Type") == "AWS::SecretsManager::SecretTargetAttachment"
                   and r.get("Properties", {}).get("TargetId") == {"Ref": logical}]
        secret_ids = [str(s["Properties"].get("SecretId", {}).get("Ref")) for s in secrets]
        if not secret_ids or not all(resources.get(i, {}).get("Properties", {}).get("KmsKeyId") for i in secret_ids):
            problems.append("master secret missing or not KMS-encrypted")
        detail = (f"{logical} {properties.get('Engine')} {properties.get('EngineVersion')}: KMS storage, deletion "
                  f"protection, {properties.get('BackupRetentionPeriod')} days of backups, IAM auth "
                  f"{'on' if properties.get('EnableIAMDatabaseAuthentication') else 'off'}, force_ssl, KMS secret"
                  if not problems else f"{logical}: " + "; ".join(problems))
        checks.append(Check(ctx.name, "Aurora cluster", not problems, detail, "template"))
    return checks


def verify_secret_rotation(ctx: StackContext) -> list[Check]:
    """What moto skips (``AWS::SecretsManager::RotationSchedule``; the ``AWS::SecretsManager`` transform that builds
    a hosted rotation function is not run): in the template. Every database secret attached to a cluster has a
    schedule; a hosted function runs in the VPC (subnets and security groups given) with the secret's KMS key, under
    the transform it needs."""
    checks: list[Check] = []
    resources = ctx.template.get("Resources", {})
    attachments = {k for k, r in resources.items() if r.get("Type") == "AWS::SecretsManager::SecretTargetAttachment"}
    schedules = ctx.resources("AWS::SecretsManager::RotationSchedule")
    scheduled = {next(iter(references(s.get("Properties", {}).get("SecretId"))), None) for s in schedules.values()}
    for logical in sorted(attachments - scheduled):
        checks.append(Check(ctx.name, "secret rotation", False, f"{logical}: no rotation schedule", "template"))
    transforms = ctx.template.get("Transform", [])
    transforms = [transforms] if isinstance(transforms, str) else list(transforms)
    for logical, schedule in schedules.items():
        properties = schedule.get("Properties", {})
        hosted = properties.get("HostedRotationLambda")
        rules = properties.get("RotationRules", {})
        every = rules.get("ScheduleExpression") or f"rate({rules.get('AutomaticallyAfterDays')} days)"
        problems = []
        if hosted is not None:
            if not any(str(t).startswith("AWS::SecretsManager-") for t in transforms):
                problems.append("hosted rotation without the AWS::SecretsManager transform")
            if not (hosted.get("VpcSubnetIds") and hosted.get("VpcSecurityGroupIds")):
                problems.append("hosted rotation function outside the VPC (no subnets or security groups)")
            if not hosted.get("KmsKeyArn"):
                problems.append("hosted rotation function without the secret's KMS key")
        elif not properties.get("RotationLambdaARN"):
            problems.append("no rotation function")
        kind = f"hosted {hosted.get('RotationType')}" if hosted is not None else "own function"
        detail = f"{logical}: {kind}, {every}, in the VPC" if not problems else f"{logical}: " + "; ".join(problems)
        checks.append(Check(ctx.name, "secret rotation", not problems, detail, "template"))
    return checks


VERIFIERS = (*VERIFIERS[:-1], verify_aurora_instances, verify_aurora_clusters, verify_secret_rotation,
             VERIFIERS[-1])
