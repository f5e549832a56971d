"""The workload model: what is being served (model shape) and how it is asked for (traffic shape).

Pure Python (pydantic v2), no CDK import: the planner consumes these, and the constructs take the plan.
Every model here is frozen and validated; a bad value raises a ``GenaiConstructsError`` naming the field,
the value and the fix (see :func:`genai_constructs.errors`), never a bare pydantic trace.
"""

from __future__ import annotations

import difflib
import math
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, computed_field, field_validator, model_validator

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


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=False)

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as error:
            raise GenaiConstructsError(_explain(type(self).__name__, error)) from None


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
    def _heads_consistent(self) -> ModelShape:
        if self.attention_heads % self.kv_heads:
            raise ValueError(
                f"attention_heads ({self.attention_heads}) must be a multiple of kv_heads ({self.kv_heads}): "
                "set kv_heads to a divisor of attention_heads (equal for multi-head attention)"
            )
        moe = (self.experts, self.experts_per_token, self.active_parameters_billion)
        if any(v is not None for v in moe) and any(v is None for v in moe):
            raise ValueError(
                f"experts ({self.experts}), experts_per_token ({self.experts_per_token}) and "
                f"active_parameters_billion ({self.active_parameters_billion}) describe a mixture-of-experts model "
                "together: give all three, or none for a dense model"
            )
        if self.experts is not None and self.experts_per_token is not None and self.experts_per_token >= self.experts:
            raise ValueError(
                f"experts_per_token ({self.experts_per_token}) must be fewer than experts ({self.experts}): "
                "a token is routed to a few of the experts (e.g. 2 of 8)"
            )
        if self.active_parameters_billion is not None and self.active_parameters_billion >= self.parameters_billion:
            raise ValueError(
                f"active_parameters_billion ({self.active_parameters_billion}) must be below parameters_billion "
                f"({self.parameters_billion}): a mixture-of-experts model activates a fraction of its weights"
            )
        return self

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
        key = name.strip().lower()
        if key not in MODEL_PRESETS:
            close = difflib.get_close_matches(key, MODEL_PRESETS, n=3, cutoff=0.4)
            hint = (
                f"did you mean {', '.join(close)}?" if close else f"known presets: {', '.join(sorted(MODEL_PRESETS))}"
            )
            raise UnknownPresetError(
                f"ModelShape.preset: unknown model {name!r}; {hint} "
                "Or describe the model with ModelShape(parameters_billion=..., layers=..., ...)."
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


def _llama(
    params: float, layers: int, hidden: int, heads: int, kv: int, vocab: int, ctx: int, dtype: str
) -> dict[str, Any]:
    return dict(
        kind="decoder",
        parameters_billion=params,
        layers=layers,
        hidden_size=hidden,
        attention_heads=heads,
        kv_heads=kv,
        head_dim=hidden // heads,
        vocabulary=vocab,
        max_context=ctx,
        precision=Precision(dtype),
    )


def _bert(params: float, layers: int, hidden: int, heads: int) -> dict[str, Any]:
    return dict(
        kind="encoder",
        parameters_billion=params,
        layers=layers,
        hidden_size=hidden,
        attention_heads=heads,
        kv_heads=heads,
        head_dim=hidden // heads,
        vocabulary=30522,
        max_context=512,
        precision=Precision.FP16,
    )


# Architecture numbers from each model's config.json on the Hugging Face Hub (num_hidden_layers, hidden_size,
# num_attention_heads, num_key_value_heads, vocab_size, max_position_embeddings, torch_dtype); parameter counts
# from the model cards. Encoders are served in fp16 on GPU (their checkpoints are fp32; fp16 halves memory
# traffic with no measurable loss in retrieval quality, and is what TEI and Infinity serve by default).
MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "llama-2-7b": _llama(6.74, 32, 4096, 32, 32, 32000, 4096, "fp16"),
    "llama-2-13b": _llama(13.0, 40, 5120, 40, 40, 32000, 4096, "fp16"),
    "llama-2-70b": _llama(68.98, 80, 8192, 64, 8, 32000, 4096, "fp16"),
    "llama-13b": _llama(13.0, 40, 5120, 40, 40, 32000, 2048, "fp16"),
    "llama-3-8b": _llama(8.03, 32, 4096, 32, 8, 128256, 8192, "bf16"),
    "llama-3-70b": _llama(70.55, 80, 8192, 64, 8, 128256, 8192, "bf16"),
    "llama-3.1-8b": _llama(8.03, 32, 4096, 32, 8, 128256, 131072, "bf16"),
    "llama-3.1-70b": _llama(70.55, 80, 8192, 64, 8, 128256, 131072, "bf16"),
    "llama-3.3-70b": _llama(70.55, 80, 8192, 64, 8, 128256, 131072, "bf16"),
    "mistral-7b": _llama(7.24, 32, 4096, 32, 8, 32000, 32768, "bf16"),
    "bge-base-en-v1.5": _bert(0.109, 12, 768, 12),
    "bge-large-en-v1.5": _bert(0.335, 24, 1024, 16),
    "all-minilm-l6-v2": _bert(0.0227, 6, 384, 12),
    "e5-large-v2": _bert(0.335, 24, 1024, 16),
}

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

    @field_validator("max_request_tokens", mode="before")
    @classmethod
    def _whole_number_of_tokens(cls, value: Any) -> Any:
        # pydantic would take True as 1 and say only "finite number" for nan: name what is allowed and the fix.
        if isinstance(value, bool):
            raise ValueError(
                "must be a whole number of tokens, not a bool: give the longest prompt + output one request may "
                "carry (e.g. 8192), or leave it unset for the default"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(
                "must be a finite whole number of tokens: give the longest prompt + output one request may carry "
                "(e.g. 8192), or leave it unset for the default"
            )
        return value

    @model_validator(mode="after")
    def _request_holds_the_mean(self) -> RealtimeTraffic:
        sequence = self.prompt_tokens + self.output_tokens
        if self.max_request_tokens is not None and self.max_request_tokens < sequence:
            raise ValueError(
                f"max_request_tokens ({self.max_request_tokens}) is shorter than prompt_tokens + output_tokens "
                f"({self.prompt_tokens} + {self.output_tokens} = {sequence}): the server would reject the mean "
                f"request; raise max_request_tokens to at least {sequence}, or leave it unset for the default"
            )
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


class ModelArtifact(_Frozen):
    """Where the model weights live in S3, and which version to serve.

    ``prefix`` holds the weights and a ``SHA256SUMS`` manifest (``sha256sum`` format) that the instance
    verifies before it starts the server.
    """

    bucket_name: str = Field(
        min_length=3,
        max_length=63,
        pattern=r"^[a-z0-9][a-z0-9.-]*[a-z0-9]$",
        description="S3 bucket holding the weights.",
    )
    prefix: str = Field(description="Key prefix of the weights, ending in '/'.")
    version: str = Field(
        default="1",
        min_length=1,
        pattern=r"^[A-Za-z0-9._-]+$",
        description="Model version served; a change rolls the fleet.",
    )
    kms_key_arn: str | None = Field(default=None, description="KMS key the bucket is encrypted with, if any.")
    manifest_name: str = Field(default="SHA256SUMS", description="sha256sum manifest under the prefix.")

    @model_validator(mode="after")
    def _prefix_is_folder(self) -> ModelArtifact:
        if not self.prefix.endswith("/") or self.prefix.startswith("/"):
            raise ValueError(f"prefix {self.prefix!r} must end in '/' and not start with '/': e.g. 'llama-3.1-8b/'")
        return self
