"""The loader service: the embedding fleet's output objects into the pgvector store, as they land, idempotently.

Two commands (``python -m genai_constructs.runtime.vector_loader``)::

    load-queue --queue-url URL --host HOST --port 5432 --database rag --table rag_chunks --dimension 384 \\
               --secret-arn ARN --region us-east-1
    load-s3    --bucket B --prefix embeddings/ --host HOST ... (the same database flags)

``load-queue`` long-polls a queue fed by the S3 event notifications of the embedding fleet's OUTPUT bucket
(``ObjectCreated`` for ``*.embeddings.jsonl``; the message format is S3's, "Event message structure",
https://docs.aws.amazon.com/AmazonS3/latest/userguide/notification-content-structure.html, read by
``batch_worker.parse_message``), loads each object with ``vector_store.load_outputs`` (an upsert keyed by
``<source>#<chunk>``, so a redelivered message changes nothing) and deletes the message only after the load's last
transaction committed. An object that is not an embeddings object is skipped (its message deleted); one that fails
to load is left to come back after ``--failure-backoff`` seconds, and the queue's redrive policy moves it to its
dead-letter queue after ``maxReceiveCount`` receives. ``load-s3`` is the one-shot backfill: every
``*.embeddings.jsonl`` object under the prefix, in key order; re-running it is safe.

Credentials come from a Secrets Manager secret in the form RDS and Aurora use for database credentials: a JSON object
with ``username`` and ``password`` and, optionally, ``host``, ``port`` and ``dbname`` ("JSON structure of AWS Secrets
Manager secrets", "Amazon RDS and Aurora credentials",
https://docs.aws.amazon.com/secretsmanager/latest/userguide/reference_secret_json_structure.html). A flag wins over
the secret's field (``--host`` over ``host``). The connection uses ``sslmode=require`` by default: Aurora PostgreSQL
accepts TLS connections with a certificate RDS creates for the cluster, and ``rds.force_ssl`` can refuse any other
(https://docs.aws.amazon.com/AmazonRDS/latest/AuroraUserGuide/AuroraPostgreSQL.Security.html); ``--sslmode
verify-full`` with ``PGSSLROOTCERT`` (the RDS CA bundle) also checks the server's name. ``--sslmode disable`` exists
for a local test server only.

Every flag has a ``GENAI_*`` variable (:data:`ENV`). Exit status: 0 after a stop (SIGTERM/SIGINT) or a finished
backfill, 2 for bad settings, 1 when AWS or the database cannot be reached at start; one line per problem, never a
traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from genai_constructs.runtime.batch_worker import (
    DEFAULT_FAILURE_BACKOFF_S,
    DEFAULT_VISIBILITY_TIMEOUT_S,
    DEFAULT_WAIT_TIME_SECONDS,
    MAX_VISIBILITY_TIMEOUT_S,
    MAX_WAIT_TIME_SECONDS,
    OUTPUT_SUFFIX,
    MalformedMessageError,
    bucket_name_problem,
    check_settings,
    explain_aws_error,
    parse_message,
    receive_messages,
    region_problem,
    report_problems,
    retry_soon,
    whole_numbers,
)

LOG = logging.getLogger("genai_constructs.vector_loader")

DEFAULT_PORT = "5432"
"""PostgreSQL's (and Aurora PostgreSQL's) default port."""
DEFAULT_DATABASE = "rag"
DEFAULT_SSLMODE = "require"
"""TLS always (Aurora supports it, see the module doc); verify-full additionally checks the certificate's host name."""
SSLMODES = ("require", "verify-ca", "verify-full", "disable")
"""libpq's modes that this loader accepts: the three that never fall back to plain text, and disable for local tests
(prefer and allow would silently fall back)."""
ENV = {
    "queue_url": "GENAI_QUEUE_URL", "bucket": "GENAI_BUCKET", "prefix": "GENAI_PREFIX", "host": "GENAI_DB_HOST",
    "port": "GENAI_DB_PORT", "database": "GENAI_DB_NAME", "table": "GENAI_DB_TABLE", "dimension": "GENAI_DB_DIMENSION",
    "secret_arn": "GENAI_DB_SECRET_ARN", "region": "GENAI_REGION", "sslmode": "GENAI_DB_SSLMODE",
    "wait_time_seconds": "GENAI_WAIT_TIME_SECONDS", "visibility_timeout_s": "GENAI_VISIBILITY_TIMEOUT_S",
    "failure_backoff_s": "GENAI_FAILURE_BACKOFF_S",
}
"""Setting -> environment variable."""
FLAGS = {
    "queue_url": "--queue-url", "bucket": "--bucket", "prefix": "--prefix", "host": "--host", "port": "--port",
    "database": "--database", "table": "--table", "dimension": "--dimension", "secret_arn": "--secret-arn",
    "region": "--region", "sslmode": "--sslmode", "wait_time_seconds": "--wait-time",
    "visibility_timeout_s": "--visibility-timeout", "failure_backoff_s": "--failure-backoff",
}
"""Setting -> flag (both commands take every database flag; --queue-url is load-queue's, --bucket/--prefix load-s3's)."""
_DEFAULTS: dict[str, str | None] = {
    "queue_url": None, "bucket": None, "prefix": "", "host": None, "port": None, "database": None,
    "table": "rag_chunks", "dimension": None, "secret_arn": None, "region": None, "sslmode": DEFAULT_SSLMODE,
    "wait_time_seconds": str(DEFAULT_WAIT_TIME_SECONDS), "visibility_timeout_s": str(DEFAULT_VISIBILITY_TIMEOUT_S),
    "failure_backoff_s": str(DEFAULT_FAILURE_BACKOFF_S),
}
_INT_RANGES: dict[str, tuple[int, int | None, str]] = {
    "dimension": (1, 2000, "the encoder's dimension, e.g. --dimension 384"),
    "wait_time_seconds": (0, MAX_WAIT_TIME_SECONDS, "e.g. --wait-time 20 (SQS long polling)"),
    "visibility_timeout_s": (1, MAX_VISIBILITY_TIMEOUT_S, "e.g. --visibility-timeout 300"),
    "failure_backoff_s": (0, MAX_VISIBILITY_TIMEOUT_S, "e.g. --failure-backoff 10"),
}


