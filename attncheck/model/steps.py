"""The size of one rounding step of each number format llama.cpp rounds attention values into: what a rounding flip
(a value on the other side of a rounding midpoint than the reference puts it) moves an element by.

x [..., n] holds rows along the last axis (blocks of a quantized format run along it); the result has x's shape."""

from __future__ import annotations

import numpy as np

# relative half-ulp of a value stored in a float cache type (0: nothing is rounded)
UNIT = {"f16": 2.0**-11, "bf16": 2.0**-8, "f32": 0.0}
# per block of 32: what one step of the stored integer is, from the block's absolute max (amax) or range (max - min)
_BLOCK = {"q8_0": ("amax", 127), "q8_1": ("amax", 127), "q4_0": ("amax", 8), "q5_0": ("amax", 16),
          "q4_1": ("range", 15), "q5_1": ("range", 31), "iq4_nl": ("amax", 127 / 24)}


def _blockwise(x: np.ndarray, size: int, f) -> np.ndarray:
    b = np.asarray(x, dtype=np.float64).reshape(*np.shape(x)[:-1], -1, size)
    return np.broadcast_to(f(b), b.shape).reshape(np.shape(x))


def step(x: np.ndarray, fmt: str) -> np.ndarray:
    """One step of fmt at each element of x: an ulp for f16/bf16, the block scale d for the 8-bit and KV block
    types (d = max|x|/127 for Q8_0/Q8_1, /8 for Q4_0, /16 for Q5_0, (max - min)/15 or /31 for Q4_1/Q5_1; IQ4_NL's
    table steps up to 24 of its 127 units), 0 for f32."""
    a = np.abs(np.asarray(x, dtype=np.float32))
    if fmt == "f16":
        return np.spacing(a.astype(np.float16)).astype(np.float64)
    if fmt == "bf16":
        with np.errstate(divide="ignore"):
            e = np.floor(np.log2(np.where(a > 0, a, 1.0)))
        return np.where(a > 0, 2.0 ** (np.maximum(e, -126) - 7), 2.0**-133)
    if fmt == "q8_k":
        return _blockwise(x, 256, lambda b: np.abs(b).max(axis=-1, keepdims=True) / 127)
    if fmt in _BLOCK:
        kind, div = _BLOCK[fmt]
        if kind == "amax":
            return _blockwise(x, 32, lambda b: np.abs(b).max(axis=-1, keepdims=True) / div)
        return _blockwise(x, 32, lambda b: (b.max(axis=-1, keepdims=True) - b.min(axis=-1, keepdims=True)) / div)
    return np.zeros(np.shape(x))
