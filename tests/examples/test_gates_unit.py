"""The gate functions themselves: they must fail when a template is bad and refuse skips without reasons."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from aws_cdk import Acknowledgment, App, Stack, Validations
from aws_cdk import aws_sqs as sqs
from cdk_nag import AwsSolutionsChecks

from genai_constructs.testing.gates import cfn_lint, checkov, format_acknowledgments, nag_acknowledgments

PLAIN_BUCKET = {"Resources": {"Bucket": {"Type": "AWS::S3::Bucket", "Properties": {}}}}


def test_cfn_lint_reports_an_error_in_a_broken_template() -> None:
    broken = {"Resources": {"Queue": {"Type": "AWS::SQS::Queue", "Properties": {"DelaySeconds": "soon"}}}}
    result = cfn_lint(broken)
    assert result.errors and result.errors[0].logical_id == "Queue"
    assert not result.ok


def test_cfn_lint_ignore_needs_a_reason_and_must_match_something() -> None:
    with pytest.raises(ValueError, match="need a reason"):
        cfn_lint(PLAIN_BUCKET, ignore={"W3005": " "})
    assert cfn_lint(PLAIN_BUCKET, ignore={"W3005:Nothing": "stale"}).unused_ignores == ["W3005:Nothing"]


def test_checkov_fails_a_bucket_without_versioning_or_logging() -> None:
    failed = {f.check_id for f in checkov(PLAIN_BUCKET).failed}
    assert {"CKV_AWS_18", "CKV_AWS_21"} <= failed


def test_checkov_skip_removes_only_the_named_resource_and_records_its_reason() -> None:
    result = checkov(PLAIN_BUCKET, skips={"CKV_AWS_18:Bucket": "logs go elsewhere", "CKV_AWS_21:Other": "stale"})
    assert "CKV_AWS_18" not in {f.check_id for f in result.failed}
    assert result.skipped == {"CKV_AWS_18:Bucket": "logs go elsewhere"}
    assert result.unused_skips == ["CKV_AWS_21:Other"]
    assert not result.ok


def test_checkov_skip_without_a_reason_is_refused() -> None:
    with pytest.raises(ValueError, match="need a reason"):
        checkov(PLAIN_BUCKET, skips={"CKV_AWS_18": ""})


def test_nag_acknowledgments_are_read_back_with_their_reasons() -> None:
    outdir = Path(tempfile.mkdtemp(prefix="cdk-ack-"))
    app = App(outdir=str(outdir))
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    stack = Stack(app, "Acked")
    queue = sqs.Queue(stack, "Queue", enforce_ssl=True)
    Validations.of(queue).acknowledge(Acknowledgment(id="AwsSolutions-SQS3", reason="a DLQ is not needed here"))
    try:
        app.synth()
    except RuntimeError:
        pass  # other findings are not this test's concern
    (ack,) = nag_acknowledgments(outdir)
    assert (ack.path, ack.rule_id, ack.reason) == ("Acked/Queue", "AwsSolutions-SQS3", "a DLQ is not needed here")
    assert "| `AwsSolutions-SQS3` | `Queue` | a DLQ is not needed here | Acked |" in format_acknowledgments([ack, ack])
