"""Compliance gates on every example: cdk-nag (three packs), cfn-lint, checkov, and a snapshot of each template."""

from __future__ import annotations

import pytest
from syrupy.assertion import SnapshotAssertion
from syrupy.extensions.json import JSONSnapshotExtension

from examples import STACK_NAMES
from genai_constructs.testing.gates import (
    CDK_PROVIDER_CFN_LINT_IGNORES,
    CDK_PROVIDER_CHECKOV_SKIPS,
    cfn_lint,
    checkov,
    format_acknowledgments,
    nag_acknowledgments,
)
from tests.support import Synthesized

EXAMPLES = sorted(STACK_NAMES.values())

CFN_LINT_IGNORES: dict[str, str] = {**CDK_PROVIDER_CFN_LINT_IGNORES}
"""Every cfn-lint finding accepted in an example, with its reason (keys: RULE or RULE:LogicalIdPrefix)."""
CHECKOV_SKIPS: dict[str, str] = {
    **CDK_PROVIDER_CHECKOV_SKIPS,
    **{
        f"CKV_AWS_18:{fleet}AccessLogs": (
            "this bucket is where the load balancer or the other buckets write their access logs; logging its own "
            "access into itself would loop (the fleet acknowledges cdk-nag's AwsSolutions-S1 for the same reason)"
        )
        for fleet in ("Chat", "Embed")
    },
}
"""Every checkov check skipped in an example, with its reason (keys: CHECK or CHECK:LogicalIdPrefix)."""


def _applicable(reasons: dict[str, str], template: dict) -> dict[str, str]:  # type: ignore[type-arg]
    """The reasons whose resource prefix exists in this template (a stack without a VPC has no CDK provider)."""
    logical_ids = list(template.get("Resources", {}))
    return {k: v for k, v in reasons.items() if any(i.startswith(k.partition(":")[2]) for i in logical_ids)}


def test_no_unacknowledged_nag_findings_in_the_three_packs(examples_synth: Synthesized) -> None:
    assert examples_synth.violation_summary() == []
    assert set(examples_synth.templates) == set(EXAMPLES)


def test_every_acknowledgment_has_a_reason_and_is_listed(examples_synth: Synthesized) -> None:
    acknowledgments = nag_acknowledgments(examples_synth.outdir)
    print(f"\n{len(acknowledgments)} cdk-nag acknowledgment(s) across the examples")
    if acknowledgments:
        print(format_acknowledgments(acknowledgments))
    assert all(a.reason.strip() for a in acknowledgments)


@pytest.mark.parametrize("stack", EXAMPLES)
def test_cfn_lint_finds_no_errors_and_no_warnings(examples_synth: Synthesized, stack: str) -> None:
    template_file = examples_synth.outdir / f"{stack}.template.json"
    result = cfn_lint(template_file, ignore=_applicable(CFN_LINT_IGNORES, examples_synth.template(stack)))
    assert [str(f) for f in result.errors] == []
    assert [str(f) for f in result.warnings] == []
    assert result.unused_ignores == []


@pytest.mark.parametrize("stack", EXAMPLES)
def test_checkov_fails_no_check(examples_synth: Synthesized, stack: str) -> None:
    template_file = examples_synth.outdir / f"{stack}.template.json"
    result = checkov(template_file, skips=_applicable(CHECKOV_SKIPS, examples_synth.template(stack)))
    assert [str(f) for f in result.failed] == []
    assert result.unused_skips == []
    assert result.passed > 0


@pytest.mark.parametrize("stack", EXAMPLES)
def test_template_matches_snapshot(examples_synth: Synthesized, stack: str, snapshot: SnapshotAssertion) -> None:
    assert examples_synth.template(stack) == snapshot(extension_class=JSONSnapshotExtension)
