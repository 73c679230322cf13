"""One head walked by hand: one query's scores, scale, mask, weights and weighted sum, recomputed beside the dump.

`walk(dump, layer, head)` picks a site and returns a `HeadWalk` (records.py): numbers only, no printing
(render.py shows them). Per-head views as in docs/format.md §4: Q_h, O_h [T, D_h]; K_h, V_h [n_kv, D_h];
S_h, P_h [T, n_kv]. The facts are those `check` pins on the run, and the recomputations and bounds those of its
checks (check/checks.py: softmax over the visible slots, Σ_j p_j v_j with the dumped p_j), both reached through
verify.py, so `inspect` and `check` agree on every element.
"""
from __future__ import annotations

from dataclasses import replace
from typing import BinaryIO

import numpy as np

from ..arch.facts import DEFAULT, AttentionFacts
from ..sites.heads import SiteView, Under, kv_head, site_view
from ..sites.mask import EMPTY, LATER, OUTSIDE_WINDOW, REASONS, VISIBLE, full_mask
from ..sites.resolve import site_facts
from ..report import Report
from ..dump.attention import Site
from ..dump.graph import Dump, Evaluation, read_dump
from ..dump.sample import Sample, parse_sample
from ..errors import DumpError
from ..verify import Options, given_facts, pinned_facts, recomputed
from .records import HeadWalk, MaskRange, QueryRow, Rows, WeightedSum
from .shapes import shapes


class NothingToInspect(Exception):
    """The dump has no attention nodes to walk (flash attention, or no SOFT_MAX): exit 3, like `check`."""


def span(values) -> str:
    """'0..11' for two or more consecutive integers, else '0, 1, 3'."""
    v = sorted(int(x) for x in values)
    if not v:
        return "none"
    if len(v) > 1 and v == list(range(v[0], v[-1] + 1)):
        return f"{v[0]}..{v[-1]}"
    return ", ".join(map(str, v))


def select(dump: Dump, evaluation: int, layer: int) -> tuple[Evaluation, Site, list[SiteView]]:
    """The evaluation and layer asked for, and the views of every site of its run (facts are pinned on the whole
    run, as `check` pins them); DumpError naming the valid range otherwise."""
    chosen: Evaluation | None = None
    run_views: list[SiteView] = []
    n_ev = flash = sites = 0
    kinds: dict[int, str] = {}
    run = None
    for ev in dump.evaluations():
        if chosen is not None and ev.run != chosen.run:
            break
        n_ev += 1
        flash, sites = flash + len(ev.flash), sites + len(ev.sites)
        if ev.run != run:  # a new run: the views gathered so far belong to another
            run, run_views = ev.run, []
        if chosen is None and ev.index == evaluation:
            chosen = ev
            kinds = ev.layer_kinds()
        if ev.n_past is not None:
            run_views += [_view(dump.source, ev, s) for s in ev.sites]
        if ev is not chosen:
            ev.nodes.clear()  # keep memory flat: only the chosen evaluation's nodes are needed
    if chosen is None or not chosen.sites:
        if not sites:  # flash attention, or no attention at all: the same advice as `check`, exit 3
            reason = Report(source=dump.source, flash_nodes=flash).unverified_reason()
            raise NothingToInspect(f"{dump.source}: {reason}")
        if chosen is None:
            raise DumpError(dump.source, None, f"evaluation {evaluation} does not exist: "
                                               f"evaluations {span(range(n_ev))}")
        raise DumpError(dump.source, None, f"evaluation {evaluation} has no attention sites")
    site = next((s for s in chosen.sites if s.layer == layer), None)
    if site is None:
        kind = kinds.get(layer)
        if kind is not None and kind != "softmax":
            raise NothingToInspect(f"{dump.source}: layer {layer} has no softmax attention ({kind}): nothing to "
                                   f"inspect; layers with softmax attention: {span(s.layer for s in chosen.sites)}")
        raise DumpError(dump.source, None, f"layer {layer} does not exist in evaluation {evaluation}: "
                                           f"layers {span(s.layer for s in chosen.sites)}")
    if chosen.n_past is None:
        raise DumpError(dump.source, site.softmax.line,
                        "cannot place this evaluation: an earlier one had no attention to count T")
    return chosen, site, run_views


