"""Example stacks composed from genai-constructs: what a platform team copies into its own CDK app.

``build_app(app)`` adds every example to an app with the cdk-nag v3 AwsSolutions, NIST 800-53 R5 and HIPAA
Security packs on; ``app.py`` is just that. With ``cdk ... -c local=true`` (or ``local=True``) the stacks use a
bootstrap-free synthesizer for the local emulator (``make deploy-local``); otherwise they keep the CDK default.
"""

from __future__ import annotations

from aws_cdk import App, Stack, Validations
from cdk_nag import AwsSolutionsChecks, HIPAASecurityChecks, NIST80053R5Checks

from examples.batch_embedding import BatchEmbeddingStack
from examples.large_model_chat import LargeModelChatStack
from examples.network_stack import PrivateNetworkStack
from examples.rag import RagStack
from examples.realtime_chat import RealtimeChatStack
from genai_constructs.testing.local_deploy import is_local, local_synthesizer

STACK_NAMES: dict[str, str] = {
    "network": "GenaiPrivateNetwork",
    "realtime_chat": "GenaiRealtimeChat",
    "large_model_chat": "GenaiLargeModelChat",
    "batch_embedding": "GenaiBatchEmbedding",
    "rag": "GenaiRag",
}
"""Stack name per example: stack names are what users see in the console and what a redeploy updates."""


FEATURE_FLAGS: dict[str, bool] = {
    # New CDK apps (`cdk init`) turn this on: S3 server access logs are granted to the logging service by bucket
    # policy instead of the legacy LogDeliveryWrite ACL (cfn-lint W3045; ACLs are off on BUCKET_OWNER_ENFORCED buckets).
    "@aws-cdk/aws-s3:serverAccessLogsUseBucketPolicy": True,
}
"""CDK feature flags the examples rely on; set on the app unless its context (cdk.json, -c) already says otherwise."""


def add_nag_packs(app: App) -> None:
    """Turn on the three cdk-nag v3 packs the examples must pass: AwsSolutions, NIST 800-53 R5, HIPAA Security."""
    Validations.of(app).add_plugins(AwsSolutionsChecks(app), NIST80053R5Checks(app), HIPAASecurityChecks(app))


def build_app(app: App, *, local: bool | None = None, nag: bool | None = None) -> list[Stack]:
    """Add every example stack to ``app``; return them.

    :param local: synthesize for the local emulator (bootstrap-free synthesizer). Default: the ``local`` context
        flag or the ``GENAI_CONSTRUCTS_LOCAL`` environment variable.
    :param nag: turn on the three cdk-nag packs (a finding fails synthesis). Default: on, except for the local
        emulator: the local templates differ only in their synthesizer, and the packs already ran on the default
        synthesis in ``make test``.
    """
    if not app.node.children:  # CDK accepts context only before the first child
        for flag, value in FEATURE_FLAGS.items():
            if app.node.try_get_context(flag) is None:
                app.node.set_context(flag, value)
    local = is_local(app) if local is None else local
    if nag if nag is not None else not local:
        add_nag_packs(app)
    synthesizer = local_synthesizer() if local else None
    return [
        PrivateNetworkStack(app, STACK_NAMES["network"], synthesizer=synthesizer),
        RealtimeChatStack(app, STACK_NAMES["realtime_chat"], synthesizer=synthesizer),
        LargeModelChatStack(app, STACK_NAMES["large_model_chat"], synthesizer=synthesizer),
        BatchEmbeddingStack(app, STACK_NAMES["batch_embedding"], synthesizer=synthesizer),
        RagStack(app, STACK_NAMES["rag"], synthesizer=synthesizer),
    ]


__all__ = [
    "FEATURE_FLAGS",
    "STACK_NAMES",
    "BatchEmbeddingStack",
    "LargeModelChatStack",
    "PrivateNetworkStack",
    "RagStack",
    "RealtimeChatStack",
    "add_nag_packs",
    "build_app",
]
