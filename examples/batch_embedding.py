"""BatchEmbeddingStack: embed a backlog of documents before a deadline on Spot GPU workers that scale to zero.

2 million documents of ~800 tokens through bge-large-en-v1.5 within 12 hours: the planner picks the instance
type, how many workers share it and how many instances meet the deadline; the fleet stages documents in one
KMS-encrypted bucket, queues their keys in SQS (with a dead-letter queue), and writes vectors to another bucket.
Feed it with ``genai-constructs enqueue`` (the fleet outputs its queue URL and bucket locations).
"""

from __future__ import annotations

from typing import Any

from aws_cdk import Stack
from constructs import Construct

from genai_constructs.fleets.embedding import EmbeddingBatchFleet
from genai_constructs.network import PrivateDataPath
from genai_constructs.testing.local_deploy import stack_synthesizer
from genai_constructs.workload import BatchTraffic, ModelShape

MODEL = "bge-large-en-v1.5"
"""A 335M-parameter encoder with 1024-dimension vectors: strong retrieval quality, cheap on one GPU."""
DOCUMENTS = 2_000_000
"""The backlog: a mid-size document corpus."""
TOKENS_PER_DOCUMENT = 800
"""Mean document length after cleaning."""
DEADLINE_HOURS = 12.0
"""Overnight: the index is fresh the next morning."""
SPOT_OK = True
"""A batch tolerates interruptions (messages return to the queue), and Spot is ~60-70 % cheaper."""


class BatchEmbeddingStack(Stack):
    """Private network plus an embedding batch fleet: staging buckets, queue with DLQ, Spot workers scaling to zero."""

    def __init__(self, scope: Construct, id: str, **kwargs: Any) -> None:
        if kwargs.get("synthesizer") is None:
            kwargs["synthesizer"] = stack_synthesizer(scope)
        super().__init__(scope, id, **kwargs)
        self.network = PrivateDataPath(self, "Network")
        self.fleet = EmbeddingBatchFleet(
            self,
            "Embed",
            network=self.network,
            model=ModelShape.preset(MODEL),
            traffic=BatchTraffic(
                documents=DOCUMENTS,
                tokens_per_document=TOKENS_PER_DOCUMENT,
                deadline_hours=DEADLINE_HOURS,
                spot_ok=SPOT_OK,
            ),
        )
