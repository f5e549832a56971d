"""Compliance gates on synthesized CloudFormation templates, reusable from tests and scripts.

- :func:`cfn_lint`: every cfn-lint error and warning (the gate is 0 and 0), minus ignores that each carry a reason.
- :func:`checkov`: checkov's failed checks, minus skips that each carry a reason; a skip that matches nothing is
  reported too, so stale justifications do not pile up.
- :func:`nag_acknowledgments`: the cdk-nag acknowledgments recorded in a cloud assembly, with their reasons, so a test
  can print the count and the README can list them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NAG_PACK_PREFIXES = ("AwsSolutions-", "NIST.800.53.R5-", "HIPAA.Security-")
"""Rule id prefixes of the three cdk-nag packs the examples run."""
ACKNOWLEDGED_RULES_METADATA = "aws:cdk:acknowledged-rules"
"""Metadata type under which ``Validations.of(x).acknowledge(...)`` records rule id -> reason."""
CFN_LINT_REGIONS = ("us-east-1",)
"""Region the templates are linted for; the examples are region-agnostic, us-east-1 has every GPU family."""


# --------------------------------------------------------------------------------------------------- cfn-lint


CDK_PROVIDERS: dict[str, str] = {
    "CustomVpcRestrictDefaultSGCustomResourceProvider": "the provider that strips a new VPC's default security group",
    "AWS679f53fac002430cb0da5b7982bd2287": "the AwsCustomResource singleton provider (one SDK call per deploy)",
    "BucketNotificationsHandler050a0587b7544547bf325f094a3db834": "the handler that sets S3 bucket notifications",
}
"""Logical id prefixes of Lambda providers aws-cdk-lib generates itself (not configurable from CDK), and what they do."""

CDK_PROVIDER_CFN_LINT_IGNORES: dict[str, str] = {
    f"W3005:{prefix}": (
        f"aws-cdk-lib generates {what}; it lists the function's role in DependsOn beside a GetAtt of the same role"
    )
    for prefix, what in CDK_PROVIDERS.items()
}
"""cfn-lint findings on CDK-generated resources, each with its reason; an ignore that matches nothing fails."""

CDK_PROVIDER_CHECKOV_SKIPS: dict[str, str] = {
    **{
        f"CKV_AWS_115:{prefix}": (
            f"aws-cdk-lib generates {what}; CloudFormation invokes it once per deploy, so a reserved concurrency "
            "limit guards nothing"
        )
        for prefix, what in CDK_PROVIDERS.items()
    },
    **{
        f"CKV_AWS_116:{prefix}": (
            f"aws-cdk-lib generates {what}; CloudFormation invokes it synchronously and reports its failure in the "
            "stack events, so a dead-letter queue would never receive anything"
        )
        for prefix, what in CDK_PROVIDERS.items()
    },
    **{
        f"CKV_AWS_117:{prefix}": (
            f"aws-cdk-lib generates {what}; it calls AWS control-plane APIs once per deploy and handles no data, and "
            "inside the NAT-less VPC it would need one more interface endpoint per API"
        )
        for prefix, what in CDK_PROVIDERS.items()
    },
}
"""checkov findings on aws-cdk-lib's own Lambda providers, with reasons; a skip that matches nothing fails."""


def _key_matches(key: str, rule_id: str, logical_id: str) -> bool:
    """A key is ``RULE`` (every resource) or ``RULE:LogicalIdPrefix`` (resources whose logical id starts so)."""
    wanted, _, prefix = key.partition(":")
    return wanted == rule_id and logical_id.startswith(prefix)


@dataclass(frozen=True)
class LintFinding:
    """One cfn-lint match: rule id (E..., W..., I...), the resource (if any), where, and the message."""

    rule_id: str
    logical_id: str
    path: str
    line: int
    message: str

    @property
    def severity(self) -> str:
        return {"E": "error", "W": "warning", "I": "informational"}.get(self.rule_id[:1], "error")

    def __str__(self) -> str:
        return f"{self.rule_id} {self.path}:{self.line} {self.message}"


