"""How much of the examples' ``cdk synth`` time is this library's, and how much is CDK's own floor?

Run: .venv/bin/python benchmarks/synth_floor.py

Times ``cdk synth`` through the real CLI (median of 5, alternating with an empty one-stack app, as
``python -m genai_constructs.testing.synth_timing`` does) for two apps:

- the examples app (``cdk.json``): five stacks built with this library, the three cdk-nag packs on;
- the *floor*: plain CDK L2 constructs of the services the examples use (KMS key, isolated VPC, S3 gateway and SQS
  interface endpoints, bucket, queue, role, launch template, Auto Scaling group, internal ALB, a scaling policy and
  an alarm: 28 resources a stack), repeated until it has as many resources as the examples app, the same packs on.

The floor is what any app of that size pays for jsii, the CDK modules it loads, synthesis, CDK's built-in
CloudFormation validation and the nag packs; the difference is the cost of this library's constructs.
``--as-app N`` runs the floor app itself with N stacks (the CLI calls it that way).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from genai_constructs.testing.synth_timing import DEFAULT_RUNS, measure

REPOSITORY = Path(__file__).resolve().parent.parent


def build_floor_app(stacks: int) -> None:
    """Synthesize the floor app: ``stacks`` copies of one plain-CDK stack shaped like an example."""
    from aws_cdk import App, Stack, Validations
    from aws_cdk import aws_autoscaling as autoscaling
    from aws_cdk import aws_cloudwatch as cw
    from aws_cdk import aws_ec2 as ec2
    from aws_cdk import aws_elasticloadbalancingv2 as elbv2
    from aws_cdk import aws_iam as iam
    from aws_cdk import aws_kms as kms
    from aws_cdk import aws_s3 as s3
    from aws_cdk import aws_sqs as sqs
    from cdk_nag import AwsSolutionsChecks, HIPAASecurityChecks, NIST80053R5Checks

    app = App()
    Validations.of(app).add_plugins(AwsSolutionsChecks(app), NIST80053R5Checks(app), HIPAASecurityChecks(app))
    for index in range(stacks):
        stack = Stack(app, f"Floor{index}")
        key = kms.Key(stack, "Key", enable_key_rotation=True)
        vpc = ec2.Vpc(
            stack,
            "Vpc",
            max_azs=2,
            nat_gateways=0,
            subnet_configuration=[
                ec2.SubnetConfiguration(name="isolated", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)
            ],
        )
        vpc.add_gateway_endpoint("S3", service=ec2.GatewayVpcEndpointAwsService.S3)
        vpc.add_interface_endpoint("Sqs", service=ec2.InterfaceVpcEndpointAwsService.SQS)
        bucket = s3.Bucket(stack, "Bucket", encryption=s3.BucketEncryption.KMS, encryption_key=key, enforce_ssl=True)
        queue = sqs.Queue(stack, "Queue", encryption=sqs.QueueEncryption.KMS, encryption_master_key=key)
        role = iam.Role(stack, "Role", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"))
        bucket.grant_read(role)
        queue.grant_consume_messages(role)
        launch_template = ec2.LaunchTemplate(
            stack,
            "LaunchTemplate",
            instance_type=ec2.InstanceType("g6.xlarge"),
            machine_image=ec2.MachineImage.latest_amazon_linux2023(),
            require_imdsv2=True,
            role=role,
            security_group=ec2.SecurityGroup(stack, "SecurityGroup", vpc=vpc),
        )
        group = autoscaling.AutoScalingGroup(
            stack, "Group", vpc=vpc, launch_template=launch_template, min_capacity=2, max_capacity=4
        )
        load_balancer = elbv2.ApplicationLoadBalancer(stack, "LoadBalancer", vpc=vpc, internet_facing=False)
        target_group = load_balancer.add_listener("Listener", port=80).add_targets(
            "Targets", port=8000, targets=[group], health_check=elbv2.HealthCheck(path="/health")
        )
        group.scale_on_request_count("Requests", target_requests_per_minute=600)
        cw.Alarm(
            stack, "Latency", metric=target_group.metrics.target_response_time(), threshold=2, evaluation_periods=3
        )
    app.synth()


def resource_count(app_command: str) -> int:
    """Resources in every template the app synthesizes (run once, outside the timing)."""
    with tempfile.TemporaryDirectory(prefix="synth-floor-") as out:
        env = {**os.environ, "CDK_OUTDIR": out}
        subprocess.run(shlex.split(app_command), cwd=REPOSITORY, env=env, capture_output=True, check=False)
        templates = list(Path(out).glob("*.template.json"))
        if not templates:
            raise SystemExit(f"{app_command} synthesized no template")
        return sum(len(json.loads(path.read_text())["Resources"]) for path in templates)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--as-app", type=int, metavar="STACKS", help="run as the floor CDK app with STACKS stacks")
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS)
    args = parser.parse_args()
    if args.as_app is not None:
        build_floor_app(args.as_app)
        return 0

    examples_app = json.loads((REPOSITORY / "cdk.json").read_text())["app"]
    floor_app = f"{shlex.quote(sys.executable)} {shlex.quote(__file__)} --as-app"
    examples_resources = resource_count(examples_app)
    per_stack = resource_count(f"{floor_app} 1")
    stacks = max(1, math.ceil(examples_resources / per_stack))
    print(f"examples app: {examples_resources} resources; floor: {stacks} stacks x {per_stack} = {stacks * per_stack}")
    examples = measure(examples_app, runs=args.runs, cwd=REPOSITORY)
    floor = measure(f"{floor_app} {stacks}", runs=args.runs, cwd=REPOSITORY)
    print(f"examples app -> {examples.render()}")
    print(f"plain-CDK floor -> {floor.render()}")
    own = (examples.app_median - examples.empty_median) / (floor.app_median - floor.empty_median)
    print(
        f"time above the empty app: examples {examples.app_median - examples.empty_median:.2f} s, "
        f"floor {floor.app_median - floor.empty_median:.2f} s ({own:.2f}x the floor's)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
