"""Evaluations that repeat one already read, made from it without the node-by-node reading of records.py and
graph.py.

With `-ub N`, and token by token after the prompt, llama.cpp prints the same graph again and again: the same header
lines (n_kv is padded, so kq's shape stays), the same print layout, only the numbers differ. An evaluation whose
header lines are byte for byte those of one read before, and whose bodies are that one's with only digits, signs and
blanks changed, has that one's nodes, lines, sources and sites; only its numbers are its own. This module keeps such
a `Template` per header text, learned from a part of the dump read the slow way that held nothing odd (no note, no run
start, no cut, no error), and makes a part's evaluations from templates when every one of them has one. Anything else
in a part, however small, sends the whole part the slow way, which reads it as before: what is read here is exactly
what the slow way would read (tests/test_repeats.py).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Iterator, NamedTuple

from .attention import find_sites
from .graph import Evaluation, graph_start
from .parts import Part
from .names import COPIES, told_apart
from .records import GAP, MAX_HEADER, Node, _HEADER_AT, _ends_whole, _long_line, _parse_header_at
from .sample import fits, prints_plainly

# deleted from bodies before they are compared: what differs between two prints of one layout (digits, signs,
# blanks); '.', letters (nan, inf, log lines), brackets and newlines are kept, so lines and layout must agree
_VARIES = b"0123456789- \t\r"
_SEP = b"\x01"  # between bodies: the compare then holds body by body (one more \x01 in a body changes the count)
GROUP = 64  # bodies compared at a time: what is translated for a compare stays small
KEEP = 16  # templates a process keeps (the most recently used); each holds about a quarter of its evaluation's text
LARGEST = 16 << 20  # bytes: a larger part is read in chunks the slow way, never held whole


class Template(NamedTuple):
    """What an evaluation's header lines and layout fix: per node its parsed header, its line after the evaluation's
    first and its sources (indices into the evaluation's nodes, -1 for none); the bodies' skeleton; the nodes whose
    print the skeleton does not vouch for (quantized, ne3 > 1, non-finite: `fits` reads those); the newlines of
    the whole evaluation's text; its layers' kinds of attention."""

    headers: tuple  # (name, type, op, srcs, ne) per node
    lines: tuple[int, ...]
    inputs: tuple[tuple[int, int], ...]
    skeleton: tuple[bytes, ...]  # per GROUP bodies
    special: tuple[int, ...]
    newlines: int
    kinds: dict[int, str]  # Evaluation.layer_kinds(): names, ops and sites fix it (with no copy told apart)
    told: tuple[tuple[int, tuple[int, ...]], ...]  # copies whose source is told apart by printed values: candidates


class _Span(NamedTuple):
    """One evaluation's text within a part: its header lines joined (the key), bodies, parsed headers."""

    key: bytes
    bodies: list[bytes]
    headers: list


_templates: OrderedDict[bytes, Template] = OrderedDict()


def cut(text: bytes) -> list[_Span] | None:
    """The part's evaluations as the slow way would cut them (a new one where the first node's name, op and first
    source recur), or None when the part is not headers and bodies alone from its first byte (log lines before the
    first header, a header that does not parse, a line the slow way refuses)."""
    if not text or len(text) > GAP or _long_line(text, len(text)) is not None:
        return None
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
        out.append(_Span(key, bodies, headers[a:b]))
    return out


def made(part: Part) -> tuple[list[Evaluation] | None, list[_Span | None] | None]:
    """A part's evaluations made from templates; else, when the part is headers and bodies alone, its spans whose
    template is not known yet (None for the others), for `template` to learn from as the part is read."""
    if part.stream is not None or part.size > LARGEST:
        return None, None
    spans = cut(part.text())
    if spans is None:
        return None, None
    evs = evaluations(spans, part.first_line, part.final)
    if evs is not None:
        return evs, None
    return None, [None if s.key in _templates else s for s in spans]


def _skeleton(bodies: list[bytes]) -> Iterator[bytes]:
    """The bodies without digits, signs and blanks, GROUP of them at a time (made as they are asked for)."""
    return (_SEP.join(bodies[g:g + GROUP]).translate(None, _VARIES) for g in range(0, len(bodies), GROUP))


def evaluations(spans: list[_Span], first_line: int, final: bool) -> list[Evaluation] | None:
    """A part's evaluations (cut by `cut`; the part starts on first_line; final: it ends the dump) made from their
    templates, as a Dump of the part would read them; None when any has none, or differs from it but in numbers."""
    tpls = []
    for s in spans:
        t = _templates.get(s.key)
        if t is None or not all(a == b for a, b in zip(_skeleton(s.bodies), t.skeleton)):  # stops at the first
            return None
        tpls.append(t)
    out: list[Evaluation] = []
    line, n_past = first_line, 0
    for k, (s, t) in enumerate(zip(spans, tpls)):
        _templates.move_to_end(s.key)
        nodes = [Node(*h, line + at, body, line + at + 1) for h, at, body in zip(t.headers, t.lines, s.bodies)]
        for node, (i0, i1) in zip(nodes, t.inputs):
            node.inputs = (None if i0 < 0 else nodes[i0], None if i1 < 0 else nodes[i1])
        for i, found in t.told:  # as names.py tells them apart, by this print's values
            nodes[i].inputs = (told_apart(nodes[i], [nodes[c] for c in found]), nodes[i].inputs[1])
        if final and k == len(spans) - 1 and not _ends_whole(nodes[-1].body, nodes[-1].quantized):
            return None  # the dump ends inside its last node: the slow way says so
        if not all(fits(nodes[i]) for i in t.special):
            return None
        # a copy told apart anew may lie on a chain find_sites walks: then the kinds are found again too
        ev = Evaluation(k, 0, k, n_past, None, 0, nodes, kinds=None if t.told else t.kinds)
        ev.sites, ev.flash, ev.other_softmax = find_sites(nodes)
        T = ev.T
        n_past = None if T is None or n_past is None else n_past + T
        line += t.newlines
        out.append(ev)
    return out


def template(s: _Span | None, ev: Evaluation) -> Template | None:
    """The template of an evaluation read the slow way (its nodes still held) from the span `made` gave it, when
    the two agree node for node and nothing in it depends on more than its header lines and layout; else None."""
    nodes = ev.nodes
    if s is None or len(nodes) != len(s.bodies) or ev.damaged or ev.lost or any(_SEP in b for b in s.bodies):
        return None
    at = {id(n): i for i, n in enumerate(nodes)}
    seen: dict[tuple, list[int]] = {}  # names.py's by_key, as indices
    inputs, special, lines, told, line = [], [], [], [], nodes[0].line
    for i, (n, body, h) in enumerate(zip(nodes, s.bodies, s.headers)):
        if n.body != body or (n.name, n.type, n.op, n.srcs, n.ne) != h or n.cut or n.lost or n.line != line:
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
        lines.append(line - nodes[0].line)
        line += 1 + body.count(b"\n")  # its header line, then its body
    return Template(tuple(s.headers), tuple(lines), tuple(inputs), tuple(_skeleton(s.bodies)), tuple(special),
                    line - nodes[0].line, ev.layer_kinds(), tuple(told))


def keep(spans: list[_Span | None], learned: list[Template | None]) -> None:
    """Keep the templates of a part read the slow way that held nothing odd (the caller says so)."""
    for s, t in zip(spans, learned):
        if s is not None and t is not None:
            _templates[s.key] = t
    while len(_templates) > KEEP:
        _templates.popitem(last=False)
