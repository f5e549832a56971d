"""Deploy CDK stacks with the real CDK CLI to a moto server on 127.0.0.1, then verify what it created.

The flow: start ``moto_server`` on a free loopback port, run ``cdk deploy`` against it with fake credentials,
check through boto3 that each resource moto creates holds the settings the template asked for, check in the
template what moto accepts but does not create (warm pools, scaling policies, alarms, placement groups),
print a short report and stop moto.

Stacks choose the bootstrapless synthesizer only when the ``local`` context flag (``cdk deploy -c local=true``)
or the ``GENAI_CONSTRUCTS_LOCAL`` environment variable is set: a stack users deploy to AWS keeps the default
synthesizer. Run it with ``python -m genai_constructs.testing`` (``make deploy-local``).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # importing constructs starts the jsii runtime; the harness itself needs none
    from constructs import IConstruct

LOCAL_CONTEXT_KEY = "local"
"""Context key that selects the bootstrapless synthesizer: ``cdk deploy -c local=true``."""
LOCAL_ENV_VAR = "GENAI_CONSTRUCTS_LOCAL"
"""Environment variable with the same effect as the context key, for apps that read no context."""
LOCAL_ASSETS_BUCKET = "genai-constructs-local-assets"
"""Bucket in moto the CDK CLI publishes file assets (custom resource Lambda code) to; created before each deploy."""
LOOPBACK = "127.0.0.1"
"""moto listens on loopback only: nothing leaves the machine."""
REGION = "us-east-1"
"""moto's default region; its default VPC and AMIs live there."""
FAKE_ACCOUNT = "123456789012"
"""The account moto reports for any credentials."""
MOTO_START_TIMEOUT_S = 30.0
"""moto_server imports every service backend on start; 30 s covers a cold start on a 2-core machine."""
CLI_TIMEOUT_S = 600.0
"""A deploy to moto takes seconds; ten minutes means something hangs."""
DEFAULT_CONCURRENCY = 4
"""Stacks deployed in parallel by one CLI call; moto answers each in well under a second."""

_TRUE = {"1", "true", "yes", "on"}


def is_local(scope: IConstruct) -> bool:
    """Whether this synthesis targets the local emulator (context ``local=true`` or ``GENAI_CONSTRUCTS_LOCAL=1``)."""
    value = scope.node.try_get_context(LOCAL_CONTEXT_KEY)
    if value is None:
        value = os.environ.get(LOCAL_ENV_VAR)
    return str(value).strip().lower() in _TRUE


def local_synthesizer() -> Any:
    """The synthesizer for stacks deployed to the local emulator: no bootstrap stack, assets to the local bucket.

    A ``CliCredentialsStackSynthesizer`` publishing file assets to ``LOCAL_ASSETS_BUCKET`` (the harness creates it in
    moto). Like ``BootstraplessSynthesizer`` it needs no bootstrap stack, no roles and no bootstrap version
    parameter, but it also accepts assets: the custom resource CDK adds to restrict a VPC's default security group
    ships its Lambda code as one, and ``BootstraplessSynthesizer`` refuses any asset.
    """
    from aws_cdk import CliCredentialsStackSynthesizer

    return CliCredentialsStackSynthesizer(file_assets_bucket_name=LOCAL_ASSETS_BUCKET, bucket_prefix="")


def stack_synthesizer(scope: IConstruct, local: bool | None = None) -> Any:
    """The synthesizer a stack under ``scope`` should use: :func:`local_synthesizer` for the emulator, else ``None``.

    ``local`` None reads the flag (:func:`is_local`). ``None`` as the result keeps the CDK default
    (``DefaultStackSynthesizer``), which is what users deploying to AWS need.
    """
    if local is None:
        local = is_local(scope)
    return local_synthesizer() if local else None


class LocalDeployError(RuntimeError):
    """The emulator did not start or the CDK CLI failed; the message carries the tail of its output."""


