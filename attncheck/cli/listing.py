"""`attncheck list`: what dumps hold, evaluation by evaluation and layer by layer; a table or JSON."""
from __future__ import annotations

import sys

import click
from rich.markup import escape

from ..check.columns import NEVER, Col, dropped, fit
from ..check.report import EXIT_INPUT, EXIT_PASS, EXIT_UNVERIFIED
from ..errors import DumpError, printable
from .common import combine, console as make_console, fail, json_option, model_meta, write_json

COLUMNS = (Col("eval", keep=NEVER), Col("run", keep=2), Col("n_past", keep=3), Col("T", keep=4), Col("nodes", keep=1),
           Col("layer", keep=NEVER), Col("attention", "left", keep=NEVER), Col("nodes (line)", "left", keep=7),
           Col("H", keep=6), Col("H_kv", keep=5), Col("D_h", keep=5), Col("n_kv", keep=3))


def _listed(path: str, meta: dict | None) -> dict:
    """One dump's evaluations, layers, runs and notes (what the table and the JSON show); with a model's header,
    each run's token ids with their text."""
    from ..arch.vocab import token_text
    from ..dump.graph import read_dump
    from ..dump.listing import listing

    d = read_dump(path)
    rows = [r._asdict() for r in listing(d)]
    return {"source": d.source, "evaluations": len({r["evaluation"] for r in rows}),
            "rows": [{**r, "names": list(r["names"]), "lines": list(r["lines"])} for r in rows],
            "runs": [{"line": r.line, "tokens": None if r.tokens is None else list(r.tokens),
                      **({} if meta is None else {"token_text": token_text(meta, r.tokens)})} for r in d.runs],
            "warnings": [f"{d.source}:{n.line}: {printable(n.message)}" for n in d.notes]}


def _table(doc: dict, width: int | None):
    rows, last = [], None
    for r in doc["rows"]:
        first = r["evaluation"] != last
        last = r["evaluation"]
        head = [str(r[k]) for k in ("evaluation", "run", "n_past", "T", "nodes")] if first else [""] * 5
        named = "\n".join(escape(printable(f"{n} ({line})")) for n, line in zip(r["names"], r["lines"]))
        rows.append([*head, "" if r["layer"] is None else str(r["layer"]), r["kind"], named,
                     *("" if r[k] is None else str(r[k]) for k in ("H", "H_kv", "D_h", "n_kv"))])
    return fit(COLUMNS, rows, width, title=escape(doc["source"]), title_justify="left")


@click.command(name="list")
@click.argument("dumps", nargs=-1, metavar="[DUMP]...")
@json_option("what the dumps hold as JSON (schema 1)")
@click.option("--model", metavar="GGUF", help="The model that made the dumps: its vocabulary shows each token's text.")
def list_(dumps, json_out, model):
    """What dumps hold: runs, evaluations, each layer's attention and its nodes (default: stdin)."""
    from ..arch.vocab import shown

    meta = model_meta(model)
    console = make_console(stderr=json_out == "-")
    docs, codes = [], []
    for path in dumps or ("-",):
        try:
            doc = _listed(path, meta)
        except DumpError as e:
            fail(str(e))
            codes.append(EXIT_INPUT)
            continue
        docs.append(doc)
        codes.append(EXIT_PASS if doc["evaluations"] else EXIT_UNVERIFIED)
        if json_out != "-":
            table = _table(doc, console.width)
            console.print(table)
            gone = dropped(table, COLUMNS)
            if gone:
                console.print(f"[dim]columns left out for the terminal's width: {', '.join(gone)} (--json has "
                              "them)[/]")
            for r in doc["runs"]:
                ids = "no token ids in the log" if r["tokens"] is None else f"{len(r['tokens'])} tokens {r['tokens']}"
                if r.get("token_text") is not None:
                    ids = f"{len(r['tokens'])} tokens " + "  ".join(
                        f"{i} {shown(t)}" for i, t in zip(r["tokens"], r["token_text"]))
                console.print(f"run at line {r['line']}: {ids}", markup=False)
        for w in doc["warnings"]:  # as `check` writes them: stderr, one visible line each
            click.echo(f"attncheck: warning: {w}", err=True)
    if json_out:
        from .. import __version__

        write_json({"schema": 1, "tool": "attncheck", "command": "list", "version": __version__, "dumps": docs},
                   json_out)
    sys.exit(combine(codes))