SECRET_ARN_EXAMPLE = "arn:aws:secretsmanager:us-east-1:123456789012:secret:rag-db-AbCdEf"
_SECRET_ARN = re.compile(r"arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:[A-Za-z0-9/_+=.@-]+")
"""A secret's ARN: ``arn:PARTITION:secretsmanager:REGION:ACCOUNT:secret:NAME-SUFFIX``, a name of letters, digits and
``/_+=.@-`` (Secrets Manager API reference, CreateSecret "Name";
https://docs.aws.amazon.com/secretsmanager/latest/apireference/API_CreateSecret.html, and the resource types of
https://docs.aws.amazon.com/service-authorization/latest/reference/list_awssecretsmanager.html)."""


def secret_arn_problem(arn: str) -> str | None:
    """Why ``arn`` is not a Secrets Manager secret ARN, or None (the orchestrator's ``--secret-arn`` check too)."""
    if _SECRET_ARN.fullmatch(arn):
        return None
    service = arn.split(":")[2] if arn.startswith("arn:") and arn.count(":") >= 2 else ""
    if service and service != "secretsmanager":
        return f"{arn!r} is an ARN of {service}, not of a Secrets Manager secret"
    return f"{arn!r} is not a Secrets Manager secret ARN"


@dataclass(frozen=True)
class LoaderSettings:
    command: str
    queue_url: str
    bucket: str
    prefix: str
    host: str | None
    port: int | None
    database: str | None
    table: str
    dimension: int
    secret_arn: str
    region: str | None
    sslmode: str
    wait_time_seconds: int
    visibility_timeout_s: int
    failure_backoff_s: int


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m genai_constructs.runtime.vector_loader",
                                     description="Load embedding outputs into PostgreSQL/pgvector.")
    commands = parser.add_subparsers(dest="command", required=True)
    for command, text in (("load-queue", "long-poll a queue of S3 notifications of *.embeddings.jsonl objects"),
                          ("load-s3", "load every *.embeddings.jsonl object under a prefix once (backfill)")):
        sub = commands.add_parser(command, help=text)
        for name, flag in FLAGS.items():
            sub.add_argument(flag, dest=name, default=None, help=f"(env {ENV[name]})")
    return parser


