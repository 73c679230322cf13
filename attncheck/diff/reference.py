"""`diff OLD NEW --model GGUF`: each side checked against the model's reference forward pass (attncheck.verify
with the model), and per evaluation × layer which side leaves the reference, and where.

The verdict: NEW leaves the reference where OLD did not: in some evaluation × layer, NEW's check furthest from the
reference is more than FAR_WORSE times its bound, and FAR_WORSE times as far as OLD's furthest there: a regression
(exit 1); else drift (exit 0). The margin is there because the reference is exact at layer 0 only: deeper, its
allowance is statistical, and two correct builds each leave it by a little, in different layers. Where both
leave it, the reference (not the build) is off there, and it is said so. A side whose log printed no token
ids takes the other side's ids when both evaluate the same tokens (same T, identical printed embeddings), else
the reference looks them up in the model's embeddings (model/token_ids.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..check.report import Report
from ..errors import DumpError, ModelError
from ..results import CheckResult, describe
from ..verify import Options, verify
from .compare import DiffReport

FAR_WORSE = 4.0  # NEW's furthest |err|/bound in a layer over OLD's (or 1): measured between correct builds up to 2.1
OTHER_DUMP = "other dump"


def severity(r: CheckResult) -> float:
    """How far a --model check leaves the reference: its worst |err|/bound, at least 1 when it failed (by NMSE)."""
    return max(r.ratio, 1.0 if not r.passed else 0.0)


@dataclass
class Side:
    name: str  # OLD | NEW
    path: str
    report: Report | None = None
    error: str = ""
    tokens_from: list[str] = field(default_factory=list)  # per run: log, embeddings, other dump, --tokens

    def worst(self) -> dict[tuple[int, int], CheckResult]:
        """(evaluation, layer) → its --model check furthest from the reference."""
        out: dict[tuple[int, int], CheckResult] = {}
        for sr in self.report.sites if self.report else []:
            for r in sr.results:
                key = (sr.evaluation, sr.layer)
                if r.check.startswith("model_") and (key not in out or severity(r) > severity(out[key])):
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
        """NEW leaves the reference, and by more than FAR_WORSE times as far as OLD (or its bound) there."""
        return severity(self.new) > FAR_WORSE * max(severity(self.old), 1.0)

    @property
    def verdict(self) -> str:
        if self.regression:
            return "NEW leaves the reference"
        leave = (not self.old.passed, not self.new.passed)
        return {(True, True): "both leave the reference (its limit here, not a build's)",
                (True, False): "OLD leaves the reference", (False, True): "NEW leaves the reference by little"
                }.get(leave, "both within")

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
    def error(self) -> str:
        return self.old.error or self.new.error

    @property
    def regression(self) -> LayerRef | None:
        return next((lr for lr in self.layers if lr.regression), None)

    def fixed(self, evaluation: int, layer: int | None) -> bool:
        """OLD leaves the reference in this layer and NEW stays within it."""
        lr = next((x for x in self.layers if (x.evaluation, x.layer) == (evaluation, layer)), None)
        return lr is not None and not lr.old.passed and lr.new.passed

    def to_dict(self) -> dict:
        return {
            "model": self.model, "forward": self.forward, "note": self.note or None, "error": self.error or None,
            "far_worse": FAR_WORSE,
            "sides": {s.name.lower(): {"path": s.path, "tokens_from": s.tokens_from, "error": s.error or None,
                                       "layers_leaving": sum(not r.passed for r in s.worst().values())}
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
    """Text: where each side's ids came from, per layer which side leaves the reference and where, the verdict."""
    if ref.error:
        return [f"--model {ref.model}: {ref.error}"]
    lines = [f"--model {ref.model}: token ids of {s.name}: {', '.join(s.tokens_from) or 'none'}"
             for s in (ref.old, ref.new) if s.tokens_from and s.tokens_from != ["log"]]
    if not ref.forward:
        return lines + [f"--model {ref.model}: {ref.note}; the drift model gives the verdict"]
    for lr in ref.layers:
        if not (lr.old.passed and lr.new.passed):
            lines.append(f"eval {lr.evaluation} layer {lr.layer}: {lr.verdict}; OLD: {lr.where('old')}; "
                         f"NEW: {lr.where('new')}")
    n = len(ref.layers)
    old_in = sum(lr.old.passed for lr in ref.layers)
    new_in = sum(lr.new.passed for lr in ref.layers)
    first = ref.regression
    lines.append(f"reference (--model {ref.model}): OLD within it in {old_in} of {n} evaluation×layers, NEW in "
                 f"{new_in}; " + (f"NEW leaves it where OLD did not first at eval {first.evaluation} layer "
                                  f"{first.layer}: {first.where('new')}" if first else
                                  "NEW leaves it nowhere OLD did not"))
    return lines


def check_sides(rep: DiffReport, model: str) -> ReferenceDiff:
    """Verify both dumps against the model, and compare which layers each leaves the reference in."""
    given = _shared_tokens(rep)
    sides = []
    for name, path, tokens in (("OLD", rep.old, given[0]), ("NEW", rep.new, given[1])):
        side = Side(name, path)
        try:
            side.report = verify(path, Options(model=model, tokens=tokens))
        except (DumpError, ModelError) as e:
            side.error = str(e)
        if side.report is not None and side.report.model:
            side.tokens_from = [OTHER_DUMP if tokens is not None else r.get("tokens_from", "log")
                                for r in side.report.model.get("runs", [])]
        sides.append(side)
    out = ReferenceDiff(model, *sides)
    if out.error:
        return out
    m = out.new.report.model or {}
    if m.get("forward", True) is None:
        out.forward, out.note = False, m.get("note", "")
        return out
    wo, wn = out.old.worst(), out.new.worst()
    out.layers = [LayerRef(e, L, wo[(e, L)], wn[(e, L)]) for e, L in sorted(wo.keys() & wn.keys())]
    return out


def reference_verdict(rep: DiffReport, pair: str) -> str:
    """The verdict of diff --model: the reference's, with the drift model's count beside it."""
    ref: ReferenceDiff = rep.reference  # type: ignore[assignment]
    beyond = rep.diverged
    first = ref.regression
    if first is not None:
        drift = f"; {len(beyond)} nodes beyond the drift of correct builds" if beyond else ""
        return (f"REGRESSION diff {pair}: NEW leaves the model's reference where OLD does not, first at eval "
                f"{first.evaluation} layer {first.layer}: {first.where('new')}; OLD: {first.where('old')}{drift}")
    if beyond:
        nd = beyond[0]
        return (f"REGRESSION diff {pair}: both builds stay within the model's reference (its allowance is wider "
                f"there), but NEW is beyond the drift of correct builds first at eval {nd.evaluation} "
                f"{nd.role.group} {nd.role.name} '{nd.new.name}' (NEW line {nd.new.line}): |Δ| {nd.max_abs:.1e}, "
                f"{nd.ratio:.1f}× its tolerance")
    return (f"DRIFT diff {pair}: NEW leaves the model's reference nowhere OLD does not ({len(ref.layers)} "
            "evaluation×layers checked on both), and every node is within the drift of correct builds")
