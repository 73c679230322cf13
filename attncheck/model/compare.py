"""One printed node against the reference: every printed element within its bound (bounds.py's error model),
NMSE per node, and the full-tensor `sum =` line; failures named by head, query, position, slot or dim."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import precision
from ..dump.sample import Sample, parse_sample, row_line
from ..results import CheckResult, Failure, Location, compare, compare_value, located, within
from .bounds import F32_REL, NMSE_MAX, PRINT, cascade, node_class
from .chaos import TWIN_GROSS, TWIN_SYSTEMATIC
from .grid import coords
from .node_expectation import Expectation, expectation
from .mapping import KV_QUANTITIES, Layer, Mapped
from .runs import Run
from .summary import Summary

CHECK = {"q": "model_q", "Qcur": "model_q", "q_scaled": "model_q", "Kcur": "model_kcur", "k_rot": "model_kcur",
         "Vcur": "model_vcur", "v_rot": "model_vcur", "k_view": "model_k", "v_view": "model_v", "kq": "model_kq",
         "kq_scores": "model_kq_scores", "kq_soft_max": "model_softmax", "kqv": "model_kqv"}


QUERY_HEADS = ("Qcur", "q_scaled", "q", "kq", "kq_scores", "kq_soft_max", "kqv")  # quantities per query head


def check_name(m: Mapped) -> str:
    if m.role == "flash_attn":
        return "model_flash_attn"
    if m.role == "kqv_out":
        return "model_kqv_out"
    return CHECK.get(m.quantity, f"model_{m.role}")


@dataclass
class NodeComparison:
    """Compares mapped nodes with the reference of their run; records each node in the summary."""

    source: str
    activations: str  # what the model's weight MUL_MATs do to their inputs: "8-bit" or "float" (bounds.CASCADE)
    heads: frozenset[int] | None
    summary: Summary

    def check(self, evaluation: int, L: Layer, m: Mapped, run: Run, n_past: int, T: int, s: Sample | None = None,
              position: int | None = None) -> list[CheckResult]:
        """The node's element checks and its `sum` against run.expected; s: its printed sample (parsed here when
        None), position: checker.py's position_after_matmul of a rows node."""
        node = m.node
        s = s if s is not None else parse_sample(node, self.source)
        e = expectation(run.expected, L, m, n_past, T, tuple(s.index[1:]), position)  # type: ignore[arg-type]
        if e is None:
            return []
        keep = self._head_mask(m, s, L)
        exp = run.expected
        cls = node_class(m.quantity, m.role)
        limits = cascade(self.activations, exp.kv_type, exp.v_type, cls, m.ref_layer,  # type: ignore[arg-type]
                         exp.ref.hparams.n_layer)
        limits = (max(limits[0], TWIN_SYSTEMATIC * e.chaos[1]), max(limits[1], TWIN_GROSS * e.chaos[0]))
        nmse_cap = NMSE_MAX if e.derived else math.inf
        got, want = s.values[0][keep], e.want[keep]
        base = PRINT + F32_REL * np.abs(want) + e.extra[keep]
        err = np.abs(got - want)
        beyond = int(np.count_nonzero(~within(err, base)))  # beyond print and f32 rounding (reported)
        unit = None if e.derived else np.where(e.valid[keep], e.unit[keep], 0.0)  # type: ignore[index]
        z = None if unit is None else self._excess(unit, err, base)
        bound, note = self._bound(e, keep, base, unit, z, limits)
        if m.role in ("kq", "kq_soft_max", "flash_attn") and m.quantity in ("kq", "kq_soft_max", "kqv"):
            self.summary.cover(m.role, s.values[0].shape, keep, m.labels)
        res = compare(check_name(m), node, got, want, bound, self._locator(m, s, np.nonzero(keep), L, n_past, T),
                      note=note)
        res.error_model = e.model
        if e.note:
            res.note = f"{res.note}; {e.note}" if res.note else e.note
        if len(got) < s.values[0].size:
            res.unchecked, res.why_unchecked = s.values[0].size - len(got), "not of the --head heads"
        self._nmse(res, err, want, nmse_cap, np.maximum(err - PRINT, 0.0))
        self.summary.note(evaluation, L.layer, node, res, e.model, beyond, z, cls, m.ref_layer,
                          float(np.median(bound)) if np.size(bound) else 0.0,
                          float(np.sqrt(np.mean(want**2))) if want.size else 0.0, None if e.derived else e.chaos)
        out = [res]
        total = self._sum(node, s, e, bound, run, limits[1]) if self.heads is None and e.whole is not None else None
        return out + ([total] if total is not None else [])

    @staticmethod
    def _excess(unit: np.ndarray, err, base) -> np.ndarray:
        """Cascade nodes: each printed value's excess over print and f32 rounding, in units of its allowance unit
        (z = (|err| − base) / unit, 0 within the rounding); an empty cache slot, whose unit is 0, inf when off."""
        over = np.maximum(err - base, 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(over > 0, np.where(unit > 0, over / np.where(unit > 0, unit, 1.0), np.inf), 0.0)

    def _bound(self, e: Expectation, keep, base, unit: np.ndarray | None, z: np.ndarray | None,
               limits: tuple[float, float]) -> tuple[np.ndarray, str]:
        """Derived: base (print, f32, layer 0's noise and roundings). Cascade (bounds.CASCADE, or the twin's chaos of
        the layer where larger: chaos.py): each value within gross·unit, unless more than half are beyond
        systematic·unit, the node off as a whole: then systematic."""
        if e.derived:
            return base, ""
        systematic, gross = limits
        live = e.valid[keep]
        off = int(np.count_nonzero(z[live] > systematic))  # type: ignore[index]
        if live.any() and 2 * off > int(np.count_nonzero(live)):
            return base + systematic * unit, (f"{off} of {int(np.count_nonzero(live))} printed values beyond "
                                              f"{systematic:g}·rms: the node is off as a whole")
        return base + gross * unit, ""

    @staticmethod
    def _nmse(res: CheckResult, err: np.ndarray, want: np.ndarray, nmse_max: float, excess: np.ndarray) -> None:
        """NMSE over the compared elements (reported); that of their errors beyond the print's rounding (5e-5: small
        values, long softmax rows of weights near 1/T, print with a large relative error) beyond nmse_max fails the
        node on its own."""
        with np.errstate(invalid="ignore", over="ignore"):
            den = float(np.sum(want**2))
            num = float(np.sum(err**2))
            computed = float(np.sum(excess**2))
        res.nmse = num / den if den > 0 else (0.0 if num == 0 else math.inf)
        beyond = computed / den if den > 0 else (0.0 if computed == 0 else math.inf)
        if not beyond <= nmse_max:
            res.failed += 1
            res.failures.append(Failure(None, beyond, 0.0, nmse_max))
            res.note = (res.note + "; " if res.note else "") + f"NMSE beyond print {beyond:.2e} > {nmse_max:g}"

    def _head_mask(self, m: Mapped, s: Sample, L: Layer) -> np.ndarray:
        """[p2, p1, p0] printed elements to compare: all, or those of the --head heads (and the KV heads they read)."""
        shape = s.values.shape[1:]
        if self.heads is None:
            return np.ones(shape, bool)
        group = L.H // L.H_kv
        kv_heads = {h // group for h in self.heads}
        keep = np.ones(shape, bool)
        for label, logical in zip(m.labels, coords(tuple(s.index[1:]), m.via)):
            if label == "head":
                sel = np.isin(logical, sorted(self.heads))
            elif label == "kvhead":
                sel = np.isin(logical, sorted(kv_heads))
            elif label == "col" and m.quantity != "rows":
                per = m.quantity in KV_QUANTITIES
                sel = np.isin(logical // L.D_h, sorted(kv_heads if per else self.heads))
            else:
                continue
            keep &= sel
        return keep

    @staticmethod
    def _locator(m: Mapped, s: Sample, idx, L: Layer, n_past: int, T: int):
        """Element i of the compared (flattened) elements → its Location."""
        full = coords(tuple(s.index[1:]), m.via)  # the indices of the node `labels` describe
        logical = [full[a][idx] for a in range(3)]
        own = [s.index[1 + a][idx[a]] for a in range(3)]  # this node's, for the printed row's line
        n_rows = m.ne[1]

        def where(i: int) -> Location:
            at: dict[str, int | None] = {"head": None, "query": None, "slot": None, "dim": None, "pos": None}
            for label, values in zip(m.labels, logical):
                v = int(values[i])
                if label in ("head", "kvhead"):
                    at["head"] = v
                elif label == "query":
                    at["query"] = v
                elif label == "row":
                    at["query"] = T - n_rows + v
                elif label == "query" and m.quantity in ("k_view", "v_view"):  # a store's rows: this evaluation's slots
                    at["slot"] = n_past + v
                elif label == "slot":
                    at["slot"] = v
                elif label == "dim":
                    at["dim"] = v
                elif label == "col":
                    if m.quantity == "rows":
                        at["dim"] = v
                    else:
                        at["head"], at["dim"] = divmod(v, L.D_h)
            if at["query"] is not None:
                at["pos"] = n_past + at["query"]
            elif at["slot"] is not None:
                at["pos"] = at["slot"]
            return Location(**at)

        # the line of the printed row that holds element i (looked up for failures only)
        where.line_of = lambda i: row_line(m.node, 0, int(own[0][i]), int(own[1][i]))  # type: ignore
        query_heads = m.quantity in QUERY_HEADS  # K/V elements belong to a KV head
        for label, values in zip(m.labels, logical):
            if query_heads and label in ("head", "col"):
                return located(where, values if label == "head" else values // L.D_h)
        return where

    @staticmethod
    def _sum(node, s: Sample, e: Expectation, bound: np.ndarray, run: Run, gross: float) -> CheckResult:
        """The `sum =` line: the whole tensor today, the printed values only before llama.cpp PR #15637."""
        w = e.whole
        assert w is not None
        got = s.sums[0]
        own = F32_REL * w.magnitude + w.extra
        if not e.derived:
            own += gross * math.sqrt(w.n * w.squares)
        b_full = own + precision.sum_bound(w.n, w.magnitude)
        res = compare_value("model_sum", node, got, w.total, b_full, note="full tensor")
        printed = e.want
        if printed.size != int(np.prod(node.ne)):  # elided: the two meanings of `sum` differ
            p_want = float(printed.sum())
            p_bound = float(np.sum(bound)) + precision.sum_bound(printed.size, float(np.abs(printed).sum()))
            alt = compare_value("model_sum", node, got, p_want, p_bound,
                                note="printed values only (llama.cpp before PR #15637 summed what it printed)")
            if run.sum_mode is None and e.derived and res.passed != alt.passed:  # a tight bound tells them apart
                run.sum_mode = "full tensor" if res.passed else "printed values"
            if run.sum_mode == "printed values" or (run.sum_mode is None and alt.ratio < res.ratio):
                res = alt
        res.error_model = e.model
        return res
