"""Test support: synthesize a CDK app with cdk-nag v3 packs and read back templates and findings."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aws_cdk import App, Stack, Validations
from cdk_nag import AwsSolutionsChecks, HIPAASecurityChecks, NIST80053R5Checks

PACKS: dict[str, Callable[[App], Any]] = {
    "AwsSolutions": lambda app: AwsSolutionsChecks(app),
    "NIST.800.53.R5": lambda app: NIST80053R5Checks(app),
    "HIPAA.Security": lambda app: HIPAASecurityChecks(app),
}


@dataclass
class Synthesized:
    """A synthesized app: templates by stack name and every unacknowledged cdk-nag violation."""

    outdir: Path
    templates: dict[str, dict[str, Any]]
    violations: list[dict[str, Any]] = field(default_factory=list)

    def template(self, stack_name: str | None = None) -> dict[str, Any]:
        if stack_name is None:
            (only,) = self.templates.values()
            return only
        return self.templates[stack_name]

    def violation_summary(self) -> list[str]:
        return [
            f"{v['ruleName']} at {c['constructPath']}: {v['description']}"
            for v in self.violations
            for c in v.get("violatingConstructs", [])
        ]


def synth_app(build: Callable[[App], Iterable[Stack] | Stack | None], packs: Iterable[str] = ("AwsSolutions",)) -> Synthesized:
    """Build stacks into a fresh App with the given cdk-nag packs, synthesize, and collect the results.

    cdk-nag v3 reports through CDK validation plugins: a finding fails synthesis and lands in
    ``validation-report.json``; this returns the findings instead of raising so tests can assert on them.
    """
    outdir = Path(tempfile.mkdtemp(prefix="cdk-test-"))
    app = App(outdir=str(outdir))
    plugins = [PACKS[name](app) for name in packs]
    if plugins:
        Validations.of(app).add_plugins(*plugins)
    build(app)
    try:
        app.synth()
    except RuntimeError:
        # cdk-nag findings fail synthesis and leave a report; any other failure (a construct's own validation) re-raises.
        if not (outdir / "validation-report.json").exists():
            raise
    templates = {p.name.removesuffix(".template.json"): json.loads(p.read_text()) for p in outdir.glob("*.template.json")}
    violations: list[dict[str, Any]] = []
    report = outdir / "validation-report.json"
    if report.exists():
        for plugin in json.loads(report.read_text()).get("pluginReports", []):
            violations.extend(plugin.get("violations", []))
    return Synthesized(outdir=outdir, templates=templates, violations=violations)


def resources_of_type(template: dict[str, Any], resource_type: str) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in template.get("Resources", {}).items() if v["Type"] == resource_type}
