"""The exceptions a user sees, each one line (exit 2): unusable input named by file and line, an unusable model."""
from __future__ import annotations

import os


class DumpError(Exception):
    """Input attncheck cannot use; str() is the one-line message `file:line: what`."""

    def __init__(self, source: str, line: int | None, message: str):
        super().__init__(message)
        self.source = source
        self.line = line
        self.message = message

    def __str__(self) -> str:
        where = self.source if self.line is None else f"{self.source}:{self.line}"
        return printable(f"{where}: {self.message}")

    def __reduce__(self):  # a worker process sends it back to the parent (dump/pool.py)
        return DumpError, (self.source, self.line, self.message)


def printable(text: str, lines: bool = False) -> str:
    """Text quoted from the input, as one visible line: control characters (NUL, a stray CR, terminal escape
    codes: C0, DEL, C1, bidi overrides) written as escapes. lines: newlines are kept (a text of several lines)."""
    if text.isprintable():
        return text
    if lines:
        return "\n".join(printable(line) for line in text.split("\n"))
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def markup(text: str) -> str:
    """Text from the input (a path, a node name, a token) placed in rich markup (a table cell, a title, a styled
    line): printable, and its square brackets escaped, so that `y[bold red]RED.txt` prints as written and
    `x[/].txt` is no markup error."""
    from rich.markup import escape

    return escape(printable(text))


class ModelError(Exception):
    """A model file that cannot be used; the message names the file."""

    def __init__(self, path: str | os.PathLike[str], message: str) -> None:
        self.path = str(path)
        self.message = " ".join(message.split())  # one line
        super().__init__(f"{self.path}: {self.message}")
