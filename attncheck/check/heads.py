"""Attention sites → per-head views: the printed scores, weights, values and outputs of a site, aligned by head.

GGML stores kq and kq_soft_max as {n_kv, T, H, 1}, i.e. numpy [H, T, n_kv]; kqv as {D_h, T, H, 1}, numpy
[H, T, D_h]; the V cache view as {n_kv, D_h, H_kv, 1}, numpy [H_kv, D_h, n_kv]. Query head h reads KV head
h // (H / H_kv) (GGML's broadcast in MUL_MAT). Which slots a query sees, and what SOFT_MAX adds to their scores,
follows from the site's facts (mask.py): `view.under(facts)`.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..dump.graph import Site
from ..dump.sample import Sample
from ..errors import DumpError
from .mask import Geometry, Mask, SiteFacts, full_mask


def kv_head(h: np.ndarray | int, H: int, H_kv: int) -> np.ndarray | int:
    """The KV head that query head h reads (GQA/MQA: H_kv divides H)."""
    return h // (H // H_kv)


@dataclass(frozen=True)
class SiteView:
    """The printed part of one site, per head. h, t, j, d are printed heads, queries, slots and dims.

    S: [h, t, j] the scores SOFT_MAX reads     P: [h, t, j] weights kq_soft_max
    O: [h, t, d] kqv (None if absent)          V: [h, d, j] V_h of each printed head (0 where kv_printed is False)
    """

    site: Site
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
    sums: tuple[float, ...] = ()  # the SOFT_MAX `sum =` lines
    P_all: np.ndarray | None = None  # every printed weight, all heads (what `sum` added up before PR #15637)

    @property
    def n_past(self) -> int:
        return self.geometry.n_past

    def under(self, facts: SiteFacts) -> "Under":
        return Under(self, facts)


@dataclass(frozen=True, eq=False)
class Under:
    """A view under the facts of its site: which printed slots each query sees, what SOFT_MAX adds to them."""

    view: SiteView
    facts: SiteFacts

    @cached_property
    def mask(self) -> Mask:
        return Mask(self.view.geometry, self.facts, self.view.queries, self.view.slots)

    @cached_property
    def visible(self) -> np.ndarray:
        """[t, j] printed slot j visible to printed query t."""
        return self.mask.visible

    @cached_property
    def n_visible_all(self) -> np.ndarray:
        """[T] how many slots each query of the evaluation sees, printed or not."""
        return full_mask(self.view.geometry, self.facts).visible.sum(axis=1)

    @cached_property
    def n_visible(self) -> np.ndarray:
        """[t] how many slots each printed query sees, printed or not."""
        return self.n_visible_all[self.view.queries]

    @cached_property
    def rows_whole(self) -> np.ndarray:
        """[t] every visible slot of the row was printed, so the row's softmax and P·V can be recomputed."""
        return self.visible.sum(axis=1) == self.n_visible

    @cached_property
    def bias(self) -> np.ndarray | None:
        """[h, t, j] ALiBi's bias on the printed slots (None without ALiBi)."""
        return self.mask.bias(self.view.heads)

    @cached_property
    def sinks(self) -> np.ndarray | None:
        """[h] the sink logit of each printed head (None without sinks)."""
        s = self.facts.sinks
        return None if s is None else np.asarray(s, dtype=np.float64)[self.view.heads]

    @cached_property
    def sink_err(self) -> np.ndarray | None:
        e = self.facts.sink_err
        return None if e is None else np.asarray(e, dtype=np.float64)[self.view.heads]

    @property
    def scale(self) -> float:
        return self.facts.kq_scale

    def scaled(self) -> np.ndarray:
        """[h, t, j] kq·scale + bias on visible slots, −inf on masked ones (what SOFT_MAX exponentiates)."""
        x = self.view.S * self.scale
        if self.bias is not None:
            x = x + self.bias
        return np.where(self.visible[None], x, -np.inf)


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
        V_h = np.zeros((len(heads), len(dims), len(slots)))
        kv_printed = np.zeros(len(heads), bool)
        for i, h in enumerate(heads):
            g = V.position(1, int(kv_head(int(h), H, H_kv)))
            if g is not None:
                V_h[i], kv_printed[i] = V.values[0, g], True
    return SiteView(
        site=site,
        geometry=Geometry(n_past, site.T, site.n_kv, site.kv_cached),
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
        sums=P.sums,
        P_all=P.values,
    )


def select_heads(view: SiteView, heads: set[int]) -> SiteView:
    """The same view restricted to some logical heads (`--head`)."""
    keep = np.isin(view.heads, sorted(heads))
    pick = lambda a: None if a is None else a[keep]  # noqa: E731
    return SiteView(view.site, view.geometry, view.heads[keep], view.queries, view.slots, view.dims,
                    pick(view.S), view.P[keep], pick(view.O), pick(view.V), view.v_type, pick(view.kv_printed),
                    view.sums, view.P_all)
