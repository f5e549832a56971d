"""Fixtures for the simulator's tests: the hand-trimmed templates and small synthetic traces (no CDK, no 24 h)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from genai_constructs.simulation import Trace

FIXTURES = Path(__file__).parent / "fixtures"
CHAT = FIXTURES / "realtime_chat.template.json"
"""The realtime chat example's fleet, trimmed from cdk synth: g6.xlarge, llama-3.1-8b, 2-4 instances, warm pool of at
least 1 with the launch hook, in-flight target tracking at 17, step scale-out on p95 TTFT (2000 ms) and TPOT (100 ms)."""
RELEASE = FIXTURES / "release.template.json"
"""The same fleet's second release, ``GpuInferenceFleet(model_artifact=[v1, v2])`` (v2 in green, blue serving v1:
blue's warm pool emptied, green's filled), trimmed from cdk synth to the resources the simulator reads, the rollout
state machine included (5, 25, 50, 100 % with 600 s bakes, alarms read every 30 s)."""
ROUND1 = FIXTURES / "round1_scale_in.template.json"
"""The same fleet with round 1's scaling: the step scale-outs, and step scale-in on ALB RequestCountPerTarget."""


def chat_template() -> dict[str, Any]:
    """A fresh, editable copy of the chat fixture."""
    return copy.deepcopy(json.loads(CHAT.read_text()))


def steady_trace(rate_per_s: float, seconds: float = 3600, prompt: int = 1024, output: int = 200) -> Trace:
    """Evenly spaced requests of one size: a load whose every minute is the same."""
    n = int(rate_per_s * seconds)
    return Trace("synthetic", [i / rate_per_s for i in range(n)], [prompt] * n, [output] * n)
