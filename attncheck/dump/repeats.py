"""Evaluations that repeat one already read, made from it without the node-by-node reading of records.py and
graph.py.

With `-ub N`, and token by token after the prompt, llama.cpp prints the same graph again and again: the same header
lines (n_kv is padded, so kq's shape stays), the same print layout, only the numbers differ. An evaluation whose
header lines are byte for byte those of one read before, and whose text is that one's with only digits, signs and
blanks changed, has that one's nodes, lines, sources and sites; only its numbers are its own. This module keeps such
a `Template` per header text, learned from a part of the dump read the slow way that held nothing odd (no note, no cut,
no error, no run start but in log text before its first header line or after its last print: `framed`), and makes a
part's evaluations from templates when every one of them has one. The part is cut where the templates' header lines
are (`foreseen`: on the lines the templates have them on), else by searching it for headers as the slow way does
(`cut`). Anything else in a part, however small, sends the whole part the slow way, which reads it as before: what
is read here is exactly what the slow way would read (tests/test_repeats.py). An evaluation made here hands its
nodes back once read (`release`), for the next of its template to take.
"""
from __future__ import annotations

import re
from collections import OrderedDict
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from .attention import find_sites
from .graph import Evaluation, graph_start
from .parts import Part
from .names import COPIES, told_apart
from .records import (GAP, MAX_HEADER, Node, RunStart, _HEADER_AT, _PRINTED_LINE, _ends_whole, _long_line,
                      _parse_header_at, _tokens)
from .sample import fits, in_layout, prints_plainly

# deleted from an evaluation's text before it is compared: what differs between two prints of one layout (digits,
# signs, blanks); '.', letters (nan, inf, log lines), brackets and newlines are kept, so lines and layout must agree
_VARIES = b"0123456789- \t\r"
_PREFIX = b"_debug"  # in every header's prefix (records.py's _HEADER_AT): once per header line of a template's text
_LOG_LINE = re.compile(rb"\n\S")  # a line that starts with neither a blank nor a newline: log text, not a printed row
_UNLINKED = (None, None)
KEEP = 16  # templates a process keeps (the most recently used); each holds about a quarter of its evaluation's text
LARGEST = 16 << 20  # bytes: a larger part is read in chunks the slow way, never held whole


class Template(NamedTuple):
    """What an evaluation's header lines and layout fix: per node its parsed header, its line after the evaluation's
    first and its sources (indices into the evaluation's nodes, -1 for none); the text's skeleton; the nodes whose
    print the skeleton does not vouch for (quantized, ne3 > 1, non-finite: `fits` reads those); the newlines of
    the whole evaluation's text; its layers' kinds of attention."""

    headers: tuple  # (name, type, op, srcs, ne) per node
    lines: tuple[int, ...]
    inputs: tuple[tuple[int, int], ...]
    skeleton: bytes  # the evaluation's text without digits, signs and blanks
    special: tuple[int, ...]
    newlines: int
    kinds: dict[int, str]  # Evaluation.layer_kinds(): names, ops and sites fix it (with no copy told apart)
    told: tuple[tuple[int, tuple[int, ...]], ...]  # copies whose source is told apart by printed values: candidates
    key: bytes  # its header lines joined (what it is kept under)
    start: tuple  # graph.graph_start of its first node: where `cut` would cut before it
    heads: tuple[bytes, ...]  # each header line as printed, its newline included (a key line and its newline)
    plain: tuple[bool, ...]  # per node: its body a clean print of its ne but for the numbers (Node.plain)


class _Span(NamedTuple):
    """One evaluation's text within a part, its header lines joined (the key), its bodies and parsed headers; the
    part's last also the log text after its last node's print, which reading gives that node as its body's end."""

    text: bytes
    key: bytes
    bodies: list[bytes]
    headers: list
    tail: bytes = b""


class _Frame(NamedTuple):
    """Where a part's evaluations lie in its text: between the log lines before its first header line (the dump's
    start-up log) and those after its last node's print (the next run's start-up log), and the runs these start."""

    lead: int  # bytes before the first header line
    tail: int  # where the log after the last node's print starts (the text's length when none follows)
    runs: list[RunStart]  # those the log before the first header line starts


_templates: OrderedDict[bytes, Template] = OrderedDict()
# per template, the nodes and sites of its last evaluation, handed back by their reader (`release`): the next
# evaluation of that template takes them instead of making and linking its nodes and finding its sites again
_spare: dict[bytes, tuple[Template, list[Node], tuple]] = {}
SPARE = 2  # evaluations whose nodes a process keeps for reuse (each holds its bodies until then)


