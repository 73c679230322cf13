"""A --model opened once per command: its GGUF header read once, and its architecture's table entry. Each command
opens it before its dumps and hands it to what needs it (verify, list, diff's two sides, the HTML page's vocabulary),
so that nothing reads the file's header again."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import ModelError
from .gguf_header import Header, read_header
from .table import Arch, lookup


@dataclass(frozen=True)
class ModelContext:
    """A GGUF model as a command opened it: where it is and its header (read once, never changed)."""

    path: str
    header: Header

    @property
    def meta(self) -> Mapping[str, Any]:
        return self.header.meta

    @property
    def entry(self) -> Arch | None:
        """The architecture table's entry, None for an architecture attncheck knows nothing of."""
        return lookup(self.header.arch)


def open_model(model: str | os.PathLike[str] | ModelContext) -> ModelContext:
    """A model path's context (its header read: ModelError when it is not a GGUF file), or the context given."""
    if isinstance(model, ModelContext):
        return model
    return ModelContext(str(model), read_header(model))


def model_path(model: str | os.PathLike[str] | ModelContext | None) -> str | None:
    """The file a model option names, whether a path or an opened context."""
    return model.path if isinstance(model, ModelContext) else None if model is None else str(model)


def opened(model: str | os.PathLike[str] | ModelContext | None) -> str | ModelContext | None:
    """A model opened once for a command's dumps, or its path when it cannot be: each dump then fails on it, as it
    does without a context."""
    try:
        return None if model is None else open_model(model)
    except ModelError:
        return str(model)
