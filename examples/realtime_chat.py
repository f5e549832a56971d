"""RealtimeChatStack: an 8B chat model on G-family GPUs, sized by the planner for interactive traffic.

Llama 3.1 8B (bf16) for 64 concurrent chat sessions reading at 10 tokens/s: the planner picks a single-GPU
G-family instance (one model replica per GPU) and a two-AZ fleet with a warm pool, behind an internal ALB in a
NAT-less private network. Copy it and change the model, the traffic and the bucket.
"""

from __future__ import annotations

from typing import Any

from aws_cdk import Stack
from constructs import Construct

from examples.certificates import listener_certificate
from genai_constructs.fleets.inference import GpuInferenceFleet
from genai_constructs.network import PrivateDataPath
from genai_constructs.testing.local_deploy import stack_synthesizer
from genai_constructs.workload import ModelArtifact, ModelShape, RealtimeTraffic

MODEL = "llama-3.1-8b"
"""An 8B chat model: fits one 24 GiB G-family GPU with room for the KV cache of dozens of sessions."""
CONCURRENT_SESSIONS = 64
"""Peak sessions streaming at once: a team-wide assistant."""
TOKENS_PER_S_PER_SESSION = 10.0
"""Reading speed plus margin; an agent loop would need more."""
WEIGHTS_BUCKET = "example-model-weights"
"""Replace with the bucket holding your weights and their SHA256SUMS manifest."""


class RealtimeChatStack(Stack):
    """Private network plus a GPU inference fleet for an 8B chat model on G-family instances.

    :param certificate_arn: ACM certificate of the HTTPS listener (the HIPAA and NIST packs require HTTPS).
        Default: ``examples.certificates.certificate_arn(scope)`` (the ``certificate_arn`` context value, else a
        placeholder that deploys only to the local emulator, with a warning).
    """

    def __init__(self, scope: Construct, id: str, *, certificate_arn: str | None = None, **kwargs: Any) -> None:
        if kwargs.get("synthesizer") is None:
            kwargs["synthesizer"] = stack_synthesizer(scope)
        super().__init__(scope, id, **kwargs)
        self.network = PrivateDataPath(self, "Network")
        certificate = listener_certificate(self, certificate_arn)
        self.fleet = GpuInferenceFleet(
            self,
            "Chat",
            network=self.network,
            model=ModelShape.preset(MODEL),
            traffic=RealtimeTraffic(
                concurrent_sessions=CONCURRENT_SESSIONS, output_tokens_per_s_per_session=TOKENS_PER_S_PER_SESSION
            ),
            model_artifact=ModelArtifact(bucket_name=WEIGHTS_BUCKET, prefix=f"{MODEL}/"),
            certificate=certificate,
        )