def cut(text: bytes) -> list[_Span] | None:
    """The part's evaluations as the slow way would cut them (a new one where the first node's name, op and first
    source recur), or None when the part is not headers and bodies alone from its first byte (log lines before the
    first header, a header that does not parse)."""
    ms = list(_HEADER_AT.finditer(text))
    if not ms:
        return None
    starts = [text.rfind(b"\n", 0, m.start()) + 1 for m in ms]
    if starts[0] != 0:
        return None
    headers = []
    for m in ms:
        rest = m.group(1)
        parsed = _parse_header_at(rest) if len(rest) <= MAX_HEADER else None
        if parsed is None:
            return None
        headers.append(parsed)
    first = graph_start(headers[0][0], headers[0][2], headers[0][3][0])
    cuts = [i for i, (name, _, op, (s0, _), _) in enumerate(headers) if graph_start(name, op, s0) == first]
    ends = [m.end() + 1 for m in ms]  # a body starts after its header's newline
    starts.append(len(text))
    out = []
    for a, b in zip(cuts, cuts[1:] + [len(ms)]):
        key = b"\n".join([text[starts[i]:ms[i].end()] for i in range(a, b)])
        bodies = [text[ends[i]:starts[i + 1]] for i in range(a, b)]
        out.append(_Span(text[starts[a]:starts[b]], key, bodies, headers[a:b]))
    return out


def line_starts(text: bytes) -> np.ndarray:
    """[lines + 1] where each line of the text starts, and where the text ends after its last newline."""
    return np.concatenate(([0], np.flatnonzero(np.frombuffer(text, np.uint8) == 10) + 1))


def foreseen(text: bytes, starts: np.ndarray | None = None) -> list[_Span] | None:
    """The part's evaluations, cut without searching the text for headers: each span a template's, whose header
    lines are byte for byte on the lines the template has them on, counted from the span's first line, and all
    spans of one graph start, as `cut` cuts. `evaluations` then asks each span's skeleton to be its template's;
    then `_PREFIX` is in those header lines alone (`template` counted it in the skeleton), the slow way finds these
    headers and no other, and `cut` would have cut the same spans. None when a line is not a template's header line
    where one would be (`cut` then searches). starts: line_starts(text), when the caller has it."""
    if not _templates:
        return None
    if starts is None:
        starts = line_starts(text)
    out: list[_Span] = []
    k, at, start = 0, 0, None  # the span's first line and byte
    while at < len(text):
        for t in reversed(_templates.values()):  # the most recently used first
            if start in (None, t.start) and k + t.newlines < len(starts) and text.startswith(t.heads[0], at):
                where = (starts[_rows(t.lines) + k]).tolist()  # each header line's first byte
                if all(map(text.startswith, t.heads, where)):
                    break
        else:
            return None
        end = int(starts[k + t.newlines])
        bodies = [text[a + len(h):b] for h, a, b in zip(t.heads, where, where[1:] + [end])]
        out.append(_Span(text[at:end], t.key, bodies, list(t.headers)))
        k, at, start = k + t.newlines, end, t.start
    return out


@lru_cache(maxsize=KEEP)
def _rows(lines: tuple[int, ...]) -> np.ndarray:
    """A template's header lines as an array, made once."""
    return np.array(lines, np.int64)


def framed(text: bytes, first_line: int, source: str) -> _Frame | None:
    """The log text around a part's evaluations, and the runs the log before them starts, as reading finds them
    (records.py's `_tokens`, asked of the text before the first header line). Neither side holds `_PREFIX`, so
    reading finds no header there. None where reading would note something before the first header (printed rows),
    or refuse the dump's first bytes (a GGUF file's, a byte-order mark). Log text at the dump's end `evaluations`
    leaves to reading, which calls the last node cut there."""
    first = text.find(_PREFIX)
    if first < 0 or (first_line == 1 and text.startswith((b"GGUF", b"\xef\xbb\xbf"))):
        return None
    lead = text.rfind(b"\n", 0, first) + 1
    eol = text.find(b"\n", text.rfind(_PREFIX))
    log = _LOG_LINE.search(text, eol) if eol >= 0 else None
    tail = log.start() + 1 if log is not None else len(text)
    if lead and _PRINTED_LINE.search(text, 0, lead):
        return None
    return _Frame(lead, tail, list(_tokens(text[:lead], first_line, source)) if lead else [])


