"""`inspect --model` → text and JSON: the query's full rows from the reference beside the dump, and the checks."""
from __future__ import annotations

import numpy as np
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from ..present.columns import NEVER, Col, fit
from ..results import describe, json_number
from ..errors import markup as escape, printable
from .walk import HeadWalk
from .model_walk import FullRow, ModelWalk


def _cell(x: float) -> str:
    return "·" if np.isnan(x) else f"{x:.4f}"


def rows_table(w: HeadWalk, mw: ModelWalk, a: FullRow, b: FullRow, axis: str, width: int | None = None) -> Group:
    """Two full rows side by side over every index: the reference, and the dumped value where printed."""
    cols = [Col(axis, keep=NEVER)] + [Col(f"{r.name} ({side})", keep=NEVER if side == "model" else 3, wrap=True)
                                      for r in (a, b) for side in ("model", "dump")]
    rows = [[str(int(a.index[i])), f"{a.reference[i]:.4f}", _cell(a.dumped[i]), f"{b.reference[i]:.4f}",
             _cell(b.dumped[i])] for i in range(len(a.index))]
    what = (f"q_{w.query} and kqv_{w.query} of head {w.head}, all D_h = {len(a.index)} dims"
            if axis == "dim" else f"scores and weights of query {w.query} over all {len(a.index)} visible slots")
    return Group(Text(printable(f"From the model: {what} (· not printed)"), style="bold"), fit(cols, rows, width))


def checks_table(mw: ModelWalk, width: int | None = None) -> Table:
    cols = (Col("check", "left", NEVER, wrap=True), Col("node", "left", 4, wrap=True, min_width=12, fold=True),
            Col("compared", keep=3), Col("max err", keep=6), Col("bound", keep=6), Col("need", keep=7),
            Col("NMSE", keep=2), Col("error model", "left", 1, wrap=True), Col("", "left", NEVER, wrap=True))
    rows = []
    for r in mw.results:
        if not r.checked and r.passed:  # a node that printed nothing of this head
            continue
        where = "" if r.worst is None or r.passed else f" at {describe(r.worst)}"
        rows.append([r.check, escape(r.node), str(r.checked), f"{r.max_error:.1e}", f"{r.bound:.1e}",
                     f"{r.ratio:.2f}", "-" if r.nmse is None else f"{r.nmse:.1e}", r.error_model or "-",
                     ("[green]PASS[/]" if r.passed else "[bold red]FAIL[/]") + where])
    return fit(cols, rows, width, title=escape(f"--model checks of this head ({mw.model}, {mw.arch})"),
               title_justify="left")


def render_model_walk(w: HeadWalk, mw: ModelWalk, console: Console) -> None:
    q, kq, p, o = mw.rows
    console.print(rows_table(w, mw, kq, p, "slot", console.width))
    console.print(rows_table(w, mw, q, o, "dim", console.width))
    console.print(checks_table(mw, console.width))
    arith = mw.arithmetic.get("f16_src1", "convert")
    console.print(f"reference arithmetic: f16 src0 with {'f16-converted' if arith == 'convert' else 'f32'} src1; "
                  f"K_h and V_h of the {len(mw.K_h)} visible slots are in --json", style="dim")
    style = "bold green" if mw.passed else "bold red"
    console.print(f"[{style}]{'PASS' if mw.passed else 'FAIL'}[/] against the model: "
                  f"{sum(r.checked for r in mw.results)} printed elements of head {w.head} checked", highlight=False)



def _list(a: np.ndarray) -> list:
    return [None if np.isnan(x) else float(x) for x in np.asarray(a, dtype=np.float64).ravel()]


def model_walk_dict(mw: ModelWalk) -> dict:
    """The `model` block of `inspect --json`: full rows, K_h/V_h, the checks of this head."""
    return {
        "path": mw.model, "arch": mw.arch, "arithmetic": mw.arithmetic, "passed": mw.passed,
        "rows": {r.name: {"node": r.node, "index": r.index.tolist(), "reference": _list(r.reference),
                          "dumped": _list(r.dumped), "printed": r.printed} for r in mw.rows},
        "K_h": [_list(row) for row in mw.K_h], "V_h": [_list(row) for row in mw.V_h],
        "checks": [{"check": r.check, "node": r.node, "line": r.line, "passed": r.passed, "checked": r.checked,
                    "max_error": json_number(r.max_error), "bound": json_number(r.bound),
                    "ratio": json_number(r.ratio),
                    "nmse": None if r.nmse is None else json_number(r.nmse),
                    "error_model": r.error_model, "worst": None if r.worst is None else
                    {k: v for k, v in r.worst._asdict().items() if v is not None}}
                   for r in mw.results],
    }
