"""`inspect --model`: one head's full rows from the model's reference forward pass, beside what the dump printed.

The dump prints 6 of D_h dims and 6 of n_kv slots; the reference has all of them. For the walked query at position
pos: q [D_h], K_h and V_h [pos + 1, D_h] (the visible slots), kq and kq_soft_max [pos + 1], kqv [D_h]; each paired
with the dumped value where llama.cpp printed one (NaN where it did not). The verdicts are those of
`check --model` (model/checker.py) for this layer, restricted to this head, so inspect and check agree.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import BinaryIO

import numpy as np

from ..arch.facts import AttentionFacts
from ..results import CheckResult, SiteReport
from ..dump.attention import Site
from ..dump.graph import Dump, Evaluation, read_dump
from ..sites.heads import kv_head
from ..model.checker import ModelChecker
from ..model.reference import Reference
from ..dump.sample import Sample, parse_sample
from ..arch.context import open_model
from ..arch.vocab import token_text
from ..verify import Options, given_facts
from .walk import HeadWalk, select, walk, walk_site


@dataclass(frozen=True)
class FullRow:
    """One logical row over all its indices: the reference [n] and the dumped value where printed (NaN if not)."""

    name: str  # q | kq | kq_soft_max | kqv
    node: str | None  # the dumped node, if printed
    index: np.ndarray  # [n] dims or slots
    reference: np.ndarray  # [n]
    dumped: np.ndarray  # [n], NaN where not printed

    @property
    def printed(self) -> int:
        return int(np.count_nonzero(~np.isnan(self.dumped)))


@dataclass(frozen=True)
class ModelWalk:
    """The reference side of a walk: full rows of the query and head, K_h/V_h of the visible slots, and the checks."""

    model: str
    arch: str
    arithmetic: dict
    rows: tuple[FullRow, ...]  # q, kq, kq_soft_max, kqv
    K_h: np.ndarray  # [pos + 1, D_h] as stored in the cache
    V_h: np.ndarray  # [pos + 1, D_h]
    results: tuple[CheckResult, ...]  # --model checks of the layer, this head's elements only

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)


def _dumped(s: Sample | None, head: int, query: int, n: int) -> np.ndarray:
    """[n] the printed values of (head, query) along the last axis of a [H, T, x] node; NaN where not printed."""
    out = np.full(n, np.nan)
    if s is None:
        return out
    hp, qp = s.position(1, head), s.position(2, query)
    if hp is not None and qp is not None:
        out[s.index[3]] = s.values[0, hp, qp]
    return out


def walk_head(dump: str, layer: int, head: int, *, query: int | None = None, evaluation: int = 0,
              kq_scale: float | None = None, model=None,
              tokens: tuple[int, ...] | None = None) -> tuple[HeadWalk, "ModelWalk | None"]:
    """`attncheck inspect`: the walk under the facts the options and the model's header give (the rest pinned on the
    run), and the model's full rows when attncheck has a reference forward pass for its architecture. model: a path,
    or the context a command opened (arch/context.py)."""
    model = open_model(model) if model is not None else None
    header = model.header if model is not None else None
    given = given_facts(Options(kq_scale=kq_scale), header)
    entry = model.entry if model is not None else None
    if entry is None or entry.forward is None:
        w, mw = walk(dump, layer, head, query=query, evaluation=evaluation, given=given), None
    else:
        w, mw = walk_with_model(dump, layer, head, model, query=query, evaluation=evaluation,  # type: ignore[arg-type]
                                kq_scale=kq_scale, tokens=tokens, given=given)
    if header is not None:  # with a model, the run's tokens as text
        text = token_text(header.meta, w.tokens if w.tokens is not None else tokens)
        w = replace(w, token_texts=tuple(text) if text is not None else None)
    return w, mw


def walk_with_model(dump: Dump | str | BinaryIO, layer: int, head: int, model, query: int | None = None,
                    evaluation: int = 0, kq_scale: float | None = None,
                    tokens: tuple[int, ...] | None = None,
                    given: AttentionFacts | None = None) -> tuple[HeadWalk, ModelWalk]:
    """The walk of `walk.walk`, and the model's full rows for the same evaluation, layer, head and query, both under
    the given facts (verify.given_facts: kq_scale's and the model's header's when not given)."""
    model = open_model(model)
    if not isinstance(dump, Dump):
        dump = read_dump(dump)
    ev, site, run_views = select(dump, evaluation, layer)
    given = given if given is not None else given_facts(Options(kq_scale=kq_scale), model.header)
    w = walk_site(dump.source, ev, site, head, query, run_views, given)
    return w, model_walk_site(dump.source, ev, site, w, model, given.kq_scale.value, tokens)[0]


def model_walk_site(src: str, ev: Evaluation, site: Site, w: HeadWalk, model, kq_scale: float | None = None,
                    tokens: tuple[int, ...] | None = None) -> tuple[ModelWalk, list[SiteReport], Reference]:
    """The model's side of a walk of one selected site, with the --model SiteReports of the walked layer (this
    head's elements only) and the run's reference; kq_scale: the given fact's (verify.given_facts), None for the
    model's header's own."""
    layer, head, model = w.layer, w.head, open_model(model)
    checker = ModelChecker(model.path, src, kq_scale=kq_scale, tokens=tokens, header=model.header,
                           layers=frozenset({layer}), heads=frozenset({head}))
    reports = [sr for sr in checker.check(ev) if sr.layer == layer]
    results = [r for sr in reports for r in sr.results]
    expected, arithmetic = checker.current  # type: ignore[misc]
    ref = expected.ref
    pos, g = w.position, int(kv_head(head, w.H, w.H_kv))
    slots = np.arange(pos + 1)
    q = np.asarray(ref.get(layer, "Qcur"))[pos, head]
    kq = np.asarray(ref.get(layer, "kq"))[head, pos, :pos + 1]
    p = np.asarray(ref.get(layer, "kq_soft_max"))[head, pos, :pos + 1]
    o = np.asarray(ref.get(layer, "kqv"))[head, pos]
    sample = lambda n: parse_sample(n, src) if n is not None and not n.quantized else None  # noqa: E731
    Q, S, P, O = sample(site.q), sample(site.kq), sample(site.softmax), sample(site.kqv)
    d_h = len(q)
    rows = (
        FullRow("q", site.q.name if site.q else None, np.arange(d_h), q, _dumped(Q, head, w.query, d_h)),
        FullRow("kq", site.kq.name if site.kq else None, slots, kq, _dumped(S, head, w.query, site.n_kv)[:pos + 1]),
        FullRow("kq_soft_max", site.softmax.name, slots, p, _dumped(P, head, w.query, site.n_kv)[:pos + 1]),
        FullRow("kqv", site.kqv.name if site.kqv else None, np.arange(d_h), o, _dumped(O, head, w.query, d_h)),
    )
    K_h = np.asarray(ref.get(layer, "k_view"))[g, :pos + 1]
    V_h = np.asarray(ref.get(layer, "v_view"))[g, :, :pos + 1].T
    mw = ModelWalk(model.path, ref.hparams.arch, arithmetic, rows, K_h, V_h, tuple(results))
    return mw, reports, ref
