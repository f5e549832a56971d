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
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from genai_constructs.testing.emulator import LocalDeployError, MotoServer, moto_server, tail
from genai_constructs.testing.moto_copy import (
    LOCAL_ASSETS_BUCKET,
    assembly_for_moto,
    assembly_stacks,
    local_certificates,
    seed_ssm_parameters,
)
from genai_constructs.testing.verifiers import VERIFIERS, Check, Verifier, verify_stack

if TYPE_CHECKING:  # importing constructs starts the jsii runtime; the harness itself needs none
    from constructs import IConstruct

LOCAL_CONTEXT_KEY = "local"
"""Context key that selects the bootstrapless synthesizer: ``cdk deploy -c local=true``."""
LOCAL_ENV_VAR = "GENAI_CONSTRUCTS_LOCAL"
"""Environment variable with the same effect as the context key, for apps that read no context."""
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
        raise LocalDeployError(f"cdk failed ({done.returncode}): {shlex.join(command)}\n{tail(output)}")
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
        detail = tail(tracebacks[-1], 25) if tracebacks else tail(log, 10)
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
