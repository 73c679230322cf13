"""`attncheck diff`: two dumps of one model and prompt compared node by node, each checked as `check` does."""
from __future__ import annotations

import shutil
import sys
import tempfile
from contextlib import contextmanager

import click

from ..dump.pipe import paced
from ..errors import DumpError, ModelError
from .common import (TOLERANCE, combine, console as make_console, fail, html_option, jobs_option, json_option,
                     junit_option, to_stdout, warn, write_html, write_json, write_junit)


@contextmanager
def spooled(*paths: str):
    """The dumps as files: '-' (stdin) copied into a temporary file, removed afterwards; and what to call each
    ('<stdin>' for the spooled one, None for a file)."""
    if "-" not in paths:
        yield paths, tuple(None for _ in paths)
        return
    with tempfile.NamedTemporaryFile(prefix="attncheck-stdin-", suffix=".txt") as f:
        shutil.copyfileobj(paced(sys.stdin.buffer), f, 1 << 20)  # a pipe in few, large reads (dump/pipe.py)
        f.flush()
        yield tuple(f.name if p == "-" else p for p in paths), tuple("<stdin>" if p == "-" else None for p in paths)


@click.command(name="diff")
@click.argument("old")
@click.argument("new")
@click.option("--prefix", is_flag=True, help="One prompt extends the other: compare only what causality fixes.")
@json_option("the JSON report (schema 1, kind diff)")
@junit_option()
@click.option("--exact", is_flag=True, help="Print precision only (two runs of one build), not the drift of two "
                                            "correct builds.")
@click.option("--atol", type=TOLERANCE, help="Absolute tolerance in place of the drift model (--exact: 1e-4).")
@click.option("--rtol", type=TOLERANCE, help="Relative tolerance in place of the drift model (--exact: 2^-16).")
@click.option("--nmse", is_flag=True, help="Per-op NMSE thresholds as llama.cpp's test-backend-ops, not atol/rtol.")
@click.option("--model", metavar="GGUF", help="Also check each side against this model's reference forward pass, "
                                              "and say per layer which side leaves it.")
@click.option("-q", "--quiet", is_flag=True, help="Only the divergences and the verdict.")
@click.option("-v", "--verbose", is_flag=True, help="Every matched node, compared or not, and every unmatched one.")
@jobs_option("diffing evaluation pairs")
@html_option("every compared node along the graph, with the tolerance it needed,")
def diff_(old, new, prefix, json_out, junit, exact, atol, rtol, nmse, model, quiet, verbose, jobs, html_out):
    """Compare two dumps of one model and prompt node by node (an old and a new llama.cpp build), and check each as
    `check` does: drift between correct builds (PASS, exit 0), or a regression (FAIL, exit 1): NEW fails check, or
    a node is beyond the drift. --exact compares at print precision."""
    from ..diff import tolerance
    from ..diff.compare import DiffReport, diff
    from ..diff.junit import diff_xml
    from ..diff.render import render_diff

    try:
        tol = tolerance(exact, atol, rtol, nmse)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    if old == new == "-":
        raise click.UsageError("OLD and NEW are both '-': stdin is one dump; give the other as a file")
    try:
        from ..arch.context import opened
        from ..diff.drift import weight_types_of

        from ..dump.pool import jobs_default

        with spooled(old, new) as (paths, names):  # diff reads each dump twice: stdin is kept in a file meanwhile
            context = opened(model)  # its header read once: for the drift model's weight types and both sides
            rep = diff(*paths, prefix=prefix, tolerance=tol, weight_types=weight_types_of(context) if model else None,
                       jobs=jobs or jobs_default(), model=context, names=names)
    except Exception as e:  # unusable input (DumpError names file and line) or a bug: one line, exit 2
        what = (str(e) if isinstance(e, (DumpError, ModelError))
                else f"internal error ({type(e).__name__}: {e}); please report it")
        rep = DiffReport(old, new, prefix, tol, error=what)
    for w in rep.warnings:
        warn(w)
    if rep.error:
        fail(f"{old} vs {new}: {rep.error}")
    elif rep.new_side is not None and rep.new_side.error:
        fail(rep.new_side.error)
    render_diff(rep, make_console(stderr=to_stdout(json_out, junit)), quiet=quiet, verbose=verbose)
    codes = [rep.exit_code]
    if json_out:
        codes.append(write_json(rep.to_dict(), json_out))
    if junit:
        codes.append(write_junit(diff_xml(rep), junit))
    if html_out:
        from ..diff.html import diff_page

        codes.append(write_html(html_out, lambda: diff_page(rep)))
    sys.exit(combine(codes))