def _view(src: str, ev: Evaluation, site: Site) -> SiteView:
    printable = lambda n: n is not None and not n.quantized  # noqa: E731
    P = parse_sample(site.softmax, src)
    S = parse_sample(site.scores, src) if printable(site.scores) else None
    O = parse_sample(site.kqv, src) if printable(site.kqv) else None
    V = parse_sample(site.v, src) if printable(site.v) else None
    return site_view(site, ev.n_past, P, S, O, V, src)


def walk(dump: Dump | str | BinaryIO, layer: int, head: int, query: int | None = None, evaluation: int = 0,
         kq_scale: float | None = None, given: AttentionFacts | None = None) -> HeadWalk:
    """Walk head `head` of layer `layer` in evaluation `evaluation` for one query (default: see `default_query`).

    given: facts from a model or options (verify.given_facts; without it, kq_scale's); what they leave open is
    pinned on the run."""
    if not isinstance(dump, Dump):
        dump = read_dump(dump)
    ev, site, run_views = select(dump, evaluation, layer)
    given = given if given is not None else given_facts(Options(kq_scale=kq_scale))
    return walk_site(dump.source, ev, site, head, query, run_views, given)


def walk_site(src: str, ev: Evaluation, site: Site, head: int, query: int | None, run_views: list[SiteView],
              given: AttentionFacts) -> HeadWalk:
    """The walk of one selected site (select()) under the facts pinned on its run."""
    printable = lambda n: n is not None and not n.quantized  # noqa: E731
    view = next(v for v in run_views if v.site.softmax.line == site.softmax.line)
    pinned, extra = pinned_facts(run_views, given)
    facts = site_facts(pinned, view, extra)
    K = parse_sample(site.k, src) if printable(site.k) else None
    Q = parse_sample(site.q, src) if printable(site.q) else None
    V = parse_sample(site.v, src) if printable(site.v) else None
    lines = _facts_used(pinned, facts.kq_scale)
    w = head_walk(src, ev, site, head, query, Under(view, facts), lines, V=V, K=K, Q=Q)
    if pinned.window.origin == DEFAULT and not (w.row.whole and _within(w.row)):
        w = replace(w, window_unknown=True)
    return w


def _within(row: QueryRow) -> bool:
    """Every recomputed weight of the row within its bound: the printed weights confirm which slots are visible."""
    compared = ~np.isnan(row.bound)
    return bool(np.all(row.error[compared] <= row.bound[compared]))


def _scale_origin(facts: tuple[str, ...]) -> str:
    """Where kq_scale came from, in a few words: 1/sqrt(D_h), --kq-scale, or the source and its detail."""
    if not facts:
        return "1/sqrt(D_h)"
    origin = facts[0].split(": ", 1)[1]
    if origin.startswith("default"):
        return "1/sqrt(D_h)"
    return "--kq-scale" if origin.startswith("option") else origin


def _facts_used(f: AttentionFacts, scale: float) -> tuple[str, ...]:
    """One line per fact that shapes this head's weights, with where it came from."""
    out = [f"kq_scale {scale:.6g}: {f.kq_scale.origin}" + (f" ({f.kq_scale.detail})" if f.kq_scale.detail else ""),
           f"{'causal' if f.causal.value else 'non-causal'} mask: {f.causal.origin}"
           + (f" ({f.causal.detail})" if f.causal.detail else "")]
    if f.window.value is not None:
        w = f.window.value
        out.append(f"{w.kind} window {w.n} on layers {span(w.layers)}: {f.window.origin} ({f.window.detail})")
    if f.alibi_max_bias.value:
        out.append(f"ALiBi max_bias {f.alibi_max_bias.value:g}: {f.alibi_max_bias.origin}")
    if f.sinks.value is not None:
        out.append(f"attention sinks: {f.sinks.origin} ({f.sinks.detail})")
    return tuple(out)


