"""Predicted vs measured: the estimator checked against the published benchmarks in the catalog data.

Used by the test suite (accuracy targets) and by ``benchmarks/accuracy.py`` (the table in the closing note).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from genai_constructs.planner.catalog import load_catalog
from genai_constructs.planner.estimate import (
    CALIBRATED,
    RUNTIMES,
    StepInputs,
    memory_breakdown,
    predict_tpot_ms,
    predict_ttft_ms,
    step_inputs,
)
from genai_constructs.workload import MODEL_PRESETS, ModelShape, Precision

_RUNTIME_BY_PREFIX = {
    "TGI 1.0": "tgi-1.0",
    # vLLM before the V1 engine (0.4.x-0.6.x): prefill runs in its own forward passes between decode steps.
    # The vLLM 0.6.0 rows (sglang benchmark_vllm_060) ran --num-scheduler-steps 10, as their README says.
    "vLLM 0.6": "vllm-v0-multistep",
    "vLLM 0.": "vllm-v0",
    "vLLM": "vllm",
    "Neuron": "neuronx",
    "TensorRT-LLM": "tensorrt-llm",
    "FasterTransformer": "fastertransformer",
}
SHAREGPT_PROMPT_TOKENS = 150
"""Rows without a prompt length sent ShareGPT prompts; see the catalog's llm_benchmarks notes."""
DECODE_ONLY_OUTPUT_TOKENS = 1024
"""Rows that time a decode step without giving an output length: long enough that prefill interleaving vanishes."""

_SHAPES_FROM_CONFIG: dict[str, dict[str, Any]] = {
    # Used only until the preset lands in workload.MODEL_PRESETS (the preset wins when present). Numbers from
    # meta-llama/Llama-3.1-405B config.json: 126 layers, hidden 16384, 128 heads, 8 KV heads, vocab 128256.
    "llama-3.1-405b": dict(
        parameters_billion=405.85,
        layers=126,
        hidden_size=16384,
        attention_heads=128,
        kv_heads=8,
        head_dim=128,
        vocabulary=128256,
        max_context=131072,
        precision=Precision.BF16,
    ),
}

EXCLUDED_ROWS: dict[int, str] = {
    7: (
        "64 concurrent 550+150-token sequences overflow an A10G's KV cache: 41 fit, and the estimator predicts the "
        "speed at those 41 (~535 tokens/s, TPOT ~77 ms against the 61.7 ms reported). llmperf reports 301 tokens/s, "
        "but its own TTFT (1.08 s) and inter-token latency (61.7 ms) imply 64 x 150 / (1.08 + 149 x 0.0617) = 930 "
        "tokens/s: the row's figures disagree with each other (preemption and client-side queueing outside both), "
        "so no mechanism can be checked on it."
    ),
    **{
        row: (
            "Llama-2-70B (64 query heads, 8 KV heads) at TP 24 (inf2) and TP 32 (trn1) on transformers-neuronx 2.16: "
            "read as run time over all tokens, both lengths agree on ~108 ms (inf2) and ~150 ms (trn1) per output "
            "token, 7-10x the weights' bandwidth roofline and 1.35 ms per block against 0.2-0.25 ms for the 7B/13B "
            "rows of the same files. 64 heads do not divide 24 (padded to 72) and 8 KV heads are replicated over "
            "24-32 ranks; the estimator does not model that padding, and fitting these rows would drag the Neuron "
            "constants down for every other model."
        )
        for row in (67, 68, 71, 72)
    },
}


def model_for(name: str, precision: str) -> ModelShape:
    """A row's model: the preset, or its published config.json shape while the preset is missing."""
    if name in MODEL_PRESETS or name not in _SHAPES_FROM_CONFIG:
        return ModelShape.preset(name, precision=Precision(precision))
    return ModelShape(name=name, **_SHAPES_FROM_CONFIG[name]).with_precision(precision)


