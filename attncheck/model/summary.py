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
    tau_needed: float | None = None  # cascade nodes: the TAU their worst element needed


UNCHECKED_LISTED = 1000  # unchecked nodes the JSON lists one by one (all are counted by reason)


@dataclass
class Summary:
    notes: list[NodeNote] = field(default_factory=list)
    coverage: dict[str, dict[str, int]] = field(default_factory=dict)
    printed: int = 0  # printed nodes of the evaluations seen (a quantized cache prints none)
    checked: int = 0  # of them, compared with the reference
    unchecked: list[tuple[int, int, str, str]] = field(default_factory=list)  # (evaluation, line, node, why)

    def count(self, ev, roles, why: dict[int, str]) -> None:
        """Count an evaluation's printed nodes; those not compared keep their reason (`why`: "" = compared; a node
        absent from it has no place in the reference forward pass)."""
        for n in ev.nodes:
            if n.quantized:
                continue
            self.printed += 1
            reason = why.get(id(n))
            if reason == "":
                self.checked += 1
                continue
            if reason is None and n.cut:
                reason = "the dump ends inside it"
            if reason is None:
                role = roles.of.get(id(n))
                reason = (f"no node of the reference forward pass is at its place ({role.name}, {n.op})"
                          if role is not None else f"no node of the reference forward pass is at its place ({n.op})")
            self.unchecked.append((ev.index, n.line, n.name, reason))

    def unchecked_list(self) -> dict:
        """Unchecked nodes: the count by reason, and the first UNCHECKED_LISTED one by one."""
        by: dict[str, int] = {}
        for *_, why in self.unchecked:
            by[why] = by.get(why, 0) + 1
        return {"by_reason": dict(sorted(by.items(), key=lambda kv: -kv[1])),
                "nodes": [{"evaluation": e, "line": line, "node": name, "why": why}
                          for e, line, name, why in self.unchecked[:UNCHECKED_LISTED]]}

    def note(self, evaluation: int, layer: int, node, res: CheckResult, error_model: str, beyond: int,
             tau_needed: float | None = None) -> None:
        self.notes.append(NodeNote(evaluation, layer, node.name, node.line, res.check, error_model, res.max_error,
                                   res.nmse, beyond, res.passed, tau_needed))

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
        """What the cascade allowance needed (bounds.TAU): overall and per layer, the largest TAU a
        node's worst element needed and the largest NMSE, with the node that needed the most."""
        notes = [n for n in self.notes if n.tau_needed is not None]
        if not notes:
            return {}
        worst = max(notes, key=lambda n: n.tau_needed)
        layers: dict[int, dict] = {}
        for n in notes:
            d = layers.setdefault(n.layer, {"layer": n.layer, "tau_needed": 0.0, "nmse": 0.0})
            d["tau_needed"] = max(d["tau_needed"], n.tau_needed)
            d["nmse"] = max(d["nmse"], n.nmse)
        kinds: dict[str, dict] = {}
        for n in notes:
            d = kinds.setdefault(n.check, {"tau_needed": 0.0, "nmse": 0.0})
            d["tau_needed"], d["nmse"] = max(d["tau_needed"], n.tau_needed), max(d["nmse"], n.nmse)
        return {"tau_needed": json_number(worst.tau_needed), "nmse": json_number(max(n.nmse for n in notes)),
                "at": {"evaluation": worst.evaluation, "layer": worst.layer, "node": worst.node, "check": worst.check},
                "by_check": {k: {a: json_number(b) for a, b in v.items()} for k, v in sorted(kinds.items())},
                "by_layer": [{k: json_number(v) if isinstance(v, float) else v for k, v in d.items()}
                             for _, d in sorted(layers.items())]}
