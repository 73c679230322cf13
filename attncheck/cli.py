"""The command line: a thin layer over attncheck.read_dump / attncheck.verify. Exit codes: 0 pass, 1 fail,
2 unusable input or usage, 3 nothing could be verified."""
from __future__ import annotations

import json
import os
import sys

import click
from rich.console import Console

from .errors import DumpError, ModelError, printable
from .check.report import EXIT_FAIL, EXIT_INPUT, EXIT_PASS, EXIT_UNVERIFIED, SCHEMA, Report


class DefaultGroup(click.Group):
    """`attncheck [DUMP]` means `attncheck check [DUMP]`."""

    def parse_args(self, ctx, args):
        if not args or (args[0] not in self.commands and args[0] not in ("--help", "-h", "--version")):
            args = ["check", *args]
        return super().parse_args(ctx, args)


@click.group(cls=DefaultGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="attncheck")
def main() -> None:
    """Verify llama.cpp attention in llama-eval-callback dumps.

    llama-eval-callback -m model.gguf -p "How are" --flash-attn off 2>&1 | attncheck
    """


def _console(stderr: bool = False) -> Console:
    """Rich console; a pipe or CI log gets 120 columns rather than rich's default 80."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, highlight=False, width=None if stream.isatty() else 120)


def _fail(message: str) -> None:
    click.echo(f"attncheck: error: {message}", err=True)


def _write_json(doc: dict, target: str | None) -> None:
    text = json.dumps(doc, indent=2)
    if target == "-":
        click.echo(text)
    elif target:
        with open(target, "w") as f:
            f.write(text + "\n")


def _html_target(ctx, param, value: str | None) -> str | None:
    """--html FILE: a page that could not be written is a usage error before any work starts (one line, exit 2)."""
    if value is None:
        return None
    folder = os.path.dirname(os.path.abspath(value))
    why = ("is a folder" if os.path.isdir(value) else f"the folder {folder} does not exist" if not os.path.isdir(folder)
           else f"the folder {folder} is not writable" if not os.access(folder, os.W_OK) else "")
    if why:
        _fail(printable(f"--html {value}: {why}"))
        sys.exit(EXIT_INPUT)
    return value


def _html_option(what: str):
    return click.option("--html", "html_out", metavar="FILE", callback=_html_target,
                        help=f"Write {what} as one self-contained HTML page (open it from disk in a browser).")


def _write_html(target: str, build) -> int:
    """Build and write the page; EXIT_INPUT with one line when it cannot be written, else EXIT_PASS."""
    from .check.html import write_page

    try:
        write_page(target, build())
    except OSError as e:
        _fail(printable(f"--html {target}: cannot write it: {e.strerror or e}"))
        return EXIT_INPUT
    return EXIT_PASS


def _vocab(model: str | None) -> list[str] | None:
    """The model's token texts for the page's axes (None without a model or a vocabulary)."""
    if model is None:
        return None
    from .arch.gguf_header import read_header

    try:
        tokens = read_header(model).meta.get("tokenizer.ggml.tokens")
    except ModelError:
        return None
    return None if tokens is None or isinstance(tokens, int) else tokens  # a lazily decoded list (gguf_header.Strings)


@main.command()
@click.argument("dumps", nargs=-1, metavar="[DUMP]...")
@click.option("--kq-scale", type=float, help="The scale SOFT_MAX applied to kq (default 1/sqrt(D_h)).")
@click.option("--layer", "layers", type=int, multiple=True, help="Check only this layer (repeatable).")
@click.option("--head", "heads", type=int, multiple=True, help="Check only this head (repeatable).")
@click.option("--json", "json_out", metavar="FILE|-", help="Write the JSON report (schema 1); '-' for stdout.")
@click.option("--junit", metavar="FILE", help="Write JUnit XML: one testcase per evaluation × layer.")
@click.option("--atol", type=float, help="Absolute tolerance in place of the derived per-element bounds.")
@click.option("--rtol", type=float, help="Relative tolerance in place of the derived per-element bounds.")
@click.option("-j", "--jobs", type=click.IntRange(min=1), help="Processes reading the dump (default: every core); "
                                                                  "the report does not depend on it.")
@click.option("--fail-fast", is_flag=True, help="Stop at the first failing site.")
@click.option("-q", "--quiet", is_flag=True, help="Only the verdict line (and failures).")
@click.option("-v", "--verbose", is_flag=True, help="Every check of every site.")
@click.option("--model", metavar="GGUF", help="Also check every printed attention number against this model's "
                                              "reference forward pass (gpt2, llama).")
@click.option("--tokens", metavar="IDS", help="The prompt's token ids, e.g. 1,2,3, for logs that do not print them.")
@_html_option("the report, a layer × head grid and each head's heatmaps")
def check(dumps, kq_scale, layers, heads, json_out, junit, atol, rtol, jobs, fail_fast, quiet, verbose, model, tokens,
          html_out):
    """Check every attention head in one or more dumps (default: stdin)."""
    from .check.page import PageData
    from .results import FixedTolerance
    from .progress import evaluation_progress, wanted as progress_wanted
    from .verify import Options, verify

    opts = Options(kq_scale=kq_scale, layers=frozenset(layers) or None, heads=frozenset(heads) or None,
                   fail_fast=fail_fast, model=model, tokens=_tokens(tokens), jobs=jobs,
                   tolerance=None if atol is None and rtol is None else FixedTolerance(atol or 0.0, rtol or 0.0))
    console = _console(stderr=json_out == "-")
    reports: list[Report] = []
    codes: list[int] = []
    if not dumps and sys.stdin.isatty():  # reading a terminal would wait for input that never comes
        _fail("no dump given and stdin is a terminal: pipe llama-eval-callback's output in (2>&1 | attncheck) "
              "or name a dump file")
        sys.exit(EXIT_INPUT)
    pages: list[tuple[Report, PageData]] = []
    errors: list[str] = []
    for path in dumps or ("-",):
        page = PageData("<stdin>" if path == "-" else path, opts.heads, opts.layers) if html_out else None
        try:
            with evaluation_progress(path, progress_wanted(quiet or json_out == "-")) as progress:
                report = verify(path, opts, progress=progress, observe=page)
        except (DumpError, ModelError) as e:
            _fail(str(e))
            errors.append(str(e))
            codes.append(EXIT_INPUT)
            continue
        except Exception as e:  # a bug: still one line, still exit 2
            errors.append(f"{path}: internal error ({type(e).__name__}: {e}); please report it with the dump")
            _fail(errors[-1])
            codes.append(EXIT_INPUT)
            continue
        if page is not None:
            pages.append((report, page))
        for w in report.warnings:
            click.echo(f"attncheck: warning: {w}", err=True)
        from .check.render import render

        render(report, console, quiet=quiet, verbose=verbose)
        reports.append(report)
        codes.append(report.exit_code)
        if fail_fast and report.exit_code == EXIT_FAIL:
            break
    if json_out:
        docs = [r.to_dict() for r in reports]
        _write_json(docs[0] if len(docs) == 1 and len(codes) == 1 else {"schema": SCHEMA, "dumps": docs}, json_out)
    if junit:
        from .check.junit import check_xml, write

        write(check_xml(reports, list(zip(dumps or ("-",), codes))), junit)
    if html_out:
        from .check.html import check_page

        codes.append(_write_html(html_out, lambda: check_page(pages, _vocab(model), errors)))
    sys.exit(_combine(codes))


def _tokens(text: str | None) -> tuple[int, ...] | None:
    """--tokens 1,2,3; a malformed list is a usage error: one line, exit 2."""
    from .model.runs import parse_tokens

    try:
        return parse_tokens(text)
    except ValueError as e:
        _fail(str(e))
        sys.exit(EXIT_INPUT)


def _combine(codes: list[int]) -> int:
    """Several dumps: a failed check outranks unusable input, which outranks nothing verified."""
    for code in (EXIT_FAIL, EXIT_INPUT, EXIT_UNVERIFIED):
        if code in codes:
            return code
    return EXIT_PASS


@main.command(name="list")
@click.argument("dump", default="-")
@click.option("--model", metavar="GGUF", help="The model that made the dump: its vocabulary shows each token's text.")
def list_(dump, model):
    """What a dump holds: runs, evaluations, nodes, attention sites."""
    from rich.markup import escape
    from rich.table import Table

    from .arch.vocab import shown, token_text
    from .dump.graph import read_dump
    from .dump.listing import listing

    meta = _model_meta(model)
    console = _console()
    try:
        d = read_dump(dump)
        table = Table(title=f"{d.source}", title_justify="left", header_style="bold")
        for col in ("eval", "run", "n_past", "T", "nodes", "layer", "attention", "nodes (line)", "H", "H_kv", "D_h",
                    "n_kv"):
            table.add_column(col)
        n_ev, last = 0, None
        for row in listing(d):
            first = row.evaluation != last
            n_ev, last = n_ev + first, row.evaluation
            head = ([str(row.evaluation), str(row.run), str(row.n_past), str(row.T), str(row.nodes)] if first
                    else [""] * 5)
            named = ", ".join(escape(printable(f"{n} ({line})")) for n, line in zip(row.names, row.lines))
            table.add_row(*head, "" if row.layer is None else str(row.layer), row.kind, named,
                          *("" if x is None else str(x) for x in (row.H, row.H_kv, row.D_h, row.n_kv)))
    except DumpError as e:
        _fail(str(e))
        sys.exit(EXIT_INPUT)
    console.print(table)
    for r in d.runs:
        ids = "no token ids in the log" if r.tokens is None else f"{len(r.tokens)} tokens {list(r.tokens)}"
        text = token_text(meta, r.tokens) if meta is not None else None
        if text is not None:
            ids = f"{len(r.tokens)} tokens " + "  ".join(f"{i} {shown(t)}" for i, t in zip(r.tokens, text))
        console.print(f"run at line {r.line}: {ids}", markup=False)
    for n in d.notes:  # as `check` writes them: stderr, one visible line each
        click.echo(f"attncheck: warning: {d.source}:{n.line}: {printable(n.message)}", err=True)
    sys.exit(EXIT_PASS if n_ev else EXIT_UNVERIFIED)


def _model_meta(model: str | None) -> dict | None:
    """A --model's header metadata (its vocabulary); a file that is not a GGUF is a usage error (exit 2)."""
    if model is None:
        return None
    from .arch.gguf_header import read_header
    from .errors import ModelError

    try:
        return read_header(model).meta
    except ModelError as e:
        _fail(str(e))
        sys.exit(EXIT_INPUT)


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.option("-m", "--model", "model", required=True, help="The GGUF model for llama-eval-callback.")
@click.option("-p", "--prompt", required=True, help="The prompt.")
@click.option("--bin", "binary", help="llama-eval-callback to run (default: $LLAMA_EVAL_CALLBACK, then PATH).")
@click.option("--keep", metavar="FILE", help="Also write the dump to FILE.")
@click.option("--kq-scale", type=float, help="The scale SOFT_MAX applied to kq (default 1/sqrt(D_h)).")
@click.option("--json", "json_out", metavar="FILE|-", help="Write the JSON report (schema 1); '-' for stdout.")
@click.option("-q", "--quiet", is_flag=True, help="Only the verdict line (and failures).")
@click.option("--dump-only", is_flag=True, help="Check from the dump alone: do not recompute from -m's weights.")
@_html_option("the report, a layer × head grid and each head's heatmaps")
@click.argument("extra", nargs=-1, type=click.UNPROCESSED)
def run(model, prompt, binary, keep, kq_scale, json_out, quiet, dump_only, html_out, extra):
    """Run llama-eval-callback on a prompt and check its attention as it streams.

    Arguments after `--` go to llama.cpp; `--flash-attn off` is added unless you set flash attention. The
    printed numbers are also checked against -m's reference forward pass (as check --model) unless --dump-only
    is given or the architecture is not one attncheck computes (a warning says so).
    """
    from . import run as runner
    from .arch.gguf_header import read_header
    from .arch.header import require_shape
    from .check.render import render
    from .verify import Options, verify

    reference = None if dump_only else model
    if reference is not None:
        try:
            require_shape(read_header(reference).meta, reference)
        except ModelError as e:  # llama.cpp may still run it: check from the dump alone
            click.echo(f"attncheck: warning: no --model checks: {e}", err=True)
            reference = None
    try:
        proc = runner.Process(runner.command(runner.find_binary(binary), model, prompt, extra), keep)
    except DumpError as e:
        _fail(str(e))
        sys.exit(EXIT_INPUT)
    from .check.page import PageData

    report, error = None, None
    page = PageData(proc.stream.name) if html_out else None
    try:
        report = verify(proc.stream, Options(kq_scale=kq_scale, model=reference), observe=page)
    except (DumpError, ModelError) as e:
        error = e
    code = proc.finish()
    if code != 0:
        _fail(str(proc.failure(code)))
        sys.exit(EXIT_INPUT)
    if error is not None:
        _fail(str(error))
        sys.exit(EXIT_INPUT)
    for w in report.warnings:
        click.echo(f"attncheck: warning: {w}", err=True)
    render(report, _console(stderr=json_out == "-"), quiet=quiet)
    if json_out:
        _write_json(report.to_dict(), json_out)
    if html_out:
        from .check.html import check_page

        if _write_html(html_out, lambda: check_page([(report, page)], _vocab(model))) != EXIT_PASS:
            sys.exit(EXIT_INPUT)
    sys.exit(report.exit_code)


