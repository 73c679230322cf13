"""What diff says of each matched node: the tolerance it was held to, the node pair and how its printed elements
compare (NodeDiff), nodes in one dump only (Unmatched).

Tolerances. The default is the drift of two correct builds (drift.py): print precision plus an allowance, relative
to the node's printed rms, for the activation roundings on the node's path. `--exact` (EXACT) is the print precision
(docs/format.md §6), for two runs of one build: |new − old| ≤ ATOL + RTOL·max(|old|, |new|).
ATOL = 1e-4: each printed value is within 5e-5 of the stored one, so two builds that store the same number print
values at most 1e-4 apart. RTOL = 2^-16: the same f32 op evaluated in another order (SIMD width, threads) differs by
about n·2^-24 relative; 2^-16 allows n = 256 and stays 32× below one f16 rounding (2^-11), so a change of storage type
is caught. `--nmse` instead uses test-backend-ops' per-op thresholds on NMSE = Σ(new − old)² / Σ new² (its `a` is
the backend under test: NEW).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..dump.records import NodeRef
from ..dump.roles import LAYOUT, Role
from ..results import Tolerance
from .drift import elementwise

ATOL = 1e-4
RTOL = 2.0**-16
NMSE_MAX = {"MUL_MAT": 5e-4, "FLASH_ATTN_EXT": 5e-4, "SOFT_MAX": 1e-6}  # test-backend-ops max_nmse_err()
NMSE_OTHER = 1e-7
SLACK = 1e-12  # float64 parsing of 4-decimal text
NOT_COMPUTING = LAYOUT | {"SET_ROWS", "CPY", "GET_ROWS"}


@dataclass(frozen=True)
class DiffTolerance(Tolerance):
    """results.Tolerance's elementwise atol/rtol (print precision unless given) over max(|old|, |new|), plus the
    drift model's allowance (the default), or per-op NMSE thresholds."""

    atol: float = ATOL
    rtol: float = RTOL
    nmse: bool = False
    origin: str = "drift of correct builds"
    drift: bool = True

    def nmse_max(self, op: str) -> float:
        return NMSE_MAX.get(op, NMSE_OTHER)

    @property
    def sum_atol(self) -> float:
        """What atol allows each element of a `sum =` line: nothing for the print's rounding (sums are of stored
        values), the given atol otherwise."""
        return 0.0 if self.origin in ("print precision", DRIFT_ORIGIN) else self.atol


DRIFT_ORIGIN = "drift of correct builds"
EXACT = DiffTolerance(origin="print precision", drift=False)


@dataclass(frozen=True)
class SumDiff:
    """The `sum =` lines of two full-tensor sums of equal ne (the worst i3 block)."""

    old: float
    new: float
    tol: float

    @property
    def diff(self) -> float:
        return abs(self.new - self.old)

    @property
    def passed(self) -> bool:
        return self.diff <= self.tol


@dataclass(slots=True)
class NodeDiff:
    """One matched node: how its printed elements compare, and the tolerance they would have needed."""

    evaluation: int
    run: int
    role: Role
    old: NodeRef
    new: NodeRef
    how: str = ""  # index | flat | store: how the logical places were matched
    compared: int = 0  # elements printed in both (and fixed by causality under --prefix)
    skipped: str = ""  # why nothing was compared
    failed: int = 0  # elements beyond atol + rtol·|x|
    max_abs: float = 0.0
    max_rel: float = 0.0
    nmse: float = 0.0
    nmse_max: float | None = None  # the threshold under --nmse
    tol: float = 0.0  # atol + rtol·|x| at the worst element
    ratio: float = 0.0  # worst |Δ| / tol (or NMSE / threshold): ≤ 1 passes
    needed_atol: float = 0.0  # the atol that would pass every element, at the rtol used
    needed_rtol: float = 0.0  # the rtol that would pass every element, at the atol used
    worst: dict[str, int] | None = None
    worst_old: float = 0.0
    worst_new: float = 0.0
    sum: SumDiff | None = None
    n_past: int = 0  # of the evaluation: a query or token index + n_past is its position
    scale: float = 0.0  # rms of the elements printed in both (both sides)
    roundings: int = 0  # drift model: activation roundings on the node's path (the larger of the two graphs)
    allowed: float = 0.0  # drift model: |new − old| allowed beyond print precision, as a fraction of scale
    drift: float = 0.0  # the largest |new − old| beyond print precision, as a fraction of scale
    note: str = ""  # where the allowance came from, when it is not the drift model's own (softmax weights, means)
    weights: float = 0.0  # of allowed, the part that is the weights' move (mean.py's weighted means of V)
    pending: object | None = None  # softmax.Pending or mean.Pending: what the allowance needs until kq_scale is known

    @property
    def scale_kind(self) -> str:
        """What the drift is relative to: the node's printed rms, or each element's own size (softmax weights)."""
        return "value" if elementwise(self.role.name) else "rms"

    @property
    def diverged(self) -> bool:
        """Beyond the tolerance: elementwise (and the sum line), or NMSE under --nmse (sums then only shown)."""
        if self.skipped:
            return False
        if self.nmse_max is not None:
            return not self.nmse <= self.nmse_max
        return self.failed > 0 or (self.sum is not None and not self.sum.passed)


@dataclass(frozen=True)
class Unmatched:
    """A node present in one dump only."""

    evaluation: int
    run: int
    side: str  # old | new
    role: Role
    node: NodeRef
