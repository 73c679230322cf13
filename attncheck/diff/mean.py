"""The drift allowance of a weighted mean of V rows (kqv {D_h, T, H}, and kqv_out that merges its heads), derived from
the measured drift of the V rows and of the scores it averages through.

O_h = P_h·V_h: kqv_i = Σ_j p_j·V_ji over the slots j of a row (Σ_j p_j = 1). Two correct builds move the rows and
the weights, and exactly

    kqv'_i − kqv_i = Σ_j p'_j·(V'_ji − V_ji) + Σ_j (p'_j − p_j)·V_ji

The rows: the first term is a mean of the rows' moves, at most max_j |ΔV_ji| ≤ D_V, the largest |V_new − V_old| +
2·PRINT over the layer's V rows printed in both dumps (Vcur and the cache view kqv reads; each print within PRINT of
the stored value). The weights: scores moved by Δs move x = s·c + mask by Δx = c·Δs (c the site's kq_scale; mask,
ALiBi and sinks the same in both builds), and p'_j/p_j = e^{Δx_j}/D, D = Σ_k p_k·e^{Δx_k} (a sink's Δx is 0) lying
between e^{min Δx} and e^{max Δx}, so |Δp_j| ≤ p_j·(e^R − 1), R = c·(max(Δs, 0) − min(Δs, 0)): the spread
of the signed score moves and of 0 (a sink's), at most twice the largest move and less where they share a sign.
Measured over the site's scores printed in both, each move within 2·PRINT: R = c·(that spread + 4·PRINT). The
second term is then at most (e^R − 1)·Σ_j p_j·|V_ji|, a weighted mean of |V|, taken as v, the rms of the layer's
printed V rows (measure.store_scales). Each build's MUL_MAT converts P to the cache's type, and Vcur is converted
into the cache: two roundings of relative u_c (the cache's unit, drift.py) per build; and each sums n_kv slots in f32
in its own order, n_kv·2^-24 relative:

    |Δkqv_i| ≤ D_V + (e^R − 1)·v + (4·u_c + n_kv·2^-24)·v

This is measured, not fitted: no A, no n. Where attention is sharp (c·rms(kq) of 3 or more) the weights' term is
most of it; a mean of many rows has a rms s well below v, so that relative to s it moved 11.6× u·n^P between two
correct builds (a 16-layer F16 llama, a 190-token prompt, -ub 7) where drift.py's MEAN_FACTOR allowed 10×.

Two quantities are not printed and are estimated, not bounded: the slots in the middle of a long row (llama.cpp prints
a row's first and last 3) are taken to move, in their score and their V, within the site's printed ones (a score or
a V element drifting more than correct builds do fails its own node where printed), and a weighted mean of |V_ji|
is taken as v. Both were confirmed on pairs of correct builds (scripts/drift_calibrate.py). Where no scores
or no V are printed in both, or no kq_scale was pinned, the node keeps drift.py's allowance (MEAN_FACTOR times a
node's), and its note says so.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from ..precision import F32, PRINT
from .align import Aligned
from .drift import MEAN_FACTOR, DriftModel, unit_of_type
from .measure import measure
from .nodes import DiffTolerance, NodeDiff
from .softmax import DERIVED

WEIGHTED_MEANS = ("kqv", "kqv_out")  # P·V and the same values with the heads merged (and the views between them)
ROW_ROLES = ("Vcur", "v_view")  # the V rows a weighted mean averages: as computed, and as kqv reads them
KEPT = f"{MEAN_FACTOR:g}× the drift model's allowance (drift.py)"
NO_SCORES = f"the scores of this layer's SOFT_MAX, or its V rows, are not printed in both dumps: {KEPT}"
NO_SCALE = f"no kq_scale for this site (neither side's check reports it): {KEPT}"
NO_RMS = f"every element printed in both is 0 (no rms to scale the derived allowance by): {KEPT}"


def weighted_mean(role_name: str) -> bool:
    """kqv, kqv_out and the views between them: P·V, whose allowance mean.py derives."""
    return role_name.split(".")[0] in WEIGHTED_MEANS


def moves(al: Aligned) -> np.ndarray:
    """new − old of the elements printed (and finite) in both."""
    with np.errstate(invalid="ignore", over="ignore"):
        d = al.new - al.old
    return d[np.isfinite(d)]


def allowed_move(nd: NodeDiff, al: Aligned, tol: DiffTolerance) -> float:
    """The largest |new − old| the node's own allowance lets a printed element show: atol + rtol·max|x| +
    allowed·scale."""
    with np.errstate(invalid="ignore"):
        x = np.abs(np.concatenate([al.old, al.new]))
    x = x[np.isfinite(x)]
    return tol.atol + tol.rtol * (float(x.max()) if x.size else 0.0) + nd.allowed * nd.scale


@dataclass
class Pending:
    """A weighted mean's elements and what its allowance needs, kept until the site's kq_scale is known."""

    aligned: Aligned
    score_spread: float  # max(Δs, 0) − min(Δs, 0) + 4·PRINT over the site's scores printed in both
    row_drift: float  # D_V: the largest |ΔV| + 2·PRINT of the layer's V rows printed in both
    v_rms: float  # v: rms of the layer's printed V rows
    unit: float | None  # u_c: the unit of the V cache's type (None: not printed, the drift model's coarsest)
    n_kv: int  # slots each row sums over
    scores: str  # the scores node (NEW's name), for the note


@dataclass
class Sites:
    """One evaluation's layers: the drift of the scores and V rows printed in both, as the diff meets them (in graph
    order, before the weighted means that read them). A move beyond the node's own allowance (a regression there)
    counts as that allowance: a wrong input never widens a mean's allowance beyond what correct inputs give it."""

    score: dict = field(default_factory=dict)  # layer → (the scores' spread, NEW's scores node name, n_kv)
    row: dict = field(default_factory=dict)  # layer → D_V
    unit: dict = field(default_factory=dict)  # layer → u_c, from the printed cache view's type

    def scores(self, nd: NodeDiff, al: Aligned, n_kv: int, tol: DiffTolerance) -> None:
        """The scores a SOFT_MAX of this layer reads (kq, or after a soft-cap), measured."""
        d = moves(al)
        if not d.size:
            return
        spread = min(max(float(d.max()), 0.0) - min(float(d.min()), 0.0), 2 * allowed_move(nd, al, tol)) + 4 * PRINT
        if spread >= self.score.get(nd.role.layer, (-1.0,))[0]:
            self.score[nd.role.layer] = (spread, nd.new.name, n_kv)

    def rows(self, nd: NodeDiff, al: Aligned, tol: DiffTolerance) -> None:
        """V rows of this layer (ROW_ROLES), measured; the cache view's type is the unit of kqv's conversions."""
        d = moves(al)
        layer = nd.role.layer
        if d.size:
            move = min(float(np.abs(d).max()), allowed_move(nd, al, tol)) + 2 * PRINT
            self.row[layer] = max(self.row.get(layer, 0.0), move)
        if nd.role.name == "v_view":
            self.unit[layer] = max(self.unit.get(layer, 0.0), unit_of_type(nd.new.type))

    def pending(self, layer: int | None, al: Aligned, v_rms: float | None) -> Pending | None:
        """What a weighted mean of this layer needs, or None when its scores or V rows are not printed in both."""
        if layer not in self.score or layer not in self.row or not v_rms:
            return None
        d, name, n_kv = self.score[layer]
        return Pending(al, d, self.row[layer], v_rms, self.unit.get(layer), n_kv, name)


