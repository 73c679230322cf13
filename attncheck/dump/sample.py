"""Records → printed samples: the numbers of one node, indexed by logical position.

llama.cpp prints, along every dimension of more than 6 entries, only the first 3 and the last 3 indices
(`common/debug.cpp`, n = 3). A `Sample` keeps which logical indices were printed, so that no code confuses
"printed position 3" with "slot 253".
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from ..errors import DumpError
from .records import Node
from .words import words_as_floats

EDGE = 3  # llama.cpp prints the first and last EDGE indices of a long dimension
CUT_ADVICE = "llama.cpp's logger can lose the tail of its output at exit: run it again"

# A value is printed from a float (common/debug.cpp converts every type to float before `%12.4f`, and sums a float
# for `sum = %f`), so its integer part has at most 39 digits (FLT_MAX = 3.4e38): a longer run of digits is damage,
# and the bound keeps these regexes linear on a line of a million digits (an unbounded `\d+` backtracks through the
# run at every position of it). The look-behind starts a number only where a run of digits starts.
_DIGITS = rb"(?<!\d)-?(?:\d{1,39}\.\d{4}(?:\d\d)?|nan|inf)"
_SKELETON = re.compile(rb"\s+|" + _DIGITS)  # what is left of a line without numbers and spaces
_NUMBER_CHARS = b"0123456789.-naif \t\r\n"  # deleted for the fast skeleton: digits, nan, inf, spaces
_BUT_DOTS = _NUMBER_CHARS.replace(b".", b"")  # deleted for the dotted skeleton: a finite number leaves its '.'
_PUNCT = bytes.maketrans(b"[],=", b"    ")
_NEWLINE_UNLIKE_PRINT = re.compile(rb"\n(?! )")  # a newline that starts no printed line (or ends the text)
# every printed word: `%12.4f` values (4 decimals) and `%f` sums (6), or the non-finite spellings
_PRINTED_VALUES = re.compile(rb"(?:" + _DIGITS + rb" )*")
_FOREIGN_LINE = re.compile(rb"(?m)^[^\s\n][^\n]*(?:\n|$)")  # log lines start in column 0; printed lines never do


def printed_indices(n: int) -> np.ndarray:
    """The logical indices llama.cpp prints along a dimension of n entries."""
    if n <= 2 * EDGE:
        return np.arange(n)
    return np.array([*range(EDGE), *range(n - EDGE, n)])


class Sample(NamedTuple):
    """The printed part of a tensor (a NamedTuple: one is made for every parsed node of every evaluation).

    values: [n3, n2, n1, n0] printed values, numpy order of GGML's (i3, i2, i1, i0);
    index:  the logical indices printed along each of those four axes;
    sums:   the `sum = ` line after each i3 block (full tensor today, printed values only before PR #15637).
    """

    node: Node
    values: np.ndarray
    index: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
    sums: tuple[float, ...]

    @property
    def complete(self) -> bool:
        """Every element was printed: nothing elided."""
        return all(len(ix) == n for ix, n in zip(self.index, reversed(self.node.ne)))

    def position(self, axis: int, logical: int) -> int | None:
        """Printed position of a logical index along a numpy axis (0 = i3 ... 3 = i0), or None if not printed."""
        hits = np.flatnonzero(self.index[axis] == logical)
        return int(hits[0]) if len(hits) else None


@lru_cache(maxsize=1024)
def _layout(ne: tuple[int, int, int, int], v: bytes = b"") -> tuple[bytes, tuple[bytes, ...]]:
    """The skeleton llama.cpp prints for this ne, whole and line by line (spaces and numbers removed; each number
    written as `v`)."""
    lines: list[bytes] = []
    n0, n1, n2, n3 = ne
    p0, p1, p2 = (len(printed_indices(n)) for n in (n0, n1, n2))
    row = b"[" + b",".join([v] * p0) + b"],"
    if n0 > 2 * EDGE:
        row = b"[" + (v + b",") * EDGE + b"...," + (v + b",") * (EDGE - 1) + v + b"],"
    elif n0 == 0:
        row = b"[],"
    for _ in range(n3):
        lines.append(b"[")
        for i2 in range(p2):
            if i2 == EDGE and n2 > 2 * EDGE:
                lines.append(b"...,")
            lines.append(b"[")
            for i1 in range(p1):
                if i1 == EDGE and n1 > 2 * EDGE:
                    lines.append(b"...,")
                lines.append(row)
            lines.append(b"],")
        lines.append(b"]")
        lines.append(b"sum=" + v)
    return b"".join(lines), tuple(lines)


@lru_cache(maxsize=256)
def _row_lines(ne: tuple[int, int, int, int]) -> tuple[int, ...]:
    """Where each printed row (in print order) sits among the lines of a clean print of this ne, from 0."""
    return tuple(i for i, text in enumerate(_layout(ne)[1]) if len(text) > 2 and text[:1] == b"[")


@lru_cache(maxsize=256)
def _first_rows(ne: tuple[int, int, int, int]) -> np.ndarray:
    """_row_lines of the first i3 block as [p2, p1], read-only (shared by every node of this ne)."""
    p1, p2 = len(printed_indices(ne[1])), len(printed_indices(ne[2]))
    k = np.array(_row_lines(ne)[:p1 * p2], dtype=np.int64).reshape(p2, p1)
    k.setflags(write=False)
    return k


def every_line_printed(body: bytes) -> bool:
    """Each line after the first starts with a blank, as llama.cpp prints: no log line came between. (As newlines
    go: those not followed by a blank, the last one's included, are one if the body starts with a blank, else none;
    found by a search for the first two, not by counting every newline.)"""
    first = _NEWLINE_UNLIKE_PRINT.search(body)
    if not body.startswith(b" "):
        return first is None
    return first is not None and _NEWLINE_UNLIKE_PRINT.search(body, first.end()) is None


def row_lines(node: Node) -> np.ndarray:
    """[p2, p1] the 1-based line of each printed row of the first i3 block (one row per printed i2, i1): where a
    failing value of kq, kq_soft_max or kqv sits. Log lines interleaved into the body are skipped, as the parser
    skips them."""
    k = _first_rows(node.ne)
    body = node.body
    if node.plain or not body or every_line_printed(body):  # plain: parsed whole, as a clean print (repeats.py)
        return node.body_line + k
    offsets = [o for o, raw in enumerate(body.split(b"\n")) if raw[:1].isspace() or raw[:1] in (b"[", b"]")]
    return np.array([node.body_line + offsets[i] if i < len(offsets) else -1 for i in k.ravel()]).reshape(k.shape)


def row_line(node: Node, i3: int, i2: int, i1: int) -> int | None:
    """The 1-based line of the printed row that holds logical element (i3, i2, i1, ·) of a node, or None when that
    row was not printed. Log lines interleaved into the body are skipped, as the parser skips them."""
    n0, n1, n2, n3 = node.ne
    p1, p2 = printed_indices(n1), printed_indices(n2)
    at1, at2 = np.flatnonzero(p1 == i1), np.flatnonzero(p2 == i2)
    if not len(at1) or not len(at2) or not 0 <= i3 < n3:
        return None
    k = _row_lines(node.ne)[(i3 * len(p2) + int(at2[0])) * len(p1) + int(at1[0])]
    body = node.body
    if not body or every_line_printed(body):
        return node.body_line + k
    printed = -1
    for offset, raw in enumerate(body.split(b"\n")):
        if raw[:1].isspace() or raw[:1] in (b"[", b"]"):
            printed += 1
            if printed == k:
                return node.body_line + offset
    return None


def _clean(body: bytes) -> bytes:
    """The body without the log lines that stdout/stderr interleaving put between its lines."""
    if every_line_printed(body) and body.endswith(b"\n"):
        return body  # every line is indented: nothing foreign (the common case, decided without a regex)
    return _FOREIGN_LINE.sub(b"", body)


def interleaved(node: Node) -> bool:
    """Whether log lines were interleaved into the node's body (2024's llama.cpp printed stdout and stderr apart):
    what does not parse there may be a number split by them, not a wrong print."""
    return _clean(node.body) != node.body


def parse_sample(node: Node, source: str) -> Sample:
    """Parse a node's printed body into a Sample; DumpError names the first line that does not fit its ne."""
    if node.quantized:
        raise DumpError(source, node.line, f"node '{node.name}' is {node.type}: quantized tensors print no values")
    n0, n1, n2, n3 = node.ne
    if n3 > 1 and n3 > node.body.count(b"sum"):  # each i3 block ends in a `sum = ` line: more cannot fit
        _locate_damage(node, source)
    index = (np.arange(n3), printed_indices(n2), printed_indices(n1), printed_indices(n0))
    shape = tuple(len(ix) for ix in index)
    per_block = shape[1] * shape[2] * shape[3]
    # fast path: the skeleton (brackets, commas, `sum=`) must be the one llama.cpp prints for this ne, and the
    # words between them exactly the expected count of numbers; anything else is located line by line
    body = _skeleton_fits(node)
    try:
        if body is None:
            raise ValueError
        words = body.replace(b"...", b"").replace(b"sum", b"").translate(_PUNCT).split()
        if len(words) != n3 * (per_block + 1):
            raise ValueError
        if not _PRINTED_VALUES.fullmatch(b" ".join(words) + b" "):
            raise ValueError  # a word `%12.4f` and `%f` never print (1234, .8108, 8108.) is damage, not a value
        numbers = np.fromiter(map(float, words), np.float64, len(words)).reshape(n3, per_block + 1)
    except ValueError:
        _locate_damage(node, source)
        raise  # unreachable: _locate_damage raises
    values = numbers[:, :per_block].reshape(shape)
    return Sample(node, values, index, tuple(numbers[:, -1].tolist()))


