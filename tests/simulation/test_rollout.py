"""A blue/green rollout replayed through both slots of the release fixture (simulation/rollout.py): during the
``ramp`` traffic it keeps the SLO, and a regressed version is rolled back on its own slot's alarm. The expected
figures are worked out here from the fixture's plan and the state machine's defaults, not taken from the replay."""

import pytest

from genai_constructs.simulation import ScenarioError, build_workload, simulate
from genai_constructs.simulation.rollout import read_rollout, simulate_rollout
from tests.simulation.support import RELEASE, steady_trace

# The fixture's own figures (tests/simulation/fixtures/release.template.json, the realtime chat fleet).
MIN_SIZE = 2
COLD_START_S, WARM_START_S = 394.8, 195.3
TTFT_TARGET_MS, TPOT_TARGET_MS = 2000.0, 50.0
STEPS, BAKE_S, POLL_S = (5, 25, 50, 100), 600, 30


@pytest.fixture(scope="module")
def release():
    return read_rollout(RELEASE)


@pytest.fixture(scope="module")
def ramp(release):
    # Requests of 1,024 + 200 tokens ramping from a fifth of the rate to the rate that keeps half of the two-instance
    # minimum at its scaling target (in flight = arrival rate x time in the server, from the plan's TTFT and TPOT):
    # a morning's climb the fleet serves within its targets without a rollout (asserted below).
    old, _, _ = release
    plan = old.plan
    seconds_in_server = (plan.estimate_ttft_ms + 200 * plan.estimate_tpot_ms) / 1000
    rate = 0.5 * MIN_SIZE * plan.in_flight_target / seconds_in_server
    return build_workload(steady_trace(rate, prompt=1024, output=200), hours=1.1, scenario="ramp")


def test_the_release_template_names_the_slots_and_the_state_machines_steps(release):
    old, new, rollout = release
    assert old.group_logical_id.startswith("ChatAutoScalingGroupASG")  # blue serves v1
    assert new.group_logical_id.startswith("ChatAutoScalingGroupGreen")  # green gets v2
    assert (old.min_size, new.min_size) == (MIN_SIZE, 0)
    assert (old.warm_pool.min_size, old.warm_pool.max_group_prepared_capacity) == (0, 0)  # the idle slot's: empty
    assert (new.warm_pool.min_size, new.warm_pool.max_group_prepared_capacity) == (1, None)
    assert (rollout.steps, rollout.bake_s, rollout.alarm_poll_s, rollout.min_instances) == (
        STEPS, BAKE_S, POLL_S, MIN_SIZE)
    # The latency alarms the bakes read (the target-group ones use ALB metrics the simulator does not publish).
    assert sorted((a.queries[0].metric.metric_name, a.threshold) for a in rollout.alarms) == [
        ("TimePerOutputToken", TPOT_TARGET_MS), ("TimeToFirstToken", TTFT_TARGET_MS)]


def test_a_rollout_during_the_ramp_keeps_the_slo(release, ramp):
    old, new, rollout = release
    start_s = 600
    report = simulate_rollout(old, new, rollout, ramp, start_s=start_s)
    assert report.outcome == "complete"
    assert [percent for _, percent in report.shifted_at_s] == list(STEPS)
    times = [at for at, _ in report.shifted_at_s]
    assert [b - a for a, b in zip(times, times[1:], strict=False)] == [BAKE_S] * 3
    # Ready: the deploy prepares the new slot's pool (a cold start under the hook), its instances resume from it
    # (the warm start) and pass two health checks; the machine sees each within a 30 s poll.
    ready_s = times[0] - start_s
    assert COLD_START_S + WARM_START_S <= ready_s <= COLD_START_S + WARM_START_S + 30 + 3 * POLL_S
    assert report.duration_s == ready_s + len(STEPS) * BAKE_S
    assert report.new_slot_cold_launches == 0 and report.new_slot_resumes >= MIN_SIZE
    # What users saw: within both targets during the rollout and over the whole run, no minute missed.
    assert report.rollout_p95_ttft_ms <= TTFT_TARGET_MS and report.rollout_p95_tpot_ms <= TPOT_TARGET_MS
    assert report.slo_violation_minutes == 0 and report.rejected == 0
    # The same traffic without a rollout: the same figures (the rollout costs users nothing here).
    baseline = simulate(old.with_warm_pool_of(new), ramp)
    assert baseline.slo_violation_minutes == 0
    print(f"\nrollout during ramp: ready {ready_s:g} s, duration {report.duration_s:g} s, p95 TTFT "
          f"{report.rollout_p95_ttft_ms} ms / TPOT {report.rollout_p95_tpot_ms} ms (baseline {baseline.p95_ttft_ms} / "
          f"{baseline.p95_tpot_ms})")


def test_a_version_twice_as_slow_per_token_is_rolled_back_in_its_first_bake(release, ramp):
    old, new, rollout = release
    report = simulate_rollout(old, new, rollout, ramp, start_s=600, new_version_decode_factor=2.0)
    assert report.outcome == "rolled back"
    assert [percent for _, percent in report.shifted_at_s] == [STEPS[0], 0]
    assert any("P95TimePerOutputToken" in name for name in report.rolled_back_because)
    (first, _), (back, _) = report.shifted_at_s
    # Two bad minutes of three trip the alarm; the next read (30 s) rolls back: well inside the first 600 s bake.
    assert back - first <= BAKE_S


def test_a_start_outside_the_workload_is_refused(release, ramp):
    old, new, rollout = release
    with pytest.raises(ScenarioError, match=r"start_s \(99999\) must fall inside"):
        simulate_rollout(old, new, rollout, ramp, start_s=99999)
