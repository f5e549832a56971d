import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genai_constructs.errors import (
    DeadlineUnreachableError,
    GenaiConstructsError,
    LatencyTargetUnreachableError,
    ModelDoesNotFitError,
)
from genai_constructs.planner import estimate, load_catalog, plan_embedding, plan_inference
from genai_constructs.workload import BatchTraffic, ModelShape, RealtimeTraffic

CHAT = RealtimeTraffic(concurrent_sessions=32, output_tokens_per_s_per_session=20)
EMBED = BatchTraffic(documents=2_000_000, tokens_per_document=800, deadline_hours=12, spot_ok=True)


@pytest.fixture(scope="module")
def chat_8b():
    return plan_inference(ModelShape.preset("llama-3.1-8b"), CHAT)


@pytest.fixture(scope="module")
def chat_70b():
    return plan_inference(
        ModelShape.preset("llama-3.1-70b"), RealtimeTraffic(concurrent_sessions=64, output_tokens_per_s_per_session=15)
    )


def test_8b_chat_lands_on_one_g_family_gpu(chat_8b):
    assert chat_8b.family.startswith("g") and chat_8b.devices_per_replica == 1


def test_70b_chat_shards_one_replica_over_several_gpus(chat_70b):
    # 131 GiB of bf16 weights fit no single GPU in the catalog (the largest, B200, has 179 GiB but a 4-GPU L40S or
    # 8-GPU A100 box is cheaper): the plan is one tensor-parallel replica over at least four GPUs.
    assert chat_70b.devices_per_replica >= 4 and chat_70b.replicas_per_instance == 1
    assert chat_70b.server.tensor_parallel_size == chat_70b.devices_per_replica


def test_plan_meets_the_latency_targets(chat_8b):
    assert chat_8b.estimate.tpot_ms <= CHAT.tpot_target_ms
    assert chat_8b.estimate.ttft_ms <= CHAT.p95_ttft_ms


def test_plan_keeps_at_least_two_instances(chat_8b):
    assert chat_8b.min_instances >= 2 and chat_8b.max_instances >= chat_8b.min_instances


def test_plan_serves_every_session(chat_8b):
    assert chat_8b.max_instances * chat_8b.concurrency_per_instance >= CHAT.concurrent_sessions


def test_plan_keeps_headroom_below_the_latency_limit(chat_8b):
    # One more third of load must still fit the target (30 % headroom): re-estimate independently.
    pushed = estimate(
        chat_8b.model,
        chat_8b.instance_type,
        concurrency=int(chat_8b.concurrency_per_instance / 0.7),
        prompt_tokens=CHAT.prompt_tokens,
        output_tokens=CHAT.output_tokens,
    )
    assert pushed.tpot_ms <= CHAT.tpot_target_ms * 1.01


def test_chosen_option_is_the_cheapest_that_meets_targets(chat_8b):
    priced = [a for a in chat_8b.alternatives if a.usd_per_hour is not None]
    assert all(a.usd_per_hour * a.instances >= chat_8b.usd_per_hour_at_peak - 1e-6 for a in priced)


def test_cost_per_million_tokens_follows_from_price_and_throughput(chat_8b):
    tokens_per_hour = chat_8b.estimate.output_tokens_per_s * 3600
    assert chat_8b.usd_per_million_output_tokens == pytest.approx(
        chat_8b.usd_per_hour / tokens_per_hour * 1e6, rel=1e-3
    )


def test_plan_explains_itself(chat_8b):
    assert len(chat_8b.reasons) >= 3 and chat_8b.bottleneck and chat_8b.cost_lever
    assert chat_8b.instance_type in " ".join(chat_8b.reasons)


def test_unpriced_types_are_kept_but_not_ranked(chat_70b):
    unpriced = [a for a in chat_70b.alternatives if a.usd_per_hour is None]
    assert any(a.instance_type == "p5e.48xlarge" for a in unpriced)
    assert chat_70b.instance_type != "p5e.48xlarge"


def test_neuron_plan_carries_caveats():
    plan = plan_inference(ModelShape.preset("llama-3.1-8b"), CHAT, instance_types=["inf2.24xlarge"])
    assert plan.is_neuron and any("compiled" in c for c in plan.neuron_caveats)


def test_gpu_plan_has_no_neuron_caveats(chat_8b):
    assert chat_8b.neuron_caveats == []


def test_embedding_plan_meets_the_deadline_and_scales_to_zero():
    plan = plan_embedding(ModelShape.preset("bge-large-en-v1.5"), EMBED)
    assert plan.hours_to_finish <= EMBED.deadline_hours * (1 - EMBED.headroom)
    assert plan.min_instances == 0 and plan.max_instances >= 1


def test_embedding_plan_offers_equivalent_spot_types_when_spot_is_ok():
    plan = plan_embedding(ModelShape.preset("bge-large-en-v1.5"), EMBED)
    catalog = load_catalog()
    assert plan.spot and plan.instance_type in plan.spot_instance_types and len(plan.spot_instance_types) >= 2
    counts = {catalog.instance(t).accelerator_count for t in plan.spot_instance_types}
    assert counts == {catalog.instance(plan.instance_type).accelerator_count}


