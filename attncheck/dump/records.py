"""Text → records: one pass over a llama.cpp debug dump, cutting it into node records.

A node is a header line (`common_debug_cb_eval:` today, `ggml_debug:` before PR #17914), then its printed body.
Only headers are parsed here; a body stays raw text until a check asks for its numbers (see `sample.py`).
The input is read in chunks, so memory does not grow with the size of the dump.
"""
from __future__ import annotations

import re

import numpy as np
from functools import lru_cache
from dataclasses import dataclass, field
from typing import BinaryIO, Callable, Iterator, NamedTuple

from ..arch.log_header import LogHeader, parse_log_header
from ..errors import DumpError

CHUNK = 8 << 20
# What llama.cpp can print bounds what is held of a line and of the text between two headers. Its longest line is a
# header, under 512 bytes (common/debug.cpp: names of at most 63 bytes, GGML_MAX_NAME; src1 printed into 128 bytes;
# four int64 ne); a printed row holds at most 7 values of at most 47 characters (a float's %12.4f). A line of a
# mebibyte is no line of llama.cpp's, nor of any log beside it: an error at its line. A header of more than
# MAX_HEADER bytes is damage (its regex is not run on it).
MAX_LINE = 1 << 20
MAX_HEADER = 1024
LONG_LINE = (f"a line of more than {MAX_LINE >> 20} MiB: llama.cpp prints none longer than a header (under 512 bytes), "
             "nor does any log beside it")
# The text between two headers is the first node's print and log lines (the next run's start-up, other programs' output
# in a CI log). Past GAP bytes of it, the node's print is kept, what a run start needs is read from the rest, and the
# rest is dropped: memory holds a few chunks whatever the log holds.
GAP = 16 << 20
_SUM_LINE = re.compile(rb"(?m)^[ \t]+sum = [^\n]*\n")

# `%s: %24s = (%s) %10s(%s, %s}) = {%s}`: the literal `_debug...: ` lets the regex engine skip ahead fast.
_HEADER_AT = re.compile(rb"_debug(?:_cb_eval)?: ([^\n]*)")
_HEADER = re.compile(
    r"(?P<name>.*?) = \((?P<type>[^()\s]+)\) *(?P<op>[A-Z0-9_]+)\((?P<srcs>.*)\}\) = \{(?P<ne>[-\d, ]+)\}\s*$"
)
_DAMAGED_NAME = re.compile(r"(.*?) = \(")  # a damaged header may still say whose it was
MAX_NAME_SAID = 80  # a longer "name" of a damaged header is more likely the damage itself: not repeated in the warning
_SRC = re.compile(r"(?P<name>.*?)\{(?P<ne>[-\d, ]+)\}$")
# a count is a size_t (at most 20 digits), a token id an int32 (10): more digits are no count or id llama.cpp printed
_TOKENS = re.compile(rb"number of input tokens = (\d{1,20})(?!\d)[^\n]*\n")
_TOKEN_ID = re.compile(rb"[^\n]*?\s(\d{1,10})[ \t\r]*\n")
_PRINTED_LINE = re.compile(rb"(?m)^[ \t]+(?:\[|\]|sum = )")  # a line of a printed tensor (log lines start in column 0)


class Src(NamedTuple):
    """A source as a header names it: the name of the latest earlier node so called, and its ne."""

    name: str
    ne: tuple[int, int, int, int]


class NodeRef(NamedTuple):
    """What a report needs of a node, without its body: picklable and small."""

    name: str
    line: int
    op: str
    type: str
    ne: tuple[int, int, int, int]


@dataclass(eq=False, slots=True)
class Node:
    """One printed graph node. `ne` is GGML order {ne0, ne1, ne2, ne3}; ne0 varies fastest."""

    name: str
    type: str
    op: str
    srcs: tuple[Src | None, Src | None]
    ne: tuple[int, int, int, int]
    line: int  # 1-based line of the header
    body: bytes  # the raw printed body, up to the next header
    body_line: int  # 1-based line where the body starts
    cut: bool = False  # the input ended inside this node
    inputs: tuple["Node | None", "Node | None"] = field(default=(None, None), repr=False)  # resolved by graph.py
    lost: int = 0  # bit i set: src i names a node whose header was damaged (so inputs[i] is None), not a weight
    plain: bool = False  # the body is a clean print of ne but for its numbers: a template vouched (dump/repeats.py)

    def unprinted(self, i: int) -> bool:
        """src i is a tensor llama.cpp does not print (a weight, a bias, an input like inp_pos), not a printed node
        and not one whose header was lost: what tells a weight MUL_MAT or a bias ADD from the others."""
        return self.inputs[i] is None and not (self.lost >> i) & 1

    @property
    def last_line(self) -> int:
        """The last line this node's text reaches (its header line when nothing follows it)."""
        text = self.body.rstrip()
        return self.body_line + text.count(b"\n") if text else self.line

    @property
    def ref(self) -> NodeRef:
        return NodeRef(self.name, self.line, self.op, self.type, self.ne)

    @property
    def quantized(self) -> bool:
        """Quantized tensors (q8_0, q4_K, ...) print their header only."""
        return self.type not in ("f32", "f16", "bf16", "f64", "i32", "i16", "i8", "i64")


