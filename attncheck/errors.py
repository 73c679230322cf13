"""The one exception a user sees: unusable input, named by file and line (exit 2)."""
from __future__ import annotations


class DumpError(Exception):
    """Input attncheck cannot use; str() is the one-line message `file:line: what`."""

    def __init__(self, source: str, line: int | None, message: str):
        super().__init__(message)
        self.source = source
        self.line = line
        self.message = message

    def __str__(self) -> str:
        where = self.source if self.line is None else f"{self.source}:{self.line}"
        return f"{where}: {self.message}"
