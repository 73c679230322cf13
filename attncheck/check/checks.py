"""Per-head views → checks: recompute what llama.cpp printed from other printed numbers, element by element.

Every check returns a CheckResult (results.py: compare, don't report): how many elements it compared, how many
printed elements it could not and why, its worst error, the bound there, and the factor the bound would have needed.
"""
from __future__ import annotations

import numpy as np

from .. import precision
from ..results import CheckResult, FixedTolerance, Location, compare
from . import bounds
from .heads import SiteView


def _locator(view: SiteView, idx: tuple[np.ndarray, ...], last: str):
    """Map flat element i of a masked [h, t, x] array back to a Location."""
    h, t, x = idx
    axis = view.slots if last == "slot" else view.dims

    def where(i: int) -> Location:
        loc = Location(int(view.heads[h[i]]), int(view.queries[t[i]]))
        return loc._replace(**{last: int(axis[x[i]])})

    return where


def finite(view: SiteView) -> list[CheckResult]:
    """Every printed score, weight, output and value is a number: `%12.4f` prints nan/inf for real non-finite ones."""
    out = []
    V = view.V[view.kv_printed] if view.V is not None else None  # [h', d, j]: heads whose KV head was printed
    for arr, node, where in ((view.S, view.site.scores, lambda idx: _locator(view, idx, "slot")),
                             (view.P, view.site.softmax, lambda idx: _locator(view, idx, "slot")),
                             (view.O, view.site.kqv, lambda idx: _locator(view, idx, "dim")),
                             (V, view.site.v, lambda idx: _v_locator(view, idx))):
        if arr is None or node is None:
            continue
        if np.isfinite(arr).all():
            out.append(CheckResult("finite", node.name, node.line, checked=arr.size))
            continue
        idx = np.nonzero(~np.isfinite(arr))
        vals = arr[idx]
        res = compare("finite", node, vals, np.zeros_like(vals), np.zeros_like(vals), where(idx))
        res.checked = arr.size
        out.append(res)
    return out


def _v_locator(view: SiteView, idx: tuple[np.ndarray, ...]):
    """Map element i of V_h [h', d, j] (heads whose KV head was printed) to a Location: head, dim, slot."""
    heads = view.heads[view.kv_printed]
    h, d, j = idx
    return lambda i: Location(int(heads[h[i]]), None, slot=int(view.slots[j[i]]), dim=int(view.dims[d[i]]))


def masked(view: SiteView) -> CheckResult:
    """Weights of masked slots (later tokens, empty cache slots) are exactly 0: softmax of −inf."""
    mask = np.broadcast_to(~view.visible, view.P.shape)
    idx = np.nonzero(mask)
    got = view.P[idx]
    return compare("masked", view.site.softmax, got, np.zeros_like(got), np.zeros_like(got), _locator(view, idx, "slot"))


def softmax_rows(view: SiteView, scale: float, tol: FixedTolerance | None = None) -> CheckResult:
    """P = softmax(kq · scale + mask) for every printed row whose visible slots were all printed."""
    site = view.site
    vis = view.visible
    whole = view.rows_whole  # [t]
    n_rows = view.P.shape[0] * view.P.shape[1]
    n_whole = int(whole.sum()) * view.P.shape[0]
    why = "rows whose visible slots were not all printed (their normaliser is unknown)"
    if view.S is None:
        return CheckResult("softmax", site.softmax.name, site.softmax.line, unchecked=int(np.broadcast_to(vis, view.P.shape).sum()),
                           why_unchecked="the scores feeding SOFT_MAX were not printed")
    x = np.where(vis, view.S * scale, -np.inf)  # [h, t, j]
    x = x[:, whole]
    with np.errstate(invalid="ignore", over="ignore"):
        m = x.max(axis=-1, keepdims=True)
        e = np.exp(x - m)
        p = e / e.sum(axis=-1, keepdims=True)
    sel = np.broadcast_to(vis[whole], x.shape)
    t_whole = np.flatnonzero(whole)
    idx = np.nonzero(sel)
    full_idx = (idx[0], t_whole[idx[1]], idx[2])
    got = view.P[full_idx]
    want = p[idx]
    bound = bounds.softmax_bound(want, scale, view.n_visible[full_idx[1]], np.abs(x[idx]))
    unchecked = int(np.broadcast_to(vis, view.P.shape)[:, ~whole].sum())
    del n_rows, n_whole
    return compare("softmax", site.softmax, got, want, bound, _locator(view, full_idx, "slot"),
                   unchecked=unchecked, why=why if unchecked else "", tol=tol)


