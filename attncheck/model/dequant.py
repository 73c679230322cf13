"""Stored rows → values, for the reference's matrix products: the legacy block types directly in the dtype asked for
(d·q of an f16 scale and a small integer is exact even in f32; + m is exact in f64), everything else through
gguf.quants' block dequantizers.

The fast paths exist for time: gguf.quants.dequantize works in groups of 16 rows, and its Q4_1 takes 4.7 ms for a
576×1536 weight where this takes 1.7 ms; a 30-layer model holds 210 such matrices, dequantized once per run.
Each block layout is ggml-common.h's (tests/test_weight_arith.py checks them against gguf.quants on every type).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT
import gguf.quants

F64 = np.float64


def _f16(b: np.ndarray, at: int, dtype) -> np.ndarray:
    """The f16 field at byte `at` of each block [n, size] → [n, 1]."""
    return np.ascontiguousarray(b[:, at:at + 2]).view(np.float16).astype(dtype)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, 16] packed bytes → [n, 32]: low nibbles are elements 0..15, high nibbles 16..31."""
    out = np.empty((qs.shape[0], 32), dtype=np.uint8)
    np.bitwise_and(qs, 15, out=out[:, :16])
    np.right_shift(qs, 4, out=out[:, 16:])
    return out


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """[n, 4] bytes of a little-endian u32 → [n, 32] its bits as 0 or 16 (bit j is element j's fifth bit)."""
    bits = np.unpackbits(np.ascontiguousarray(qh), axis=1, bitorder="little")
    return bits * np.uint8(16)


def _scaled(q: np.ndarray, b: np.ndarray, offset: float, dtype, with_min: bool = False) -> np.ndarray:
    """(q − offset)·d (+ m): in place on one array of dtype (exact in f32 without a min: 5 + 11 bits)."""
    out = q.astype(dtype)
    if offset:
        out -= offset
    out *= _f16(b, 0, dtype)
    if with_min:
        out += _f16(b, 2, dtype)
    return out


def _q4_0(b: np.ndarray, dtype) -> np.ndarray:
    return _scaled(_nibbles(b[:, 2:18]), b, 8, dtype)


def _q4_1(b: np.ndarray, dtype) -> np.ndarray:
    return _scaled(_nibbles(b[:, 4:20]), b, 0, dtype, with_min=True)


def _q5_0(b: np.ndarray, dtype) -> np.ndarray:
    return _scaled(_nibbles(b[:, 6:22]) | _high_bits(b[:, 2:6]), b, 16, dtype)


def _q5_1(b: np.ndarray, dtype) -> np.ndarray:
    return _scaled(_nibbles(b[:, 8:24]) | _high_bits(b[:, 4:8]), b, 0, dtype, with_min=True)


def _q8_0(b: np.ndarray, dtype) -> np.ndarray:
    return _scaled(np.ascontiguousarray(b[:, 2:34]).view(np.int8), b, 0, dtype)


FAST = {QT.Q4_0: (18, _q4_0), QT.Q4_1: (20, _q4_1), QT.Q5_0: (22, _q5_0), QT.Q5_1: (24, _q5_1), QT.Q8_0: (34, _q8_0)}


def dequantize(raw: np.ndarray, qtype: QT, dtype=np.float32) -> np.ndarray:
    """Raw rows [rows, bytes] of a tensor of qtype → [rows, elements] of dtype; NotImplementedError when the gguf
    package has no dequantizer for the type."""
    raw = np.ascontiguousarray(raw)
    rows = raw.shape[0]
    if qtype == QT.F32:
        return raw.view(np.float32).astype(dtype, copy=False)
    if qtype == QT.F16:
        return raw.view(np.float16).astype(dtype)
    if qtype in FAST:
        size, f = FAST[qtype]
        return f(raw.reshape(-1, size), dtype).reshape(rows, -1)
    kind = getattr(gguf.quants, qtype.name, None)
    if kind is None or not hasattr(kind, "dequantize_rows"):
        raise NotImplementedError(f"the gguf package has no {qtype.name} dequantizer")
    kind.init_grid()
    return kind.dequantize_rows(raw).reshape(rows, -1).astype(dtype, copy=False)
