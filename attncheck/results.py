"""What every checker returns: per-element comparisons that know their worst error, the bound there and the factor
the bound would have needed (Polygraphy-style), gathered per evaluation × layer.

Comparing lives here, with the one kernel every comparison uses (abs_error, within, needed: the dump-only checks,
`--model` and `diff` alike) and the one Tolerance type; reporting (tables, JSON, JUnit) lives in report.py and
present/render.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import numpy as np

MAX_FAILURES = 20  # failing elements kept per check for the report


class Location(NamedTuple):
    """The logical place of an element: head, query (index in the evaluation), and a slot or a dim.

    --model checks also give pos, the token position (n_past + query, or the slot of a K/V cache row), and leave
    out what a node has no axis for (head of a [T, n_embd] row, query of a cache row).
    """

    head: int | None
    query: int | None
    slot: int | None = None
    dim: int | None = None
    pos: int | None = None


def describe(at: Location | None) -> str:
    """A Location as words, for tables, failure lines and JUnit messages: "head 3, query 1, slot 0"."""
    if at is None:
        return "whole tensor"
    parts = [f"{k} {getattr(at, k)}" for k in ("head", "query", "slot", "dim") if getattr(at, k) is not None]
    if at.pos is not None:
        parts.append(f"position {at.pos}")
    return ", ".join(parts)


class HeadFigures(NamedTuple):
    """One check's figures on the elements of one logical head (the HTML page colours its grid by them)."""

    checked: int
    failed: int
    ratio: float  # largest error/bound among them


def located(where, heads) -> Callable[[int], Location]:
    """A locator that also gives the logical head of every element, so compare keeps per-head figures."""
    where.heads = np.asarray(heads)
    return where


class Failure(NamedTuple):
    at: Location | None
    got: float
    want: float
    bound: float
    line: int | None = None  # the line of the printed row that holds the value (None: the node's header line)


@dataclass(slots=True)
class CheckResult:
    """One check on one node: it knows whether it passed and the tolerance it would have needed."""

    check: str  # masked | softmax | softmax_ratio | pv | sum | finite | model_*
    node: str
    line: int
    checked: int = 0  # elements compared
    unchecked: int = 0  # printed elements this check could not compare
    why_unchecked: str = ""
    max_error: float = 0.0  # largest |dumped − recomputed|
    bound: float = 0.0  # the bound at that element
    ratio: float = 0.0  # largest error/bound: the factor the bounds would have needed (≤ 1 passes)
    worst: Location | None = None
    failed: int = 0  # elements beyond their bound
    failures: list[Failure] = field(default_factory=list)
    note: str = ""
    nmse: float | None = None  # --model: sum(err^2) / sum(ref^2) over the compared elements
    error_model: str | None = None  # --model: which error model gave the bounds (model/checker.py)
    by_head: dict[int, HeadFigures] | None = None  # per logical head, when the check's elements have one

    @property
    def passed(self) -> bool:
        return self.failed == 0


# ---- the comparison kernel ----------------------------------------------------------------------------------------

def abs_error(got, want) -> np.ndarray:
    """|got − want| per element, inf where either is not finite: NaN or inf never passes."""
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(got - want)
        return np.where(np.isfinite(got) & np.isfinite(want) & ~np.isnan(err), err, np.inf)


def within(err, bound) -> np.ndarray:
    """The pass rule: an element passes when its error is finite and at most its bound (a NaN error or bound never
    does, nor an infinite error under an infinite bound: --rtol of an inf)."""
    with np.errstate(invalid="ignore"):
        return (err <= bound) & (err < np.inf)