def test_embedding_plan_without_spot_lists_no_spot_types():
    plan = plan_embedding(
        ModelShape.preset("bge-base-en-v1.5"), BatchTraffic(documents=1000, tokens_per_document=500, deadline_hours=1)
    )
    assert not plan.spot and plan.spot_instance_types == []


def test_embedding_plan_is_the_cheapest_per_million_tokens():
    plan = plan_embedding(ModelShape.preset("bge-large-en-v1.5"), EMBED)
    priced = [a.usd_per_million_tokens for a in plan.alternatives if a.usd_per_million_tokens is not None]
    assert all(p >= plan.usd_per_million_tokens for p in priced)


@settings(max_examples=25, deadline=None)
@given(sessions=st.integers(1, 400), more=st.integers(0, 400))
def test_more_concurrency_never_needs_fewer_replicas(sessions, more):
    model = ModelShape.preset("llama-3.1-8b")
    a = plan_inference(
        model,
        RealtimeTraffic(concurrent_sessions=sessions, output_tokens_per_s_per_session=20),
        instance_types=["g5.2xlarge"],
    )
    b = plan_inference(
        model,
        RealtimeTraffic(concurrent_sessions=sessions + more, output_tokens_per_s_per_session=20),
        instance_types=["g5.2xlarge"],
    )
    assert b.max_instances >= a.max_instances


# --- bad input ----------------------------------------------------------------------------------------------------


def test_fails_model_that_fits_nowhere_names_largest_and_shortfall():
    huge = ModelShape(
        name="huge",
        parameters_billion=2000,
        layers=120,
        hidden_size=16384,
        attention_heads=128,
        kv_heads=8,
        head_dim=128,
        vocabulary=128000,
        max_context=8192,
    )
    with pytest.raises(
        ModelDoesNotFitError, match=r"fits no instance .* the largest, p6-b200.48xlarge .* falls short by"
    ):
        plan_inference(huge, CHAT)


def test_fails_impossible_token_rate_names_the_best_decode_and_the_rate_lever():
    with pytest.raises(LatencyTargetUnreachableError) as error:
        plan_inference(
            ModelShape.preset("llama-3.1-70b"),
            RealtimeTraffic(concurrent_sessions=4, output_tokens_per_s_per_session=500),
        )
    message = str(error.value)
    assert "output_tokens_per_s_per_session (500, a token every 2.0 ms) is faster than the best decode" in message
    assert "lower output_tokens_per_s_per_session to at most" in message
    assert "p95_ttft_ms" not in message  # the first-token target is reachable: do not point at it


def test_fails_impossible_ttft_points_at_the_prompt_not_the_token_rate():
    # A 30,000-token prompt cannot be prefilled in 20 ms on any GPU: the advice is about TTFT and prompts.
    traffic = RealtimeTraffic(
        concurrent_sessions=4, output_tokens_per_s_per_session=5, prompt_tokens=30_000, output_tokens=200,
        p95_ttft_ms=20,
    )  # fmt: skip
    with pytest.raises(LatencyTargetUnreachableError) as error:
        plan_inference(ModelShape.preset("llama-3.1-8b"), traffic)
    message = str(error.value)
    assert "p95_ttft_ms (20) is below the fastest first token for a 30000-token prompt" in message
    assert "raise p95_ttft_ms to at least" in message and "shorten prompt_tokens" in message
    assert "output_tokens_per_s_per_session" not in message


def test_fails_heads_that_divide_no_device_count_are_named_not_memory():
    # 70 B parameters (130 GiB in bf16), 7 heads: 8 x 80 GiB holds it, but 7 heads shard over 1 or 7 ranks only,
    # and one 80 GiB GPU is too small.
    odd = ModelShape(
        name="odd-70b", parameters_billion=70, layers=80, hidden_size=7168, attention_heads=7, kv_heads=7,
        head_dim=1024, vocabulary=32000, max_context=4096, precision="bf16",
    )  # fmt: skip
    with pytest.raises(ModelDoesNotFitError) as error:
        plan_inference(odd, CHAT, instance_types=["p5.48xlarge", "p4de.24xlarge"])
    message = str(error.value)
    assert "attention_heads (7) divide no tensor-parallel degree" in message
    assert "short by -" not in message


def test_fails_encoder_given_to_the_inference_planner():
    with pytest.raises(GenaiConstructsError, match=r"is an encoder; plan embedding work with plan_embedding"):
        plan_inference(ModelShape.preset("bge-large-en-v1.5"), CHAT)


def test_fails_decoder_given_to_the_embedding_planner():
    with pytest.raises(GenaiConstructsError, match=r"is a decoder; plan chat/completion with plan_inference"):
        plan_embedding(ModelShape.preset("llama-3.1-8b"), EMBED)


