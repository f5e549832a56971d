"""Session fixtures for the examples: one synthesis of the whole app with the three cdk-nag packs, and one local
deploy of every example (plus the plain-CDK minimal stack) to a moto server."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aws_cdk import App

from examples import build_app
from genai_constructs.testing import LocalDeployReport, MotoServer, deploy_local, moto_server, synth_local
from tests.examples.minimal_stack import build as build_minimal
from tests.support import Synthesized

REPO_ROOT = Path(__file__).resolve().parents[2]


def _synth_examples() -> Synthesized:
    """Like ``tests.support.synth_app``, which re-raises when the jsii error message starts with the findings
    ("ValidationFailed: ERROR ...") instead of "Validation failed"; findings are read from the report either way."""
    outdir = Path(tempfile.mkdtemp(prefix="cdk-examples-"))
    app = App(outdir=str(outdir))
    build_app(app, local=False)
    try:
        app.synth()
    except RuntimeError:
        if not (outdir / "validation-report.json").exists():  # not nag findings: a construct error
            raise
    templates = {
        p.name.removesuffix(".template.json"): json.loads(p.read_text()) for p in outdir.glob("*.template.json")
    }
    violations: list[dict[str, Any]] = []
    report = outdir / "validation-report.json"
    if report.exists():
        for plugin in json.loads(report.read_text()).get("pluginReports", []):
            violations.extend(plugin.get("violations", []))
    return Synthesized(outdir=outdir, templates=templates, violations=violations)


@pytest.fixture(scope="session")
def examples_synth() -> Synthesized:
    """Every example, synthesized once with the default synthesizer; build_app turns the nag packs on itself."""
    return _synth_examples()


@dataclass
class LocalDeploy:
    server: MotoServer
    report: LocalDeployReport
    assembly: Path


def _build_all(app: App) -> None:
    build_app(app, local=True, nag=False)  # the nag gate runs on examples_synth; here only the deploy matters
    build_minimal(app)


@pytest.fixture(scope="session")
def local_deploy() -> Iterator[LocalDeploy]:
    """Every example and the minimal stack deployed by one CDK CLI call to one moto server, kept up for the tests."""
    assembly = synth_local(_build_all)
    with moto_server() as server:
        report = deploy_local(assembly, server=server, cwd=REPO_ROOT)
        yield LocalDeploy(server=server, report=report, assembly=assembly)
