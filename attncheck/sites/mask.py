"""Facts → what SOFT_MAX added to each printed score: which slots a query sees (and why not), ALiBi's bias, the sink.

Slot j of a KV cache holds the token at position j (slots past n_past + T are empty); without a cache (encoders) the
slots are this evaluation's own tokens, at positions n_past + j. A windowed cache smaller than the tokens it has
seen reuses slots, so their positions are unknown: such a site is not checkable (`positions_known`).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..arch.facts import Window

# why a slot is masked (inspect shows it): 0 visible
VISIBLE, LATER, EMPTY, OUTSIDE_WINDOW = 0, 1, 2, 3
REASONS = {VISIBLE: "visible", LATER: "later token (causal)", EMPTY: "empty slot", OUTSIDE_WINDOW: "outside the window"}


@dataclass(frozen=True)
class SiteFacts:
    """The facts the checks of one site use (AttentionFacts resolved for its layer and D_h).

    scale_err: the uncertainty of an inferred scale (0 when the scale is exact); sinks [H] logits per head (in the
    units of the scaled scores) and sink_err [H] their uncertainty when fitted from the data.
    """

    kq_scale: float
    causal: bool = True
    window: Window | None = None
    slopes: np.ndarray | None = None  # [H] ALiBi slope per head
    sinks: np.ndarray | None = None  # [H]
    scale_err: float = 0.0
    sink_err: np.ndarray | None = None  # [H]


@dataclass(frozen=True)
class Geometry:
    """Where a site's queries and slots sit: positions n_past.., slots holding positions slot_base + j."""

    n_past: int
    T: int
    n_kv: int
    cached: bool  # K and V come from a KV cache (else from this evaluation's Kcur/Vcur: encoders)

    @property
    def slot_base(self) -> int:
        return 0 if self.cached else self.n_past

    @property
    def n_tokens(self) -> int:
        """Slots holding a token: n_past + T with a cache, T without."""
        return self.n_past + self.T if self.cached else self.T

    @property
    def positions_known(self) -> bool:
        """Every token seen so far has its own slot (a windowed cache smaller than that reuses slots)."""
        return self.n_tokens <= self.n_kv


@dataclass(frozen=True)
class Mask:
    """The mask of one site for some queries (all T by default) over some slots (all n_kv by default)."""

    geometry: Geometry
    facts: SiteFacts
    queries: np.ndarray  # [t] query indices in the evaluation
    slots: np.ndarray  # [j] slot indices

    @cached_property
    def reason(self) -> np.ndarray:
        """[t, j] VISIBLE, LATER, EMPTY or OUTSIDE_WINDOW."""
        g, f = self.geometry, self.facts
        n = np.array([f.window.n if f.window is not None else 0])
        kind = f.window.kind if f.window is not None else "standard"
        return reasons(np.array([g.n_past]), np.array([g.slot_base]), np.array([g.n_tokens]), self.queries,
                       self.slots, f.causal, n, kind)[0]

    @cached_property
    def visible(self) -> np.ndarray:
        """[t, j] slot j visible to query t."""
        return self.reason == VISIBLE

    def bias(self, heads: np.ndarray) -> np.ndarray | None:
        """[h, t, j] ALiBi's slope_h · (−|p_q − p_k|) on visible slots (0 elsewhere), or None without ALiBi."""
        if self.facts.slopes is None:
            return None
        g = self.geometry
        dist = np.abs((g.n_past + self.queries)[:, None] - (g.slot_base + self.slots)[None, :]).astype(np.float64)
        return np.where(self.visible[None], -self.facts.slopes[heads][:, None, None] * dist[None], 0.0)


def reasons(n_past: np.ndarray, slot_base: np.ndarray, n_tokens: np.ndarray, queries: np.ndarray,
            slots: np.ndarray, causal: bool, window: np.ndarray, kind: str) -> np.ndarray:
    """[s, t, j] why each slot is masked for each query, over sites s at their own n_past, slot_base, n_tokens and
    window size (0: no window): VISIBLE, LATER, EMPTY or OUTSIDE_WINDOW (llama_hparams::is_masked_swa)."""
    q_pos = n_past[:, None] + queries[None, :]  # [s, t]
    k_pos = slot_base[:, None] + slots[None, :]  # [s, j]
    out = np.full((len(n_past), len(queries), len(slots)), VISIBLE, np.int8)
    w = window[:, None, None]
    if (window > 0).any():
        d = q_pos[:, :, None] - k_pos[:, None, :]
        if kind == "standard":
            outside = d >= w
        elif kind == "symmetric":
            outside = np.abs(d) > w // 2
        elif kind == "chunked":  # keys before the query's chunk
            outside = k_pos[:, None, :] < (q_pos // np.maximum(window, 1)[:, None] * window[:, None])[:, :, None]
        else:
            raise ValueError(f"window kind {kind!r}")
        out[outside & (w > 0)] = OUTSIDE_WINDOW
    if causal:
        out[k_pos[:, None, :] > q_pos[:, :, None]] = LATER
    out[np.broadcast_to(slots[None, None, :] >= n_tokens[:, None, None], out.shape)] = EMPTY
    return out


def full_mask(geometry: Geometry, facts: SiteFacts, queries: np.ndarray | None = None) -> Mask:
    """The mask over every slot of the view (to count visible slots, printed or not)."""
    q = np.arange(geometry.T) if queries is None else queries
    return Mask(geometry, facts, q, np.arange(geometry.n_kv))
