"""The public monitoring pieces refuse wrong types and nonsense numbers with the library's own error."""

from __future__ import annotations

from typing import Any

import pytest
from aws_cdk import Duration

from genai_constructs.errors import ConfigurationError
from genai_constructs.monitoring import InferenceAlarmThresholds, InferenceFleetMetricFactory, inference_fleet_segment

TTFT = Duration.millis(1000)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"p99_time_to_first_token": 1000}, "p99_time_to_first_token (1000) must be a Duration, not an int"),
        ({"http_5xx_rate_percent": float("inf")}, "http_5xx_rate_percent (inf) must be a finite number > 0 and <= 100"),
        ({"gpu_memory_used_percent": float("nan")}, "gpu_memory_used_percent (nan) must be a finite number"),
        ({"unhealthy_hosts": True}, "unhealthy_hosts (True) must be a whole number >= 1, not a bool"),
        ({"min_instances": 2.5}, "min_instances (2.5) must be a whole number >= 0, not a float"),
    ],
)
def test_thresholds_refuse_nonsense(kwargs: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        InferenceAlarmThresholds(**{"p99_time_to_first_token": TTFT, **kwargs})
    assert any(p.startswith(expected) for p in raised.value.problems), raised.value.problems


def test_metric_factory_refuses_a_name_for_a_load_balancer() -> None:
    with pytest.raises(ConfigurationError) as raised:
        InferenceFleetMetricFactory(load_balancer="my-alb", target_groups=[], auto_scaling_group_names="asg",  # type: ignore[arg-type]
                                    namespace="GenaiConstructs/Inference", fleet="chat")
    assert [p.split(" ")[0] for p in raised.value.problems] == ["load_balancer", "target_groups",
                                                                "auto_scaling_group_names"]


def test_dashboard_segment_refuses_an_infinite_target() -> None:
    with pytest.raises(ConfigurationError, match=r"metrics \(None\) must be an InferenceFleetMetricFactory"):
        inference_fleet_segment(None, title="t", ttft_target_ms=float("inf"), tpot_target_ms=50)  # type: ignore[arg-type]
