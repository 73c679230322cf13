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
        q_pos = g.n_past + self.queries
        k_pos = g.slot_base + self.slots
        out = np.full((len(q_pos), len(k_pos)), VISIBLE, np.int8)
        if f.window is not None:
            out[f.window.masks(q_pos, k_pos)] = OUTSIDE_WINDOW
        if f.causal:
            out[k_pos[None, :] > q_pos[:, None]] = LATER
        out[:, self.slots >= g.n_tokens] = EMPTY
        return out

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


def full_mask(geometry: Geometry, facts: SiteFacts, queries: np.ndarray | None = None) -> Mask:
    """The mask over every slot of the view (to count visible slots, printed or not)."""
    q = np.arange(geometry.T) if queries is None else queries
    return Mask(geometry, facts, q, np.arange(geometry.n_kv))
