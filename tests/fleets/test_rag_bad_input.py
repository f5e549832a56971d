"""A new user's mistakes with the RAG constructs: each is one ConfigurationError naming the field, the value and the
fix, raised before the construct joins the tree. One module-scoped stack, never synthesized (errors come first)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from aws_cdk import App, Stack
from aws_cdk import aws_certificatemanager as acm

from genai_constructs import (
    AuroraVectorStore,
    BatchTraffic,
    DocumentPreprocessingFleet,
    EmbeddingBatchFleet,
    GpuInferenceFleet,
    ModelArtifact,
    ModelShape,
    PrivateDataPath,
    RagOrchestrationFleet,
    RagTraffic,
    RealtimeTraffic,
)
from genai_constructs.errors import ConfigurationError

ENCODER = "all-minilm-l6-v2"
V1 = ModelArtifact(bucket_name="my-models", prefix="llama-3.1-8b/", version="1")


@dataclass
class Pieces:
    stack: Stack
    network: PrivateDataPath
    other_network: PrivateDataPath
    embed: EmbeddingBatchFleet
    store: AuroraVectorStore
    chat: GpuInferenceFleet
    certificate: acm.ICertificate


@pytest.fixture(scope="module")
def pieces() -> Pieces:
    stack = Stack(App(), "Rag")
    network = PrivateDataPath(stack, "Net", extra_interface_endpoints=["secretsmanager"])
    certificate = acm.Certificate.from_certificate_arn(
        stack, "Cert", "arn:aws:acm:us-east-1:111122223333:certificate/your-certificate-id")
    corpus = BatchTraffic(documents=500_000, tokens_per_document=1_000, deadline_hours=6, sequence_tokens=254)
    return Pieces(
        stack=stack, network=network,
        other_network=PrivateDataPath(stack, "OtherNet", extra_interface_endpoints=["secretsmanager"]),
        embed=EmbeddingBatchFleet(stack, "Embed", network=network, model=ModelShape.preset(ENCODER), traffic=corpus),
        store=AuroraVectorStore(stack, "Store", network=network, traffic=RagTraffic(requests_per_s=4), dimension=384),
        chat=GpuInferenceFleet(
            stack, "Chat", network=network, model=ModelShape.preset("llama-3.1-8b"), model_artifact=V1,
            traffic=RealtimeTraffic(concurrent_sessions=32, output_tokens_per_s_per_session=10, prompt_tokens=2_300),
            certificate=certificate),
        certificate=certificate)


def refused(pieces: Pieces, build: Callable[[str], object], construct_id: str = "New") -> str:
    """The one error ``build`` raises, after checking it left nothing in the stack."""
    children = len(pieces.stack.node.children)
    with pytest.raises(ConfigurationError) as caught:
        build(construct_id)
    assert len(pieces.stack.node.children) == children
    if construct_id == "New":
        assert pieces.stack.node.try_find_child(construct_id) is None
    return str(caught.value)


def prep(pieces: Pieces, **override: object) -> Callable[[str], object]:
    arguments = {"network": pieces.network, "embedding": pieces.embed, "traffic": pieces.embed.plan.traffic,
                 "formats": {"pdf": 0.5, "html": 0.3, "txt": 0.2}, **override}
    return lambda cid: DocumentPreprocessingFleet(pieces.stack, cid, **arguments)  # type: ignore[arg-type]


def answers(pieces: Pieces, **override: object) -> Callable[[str], object]:
    arguments = {"network": pieces.network, "inference": pieces.chat, "vector_store": pieces.store,
                 "traffic": RagTraffic(requests_per_s=4, top_k=8, chunk_tokens=254), "encoder": ENCODER,
                 "certificate": pieces.certificate, "inference_server_name": "chat.example.internal", **override}
    return lambda cid: RagOrchestrationFleet(pieces.stack, cid, **arguments)  # type: ignore[arg-type]


def test_an_id_already_taken_is_named_with_the_fix_not_a_runtime_error(pieces: Pieces) -> None:
    store = refused(pieces, lambda cid: AuroraVectorStore(pieces.stack, cid, network=pieces.network,
                                                          traffic=RagTraffic(requests_per_s=4), dimension=384),
                    "Store")
    assert "id ('Store') is already used" in store and "AuroraVectorStore(stack, 'Store2'" in store
    assert "id ('Embed') is already used" in refused(pieces, prep(pieces), "Embed")
    assert "id ('Chat') is already used" in refused(pieces, answers(pieces), "Chat")


def test_chunk_tokens_above_the_packaged_tokenizers_window_is_refused(pieces: Pieces) -> None:
    message = refused(pieces, prep(pieces, chunk_tokens=1000))
    assert "chunk_tokens (1000)" in message and "at most 254" in message and "chunk_tokens=254 or fewer" in message


def test_overlap_as_long_as_the_chunk_is_refused(pieces: Pieces) -> None:
    message = refused(pieces, prep(pieces, chunk_tokens=100, overlap_tokens=100))
    assert "overlap_tokens (100) must be fewer than chunk_tokens (100)" in message
    assert "overlap_tokens (300) must be fewer than chunk_tokens (254)" in refused(
        pieces, prep(pieces, overlap_tokens=300))  # against the window when chunk_tokens is the worker's default


def test_a_tier_in_another_network_than_its_store_is_refused(pieces: Pieces) -> None:
    loader = refused(pieces, prep(pieces, network=pieces.other_network, vector_store=pieces.store))
    assert "network ('Rag/OtherNet') is not the vector store's ('Rag/Net')" in loader and "vector loader" in loader
    orchestrator = refused(pieces, answers(pieces, network=pieces.other_network))
    assert "network ('Rag/OtherNet') is not the vector store's ('Rag/Net')" in orchestrator


def test_a_decoder_as_the_encoder_is_one_problem_that_says_so(pieces: Pieces) -> None:
    for encoder in ("llama-3.1-8b", ModelShape.preset("llama-3.1-8b")):
        message = refused(pieces, answers(pieces, encoder=encoder))
        assert "1 problem(s)" in message
        assert "encoder ('llama-3.1-8b') is a decoder" in message and "encoder='all-minilm-l6-v2'" in message


@pytest.mark.parametrize("construct", ["prep", "answers"])
def test_a_wrong_vector_store_names_its_type_and_the_fix(pieces: Pieces, construct: str) -> None:
    build = prep if construct == "prep" else answers
    message = refused(pieces, build(pieces, vector_store="db"))
    assert "vector_store ('db')" in message and "not a str" in message and "AuroraVectorStore(stack, 'Store'" in message
    message = refused(pieces, build(pieces, vector_store=pieces.embed))
    assert "vector_store (the EmbeddingBatchFleet at 'Rag/Embed')" in message and " object at 0x" not in message


def test_a_release_history_with_the_same_version_twice_is_one_problem(pieces: Pieces) -> None:
    message = refused(pieces, lambda cid: GpuInferenceFleet(
        pieces.stack, cid, network=pieces.network, model=ModelShape.preset("llama-3.1-8b"), model_artifact=[V1, V1],
        traffic=pieces.chat.plan.traffic, certificate=pieces.certificate))
    assert "1 problem(s)" in message and "live_slot" not in message
    assert "model_artifact[-1].version ('1') equals model_artifact[-2].version" in message


def test_retrieved_context_longer_than_the_inference_servers_window_is_refused(pieces: Pieces) -> None:
    message = refused(pieces, answers(pieces, traffic=RagTraffic(requests_per_s=4, top_k=1000, chunk_tokens=254)))
    assert "traffic.top_k (1000) x traffic.chunk_tokens (254) + query_tokens (64) is 254,064 prompt tokens" in message
    assert f"max_model_len ({pieces.chat.plan.server.max_model_len:,})" in message and "lower top_k" in message


def test_gpu_fleets_and_the_network_refuse_an_id_already_used_naming_it() -> None:
    # GIVEN a stack whose "Taken" id is already used
    from aws_cdk import App, Stack
    from constructs import Construct

    from genai_constructs import (
        BatchTraffic,
        EmbeddingBatchFleet,
        GpuInferenceFleet,
        ModelArtifact,
        ModelShape,
        PrivateDataPath,
        RealtimeTraffic,
    )
    from genai_constructs.errors import ConfigurationError

    stack = Stack(App(), "Taken")
    network = PrivateDataPath(stack, "Net")
    Construct(stack, "Taken")
    builds = {
        "GpuInferenceFleet": lambda: GpuInferenceFleet(
            stack, "Taken", network=network, model=ModelShape.preset("llama-3.1-8b"),
            traffic=RealtimeTraffic(concurrent_sessions=8, output_tokens_per_s_per_session=10),
            model_artifact=ModelArtifact(bucket_name="my-models", prefix="llama/"), allow_plain_http=True),
        "EmbeddingBatchFleet": lambda: EmbeddingBatchFleet(
            stack, "Taken", network=network, model=ModelShape.preset("bge-base-en-v1.5"),
            traffic=BatchTraffic(documents=1000, tokens_per_document=100, deadline_hours=1)),
    }
    for name, build in builds.items():
        # WHEN a fleet is given that id, THEN the error names the id, the scope and the fix, not CDK's RuntimeError
        with pytest.raises(ConfigurationError) as raised:
            build()
        assert "id ('Taken') is already used by another construct in 'Taken'" in str(raised.value), name
        assert f"{name}(stack, 'Taken2', ...)" in str(raised.value)
