"""A MUL_MAT as ggml-cpu computes it for its src0's storage type (ggml-cpu.c type_traits_cpu[type].vec_dot_type).

src1 (the activation) is converted to the vec_dot_type first, then each dot product combines the two as the type's
vec_dot does:
- F32 weights: f32 activations, as they are;
- F16 → f16, BF16 → bf16 activations;
- Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4 → Q8_0 blocks of 32 (f16 scale); d_w·d_x·Σ q_w q_x per block;
- Q4_1, Q5_1 → Q8_1 blocks (f16 scale and f16 block sum s): d_w·d_x·Σ q_w q_x + m_w·s per block, so the weight's
  min multiplies the f16-rounded block sum, not Σ of the rounded activations (numerics.q8_1);
- K-quants, IQ2/IQ3/IQ1, IQ4_XS → Q8_K blocks of 256 (f32 scale; the 16-element integer sums the kernels use for
  the mins are exact).
Beyond these conversions every product is exact and only the f32 summation order differs (the reference sums in
f64): the llamafile, repack and vec_dot kernels of one type agree up to that.
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QT

from . import numerics
from .weights import Model, Shared

F32 = np.float32
F64 = np.float64
Q8_1_TYPES = (QT.Q4_1, QT.Q5_1)
# What a MUL_MAT with an f16 src0 does to a contiguous f32 src1: "convert" it to f16 first (ggml-cpu today), or keep
# it "f32" (2024 builds called llamafile's tinyBLAS with the f32 src1 first, and its F16 kernels take f32 B).
F16_SRC1 = ("convert", "f32")


def vec_dot_type(qtype: QT) -> str:
    """The format a weight of qtype converts its activations to: f32, f16, bf16, q8_0, q8_1 or q8_k."""
    if qtype == QT.F32:
        return "f32"
    if qtype == QT.F16:
        return "f16"
    if qtype == QT.BF16:
        return "bf16"
    if qtype in Q8_1_TYPES:
        return "q8_1"
    return "q8_k" if GGML_QUANT_SIZES[qtype][0] == 256 else "q8_0"


def convert(x: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray | None]:
    """x [..., n] in the vec_dot format fmt: (the values, and for q8_1 the block-sum errors [..., n / 32])."""
    if fmt == "q8_1":
        return numerics.q8_1(x)
    f = {"f32": lambda a: np.asarray(a, F32), "f16": numerics.round_f16, "bf16": numerics.round_bf16,
         "q8_0": numerics.q8_0, "q8_k": numerics.q8_k}[fmt]
    return f(x), None


def converted(x: np.ndarray, fmt: str, dtype, memo: dict | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """convert(x, fmt), its values as dtype; memo ({(fmt, dtype): (x, the conversion)}, one x each) keeps it for the
    next MUL_MAT of the same x and format (q, k and v, or gate and up, read one x: ggml-cpu converts it for each,
    to the same values)."""
    got = memo.get((fmt, dtype)) if memo is not None else None
    if got is not None and got[0] is x:
        return got[1]
    xc, s_err = convert(x, fmt)
    out = (xc.astype(dtype, copy=False), s_err)
    if memo is not None:
        memo[(fmt, dtype)] = (x, out)
    return out


def dot(x: np.ndarray, w: np.ndarray, fmt: str, mins: np.ndarray | None = None, memo: dict | None = None
        ) -> np.ndarray:
    """x [..., T, n] · w [..., m, n]ᵀ → [..., T, m] (f32) as ggml-cpu computes it with activations converted to fmt;
    mins [..., m, n / 32]: the block mins of a Q4_1/Q5_1 src0 (its Q8_1 block-sum term). The sums are exact (f64)
    for a float64 w, f32 (BLAS) for a float32 one. memo: converted()'s."""
    dtype = F64 if w.dtype == F64 else F32
    xc, s_err = converted(x, fmt, dtype, memo)
    y = np.matmul(xc, np.swapaxes(w, -1, -2).astype(dtype, copy=False))
    if s_err is not None and mins is not None:
        y = y + np.matmul(s_err, np.swapaxes(mins, -1, -2).astype(F64)).astype(dtype)
    return y.astype(F32, copy=False)


def weight_matmul(model: Model, name: str, x: np.ndarray, f16_src1: str = "convert", exact: bool = True,
                  memo: dict | None = None, weights: Shared | None = None) -> np.ndarray:
    """MUL_MAT(weight, x) for x [T, n_in] → [T, n_out], the weight dequantized for this call only, or taken from
    `weights` (shared by the passes that read it); exact: sums in f64 (layer 0, held to print precision), else in f32
    (deeper layers, held to the cascade allowance: 3x faster). memo: converted()'s."""
    qtype = model.tensor_type(name)
    fmt = "f32" if (qtype == QT.F16 and f16_src1 == "f32") else vec_dot_type(qtype)
    mins = numerics.block_mins(model.raw(name), qtype) if qtype in Q8_1_TYPES else None
    dtype = F64 if exact else F32
    w = weights.matrix(name, dtype) if weights is not None else model.matrix(name, dtype)
    return dot(x, w, fmt, mins, memo)


def weight_rows(model: Model, name: str, x: np.ndarray, rows: np.ndarray, f16_src1: str = "convert") -> np.ndarray:
    """Only the output entries `rows` of MUL_MAT(weight, x): [T, len(rows)] (the logits the dump prints)."""
    qtype = model.tensor_type(name)
    fmt = "f32" if (qtype == QT.F16 and f16_src1 == "f32") else vec_dot_type(qtype)
    mins = numerics.block_mins(model.raw(name)[rows], qtype) if qtype in Q8_1_TYPES else None
    return dot(x, model.rows(name, rows, np.float64), fmt, mins)
