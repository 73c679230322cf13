"""How exact the dumped numbers are (FORMAT.md §3): the terms every per-element bound is built from."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

PRINT = 5e-5  # `%12.4f`: a printed value is within half a unit of the 4th decimal of the stored one
SUM_PRINT = 5e-7  # `sum = %f`
F32 = 2.0**-24  # unit roundoff of f32 arithmetic (accumulations, expf)

# On the CPU, MUL_MAT with an f16 (bf16) src0 converts src1 to f16 (bf16) first: P is rounded before P·V.
SRC1_ROUNDING = {"f32": 0.0, "f16": 2.0**-11, "bf16": 2.0**-8}


def softmax_bound(p: np.ndarray, scale: float, n_visible: np.ndarray | int, scaled_max: np.ndarray | float = 0.0):
    """|printed P − softmax(printed kq · scale)|: P's print, kq's print through softmax, f32 rounding.

    A change δ in every score moves p by at most p·(e^{2·scale·δ} − 1) (the δ_j − Σ p_k δ_k of softmax's derivative).
    """
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


def sum_bound(n_added: int, magnitude: float, n_rows: int = 0, row_len: int = 0) -> float:
    """|printed sum − exact sum|: f32 accumulation of n_added non-zero terms, row normalisation, the `%f` print."""
    return n_added * F32 * magnitude + n_rows * (row_len + 4) * F32 + SUM_PRINT


class FixedTolerance(NamedTuple):
    """check --atol/--rtol: |dumped − recomputed| ≤ atol + rtol·|recomputed|, in place of the derived per-element
    bounds (diff.Tolerance is diff's own: two dumps against each other, or per-op NMSE)."""

    atol: float
    rtol: float

    def bound(self, want) -> np.ndarray:
        return self.atol + self.rtol * np.abs(np.asarray(want, dtype=np.float64))