def parse_samples(nodes: list[Node]) -> list[Sample | None]:
    """Many nodes' printed bodies parsed at once, as parse_sample parses each (the same words, the same floats), in
    one pass of numpy over all their text: per node, a Sample, or None where that pass cannot vouch for it (a
    quantized node, a skeleton or a word it does not accept, a number of more than 15 digits, nan, inf), for
    parse_sample to parse or to name the damage, at the moment the caller would have parsed it."""
    bodies: list[bytes] = []
    todo: list[int] = []  # the nodes whose bodies are parsed
    for i, node in enumerate(nodes):
        n3 = node.ne[3]
        if node.quantized or n3 > 1 and n3 > node.body.count(b"sum"):
            continue
        body = _skeleton_fits(node)
        if body is not None:
            bodies.append(body)
            todo.append(i)
    out: list[Sample | None] = [None] * len(nodes)
    if not todo:
        return out
    values, words, good = words_as_floats(bodies)
    count = np.asarray(words)
    ends = np.cumsum(count)
    starts = ends - count
    layouts = [_sample_layout(nodes[i].ne) for i in todo]
    want = [layout[0] for layout in layouts]
    # a node is parsed when it has the words its ne prints and each one is a print words_as_floats vouches for
    ok = ((count == want) & (good[ends] - good[starts] == want)).tolist()
    for i, a, b, fine, (_, rows, per_block, shape, index) in zip(todo, starts.tolist(), ends.tolist(), ok, layouts):
        if fine:
            numbers = values[a:b].reshape(rows, per_block + 1)
            out[i] = Sample(nodes[i], numbers[:, :per_block].reshape(shape), index, tuple(numbers[:, -1].tolist()))
    return out


