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


def user_data_script(launch_template: dict[str, Any], token: str = "tokenvalue") -> str:
    """A launch template resource's shell script (the user data's x-shellscript part), tokens replaced by ``token``."""
    data = launch_template["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]
    parts = data["Fn::Join"][1] if isinstance(data, dict) else [data]
    mime = "".join(p if isinstance(p, str) else token for p in parts)
    marker = 'Content-Type: text/x-shellscript; charset="utf-8"\n\n'
    script = mime.split(marker, 1)[1] if marker in mime else mime
    return script.split("\n--+AWS+CDK+User+Data+Separator==", 1)[0]


def _resolve_pseudo(value: Any, pseudo: dict[str, str]) -> Any:
    if isinstance(value, dict) and set(value) == {"Ref"} and value["Ref"] in pseudo:
        return pseudo[value["Ref"]]
    if isinstance(value, list):
        return [_resolve_pseudo(v, pseudo) for v in value]
    return value


def resource_policy_decision(document: dict[str, Any], *, service: str, action: str,
                             context: dict[str, str], pseudo: dict[str, str]) -> str:
    """IAM's evaluation of one resource policy for a request by an AWS service principal: "deny" when any matching
    Deny applies, else "allow" when a matching Allow applies, else "implicit deny" (IAM user guide, "Policy evaluation
    logic"). Conditions: StringEquals, StringNotEquals, Bool, with values as context strings ("true"/"false");
    ``pseudo`` resolves ``{"Ref": "AWS::AccountId"}``-style values."""
    import fnmatch

    def matches(statement: dict[str, Any]) -> bool:
        principal = statement.get("Principal", {})
        services = principal.get("Service", []) if isinstance(principal, dict) else []
        services = [services] if isinstance(services, str) else services
        if principal != "*" and principal != {"AWS": "*"} and service not in services:
            return False
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        if not any(fnmatch.fnmatchcase(action, pattern) for pattern in actions):
            return False
        for operator, tests in statement.get("Condition", {}).items():
            for key, expected in tests.items():
                wanted = {str(v).lower() for v in (_resolve_pseudo(expected, pseudo) if isinstance(expected, list)
                                                   else [_resolve_pseudo(expected, pseudo)])}
                actual = context.get(key)
                present = actual is not None and actual.lower() in wanted
                if operator in ("StringEquals", "Bool") and not present:
                    return False
                if operator == "StringNotEquals" and present:
                    return False
                if operator not in ("StringEquals", "Bool", "StringNotEquals"):
                    raise AssertionError(f"condition operator {operator} not modelled")
        return True

    statements = [s for s in document["Statement"] if matches(s)]
    if any(s["Effect"] == "Deny" for s in statements):
        return "deny"
    return "allow" if any(s["Effect"] == "Allow" for s in statements) else "implicit deny"
