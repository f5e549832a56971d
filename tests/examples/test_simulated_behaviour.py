"""The synthesized chat example itself (not a hand-trimmed fixture) replayed through the fleet simulator: the
scaling the template carries scales out under load and back to its minimum when the traffic stops. The simulator's
rules (target tracking, alarms, missing data, warm pool and hook) are documented and tested in tests/simulation."""

from __future__ import annotations

from examples import STACK_NAMES
from genai_constructs.simulation import build_workload, read_template, simulate
from tests.simulation.support import steady_trace
from tests.support import Synthesized


def test_the_synthesized_chat_fleet_scales_out_under_load_and_in_to_its_minimum_when_idle(
    examples_synth: Synthesized,
) -> None:
    template = examples_synth.outdir / f"{STACK_NAMES['realtime_chat']}.template.json"
    fleet = read_template(template)
    assert fleet.unmodelled == ()  # every policy and alarm of the template is one the simulator runs
    # For an hour, requests of 1,024 + 200 tokens at twice the rate that keeps the example's minimum of two instances
    # at their scaling target (in flight = arrival rate x time in the server, from the plan's own TTFT and TPOT),
    # then two idle hours.
    plan = fleet.plan
    seconds_in_server = (plan.estimate_ttft_ms + 200 * plan.estimate_tpot_ms) / 1000
    rate = 2 * 2 * plan.in_flight_target / seconds_in_server
    report = simulate(fleet, build_workload(steady_trace(rate), hours=3, scenario="stop"))
    assert report.peak_instances > 2
    assert report.final_instances == 2  # the example's MinSize
    assert report.scale_in_activities >= 1
