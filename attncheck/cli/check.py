"""`attncheck check` and `attncheck run`: dumps through verify, the report as tables, JSON, JUnit and a page."""
from __future__ import annotations

import os
import sys

import click

from ..check.report import EXIT_FAIL, EXIT_INPUT, EXIT_PASS, Report, multi_dict
from ..errors import DumpError, ModelError, printable
from ..inspect.walk import span
from ..run import STALL
from .common import (INDEX, SCALE, TOLERANCE, combine, console as make_console, fail, html_option, jobs_option, json_option,
                     junit_option, output_target, tokens as parse_tokens, vocab, warn, write_html, write_json,
                     write_junit)


@click.command()
@click.argument("dumps", nargs=-1, metavar="[DUMP]...")
@click.option("--kq-scale", type=SCALE, help="The scale SOFT_MAX applied to kq (default 1/sqrt(D_h)).")
@click.option("--layer", "layers", type=INDEX, multiple=True, help="Check only this layer (repeatable).")
@click.option("--head", "heads", type=INDEX, multiple=True, help="Check only this head (repeatable).")
@json_option()
@junit_option()
@click.option("--atol", type=TOLERANCE, help="Absolute tolerance in place of the derived per-element bounds.")
@click.option("--rtol", type=TOLERANCE, help="Relative tolerance in place of the derived per-element bounds.")
@jobs_option("reading the dump")
@click.option("--fail-fast", is_flag=True, help="Stop at the first failing site (and dump).")
@click.option("-q", "--quiet", is_flag=True, help="Only the failures and the verdict line.")
@click.option("-v", "--verbose", is_flag=True, help="A row per evaluation × layer, every check of every site, "
                                                    "every failing element kept.")
@click.option("--model", metavar="GGUF", help="Also check every printed attention number against this model's "
                                              "reference forward pass (gpt2, llama).")
@click.option("--tokens", metavar="IDS", help="The prompt's token ids, e.g. 1,2,3, for logs that do not print them.")
@html_option("the report, a layer × head grid and each head's heatmaps")
def check(dumps, kq_scale, layers, heads, json_out, junit, atol, rtol, jobs, fail_fast, quiet, verbose, model, tokens,
          html_out):
    """Check every attention head in one or more dumps (default: stdin)."""
    from ..check.page import PageData
    from ..check.render import render
    from ..progress import evaluation_progress, wanted as progress_wanted
    from ..results import FixedTolerance
    from ..verify import Options, verify

    opts = Options(kq_scale=kq_scale, layers=frozenset(layers) or None, heads=frozenset(heads) or None,
                   fail_fast=fail_fast, model=model, tokens=parse_tokens(tokens), jobs=jobs, require_ids=False,
                   tolerance=None if atol is None and rtol is None else FixedTolerance(atol or 0.0, rtol or 0.0))
    console = make_console(stderr=json_out == "-")
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
            with evaluation_progress(path, progress_wanted(quiet or json_out == "-")) as progress:
                report = verify(path, opts, progress=progress, observe=page)
        except (DumpError, ModelError) as e:
            errors.append(str(e))
        except Exception as e:  # a bug: still one line, still exit 2
            errors.append(f"{path}: internal error ({type(e).__name__}: {e}); please report it with the dump")
        else:
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
            if page is not None:
                pages.append((report, page))
            for w in report.warnings:
                warn(w)
            render(report, console, quiet=quiet, verbose=verbose)
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
    if json_out:
        one = len(paths) == 1 and reports  # one dump: its document; several (or none readable): the multi-dump form
        codes.append(write_json(reports[0].to_dict() if one else multi_dict(reports, inputs, left), json_out))
    if junit:
        from ..check.junit import check_xml

        codes.append(write_junit(check_xml(reports, inputs), junit))
    if html_out:
        from ..check.html import check_page

        codes.append(write_html(html_out, lambda: check_page(pages, vocab(model), errors)))
    sys.exit(combine(codes))


@click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.option("-m", "--model", "model", required=True, help="The GGUF model for llama-eval-callback.")
@click.option("-p", "--prompt", required=True, help="The prompt.")
@click.option("--bin", "binary", help="llama-eval-callback to run (default: $LLAMA_EVAL_CALLBACK, then PATH).")
@click.option("--keep", metavar="FILE", callback=output_target, help="Also write the dump to FILE.")
@click.option("--kq-scale", type=SCALE, help="The scale SOFT_MAX applied to kq (default 1/sqrt(D_h)).")
@json_option()
@click.option("-q", "--quiet", is_flag=True, help="Only the failures and the verdict line.")
@click.option("--dump-only", is_flag=True, help="Check from the dump alone: do not recompute from -m's weights.")
@html_option("the report, a layer × head grid and each head's heatmaps")
@click.option("--stall-timeout", "stall", type=TOLERANCE, default=STALL, show_default=True, metavar="SECONDS",
              help="End llama.cpp when it prints nothing for this long (0: wait for ever).")
@click.argument("extra", nargs=-1, type=click.UNPROCESSED)
def run(model, prompt, binary, keep, kq_scale, json_out, quiet, dump_only, html_out, stall, extra):
    """Run llama-eval-callback on a prompt and check its attention as it streams.

    Arguments after `--` go to llama.cpp; `--flash-attn off` is added unless you set flash attention. The
    printed numbers are also checked against -m's reference forward pass (as check --model) unless --dump-only
    is given or the architecture is not one attncheck computes (a warning says so).
    """
    from .. import run as runner
    from ..arch.gguf_header import read_header
    from ..arch.header import require_shape
    from ..check.page import PageData
    from ..check.render import render
    from ..verify import Options, verify

    if not os.path.isfile(model):  # llama.cpp would wait on a FIFO for ever, and read a folder as nothing
        fail(f"-m {model}: {'no such file' if not os.path.exists(model) else 'not a regular file'}")
        sys.exit(EXIT_INPUT)
    reference = None if dump_only else model
    if reference is not None:
        try:
            require_shape(read_header(reference).meta, reference)
        except ModelError as e:  # llama.cpp may still run it: check from the dump alone
            warn(f"no --model checks: {e}")
            reference = None
    try:
        proc = runner.Process(runner.command(runner.find_binary(binary), model, prompt, extra), keep, stall)
    except DumpError as e:
        fail(str(e))
        sys.exit(EXIT_INPUT)
    report, error = None, None
    page = PageData(proc.stream.name) if html_out else None
    with proc:  # llama.cpp's process group ends with this block, whatever ends it
        try:
            report = verify(proc.stream, Options(kq_scale=kq_scale, model=reference), observe=page)
        except (DumpError, ModelError) as e:
            error = e
        code = proc.finish()
    if proc.stream.stalled is not None:
        fail(str(proc.stream.stalled))
        sys.exit(EXIT_INPUT)
    if code != 0:
        fail(str(proc.failure(code)))
        sys.exit(EXIT_INPUT)
    if error is not None:
        fail(str(error))
        sys.exit(EXIT_INPUT)
    for w in report.warnings:
        warn(w)
    render(report, make_console(stderr=json_out == "-"), quiet=quiet)
    codes = [report.exit_code]
    if json_out:
        codes.append(write_json(report.to_dict(), json_out))
    if html_out:
        from ..check.html import check_page

        codes.append(write_html(html_out, lambda: check_page([(report, page)], vocab(model))))
    sys.exit(combine(codes))