def loader_settings(argv: Sequence[str] | None = None, environ: dict[str, str] | None = None,
                    ) -> tuple[LoaderSettings | None, list[str]]:
    """The settings and every problem found (each naming the flag or variable, the value and the fix)."""
    from genai_constructs.runtime.vector_store import VectorStoreError, _check_table

    args = _parser().parse_args(argv)
    required = ["dimension", "secret_arn", "queue_url" if args.command == "load-queue" else "bucket"]
    check = check_settings(args, FLAGS, ENV, _DEFAULTS, environ, required=required, queue_urls=("queue_url",))
    values, problems, problem = check.values, check.problems, check.problem
    queue_url, bucket = values["queue_url"] or "", values["bucket"] or ""
    if bucket and bucket_name_problem(bucket):
        problem("bucket", f"{bucket_name_problem(bucket)}; give the embedding output bucket's name, e.g. --bucket "
                          "my-vectors (the key prefix is --prefix)")
    secret = values["secret_arn"] or ""
    if secret and secret_arn_problem(secret):
        problem("secret_arn", f"{secret_arn_problem(secret)}; give the cluster's secret, e.g. --secret-arn "
                              f"{SECRET_ARN_EXAMPLE}")
    region = values["region"] or None
    if region and region_problem(region):
        problem("region", f"{region_problem(region)}; give e.g. --region us-east-1")
    if values["sslmode"] not in SSLMODES:
        problem("sslmode", f"{values['sslmode']!r} is not one of {', '.join(SSLMODES)}; give --sslmode require")
    try:
        _check_table(values["table"] or "")
    except VectorStoreError as error:
        problem("table", str(error).replace("table='rag_chunks'", "--table rag_chunks").replace("table=", ""))
    port: int | None = None
    if values["port"]:
        port = whole_numbers(values, {"port": (1, 65535, "e.g. --port 5432")}, problem).get("port")
    numbers = whole_numbers(values, {k: v for k, v in _INT_RANGES.items() if values[k]}, problem)
    if problems:
        return None, problems
    return LoaderSettings(
        command=args.command, queue_url=queue_url, bucket=bucket, prefix=values["prefix"] or "",
        host=values["host"] or None, port=port, database=values["database"] or None, table=values["table"] or "",
        dimension=numbers["dimension"], secret_arn=secret, region=region, sslmode=values["sslmode"] or "",
        wait_time_seconds=numbers["wait_time_seconds"], visibility_timeout_s=numbers["visibility_timeout_s"],
        failure_backoff_s=numbers["failure_backoff_s"],
    ), problems


def connection_parameters(secret_string: str, settings: LoaderSettings) -> dict[str, Any]:
    """psycopg ``connect`` keywords from the RDS-form secret and the flags (a flag wins); ValueError naming what is
    missing."""
    try:
        secret = json.loads(secret_string)
    except json.JSONDecodeError:
        raise ValueError("the secret is not JSON: store it in the RDS form {\"username\": ..., \"password\": ...}"
                         ) from None
    if not isinstance(secret, dict) or not isinstance(secret.get("username"), str) or "password" not in secret:
        raise ValueError("the secret lacks username or password: store it in the RDS form "
                         "{\"username\": ..., \"password\": ..., \"host\": ..., \"port\": ..., \"dbname\": ...}")
    host = settings.host or secret.get("host")
    if not host:
        raise ValueError("no database host: pass --host (the cluster's writer endpoint) or add host to the secret")
    return {
        "host": host, "port": settings.port or int(secret.get("port") or DEFAULT_PORT),
        "dbname": settings.database or secret.get("dbname") or DEFAULT_DATABASE, "user": secret["username"],
        "password": str(secret["password"]), "sslmode": settings.sslmode, "connect_timeout": 10,
    }