@main.command(name="inspect")
@click.argument("dump")
@click.option("--layer", type=int, required=True, help="The layer to walk.")
@click.option("--head", type=int, required=True, help="The query head to walk.")
@click.option("--query", type=int, help="Query index in the evaluation (default: the last whose visible slots are "
                                        "all printed).")
@click.option("--eval", "evaluation", type=int, default=0, show_default=True, help="Evaluation (ubatch) index.")
@click.option("--kq-scale", type=float, help="The scale SOFT_MAX applied to kq (default 1/sqrt(D_h)).")
@click.option("--json", "json_out", metavar="FILE|-", help="Write the walk as JSON (schema 1); '-' for stdout.")
@click.option("--model", metavar="GGUF", help="Also show the query's full rows (every dim and visible slot) from "
                                              "this model's reference forward pass, and check them.")
@click.option("--tokens", metavar="IDS", help="The prompt's token ids, e.g. 1,2,3, for logs that do not print them.")
@_html_option("the walk and the head's heatmaps")
def inspect_(dump, layer, head, query, evaluation, kq_scale, json_out, model, tokens, html_out):
    """Walk one head by hand: Q/K/V rows, scores, scale, mask, weights, weighted sum, beside the dump."""
    import os

    from .inspect.model_walk import walk_head
    from .inspect.render import render_walk, walk_dict
    from .inspect.walk import NothingToInspect

    mw = page = None
    try:
        if html_out:
            from .inspect.html import head_page

            w, mw, page = head_page(dump, layer, head, query=query, evaluation=evaluation, kq_scale=kq_scale,
                                    model=model, tokens=_tokens(tokens), vocab=_vocab(model))
        else:
            w, mw = walk_head(dump, layer, head, query=query, evaluation=evaluation, kq_scale=kq_scale, model=model,
                              tokens=_tokens(tokens))
    except (DumpError, ModelError) as e:
        _fail(str(e))
        sys.exit(EXIT_INPUT)
    except NothingToInspect as e:
        _fail(str(e))
        sys.exit(EXIT_UNVERIFIED)
    except Exception as e:  # a bug: still one line, still exit 2
        _fail(f"{dump}: internal error ({type(e).__name__}: {e}); please report it with the dump")
        sys.exit(EXIT_INPUT)
    if json_out != "-":
        console = _console()
        if os.environ.get("NO_COLOR"):  # no escapes at all: shades and numbers carry the heatmap
            console = Console(highlight=False, width=console.width, color_system=None)
        render_walk(w, console)
        if mw is not None:
            from .inspect.render_model import render_model_walk

            render_model_walk(w, mw, console)
    if json_out:
        doc = walk_dict(w)
        if mw is not None:
            from .inspect.render_model import model_walk_dict

            doc["model"] = model_walk_dict(mw)
        _write_json(doc, json_out)
    if page is not None and _write_html(html_out, lambda: page) != EXIT_PASS:
        sys.exit(EXIT_INPUT)
    sys.exit(EXIT_PASS if w.passed and (mw is None or mw.passed) else EXIT_FAIL)


