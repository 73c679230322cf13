"""What every command shares: the console (its width), one-line errors, option types that refuse nonsense, output
targets checked before any work starts, JSON and HTML writing."""
from __future__ import annotations

import json
import math
import os
import sys
from typing import Callable, Sequence

import click
from rich.console import Console

from ..report import EXIT_FAIL, EXIT_INPUT, EXIT_PASS, EXIT_UNVERIFIED
from ..arch.vocab import GLUE, Texts
from ..errors import ModelError, printable

PIPE_WIDTH = 120  # a pipe or CI log without COLUMNS: wider than rich's default 80


def _width(stream) -> int | None:
    """A terminal's width (rich reads COLUMNS first, then asks the terminal); a pipe gets COLUMNS when set, else
    120 rather than rich's 80."""
    return None if stream.isatty() or os.environ.get("COLUMNS", "").strip().isdigit() else PIPE_WIDTH


class _Printable:
    """A renderable whose text segments are written printable (errors.printable; the console's own control codes
    aside): whatever a table cell or a title let through, no control character from the input reaches the terminal.
    A glued space (arch/vocab.GLUE, inside a token's quotes) is written as a space, and no line ends in spaces (a
    table pads its cells to its width: a pipe or a copied screen would carry them)."""

    def __init__(self, renderable):
        self.renderable = renderable

    def __rich_console__(self, console, options):
        from rich.segment import Segment

        line: list = []
        for seg in console.render(self.renderable, options):
            if seg.control:
                line.append(seg)
                continue
            text = seg.text.replace(GLUE, " ") if GLUE in seg.text else seg.text
            if not text.isprintable() and text != "\n":
                text = printable(text, lines=True)
            pieces = text.split("\n")
            for k, piece in enumerate(pieces):
                if piece:
                    line.append(Segment(piece, seg.style))
                if k < len(pieces) - 1:
                    yield from _rstrip(line)
                    yield Segment.line()
                    line = []
        yield from _rstrip(line)


def _rstrip(line: list) -> list:
    """A line's segments without the spaces it ends in (control segments kept where they stand)."""
    from rich.segment import Segment

    out = list(line)
    i = len(out) - 1
    while i >= 0:
        seg = out[i]
        if not seg.control:
            text = seg.text.rstrip(" ")
            if text:
                out[i] = Segment(text, seg.style)
                break
            del out[i]
        i -= 1
    return out


class _PrintableHook:
    """rich's render hook (Console.push_render_hook): every renderable printed goes through _Printable."""

    def process_renderables(self, renderables):
        return [_Printable(r) for r in renderables]


def no_color() -> bool:
    """NO_COLOR set and not empty (no-color.org): no escapes at all, bold, italic and dim included."""
    return bool(os.environ.get("NO_COLOR"))


def console(stderr: bool = False, **kw) -> Console:
    """Rich console on stdout (stderr: for the table when stdout carries the JSON or JUnit). Text from the input is
    escaped where it is placed (errors.markup, errors.printable); the hook makes sure of it for control characters.
    Under NO_COLOR, no style escapes at all (rich's own NO_COLOR drops colours but keeps bold, italic and dim). No
    emoji codes: a path or a token's text holding ":smile:" is printed as written."""
    if no_color():
        kw.setdefault("color_system", None)
    out = Console(stderr=stderr, highlight=False, emoji=False, width=_width(sys.stderr if stderr else sys.stdout),
                  **kw)
    out.push_render_hook(_PrintableHook())
    return out


def fail(message: str) -> None:
    click.echo(f"attncheck: error: {printable(message)}", err=True)


def warn(message: str) -> None:
    click.echo(f"attncheck: warning: {printable(message)}", err=True)


def json_text(value, level: int = 0) -> str:
    """JSON laid out for people and for speed: objects indented by 2 spaces, an array of objects or arrays one
    element per line, each element written on that one line by the json module's C encoder (with indent=2 the json
    module uses its Python encoder: 1.35 s against 0.67 s for the 20 MB document of a 35 MB dump's diff)."""
    pad, inner = "  " * level, "  " * (level + 1)
    if isinstance(value, dict) and value:
        items = (f"{inner}{json.dumps(k)}: {json_text(v, level + 1)}" for k, v in value.items())
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(value, list) and value and any(isinstance(v, (dict, list)) for v in value):
        return "[\n" + ",\n".join(inner + json.dumps(v) for v in value) + f"\n{pad}]"
    return json.dumps(value)


def size_words(n: int) -> str:
    """A file's size for people: '812 bytes', '39 KB', '1.4 MB' (powers of 1000)."""
    if n < 10_000:
        return f"{n} byte{'s' * (n != 1)}"
    if n < 1_000_000:
        return f"{n / 1000:.0f} KB"
    return f"{n / 1e6:.1f} MB" if n < 1e8 else f"{n / 1e6:.0f} MB"


def written(option: str, target: str, write: Callable[[], None]) -> int:
    """EXIT_PASS once write() wrote the report, and one stderr line saying so (the path and its size); EXIT_INPUT
    with one line naming the file when it could not be written (a full disk, a folder gone): the other reports are
    written all the same (cli/streams.py does so for stdout)."""
    try:
        write()
        size = os.path.getsize(target)
    except OSError as e:
        fail(f"{option} {target}: cannot write it: {e.strerror or e}")
        return EXIT_INPUT
    click.echo(f"attncheck: wrote {printable(target)} ({size_words(size)})", err=True)
    return EXIT_PASS


