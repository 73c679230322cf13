"""FLASH_ATTN_EXT's output as ggml-cpu's kernels compute it (ggml/src/ggml-cpu/ops.cpp), for the nodes that read it.

The attention nodes keep the reference of the MUL_MAT path (kq, softmax, P·V: attention.py) and are held to it with the
kernel's error bound (expect.py flash()). The output projection and everything after it read what the kernel returned,
and the kernels differ from the MUL_MAT path by more than f32 rounding: the one-chunk kernel with an f16 V rounds its
accumulator to f16 after every key, which moves the output by up to ~1e-3 on a prompt of 100 keys; the rest of the
layer carries that into ffn_out ~10 times larger. So the reference continues from the kernel's output, computed as the
kernel computes it, as it emulates the other conversions llama.cpp makes (reference.py).

Which kernel ran depends on the ubatch and the cache (ggml_compute_forward_flash_attn_ext_f16); KERNELS names them.
Today's builds cast an f32 K or V to f16 before the op (src/llama-graph.cpp build_attn_mha); 2024's pass them as they
are and have the one-chunk kernel only. A single-query ubatch over >= 512 slots (today's split-KV path: one chunk of
slots per thread, reduced in f32) is taken as one chunk over the whole row.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import matmul
from .attention import Cache, _mask, hadamard, softmax
from .hparams import Hparams
from .numerics import KV_QT, round_f16

F32 = np.float32
F64 = np.float64
TILE_Q = 64  # GGML_FA_TILE_Q (ggml-cpu/common.h): the tiled kernel takes ubatches of at least this many queries
KERNELS = {
    "tiled": "today's tiled kernel (>= 64 queries, K and V both f16 or f32): scores of the f32 q, P·V in f32",
    "f16": "the one-chunk kernel with an f16 V: the online softmax's Σ e^(s-M)·V accumulated in f16, rounded per key",
    "f32": "the one-chunk kernel with another V type: the same sum in f32 over V dequantized (P unrounded)",
}


@dataclass(frozen=True)
class Plan:
    """Which kernel computed each query position's output ([T_all]: a KERNELS key, "" where no flash attention ran),
    and whether the build casts an f32 K and V to f16 first (today's)."""

    kernels: tuple[str, ...]
    casts: bool


def kernel(T: int, k_type: str, v_type: str, today: bool) -> str:
    """The kernel an ubatch of T queries ran (a KERNELS key) for these cache types, in today's build or 2024's."""
    if today:
        k_type, v_type = ("f16" if t == "f32" else t for t in (k_type, v_type))
        if T >= TILE_Q and k_type == v_type and k_type in ("f16", "f32"):
            return "tiled"
    return "f16" if v_type == "f16" else "f32"


def plan(n_tokens: int, spans: list[tuple[int, int]], k_type: str, v_type: str, today: bool) -> Plan:
    """The Plan of a run of n_tokens from the (n_past, T) of its flash evaluations seen so far; positions after the
    last one continue in ubatches of its T (the size llama.cpp splits a prompt into)."""
    codes = [""] * n_tokens
    for n_past, t in spans:
        for p in range(n_past, min(n_past + t, n_tokens)):
            codes[p] = kernel(t, k_type, v_type, today)
    if spans:
        n_past, t = max(spans)
        at = n_past + t
        while at < n_tokens:
            size = min(t, n_tokens - at)
            codes[at:at + size] = [kernel(size, k_type, v_type, today)] * size
            at += size
    return Plan(tuple(codes), today)


def output(att: dict[str, np.ndarray], hp: Hparams, layer: int, cache: Cache, fa: Plan, exact: bool) -> np.ndarray:
    """[T, H·D_v]: what the output projection reads (kqv_unrot) when FLASH_ATTN_EXT ran: each position's row as its
    kernel computed it (the MUL_MAT path's where fa gives none), rotated back for a rotated V. att: attention()'s."""
    kqv = np.array(att["kqv"], dtype=F32)  # [H, T, D_v]
    codes = np.array(fa.kernels)
    h, t, _ = kqv.shape
    group = h // hp.n_head_kv
    sums = F64 if exact else F32
    k_type, v_type = cache.k_type, cache.v_type
    k, v = att["k_view"], att["v_view"]  # [H_kv, T, D_k], [H_kv, D_v, T] as stored
    cast_k = fa.casts and k_type == "f32"
    if cast_k:
        k, k_type = round_f16(k), "f16"
    if fa.casts and v_type == "f32":
        v = round_f16(v)
    kh = np.repeat(k, group, axis=0).astype(sums)
    vh = np.repeat(v, group, axis=0).astype(sums)
    visible = _mask(t, hp, layer)
    q = att["q"].transpose(1, 0, 2)  # [H, T, D_k] as kq reads it, before its conversion
    for code in ("tiled", "f16", "f32"):
        rows = np.flatnonzero(codes[:t] == code)
        if not rows.size:
            continue
        if code == "tiled":  # q stays f32
            kq = matmul.dot(q[:, rows], kh, "f32")
        elif not cast_k:  # q converted to K's vec_dot format, as the reference's kq
            kq = np.asarray(att["kq"], F32)[:, rows]
        else:
            kq = matmul.dot(q[:, rows], kh, matmul.vec_dot_type(KV_QT[k_type]))
        s = _scores(kq, hp)
        if code == "f16":
            kqv[:, rows] = _one_chunk_f16(s, np.asarray(vh, F32), visible[rows], rows)
        else:
            kqv[:, rows] = matmul.dot(softmax(s, visible[rows][None], 1.0), vh, "f32")
    merged = np.ascontiguousarray(kqv.transpose(1, 0, 2)).reshape(t, -1)
    return hadamard(merged, cache.v_rot) if cache.v_rot else merged


def _scores(kq: np.ndarray, hp: Hparams) -> np.ndarray:
    """The kernel's score s from k·q: s·scale, or with a soft-cap cap·tanhf(s·(scale/cap)) (one op's params)."""
    if hp.softcap:
        return (F32(hp.softcap) * np.tanh((kq * (F32(hp.kq_scale) / F32(hp.softcap))).astype(F32))).astype(F32)
    return (kq * F32(hp.kq_scale)).astype(F32)


def _one_chunk_f16(s: np.ndarray, vh: np.ndarray, visible: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """s [H, R, T] scores of the query positions `rows` (ascending), vh [H, D_v, T], visible [R, T] → [H, R, D_v]:
    ggml_compute_forward_flash_attn_ext_f16_one_chunk with an f16 V. Per slot in order, masked slots skipped: on a
    new maximum M the f16 accumulator is scaled by expf(M_old − M) (vec_scale_f16: the f32 product rounded to f16),
    then V_j·expf(s_j − M) is added (vec_mad_f16: an f32 FMA rounded to f16; in f64 here, exact before the one
    rounding); S = S·ms + vs in f32; the output is f32(acc) · (1/S)."""
    h, r, _ = s.shape
    acc = np.zeros((h, r, vh.shape[1]), F64)  # holds f16 values
    v = np.ascontiguousarray(np.moveaxis(np.asarray(vh, F64), -1, 0))  # [T, H, D_v]
    m = np.full((h, r), -np.inf, F32)
    total = np.zeros((h, r), F32)
    with np.errstate(invalid="ignore", over="ignore"):
        for j in range(int(rows[-1]) + 1):
            lo = int(np.searchsorted(rows, j))  # causal: rows before j never see slot j
            live = np.broadcast_to(visible[lo:, j], (h, r - lo))  # [H, R']
            sj, mo = s[:, lo:, j], m[:, lo:]
            new = live & (sj > mo)
            mn = np.where(new, sj, mo)
            ms = np.where(new, np.exp((mo - mn).astype(F32)), F32(1)).astype(F32)
            vs = np.where(live, np.where(new, F32(1), np.exp((sj - mn).astype(F32))), F32(0)).astype(F32)
            if new.any():  # rare after the first slots: scale only the rows with a new maximum
                hi, ri = np.nonzero(new)
                a = acc[hi, lo + ri]
                acc[hi, lo + ri] = round_f16((a * ms[hi, ri][:, None]).astype(F32))
            add = v[j][:, None, :] * vs[..., None].astype(F64)  # a masked slot adds 0: the accumulator is unchanged
            add += acc[:, lo:]
            acc[:, lo:] = add.astype(F32).astype(np.float16)  # f32 first: its ties decide as llama.cpp's do
            total[:, lo:] = (total[:, lo:] * ms + vs).astype(F32)
            m[:, lo:] = mn
    return (acc.astype(F32) * (F32(1) / total)[..., None]).astype(F32)
