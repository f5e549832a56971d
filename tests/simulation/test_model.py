from array import array

import pytest

from genai_constructs.simulation import read_template
from genai_constructs.simulation.model import (
    DONE,
    FAILED,
    REJECTED,
    TIMED_OUT,
    Instance,
    Requests,
    ServingModel,
    serving_model,
)
from tests.simulation.support import CHAT

# A server with round numbers: a decode step takes 0.1 s for one sequence and 0.2 s for two; every prefill 0.5 s.
SERVER = ServingModel(step_s=(0.0, 0.1, 0.2), prefill_grid=(1, 10_000), prefill_s=(0.5, 0.5), max_num_seqs=2,
                      kv_capacity_tokens=4096, block_size=16, max_model_len=4096, precision="bf16")


def _run(arrivals, outputs, prompts=None, until=100.0, model=SERVER, idle_timeout=300.0):
    prompts = prompts or [100] * len(arrivals)
    req = Requests(array("d", arrivals), array("l", prompts), array("l", outputs), model)
    inst = Instance(0, model, req, 0.0)
    inst.state = "serving"
    inst.inbox.extend(range(len(arrivals)))
    inst.outstanding = len(arrivals)
    inst.advance(until, idle_timeout)
    return req, inst


def test_one_request_alone_ttft_is_its_prefill_and_tpot_the_single_step():
    req, inst = _run([0.0], [11])
    assert req.status[0] == DONE
    assert req.ttft[0] == pytest.approx(0.5)
    assert req.tpot[0] == pytest.approx(0.1)  # 10 more tokens at 0.1 s, from 0.5 s to 1.5 s
    assert inst.outstanding == 0
    assert inst.busy_s == pytest.approx(1.5)


def test_two_requests_prefill_in_turn_then_decode_together():
    req, _ = _run([0.0, 0.0], [11, 11])
    assert list(req.ttft) == pytest.approx([0.5, 1.0])
    # Both decode 10 tokens at 0.2 s a step from 1.0 s: both finish at 3.0 s.
    assert list(req.tpot) == pytest.approx([(3.0 - 0.5) / 10, (3.0 - 1.0) / 10])


def test_a_third_request_waits_for_a_sequence_slot():
    req, _ = _run([0.0, 0.0, 0.1], [11, 11, 2])
    assert req.ttft[2] == pytest.approx(3.0 + 0.5 - 0.1)  # admitted when the first two finish at 3.0 s


def test_the_kv_cache_holds_back_a_request_with_a_free_slot():
    small = ServingModel(**{**SERVER.__dict__, "kv_capacity_tokens": 160})  # 10 blocks of 16
    req, _ = _run([0.0, 0.0], [11, 11], prompts=[69, 69], model=small)  # 69 + 11 = 80 tokens = 5 blocks each
    assert list(req.ttft) == pytest.approx([0.5, 1.0])
    req, _ = _run([0.0, 0.0], [11, 11], prompts=[70, 70], model=small)  # 81 tokens = 6 blocks: not both
    assert list(req.ttft) == pytest.approx([0.5, 1.5 + 0.5])  # the second waits for the first (done at 1.5 s)


def test_a_request_longer_than_max_model_len_is_rejected():
    req, _ = _run([0.0], [100], prompts=[4000])
    assert req.status[0] == REJECTED


def test_a_request_queued_past_the_idle_timeout_times_out():
    req, inst = _run([0.0, 0.0, 0.0], [101, 101, 2], idle_timeout=5.0)  # the third waits 21 s for a slot
    assert [req.status[i] for i in range(3)] == [DONE, DONE, TIMED_OUT]
    assert inst.outstanding == 0


def test_a_wedged_instance_never_answers_and_loses_what_it_holds():
    req = Requests(array("d", [0.0]), array("l", [100]), array("l", [11]), SERVER)
    inst = Instance(0, SERVER, req, 0.0)
    inst.wedged = True
    inst.inbox.append(0)
    inst.advance(100.0, 300.0)
    assert req.status[0] == 0
    assert inst.lose_all() == 1
    assert req.status[0] == FAILED


def test_the_estimator_table_for_the_chat_fleet():
    model, notes = serving_model(read_template(CHAT).plan, mean_prompt=1024, mean_output=256)
    assert notes == []
    assert model.precision == "bf16"  # the plan's 14.957 GiB of weights are llama-3.1-8b in bf16
    assert len(model.step_s) == 26 and model.step_s[1] < model.step_s[17] < model.step_s[25]
    assert model.kv_capacity_tokens == 34062  # 4.158 GiB / 128 KiB per token (32 layers x 8 KV heads x 128 x 2 x 2)
    # The planner's own figure for a 1024-token prompt on g6.xlarge: the simulator times prefill as the estimator does.
    from genai_constructs.planner import estimate
    from genai_constructs.workload import ModelShape

    planned = estimate(ModelShape.preset("llama-3.1-8b"), "g6.xlarge", prompt_tokens=1024, output_tokens=1).ttft_ms
    assert 0.1 < planned / 1000 < 1.0  # a 1024-token prefill of an 8B model on an L4 takes a fraction of a second
    assert model.ttft_s(1024) == pytest.approx(planned / 1000, rel=1e-3)


def test_replicas_per_instance_serve_side_by_side():
    # Two replicas: twice the sequences and KV cache, and two sequences step as fast as one does on one replica.
    from dataclasses import replace

    plan = read_template(CHAT).plan
    one, _ = serving_model(replace(plan, replicas_per_instance=1), 1024, 256)
    two, _ = serving_model(replace(plan, replicas_per_instance=2), 1024, 256)
    assert two.max_num_seqs == 2 * one.max_num_seqs
    assert two.kv_capacity_tokens == 2 * one.kv_capacity_tokens
    assert two.step_s[2] == one.step_s[1] and two.step_s[4] == one.step_s[2]
    assert two.step_s[3] == one.step_s[2]  # three sequences: one replica runs two of them
