"""Predicted vs measured for every row of the published LLM benchmarks in the catalog data.

Run: .venv/bin/python benchmarks/accuracy.py
"""

from __future__ import annotations

from genai_constructs.planner.validation import compare_all, error_summary


def main() -> None:
    comparisons = compare_all()
    print(f"{'row':>3}  {'workload':<52}{'metric':<21}{'measured':>10}{'predicted':>11}{'error':>8}")
    for c in comparisons:
        mark = "  (left out)" if c.excluded else ""
        print(
            f"{c.row_id:>3}  {c.label:<52}{c.metric:<21}{c.measured:>10.2f}{c.predicted:>11.2f}{c.error:>+8.1%}{mark}"
        )
    median, worst = error_summary(comparisons)
    print(
        f"\nmedian absolute error {median:.1%}, worst {worst:.1%} over {sum(not c.excluded for c in comparisons)} rows"
    )
    for c in comparisons:
        if c.excluded:
            print(f"row {c.row_id} left out: {c.excluded}")


def encoders() -> None:
    from genai_constructs.planner.validation import compare_embeddings

    print("\nencoders (per device)")
    comparisons = compare_embeddings()
    for c in comparisons:
        mark = f"  (left out: {c.excluded})" if c.excluded else ""
        print(f"{c.row_id:>3}  {c.label:<72}{c.measured:>9.0f}{c.predicted:>9.0f}{c.error:>+8.1%}{mark}")
    median, worst = error_summary(comparisons)
    print(f"median absolute error {median:.1%}, worst {worst:.1%}")


if __name__ == "__main__":
    main()
    encoders()
