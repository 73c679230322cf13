"""Per-head views → checks: recompute what llama.cpp printed from other printed numbers, element by element.

Each check first computes its Elements (dumped and recomputed values, the bound of each, and where each sits), then
either a CheckResult (results.py: how many compared, how many printed elements could not be and why, the worst
error, the bound there, the factor the bound would have needed) or, for pinning facts (hypotheses.py), which
printed rows (head × query) pass.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .. import precision
from ..results import CheckResult, FixedTolerance, Location, compare, located
from . import bounds
from .heads import SiteView, Under


class Elements(NamedTuple):
    """Compared elements of one check: got, want, bound [n]; h, t, x [n] printed positions (x: slot or dim)."""

    got: np.ndarray
    want: np.ndarray
    bound: np.ndarray
    h: np.ndarray
    t: np.ndarray
    x: np.ndarray
    unchecked: int = 0
    why: str = ""

    def ok(self, tol: FixedTolerance | None = None) -> np.ndarray:
        """[n] within the bound (NaN and inf never are)."""
        bound = self.bound if tol is None else tol.bound(self.want)
        with np.errstate(invalid="ignore"):
            return np.abs(self.got - self.want) <= bound


def _empty(why: str = "", unchecked: int = 0) -> Elements:
    z = np.zeros(0)
    i = np.zeros(0, np.int64)
    return Elements(z, z, z, i, i, i, unchecked, why)


def failing_rows(el: Elements, shape: tuple[int, int], tol: FixedTolerance | None = None) -> np.ndarray:
    """[h, t] printed rows with an element beyond its bound."""
    out = np.zeros(shape, bool)
    bad = ~el.ok(tol)
    out[el.h[bad], el.t[bad]] = True
    return out


def result(check: str, node, view: SiteView, el: Elements, last: str, tol: FixedTolerance | None = None,
           note: str = "") -> CheckResult:
    """The CheckResult of some Elements; `last` names the x axis (slot or dim)."""
    axis = view.slots if last == "slot" else view.dims

    def where(i: int) -> Location:
        loc = Location(int(view.heads[el.h[i]]), int(view.queries[el.t[i]]))
        return loc._replace(**{last: int(axis[el.x[i]])})

    return compare(check, node, el.got, el.want, el.bound, located(where, view.heads[el.h]), unchecked=el.unchecked,
                   why=el.why, note=note, tol=tol)


def finite(view: SiteView) -> list[CheckResult]:
    """Every printed score, weight, output and value is a number: `%12.4f` prints nan/inf for real non-finite ones."""
    out = []
    V = view.V[view.kv_printed] if view.V is not None else None  # [h', d, j]: heads whose KV head was printed
    v_heads = view.heads[view.kv_printed] if view.V is not None else None
    for arr, node, last in ((view.S, view.site.scores, "slot"), (view.P, view.site.softmax, "slot"),
                            (view.O, view.site.kqv, "dim"), (V, view.site.v, "v")):
        if arr is None or node is None:
            continue
        if np.isfinite(arr).all():
            out.append(CheckResult("finite", node.name, node.line, checked=arr.size))
            continue
        idx = np.nonzero(~np.isfinite(arr))
        vals = arr[idx]
        if last == "v":  # V_h [h', d, j]: head, dim, slot
            h, d, j = idx
            where = lambda i, h=h, d=d, j=j: Location(int(v_heads[h[i]]), None, slot=int(view.slots[j[i]]),  # noqa
                                                      dim=int(view.dims[d[i]]))
            res = compare("finite", node, vals, np.zeros_like(vals), np.zeros_like(vals), located(where, v_heads[h]))
        else:
            el = Elements(vals, np.zeros_like(vals), np.zeros_like(vals), *idx)
            res = result("finite", node, view, el, last)
        res.checked = arr.size
        out.append(res)
    return out


def masked(u: Under) -> Elements:
    """Weights of masked slots (later tokens, empty cache slots, outside the window) are exactly 0: softmax of −inf."""
    P = u.view.P
    h, t, j = np.nonzero(np.broadcast_to(~u.visible, P.shape))
    got = P[h, t, j]
    return Elements(got, np.zeros_like(got), np.zeros_like(got), h, t, j)


def softmax_rows(u: Under) -> Elements:
    """P = softmax(kq·scale + bias + mask), with the sink in the denominator, for every printed row whose visible
    slots were all printed."""
    view = u.view
    vis = np.broadcast_to(u.visible, view.P.shape)
    if view.S is None:
        return _empty("the scores feeding SOFT_MAX were not printed", int(vis.sum()))
    whole = u.rows_whole  # [t]
    x = u.scaled()[:, whole]  # [h, t', j]
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        m = x.max(axis=-1, keepdims=True)
        sink = None
        if u.sinks is not None:
            sink = u.sinks[:, None, None]
            m = np.maximum(m, sink)
        e = np.exp(x - m)
        z = e.sum(axis=-1, keepdims=True)
        if sink is not None:
            z = z + np.exp(sink - m)
        p = e / z
    t_whole = np.flatnonzero(whole)
    rows = vis[:, whole]
    sink_unknown = 0
    if u.sinks is not None and np.isnan(u.sinks).any():  # a sink the whole rows did not agree on
        no = np.isnan(u.sinks)
        sink_unknown = int(rows[no].sum())
        rows = rows & ~no[:, None, None]
    h, tw, j = np.nonzero(rows)
    t = t_whole[tw]
    want = p[h, tw, j]
    bound = bounds.softmax_bound(want, u.scale, u.n_visible[t], np.abs(x[h, tw, j]))
    if u.facts.scale_err:
        bound = bound + want * 2 * u.facts.scale_err * np.abs(view.S[:, whole]).max(axis=-1)[h, tw]
    if u.sink_err is not None and sink is not None:
        share = (np.exp(sink - m) / z)[h, tw, 0]
        bound = bound + want * share * u.sink_err[h]
    unchecked = int(vis[:, ~whole].sum())
    why = ["rows whose visible slots were not all printed (their normaliser is unknown)"] if unchecked else []
    if sink_unknown:
        why.append("heads whose whole rows do not agree on one sink logit (fewer than two)")
    return Elements(view.P[h, t, j], want, bound, h, t, j, unchecked + sink_unknown, "; ".join(why))


def softmax_ratio(u: Under) -> Elements:
    """Rows with unprinted visible slots: p_j / p_k = exp(scale·(s_j − s_k) + b_j − b_k) between printed visible
    slots (a sink cancels)."""
    view = u.view
    part = ~u.rows_whole
    if view.S is None or not part.any():
        return _empty()
    vis = u.visible[part]  # [t', j]
    P, S = view.P[:, part], view.S[:, part]  # [h, t', j]
    x = S * u.scale
    if u.bias is not None:
        x = x + u.bias[:, part]
    Pv = np.where(vis, P, -1.0)
    k = Pv.argmax(axis=-1)[..., None]  # the printed visible slot with the largest weight: the best-known reference
    p_ref = np.take_along_axis(P, k, -1)
    x_ref = np.take_along_axis(x, k, -1)
    with np.errstate(over="ignore", invalid="ignore"):
        pred = p_ref * np.exp(x - x_ref)
    slot = np.arange(P.shape[-1])
    usable = np.broadcast_to(vis, P.shape) & (slot != k) & (p_ref > precision.PRINT)
    h, tp, j = np.nonzero(usable)
    t = np.flatnonzero(part)[tp]
    want = pred[h, tp, j]
    bound = bounds.ratio_bound(want, np.broadcast_to(p_ref, P.shape)[h, tp, j], u.scale)
    if u.facts.scale_err:
        bound = bound + want * u.facts.scale_err * np.abs(S - np.take_along_axis(S, k, -1))[h, tp, j]
    n_vis_printed = int(np.broadcast_to(vis, P.shape).sum())
    return Elements(P[h, tp, j], want, bound, h, t, j, n_vis_printed - len(h),
                    "each row's reference slot, and rows whose printed weights are all below print precision")


def pv(u: Under) -> Elements:
    """O = P·V over the visible slots, for printed kqv elements of rows whose visible slots were all printed."""
    view = u.view
    if view.O is None:
        return _empty()
    if view.V is None:
        return _empty("the V cache view was not printed (quantized cache?)", view.O.size)
    whole = u.rows_whole
    vis = u.visible  # [t, j]
    P = np.where(vis, view.P, 0.0)[:, whole]  # [h, t', j]
    Vh = view.V  # [h, d, j]: a printed nan or inf stays, and fails the elements it feeds
    want = np.einsum("htj,hdj->htd", P, Vh)
    bound = bounds.pv_bound(P[:, :, None, :], Vh[:, None], vis[whole][None, :, None, :], view.v_type)  # [h, t', d]
    ok_rows = np.zeros(view.O.shape, bool)
    ok_rows[np.ix_(view.kv_printed, whole)] = True
    h, t, d = np.nonzero(ok_rows)
    t_pos = np.cumsum(whole) - 1  # query index → index among the whole rows
    why = []
    if (~whole).any():
        why.append("rows whose visible slots were not all printed")
    if (~view.kv_printed).any():
        why.append("heads whose KV head was not printed")
    return Elements(view.O[h, t, d], want[h, t_pos[t], d], bound[h, t_pos[t], d], h, t, d,
                    view.O.size - len(h), ", ".join(why))


def softmax_sum(u: Under, tol: FixedTolerance | None = None) -> CheckResult:
    """The SOFT_MAX `sum =` line: T·H (every row sums to 1) today; the sum of printed values before PR #15637."""
    view = u.view
    site = view.site
    node = site.softmax
    T, H = site.T, site.H
    got = view.sums[0]
    if u.facts.sinks is not None:
        return CheckResult("sum", node.name, node.line, unchecked=1,
                           why_unchecked="attention sinks take a share of every row, printed or not")
    full = float(T * H)
    n_added = H * int(u.n_visible_all.sum())
    full_bound = precision.sum_bound(n_added, full, T * H, int(u.n_visible_all.max(initial=0)))
    P_all = view.P_all
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


