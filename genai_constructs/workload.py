"""The workload model: what is being served (model shape) and how it is asked for (traffic shape).

Pure Python (pydantic v2), no CDK import: the planner consumes these, and the constructs take the plan.
Every model here is frozen and validated; a bad value raises a ``GenaiConstructsError`` naming the field,
the value and the fix (see :func:`genai_constructs.errors`), never a bare pydantic trace.
"""

from __future__ import annotations

import difflib
import json
import math
import operator
import os
import re
import types
import typing
from collections.abc import Mapping
from enum import Enum
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    computed_field,
    field_validator,
    model_validator,
)

from genai_constructs.errors import GenaiConstructsError, UnknownPresetError


class Precision(str, Enum):
    """Numeric format of the weights as served."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    INT8 = "int8"
    INT4 = "int4"

    @property
    def bytes_per_parameter(self) -> float:
        return _BYTES_PER_PARAMETER[self]

    @property
    def kv_cache_bytes_per_element(self) -> float:
        """KV cache element size served with this weight precision.

        FP8 serving (TensorRT-LLM, vLLM on Hopper) keeps an FP8 KV cache; INT8/INT4 are weight-only
        schemes (GPTQ, AWQ) whose activations and KV cache stay 16-bit; FP32 keeps an FP32 cache.
        """
        return {Precision.FP32: 4.0, Precision.FP8: 1.0}.get(self, 2.0)

    @property
    def is_float8(self) -> bool:
        return self is Precision.FP8


_BYTES_PER_PARAMETER: dict[Precision, float] = {
    Precision.FP32: 4.0,
    Precision.BF16: 2.0,
    Precision.FP16: 2.0,
    Precision.FP8: 1.0,
    Precision.INT8: 1.0,
    Precision.INT4: 0.5,
}


def _is_number_field(annotation: Any) -> bool:
    """Whether a field holds an int or float (optionally None), not a bool, str or enum."""
    if annotation in (int, float):
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        return bool(members) and all(a in (int, float) for a in members)
    return False


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=False)

    _NUMBER_FIXES: ClassVar[dict[str, tuple[str, str]]] = {}
    """Per field: the unit after 'whole number' / 'number', and the fix, where the field description is not enough."""

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as error:
            raise GenaiConstructsError(_explain(type(self).__name__, error)) from None

    @field_validator("*", mode="before")
    @classmethod
    def _real_number(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic takes True as 1 and says only "finite number" for nan: name what is allowed and the fix.
        field = cls.model_fields.get(info.field_name or "")
        if field is None or not _is_number_field(field.annotation):
            return value
        whole = int in typing.get_args(field.annotation) or field.annotation is int
        unit, fix = cls._NUMBER_FIXES.get(
            info.field_name or "", ("", f"give the number itself ({(field.description or '').rstrip('.')})")
        )
        kind = f"{'whole number' if whole else 'number'}{unit}"
        if isinstance(value, bool):
            raise ValueError(f"must be a {kind}, not a bool: {fix}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"must be a finite {kind}: {fix}")
        return value


def _explain(model_name: str, error: ValidationError) -> str:
    """Turn a pydantic ValidationError into one sentence per field: the field, the value and the fix."""
    lines = []
    for item in error.errors():
        field = ".".join(str(part) for part in item["loc"]) or "(model)"
        value = item.get("input")
        message = item["msg"]
        if message.startswith("Value error, "):
            message = message[len("Value error, ") :]
        shown = "" if isinstance(value, dict) else f" (got {value!r})"
        lines.append(f"{model_name}.{field}{shown}: {message}")
    return "; ".join(lines)


_SHAPE_LIMITS: tuple[tuple[str, int, str], ...] = (
    ("layers", 1_000, "Llama 3.1 405B has 126 blocks"),
    ("max_context", 16_777_216, "Llama 4 Scout's 10M-token context is the longest published"),
    ("hidden_size", 65_536, "Llama 3.1 405B is 16,384 wide"),
    ("parameters_billion", 20_000, "the largest published models are about 1-2 trillion parameters"),
)
"""Upper bounds a real model stays well inside (each about 4-10x the largest published figure, 2026-12)."""
_HEAD_WIDTH_RATIO = (0.25, 8.0)
"""attention_heads x head_dim over hidden_size: 1.0 for most models; Gemma 3 27B 0.76, Qwen3-32B 1.6, Qwen3-30B-A3B
2.0, gpt-oss 1.42, DeepSeek-V3's 576-wide latent cache as one 288-wide head per query head 5.1 (config.json of each)."""