def softmax_ratio(view: SiteView, scale: float, tol: FixedTolerance | None = None) -> CheckResult:
    """Rows with unprinted visible slots: p_j / p_k = exp(scale · (s_j − s_k)) between printed visible slots."""
    site = view.site
    part = ~view.rows_whole
    if view.S is None or not part.any():
        return CheckResult("softmax_ratio", site.softmax.name, site.softmax.line)
    vis = view.visible[part]  # [t', j]
    P, S = view.P[:, part], view.S[:, part]  # [h, t', j]
    Pv = np.where(vis, P, -1.0)
    k = Pv.argmax(axis=-1)[..., None]  # the printed visible slot with the largest weight: the best-known reference
    p_ref = np.take_along_axis(P, k, -1)
    s_ref = np.take_along_axis(S, k, -1)
    with np.errstate(over="ignore", invalid="ignore"):
        pred = p_ref * np.exp(scale * (S - s_ref))
    slot = np.arange(P.shape[-1])
    usable = np.broadcast_to(vis, P.shape) & (slot != k) & (p_ref > precision.PRINT)
    idx = np.nonzero(usable)
    t_part = np.flatnonzero(part)
    full_idx = (idx[0], t_part[idx[1]], idx[2])
    n_vis_printed = int(np.broadcast_to(vis, P.shape).sum())
    return compare("softmax_ratio", site.softmax, P[idx], pred[idx],
                   bounds.ratio_bound(pred[idx], np.broadcast_to(p_ref, P.shape)[idx], scale),
                   _locator(view, full_idx, "slot"), unchecked=n_vis_printed - len(idx[0]),
                   why="each row's reference slot, and rows whose printed weights are all below print precision",
                   tol=tol)


def pv(view: SiteView, tol: FixedTolerance | None = None) -> CheckResult:
    """O = P·V over the visible slots, for printed kqv elements of rows whose visible slots were all printed."""
    site = view.site
    if view.O is None:
        return CheckResult("pv", site.softmax.name, site.softmax.line, why_unchecked="no MUL_MAT(v, P) node printed")
    if view.V is None:
        return CheckResult("pv", site.kqv.name, site.kqv.line, unchecked=view.O.size,
                           why_unchecked="the V cache view was not printed (quantized cache?)")
    whole = view.rows_whole
    kv_printed = view.kv_printed  # [h]
    vis = view.visible  # [t, j]
    P = np.where(vis, view.P, 0.0)[:, whole]  # [h, t', j]
    Vh = view.V  # [h, d, j]: a printed nan or inf stays, and fails the elements it feeds
    want = np.einsum("htj,hdj->htd", P, Vh)
    bound = bounds.pv_bound(P[:, :, None, :], Vh[:, None], vis[whole][None, :, None, :], view.v_type)  # [h, t', d]
    ok_rows = np.zeros(view.O.shape, bool)
    ok_rows[np.ix_(kv_printed, whole)] = True
    idx_h, idx_t, idx_d = np.nonzero(ok_rows)
    t_pos = np.cumsum(whole) - 1  # query index → index among the whole rows
    got = view.O[idx_h, idx_t, idx_d]
    w = want[idx_h, t_pos[idx_t], idx_d]
    b = bound[idx_h, t_pos[idx_t], idx_d]
    why = []
    if (~whole).any():
        why.append("rows whose visible slots were not all printed")
    if (~kv_printed).any():
        why.append("heads whose KV head was not printed")
    return compare("pv", site.kqv, got, w, b, _locator(view, (idx_h, idx_t, idx_d), "dim"),
                   unchecked=view.O.size - len(got), why=", ".join(why), tol=tol)


def softmax_sum(view: SiteView, sums: tuple[float, ...], P_all: np.ndarray,
                tol: FixedTolerance | None = None) -> CheckResult:
    """The SOFT_MAX `sum =` line: T·H (every row sums to 1) today; the sum of printed values before PR #15637."""
    site = view.site
    node = site.softmax
    T, H = site.T, site.H
    got = sums[0]
    full = float(T * H)
    n_added = H * (T * view.n_past + T * (T + 1) // 2)  # query t reads n_past + t + 1 slots
    full_bound = precision.sum_bound(n_added, full, T * H, view.n_past + T)
    printed = float(P_all.sum())
    printed_bound = P_all.size * precision.PRINT + precision.sum_bound(int(np.count_nonzero(P_all)), printed)
    where = lambda i: Location(-1, -1)  # noqa: E731  (a whole-tensor value has no element)
    res = compare("sum", node, [got], [full], [full_bound], where, note="full tensor: T·H rows that each sum to 1",
                  tol=tol)
    if not res.passed and abs(got - printed) <= (printed_bound if tol is None else tol.bound(printed)):
        res = compare("sum", node, [got], [printed], [printed_bound], where,
                      note="printed values only (llama.cpp before PR #15637 summed what it printed)", tol=tol)
    res.worst = None
    res.failures = [f._replace(at=None) for f in res.failures]
    return res


def infer_scale(view: SiteView) -> tuple[float, float, int]:
    """Pooled least squares of log p_j = c_row + scale·s_j over printed visible weights ≥ 0.01.

    Returns the numerator and denominator sums (so sites pool) and the number of rows used.
    """
    if view.S is None:
        return 0.0, 0.0, 0
    vis = np.broadcast_to(view.visible, view.P.shape)
    use = vis & (view.P >= 0.01) & np.isfinite(view.S)
    n = use.sum(axis=-1)
    rows = n >= 2
    if not rows.any():
        return 0.0, 0.0, 0
    w = np.where(use, view.P, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        L = np.where(use, np.log(np.where(use, view.P, 1.0)), 0.0)
        wsum = w.sum(-1, keepdims=True)
        s_bar = (w * np.where(use, view.S, 0.0)).sum(-1, keepdims=True) / wsum
        l_bar = (w * L).sum(-1, keepdims=True) / wsum
    ds = np.where(use & rows[..., None], view.S - s_bar, 0.0)
    dl = np.where(use & rows[..., None], L - l_bar, 0.0)
    return float((w * ds * dl).sum()), float((w * ds * ds).sum()), int(rows.sum())
