"""What `--model` keeps of a whole dump for the JSON `model` block: per checked node a note, coverage of the
attention nodes, what was skipped, the first node beyond print precision and the first failing one."""
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


@dataclass
class Summary:
    notes: list[NodeNote] = field(default_factory=list)
    coverage: dict[str, dict[str, int]] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)

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