class Loader:
    """Loads embeddings objects from S3 into one table; ``load-queue`` and ``load-s3`` share it."""

    def __init__(self, settings: LoaderSettings, *, connection: Any, s3: Any, sqs: Any | None = None) -> None:
        self.settings = settings
        self.connection = connection
        self.s3 = s3
        self.sqs = sqs
        self._stop = threading.Event()
        self.counters = {"objects": 0, "records": 0, "rows_written": 0, "rows_removed": 0, "messages": 0}
        self.lost_connection = False

    def request_stop(self, reason: str) -> None:
        LOG.warning("stopping: %s", reason)
        self._stop.set()

    def _read_source(self, source: str) -> tuple[str, str]:
        bucket, _, key = source.removeprefix("s3://").partition("/")
        try:
            response = self.s3.get_object(Bucket=bucket, Key=key)
        except Exception as error:
            raise OSError(f"GetObject failed: {error}") from None
        return response["Body"].read().decode("utf-8-sig"), str(response.get("ETag", ""))

    def load_object(self, bucket: str, key: str) -> None:
        """Load one embeddings object (every row committed when this returns)."""
        from genai_constructs.runtime.vector_store import load_outputs

        text = self.s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode()
        report = load_outputs(self.connection, [(f"s3://{bucket}/{key}", text)], self._read_source,
                              dimension=self.settings.dimension, table=self.settings.table)
        for source in report.skipped_sources:
            LOG.warning("skipped %s", source)
        self.counters["objects"] += report.objects
        self.counters["records"] += report.records
        self.counters["rows_written"] += report.rows_written
        self.counters["rows_removed"] += report.rows_removed

    def load_s3(self) -> int:
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.settings.bucket,
                                                                  Prefix=self.settings.prefix)
        for page in pages:
            for item in page.get("Contents", []):
                if item["Key"].endswith(OUTPUT_SUFFIX):
                    self.load_object(self.settings.bucket, item["Key"])
        LOG.info("backfill done: %s", self.counters)
        return 0

    def run_queue(self) -> int:
        while not self._stop.is_set():
            self.receive_once()
        LOG.info("stopped; counters %s", self.counters)
        return 1 if self.lost_connection else 0

    def receive_once(self) -> None:
        assert self.sqs is not None
        url = self.settings.queue_url
        messages = receive_messages(self.sqs, url, max_messages=10, wait_time_seconds=self.settings.wait_time_seconds,
                                    visibility_timeout_s=self.settings.visibility_timeout_s, stop=self._stop)
        for message in messages:
            try:
                work = parse_message(message.get("Body", ""))
                if work is not None:
                    for key in work.keys:
                        if key.endswith(OUTPUT_SUFFIX):
                            self.load_object(work.bucket, key)
            except MalformedMessageError as error:
                LOG.error("message %s is not an S3 notification (%s); deleting it", message["MessageId"], error)
            except Exception as error:  # S3, the database, or a malformed object: retried, then redriven
                LOG.warning("message %s: load failed (%s: %s); retrying in %d s", message["MessageId"],
                            type(error).__name__, error, self.settings.failure_backoff_s)
                self._rollback()
                retry_soon(self.sqs, url, message["MessageId"], message["ReceiptHandle"], self.settings.failure_backoff_s)
                if getattr(self.connection, "closed", False):
                    # psycopg never reopens a connection the server dropped (a writer failover, a reboot): every
                    # later load would fail and its message drift to the dead-letter queue. Stop with status 1
                    # instead; systemd restarts the loader, which reads the secret again and connects afresh.
                    self.lost_connection = True
                    self.request_stop("the database connection was closed; exiting so the service restarts")
                    return
                continue
            try:
                self.sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
                self.counters["messages"] += 1
            except Exception as error:  # the load is idempotent: a redelivery changes nothing
                LOG.warning("delete failed (%s); a redelivery reloads the same rows", error)

    def _rollback(self) -> None:
        try:
            self.connection.rollback()
        except Exception as error:  # a broken connection: the next call fails the same way and is retried
            LOG.warning("rollback failed: %s", error)


