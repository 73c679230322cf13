"""A dump cut into parts at evaluation starts, so that parts can be read in parallel (check/pool.py).

An evaluation starts where the graph starts again: the header of the run's first node recurs, with the same name,
type, op and first source (its other sources' ne, such as the token count, may change). Every part but the first
begins with such a header, so a part read alone starts a fresh evaluation, as it would in one pass; each part knows
the line it starts at and whether it is the dump's last. The input is read in blocks, files and stdin alike, so
memory holds a few parts at most.
"""
from __future__ import annotations

import re
from typing import BinaryIO, Iterator, NamedTuple

PART = 4 << 20  # bytes: big enough that a part's work dwarfs sending it to a worker
BLOCK = 8 << 20
_FIRST_HEADER = re.compile(rb"(?m)^[^\n]*?_debug(?:_cb_eval)?: [^\n]*$")
# a header up to its first source's ne: `...: name = (type)    OP(src0{ne}`
_HEAD = re.compile(rb"^(.*? = \([^()\s]+\) *[A-Z0-9_]+\([^{\n]*\{[-\d, ]+\})")


class Part(NamedTuple):
    data: bytes
    first_line: int  # the line the part's first byte is on
    final: bool  # the dump's last part


def start_of_graph(block: bytes) -> bytes | None:
    """The bytes every evaluation's first header begins with (from the first header in the block), or None."""
    m = _FIRST_HEADER.search(block)
    if m is None:
        return None
    head = _HEAD.match(m.group(0))
    return None if head is None else head.group(1)


def parts(stream: BinaryIO, size: int | None = None) -> Iterator[Part]:
    """The dump's parts (about `size` bytes each, PART by default), in order; one part when it cannot be cut (no
    repeated graph start found)."""
    size = size or PART
    buf = b""
    line = 1
    start: bytes | None = None
    floor = 0
    while True:
        block = stream.read(BLOCK)
        buf += block
        if start is None and buf:
            start = start_of_graph(buf[:BLOCK])
            # the dump's first evaluation is not a cut: a first part of log lines alone would hold no dump
            floor = buf.find(start) + 1 if start is not None else 0
        while start is not None and len(buf) > size:
            cut = buf.find(b"\n" + start, max(size, floor))
            if cut < 0:
                break
            cut += 1
            yield Part(buf[:cut], line, False)
            line += buf.count(b"\n", 0, cut)
            buf, floor = buf[cut:], 0
        if not block:
            yield Part(buf, line, True)
            return
