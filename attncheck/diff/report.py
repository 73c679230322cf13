"""A diff's result: the matched nodes and their differences, the unmatched ones, each side's check, the verdict and
exit code, and the JSON document (schema 1, kind diff). compare.py fills it; render.py, html.py and junit.py show
it."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..report import EXIT_FAIL, EXIT_INPUT, EXIT_PASS, EXIT_UNVERIFIED, SCHEMA
from ..results import json_number
from .drift import DriftModel
from .nodes import NMSE_MAX, NMSE_OTHER, NOT_COMPUTING, DiffTolerance, NodeDiff, Unmatched


@dataclass
class DiffReport:
    old: str
    new: str
    prefix: bool
    tolerance: DiffTolerance
    nodes: list[NodeDiff] = field(default_factory=list)  # matched, in OLD's graph order
    only: list[Unmatched] = field(default_factory=list)
    tokens: list[tuple[tuple[int, ...] | None, tuple[int, ...] | None]] = field(default_factory=list)  # per run
    prompt: str = ""  # how the prompts compare: same | prefix | unknown
    prompt_note: str = ""
    evaluations: int = 0
    error: str = ""  # unusable pair (different models or prompts): exit 2
    warnings: list[str] = field(default_factory=list)
    model: DriftModel | None = None  # the drift model used (default tolerance)
    reference: object | None = None  # diff --model: reference.ReferenceDiff, per layer which side leaves the model
    sides: tuple | None = None  # (OLD, NEW) sides.Side: each dump checked as `check` (--model: `check --model`)
    paths: tuple[str, str] | None = None  # the files read, where they are not old and new (stdin spooled to a file)

    def to_dict(self) -> dict:
        """The JSON of `attncheck diff --json` (schema 1, kind diff)."""
        return diff_dict(self)

    def path(self, side: str) -> str:
        """The file of side 'old' or 'new', to read again for its check."""
        return self.paths[side == "new"] if self.paths else getattr(self, side)

    @property
    def old_side(self):
        return self.sides[0] if self.sides else None

    @property
    def new_side(self):
        return self.sides[1] if self.sides else None

    @property
    def compared(self) -> list[NodeDiff]:
        return [n for n in self.nodes if not n.skipped]

    @property
    def diverged(self) -> list[NodeDiff]:
        """Nodes beyond the tolerance, less those in a layer where --model shows OLD off the reference and NEW on
        it (an upgrade that fixed what the old build got wrong)."""
        return [n for n in self.nodes if self._counts(n)]

    def _counts(self, n: NodeDiff) -> bool:
        ref = self.reference
        return n.diverged and (ref is None or not ref.fixed(n.evaluation, n.role.layer))  # type: ignore

    @property
    def first_divergent(self) -> NodeDiff | None:
        return next((n for n in self.nodes if self._counts(n)), None)

    @property
    def first_computed(self) -> NodeDiff | None:
        """The first divergent node that computes (not a view or a cache write of values computed before)."""
        return next((n for n in self.nodes if self._counts(n) and n.new.op not in NOT_COMPUTING), None)

    @property
    def exit_code(self) -> int:
        """2: unusable pair, or a NEW that check cannot read; 1: a regression; 0: drift; 3: nothing compared."""
        if self.error or (self.new_side is not None and self.new_side.error):
            return EXIT_INPUT
        if self.regression:
            return EXIT_FAIL
        return EXIT_PASS if self.compared else EXIT_UNVERIFIED

    @property
    def regression(self) -> str:
        """'check' when check fails NEW, else 'drift' when a node is beyond the tolerance, else ''."""
        if self.new_side is not None and self.new_side.failed:
            return "check"
        return "drift" if self.diverged else ""

    @property
    def identical(self) -> bool:
        """Every node of both dumps matched, and every printed element and sum the same."""
        return (bool(self.compared) and not self.only and not self.diverged
                and all(n.max_abs == 0 and (n.sum is None or n.sum.diff == 0) for n in self.compared))

    @property
    def verdict(self) -> str:
        return {EXIT_PASS: "pass", EXIT_FAIL: "fail", EXIT_INPUT: "error", EXIT_UNVERIFIED: "unverified"}[self.exit_code]

    @property
    def outcome(self) -> str:
        """The verdict in diff's words: identical | drift (pass) | regression (fail) | error | unverified."""
        code = self.exit_code
        if code == EXIT_PASS:
            return "identical" if self.identical else "drift"
        return {EXIT_FAIL: "regression", EXIT_INPUT: "error", EXIT_UNVERIFIED: "unverified"}[code]

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
            "tests_failed": sum(any(self._counts(n) for n in ns) for ns in g),
            "tests_skipped": sum(all(n.skipped for n in ns) for ns in g),
        }