def test_fails_deadline_no_fleet_can_meet():
    traffic = BatchTraffic(documents=10**11, tokens_per_document=2000, deadline_hours=1)
    with pytest.raises(DeadlineUnreachableError, match=r"deadline_hours \(1\) cannot be met .* the fastest option"):
        plan_embedding(ModelShape.preset("e5-large-v2"), traffic)


def test_fails_deadline_shorter_than_a_workers_start_up():
    # Six minutes less 20 % headroom is 4.8 min: no worker has booted, pulled its image and loaded the encoder yet.
    traffic = BatchTraffic(documents=10, tokens_per_document=100, deadline_hours=0.1)
    with pytest.raises(DeadlineUnreachableError) as error:
        plan_embedding(ModelShape.preset("e5-large-v2"), traffic)
    message = str(error.value)
    assert "deadline_hours (0.1) leaves no time to work" in message
    assert "image_pull" in message and "give a deadline of at least" in message


def test_batch_hours_include_worker_start_up():
    # A tiny backlog finishes in seconds of work, but the job takes as long as a worker's start-up.
    plan = plan_embedding(
        ModelShape.preset("bge-base-en-v1.5"), BatchTraffic(documents=1000, tokens_per_document=200, deadline_hours=4)
    )
    assert plan.worker_startup_s > 240  # boot + image pull + server start, each over a minute (data/startup.json)
    assert plan.hours_to_finish * 3600 >= plan.worker_startup_s


def test_fails_traffic_longer_than_the_context():
    traffic = RealtimeTraffic(
        concurrent_sessions=4, output_tokens_per_s_per_session=10, prompt_tokens=4000, output_tokens=500
    )
    with pytest.raises(GenaiConstructsError, match=r"prompt_tokens \+ output_tokens \(4500\) exceeds llama-2-7b's"):
        plan_inference(ModelShape.preset("llama-2-7b"), traffic)


def test_fails_chunk_longer_than_encoder_context():
    traffic = BatchTraffic(documents=10, tokens_per_document=100, deadline_hours=1, sequence_tokens=1024)
    with pytest.raises(GenaiConstructsError, match=r"sequence_tokens \(1024\) exceeds bge-base-en-v1.5's max_context"):
        plan_embedding(ModelShape.preset("bge-base-en-v1.5"), traffic)


def test_fails_unknown_instance_in_restriction():
    with pytest.raises(GenaiConstructsError, match=r"'p9.48xlarge' is not in the accelerator catalog"):
        plan_inference(ModelShape.preset("llama-3.1-8b"), CHAT, instance_types=["p9.48xlarge"])


def test_fails_unknown_runtime_for_planning():
    with pytest.raises(GenaiConstructsError, match=r"runtime 'triton' is not one of"):
        plan_inference(ModelShape.preset("llama-3.1-8b"), CHAT, runtime="triton")


def test_plan_names_the_vcpu_quota_to_request(chat_70b):
    quota = next(n for n in chat_70b.notes if n.startswith("Quota"))
    group = "P" if chat_70b.family.startswith("p") else "G and VT"
    assert f"Running On-Demand {group} instances" in quota
    vcpus = load_catalog().instance(chat_70b.instance_type).vcpu  # EC2 DescribeInstanceTypes, via the catalog
    group_max = max(chat_70b.max_instances, chat_70b.min_instances + 1)
    assert f"{vcpus * group_max:,} vCPUs" in quota


def test_spot_plan_names_the_spot_quota():
    plan = plan_embedding(ModelShape.preset("bge-large-en-v1.5"), EMBED)
    assert any("All G and VT Spot Instance Requests" in n for n in plan.notes)


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (lambda: plan_inference(ModelShape.preset("llama-3.1-8b"), EMBED),
         "traffic (BatchTraffic) must be a RealtimeTraffic; BatchTraffic is planned by plan_embedding"),
        (lambda: plan_embedding(ModelShape.preset("bge-large-en-v1.5"), CHAT),
         "traffic (RealtimeTraffic) must be a BatchTraffic; RealtimeTraffic is planned by plan_inference"),
        (lambda: plan_inference("llama-3.1-8b", CHAT), "model ('llama-3.1-8b') must be a ModelShape, not a str"),
        (lambda: plan_inference(ModelShape.preset("llama-3.1-8b"), CHAT, include_neuron="yes"),
         "include_neuron ('yes') must be True or False"),
        (lambda: plan_inference(ModelShape.preset("llama-3.1-8b"), CHAT, region=1),
         "region (1) must be a region name"),
        (lambda: plan_inference(ModelShape.preset("llama-3.1-8b"), CHAT, instance_types=[]),
         "instance_types ([]) is empty"),
        (lambda: plan_inference(ModelShape.preset("llama-3.1-8b"), CHAT, instance_types="g5.xlarge"),
         "instance_types ('g5.xlarge') must be a list of instance type names, not one string"),
        (lambda: ModelShape.preset(None), "name (None) must be a preset name string"),
    ],
)  # fmt: skip
def test_fails_wrong_types_before_any_planning(call, expected):
    with pytest.raises(GenaiConstructsError) as error:
        call()
    assert expected in str(error.value)
