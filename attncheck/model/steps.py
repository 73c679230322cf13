"""The size of one rounding step of each number format llama.cpp rounds attention values into: what a value rounded
the other way (on the other side of a rounding midpoint than the reference's) moves by; and deviation(): how far a
value within some noise of the reference's can round from it.

x [..., n] holds rows along the last axis (blocks of a quantized format run along it); the result has x's shape."""

from __future__ import annotations

import numpy as np

from .numerics import round_bf16, round_f16

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


# ---- rounding under noise: how far the value llama.cpp stores can lie from the reference's -------------------------

U32 = 2.0**-24
_FLOATS = {"f16": (10, -14), "bf16": (7, -126)}  # mantissa bits, smallest normal exponent
# block formats of an integer grid: block size, how the scale d is found (and its divisor), the origin of the grid
# (0, or the block's min for the _1 types), and whether d (and the min) are stored as f16
_GRIDS = {"q8_0": (32, "amax", 127, True), "q8_1": (32, "amax", 127, True), "q8_k": (256, "amax", 127, False),
          "q4_0": (32, "amax", 8, True), "q5_0": (32, "amax", 16, True),
          "q4_1": (32, "range", 15, True), "q5_1": (32, "range", 31, True)}


def float_deviation(x: np.ndarray, noise: np.ndarray, fmt: str = "f16") -> np.ndarray:
    """For each element: the most that rounding a value within `noise` of x into f16/bf16 can differ from rounding x
    itself. 0 where no rounding midpoint lies within the noise of x (both round alike); else whole steps, at most
    floor(noise/step + 1) of them. Found exactly from x: the reference's value says where its midpoints are."""
    mant, emin = _FLOATS[fmt]
    a = np.abs(np.asarray(x, np.float64))
    n = np.asarray(noise, np.float64)
    r = np.abs(np.asarray(round_to(x, fmt), np.float64))
    m, e = np.frexp(np.maximum(r, 2.0**emin))  # r = m·2^e, m in [0.5, 1): |r| lies in [2^(e-1), 2^e)
    e -= 1
    hi = np.ldexp(1.0, e - mant)  # the step above |r|
    lo = np.where((m == 0.5) & (r > 0) & (e > emin), hi / 2, hi)  # the step below it: half at a power of two
    n, a, hi, lo = np.broadcast_arrays(n, a, hi, lo)
    r = np.broadcast_to(r, a.shape)
    near = np.flatnonzero(((a + n >= r + hi / 2) | (a - n <= r - lo / 2)) & (n > 0))
    out = np.zeros(a.shape)
    out.flat[near] = hi.flat[near] * np.floor(n.flat[near] / lo.flat[near] + 1)  # few elements: most lie clear
    return out


