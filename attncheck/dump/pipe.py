"""A pipe read in few, large reads.

llama-eval-callback writes each printed number with a write of its own (about 13 bytes; 112 000 writes for a 15 MB
dump). A reader that takes each as it comes wakes that often, and the wakeups cost more CPU than checking the dump,
taken from the cores llama.cpp computes on. So after a read that found less than SMALL bytes the reader waits PAUSE
while the writer fills the pipe, enlarged to PIPE bytes where Linux allows: a writer then blocks only past PIPE /
PAUSE bytes a second (200 MB/s; 13 MB/s in a pipe of Linux's default 64 KB), and a read that finds SMALL bytes or
more is followed by the next at once.
"""
from __future__ import annotations

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


class Paced:
    """A binary stream over a buffered pipe reader: read(n) returns n bytes, fewer only at the end, as the reader it
    wraps does, gathered in reads of what the pipe holds with PAUSE between those that found little."""

    def __init__(self, inner: BinaryIO):
        self._inner = inner
        self._small = False
        self.name = getattr(inner, "name", "<stream>")
        enlarge(inner.fileno())

    def read(self, n: int = -1) -> bytes:
        chunks: list[bytes] = []
        got = 0
        while n < 0 or got < n:
            if self._small:
                time.sleep(PAUSE)
            data = self._inner.read1(PIPE if n < 0 else n - got)  # type: ignore[attr-defined]
            if not data:
                break
            chunks.append(data)
            got += len(data)
            self._small = len(data) < SMALL
        return b"".join(chunks)

    def fileno(self) -> int:
        return self._inner.fileno()

    def close(self) -> None:
        self._inner.close()


def paced(stream: BinaryIO) -> BinaryIO:
    """The stream, paced when it reads a pipe (a file or a terminal is read as it is)."""
    return Paced(stream) if is_pipe(stream) and hasattr(stream, "read1") else stream  # type: ignore[return-value]
