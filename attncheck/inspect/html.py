"""`inspect --html`: the one-head view as a page. The walk of one query (scores, scale, mask, softmax, weighted
sum, each beside the dumped value) as tables, and the head's P and O heatmaps drawn by the same script as check's
page, from the same collector (present/page.py) fed with the dump-only checks of this head and, with --model, the
model's checks and reference."""
from __future__ import annotations

from typing import BinaryIO, Sequence

import numpy as np
from rich.text import Text

from ..arch.context import open_model
from ..present.html import document, esc, lines, table, token_texts
from ..present.page import PageData
from ..dump.graph import Dump, read_dump
from ..verify import Options, given_facts, head_reports, merge, pinned_facts
from .model_walk import ModelWalk, model_walk_site
from .render import _err, _fmt, mask_line, verdict
from .walk import HeadWalk, select, span, walk_site


def _token(w: HeadWalk, position: int, vocab: Sequence[str] | None) -> str:
    t = w.token(position)
    if t is None:
        return ""
    return f"{t} {vocab[t]!r}" if vocab is not None and 0 <= t < len(vocab) else str(t)


def header(w: HeadWalk, vocab: Sequence[str] | None) -> str:
    gqa = (f"head {w.head} reads KV head {w.kv_head} (H = {w.H} query heads share H_kv = {w.H_kv} KV heads)"
           if w.H_kv != w.H else f"head {w.head} reads KV head {w.kv_head} (H = H_kv = {w.H}: no head sharing)")
    rows = [("source", w.source), ("evaluation", f"{w.evaluation} (run {w.run}, n_past {w.n_past}, T {w.T})"),
            ("layer, head", f"layer {w.layer}, head {w.head} of 0..{w.H - 1}"), ("heads", gqa),
            ("sizes", f"D_h = {w.D_h}, n_kv = {w.n_kv}"), ("kq_scale", f"{w.kq_scale:.6g} ({w.scale_origin})"),
            ("query", f"{w.query}: position {w.position}, token {_token(w, w.position, vocab) or '—'} "
                      f"({w.query_origin})")]
    rows += [("fact used", f) for f in w.facts]
    if w.tokens is not None:
        rows.append(("tokens of the run", " ".join(_token(w, i, vocab) for i in range(len(w.tokens)))))
    return table(("", ""), rows, "facts")


def scores(w: HeadWalk, vocab: Sequence[str] | None) -> str:
    r = w.row
    rows = []
    for i, j in enumerate(int(x) for x in r.slots):
        ok = "" if r.bound[i] != r.bound[i] else ("ok" if r.error[i] <= r.bound[i] else "FAIL")
        rows.append((j, _token(w, j, vocab), "—" if r.kq is None else _fmt(r.kq[i]),
                     "—" if r.scaled is None else _fmt(r.scaled[i], 6), "0" if r.mask[i] == 0 else "-inf",
                     _fmt(r.softmax[i], 6), _fmt(r.kq_soft_max[i]), _err(r.error[i]), _err(r.bound[i]),
                     ok or ("reference" if j == r.reference else "")))
    how = "softmax over the visible slots" if r.reference is None else \
        f"recomputed relative to slot {r.reference}: p_j = p_k·exp(kq_scale·(s_j − s_k))"
    return (f"<h3>{esc(f'query {w.query} (position {w.position}): p_j = softmax(kq·{w.kq_scale:.6g} + mask)_j, {how}')}"
            f"</h3>" + table(("slot", "token", "kq s_j", "s_j·scale", "mask", "softmax", "kq_soft_max", "|err|",
                              "bound", ""), rows) + lines([mask_line(w)] + ([r.why_not] if r.why_not else []), "dim"))


def weighted(w: HeadWalk) -> str:
    ws = w.weighted
    if ws is None:
        return f'<p class="note">{esc("weighted sum not recomputed: " + w.weighted_why_not)}</p>'
    rows = [(f"d{d}", _fmt(ws.weighted_sum[i], 6), _fmt(ws.kqv[i]), _err(ws.error[i]), _err(ws.bound[i]),
             "ok" if ws.error[i] <= ws.bound[i] else "FAIL") for i, d in enumerate(int(x) for x in ws.dims)]
    title = (f"O_h[{w.query}, d] = Σ_j p_j·V_h[j, d] over the visible slots {span(ws.slots)} (p_j as dumped; V_h "
             f"of KV head {w.kv_head})")
    return f"<h3>{esc(title)}</h3>" + table(("dim", "Σ p_j v_j", "kqv", "|err|", "bound", ""), rows)


def model_rows(mw: ModelWalk) -> str:
    rows = [(r.name, r.node or "—", f"{r.printed} of {len(r.index)}",
             _err(float(np.nanmax(np.abs(r.dumped - r.reference))) if r.printed else float("nan")))
            for r in mw.rows]
    return (f"<h3>{esc(f'the walked query from the model ({mw.model}, {mw.arch})')}</h3>" +
            table(("row", "node", "printed", "max |dumped − reference|"), rows))


def head_page(dump: Dump | str | BinaryIO, layer: int, head: int, *, query: int | None = None, evaluation: int = 0,
              kq_scale: float | None = None, model=None, tokens: tuple[int, ...] | None = None,
              vocab: Sequence[str] | None = None) -> tuple[HeadWalk, ModelWalk | None, str]:
    """The walk (and the model's side of it), and the page showing both with the head's heatmaps."""
    model = open_model(model) if model is not None else None
    header_ = model.header if model is not None else None
    given = given_facts(Options(kq_scale=kq_scale), header_)
    if not isinstance(dump, Dump):
        dump = read_dump(dump)
    src = dump.source
    ev, site, run_views = select(dump, evaluation, layer)
    w = walk_site(src, ev, site, head, query, run_views, given)
    only, layers = frozenset({head}), frozenset({layer})
    reports = head_reports(src, ev, pinned_facts(run_views, given)[0], layer, head)  # the facts the walk used
    mw = reference = None
    entry = model.entry if model is not None else None
    if entry is not None and entry.forward is not None:
        mw, model_reports, reference = model_walk_site(src, ev, site, w, model, given.kq_scale.value,  # type: ignore
                                                       tokens)
        reports = merge(reports, model_reports)
    collected = PageData(src, only, layers)
    collected.evaluation(ev, reference)
    for sr in reports:
        collected.site(sr)
    passed = w.passed and (mw is None or mw.passed)
    body = (f'<section class="dump"><p class="verdict {"pass" if passed else "fail"}">'
            f"{esc(Text.from_markup(verdict(w)).plain)}</p>{header(w, vocab)}{scores(w, vocab)}{weighted(w)}"
            f"{model_rows(mw) if mw is not None else ''}{lines(list(w.notes), 'warnings')}</section>"
            '<section id="head-view" hidden></section>')
    data = {"kind": "inspect", "open": {"d": 0, "e": ev.index, "l": layer, "h": head},
            "dumps": [{"source": src, "sites": collected.sites, "tokens": collected.tokens, "strings": collected.strings,
                       "vocab": token_texts(collected.tokens, vocab)}]}
    return w, mw, document(f"attncheck inspect: {src} layer {layer} head {head}", body, data, "inspect")
