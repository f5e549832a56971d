"""A stack of plain CDK resources shaped like the examples (isolated VPC, S3 endpoint with a policy, queue with a
dead-letter queue, KMS bucket): proves the local deploy harness without depending on the library's constructs."""

from __future__ import annotations

from aws_cdk import App, RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from genai_constructs.testing import stack_synthesizer

MAX_RECEIVE_COUNT = 3


class MinimalStack(Stack):
    def __init__(self, scope: Construct, id_: str) -> None:
        super().__init__(scope, id_, synthesizer=stack_synthesizer(scope))
        key = kms.Key(self, "Key", enable_key_rotation=True, removal_policy=RemovalPolicy.DESTROY)
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            max_azs=2,
            nat_gateways=0,
            subnet_configuration=[
                ec2.SubnetConfiguration(name="isolated", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)
            ],
        )
        self.bucket = s3.Bucket(
            self,
            "Bucket",
            encryption=s3.BucketEncryption.KMS,
            encryption_key=key,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
        )
        endpoint = self.vpc.add_gateway_endpoint("S3", service=ec2.GatewayVpcEndpointAwsService.S3)
        endpoint.add_to_policy(
            iam.PolicyStatement(
                principals=[iam.AnyPrincipal()],
                actions=["s3:GetObject"],
                resources=[self.bucket.arn_for_objects("*")],
            )
        )
        self.vpc.add_interface_endpoint("Sqs", service=ec2.InterfaceVpcEndpointAwsService.SQS)
        dead_letters = sqs.Queue(self, "DeadLetters", encryption=sqs.QueueEncryption.KMS, encryption_master_key=key)
        self.queue = sqs.Queue(
            self,
            "Work",
            encryption=sqs.QueueEncryption.KMS,
            encryption_master_key=key,
            dead_letter_queue=sqs.DeadLetterQueue(queue=dead_letters, max_receive_count=MAX_RECEIVE_COUNT),
        )


def build(app: App) -> MinimalStack:
    return MinimalStack(app, "GenaiMinimal")


if __name__ == "__main__":
    application = App()
    build(application)
    application.synth()
