"""The drift allowance of a softmax weight, derived from its row's score drift through the softmax (docs/numerics.md
§4.3).

SOFT_MAX reads a row of scores s (kq, or what SOFT_MAX reads after it: a soft-cap, a score bias) and computes
p = softmax(x), x = s·c + mask (+ ALiBi; c the site's kq_scale; mask, ALiBi and sinks are the same in both builds).
Two builds whose scores differ by Δs move x by Δx = c·Δs, and p'_j = p_j·e^{Δx_j} / D with D = Σ_k p_k·e^{Δx_k}.
By Jensen's inequality e^{−L} ≤ e^{−Σ_k p_k|Δx_k|} ≤ D ≤ e^{L}, L = log Σ_k p_k·e^{|Δx_k|} (Σ_k p_k|Δx_k| ≤ L ≤
max_k |Δx_k|), so exactly, with no first-order step:

    |p'_j − p_j| ≤ p_j·(e^{|Δx_j| + L} − 1)

p is OLD's weight (a weight moved in NEW does not widen its own allowance), at most PRINT above its print. |Δs| of a
slot whose score is printed in both dumps is measured: |s_new − s_old| + 2·PRINT (each print within PRINT of the f32
value SOFT_MAX read). For slots not printed in both (the middle of a long row, a 2024 dump's 32-slot view), |Δs| is
the scores node's drift allowance, what a correct build may move them by, and their weight is at most
1 − Σ_printed (p_k − PRINT). Where the scores SOFT_MAX reads are not printed in both dumps (a graph that prints
none; flash attention prints no weights at all) the weight keeps the allowance of drift.py (SOFTMAX_FACTOR times
its own size), and the node's note says so.

The site's kq_scale is known once each side's check has pinned it, after the node diff: until then the node keeps
its rows here (Pending) and the drift.py allowance; settle() gives it the derived one.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..precision import PRINT
from .align import Aligned, key_view
from .drift import SOFTMAX_FACTOR
from .measure import measure
from .nodes import DiffTolerance, NodeDiff

SCORE_ROLES = ("kq", "kq_scores")  # what a SOFT_MAX may read: kq itself, or the scores after the steps after it
NO_SCORES = ("the scores SOFT_MAX reads are not printed in both dumps (or not matched): each weight allowed "
             f"{SOFTMAX_FACTOR:g}× its own size (drift.py)")
DERIVED = "allowance derived from the drift of"
NO_SCALE = (f"no kq_scale for this site (neither side's check reports it): each weight allowed {SOFTMAX_FACTOR:g}× "
            "its own size (drift.py)")


@dataclass
class Pending:
    """A kq_soft_max node's aligned weights and its scores' drift, kept until the site's kq_scale is known."""

    aligned: Aligned  # the weights printed in both, keys (slot, query, head, i3)
    score_drift: np.ndarray  # [N] |Δs| + 2·PRINT where the slot's score is printed in both; NaN elsewhere
    row: np.ndarray  # [N] the row (query, head, i3) of each weight
    unprinted_mass: np.ndarray  # [R] at most this much of each row's weight lies on slots not printed in both
    unprinted_drift: float  # |Δs| a correct build may show on a slot not printed in both: the scores' allowance
    scores: str  # the scores node (NEW's name), for the note


def pending(weights: Aligned, scores: Aligned, scores_diff: NodeDiff, tol: DiffTolerance) -> Pending | None:
    """The rows of a softmax node to settle later, or None when weights or scores are not aligned by index."""
    if weights.how != "index" or scores.how != "index" or not len(weights.old):
        return None
    _, row = np.unique(weights.keys[:, 1:], axis=0, return_inverse=True)
    row = row.ravel()
    drift = np.full(len(weights.old), np.nan)
    _, iw, is_ = np.intersect1d(key_view(weights.keys), key_view(scores.keys), return_indices=True)
    with np.errstate(invalid="ignore", over="ignore"):
        ds = np.abs(scores.new[is_] - scores.old[is_]) + 2 * PRINT
    drift[iw] = np.where(np.isfinite(ds), ds, np.inf)
    p = weights.old
    printed = np.where(np.isfinite(p), np.maximum(p, 0.0) - PRINT, -np.inf)  # a NaN weight: all mass unknown
    mass = np.maximum(1.0 - np.bincount(row, printed), 0.0)
    mass = np.where(np.isfinite(mass), mass, 1.0)
    s = np.concatenate([scores.old, scores.new])
    s = s[np.isfinite(s)]
    top = float(np.max(np.abs(s))) if s.size else 0.0
    unprinted = scores_diff.allowed * scores_diff.scale + tol.atol + tol.rtol * top + 2 * PRINT
    return Pending(weights, drift, row, mass, unprinted, scores_diff.new.name)


def allowance(pd: Pending, kq_scale: float) -> tuple[np.ndarray, np.ndarray]:
    """(each weight's allowed |new − old| beyond print precision, its size p_j + PRINT) under kq_scale."""
    c = abs(kq_scale)
    with np.errstate(invalid="ignore", over="ignore"):
        dx = c * np.where(np.isnan(pd.score_drift), pd.unprinted_drift, pd.score_drift)
        p = pd.aligned.old
        size = np.where(np.isfinite(p), np.maximum(p, 0.0), 1.0) + PRINT
        terms = np.bincount(pd.row, size * np.exp(dx), minlength=len(pd.unprinted_mass))
        L = np.log(terms + pd.unprinted_mass * np.exp(c * pd.unprinted_drift))
        allowed = size * np.expm1(dx + L[pd.row])
    return np.where(np.isnan(allowed), np.inf, allowed), size


def settle(nodes: list[NodeDiff], scales: dict[tuple[int, int], tuple[float, str]], tol: DiffTolerance) -> None:
    """Give every pending softmax node the allowance derived under its site's kq_scale ((evaluation, layer) →
    (scale, where it was pinned)), or say why it keeps drift.py's."""
    for nd in nodes:
        pd = nd.pending
        if not isinstance(pd, Pending):
            continue
        nd.pending = None
        got = scales.get((nd.evaluation, nd.role.layer))
        if got is None:
            nd.note = NO_SCALE
            continue
        scale, origin = got
        allowed, size = allowance(pd, scale)
        measure(nd, pd.aligned, tol, allowance=(allowed, size))
        nd.note = (f"{DERIVED} '{pd.scores}' through the softmax (kq_scale {scale:.6g}, "
                   f"pinned by {origin})")
