"""Per-head views → checks: recompute what llama.cpp printed from other printed numbers, element by element.

Each check runs on a Stack (heads.py: the sites of one printed shape, stacked) as one numpy expression, and gives its
Elements: dumped and recomputed values, the bound of each, and where each sits (site, head, query, slot or dim).
`results` turns them into one CheckResult per site (results.py: how many compared, how many printed elements could
not be and why, the worst error, the bound there, the factor the bound would have needed, per-head figures);
`failing_rows` into the printed rows that fail, for pinning facts (hypotheses.py).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .. import precision
from ..results import (MAX_FAILURES, CheckResult, Failure, HeadFigures, Location, Tolerance, abs_error, compare,
                       compare_value, needed, within)
from . import bounds
from ..sites.heads import SiteView, Stack


class Elements(NamedTuple):
    """Compared elements of one check over a stack: got, want, bound [n]; s, h, t, x [n] the site and printed
    positions (x: slot or dim), sorted by site; unchecked [sites] printed elements each site could not compare."""

    got: np.ndarray
    want: np.ndarray
    bound: np.ndarray
    s: np.ndarray
    h: np.ndarray
    t: np.ndarray
    x: np.ndarray
    unchecked: np.ndarray
    why: str = ""

    def ok(self, tol: Tolerance | None = None) -> np.ndarray:
        """[n] within the bound (NaN and inf never are)."""
        return within(abs_error(self.got, self.want), self.bound if tol is None else tol.bound(self.want))


def _empty(n_sites: int, why: str = "", unchecked: np.ndarray | None = None) -> Elements:
    z = np.zeros(0)
    i = np.zeros(0, np.int64)
    return Elements(z, z, z, i, i, i, i, np.zeros(n_sites, np.int64) if unchecked is None else unchecked, why)


def _per_site(mask: np.ndarray) -> np.ndarray:
    """[s] how many elements of a [s, ...] mask are set in each site."""
    return mask.reshape(len(mask), -1).sum(axis=1)


def failing_rows(el: Elements, shape: tuple[int, int, int], tol: Tolerance | None = None) -> np.ndarray:
    """[s, h, t] printed rows with an element beyond its bound."""
    out = np.zeros(shape, bool)
    bad = ~el.ok(tol)
    out[el.s[bad], el.h[bad], el.t[bad]] = True
    return out


def results(check: str, nodes: list, st: Stack, el: Elements, last: str, tol: Tolerance | None = None,
            note: str = "", rows: str = "P_rows", per_head: bool = True) -> list[CheckResult]:
    """One CheckResult per site of the stack: what compare() gives for each site's elements, computed for all sites
    at once. `nodes[i]` is the node site i's check names; `last` names the x axis (slot or dim); `rows` the view's
    table of its printed rows' lines (P_rows, O_rows), where each failing value is; per_head: keep each head's
    figures (by_head, which the HTML page colours its grid by)."""
    n_sites = len(st.views)
    bound = el.bound if tol is None else tol.bound(el.want)
    err = abs_error(el.got, el.want)
    ratio = needed(err, bound)
    bad = ~within(err, bound)
    checked = np.bincount(el.s, minlength=n_sites)
    failed = np.bincount(el.s[bad], minlength=n_sites)
    worst = np.full(n_sites, -1)
    if len(ratio):
        key = np.where(np.isnan(ratio), np.inf, ratio)
        order = np.lexsort((np.arange(len(key)), -key, el.s))  # per site: the largest ratio, the first on ties
        firsts = order[np.searchsorted(el.s[order], np.arange(n_sites))[checked > 0]]
        worst[checked > 0] = firsts
    n_h = len(st.heads)
    if per_head:
        hk = el.s * n_h + el.h
        h_n = np.bincount(hk, minlength=n_sites * n_h).reshape(n_sites, n_h)
        h_bad = np.bincount(hk[bad], minlength=n_sites * n_h).reshape(n_sites, n_h)
        h_worst = np.zeros(n_sites * n_h)
        np.maximum.at(h_worst, hk, np.where(np.isnan(ratio), np.inf, ratio))
        h_worst = h_worst.reshape(n_sites, n_h)
    axis = st.slots if last == "slot" else st.dims

    def place(head: int, query: int, x: int) -> Location:
        return Location(head, query, x) if last == "slot" else Location(head, query, None, x)

    def where(i) -> Location:
        return place(int(st.heads[el.h[i]]), int(st.queries[el.t[i]]), int(axis[el.x[i]]))

    # each site's worst element, its figures and place taken for all sites at once (Python scalars, as float() and
    # int() give them), so that the loop below only builds the results
    w_all = worst[worst >= 0]
    w_err, w_bound, w_ratio = err[w_all].tolist(), bound[w_all].tolist(), ratio[w_all].tolist()
    w_h, w_t, w_x = st.heads[el.h[w_all]].tolist(), st.queries[el.t[w_all]].tolist(), axis[el.x[w_all]].tolist()
    w_at = list(map(place, w_h, w_t, w_x))
    out = []
    bad_idx = np.flatnonzero(bad)
    w = 0  # the next site with a worst element
    for i, (n_checked, n_unchecked, n_failed) in enumerate(zip(checked.tolist(), el.unchecked.tolist(),
                                                                failed.tolist())):
        node = nodes[i]
        why = el.why if n_unchecked else ""
        if not n_checked:
            out.append(CheckResult(check, node.name, node.line, 0, n_unchecked, why, note=note))
            continue
        res = CheckResult(check, node.name, node.line, n_checked, n_unchecked, why, w_err[w], w_bound[w], w_ratio[w],
                          w_at[w], n_failed, [], note)
        w += 1
        if n_failed:
            mine = bad_idx[el.s[bad_idx] == i][:MAX_FAILURES]
            # kq, kq_soft_max and kqv print one row per (head, query): the failing value's own line
            lines = getattr(st.views[i], rows)
            res.failures = [Failure(where(int(k)), float(el.got[k]), float(el.want[k]), float(bound[k]),
                                    None if lines is None else int(lines[el.h[k], el.t[k]]))
                            for k in mine]
        if per_head:
            res.by_head = {int(st.heads[k]): HeadFigures(int(h_n[i, k]), int(h_bad[i, k]),
                                                         float(h_worst[i, k])) for k in range(n_h) if h_n[i, k]}
        out.append(res)
    return out


def finite(view: SiteView) -> list[CheckResult]:
    """Every printed score, weight, output and value is a number: `%12.4f` prints nan/inf for real non-finite ones."""
    out = []
    V = view.V[view.kv_printed] if view.V is not None else None  # [h', d, j]: heads whose KV head was printed
    v_heads = view.heads[view.kv_printed] if view.V is not None else None
    nodes = ((view.S, view.site.scores, "slot", None), (view.P, view.site.softmax, "slot", view.P_rows),
             (view.O, view.site.kqv, "dim", view.O_rows), (V, view.site.v, "v", None))
    for arr, node, last, rows in nodes:  # rows: [h, t] the line of each printed row, where the view knows it
        if arr is None or node is None:
            continue
        if _all_finite(arr):
            out.append(CheckResult("finite", node.name, node.line, checked=arr.size))
            continue
        idx = np.nonzero(~np.isfinite(arr))
        vals = arr[idx]
        if last == "v":  # V_h [h', d, j]: head, dim, slot
            h, d, j = idx
            where = lambda i, h=h, d=d, j=j: Location(int(v_heads[h[i]]), None, slot=int(view.slots[j[i]]),  # noqa
                                                      dim=int(view.dims[d[i]]))
        else:
            h, t, x = idx
            axis = view.slots if last == "slot" else view.dims
            where = lambda i, h=h, t=t, x=x, axis=axis, last=last: Location(  # noqa: E731
                int(view.heads[h[i]]), int(view.queries[t[i]]))._replace(**{last: int(axis[x[i]])})
            if rows is not None:  # kq_soft_max and kqv print one row per (head, query): the value's own line
                where.line_of = lambda i, h=h, t=t, rows=rows: int(rows[h[i], t[i]])
        res = compare("finite", node, vals, np.zeros_like(vals), np.zeros_like(vals), where)
        res.checked = arr.size
        out.append(res)
    return out


def finite_stack(st: Stack) -> list[list[CheckResult]]:
    """finite() of each site of a stack, decided for all of them by one sum per printed array (a site whose sum is
    not finite, or overflows, is looked at alone)."""
    arrays = [(a, a.reshape(len(a), -1).sum(axis=1)) if a is not None else (None, None)
              for a in (st.S, st.P, st.O, st.V)]
    ok = np.logical_and.reduce([np.isfinite(sums) for _, sums in arrays if sums is not None]).tolist()
    # elements per site: each array's; of V, the rows of the heads whose KV head was printed
    sizes = [None if a is None else [a[0].size] * len(a) for a, _ in arrays]
    if st.V is not None:
        sizes[3] = (st.kv_printed.sum(axis=1) * (st.V.shape[2] * st.V.shape[3])).tolist()
    out = []
    for i, view in enumerate(st.views):
        if not ok[i]:
            out.append(finite(view))
            continue
        res = []
        for n, node in zip(sizes, (view.site.scores, view.site.softmax, view.site.kqv, view.site.v)):
            if n is not None and node is not None:
                res.append(CheckResult("finite", node.name, node.line, checked=n[i]))
        out.append(res)
    return out


def _all_finite(arr: np.ndarray) -> bool:
    """Every value is finite, decided by one sum in the common case (a NaN or inf makes the sum NaN or inf; only a
    sum that overflows needs the element-wise test)."""
    return math.isfinite(float(np.add.reduce(arr, axis=None))) or bool(np.isfinite(arr).all())


def masked(st: Stack) -> Elements:
    """Weights of masked slots (later tokens, empty cache slots, outside the window) are exactly 0: softmax of −inf."""
    P = st.P
    s, h, t, j = np.nonzero(np.broadcast_to(~st.visible[:, None], P.shape))
    got = P[s, h, t, j]
    return Elements(got, np.zeros_like(got), np.zeros_like(got), s, h, t, j, np.zeros(len(P), np.int64))


def softmax_rows(st: Stack) -> Elements:
    """P = softmax(kq·scale + bias + mask), with the sink in the denominator, for every printed row whose visible
    slots were all printed."""
    P = st.P
    vis = np.broadcast_to(st.visible[:, None], P.shape)
    if st.S is None:
        return _empty(len(P), "the scores feeding SOFT_MAX were not printed", _per_site(vis))
    whole = st.rows_whole  # [s, t]
    x = st.scaled()  # [s, h, t, j]
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        m = x.max(axis=-1, keepdims=True)
        sink = None
        if st.sinks is not None:
            sink = st.sinks[:, :, None, None]
            m = np.maximum(m, sink)
        e = np.exp(x - m)
        z = e.sum(axis=-1, keepdims=True)
        if sink is not None:
            z = z + np.exp(sink - m)
        p = e / z
    rows = vis & whole[:, None, :, None]
    unknown_sink = np.zeros(len(P), np.int64)
    if st.sinks is not None and np.isnan(st.sinks).any():  # a sink the whole rows did not agree on
        no = np.isnan(st.sinks)[:, :, None, None]
        unknown_sink = _per_site(rows & no)
        rows = rows & ~no
    s, h, t, j = np.nonzero(rows)
    want = p[s, h, t, j]
    bound = bounds.softmax_bound(want, st.scale[s], st.n_visible[s, t], np.abs(x[s, h, t, j]))
    if st.scale_err.any():
        bound = bound + want * 2 * st.scale_err[s] * np.abs(st.S).max(axis=-1)[s, h, t]
    if st.sink_err is not None and sink is not None:
        share = (np.exp(sink - m) / z)[s, h, t, 0]
        bound = bound + want * share * st.sink_err[s, h]
    unchecked = _per_site(vis & ~whole[:, None, :, None])
    why = []
    if unchecked.any():
        why.append("rows whose visible slots were not all printed (their normaliser is unknown)")
    if unknown_sink.any():
        why.append("heads whose whole rows do not agree on one sink logit (fewer than two)")
    return Elements(P[s, h, t, j], want, bound, s, h, t, j, unchecked + unknown_sink, "; ".join(why))


def softmax_ratio(st: Stack) -> Elements:
    """Rows with unprinted visible slots: p_j / p_k = exp(scale·(s_j − s_k) + b_j − b_k) between printed visible
    slots (a sink cancels)."""
    P, S = st.P, st.S
    part = ~st.rows_whole  # [s, t]
    if S is None or not part.any():
        return _empty(len(P))
    vis = st.visible[:, None] & part[:, None, :, None]  # [s, 1, t, j]
    x = S * st.scale[:, None, None, None]
    if st.bias is not None:
        x = x + st.bias
    k = np.where(vis, P, -1.0).argmax(axis=-1)[..., None]  # the largest printed visible weight: the best-known reference
    p_ref = np.take_along_axis(P, k, -1)
    x_ref = np.take_along_axis(x, k, -1)
    with np.errstate(over="ignore", invalid="ignore"):
        pred = p_ref * np.exp(x - x_ref)
    usable = np.broadcast_to(vis, P.shape) & (np.arange(P.shape[-1]) != k) & (p_ref > precision.PRINT)
    s, h, t, j = np.nonzero(usable)
    want = pred[s, h, t, j]
    bound = bounds.ratio_bound(want, p_ref[s, h, t, 0], st.scale[s])
    if st.scale_err.any():
        bound = bound + want * st.scale_err[s] * np.abs(S - np.take_along_axis(S, k, -1))[s, h, t, j]
    unchecked = _per_site(np.broadcast_to(vis, P.shape)) - np.bincount(s, minlength=len(P))
    return Elements(P[s, h, t, j], want, bound, s, h, t, j, unchecked,
                    "each row's reference slot, and rows whose printed weights are all below print precision")


def pv(st: Stack) -> Elements:
    """O = P·V over the visible slots, for printed kqv elements of rows whose visible slots were all printed."""
    O = st.O
    if O is None:
        return _empty(len(st.P))
    if st.V is None:
        return _empty(len(O), "the V cache view was not printed (quantized cache?)", _per_site(np.ones(O.shape, bool)))
    whole = st.rows_whole  # [s, t]
    vis = st.visible  # [s, t, j]
    P = np.where(vis[:, None], st.P, 0.0)  # [s, h, t, j]
    V = st.V  # [s, h, d, j]: a printed nan or inf stays, and fails the elements it feeds
    want = np.einsum("shtj,shdj->shtd", P, V)
    bound = bounds.pv_bound(P[:, :, :, None, :], V[:, :, None], vis[:, None, :, None, :], st.v_type)  # [s, h, t, d]
    ok = st.kv_printed[:, :, None, None] & whole[:, None, :, None]
    s, h, t, d = np.nonzero(np.broadcast_to(ok, O.shape))
    why = []
    if (~whole).any():
        why.append("rows whose visible slots were not all printed")
    if (~st.kv_printed).any():
        why.append("heads whose KV head was not printed")
    unchecked = O[0].size - np.bincount(s, minlength=len(O))
    return Elements(O[s, h, t, d], want[s, h, t, d], bound[s, h, t, d], s, h, t, d, unchecked, ", ".join(why))


def softmax_sum(st: Stack, i: int, tol: Tolerance | None = None) -> CheckResult:
    """Site i's SOFT_MAX `sum =` line: T·H (every row sums to 1) today; the sum of printed values before PR #15637."""
    view = st.views[i]
    site = view.site
    node = site.softmax
    T, H = site.T, site.H
    got = view.sums[0]
    if st.facts[i].sinks is not None:
        return CheckResult("sum", node.name, node.line, unchecked=1,
                           why_unchecked="attention sinks take a share of every row, printed or not")
    full = float(T * H)
    seen, most = st.n_visible_totals
    full_bound = precision.sum_bound(H * seen[i], full, T * H, most[i])
    res = compare_value("sum", node, got, full, full_bound, note="full tensor: T·H rows that each sum to 1", tol=tol)
    if res.passed:
        return res
    P_all = view.P_all  # else the sum of what was printed, which llama.cpp printed before PR #15637
    printed = float(P_all.sum())
    printed_bound = P_all.size * precision.PRINT + precision.sum_bound(int(np.count_nonzero(P_all)), printed)
    if abs(got - printed) <= (printed_bound if tol is None else tol.bound(printed)):
        res = compare_value("sum", node, got, printed, printed_bound,
                            note="printed values only (llama.cpp before PR #15637 summed what it printed)", tol=tol)
    return res