@dataclass(frozen=True)
class LintResult:
    """cfn-lint on one template: errors and warnings not ignored, ignores used, ignores that matched nothing."""

    findings: list[LintFinding]
    ignored: dict[str, str]
    unused_ignores: list[str]

    @property
    def errors(self) -> list[LintFinding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[LintFinding]:
        return [f for f in self.findings if f.severity == "warning"]

    @property
    def ok(self) -> bool:
        return not self.findings and not self.unused_ignores


def _require_reasons(kind: str, reasons: Mapping[str, str]) -> None:
    missing = [key for key, reason in reasons.items() if not isinstance(reason, str) or not reason.strip()]
    if missing:
        raise ValueError(f"{kind} need a reason each; these have none: {missing}")


def cfn_lint(
    template: Path | Mapping[str, Any],
    *,
    ignore: Mapping[str, str] | None = None,
    regions: Iterable[str] = CFN_LINT_REGIONS,
) -> LintResult:
    """Run cfn-lint on a template file or dict: errors and warnings, minus ``ignore`` (key -> reason).

    Keys are ``RULE`` or ``RULE:LogicalIdPrefix``; informational matches are dropped.
    """
    from cfnlint.api import ManualArgs, lint  # type: ignore[import-untyped]

    ignore = dict(ignore or {})
    _require_reasons("cfn-lint ignores", ignore)
    if isinstance(template, Path):
        text, where = template.read_text(), template.name
    else:
        text, where = json.dumps(template), "<template>"
    findings = []
    for match in lint(text, config=ManualArgs(regions=list(regions))):
        path = list(getattr(match, "path", []) or [])
        logical_id = str(path[1]) if len(path) > 1 and path[0] == "Resources" else ""
        findings.append(LintFinding(match.rule.id, logical_id, where, match.linenumber, match.message))
    used: dict[str, str] = {}
    remaining = []
    for finding in findings:
        if finding.severity == "informational":
            continue
        key = next((k for k in ignore if _key_matches(k, finding.rule_id, finding.logical_id)), None)
        if key is None:
            remaining.append(finding)
        else:
            used[key] = ignore[key]
    return LintResult(findings=remaining, ignored=used, unused_ignores=sorted(set(ignore) - set(used)))


# --------------------------------------------------------------------------------------------------- checkov


@dataclass(frozen=True)
class CheckovFinding:
    """One failed checkov check on one resource (``AWS::S3::Bucket.Bucket83908E77``)."""

    check_id: str
    check_name: str
    resource: str

    @property
    def logical_id(self) -> str:
        return self.resource.split(".", 1)[-1]

    def __str__(self) -> str:
        return f"{self.check_id} on {self.resource}: {self.check_name}"


@dataclass(frozen=True)
class CheckovResult:
    """Checkov on one template: failures not skipped, skips used (key -> reason), skips that matched nothing."""

    failed: list[CheckovFinding]
    skipped: dict[str, str]
    unused_skips: list[str]
    passed: int

    @property
    def ok(self) -> bool:
        return not self.failed and not self.unused_skips


def checkov(template: Path | Mapping[str, Any], *, skips: Mapping[str, str] | None = None) -> CheckovResult:
    """Run checkov's CloudFormation checks in-process on a template; apply ``skips`` (key -> reason).

    Every skip must carry a non-empty reason (``ValueError`` otherwise). In-process, checkov neither prints its
    banner nor checks PyPI for updates, and it makes no call to Prisma Cloud without an API key.
    """
    skips = dict(skips or {})
    _require_reasons("checkov skips", skips)
    import tempfile

    from checkov.cloudformation.runner import Runner
    from checkov.runner_filter import RunnerFilter

    with tempfile.TemporaryDirectory(prefix="checkov-") as scratch:
        if isinstance(template, Path):
            path = template
        else:
            path = Path(scratch) / "template.json"
            path.write_text(json.dumps(template))
        report = Runner().run(
            root_folder=None, files=[str(path)], runner_filter=RunnerFilter(framework=["cloudformation"])
        )
    if isinstance(report, list):  # the runner returns a list when it has several reports
        failed_checks = [c for r in report for c in r.failed_checks]
        passed = sum(len(r.passed_checks) for r in report)
    else:
        failed_checks, passed = list(report.failed_checks), len(report.passed_checks)
    findings = [CheckovFinding(c.check_id, c.check_name, c.resource) for c in failed_checks]
    used: dict[str, str] = {}
    remaining = []
    for finding in findings:
        key = next((k for k in skips if _key_matches(k, finding.check_id, finding.logical_id)), None)
        if key is None:
            remaining.append(finding)
        else:
            used[key] = skips[key]
    unused = sorted(set(skips) - set(used))
    return CheckovResult(failed=remaining, skipped=used, unused_skips=unused, passed=passed)


# --------------------------------------------------------------------------------------------------- cdk-nag


@dataclass(frozen=True)
class Acknowledgment:
    """A cdk-nag finding acknowledged on a construct path, with its reason."""

    stack: str
    path: str
    rule_id: str
    reason: str

    def __str__(self) -> str:
        return f"{self.rule_id} on {self.path}: {self.reason}"


def _stack_metadata(assembly: Path) -> dict[str, dict[str, list[dict[str, Any]]]]:
    manifest = json.loads((assembly / "manifest.json").read_text())
    result: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for artifact_id, artifact in manifest.get("artifacts", {}).items():
        if artifact.get("type") != "aws:cloudformation:stack":
            continue
        metadata: dict[str, list[dict[str, Any]]] = dict(artifact.get("metadata", {}))
        extra = artifact.get("additionalMetadataFile")
        if extra and (assembly / extra).exists():
            for path, entries in json.loads((assembly / extra).read_text()).items():
                metadata.setdefault(path, []).extend(entries)
        result[artifact.get("properties", {}).get("stackName", artifact_id)] = metadata
    return result


def _nag_rule_id(recorded: str) -> str | None:
    """``Annotation::AwsSolutions-IAM5[Resource::*]`` or ``AwsSolutions::AwsSolutions-S1`` -> the nag rule id."""
    for candidate in (recorded, recorded.split("::", 1)[-1]):
        if candidate.startswith(NAG_PACK_PREFIXES):
            return candidate
    return None


def nag_acknowledgments(assembly: Path) -> list[Acknowledgment]:
    """Every cdk-nag acknowledgment in a cloud assembly (rules of the three packs; CDK's own ones left out)."""
    found = []
    for stack, metadata in _stack_metadata(assembly).items():
        for path, entries in metadata.items():
            for entry in entries:
                if entry.get("type") != ACKNOWLEDGED_RULES_METADATA:
                    continue
                for recorded, reason in dict(entry.get("data") or {}).items():
                    rule_id = _nag_rule_id(str(recorded))
                    if rule_id is not None:
                        found.append(Acknowledgment(stack, path.lstrip("/"), rule_id, str(reason)))
    return sorted(set(found), key=lambda a: (a.stack, a.path, a.rule_id))


def format_acknowledgments(acknowledgments: Iterable[Acknowledgment]) -> str:
    """A Markdown table for the README: one row per rule, construct path (within its stack) and reason, with the
    stacks it appears in, so the same acknowledgment in several examples is listed once."""
    rows: dict[tuple[str, str, str], list[str]] = {}
    for ack in acknowledgments:
        within = ack.path.split("/", 1)[1] if "/" in ack.path else ack.path
        rows.setdefault((ack.rule_id, within, ack.reason), []).append(ack.stack)
    lines = ["| rule | construct | reason | stacks |", "|---|---|---|---|"]
    for (rule_id, within, reason), stacks in sorted(rows.items()):
        escaped = reason.replace("|", "\\|")
        lines.append(f"| `{rule_id}` | `{within}` | {escaped} | {', '.join(sorted(set(stacks)))} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the cdk-nag acknowledgments of a cloud assembly (default ``cdk.out``) as a Markdown table."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    assembly = Path(args[0] if args else "cdk.out")
    acknowledgments = nag_acknowledgments(assembly)
    print(f"{len(acknowledgments)} acknowledgment(s) in {assembly}\n")
    print(format_acknowledgments(acknowledgments))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
