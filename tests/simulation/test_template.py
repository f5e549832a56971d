import copy

import pytest

from genai_constructs.simulation import TemplateReadError, read_template
from genai_constructs.simulation.template import MetricStat
from tests.simulation.support import CHAT, ROUND1, chat_template


def test_reads_the_group_its_warm_pool_hook_and_target_group():
    spec = read_template(CHAT)
    assert (spec.min_size, spec.max_size, spec.desired_capacity) == (2, 4, 2)  # MinSize/MaxSize are strings
    assert (spec.health_check_type, spec.health_check_grace_s, spec.default_instance_warmup_s) == ("ELB", 120, 120)
    assert spec.warm_pool is not None
    assert (spec.warm_pool.min_size, spec.warm_pool.pool_state, spec.warm_pool.reuse_on_scale_in) == (1, "Stopped", True)
    assert spec.warm_pool.max_group_prepared_capacity is None
    assert spec.launch_hook is True
    assert (spec.health_check_interval_s, spec.unhealthy_threshold) == (15, 3)
    assert spec.routing_algorithm == "least_outstanding_requests"
    assert (spec.deregistration_delay_s, spec.idle_timeout_s) == (300, 300)
    assert [(v.size_gib, v.iops, v.throughput_mibps) for v in spec.volumes] == [(186, 4000, 1000)]
    assert spec.unmodelled == ()


def test_reads_the_plan_metadata():
    plan = read_template(CHAT).plan
    assert (plan.model, plan.instance_type, plan.devices_per_replica) == ("llama-3.1-8b", "g6.xlarge", 1)
    assert (plan.max_num_seqs, plan.max_model_len, plan.kv_cache_gib_available) == (25, 8192, 4.158)
    assert (plan.concurrency_per_instance, plan.in_flight_target) == (17, 17)
    assert (plan.p95_ttft_ms, plan.p95_tpot_ms, plan.usd_per_hour) == (2000, 100, 0.805)
    assert (plan.cold_start_s, plan.warm_start_s) == (394.8, 195.3)


def test_reads_target_tracking_with_its_metric_math():
    (policy,) = read_template(CHAT).target_tracking
    assert (policy.target_value, policy.disable_scale_in) == (17, False)
    running, waiting, demand = policy.queries
    assert running.metric == MetricStat("GenaiConstructs/Inference", "RequestsInFlight", "Average", 60)
    assert waiting.metric is not None and waiting.metric.metric_name == "RequestsWaiting"
    assert (demand.expression, demand.return_data) == ("running + waiting", True)


def test_reads_step_policies_with_their_alarms():
    ttft, tpot = read_template(CHAT).step_policies
    assert [(s.lower, s.upper, s.adjustment) for s in ttft.steps] == [(0, 2000, 1), (2000, None, 2)]
    (alarm,) = ttft.alarms
    assert (alarm.period_s, alarm.evaluation_periods, alarm.datapoints_to_alarm) == (60, 3, 2)
    assert (alarm.threshold, alarm.comparison, alarm.treat_missing_data) == (2000, "GreaterThanOrEqualToThreshold",
                                                                             "notBreaching")
    assert alarm.queries[0].metric == MetricStat("GenaiConstructs/Inference", "TimeToFirstToken", "p95", 60)
    assert tpot.alarms[0].threshold == 100


def test_round1_scale_in_alarm_treats_missing_data_as_missing_by_default():
    spec = read_template(ROUND1)
    assert spec.target_tracking == ()
    scale_in = next(p for p in spec.step_policies if p.logical_id == "ChatRequestCountScaleInPolicy")
    (alarm,) = scale_in.alarms
    assert alarm.treat_missing_data == "missing"
    assert (alarm.evaluation_periods, alarm.datapoints_to_alarm, alarm.threshold) == (15, 15, 30)
    assert alarm.comparison == "LessThanOrEqualToThreshold"
    assert alarm.queries[0].metric == MetricStat("AWS/ApplicationELB", "RequestCountPerTarget", "Sum", 60)


