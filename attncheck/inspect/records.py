"""What `attncheck inspect` shows, as data: the rows of a head, the chosen query's row, the weighted sum, the walk.

Per-head views as in docs/format.md §4: Q_h, O_h [T, D_h]; K_h, V_h [n_kv, D_h]; S_h, P_h [T, n_kv].
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..dump.records import Node
from .shapes import NodeShape


@dataclass(frozen=True)
class Rows:
    """The printed part of a per-head matrix of logical shape [n_rows, n_cols] (queries or slots × head dims)."""

    name: str  # Q_h | K_h | V_h
    node: Node
    rows: np.ndarray  # [r] logical rows printed: queries (Q_h) or KV slots (K_h, V_h)
    cols: np.ndarray  # [c] logical head dims printed
    values: np.ndarray  # [r, c]
    shape: tuple[int, int]  # logical [T, D_h] or [n_kv, D_h]


class MaskRange(NamedTuple):
    """Consecutive slots with one mask reason for the chosen query: visible (0, or ALiBi's −slope·|p_q − p_k|), or
    −inf for a later token, an empty slot, or a slot outside the window."""

    first: int
    last: int
    value: float  # 0 or −inf (NaN: ALiBi's bias, which varies along the range)
    what: str


@dataclass(frozen=True)
class QueryRow:
    """The chosen query over the printed slots j: kq → ·kq_scale → + mask → softmax, beside kq_soft_max.

    Arrays are [j]. When some visible slot was not printed the normaliser is unknown: the visible weights are then
    recomputed relative to `reference` (as checks.softmax_ratio), p_j = p_k · exp(kq_scale · (s_j − s_k)).
    `softmax`, `error`, `bound` are NaN where nothing was recomputed; masked slots are exactly 0 either way.
    """

    slots: np.ndarray  # [j]
    visible: np.ndarray  # [j] bool
    whole: bool  # every visible slot of the row was printed
    kq: np.ndarray | None  # [j] the scores SOFT_MAX reads (None if not printed)
    scaled: np.ndarray | None  # [j] kq · kq_scale
    mask: np.ndarray  # [j] 0 or -inf
    softmax: np.ndarray  # [j] recomputed
    kq_soft_max: np.ndarray  # [j] dumped
    error: np.ndarray  # [j] |dumped − recomputed|
    bound: np.ndarray  # [j]
    mask_ranges: tuple[MaskRange, ...]
    reference: int | None  # slot k the visible weights were recomputed relative to (rows not wholly printed)
    why_not: str  # why the visible weights were not recomputed by a full softmax ('' when they were)
    reason: np.ndarray | None = None  # [j] mask.VISIBLE, LATER, EMPTY or OUTSIDE_WINDOW
    sink: float | None = None  # the head's sink logit, when the model has attention sinks
    sink_share: float | None = None  # the share of the row the sink takes (1 − Σ_j p_j), when the row is whole


@dataclass(frozen=True)
class WeightedSum:
    """O_h[t, d] = Σ_j p_j v_j over the visible slots, with the dumped p_j, for each printed dim d, beside kqv."""

    dims: np.ndarray  # [d]
    slots: np.ndarray  # [j] visible printed slots summed over
    terms: np.ndarray  # [j, d] p_j · V_h[j, d]
    weighted_sum: np.ndarray  # [d]
    kqv: np.ndarray  # [d] dumped
    error: np.ndarray  # [d]
    bound: np.ndarray  # [d] bounds.pv_bound


@dataclass(frozen=True)
class HeadWalk:
    """Everything `attncheck inspect` shows for one evaluation, layer, head and query."""

    source: str
    evaluation: int
    run: int
    n_past: int
    T: int
    layer: int
    head: int
    H: int
    H_kv: int
    kv_head: int  # the KV head this query head reads: head // (H / H_kv)
    D_h: int | None
    n_kv: int
    kq_scale: float
    scale_origin: str  # "1/sqrt(D_h)" or "--kq-scale"
    tokens: tuple[int, ...] | None  # the run's token ids, when the log printed them
    query: int  # index in the evaluation; its position is n_past + query
    query_origin: str  # "--query" or the default's reason
    shapes: tuple[NodeShape, ...]
    Q_h: Rows | None
    K_h: Rows | None
    V_h: Rows | None
    row: QueryRow
    weighted: WeightedSum | None
    weighted_why_not: str
    P_h: np.ndarray  # [t, j] dumped weights of the printed queries × printed slots
    P_queries: np.ndarray  # [t] printed queries
    P_slots: np.ndarray  # [j] printed slots
    notes: tuple[str, ...]
    P_reason: np.ndarray | None = None  # [t, j] why each printed weight is masked (mask.VISIBLE when it is not)
    visible_all: np.ndarray | None = None  # [t, n_kv] which slots each printed query sees, printed or not
    slot_base: int = 0  # slot j holds position slot_base + j (n_past without a KV cache)
    n_tokens: int = 0  # slots holding a token
    facts: tuple[str, ...] = ()  # the attention facts used, each with where it came from
    token_texts: tuple[str, ...] | None = None  # with a model: the text of each token of the run
    # no model, log or option gave the sliding window, the data pinned none, and this row's printed weights do not
    # confirm its visible slots (not all printed, or beyond their bounds): a window may mask the earliest of them
    window_unknown: bool = False

    @property
    def position(self) -> int:
        return self.n_past + self.query

    @property
    def n_visible_cols(self) -> int:
        """Slots holding a token of this run (the others are empty): 0 .. n_tokens − 1."""
        return self.n_tokens or self.n_past + self.T

    def token(self, position: int) -> int | None:
        return self.tokens[position] if self.tokens is not None and position < len(self.tokens) else None

    def token_text(self, position: int) -> str | None:
        t = self.token_texts
        return t[position] if t is not None and position < len(t) else None

    @property
    def compared(self) -> int:
        """Elements compared with a recomputation: weights of the chosen query and kqv dims."""
        n = int(np.count_nonzero(~np.isnan(self.row.bound)))
        return n + (len(self.weighted.dims) if self.weighted is not None else 0)

    @property
    def passed(self) -> bool:
        """Every compared element is within its bound (NaN: not compared)."""
        return self.worst_ratio <= 1.0

    @property
    def worst_ratio(self) -> float:
        """Largest |error| / bound over the compared elements (≤ 1 passes)."""
        pairs = [(self.row.error, self.row.bound)]
        if self.weighted is not None:
            pairs.append((self.weighted.error, self.weighted.bound))
        e, b = (np.concatenate(x) for x in zip(*pairs))
        e, b = e[~np.isnan(b)], b[~np.isnan(b)]  # a NaN bound marks an element that was not compared
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.where(e == 0, 0.0, np.where(np.isfinite(e), e / b, np.inf))  # a NaN/inf value never passes
        return float(r.max()) if len(r) else 0.0