def _check_index(source: str, what: str, value: int, n: int, printed: np.ndarray, extra: str = "") -> int:
    """The printed position of a logical head or query; DumpError naming the valid (printed) range otherwise."""
    whats = "queries" if what == "query" else what + "s"
    if not 0 <= value < n:
        raise DumpError(source, None, f"{what} {value} does not exist: {whats} {span(range(n))}{extra}")
    hits = np.flatnonzero(printed == value)
    if not len(hits):
        raise DumpError(source, None, f"{what} {value} was not printed: llama.cpp printed {whats} {span(printed)} "
                                      f"of {span(range(n))}")
    return int(hits[0])


def default_query(u: Under) -> tuple[int, str]:
    """The last printed query whose visible slots are all printed (its softmax can be recomputed), else the last."""
    whole = [int(t) for t, w in zip(u.view.queries, u.rows_whole) if w]
    if whole:
        return whole[-1], "the last query whose visible slots are all printed"
    return int(u.view.queries[-1]), "the last printed query (no query has all its visible slots printed)"


def head_walk(source: str, ev: Evaluation, site: Site, head: int, query: int | None, u: Under,
              facts: tuple[str, ...] = (), *, V: Sample | None, K: Sample | None, Q: Sample | None) -> HeadWalk:
    """Build the walk from a site under its facts, and its parsed K, V and q samples."""
    view = u.view
    H, T, n_kv, n_past = site.H, site.T, site.n_kv, ev.n_past
    hp = _check_index(source, "head", head, H, view.heads, f" (layer {site.layer} has H = {H})")
    if query is None:
        query, query_origin = default_query(u)
    else:
        query_origin = "--query"
    tp = _check_index(source, "query", query, T, view.queries, f" (T = {T}, positions {n_past}..{n_past + T - 1})")
    H_kv = site.H_kv
    g = int(kv_head(head, H, H_kv)) if H_kv and H % H_kv == 0 else head
    notes: list[str] = []
    row = _query_row(u, hp, tp)
    K_h = _kv_rows("K_h", K, g, transpose=False, notes=notes)
    V_h = _kv_rows("V_h", V, g, transpose=True, notes=notes)
    Q_h = None
    if Q is not None and Q.node.ne[2] == H:
        qp = Q.position(1, head)
        if qp is not None:
            Q_h = Rows("Q_h", Q.node, Q.index[2], Q.index[3], Q.values[0, qp], (Q.node.ne[1], Q.node.ne[0]))
    weighted, why = _weighted(u, row, hp, tp, V_h)
    if view.S is None:
        notes.append("the scores SOFT_MAX reads were not printed: only the dumped weights are shown")
    if site.scores is not None and site.kq is not None and site.scores is not site.kq:
        notes.append(f"SOFT_MAX reads '{site.scores.name}' ({site.scores.op}), not kq itself: "
                     "its values are shown as kq")
    g_ = view.geometry
    vis_all = full_mask(g_, u.facts, view.queries).visible
    return HeadWalk(
        source=source, evaluation=ev.index, run=ev.run, n_past=n_past, T=T, layer=site.layer, head=head, H=H,
        H_kv=H_kv, kv_head=g, D_h=site.D_h, n_kv=n_kv, kq_scale=u.scale,
        scale_origin=_scale_origin(facts), tokens=ev.tokens, query=query,
        query_origin=query_origin, shapes=tuple(shapes(site)), Q_h=Q_h, K_h=K_h, V_h=V_h, row=row,
        weighted=weighted, weighted_why_not=why, P_h=view.P[hp], P_queries=view.queries, P_slots=view.slots,
        notes=tuple(notes), P_reason=u.reason, visible_all=vis_all, slot_base=g_.slot_base,
        n_tokens=g_.n_tokens, facts=facts,
    )


def _kv_rows(name: str, X: Sample | None, g: int, transpose: bool, notes: list[str]) -> Rows | None:
    """K_h from the K view {D_h, n_kv, H_kv, 1}, or V_h from the V view {n_kv, D_h, H_kv, 1} transposed."""
    if X is None:
        notes.append(f"{name}: the {'V' if transpose else 'K'} cache view was not printed (quantized cache?)")
        return None
    gp = X.position(1, g)
    if gp is None:
        notes.append(f"{name}: KV head {g} was not printed (llama.cpp printed KV heads {span(X.index[1])})")
        return None
    ne0, ne1 = X.node.ne[0], X.node.ne[1]
    if transpose:  # [D_h, n_kv] → [n_kv, D_h]
        return Rows(name, X.node, X.index[3], X.index[2], X.values[0, gp].T, (ne0, ne1))
    return Rows(name, X.node, X.index[2], X.index[3], X.values[0, gp], (ne1, ne0))


