"""Two dumps → per-node differences: nodes matched by (run, evaluation, layer, role), compared on the elements
printed in both, and the first node where the builds diverge. Result objects only; render_diff.py prints them.

Default tolerance, from how the numbers were printed (FORMAT.md §3): |new − old| ≤ ATOL + RTOL·max(|old|, |new|).
ATOL = 1e-4: each printed value is within 5e-5 of the stored one, so two builds that store the same number print
values at most 1e-4 apart. RTOL = 2^-16: the same f32 op evaluated in another order (SIMD width, threads) differs by
about n·2^-24 relative; 2^-16 allows n = 256 and stays 32× below one f16 rounding (2^-11), so a change of storage type
is caught. `--nmse` instead uses test-backend-ops' per-op thresholds on NMSE = Σ(new − old)² / Σ new² (its `a` is
the backend under test: NEW).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import zip_longest
from typing import BinaryIO

import numpy as np

from .. import precision
from .align import Aligned, align, causal, geometry
from ..errors import DumpError
from ..dump.graph import Dump, Evaluation, read_dump
from ..dump.records import NodeRef
from ..check.report import EXIT_FAIL, EXIT_INPUT, EXIT_PASS, EXIT_UNVERIFIED
from ..dump.roles import LAYOUT, Role, assign
from ..dump.sample import Sample, parse_sample

ATOL = 1e-4
RTOL = 2.0**-16
NMSE_MAX = {"MUL_MAT": 5e-4, "FLASH_ATTN_EXT": 5e-4, "SOFT_MAX": 1e-6}  # test-backend-ops max_nmse_err()
NMSE_OTHER = 1e-7
SLACK = 1e-12  # float64 parsing of 4-decimal text
NOT_COMPUTING = LAYOUT | {"SET_ROWS", "CPY", "GET_ROWS"}


@dataclass(frozen=True)
class Tolerance:
    """Elementwise atol/rtol (print precision unless given), or per-op NMSE thresholds."""

    atol: float = ATOL
    rtol: float = RTOL
    nmse: bool = False
    origin: str = "print precision"

    def nmse_max(self, op: str) -> float:
        return NMSE_MAX.get(op, NMSE_OTHER)

    @property
    def sum_atol(self) -> float:
        """What atol allows each element of a `sum =` line: nothing for the print's rounding (sums are of stored
        values), the given atol otherwise."""
        return 0.0 if self.origin == "print precision" else self.atol


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


@dataclass
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


@dataclass
class DiffReport:
    old: str
    new: str
    prefix: bool
    tolerance: Tolerance
    nodes: list[NodeDiff] = field(default_factory=list)  # matched, in OLD's graph order
    only: list[Unmatched] = field(default_factory=list)
    tokens: list[tuple[tuple[int, ...] | None, tuple[int, ...] | None]] = field(default_factory=list)  # per run
    prompt: str = ""  # how the prompts compare: same | prefix | unknown
    prompt_note: str = ""
    evaluations: int = 0
    error: str = ""  # unusable pair (different models or prompts): exit 2
    warnings: list[str] = field(default_factory=list)

    @property
    def compared(self) -> list[NodeDiff]:
        return [n for n in self.nodes if not n.skipped]

    @property
    def diverged(self) -> list[NodeDiff]:
        return [n for n in self.nodes if n.diverged]

    @property
    def first_divergent(self) -> NodeDiff | None:
        return next((n for n in self.nodes if n.diverged), None)

    @property
    def first_computed(self) -> NodeDiff | None:
        """The first divergent node that computes (not a view or a cache write of values computed before)."""
        return next((n for n in self.nodes if n.diverged and n.new.op not in NOT_COMPUTING), None)

    @property
    def exit_code(self) -> int:
        if self.error:
            return EXIT_INPUT
        if self.diverged:
            return EXIT_FAIL
        return EXIT_PASS if self.compared else EXIT_UNVERIFIED

    @property
    def verdict(self) -> str:
        return {EXIT_PASS: "pass", EXIT_FAIL: "fail", EXIT_INPUT: "error", EXIT_UNVERIFIED: "unverified"}[self.exit_code]

    def groups(self) -> dict[tuple[int, str], list[NodeDiff]]:
        """Matched nodes per evaluation × layer (input and output are groups of their own), in graph order."""
        out: dict[tuple[int, str], list[NodeDiff]] = {}
        for n in self.nodes:
            out.setdefault((n.evaluation, n.role.group), []).append(n)
        return out

    def totals(self) -> dict[str, int]:
        g = self.groups().values()
        return {
            "evaluations": self.evaluations,
            "matched": len(self.nodes),
            "compared": len(self.compared),
            "diverged": len(self.diverged),
            "skipped": len(self.nodes) - len(self.compared),
            "elements_compared": sum(n.compared for n in self.nodes),
            "only_old": sum(u.side == "old" for u in self.only),
            "only_new": sum(u.side == "new" for u in self.only),
            "tests": len(g),
            "tests_failed": sum(any(n.diverged for n in ns) for ns in g),
            "tests_skipped": sum(all(n.skipped for n in ns) for ns in g),
        }


def diff(old: Dump | str | BinaryIO, new: Dump | str | BinaryIO, *, prefix: bool = False,
         tolerance: Tolerance = Tolerance()) -> DiffReport:
    """Compare two dumps node by node; DumpError when either cannot be read."""
    da = old if isinstance(old, Dump) else read_dump(old)
    db = new if isinstance(new, Dump) else read_dump(new)
    rep = DiffReport(da.source, db.source, prefix, tolerance)
    for ea, eb in zip_longest(da.evaluations(), db.evaluations()):
        if ea is None or eb is None:
            one, side = (ea, "old") if eb is None else (eb, "new")
            roles = assign(one)
            rep.only += [Unmatched(one.index, one.run, side, roles.role(n), n.ref) for n in one.nodes]
            rep.warnings.append(f"evaluation {one.index} (run {one.run}) is in {side.upper()} only")
            continue
        rep.error = _same_inputs(rep, ea, eb)
        if rep.error:
            break
        rep.evaluations += 1
        _diff_evaluation(rep, ea, eb, da.source, db.source)
        ea.nodes.clear()
        eb.nodes.clear()
    for d in (da, db):
        rep.warnings += [f"{d.source}:{n.line}: {n.message}" for n in d.notes]
    return rep


def _weights(ev: Evaluation) -> dict[str, tuple]:
    """Weights as headers name them: unprinted src0 of MUL_MAT and GET_ROWS, by GGUF tensor name."""
    return {n.srcs[0].name: n.srcs[0].ne for n in ev.nodes
            if n.op in ("MUL_MAT", "GET_ROWS") and n.srcs[0] is not None and n.inputs[0] is None}


def _same_inputs(rep: DiffReport, ea: Evaluation, eb: Evaluation) -> str:
    """'' when the two evaluations ran the same model on the same (or, with --prefix, an extended) prompt."""
    wa, wb = _weights(ea), _weights(eb)
    bad = [k for k in sorted(wa.keys() & wb.keys()) if wa[k] != wb[k]]
    if bad:
        k = bad[0]
        return (f"different models: weight '{k}' is {_ne(wa[k])} in OLD and {_ne(wb[k])} in NEW"
                f"{f' ({len(bad) - 1} more weights differ)' if len(bad) > 1 else ''}")
    if wa and wb and not wa.keys() & wb.keys():
        return "different models: the two dumps have no weight in common"
    if (ea.run, ea.index_in_run) != (eb.run, eb.index_in_run):
        return f"the evaluations do not line up: OLD evaluation {ea.index} is run {ea.run}, NEW's is run {eb.run}"
    ta, tb = ea.tokens, eb.tokens
    if ea.index_in_run == 0:
        rep.tokens.append((ta, tb))
        if ta is not None and tb is not None:
            extends = ta[: len(tb)] == tb or tb[: len(ta)] == ta
            if ta != tb and not (rep.prefix and extends):
                hint = "; one extends the other: pass --prefix" if extends else ""
                return f"different prompts: token ids {list(ta)} in OLD, {list(tb)} in NEW{hint}"
            if rep.prompt != "unknown":
                rep.prompt = "prefix" if ta != tb or rep.prompt == "prefix" else "same"
        else:
            which = "neither dump" if ta is None and tb is None else "OLD" if ta is None else "NEW"
            rep.prompt = "unknown"
            rep.prompt_note = (f"the prompt could not be compared: {which} printed no token ids (older llama.cpp "
                               "format); nodes are aligned by role")
    if ea.T != eb.T and not rep.prefix:
        return (f"different prompts: evaluation {ea.index} has T = {ea.T} queries in OLD and {eb.T} in NEW "
                "(diff needs the same prompt and -ub; --prefix if one prompt extends the other)")
    if ea.n_past != eb.n_past:
        return f"the evaluations do not line up: evaluation {ea.index} starts at n_past {ea.n_past} in OLD, {eb.n_past} in NEW"
    return ""


def _diff_evaluation(rep: DiffReport, ea: Evaluation, eb: Evaluation, src_a: str, src_b: str) -> None:
    ra, rb = assign(ea), assign(eb)
    by_key = {rb.role(n).key: n for n in eb.nodes}
    matched: set[int] = set()
    T_short = min(t for t in (ea.T, eb.T) if t is not None) if (ea.T or eb.T) is not None else None
    for a in ea.nodes:
        role = ra.role(a)
        b = by_key.get(role.key)
        if b is None or id(b) in matched:
            rep.only.append(Unmatched(ea.index, ea.run, "old", role, a.ref))
            continue
        matched.add(id(b))
        nd = NodeDiff(ea.index, ea.run, role, a.ref, b.ref)
        _diff_node(nd, rep, (a, ra, ea, src_a), (b, rb, eb, src_b), T_short)
        rep.nodes.append(nd)
    rep.only += [Unmatched(eb.index, eb.run, "new", rb.role(n), n.ref) for n in eb.nodes if id(n) not in matched]


def _diff_node(nd: NodeDiff, rep: DiffReport, side_a: tuple, side_b: tuple, T_short: int | None) -> None:
    (a, ra, ea, src_a), (b, rb, eb, src_b) = side_a, side_b
    role, tol = nd.role, rep.tolerance
    if rep.prefix and (id(a) in ra.after_out_ids or id(b) in rb.after_out_ids):
        nd.skipped = "rows re-selected by out_ids: not fixed by causality"
        return
    if a.quantized or b.quantized:
        nd.skipped = f"{a.type if a.quantized else b.type}: quantized tensors print no values"
        return
    try:
        sa, sb = parse_sample(a, src_a), parse_sample(b, src_b)
    except DumpError as e:
        nd.skipped = f"not readable: {e}"
        return
    ga, gb = geometry(ra, role.layer, ea.T, ea.n_past), geometry(rb, role.layer, eb.T, eb.n_past)
    al = align(sa, sb, role, ga, gb)
    if isinstance(al, str):
        nd.skipped = al
        return
    nd.how = al.how
    if rep.prefix and T_short is not None:
        keep = causal(al, role, b, gb, T_short)
        if isinstance(keep, str):
            nd.skipped = keep
            return
        if not keep.any():
            nd.skipped = "no printed element is fixed by causality"
            return
        al = Aligned(al.how, al.keys[keep], al.old[keep], al.new[keep], al.axes)
    _measure(nd, al, tol)
    if a.ne == b.ne and not rep.prefix:  # a sum covers elements causality may not fix
        nd.sum = _sum(sa, sb, tol)


def _measure(nd: NodeDiff, al: Aligned, tol: Tolerance) -> None:
    """max abs/rel error, NMSE, the worst element and the tolerance that would have been needed."""
    a, b = al.old, al.new
    fin = np.isfinite(a) & np.isfinite(b)
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        err = np.where(same, 0.0, np.where(fin, np.abs(b - a), np.inf))
        mag = np.where(fin, np.maximum(np.abs(a), np.abs(b)), 0.0)
        t = tol.atol + tol.rtol * mag
        ratio = np.where(err == 0, 0.0, err / t)
        rel = np.where(err == 0, 0.0, err / mag)
        num, den = float(np.sum((b - a)[fin] ** 2)), float(np.sum(b[fin] ** 2))
        need_r = np.where(err <= tol.atol, 0.0, (err - tol.atol) / mag)
    w = int(np.argmax(ratio))
    nd.compared = len(a)
    nd.failed = int(np.count_nonzero(~(err <= t + SLACK)))
    nd.max_abs, nd.max_rel = float(err.max()), float(rel.max())
    nd.nmse = np.inf if not fin.all() and not same.all() else (num / den if den > 0 else (0.0 if num == 0 else np.inf))
    nd.tol, nd.ratio = float(t[w]), float(ratio[w])
    nd.needed_atol = float(np.max(np.maximum(err - tol.rtol * mag, 0.0)))
    nd.needed_rtol = float(need_r.max())
    nd.worst, nd.worst_old, nd.worst_new = al.where(w), float(a[w]), float(b[w])
    if tol.nmse:
        nd.nmse_max = tol.nmse_max(nd.new.op)
        nd.ratio = nd.nmse / nd.nmse_max if nd.nmse else 0.0


def _full_sum(s: Sample) -> bool:
    """The `sum =` line is of the whole tensor: nothing elided, or too far from the printed values' sum for a sum
    of printed values only (llama.cpp before PR #15637)."""
    if s.complete:
        return True
    for block, total in zip(s.values, s.sums):
        printed = float(np.nansum(block))
        slack = block.size * precision.PRINT + precision.SUM_PRINT + 1e-6 * float(np.nansum(np.abs(block)))
        if not abs(total - printed) > slack:
            return False
    return True


def _sum(sa: Sample, sb: Sample, tol: Tolerance) -> SumDiff | None:
    """Sums of equal-ne full tensors: 2·5e-7 for the two `%f` prints, n·sum_atol, plus rtol and f32 accumulation
    (n·2^-24, FORMAT.md §3) of Σ|x|, estimated as n times the mean printed |x|."""
    if not (_full_sum(sa) and _full_sum(sb)):
        return None
    n0, n1, n2, _ = sa.node.ne
    n = n0 * n1 * n2
    worst: SumDiff | None = None
    for i, (x, y) in enumerate(zip(sa.sums, sb.sums)):
        with np.errstate(invalid="ignore"):
            mag = n * max(float(np.nanmean(np.abs(sa.values[i]))), float(np.nanmean(np.abs(sb.values[i]))), 0.0)
        d = SumDiff(x, y, 2 * precision.SUM_PRINT + n * tol.sum_atol + (tol.rtol + n * precision.F32) * mag)
        if worst is None or d.diff / d.tol > worst.diff / worst.tol:
            worst = d
    return worst


def _ne(ne) -> str:
    return "{" + ", ".join(map(str, ne)) + "}"