def test_an_unknown_predefined_metric_is_reported_not_ignored():
    template = chat_template()
    config = template["Resources"]["ChatInFlightPerInstance"]["Properties"]["TargetTrackingConfiguration"]
    del config["CustomizedMetricSpecification"]
    config["PredefinedMetricSpecification"] = {"PredefinedMetricType": "ASGAverageCPUUtilization"}
    spec = read_template(template)
    assert spec.target_tracking == ()
    assert spec.unmodelled == (
        "target tracking policy ChatInFlightPerInstance tracks ASGAverageCPUUtilization, which the simulator does not "
        "produce: policy not simulated",)


def test_an_unknown_custom_metric_is_reported_not_ignored():
    template = chat_template()
    alarm = template["Resources"]["ChatTimeToFirstTokenScaleOutAlarm"]["Properties"]
    alarm["MetricName"] = "KvCacheUsage"
    spec = read_template(template)
    assert [p.logical_id for p in spec.step_policies] == ["ChatTimePerOutputTokenScaleOutPolicy"]
    assert spec.unmodelled == (
        "ChatTimeToFirstTokenScaleOutAlarm reads GenaiConstructs/Inference KvCacheUsage, which the simulator does not "
        "produce: ChatTimeToFirstTokenScaleOutAlarm not simulated",
        "step policy ChatTimeToFirstTokenScaleOutPolicy has no alarm the simulator can evaluate: policy not simulated",
    )


def test_metric_math_it_cannot_evaluate_is_reported():
    template = chat_template()
    metrics = template["Resources"]["ChatInFlightPerInstance"]["Properties"]["TargetTrackingConfiguration"][
        "CustomizedMetricSpecification"]["Metrics"]
    metrics[2]["Expression"] = "IF(running > 0, running + waiting, 0)"
    spec = read_template(template)
    assert spec.target_tracking == ()
    assert spec.unmodelled[0].startswith("ChatInFlightPerInstance metric math 'IF(running > 0, running + waiting, 0)': "
                                         "function IF is not implemented")


def test_a_second_fleet_and_a_spot_mix_are_reported():
    template = chat_template()
    resources = template["Resources"]
    resources["OtherGroup"] = copy.deepcopy(resources["ChatAutoScalingGroup"])
    # Another fleet's group (a group of the same fleet would be its second slot: next test).
    resources["OtherGroup"]["Metadata"]["genai-constructs:plan"]["fleet"] = "Other-Fleet"
    resources["ChatAutoScalingGroup"]["Properties"]["MixedInstancesPolicy"] = {"InstancesDistribution": {}}
    spec = read_template(template)
    assert spec.group_logical_id == "ChatAutoScalingGroup"
    assert spec.unmodelled[:2] == (
        "second fleet OtherGroup: only the first fleet (ChatAutoScalingGroup) is simulated",
        "ChatAutoScalingGroup has a MixedInstancesPolicy (Spot or several instance types): simulated as On-Demand "
        "g6.xlarge only, without Spot interruptions",
    )


def test_sizes_may_be_parameters_with_defaults():
    template = chat_template()
    template["Parameters"] = {"Max": {"Type": "Number", "Default": "6"}}
    template["Resources"]["ChatAutoScalingGroup"]["Properties"]["MaxSize"] = {"Ref": "Max"}
    assert read_template(template).max_size == 6


def test_fails_on_a_template_without_a_fleet():
    with pytest.raises(TemplateReadError) as error:
        read_template({"Resources": {"Bucket": {"Type": "AWS::S3::Bucket"}}})
    assert str(error.value) == ("the template holds no inference fleet to simulate: it has no "
                                "AWS::AutoScaling::AutoScalingGroup; synthesize a stack with a GpuInferenceFleet")


def test_fails_on_a_file_that_is_not_json(tmp_path):
    path = tmp_path / "x.template.json"
    path.write_text("Resources: {}")
    with pytest.raises(TemplateReadError, match=r"is not JSON \(line 1"):
        read_template(path)


def test_variants_drop_the_warm_pool_or_replace_the_policies():
    spec = read_template(CHAT)
    assert spec.without_warm_pool().warm_pool is None
    gpu = spec.with_gpu_utilization_tracking(70)
    assert gpu.step_policies == ()
    (policy,) = gpu.target_tracking
    assert policy.target_value == 70
    assert policy.queries[0].metric == MetricStat("GenaiConstructs/Inference", "nvidia_smi_utilization_gpu", "Average")
