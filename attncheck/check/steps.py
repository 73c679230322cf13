"""The printed steps between kq and SOFT_MAX (gemma2's soft-cap SCALE → TANH → SCALE, t5's score bias ADD) and q's
pre-scale (gemma, phi3: SCALE before kq), each recomputed from its printed input element by element.

A SCALE's factor is an op parameter the dump does not print: unless a model gives it (the soft-cap, the q scale),
it is pinned per run as the one factor most printed elements agree on, within their print precision; elements it
does not fit fail.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .. import precision
from ..dump.records import NodeRef
from ..dump.sample import Sample, row_lines
from ..results import CheckResult, Location, compare
from .fits import consensus

PRINT, F32 = precision.PRINT, precision.F32
MIN_INPUT = 0.01  # elements of smaller input tell little about a factor


class Printed(NamedTuple):
    """A printed sample's values [1, n2, n1, n0], the logical index printed along each axis, and the line of each
    printed row [n2, n1] (so that a failure names the value's own line)."""

    values: np.ndarray
    index: tuple[np.ndarray, ...]
    rows: np.ndarray

    @classmethod
    def of(cls, s: Sample | None) -> "Printed | None":
        return None if s is None else cls(s.values, s.index, row_lines(s.node))


@dataclass(frozen=True)
class Step:
    """One printed step: its node, its printed input(s), and the key its factor is pinned under."""

    key: str  # "q" (q's pre-scale) or "scores.<i>" (the i-th step from kq)
    node: NodeRef
    y: Printed
    a: Printed | None  # the input (src0), when printed with the same ne
    b: Printed | None = None  # ADD's second input, when printed with the same ne
    before: str | None = None  # the op of the next step in the chain (SOFT_MAX after the last)
    feeds: str | None = None  # the op of its input (a TANH before the soft-cap's second SCALE)


def factor_intervals(steps: list[Step]) -> tuple[np.ndarray, np.ndarray]:
    """Every printed element y = c·a with |a| >= MIN_INPUT gives c within [lo, hi]."""
    los, his = [], []
    for s in steps:
        a, y = s.a.values.ravel(), s.y.values.ravel()
        use = np.abs(a) >= MIN_INPUT
        a, y = a[use], y[use]
        c = y / a
        e = PRINT + np.abs(c) * PRINT + 2 * F32 * np.abs(y)
        lo, hi = (y - e) / a, (y + e) / a
        los.append(np.minimum(lo, hi))
        his.append(np.maximum(lo, hi))
    return (np.concatenate(los), np.concatenate(his)) if los else (np.zeros(0), np.zeros(0))


def pin_factor(steps: list[Step]) -> tuple[float, float, int] | None:
    """The factor most elements agree on: (value, uncertainty, how many agree), None when nothing tells."""
    lo, hi = factor_intervals(steps)
    if not len(lo):
        return None
    if len(lo) > 4096:  # the consensus of a large run: its intervals all overlap where they agree
        pick = np.linspace(0, len(lo) - 1, 4096).astype(int)
        lo, hi = lo[pick], hi[pick]
    a, b, n = consensus(list(zip(lo.tolist(), hi.tolist())))
    if not (math.isfinite(a) and math.isfinite(b)):
        return None
    return (a + b) / 2, (b - a) / 2, n


def check_step(s: Step, factor: tuple[float, float] | None) -> CheckResult:
    """One step node against its printed input: SCALE by the pinned factor, TANH, ADD of two printed inputs."""
    node, y = s.node, s.y
    where = _locator(y, s.key)
    if s.a is None:
        return CheckResult("step", node.name, node.line, unchecked=y.values.size,
                           why_unchecked=f"{node.op}: its input is not printed with the same ne")
    a = s.a.values.ravel()
    got = y.values.ravel()
    if node.op == "SCALE":
        if factor is None:
            return CheckResult("step", node.name, node.line, unchecked=got.size,
                               why_unchecked="SCALE: no factor could be pinned from the printed values")
        c, dc = factor
        want = c * a
        bound = PRINT + abs(c) * PRINT + np.abs(a) * dc + 2 * F32 * np.abs(want)
        note = f"SCALE ×{c:.6g}"
    elif node.op == "TANH":
        want = np.tanh(a)
        bound = PRINT + (1 - want**2) * PRINT + 2 * F32
        note = "TANH"
    elif node.op == "ADD" and s.b is not None:
        b = s.b.values.ravel()
        want = a + b
        bound = 3 * PRINT + 2 * F32 * (np.abs(a) + np.abs(b))
        note = "ADD of two printed inputs"
    else:
        return CheckResult("step", node.name, node.line, unchecked=got.size,
                           why_unchecked=f"{node.op}: not recomputed (its other input is not printed)")
    return compare("step", node, got, want, bound, where, note=note)


def _locator(s: Printed, key: str):
    """Flat element i of a printed scores sample [1, H, T, n_kv] or q sample [1, T, H, D_h] → its Location."""
    shape = s.values.shape

    def where(i: int) -> Location:
        _, a, b, c = (int(x) for x in np.unravel_index(i, shape))
        ix = s.index
        if key == "q":
            return Location(int(ix[2][b]), int(ix[1][a]), dim=int(ix[3][c]))
        return Location(int(ix[1][a]), int(ix[2][b]), slot=int(ix[3][c]))

    def line_of(i: int) -> int | None:
        """The line of the printed row that holds element i."""
        _, a, b, _ = np.unravel_index(i, shape)
        line = int(s.rows[a, b])
        return line if line > 0 else None

    where.line_of = line_of  # type: ignore[attr-defined]
    return where