@lru_cache(maxsize=1024)
def _sample_layout(ne: tuple[int, int, int, int]) -> tuple[int, int, int, tuple[int, ...], tuple]:
    """What a print of this ne holds: its words, its i3 blocks, the values in each, the values' shape, and the
    printed indices (read-only, shared by the Samples of that shape)."""
    index = (np.arange(ne[3]), *_printed(ne[:3]))
    index[0].setflags(write=False)
    per_block = _per_block(ne)
    return ne[3] * (per_block + 1), ne[3], per_block, tuple(map(len, index)), index


@lru_cache(maxsize=1024)
def _per_block(ne: tuple[int, int, int, int]) -> int:
    return len(printed_indices(ne[0])) * len(printed_indices(ne[1])) * len(printed_indices(ne[2]))


@lru_cache(maxsize=1024)
def _printed(ne: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """printed_indices of (n2, n1, n0), made once per shape and read-only, as the Samples of that shape share them."""
    out = tuple(printed_indices(n) for n in reversed(ne))
    for a in out:
        a.setflags(write=False)
    return out  # type: ignore[return-value]


@lru_cache(maxsize=1024)
def _fast_skeleton(ne: tuple[int, int, int, int]) -> bytes:
    return _layout(ne)[0].translate(None, _NUMBER_CHARS)


@lru_cache(maxsize=1024)
def _dotted_skeleton(ne: tuple[int, int, int, int]) -> bytes:
    """A clean print of finite numbers with everything but each number's '.' deleted: one compare says it fits."""
    return _layout(ne, b".")[0]


def prints_plainly(node: Node) -> bool:
    """fits' common case: the body is a clean print of finite numbers, decided by one translate and one compare."""
    return node.body.translate(None, _BUT_DOTS) == _dotted_skeleton(node.ne)


def fits(node: Node) -> bool:
    """The body has the shape llama.cpp prints for this ne, without parsing a number: the skeleton, and one '.',
    'nan' or 'inf' per number. For the nodes no check parses, so that damage to them is noticed all the same."""
    if node.quantized:
        return not node.body.strip()
    n3 = node.ne[3]
    if n3 > 1 and n3 > node.body.count(b"sum"):  # before any layout: a header may promise 10^18 blocks
        return False
    if prints_plainly(node):
        return True
    body = _skeleton_fits(node)
    if body is None:
        return False
    marks, dots = _marks(node.ne), body.count(b".")
    return dots == marks or dots + body.count(b"nan") + body.count(b"inf") == marks


def in_layout(body: bytes, ne: tuple[int, int, int, int]) -> bool:
    """The body's skeleton (numbers, nan, inf and blanks deleted) is the one llama.cpp prints for this ne."""
    return body.translate(None, _NUMBER_CHARS) == _fast_skeleton(ne)


def _skeleton_fits(node: Node) -> bytes | None:
    """The body (without interleaved log lines) if its skeleton is the one printed for its ne, else None.

    Log lines hold letters the skeleton keeps, so the raw body is tried first and cleaned only when it differs."""
    if node.plain or in_layout(node.body, node.ne):
        return node.body
    body = _clean(node.body)
    return body if body is not node.body and in_layout(body, node.ne) else None


@lru_cache(maxsize=1024)
def _marks(ne: tuple[int, int, int, int]) -> int:
    """How many '.', 'nan' and 'inf' a clean print of this ne holds: one per number and sum, three per '...'."""
    n0, n1, n2, n3 = ne
    per_block = len(printed_indices(n2)) * len(printed_indices(n1)) * len(printed_indices(n0))
    return n3 * (per_block + 1) + 3 * _layout(ne)[0].count(b"...")


def _locate_damage(node: Node, source: str) -> None:
    """Walk the body line by line against the expected layout and raise at the first line that differs."""
    if node.cut:
        raise DumpError(source, node.last_line, f"the dump ends inside node '{node.name}' (header at line {node.line}); "
                                                f"{CUT_ADVICE}")
    n0, n1, n2, n3 = node.ne  # no more i3 blocks than the body has `sum = ` lines, whatever a damaged ne3 says
    _, expected = _layout((n0, n1, n2, min(n3, node.body.count(b"sum") + 1)))
    line = node.body_line
    k = 0
    for raw in node.body.split(b"\n"):
        text = raw.strip()
        if text and raw[:1].isspace() or raw.startswith(b"[") or raw.startswith(b"]"):
            got = _SKELETON.sub(b"", raw)
            if k >= len(expected) or got != expected[k] or not _numbers_fit(raw, expected[k]):
                what = "more lines than its ne" if k >= len(expected) else _describe(expected[k])
                shown = raw.strip().decode("utf-8", "replace")[:60]
                raise DumpError(
                    source, line,
                    f"node '{node.name}' (ne {{{', '.join(map(str, node.ne))}}}): expected {what}, found '{shown}'",
                )
            k += 1
        line += 1
    if k >= len(expected):  # every line fits: what failed is not in a line of its own (not expected to happen)
        raise DumpError(source, node.line, f"node '{node.name}': its printed values do not parse")
    cut = "the dump ends" if node.cut else "the next node starts"
    raise DumpError(
        source, line - 1,
        f"node '{node.name}' is incomplete: {cut} before its {_describe(expected[k])} (header at line {node.line})",
    )


def _numbers_fit(raw: bytes, skeleton_line: bytes) -> bool:
    """The line holds as many numbers as its skeleton line calls for, each one a number (as the fast path reads
    them): catches a number lost, split, or two run together, which leave the skeleton as it was."""
    words = raw.replace(b"...", b"").replace(b"sum", b"").translate(_PUNCT).split()
    want = 1 if skeleton_line == b"sum=" else 0
    if skeleton_line.startswith(b"[") and skeleton_line.endswith(b"],"):
        inner = skeleton_line[1:-2]
        want = inner.count(b",") + 1 - (b"..." in inner) if inner else 0
    if len(words) != want:
        return False
    try:
        [float(w) for w in words]
    except ValueError:
        return False
    return True


def _describe(skeleton_line: bytes) -> str:
    if skeleton_line == b"sum=":
        return "'sum = ' line"
    if skeleton_line == b"...,":
        return "'...,' elision line"
    if skeleton_line in (b"[", b"],", b"]"):
        return f"bracket line '{skeleton_line.decode()}'"
    inner = skeleton_line[1:-2]
    n = inner.count(b",") + 1 - (b"..." in inner) if inner else 0
    return f"a row of {n} printed values"
