"""A GGUF file's header, read without its weights: the metadata, each tensor's name, type, shape and offset, and
small tensors on demand (attention sinks). Reading the header of a 100 MB model takes milliseconds; the `gguf`
package's GGUFReader maps every tensor and field first, which is what model/weights.py needs but facts do not.

Format (ggml/docs/gguf.md): magic "GGUF", version, tensor count, KV count; KV pairs (key string, value type,
value); tensor infos (name, n_dims, ne[n_dims], ggml type, offset); data aligned to general.alignment (32).
"""
from __future__ import annotations

import math
import mmap
import os
import stat
import struct
from dataclasses import dataclass, field
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import ModelError, printable
from .gguf_keys import VERSIONS, bad_key

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NP = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32, 7: np.bool_,
       10: np.uint64, 11: np.int64, 12: np.float64}
STRING, ARRAY = 8, 9
F32, F16 = 0, 1  # ggml types of the small tensors read here
KEEP_STRINGS = ("tokenizer.ggml.tokens",)  # string arrays kept (token text, decoded on demand); others are skipped
_U64 = struct.Struct("<Q")
MAX_DIMS = 4  # GGML_MAX_DIMS


class Strings(Sequence):
    """A GGUF string array kept as its bytes and offsets; an entry is decoded when it is read (a vocabulary of
    262,144 tokens costs milliseconds, not the half second of decoding every entry)."""

    def __init__(self, data: bytes, starts: np.ndarray, ends: np.ndarray):
        self._data, self._starts, self._ends = data, starts, ends

    def __len__(self) -> int:
        return len(self._starts)

    def __getitem__(self, i: int) -> str:
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        return self._data[int(self._starts[i]):int(self._ends[i])].decode("utf-8", "replace")

    def __iter__(self):
        return (self[i] for i in range(len(self)))


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ne: tuple[int, ...]
    type: int  # ggml_type
    offset: int  # from the start of the data section


@dataclass
class Header:
    path: str
    meta: dict[str, Any] = field(default_factory=dict)
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    data_start: int = 0

    @property
    def arch(self) -> str | None:
        return self.meta.get("general.architecture")

    def tensor(self, name: str) -> np.ndarray | None:
        """A small F32/F16 tensor's values as float64, or None when the file has no such tensor."""
        t = self.tensors.get(name)
        if t is None:
            return None
        if t.type not in (F32, F16):
            raise ModelError(self.path, f"{name} is of ggml type {t.type}, not f32 or f16")
        n = int(np.prod(t.ne))
        dtype = np.float32 if t.type == F32 else np.float16
        with open(self.path, "rb") as f:
            f.seek(self.data_start + t.offset)
            raw = f.read(n * np.dtype(dtype).itemsize)
        return np.frombuffer(raw, dtype=dtype).astype(np.float64)


class _Cursor:
    def __init__(self, buf, path: str):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise ModelError(self.path, "the GGUF header ends early (a truncated file?)")
        out = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return out[0] if len(out) == 1 else out

    def string(self) -> str:
        n = self.take("<Q")
        if self.pos + n > len(self.buf):
            raise ModelError(self.path, "the GGUF header ends early (a truncated file?)")
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", "replace")
        self.pos += n
        return s

    def strings(self, n: int, keep: bool) -> "Strings | int":
        """n strings from the cursor: kept as a Strings, or skipped (their count)."""
        buf, pos, size = self.buf, self.pos, len(self.buf)
        start = pos
        starts = np.empty(n, dtype=np.int64) if keep else None
        unpack = _U64.unpack_from
        for i in range(n):
            if pos + 8 > size:
                raise ModelError(self.path, "the GGUF header ends early (a truncated file?)")
            length = unpack(buf, pos)[0]
            pos += 8
            if keep:
                starts[i] = pos - start
            pos += length
        if pos > size:
            raise ModelError(self.path, "the GGUF header ends early (a truncated file?)")
        self.pos = pos
        if not keep:
            return n
        data = bytes(buf[start:pos])
        ends = np.empty(n, dtype=np.int64)
        if n:
            ends[:-1] = starts[1:] - 8
            ends[-1] = pos - start
        return Strings(data, starts, ends)

    def value(self, vtype: int, key: str) -> Any:
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            etype, n = self.take("<I"), self.take("<Q")
            if etype == ARRAY or (etype not in _NP and etype != STRING):  # gguf.cpp reads no array of arrays
                raise ModelError(self.path, f"metadata key {printable(key)}: an array of GGUF type {etype}")
            least = np.dtype(_NP[etype]).itemsize if etype in _NP else 8  # a string: its length at least
            if n > (len(self.buf) - self.pos) // least:  # before reading any: a count may claim 2^62 elements
                raise ModelError(self.path, f"metadata key {printable(key)}: an array of {n} elements does not fit "
                                            "in the file")
            if etype in _NP:
                size = np.dtype(_NP[etype]).itemsize * n
                arr = np.frombuffer(self.buf, dtype=_NP[etype], count=n, offset=self.pos).copy()
                self.pos += size
                return arr.tolist() if n <= 4096 else arr
            return self.strings(n, key in KEEP_STRINGS)
        raise ModelError(self.path, f"unknown GGUF value type {vtype} for key {printable(key)!r}")


def read_header(path: str | os.PathLike[str]) -> Header:
    """The header of a GGUF file; ModelError (one line naming the file) when it is not one."""
    path = str(path)
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # opening a FIFO would wait for a writer
            raise ModelError(path, "not a regular file (a model is a GGUF file)")
        with open(path, "rb") as f:
            try:
                buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError:  # an empty file cannot be mapped
                raise ModelError(path, "not a GGUF file (empty)") from None
    except OSError as e:
        raise ModelError(path, f"cannot read: {e.strerror}") from None
    try:
        if buf[:4] != b"GGUF":
            raise ModelError(path, "not a GGUF file (no GGUF magic at its start)")
        c = _Cursor(buf, path)
        c.pos = 4
        version, n_tensors, n_kv = c.take("<I"), c.take("<Q"), c.take("<Q")
        if version not in VERSIONS:
            raise ModelError(path, f"GGUF version {version}: llama.cpp reads versions "
                                   f"{', '.join(map(str, VERSIONS))}")
        h = Header(path)
        for _ in range(n_kv):  # each takes bytes of the file: a count beyond it ends in "ends early"
            key = c.string()
            h.meta[key] = c.value(c.take("<I"), key)
        why = bad_key(h.meta)
        if why:
            raise ModelError(path, why)
        for _ in range(n_tensors):
            name = c.string()
            n_dims = c.take("<I")
            if n_dims > MAX_DIMS:
                raise ModelError(path, f"tensor {printable(name)!r} has {n_dims} dimensions (at most {MAX_DIMS})")
            ne = tuple(c.take("<Q") for _ in range(n_dims))
            if math.prod(ne) >= 2**63:
                raise ModelError(path, f"tensor {printable(name)!r} has 2^63 elements or more")
            h.tensors[name] = TensorInfo(name, ne, c.take("<I"), c.take("<Q"))
        align = int(h.meta.get("general.alignment", 32))
        h.data_start = (c.pos + align - 1) // align * align
        return h
    finally:
        buf.close()
