"""Test and deploy harness: local deploy of CDK stacks to a moto server, and the compliance gates.

- ``local_deploy``: synthesizer selection, the CDK CLI calls, the flow and its report (``python -m genai_constructs.testing``)
- ``emulator``: the moto server on 127.0.0.1 and what moto's CloudFormation supports
- ``moto_copy``: the copy of the cloud assembly moto deploys, and how it differs
- ``verifiers``: one verifier per resource kind
- ``gates``: cfn-lint, checkov and cdk-nag acknowledgments
- ``synth_timing``: ``cdk synth`` wall time against an empty app
"""

from genai_constructs.testing.emulator import LocalDeployError, MotoServer, moto_server
from genai_constructs.testing.local_deploy import (
    LOCAL_CONTEXT_KEY,
    LOCAL_ENV_VAR,
    LocalDeployReport,
    deploy_local,
    is_local,
    local_synthesizer,
    stack_synthesizer,
    synth_local,
)
from genai_constructs.testing.verifiers import Check

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
