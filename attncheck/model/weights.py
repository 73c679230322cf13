"""GGUF model access: hyperparameters and weights dequantized one tensor at a time."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from ..arch import ARCHS, Forward, lookup
from ..errors import ModelError  # defined beside DumpError, so the CLI need not import gguf to catch it


@dataclass(frozen=True)
class Hparams:
    """The hyperparameters a reference forward pass needs, read from GGUF metadata."""

    arch: str
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_layer: int
    n_ctx_train: int
    norm_eps: float
    rope_dim: int  # 0 when the architecture has no RoPE
    rope_freq_base: float
    kq_scale: float
    n_vocab: int

    @property
    def forward(self) -> Forward:
        """How the architecture table says this family computes (arch/table.py)."""
        return lookup(self.arch).forward  # type: ignore[union-attr]  # load_model admits only such architectures


class Model:
    """A memory-mapped GGUF model; `tensor()` dequantizes one tensor on demand (no cache, flat memory)."""

    def __init__(self, path: str | os.PathLike[str], reader: GGUFReader, hparams: Hparams) -> None:
        self.path = str(path)
        self.hparams = hparams
        self._reader = reader
        self._tensors = {t.name: t for t in reader.tensors}

    def has(self, name: str) -> bool:
        """Whether the file holds a tensor of that name."""
        return name in self._tensors

    def _get(self, name: str) -> Any:
        try:
            return self._tensors[name]
        except KeyError:
            raise ModelError(self.path, f"no tensor named {name!r}") from None

    def tensor_type(self, name: str) -> GGMLQuantizationType:
        """The GGML storage type of a tensor (F32, F16, Q8_0, ...)."""
        return GGMLQuantizationType(int(self._get(name).tensor_type))

    def ne(self, name: str) -> tuple[int, ...]:
        """GGML ne of a tensor (ne0 first, the contiguous dimension)."""
        return tuple(int(n) for n in self._get(name).shape)

    def tensor(self, name: str) -> np.ndarray:
        """One tensor as float32, numpy shape = reversed GGML ne (a weight {n_in, n_out} is [n_out, n_in])."""
        t = self._get(name)
        try:
            values = dequantize(np.asarray(t.data), self.tensor_type(name))
        except NotImplementedError as e:
            raise ModelError(self.path, f"cannot dequantize {name} ({self.tensor_type(name).name}): {e}") from None
        return np.ascontiguousarray(values, dtype=np.float32).reshape(tuple(reversed(self.ne(name))))

    def rows(self, name: str, ids: list[int] | np.ndarray) -> np.ndarray:
        """Rows `ids` of a 2-D tensor as float32 [len(ids), ne0], dequantizing only those rows (GET_ROWS)."""
        t = self._get(name)
        ne = self.ne(name)
        if len(ne) != 2:
            raise ModelError(self.path, f"{name} is not a matrix (ne = {ne})")
        idx = np.asarray(ids, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= ne[1]):
            raise ModelError(self.path, f"row index out of range for {name} ({ne[1]} rows)")
        data = np.asarray(t.data).reshape(ne[1], -1)[idx]
        return np.ascontiguousarray(dequantize(data, self.tensor_type(name)), dtype=np.float32).reshape(len(idx), ne[0])


def _field(reader: GGUFReader, key: str, default: Any = None) -> Any:
    """The value of a metadata key, or default when absent."""
    f = reader.fields.get(key)
    if f is None:
        return default
    if hasattr(f, "contents"):
        return f.contents()
    part = f.parts[f.data[0]]  # older gguf: scalar fields hold one part
    return bytes(part).decode() if part.dtype == np.uint8 else part.tolist()[0]


def load_model(path: str | os.PathLike[str]) -> Model:
    """Open a GGUF file (memory-mapped) and read the hyperparameters of a model whose architecture has a reference
    forward pass in the architecture table."""
    try:
        reader = GGUFReader(path, "r")
    except (OSError, ValueError) as e:
        raise ModelError(path, f"not a readable GGUF file ({e})") from None
    arch = _field(reader, "general.architecture")
    spec = lookup(arch)
    if spec is None or spec.forward is None:
        supported = ", ".join(name for name, a in ARCHS.items() if a.forward is not None)
        raise ModelError(path, f"unsupported architecture {arch!r} (supported: {supported})")
    fw = spec.forward

    def key(name: str, default: Any = None) -> Any:
        value = _field(reader, f"{arch}.{name}", default)
        if value is None:
            raise ModelError(path, f"missing metadata key {arch}.{name}")
        return value

    n_embd = int(key("embedding_length"))
    n_head = int(key("attention.head_count"))
    head_dim = int(key("attention.key_length", n_embd // n_head))
    tensors = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in tensors:
        raise ModelError(path, "no tensor named 'token_embd.weight'")
    scale = float(_field(reader, f"{arch}.attention.scale", 0.0) or 0.0)
    hp = Hparams(
        arch=arch,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=int(key("attention.head_count_kv", n_head)),
        head_dim=head_dim,
        n_layer=int(key("block_count")),
        n_ctx_train=int(key("context_length")),
        norm_eps=float(key(fw.norm_eps_key)),
        rope_dim=int(key("rope.dimension_count", head_dim)) if fw.positions.startswith("rope") else 0,
        rope_freq_base=float(key("rope.freq_base", 10000.0)) if fw.positions.startswith("rope") else 0.0,
        kq_scale=scale if scale else float(np.float32(1) / np.sqrt(np.float32(head_dim))),  # 1.0f/sqrtf(D_h)
        n_vocab=int(tensors["token_embd.weight"].shape[1]),
    )
    return Model(path, reader, hp)
