"""GGUF model access for the reference forward pass: the header read in milliseconds (arch/gguf_header.py), each
tensor memory-mapped at its offset and dequantized on demand by gguf.quants, one tensor at a time (nothing is kept:
the forward pass holds one layer's weights in f32 at most)."""

from __future__ import annotations

import copy
import os
import threading
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ..arch import ARCHS, lookup
from ..arch.gguf_header import Header, read_header
from ..errors import ModelError  # defined beside DumpError, so the CLI need not import gguf to catch it
from .dequant import dequantize
from .hparams import Hparams, read_hparams


class Model:
    """A GGUF file: its header, its hyperparameters, and its tensors memory-mapped (read only when asked)."""

    def __init__(self, path: str | os.PathLike[str], header: Header, hparams: Hparams) -> None:
        self.path = str(path)
        self.header = header
        self.hparams = hparams
        self._map = np.memmap(self.path, dtype=np.uint8, mode="r")

    def with_hparams(self, hparams: Hparams) -> "Model":
        """The same file and map under other hyperparameters (a build that read the header otherwise)."""
        out = copy.copy(self)
        out.hparams = hparams
        return out

    def has(self, name: str) -> bool:
        """Whether the file holds a tensor of that name."""
        return name in self.header.tensors

    def _info(self, name: str):
        try:
            return self.header.tensors[name]
        except KeyError:
            raise ModelError(self.path, f"no tensor named {name!r}") from None

    def tensor_type(self, name: str) -> GGMLQuantizationType:
        """The GGML storage type of a tensor (F32, F16, Q8_0, ...)."""
        t = self._info(name).type
        try:
            return GGMLQuantizationType(t)
        except ValueError:
            raise ModelError(self.path, f"{name} has ggml type {t}, which the gguf package does not know") from None

    def ne(self, name: str) -> tuple[int, ...]:
        """GGML ne of a tensor (ne0 first, the contiguous dimension)."""
        return tuple(int(n) for n in self._info(name).ne)

    def raw(self, name: str) -> np.ndarray:
        """The stored bytes of a tensor, [rows, bytes per row] (rows = the product of ne1, ne2, ...): memory-mapped."""
        info = self._info(name)
        block, size = GGML_QUANT_SIZES[self.tensor_type(name)]
        ne = self.ne(name)
        if ne[0] % block:
            raise ModelError(self.path, f"{name}: ne0 {ne[0]} is not a multiple of its block size {block}")
        row = ne[0] // block * size
        rows = int(np.prod(ne[1:], dtype=np.int64)) if len(ne) > 1 else 1
        start = self.header.data_start + info.offset
        if start + rows * row > self._map.size:
            raise ModelError(self.path, f"{name} lies beyond the end of the file (a truncated file?)")
        return self._map[start:start + rows * row].reshape(rows, row)

    def _dequantize(self, name: str, data: np.ndarray, dtype=np.float32) -> np.ndarray:
        """Raw rows [rows, bytes] → [rows, ne0] of dtype (dequant.py)."""
        qtype = self.tensor_type(name)
        try:
            return dequantize(data, qtype, dtype)
        except NotImplementedError as e:
            raise ModelError(self.path, f"cannot dequantize {name} ({qtype.name}): {e}") from None

    def tensor(self, name: str) -> np.ndarray:
        """One tensor as float32, numpy shape = reversed GGML ne (a weight {n_in, n_out} is [n_out, n_in])."""
        return self._dequantize(name, self.raw(name)).reshape(tuple(reversed(self.ne(name))))

    def matrix(self, name: str, dtype=np.float64) -> np.ndarray:
        """A weight as [ne1, ne0] of dtype (float64: exact for the legacy block types), for one matrix product."""
        ne = self.ne(name)
        return self._dequantize(name, self.raw(name), dtype).reshape(-1, ne[0])

    def rows(self, name: str, ids: list[int] | np.ndarray, dtype=np.float32) -> np.ndarray:
        """Rows `ids` of a 2-D tensor [len(ids), ne0], dequantizing only those rows (GET_ROWS)."""
        ne = self.ne(name)
        if len(ne) != 2:
            raise ModelError(self.path, f"{name} is not a matrix (ne = {ne})")
        idx = np.asarray(ids, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= ne[1]):
            raise ModelError(self.path, f"row index out of range for {name} ({ne[1]} rows)")
        return self._dequantize(name, self.raw(name)[idx], dtype).reshape(len(idx), ne[0])

    def meta(self, key: str, default: Any = None) -> Any:
        """A metadata value of the header, or default."""
        return self.header.meta.get(key, default)


class Shared:
    """A model's weights dequantized once for the passes that read them side by side (the reference and its twin, on
    two threads): each matrix is kept until `takers` reads took it, or until clear() (the end of a layer)."""

    def __init__(self, model: Model, takers: int) -> None:
        self.model, self.takers = model, takers
        self._lock = threading.Lock()
        self._slots: dict[tuple[str, np.dtype], list] = {}  # (name, dtype) → [its lock, the matrix, takes left]

    def matrix(self, name: str, dtype=np.float64) -> np.ndarray:
        """Model.matrix(name, dtype), dequantized by the first pass to ask; the others wait for it."""
        key = (name, np.dtype(dtype))
        with self._lock:
            slot = self._slots.setdefault(key, [threading.Lock(), None, self.takers])
        with slot[0]:
            if slot[1] is None:
                slot[1] = self.model.matrix(name, dtype)
            out = slot[1]
            slot[2] -= 1
            if slot[2] == 0:
                with self._lock:
                    self._slots.pop(key, None)
        return out

    def clear(self) -> None:
        """Drop what is still kept at a layer's end (a matrix one pass did not take: it stopped on an error)."""
        with self._lock:
            self._slots.clear()


def load_model(path: str | os.PathLike[str], header: Header | None = None) -> Model:
    """Open a GGUF file (its header read, its tensors memory-mapped) of an architecture the table gives a reference
    forward pass; ModelError (one line naming the file) otherwise."""
    header = header or read_header(path)
    spec = lookup(header.arch)
    if spec is None or spec.forward is None:
        supported = ", ".join(name for name, a in ARCHS.items() if a.forward is not None)
        raise ModelError(str(path), f"unsupported architecture {header.arch!r} (supported: {supported})")
    return Model(path, header, read_hparams(header, spec))
