"""Each dump of a diff checked as `attncheck check` checks it (attncheck.verify; with --model, `check --model`).

The upgrade gate never passes a NEW that check fails: that is a regression whatever the drift, named as check names
it. An OLD that check fails is said (the baseline was already broken) and fails nothing by itself. Each dump is read
once more for its check, evaluation by evaluation as check reads it, after the node diff has dropped its nodes. The
checks also pin each site's kq_scale, which the softmax weights' allowance needs (softmax.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..arch.context import model_path
from ..present.render import failure_lines
from ..report import EXIT_FAIL, EXIT_INPUT, EXIT_UNVERIFIED, Report
from ..dump.graph import read_dump
from ..errors import DumpError, ModelError
from ..results import json_number
from ..verify import Options, verify


@dataclass
class Side:
    """One dump of the pair and what check says of it."""

    name: str  # OLD | NEW
    path: str
    model: str | None = None  # checked with --model
    report: Report | None = None
    error: str = ""  # check could not read it (check's exit 2): its error line
    tokens_from: list[str] = field(default_factory=list)  # --model: per run, where the token ids came from

    @property
    def command(self) -> str:
        return "check --model" if self.model else "check"

    @property
    def exit_code(self) -> int:
        return EXIT_INPUT if self.error or self.report is None else self.report.exit_code

    @property
    def failed(self) -> bool:
        return self.exit_code == EXIT_FAIL

    def failures(self, limit: int | None = 10) -> list[str]:
        """The failing elements as check lists them (evaluation, layer, head, query, slot or dim, node, line)."""
        return failure_lines(self.report, limit) if self.failed else []

    def covered(self) -> str:
        """What check covered, in a few words: sites and elements."""
        if self.report is None:
            return ""
        t = self.report.totals()
        out = (f"{t['sites']} sites, {t['softmax_rows_checked']} softmax rows, {t['softmax_ratio_elements_checked']} "
               f"weight ratios, {t['masked_weights_checked']} masked weights, {t['kqv_elements_checked']} kqv elements")
        if t.get("model_nodes_checked"):
            out += f", {t['model_elements_checked']} elements of {t['model_nodes_checked']} nodes against the model"
        return out

    def state(self) -> str:
        """'passes check (...)', 'fails check: <first failure>; k of n sites failed', and so on."""
        code = self.exit_code
        if code == EXIT_INPUT:
            return f"cannot be checked: {self.error}"
        if code == EXIT_UNVERIFIED:
            return f"{self.command} verifies nothing of it: {self.report.unverified_reason()}"
        if code == EXIT_FAIL:
            t = self.report.totals()
            return (f"fails {self.command}: {self.failures(1)[0]}; {t['sites_failed']} of {t['sites']} sites "
                    "failed")
        return f"passes {self.command} ({self.covered()})"

    def as_baseline(self) -> str:
        """What check says of OLD when it does not pass: said, and failing nothing by itself."""
        return f"the baseline {'already ' if self.failed else ''}{self.state()}"

    def to_dict(self) -> dict:
        """The side's check: its verdict, exit code, totals and every failing element the report kept."""
        rep = self.report
        return {
            "path": self.path, "command": self.command, "verdict": rep.verdict if rep and not self.error else "error",
            "exit_code": self.exit_code, "error": self.error or None,
            "reason": rep.unverified_reason() if self.exit_code == EXIT_UNVERIFIED else None,
            "tokens_from": self.tokens_from or None,
            "totals": rep.totals() if rep is not None else None,
            "failures": [_failure(s, r, f) for s in rep.failed_sites for r in s.results if not r.passed
                         for f in r.failures] if rep is not None else [],
        }


def _failure(s, r, f) -> dict:
    at = None if f.at is None else {k: v for k, v in f.at._asdict().items() if v is not None}
    return {"evaluation": s.evaluation, "layer": s.layer, "check": r.check, "node": r.node, "line": f.line or r.line,
            "at": at, "got": json_number(f.got), "want": json_number(f.want), "bound": json_number(f.bound),
            "elements_failed": r.failed}


def check_side(name: str, path: str, options: Options, label: str | None = None) -> Side:
    """One dump through verify; unusable input (check's exit 2) is the side's error, not an exception. label: what
    the report calls the file, where it is not its path."""
    side = Side(name, label or path, model_path(options.model))
    try:
        side.report = verify(read_dump(path, label), options)
    except (DumpError, ModelError) as e:
        side.error = str(e)
    return side


def check_both(rep, jobs: int) -> tuple[Side, Side]:
    """OLD and NEW of a DiffReport through the dump-only checks, one after the other."""
    return (check_side("OLD", rep.path("old"), Options(jobs=jobs), rep.old),
            check_side("NEW", rep.path("new"), Options(jobs=jobs), rep.new))


def kq_scales(sides: tuple[Side, Side] | None) -> dict[tuple[int, int], tuple[float, str]]:
    """(evaluation, layer) → the kq_scale its check pinned, and which side's check: OLD's (the build trusted so far)
    where it has the site, else NEW's."""
    out: dict[tuple[int, int], tuple[float, str]] = {}
    for side in reversed(sides or ()):
        for sr in side.report.sites if side.report is not None else ():
            out[(sr.evaluation, sr.layer)] = (sr.kq_scale, f"{side.name}'s check")
    return out
