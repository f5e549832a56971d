"""Test and deploy harness: local deploy of CDK stacks to a moto server, and the compliance gates."""

from genai_constructs.testing.local_deploy import (
    LOCAL_CONTEXT_KEY,
    LOCAL_ENV_VAR,
    Check,
    LocalDeployError,
    LocalDeployReport,
    MotoServer,
    deploy_local,
    is_local,
    local_synthesizer,
    moto_server,
    stack_synthesizer,
    synth_local,
)

__all__ = [
    "LOCAL_CONTEXT_KEY",
    "LOCAL_ENV_VAR",
    "Check",
    "LocalDeployError",
    "LocalDeployReport",
    "MotoServer",
    "deploy_local",
    "is_local",
    "local_synthesizer",
    "moto_server",
    "stack_synthesizer",
    "synth_local",
]
