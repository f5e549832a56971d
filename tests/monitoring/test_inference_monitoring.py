"""Metric factory, alarm factory and dashboard segment of the inference fleet, on a small stack of their own."""

from __future__ import annotations

from typing import Any

import pytest
from aws_cdk import App, Duration, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from aws_cdk import aws_sns as sns
from aws_cdk.assertions import Template

from genai_constructs.monitoring import (
    InferenceAlarmThresholds,
    InferenceFleetAlarmFactory,
    InferenceFleetMetricFactory,
    inference_fleet_segment,
)


@pytest.fixture(scope="module")
def world() -> dict[str, Any]:
    stack = Stack(App(), "Monitoring")
    vpc = ec2.Vpc(stack, "Vpc", max_azs=2, nat_gateways=0, subnet_configuration=[
        ec2.SubnetConfiguration(name="p", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)])
    alb = elbv2.ApplicationLoadBalancer(stack, "Alb", vpc=vpc)
    groups = [elbv2.ApplicationTargetGroup(stack, f"Tg{i}", vpc=vpc, port=8000) for i in range(2)]
    alb.add_listener("L", port=80, open=False, default_action=elbv2.ListenerAction.weighted_forward([
        elbv2.WeightedTargetGroup(target_group=groups[0], weight=90),
        elbv2.WeightedTargetGroup(target_group=groups[1], weight=10)]))
    metrics = InferenceFleetMetricFactory(load_balancer=alb, target_groups=groups,
                                          auto_scaling_group_names=["asg-blue", "asg-green"],
                                          namespace="NS", fleet="chat")
    topic = sns.Topic(stack, "Topic")
    return {"stack": stack, "metrics": metrics, "topic": topic}


def test_agent_metrics_carry_the_fleet_dimension(world: dict[str, Any]) -> None:
    metric = world["metrics"].metric_gpu_utilization()
    assert (metric.namespace, metric.metric_name, metric.dimensions) == (
        "NS", "nvidia_smi_utilization_gpu", {"Fleet": "chat"})


def test_instance_metrics_sum_every_group(world: dict[str, Any]) -> None:
    expression = world["metrics"].metric_network_in_bytes()
    assert expression.expression == "FILL(networkin0, 0) + FILL(networkin1, 0)"
    assert {m.dimensions["AutoScalingGroupName"] for m in expression.using_metrics.values()} == {
        "asg-blue", "asg-green"}


def test_cost_per_million_tokens_divides_instance_cost_by_tokens(world: dict[str, Any]) -> None:
    expression = world["metrics"].metric_usd_per_million_tokens(1.5)
    assert expression.expression == (
        "1000000 * (FILL(groupinserviceinstances0, 0) + FILL(groupinserviceinstances1, 0)) * 1.5 * 1 / tokens")
    assert expression.using_metrics["tokens"].metric_name == "GeneratedTokens"
    assert expression.period.to_seconds() == 3600


def test_5xx_rate_counts_target_and_load_balancer_errors(world: dict[str, Any]) -> None:
    expression = world["metrics"].metric_http_5xx_rate()
    names = {m.metric_name for m in expression.using_metrics.values()}
    assert names == {"HTTPCode_Target_5XX_Count", "HTTPCode_ELB_5XX_Count", "RequestCount"}


@pytest.fixture(scope="module")
def alarms(world: dict[str, Any]) -> dict[str, Any]:
    factory = InferenceFleetAlarmFactory(world["stack"], metrics=world["metrics"], topic=world["topic"])
    with_gpu = factory.create(InferenceAlarmThresholds(
        p99_time_to_first_token=Duration.seconds(4), p99_time_per_output_token=Duration.millis(100)))
    return {"with_gpu": with_gpu, "template": Template.from_stack(world["stack"])}


def test_all_alarms_one_per_signal_and_target_group(alarms: dict[str, Any]) -> None:
    assert sorted(alarms["with_gpu"]) == [
        "gpu_memory", "http_5xx_rate", "overprovisioned", "p99_tpot", "p99_ttft", "unhealthy_hosts",
        "unhealthy_hosts_green"]
    alarms["template"].resource_count_is("AWS::CloudWatch::Alarm", 7)


def test_latency_alarms_read_the_per_request_metrics_in_milliseconds(alarms: dict[str, Any]) -> None:
    by_name = {a["Properties"].get("MetricName"): a["Properties"]
               for a in alarms["template"].find_resources("AWS::CloudWatch::Alarm").values()}
    assert by_name["TimeToFirstToken"]["Threshold"] == 4000 and by_name["TimeToFirstToken"]["Namespace"] == "NS"
    assert by_name["TimePerOutputToken"]["Threshold"] == 100
    assert by_name["TimeToFirstToken"]["Dimensions"] == [{"Name": "Fleet", "Value": "chat"}]


def test_alarms_notify_on_alarm_and_on_ok(alarms: dict[str, Any]) -> None:
    for alarm in alarms["template"].find_resources("AWS::CloudWatch::Alarm").values():
        assert alarm["Properties"]["AlarmActions"] == alarm["Properties"]["OKActions"]
        assert alarm["Properties"]["TreatMissingData"] == "notBreaching"


def test_no_gpu_alarm_without_a_gpu_threshold() -> None:
    stack = Stack(App(), "NoGpu")
    vpc = ec2.Vpc(stack, "Vpc", max_azs=2, nat_gateways=0, subnet_configuration=[
        ec2.SubnetConfiguration(name="p", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)])
    alb = elbv2.ApplicationLoadBalancer(stack, "Alb", vpc=vpc)
    group = elbv2.ApplicationTargetGroup(stack, "Tg", vpc=vpc, port=8000)
    alb.add_listener("L", port=80, default_target_groups=[group], open=False)
    metrics = InferenceFleetMetricFactory(load_balancer=alb, target_groups=[group], auto_scaling_group_names=["a"],
                                          namespace="NS", fleet="f")
    created = InferenceFleetAlarmFactory(stack, metrics=metrics, topic=sns.Topic(stack, "T")).create(
        InferenceAlarmThresholds(p99_time_to_first_token=Duration.seconds(4), gpu_memory_used_percent=None,
                                 gpu_underused_percent=None))
    assert sorted(created) == ["http_5xx_rate", "p99_ttft", "unhealthy_hosts"]
    Template.from_stack(stack).resource_count_is("AWS::CloudWatch::Alarm", 3)


def _titles(stack: Stack, rows: list[list[Any]]) -> list[str | None]:
    return [stack.resolve(w.to_json())[0]["properties"].get("title") for row in rows for w in row]


def test_segment_lays_out_latency_errors_capacity_and_validation(world: dict[str, Any]) -> None:
    rows = inference_fleet_segment(world["metrics"], title="Chat", ttft_target_ms=2000, tpot_target_ms=50,
                                   in_flight_target=12, usd_per_instance_hour=1.5)
    titles = _titles(world["stack"], rows)
    assert "Time to first token p50 / p95 / p99 (ms)" in titles
    assert "Time per output token p50 / p95 / p99 (ms)" in titles
    assert "Requests in flight and waiting per instance" in titles
    assert "ALB TargetResponseTime p95 (s): to response headers, not TTFT" in titles
    assert "GPU utilization and memory (%)" in titles
    assert "USD per 1M output tokens" in titles


def test_segment_leaves_out_cost_when_the_price_is_unknown(world: dict[str, Any]) -> None:
    rows = inference_fleet_segment(world["metrics"], title="Chat", ttft_target_ms=2000, tpot_target_ms=50)
    titles = _titles(world["stack"], rows)
    assert "USD per 1M output tokens" not in titles