# --------------------------------------------------------------------------------------------------- moto server


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def _moto_server_bin() -> str:
    beside = Path(sys.executable).with_name("moto_server")
    if beside.exists():
        return str(beside)
    found = shutil.which("moto_server")
    if found is None:
        raise LocalDeployError("moto_server not found: install the dev extras (pip install -e '.[dev]')")
    return found


@dataclass
class MotoServer:
    """A moto server process on 127.0.0.1; use :func:`moto_server` to start and stop one."""

    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def endpoint_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def reset(self) -> None:
        """Drop every resource (``cdk destroy`` of a VPC stack fails on moto; a reset is the clean-up)."""
        request = urllib.request.Request(f"{self.endpoint_url}/moto-api/reset", method="POST")
        with urllib.request.urlopen(request, timeout=10):
            pass

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment for a process that must talk to this server only: fake credentials, endpoint, region."""
        env = dict(os.environ if base is None else base)
        for key in (
            "AWS_PROFILE",
            "AWS_SESSION_TOKEN",
            "AWS_SECURITY_TOKEN",
            "AWS_CONFIG_FILE",
            "AWS_SHARED_CREDENTIALS_FILE",
            "AWS_ROLE_ARN",
            "AWS_WEB_IDENTITY_TOKEN_FILE",
        ):
            env.pop(key, None)
        env.update(
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            AWS_REGION=REGION,
            AWS_DEFAULT_REGION=REGION,
            AWS_ENDPOINT_URL=self.endpoint_url,
            AWS_EC2_METADATA_DISABLED="true",
        )
        return env

    def session(self) -> Any:
        """A boto3 session whose clients all go to this server."""
        import boto3  # type: ignore[import-untyped]

        return _EndpointSession(
            boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing", region_name=REGION),
            self.endpoint_url,
        )


@dataclass
class _EndpointSession:
    inner: Any
    endpoint_url: str

    def client(self, service: str) -> Any:
        return self.inner.client(service, endpoint_url=self.endpoint_url)


@contextmanager
def moto_server(port: int | None = None) -> Iterator[MotoServer]:
    """Start ``moto_server`` on 127.0.0.1 (a free port unless given), wait until it answers, stop it on exit."""
    port = port or _free_port()
    log_dir = Path(tempfile.mkdtemp(prefix="moto-"))
    log_path = log_dir / "moto.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [_moto_server_bin(), "-H", LOOPBACK, "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = MotoServer(port=port, process=process, log_path=log_path)
    try:
        deadline = time.monotonic() + MOTO_START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                raise LocalDeployError(f"moto_server exited with {process.returncode}:\n{_tail(log_path.read_text())}")
            try:
                with urllib.request.urlopen(f"{server.endpoint_url}/moto-api/data.json", timeout=1):
                    break
            except OSError as error:
                if time.monotonic() > deadline:
                    raise LocalDeployError(
                        f"moto_server did not answer on port {port} within {MOTO_START_TIMEOUT_S} s"
                    ) from error
                time.sleep(0.1)
        yield server
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        shutil.rmtree(log_dir, ignore_errors=True)


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


# --------------------------------------------------------------------------------------------------- CDK CLI


def find_cdk_cli(start: Path | None = None) -> list[str]:
    """The pinned CDK CLI (``node_modules/.bin/cdk`` in this directory or a parent), else ``npx cdk``."""
    here = (start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        candidate = directory / "node_modules" / ".bin" / "cdk"
        if candidate.exists():
            return [str(candidate)]
    return ["npx", "--no-install", "cdk"]


def _cli_env(server: MotoServer, cdk_home: Path) -> dict[str, str]:
    env = server.env()
    env.update(
        # moto finds a template uploaded to its S3 only when the URL's host is "localhost"; it still resolves to
        # the loopback address moto listens on.
        AWS_ENDPOINT_URL=f"http://localhost:{server.port}",
        CDK_HOME=str(cdk_home),  # keeps the CLI's cache and settings out of ~/.cdk
        CDK_DISABLE_VERSION_CHECK="1",  # the version check calls the npm registry
        CDK_DISABLE_CLI_TELEMETRY="true",
        JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION="1",
        JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="20,18",
        NODE_NO_WARNINGS="1",
        GENAI_CONSTRUCTS_LOCAL="1",
    )
    return env


@dataclass(frozen=True)
class CliRun:
    """One CDK CLI deploy: where its cloud assembly is, how long it took, its output."""

    assembly: Path
    seconds: float
    stack_seconds: dict[str, float]
    output: str


_DEPLOY_TIME = re.compile(r"^\s*✅\s+(\S+)", re.MULTILINE)
_STACK_TIME = re.compile(r"Deployment time:\s*([0-9.]+)s")


def cdk_deploy(
    server: MotoServer,
    app: str | Path,
    *,
    stacks: Sequence[str] = (),
    concurrency: int = DEFAULT_CONCURRENCY,
    cwd: Path | None = None,
    cli: Sequence[str] | None = None,
) -> CliRun:
    """Run ``cdk deploy`` of ``app`` against ``server``.

    ``app`` is an app command (``".venv/bin/python app.py"``, synthesized by the CLI with ``-c local=true``) or a
    cloud assembly directory synthesized beforehand (see :func:`synth_local`). ``stacks`` empty means ``--all``.
    """
    cwd = Path(cwd or Path.cwd()).resolve()
    work = Path(tempfile.mkdtemp(prefix="cdk-local-"))
    assembly = Path(app) if _is_assembly(app) else work / "cdk.out"
    command = [
        *(cli or find_cdk_cli(cwd)),
        "deploy",
        *(list(stacks) or ["--all"]),
        "--app",
        str(app),
        *([] if _is_assembly(app) else ["--output", str(assembly)]),
        "--context",
        f"{LOCAL_CONTEXT_KEY}=true",
        "--require-approval",
        "never",
        "--method=direct",  # no change sets: moto's change-set support is partial and slower
        "--concurrency",
        str(concurrency),
        "--no-notices",
        "--no-version-reporting",
        "--progress",
        "events",
    ]
    started = time.monotonic()
    output = _run_cli(command, cwd, _cli_env(server, work / "cdk-home"))
    seconds = time.monotonic() - started
    return CliRun(assembly=assembly, seconds=seconds, stack_seconds=_stack_seconds(output), output=output)


def cdk_synth(
    server: MotoServer, app: str, *, cwd: Path | None = None, cli: Sequence[str] | None = None
) -> tuple[Path, float]:
    """``cdk synth`` of an app command with ``-c local=true``; returns the cloud assembly directory and seconds."""
    cwd = Path(cwd or Path.cwd()).resolve()
    work = Path(tempfile.mkdtemp(prefix="cdk-local-"))
    assembly = work / "cdk.out"
    command = [
        *(cli or find_cdk_cli(cwd)),
        "synth",
        "--app",
        app,
        "--output",
        str(assembly),
        "--context",
        f"{LOCAL_CONTEXT_KEY}=true",
        "--quiet",
        "--no-notices",
        "--no-version-reporting",
    ]
    started = time.monotonic()
    _run_cli(command, cwd, _cli_env(server, work / "cdk-home"))
    return assembly, time.monotonic() - started


def _run_cli(command: Sequence[str], cwd: Path, env: Mapping[str, str]) -> str:
    try:
        done = subprocess.run(
            list(command), cwd=cwd, env=dict(env), capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as error:
        raise LocalDeployError(f"cdk did not finish in {CLI_TIMEOUT_S} s: {shlex.join(command)}") from error
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise LocalDeployError(f"cdk failed ({done.returncode}): {shlex.join(command)}\n{_tail(output)}")
    return output


def _stack_seconds(output: str) -> dict[str, float]:
    """Per-stack 'Deployment time' from the CLI output (each follows its stack's ✅ line)."""
    result: dict[str, float] = {}
    current: str | None = None
    for line in output.splitlines():
        done = _DEPLOY_TIME.match(line)
        if done:
            current = done.group(1)
            continue
        timed = _STACK_TIME.search(line)
        if timed and current:
            result[current] = float(timed.group(1))
            current = None
    return result


def _is_assembly(app: str | Path) -> bool:
    return Path(app).is_dir() and (Path(app) / "manifest.json").exists()


def synth_local(build: Callable[[Any], object], outdir: Path | None = None) -> Path:
    """Synthesize ``build(app)`` in this process with the local flag set; return the cloud assembly directory.

    Cheaper than a CLI synth when the jsii runtime is already loaded (tests); the CLI then deploys the assembly.
    """
    from aws_cdk import App

    outdir = outdir or Path(tempfile.mkdtemp(prefix="cdk-local-assembly-"))
    app = App(outdir=str(outdir), context={LOCAL_CONTEXT_KEY: "true"})
    build(app)
    app.synth()
    return outdir


CUSTOM_RESOURCE_TYPES = ("AWS::CloudFormation::CustomResource",)
"""Plus every ``Custom::*`` type: moto runs a custom resource's Lambda only in Docker and waits for its answer."""


def _is_custom_resource(resource_type: str) -> bool:
    return resource_type.startswith("Custom::") or resource_type in CUSTOM_RESOURCE_TYPES


def _references(value: Any) -> set[str]:
    """Logical ids a template fragment points at through Ref, Fn::GetAtt or Fn::Sub."""
    found: set[str] = set()
    if isinstance(value, dict):
        for key, arg in value.items():
            if key == "Ref" and isinstance(arg, str):
                found.add(arg)
            elif key == "Fn::GetAtt":
                found.add(arg[0] if isinstance(arg, list) else str(arg).split(".", 1)[0])
            elif key == "Fn::Sub":
                text = arg[0] if isinstance(arg, list) else arg
                found.update(name.split(".", 1)[0] for name in re.findall(r"\$\{([^}!]+)\}", str(text)))
            found |= _references(arg)
    elif isinstance(value, list):
        for item in value:
            found |= _references(item)
    return found


def strip_custom_resources(template: dict[str, Any]) -> list[tuple[str, str]]:
    """Remove custom resources (and what refers to them) from ``template`` in place; return (logical id, type).

    moto accepts them but never finishes creating them without Docker, so the stack would wait forever;
    they stay in the real template and are reported as template-only.
    """
    resources = template.get("Resources", {})
    removed = {k for k, v in resources.items() if _is_custom_resource(str(v.get("Type")))}
    changed = True
    while changed:
        changed = False
        for logical, resource in list(resources.items()):
            if logical in removed:
                continue
            body = {k: v for k, v in resource.items() if k != "DependsOn"}
            if _references(body) & removed:
                removed.add(logical)
                changed = True
    result = [(logical, str(resources[logical]["Type"])) for logical in sorted(removed)]
    for logical in removed:
        del resources[logical]
    for resource in resources.values():
        depends = resource.get("DependsOn")
        if isinstance(depends, str) and depends in removed:
            del resource["DependsOn"]
        elif isinstance(depends, list):
            kept = [d for d in depends if d not in removed]
            if kept:
                resource["DependsOn"] = kept
            else:
                del resource["DependsOn"]
    outputs = template.get("Outputs", {})
    for name in [n for n, o in outputs.items() if _references(o) & removed]:
        del outputs[name]
    return result


def assembly_for_moto(
    assembly: Path, ssm_substitutes: Mapping[str, str] | None = None, replacements: Mapping[str, str] | None = None
) -> tuple[Path, dict[str, list[tuple[str, str]]]]:
    """A copy of ``assembly`` that moto can deploy: custom resources stripped, reserved SSM parameters (AMI ids)
    substituted, literal strings replaced (certificate ARNs); returns it and what was removed."""
    copy = Path(tempfile.mkdtemp(prefix="cdk-moto-assembly-")) / "cdk.out"
    shutil.copytree(assembly, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    removed: dict[str, list[tuple[str, str]]] = {}
    for artifact_id, artifact in manifest.get("artifacts", {}).items():
        if artifact.get("type") != "aws:cloudformation:stack":
            continue
        properties = artifact.get("properties", {})
        path = copy / properties["templateFile"]
        template = json.loads(path.read_text())
        stripped = strip_custom_resources(template)
        substituted = substitute_ssm_parameters(template, ssm_substitutes or {})
        substituted += ["reference"] * substitute_unresolved_references(template)
        if replacements:
            template["Resources"] = _replace_strings(template.get("Resources", {}), replacements)
        if stripped or substituted or replacements:
            path.write_text(json.dumps(template, indent=1))
        removed[properties.get("stackName", artifact_id)] = stripped
    return copy, removed


def assembly_stacks(assembly: Path) -> dict[str, dict[str, Any]]:
    """Templates of the CloudFormation stacks in a cloud assembly, by stack name."""
    manifest = json.loads((assembly / "manifest.json").read_text())
    stacks: dict[str, dict[str, Any]] = {}
    for artifact_id, artifact in manifest.get("artifacts", {}).items():
        if artifact.get("type") != "aws:cloudformation:stack":
            continue
        properties = artifact.get("properties", {})
        name = properties.get("stackName", artifact_id)
        stacks[name] = json.loads((assembly / properties["templateFile"]).read_text())
    return stacks


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
            f"{got.get('InstanceType', '?')}: IMDSv2 required, {len(volumes)} encrypted EBS volume(s)"
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
            f"min {group['MinSize']} max {group['MaxSize']} in {len(got_subnets)} private subnet(s)"
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
            f"health check {group.get('HealthCheckProtocol')} {group.get('HealthCheckPath')} "
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
        if not _is_custom_resource(str(resource["Type"])):
            continue
        token = _references(resource.get("Properties", {}).get("ServiceToken"))
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


# --------------------------------------------------------------------------------------------------- the flow


@dataclass
class LocalDeployReport:
    """What one local deploy did: stacks, checks, timings."""

    stacks: list[str]
    checks: list[Check]
    synth_seconds: float
    deploy_seconds: float
    stack_seconds: dict[str, float]
    total_seconds: float

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    @property
    def ok(self) -> bool:
        return bool(self.stacks) and not self.failures

    def render(self) -> str:
        synth = f"cdk synth {self.synth_seconds:.1f} s, " if self.synth_seconds else ""
        lines = [
            f"Local deploy to moto: {len(self.stacks)} stack(s); {synth}cdk deploy {self.deploy_seconds:.1f} s; "
            f"{self.total_seconds:.1f} s in all"
        ]
        for stack in self.stacks:
            own = [c for c in self.checks if c.stack == stack]
            seconds = self.stack_seconds.get(stack)
            timing = f", deployed in {seconds:.2f} s" if seconds is not None else ""
            lines.append(f"  {stack}: {sum(c.ok for c in own)}/{len(own)} checks passed{timing}")
            for check in own:
                if check.subject == "stack" and check.ok:
                    continue
                mark = "ok  " if check.ok else "FAIL"
                where = "" if check.source == "moto" else " [template: moto skips it]"
                lines.append(f"    {mark} {check.subject}: {check.detail}{where}")
        lines.append("PASS" if self.ok else f"FAIL: {len(self.failures)} check(s) failed")
        return "\n".join(lines)


def seed_ssm_parameters(server: MotoServer, templates: Mapping[str, dict[str, Any]]) -> dict[str, str]:
    """Give every SSM-typed template parameter moto lacks a value; return the ones to substitute in the templates.

    moto ships only the public Amazon Linux parameters and refuses to create others under ``/aws/`` (reserved), so
    those (the DLAMI AMI-id paths) come back as path -> value for :func:`assembly_for_moto` to put in the template;
    any other missing path is created in moto. An AMI-id parameter gets an image moto knows.
    """
    session = server.session()
    ssm = session.client("ssm")
    image_id: str | None = None
    substitutes: dict[str, str] = {}
    for template in templates.values():
        for parameter in template.get("Parameters", {}).values():
            kind = str(parameter.get("Type", ""))
            path = parameter.get("Default")
            if not kind.startswith("AWS::SSM::Parameter::Value<") or not path or path in substitutes:
                continue
            try:
                ssm.get_parameter(Name=path)
                continue
            except ssm.exceptions.ParameterNotFound:
                pass
            if "Image::Id" in kind:
                if image_id is None:
                    image_id = session.client("ec2").describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
                value = image_id
            else:
                value = "local-placeholder"
            if str(path).startswith("/aws/"):
                substitutes[str(path)] = value
            else:
                ssm.put_parameter(Name=path, Value=value, Type="String", Overwrite=True)
    return substitutes


_ACM_ARN = re.compile(r"arn:aws:acm:[a-z0-9-]+:\d{12}:certificate/[0-9a-f-]+")


def local_certificates(server: MotoServer, templates: Mapping[str, dict[str, Any]]) -> dict[str, str]:
    """ACM certificate ARNs the templates name, each mapped to a certificate requested in moto.

    moto's load balancer refuses a listener whose certificate it does not hold, and ACM ARNs carry a random id,
    so the deployed copy points at a moto certificate instead; the verifiers still read the real template.
    """
    arns = sorted({arn for template in templates.values() for arn in _ACM_ARN.findall(json.dumps(template))})
    if not arns:
        return {}
    acm = server.session().client("acm")
    local = acm.request_certificate(DomainName="genai-constructs.local", ValidationMethod="DNS")["CertificateArn"]
    return {arn: str(local) for arn in arns}


def moto_creates(resource_type: str) -> bool:
    """Whether moto's CloudFormation creates this resource type (asks moto's own model table)."""
    from moto.cloudformation import parsing

    if _is_custom_resource(resource_type) or resource_type in parsing.NULL_MODELS:
        return False
    return resource_type in parsing.get_model_map()


def moto_resolves(resource_type: str, attribute: str) -> bool:
    """Whether moto's CloudFormation can resolve ``Fn::GetAtt`` of this attribute (it fails the stack otherwise)."""
    from moto.cloudformation import parsing

    model = parsing.get_model_map().get(resource_type)
    return model is not None and hasattr(model, "get_cfn_attribute") and bool(model.has_cfn_attr(attribute))


def substitute_unresolved_references(template: dict[str, Any]) -> int:
    """Replace Ref/GetAtt that moto cannot resolve with placeholder strings, in place; return how many.

    A reference to a resource moto does not create (an alarm, a placement group) or to an attribute it does not
    implement (a target group's full name) fails the whole stack in moto; in the deployed copy it becomes
    ``local/<logical id>/<attribute>``. Those values feed resources moto skips or stores without using.
    """
    types = {k: str(v.get("Type")) for k, v in template.get("Resources", {}).items()}
    count = 0

    def walk(value: Any) -> Any:
        nonlocal count
        if isinstance(value, dict):
            if set(value) == {"Ref"} and value["Ref"] in types and not moto_creates(types[value["Ref"]]):
                count += 1
                return f"local/{value['Ref']}"
            if set(value) == {"Fn::GetAtt"}:
                arg = value["Fn::GetAtt"]
                logical, attribute = arg if isinstance(arg, list) else str(arg).split(".", 1)
                kind = types.get(logical, "")
                if not moto_creates(kind) or not moto_resolves(kind, attribute):
                    count += 1
                    return f"local/{logical}/{attribute}"
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    template["Resources"] = walk(template.get("Resources", {}))
    return count


def _replace_strings(value: Any, replacements: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        return replacements.get(value, value)
    if isinstance(value, list):
        return [_replace_strings(v, replacements) for v in value]
    if isinstance(value, dict):
        return {k: _replace_strings(v, replacements) for k, v in value.items()}
    return value


def substitute_ssm_parameters(template: dict[str, Any], substitutes: Mapping[str, str]) -> list[str]:
    """Turn SSM-typed parameters whose path is in ``substitutes`` into plain strings holding the value; in place."""
    changed = []
    for name, parameter in template.get("Parameters", {}).items():
        if (
            str(parameter.get("Type", "")).startswith("AWS::SSM::Parameter::Value<")
            and parameter.get("Default") in substitutes
        ):
            parameter["Type"] = "String"
            parameter["Default"] = substitutes[parameter["Default"]]
            changed.append(name)
    return changed


def deploy_local(
    app: str | Path | Callable[[Any], object],
    *,
    stacks: Sequence[str] = (),
    server: MotoServer | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
    cwd: Path | None = None,
    verifiers: Sequence[Verifier] = VERIFIERS,
) -> LocalDeployReport:
    """Deploy ``app`` to moto with the real CDK CLI and verify it; start and stop moto unless ``server`` is given.

    ``app``: an app command for the CLI (``".venv/bin/python app.py"``), a cloud assembly directory, or a function
    ``build(app)`` that adds stacks (synthesized here with the local flag, then deployed from the assembly).
    """
    started = time.monotonic()
    if callable(app):
        app = synth_local(app)
    if server is None:
        with moto_server() as own:
            return _deploy_and_verify(own, app, stacks, concurrency, cwd, verifiers, started)
    return _deploy_and_verify(server, app, stacks, concurrency, cwd, verifiers, started)


def _deploy_and_verify(
    server: MotoServer,
    app: str | Path,
    stacks: Sequence[str],
    concurrency: int,
    cwd: Path | None,
    verifiers: Sequence[Verifier],
    started: float,
) -> LocalDeployReport:
    synth_seconds = 0.0
    if not _is_assembly(app):
        app, synth_seconds = cdk_synth(server, str(app), cwd=cwd)
    assembly = Path(app)
    templates = assembly_stacks(assembly)
    substitutes = seed_ssm_parameters(server, templates)
    server.session().client("s3").create_bucket(Bucket=LOCAL_ASSETS_BUCKET)
    deployable, _removed = assembly_for_moto(assembly, substitutes, local_certificates(server, templates))
    try:
        run = cdk_deploy(server, deployable, stacks=stacks, concurrency=concurrency, cwd=cwd)
    except LocalDeployError as error:
        log = server.log_path.read_text(errors="replace")
        tracebacks = log.split("Traceback (most recent call last):")[1:]
        detail = _tail(tracebacks[-1], 25) if tracebacks else _tail(log, 10)
        raise LocalDeployError(f"{error}\n--- moto log, last error ---\n{detail}") from None
    names = [n for n in templates if not stacks or n in stacks]
    session = server.session()
    checks = [check for name in names for check in verify_stack(session, name, templates[name], verifiers)]
    return LocalDeployReport(
        stacks=names,
        checks=checks,
        synth_seconds=synth_seconds,
        deploy_seconds=run.seconds,
        stack_seconds=run.stack_seconds,
        total_seconds=time.monotonic() - started,
    )


def _default_app(cwd: Path) -> str:
    cdk_json = cwd / "cdk.json"
    if cdk_json.exists():
        app = json.loads(cdk_json.read_text()).get("app")
        if app:
            return str(app)
    return f"{shlex.quote(sys.executable)} app.py"


def main(argv: Sequence[str] | None = None) -> int:
    """``make deploy-local``: deploy every stack of the app to a fresh moto server, print the report."""
    os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")
    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
    parser = argparse.ArgumentParser(prog="python -m genai_constructs.testing", description=main.__doc__)
    parser.add_argument("stacks", nargs="*", help="stacks to deploy (default: all)")
    parser.add_argument("--app", help="app command or cloud assembly directory (default: cdk.json's app)")
    parser.add_argument("--port", type=int, help="moto port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY, help="stacks deployed in parallel")
    args = parser.parse_args(argv)
    cwd = Path.cwd()
    app = args.app or _default_app(cwd)
    try:
        with moto_server(args.port) as server:
            print(
                f"moto on {server.endpoint_url}; deploying {', '.join(args.stacks) or 'every stack'} of {app}",
                flush=True,
            )
            report = deploy_local(app, stacks=args.stacks, server=server, concurrency=args.concurrency, cwd=cwd)
    except LocalDeployError as error:
        print(f"local deploy failed: {error}", file=sys.stderr)
        return 2
    print(report.render())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
