"""Property tests: whatever bytes reach attncheck, it ends in a verdict, never a crash, a hang or a silent pass.

Every input here is a real llama.cpp dump from fixtures/, damaged the way logs get damaged: cut short, lines lost,
repeated or swapped, numbers garbled, headers with a wrong ne or an odd type, binary bytes, CRLF line ends, a BOM,
two logs concatenated. The library is called in-process (fast); a few cases run the real command line.

The contract checked on every example:
- the outcome is exit 0, 1 or 3 with a report, or a DumpError (exit 2) whose message is one line naming the input
  and, when the input holds a dump, a line; any other exception is a bug;
- the report renders and its JSON is valid JSON (no NaN or Infinity);
- a printed weight or kqv element changed beyond its bound, or a printed nan/inf, never passes.

No example has a time limit (hypothesis' deadline is off, and timing belongs in `make bench`): the work is bounded
instead, by the size of the fixtures and by the damage each strategy can draw (a header promising 10⁹ rows is
tested on its own, below). The value moves are drawn from every evaluation, query and kind of row (whole rows,
rows checked by weight ratios, masked slots), and scaled to the element's bound as this file computes it from
docs/numerics.md §2 (tests/formulas.py): 2.5× to 10× of it, so a bound 10× too wide lets some of them pass.
"""
from __future__ import annotations

import io
import json
import math
import re
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from rich.console import Console

import attncheck
from attncheck.present.render import render
from conftest import DUMPS, FIXTURES
from conftest import attncheck as cli
from formulas import PRINT, STEP, pv_bound, ratio_bound, softmax_bound

CHECKED = sorted(n for n, code in DUMPS.items() if code == 0)  # dumps with attention sites that pass
ALL = sorted(DUMPS)