def infer_scale(u: Under) -> tuple[float, float, int]:
    """Pooled least squares of log p_j − b_j = c_row + scale·s_j over printed visible weights ≥ 0.01.

    Returns the numerator and denominator sums (so sites pool) and the number of rows used.
    """
    view = u.view
    if view.S is None:
        return 0.0, 0.0, 0
    vis = np.broadcast_to(u.visible, view.P.shape)
    S = view.S
    bias = 0.0 if u.bias is None else u.bias  # ALiBi: log p_j − b_j = c_row + scale·s_j
    use = vis & (view.P >= 0.01) & np.isfinite(S)
    n = use.sum(axis=-1)
    rows = n >= 2
    if not rows.any():
        return 0.0, 0.0, 0
    w = np.where(use, view.P, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        L = np.where(use, np.log(np.where(use, view.P, 1.0)) - bias, 0.0)
        wsum = w.sum(-1, keepdims=True)
        s_bar = (w * np.where(use, S, 0.0)).sum(-1, keepdims=True) / wsum
        l_bar = (w * L).sum(-1, keepdims=True) / wsum
    ds = np.where(use & rows[..., None], S - s_bar, 0.0)
    dl = np.where(use & rows[..., None], L - l_bar, 0.0)
    return float((w * ds * dl).sum()), float((w * ds * ds).sum()), int(rows.sum())
