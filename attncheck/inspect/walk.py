"""One head walked by hand: one query's scores, scale, mask, weights and weighted sum, recomputed beside the dump.

`walk(dump, layer, head)` picks a site and returns a `HeadWalk`: numbers only, no printing (render_walk.py shows
them). Per-head views as in FORMAT.md §2: Q_h, O_h [T, D_h]; K_h, V_h [n_kv, D_h]; S_h, P_h [T, n_kv]. The
recomputations and bounds are those of checks.py (softmax over the visible slots, Σ_j p_j v_j with the dumped
p_j), so `inspect` and `check` agree on every element.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO, NamedTuple

import numpy as np

from .. import precision
from ..check import bounds
from ..check.hypotheses import default_scale
from ..errors import DumpError
from ..dump.graph import Dump, Evaluation, Site, read_dump
from ..check.heads import kv_head
from ..dump.records import Node
from ..check.report import Report
from ..dump.sample import Sample, parse_sample

_CHAIN_OPS = ("PERMUTE", "VIEW", "RESHAPE", "CONT", "CPY")  # ops that only re-lay out q, k or v


class NothingToInspect(Exception):
    """The dump has no attention nodes to walk (flash attention, or no SOFT_MAX): exit 3, like `check`."""


class NodeShape(NamedTuple):
    """One node on the way to a head's attention: GGML ne, the GGML axis holding heads, the per-head shape."""

    role: str  # q | k | v | kq | scores | kq_soft_max | kqv
    name: str
    op: str
    type: str
    line: int
    ne: tuple[int, int, int, int]
    head_axis: int | None  # 0..3 (ne0..ne3): query heads, or KV heads for k and v; None if the layout is unknown
    logical: str  # "Q_h [T, D_h]"
    logical_shape: tuple[int, int]


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
    """Consecutive slots with one mask value for the chosen query: 0 (visible) or -inf (later token, empty)."""

    first: int
    last: int
    value: float
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

    @property
    def position(self) -> int:
        return self.n_past + self.query

    @property
    def n_visible_cols(self) -> int:
        """Slots visible to some query of this evaluation: 0 .. n_past + T − 1."""
        return self.n_past + self.T

    def token(self, position: int) -> int | None:
        return self.tokens[position] if self.tokens is not None and position < len(self.tokens) else None

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


def span(values) -> str:
    """'0..11' for two or more consecutive integers, else '0, 1, 3'."""
    v = sorted(int(x) for x in values)
    if not v:
        return "none"
    if len(v) > 1 and v == list(range(v[0], v[-1] + 1)):
        return f"{v[0]}..{v[-1]}"
    return ", ".join(map(str, v))


def select(dump: Dump, evaluation: int, layer: int) -> tuple[Evaluation, Site]:
    """The evaluation and layer asked for; DumpError naming the valid range otherwise (reads no further than needed)."""
    chosen: Evaluation | None = None
    n_ev = flash = sites = 0
    for ev in dump.evaluations():
        n_ev += 1
        flash, sites = flash + len(ev.flash), sites + len(ev.sites)
        if ev.index == evaluation:
            chosen = ev
            break
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
        raise DumpError(dump.source, None, f"layer {layer} does not exist in evaluation {evaluation}: "
                                           f"layers {span(s.layer for s in chosen.sites)}")
    if chosen.n_past is None:
        raise DumpError(dump.source, site.softmax.line,
                        "cannot place this evaluation: an earlier one had no attention to count T")
    return chosen, site


def walk(dump: Dump | str | BinaryIO, layer: int, head: int, query: int | None = None, evaluation: int = 0,
         kq_scale: float | None = None) -> HeadWalk:
    """Walk head `head` of layer `layer` in evaluation `evaluation` for one query (default: see `default_query`)."""
    if not isinstance(dump, Dump):
        dump = read_dump(dump)
    ev, site = select(dump, evaluation, layer)
    return walk_site(dump.source, ev, site, head, query, kq_scale)


def walk_site(src: str, ev: Evaluation, site: Site, head: int, query: int | None = None,
              kq_scale: float | None = None) -> HeadWalk:
    """The walk of one selected site (select()): its samples parsed, then head_walk."""
    printable = lambda n: n is not None and not n.quantized  # noqa: E731
    P = parse_sample(site.softmax, src)
    S = parse_sample(site.scores, src) if printable(site.scores) else None
    O = parse_sample(site.kqv, src) if printable(site.kqv) else None
    V = parse_sample(site.v, src) if printable(site.v) else None
    K = parse_sample(site.k, src) if printable(site.k) else None
    Q = parse_sample(site.q, src) if printable(site.q) else None
    return head_walk(src, ev, site, head, query, kq_scale, P=P, S=S, O=O, V=V, K=K, Q=Q)


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


