"""What each example promises, asserted on its synthesized template (one synthesis per session)."""

from __future__ import annotations

import json
from typing import Any

from aws_cdk.assertions import Match, Template

from examples import STACK_NAMES
from examples.certificates import PLACEHOLDER_CERTIFICATE_ARN
from tests.support import Synthesized, resources_of_type


def _only(template: dict[str, Any], resource_type: str, prefix: str = "") -> dict[str, Any]:
    """The one resource of a type (under ``prefix``) of the serving slot: a chat fleet's idle Green slot (logical ids
    with "Green") is left out."""
    (resource,) = [r for k, r in resources_of_type(template, resource_type).items()
                   if k.startswith(prefix) and "Green" not in k]
    return dict(resource["Properties"])


def _instance_type(template: dict[str, Any], prefix: str) -> str:
    return str(_only(template, "AWS::EC2::LaunchTemplate", prefix)["LaunchTemplateData"]["InstanceType"])


# ---- RealtimeChatStack -------------------------------------------------------------------------------------------


def test_realtime_chat_runs_on_a_g_family_instance(examples_synth: Synthesized) -> None:
    assert _instance_type(examples_synth.template(STACK_NAMES["realtime_chat"]), "Chat").startswith("g")


def test_every_chat_fleet_has_an_idle_green_slot_that_runs_nothing(examples_synth: Synthesized) -> None:
    for example in ("realtime_chat", "large_model_chat", "rag"):
        template = examples_synth.template(STACK_NAMES[example])
        (green,) = [r["Properties"] for k, r in resources_of_type(template, "AWS::AutoScaling::AutoScalingGroup").items()
                    if k.startswith("ChatAutoScalingGroupGreen")]
        assert green["MinSize"] == "0" and "DesiredCapacity" not in green, example
        (pool,) = [r["Properties"] for k, r in resources_of_type(template, "AWS::AutoScaling::WarmPool").items()
                   if "Green" in k]
        assert (pool["MinSize"], pool["MaxGroupPreparedCapacity"]) == (0, 0), example
        assert len(resources_of_type(template, "AWS::StepFunctions::StateMachine")) == 1, example


def test_realtime_chat_spans_two_zones_with_at_least_two_instances(examples_synth: Synthesized) -> None:
    group = _only(examples_synth.template(STACK_NAMES["realtime_chat"]), "AWS::AutoScaling::AutoScalingGroup")
    assert int(group["MinSize"]) >= 2
    assert len(group["VPCZoneIdentifier"]) == 2


def test_realtime_chat_keeps_a_warm_pool(examples_synth: Synthesized) -> None:
    assert resources_of_type(examples_synth.template(STACK_NAMES["realtime_chat"]), "AWS::AutoScaling::WarmPool")


def test_listeners_clients_call_serve_https_with_the_certificate(examples_synth: Synthesized) -> None:
    # In the RAG stack clients call the orchestrators' listener; the chat fleet behind it answers only them.
    for name in ("realtime_chat", "large_model_chat", "rag"):
        Template.from_json(examples_synth.template(STACK_NAMES[name])).has_resource_properties(
            "AWS::ElasticLoadBalancingV2::Listener",
            {"Protocol": "HTTPS", "Port": 443, "Certificates": [{"CertificateArn": PLACEHOLDER_CERTIFICATE_ARN}]},
        )


# ---- LargeModelChatStack -----------------------------------------------------------------------------------------


def test_large_model_chat_runs_on_a_p_family_instance_with_several_gpus(examples_synth: Synthesized) -> None:
    template = examples_synth.template(STACK_NAMES["large_model_chat"])
    assert _instance_type(template, "Chat").startswith("p")
    user_data = str(_only(template, "AWS::EC2::LaunchTemplate")["LaunchTemplateData"]["UserData"])
    assert "tensor" in user_data  # the replica is split across the instance's GPUs


def test_large_model_chat_launches_into_a_cluster_placement_group(examples_synth: Synthesized) -> None:
    template = examples_synth.template(STACK_NAMES["large_model_chat"])
    ((group_id, group),) = resources_of_type(template, "AWS::EC2::PlacementGroup").items()
    assert group["Properties"]["Strategy"] == "cluster"
    placement = _only(template, "AWS::EC2::LaunchTemplate")["LaunchTemplateData"]["Placement"]
    assert placement == {"GroupName": {"Fn::GetAtt": [group_id, "GroupName"]}}


# ---- BatchEmbeddingStack -----------------------------------------------------------------------------------------


def test_batch_embedding_scales_to_zero_on_spot(examples_synth: Synthesized) -> None:
    group = _only(examples_synth.template(STACK_NAMES["batch_embedding"]), "AWS::AutoScaling::AutoScalingGroup")
    assert group["MinSize"] == "0"
    distribution = group["MixedInstancesPolicy"]["InstancesDistribution"]
    assert distribution["OnDemandPercentageAboveBaseCapacity"] == 0


