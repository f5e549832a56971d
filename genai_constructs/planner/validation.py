"""Predicted vs measured: the estimator checked against the published benchmarks in the catalog data.

Used by the test suite (accuracy targets) and by ``benchmarks/accuracy.py`` (the table in the closing note).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from genai_constructs.planner.catalog import load_catalog
from genai_constructs.planner.estimate import estimate
from genai_constructs.workload import ModelShape, Precision

_RUNTIME_BY_PREFIX = {
    "TGI 1.0": "tgi-1.0",
    "vLLM": "vllm",
    "Neuron": "neuronx",
    "TensorRT-LLM": "tensorrt-llm",
    "FasterTransformer": "fastertransformer",
}
SHAREGPT_PROMPT_TOKENS = 150
"""Rows without a prompt length sent ShareGPT prompts; see the catalog's llm_benchmarks notes."""
DECODE_ONLY_OUTPUT_TOKENS = 1024
"""Rows that time a decode step without giving an output length: long enough that prefill interleaving vanishes."""

EXCLUDED_ROWS: dict[int, str] = {
    7: (
        "64 concurrent 550+150-token sequences need ~5.9 GiB of KV cache on top of 15 GiB of weights; an A10G "
        "(22.35 GiB, 90 % usable) holds ~4.2 GiB, so vLLM 0.4.3 preempted and recomputed sequences while llmperf "
        "queued the rest. The estimator models a server inside its memory, which is what the planner provisions."
    ),
}


@dataclass(frozen=True)
class Comparison:
    row_id: int
    label: str
    metric: str
    measured: float
    predicted: float
    excluded: str | None

    @property
    def error(self) -> float:
        return (self.predicted - self.measured) / self.measured


def _runtime(label: str) -> str:
    for prefix, runtime in _RUNTIME_BY_PREFIX.items():
        if label.startswith(prefix):
            return runtime
    raise ValueError(f"no runtime profile for benchmark runtime {label!r}")


def predict_row(row: dict[str, Any]) -> float:
    model = ModelShape.preset(row["model"], precision=Precision(row["precision"]))
    prompt = int(row["prompt_tokens"] or SHAREGPT_PROMPT_TOKENS)
    output = int(row["output_tokens"] or DECODE_ONLY_OUTPUT_TOKENS)
    kwargs: dict[str, Any] = dict(
        devices=int(row["devices_used"]), prompt_tokens=prompt, output_tokens=output, runtime=_runtime(row["runtime"])
    )
    concurrency = row["concurrency"]
    if concurrency == "max":
        probe = estimate(model, row["instance_type"], concurrency=1, **kwargs)
        concurrency = probe.memory.max_concurrency
    result = estimate(model, row["instance_type"], concurrency=int(concurrency), **kwargs)
    return float(getattr(result, row["metric"]))


def compare_all() -> list[Comparison]:
    comparisons = []
    for row in load_catalog().llm_benchmarks:
        label = (
            f"{row['model']} {row['precision']} {row['instance_type']} x{row['devices_used']} c={row['concurrency']}"
        )
        comparisons.append(
            Comparison(
                row_id=int(row["id"]),
                label=label,
                metric=row["metric"],
                measured=float(row["value"]),
                predicted=predict_row(row),
                excluded=EXCLUDED_ROWS.get(int(row["id"])),
            )
        )
    return comparisons


def error_summary(comparisons: list[Comparison]) -> tuple[float, float]:
    """(median, worst) absolute relative error over the rows not excluded."""
    errors = [abs(c.error) for c in comparisons if c.excluded is None]
    return statistics.median(errors), max(errors)


# --- encoders --------------------------------------------------------------------------------------------------------

_ENCODER_ARCHITECTURE = {"bert-base": "bge-base-en-v1.5", "bert-large": "bge-large-en-v1.5"}
"""BERT-base/large share the BGE v1.5 architectures (BGE is a BERT encoder), so the presets describe them."""
_HARDWARE_INSTANCE = {"A100-SXM4-80GB (p4de)": "p4de.24xlarge", "L4 (g6)": "g6.xlarge", "inf2.xlarge": "inf2.xlarge"}
EXCLUDED_EMBEDDING_RUNTIMES = {
    "PyTorch FP32": "FP32 on CUDA cores (not tensor cores) is a different roofline the planner never plans for: "
    "GPU encoders are served in fp16.",
}


def compare_embeddings() -> list[Comparison]:
    """Encoder throughput per device, predicted vs published (samples/s = tokens/s / sequence length)."""
    from genai_constructs.planner.planning import encoder_tokens_per_s

    catalog = load_catalog()
    comparisons = []
    for index, row in enumerate(catalog.embedding_benchmarks, start=1):
        model = ModelShape.preset(_ENCODER_ARCHITECTURE.get(row["model"], row["model"]))
        instance = catalog.instance(_HARDWARE_INSTANCE[row["hardware"]])
        sequence = int(str(row["seq_len"]).lstrip("~"))
        per_device = encoder_tokens_per_s(model, instance, sequence) / instance.accelerator_count
        label = f"{row['model']} {row['hardware']} seq {sequence} ({row['runtime']})"
        comparisons.append(
            Comparison(
                row_id=index,
                label=label,
                metric=str(row["metric"]),
                measured=float(row["value"]),
                predicted=per_device / sequence,
                excluded=EXCLUDED_EMBEDDING_RUNTIMES.get(str(row["runtime"])),
            )
        )
    return comparisons
