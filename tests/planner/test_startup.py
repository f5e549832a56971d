"""Time to serving: the cold start pays for the image, the download and the verification; a warm start with the
launch hook pays only for the boot, the EBS read and the server start; without the hook a warm start is a cold one.

Expected values are worked by hand from the figures in data/startup.json (written out in each test).
"""

from __future__ import annotations

import math

import pytest

from genai_constructs.errors import GenaiConstructsError
from genai_constructs.planner.startup import startup_figures, time_to_serving

LLAMA_8B_GIB = 14.96  # 8.03e9 bf16 parameters
LLAMA_70B_GIB = 131.4  # 70.6e9 bf16 parameters


def test_every_figure_has_a_source_and_a_positive_value() -> None:
    import json
    from importlib import resources

    raw = json.loads(resources.files("genai_constructs.data").joinpath("startup.json").read_text())
    assert raw["figures"] and all(entry["source"] and entry["value"] > 0 for entry in raw["figures"].values())
    assert set(startup_figures()) == set(raw["figures"])


def test_cold_start_of_an_8b_model() -> None:
    # boot 90 + image 11 GiB / 0.1 = 110 + download 14.96 / 0.25 = 59.84 + sha256 14.96 / 1.0 + server 90 + checks 30
    estimate = time_to_serving(LLAMA_8B_GIB, "cold")
    assert estimate.total_s == pytest.approx(90 + 110 + 59.84 + 14.96 + 90 + 30, abs=0.2)
    assert list(estimate.terms_s) == ["boot", "image_pull", "weights_download", "weights_verify", "server_start",
                                      "health_checks"]


def test_warm_start_of_a_70b_model_reads_the_weights_from_ebs_and_downloads_nothing() -> None:
    # resume 60 + EBS read 131.4 / 0.977 = 134.5 + server 90 + checks 30
    estimate = time_to_serving(LLAMA_70B_GIB, "warm")
    assert estimate.total_s == pytest.approx(60 + 134.5 + 90 + 30, abs=0.3)
    assert "weights_download" not in estimate.terms_s and "image_pull" not in estimate.terms_s


def test_a_warm_pool_without_the_launch_hook_is_no_faster_than_a_cold_start_for_a_large_model() -> None:
    cold, unhooked = time_to_serving(LLAMA_70B_GIB, "cold"), time_to_serving(LLAMA_70B_GIB, "warm-without-hook")
    warm = time_to_serving(LLAMA_70B_GIB, "warm")
    assert unhooked.total_s >= cold.total_s - 30  # only the boot is shorter
    assert warm.total_s < cold.total_s / 2


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, True, "15"])
def test_nonsense_weights_are_refused_with_the_fix(bad: object) -> None:
    with pytest.raises(GenaiConstructsError, match="weights_gib"):
        time_to_serving(bad, "cold")  # type: ignore[arg-type]


def test_an_unknown_path_is_refused() -> None:
    with pytest.raises(GenaiConstructsError, match="path"):
        time_to_serving(10.0, "lukewarm")  # type: ignore[arg-type]
