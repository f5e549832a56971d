"""AuroraVectorStore: the retrieval tier's store, Aurora PostgreSQL with pgvector, one reader per AZ of the network.

Why one reader per zone with its *instance* endpoint: an instance endpoint names one DB instance (Amazon Aurora endpoint
connections, https://docs.aws.amazon.com/AmazonRDS/latest/AuroraUserGuide/Aurora.Overview.Endpoints.html), while "the
reader endpoint balances each connection request among the Aurora Replicas" of the whole cluster, whatever their AZ
(Reader endpoints for Amazon Aurora, https://docs.aws.amazon.com/AmazonRDS/latest/AuroraUserGuide/Aurora.Endpoints.Reader.html). A retriever in zone A
given the reader endpoint crosses zones about half the time; given zone A's instance endpoint it stays in its zone,
and the orchestrator (``runtime.rag_orchestrator --reader ZONE=HOST:PORT``) fails over to another zone's instance
only when its own is gone. ``reader_arguments()`` are those flags.

pgvector with HNSW indexes: "The pgvector extension version 0.5.0 is available on Aurora PostgreSQL 15.4, 14.9,
13.12, 12.16 and higher" (What's New, 2023-10-24, https://aws.amazon.com/about-aws/whats-new/2023/10/amazon-aurora-
postgresql-pgvector-v0-5-0-hnsw-indexing/); ``DEFAULT_ENGINE_VERSION`` is a 16.x release. See docs/vector-store.md.
"""

from __future__ import annotations

from aws_cdk import Annotations, Aws, Duration, Names, RemovalPolicy, Token
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_rds as rds
from aws_cdk import aws_secretsmanager as secretsmanager
from aws_cdk import aws_sns as sns
from constructs import Construct

from genai_constructs.errors import ConfigurationError
from genai_constructs.fleets._launch import FLEET_LOG_RETENTION, acknowledge, alarm_topic
from genai_constructs.network import _checks as checks
from genai_constructs.network.private_data_path import PrivateDataPath
from genai_constructs.planner.vector_store import (
    MAX_READERS_PER_CLUSTER,
    VectorStorePlan,
    aurora_instance_classes,
    plan_vector_store,
)
from genai_constructs.workload import RagTraffic

__all__ = [
    "DATABASE_NAME",
    "DEFAULT_BACKUP_RETENTION",
    "DEFAULT_ENGINE_VERSION",
    "DEFAULT_REMOVAL_POLICY",
    "MASTER_USERNAME",
    "PORT",
    "TABLE",
    "AuroraVectorStore",
]

_NAME = "AuroraVectorStore"