def infer_scale(st: Stack) -> tuple[float, float, int]:
    """Pooled least squares of log p_j − b_j = c_row + scale·s_j over printed visible weights ≥ 0.01.

    Returns the numerator and denominator sums (so stacks pool) and the number of rows used.
    """
    if st.S is None:
        return 0.0, 0.0, 0
    P, S = st.P, st.S
    vis = np.broadcast_to(st.visible[:, None], P.shape)
    bias = 0.0 if st.bias is None else st.bias  # ALiBi: log p_j − b_j = c_row + scale·s_j
    use = vis & (P >= 0.01) & np.isfinite(S)
    rows = use.sum(axis=-1) >= 2
    if not rows.any():
        return 0.0, 0.0, 0
    w = np.where(use, P, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        L = np.where(use, np.log(np.where(use, P, 1.0)) - bias, 0.0)
        wsum = w.sum(-1, keepdims=True)
        s_bar = (w * np.where(use, S, 0.0)).sum(-1, keepdims=True) / wsum
        l_bar = (w * L).sum(-1, keepdims=True) / wsum
    ds = np.where(use & rows[..., None], S - s_bar, 0.0)
    dl = np.where(use & rows[..., None], L - l_bar, 0.0)
    return float((w * ds * dl).sum()), float((w * ds * ds).sum()), int(rows.sum())
