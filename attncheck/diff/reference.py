"""`diff OLD NEW --model GGUF`: each side checked against the model's reference forward pass (`check --model`,
sides.py), and per evaluation × layer which side leaves the reference, and where.

The verdict is check's: a NEW that `check --model` fails anywhere is a regression (sides.py), also where OLD leaves
the reference as well (it fails there too: said beside it). Per layer this says which side leaves the reference;
a node beyond drift in a layer where OLD leaves the reference and NEW does not is an upgrade that fixed what the old
build got wrong, not a regression. A side whose log printed no token ids takes the other side's ids when both
evaluate the same tokens (same T, identical printed embeddings), else the reference looks them up in the model's
embeddings (model/token_ids.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..arch.context import model_path, opened
from ..results import CheckResult, describe
from ..verify import Options
from .report import DiffReport
from .sides import Side, check_side

OTHER_DUMP = "other dump"


def severity(r: CheckResult) -> float:
    """How far a --model check leaves the reference: its worst |err|/bound, at least 1 when it failed (by NMSE)."""
    return max(r.ratio, 1.0 if not r.passed else 0.0)


def worst(side: Side) -> dict[tuple[int, int], CheckResult]:
    """(evaluation, layer) → the side's --model check furthest from the reference there (a failed one first)."""
    out: dict[tuple[int, int], CheckResult] = {}
    for sr in side.report.sites if side.report else []:
        for r in sr.results:
            key = (sr.evaluation, sr.layer)
            if r.check.startswith("model_") and (key not in out or (not r.passed, severity(r)) >
                                                 (not out[key].passed, severity(out[key]))):
                out[key] = r
    return out


@dataclass
class LayerRef:
    """One evaluation × layer: each side's --model check furthest from the reference there."""

    evaluation: int
    layer: int
    old: CheckResult
    new: CheckResult

    @property
    def regression(self) -> bool:
        """NEW leaves the reference here: `check --model` fails NEW."""
        return not self.new.passed

    @property
    def verdict(self) -> str:
        return {(False, True): "NEW leaves the reference", (True, True): "both leave the reference",
                (True, False): "OLD leaves the reference"}.get((not self.old.passed, not self.new.passed),
                                                               "both within")

    def where(self, side: str) -> str:
        r = self.new if side == "new" else self.old
        state = "within" if r.passed else "leaves it"
        return (f"{state}, {r.check} '{r.node}' (line {r.line}) at {describe(r.worst)}: |err| {r.max_error:.1e}, "
                f"{r.ratio:.2f}× its bound")


@dataclass
class ReferenceDiff:
    model: str
    old: Side
    new: Side
    layers: list[LayerRef] = field(default_factory=list)
    forward: bool = True
    note: str = ""

    @property
    def regression(self) -> LayerRef | None:
        return next((lr for lr in self.layers if lr.regression), None)

    def fixed(self, evaluation: int, layer: int | None) -> bool:
        """OLD leaves the reference in this layer and NEW stays within it."""
        lr = next((x for x in self.layers if (x.evaluation, x.layer) == (evaluation, layer)), None)
        return lr is not None and not lr.old.passed and lr.new.passed

    def to_dict(self) -> dict:
        return {
            "model": self.model, "forward": self.forward, "note": self.note or None,
            "sides": {s.name.lower(): {"path": s.path, "tokens_from": s.tokens_from, "error": s.error or None,
                                       "layers_leaving": sum(not r.passed for r in worst(s).values())}
                      for s in (self.old, self.new)},
            "layers": [{"evaluation": lr.evaluation, "layer": lr.layer, "verdict": lr.verdict,
                        "regression": lr.regression, "old": lr.where("old"), "new": lr.where("new"),
                        "old_severity": severity(lr.old), "new_severity": severity(lr.new)} for lr in self.layers],
        }


def _shared_tokens(rep: DiffReport) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    """(ids for OLD, ids for NEW) taken from the other side when one log printed none: one run, the same
    evaluations (diff has checked T and n_past) and identical printed embeddings."""
    if len(rep.tokens) != 1 or any(w.startswith("evaluation ") and w.endswith(" only") for w in rep.warnings):
        return None, None
    ta, tb = rep.tokens[0]
    inputs = [n for n in rep.compared if n.role.section == "input"]
    if not inputs or any(n.max_abs > 1e-4 for n in inputs) or (ta is None) == (tb is None):
        return None, None
    return (tb, None) if ta is None else (None, ta)


def reference_lines(ref: ReferenceDiff) -> list[str]:
    """Text: where each side's ids came from, per layer which side leaves the reference and where, a summary."""
    lines = [f"--model {ref.model}: token ids of {s.name}: {', '.join(s.tokens_from) or 'none'}"
             for s in (ref.old, ref.new) if s.tokens_from and s.tokens_from != ["log"]]
    if ref.old.error or ref.new.error:
        return lines
    if not ref.forward:
        return lines + [f"--model {ref.model}: {ref.note}; each side checked from the dump alone under its facts"]
    for lr in ref.layers:
        if not (lr.old.passed and lr.new.passed):
            lines.append(f"eval {lr.evaluation} layer {lr.layer}: {lr.verdict}; OLD: {lr.where('old')}; "
                         f"NEW: {lr.where('new')}")
    n = len(ref.layers)
    old_in = sum(lr.old.passed for lr in ref.layers)
    new_in = sum(lr.new.passed for lr in ref.layers)
    first = ref.regression
    lines.append(f"reference (--model {ref.model}): OLD within it in {old_in} of {n} evaluation×layers, NEW in "
                 f"{new_in}" + (f"; NEW leaves it first at eval {first.evaluation} layer {first.layer}: "
                                f"{first.where('new')}" if first else ""))
    return lines


def check_sides(rep: DiffReport, model, jobs: int = 1) -> ReferenceDiff:
    """Check both dumps with the model (`check --model`; a path, or its context opened once for both), and compare
    which layers each leaves the reference in."""
    model = opened(model)
    given = _shared_tokens(rep)
    sides = []
    for name, side_of, tokens in (("OLD", "old", given[0]), ("NEW", "new", given[1])):
        side = check_side(name, rep.path(side_of), Options(model=model, tokens=tokens, jobs=jobs),
                          getattr(rep, side_of))
        if side.report is not None and side.report.model:
            side.tokens_from = [OTHER_DUMP if tokens is not None else r.get("tokens_from", "log")
                                for r in side.report.model.get("runs", [])]
        sides.append(side)
    out = ReferenceDiff(model_path(model), *sides)
    if out.old.error or out.new.error:
        return out
    m = out.new.report.model or {}
    if m.get("forward", True) is None:
        out.forward, out.note = False, m.get("note", "")
        return out
    wo, wn = worst(out.old), worst(out.new)
    out.layers = [LayerRef(e, L, wo[(e, L)], wn[(e, L)]) for e, L in sorted(wo.keys() & wn.keys())]
    return out