PORT = 5432
"""PostgreSQL's port. The orchestrators and loaders name it literally; a non-default port hides nothing from a scan
inside the VPC, and the security group admits only the peers ``allow_from`` names (cdk-nag AwsSolutions-RDS11 is
acknowledged for this reason)."""
DATABASE_NAME = "rag"
"""The database the cluster creates at launch; the loader and the orchestrators connect to it."""
TABLE = "rag_chunks"
"""The table the loader fills and the orchestrator searches (``runtime.vector_store.DEFAULT_TABLE``)."""
MASTER_USERNAME = "rag_admin"
"""The generated secret's user ("admin" and "postgres" are reserved words for Aurora PostgreSQL master users)."""
DEFAULT_ENGINE_VERSION = rds.AuroraPostgresEngineVersion.VER_16_13
"""The newest 16.x release aws-cdk-lib and cfn-lint both know (cfn-lint marks 16.6 and older deprecated for new
clusters); pgvector 0.5.0 and later (HNSW) is on every Aurora PostgreSQL 16 version (module doc)."""
DEFAULT_BACKUP_RETENTION = Duration.days(7)
"""A week of point-in-time restore: the corpus can be rebuilt from the embedding fleet's outputs in S3, and a week
covers a bad load noticed late. Aurora allows 1-35 days."""
DEFAULT_REMOVAL_POLICY = RemovalPolicy.SNAPSHOT
"""Deleting the stack leaves a final snapshot, not nothing: a re-embedding of the corpus takes hours of GPU time."""
MONITORING_INTERVAL = Duration.seconds(60)
"""Enhanced Monitoring every minute (the NIST 800-53 R5 and HIPAA packs ask for it): OS memory and CPU per process,
the view that shows a reader paging its HNSW index; one minute matches the alarms' period."""
CPU_ALARM_PERCENT = 75.0
"""Above three quarters of a reader's CPU the queue of top-k queries grows and p99 climbs: the plan sized readers
with the traffic's headroom, so a reader this busy means the traffic outgrew the plan."""
FREEABLE_MEMORY_ALARM_FRACTION = 0.1
"""Alarm below a tenth of the class's memory free: the corpus no longer fits the cache and queries start reading
storage (the plan's memory term)."""
REPLICA_LAG_ALARM_MS = 1000.0
"""AuroraReplicaLag above a second: a reader serves chunks a load has already replaced; Aurora replicas usually lag
by well under 100 ms (Replication with Amazon Aurora,
https://docs.aws.amazon.com/AmazonRDS/latest/AuroraUserGuide/Aurora.Replication.html)."""
SECRET_ROTATION_INTERVAL = Duration.days(30)
"""The master password changes monthly. The orchestrator re-reads the secret when a reader refuses the password
(``runtime.rag_orchestrator --secret-arn``); the loader (``runtime.vector_loader``) keeps one open connection, which a
rotation does not close, and reads the secret again whenever systemd restarts it; so a rotation costs a consumer at
most one failed connection and one GetSecretValue call; NIST 800-53 IA-5 leaves the period to the organization, and a month keeps
a leaked password short-lived without rotating so often that a rotation is always in flight."""
ALARM_EVALUATION_PERIODS = 5
ALARM_DATAPOINTS = 3
"""Three of five one-minute periods: a load or a vacuum spike does not page, a sustained condition does."""


