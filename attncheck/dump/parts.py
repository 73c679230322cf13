"""A dump cut into parts at evaluation starts, so that parts can be read in parallel (dump/pool.py).

An evaluation starts where the graph starts again: the header of the run's first node recurs, with the same name,
type, op and first source (its other sources' ne, such as the token count, may change). Every part but the first
begins with such a header, so a part read alone starts a fresh evaluation, as it would in one pass; each part knows
the line it starts at and whether it is the dump's last. A regular file is mapped, not read: a part is its span of
the file, which the worker reads itself, so the parent neither copies nor sends the text. A stream (stdin) is read
in blocks, so memory holds a few parts at most.
"""
from __future__ import annotations

import io
import mmap
import os
import re
from typing import BinaryIO, Iterator, NamedTuple

import numpy as np

PART = 2 << 20  # bytes: big enough that a part's work dwarfs sending it to a worker; a dump of one is read in place
LATER = 512 << 10  # bytes: the parts after the first, at most; smaller parts let more of them be made from templates
BLOCK = 8 << 20
HOLD = 16 << 20  # bytes of a stream held while no evaluation start to cut at comes
WINDOW = 64 << 10  # bytes either side of where the previous part's length puts the next cut, searched first
_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)  # Linux, macOS; elsewhere the map's pages stay until it closes
_FIRST_HEADER = re.compile(rb"(?m)^[^\n]*?_debug(?:_cb_eval)?: [^\n]*$")
# a header up to its first source's ne: `...: name = (type)    OP(src0{ne}`
_HEAD = re.compile(rb"^(.*? = \([^()\s]+\) *[A-Z0-9_]+\([^{\n]*\{[-\d, ]+\})")


class Part(NamedTuple):
    data: bytes | None  # the text, or None when it is `span` of the file at `path` (or the rest of `stream`)
    first_line: int  # the line the part's first byte is on
    final: bool  # the dump's last part
    path: str | None = None
    span: tuple[int, int] = (0, 0)  # [start, end) in bytes
    stream: BinaryIO | None = None  # the rest of a stream that could not be cut (read in this process)
    # the newlines in the part's bytes, put here by its reader (dump/repeats.py's made) when it read the part in this
    # process before the next part was cut, so that the cut need not count them again to number the next part's lines
    newlines: list[int] | None = None

    @property
    def size(self) -> int:
        return len(self.data) if self.data is not None else self.span[1] - self.span[0]

    def text(self) -> bytes:
        """The part's bytes, whole."""
        return self.reader().read()

    def reader(self) -> BinaryIO:
        """The part's bytes as a stream, read as scanning goes (a span of a file is not read whole)."""
        if self.stream is not None:
            return self.stream
        if self.data is not None:
            return io.BytesIO(self.data)
        return _Span(self.path, *self.span)  # type: ignore[arg-type]


class _Span(io.RawIOBase):
    """[start, end) of a file, read in the sizes asked for."""

    def __init__(self, path: str, start: int, end: int):
        self._f = open(path, "rb")
        self._f.seek(start)
        self._left = end - start

    def read(self, n: int = -1) -> bytes:
        if self._f.closed:
            return b""
        n = self._left if n < 0 else min(n, self._left)
        data = self._f.read(n)
        self._left -= len(data)
        if not data or not self._left:
            self._f.close()
        return data


class _Chain(io.RawIOBase):
    """Bytes already read, then the rest of a stream."""

    def __init__(self, head: bytes, rest: BinaryIO):
        self._head, self._at, self._rest = head, 0, rest

    def read(self, n: int = -1) -> bytes:
        if self._at < len(self._head):
            end = len(self._head) if n < 0 else self._at + n
            out = self._head[self._at:end]
            self._at += len(out)
            if self._at >= len(self._head):
                self._head = b""
                self._at = 0
            return out
        return self._rest.read(n)


def start_of_graph(block: bytes) -> bytes | None:
    """The bytes every evaluation's first header begins with (from the first header in the block), or None."""
    m = _FIRST_HEADER.search(block)
    if m is None:
        return None
    head = _HEAD.match(m.group(0))
    return None if head is None else head.group(1)


def parts(stream: BinaryIO, size: int | None = None) -> Iterator[Part]:
    """The dump's parts (the first of about `size` bytes, PART by default; the others of at most LATER), in order;
    one part when it cannot be cut (no repeated graph start found)."""
    path = _regular_file(stream)
    if path is not None:
        yield from _file_parts(stream, path, size or PART)
    else:
        yield from _stream_parts(stream, size or PART)


