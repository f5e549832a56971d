"""Monitoring in three layers: a metric factory, an alarm factory and a dashboard segment per fleet."""

from genai_constructs.monitoring.alarms import InferenceAlarmThresholds, InferenceFleetAlarmFactory
from genai_constructs.monitoring.dashboard import inference_fleet_segment
from genai_constructs.monitoring.metrics import InferenceFleetMetricFactory

__all__ = [
    "InferenceAlarmThresholds",
    "InferenceFleetAlarmFactory",
    "InferenceFleetMetricFactory",
    "inference_fleet_segment",
]
