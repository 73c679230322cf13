"""Attention sites → per-head views: the printed scores, weights, values and outputs of a site, aligned by head.

GGML stores kq and kq_soft_max as {n_kv, T, H, 1}, i.e. numpy [H, T, n_kv]; kqv as {D_h, T, H, 1}, numpy
[H, T, D_h]; the V cache view as {n_kv, D_h, H_kv, 1}, numpy [H_kv, D_h, n_kv]. Query head h reads KV head
h // (H / H_kv) (GGML's broadcast in MUL_MAT). Query t sits at position n_past + t and may read slot j iff
j <= n_past + t; every other slot (a later token of the same ubatch, or an empty slot) is masked to -inf.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..errors import DumpError
from ..dump.graph import Site
from ..dump.sample import Sample


def kv_head(h: np.ndarray | int, H: int, H_kv: int) -> np.ndarray | int:
    """The KV head that query head h reads (GQA/MQA: H_kv divides H)."""
    return h // (H // H_kv)


def visible(positions: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """[t, j] True where slot j is visible to the query at that position (the causal mask, 0 / -inf)."""
    return slots[None, :] <= positions[:, None]


@dataclass(frozen=True)
class SiteView:
    """The printed part of one site, per head. h, t, j, d are printed heads, queries, slots and dims.

    S: [h, t, j] raw scores kq          P: [h, t, j] weights kq_soft_max
    O: [h, t, d] kqv (None if absent)   V: [h, d, j] V_h of each printed head (0 where kv_printed is False)
    """

    site: Site
    n_past: int
    heads: np.ndarray  # [h] logical head indices
    queries: np.ndarray  # [t] query indices within the evaluation (position n_past + t)
    slots: np.ndarray  # [j] KV slots
    dims: np.ndarray  # [d] head dims printed in kqv and V
    S: np.ndarray | None
    P: np.ndarray
    O: np.ndarray | None
    V: np.ndarray | None
    v_type: str | None  # storage type of the V cache view (f16 by default)
    kv_printed: np.ndarray | None = None  # [h] the KV head this head reads was printed in the V view

    @cached_property
    def visible(self) -> np.ndarray:
        """[t, j] slot j visible to query t."""
        return visible(self.n_past + self.queries, self.slots)

    @cached_property
    def n_visible(self) -> np.ndarray:
        """[t] how many slots query t may read: n_past + t + 1."""
        return self.n_past + self.queries + 1

    @cached_property
    def rows_whole(self) -> np.ndarray:
        """[t] every visible slot of the row was printed, so the row's softmax and P·V can be recomputed."""
        return self.visible.sum(axis=1) == self.n_visible


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
        n_past=n_past,
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
    )


def select_heads(view: SiteView, heads: set[int]) -> SiteView:
    """The same view restricted to some logical heads (`--head`)."""
    keep = np.isin(view.heads, sorted(heads))
    pick = lambda a: None if a is None else a[keep]  # noqa: E731
    return SiteView(view.site, view.n_past, view.heads[keep], view.queries, view.slots, view.dims,
                    pick(view.S), view.P[keep], pick(view.O), pick(view.V), view.v_type, pick(view.kv_printed))