def regular_size(stream: BinaryIO) -> int | None:
    """The size of a stream that is a whole regular file read from its start (`parts` cuts it in a map), else None."""
    path = _regular_file(stream)
    return os.path.getsize(path) if path is not None else None


def _regular_file(stream: BinaryIO) -> str | None:
    """The path of a stream that is a whole regular file read from its start, when that path still names it."""
    try:
        name, st = stream.name, os.fstat(stream.fileno())  # type: ignore[attr-defined]
        if not isinstance(name, str) or stream.tell() != 0 or st.st_size == 0 or not os.path.isfile(name):
            return None
        there = os.stat(name)
    except (AttributeError, OSError, ValueError):
        return None
    return name if (there.st_dev, there.st_ino) == (st.st_dev, st.st_ino) else None


def _file_parts(stream: BinaryIO, path: str, size: int) -> Iterator[Part]:
    """The file's parts as spans of it, cut in a memory map of it."""
    with mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        start = start_of_graph(mm[:BLOCK])
        total, line, pos = len(mm), 1, 0
        floor = mm.find(start) + 1 if start is not None else 0
        released, last = 0, None  # last: the previous part's length
        while start is not None and total - pos > size:
            cut = _next_cut(mm, b"\n" + start, max(pos + size, floor), None if last is None else pos + last - 1)
            if cut < 0:
                break
            cut += 1
            counted: list[int] = []
            yield Part(None, line, False, path, (pos, cut), newlines=counted)
            line += counted[0] if counted else int(np.count_nonzero(np.frombuffer(mm, np.uint8, cut - pos, pos) == 10))
            pos, size, last = cut, min(size, LATER), cut - pos
            released = _release(mm, released, pos)
        yield Part(None, line, True, path, (pos, total))


def _next_cut(buf, needle: bytes, lo: int, guess: int | None) -> int:
    """Where the next part starts (the newline before it; -1 when no evaluation starts at or after lo): in a window
    around `guess`, where the previous part's length puts it (the evaluations of one graph print alike in length),
    else the first at or after lo. Either is an evaluation start, and a part holds whole evaluations wherever it is
    cut; the window spares searching most of the part's bytes a second time (its reader reads them anyway)."""
    if guess is not None and guess + WINDOW >= lo:
        at = buf.find(needle, max(lo, guess - WINDOW), guess + WINDOW + len(needle))
        if at >= 0:
            return at
    return buf.find(needle, lo)


def _release(mm: mmap.mmap, released: int, upto: int) -> int:
    """Unmap from this process the pages before `upto` that the cut has read (the page cache keeps them), so that its
    memory stays flat however long the file; returns how far pages are released."""
    end = upto - upto % mmap.PAGESIZE
    if end > released and _DONTNEED is not None:
        mm.madvise(_DONTNEED, released, end - released)
        return end
    return released


def _stream_parts(stream: BinaryIO, size: int) -> Iterator[Part]:
    """A stream's parts, read in blocks."""
    buf = b""
    line = 1
    start: bytes | None = None
    floor = 0
    last = None  # the previous part's length
    while True:
        block = stream.read(BLOCK)
        buf += block
        if start is None and buf:
            start = start_of_graph(buf[:BLOCK])
            # the dump's first evaluation is not a cut: a first part of log lines alone would hold no dump
            floor = buf.find(start) + 1 if start is not None else 0
        while start is not None and len(buf) > size:
            if block and last is not None and len(buf) < last + WINDOW + len(start) <= HOLD:
                break  # the window a file is cut in is not all read yet: cut where a file of these bytes is cut
            cut = _next_cut(buf, b"\n" + start, max(size, floor), None if last is None else last - 1)
            if cut < 0:
                break
            cut += 1
            yield Part(buf[:cut], line, False)
            line += buf.count(b"\n", 0, cut)
            buf, floor, size, last = buf[cut:], 0, min(size, LATER), cut
        if not block:
            yield Part(buf, line, True)
            return
        if len(buf) > HOLD:  # no evaluation starts in sight (a log without a dump, an evaluation past all sizes):
            yield Part(None, line, True, stream=_Chain(buf, stream))  # the rest is read as it comes, in this process
            return