def props(n: int):
    """Repeatable in CI: derandomized, no example database, no per-example deadline (CI machines are noisy)."""
    return settings(max_examples=n, derandomize=True, database=None, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# --- running attncheck ---------------------------------------------------------------------------------------

@dataclass
class Outcome:
    code: int
    report: attncheck.Report | None = None
    error: attncheck.DumpError | None = None

    @property
    def warned(self) -> bool:
        return bool(self.report and self.report.warnings)

    def __repr__(self) -> str:
        if self.error is not None:
            return f"Outcome(2, {self.error})"
        return f"Outcome({self.code}, warnings={self.report.warnings[:3]})"


def check(data: bytes, **options) -> Outcome:
    """attncheck.verify on bytes, with the contract every outcome must meet. DumpError is exit 2."""
    try:
        report = attncheck.verify(io.BytesIO(data), **options)
    except attncheck.DumpError as e:
        message = str(e)
        assert message.isprintable(), f"control characters in the error message: {message!r}"
        assert message.startswith("<stream>"), message
        if any(_HEADER.match(line) for line in data.splitlines()):  # it holds a dump: the message names a line
            assert e.line is not None and 1 <= e.line <= data.count(b"\n") + 1, message
        return Outcome(2, error=e)
    assert report.exit_code in (0, 1, 3)
    doc = report.to_dict()
    json.dumps(doc, allow_nan=False)  # the JSON is JSON: no NaN or Infinity tokens
    render(report, Console(file=io.StringIO(), width=120))
    for w in report.warnings:
        assert w.isprintable() and re.match(r"<stream>:\d+: ", w), f"a warning not on one line: {w!r}"
    return Outcome(report.exit_code, report=report)


# --- a dump as lines, with the nodes attention checks need -----------------------------------------------------

_HEADER = re.compile(rb"^(?:common_debug_cb_eval|ggml_debug): +(.*?) = \(([^()\s]+)\) *([A-Z0-9_]+)\((.*)\) = "
                     rb"\{(\d+), (\d+), (\d+), (\d+)\}\s*$")
_VALUE = re.compile(rb"-?(?:\d+\.\d+|nan|inf)")


def printed(n: int) -> list[int]:
    """The logical indices llama.cpp prints along a dimension of n entries (first and last 3 of a long one)."""
    return list(range(n)) if n <= 6 else [0, 1, 2, n - 3, n - 2, n - 1]


@dataclass
class NodeText:
    name: str
    op: str
    srcs: tuple[str | None, str | None]
    ne: tuple[int, int, int, int]
    start: int  # 0-based line index of the header
    end: int  # 0-based line index after the body

    def rows(self, lines: list[bytes]) -> list[int]:
        """Line indices of the printed rows, in print order (i3, i2, i1)."""
        return [i for i in range(self.start + 1, self.end)
                if lines[i][:1].isspace() and lines[i].lstrip().startswith(b"[") and _VALUE.search(lines[i])]

    def row(self, lines: list[bytes], i2: int, i1: int) -> int:
        p2, p1 = printed(self.ne[2]), printed(self.ne[1])
        return self.rows(lines)[p2.index(i2) * len(p1) + p1.index(i1)]


def _sources(text: bytes) -> tuple[str | None, str | None]:
    text = text.decode("latin-1")[:-1]  # the doubled `}}`
    cut = text.find("}, ")
    parts = (text[: cut + 1], text[cut + 3:]) if cut >= 0 else (text, "")
    return tuple(p[: p.rfind("{")].strip() if "{" in p else None for p in parts)  # type: ignore[return-value]


@dataclass
class Site:
    scores: NodeText | None
    softmax: NodeText
    kqv: NodeText | None
    v: NodeText | None
    n_past: int  # tokens of the earlier evaluations (the fixtures hold one llama.cpp run each)

    @property
    def scale(self) -> float:
        return 1 / math.sqrt(self.kqv.ne[0])  # 1/sqrt(D_h): every fixture is gpt2 or llama

    def kind(self, q: int) -> str:
        """'full': every visible slot of query q (slots 0..n_past + q) printed; else 'ratio'."""
        return "full" if set(range(self.n_past + q + 1)) <= set(printed(self.softmax.ne[0])) else "ratio"

    @property
    def nodes(self) -> list[NodeText]:
        return [n for n in (self.scores, self.softmax, self.kqv, self.v) if n is not None]


@dataclass
class Text:
    """A fixture as lines (newlines kept), its printed nodes and its attention sites."""

    name: str
    data: bytes
    lines: list[bytes]
    nodes: list[NodeText]
    sites: list[Site]

    @cached_property
    def needed(self) -> set[int]:
        """Line indices of the nodes some check reads: scores, weights, outputs and V view of every site."""
        return {i for s in self.sites for n in s.nodes for i in range(n.start, n.end)}

    def rows(self, *kinds: str) -> list[tuple[Site, int, int]]:
        """(site, head, query) of every printed weight row of every evaluation, of the given kinds (default all)."""
        return [(s, h, t) for s in self.sites for h in printed(s.softmax.ne[2]) for t in printed(s.softmax.ne[1])
                if not kinds or s.kind(t) in kinds]


@lru_cache(maxsize=None)
def text(name: str) -> Text:
    data = (FIXTURES / name).read_bytes()
    lines = data.splitlines(keepends=True)
    heads = [(i, m) for i, line in enumerate(lines) if (m := _HEADER.match(line))]
    nodes = []
    for k, (i, m) in enumerate(heads):
        end = heads[k + 1][0] if k + 1 < len(heads) else len(lines)
        nodes.append(NodeText(m[1].decode("latin-1").strip(), m[3].decode(), _sources(m[4]),
                              tuple(int(x) for x in m.group(5, 6, 7, 8)), i, end))  # type: ignore[arg-type]
    first = next((k for k, n in enumerate(nodes[1:], 1) if (n.name, n.op) == (nodes[0].name, nodes[0].op)),
                 len(nodes))

    def latest(before: int, name: str | None) -> NodeText | None:
        return next((n for n in reversed(nodes[:before]) if n.name == name), None)

    sites = []
    T_seen: dict[str, int] = {}  # per SOFT_MAX name, the T of its earlier evaluations
    for k, n in enumerate(nodes):
        if n.op != "SOFT_MAX":
            continue
        kqv_k = next((j for j in range(k + 1, len(nodes)) if nodes[j].op == "MUL_MAT" and nodes[j].srcs[1] == n.name),
                     None)
        kqv = nodes[kqv_k] if kqv_k is not None else None
        n_past = T_seen.get(n.name, 0)
        T_seen[n.name] = n_past + n.ne[1]
        sites.append(Site(latest(k, n.srcs[0]), n, kqv, latest(kqv_k, kqv.srcs[0]) if kqv else None, n_past))
        assert (k < first) == (n_past == 0)
    return Text(name, data, lines, nodes, sites)


def set_value(line: bytes, item: int, new: bytes) -> bytes:
    """Replace the item-th printed value of a row line by `new`, right-aligned in llama.cpp's 12 columns."""
    m = list(_VALUE.finditer(line))[item]
    start = max(line.rfind(b"[", 0, m.start()), line.rfind(b",", 0, m.start())) + 1
    return line[:start] + new.rjust(12) + line[m.end():]


def get_value(line: bytes, item: int) -> float:
    return float(list(_VALUE.finditer(line))[item].group())


# --- the clean dumps: the baseline every property compares with ---------------------------------------------------

@lru_cache(maxsize=None)
def clean(name: str) -> Outcome:
    return check(text(name).data)


def test_fixtures_are_what_the_properties_assume():
    for name in ALL:
        t = text(name)
        assert clean(name).code == DUMPS[name]
        assert len(t.sites) == clean(name).report.totals()["sites"], name
        for s in t.sites:
            assert s.scores is not None and s.kqv is not None and s.v is not None, name
            assert len(s.softmax.rows(t.lines)) == len(printed(s.softmax.ne[1])) * len(printed(s.softmax.ne[2]))
    # the rows the value properties change: 2 layers × 6 printed heads × the printed queries. gpt2-how-are's 2
    # queries see only printed slots; llama-gqa-long's 14 print queries 0, 1, 2 (whole) and 11, 12, 13 (ratio);
    # gpt2-ubatch2 (-ub 2, n_past 0, 2, 4) has queries at positions 0, 1, 2 (whole) and 3, 4, 5 (ratio)
    for name, full, ratio in (("gpt2-how-are.txt", 24, 0), ("llama-gqa-long.txt", 36, 36), ("gpt2-ubatch2.txt", 36, 36)):
        assert (len(text(name).rows("full")), len(text(name).rows("ratio"))) == (full, ratio), name
    assert {s.n_past for s in text("gpt2-ubatch2.txt").sites} == {0, 2, 4}


# --- 1. a changed value never passes --------------------------------------------------------------------------

def _variant(data: bytes, crlf: bool, bom: bool) -> bytes:
    if crlf:
        data = data.replace(b"\n", b"\r\n")
    return b"\xef\xbb\xbf" + data if bom else data


def _move(data, t, line: int, item: int, delta: float):
    """Check the dump with one printed value (item `item` of line `line`) moved by delta, rounded away from 0 to a
    printed step, with or without CRLF line ends and a BOM."""
    lines = list(t.lines)
    old = get_value(lines[line], item)
    delta = math.copysign(math.ceil(round(abs(delta) / STEP, 6)) * STEP, delta)
    lines[line] = set_value(lines[line], item, b"%.4f" % (old + delta))
    return check(_variant(b"".join(lines), data.draw(st.booleans(), "crlf"), data.draw(st.booleans(), "bom")))


def _factor(data) -> float:
    return data.draw(st.floats(2.5, 10.0), label="× bound") * data.draw(st.sampled_from([1, -1]), label="sign")


def values(t: Text, node: NodeText, i2: int, i1: int) -> list[float]:
    return [get_value(t.lines[node.row(t.lines, i2, i1)], k) for k in range(len(printed(node.ne[0])))]


@props(150)
@given(st.data())
def test_weight_changed_beyond_its_bound_fails(data):
    """A printed kq_soft_max weight of any evaluation and row, moved by 2.5× to 10× its bound computed here: exit 1,
    at that weight, by the check of its kind. A masked slot's bound is 0 (one printed step); a whole row's is
    5e-5 + p·(e^{2·scale·5e-5} − 1); a ratio row's, against its largest printed weight p_k (the reference, not
    moved here), 5e-5 + p_j·(5e-5/p_k + e^{2·scale·5e-5} − 1) with p_j = p_k·exp(scale·(s_j − s_k))."""
    t = text(data.draw(st.sampled_from(CHECKED), label="dump"))
    site, h, q = data.draw(st.sampled_from(t.rows()), label="row")
    slots = printed(site.softmax.ne[0])
    i = data.draw(st.integers(0, len(slots) - 1), label="printed slot")
    P, S = values(t, site.softmax, h, q), values(t, site.scores, h, q)
    visible = [k for k, j in enumerate(slots) if j <= site.n_past + q]
    if i not in visible:
        check_name, bound = "masked", 0.0
        delta = data.draw(st.integers(1, 10), label="steps") * STEP * data.draw(st.sampled_from([1, -1]), label="sign")
    elif site.kind(q) == "full":
        check_name, bound = "softmax", float(softmax_bound(P[i], site.scale))
        delta = _factor(data) * bound
    else:
        k = max(visible, key=lambda v: P[v])
        assume(i != k and P[k] > PRINT)  # the reference weight moves every prediction of its row, by little
        pred = P[k] * math.exp(site.scale * (S[i] - S[k]))
        check_name, bound = "softmax_ratio", float(ratio_bound(pred, P[k], site.scale))
        delta = _factor(data) * bound
        if P[i] + delta >= P[k] - STEP:
            delta = -abs(delta)  # the reference stays the row's largest printed weight
    out = _move(data, t, site.softmax.row(t.lines, h, q), i, delta)
    assert out.code == 1, (check_name, bound, delta, out)
    bad = [(r.check, f.at) for s in out.report.sites for r in s.results if r.line == site.softmax.start + 1
           for f in r.failures if f.at is not None]
    assert (check_name, (h, q, slots[i])) in [(c, (a.head, a.query, a.slot)) for c, a in bad], bad


@props(100)
@given(st.data())
def test_kqv_changed_beyond_its_bound_fails(data):
    """A printed kqv element of a whole row of any evaluation, moved by 2.5× to 10× its P·V bound computed here from
    the printed P and V (GQA: head h reads KV head h // (H / H_kv)): exit 1, reported at that element alone."""
    t = text(data.draw(st.sampled_from(CHECKED), label="dump"))
    site, h, q = data.draw(st.sampled_from(t.rows("full")), label="row")
    k = data.draw(st.integers(0, len(printed(site.kqv.ne[0])) - 1), label="printed dim")
    d = printed(site.kqv.ne[0])[k]
    H, H_kv = site.softmax.ne[2], site.v.ne[2]
    visible = [i for i, j in enumerate(printed(site.softmax.ne[0])) if j <= site.n_past + q]
    P = values(t, site.softmax, h, q)
    V = values(t, site.v, h // (H // H_kv), d)  # the V view {n_kv, D_h, H_kv}: a row per (KV head, dim)
    vtype = re.search(rb" = \((\w+)\)", t.lines[site.v.start]).group(1).decode()
    bound = pv_bound(np.array([P[i] for i in visible]), np.array([V[i] for i in visible]), vtype)
    out = _move(data, t, site.kqv.row(t.lines, h, q), k, _factor(data) * bound)
    assert out.code == 1, (bound, out)
    pv = [r for s in out.report.sites for r in s.results if r.check == "pv" and r.line == site.kqv.start + 1]
    assert [(f.at.head, f.at.query, f.at.dim) for r in pv for f in r.failures] == [(h, q, d)]


@props(60)
@given(st.data())
def test_nonfinite_values_fail_with_their_place(data):
    """`nan`, `-nan`, `inf`, `-inf` (what %12.4f prints for them) in scores, weights or outputs: exit 1 naming
    head, query and slot or dim, never a parse error."""
    t = text(data.draw(st.sampled_from(CHECKED), label="dump"))
    site = data.draw(st.sampled_from(t.sites), label="site")
    node = data.draw(st.sampled_from([site.scores, site.softmax, site.kqv]), label="node")
    h = data.draw(st.sampled_from(printed(node.ne[2])), label="head")
    q = data.draw(st.sampled_from(printed(node.ne[1])), label="query")
    k = data.draw(st.integers(0, len(printed(node.ne[0])) - 1), label="printed slot or dim")
    word = data.draw(st.sampled_from([b"nan", b"-nan", b"inf", b"-inf"]), label="value")
    i = node.row(t.lines, h, q)
    lines = list(t.lines)
    lines[i] = set_value(lines[i], k, word)
    out = check(b"".join(lines))
    assert out.code == 1, out
    finite = [r for s in out.report.sites for r in s.results if r.check == "finite" and r.line == node.start + 1]
    assert len(finite) == 1 and finite[0].failed == 1, finite
    at = finite[0].failures[0].at
    assert (at.head, at.query, at.slot if node is not site.kqv else at.dim) == (h, q, printed(node.ne[0])[k])


@props(40)
@given(st.data())
def test_swapped_rows_that_differ_fail(data):
    """Two printed rows of a fully printed part of kq_soft_max or kqv swapped, where they differ by >= 0.05."""
    t = text(data.draw(st.sampled_from(CHECKED), label="dump"))
    rows = t.rows("full")
    site, h1, q1 = data.draw(st.sampled_from(rows), label="row a")
    node = data.draw(st.sampled_from([site.softmax, site.kqv]), label="node")
    h2, q2 = data.draw(st.sampled_from([(h, q) for s, h, q in rows if s is site]), label="row b")
    a, b = node.row(t.lines, h1, q1), node.row(t.lines, h2, q2)
    va, vb = (list(map(float, _VALUE.findall(t.lines[i]))) for i in (a, b))
    assume(max(abs(x - y) for x, y in zip(va, vb)) >= 0.05)
    lines = list(t.lines)
    lines[a], lines[b] = lines[b], lines[a]
    assert check(b"".join(lines)).code == 1


# --- 2. damaged text: a verdict, an error with its line, or a warning; never a crash, a hang, a silent pass ----------

@props(120)
@given(st.data())
def test_truncated(data):
    """Cut anywhere: a checked node cut short is an error, a later cut a warning; truncation never fails a check."""
    t = text(data.draw(st.sampled_from(ALL), label="dump"))
    if data.draw(st.booleans(), label="at a line end"):
        cut = sum(map(len, t.lines[: data.draw(st.integers(0, len(t.lines)), label="lines kept")]))
    else:
        cut = data.draw(st.integers(0, len(t.data)), label="bytes kept")
    out = check(t.data[:cut])
    assert out.code != 1, out
    if out.code == 0:  # every site that survived is a whole site of the clean dump, and it passed
        assert out.report.totals()["sites"] <= clean(t.name).report.totals()["sites"]


_KINDS = ["delete", "duplicate"]


@props(200)
@given(st.data())
def test_lines_deleted_or_duplicated(data):
    """Lost or repeated lines: in a node a check reads, an error (exit 2) or a failed check; elsewhere at least a
    warning. (A lost SOFT_MAX header leaves no trace of its site but the node before it, which now holds two
    bodies: a warning.)"""
    t = text(data.draw(st.sampled_from(ALL), label="dump"))
    kind = data.draw(st.sampled_from(_KINDS), label="kind")
    near_needed = data.draw(st.booleans(), label="in a checked node")
    pool = sorted(t.needed) if near_needed and t.sites else range(len(t.lines))
    first = data.draw(st.sampled_from(pool), label="first line")
    n = data.draw(st.integers(1, 3), label="lines")
    last = min(first + n, len(t.lines)) - 1
    span = t.lines[first:last + 1]
    lines = list(t.lines)
    lines[first:last + 1] = [] if kind == "delete" else span * 2
    assume(any(line.strip() for line in span))  # blank lines carry nothing
    out = check(b"".join(lines))
    if out.code in (1, 2):
        return
    if _damages_checked(t, kind, first, last):
        pytest.fail(f"{kind} lines {first + 1}..{last + 1} in a checked node: {out}")
    assert out.warned or _only_log(span), f"{kind} lines {first + 1}..{last + 1}: no warning: {out}"


def _damages_checked(t: Text, kind: str, first: int, last: int) -> bool:
    """Whether the edit changes the text of a node a check reads (rather than adding a node of its own)."""
    if kind == "delete":  # a lost SOFT_MAX header leaves its site unrecognisable: a warning on the node before
        return any(i in t.needed for i in range(first, last + 1)) and \
            not any(first <= s.softmax.start <= last for s in t.sites)
    # the copy lands after line `last`: with a header in it, it is a node of its own (the node a check reads
    # is the later, intact copy); without one, it lengthens the node that holds line `last`
    return last in t.needed and not any(_HEADER.match(line) for line in t.lines[first:last + 1])


def _only_log(span: list[bytes]) -> bool:
    """Log lines (column 0, not a header) carry no tensor data: losing or repeating one is no damage to a node."""
    return all(not line[:1].isspace() and b"_debug" not in line for line in span)


@props(100)
@given(st.data())
def test_lines_swapped(data):
    """Two lines swapped, adjacent or anywhere: a verdict or an error with its line, never a crash."""
    t = text(data.draw(st.sampled_from(ALL), label="dump"))
    a = data.draw(st.integers(0, len(t.lines) - 1), label="line a")
    if data.draw(st.booleans(), label="adjacent"):
        b = min(a + 1, len(t.lines) - 1)
    else:
        b = data.draw(st.integers(0, len(t.lines) - 1), label="line b")
    lines = list(t.lines)
    lines[a], lines[b] = lines[b], lines[a]
    check(b"".join(lines))


_GARBLED = [b"0.12.34", b"1e309", b"12,34", b"1.0-2.0", b"0.5nan", b"infnan", b"--0.5", b"+0.5", b"1_000.0",
            b"0x1p-3", b".", b"-", b"", b"1.", b".5", b"NaN", b"Infinity", b"nan(ind)", b"1.#INF", b"\xd9\xa1.0",
            b"0.1 2", b"1e5", b"9" * 400 + b".0"]


def _a_number(word: bytes) -> bool:
    """One number, if not always as %12.4f prints it (`0`, `1.`, `.5`, `12.34567`): its value is what it says."""
    w = word.strip()
    if not re.fullmatch(rb"-?(?:[\d.]+|nan|inf)", w):
        return False
    try:
        return float(w) == float(w) or w.lstrip(b"-") == b"nan"
    except ValueError:
        return False


@props(200)
@given(st.data())
def test_garbled_number(data):
    """One printed number garbled: in a node a check reads, an error naming that line; elsewhere never a crash."""
    t = text(data.draw(st.sampled_from(ALL), label="dump"))
    near_needed = data.draw(st.booleans(), label="in a checked node") and t.sites
    rows = [i for n in (n for s in t.sites for n in s.nodes) for i in n.rows(t.lines)] if near_needed else \
        [i for n in t.nodes for i in n.rows(t.lines)]
    i = data.draw(st.sampled_from(rows), label="row line")
    k = data.draw(st.integers(0, len(_VALUE.findall(t.lines[i])) - 1), label="item")
    word = data.draw(st.sampled_from(_GARBLED) | st.binary(max_size=8)
                     | st.text("0123456789.-naif", min_size=1, max_size=9).map(str.encode), label="garbled")
    lines = list(t.lines)
    lines[i] = set_value(lines[i], k, word)
    assume(lines[i] != t.lines[i])
    out = check(b"".join(lines))
    if b"\n" in word or _a_number(word):
        return  # a newline moves the damage to the next line; a number is a value change (properties above)
    if not near_needed:  # a node no check parses: a warning when the print's shape changed
        if word.translate(None, b"0123456789.-naif \t\r") or \
                word.count(b".") + word.count(b"nan") + word.count(b"inf") != 1:
            assert out.code in (1, 2) or out.warned, f"line {i + 1} now {lines[i]!r}: {out}"
        return
    assert out.code == 2, f"line {i + 1} now {lines[i]!r}: {out}"
    assert out.error.line == i + 1, f"line {i + 1} now {lines[i]!r}: {out}"


@props(150)
@given(st.data())
def test_header_with_wrong_ne(data):
    """A header whose ne (its own, or a source's) is wrong: a verdict or an error with its line, never a hang."""
    t = text(data.draw(st.sampled_from(ALL), label="dump"))
    near_needed = data.draw(st.booleans(), label="a checked node") and t.sites
    node = data.draw(st.sampled_from([n for s in t.sites for n in s.nodes] if near_needed else t.nodes), label="node")
    dim = st.one_of(st.integers(0, 300), st.sampled_from([2**31, 2**62, 2**63, 10**9, 10**30, -1]))
    if data.draw(st.booleans(), label="one dim off"):
        ne = list(node.ne)
        ne[data.draw(st.integers(0, 3), label="dim")] = data.draw(dim, label="to")
    else:
        ne = data.draw(st.lists(dim, min_size=1, max_size=5), label="ne")
    which = data.draw(st.sampled_from([-1, -1, 0, 1]), label="own ne (-1) or a source's")
    line = t.lines[node.start]
    spans = [m.span(1) for m in re.finditer(rb"\{([-\d, ]*)\}", line)]
    assume(which < len(spans) - 1)
    a, b = spans[which]
    lines = list(t.lines)
    lines[node.start] = line[:a] + ", ".join(map(str, ne)).encode() + line[b:]
    out = check(b"".join(lines))
    if near_needed and which == -1 and out.code in (0, 3):
        # a wrong ne the printed body happens to fit (a long dimension prints 3 + 3 either way) leaves the values
        # the checks read as they were; a header that no longer parses is skipped, with a warning
        assert out.warned or out.report.totals() == clean(t.name).report.totals(), out


@pytest.mark.parametrize("ne", ["256, 1000000000, 12, 1", "256, 13, 12, 1000000000", "256, 13, 1000000000, 1",
                                "4611686018427387904, 13, 12, 1", "256, 13, 12, 9223372036854775808", "256, 13, 12, 0"])
def test_huge_ne_is_no_hang(ne):
    """A kq_soft_max header promising 10^9 queries, heads or blocks (the body prints 3 + 3 of a long dimension
    either way): an error or a warning, at once."""
    t = text("gpt2-long.txt")
    site = t.sites[0]
    lines = list(t.lines)
    lines[site.softmax.start] = re.sub(rb"\{[\d, ]+\}(\s*)$", b"{%s}\\1" % ne.encode(), lines[site.softmax.start])
    assert lines[site.softmax.start] != t.lines[site.softmax.start]
    out = check(b"".join(lines))
    assert out.code == 2 or out.warned, out


@props(80)
@given(st.data())
def test_odd_type(data):
    """A header's type replaced (another float type, a quantized type, an integer, nonsense): a verdict or an error."""
    t = text(data.draw(st.sampled_from(ALL), label="dump"))
    near_needed = data.draw(st.booleans(), label="a checked node") and t.sites
    node = data.draw(st.sampled_from([n for s in t.sites for n in s.nodes] if near_needed else t.nodes), label="node")
    typ = data.draw(st.sampled_from([b"f16", b"bf16", b"f32", b"f64", b"q8_0", b"q4_K", b"i32", b"i8", b"F32",
                                     b"xyz", b"f32 f16", b""])
                    | st.text("abcfiqK0123456789_", min_size=1, max_size=6).map(str.encode), label="type")
    lines = list(t.lines)
    lines[node.start] = re.sub(rb" = \([^()\s]+\)", b" = (" + typ + b")", lines[node.start], count=1)
    out = check(b"".join(lines))
    if near_needed and typ in (b"q8_0", b"q4_K", b"xyz") and any(node in (s.softmax, s.kqv) for s in t.sites):
        assert out.code == 2 and out.error.line == node.start + 1, out  # weights and outputs must be printed


@props(150)
@given(st.data())
def test_binary_bytes(data):
    """Random bytes inserted or written over anywhere: a verdict or an error with its line, never a crash."""
    t = text(data.draw(st.sampled_from(ALL), label="dump"))
    at = data.draw(st.integers(0, len(t.data)), label="offset")
    junk = data.draw(st.binary(min_size=1, max_size=64), label="bytes")
    over = data.draw(st.booleans(), label="overwrite")
    check(t.data[:at] + junk + t.data[at + (len(junk) if over else 0):])


@props(80)
@given(st.data())
def test_binary_bytes_in_a_checked_row(data):
    """Bytes inserted into a printed row of a node a check reads: anything but digits, '.', '-', 'nan', 'inf' and
    blanks breaks the print's shape there, and that is an error naming the line."""
    t = text(data.draw(st.sampled_from(CHECKED), label="dump"))
    i = data.draw(st.sampled_from([i for s in t.sites for n in s.nodes for i in n.rows(t.lines)]), label="row")
    at = data.draw(st.integers(1, len(t.lines[i].rstrip()) - 1), label="column")
    junk = data.draw(st.binary(min_size=1, max_size=16).filter(lambda b: b"\n" not in b), label="bytes")
    assume(junk.translate(None, b"0123456789.-naif \t\r"))
    lines = list(t.lines)
    lines[i] = lines[i][:at] + junk + lines[i][at:]
    out = check(b"".join(lines))
    assert out.code == 2 and out.error.line == i + 1, out


@props(30)
@given(st.binary(max_size=2000))
def test_arbitrary_bytes(junk):
    """Bytes that are no dump at all: exit 2 with one line, or (if a header happens to parse) a verdict."""
    check(junk)


# --- 3. line ends, BOM, concatenation, empty input --------------------------------------------------------------

def _same(a: Outcome, b: Outcome) -> None:
    assert a.code == b.code
    if a.report is None:
        assert (a.error.line, a.error.message) == (b.error.line, b.error.message)
        return
    da, db = a.report.to_dict(), b.report.to_dict()
    for key in ("verdict", "runs", "tokens", "evaluations", "flash_attention_nodes", "totals"):
        assert da[key] == db[key], key
    assert len(da["warnings"]) == len(db["warnings"])


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("variant", ["crlf", "bom", "crlf+bom"])
def test_crlf_and_bom_change_nothing(name, variant):
    data = _variant(text(name).data, "crlf" in variant, "bom" in variant)
    _same(check(data), clean(name))


@props(40)
@given(st.data())
def test_crlf_and_bom_keep_errors_and_their_lines(data):
    """A damaged dump with CRLF line ends or a BOM: the same verdict, and an error at the same line."""
    t = text(data.draw(st.sampled_from(ALL), label="dump"))
    i = data.draw(st.integers(0, len(t.lines) - 1), label="line deleted")
    damaged = b"".join(t.lines[:i] + t.lines[i + 1:])
    _same(check(_variant(damaged, data.draw(st.booleans(), "crlf"), True)), check(damaged))


_PAIRS = [(n, n) for n in ALL] + [("gpt2-how-are.txt", "old-llama-gqa-how-are-you.txt"),
                                   ("old-llama-gqa-how-are-you.txt", "gpt2-ubatch2.txt"),
                                   ("llama-gqa-draw.txt", "gpt2-long.txt"),
                                   ("gpt2-flash-attn.txt", "llama-gqa-long.txt")]


@pytest.mark.parametrize("first,second", _PAIRS)
def test_two_dumps_concatenated_are_two_runs(first, second):
    """`cat a.txt b.txt`: two runs, each verified on its own (n_past starts again at 0), totals add up."""
    a, b = clean(first).report, clean(second).report
    out = check(text(first).data + text(second).data)
    assert out.code == (0 if a.sites or b.sites else 3)
    both = out.report
    assert both.runs == 2
    assert both.evaluations == a.evaluations + b.evaluations
    ta, tb, tt = a.totals(), b.totals(), both.totals()
    assert tt == {k: ta[k] + tb[k] for k in tt}
    key = lambda s: (s.evaluation, s.n_past, s.T, s.layer, s.passed)  # noqa: E731
    shifted = [(s.evaluation + a.evaluations, *key(s)[1:]) for s in b.sites]
    assert [key(s) for s in both.sites] == [key(s) for s in a.sites] + shifted
    assert [s.run for s in both.sites] == [0] * len(a.sites) + [1] * len(b.sites)


def test_each_concatenated_run_is_verified():
    """A bad value in the second of two concatenated runs fails, at its place in the second run."""
    t = text("gpt2-ubatch2.txt")
    site, h, q = t.rows("full")[0]
    i = site.kqv.row(t.lines, h, q)
    lines = list(t.lines)
    lines[i] = set_value(lines[i], 0, b"%.4f" % (get_value(lines[i], 0) + 1))
    out = check(t.data + b"".join(lines))
    assert out.code == 1 and out.report.runs == 2
    assert [(s.run, s.evaluation, s.n_past) for s in out.report.failed_sites] == [(1, 3, 0)]


@pytest.mark.parametrize("data", [b"", b"\n", b"  \r\n\t\n", b"\xef\xbb\xbf", b"\xef\xbb\xbf\r\n", b"\x00" * 100,
                                  b"0.00.014 I system_info: n_threads = 2\n", b"GGUF\x03\x00\x00\x00"])
def test_no_dump_at_all(data):
    out = check(data)
    assert out.code == 2 and out.error.line in (None, 1), out


# --- 4. the command line: one error line, exit codes, no traceback, no hang ------------------------------------------

def _one_error_line(r) -> str:
    assert "Traceback" not in r.err and "internal error" not in r.err, r.err
    errors = [line for line in r.err.splitlines() if line.startswith("attncheck: error: ")]
    assert len(errors) == 1 and len(r.err.splitlines()) == 1, r.err
    return errors[0]


def test_cli_empty_stdin():
    r = cli(stdin=b"")
    assert r.code == 2
    assert _one_error_line(r).startswith("attncheck: error: <stdin>: empty input")


def test_cli_binary_stdin():
    r = cli("check", "-", stdin=bytes(range(256)) * 8)
    assert r.code == 2
    _one_error_line(r)


def test_cli_error_names_file_and_line(tmp_path):
    t = text("gpt2-how-are.txt")
    site, h, q = t.rows("full")[3]
    i = site.softmax.row(t.lines, h, q)
    lines = list(t.lines)
    lines[i] = set_value(lines[i], 1, b"0.12.34")
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"".join(lines))
    r = cli("check", bad)
    assert r.code == 2
    assert _one_error_line(r).startswith(f"attncheck: error: {bad}:{i + 1}: ")


def test_cli_truncated_stdin_is_a_verdict():
    """gpt2-long cut at 2/3 of its bytes: the cut lands inside a node no check reads, after layer 0's site and
    before layer 1's scores, as the tail today's logger loses at exit: layer 0 is checked and passes (exit 0), and
    a warning names the node the output ends in, at its header's line."""
    t = text("gpt2-long.txt")
    cut = len(t.data) * 2 // 3
    inside = [n for n in t.nodes if sum(map(len, t.lines[: n.start])) < cut]
    last = inside[-1]
    first, second = t.sites
    assert last.end > last.start + 1 and sum(map(len, t.lines[: last.end])) > cut, "the cut is inside a node's body"
    assert all(last is not n for s in t.sites for n in s.nodes), "a node no check reads"
    assert first.kqv.end <= last.start and second.scores.start > last.start
    r = cli(stdin=t.data[:cut])
    assert r.code == 0, r.err
    assert re.search(r"^PASS <stdin>: .* in 1 site \(1 evaluation\)(; \d+ of \d+ printed kqv elements \(\d+%\) not "
                     r"checkable from the dump alone)?$", r.out, re.M), r.out[-500:]
    assert r.err.strip() == (f"attncheck: warning: <stdin>:{last.start + 1}: the output ends inside node '{last.name}' "
                             "(llama.cpp's logger loses its tail at exit); no check needed it")


def test_cli_crlf_bom_stdin_same_json():
    name = "llama-gqa-long.txt"
    plain = cli("check", FIXTURES / name, "--json", "-")
    dos = cli("check", "-", "--json", "-", stdin=_variant(text(name).data, True, True))
    assert plain.code == dos.code == 0
    assert plain.json()["totals"] == dos.json()["totals"]


def test_cli_concatenated_json():
    data = text("gpt2-ubatch2.txt").data
    one = cli("check", "-", "--json", "-", stdin=data).json()
    two = cli("check", "-", "--json", "-", stdin=data * 2).json()
    assert two["runs"] == 2 and two["verdict"] == "pass"
    assert two["totals"]["sites"] == 2 * one["totals"]["sites"]
    assert [s["n_past"] for s in two["sites"]] == [s["n_past"] for s in one["sites"]] * 2


def test_cli_nan_is_a_failed_check_with_its_place():
    t = text("gpt2-how-are.txt")
    site = t.sites[1]
    i = site.softmax.row(t.lines, 2, 1)
    lines = list(t.lines)
    lines[i] = set_value(lines[i], 1, b"-nan")
    r = cli("check", "-", stdin=b"".join(lines))
    assert r.code == 1, r.err + r.out
    assert "Traceback" not in r.err and "error" not in r.err
    assert "layer 1 head 2, query 1, slot 1" in r.out