def made(part: Part, source: str) -> tuple[list[Evaluation] | None, list[_Span | None] | None, list[RunStart]]:
    """A part's evaluations made from templates, and the runs its log text starts; else, when the part is headers
    and bodies alone between log text (`framed`), its spans whose template is not known yet (None for the others),
    for `template` to learn from as the part is read, and the runs that log text starts (reading must find those
    and no others for the part to be learned from). Not a part the slow way would refuse a line of, or note a gap in:
    that is read node by node."""
    if part.stream is not None or part.size > LARGEST:
        return None, None, []
    text = part.text()
    if not text or len(text) > GAP or _long_line(text, len(text)) is not None:
        return None, None, []
    frame = framed(text, part.first_line, source)
    if frame is None:
        return None, None, []
    core, tail = text[frame.lead:frame.tail], text[frame.tail:]
    lead = text.count(b"\n", 0, frame.lead)
    line = part.first_line + lead
    starts = line_starts(core)
    if part.newlines is not None:  # the cut, waiting to number the next part's lines, need not count them again
        part.newlines.append(lead + len(starts) - 1 + tail.count(b"\n"))
    spans = _ending(foreseen(core, starts), tail)
    evs = evaluations(spans, line, part.final, frame.runs) if spans is not None else None
    if evs is None:
        spans = _ending(cut(core), tail)
        if spans is None:
            return None, None, []
        evs = evaluations(spans, line, part.final, frame.runs)
    if evs is not None:  # a run the log after the print starts: reading asks the last node's whole body for it
        last = evs[-1].nodes[-1]
        return evs, None, frame.runs + (list(_tokens(last.body, last.body_line, source)) if tail else [])
    after = list(_tokens(tail, line + len(starts) - 1, source)) if tail else []
    return None, [None if s.key in _templates else s for s in spans], frame.runs + after


def _ending(spans: list[_Span] | None, tail: bytes) -> list[_Span] | None:
    """The spans, the last with the log text after its print."""
    if spans and tail:
        spans[-1] = spans[-1]._replace(tail=tail)
    return spans


def evaluations(spans: list[_Span], first_line: int, final: bool, runs: list[RunStart]) -> list[Evaluation] | None:
    """A part's evaluations (cut by `cut` or `foreseen`; the first starts on first_line, after log text that started
    `runs`; final: they end the dump) made from their templates, as a Dump of the part would read them; None when
    any has none, or differs from it but in numbers. One compare of the whole text's skeleton vouches for each body:
    the header lines are the template's, and `_PREFIX` is in each of them once and in no body of the template, so
    where the skeletons are equal each header's `_PREFIX` falls at the same place in both, and so does each body's
    skeleton."""
    tpls = []
    for s in spans:
        t = _templates.get(s.key)
        if t is None or s.text.translate(None, _VARIES) != t.skeleton:
            return None
        tpls.append(t)
    out: list[Evaluation] = []
    line, n_past = first_line, 0
    for k, (s, t) in enumerate(zip(spans, tpls)):
        _templates.move_to_end(s.key)
        spare = _spare.pop(s.key, None)
        if spare is not None and spare[0] is not t:  # handed back under a template learned anew since
            spare = None
        if spare is None:
            nodes = [Node(*h, line + at, body, line + at + 1, False, _UNLINKED, 0, plain)
                     for h, at, body, plain in zip(t.headers, t.lines, s.bodies, t.plain)]
        else:  # the nodes of this template's last evaluation, which its reader handed back (`release`)
            _, nodes, found = spare
            for node, at, body in zip(nodes, t.lines, s.bodies):
                at += line
                node.line = at
                node.body = body
                node.body_line = at + 1
            nodes[-1].plain = t.plain[-1]  # the others are the template's still: only a tail (below) changes one
        if s.tail:  # log text after the print: reading gives it to the last node, and notes it unless the print fits
            nodes[-1].body += s.tail
            nodes[-1].plain = False
            if not fits(nodes[-1]):
                return None
        if spare is None:
            for node, (i0, i1) in zip(nodes, t.inputs):
                node.inputs = (None if i0 < 0 else nodes[i0], None if i1 < 0 else nodes[i1])
            for i, told in t.told:  # as names.py tells them apart, by this print's values
                nodes[i].inputs = (told_apart(nodes[i], [nodes[c] for c in told]), nodes[i].inputs[1])
            found = find_sites(nodes)
        if final and k == len(spans) - 1 and not _ends_whole(nodes[-1].body, nodes[-1].quantized):
            return None  # the dump ends inside its last node: the slow way says so
        if not all(fits(nodes[i]) for i in t.special):
            return None
        # a copy told apart anew may lie on a chain find_sites walks: then the kinds are found again too
        ev = Evaluation(k, 0, k, n_past, runs[-1].tokens if runs else None, len(runs), nodes,
                        kinds=None if t.told else t.kinds, template=None if t.told else s.key)
        ev.sites, ev.flash, ev.other_softmax = found
        T = ev.T
        n_past = None if T is None or n_past is None else n_past + T
        line += t.newlines
        out.append(ev)
    return out


