"""What one printed node should hold: the reference at its printed elements and the allowances of its error model
(bounds.py), and the figures of the whole tensor its `sum =` line is checked against."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .bounds import DERIVED, DERIVED_ROWS
from .chaos import kept_rms
from .expect import Expected
from .grid import locate
from .mapping import CANONICAL, Layer, Mapped
from .weighted_mean import QUANTITIES, refined


@dataclass(frozen=True)
class Whole:
    """The whole node (its `sum =` line): the reference's sum, Σ|x|, Σx², element count, and the sums of the
    allowances every element may use (extra)."""

    total: float
    magnitude: float
    squares: float
    n: int
    extra: float


@dataclass(frozen=True)
class Expectation:
    """A node's reference at its printed elements [p2, p1, p0], with the allowances of its error model."""

    model: str  # derived | cascade, + "+flash"
    want: np.ndarray  # the reference
    extra: np.ndarray  # allowances every element may use (layer 0's noise and roundings, the flash kernel)
    valid: np.ndarray  # True where the node holds a value of the tensor, False in empty cache slots
    whole: Whole | None  # None when the reference does not hold the whole tensor (the logits)
    unit: np.ndarray | None = None  # cascade: the allowance unit of each printed element (rms of the value × row gain)
    note: str = ""  # what the result should say of what was compared (a role at an earlier node than its last)
    chaos: tuple[float, float] = (0.0, 0.0)  # cascade: the twin's (chaos_max, chaos_row) of its layer (chaos.py)

    @property
    def derived(self) -> bool:
        return self.model.startswith("derived")


def expectation(exp: Expected, L: Layer, m: Mapped, n_past: int, T: int, printed: tuple[np.ndarray, ...],
                position: int | None = None) -> Expectation | None:
    """The reference of a mapped node at its printed indices (per axis), or None when its ne does not fit; position:
    a rows node's place after its weight MUL_MAT (dump/paths.py position_after_matmul, read while the graph is
    at hand)."""
    node, ref_layer = m.node, m.ref_layer
    if m.role == "result_output":
        return _logits(exp, node, n_past, T, printed, position)
    flash = L.flash and m.quantity == "kqv"
    derived = (ref_layer == 0 and m.quantity in DERIVED) or (m.role in DERIVED_ROWS and ref_layer in (0, None))
    canon = CANONICAL[m.quantity]
    position = position if m.quantity == "rows" and m.key is None else None
    ref = exp.value(m.quantity, m.role, ref_layer, position, m.key)
    g = locate(canon, m.labels, m.ne, n_past, T, printed, ref.shape, m.via, m.before)
    if g is None:
        return None
    terms = []
    if flash:
        terms.append(exp.flash(ref_layer))  # type: ignore[arg-type]
    if derived and ref_layer == 0:
        name = "kqv@flash" if flash else m.key or m.quantity
        terms.append(refined(exp, name, g.index) if name in QUANTITIES else exp.noise(name))
    terms = [t for t in terms if t is not None]
    extra = sum((g.take(t) for t in terms), np.zeros(g.valid.shape))
    whole = Whole(*_sums(exp, m, ref, position, g.region), sum(float(g.block(t).sum()) for t in terms))
    model = ("derived" if derived else "cascade") + ("+flash" if flash else "")
    unit = None if derived else g.take(_unit(exp, m, ref, position))
    return Expectation(model, g.take(ref), extra, g.valid, whole, unit,
                       note=exp.ref.at_node(ref_layer, m.role, position)[1] if position is not None else "",
                       chaos=(0.0, 0.0) if derived else exp.chaos(ref_layer))


def _value_key(m: Mapped, position: int | None) -> tuple:
    """What names the reference value a mapped node reads (Expected.value's arguments): the keys of what is kept per
    value in Expected._cache."""
    return m.ref_layer, m.key or m.quantity, m.role if m.quantity == "rows" else "", position


def _sums(exp: Expected, m: Mapped, ref: np.ndarray, position: int | None, region: tuple[slice, ...]
          ) -> tuple[float, float, float, int]:
    """Σx, Σ|x|, Σx² (f64) and the count of the reference over a whole node's block: kept per value and block, since
    a value's copies and views (kqv, kqv_out and its permutes; the K cache, its store and views) cover the same one."""
    key = ("sums", *_value_key(m, position), tuple((r.start, r.stop, r.step) for r in region))
    got = exp._cache.get(key)
    if got is None:
        block = np.asarray(ref)[region]
        got = exp._cache[key] = (float(block.sum(dtype=np.float64)), float(np.abs(block).sum(dtype=np.float64)),
                                 float(np.square(block, dtype=np.float64).sum()), int(block.size))
    return got  # type: ignore[return-value]


def _unit(exp: Expected, m: Mapped, ref: np.ndarray, position: int | None) -> np.ndarray:
    """The cascade allowance's unit over the canonical array: the rms of the whole reference value (every token, every
    element but exact zeros, the softmax's masked weights) — the same wherever the value is read (a copy, a view, a
    store: the arrays are equal) — times, for a norm's output y_t = w·x_t/rms(x_t), its row's gain
    rms(x)/rms(x_t) (>= 1: a row whose rms is below the whole input's amplifies the deviation it carries)."""
    key = ("unit", *_value_key(m, position))
    got = exp._cache.get(key)
    if got is None:
        a = np.asarray(ref)
        rms = kept_rms(exp.ref.rms, a)
        got = np.broadcast_to(rms, a.shape)
        x = exp.norm_input(m.role, m.ref_layer) if m.quantity == "rows" and m.key in (None, m.role) else None
        if x is not None and x.shape[0] == a.shape[1]:
            ms = np.mean(np.square(np.asarray(x, np.float64)), axis=-1)  # [T_all]
            with np.errstate(divide="ignore"):
                gain = np.sqrt(np.mean(ms) / np.maximum(ms, 1e-30))
            got = np.broadcast_to(rms * np.maximum(gain, 1.0)[None, :, None], a.shape)
        exp._cache[key] = got
    return got


def _logits(exp: Expected, node, n_past: int, T: int, printed: tuple[np.ndarray, ...],
            position: int | None) -> Expectation | None:
    """result_output {n_vocab, rows}: the reference holds the logits at the vocabulary entries a dump prints only,
    so the `sum` of the whole vocabulary is not checked."""
    cols = exp.ref.vocab_cols
    if cols is None or node.ne[0] != exp.ref.hparams.n_vocab:
        return None
    # the logits, or, when the dump ends before them (llama.cpp's logger lost the tail), the output's node it ends on
    ref, note = exp.ref.at_node(None, "result_output", position)
    at = np.searchsorted(cols, printed[2])
    if np.any(at >= len(cols)) or np.any(cols[np.minimum(at, len(cols) - 1)] != printed[2]):
        return None
    g = locate(("one", "row", "col"), ("one", "row", "col"), (len(cols), *node.ne[1:]), n_past, T,
               (printed[0], printed[1], at), (1, *ref.shape))
    if g is None:
        return None
    want = g.take(np.asarray(ref)[None])
    zeros = np.zeros(want.shape)
    a = np.asarray(ref, np.float64)  # the logits the reference holds: every token at the printed vocabulary entries
    unit = np.full(want.shape, float(np.sqrt(np.mean(a * a))) if a.size else 0.0)
    return Expectation("cascade", want, zeros, g.valid, None, unit, note=note, chaos=exp.chaos(None))