@dataclass
class LayerDrift:
    """One layer (input and output are their own) over every evaluation: its largest drift and largest need."""

    group: str
    nodes: int = 0
    beyond: int = 0  # nodes beyond the drift of correct builds
    largest: NodeDiff | None = None  # the node with the largest drift (fraction of its scale)
    worst: NodeDiff | None = None  # the node closest to (or furthest beyond) its allowance

    def to_dict(self) -> dict:
        def ref(nd: NodeDiff | None) -> dict | None:
            return None if nd is None else {
                "evaluation": nd.evaluation, "role": nd.role.name, "node": nd.new.name, "line": nd.new.line,
                "drift": nd.drift, "allowed": nd.allowed, "roundings": nd.roundings, "ratio": nd.ratio}
        return {"layer": self.group, "nodes": self.nodes, "beyond": self.beyond, "largest_drift": ref(self.largest),
                "closest_to_allowance": ref(self.worst)}


def per_layer(rep: DiffReport) -> list[LayerDrift]:
    """Per layer, in graph order: the largest drift (relative to each node's scale) and the largest need."""
    out: dict[str, LayerDrift] = {}
    counted = {id(n) for n in rep.diverged}
    for nd in rep.compared:
        ld = out.setdefault(nd.role.group, LayerDrift(nd.role.group))
        ld.nodes += 1
        ld.beyond += id(nd) in counted
        if ld.largest is None or nd.drift > ld.largest.drift:
            ld.largest = nd
        if ld.worst is None or nd.ratio > ld.worst.ratio:
            ld.worst = nd
    return list(out.values())


def position(nd: NodeDiff) -> int | None:
    """The token position of the worst element: n_past + its query or token index (or its cache slot)."""
    w = nd.worst or {}
    for k in ("query", "token"):
        if k in w:
            return nd.n_past + w[k]
    return w.get("slot") if nd.how == "store" else None


def _ref(r) -> dict:
    return {"name": r.name, "line": r.line, "op": r.op, "type": r.type, "ne": list(r.ne)}


def _role(role) -> dict:
    return {"section": role.section, "layer": role.layer, "role": role.name, "kind": role.kind}


def _node(nd: NodeDiff) -> dict:
    s = nd.sum
    return {
        "evaluation": nd.evaluation, "run": nd.run, **_role(nd.role), "old": _ref(nd.old), "new": _ref(nd.new),
        "matched_by": nd.how or None, "compared": nd.compared, "skipped": nd.skipped or None,
        "diverged": nd.diverged, "failed": nd.failed, "max_abs": json_number(nd.max_abs),
        "max_rel": json_number(nd.max_rel), "nmse": json_number(nd.nmse), "nmse_max": nd.nmse_max,
        "tolerance_at_worst": json_number(nd.tol), "ratio": json_number(nd.ratio),
        "needed_atol": json_number(nd.needed_atol), "needed_rtol": json_number(nd.needed_rtol),
        "worst": None if nd.worst is None or nd.skipped else {"at": nd.worst, "old": json_number(nd.worst_old),
                                                               "new": json_number(nd.worst_new)},
        "sum": None if s is None else {"old": s.old, "new": s.new, "diff": s.diff, "tolerance": s.tol,
                                       "passed": s.passed},
        "position": position(nd) if nd.worst and not nd.skipped else None,
        "drift": None if nd.skipped or not nd.roundings and not nd.drift else {
            "roundings": nd.roundings, "scale": json_number(nd.scale), "scale_of": nd.scale_kind,
            "drift": json_number(nd.drift), "allowed": json_number(nd.allowed), "allowance": nd.note or None},
    }


def diff_dict(rep: DiffReport) -> dict:
    """The JSON document: schema 1, kind diff, one record per matched node and per node in one dump only."""
    from .. import __version__

    t = rep.tolerance
    first, comp = rep.first_divergent, rep.first_computed
    return {
        "schema": SCHEMA, "kind": "diff", "tool": "attncheck", "version": __version__,
        "old": rep.old, "new": rep.new, "prefix": rep.prefix,
        "verdict": rep.verdict, "outcome": rep.outcome, "regression": rep.regression or None,
        "exit_code": rep.exit_code, "error": rep.error or (rep.new_side.error if rep.new_side else "") or None,
        "check": None if rep.sides is None else {s.name.lower(): s.to_dict() for s in rep.sides},
        "tolerance": {"mode": "nmse" if t.nmse else "drift" if rep.model is not None else "elementwise",
                      "atol": t.atol, "rtol": t.rtol, "origin": t.origin,
                      "nmse_max": {**NMSE_MAX, "other": NMSE_OTHER} if t.nmse else None,
                      "drift_model": None if rep.model is None else rep.model.to_dict()},
        "drift_per_layer": [ld.to_dict() for ld in per_layer(rep)] if rep.model is not None else None,
        "reference": None if rep.reference is None else rep.reference.to_dict(),
        "prompt": {"relation": rep.prompt or None, "compared": rep.prompt in ("same", "prefix"),
                   "note": rep.prompt_note or None,
                   "tokens": [{"old": None if a is None else list(a), "new": None if b is None else list(b)}
                              for a, b in rep.tokens]},
        "totals": rep.totals(),
        "first_divergent": None if first is None else _node(first),
        "first_divergent_computation": None if comp is None else _node(comp),
        "nodes": [_node(n) for n in rep.nodes],
        "only": [{"side": u.side, "evaluation": u.evaluation, "run": u.run, **_role(u.role), "node": _ref(u.node)}
                 for u in rep.only],
        "warnings": rep.warnings,
    }
