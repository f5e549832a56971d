"""PrivateNetworkStack: only the private data path, the network a platform team shares between its fleets.

A VPC with isolated subnets in two AZs, an S3 gateway endpoint, interface endpoints for the AWS APIs the fleets
call, endpoint policies, and encrypted flow logs. No NAT gateway and no internet gateway: see
docs/private-data-path.md for why, and for the cost of endpoints against a NAT gateway.
"""

from __future__ import annotations

from typing import Any

from aws_cdk import Stack
from constructs import Construct

from genai_constructs.network import PrivateDataPath
from genai_constructs.testing.local_deploy import stack_synthesizer


class PrivateNetworkStack(Stack):
    """A stack holding one :class:`PrivateDataPath` with its defaults."""

    def __init__(self, scope: Construct, id: str, **kwargs: Any) -> None:
        if kwargs.get("synthesizer") is None:
            kwargs["synthesizer"] = stack_synthesizer(scope)
        super().__init__(scope, id, **kwargs)
        self.network = PrivateDataPath(self, "Network")
