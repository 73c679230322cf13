"""Attention sites → per-head views: the printed scores, weights, values and outputs of a site, aligned by head.

GGML stores kq and kq_soft_max as {n_kv, T, H, 1}, i.e. numpy [H, T, n_kv]; kqv as {D_h, T, H, 1}, numpy
[H, T, D_h]; the V cache view as {n_kv, D_h, H_kv, 1}, numpy [H_kv, D_h, n_kv]. Query head h reads KV head
h // (H / H_kv) (GGML's broadcast in MUL_MAT). Which slots a query sees, and what SOFT_MAX adds to their scores,
follows from the site's facts (mask.py): `Under(view, facts)` for one site, `Stack(views, facts)` for many at once.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from ..dump.attention import Site, SiteInfo
from ..dump.sample import Sample, printed_indices, row_lines
from ..errors import DumpError
from .mask import VISIBLE, Geometry, SiteFacts, reasons


def kv_head(h: np.ndarray | int, H: int, H_kv: int) -> np.ndarray | int:
    """The KV head that query head h reads (GQA/MQA: H_kv divides H)."""
    return h // (H // H_kv)


@dataclass(frozen=True)
class SiteView:
    """The printed part of one site, per head. h, t, j, d are printed heads, queries, slots and dims.

    S: [h, t, j] the scores SOFT_MAX reads     P: [h, t, j] weights kq_soft_max
    O: [h, t, d] kqv (None if absent)          V: [h, d, j] V_h of each printed head (0 where kv_printed is False)
    """

    site: SiteInfo
    geometry: Geometry
    heads: np.ndarray  # [h] logical head indices
    queries: np.ndarray  # [t] query indices within the evaluation (position n_past + t)
    slots: np.ndarray  # [j] KV slots
    dims: np.ndarray  # [d] head dims printed in kqv and V
    S: np.ndarray | None
    P: np.ndarray
    O: np.ndarray | None
    V: np.ndarray | None
    v_type: str | None  # storage type of the V cache view (f16 by default; f32 without a cache)
    kv_printed: np.ndarray | None = None  # [h] the KV head this head reads was printed in the V view
    P_rows: np.ndarray | None = None  # [h, t] the line of each printed row of kq_soft_max (and kq, its twin)
    O_rows: np.ndarray | None = None  # [h, t] the line of each printed row of kqv
    sums: tuple[float, ...] = ()  # the SOFT_MAX `sum =` lines
    P_all: np.ndarray | None = None  # every printed weight, all heads (what `sum` added up before PR #15637)

    @property
    def n_past(self) -> int:
        return self.geometry.n_past

    def placed(self, geometry: Geometry) -> SiteView:
        """The same view with another geometry (dump/pool.py numbers a part's n_past from the run's start once the
        parts before it are read): a copy of its fields, not dataclasses.replace, which costs several times more."""
        view = object.__new__(SiteView)
        view.__dict__.update(self.__dict__, geometry=geometry)
        return view



def stack_key(view: SiteView, facts: SiteFacts) -> tuple:
    """Sites with equal keys stack: the same printed indices and shapes, storage, and kind of mask."""
    w = facts.window
    return (view.site.H, view.site.T, view.geometry.n_kv, view.geometry.cached, facts.causal,
            None if w is None else w.kind, facts.slopes is not None, facts.sinks is not None, view.v_type,
            view.S is None, view.O is None, view.V is None, view.kv_printed is None,
            view.heads.tobytes(), view.queries.tobytes(), view.slots.tobytes(), view.dims.tobytes())


@dataclass(frozen=True, eq=False)
class Stack:
    """Sites of one printed shape under their facts, stacked along a leading site axis s, so that each check is one
    numpy expression over all of them. Shapes: P, S [s, h, t, j]; O [s, h, t, d]; V [s, h, d, j]."""

    views: list[SiteView]
    facts: list[SiteFacts]

    @property
    def heads(self) -> np.ndarray:
        return self.views[0].heads

    @property
    def queries(self) -> np.ndarray:
        return self.views[0].queries

    @property
    def slots(self) -> np.ndarray:
        return self.views[0].slots

    @property
    def dims(self) -> np.ndarray:
        return self.views[0].dims

    @property
    def v_type(self) -> str | None:
        return self.views[0].v_type

    def _stacked(self, name: str) -> np.ndarray | None:
        a = getattr(self.views[0], name)
        return None if a is None else np.stack([getattr(v, name) for v in self.views])

    @cached_property
    def P(self) -> np.ndarray:
        return self._stacked("P")

    @cached_property
    def S(self) -> np.ndarray | None:
        return self._stacked("S")

    @cached_property
    def O(self) -> np.ndarray | None:  # noqa: E743
        return self._stacked("O")

    @cached_property
    def V(self) -> np.ndarray | None:
        return self._stacked("V")

    @cached_property
    def kv_printed(self) -> np.ndarray | None:
        return self._stacked("kv_printed")

    @cached_property
    def scale(self) -> np.ndarray:
        """[s] the SOFT_MAX scale of each site."""
        return np.array([f.kq_scale for f in self.facts], dtype=np.float64)

    @cached_property
    def scale_err(self) -> np.ndarray:
        return np.array([f.scale_err for f in self.facts], dtype=np.float64)

    @cached_property
    def reason(self) -> np.ndarray:
        """[s, t, j] why each printed slot is masked for each printed query (mask.VISIBLE when it is not)."""
        return self._reasons(self.queries, self.slots)

    def _reasons(self, queries: np.ndarray, slots: np.ndarray) -> np.ndarray:
        return self._reasons_at(self._geometries(), queries, slots)

    def _geometries(self) -> np.ndarray:
        """[s, 4]: each site's n_past, slot base, token count and window size (0: none), what its mask depends on."""
        return np.array([(v.geometry.n_past, v.geometry.slot_base, v.geometry.n_tokens,
                          f.window.n if f.window is not None else 0) for v, f in zip(self.views, self.facts)])

    def _reasons_at(self, geo: np.ndarray, queries: np.ndarray, slots: np.ndarray) -> np.ndarray:
        f0 = self.facts[0]
        return reasons(geo[:, 0], geo[:, 1], geo[:, 2], queries, slots, f0.causal, geo[:, 3],
                       f0.window.kind if f0.window is not None else "standard")

    @cached_property
    def visible(self) -> np.ndarray:
        """[s, t, j] printed slot j visible to printed query t."""
        return self.reason == VISIBLE

    @cached_property
    def n_visible_all(self) -> np.ndarray:
        """[s, T] how many slots each query of the evaluation sees, printed or not: counted once per distinct
        geometry (an evaluation's layers differ in their window at most)."""
        v0 = self.views[0]
        geo, back = np.unique(self._geometries(), axis=0, return_inverse=True)
        counts = (self._reasons_at(geo, np.arange(v0.site.T), np.arange(v0.geometry.n_kv)) == VISIBLE).sum(axis=-1)
        return counts[back.reshape(-1)]

    @cached_property
    def n_visible_totals(self) -> tuple[list[int], list[int]]:
        """Per site: the slots its queries see, summed over the evaluation's queries, and the most one query sees
        (the terms of SOFT_MAX's `sum =` line), as Python ints."""
        a = self.n_visible_all
        return a.sum(axis=1).tolist(), a.max(axis=1, initial=0).tolist()

    @cached_property
    def n_visible(self) -> np.ndarray:
        """[s, t] how many slots each printed query sees, printed or not."""
        return self.n_visible_all[:, self.queries]

    @cached_property
    def rows_whole(self) -> np.ndarray:
        """[s, t] every visible slot of the row was printed, so its softmax and P·V can be recomputed."""
        return self.visible.sum(axis=-1) == self.n_visible

    @cached_property
    def positions_known(self) -> np.ndarray:
        """[s] every token seen has its own slot (a windowed cache smaller than that reuses slots)."""
        return np.array([v.geometry.positions_known for v in self.views])

    @cached_property
    def bias(self) -> np.ndarray | None:
        """[s, h, t, j] ALiBi's slope_h · (−|p_q − p_k|) on visible slots (0 elsewhere), or None without ALiBi."""
        if self.facts[0].slopes is None:
            return None
        slopes = np.stack([f.slopes[self.heads] for f in self.facts])  # [s, h]
        g = [v.geometry for v in self.views]
        q_pos = np.array([x.n_past for x in g])[:, None] + self.queries[None, :]
        k_pos = np.array([x.slot_base for x in g])[:, None] + self.slots[None, :]
        dist = np.abs(q_pos[:, :, None] - k_pos[:, None, :]).astype(np.float64)  # [s, t, j]
        return np.where(self.visible[:, None], -slopes[:, :, None, None] * dist[:, None], 0.0)

    @cached_property
    def sinks(self) -> np.ndarray | None:
        """[s, h] each printed head's sink logit (None without sinks; NaN where the rows did not agree on one)."""
        if self.facts[0].sinks is None:
            return None
        return np.stack([np.asarray(f.sinks, dtype=np.float64)[self.heads] for f in self.facts])

    @cached_property
    def sink_err(self) -> np.ndarray | None:
        if self.facts[0].sink_err is None or self.sinks is None:
            return None
        return np.stack([np.asarray(f.sink_err, dtype=np.float64)[self.heads] for f in self.facts])

    def scaled(self) -> np.ndarray:
        """[s, h, t, j] kq·scale + bias on visible slots, −inf on masked ones (what SOFT_MAX exponentiates)."""
        x = self.S * self.scale[:, None, None, None]
        if self.bias is not None:
            x = x + self.bias
        return np.where(self.visible[:, None], x, -np.inf)