def q8_1_sum_deviation(x: np.ndarray, noise: np.ndarray, dev: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x [..., n] converted to Q8_1 blocks of 32 within `noise` of the reference's, dev its elements' deviation
    (deviation(x, noise, "q8_1")) → [..., n / 32] twice: the most the stored block sum s = f16(d·Σq) can differ from
    the reference's, and the noise of d·Σq it was found from. d·Σq moves by Σ dev (integers flipped), by |d·Σq|
    times d's own relative noise (the block's largest |x| within its noise) and by the f32 roundings of d and the
    product; where an f16 midpoint lies within that, s steps to the next f16 (Δs of one ulp: 2^-6 at s = 20, times
    the min of every Q4_1/Q5_1 block it multiplies)."""
    b = np.asarray(x, np.float64).reshape(*np.shape(x)[:-1], -1, 32)
    nb = np.broadcast_to(np.asarray(noise, np.float64), np.shape(x)).reshape(b.shape)
    i = np.abs(b).argmax(axis=-1)[..., None]
    amax = np.abs(np.take_along_axis(b, i, axis=-1))[..., 0]
    d = amax / 127
    with np.errstate(divide="ignore", invalid="ignore"):
        q_sum = np.abs(np.rint(b / np.where(d > 0, d, 1.0)[..., None]).sum(-1))
        rel = np.where(amax > 0, np.take_along_axis(nb, i, axis=-1)[..., 0] / np.where(amax > 0, amax, 1.0), 0.0)
    s_noise = np.asarray(dev, np.float64).reshape(b.shape).sum(-1) + q_sum * d * (rel + 8 * U32)
    return float_deviation(d * q_sum, s_noise), s_noise


def round_to(x: np.ndarray, fmt: str) -> np.ndarray:
    """x rounded to f16 or bf16 (as f32)."""
    return round_f16(x) if fmt == "f16" else round_bf16(x)


def deviation(x: np.ndarray, noise: np.ndarray, fmt: str) -> np.ndarray:
    """x [..., n] (rows along the last axis, blocks along it): the most that llama.cpp's value of each element,
    converted to fmt, can differ from the reference's conversion of x, when llama.cpp's unconverted value lies within
    `noise` of x (elementwise). f32 keeps the noise; f16/bf16: float_deviation; an integer block grid (Q8_0, Q8_1,
    Q8_K, Q4_0, Q5_0, Q4_1, Q5_1): an element moves only where its place on the grid, x/d from the block's origin, lies
    within the noise (in grid units, the scale's own noise included) of a rounding midpoint, and then by whole steps d;
    the block's f16 scale (and min) can round the other way too, moving every element of the block by |q|·that step.
    IQ4_NL (a table, and a least-squares scale) is taken to move every element by two of its largest steps."""
    n = np.asarray(noise, np.float64)
    if fmt == "f32":
        return np.broadcast_to(n, np.shape(x)).astype(np.float64)
    if fmt in _FLOATS:
        return float_deviation(x, n, fmt)
    if fmt not in _GRIDS:
        return 2 * step(x, fmt) + n
    size, kind, div, f16_scale = _GRIDS[fmt]
    shape = np.shape(x)
    b = np.asarray(x, np.float64).reshape(*shape[:-1], -1, size)
    nb = np.broadcast_to(n, shape).reshape(b.shape)
    if kind == "amax":
        i = np.abs(b).argmax(axis=-1)[..., None]
        ref = np.abs(np.take_along_axis(b, i, axis=-1))  # the block's scale source
        ref_noise = np.take_along_axis(nb, i, axis=-1)
        origin, origin_noise = np.zeros_like(ref), np.zeros_like(ref)
    else:
        lo_i, hi_i = b.argmin(axis=-1)[..., None], b.argmax(axis=-1)[..., None]
        origin = np.take_along_axis(b, lo_i, axis=-1)
        origin_noise = np.take_along_axis(nb, lo_i, axis=-1)
        ref = np.take_along_axis(b, hi_i, axis=-1) - origin
        ref_noise = origin_noise + np.take_along_axis(nb, hi_i, axis=-1)
    d = ref / div
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(ref > 0, ref_noise / np.where(ref > 0, ref, 1.0), 0.0)  # the scale's own noise
        rel = rel + U32 * (rel > 0)  # and its division's rounding, once the inputs differ
        u = np.where(d > 0, (b - origin) / np.where(d > 0, d, 1.0), 0.0)  # the place on the grid
        nu = np.where(d > 0, (nb + origin_noise) / np.where(d > 0, d, 1.0), 0.0) + np.abs(u) * rel
    to_mid = 0.5 - np.abs(u - np.rint(u))
    dev = np.where((to_mid <= nu) & (nu > 0), d * np.floor(nu + 1), 0.0)
    if f16_scale:  # the stored scale (and min) rounded to f16 the other way: the whole block moves
        dev = dev + (np.abs(np.rint(u)) + 1) * float_deviation(d, d * rel)
        if kind == "range":
            dev = dev + float_deviation(origin, origin_noise)
    return dev.reshape(shape)