def test_batch_embedding_queue_redrives_to_a_dead_letter_queue(examples_synth: Synthesized) -> None:
    Template.from_json(examples_synth.template(STACK_NAMES["batch_embedding"])).has_resource_properties(
        "AWS::SQS::Queue",
        {"RedrivePolicy": {"deadLetterTargetArn": Match.any_value(), "maxReceiveCount": Match.any_value()}},
    )


def test_batch_embedding_buckets_are_kms_encrypted(examples_synth: Synthesized) -> None:
    buckets = resources_of_type(examples_synth.template(STACK_NAMES["batch_embedding"]), "AWS::S3::Bucket")
    data = {k: b for k, b in buckets.items() if "InputBucket" in k or "OutputBucket" in k}
    assert len(data) == 2
    for bucket in data.values():
        rule = bucket["Properties"]["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]
        assert rule["ServerSideEncryptionByDefault"]["SSEAlgorithm"] == "aws:kms"


# ---- RagStack ----------------------------------------------------------------------------------------------------


def _launch_user_data(template: dict[str, Any], prefix: str) -> str:
    return json.dumps(_only(template, "AWS::EC2::LaunchTemplate", prefix)["LaunchTemplateData"]["UserData"])


def test_rag_every_tier_runs_in_the_same_private_subnets(examples_synth: Synthesized) -> None:
    # Every hop of the request and batch paths can stay inside one AZ only if every tier spans the same subnets.
    template = examples_synth.template(STACK_NAMES["rag"])
    zones = {prefix: _only(template, "AWS::AutoScaling::AutoScalingGroup", prefix)["VPCZoneIdentifier"]
             for prefix in ("Embed", "Chat", "Prep", "Rag")}
    assert len({json.dumps(z, sort_keys=True) for z in zones.values()}) == 1, zones
    (subnet_group,) = [r["Properties"] for r in resources_of_type(template, "AWS::RDS::DBSubnetGroup").values()]
    assert sorted(json.dumps(s) for s in subnet_group["SubnetIds"]) == sorted(json.dumps(s) for s in zones["Rag"])


def test_rag_store_has_one_reader_in_each_zone_of_the_orchestrators(examples_synth: Synthesized) -> None:
    template = examples_synth.template(STACK_NAMES["rag"])
    instances = resources_of_type(template, "AWS::RDS::DBInstance")
    readers = [r["Properties"] for k, r in instances.items() if "Reader" in k]
    assert len(instances) == 3 and len(readers) == 2  # a writer plus one reader per zone
    assert len({json.dumps(r["AvailabilityZone"], sort_keys=True) for r in readers}) == 2


def test_rag_orchestrators_read_their_zone_s_reader_and_stream_from_the_chat_fleet(examples_synth: Synthesized) -> None:
    template = examples_synth.template(STACK_NAMES["rag"])
    user_data = _launch_user_data(template, "Rag")
    reader_ids = [k for k in resources_of_type(template, "AWS::RDS::DBInstance") if "Reader" in k]
    assert user_data.count("--reader") >= 2 and all(reader in user_data for reader in reader_ids)
    assert "--availability-zone" in user_data
    (chat_alb,) = [k for k in resources_of_type(template, "AWS::ElasticLoadBalancingV2::LoadBalancer")
                   if k.startswith("Chat")]
    assert chat_alb in user_data and "--inference" in user_data


def test_rag_preprocessing_writes_chunks_where_the_embedding_fleet_is_notified(examples_synth: Synthesized) -> None:
    template = examples_synth.template(STACK_NAMES["rag"])
    user_data = _launch_user_data(template, "Prep")
    (embed_input,) = [k for k in resources_of_type(template, "AWS::S3::Bucket") if k.startswith("EmbedInputBucket")]
    assert "preprocess_worker" in user_data and embed_input in user_data
    assert "--chunk-tokens" in user_data and "254" in user_data  # MiniLM's window less [CLS] and [SEP]
    assert "vector_loader" in user_data  # the same CPU tier loads the vectors into the store


def test_rag_index_bucket_is_the_embedding_output(examples_synth: Synthesized) -> None:
    template = examples_synth.template(STACK_NAMES["rag"])
    assert [k for k in resources_of_type(template, "AWS::S3::Bucket") if k.startswith("EmbedOutputBucket")]


def test_rag_outputs_name_where_documents_go_in_and_answers_come_out(examples_synth: Synthesized) -> None:
    outputs = examples_synth.template(STACK_NAMES["rag"])["Outputs"]
    assert "RawDocumentsBucket" in outputs and "AnswersUrl" in outputs