def default_query(n_past: int, queries: np.ndarray, slots: np.ndarray) -> tuple[int, str]:
    """The last printed query whose visible slots are all printed (its softmax can be recomputed), else the last."""
    whole = [int(t) for t in queries if np.count_nonzero(slots <= n_past + t) == n_past + t + 1]
    if whole:
        return whole[-1], "the last query whose visible slots are all printed"
    return int(queries[-1]), "the last printed query (no query has all its visible slots printed)"


def head_walk(source: str, ev: Evaluation, site: Site, head: int, query: int | None, kq_scale: float | None, *,
              P: Sample, S: Sample | None, O: Sample | None, V: Sample | None, K: Sample | None,
              Q: Sample | None) -> HeadWalk:
    """Build the walk from a site and its parsed samples (P kq_soft_max, S scores, O kqv, V/K cache views, Q q)."""
    H, T, n_kv, n_past = site.H, site.T, site.n_kv, ev.n_past
    hp = _check_index(source, "head", head, H, P.index[1], f" (layer {site.layer} has H = {H})")
    if query is None:
        query, query_origin = default_query(n_past, P.index[2], P.index[3])
    else:
        query_origin = "--query"
    tp = _check_index(source, "query", query, T, P.index[2], f" (T = {T}, positions {n_past}..{n_past + T - 1})")
    scale = kq_scale if kq_scale is not None else default_scale(site.D_h)
    H_kv = site.H_kv
    g = int(kv_head(head, H, H_kv)) if H_kv and H % H_kv == 0 else head
    notes: list[str] = []
    slots = P.index[3]
    row = _query_row(P.values[0, hp, tp], S.values[0, hp, tp] if S is not None else None, slots, n_past, query, T,
                     n_kv, scale)
    K_h = _kv_rows("K_h", K, g, transpose=False, notes=notes)
    V_h = _kv_rows("V_h", V, g, transpose=True, notes=notes)
    Q_h = None
    if Q is not None and Q.node.ne[2] == H:
        qp = Q.position(1, head)
        if qp is not None:
            Q_h = Rows("Q_h", Q.node, Q.index[2], Q.index[3], Q.values[0, qp], (Q.node.ne[1], Q.node.ne[0]))
    weighted, why = _weighted(row, O, hp, tp, V_h, V, slots)
    if S is None:
        notes.append("the scores SOFT_MAX reads were not printed: only the dumped weights are shown")
    if site.scores is not None and site.kq is not None and site.scores is not site.kq:
        notes.append(f"SOFT_MAX reads '{site.scores.name}' ({site.scores.op}), not kq itself: "
                     "its values are shown as kq")
    return HeadWalk(
        source=source, evaluation=ev.index, run=ev.run, n_past=n_past, T=T, layer=site.layer, head=head, H=H,
        H_kv=H_kv, kv_head=g, D_h=site.D_h, n_kv=n_kv, kq_scale=scale,
        scale_origin="--kq-scale" if kq_scale is not None else "1/sqrt(D_h)", tokens=ev.tokens, query=query,
        query_origin=query_origin, shapes=tuple(shapes(site)), Q_h=Q_h, K_h=K_h, V_h=V_h, row=row,
        weighted=weighted, weighted_why_not=why, P_h=P.values[0, hp], P_queries=P.index[2], P_slots=slots,
        notes=tuple(notes),
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


def _mask_ranges(position: int, n_past: int, T: int, n_kv: int) -> tuple[MaskRange, ...]:
    """The mask row of the query at `position`: 0 up to itself, −inf for later tokens of the ubatch, −inf empty."""
    out = [MaskRange(0, position, 0.0, "visible")]
    if position + 1 <= n_past + T - 1:
        out.append(MaskRange(position + 1, n_past + T - 1, -np.inf, "later tokens of this ubatch"))
    if n_past + T <= n_kv - 1:
        out.append(MaskRange(n_past + T, n_kv - 1, -np.inf, "empty"))
    return tuple(out)


def _query_row(p: np.ndarray, s: np.ndarray | None, slots: np.ndarray, n_past: int, t: int, T: int, n_kv: int,
               scale: float) -> QueryRow:
    """kq, scaled, mask, softmax recomputed over the visible slots (as checks.softmax_rows), errors and bounds."""
    pos = n_past + t
    vis = slots <= pos  # [j]
    n_visible = pos + 1
    whole = int(vis.sum()) == n_visible
    mask = np.where(vis, 0.0, -np.inf)
    softmax = np.where(vis, np.nan, 0.0)
    bound = np.where(vis, np.nan, 0.0)  # masked weights are exactly 0
    scaled = s * scale if s is not None else None
    why, ref = "", None
    if scaled is None:
        why = "the scores SOFT_MAX reads were not printed"
    elif not whole:
        why = (f"slots {span(np.setdiff1d(np.arange(n_visible), slots))} are visible but were not printed: "
               "the softmax normaliser is unknown")
        k = int(np.argmax(np.where(vis, p, -1.0)))  # the largest printed visible weight: the best-known reference
        if p[k] > precision.PRINT:
            ref = int(slots[k])
            others = vis & (slots != ref)
            with np.errstate(over="ignore", invalid="ignore"):
                pred = p[k] * np.exp(scale * (s - s[k]))
            softmax = np.where(others, pred, softmax)
            bound = np.where(others, np.nan_to_num(bounds.ratio_bound(pred, p[k], scale), nan=0.0), bound)
    else:
        x = np.where(vis, scaled, -np.inf)
        with np.errstate(invalid="ignore", over="ignore"):
            e = np.exp(x - x.max())
            softmax = e / e.sum()
        b = bounds.softmax_bound(softmax, scale, n_visible, np.abs(np.where(vis, x, 0.0)))
        bound = np.where(vis, np.nan_to_num(b, nan=0.0), 0.0)  # NaN marks "not compared": a NaN value must fail
    with np.errstate(invalid="ignore"):
        error = np.abs(p - softmax)
    return QueryRow(slots, vis, whole, s, scaled, mask, softmax, p, error, bound,
                    _mask_ranges(pos, n_past, T, n_kv), ref, why)


def _weighted(row: QueryRow, O: Sample | None, hp: int, tp: int, V_h: Rows | None, V: Sample | None,
              slots: np.ndarray) -> tuple[WeightedSum | None, str]:
    """Σ_j p_j v_j over the visible slots with the dumped p_j (as checks.pv), beside kqv, with bounds.pv_bound."""
    if O is None:
        return None, "kqv (MUL_MAT(v, kq_soft_max)) was not printed"
    if V_h is None:
        return None, "V_h was not printed"
    if not row.whole:
        return None, "the row's visible slots were not all printed"
    vis = row.visible
    Vh = V_h.values  # [j, d]
    p = np.where(vis, row.kq_soft_max, 0.0)  # [j]
    terms = p[:, None] * Vh  # [j, d]
    want = terms.sum(axis=0)  # [d]
    bound = np.nan_to_num(bounds.pv_bound(p[None, :], Vh.T, vis[None, :], V.node.type if V is not None else None))
    got = O.values[0, hp, tp]
    return WeightedSum(O.index[3], slots[vis], terms[vis], want, got, np.abs(got - want), bound), ""


def _head_axis_back(node: Node, src: Node, axis: int) -> int | None:
    """The head axis of `src` given that of `node` = op(src): kept by a same-ne view, swapped by permute(0,2,1,3)."""
    a, b = node.ne, src.ne
    if node.op == "PERMUTE" and axis in (1, 2) and b == (a[0], a[2], a[1], a[3]):
        return 3 - axis
    return axis if a == b else None


def _chain(node: Node | None) -> list[tuple[Node, int]]:
    """`node` (head axis ne2, as MUL_MAT reads it) and the nodes it is a re-layout of, oldest first."""
    if node is None:
        return []
    out = [(node, 2)]
    while node.op in _CHAIN_OPS and node.inputs[0] is not None:
        axis = _head_axis_back(node, node.inputs[0], out[0][1])
        if axis is None:
            break
        node = node.inputs[0]
        out.insert(0, (node, axis))
    return out


def shapes(site: Site) -> list[NodeShape]:
    """GGML ne of every node a head's attention reads or writes, beside its logical per-head shape."""
    T, n_kv, D = site.T, site.n_kv, site.D_h or 0
    out: list[NodeShape] = []

    def add(role: str, n: Node | None, axis: int | None, logical: str, shape: tuple[int, int]) -> None:
        if n is not None:
            out.append(NodeShape(role, n.name, n.op, n.type, n.line, n.ne, axis, logical, shape))

    for n, axis in _chain(site.q):
        add("q", n, axis, "Q_h [T, D_h]", (T, D))
    for n, axis in _chain(site.k):
        add("k", n, axis, "K_h [n_kv, D_h]", (n_kv, D))
    for n, axis in _chain(site.v):
        add("v", n, axis, "V_h [n_kv, D_h]", (n_kv, D))
    add("kq", site.kq, 2, "S_h [T, n_kv]", (T, n_kv))
    if site.scores is not None and site.scores is not site.kq:
        add("scores", site.scores, 2, "S_h [T, n_kv]", (T, n_kv))
    add("kq_soft_max", site.softmax, 2, "P_h [T, n_kv]", (T, n_kv))
    add("kqv", site.kqv, 2, "O_h [T, D_h]", (T, D))
    return out
