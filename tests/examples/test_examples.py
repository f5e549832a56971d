"""What each example promises, asserted on its synthesized template (one synthesis per session)."""

from __future__ import annotations

from typing import Any

from aws_cdk.assertions import Match, Template

from examples import STACK_NAMES
from examples.certificates import PLACEHOLDER_CERTIFICATE_ARN
from examples.rag import PLACEHOLDER_RETRIEVAL_SERVICE
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


def test_chat_listeners_serve_https_with_the_certificate(examples_synth: Synthesized) -> None:
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


def test_rag_fleets_share_the_same_zones(examples_synth: Synthesized) -> None:
    template = examples_synth.template(STACK_NAMES["rag"])
    embed = _only(template, "AWS::AutoScaling::AutoScalingGroup", "Embed")
    chat = _only(template, "AWS::AutoScaling::AutoScalingGroup", "Chat")
    assert embed["VPCZoneIdentifier"] == chat["VPCZoneIdentifier"]


def test_rag_retrieval_tier_gets_an_endpoint_in_the_same_subnets(examples_synth: Synthesized) -> None:
    template = examples_synth.template(STACK_NAMES["rag"])
    (endpoint,) = [
        e["Properties"]
        for e in resources_of_type(template, "AWS::EC2::VPCEndpoint").values()
        if e["Properties"].get("ServiceName") == PLACEHOLDER_RETRIEVAL_SERVICE
    ]
    chat = _only(template, "AWS::AutoScaling::AutoScalingGroup", "Chat")
    assert endpoint["VpcEndpointType"] == "Interface"
    assert endpoint["SubnetIds"] == chat["VPCZoneIdentifier"]


def test_rag_exposes_the_retrieval_tier_s_zonal_names(examples_synth: Synthesized) -> None:
    outputs = examples_synth.template(STACK_NAMES["rag"])["Outputs"]
    assert "RetrievalDnsEntries" in outputs and "RetrievalZonalNames" in outputs


def test_rag_index_bucket_is_the_embedding_output(examples_synth: Synthesized) -> None:
    template = examples_synth.template(STACK_NAMES["rag"])
    assert [k for k in resources_of_type(template, "AWS::S3::Bucket") if k.startswith("EmbedOutputBucket")]


def test_rag_chat_servers_receive_the_retrieval_tier_s_zonal_names(examples_synth: Synthesized) -> None:
    import json

    template = examples_synth.template(STACK_NAMES["rag"])
    chat_lts = [lt["Properties"] for key, lt in resources_of_type(template, "AWS::EC2::LaunchTemplate").items()
                if key.startswith("Chat")]
    (endpoint_id,) = [key for key, e in resources_of_type(template, "AWS::EC2::VPCEndpoint").items()
                      if e["Properties"].get("ServiceName") == PLACEHOLDER_RETRIEVAL_SERVICE]
    assert len(chat_lts) == 2  # both slots: the idle one serves after the next release
    for chat_lt in chat_lts:
        user_data = json.dumps(chat_lt["LaunchTemplateData"]["UserData"])
        # The container gets RETRIEVAL_DNS_ENTRIES, resolved from the retrieval endpoint's DnsEntries at deploy time.
        assert "--env 'RETRIEVAL_DNS_ENTRIES=" in user_data
        assert endpoint_id in user_data and "DnsEntries" in user_data