def write_json(doc: dict, target: str | None) -> int:
    """The JSON report to a file or, for '-', stdout; EXIT_INPUT when the file could not be written."""
    text = json_text(doc)
    if target == "-":
        click.echo(text)
    elif target:
        def write() -> None:
            with open(target, "w") as f:
                f.write(text + "\n")
        return written("--json", target, write)
    return EXIT_PASS


def write_junit(tree, target: str) -> int:
    """The JUnit XML to a file or, for '-', stdout (as --json -)."""
    if target == "-":
        import xml.etree.ElementTree as ET

        click.echo(ET.tostring(tree.getroot(), encoding="unicode", xml_declaration=True))
        return EXIT_PASS
    return written("--junit", target, lambda: tree.write(target, encoding="utf-8", xml_declaration=True))


def to_stdout(json_out: str | None, junit: str | None = None) -> bool:
    """Whether a report goes to stdout ('-'), so that the table goes to stderr; both at once is a usage error."""
    if json_out == "-" and junit == "-":
        raise click.UsageError("--json - and --junit - would both write to stdout: give one of them a file")
    return "-" in (json_out, junit)


class Number(click.ParamType):
    """A finite float: ≥ 0 (tolerances) or > 0 (a scale). nan, inf and the rest are usage errors."""

    name = "number"

    def __init__(self, positive: bool = False):
        self.positive = positive

    def convert(self, value, param, ctx):
        if isinstance(value, float):
            x = value
        else:
            try:
                x = float(value)
            except (TypeError, ValueError):
                self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(x):
            self.fail(f"{value} is not a finite number", param, ctx)
        if self.positive and x <= 0:
            self.fail(f"{value}: must be greater than 0", param, ctx)
        if x < 0:
            self.fail(f"{value}: must be 0 or more", param, ctx)
        return x


SCALE = Number(positive=True)
TOLERANCE = Number()
INDEX = click.IntRange(min=0)


def why_unwritable(path: str) -> str:
    """'' when a file can be written at path, else why not (in words)."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return "is a folder"
    if not os.path.isdir(folder):
        return f"the folder {folder} does not exist"
    if not os.access(folder, os.W_OK):
        return f"the folder {folder} is not writable"
    if os.path.exists(path) and not os.access(path, os.W_OK):
        return "the file is not writable"
    return ""


def output_target(ctx, param, value: str | None) -> str | None:
    """--json/--junit/--html/--keep FILE: a file that could not be written is a usage error before any work starts
    (one line, exit 2); '-' (stdout) for --json and --junit is always fine."""
    if value is None or (value == "-" and param.name in ("json_out", "junit")):
        return value
    why = why_unwritable(value)
    if why:
        fail(f"{param.opts[0]} {value}: {why}")
        sys.exit(EXIT_INPUT)
    return value


def html_option(what: str):
    return click.option("--html", "html_out", metavar="FILE", callback=output_target,
                        help=f"Write {what} as one self-contained HTML page (open it from disk in a browser).")


def json_option(what: str = "the JSON report (schema 1)"):
    return click.option("--json", "json_out", metavar="FILE|-", callback=output_target,
                        help=f"Write {what}; '-' for stdout (the table then goes to stderr).")


def jobs_option(what: str, output: str = "the report"):
    """-j/--jobs: how many processes do `what` (default: every core); `output` does not depend on it."""
    return click.option("-j", "--jobs", type=click.IntRange(min=1),
                        help=f"Processes {what} (default: every core); {output} does not depend on it.")


def junit_option():
    return click.option("--junit", metavar="FILE|-", callback=output_target,
                        help="Write JUnit XML: one testcase per evaluation × layer; '-' for stdout (the table then "
                             "goes to stderr).")


def write_html(target: str, build) -> int:
    """Build and write the page; EXIT_INPUT with one line when it cannot be written, else EXIT_PASS."""
    from ..present.html import write_page

    return written("--html", target, lambda: write_page(target, build()))


def vocab(model) -> Sequence[str] | None:
    """The model's token texts for the page's axes, as text (a space, not GPT-2's "Ġ"; arch/vocab.py); None without
    a model or a vocabulary. model: a path, or the context the command opened (arch/context.py)."""
    if model is None:
        return None
    from ..arch.context import open_model

    try:
        meta = open_model(model).meta
    except ModelError:
        return None
    tokens = meta.get("tokenizer.ggml.tokens")  # a lazily decoded list (gguf_header.Strings)
    return None if tokens is None or isinstance(tokens, int) else Texts(tokens, meta.get("tokenizer.ggml.model"))


def model_context(model: str | None):
    """A --model opened once for the command (its header: the vocabulary, the facts); a file that is not a GGUF is a
    usage error (exit 2)."""
    if model is None:
        return None
    from ..arch.context import open_model

    try:
        return open_model(model)
    except ModelError as e:
        fail(str(e))
        sys.exit(EXIT_INPUT)


def tokens(text: str | None) -> tuple[int, ...] | None:
    """--tokens 1,2,3; a malformed list is a usage error: one line, exit 2. Without --tokens, the model's modules
    (numpy's reference pass, gguf: 90 ms) are not imported."""
    if text is None:
        return None
    from ..model.runs import parse_tokens

    try:
        return parse_tokens(text)
    except ValueError as e:
        fail(str(e))
        sys.exit(EXIT_INPUT)


def combine(codes: list[int]) -> int:
    """Several dumps: a failed check outranks unusable input, which outranks nothing verified."""
    for code in (EXIT_FAIL, EXIT_INPUT, EXIT_UNVERIFIED):
        if code in codes:
            return code
    return EXIT_PASS
