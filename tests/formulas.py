"""The numbers attncheck's checks rest on, written again here from docs/format.md §6 and docs/numerics.md §2,
apart from attncheck's own code: a test that took a bound from attncheck would move with the bound it tests.

    site = Site(DumpEdit(FIXTURES / "gpt2-ubatch2.txt", tmp_path / "d.txt"), layer=0, ev=2)   # n_past = 4
    p = site.recompute(head, query)                 # softmax(kq · scale) over the visible slots, from printed kq
    softmax_bound(p, site.scale)                    # 5e-5 + p·(e^{2·scale·5e-5} − 1)

Every printed value is read through tests/dumpedit.py (which does not use attncheck's parser either).
"""
from __future__ import annotations

import io
import math
import re

import numpy as np

from dumpedit import DumpEdit, printed

PRINT = 5e-5  # `%12.4f`: a printed value is within half a unit of the 4th decimal of the stored one
STEP = 1e-4  # the smallest change a `%12.4f` print can show
SUM_PRINT = 5e-7  # `sum = %f`
F32 = 2.0**-24  # f32 unit roundoff
SRC1 = {"f16": 2.0**-11, "bf16": 2.0**-8, "f32": 0.0}  # P rounded to V's type before P·V (docs/format.md §6)
DIFF_ATOL, DIFF_RTOL = 1e-4, 2.0**-16  # docs/numerics.md §4.1: 1e-4 + 2⁻¹⁶·|x|


def softmax_bound(p, scale: float):
    """|printed P − softmax(printed kq · scale)|: P's own print, plus kq's print through softmax (each score within
    5e-5, so x_j − x_k moves by at most 2·scale·5e-5 and p by at most p·(e^{2·scale·5e-5} − 1)). The f32 term
    docs/numerics.md §2.3 adds (about (n + 2|x|)·2⁻²⁴·p) is below 1 % of this bound on the shipped dumps."""
    return PRINT + np.asarray(p) * math.expm1(2 * scale * PRINT)


def ratio_bound(pred, p_ref, scale: float):
    """|p_j − p_k·exp(scale·(s_j − s_k))|: p_j's print; p_k's print, relative 5e-5/p_k; two scores' prints."""
    return PRINT + np.asarray(pred) * (PRINT / p_ref + math.expm1(2 * scale * PRINT))


def pv_bound(P: np.ndarray, V: np.ndarray, v_type: str) -> float:
    """|printed O − Σ_j P_j V_j| over the visible slots: O's print, P's print times |V|, V's print times P (and P's
    error), P rounded to V's type (2⁻¹¹ for f16), f32 accumulation of n terms."""
    n = len(P)
    a = np.abs(V)
    return float(PRINT + (a * PRINT).sum() + ((P + PRINT) * PRINT).sum() + (a * P).sum() * (SRC1[v_type] + n * F32))


def sum_bound(n_terms: int, magnitude: float, n_rows: int = 0, row_len: int = 0) -> float:
    """A printed `sum = %f`: f32 accumulation of n non-zero terms, n·2⁻²⁴·Σ|x|, and the `%f` print. For SOFT_MAX
    rows that should each sum to 1, also how far a row may be from 1: each of its (at most row_len) weights is
    rounded to f32 in expf and in the multiplication by 1/sum, the sum and 1/sum once each, about
    (row_len + 4)·2⁻²⁴ per row."""
    return n_terms * F32 * magnitude + n_rows * (row_len + 4) * F32 + SUM_PRINT


def diff_tolerance(x: float) -> float:
    return DIFF_ATOL + DIFF_RTOL * abs(x)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def kv_head(h: int, H: int, H_kv: int) -> int:
    """docs/format.md §4: query head h reads KV head h // (H / H_kv)."""
    return h // (H // H_kv)


class Site:
    """One layer's attention in one evaluation of a dump, as printed: kq, kq_soft_max, kqv and the V view."""

    def __init__(self, edit: DumpEdit, layer: int, ev: int = 0):
        self.edit, self.layer, self.ev = edit, layer, ev
        soft = f"kq_soft_max-{layer}"
        self.softmax = soft if edit.headers(soft) else f"kq_soft_max_ext-{layer}"  # the older format's name
        self.kq, self.kqv = f"kq-{layer}", f"kqv-{layer}"
        self.P = edit.node(self.softmax, ev)
        self.O = edit.node(self.kqv, ev)
        self.V = edit.source0(self.kqv, ev)
        self.v_occurrence = edit.headers(self.V.name).index(self.V.header)
        self.n_past = sum(edit.node(self.softmax, k).ne[1] for k in range(ev))  # T of the earlier evaluations
        self.n_kv, self.T, self.H, _ = self.P.ne
        self.D_h, self.H_kv = self.O.ne[0], self.V.ne[2]
        self.scale = 1 / math.sqrt(self.D_h)

    # --- the geometry ------------------------------------------------------------------------------------------
    def visible(self, t: int) -> list[int]:
        """Slots query t may read: 0..n_past + t (the causal mask)."""
        return list(range(self.n_past + t + 1))

    def whole(self, t: int) -> bool:
        """Every visible slot of query t's row was printed."""
        return set(self.visible(t)) <= set(printed(self.n_kv))

    def printed_visible(self, t: int) -> list[int]:
        return [j for j in printed(self.n_kv) if j <= self.n_past + t]

    def masked(self, t: int) -> list[int]:
        return [j for j in printed(self.n_kv) if j > self.n_past + t]

    # --- printed values ----------------------------------------------------------------------------------------
    def p(self, h: int, t: int, slots) -> np.ndarray:
        return np.array([self.edit.get(self.softmax, (h, t, j), self.ev) for j in slots])

    def s(self, h: int, t: int, slots) -> np.ndarray:
        return np.array([self.edit.get(self.kq, (h, t, j), self.ev) for j in slots])

    def o(self, h: int, t: int, d: int) -> float:
        return self.edit.get(self.kqv, (h, t, d), self.ev)

    def v(self, h: int, d: int, slots) -> np.ndarray:
        """V_h[slots, d] of the KV head query head h reads."""
        g = kv_head(h, self.H, self.H_kv)
        return np.array([self.edit.get(self.V.name, (g, d, j), self.v_occurrence) for j in slots])

    # --- recomputed ---------------------------------------------------------------------------------------------
    def recompute(self, h: int, t: int, kq: np.ndarray | None = None) -> np.ndarray:
        """softmax(kq · scale) over the visible slots of a whole row, from printed kq (or the given scores)."""
        s = self.s(h, t, self.visible(t)) if kq is None else kq
        return softmax(s * self.scale)

    def pv(self, h: int, t: int, d: int) -> tuple[float, float]:
        """(Σ_j P_j V_j over the visible slots, its bound) for a whole row, from printed P and V."""
        slots = self.visible(t)
        P, V = self.p(h, t, slots), self.v(h, d, slots)
        return float(P @ V), pv_bound(P, V, self.V.type)


def text(edit: DumpEdit) -> io.BytesIO:
    """The edited dump as a stream, for attncheck.verify in this process."""
    return io.BytesIO("\n".join(edit.lines).encode("latin-1"))


def tokens(edit: DumpEdit) -> list[int]:
    """The token ids llama.cpp logs after `number of input tokens = N` (one per line, the id last)."""
    for i, line in enumerate(edit.lines):
        m = re.search(r"number of input tokens = (\d+)", line)
        if m:
            return [int(edit.lines[i + 1 + k].split()[-1]) for k in range(int(m.group(1)))]
    raise LookupError("no token ids in the log")


def nearest_printed(value: float) -> float:
    return float("%.4f" % value)