@main.command(name="diff")
@click.argument("old")
@click.argument("new")
@click.option("--prefix", is_flag=True, help="One prompt extends the other: compare only what causality fixes.")
@click.option("--json", "json_out", metavar="FILE|-", help="Write the JSON report (schema 1, kind diff); '-': stdout.")
@click.option("--junit", metavar="FILE", help="Write JUnit XML: one testcase per evaluation × layer.")
@click.option("--atol", type=float, help="Absolute tolerance (default 1e-4: two prints of 4 decimals).")
@click.option("--rtol", type=float, help="Relative tolerance (default 2^-16).")
@click.option("--nmse", is_flag=True, help="Per-op NMSE thresholds as llama.cpp's test-backend-ops, not atol/rtol.")
@click.option("-q", "--quiet", is_flag=True, help="Only the divergences and the verdict.")
@click.option("-v", "--verbose", is_flag=True, help="Every matched node, compared or not, and every unmatched one.")
@_html_option("every compared node along the graph, with the tolerance it needed,")
def diff_(old, new, prefix, json_out, junit, atol, rtol, nmse, quiet, verbose, html_out):
    """Compare two dumps of one model and prompt node by node (two llama.cpp builds): where they first diverge."""
    from .diff.compare import ATOL, RTOL, DiffReport, Tolerance, diff
    from .check.junit import write
    from .diff.junit import diff_xml
    from .diff.render import diff_dict, render_diff

    if nmse and (atol is not None or rtol is not None):
        raise click.UsageError("--nmse replaces --atol/--rtol: give one or the other")
    given = atol is not None or rtol is not None
    tol = Tolerance(ATOL if atol is None else atol, RTOL if rtol is None else rtol, nmse,
                    "--atol/--rtol" if given else "print precision")
    try:
        rep = diff(old, new, prefix=prefix, tolerance=tol)
    except Exception as e:  # unusable input (DumpError names file and line) or a bug: one line, exit 2
        what = str(e) if isinstance(e, DumpError) else f"internal error ({type(e).__name__}: {e}); please report it"
        rep = DiffReport(old, new, prefix, tol, error=what)
    for w in rep.warnings:
        click.echo(f"attncheck: warning: {w}", err=True)
    if rep.error:
        _fail(f"{old} vs {new}: {rep.error}")
    render_diff(rep, _console(stderr=json_out == "-"), quiet=quiet, verbose=verbose)
    if json_out:
        _write_json(diff_dict(rep), json_out)
    if junit:
        write(diff_xml(rep), junit)
    if html_out:
        from .diff.html import diff_page

        if _write_html(html_out, lambda: diff_page(rep)) != EXIT_PASS:
            sys.exit(EXIT_INPUT)
    sys.exit(rep.exit_code)


def entry() -> None:
    """The console script: the click group, with an exception no command expected (a bug) turned into one line
    and exit 2, never a traceback."""
    try:
        main()
    except Exception as e:  # click already turned usage errors into exit 2 with its message
        _fail(printable(f"internal error ({type(e).__name__}: {e}); please report it with the input"))
        sys.exit(EXIT_INPUT)


if __name__ == "__main__":
    entry()
