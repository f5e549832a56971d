"""Calibrating the estimator's constants on published measurements, reproducibly (pure Python).

Procedure (``fit``): minimise the sum over the calibration rows of (ln predicted - ln measured)^2 by coordinate search
on the constants named in ``estimate.FITTED``: for each constant in turn try it x (1 + step) and / (1 + step), keep
any change that lowers the loss, and once a full sweep changes nothing halve the step, from 1.0 down to 1/64.
Efficiencies and ratios are kept in [0.05, MAX_EFFICIENCY]; every other constant stays positive. It is deterministic (fixed order, no
randomness) and starts from the shipped constants, so re-running it from them returns them (the test checks this).

``leave_one_out``: for each calibration row, refit on the others (warm start, the same search with a shorter step
schedule) and predict the row left out. ``holdout``: predict the holdout rows, never used by any fit, with the
constants fitted on calibration rows only. Both estimate the error on rows the constants never saw.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from genai_constructs.planner.estimate import CALIBRATED, FITTED
from genai_constructs.planner.validation import PreparedRow, prepared_rows

STEPS = (1.0, 0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625)
"""Relative step schedule of the coordinate search."""
LEAVE_ONE_OUT_STEPS = (0.0625, 0.015625)
"""Shorter schedule for the leave-one-out refits, warm-started from the full fit (one row moves constants a little)."""


def loss(rows: Sequence[PreparedRow], constants: dict[str, float]) -> float:
    """Sum of squared log errors: a factor of 2 too high costs what a factor of 2 too low does."""
    return sum(math.log(row.predict(constants) / row.measured) ** 2 for row in rows)


LOWER_BOUNDS: dict[str, float] = {
    # Physical floors: a CUDA-graph block still launches ~12 kernels (~1 us each); a hop of any collective costs
    # at least a couple of microseconds of link latency; a decode attention kernel reads at least one 16-token block.
    "layer_latency_us.graphs": 5.0,
    "layer_latency_us.neuron": 5.0,
    "layer_latency_us.eager-cpp": 5.0,
    "collective_hop_us.nvlink": 2.0,
    "collective_hop_us.neuronlink": 2.0,
    "attention_floor_tokens": 16.0,
    "neuron_attention_ns_per_head_token": 1.0,
}
"""Constants the search may not push below these (without them it trades one mechanism for another at 0)."""


MAX_EFFICIENCY = 0.92
"""No kernel streams memory faster than STREAM does: ~90-92 % of datasheet HBM bandwidth on A100/H100 (NVIDIA's
published STREAM-triad figures, e.g. ~3.0 of 3.35 TB/s on H100 SXM); the same cap applies to GEMM efficiency."""


def _bounded(key: str, value: float) -> float:
    if "efficiency" in key or key.endswith("_ratio"):
        return min(MAX_EFFICIENCY, max(0.05, value))
    return max(LOWER_BOUNDS.get(key, 1e-3), value)


def fit(
    rows: Sequence[PreparedRow],
    start: dict[str, float] | None = None,
    keys: Sequence[str] = FITTED,
    steps: Sequence[float] = STEPS,
) -> dict[str, float]:
    """Constants minimising ``loss`` over ``rows`` by the coordinate search described in the module docstring."""
    constants = dict(CALIBRATED if start is None else start)
    best = loss(rows, constants)
    for step in steps:
        improved = True
        while improved:
            improved = False
            for key in keys:
                for factor in (1 + step, 1 / (1 + step)):
                    trial = dict(constants)
                    trial[key] = _bounded(key, constants[key] * factor)
                    if trial[key] == constants[key]:
                        continue
                    value = loss(rows, trial)
                    if value < best - 1e-12:
                        constants, best, improved = trial, value, True
                        break
    return constants


def rounded(constants: dict[str, float], digits: int = 3) -> dict[str, float]:
    """Constants to ``digits`` significant figures (what estimate.CALIBRATED ships)."""
    return {k: float(f"{v:.{digits}g}") for k, v in constants.items()}


@dataclass(frozen=True)
class RowError:
    row_id: int
    label: str
    metric: str
    measured: float
    predicted: float

    @property
    def error(self) -> float:
        return (self.predicted - self.measured) / self.measured


def summary(errors: Sequence[RowError]) -> tuple[float, float]:
    """(median, worst) absolute relative error."""
    values = [abs(e.error) for e in errors]
    return statistics.median(values), max(values)


def _error(row: PreparedRow, constants: dict[str, float]) -> RowError:
    return RowError(row.row_id, row.label, row.metric, row.measured, row.predict(constants))


def in_sample(constants: dict[str, float] | None = None) -> list[RowError]:
    constants = CALIBRATED if constants is None else constants
    return [_error(r, constants) for r in prepared_rows("calibration")]


def holdout(constants: dict[str, float] | None = None) -> list[RowError]:
    """Holdout rows predicted with constants fitted on the calibration rows only (the shipped ones by default)."""
    constants = CALIBRATED if constants is None else constants
    return [_error(r, constants) for r in prepared_rows("holdout")]


def leave_one_out(start: dict[str, float] | None = None) -> list[RowError]:
    """Each calibration row predicted by constants refitted without it."""
    rows = prepared_rows("calibration")
    base = dict(CALIBRATED if start is None else start)
    results = []
    for index, row in enumerate(rows):
        others = rows[:index] + rows[index + 1 :]
        refit = fit(others, start=base, steps=LEAVE_ONE_OUT_STEPS)
        results.append(_error(row, refit))
    return results


def fit_calibration_rows() -> dict[str, float]:
    """The shipped procedure: fit on every calibration row, round to 3 significant figures."""
    return rounded(fit(prepared_rows("calibration")))
