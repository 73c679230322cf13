"""One layer's attention in the reference: build_attn and build_attn_mha of llama.cpp's graph (src/llama-graph.cpp)
over one causal sequence at positions 0..T-1, the MUL_MAT path (kq, SOFT_MAX, P·V). Under flash attention it stays the
attention nodes' reference, FLASH_ATTN_EXT's own arithmetic an error term (expect.py flash()); what reads the kernel's
output reads it as the kernel computed it (flash.py).

q is scaled before kq where the family pre-scales it (gemma, phi3: a SCALE node). With a quantized K cache llama.cpp
rotates q and k by an orthonormal Walsh-Hadamard matrix before the cache (attn_inp_k_rot, n = the largest power of two
>= 64 dividing D_h), and with a quantized V cache V by a 64×64 one, un-rotating the attention output before the output
projection (llama-kv-cache.cpp build_input_k_rot/_v_rot; ggml-cpu computes these MUL_MATs as a fast Walsh-Hadamard
transform, emulated exactly). K and V are stored as the cache type stores them (numerics.store); kq converts q to
the K type's vec_dot format, MUL_MAT(v, P) converts P to the V type's (f16 today; none with a quantized V, which only
flash attention reads, in f32). Scores are soft-capped (gemma2), scaled, masked (causal, and the sliding window on the
layers that have one) and normalised as ggml's SOFT_MAX does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import blocks, matmul, numerics
from .hparams import Hparams

F32 = np.float32
F64 = np.float64
QUANTIZED = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")


@dataclass(frozen=True)
class Cache:
    """How the KV cache stores K and V: their types, and the Hadamard rotation sizes (0: none)."""

    k_type: str = "f16"
    v_type: str = "f16"
    k_rot: int = 0
    v_rot: int = 0

    @staticmethod
    def of(k_type: str, v_type: str, d_k: int, d_v: int, rotates: bool = True) -> "Cache":
        """llama.cpp's rule: K is rotated when its type is quantized and D_k % 64 == 0 (by the largest power of two
        dividing D_k), V likewise by 64; builds before the rotation (2024's) never rotate (rotates False)."""
        k_rot = 0
        if not rotates:
            return Cache(k_type, v_type, 0, 0)
        if k_type in QUANTIZED and d_k % 64 == 0:
            k_rot = 64
            while d_k % (k_rot * 2) == 0:
                k_rot *= 2
        v_rot = 64 if v_type in QUANTIZED and d_v % 64 == 0 else 0
        return Cache(k_type, v_type, k_rot, v_rot)


def hadamard(x: np.ndarray, n: int) -> np.ndarray:
    """x [..., D] with every n consecutive elements rotated by the orthonormal Walsh-Hadamard matrix, as
    ggml_compute_forward_fwht: x · f32(1/sqrtf(n)), then butterflies (u + v, u − v) over pairs len = 1, 2, 4, ..."""
    shape = x.shape
    a = (np.asarray(x, F32) * (F32(1) / np.sqrt(F32(n)))).astype(F32).reshape(-1, n)
    length = 1
    while length < n:
        b = a.reshape(a.shape[0], n // (2 * length), 2, length)
        u, v = b[:, :, 0], b[:, :, 1]
        a = np.stack([(u + v).astype(F32), (u - v).astype(F32)], axis=2).reshape(-1, n)
        length *= 2
    return a.reshape(shape)


def _mask(t: int, hp: Hparams, layer: int) -> np.ndarray:
    """[T, T] True where query t may read slot j: causal, and inside the window on windowed layers."""
    pos = np.arange(t)
    visible = pos[None, :] <= pos[:, None]
    w = hp.window
    if w is not None and layer in w.layers:
        visible &= ~w.masks(pos, pos)
    return visible


def softmax(s: np.ndarray, visible: np.ndarray, kq_scale: float) -> np.ndarray:
    """ggml SOFT_MAX: x·scale + mask (0 or -inf), max subtracted, expf, summed in double, times 1/sum."""
    x = np.where(visible, (s * F32(kq_scale)).astype(F32), F32(-np.inf))
    e = np.exp(x - x.max(axis=-1, keepdims=True)).astype(F32)
    return (e * (1.0 / e.astype(F64).sum(axis=-1, keepdims=True)).astype(F32)).astype(F32)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, hp: Hparams, layer: int, cache: Cache,
              f16_src1: str = "convert", exact: bool = True, q_exact: np.ndarray | None = None
              ) -> dict[str, np.ndarray]:
    """q [T, H, D_k] (after RoPE), k [T, H_kv, D_k], v [T, H_kv, D_v] → the layer's attention nodes (sums in f64
    when exact, else f32); q_exact [T]: the queries whose q kq takes as f32 under f16_src1 "f32" (below):

    q (what kq reads) [T, H, D_k]; k_rot, v_rot [T, H_kv, D] (rotated, when rotated); k_view [H_kv, T, D_k];
    v_view [H_kv, D_v, T]; kq, kq_scores, kq_soft_max [H, T, T]; kqv [H, T, D_v]; kqv_out [T, H·D_v] (in V's
    rotated basis when V is rotated); kqv_unrot [T, H·D_v] (the output projection's input).
    """
    t, h, _ = q.shape
    group = h // hp.n_head_kv
    out: dict[str, np.ndarray] = {}
    if hp.q_scale is not None:
        q = out["q_scaled"] = blocks.scale(q, hp.q_scale)
    if cache.k_rot:
        q, k = hadamard(q, cache.k_rot), hadamard(k, cache.k_rot)
        out["k_rot"] = k
    if cache.v_rot:
        v = hadamard(v, cache.v_rot)
        out["v_rot"] = v
    out["q"] = q
    k_st, k_mins = numerics.store(k, cache.k_type)  # [T, H_kv, D]
    v_st, _ = numerics.store(v, cache.v_type)
    out["k_view"] = k_st.transpose(1, 0, 2)
    out["v_view"] = v_st.transpose(1, 2, 0)
    k_fmt = matmul.vec_dot_type(numerics.KV_QT[cache.k_type])
    sums = F64 if exact else F32  # exact sums where the error model is derived (layer 0)
    kh = np.repeat(out["k_view"], group, axis=0).astype(sums)  # query head i reads KV head i // group
    mins = None if k_mins is None else np.repeat(k_mins.transpose(1, 0, 2), group, axis=0)
    kq = matmul.dot(q.transpose(1, 0, 2), kh, k_fmt, mins)  # [H, T, T]
    if cache.k_type == "f16" and f16_src1 == "f32" and q_exact is not None and q_exact.any():
        # q before k·q is a permuted view: converted to f16, but where the view is contiguous (an evaluation of one
        # query), which a 2024 build's tinyBLAS multiplied as f32
        kq[:, q_exact] = matmul.dot(q.transpose(1, 0, 2)[:, q_exact], kh, "f32")
    out["kq"] = kq
    scores = kq
    if hp.softcap:  # blocks.softcap node by node: SCALE(1/cap), TANH, SCALE(cap)
        out["kq_scores@scaled"] = blocks.scale(kq, float(F32(1) / F32(hp.softcap)))
        out["kq_scores@tanh"] = np.tanh(out["kq_scores@scaled"]).astype(F32)
        scores = blocks.scale(out["kq_scores@tanh"], hp.softcap)
    out["kq_scores"] = scores
    p = softmax(scores, _mask(t, hp, layer)[None], hp.kq_scale)
    out["kq_soft_max"] = p
    p_fmt = "f32"
    if cache.v_type in ("f16", "bf16") and not (cache.v_type == "f16" and f16_src1 == "f32"):
        p_fmt = cache.v_type
    vh = np.repeat(out["v_view"], group, axis=0).astype(sums)  # [H, D_v, T]
    kqv = matmul.dot(p, vh, p_fmt)  # [H, T, D_v]
    out["kqv"] = kqv
    merged = np.ascontiguousarray(kqv.transpose(1, 0, 2)).reshape(t, -1)
    out["kqv_out"] = merged
    out["kqv_unrot"] = hadamard(merged, cache.v_rot) if cache.v_rot else merged
    return out