class AuroraVectorStore(Construct):
    """An Aurora PostgreSQL cluster for pgvector: one writer and one reader instance per AZ of the network.

    Encrypted storage and Performance Insights with a customer-managed key (rotation on); a generated master secret
    (RDS JSON: username, password, host, port, dbname, engine) encrypted with the same key; ``rds.force_ssl`` in
    the cluster parameter group; IAM database authentication on; the network's private subnets, no public access;
    a security group with no ingress until ``allow_from``; the master secret rotated every
    ``SECRET_ROTATION_INTERVAL`` by Secrets Manager's hosted PostgreSQL single-user rotation function, inside the
    network's private subnets; deletion protection, a snapshot on removal; a week of
    backups; the ``postgresql`` log exported to a KMS-encrypted log group with a year's retention; Enhanced
    Monitoring through a role with a customer-managed policy; alarms on the readers' CPU and freeable memory and on
    replica lag, to an encrypted SNS topic.

    :param network: the ``PrivateDataPath`` it lives in; it must have the Secrets Manager interface endpoint
        (``PrivateDataPath(..., extra_interface_endpoints=["secretsmanager"])``): the orchestrators and loaders read
        the secret from private subnets without NAT.
    :param traffic: the RAG request path's load; with ``dimension`` it sizes the class (``plan_vector_store``).
    :param dimension: the embedding width (the encoder's output), 1-2000 (pgvector's HNSW limit).
    :param instance_class: e.g. ``"db.r7g.xlarge"``. Default: the plan's choice. The plan is evaluated on it.
    :param readers_per_zone: Default: the plan's figure. Fewer than the plan's warns.
    :param deletion_protection: Default: True; False warns.
    :param removal_policy: Default: ``DEFAULT_REMOVAL_POLICY`` (snapshot).
    :param backup_retention: Default: ``DEFAULT_BACKUP_RETENTION``.
    :param notifications_topic: SNS topic for the alarms. Default: a new KMS-encrypted topic.

    After ``allow_from(consumer)``, give consumers ``credential_statements()`` in their own customer-managed policy,
    ``reader_arguments()`` for ``--reader``, and ``database_name``/``port``/``secret`` for the connection.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        network: PrivateDataPath,
        traffic: RagTraffic,
        dimension: int,
        instance_class: str | None = None,
        readers_per_zone: int | None = None,
        deletion_protection: bool = True,
        removal_policy: RemovalPolicy = DEFAULT_REMOVAL_POLICY,
        backup_retention: Duration = DEFAULT_BACKUP_RETENTION,
        notifications_topic: sns.ITopic | None = None,
    ) -> None:
        zones = _validate(scope=scope, id=id, network=network, traffic=traffic, dimension=dimension,
                          instance_class=instance_class, readers_per_zone=readers_per_zone,
                          deletion_protection=deletion_protection, removal_policy=removal_policy,
                          backup_retention=backup_retention, notifications_topic=notifications_topic)
        plan = plan_vector_store(traffic, dimension, zones=len(zones), instance_class=instance_class)
        super().__init__(scope, id)
        self.plan: VectorStorePlan = plan
        self.port: int = PORT
        self.database_name: str = DATABASE_NAME
        self.table: str = TABLE
        self.dimension: int = dimension
        self.network: PrivateDataPath = network  # the tiers that connect to the store check they share it
        readers = readers_per_zone or plan.readers_per_zone
        if readers < plan.readers_per_zone:
            Annotations.of(self).add_warning_v2(
                "genai-constructs:AuroraVectorStoreFewerReaders",
                f"readers_per_zone={readers} is below the plan's {plan.readers_per_zone} ({plan.explanation})")
        if not deletion_protection:
            Annotations.of(self).add_warning_v2(
                "genai-constructs:AuroraVectorStoreNoDeletionProtection",
                "deletion_protection=False: a stack update or deletion can drop the database")

        cluster_identifier = Names.unique_resource_name(self, max_length=60, separator="-").lower()
        self.encryption_key = kms.Key(self, "Key", enable_key_rotation=True,
                                      description=f"{_NAME}: storage, secret, Performance Insights, logs, alarms")
        log_group_name = f"/aws/rds/cluster/{cluster_identifier}/postgresql"
        self.encryption_key.add_to_resource_policy(iam.PolicyStatement(
            sid="CloudWatchLogsEncryptThePostgresqlLog",
            principals=[iam.ServicePrincipal(f"logs.{Aws.REGION}.amazonaws.com")],
            actions=["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"],
            resources=["*"],  # in a key policy, "*" means this key
            conditions={"ArnEquals": {"kms:EncryptionContext:aws:logs:arn":
                                      f"arn:{Aws.PARTITION}:logs:{Aws.REGION}:{Aws.ACCOUNT_ID}:log-group:"
                                      f"{log_group_name}"}}))
        self.encryption_key.add_to_resource_policy(iam.PolicyStatement(
            sid="CloudWatchAlarmsPublishToTheEncryptedTopic",
            principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
            actions=["kms:Decrypt", "kms:GenerateDataKey*"], resources=["*"]))
        self.topic = notifications_topic or alarm_topic(self, "Topic", key=self.encryption_key,
                                                        display_name=f"{_NAME} alarms")
        # RDS writes the exported log to this name; created first, so it is encrypted and has a retention (RDS
        # would otherwise create it unencrypted and keep it forever: "Publishing Aurora PostgreSQL logs to Amazon
        # CloudWatch Logs", https://docs.aws.amazon.com/AmazonRDS/latest/AuroraUserGuide/AuroraPostgreSQL.CloudWatch.html).
        self.log_group = logs.LogGroup(self, "PostgresqlLog", log_group_name=log_group_name,
                                       retention=FLEET_LOG_RETENTION, encryption_key=self.encryption_key,
                                       removal_policy=RemovalPolicy.RETAIN)

        self.security_group = ec2.SecurityGroup(
            self, "SecurityGroup", vpc=network.vpc, allow_all_outbound=False,
            description=f"{_NAME}: PostgreSQL ({PORT}) from the peers allow_from names; nothing else")
        self.monitoring_role = self._monitoring_role()
        parameter_group = rds.ParameterGroup(
            self, "ClusterParameters", engine=_engine(),
            description=f"{_NAME}: TLS only",
            # rds.force_ssl=1: the cluster refuses connections without TLS ("Securing Aurora PostgreSQL data with
            # SSL/TLS", https://docs.aws.amazon.com/AmazonRDS/latest/AuroraUserGuide/AuroraPostgreSQL.Security.html).
            parameters={"rds.force_ssl": "1"})
        instance_type = ec2.InstanceType(plan.instance_class.removeprefix("db."))

        def instance(name: str, zone: str | None, tier: int) -> rds.IClusterInstance:
            return rds.ClusterInstance.provisioned(
                name, instance_type=instance_type, availability_zone=zone, publicly_accessible=False,
                auto_minor_version_upgrade=True, promotion_tier=tier)

        reader_ids = [[f"Zone{z + 1}Reader{r + 1}" for r in range(readers)] for z in range(len(zones))]
        self.cluster = rds.DatabaseCluster(
            self, "Resource",
            engine=_engine(),
            cluster_identifier=cluster_identifier,
            credentials=rds.Credentials.from_generated_secret(MASTER_USERNAME, encryption_key=self.encryption_key),
            default_database_name=DATABASE_NAME,
            port=PORT,
            vpc=network.vpc,
            vpc_subnets=network.subnet_selection,
            security_groups=[self.security_group],
            writer=instance("Writer", zones[0], 0),
            # The first reader of each zone is promotion tier 1: a failover moves the writer to a reader.
            readers=[instance(name, zone, 1 + r) for zone, names in zip(zones, reader_ids, strict=True)
                     for r, name in enumerate(names)],
            parameter_group=parameter_group,
            storage_encrypted=True,
            storage_encryption_key=self.encryption_key,
            iam_authentication=True,
            deletion_protection=deletion_protection,
            removal_policy=removal_policy,
            backup=rds.BackupProps(retention=backup_retention),
            cloudwatch_logs_exports=["postgresql"],
            monitoring_interval=MONITORING_INTERVAL,
            monitoring_role=self.monitoring_role,
            enable_performance_insights=True,
            performance_insight_encryption_key=self.encryption_key,
            copy_tags_to_snapshot=True,
        )
        self.cluster.node.add_dependency(self.log_group)
        assert self.cluster.secret is not None
        self.secret: secretsmanager.ISecret = self.cluster.secret
        self.writer_address: str = self.cluster.cluster_endpoint.hostname
        self._readers: list[tuple[str, rds.CfnDBInstance]] = [
            (zone, self._cfn_instance(name)) for zone, names in zip(zones, reader_ids, strict=True)
            for name in names]
        self.reader_endpoints: list[tuple[str, str]] = [
            (zone, self._cfn_instance(names[0]).attr_endpoint_address)
            for zone, names in zip(zones, reader_ids, strict=True)]
        """(AZ, instance endpoint hostname) of each zone's first reader: what ``--reader`` takes."""
        self.alarms: dict[str, cw.Alarm] = self._alarms(plan)
        self.rotation_security_group, self.rotation_schedule = self._rotation(network)
        acknowledge(self.cluster, {
            "AwsSolutions-RDS11": (
                f"PostgreSQL's default port {PORT} is kept: the orchestrators and loaders name it, a different port "
                "hides nothing from a scan inside the VPC, and the security group admits only allow_from peers"),
        })
        for name in ["Writer", *(n for names in reader_ids for n in names)]:
            acknowledge(self._cfn_instance(name), {
                f"{pack}-RDSInBackupPlan": (
                    "An Aurora instance holds no data of its own: the cluster volume is backed up continuously "
                    "(backup_retention, point-in-time restore), and an AWS Backup plan would select the cluster")
                for pack in ("NIST.800.53.R5", "HIPAA.Security")})

    # ---- What consumers use -----------------------------------------------------------------------------------------

    def reader_arguments(self) -> list[str]:
        """``ZONE=HOST:PORT`` per zone (tokens in an environment-agnostic stack) for the orchestrator's ``--reader``."""
        return [f"{zone}={host}:{PORT}" for zone, host in self.reader_endpoints]

    @property
    def connections(self) -> ec2.Connections:
        """The cluster's connections (default port ``PORT``)."""
        return self.cluster.connections

    def allow_from(self, peer: ec2.IConnectable, *, description: str) -> None:
        """Admit ``peer`` (an instance fleet's security group, a loader's) to PostgreSQL (``PORT``) only."""
        problems: list[str] = []
        checks.cdk_interface(problems, "allow_from: peer", peer, attributes=("connections",), optional=False,
                             allowed="an ec2.IConnectable (e.g. a security group)",
                             fix="pass the consumer's security group or construct with connections")
        checks.text(problems, "allow_from: description", description,
                    fix="say who connects, e.g. 'RAG orchestrators'")
        if problems:
            raise ConfigurationError(_NAME, problems)
        self.security_group.connections.allow_from(peer, ec2.Port.tcp(PORT), description)

    def credential_statements(self) -> list[iam.PolicyStatement]:
        """What a consumer's customer-managed policy needs to read the master secret: ``secretsmanager:
        GetSecretValue`` and ``DescribeSecret`` on this secret's ARN, and ``kms:Decrypt`` on its key only through
        Secrets Manager in this Region (``kms:ViaService``; "How AWS Secrets Manager uses AWS KMS",
        https://docs.aws.amazon.com/secretsmanager/latest/userguide/security-encryption.html)."""
        return [
            iam.PolicyStatement(sid="ReadVectorStoreSecret", resources=[self.secret.secret_arn],
                                actions=["secretsmanager:GetSecretValue", "secretsmanager:DescribeSecret"]),
            iam.PolicyStatement(
                sid="DecryptVectorStoreSecret", actions=["kms:Decrypt"],
                resources=[self.encryption_key.key_arn],
                conditions={"StringEquals": {"kms:ViaService": f"secretsmanager.{Aws.REGION}.amazonaws.com"}}),
        ]

    # ---- Internals ----------------------------------------------------------------------------------------------

    def _rotation(self, network: PrivateDataPath) -> tuple[ec2.SecurityGroup, secretsmanager.RotationSchedule]:
        """Rotate the master secret with Secrets Manager's hosted rotation: the ``AWS::SecretsManager`` transform
        creates the PostgreSQL single-user rotation function (AWS's code, no function code of ours) in the network's
        private subnets, in a nested stack the transform adds ("AWS::SecretsManager transform",
        https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/transform-aws-secretsmanager.html;
        "HostedRotationLambda", https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/
        aws-properties-secretsmanager-rotationschedule-hostedrotationlambda.html; the CDK CLI deploys with
        CAPABILITY_AUTO_EXPAND). The function reaches the cluster on ``PORT`` (its own security group, admitted by
        the store's) and Secrets Manager through the network's interface endpoint (443 inside the VPC: "Network
        access for Lambda rotation function",
        https://docs.aws.amazon.com/secretsmanager/latest/userguide/rotation-function-network-access.html); the
        secret's key is the store's (the transform's ``KmsKeyArn``). Single-user rotation changes the password the
        consumers use: they re-read the secret when the database refuses it."""
        group = ec2.SecurityGroup(
            self, "RotationSecurityGroup", vpc=network.vpc, allow_all_outbound=False,
            description=f"{_NAME}: rotation function of the master secret, to PostgreSQL and the endpoints only")
        group.add_egress_rule(ec2.Peer.ipv4(network.vpc_cidr), ec2.Port.tcp(443),
                              "Secrets Manager through the interface endpoint")
        self.security_group.connections.allow_from(group, ec2.Port.tcp(PORT), "The master secret's rotation function")
        schedule = self.secret.add_rotation_schedule(
            "Rotation", automatically_after=SECRET_ROTATION_INTERVAL,
            hosted_rotation=secretsmanager.HostedRotation.postgre_sql_single_user(
                vpc=network.vpc, vpc_subnets=network.subnet_selection, security_groups=[group]))
        return group, schedule

    def _cfn_instance(self, name: str) -> rds.CfnDBInstance:
        child = self.cluster.node.find_child(name).node.default_child
        assert isinstance(child, rds.CfnDBInstance)
        return child

    def _monitoring_role(self) -> iam.Role:
        """The Enhanced Monitoring role with the customer-managed equivalent of ``AmazonRDSEnhancedMonitoringRole``:
        RDS writes OS metrics to the ``RDSOSMetrics`` log group it creates ("Setting up and enabling Enhanced
        Monitoring", https://docs.aws.amazon.com/AmazonRDS/latest/AuroraUserGuide/USER_Monitoring.OS.Enabling.html)."""
        role = iam.Role(self, "MonitoringRole", assumed_by=iam.ServicePrincipal("monitoring.rds.amazonaws.com"),
                        description=f"{_NAME}: Enhanced Monitoring writes OS metrics to RDSOSMetrics")
        group = f"arn:{Aws.PARTITION}:logs:{Aws.REGION}:{Aws.ACCOUNT_ID}:log-group:RDSOSMetrics"
        policy = iam.ManagedPolicy(self, "MonitoringPolicy", roles=[role], description=(
            f"{_NAME}: Enhanced Monitoring to the RDSOSMetrics log group only"), statements=[
            iam.PolicyStatement(sid="CreateAndKeepTheMetricsGroup", resources=[f"{group}:*"],
                                actions=["logs:CreateLogGroup", "logs:PutRetentionPolicy"]),
            iam.PolicyStatement(sid="WriteTheMetrics", resources=[f"{group}:log-stream:*"],
                                actions=["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams",
                                         "logs:GetLogEvents"]),
        ])
        acknowledge(policy, {
            "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:logs:<AWS::Region>:<AWS::AccountId>:log-group:"
            "RDSOSMetrics:*]": "The one log group RDS names for Enhanced Monitoring ('...:*' is the group's own ARN "
                               "form in IAM)",
            "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:logs:<AWS::Region>:<AWS::AccountId>:log-group:"
            "RDSOSMetrics:log-stream:*]": "RDS names one stream per instance resource id, not known before the "
                                          "instances exist",
        })
        return role

    def _alarms(self, plan: VectorStorePlan) -> dict[str, cw.Alarm]:
        """Per reader: CPU (the queries term), freeable memory (the memory term), replica lag (stale chunks)."""
        alarms: dict[str, cw.Alarm] = {}
        action = cw_actions.SnsAction(self.topic)
        for index, (zone, instance) in enumerate(self._readers, start=1):
            dimensions = {"DBInstanceIdentifier": instance.ref}

            def metric(name: str, statistic: str, dimensions: dict[str, str] = dimensions) -> cw.Metric:
                return cw.Metric(namespace="AWS/RDS", metric_name=name, dimensions_map=dimensions,
                                 statistic=statistic, period=Duration.minutes(1))

            where = f"reader {index} ({zone})" if not Token.is_unresolved(zone) else f"reader {index}"
            for key, metric_, threshold, comparison, text in (
                ("CpuUtilization", metric("CPUUtilization", "Average"), CPU_ALARM_PERCENT,
                 cw.ComparisonOperator.GREATER_THAN_THRESHOLD,
                 f"CPU above {CPU_ALARM_PERCENT:g} %: the top-k load outgrew the plan ({plan.queries_per_s_needed:.0f}"
                 " queries/s per zone); add readers or a larger class"),
                ("FreeableMemory", metric("FreeableMemory", "Minimum"),
                 plan.memory_gib * 2**30 * FREEABLE_MEMORY_ALARM_FRACTION, cw.ComparisonOperator.LESS_THAN_THRESHOLD,
                 f"freeable memory below {FREEABLE_MEMORY_ALARM_FRACTION:.0%} of {plan.memory_gib:g} GiB: the corpus "
                 "no longer fits the cache; choose a larger class"),
                ("ReplicaLag", metric("AuroraReplicaLag", "Maximum"), REPLICA_LAG_ALARM_MS,
                 cw.ComparisonOperator.GREATER_THAN_THRESHOLD,
                 f"replica lag above {REPLICA_LAG_ALARM_MS:g} ms: the reader serves chunks a load has replaced"),
            ):
                alarm = cw.Alarm(self, f"Reader{index}{key}Alarm", metric=metric_, threshold=threshold,
                                 comparison_operator=comparison, evaluation_periods=ALARM_EVALUATION_PERIODS,
                                 datapoints_to_alarm=ALARM_DATAPOINTS,
                                 treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
                                 alarm_description=f"{_NAME} {where}: {text}")
                alarm.add_alarm_action(action)
                alarms[f"Reader{index}{key}"] = alarm
        return alarms