def release(ev: Evaluation) -> None:
    """Its reader is done with an evaluation: one made from a template hands its nodes and sites back, for the next
    evaluation of that template to take with its own lines and bodies (a template whose copies are told apart by
    their values, whose links differ from print to print, keeps none). What a reader keeps of an evaluation must
    hold no node (check/gather.py's EvalData, dump/listing.py's Listed)."""
    if ev.template is None or ev.template not in _templates:
        ev.nodes.clear()
        return
    _spare[ev.template] = (_templates[ev.template], ev.nodes, (ev.sites, ev.flash, ev.other_softmax))
    while len(_spare) > SPARE:
        _spare.pop(next(iter(_spare)))
    ev.nodes, ev.sites, ev.flash, ev.other_softmax = [], [], [], []


def template(s: _Span | None, ev: Evaluation) -> Template | None:
    """The template of an evaluation read the slow way (its nodes still held) from the span `made` gave it, when
    the two agree node for node and nothing in it depends on more than its header lines and layout; else None."""
    nodes = ev.nodes
    if s is None or len(nodes) != len(s.bodies) or ev.damaged or ev.lost:
        return None
    at = {id(n): i for i, n in enumerate(nodes)}
    seen: dict[tuple, list[int]] = {}  # names.py's by_key, as indices
    inputs, special, lines, told, plain, line = [], [], [], [], [], nodes[0].line
    for i, (n, body, h) in enumerate(zip(nodes, s.bodies, s.headers)):
        as_read = body if i < len(nodes) - 1 else body + s.tail  # the log after the last print is its node's
        if n.body != as_read or (n.name, n.type, n.op, n.srcs, n.ne) != h or n.cut or n.lost or n.line != line:
            return None
        found = seen.get((n.srcs[0].name, n.srcs[0].ne), []) if n.srcs[0] is not None else []
        if n.op in COPIES and len(found) > 1:  # told apart by printed values (names.py): again at each print
            told.append((i, tuple(found)))
        seen.setdefault((n.name, n.ne), []).append(i)
        if any(x is not None and id(x) not in at for x in n.inputs):
            return None
        inputs.append(tuple(-1 if x is None else at[id(x)] for x in n.inputs))
        if n.quantized or n.ne[3] > 1 or not prints_plainly(n):
            special.append(i)
        # where a print's skeleton is its ne's, so is a repeat's: the skeletons differ in no more than _VARIES deletes
        plain.append(not n.quantized and in_layout(body, n.ne))
        lines.append(line - nodes[0].line)
        line += 1 + body.count(b"\n")  # its header line, then its body
    skeleton = s.text.translate(None, _VARIES)
    if skeleton.count(_PREFIX) != len(nodes):  # one in each header line and none in a body: see `evaluations`
        return None
    h = s.headers[0]
    heads = tuple(x + b"\n" for x in s.key.split(b"\n"))  # `cut`'s key lines end where their newline is
    return Template(tuple(s.headers), tuple(lines), tuple(inputs), skeleton, tuple(special), line - nodes[0].line,
                    ev.layer_kinds(), tuple(told), s.key, graph_start(h[0], h[2], h[3][0]), heads, tuple(plain))


def keep(spans: list[_Span | None], learned: list[Template | None]) -> None:
    """Keep the templates of a part read the slow way that held nothing odd (the caller says so)."""
    for s, t in zip(spans, learned):
        if s is not None and t is not None:
            _templates[s.key] = t
    while len(_templates) > KEEP:
        _templates.popitem(last=False)