def needed(err, bound) -> np.ndarray:
    """err / bound, 0 where err is 0: the factor the bound would have needed (≤ 1 passes)."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return np.where(err == 0, 0.0, err / bound)


@dataclass(frozen=True)
class Tolerance:
    """|got − want| ≤ atol + rtol·|size|. check's --atol/--rtol in place of the derived per-element bounds (size: the
    recomputed value); diff's elementwise tolerance (size: the larger of the two printed values), which diff/nodes.py
    extends with its drift and NMSE modes."""

    atol: float
    rtol: float

    def bound(self, size) -> np.ndarray:
        return self.atol + self.rtol * np.abs(np.asarray(size, dtype=np.float64))


def compare(check: str, node, got, want, bound, where, unchecked=0, why="", note="",
            tol: Tolerance | None = None) -> CheckResult:
    """Compare flat arrays element by element; `where(i)` names element i. NaN or inf never passes.

    tol (--atol/--rtol) replaces the derived bounds. A locator made by located() also gives each element's head:
    the result then keeps per-head figures (by_head)."""
    got, want, bound = (np.asarray(a, dtype=np.float64).ravel() for a in (got, want, bound))
    if tol is not None:
        bound = tol.bound(want)
    res = CheckResult(check, node.name, node.line, checked=len(got), unchecked=unchecked, why_unchecked=why, note=note)
    if not len(got):
        return res
    err = abs_error(got, want)
    ratio = needed(err, bound)
    bad = np.flatnonzero(~within(err, bound))
    worst = int(np.argmax(ratio))
    res.max_error, res.bound, res.ratio = float(err[worst]), float(bound[worst]), float(ratio[worst])
    res.worst, res.failed = where(worst), len(bad)
    line_of = getattr(where, "line_of", None)  # a locator may also know each element's printed line
    res.failures = [Failure(where(int(i)), float(got[i]), float(want[i]), float(bound[i]),
                            line_of(int(i)) if line_of is not None else None) for i in bad[:MAX_FAILURES]]
    heads = getattr(where, "heads", None)
    if heads is not None and len(heads) == len(got):
        res.by_head = _by_head(heads, ratio, bad)
    return res


def compare_value(check: str, node, got: float, want: float, bound: float, note: str = "",
                  tol: Tolerance | None = None) -> CheckResult:
    """compare() of one whole-tensor value (a `sum =` line), which has no element to locate (worst is None): the
    same IEEE double arithmetic in Python floats, without a dozen numpy calls on one-element arrays."""
    got, want, bound = float(got), float(want), float(bound)
    if tol is not None:
        bound = tol.atol + tol.rtol * abs(want)
    res = CheckResult(check, node.name, node.line, checked=1, note=note)
    err = abs(got - want)
    if not (math.isfinite(got) and math.isfinite(want)) or err != err:  # NaN or inf never passes
        err = math.inf
    if err == 0:
        ratio = 0.0
    elif bound == 0:  # numpy's err / ±0
        ratio = math.copysign(math.inf, bound)
    else:
        ratio = err / bound
    res.max_error, res.bound, res.ratio = err, bound, ratio
    if not err <= bound or err == math.inf:  # within()'s rule
        res.failed, res.failures = 1, [Failure(None, got, want, bound)]
    return res


def _by_head(heads: np.ndarray, ratio: np.ndarray, bad: np.ndarray) -> dict[int, HeadFigures]:
    """Elements compared, beyond their bound, and the largest ratio, per head (a NaN ratio never passes)."""
    keys, inv = np.unique(heads, return_inverse=True)
    worst = np.zeros(len(keys))
    np.maximum.at(worst, inv, np.where(np.isnan(ratio), np.inf, ratio))
    n, failed = np.bincount(inv, minlength=len(keys)), np.bincount(inv[bad], minlength=len(keys))
    return {int(h): HeadFigures(int(n[k]), int(failed[k]), float(worst[k])) for k, h in enumerate(keys)}


@dataclass(slots=True)
class SiteReport:
    """The checks of one evaluation × layer: where the layer's attention sits, and every checker's results on it."""

    evaluation: int
    run: int
    n_past: int
    T: int
    layer: int
    H: int
    H_kv: int
    D_h: int | None
    n_kv: int
    kq_scale: float
    nodes: dict[str, str | None]
    line: int
    results: list[CheckResult]
    rows_whole: int  # printed softmax rows whose visible slots were all printed
    rows_printed: int
    facts: dict = field(default_factory=dict)  # the attention facts its checks used (scale, mask, window, ...)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    def result(self, check: str) -> CheckResult | None:
        return next((r for r in self.results if r.check == check), None)

    def checked(self, check: str) -> int:
        return sum(r.checked for r in self.results if r.check == check)


def json_number(x: float) -> float | str:
    """JSON has no inf/nan: write them as strings."""
    return x if x == x and abs(x) != float("inf") else str(x)