class ModelShape(_Frozen):
    """Architecture of a transformer, enough to size memory and time its steps.

    Numbers for the presets come from each model's published ``config.json``.
    """

    name: str = Field(description="A label for the model, used in plans and resource names.", min_length=1)
    kind: Literal["decoder", "encoder"] = Field(
        default="decoder", description="decoder: generates tokens (chat, completion); encoder: embeds text."
    )
    parameters_billion: float = Field(gt=0, description="Total parameter count, in billions.")
    layers: int = Field(gt=0, description="Transformer blocks (num_hidden_layers).")
    hidden_size: int = Field(gt=0, description="Model width (hidden_size); also the embedding dimension of encoders.")
    attention_heads: int = Field(gt=0, description="Query heads (num_attention_heads).")
    kv_heads: int = Field(gt=0, description="Key/value heads (num_key_value_heads); fewer than query heads = GQA.")
    head_dim: int = Field(gt=0, description="Width of one attention head.")
    vocabulary: int = Field(gt=0, description="Vocabulary size.")
    max_context: int = Field(gt=0, description="Longest sequence (prompt + output) the model accepts, in tokens.")
    precision: Precision = Field(default=Precision.BF16, description="Numeric format of the served weights.")
    experts: int | None = Field(
        default=None,
        gt=1,
        description="Mixture-of-experts: routed experts per MoE layer (num_local_experts / num_experts); None: dense.",
    )
    experts_per_token: int | None = Field(
        default=None,
        gt=0,
        description="Mixture-of-experts: experts each token is routed to (num_experts_per_tok); None: dense.",
    )
    active_parameters_billion: float | None = Field(
        default=None,
        gt=0,
        description="Mixture-of-experts: parameters one token passes through, in billions (the model card's "
        "'active' count). Memory holds parameters_billion; decode reads and multiplies the active ones. None: dense.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> ModelShape:
        # Every problem at once, each with its numbers and the fix.
        problems = []
        if self.attention_heads % self.kv_heads:
            problems.append(
                f"attention_heads ({self.attention_heads}) must be a multiple of kv_heads ({self.kv_heads}): "
                "set kv_heads to a divisor of attention_heads (equal for multi-head attention)"
            )
        moe = (self.experts, self.experts_per_token, self.active_parameters_billion)
        if any(v is not None for v in moe) and any(v is None for v in moe):
            problems.append(
                f"experts ({self.experts}), experts_per_token ({self.experts_per_token}) and "
                f"active_parameters_billion ({self.active_parameters_billion}) describe a mixture-of-experts model "
                "together: give all three, or none for a dense model"
            )
        if self.experts is not None and self.experts_per_token is not None and self.experts_per_token >= self.experts:
            problems.append(
                f"experts_per_token ({self.experts_per_token}) must be fewer than experts ({self.experts}): "
                "a token is routed to a few of the experts (e.g. 2 of 8)"
            )
        if self.active_parameters_billion is not None and self.active_parameters_billion >= self.parameters_billion:
            problems.append(
                f"active_parameters_billion ({self.active_parameters_billion}) must be below parameters_billion "
                f"({self.parameters_billion}): a mixture-of-experts model activates a fraction of its weights"
            )
        problems += self._parameter_problems()
        problems += self._beyond_real_problems()
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _beyond_real_problems(self) -> list[str]:
        """Shapes no published model has: a typo, a unit mistake, or numbers from another model."""
        problems = []
        for name, limit, why in _SHAPE_LIMITS:
            if getattr(self, name) > limit:
                problems.append(f"{name} ({getattr(self, name):,}) is beyond any published model ({why}): check it")
        ratio = self.attention_heads * self.head_dim / self.hidden_size
        if not _HEAD_WIDTH_RATIO[0] <= ratio <= _HEAD_WIDTH_RATIO[1]:
            problems.append(
                f"attention_heads x head_dim ({self.attention_heads} x {self.head_dim} = "
                f"{self.attention_heads * self.head_dim:,}) is {ratio:.2g}x hidden_size ({self.hidden_size:,}): head_dim "
                f"is usually hidden_size / attention_heads ({self.hidden_size / self.attention_heads:g}); models that "
                f"set it apart (Qwen3, Gemma 3, gpt-oss, DeepSeek's latent) stay within "
                f"{_HEAD_WIDTH_RATIO[0]:g}-{_HEAD_WIDTH_RATIO[1]:g}x. Check head_dim and attention_heads"
            )
        return problems

    def _parameter_problems(self) -> list[str]:
        """parameters_billion against what layers, hidden_size, heads and vocabulary allow.

        The floor is certain: the embedding table and the q/k/v/o projections of every layer. The ceiling
        assumes untied embeddings and a gated MLP _WIDEST_MLP x hidden_size wide (per expert, plus one shared,
        for MoE). Either side is an error only past _PARAMETER_SLACK: it catches a count in the wrong unit
        (8030 for 8.03) or shapes copied from another model, not a rounding.
        """
        attention = 2 * self.hidden_size * self.head_dim * (self.attention_heads + self.kv_heads)
        embeddings = self.vocabulary * self.hidden_size
        floor = (embeddings + self.layers * attention) / 1e9
        mlps = 1 + (self.experts or 0)
        widest_mlp = mlps * 3 * self.hidden_size * _WIDEST_MLP * self.hidden_size
        ceiling = (2 * embeddings + self.layers * (attention + widest_mlp)) / 1e9
        if self.parameters_billion * _PARAMETER_SLACK < floor:
            return [
                f"parameters_billion ({self.parameters_billion:g}) is under half of the {floor:.3g} B that "
                f"{self.layers} layers of width {self.hidden_size} ({self.attention_heads} heads of {self.head_dim}, "
                f"{self.kv_heads} KV heads) and a {self.vocabulary}-token embedding hold in attention and embeddings "
                "alone: give the total parameter count in billions (e.g. 8.03 for an 8B model), or check the "
                "architecture numbers against the model's config.json"
            ]
        if self.parameters_billion > _PARAMETER_SLACK * ceiling:
            return [
                f"parameters_billion ({self.parameters_billion:g}) is over twice the {ceiling:.3g} B that "
                f"{self.layers} layers of width {self.hidden_size} and a {self.vocabulary}-token vocabulary can hold "
                f"even with an MLP {_WIDEST_MLP} x the width: give the count in billions (e.g. 8.03, not "
                "8030000000), or check the architecture numbers against the model's config.json"
            ]
        return []

    @property
    def is_moe(self) -> bool:
        return self.experts is not None

    @property
    def decode_parameters_billion(self) -> float:
        """Parameters one token passes through: all of them for a dense model, the active ones for MoE."""
        return self.active_parameters_billion if self.active_parameters_billion is not None else self.parameters_billion

    @property
    def expert_parameters_billion(self) -> float:
        """Parameters of one routed expert summed over every MoE layer (0 for a dense model).

        From total = shared + experts x expert and active = shared + experts_per_token x expert.
        """
        if self.experts is None or self.experts_per_token is None or self.active_parameters_billion is None:
            return 0.0
        return (self.parameters_billion - self.active_parameters_billion) / (self.experts - self.experts_per_token)

    @property
    def shared_parameters_billion(self) -> float:
        """Parameters every token uses (attention, embeddings, norms, shared experts): all of a dense model."""
        if self.experts_per_token is None:
            return self.parameters_billion
        return self.decode_parameters_billion - self.experts_per_token * self.expert_parameters_billion

    @computed_field(description="Bytes of weights as served.")  # type: ignore[prop-decorator]
    @property
    def weight_bytes(self) -> float:
        return self.parameters_billion * 1e9 * self.precision.bytes_per_parameter

    @computed_field(description="KV cache bytes one token occupies across all layers.")  # type: ignore[prop-decorator]
    @property
    def kv_bytes_per_token(self) -> float:
        if self.kind == "encoder":
            return 0.0
        return 2.0 * self.layers * self.kv_heads * self.head_dim * self.precision.kv_cache_bytes_per_element

    @property
    def embedding_dimension(self) -> int:
        return self.hidden_size

    def with_precision(self, precision: Precision | str) -> ModelShape:
        return self.model_copy(update={"precision": Precision(precision)})

    @classmethod
    def preset(cls, name: str, precision: Precision | str | None = None) -> ModelShape:
        """A known model by name, e.g. ``ModelShape.preset("llama-3.1-8b")``.

        ``precision`` overrides the published dtype (e.g. ``"fp8"`` or ``"int4"`` for a quantized build).
        Raises ``UnknownPresetError`` listing the closest names.
        """
        if not isinstance(name, str):
            raise UnknownPresetError(
                f"ModelShape.preset: name ({name!r}) must be a preset name string, e.g. 'llama-3.1-8b' (list them "
                "with `genai-constructs models`)"
            )
        key = name.strip().lower()
        if key not in MODEL_PRESETS:
            close = difflib.get_close_matches(key, MODEL_PRESETS, n=3, cutoff=0.4)
            hint = (
                f"did you mean {', '.join(close)}?" if close else f"known presets: {', '.join(sorted(MODEL_PRESETS))}."
            )
            raise UnknownPresetError(
                f"ModelShape.preset: unknown model {name!r}; {hint} "
                "Or describe the model with ModelShape(parameters_billion=..., layers=..., ...) or "
                "ModelShape.from_hf_config('config.json')."
            )
        shape = cls(name=key, **MODEL_PRESETS[key])
        if precision is not None:
            try:
                shape = shape.with_precision(precision)
            except ValueError:
                allowed = ", ".join(p.value for p in Precision)
                raise GenaiConstructsError(
                    f"ModelShape.preset: precision {precision!r} is not one of {allowed}"
                ) from None
        return shape

    @classmethod
    def from_hf_config(
        cls,
        path_or_dict: str | os.PathLike[str] | Mapping[str, Any],
        *,
        name: str | None = None,
        precision: Precision | str | None = None,
    ) -> ModelShape:
        """A shape from a Hugging Face ``config.json``: a path to the file, to the folder holding it, or a dict.

        Reads decoder LMs (llama, mistral, qwen2/qwen3, gemma3 with its nested ``text_config``, mixtral,
        qwen2_moe/qwen3_moe, gpt_oss, deepseek, falcon, gpt2) and BERT-style encoders (bert, xlm-roberta,
        roberta, mpnet, nomic_bert, ...: ``kind="encoder"``). ``head_dim`` is the config's where it sets one
        (Qwen3, Gemma 3 and gpt-oss do), else hidden_size / num_attention_heads.

        A config.json carries no parameter count, so ``parameters_billion`` (and, for mixture-of-experts,
        ``active_parameters_billion``) is COMPUTED from the architecture: the embedding table (and a separate
        lm_head unless ``tie_word_embeddings``; position and token-type tables for encoders), per layer the
        q/k/v/o projections with head_dim (DeepSeek's latent attention by its low-rank matrices), the MLP (gate,
        up and down for gated SiLU/GeLU MLPs, up and down for plain ones), and for MoE layers every routed expert
        (``moe_intermediate_size``, else ``intermediate_size``), the router and any shared experts, with
        DeepSeek's ``first_k_dense_replace`` and Qwen's ``decoder_sparse_step``/``mlp_only_layers`` dense layers.
        Norms and biases are left out (under 0.1 %). The active count includes both embedding tables, as
        Mixtral's and Qwen's published counts do (OpenAI's gpt-oss count leaves out the input embedding).

        ``precision``: the argument, else the checkpoint's ``quantization_config`` (fp8 -> fp8, mxfp4 -> int4,
        awq/gptq 4 or 8 bits -> int4/int8), else ``torch_dtype``/``dtype`` (bfloat16, float16, float32), else fp32
        (what transformers loads when the config names no dtype). ``name``: else the config's ``_name_or_path``,
        the model folder's name or the file's stem.

        Raises ``GenaiConstructsError`` listing every problem of the config at once (a missing or non-integer
        field, an architecture that is not a decoder or encoder, an unreadable file, a JSON syntax error with
        its line), each with the field, the value and the fix.
        """
        raw, source = _read_hf_config(path_or_dict)
        return cls(**_hf_shape_kwargs(raw, source, name, precision))


# --- presets: genai_constructs/data/models.json ----------------------------------------------------------------------


@lru_cache(maxsize=1)
def _model_table() -> dict[str, dict[str, Any]]:
    """The preset entries of ``genai_constructs/data/models.json``, in file order, loaded once.

    Each entry holds ``shape`` (the ModelShape fields), the Hugging Face repo, the config.json fields they came from,
    where the parameter count comes from and when it was all read: see the file's ``_about``.
    """
    raw = json.loads(resources.files("genai_constructs.data").joinpath("models.json").read_text(encoding="utf-8"))
    models: dict[str, dict[str, Any]] = raw["models"]
    return models


def _preset_kwargs() -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = {}
    for name, entry in _model_table().items():
        shape = dict(entry["shape"])
        shape["precision"] = Precision(shape["precision"])
        table[name] = shape
    return table


MODEL_PRESETS: dict[str, dict[str, Any]] = _preset_kwargs()
"""Preset name -> ModelShape keyword arguments (all but ``name``), from ``genai_constructs/data/models.json``."""


class PresetRow(BaseModel):
    """One line of ``genai-constructs models``: what a preset is and where its numbers come from."""

    model_config = ConfigDict(frozen=True)

    name: str
    kind: Literal["decoder", "encoder"]
    parameters_billion: float
    active_parameters_billion: float | None = Field(description="Mixture-of-experts: parameters per token.")
    precision: str
    max_context: int
    source: str = Field(description="The Hugging Face repo whose config.json the architecture comes from.")


def list_presets() -> list[PresetRow]:
    """Every model preset, in the order of ``genai_constructs/data/models.json``."""
    rows = []
    for name, entry in _model_table().items():
        shape = entry["shape"]
        rows.append(
            PresetRow(
                name=name,
                kind=shape["kind"],
                parameters_billion=shape["parameters_billion"],
                active_parameters_billion=shape.get("active_parameters_billion"),
                precision=shape["precision"],
                max_context=shape["max_context"],
                source=entry["hf_repo"],
            )
        )
    return rows


# --- ModelShape.from_hf_config ---------------------------------------------------------------------------------------

# model_type values of bidirectional encoders served as embedding models (BERT and its descendants).
_ENCODER_TYPES = frozenset(
    {
        "bert",
        "roberta",
        "xlm-roberta",
        "camembert",
        "mpnet",
        "nomic_bert",
        "distilbert",
        "electra",
        "deberta",
        "deberta-v2",
        "modernbert",
        "new",  # Alibaba-NLP gte-*-v1.5 ("NewModel")
        "jina_bert",
    }
)
# RoBERTa-family position tables start at padding_idx + 1 = 2, so 514 positions hold 512 tokens.
_POSITION_OFFSET = {"roberta": 2, "xlm-roberta": 2, "camembert": 2}
# Architectures that are neither a decoder-only LM nor an encoder the planner sizes: name them in the error.
_ENCODER_DECODER_TYPES = frozenset({"t5", "mt5", "umt5", "bart", "mbart", "pegasus", "marian", "whisper", "m2m_100"})
# model_type prefixes whose MLP is gated (gate, up and down projections: 3 matrices) even where hidden_act says
# gelu (Gemma's GeGLU). BERT-style encoders, GPT-2, Falcon and GPT-NeoX use a plain 2-matrix MLP.
_GATED_TYPES = ("llama", "mistral", "mixtral", "qwen", "gemma", "gpt_oss", "deepseek", "phi3", "olmo", "granite")
_GATED_ACTIVATIONS = frozenset({"silu", "swish", "swiglu", "geglu"})
# Per-model_type defaults that transformers' config classes apply when config.json omits the field
# (Gemma3TextConfig: vocab_size 262,208, max_position_embeddings 131,072, tie_word_embeddings True; the gemma-3-*-it
# text_config omits all three). Where a type is not listed, untied embeddings are assumed: that counts the
# lm_head as its own matrix, which errs towards more memory rather than less.
_TYPE_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {"vocab_size": 262208, "max_position_embeddings": 131072, "tie_word_embeddings": True},
    "gemma3": {"vocab_size": 262208, "max_position_embeddings": 131072, "tie_word_embeddings": True},
    "gemma2": {"tie_word_embeddings": True},
    "gemma": {"tie_word_embeddings": True},
    "gpt2": {"tie_word_embeddings": True},
}
_DTYPES = {"bfloat16": Precision.BF16, "float16": Precision.FP16, "float32": Precision.FP32}
_ALIASES: dict[str, tuple[str, ...]] = {
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "hidden_size": ("hidden_size", "n_embd", "d_model", "dim"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
    "num_key_value_heads": ("num_key_value_heads", "n_head_kv", "num_kv_heads"),
    "intermediate_size": ("intermediate_size", "n_inner", "ffn_dim", "hidden_dim", "ffn_hidden_size"),
    "vocab_size": ("vocab_size",),
    "max_position_embeddings": ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"),
    "num_experts": ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"),
    "num_experts_per_tok": ("num_experts_per_tok", "experts_per_token", "moe_top_k"),
}


class _HfConfig:
    """Reads one config.json, collecting every problem instead of stopping at the first."""

    def __init__(self, raw: dict[str, Any], source: str) -> None:
        self.source = source
        self.problems: list[str] = []
        self.top = raw
        text = raw.get("text_config")
        # Multimodal checkpoints (gemma3, mistral3, llava) nest the language model; its dtype and quantization
        # stay at the top level.
        self.fields: dict[str, Any] = dict(text) if isinstance(text, dict) else dict(raw)
        self.prefix = "text_config." if isinstance(text, dict) else ""
        self.model_type = str(self.fields.get("model_type") or raw.get("model_type") or "").lower()
        for key, value in _TYPE_DEFAULTS.get(self.model_type, {}).items():
            self.fields.setdefault(key, value)

    def _lookup(self, field: str) -> tuple[str, Any]:
        for alias in _ALIASES.get(field, (field,)):
            if self.fields.get(alias) is not None:
                return alias, self.fields[alias]
        return field, None

    def integer(self, field: str, *, required: bool = True, fix: str = "") -> int | None:
        alias, value = self._lookup(field)
        if value is None:
            if required:
                names = " / ".join(_ALIASES.get(field, (field,)))
                self.problems.append(
                    f"{self.prefix}{field} is missing (looked for {names}): {fix or 'add it from the model card'}"
                )
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            self.problems.append(
                f"{self.prefix}{alias} = {value!r} is not a positive whole number: "
                f"give the count as an integer (e.g. {alias}: 32)"
            )
            return None
        return value

    def flag(self, field: str) -> bool | None:
        value = self.fields.get(field)
        return value if isinstance(value, bool) else None


def _read_hf_config(path_or_dict: str | os.PathLike[str] | Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """The config as a dict and a label for messages; an unreadable or malformed file raises, naming it."""
    if isinstance(path_or_dict, Mapping):
        return dict(path_or_dict), "config"
    path = Path(path_or_dict)
    if path.is_dir():
        path = path / "config.json"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise GenaiConstructsError(
            f"ModelShape.from_hf_config: cannot read {str(path)!r} ({reason}): give the path of a Hugging Face "
            "config.json, or of the model folder that holds one"
        ) from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as error:
        raise GenaiConstructsError(
            f"ModelShape.from_hf_config: {str(path)!r} is not valid JSON: {error.msg} at line {error.lineno} "
            f"column {error.colno}; fix the file (download config.json again from the Hub)"
        ) from None
    if not isinstance(raw, dict):
        raise GenaiConstructsError(
            f"ModelShape.from_hf_config: {str(path)!r} holds a JSON {type(raw).__name__}, not an object: "
            "give a Hugging Face config.json (a JSON object of num_hidden_layers, hidden_size, ...)"
        )
    return raw, repr(str(path))


def _hf_precision(config: _HfConfig, precision: Precision | str | None) -> Precision | None:
    """The served weight format: the argument, else the checkpoint's quantization, else its dtype.

    quantization_config comes before torch_dtype: a quantized checkpoint keeps ``torch_dtype`` for its activations
    and unquantized layers (DeepSeek-V3 says bfloat16 and ships fp8 weights; AWQ checkpoints say float16).
    """
    if precision is not None:
        try:
            return Precision(precision)
        except ValueError:
            allowed = ", ".join(p.value for p in Precision)
            config.problems.append(f"precision {precision!r} is not one of {allowed}")
            return None
    quantization = config.top.get("quantization_config") or config.fields.get("quantization_config")
    if isinstance(quantization, dict):
        method = str(quantization.get("quant_method", "")).lower()
        bits = quantization.get("bits", quantization.get("w_bit"))
        if method == "fp8":
            return Precision.FP8
        if method == "mxfp4":  # 4-bit values plus a shared 8-bit scale per 32: 4.25 bits, nearest int4
            return Precision.INT4
        if method in {"awq", "gptq"} and bits in (4, 8):
            return Precision.INT4 if bits == 4 else Precision.INT8
        config.problems.append(
            f"quantization_config.quant_method = {method!r} (bits {bits!r}) has no matching precision: pass "
            "precision= one of fp8, int8, int4 for the served weights"
        )
        return None
    dtype = config.top.get("torch_dtype") or config.top.get("dtype") or config.fields.get("torch_dtype")
    if dtype is None:
        return Precision.FP32  # transformers loads a checkpoint whose config names no dtype as float32
    if str(dtype).lower() in _DTYPES:
        return _DTYPES[str(dtype).lower()]
    config.problems.append(
        f"torch_dtype = {dtype!r} is not bfloat16, float16 or float32: pass precision= for the served weights"
    )
    return None


def _is_decoder(config: _HfConfig) -> bool:
    architectures = config.top.get("architectures") or []
    return any(
        str(a).endswith(("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")) for a in architectures
    ) or config.model_type.startswith(_GATED_TYPES + ("gpt2", "falcon", "gpt_neox", "opt", "phi"))


def _hf_shape_kwargs(
    raw: dict[str, Any], source: str, name: str | None, precision: Precision | str | None
) -> dict[str, Any]:
    """ModelShape fields from a config.json, with parameters COMPUTED from the architecture (see from_hf_config)."""
    config = _HfConfig(raw, source)
    mt = config.model_type
    encoder = mt in _ENCODER_TYPES
    if mt in _ENCODER_DECODER_TYPES or not (encoder or _is_decoder(config)):
        architectures = raw.get("architectures")
        raise GenaiConstructsError(
            f"ModelShape.from_hf_config({source}): model_type {mt or None!r} (architectures {architectures!r}) is "
            "not a decoder-only language model or a BERT-style encoder, the two kinds the planner sizes: give the "
            "config.json of a causal LM (architectures ...ForCausalLM) or of an embedding encoder (bert, "
            "xlm-roberta, mpnet, ...), or describe the model with ModelShape(...)"
        )
    layers = config.integer("num_hidden_layers", fix="give the number of transformer blocks")
    hidden = config.integer("hidden_size", fix="give the model width")
    heads = config.integer("num_attention_heads", fix="give the number of query heads")
    vocab = config.integer("vocab_size", fix="give the tokenizer's vocabulary size")
    context = config.integer(
        "max_position_embeddings", fix="give the longest sequence the model accepts (the model card's context)"
    )
    kv_heads = config.integer("num_key_value_heads", required=False)
    if kv_heads is None and heads is not None:
        # Falcon-7B says multi_query: one K/V head shared by all query heads; otherwise multi-head attention.
        kv_heads = 1 if config.flag("multi_query") and not config.flag("new_decoder_architecture") else heads
    head_dim = config.integer("head_dim", required=False)
    if head_dim is None and hidden is not None and heads is not None:
        head_dim = hidden // heads
    intermediate = config.integer("intermediate_size", required=False)
    if intermediate is None and hidden is not None:
        intermediate = 4 * hidden  # GPT-2 (n_inner null) and Falcon: the MLP is 4 x the width
    experts = config.integer("num_experts", required=False)
    per_token = config.integer("num_experts_per_tok", required=False)
    if experts is not None and per_token is None:
        config.problems.append(
            f"{config.prefix}num_experts_per_tok is missing while the config has {experts} experts: add "
            "num_experts_per_tok (experts each token is routed to)"
        )
    resolved = _hf_precision(config, precision)
    if config.problems or None in (layers, hidden, heads, vocab, context, kv_heads, head_dim, intermediate):
        lines = "\n".join(f"  - {p}" for p in config.problems)
        raise GenaiConstructsError(
            f"ModelShape.from_hf_config({source}): {len(config.problems)} problem(s) in the config:\n{lines}"
        )
    assert layers and hidden and heads and vocab and context and kv_heads and head_dim and intermediate
    if mt in _POSITION_OFFSET:
        context -= _POSITION_OFFSET[mt]
    total, active = _hf_parameter_count(
        config, layers, hidden, heads, kv_heads, head_dim, vocab, intermediate, experts, per_token, context, encoder
    )
    shape_heads, shape_kv, shape_head_dim = heads, kv_heads, head_dim
    if isinstance(config.fields.get("kv_lora_rank"), int):
        # Multi-head latent attention (DeepSeek V2/V3) caches one latent of kv_lora_rank + qk_rope_head_dim values
        # per token per layer (576 for V3), not K and V per head: as one "KV head" whose K + V is that latent.
        latent = config.fields["kv_lora_rank"] + int(config.fields.get("qk_rope_head_dim") or 0)
        shape_kv, shape_head_dim = 1, max(1, latent // 2)
    label = name or _hf_name(raw, source)
    shape: dict[str, Any] = dict(
        name=label,
        kind="encoder" if encoder else "decoder",
        parameters_billion=total / 1e9,
        layers=layers,
        hidden_size=hidden,
        attention_heads=shape_heads,
        kv_heads=shape_kv,
        head_dim=shape_head_dim,
        vocabulary=vocab,
        max_context=context,
        precision=resolved,
    )
    if experts is not None and per_token is not None:
        shape.update(experts=experts, experts_per_token=per_token, active_parameters_billion=active / 1e9)
    return shape


def _hf_name(raw: dict[str, Any], source: str) -> str:
    given = raw.get("_name_or_path")
    if isinstance(given, str) and given.strip():
        return given.strip().rstrip("/").split("/")[-1].lower()
    if source != "config":
        path = Path(source.strip("'\""))
        label = path.parent.name if path.name == "config.json" else path.stem
        if label:
            return label.lower()
    return str(raw.get("model_type") or "model")


def _hf_parameter_count(
    config: _HfConfig,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    vocab: int,
    intermediate: int,
    experts: int | None,
    per_token: int | None,
    context: int,
    encoder: bool,
) -> tuple[float, float]:
    """Total and per-token parameters counted from the matrices; norms and biases are left out (< 0.1 %)."""
    fields = config.fields
    act = str(fields.get("hidden_act") or fields.get("hidden_activation") or fields.get("activation_function") or "")
    gated = config.model_type.startswith(_GATED_TYPES) or act.lower() in _GATED_ACTIVATIONS
    if config.model_type == "nomic_bert":
        gated = True  # nomic-embed-text uses a SwiGLU MLP
    mlp_matrices = 3 if gated else 2
    embeddings = vocab * hidden
    if encoder:
        # Word, position and token-type tables; an encoder has no lm_head (the MLM head is not served).
        embeddings += context * hidden + int(fields.get("type_vocab_size") or 0) * hidden
    elif not fields.get("tie_word_embeddings", config.top.get("tie_word_embeddings", False)):
        embeddings *= 2  # a separate lm_head of vocab x hidden
    if isinstance(fields.get("kv_lora_rank"), int):
        attention = _mla_attention(fields, hidden, heads)
    else:
        attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim  # q, o; k, v
    dense_mlp = mlp_matrices * hidden * intermediate
    if experts is None or per_token is None:
        per_layer = attention + dense_mlp
        total = embeddings + layers * per_layer
        return total, total
    expert_width = int(fields.get("moe_intermediate_size") or intermediate)
    expert = mlp_matrices * hidden * expert_width
    shared = int(fields.get("n_shared_experts") or 0) * expert  # DeepSeek: shared experts of the expert width
    shared_width = fields.get("shared_expert_intermediate_size")  # Qwen2-MoE: one wide shared expert plus its gate
    if isinstance(shared_width, int) and shared_width > 0:
        shared += mlp_matrices * hidden * shared_width + hidden
    router = hidden * experts
    moe_layers = _moe_layer_count(fields, layers)
    dense_layers = layers - moe_layers
    common = embeddings + layers * attention + dense_layers * dense_mlp + moe_layers * (router + shared)
    total = common + moe_layers * experts * expert
    active = common + moe_layers * per_token * expert
    return total, active


def _mla_attention(fields: dict[str, Any], hidden: int, heads: int) -> int:
    """Multi-head latent attention (DeepSeek V2/V3): low-rank q and kv projections, then per-head up-projections."""
    nope = int(fields.get("qk_nope_head_dim") or 0)
    rope = int(fields.get("qk_rope_head_dim") or 0)
    v_dim = int(fields.get("v_head_dim") or nope)
    kv_rank = int(fields["kv_lora_rank"])
    q_rank = fields.get("q_lora_rank")
    q = hidden * q_rank + q_rank * heads * (nope + rope) if isinstance(q_rank, int) else hidden * heads * (nope + rope)
    kv = hidden * (kv_rank + rope) + kv_rank * heads * (nope + v_dim)
    return q + kv + heads * v_dim * hidden


def _moe_layer_count(fields: dict[str, Any], layers: int) -> int:
    """Layers whose MLP is routed: DeepSeek keeps the first first_k_dense_replace dense and then every
    moe_layer_freq-th; Qwen-MoE routes every decoder_sparse_step-th layer not listed in mlp_only_layers."""
    first_dense = int(fields.get("first_k_dense_replace") or 0)
    frequency = int(fields.get("moe_layer_freq") or 1)
    step = int(fields.get("decoder_sparse_step") or 1)
    dense_only = set(fields.get("mlp_only_layers") or [])
    return sum(
        1
        for i in range(layers)
        if i >= first_dense and i % frequency == 0 and (i + 1) % step == 0 and i not in dense_only
    )


# Bounds for the parameters_billion check of ModelShape (see _parameter_problems).
_WIDEST_MLP = 16
"""MLP width, in multiples of hidden_size, that the upper bound allows: twice the widest of a published dense
transformer (Gemma 7B: intermediate_size 24,576 for hidden_size 3,072, 8 x)."""
_PARAMETER_SLACK = 2.0
"""parameters_billion may sit this far outside the bounds (MLA attention and padded vocabularies blur them)."""

# Traffic defaults, each with its reason.
DEFAULT_PROMPT_TOKENS = 1024
"""Mean prompt of the Azure LLM inference conversation trace 2023 is 1,155 tokens (shared/traces): chat
prompts carry history and retrieved context, so a 128-token default would under-size prefill and KV cache."""
DEFAULT_OUTPUT_TOKENS = 256
"""Mean completion of the same trace is 211 tokens; rounded up so KV cache sizing errs on the safe side."""
DEFAULT_P95_TTFT_MS = 2000.0
"""A chat user tolerates about two seconds before the first token appears; a stricter target is a user choice."""
DEFAULT_HEADROOM = 0.3
"""Real-time fleets are planned at 70 % of the concurrency that meets the latency targets: load is bursty,
p95 latency climbs steeply near saturation, and scale-out takes minutes."""
DEFAULT_BATCH_HEADROOM = 0.2
"""Batch plans finish 20 % before the deadline: Spot interruptions, retries and scale-out eat into it."""
DEFAULT_MAX_REQUEST_TOKENS_FLOOR = 8192
"""The longest request (prompt + output) a fleet accepts is at least 8,192 tokens: in the Azure LLM inference traces
2023 (shared/traces) only 1 of 19,366 conversation requests and none of 8,819 code requests is longer, and it is the
native context of the Llama 3 generation. The server rejects a longer request outright, so the floor errs long; one
such request costs 1 GiB of KV cache on an 8B model (131,072 bytes per token)."""
DEFAULT_MAX_REQUEST_TOKENS_FACTOR = 4
"""Above the floor, a traffic with long means is given 4 x its mean prompt + output: the 99th percentile of prompt +
output is 3.1 x the mean in the Azure 2023 conversation trace and 3.6 x in the code trace, so 4 x covers both."""


class RealtimeTraffic(_Frozen):
    """Interactive traffic: sessions streaming tokens at a reading pace, with latency targets at p95."""

    concurrent_sessions: int = Field(gt=0, description="Sessions streaming at the same time at peak.")
    output_tokens_per_s_per_session: float = Field(
        gt=0, description="Tokens per second each session must receive (reading speed is ~5-10; agents need more)."
    )
    prompt_tokens: int = Field(default=DEFAULT_PROMPT_TOKENS, gt=0, description="Mean prompt length, tokens.")
    output_tokens: int = Field(default=DEFAULT_OUTPUT_TOKENS, gt=0, description="Mean completion length, tokens.")
    p95_ttft_ms: float = Field(default=DEFAULT_P95_TTFT_MS, gt=0, description="Time-to-first-token target at p95.")
    p95_tpot_ms: float | None = Field(
        default=None,
        gt=0,
        description="Time-per-output-token target at p95. Default: 1000 / output_tokens_per_s_per_session.",
    )
    headroom: float = Field(
        default=DEFAULT_HEADROOM,
        ge=0,
        lt=1,
        description="Fraction of capacity kept free at peak (see DEFAULT_HEADROOM).",
    )
    min_instances: int = Field(default=2, ge=2, description="At least two instances, in two AZs, for availability.")
    max_request_tokens: int | None = Field(
        default=None,
        gt=0,
        description="Longest prompt + output one request may carry, tokens; the server's --max-model-len. Default: "
        "the larger of DEFAULT_MAX_REQUEST_TOKENS_FLOOR and DEFAULT_MAX_REQUEST_TOKENS_FACTOR x (prompt_tokens + "
        "output_tokens); the planner caps the default at the model's max_context.",
    )

    _NUMBER_FIXES: ClassVar[dict[str, tuple[str, str]]] = {
        "max_request_tokens": (
            " of tokens",
            "give the longest prompt + output one request may carry (e.g. 8192), or leave it unset for the default",
        ),
    }

    @model_validator(mode="after")
    def _targets_agree(self) -> RealtimeTraffic:
        problems = []
        sequence = self.prompt_tokens + self.output_tokens
        if self.max_request_tokens is not None and self.max_request_tokens < sequence:
            problems.append(
                f"max_request_tokens ({self.max_request_tokens}) is shorter than prompt_tokens + output_tokens "
                f"({self.prompt_tokens} + {self.output_tokens} = {sequence}): the server would reject the mean "
                f"request; raise max_request_tokens to at least {sequence}, or leave it unset for the default"
            )
        # A session receiving r tokens per second needs a token every 1000 / r ms; a p95 TPOT target slower than
        # that lets the plan choose a fleet that cannot keep the session's pace. (A tiny tolerance absorbs the
        # float of e.g. 1000 / 3.)
        interval_ms = 1000.0 / self.output_tokens_per_s_per_session
        if self.p95_tpot_ms is not None and self.p95_tpot_ms > interval_ms * (1 + 1e-9):
            problems.append(
                f"p95_tpot_ms ({self.p95_tpot_ms:g}) allows a token every {self.p95_tpot_ms:g} ms, but "
                f"output_tokens_per_s_per_session ({self.output_tokens_per_s_per_session:g}) asks for one every "
                f"{interval_ms:.4g} ms: the session rate cannot be met; set p95_tpot_ms to at most {interval_ms:.4g}, "
                f"lower output_tokens_per_s_per_session to at most {1000.0 / self.p95_tpot_ms:.4g}, or leave "
                "p95_tpot_ms unset (it defaults to 1000 / output_tokens_per_s_per_session)"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @computed_field(description="The TPOT the plan must meet at p95.")  # type: ignore[prop-decorator]
    @property
    def tpot_target_ms(self) -> float:
        if self.p95_tpot_ms is not None:
            return self.p95_tpot_ms
        return 1000.0 / self.output_tokens_per_s_per_session

    @computed_field(  # type: ignore[prop-decorator]
        description="max_request_tokens, or its default rule; before the planner caps a default at max_context."
    )
    @property
    def request_tokens_limit(self) -> int:
        if self.max_request_tokens is not None:
            return self.max_request_tokens
        return max(
            DEFAULT_MAX_REQUEST_TOKENS_FLOOR,
            DEFAULT_MAX_REQUEST_TOKENS_FACTOR * (self.prompt_tokens + self.output_tokens),
        )


class BatchTraffic(_Frozen):
    """A backlog of documents to embed (or process) before a deadline."""

    documents: int = Field(gt=0, description="Documents in the backlog.")
    tokens_per_document: int = Field(gt=0, description="Mean tokens per document.")
    deadline_hours: float = Field(gt=0, description="Hours from start until every document must be done.")
    spot_ok: bool = Field(default=False, description="Whether Spot capacity may be used (interruptions are retried).")
    sequence_tokens: int = Field(
        default=512, gt=0, description="Chunk length fed to the encoder; documents are split into chunks this long."
    )
    headroom: float = Field(default=DEFAULT_BATCH_HEADROOM, ge=0, lt=1, description="See DEFAULT_BATCH_HEADROOM.")

    @computed_field(description="Tokens in the whole backlog.")  # type: ignore[prop-decorator]
    @property
    def total_tokens(self) -> int:
        return self.documents * self.tokens_per_document


DEFAULT_RAG_TOP_K = 4
"""Four ~512-token chunks: about 2,000 tokens of context, room for the question and the answer in an 8k window (the
orchestrator's own default, ``runtime.rag_orchestrator.DEFAULT_TOP_K``)."""
DEFAULT_UTF8_BYTES_PER_TOKEN = 4.0
"""English text runs about four characters (bytes, in UTF-8) per BPE/WordPiece token; retrieved context is sized in
bytes from it."""


class RagTraffic(_Frozen):
    """The RAG request path's load at peak: answers per second and the context each answer retrieves.

    The retrieval tier and the orchestration tier are sized from ``retrieved_bytes_per_s`` (chunks x chunk length x
    bytes per token x request rate), not from a row count: the lesson warns that teams shrink retrieval (fewer,
    shorter chunks) to hide a bandwidth limit, so the plan states the bytes it must carry and sizes for them.
    """

    requests_per_s: float = Field(gt=0, description="RAG answers started per second at peak.")
    top_k: int = Field(default=DEFAULT_RAG_TOP_K, gt=0, le=1000, description="Chunks retrieved per request.")
    chunk_tokens: int = Field(default=512, gt=0, description="Tokens per stored chunk (the preprocessing tier's cut).")
    bytes_per_token: float = Field(
        default=DEFAULT_UTF8_BYTES_PER_TOKEN, gt=0, le=16, description="UTF-8 bytes per token of stored text."
    )
    query_tokens: int = Field(default=64, gt=0, description="Mean question length, tokens (embedded on the CPU).")
    stored_chunks: int = Field(default=1_000_000, gt=0, description="Chunks held by the vector store.")
    headroom: float = Field(default=DEFAULT_HEADROOM, ge=0, lt=1, description="See DEFAULT_HEADROOM.")

    _RANGE_FIXES: ClassVar[dict[str, str]] = {
        "requests_per_s": "RAG answers started per second at peak, e.g. requests_per_s=50",
        "top_k": f"chunks retrieved per request, 1 to 1000, e.g. top_k={DEFAULT_RAG_TOP_K}",
        "chunk_tokens": "the preprocessing tier's chunk length, e.g. chunk_tokens=254 for all-MiniLM-L6-v2",
        "bytes_per_token": f"UTF-8 bytes per token of stored text, above 0 and at most 16 (English: "
                           f"{DEFAULT_UTF8_BYTES_PER_TOKEN:g})",
        "query_tokens": "mean question length in tokens, e.g. query_tokens=64",
        "stored_chunks": "chunks the vector store holds, e.g. stored_chunks=2_000_000",
        "headroom": f"the spare fraction kept at peak, from 0 up to (not including) 1, e.g. headroom={DEFAULT_HEADROOM}",
    }
    """Per field, the fix a range or type error names (pydantic's own 'Input should be greater than 0' names none)."""

    @field_validator("*", mode="before")
    @classmethod
    def _number_in_range(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic would read requests_per_s="4" as 4.0 (lax mode): a number given as text is a mistake, say so.
        field = cls.model_fields.get(info.field_name or "")
        fix = cls._RANGE_FIXES.get(info.field_name or "")
        if field is None or fix is None:
            return value
        if isinstance(value, bool) or (isinstance(value, float) and not math.isfinite(value)):
            return value  # _Frozen._real_number names these
        whole = field.annotation is int
        if not isinstance(value, (int, float)) or (whole and not float(value).is_integer()):
            shown = f"a {type(value).__name__}" if not isinstance(value, float) else "a fraction"
            raise ValueError(f"must be a {'whole ' if whole else ''}number, not {shown}: {fix}")
        for bound in field.metadata:  # annotated_types Gt/Ge/Lt/Le from Field(gt=..., le=...)
            for name, word, outside in (("gt", "greater than", operator.le), ("ge", "at least", operator.lt),
                                        ("lt", "less than", operator.ge), ("le", "at most", operator.gt)):
                limit = getattr(bound, name, None)
                if limit is not None and outside(value, limit):
                    raise ValueError(f"must be {word} {limit:g}: {fix}")
        return value

    @computed_field(description="Bytes of chunk text one request reads from the store.")  # type: ignore[prop-decorator]
    @property
    def retrieved_bytes_per_request(self) -> float:
        return self.top_k * self.chunk_tokens * self.bytes_per_token

    @computed_field(description="Bytes of chunk text per second at peak.")  # type: ignore[prop-decorator]
    @property
    def retrieved_bytes_per_s(self) -> float:
        return self.retrieved_bytes_per_request * self.requests_per_s


class ModelArtifact(_Frozen):
    """Where the model weights live in S3, and which version to serve.

    ``prefix`` holds the weights and a ``SHA256SUMS`` manifest (``sha256sum`` format) that the instance
    verifies before it starts the server.

    Every field is checked here, before any construct uses it: the bucket name and prefix end up in IAM ARNs, the
    S3 gateway endpoint's policy and the boot script, where a mistake would surface only at deploy time (IAM
    ``MalformedPolicyDocument``) or at boot (an instance that never serves). The bucket name follows "General purpose
    bucket naming rules" (Amazon S3 user guide): 3-63 characters of lower-case letters, digits, '.' and '-',
    beginning and ending with a letter or digit, no two adjacent periods, not formatted as an IP address, none of the
    reserved prefixes (``xn--``, ``sthree-``, ``amzn-s3-demo-``) or suffixes (``-s3alias``, ``--ol-s3``, ``.mrap``,
    ``--x-s3``, ``--table-s3``). A KMS key is named by its key ARN: IAM permissions for ``kms:Decrypt`` are
    evaluated against the key, and an alias ARN in a policy's Resource controls only alias operations ("Using
    aliases to control access to KMS keys", AWS KMS developer guide).
    """

    bucket_name: str = Field(description="S3 bucket holding the weights (its name, not an s3:// URL or an ARN).")
    prefix: str = Field(description="Key prefix of the weights, ending in '/'.")
    version: str = Field(default="1", description="Model version served; a change rolls the fleet.")
    kms_key_arn: str | None = Field(default=None, description="KMS key the bucket is encrypted with, if any.")
    manifest_name: str = Field(default="SHA256SUMS", description="sha256sum manifest under the prefix.")

    @field_validator("bucket_name", mode="before")
    @classmethod
    def _bucket_name_s3_allows(cls, value: Any) -> Any:
        if not isinstance(value, str):
            raise ValueError(f"must be the bucket's name as a string, e.g. 'my-models', not a {type(value).__name__}")
        problem = s3_bucket_name_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("prefix", mode="before")
    @classmethod
    def _prefix_is_a_key_prefix(cls, value: Any) -> Any:
        if not isinstance(value, str):
            raise ValueError(f"must be a key prefix string such as 'llama-3.1-8b/', not a {type(value).__name__}")
        if value.startswith(("s3://", "arn:")):
            raise ValueError("is a key prefix inside the bucket, not a URL or an ARN: give bucket_name='my-models' "
                             "and prefix='llama-3.1-8b/' for s3://my-models/llama-3.1-8b/")
        if not value.endswith("/") or value.startswith("/"):
            raise ValueError(f"prefix {value!r} must end in '/' and not start with '/': e.g. 'llama-3.1-8b/'")
        if "//" in value or any(part in (".", "..") for part in value.split("/")[:-1]):
            raise ValueError("holds an empty, '.' or '..' path segment, which S3 keeps literally (the weights would "
                             "not be where the instance looks): write it as 'folder/sub/'")
        if any(c in value for c in "*?$") or any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise ValueError("holds '*', '?', '$' or a control character: in the instance role's IAM ARN a '*' or "
                             "'?' is a wildcard that widens the grant and '${' starts a policy variable; rename the "
                             "folder to letters, digits and '-_./'")
        if len(value.encode()) > 1000:
            raise ValueError("is longer than 1000 bytes: S3 keys are at most 1024 bytes and the weights' file names "
                             "go after it; use a shorter prefix")
        return value

    @field_validator("version", mode="before")
    @classmethod
    def _version_is_a_label(cls, value: Any) -> Any:
        if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", value):
            raise ValueError("must be 1-64 letters, digits, '.', '_' or '-' (it names a metric dimension and a "
                             "folder on the instance): e.g. version='2' or '2024-07-23'")
        return value

    @field_validator("kms_key_arn", mode="before")
    @classmethod
    def _kms_key_arn_is_a_key_arn(cls, value: Any) -> Any:
        if value is None:
            return value
        if not isinstance(value, str) or not _KMS_KEY_ARN.fullmatch(value):
            raise ValueError("must be a KMS key ARN, arn:<partition>:kms:<region>:<12-digit account>:key/<key id>, "
                             "e.g. 'arn:aws:kms:us-east-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab' (an "
                             "alias ARN or a bare key id does not work in the instance role's policy): copy the key's "
                             "ARN from the KMS console, or leave it None for SSE-S3")
        return value

    @field_validator("manifest_name", mode="before")
    @classmethod
    def _manifest_name_is_a_file_name(cls, value: Any) -> Any:
        if (not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9._-]{1,255}", value)
                or value in (".", "..")):
            raise ValueError("must be a file name of 1-255 letters, digits, '.', '_' or '-' directly under prefix "
                             "(the instance downloads <prefix><manifest_name> and stops at boot without it): "
                             "use the default 'SHA256SUMS'")
        return value


_KMS_KEY_ARN = re.compile(r"arn:aws[a-z-]*:kms:[a-z]{2}(-[a-z]+)+-\d:\d{12}:key/(mrk-)?[0-9a-fA-F-]{32,36}")
_IPV4_LIKE = re.compile(r"\d{1,3}(\.\d{1,3}){3}")
_RESERVED_BUCKET_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_RESERVED_BUCKET_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")


def s3_bucket_name_problem(name: str) -> str | None:
    """Why S3 would refuse ``name`` for a general purpose bucket, with the fix; None when it is allowed.

    The rules of "General purpose bucket naming rules" (Amazon S3 user guide).
    """
    if name.startswith(("s3://", "arn:", "https://")):
        bare = re.sub(r"^(s3://|arn:aws[a-z-]*:s3:::|https://)", "", name).split("/", 1)[0]
        return (f"is a URL or an ARN, not a bucket name: give bucket_name={bare!r} and put any folder in prefix= "
                "(the name goes into IAM ARNs as it is)")
    allowed = ("S3 bucket names are 3-63 characters of lower-case letters, digits, '.' and '-', beginning and ending "
               "with a letter or digit")
    if not 3 <= len(name) <= 63 or not re.fullmatch(r"[a-z0-9][a-z0-9.-]*[a-z0-9]", name):
        return f"{allowed}: give the bucket's exact name, e.g. 'my-models'"
    if ".." in name:
        return f"holds two adjacent periods, which S3 does not allow: write {re.sub(r'[.]{2,}', '.', name)!r}"
    if _IPV4_LIKE.fullmatch(name):
        return "is formatted as an IP address, which S3 does not allow for a bucket name: give the bucket's name"
    for reserved in _RESERVED_BUCKET_PREFIXES:
        if name.startswith(reserved):
            return f"starts with {reserved!r}, a prefix S3 reserves: give the bucket's name"
    for reserved in _RESERVED_BUCKET_SUFFIXES:
        if name.endswith(reserved):
            return (f"ends with {reserved!r}, a suffix S3 reserves for access points and other bucket types: give a "
                    "general purpose bucket's name")
    return None
