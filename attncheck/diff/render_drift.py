"""The drift of two builds for people: per layer the largest drift between them and how much of its allowance it
took."""
from __future__ import annotations



from ..present.columns import NEVER, Col, fit
from ..errors import markup as escape
from .report import DiffReport, NodeDiff, per_layer


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
