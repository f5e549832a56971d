"""Scenarios as tests: each asserts on the report with figures worked out here, not taken from the simulator."""

import math

import pytest

from genai_constructs.simulation import Trace, build_workload, read_template, simulate
from tests.simulation.support import CHAT, ROUND1, steady_trace

# The chat fixture's own figures (tests/simulation/fixtures/realtime_chat.template.json).
MIN_SIZE, MAX_SIZE = 2, 4
WARM_START_S = 195.3
TTFT_TARGET_MS, TPOT_TARGET_MS = 2000.0, 100.0


@pytest.fixture(scope="module")
def chat():
    return read_template(CHAT)


@pytest.fixture(scope="module")
def stop_workload():
    # 2.6 requests/s of 1024 + 200 tokens: more than two instances hold within the targets, so the fleet scales
    # out in the first hour; then two hours without a request.
    return build_workload(steady_trace(2.6), hours=3, scenario="stop")


def test_a_two_hour_stop_ends_at_the_groups_minimum(chat, stop_workload):
    report = simulate(chat, stop_workload)
    assert report.peak_instances > MIN_SIZE
    assert report.final_instances == MIN_SIZE
    assert report.series.in_service_instances[-1] == MIN_SIZE
    assert report.scale_in_activities >= 1


def test_round1_scale_in_never_fires_on_an_idle_fleet(stop_workload):
    # Round 1 scaled in on ALB RequestCountPerTarget with missing data treated as missing: the ALB publishes
    # nothing without requests, the alarm stays INSUFFICIENT_DATA, and the fleet keeps its peak for two idle hours.
    report = simulate(read_template(ROUND1), stop_workload)
    assert report.peak_instances == MAX_SIZE
    assert report.final_instances == MAX_SIZE
    assert report.scale_in_activities == 0
    assert report.series.in_service_instances[-1] == MAX_SIZE


def test_a_wedged_instance_is_replaced_and_the_slo_recovers(chat):
    report = simulate(chat, build_workload(steady_trace(1.5), hours=1.5, scenario="failure"))
    assert report.instances_replaced == 1
    assert report.failed > 0  # what the wedged instance held when it was terminated
    minute_of_wedge = 60
    assert report.series.in_service_instances[minute_of_wedge] == MIN_SIZE - 1  # out of the target group (45 s)
    # Replaced from the warm pool: serving again within 45 s of health checks + 195.3 s of resume (~4 minutes).
    assert report.series.in_service_instances[minute_of_wedge + 5] >= MIN_SIZE
    last = slice(-15, None)
    assert all(v is not None and v <= TTFT_TARGET_MS for v in report.series.p95_ttft_ms[last])
    assert all(v is not None and v <= TPOT_TARGET_MS for v in report.series.p95_tpot_ms[last])


def test_a_3x_burst_is_absorbed_within_what_the_warm_pool_promises(chat):
    report = simulate(chat, build_workload(steady_trace(1.0), hours=1, scenario="burst"))
    # Target tracking sees 3 one-minute datapoints above the target, published 60 s after each minute and evaluated
    # at the next minute boundary (up to 60 s more): 180 + 60 + 60 s; then a warm-pool resume of 195.3 s.
    promise_minutes = math.ceil((180 + 60 + 60 + WARM_START_S) / 60)
    assert promise_minutes == 9
    assert report.burst_recovery_minutes is not None
    assert 0 < report.burst_recovery_minutes <= promise_minutes
    assert report.warm_pool_resumes >= 1 and report.cold_launches == 0


def test_without_the_warm_pool_the_same_burst_takes_a_cold_start_longer(chat):
    workload = build_workload(steady_trace(1.0), hours=1, scenario="burst")
    warm = simulate(chat, workload).burst_recovery_minutes
    cold = simulate(chat.without_warm_pool(), workload).burst_recovery_minutes
    assert warm is not None and cold is not None
    assert cold - warm >= math.floor((394.8 - WARM_START_S) / 60)  # the cold start is 199.5 s longer


def test_gpu_utilization_tracking_reads_100_percent_at_any_load(chat):
    # 0.5 requests/s keeps each of two instances at a fraction of its 17 sequences, yet a decode-bound GPU is busy
    # whenever it holds one: average utilization above 70 % scales the group to its maximum and keeps it there.
    report = simulate(chat.with_gpu_utilization_tracking(70), build_workload(steady_trace(0.5), hours=1))
    assert report.final_instances == MAX_SIZE
    assert report.scale_in_activities == 0


def test_an_idle_hour_costs_two_instances_and_four_volumes(chat):
    report = simulate(chat, build_workload(Trace("one", [0.0], [100], [10]), hours=1))
    assert report.instance_hours == pytest.approx(2.0)
    # The warm pool holds MaxSize - desired = 2 stopped instances (PutWarmPool: no MaxGroupPreparedCapacity).
    assert report.warm_pool_stopped_hours == pytest.approx(2.0)
    assert report.usd_instances == pytest.approx(2 * 0.805)
    # gp3 186 GiB at $0.08, 1000 IOPS over 3000 at $0.005, 875 MiB/s over 125 at $0.04, per month / 730 h.
    volume_per_hour = (186 * 0.08 + 1000 * 0.005 + 875 * 0.04) / 730
    assert report.usd_volumes == pytest.approx(4 * volume_per_hour, abs=0.005)
    assert report.final_instances == MIN_SIZE


def test_elb_health_checks_replace_but_ec2_health_checks_keep_a_wedged_instance(chat):
    from dataclasses import replace

    workload = build_workload(steady_trace(0.5), hours=1.25, scenario="failure")
    report = simulate(replace(chat, health_check_type="EC2", target_tracking=(), step_policies=()), workload)
    assert report.instances_replaced == 0
    assert report.series.in_service_instances[-1] == MIN_SIZE - 1  # out of the target group, still in the group
    assert report.final_instances == MIN_SIZE