def _engine() -> rds.IClusterEngine:
    return rds.DatabaseClusterEngine.aurora_postgres(version=DEFAULT_ENGINE_VERSION)


def _zones(network: PrivateDataPath) -> list[str]:
    """One AZ name per zone of the network's chosen subnets (tokens in an environment-agnostic stack)."""
    selection = network.subnet_selection._values  # jsii keeps a struct's fields here (as PrivateDataPath does)
    return [s.availability_zone for s in network.vpc.select_subnets(**{**selection, "one_per_az": True}).subnets]


def _validate(
    *, scope: object, id: object, network: object, traffic: object, dimension: object, instance_class: object,
    readers_per_zone: object, deletion_protection: object, removal_policy: object, backup_retention: object,
    notifications_topic: object,
) -> list[str]:
    """Check every argument, gather every problem, raise once (before the construct joins the tree); the zones."""
    problems: list[str] = []
    checks.instance_of(problems, "scope", scope, Construct, allowed="a construct (a Stack or a Construct)",
                       fix=f"pass the stack: {_NAME}(stack, 'VectorStore', ...)")
    checks.text(problems, "id", id, fix=f"pass the construct id: {_NAME}(stack, 'VectorStore', ...)")
    checks.id_in_use(problems, scope, id, construct=_NAME)
    network_ok = checks.instance_of(
        problems, "network", network, PrivateDataPath, allowed="a PrivateDataPath",
        fix="PrivateDataPath(stack, 'Net', extra_interface_endpoints=['secretsmanager'])")
    checks.instance_of(problems, "traffic", traffic, RagTraffic, allowed="a RagTraffic",
                       fix="e.g. traffic=RagTraffic(requests_per_s=50, stored_chunks=2_000_000)")
    checks.whole_number(problems, "dimension", dimension, minimum=1, maximum=2000,
                        fix="the encoder's output width, e.g. 384 for all-MiniLM-L6-v2 (pgvector's HNSW indexes "
                            "vectors of up to 2,000 dimensions)")
    known = [c.instance_class for c in aurora_instance_classes()]
    if instance_class is not None and instance_class not in known:
        problems.append(f"instance_class ({instance_class!r}) is not a class the planner knows: use one of "
                        f"{', '.join(known)}, or None to let the plan choose")
    checks.whole_number(problems, "readers_per_zone", readers_per_zone, minimum=1, optional=True,
                        maximum=MAX_READERS_PER_CLUSTER,
                        fix="at least one reader per zone serves that zone's retrievers; None takes the plan's")
    checks.flag(problems, "deletion_protection", deletion_protection)
    checks.instance_of(problems, "removal_policy", removal_policy, RemovalPolicy, allowed="a RemovalPolicy",
                       fix="e.g. RemovalPolicy.SNAPSHOT (the default)")
    if checks.instance_of(problems, "backup_retention", backup_retention, Duration, allowed="a Duration",
                          fix="e.g. Duration.days(7) (the default)"):
        assert isinstance(backup_retention, Duration)
        days = backup_retention.to_days()
        if not Token.is_unresolved(days) and not 1 <= days <= 35:
            problems.append(f"backup_retention ({days:g} days) must be 1-35 days (Aurora's range): e.g. "
                            "Duration.days(7)")
    checks.cdk_interface(problems, "notifications_topic", notifications_topic, attributes=("topic_arn",),
                         allowed="an sns.ITopic", fix="pass a topic, or leave it None for a new encrypted one")
    zones: list[str] = []
    if network_ok:
        assert isinstance(network, PrivateDataPath)
        if "secretsmanager" not in network.interface_endpoints:
            problems.append(
                "network has no Secrets Manager interface endpoint: the orchestrators and loaders read the "
                "database secret from private subnets without NAT; build it with PrivateDataPath(stack, 'Net', "
                "extra_interface_endpoints=['secretsmanager'])")
        zones = _zones(network)
        if readers_per_zone is not None and isinstance(readers_per_zone, int) and not isinstance(
                readers_per_zone, bool) and readers_per_zone * len(zones) > MAX_READERS_PER_CLUSTER:
            problems.append(f"readers_per_zone ({readers_per_zone}) x {len(zones)} zones exceeds Aurora's "
                            f"{MAX_READERS_PER_CLUSTER} readers per cluster: lower it")
    if problems:
        raise ConfigurationError(_NAME, problems)
    return zones
