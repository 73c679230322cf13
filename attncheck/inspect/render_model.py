"""`inspect --model` → text and JSON: the query's full rows from the reference beside the dump, and the checks."""
from __future__ import annotations

import numpy as np
from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from ..results import describe, json_number
from .walk import HeadWalk
from .model_walk import FullRow, ModelWalk


def _cell(x: float) -> str:
    return "·" if np.isnan(x) else f"{x:.4f}"


def rows_table(w: HeadWalk, mw: ModelWalk, a: FullRow, b: FullRow, axis: str) -> Group:
    """Two full rows side by side over every index: the reference, and the dumped value where printed."""
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, header_style="bold")
    t.add_column(axis, justify="right")
    for r in (a, b):
        t.add_column(f"{r.name} (model)", justify="right")
        t.add_column(f"{r.name} (dump)", justify="right")
    for i in range(len(a.index)):
        t.add_row(str(int(a.index[i])), f"{a.reference[i]:.4f}", _cell(a.dumped[i]), f"{b.reference[i]:.4f}",
                  _cell(b.dumped[i]))
    what = (f"q_{w.query} and kqv_{w.query} of head {w.head}, all D_h = {len(a.index)} dims"
            if axis == "dim" else f"scores and weights of query {w.query} over all {len(a.index)} visible slots")
    return Group(Text(f"From the model: {what} (· not printed)", style="bold"), t)


def checks_table(mw: ModelWalk) -> Table:
    t = Table(title=f"--model checks of this head ({mw.model}, {mw.arch})", title_justify="left",
              box=box.SIMPLE_HEAD, pad_edge=False, header_style="bold")
    for col in ("check", "node", "compared", "max err", "bound", "need", "NMSE", "error model", ""):
        t.add_column(col, justify="left" if col in ("check", "node", "error model", "") else "right")
    for r in mw.results:
        if not r.checked and r.passed:  # a node that printed nothing of this head
            continue
        where = "" if r.worst is None or r.passed else f" at {describe(r.worst)}"
        t.add_row(r.check, r.node, str(r.checked), f"{r.max_error:.1e}", f"{r.bound:.1e}", f"{r.ratio:.2f}",
                  "-" if r.nmse is None else f"{r.nmse:.1e}", r.error_model or "-",
                  ("[green]PASS[/]" if r.passed else "[bold red]FAIL[/]") + where)
    return t


def render_model_walk(w: HeadWalk, mw: ModelWalk, console: Console) -> None:
    q, kq, p, o = mw.rows
    console.print(rows_table(w, mw, kq, p, "slot"))
    console.print(rows_table(w, mw, q, o, "dim"))
    console.print(checks_table(mw))
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
