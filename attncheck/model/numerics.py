"""ggml-cpu's number formats, as the x86 build that made the dumps rounds into them (ggml/src/ggml-cpu/arch/x86/
quants.c, ggml-quants.c): f16, bf16, the 8-bit blocks a weight MUL_MAT quantizes its activations to (Q8_0, Q8_1,
Q8_K), and the block types a KV cache stores (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL).

Every function takes f32 rows [..., n] (n a multiple of the block) and returns the values they stand for, f32.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize, quantize

F32 = np.float32
U32 = np.uint32
IQ4NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=F32)


def round_f16(x: np.ndarray) -> np.ndarray:
    """f32 → f16 → f32 (ggml's FP32_TO_FP16, round to nearest even); bit for bit numpy's astype, twice as fast."""
    a, r, small, big = _f16_rounded(x)
    out = r.view(F32)
    if small.size:  # f16 subnormals: a fixed step of 2^-24 (the scaling is exact, rint rounds half to even)
        out.flat[small] = np.rint(a.flat[small] * F32(2.0**24)) * F32(2.0**-24)
    if big.size:
        with np.errstate(over="ignore"):
            out.flat[big] = a.flat[big].astype(np.float16).astype(F32)
    return out.reshape(np.shape(x))


def f16_bits(x: np.ndarray) -> np.ndarray:
    """f32 → the bits of its f16 (round to nearest even) as uint16: the index into ggml's f16 lookup tables."""
    a, r, small, big = _f16_rounded(x)
    bits = (r >> U32(16)) & U32(0x8000)
    r &= U32(0x7FFFFFFF)
    r -= U32(112 << 23)  # f32's exponent bias 127, f16's 15
    r >>= U32(13)
    bits |= r
    out = bits.astype(np.uint16)
    odd = np.concatenate([small, big, np.flatnonzero(a == 0)])  # the shift above wraps for zeros
    if odd.size:
        with np.errstate(over="ignore"):
            out.flat[odd] = a.flat[odd].astype(np.float16).view(np.uint16)
    return out.reshape(np.shape(x))


def _f16_rounded(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """x as contiguous f32, its bits rounded to f16's 11-bit significand (uint32; right in f16's normal range), and
    the flat indices outside it: nonzero values below 2^-14 (f16 subnormals), and values rounding to inf, inf, NaN."""
    a = np.ascontiguousarray(x, dtype=F32)
    u = a.view(U32)
    r = u >> U32(13)
    r &= U32(1)
    r += U32(0x0FFF)
    r += u
    r &= U32(0xFFFFE000)
    e = u & U32(0x7FFFFFFF)
    big = np.flatnonzero(e >= U32(0x477FF000))  # 65520 and above round to inf
    e -= U32(1)  # zero wraps to the top
    small = np.flatnonzero(e < U32(0x387FFFFF))
    return a, r, small, big


def round_bf16(x: np.ndarray) -> np.ndarray:
    """f32 → bf16 → f32 (ggml_compute_fp32_to_bf16: round to nearest even; NaN kept)."""
    u = np.ascontiguousarray(x, dtype=F32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    out = r.astype(np.uint32).view(F32)
    return np.where(np.isnan(x), x, out).astype(F32)


def _blocks(x: np.ndarray, size: int) -> np.ndarray:
    """[..., n] → [..., n / size, size] in f32."""
    return np.asarray(x, dtype=F32).reshape(*np.shape(x)[:-1], -1, size)


def _q8_blocks(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """quantize_row_q8_0 and _q8_1 (x86): d = max|x|/127 in f32, q = round_half_even(x · 127/max|x|).

    Returns the blocks [..., nb, 32], the integer quants q and d (f32, before its f16 rounding)."""
    b = _blocks(x, 32)
    amax = np.abs(b).max(axis=-1, keepdims=True)
    d = (amax / F32(127)).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inv = np.where(amax != 0, F32(127) / amax, F32(0)).astype(F32)
        q = np.rint((b * inv).astype(F32))
    q = np.where(np.isfinite(q), q, 0)  # inv overflows only where d underflows: the block is 0
    return b, q, d


def q8_0(x: np.ndarray) -> np.ndarray:
    """Activations (and a Q8_0 KV cache) rounded to Q8_0 blocks of 32: q · f16(d)."""
    _, q, d = _q8_blocks(x)
    return (q * round_f16(d)).reshape(np.shape(x)).astype(F32)


def q8_1(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Activations rounded to Q8_1 blocks of 32 (Q4_1 and Q5_1 weights): the values q · f16(d), and per block
    [..., nb] how far the stored block sum s = f16(d · Σq) lies from f16(d) · Σq — vec_dot_q4_1_q8_1 multiplies
    the weight's min by s, where a dequantized product would use f16(d) · Σq."""
    _, q, d = _q8_blocks(x)
    d16 = round_f16(d)
    total = q.sum(axis=-1, keepdims=True)
    s = round_f16((d * total).astype(F32))
    err = (s.astype(np.float64) - d16.astype(np.float64) * total)[..., 0]
    return (q * d16).reshape(np.shape(x)).astype(F32), err


def q8_k(x: np.ndarray) -> np.ndarray:
    """Activations rounded to Q8_K blocks of 256 (K-quant and IQ weights; quantize_row_q8_K_ref): the signed max
    (first of the largest |x|) gives iscale = -127/max, q = min(127, round_half_even(iscale · x)), d = 1/iscale."""
    b = _blocks(x, 256)
    i = np.abs(b).argmax(axis=-1)[..., None]
    mx = np.take_along_axis(b, i, axis=-1)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        iscale = np.where(mx != 0, F32(-127) / mx, F32(0)).astype(F32)
        d = np.where(iscale != 0, F32(1) / iscale, F32(0)).astype(F32)
        q = np.minimum(127, np.rint((b * iscale).astype(F32)))
        return (q * d).reshape(np.shape(x)).astype(F32)


def iq4_nl(x: np.ndarray) -> np.ndarray:
    """quantize_row_iq4_nl_ref (ntry -1, weights x²): d = max/-127, each x to the nearest table value of x/d (ties
    up), then the least-squares scale Σw q x / Σw q² (summed in order, f32) stored as f16."""
    b = _blocks(x, 32)
    i = np.abs(b).argmax(axis=-1)[..., None]
    mx = np.take_along_axis(b, i, axis=-1)[..., 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        d0 = (mx / F32(-127)).astype(F32)
        inv = np.where(d0 != 0, F32(1) / d0, F32(0)).astype(F32)
    al = (b * inv[..., None]).astype(F32)
    v = IQ4NL_VALUES
    mu = np.clip(np.searchsorted(v, al, side="right"), 1, 15)  # v[mu-1] <= al < v[mu]
    lo, hi = v[mu - 1], v[mu]
    q = np.where(al <= v[0], v[0], np.where(al >= v[-1], v[-1], np.where(al - lo < hi - al, lo, hi))).astype(F32)
    sumqx = np.zeros(b.shape[:-1], F32)
    sumq2 = np.zeros(b.shape[:-1], F32)
    for j in range(32):
        w = (b[..., j] * b[..., j]).astype(F32)
        wq = (w * q[..., j]).astype(F32)
        sumqx = (sumqx + (wq * b[..., j]).astype(F32)).astype(F32)
        sumq2 = (sumq2 + (wq * q[..., j]).astype(F32)).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.where(sumq2 > 0, sumqx / sumq2, F32(0)).astype(F32)
    d = np.where(np.abs(mx) < F32(1e-15), F32(0), d)
    return (q * round_f16(d)[..., None]).reshape(np.shape(x)).astype(F32)


# KV cache types whose SET_ROWS uses ggml's reference quantizers (ggml-cpu/quants.c), which gguf.quants reproduces
_GGUF_EXACT = {"q4_0": QT.Q4_0, "q4_1": QT.Q4_1, "q5_0": QT.Q5_0, "q5_1": QT.Q5_1}
KV_TYPES = ("f16", "bf16", "f32", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")
KV_QT = {"f16": QT.F16, "bf16": QT.BF16, "f32": QT.F32, "q8_0": QT.Q8_0, "iq4_nl": QT.IQ4_NL, **_GGUF_EXACT}


def store(x: np.ndarray, kv_type: str) -> tuple[np.ndarray, np.ndarray | None]:
    """Rows as a KV cache of kv_type stores them: (the values, and for Q4_1/Q5_1 the block mins [..., nb] that a
    Q8_1 dot product multiplies by the activation's block sum; None for the other types)."""
    if kv_type == "f32":
        return np.asarray(x, dtype=F32), None
    if kv_type == "f16":
        return round_f16(x), None
    if kv_type == "bf16":
        return round_bf16(x), None
    if kv_type == "q8_0":
        return q8_0(x), None
    if kv_type == "iq4_nl":
        return iq4_nl(x), None
    qt = _GGUF_EXACT[kv_type]
    flat = np.ascontiguousarray(x, dtype=F32).reshape(-1, np.shape(x)[-1])
    raw = quantize(flat, qt)
    values = dequantize(raw, qt).reshape(np.shape(x)).astype(F32)
    return values, (block_mins(raw, qt).reshape(*np.shape(x)[:-1], -1) if qt in (QT.Q4_1, QT.Q5_1) else None)


def block_mins(raw: np.ndarray, qtype: QT) -> np.ndarray:
    """The f16 min m of each Q4_1/Q5_1 block of raw rows [rows, bytes] → [rows, nb] (bytes 2..3 of each block)."""
    size = {QT.Q4_1: 20, QT.Q5_1: 24}[qtype]
    blocks = np.ascontiguousarray(raw).reshape(raw.shape[0], -1, size)
    return np.ascontiguousarray(blocks[:, :, 2:4]).view(np.float16)[..., 0].astype(F32)
