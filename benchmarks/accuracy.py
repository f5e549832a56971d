"""Predicted vs measured for the published LLM benchmarks: calibration, leave-one-out and holdout tables.

Run: .venv/bin/python benchmarks/accuracy.py   (the leave-one-out refits take about a minute)
The last line is the unseen-row figure: holdout and leave-one-out median / worst absolute error.
"""

from __future__ import annotations

from genai_constructs.planner import calibration
from genai_constructs.planner.validation import EXCLUDED_ROWS


def table(title: str, errors: list[calibration.RowError]) -> tuple[float, float]:
    print(f"\n{title}")
    print(f"{'row':>3}  {'workload':<62}{'metric':<21}{'measured':>10}{'predicted':>11}{'error':>8}")
    for e in errors:
        print(f"{e.row_id:>3}  {e.label:<62}{e.metric:<21}{e.measured:>10.2f}{e.predicted:>11.2f}{e.error:>+8.1%}")
    median, worst = calibration.summary(errors)
    print(f"median absolute error {median:.1%}, worst {worst:.1%} over {len(errors)} rows")
    return median, worst


def main() -> None:
    in_sample = table("calibration rows (in sample, shipped constants)", calibration.in_sample())
    loo = table(
        "leave-one-out (each calibration row predicted by constants refitted without it)", calibration.leave_one_out()
    )
    held = table("holdout rows (never fitted on)", calibration.holdout())
    for row, reason in EXCLUDED_ROWS.items():
        print(f"row {row} left out: {reason}")
    print(f"\nin sample: median {in_sample[0]:.1%}, worst {in_sample[1]:.1%}")
    print(
        f"unseen rows: holdout median {held[0]:.1%}, worst {held[1]:.1%}; "
        f"leave-one-out median {loo[0]:.1%}, worst {loo[1]:.1%}"
    )


if __name__ == "__main__":
    main()