class RunStart(NamedTuple):
    """A new llama.cpp run begins: its start-up log, with `number of input tokens = N` and the ids when printed,
    and the model's GGUF keys when the log printed them (2024 logs: arch/log_header.py)."""

    line: int
    tokens: tuple[int, ...] | None
    header: LogHeader | None = None


class Note(NamedTuple):
    """Something odd in the text that no check needed: reported as a warning.

    damage: text was lost or garbled there, so a node may be missing (graph.py turns that into an error where an
    attention check needed the node)."""

    line: int
    message: str
    damage: bool = False
    name: str | None = None  # the node whose header was damaged, when its name could still be read
    lost: bool = False  # a header line was damaged: a whole node is missing from the graph (not just a row of one)


Record = Node | RunStart | Note


@lru_cache(maxsize=4096)
def _ne(text: str) -> tuple[int, int, int, int]:
    dims = tuple(map(int, text.split(",")))
    if len(dims) != 4 or min(dims) < 0 or max(dims) >= 2**63:  # GGML's ne is int64_t
        raise ValueError(text)
    return dims  # type: ignore[return-value]


def ne_text(ne) -> str:
    """A shape as a header prints it: {ne0, ne1, ne2, ne3}."""
    return "{" + ", ".join(map(str, ne)) + "}"


@lru_cache(maxsize=8192)
def _parse_header_at(rest: bytes):
    """parse_header of a header's raw bytes (headers repeat: each is decoded and parsed once)."""
    return parse_header(rest.decode("utf-8", "replace"))


@lru_cache(maxsize=8192)
def parse_header(rest: str) -> tuple[str, str, str, tuple[Src | None, Src | None], tuple[int, int, int, int]] | None:
    """Split the part of a header after the prefix; None when it is not a whole header."""
    m = _HEADER.match(rest)
    if not m:
        return None
    srcs_text = m["srcs"]
    # "src0{ne}, src1{ne}" or "src0{ne}, " (no src1) or ", " (no sources); names may hold ", " themselves,
    # but ne never holds a brace, so split after the first "}, ".
    cut = srcs_text.find("}, ")
    if cut >= 0:
        s0, s1 = srcs_text[: cut + 1], srcs_text[cut + 3 :]
    elif srcs_text.startswith(", "):
        s0, s1 = "", srcs_text[2:]
    else:
        return None
    srcs: list[Src | None] = []
    for text in (s0, s1):
        if not text:
            srcs.append(None)
            continue
        sm = _SRC.match(text)
        if not sm:
            return None
        try:
            srcs.append(Src(sm["name"].strip(), _ne(sm["ne"])))
        except ValueError:
            return None
    try:
        ne = _ne(m["ne"])
    except ValueError:
        return None
    return m["name"].strip(), m["type"], m["op"], (srcs[0], srcs[1]), ne


