"""The command line: a thin layer over attncheck.read_dump / attncheck.verify. Exit codes: 0 pass, 1 fail,
2 unusable input or usage, 3 nothing could be verified, 130 and 143 interrupted (SIGINT, SIGTERM)."""
from __future__ import annotations

import difflib
import gc
import os
import signal

import click

from ..model.heap import one_arena
from ..report import EXIT_INPUT
from .check import check
from .common import fail
from .diff import diff_
from .inspect import inspect_
from .interrupt import Interrupted, catch_signals, ignore_signals
from .listing import list_
from .run import run
from .streams import guard, settle

GC_ALLOCATIONS = 50_000


class DefaultGroup(click.Group):
    """`attncheck [DUMP]` means `attncheck check [DUMP]`; a first word that is neither a command nor a file is a
    usage error that names the commands (a typo must not be read as a dump)."""

    def parse_args(self, ctx, args):
        first = args[0] if args else None
        if first is not None and first not in self.commands and first not in ("--help", "-h", "--version"):
            if not first.startswith("-") and not os.path.exists(first):
                near = difflib.get_close_matches(first, list(self.commands), n=1, cutoff=0.6)
                raise click.UsageError(
                    f"'{first}' is neither a command nor a file (commands: {', '.join(sorted(self.commands))})"
                    + (f"; did you mean {near[0]}?" if near else ""), ctx)
        if not args or first not in self.commands and first not in ("--help", "-h", "--version"):
            args = ["check", *args]
        return super().parse_args(ctx, args)


@click.group(cls=DefaultGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="attncheck")
def main() -> None:
    """Verify llama.cpp attention in llama-eval-callback dumps.

    llama-eval-callback -m model.gguf -p "How are" --flash-attn off 2>&1 | attncheck
    """


@click.command(name="help")
@click.argument("command", required=False)
@click.pass_context
def help_(ctx, command: str | None) -> None:
    """Show attncheck's help, or a command's (attncheck help run)."""
    group = ctx.parent
    if command is None:
        click.echo(main.get_help(group))
        return
    cmd = main.get_command(group, command)
    if cmd is None:
        near = difflib.get_close_matches(command, list(main.commands), n=1, cutoff=0.6)
        raise click.UsageError(f"no command '{command}' (commands: {', '.join(sorted(main.commands))})"
                               + (f"; did you mean {near[0]}?" if near else ""), ctx)
    with click.Context(cmd, info_name=command, parent=group) as sub:
        click.echo(cmd.get_help(sub))


for command in (check, list_, run, inspect_, diff_, help_):
    main.add_command(command)


def entry() -> None:
    """The console script: the collector and the heap set for the process (collect_rarely, model.heap.one_arena: before
    any thread starts), command_line(), then the process ends without the interpreter's teardown: every report is
    written and closed and every pool ended, and freeing every object and module one by one took 35-45 ms after a
    2 MB dump's check, all of it after llama.cpp's end in a pipe; interrupted, it leaves at once, not after the
    worker pools' threads wind down."""
    collect_rarely()
    one_arena()
    os._exit(command_line())


def collect_rarely() -> None:
    """The cyclic collector tuned for this process: the modules' objects, made once, moved out of its sight
    (gc.freeze), and a collection after every GC_ALLOCATIONS objects made instead of every 700. Reading a dump makes
    objects by the hundred thousand and almost no cycles (none in a node, an evaluation or a report), yet each
    full collection walked every object held: 2.3 s of a 313 MB dump's 13.8 s check in one process."""
    gc.freeze()
    gc.set_threshold(GC_ALLOCATIONS, 20, 20)


def command_line() -> int:
    """The command line's exit code, its output flushed: the click group, with a usage error as one line (exit 2), an
    exception no command expected (a bug) turned into one line and exit 2, never a traceback; Ctrl-C or SIGTERM 128 +
    the signal; a report that could not be written said, without losing the others or a failed verdict
    (streams.py)."""
    stdout, stderr = guard()
    catch_signals()
    code = settle(_run(), stdout, fail)
    stdout.flush()
    stderr.flush()
    return code


def _run() -> int:
    """The command's exit code; whatever ends it, one line on stderr at most."""
    try:
        return main.main(prog_name="attncheck", standalone_mode=False) or 0
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else EXIT_INPUT
    except Interrupted as e:  # Ctrl-C (130) or SIGTERM (143): no verdict, and not a failed check (exit 1)
        ignore_signals()
        click.echo(f"attncheck: interrupted ({e.name}): no verdict", err=True)
        return e.exit_code
    except click.UsageError as e:
        where = f" (attncheck {e.ctx.info_name} --help)" if e.ctx is not None and e.ctx.parent is not None else \
            " (attncheck --help)"
        fail(e.format_message().replace("\n", " ") + where)
        return EXIT_INPUT
    except click.ClickException as e:
        fail(e.format_message().replace("\n", " "))
        return e.exit_code
    except click.Abort:  # click's word for an interrupted prompt: interrupted as well
        click.echo("attncheck: interrupted: no verdict", err=True)
        return 128 + signal.SIGINT
    except Exception as e:
        fail(f"internal error ({type(e).__name__}: {e}); please report it with the input")
        return EXIT_INPUT


if __name__ == "__main__":
    entry()