@dataclass(frozen=True)
class PreparedRow:
    """One benchmark row with everything that does not depend on the fitted constants worked out once."""

    row_id: int
    label: str
    metric: str
    measured: float
    split: str
    inputs: StepInputs
    batch: int
    prompt_tokens: int
    output_tokens: int
    runtime: str
    per_total_token: bool = False
    """The published latency is run time over input + output tokens (Neuron's latency_data_decoder.csv)."""

    def predict(self, constants: dict[str, float] | None = None) -> float:
        constants = CALIBRATED if constants is None else constants
        if self.metric == "ttft_ms":
            return predict_ttft_ms(self.inputs, self.prompt_tokens, constants)
        tpot = predict_tpot_ms(self.inputs, self.batch, self.prompt_tokens, self.output_tokens, constants)
        if self.runtime == "tgi-1.0":
            # The TGI tests' "ms/token" is a request's server time over its generated tokens: prefill included.
            tpot += predict_ttft_ms(self.inputs, self.prompt_tokens, constants) / self.output_tokens
        if self.metric == "output_tokens_per_s":
            return self.batch * 1000.0 / tpot
        if self.per_total_token:
            ttft = predict_ttft_ms(self.inputs, self.prompt_tokens, constants)
            return (ttft + self.output_tokens * tpot) / (self.prompt_tokens + self.output_tokens)
        return tpot


def _runtime(label: str) -> str:
    for prefix, runtime in _RUNTIME_BY_PREFIX.items():
        if label.startswith(prefix):
            return runtime
    raise ValueError(f"no runtime profile for benchmark runtime {label!r}")


def prepare(row: dict[str, Any]) -> PreparedRow:
    catalog = load_catalog()
    model = model_for(row["model"], row["precision"])
    instance = catalog.instance(row["instance_type"])
    devices = int(row["devices_used"])
    runtime = _runtime(row["runtime"])
    profile = RUNTIMES[runtime]
    prompt = int(row["prompt_tokens"] or SHAREGPT_PROMPT_TOKENS)
    output = int(row["output_tokens"] or DECODE_ONLY_OUTPUT_TOKENS)
    memory = memory_breakdown(model, instance, devices, 1, prompt + output, profile)
    if row["concurrency"] == "max":
        # The runtime's best batch: as many sequences as the KV cache holds, up to its batch cap.
        batch = min(memory.max_concurrency, profile.max_batch)
    else:
        # A concurrency whose KV cache overflows runs at the sequences that fit (estimate() does the same).
        batch = min(int(row["concurrency"]), max(memory.max_concurrency, 1))
    label = (
        f"{row['model']} {row['precision']} {row['instance_type']} x{devices} c={row['concurrency']} {prompt}/{output}"
    )
    return PreparedRow(
        row_id=int(row["id"]),
        label=label,
        metric=row["metric"],
        measured=float(row["value"]),
        split=str(row.get("split", "calibration")),
        inputs=step_inputs(model, instance, devices, profile),
        batch=max(batch, 1),
        prompt_tokens=prompt,
        output_tokens=output,
        runtime=runtime,
        per_total_token=row.get("latency_per_token_counts") == "input+output",
    )


def prepared_rows(split: str | None = None, include_excluded: bool = False) -> list[PreparedRow]:
    """The catalog's rows (of one split, or all), prepared; excluded rows only on request."""
    rows = [prepare(r) for r in load_catalog().llm_benchmarks]
    return [
        r for r in rows if (split is None or r.split == split) and (include_excluded or r.row_id not in EXCLUDED_ROWS)
    ]


@dataclass(frozen=True)
class Comparison:
    row_id: int
    label: str
    metric: str
    measured: float
    predicted: float
    excluded: str | None
    split: str = "calibration"

    @property
    def error(self) -> float:
        return (self.predicted - self.measured) / self.measured


def predict_row(row: dict[str, Any]) -> float:
    return prepare(row).predict()


def compare_all(split: str | None = None) -> list[Comparison]:
    """Every row (or one split's rows) predicted with the shipped constants."""
    return [
        Comparison(r.row_id, r.label, r.metric, r.measured, r.predict(), EXCLUDED_ROWS.get(r.row_id), r.split)
        for r in prepared_rows(split, include_excluded=True)
    ]


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