def stacks(views: list[SiteView], facts: list[SiteFacts]) -> list[tuple[list[int], Stack]]:
    """The views grouped into stacks, each with the indices of its views in the input."""
    groups: dict[tuple, list[int]] = {}
    for i, (v, f) in enumerate(zip(views, facts)):
        groups.setdefault(stack_key(v, f), []).append(i)
    return [(idx, Stack([views[i] for i in idx], [facts[i] for i in idx])) for idx in groups.values()]


class Under:
    """One view under its facts (a stack of one), for code that walks a single site (inspect)."""

    def __init__(self, view: SiteView, facts: SiteFacts):
        self.view, self.facts = view, facts
        self.stack = Stack([view], [facts])

    @property
    def visible(self) -> np.ndarray:
        return self.stack.visible[0]

    @property
    def reason(self) -> np.ndarray:
        return self.stack.reason[0]

    @property
    def n_visible(self) -> np.ndarray:
        return self.stack.n_visible[0]

    @property
    def rows_whole(self) -> np.ndarray:
        return self.stack.rows_whole[0]

    @property
    def bias(self) -> np.ndarray | None:
        return None if self.stack.bias is None else self.stack.bias[0]

    @property
    def sinks(self) -> np.ndarray | None:
        return None if self.stack.sinks is None else self.stack.sinks[0]

    @property
    def scale(self) -> float:
        return self.facts.kq_scale

    def scaled(self) -> np.ndarray:
        return self.stack.scaled()[0]


