"""`attncheck check`: dumps through verify, the report as tables, JSON, JUnit and a page. `attncheck run` (run.py)
takes the same options (check_options) and shows its report alike."""
from __future__ import annotations

import sys

import click

from ..report import EXIT_FAIL, EXIT_INPUT, Report, multi_dict
from ..arch.context import opened
from ..arch.table import ARCHS
from ..errors import DumpError, ModelError, printable
from ..inspect.walk import span
from .common import (INDEX, SCALE, TOLERANCE, combine, console as make_console, fail, html_option, jobs_option,
                     json_option, junit_option, to_stdout, tokens as parse_tokens, vocab, warn,
                     write_html, write_json, write_junit)

FORWARD = [name for name, a in ARCHS.items() if a.forward is not None]  # the architectures with a reference


def check_options(f):
    """The options of `check`, which `run` takes as well (the model aside: check's --model, run's -m)."""
    for option in reversed((
        click.option("--kq-scale", type=SCALE, help="The scale SOFT_MAX applied to kq (default 1/sqrt(D_h))."),
        click.option("--layer", "layers", type=INDEX, multiple=True, help="Check only this layer (repeatable)."),
        click.option("--head", "heads", type=INDEX, multiple=True, help="Check only this head (repeatable)."),
        json_option(),
        junit_option(),
        click.option("--atol", type=TOLERANCE, help="Absolute tolerance in place of the derived per-element bounds."),
        click.option("--rtol", type=TOLERANCE, help="Relative tolerance in place of the derived per-element bounds."),
        jobs_option("reading the dump"),
        click.option("--fail-fast", is_flag=True, help="Stop at the first failing site (and dump)."),
        click.option("-q", "--quiet", is_flag=True, help="Only the failures and the verdict line."),
        click.option("-v", "--verbose", is_flag=True, help="A row per evaluation × layer, every check of every site, "
                                                           "every failing element kept."),
        click.option("--tokens", metavar="IDS", help="The prompt's token ids, e.g. 1,2,3, for logs that do not print "
                                                     "them."),
        html_option("the report, a layer × head grid and each head's heatmaps"),
    )):
        f = option(f)
    return f


def _options(kq_scale, layers, heads, atol, rtol, jobs, fail_fast, model, tokens):
    """The command line's options as verify.Options (a run without token ids gets its dump-only checks)."""
    from ..results import Tolerance
    from ..verify import Options

    return Options(kq_scale=kq_scale, layers=frozenset(layers) or None, heads=frozenset(heads) or None,
                   fail_fast=fail_fast, model=model, tokens=parse_tokens(tokens), jobs=jobs, require_ids=False,
                   tolerance=None if atol is None and rtol is None else Tolerance(atol or 0.0, rtol or 0.0))


def _shown(report: Report, opts, console, quiet: bool, verbose: bool) -> None:
    """A report's usage errors (a --head or --layer the dump does not have: exit 2), its warnings, its tables."""
    from ..present.render import render

    absent = report.absent_heads()
    if absent:  # a head no layer has: a usage error, as inspect says it
        fail(f"--head {', '.join(map(str, absent))}: no such head in {report.source}: its layers have "
             f"heads {report.head_range()}")
        sys.exit(EXIT_INPUT)
    gone = report.absent_layers(opts.layers)
    if gone:  # a layer the model does not have: a usage error, as inspect says it
        fail(f"--layer {', '.join(map(str, gone))}: no such layer in {report.source}: its layers are "
             f"{span(report.layer_numbers())}")
        sys.exit(EXIT_INPUT)
    unprinted, printed = report.unprinted_heads()
    if unprinted and report.checked:  # some heads asked for were printed, these were not
        report.warnings.append(f"--head {', '.join(map(str, unprinted))}: not printed in {report.source} "
                               f"(llama.cpp printed heads {', '.join(map(str, printed))}): not checked")
    for w in report.warnings:
        warn(w)
    render(report, console, quiet=quiet, verbose=verbose)


def _written(reports: list[Report], inputs: list, left: list[str], pages: list, errors: list[str], json_out, junit,
             html_out, model) -> list[int]:
    """The report files (or stdout for '-'): each one's exit code (2 when it could not be written)."""
    codes = []
    if json_out:
        one = len(inputs) + len(left) == 1 and reports  # one dump: its document; several (or none readable): all
        codes.append(write_json(reports[0].to_dict() if one else multi_dict(reports, inputs, left), json_out))
    if junit:
        from ..present.junit import check_xml

        codes.append(write_junit(check_xml(reports, inputs), junit))
    if html_out:
        from ..present.html import check_page

        codes.append(write_html(html_out, lambda: check_page(pages, vocab(model), errors)))
    return codes


@click.command()
@click.argument("dumps", nargs=-1, metavar="[DUMP]...")
@click.option("--model", metavar="GGUF", help="Also check every printed node against this model's reference "
              f"forward pass ({', '.join(FORWARD)}); for another architecture, its header's attention facts drive "
              "the dump-only checks.")
@check_options
def check(dumps, model, kq_scale, layers, heads, json_out, junit, atol, rtol, jobs, fail_fast, quiet, verbose, tokens,
          html_out):
    """Check every attention head in one or more dumps (default: stdin)."""
    from ..present.page import PageData
    from .progress import evaluation_progress, wanted as progress_wanted
    from ..verify import verify

    opts = _options(kq_scale, layers, heads, atol, rtol, jobs, fail_fast, opened(model), tokens)  # opened once
    stdout_report = to_stdout(json_out, junit)
    console = make_console(stderr=stdout_report)
    if not dumps and sys.stdin.isatty():  # reading a terminal would wait for input that never comes
        fail("no dump given and stdin is a terminal: pipe llama-eval-callback's output in (2>&1 | attncheck) "
             "or name a dump file")
        sys.exit(EXIT_INPUT)
    paths = list(dumps or ("-",))
    reports: list[Report] = []
    inputs: list[tuple[str, int, str | None]] = []  # every dump checked: path, exit code, its error line
    pages = []
    errors: list[str] = []
    for path in paths:
        page = PageData("<stdin>" if path == "-" else path, opts.heads, opts.layers) if html_out else None
        try:
            with evaluation_progress(path, progress_wanted(quiet or stdout_report)) as progress:
                report = verify(path, opts, progress=progress, observe=page)
        except (DumpError, ModelError) as e:
            errors.append(str(e))
        except Exception as e:  # a bug: still one line, still exit 2
            errors.append(f"{path}: internal error ({type(e).__name__}: {e}); please report it with the dump")
        else:
            _shown(report, opts, console, quiet, verbose)
            if page is not None:
                pages.append((report, page))
            reports.append(report)
            inputs.append((path, report.exit_code, None))
            if fail_fast and report.exit_code == EXIT_FAIL:
                break
            continue
        fail(errors[-1])
        inputs.append((path, EXIT_INPUT, errors[-1]))
    left = paths[len(inputs):]
    if left:
        console.print(printable(f"stopped early (--fail-fast): {len(left)} of {len(paths)} dumps not checked: "
                                f"{', '.join(left)}"), style="bold red", highlight=False, soft_wrap=True, markup=False)
    codes = [code for _, code, _ in inputs]
    codes += _written(reports, inputs, left, pages, errors, json_out, junit, html_out, opts.model)
    sys.exit(combine(codes))
