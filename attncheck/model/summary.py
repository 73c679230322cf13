"""What `--model` keeps of a whole dump for the JSON `model` block: per checked node a note, coverage of the
attention nodes, the printed nodes counted and those not compared with why, the first node beyond print precision and the first failing one."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..results import CheckResult, json_number


@dataclass
class NodeNote:
    """What the summary keeps per checked node (graph order = evaluation, then line)."""

    evaluation: int
    layer: int
    node: str
    line: int
    check: str
    error_model: str
    max_error: float
    nmse: float
    beyond_print: int
    passed: bool
    tau_needed: float | None = None  # cascade nodes: the largest z (the gross factor its worst value needed)
    median: float | None = None  # cascade nodes: the median z over its printed values (what `systematic` reads)
    cls: str = ""  # scores | values
    ref_layer: int | None = None
    z: tuple[float, ...] = ()  # cascade nodes: every printed value's z, largest first (calibration reads them)
    need: float = 0.0  # the factor its bound would have needed (CheckResult.ratio)
    n: int = 0  # elements compared
    bound: float = 0.0  # the median bound of its elements: the smallest single move caught there, typically
    rms: float = 0.0  # the rms of its printed reference values
    chaos: tuple[float, float] | None = None  # cascade nodes: the twin's (chaos_max, chaos_row) of its layer


UNCHECKED_LISTED = 1000  # unchecked nodes the JSON lists one by one (all are counted by reason)


@dataclass
class Summary:
    notes: list[NodeNote] = field(default_factory=list)
    coverage: dict[str, dict[str, int]] = field(default_factory=dict)
    printed: int = 0  # printed nodes of the evaluations seen (a quantized cache prints none)
    checked: int = 0  # of them, compared with the reference
    unchecked: list[tuple[int, int, str, str]] = field(default_factory=list)  # (evaluation, line, node, why)

    def count(self, ev) -> None:
        """Count an evaluation's printed nodes (work.Evaluation); those not compared keep their reason (`why`: ""
        = compared; a node absent from it has no place in the reference forward pass)."""
        for line, name, op, quantized, cut, role in ev.nodes:
            if quantized:
                continue
            self.printed += 1
            reason = ev.why.get(line)
            if reason == "":
                self.checked += 1
                continue
            if reason is None and cut:
                reason = "the dump ends inside it"
            if reason is None:
                reason = f"no node of the reference forward pass is at its place ({role + ', ' if role else ''}{op})"
                if ev.lost:  # a role found by its position among the nodes is not named when a node may be missing
                    reason += f", or the header damaged at line {ev.lost[0]} hid its place"
            self.unchecked.append((ev.index, line, name, reason))

    def unchecked_list(self) -> dict:
        """Unchecked nodes: the count by reason, and the first UNCHECKED_LISTED one by one."""
        by: dict[str, int] = {}
        for *_, why in self.unchecked:
            by[why] = by.get(why, 0) + 1
        return {"by_reason": dict(sorted(by.items(), key=lambda kv: -kv[1])),
                "nodes": [{"evaluation": e, "line": line, "node": name, "why": why}
                          for e, line, name, why in self.unchecked[:UNCHECKED_LISTED]]}

    def note(self, evaluation: int, layer: int, node, res: CheckResult, error_model: str, beyond: int,
             z: np.ndarray | None = None, cls: str = "", ref_layer: int | None = None, bound: float = 0.0,
             rms: float = 0.0, chaos: tuple[float, float] | None = None) -> None:
        need = med = None
        zs: tuple[float, ...] = ()
        if z is not None and z.size:
            srt = np.sort(z.ravel())[::-1]
            need, med = float(srt[0]), float(np.median(srt))
            zs = tuple(float(f"{v:.3g}") for v in srt)
        self.notes.append(NodeNote(evaluation, layer, node.name, node.line, res.check, error_model, res.max_error,
                                   res.nmse, beyond, res.passed, need, med, cls, ref_layer, zs, res.ratio, res.checked,
                                   bound, rms, chaos))

    def cover(self, role: str, shape: tuple[int, ...], keep: np.ndarray, labels: tuple[str, str, str]) -> None:
        """Count printed elements and query rows (head × query) of kq, kq_soft_max and FLASH_ATTN_EXT checked."""
        c = self.coverage.setdefault(role, {"elements_printed": 0, "elements_checked": 0, "query_rows_printed": 0,
                                            "query_rows_checked": 0})
        last = 2 if labels[2] in ("slot", "dim") else 1  # the axis along a row
        rows = keep.all(axis=last)
        c["elements_printed"] += int(np.prod(shape))
        c["elements_checked"] += int(keep.sum())
        c["query_rows_printed"] += rows.size
        c["query_rows_checked"] += int(rows.sum())

    def first(self, pred) -> dict | None:
        """The first note, in graph order, that pred holds for."""
        ordered = sorted(self.notes, key=lambda n: (n.evaluation, n.line))
        n = next((x for x in ordered if pred(x)), None)
        return None if n is None else {
            "evaluation": n.evaluation, "layer": n.layer, "node": n.node, "line": n.line, "check": n.check,
            "max_error": json_number(n.max_error), "nmse": json_number(n.nmse), "beyond_print": n.beyond_print}

    def by_check(self) -> dict[str, dict]:
        """Per check kind: nodes, the largest error and NMSE, how many failed."""
        kinds: dict[str, dict] = {}
        for n in self.notes:
            k = kinds.setdefault(n.check, {"nodes": 0, "max_error": 0.0, "max_nmse": 0.0, "failed": 0})
            k["nodes"] += 1
            k["max_error"] = max(k["max_error"], n.max_error)
            k["max_nmse"] = max(k["max_nmse"], n.nmse)
            k["failed"] += not n.passed
        return {k: {**v, "max_error": json_number(v["max_error"]), "max_nmse": json_number(v["max_nmse"])}
                for k, v in sorted(kinds.items())}

    def cascade(self) -> dict:
        """What the deep-layer verdict needed (bounds.CASCADE): overall, per check and per layer, the largest z of
        any value (what `gross` must exceed) and the largest median z of a node (what `systematic` must exceed), and
        the twin's chaos (chaos.py: chaos_max, chaos_row) of the layers they are in."""
        notes = [n for n in self.notes if n.tau_needed is not None]
        if not notes:
            return {}
        worst = max(notes, key=lambda n: n.tau_needed)

        def fold(key) -> list[dict]:
            out: dict = {}
            for n in notes:
                d = out.setdefault(key(n), {"gross_needed": 0.0, "systematic_needed": 0.0, "nmse": 0.0,
                                            "chaos_max": 0.0, "chaos_row": 0.0})
                d["gross_needed"] = max(d["gross_needed"], n.tau_needed)
                d["systematic_needed"] = max(d["systematic_needed"], n.median or 0.0)
                d["nmse"] = max(d["nmse"], n.nmse)
                chaos = n.chaos or (0.0, 0.0)
                d["chaos_max"], d["chaos_row"] = max(d["chaos_max"], chaos[0]), max(d["chaos_row"], chaos[1])
            return [{"at": k, **{a: json_number(b) for a, b in v.items()}} for k, v in sorted(out.items())]

        return {"gross_needed": json_number(worst.tau_needed),
                "systematic_needed": json_number(max(n.median or 0.0 for n in notes)),
                "at": {"evaluation": worst.evaluation, "layer": worst.layer, "node": worst.node, "check": worst.check},
                "by_check": fold(lambda n: n.check), "by_layer": fold(lambda n: n.layer)}
