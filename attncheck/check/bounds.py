"""The bounds of the dump-only checks: softmax, weight ratios, P·V, each from the print precision and storage
types of docs/format.md §6 (precision.py); derived in docs/numerics.md §2."""
from __future__ import annotations

import numpy as np

from ..precision import F32, PRINT, SRC1_ROUNDING


def softmax_bound(p: np.ndarray, scale: float, n_visible: np.ndarray | int, scaled_max: np.ndarray | float = 0.0):
    """|printed P − softmax(printed kq · scale)|: P's print, kq's print through softmax, f32 rounding.

    A change δ in every score moves p by at most p·(e^{2·scale·δ} − 1) (the δ_j − Σ p_k δ_k of softmax's derivative).
    """
    with np.errstate(invalid="ignore"):  # a non-finite score (inf · 0): the finite check fails it
        return PRINT + p * (np.expm1(2 * scale * PRINT) + (np.asarray(n_visible) + 4 + 2 * np.abs(scaled_max)) * F32)


def ratio_bound(pred: np.ndarray, p_ref: np.ndarray, scale: float):
    """|p_j − p_k·exp(scale·(s_j − s_k))|: p_j's print, p_k's print (relative PRINT/p_k), two scores' prints."""
    return PRINT + pred * (PRINT / p_ref + np.expm1(2 * scale * PRINT) + 8 * F32)


def pv_bound(P: np.ndarray, V: np.ndarray, visible: np.ndarray, v_type: str | None):
    """|printed O − Σ_j P_j V_j| over the visible slots j (last axis; P, V, visible broadcast together).

    O's print; P's print times |V|; V's print times P; src1 rounding of P to V's type; f32 accumulation.
    """
    u = SRC1_ROUNDING.get(v_type or "f32", 0.0)
    absV = np.where(visible, np.abs(V), 0.0)
    Pv = np.where(visible, P, 0.0)
    n = np.count_nonzero(visible, axis=-1) + 1
    return (
        PRINT
        + (absV * PRINT).sum(axis=-1)
        + np.where(visible, (Pv + PRINT) * PRINT, 0.0).sum(axis=-1)
        + (absV * Pv).sum(axis=-1) * (u + n * F32)
    )
