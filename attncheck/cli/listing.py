"""`attncheck list`: what dumps hold, evaluation by evaluation and layer by layer; a table or JSON."""
from __future__ import annotations

import sys

import click

from ..present.columns import NEVER, Col, dropped, extent, fit
from ..report import EXIT_INPUT, EXIT_PASS, EXIT_UNVERIFIED
from ..errors import DumpError, markup
from .common import combine, console as make_console, fail, jobs_option, json_option, model_context, warn, write_json

COLUMNS = (Col("eval", keep=NEVER), Col("run", keep=2), Col("n_past", keep=3), Col("T", keep=4), Col("nodes", keep=1),
           Col("layer", keep=NEVER), Col("attention", "left", keep=NEVER), Col("nodes (line)", "left", keep=7),
           Col("H", keep=6), Col("H_kv", keep=5), Col("D_h", keep=5), Col("n_kv", keep=3))


TABLE_EVALUATIONS = 200  # without -v or --json, the table's evaluations: the rows of more are neither kept nor shown


STRUCTURE = ("layer", "kind", "names", "H", "H_kv", "D_h", "n_kv")  # what a layer is, its lines aside


def _evaluations(rows: list[dict]) -> list[list[dict]]:
    """The rows cut into evaluations, in order: a repeat is told evaluation by evaluation."""
    out: list[list[dict]] = []
    for r in rows:
        if not out or out[-1][0]["evaluation"] != r["evaluation"]:
            out.append([])
        out[-1].append(r)
    return out


def _structure(rows: list[dict]) -> tuple:
    """An evaluation's layers without their line numbers (which always differ): equal when the layers repeat."""
    return tuple(tuple(tuple(r[k]) if isinstance(r[k], list) else r[k] for k in STRUCTURE) for r in rows)


def _head(r: dict) -> list[str]:
    """The cells of the evaluation itself: eval, run, n_past, T, nodes."""
    return [str(r[k]) for k in ("evaluation", "run", "n_past", "T", "nodes")]


def _layer_cells(r: dict) -> list[str]:
    """The cells of one layer (or SOFT_MAX that is not attention): layer, attention, its nodes at their lines, shape."""
    named = "\n".join(markup(f"{n} ({line})") for n, line in zip(r["names"], r["lines"]))
    return ["" if r["layer"] is None else str(r["layer"]), r["kind"], named,
            *("" if r[k] is None else str(r[k]) for k in ("H", "H_kv", "D_h", "n_kv"))]


def _repeat_cells(rows: list[dict], full: int) -> list[str]:
    """An evaluation whose layers repeat eval `full`'s as one row: its own cells, its layers, its nodes' line span."""
    layered = [r for r in rows if r["layer"] is not None]
    lines = [line for r in (layered or rows) for line in r["lines"]]
    return [*_head(rows[0]), extent([r["layer"] for r in layered]) if layered else "", f"as eval {full}",
            f"lines {extent(lines)}" if lines else "", "", "", "", ""]


def _table_rows(doc: dict, verbose: bool) -> tuple[list[list[str]], int]:
    """The rows, and how many evaluations got one: without -v, a repeat of the last full evaluation is one row."""
    out, full, repeats = [], None, 0
    for rows in _evaluations(doc["rows"]):
        if not verbose and full is not None and _structure(rows) == full[1]:
            out.append(_repeat_cells(rows, full[0]))
            repeats += 1
            continue
        full = (rows[0]["evaluation"], _structure(rows))
        out += [[*(_head(r) if i == 0 else [""] * 5), *_layer_cells(r)] for i, r in enumerate(rows)]
    return out, repeats


def _table(doc: dict, width: int | None, verbose: bool = False):
    """The dump's table, fit to `width`, and how many evaluations it shows on one row."""
    rows, repeats = _table_rows(doc, verbose)
    return fit(COLUMNS, rows, width, title=markup(doc["source"]), title_justify="left"), repeats


def _repeats_note(repeats: int) -> str:
    """The line under the table that says which rows stand for a whole evaluation, and how to see its layers."""
    what = "evaluation" if repeats == 1 else "evaluations"
    return (f"[dim]{repeats} {what} on one row: layers as in the eval named; -v lists every layer (--json has all "
            "rows)[/]")


@click.command(name="list")
@click.argument("dumps", nargs=-1, metavar="[DUMP]...")
@json_option("what the dumps hold as JSON (schema 1)")
@click.option("--model", metavar="GGUF", help="The model that made the dumps: its vocabulary shows each token's text.")
@click.option("-v", "--verbose", is_flag=True, help="Every evaluation's layers, also those that repeat the evaluation "
              "printed in full before it (without -v: one row for such an evaluation).")
@jobs_option("reading each dump", "the listing")
def list_(dumps, json_out, model, verbose, jobs):
    """What dumps hold: runs, evaluations, each layer's attention and its nodes (default: stdin)."""
    from ..arch.vocab import token_unit

    from ..listing import list_dump

    model = model_context(model)  # opened once; a file that is not a GGUF: one line, exit 2, before any dump
    console = make_console(stderr=json_out == "-")
    docs, codes = [], []
    for path in dumps or ("-",):
        try:
            doc = list_dump(path, model=model, jobs=jobs, limit=None if json_out or verbose else TABLE_EVALUATIONS)
        except DumpError as e:
            fail(str(e))
            codes.append(EXIT_INPUT)
            continue
        docs.append(doc)
        codes.append(EXIT_PASS if doc["evaluations"] else EXIT_UNVERIFIED)
        if json_out != "-":
            table, repeats = _table(doc, console.width, verbose)
            console.print(table)
            if repeats:
                console.print(_repeats_note(repeats))
            shown_evs = len({r["evaluation"] for r in doc["rows"]})
            if shown_evs < doc["evaluations"]:
                console.print(f"[dim]the first {shown_evs} of {doc['evaluations']} evaluations (-v or --json lists "
                              "every one)[/]")
            gone = dropped(table, COLUMNS)
            if gone:
                console.print(f"[dim]columns left out for the terminal's width: {', '.join(gone)} (--json has "
                              "them)[/]")
            for r in doc["runs"]:
                ids = "no token ids in the log" if r["tokens"] is None else f"{len(r['tokens'])} tokens {r['tokens']}"
                if r.get("token_text") is not None:  # each id and its text one unit, never broken across lines
                    ids = f"{len(r['tokens'])} tokens " + "  ".join(
                        token_unit(i, t) for i, t in zip(r["tokens"], r["token_text"]))
                console.print(f"run at line {r['line']}: {ids}", markup=False)
        for w in doc["warnings"]:  # as `check` writes them: stderr, one visible line each
            warn(w)
    if json_out:
        from .. import __version__

        codes.append(write_json({"schema": 1, "tool": "attncheck", "command": "list", "version": __version__,
                                 "dumps": docs}, json_out))
    sys.exit(combine(codes))