def _mask_ranges(reason: np.ndarray, bias: bool) -> tuple[MaskRange, ...]:
    """The chosen query's mask over every slot, as runs of one reason."""
    value = {VISIBLE: np.nan if bias else 0.0, LATER: -np.inf, EMPTY: -np.inf, OUTSIDE_WINDOW: -np.inf}
    what = {**REASONS, VISIBLE: "visible" + (" (ALiBi: −slope·|p_q − p_k|)" if bias else "")}
    out: list[MaskRange] = []
    start = 0
    for j in range(1, len(reason) + 1):
        if j == len(reason) or reason[j] != reason[start]:
            r = int(reason[start])
            out.append(MaskRange(start, j - 1, value[r], what[r]))
            start = j
    return tuple(out)


def _query_row(u: Under, hp: int, tp: int) -> QueryRow:
    """kq, scaled (+ ALiBi), mask, softmax recomputed as the checks recompute it (verify.recomputed: check/checks.py's
    softmax_rows or softmax_ratio, so inspect and check agree on every element), errors and bounds."""
    view = u.view
    p = view.P[hp, tp]
    s = view.S[hp, tp] if view.S is not None else None
    vis = u.visible[tp]
    whole = bool(u.rows_whole[tp])
    bias = u.bias[hp, tp] if u.bias is not None else None
    mask = np.where(vis, 0.0 if bias is None else bias, -np.inf)
    softmax = np.where(vis, np.nan, 0.0)
    bound = np.where(vis, np.nan, 0.0)  # masked weights are exactly 0
    scaled = s * u.scale if s is not None else None
    why, ref = "", None
    if scaled is None:
        why = "the scores SOFT_MAX reads were not printed"
    else:
        el = recomputed("softmax" if whole else "ratio", u.stack, hp, tp)
        softmax[el.x] = el.want
        bound[el.x] = el.bound
        if not whole:
            n_vis = int(u.n_visible[tp])
            unprinted = np.setdiff1d(np.flatnonzero(full_mask(view.geometry, u.facts, view.queries[tp:tp + 1])
                                                    .visible[0]), view.slots)
            why = (f"slots {span(unprinted)} are visible but were not printed: the softmax normaliser is unknown"
                   if n_vis else "")
            k = int(np.argmax(np.where(vis, p, -1.0)))
            if p[k] > 5e-5:
                ref = int(view.slots[k])
    with np.errstate(invalid="ignore"):
        error = np.abs(p - softmax)
    sink = share = None
    if u.sinks is not None:
        sink = float(u.sinks[hp])
        if whole:
            share = float(1.0 - p[vis].sum())
    reason_all = full_mask(view.geometry, u.facts, view.queries[tp:tp + 1]).reason[0]
    return QueryRow(view.slots, vis, whole, s, scaled, mask, softmax, p, error, bound,
                    _mask_ranges(reason_all, bias is not None), ref, why, u.reason[tp], sink, share)


def _weighted(u: Under, row: QueryRow, hp: int, tp: int, V_h: Rows | None) -> tuple[WeightedSum | None, str]:
    """Σ_j p_j v_j over the visible slots with the dumped p_j (as check/checks.py's pv computes it), beside kqv."""
    view = u.view
    if view.O is None:
        return None, "kqv (MUL_MAT(v, kq_soft_max)) was not printed"
    if V_h is None or view.V is None:
        return None, "V_h was not printed"
    if not row.whole:
        return None, "the row's visible slots were not all printed"
    el = recomputed("pv", u.stack, hp, tp)
    if not len(el.x):
        return None, "the KV head this head reads was not printed"
    vis = row.visible
    p = np.where(vis, row.kq_soft_max, 0.0)
    terms = p[:, None] * view.V[hp].T  # [j, d]
    d = el.x
    return WeightedSum(view.dims[d], view.slots[vis], terms[vis][:, d], el.want, el.got, np.abs(el.got - el.want),
                       el.bound), ""