def allowance(pd: Pending, c: float, scale: float, unit: float) -> tuple[float, float]:
    """(the allowance as a fraction of the mean's rms `scale`, the part of it that is the weights' move) under the
    site's kq_scale c: D_V + (e^R − 1)·v + (4·u_c + n_kv·2^-24)·v, over s."""
    v = pd.v_rms
    weights = math.expm1(abs(c) * pd.score_spread) * v
    rounding = (4 * (pd.unit if pd.unit is not None else unit) + pd.n_kv * F32) * v
    return (pd.row_drift + weights + rounding) / scale, weights / scale


def settle(nodes: list[NodeDiff], scales: dict[tuple[int, int], tuple[float, str]], model: DriftModel | None,
           tol: DiffTolerance) -> None:
    """Give every pending weighted mean the allowance derived under its site's kq_scale ((evaluation, layer) →
    (scale, where it was pinned)), or say why it keeps drift.py's."""
    for nd in nodes:
        pd = nd.pending
        if not isinstance(pd, Pending) or model is None:
            continue
        nd.pending = None
        got = scales.get((nd.evaluation, nd.role.layer))
        if got is None or not nd.scale > 0:
            nd.note = NO_SCALE if got is None else NO_RMS
            continue
        c, origin = got
        before = nd.allowed
        nd.allowed, nd.weights = allowance(pd, c, nd.scale, model.unit.value)
        measure(nd, pd.aligned, tol)
        if nd.sum is not None:  # each of the sum's elements may drift by the new allowance
            n0, n1, n2, _ = nd.new.ne
            nd.sum = replace(nd.sum, tol=nd.sum.tol + n0 * n1 * n2 * (nd.allowed - before) * nd.scale)
        nd.note = (f"{DERIVED} the V rows and '{pd.scores}' through the weighted mean: D_V + (e^R − 1)·v + "
                   f"rounding, D_V = {pd.row_drift:.4g}, R = {abs(c) * pd.score_spread:.4g} (kq_scale {c:.6g}, "
                   f"pinned by {origin}), v = {pd.v_rms:.4g} the rms of V")
