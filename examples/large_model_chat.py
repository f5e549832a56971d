"""LargeModelChatStack: a 70B chat model on P-family instances, several GPUs per replica, in a cluster placement group.

Llama 3.1 70B (bf16, ~131 GiB of weights) does not fit one GPU: the planner picks a P-family instance and splits
each replica across its GPUs (tensor parallel). ``latency_is_the_product=True`` puts the fleet in a cluster
placement group: lower network jitter between instances, at the price of one AZ (the fleet warns about that).
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

MODEL = "llama-3.1-70b"
"""A 70B chat model: needs several 40-80 GiB GPUs per replica."""
CONCURRENT_SESSIONS = 64
"""Peak sessions streaming at once."""
TOKENS_PER_S_PER_SESSION = 20.0
"""Faster than reading speed: long answers and tool-using agents."""
WEIGHTS_BUCKET = "example-model-weights"
"""Replace with the bucket holding your weights and their SHA256SUMS manifest."""


class LargeModelChatStack(Stack):
    """Private network plus a multi-GPU P-family inference fleet for a 70B model, cluster-placed.

    :param certificate_arn: see :func:`examples.certificates.listener_certificate`.
    """

    def __init__(self, scope: Construct, id: str, *, certificate_arn: str | None = None, **kwargs: Any) -> None:
        if kwargs.get("synthesizer") is None:
            kwargs["synthesizer"] = stack_synthesizer(scope)
        super().__init__(scope, id, **kwargs)
        self.network = PrivateDataPath(self, "Network")
        self.fleet = GpuInferenceFleet(
            self,
            "Chat",
            network=self.network,
            model=ModelShape.preset(MODEL),
            traffic=RealtimeTraffic(
                concurrent_sessions=CONCURRENT_SESSIONS, output_tokens_per_s_per_session=TOKENS_PER_S_PER_SESSION
            ),
            model_artifact=ModelArtifact(bucket_name=WEIGHTS_BUCKET, prefix=f"{MODEL}/"),
            certificate=listener_certificate(self, certificate_arn),
            latency_is_the_product=True,
        )
