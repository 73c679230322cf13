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

    def __reduce__(self):  # a worker process sends it back to the parent (check/pool.py)
        return DumpError, (self.source, self.line, self.message)


def printable(text: str) -> str:
    """Text quoted from the input, as one visible line: control characters (NUL, a stray CR, terminal escape
    codes) written as escapes."""
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class ModelError(Exception):
    """A model file that cannot be used; the message names the file."""

    def __init__(self, path: str | os.PathLike[str], message: str) -> None:
        self.path = str(path)
        self.message = " ".join(message.split())  # one line
        super().__init__(f"{self.path}: {self.message}")
