"""RagTraffic's mistakes: a number given as text, a fraction for a count, a value out of range; each a
GenaiConstructsError naming the field, the value and the fix (pydantic would read "4" as 4.0, and its range messages
name no fix)."""

from __future__ import annotations

import pytest

from genai_constructs.errors import GenaiConstructsError
from genai_constructs.workload import RagTraffic


@pytest.mark.parametrize(("given", "expected"), [
    ({"requests_per_s": "4"}, "RagTraffic.requests_per_s (got '4'): must be a number, not a str"),
    ({"requests_per_s": 4, "top_k": "8"}, "RagTraffic.top_k (got '8'): must be a whole number, not a str"),
    ({"requests_per_s": [4]}, "RagTraffic.requests_per_s (got [4]): must be a number, not a list"),
    ({"requests_per_s": 4, "top_k": 2.5}, "RagTraffic.top_k (got 2.5): must be a whole number, not a fraction"),
    ({"requests_per_s": 0}, "RagTraffic.requests_per_s (got 0): must be greater than 0: RAG answers started"),
    ({"requests_per_s": -1}, "RagTraffic.requests_per_s (got -1): must be greater than 0"),
    ({"requests_per_s": 4, "top_k": 0}, "RagTraffic.top_k (got 0): must be greater than 0: chunks retrieved per "
                                        "request, 1 to 1000, e.g. top_k=4"),
    ({"requests_per_s": 4, "top_k": 5000}, "RagTraffic.top_k (got 5000): must be at most 1000"),
    ({"requests_per_s": 4, "headroom": 1}, "RagTraffic.headroom (got 1): must be less than 1"),
    ({"requests_per_s": 4, "stored_chunks": -5}, "stored_chunks (got -5): must be greater than 0: chunks the vector "
                                                 "store holds, e.g. stored_chunks=2_000_000"),
    ({"requests_per_s": 4, "top_k": True}, "RagTraffic.top_k (got True): must be a whole number, not a bool"),
    ({"requests_per_s": float("nan")}, "RagTraffic.requests_per_s (got nan): must be a finite number"),
    ({"requests_per_s": float("inf")}, "RagTraffic.requests_per_s (got inf): must be a finite number"),
])
def test_each_mistake_names_the_field_the_value_and_the_fix(given: dict[str, object], expected: str) -> None:
    with pytest.raises(GenaiConstructsError) as caught:
        RagTraffic(**given)
    assert expected in str(caught.value)


def test_every_mistake_at_once() -> None:
    with pytest.raises(GenaiConstructsError) as caught:
        RagTraffic(requests_per_s="4", top_k=0, chunk_tokens=-1)
    assert all(f"RagTraffic.{field}" in str(caught.value) for field in ("requests_per_s", "top_k", "chunk_tokens"))


def test_the_readme_call_still_holds() -> None:
    traffic = RagTraffic(requests_per_s=4, top_k=8, chunk_tokens=254)
    assert (traffic.requests_per_s, traffic.top_k, traffic.retrieved_bytes_per_request) == (4.0, 8, 8 * 254 * 4.0)
