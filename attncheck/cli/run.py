"""`attncheck run`: llama-eval-callback run on a prompt (llama.py), its output checked as it streams. It takes every
option of `check` (check_options); its own (-m, -p, --bin, --keep, ...) stand anywhere before `--`, and llama.cpp's
after it."""
from __future__ import annotations

import difflib
import os
import sys

import click

from ..arch.context import opened
from ..errors import DumpError, ModelError
from ..report import EXIT_INPUT
from .check import _options, _shown, _written, check_options
from .common import (TOLERANCE, combine, console as make_console, fail, output_target, to_stdout,
                     written)
from .llama import STALL


class RunCommand(click.Command):
    """attncheck's options wherever they stand before `--`; everything after `--` goes to llama.cpp untouched. An
    option attncheck does not know (a typo, or llama.cpp's before `--`) is a usage error that says so: it would
    otherwise reach llama.cpp, or be taken for attncheck's."""

    def collect_usage_pieces(self, ctx):
        return [*super().collect_usage_pieces(ctx), "[-- LLAMA.CPP OPTIONS]"]

    def parse_args(self, ctx, args):
        args = list(args)
        valued = {o for p in self.params if isinstance(p, click.Option) and not p.is_flag for o in p.opts}
        cut, i = None, 0
        while i < len(args):  # the first `--` that is not an option's value (`-p --` is a prompt)
            if args[i] == "--":
                cut = i
                break
            i += 2 if args[i] in valued else 1
        ours, theirs = (args, []) if cut is None else (args[:cut], args[cut + 1:])
        try:
            rest = super().parse_args(ctx, list(ours))  # click consumes the list it is given
        except click.NoSuchOption as e:  # click names `-ub` as `-u`: the argument as given
            given = next((a.split("=", 1)[0] for a in ours if a.startswith("-") and a.startswith(e.option_name)),
                         e.option_name)
            mine = sorted({o for p in self.params for o in getattr(p, "opts", ()) if o.startswith("--")})
            near = difflib.get_close_matches(given, mine, n=1, cutoff=0.7)
            raise click.UsageError(f"no such option: {given}"
                                   + (f" (did you mean {near[0]}?)" if near else "")
                                   + "; llama.cpp's options go after `--` (attncheck run -m M -p P -- -ub 2)",
                                   ctx) from None
        except click.UsageError as e:
            if "unexpected extra argument" in e.message:
                raise click.UsageError(e.message.rstrip(".") + "; llama.cpp's arguments go after `--`", ctx) from None
            raise
        ctx.params["extra"] = tuple(theirs)
        return rest


@click.command(cls=RunCommand)
@click.option("-m", "--model", "model", required=True, metavar="GGUF",
              help="The GGUF model: llama-eval-callback runs it, and the printed numbers are checked against its "
                   "reference forward pass.")
@click.option("-p", "--prompt", required=True, help="The prompt.")
@click.option("--bin", "binary", help="llama-eval-callback to run (default: $LLAMA_EVAL_CALLBACK, then PATH).")
@click.option("--keep", metavar="FILE", callback=output_target, help="Also write the dump to FILE.")
@click.option("--dump-only", is_flag=True, help="Check from the dump alone: do not recompute from -m's weights.")
@click.option("--stall-timeout", "stall", type=TOLERANCE, default=STALL, show_default=True, metavar="SECONDS",
              help="End llama.cpp when it prints nothing for this long (0: wait for ever).")
@check_options
def run(model, prompt, binary, keep, dump_only, stall, kq_scale, layers, heads, json_out, junit, atol, rtol, jobs,
        fail_fast, quiet, verbose, tokens, html_out, extra=()):
    """Run llama-eval-callback on a prompt and check its attention as it streams.

    \b
    attncheck run -m model.gguf -p "How are" [OPTIONS] [-- LLAMA.CPP OPTIONS]
    attncheck run -m model.gguf -p "How are" --junit r.xml -v -- -ub 2 -ctk f32

    attncheck's options (every option of `check`, and those below) stand anywhere before `--`; llama.cpp's go
    after it, untouched. `--flash-attn off` is added unless you set flash attention. The printed numbers are
    also checked against -m's reference forward pass (as check --model) unless --dump-only is given or the
    architecture is not one attncheck computes (a warning says so).
    """
    from dataclasses import fields

    from ..present.page import PageData
    from .llama import BINARY, run_llama

    if not os.path.isfile(model):  # before llama.cpp starts: it would wait on a FIFO for ever, read a folder as nothing
        fail(f"-m {model}: {'no such file' if not os.path.exists(model) else 'not a regular file'}")
        sys.exit(EXIT_INPUT)
    context = opened(model)  # its header read once: for the checks and the page's vocabulary
    stdout_report = to_stdout(json_out, junit)
    opts = _options(kq_scale, layers, heads, atol, rtol, jobs, fail_fast, None, tokens)
    page = PageData(BINARY, opts.heads, opts.layers) if html_out else None
    try:
        report = run_llama(context, prompt, extra, binary=binary, keep=keep, dump_only=dump_only, stall=stall,
                           observe=page, **{f.name: getattr(opts, f.name) for f in fields(opts) if f.name != "model"})
    except (DumpError, ModelError) as e:
        fail(str(e))
        sys.exit(EXIT_INPUT)
    _shown(report, opts, make_console(stderr=stdout_report), quiet, verbose)
    inputs = [(report.source, report.exit_code, None)]
    codes = [report.exit_code]
    codes += _written([report], inputs, [], [(report, page)] if page is not None else [], [], json_out, junit,
                      html_out, context)
    if keep:
        written("--keep", keep, lambda: None)  # one line: the kept dump's path and size
    sys.exit(combine(codes))