REGION_FIX = "pass --region or set AWS_DEFAULT_REGION"
ENDPOINT_FIX = "check that the subnet reaches SQS, S3 and Secrets Manager (VPC endpoints), and AWS_ENDPOINT_URL"


def main(argv: Sequence[str] | None = None) -> int:
    """Run a command: 2 for bad settings, 1 when AWS or the database cannot be reached at start."""
    settings, problems = loader_settings(argv)
    if settings is None:
        return report_problems("vector_loader", problems)
    import boto3  # type: ignore[import-untyped]
    import psycopg

    try:
        session = boto3.session.Session(region_name=settings.region)
        s3 = session.client("s3")
        sqs = session.client("sqs") if settings.command == "load-queue" else None
        if sqs is not None:
            sqs.get_queue_attributes(QueueUrl=settings.queue_url, AttributeNames=["VisibilityTimeout"])
        secret_value = session.client("secretsmanager").get_secret_value(SecretId=settings.secret_arn)
        if sqs is None:
            # A missing bucket would otherwise show only after the database connection, as a traceback mid-backfill.
            s3.head_bucket(Bucket=settings.bucket)
    except Exception as error:
        sentence = explain_aws_error(error, region_fix=REGION_FIX, endpoint_fix=ENDPOINT_FIX,
                                     queue_url=settings.queue_url or None, bucket=settings.bucket or None)
        if "ResourceNotFoundException" in str(getattr(error, "response", {}).get("Error", {}).get("Code", "")):
            # GetSecretValue's code for a secret that is not there (API_GetSecretValue, "Errors",
            # https://docs.aws.amazon.com/secretsmanager/latest/apireference/API_GetSecretValue.html).
            sentence = (f"the secret {settings.secret_arn} does not exist (or is in another Region or account): give "
                        f"the database's secret ARN and its Region; {REGION_FIX}")
        print(f"vector_loader: error: {sentence}", file=sys.stderr)
        return 1
    secret = secret_value.get("SecretString")
    if not isinstance(secret, str):
        # GetSecretValue returns SecretString or SecretBinary, whichever was stored (API_GetSecretValue, "Response
        # Elements", https://docs.aws.amazon.com/secretsmanager/latest/apireference/API_GetSecretValue.html).
        print(f"vector_loader: error: argument --secret-arn: {settings.secret_arn} holds a binary secret, not the RDS "
              "form's JSON text: store it as SecretString {\"username\": ..., \"password\": ...}", file=sys.stderr)
        return 2
    try:
        parameters = connection_parameters(secret, settings)
        # autocommit: each of load_outputs' transaction() blocks is its own BEGIN ... COMMIT.
        connection = psycopg.connect(**parameters, autocommit=True)
    except ValueError as error:
        print(f"vector_loader: error: argument --secret-arn: {error}", file=sys.stderr)
        return 2
    except psycopg.Error as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"vector_loader: error: cannot connect to the database ({first}): check --host, --port, the security "
              "group and the secret's credentials", file=sys.stderr)
        return 1
    # Logging starts after the checks, so a failed start is the one line above and nothing else.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    with connection:
        loader = Loader(settings, connection=connection, s3=s3, sqs=sqs)
        if settings.command == "load-s3":
            try:
                return loader.load_s3()
            except Exception as error:  # one sentence, not a traceback; re-running the backfill is safe
                sentence = explain_aws_error(error, region_fix=REGION_FIX, endpoint_fix=ENDPOINT_FIX,
                                             bucket=settings.bucket)
                print(f"vector_loader: error: the backfill stopped after {loader.counters['objects']} objects: "
                      f"{sentence}; fix it and run load-s3 again (loaded rows are upserted, not duplicated)",
                      file=sys.stderr)
                return 1
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda number, _frame: loader.request_stop(signal.Signals(number).name))
        return loader.run_queue()


if __name__ == "__main__":
    sys.exit(main())
