"""Time to serving: how long an inference instance takes from launch (or warm-pool resume) to its first request.

Pure Python; the figures and their sources live in ``genai_constructs/data/startup.json``. The fleet sizes its
launch lifecycle hook from the cold figure, the docs report both, and the fleet simulator replays them.

Three paths (EC2 Auto Scaling user guide, "Warm pools for Amazon EC2 Auto Scaling" and "Use lifecycle hooks with a
warm pool"):

* **cold**: launch, pull the image, download and verify the weights, start the server, pass the health checks;
* **warm** (warm pool with the launch lifecycle hook): the instance did the pull, download and verification before
  it was stopped; resuming is a boot, a read of the weights from the EBS root, the server start and health checks;
* **warm without the hook**: Auto Scaling stops a warm-pool instance "as soon as it finishes launching ... does not
  wait for user data to finish running", so the pull and download are cut off and the resume redoes them: as slow
  as cold, less nothing.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from genai_constructs.errors import GenaiConstructsError

StartPath = Literal["cold", "warm", "warm-without-hook"]


class StartupEstimate(BaseModel):
    """Seconds from launch (or resume) to serving, with every term named."""

    model_config = ConfigDict(frozen=True)

    path: StartPath
    weights_gib: float
    terms_s: dict[str, float] = Field(description="Each step's seconds, in order.")
    total_s: float = Field(description="Sum of the terms.")


@lru_cache(maxsize=1)
def startup_figures() -> dict[str, float]:
    """The figures of ``data/startup.json`` by name (values only; the file carries each one's source)."""
    text = resources.files("genai_constructs.data").joinpath("startup.json").read_text()
    return {name: float(entry["value"]) for name, entry in json.loads(text)["figures"].items()}


def time_to_serving(weights_gib: float, path: StartPath = "cold") -> StartupEstimate:
    """Seconds until an instance holding ``weights_gib`` of weights serves, on ``path``.

    :raises GenaiConstructsError: on a negative or non-finite ``weights_gib`` or an unknown ``path``.
    """
    if isinstance(weights_gib, bool) or not isinstance(weights_gib, (int, float)) or not 0 <= weights_gib < 1e6:
        raise GenaiConstructsError(
            f"weights_gib ({weights_gib!r}) must be a finite number of GiB >= 0: pass the plan's weights_gib"
        )
    figures = startup_figures()
    download = {
        "image_pull": figures["image_gib"] / figures["image_pull_gib_per_s"],
        "weights_download": weights_gib / figures["s3_download_gib_per_s"],
        "weights_verify": weights_gib / figures["sha256_gib_per_s"],
    }
    serve = {"server_start": figures["server_start_s"], "health_checks": figures["health_checks_s"]}
    if path == "cold":
        # Just-downloaded weights are read back from the page cache where they fit; count no separate read.
        terms = {"boot": figures["instance_boot_s"], **download, **serve}
    elif path == "warm":
        terms = {
            "boot": figures["warm_resume_boot_s"],
            "weights_read": weights_gib / figures["ebs_read_gib_per_s"],
            **serve,
        }
    elif path == "warm-without-hook":
        terms = {"boot": figures["warm_resume_boot_s"], **download, **serve}
    else:
        raise GenaiConstructsError(f"path ({path!r}) must be one of 'cold', 'warm', 'warm-without-hook'")
    rounded = {name: round(seconds, 1) for name, seconds in terms.items()}
    return StartupEstimate(path=path, weights_gib=weights_gib, terms_s=rounded, total_s=round(sum(terms.values()), 1))