def scan(stream: BinaryIO, source: str, on_read: Callable[[bytes], None] | None = None,
         first_line: int = 1) -> Iterator[Record]:
    """Yield the records of a dump in order: RunStart per run, Node per header, Note per oddity.

    on_read(chunk) sees each chunk as it is read (for progress, and to count lines to the end). first_line: the line a
    part of a dump starts at (dump/parts.py); the start of the dump itself is line 1.
    """
    carry = b""
    line = first_line  # line number of the first byte of `carry`
    first = first_line == 1  # only the dump's own start can be a GGUF file or carry a BOM
    pending: tuple | None = None  # the header waiting for its body: (name, type, op, srcs, ne, line, body_line)
    seen_header = False
    held = b""  # the pending node's print, when the text after it grew past GAP and was dropped
    held_runs: list[RunStart] = []  # the run start read from the dropped text
    noted = False  # printed values before the first header were noted
    while True:
        chunk = stream.read(CHUNK)
        if on_read is not None:
            on_read(chunk)
        if first:
            if chunk.startswith(b"GGUF"):
                raise DumpError(source, 1, "this is a GGUF model file, not a dump (give it with --model)")
            if chunk.startswith(b"\xef\xbb\xbf"):
                chunk = chunk[3:]
            first = False
        eof = not chunk
        buf = carry + chunk
        # headers and token lists are whole lines: leave a partial last line for the next round
        end = len(buf) if eof else buf.rfind(b"\n") + 1
        runs_here = b"system_info:" in buf or b"number of input tokens" in buf  # else no gap needs a look
        pos = 0  # start of the text not yet given to a node
        matches = list(_HEADER_AT.finditer(buf, 0, end))
        starts = [buf.rfind(b"\n", 0, m.start()) + 1 for m in matches]  # each header's line start
        long = _long_line(buf, end)
        if long is not None:
            raise DumpError(source, line + buf.count(b"\n", 0, long), LONG_LINE)
        lines = _lines_at(buf, end, starts, line)
        for m, start, header_line in zip(matches, starts, lines):
            if start < pos:  # a second prefix on a header's own line: not a header of its own
                continue
            body = buf[pos:start]
            if pending is not None:  # the node before the gap ends there: a run starting in the gap comes after it
                yield _node(pending, held + body)
            elif not seen_header and not noted and (hit := _PRINTED_LINE.search(body)):
                yield Note(line + body.count(b"\n", 0, hit.start()), "printed values before the first header "
                                                                     "(the header line lost?): skipped, no node holds them")
            if held_runs:
                yield from held_runs
            elif runs_here:
                yield from _tokens(body, line, source)
            held, held_runs = b"", []
            line, pos = header_line + 1, m.end() + 1
            parsed = _parse_header_at(m.group(1)) if len(m.group(1)) <= MAX_HEADER else None
            if parsed is None:
                named = _DAMAGED_NAME.match(m.group(1).decode("utf-8", "replace"))
                name = named.group(1).strip() if named else None
                of = f" of '{name}'" if name and len(name) <= MAX_NAME_SAID else ""
                yield Note(header_line, f"damaged header line{of} (interleaved output?): skipped with its body",
                           damage=True, name=name, lost=True)
                pending = None
                continue
            at = m.start()
            if buf[start : at + 14] != b"common_debug_cb_eval":  # today's prefix alone on its line: the common case
                lead = buf[start:at]
                if lead != (b"common" if m.group(0).startswith(b"_debug_cb_eval") else b"ggml"):
                    yield Note(header_line, f"header of '{parsed[0]}' shares its line with other output: read all "
                                            "the same")
            seen_header = True
            pending = parsed + (header_line, line)
        carry = buf[pos:]
        if not eof:
            last = carry.rfind(b"\n") + 1
            if len(carry) - last > MAX_LINE:  # a line not ended yet: held no further
                raise DumpError(source, line + carry.count(b"\n", 0, last), LONG_LINE)
            if len(carry) > GAP:
                keep = 0 if pending is None or held else _print_end(carry, last, pending)
                held += carry[:keep]
                at = line + carry.count(b"\n", 0, keep)  # the dropped text, carry[keep:last], starts on this line
                if not seen_header and not noted and carry.find(b"[", keep, last) >= 0 and (
                        hit := _PRINTED_LINE.search(carry, keep, last)):
                    noted = True
                    yield Note(at + carry.count(b"\n", keep, hit.start()), "printed values before the first header "
                                                                           "(the header line lost?): skipped, no node holds them")
                if not any(r.tokens for r in held_runs) and any(  # a run's token ids outrank a bare system_info line
                        carry.find(key, keep, last) >= 0 for key in (b"system_info:", b"number of input tokens")):
                    held_runs = list(_tokens(carry[keep:last], at, source)) or held_runs
                line, carry = at + carry.count(b"\n", keep, last), carry[last:]
            continue
        if pending is not None:
            node = _node(pending, held + carry)
            node.cut = not _ends_whole(held + carry, node.quantized)
            yield node
        yield from held_runs or _tokens(carry, line, source)
        if not seen_header:
            if not buf.strip():
                raise DumpError(source, None, "empty input: no llama.cpp tensor dump")
            raise _no_dump(buf, line, source)
        return


