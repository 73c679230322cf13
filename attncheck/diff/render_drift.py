"""The drift of two builds for people: per layer the largest drift between them and how much of its allowance it
took."""
from __future__ import annotations

from dataclasses import dataclass


from ..present.columns import NEVER, Col, fit
from ..errors import markup as escape
from .compare import DiffReport, NodeDiff


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


def drift_table(rep: DiffReport, width: int | None = None):
    """Per layer the largest drift and the node closest to its allowance; the layer and its verdict always, the other
    columns as the terminal's width allows (present/columns.py)."""
    cols = (Col("layer", "left", NEVER), Col("nodes", keep=2), Col("largest drift (of rms)", keep=7),
            Col("in", "left", 4, wrap=True, min_width=8, fold=True), Col("allowed there", keep=6),
            Col("closest to its allowance", "left", 3, wrap=True, min_width=8, fold=True), Col("|Δ|/tol", keep=5),
            Col("", "left", NEVER))
    rows = []
    for ld in per_layer(rep):
        big, worst = ld.largest, ld.worst
        status = f"[bold red]{ld.beyond} BEYOND[/]" if ld.beyond else "[green]drift[/]"
        rows.append([ld.group.replace("layer ", ""), str(ld.nodes), f"{big.drift:.1e}", escape(big.role.name),
                     f"{big.allowed:.1e}", escape(_name(worst)), f"{worst.ratio:.2f}", status])
    return fit(cols, rows, width, title=escape(f"diff {rep.old} → {rep.new}: drift per layer (every evaluation)"),
               title_justify="left")


def _name(nd: NodeDiff) -> str:
    return nd.role.name + (f" (eval {nd.evaluation})" if nd.evaluation else "")
