"""ModelArtifact: names AWS would reject later are refused here, each message naming the field, the value and the fix."""

from __future__ import annotations

from typing import Any

import pytest

from genai_constructs.errors import GenaiConstructsError
from genai_constructs.workload import ModelArtifact, s3_bucket_name_problem

GOOD: dict[str, Any] = {"bucket_name": "my-models", "prefix": "llama-3.1-8b/"}
KEY_ARN = "arn:aws:kms:us-east-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab"


@pytest.mark.parametrize(
    ("field", "value", "fix"),
    [
        ("bucket_name", "my..models", "write 'my.models'"),
        ("bucket_name", "192.168.5.4", "formatted as an IP address"),
        ("bucket_name", "s3://my-models/llama/", "give bucket_name='my-models'"),
        ("bucket_name", "arn:aws:s3:::my-models", "give bucket_name='my-models'"),
        ("bucket_name", "My_Models", "give the bucket's exact name"),
        ("bucket_name", "xn--models", "a prefix S3 reserves"),
        ("bucket_name", "models-s3alias", "a suffix S3 reserves"),
        ("bucket_name", 42, "as a string"),
        ("prefix", "s3://my-models/llama/", "give bucket_name='my-models' and prefix="),
        ("prefix", "llama/*/", "widens the grant"),
        ("prefix", "llama//v1/", "write it as 'folder/sub/'"),
        ("prefix", None, "not a NoneType"),
        ("kms_key_arn", "alias/my-key", "copy the key's ARN"),
        ("kms_key_arn", "arn:aws:kms:us-east-1:111122223333:alias/my-key", "an alias ARN"),
        ("kms_key_arn", "1234abcd-12ab-34cd-56ef-1234567890ab", "copy the key's ARN"),
        ("manifest_name", "", "use the default 'SHA256SUMS'"),
        ("manifest_name", "sums/SHA256SUMS", "directly under prefix"),
        ("version", 2, "e.g. version='2'"),
        ("version", "", "e.g. version='2'"),
    ],
)
def test_fails_on_a_value_aws_or_the_boot_script_would_reject(field: str, value: Any, fix: str) -> None:
    with pytest.raises(GenaiConstructsError) as raised:
        ModelArtifact(**{**GOOD, field: value})
    message = str(raised.value)
    assert message.startswith(f"ModelArtifact.{field} (got {value!r}): ")
    assert fix in message


def test_accepts_a_key_arn_a_multi_region_key_and_dotted_names() -> None:
    artifact = ModelArtifact(bucket_name="models.example-co", prefix="org/llama-3.1-8b/v1/", kms_key_arn=KEY_ARN,
                             manifest_name="SHA256SUMS.txt", version="2024-07-23")
    assert artifact.kms_key_arn == KEY_ARN
    ModelArtifact(**GOOD, kms_key_arn="arn:aws-cn:kms:cn-north-1:111122223333:key/mrk-1234abcd12ab34cd56ef1234567890ab")


def test_bucket_name_rules_are_the_s3_ones() -> None:
    assert s3_bucket_name_problem("my-models") is None
    assert s3_bucket_name_problem("ab") is not None  # shorter than 3
    assert s3_bucket_name_problem("a" * 64) is not None  # longer than 63
    assert s3_bucket_name_problem("models-") is not None  # must end in a letter or digit
    assert s3_bucket_name_problem("models--ol-s3") is not None