def _no_dump(text: bytes, line: int, source: str) -> DumpError:
    """A log without a tensor header: llama.cpp's own error lines when it printed any (it stopped before computing:
    a refused option, a model it could not load), at the line of the first; else how to make a dump. text: the
    log's last block, which starts on `line`."""
    from .llama_log import error_lines

    lines = text.decode("utf-8", "replace").split("\n")
    said = error_lines(lines)
    if said:
        first = next(k for k, ln in enumerate(lines) if ln.rstrip().endswith(said[0].removeprefix("E ")))
        return DumpError(source, line + first, "no tensor dump: llama.cpp stopped before computing; it said: "
                                               + " | ".join(said))
    return DumpError(source, None, "no tensor dump found (no 'common_debug_cb_eval:' or 'ggml_debug:' header lines); "
                                   "run llama-eval-callback and pipe its output with 2>&1")


def _print_end(text: bytes, end: int, pending: tuple) -> int:
    """How much of a node's text is its print: up to its last `sum = ` line (one per i3 block), all of text[:end]
    when fewer are there (a print beyond GAP is damage, and stays so), nothing for a quantized node."""
    node = _node(pending, b"")
    if node.quantized:
        return 0
    for k, m in enumerate(_SUM_LINE.finditer(text, 0, end), 1):
        if k >= node.ne[3]:
            return m.end()
    return end


def _long_line(buf: bytes, end: int) -> int | None:
    """Where the first line of buf[:end] longer than MAX_LINE starts (buf starts at a line start), or None: from a
    line start, the last newline within MAX_LINE + 1 bytes is the next place to look from, so the search takes a few
    finds per mebibyte, in C."""
    p = 0
    while end - p > MAX_LINE:
        q = buf.rfind(b"\n", p, p + MAX_LINE + 1)
        if q < 0:
            return p
        p = q + 1
    return None


def _lines_at(buf: bytes, end: int, starts: list[int], line: int) -> list[int]:
    """The line of each position in `starts` (sorted), the buffer's first byte being on `line`: one count of the
    newlines before each, for all of them at once."""
    if not starts:
        return []
    newlines = np.flatnonzero(np.frombuffer(buf, np.uint8, count=end) == 10)
    return (np.searchsorted(newlines, starts) + line).tolist()


def _node(pending: tuple, body: bytes) -> Node:
    name, type_, op, srcs, ne, line, body_line = pending
    return Node(name, type_, op, srcs, ne, line, body, body_line)


def _ends_whole(body: bytes, quantized: bool) -> bool:
    """A printed node ends with its `sum = ` line; quantized ones print no body at all."""
    tail = body.rstrip()
    if not tail:
        return quantized
    last = tail[tail.rfind(b"\n") + 1 :]
    return last.strip().startswith(b"sum = ")


def _log_find(text: bytes, key: bytes) -> int:
    """Where `key` first stands in a log line (one that does not start with a blank: printed rows always do, so
    the same words inside a damaged row start no run), or -1."""
    at = text.find(key)
    while at >= 0:
        start = text.rfind(b"\n", 0, at) + 1
        if text[start:start + 1] not in (b" ", b"\t"):
            return at
        at = text.find(key, at + 1)
    return at


def _tokens(text: bytes, line: int, source: str) -> Iterator[RunStart]:
    """A run starts where llama.cpp's start-up log sits between nodes: `system_info:` (both formats) and, today,
    `number of input tokens = N` followed by one id per line. One RunStart per gap between nodes."""
    at_info = _log_find(text, b"system_info:")
    at = _log_find(text, b"number of input tokens")
    kv = _log_find(text, b"llama_model_loader: - kv")
    header = None
    if kv >= 0:
        header = parse_log_header(text[kv:].decode("utf-8", "replace"), line + text.count(b"\n", 0, kv))
    if at < 0:
        if at_info >= 0:
            yield RunStart(line + text.count(b"\n", 0, at_info), None, header)
        return
    m = _TOKENS.match(text, at)
    ids: list[int] = []
    if m:
        p = m.end()
        for _ in range(int(m.group(1))):
            tm = _TOKEN_ID.match(text, p)
            if not tm:
                break
            ids.append(int(tm.group(1)))
            p = tm.end()
    yield RunStart(line + text.count(b"\n", 0, at), tuple(ids), header)