@lru_cache(maxsize=256)
def _kv_rows(H: int, H_kv: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """[h] whether the KV head of each printed query head (of H) was printed (of H_kv), [h'] the printed row of V
    each of those reads (the first, as Sample.position), and whether those rows are V's printed rows as they are
    (0, 1, ... each once: then V's values are taken as a view, not copied); read-only, shared by the sites of one
    shape."""
    at: dict[int, int] = {}
    for g, kv in enumerate(printed_indices(H_kv).tolist()):
        at.setdefault(kv, g)
    where = [at.get(kv, -1) for kv in kv_head(printed_indices(H), H, H_kv).tolist()]
    printed, rows = np.array([g >= 0 for g in where], bool), np.array([g for g in where if g >= 0], np.int64)
    printed.setflags(write=False)
    rows.setflags(write=False)
    return printed, rows, rows.tolist() == list(range(len(at)))


def site_view(site: Site, n_past: int, P: Sample, S: Sample | None, O: Sample | None, V: Sample | None,
              source: str) -> SiteView:
    """Align the printed samples of a site by logical head, query, slot and dim."""
    heads, queries, slots = P.index[1], P.index[2], P.index[3]
    if S is not None and S.node.ne != P.node.ne:
        raise DumpError(source, S.node.line, f"scores '{S.node.name}' ne {S.node.ne} differ from weights "
                                             f"'{P.node.name}' (line {P.node.line}) ne {P.node.ne}")
    if O is not None and O.node.ne[1:] != P.node.ne[1:]:
        raise DumpError(source, O.node.line, f"kqv '{O.node.name}' ne {O.node.ne} does not fit weights "
                                             f"'{P.node.name}' (line {P.node.line}) ne {P.node.ne}")
    dims = O.index[3] if O is not None else np.arange(0)
    V_h = kv_printed = None
    if V is not None and O is not None:
        if V.node.ne[0] != P.node.ne[0] or V.node.ne[1] != O.node.ne[0]:
            raise DumpError(source, V.node.line, f"V view '{V.node.name}' ne {V.node.ne} does not fit kqv {O.node.ne}")
        H, H_kv = site.H, V.node.ne[2]
        if H_kv == 0 or H % H_kv:
            raise DumpError(source, V.node.line, f"{H} query heads cannot share {H_kv} KV heads")
        kv_printed, rows, in_order = _kv_rows(H, H_kv)
        if len(rows) == len(heads):  # every printed head's KV head was printed
            V_h = V.values[0] if in_order else V.values[0, rows]
        else:
            V_h = np.zeros((len(heads), len(dims), len(slots)))
            V_h[kv_printed] = V.values[0, rows]
    info = site.info()
    # made as `placed` copies one, every field set in its __dict__: a frozen dataclass's __init__ sets each through
    # object.__setattr__, which cost as much as the rest of this function (tests/test_dumps.py holds the fields)
    view = object.__new__(SiteView)
    view.__dict__.update(
        site=info,
        geometry=Geometry(n_past, info.T, info.n_kv, info.kv_cached),
        heads=heads,
        queries=queries,
        slots=slots,
        dims=dims,
        S=S.values[0] if S is not None else None,
        P=P.values[0],
        O=O.values[0] if O is not None else None,
        V=V_h,
        v_type=V.node.type if V is not None else None,
        kv_printed=kv_printed,
        P_rows=row_lines(P.node),
        O_rows=row_lines(O.node) if O is not None else None,
        sums=P.sums,
        P_all=P.values,
    )
    return view


def select_heads(view: SiteView, heads: set[int]) -> SiteView:
    """The same view restricted to some logical heads (`--head`)."""
    keep = np.isin(view.heads, sorted(heads))
    pick = lambda a: None if a is None else a[keep]  # noqa: E731
    return SiteView(view.site, view.geometry, view.heads[keep], view.queries, view.slots, view.dims,
                    pick(view.S), view.P[keep], pick(view.O), pick(view.V), view.v_type, pick(view.kv_printed),
                    pick(view.P_rows), pick(view.O_rows), view.sums, view.P_all)
