"""The HTTPS certificate the examples' load balancer listeners use.

The HIPAA Security and NIST 800-53 R5 packs require HTTPS listeners with an ACM certificate. Pass yours with
``cdk deploy -c certificate_arn=arn:aws:acm:...`` (or the stacks' ``certificate_arn=``); without one the examples
use ``PLACEHOLDER_CERTIFICATE_ARN``, which only the local emulator accepts, and warn.
"""

from __future__ import annotations

from aws_cdk import Annotations, Stack
from aws_cdk import aws_certificatemanager as acm

CERTIFICATE_CONTEXT_KEY = "certificate_arn"
"""Context key for the ACM certificate ARN: ``cdk deploy -c certificate_arn=...``."""
PLACEHOLDER_CERTIFICATE_ARN = "arn:aws:acm:us-east-1:123456789012:certificate/00000000-0000-4000-8000-000000000000"
"""A well-formed ARN in moto's fake account: synthesizes and deploys locally; AWS rejects it at deploy time."""


def listener_certificate(stack: Stack, certificate_arn: str | None = None) -> acm.ICertificate:
    """The listener certificate: ``certificate_arn``, else the context value, else the placeholder (with a warning)."""
    arn = certificate_arn or stack.node.try_get_context(CERTIFICATE_CONTEXT_KEY)
    if not arn:
        arn = PLACEHOLDER_CERTIFICATE_ARN
        Annotations.of(stack).add_warning_v2(
            "genai-constructs:ExamplePlaceholderCertificate",
            f"No certificate given: the listener uses a placeholder ARN that only the local emulator accepts. "
            f"Pass -c {CERTIFICATE_CONTEXT_KEY}=<your ACM certificate ARN> to deploy to AWS.",
        )
    return acm.Certificate.from_certificate_arn(stack, "ListenerCertificate", str(arn))
