"""A pipe read in few, large reads.

llama-eval-callback writes each printed number with a write of its own (about 13 bytes; 112 000 writes for a 15 MB
dump). A reader that takes each as it comes wakes that often, and the wakeups cost more CPU than checking the dump,
taken from the cores llama.cpp computes on. So after a read that found less than SMALL bytes the reader waits PAUSE
while the writer fills the pipe, enlarged to PIPE bytes where Linux allows: a writer then blocks only past PIPE /
PAUSE bytes a second (200 MB/s; 13 MB/s in a pipe of Linux's default 64 KB), and a read that finds SMALL bytes or
more is followed by the next at once.
"""
from __future__ import annotations

import io
import os
import stat
import time
from typing import BinaryIO

PAUSE = 0.005  # seconds between reads while the pipe gives little
SMALL = 16 << 10  # bytes: a read that found less waits PAUSE before the next
PIPE = 1 << 20  # bytes: the pipe's size asked for (Linux's pipe-max-size by default)


def is_pipe(stream: BinaryIO) -> bool:
    """Whether the stream reads a pipe (a FIFO: `llama ... | attncheck`)."""
    try:
        return stat.S_ISFIFO(os.fstat(stream.fileno()).st_mode)
    except (AttributeError, OSError, ValueError):
        return False


def enlarge(fd: int) -> None:
    """Ask for a pipe of PIPE bytes; where the system refuses (not Linux, or above its limit), it stays as it is."""
    try:
        import fcntl

        if fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ) < PIPE:
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE)
    except (ImportError, AttributeError, OSError):
        pass


class Pace:
    """When a pipe is read next: at once after a read that found SMALL bytes or more, PAUSE later after one that found
    less (paced()'s reads here, `attncheck run`'s in cli/llama.py)."""

    def __init__(self) -> None:
        self._small = False

    def wait(self) -> None:
        """Before a read: let the pipe fill if the last read found little."""
        if self._small:
            time.sleep(PAUSE)

    def read(self, n: int) -> None:
        """After a read of n bytes."""
        self._small = n < SMALL


class _Paced(io.RawIOBase):
    """The raw reads under paced()'s buffered reader: each takes what the pipe holds (what the reader it wraps has
    buffered first), and one that found less than SMALL bytes waits PAUSE before the next."""

    def __init__(self, inner: BinaryIO):
        self._inner = inner
        self._pace = Pace()
        self.name = getattr(inner, "name", "<stream>")
        enlarge(inner.fileno())

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        self._pace.wait()
        n = self._inner.readinto1(b)  # type: ignore[attr-defined]
        self._pace.read(n)
        return n

    def fileno(self) -> int:
        return self._inner.fileno()


def paced(stream: BinaryIO) -> BinaryIO:
    """The stream, read through a paced pipe reader when it is a pipe (a file or a terminal is read as it is). Its
    read(n) returns n bytes, fewer only at the end, read into the result it returns as they come (no copies held)."""
    if not is_pipe(stream) or not hasattr(stream, "readinto1"):
        return stream
    return io.BufferedReader(_Paced(stream), SMALL)  # type: ignore[return-value]
