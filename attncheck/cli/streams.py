"""stdout and stderr that never end a command: a write that fails (a reader that went away, `| head -1`; stdout
closed, `>&-`; a full disk) is remembered and later writes are dropped, so the command goes on to write its other
reports; at the end one line says what was lost, and the exit code is the verdict's when it is a FAIL, 2 when the
verdict passed but a report could not be written (settle)."""
from __future__ import annotations

import errno
import io
import os
import sys

from ..report import EXIT_FAIL, EXIT_INPUT


class _Closed(io.TextIOBase):
    """A standard stream whose file descriptor was closed when attncheck started (Python gives None for it)."""

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, "it was closed")

    def isatty(self) -> bool:
        return False


class Guarded(io.TextIOBase):
    """A text stream around stdout or stderr that remembers its first failed write and drops the rest."""

    def __init__(self, inner, name: str):
        self.inner, self.name = inner, name
        self.error: OSError | None = None

    def write(self, text: str) -> int:
        if self.error is None:
            try:
                self.inner.write(text)
            except OSError as e:
                self._lost(e)
        return len(text)

    def flush(self) -> None:
        if self.error is None:
            try:
                self.inner.flush()
            except OSError as e:
                self._lost(e)

    def _lost(self, e: OSError) -> None:
        self.error = e
        try:  # the descriptor now reads as /dev/null: the interpreter's last flush at exit says nothing
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self.inner.fileno())
            os.close(null)
        except (OSError, ValueError, AttributeError):
            pass

    def isatty(self) -> bool:
        try:
            return self.inner.isatty()
        except (OSError, ValueError):
            return False

    def fileno(self) -> int:
        return self.inner.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self.inner, "encoding", "utf-8")

    @property
    def errors(self) -> str | None:
        return getattr(self.inner, "errors", None)

    def writable(self) -> bool:
        return True


def guard() -> tuple[Guarded, Guarded]:
    """sys.stdout and sys.stderr guarded; a descriptor closed at start is held by /dev/null, so that a report file
    opened later cannot take its number and receive what was meant for the terminal."""
    out = []
    for fd, name in ((1, "stdout"), (2, "stderr")):
        stream = getattr(sys, name)
        if stream is None:
            try:
                os.fstat(fd)
            except OSError:
                null = os.open(os.devnull, os.O_WRONLY)
                if null != fd:
                    os.dup2(null, fd)
                    os.close(null)
            stream = _Closed()
        guarded = stream if isinstance(stream, Guarded) else Guarded(stream, name)
        setattr(sys, name, guarded)
        out.append(guarded)
    return out[0], out[1]


def settle(code: int, stdout: Guarded, say) -> int:
    """The exit code once the output is flushed: a lost stdout is one line (`say`), and turns a verdict that did not
    fail into 2: what it said did not all reach its reader."""
    stdout.flush()
    if stdout.error is None:
        return code
    say(f"stdout: the report could not be written: {stdout.error.strerror or stdout.error}")
    return code if code == EXIT_FAIL or code > 128 else EXIT_INPUT  # a failed or interrupted one keeps its code
