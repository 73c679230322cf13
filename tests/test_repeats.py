"""dump/repeats.py: a part made from templates is what reading it node by node gives, field for field.

The dump is the shipped benchmark dump (a real llama.cpp run, bench/gpt2-deep-48l.txt.xz): no fixture holds a graph
printed again with numbers that differ (their runs are one or two ubatches), and the benchmark's 13 evaluations are
12 of one template. Its first evaluations are cut at evaluation starts, as parts are.
"""
from __future__ import annotations

import gc
import io
import lzma
import re
import types
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attncheck.check.gather import gather
from attncheck.dump import pool, repeats
from attncheck.dump.listing import listed
from attncheck.dump.records import Node
from attncheck.dump.parts import parts, start_of_graph
from attncheck.dump.sample import _NUMBER_CHARS, _fast_skeleton

MADE = repeats.evaluations  # the real one: read() puts a counting one in its place
BENCH = Path(__file__).resolve().parent.parent / "bench" / "gpt2-deep-48l.txt.xz"


@pytest.fixture(scope="module")
def text() -> bytes:
    """The benchmark dump's start-up log and first three evaluations (of one template), whole."""
    with lzma.open(BENCH) as f:
        data = f.read(12 << 20)
    return data[:_starts(data)[3]]


def _starts(data: bytes) -> list[int]:
    """Where each evaluation's first header line starts (dump/parts.py's graph start)."""
    head = start_of_graph(data)
    return [m.start() + 1 for m in re.finditer(re.escape(b"\n" + head), data)]


def describe(ev, source, layers):
    """Everything of an evaluation a check, `list` or `diff` could read, its links as indices; and a node said
    `plain` (parse_samples then takes its body as a clean print without looking) must be one."""
    for n in ev.nodes:
        assert not n.plain or n.body.translate(None, _NUMBER_CHARS) == _fast_skeleton(n.ne), n.name
    at = {id(n): i for i, n in enumerate(ev.nodes)}
    ix = lambda n: None if n is None else at[id(n)]  # noqa: E731
    nodes = [(n.name, n.type, n.op, n.srcs, n.ne, n.line, n.body, n.body_line, n.cut, n.lost, tuple(map(ix, n.inputs)))
             for n in ev.nodes]
    sites = [(s.layer, *map(ix, (s.softmax, s.scores, s.kq, s.k, s.q, s.kqv, s.v))) for s in ev.sites]
    return (ev.index, ev.run, ev.index_in_run, ev.n_past, ev.tokens, ev.runs_before, nodes, sites,
            [ix(n) for n in ev.flash], [ix(n) for n in ev.other_softmax], ev.damaged, ev.damaged_names, ev.lost,
            ev.T, ev.layer_kinds())


def read(data: bytes, fast: bool, monkeypatch, fresh: bool = True) -> tuple[list, int]:
    """Every part's result (each evaluation its own part), and how many parts were made from templates; fresh: with
    no template known before (else those learned before, as a second dump read in one process, `diff`'s)."""
    if fresh:
        repeats._templates.clear()
    made = [0]

    def counted(*a):
        out = MADE(*a) if fast else None
        made[0] += out is not None
        return out

    monkeypatch.setattr(repeats, "evaluations", counted)
    out = []
    for part in parts(io.BytesIO(data), size=1):
        r = pool.gather_part(part, "dump.txt", None, describe)
        out.append((r.evals, r.runs, r.notes, r.cut, None if r.error is None else str(r.error), r.size))
    return out, made[0]


def test_templates_make_what_reading_gives(text, monkeypatch):
    """A clean run: the second and third evaluations are made from the template of the first (read with the start-up
    log before it, which starts the run), and are what reading them gives."""
    slow, _ = read(text, False, monkeypatch)
    fast, made = read(text, True, monkeypatch)
    assert made == 2
    assert fast == slow
    assert [len(p[0]) for p in fast] == [1, 1, 1]


@pytest.mark.parametrize("take", [gather, listed])
def test_what_a_reader_keeps_holds_no_node(text, take):
    """An evaluation made from a template hands its nodes back when its reader is done (repeats.release), and the
    next evaluation of that template takes them with its own lines and bodies: what `check` (EvalData) and `list`
    (Listed) keep of an evaluation must then hold no node, or the next would rewrite it. The third evaluation here
    takes the second's nodes."""
    repeats._templates.clear()
    made = []
    kept = []
    for part in parts(io.BytesIO(text), size=1):
        r = pool.gather_part(part, "dump.txt", None, lambda ev, *a: (made.append(ev.nodes[0]), take(ev, *a))[1])
        kept.append(r)
    assert made[2] is made[1] and made[1] is not made[0]  # taken again, not made again
    seen, todo = set(), [kept]
    while todo:
        x = todo.pop()
        if id(x) in seen or isinstance(x, (type, types.ModuleType, types.FunctionType)):
            continue
        seen.add(id(x))
        assert not isinstance(x, Node), x.name
        todo += gc.get_referents(x)
    assert len(seen) > 1000  # the walk reached the kept views, steps and rows


def test_foreseen_cuts_as_cut(text, monkeypatch):
    """Once a template is known, `foreseen` cuts a repeat of it (its header lines found on the template's lines, not
    searched for) into the spans `cut` gives, field for field; a part it cannot vouch for (a log line first) it
    leaves to `cut`."""
    read(text, True, monkeypatch)  # learns the template
    third = text[_starts(text)[-1]:]
    assert repeats.foreseen(third) == repeats.cut(third)
    assert repeats.foreseen(b"I a log line\n" + third) is None


def test_a_header_line_run_on_reads_as_read(text, monkeypatch):
    """A digit added at the end of a header line and a blank taken from its body: the header prefixes and the text's
    length stay where the template has them, but the line is no longer the template's header (and no header at all
    to records.py): the part must read as reading it gives."""
    first = _starts(text)[-1]
    at = text.index(b"\ncommon_debug_cb_eval:", (first + len(text)) // 2) + 1
    eol = text.index(b"\n", at)
    blank = text.index(b" ", eol)
    data = text[:eol] + b"5" + text[eol:blank] + text[blank + 1:]
    assert len(data) == len(text)
    slow, _ = read(data, False, monkeypatch)
    fast, made = read(data, True, monkeypatch)
    assert fast == slow and made == 1  # the second evaluation; the third is read


def test_a_log_line_every_print_holds_is_no_plain_print(text, monkeypatch):
    """A log line inside the same node's print in every evaluation: the template holds it (reading reads around it),
    the repeats are made, and that node is not taken for a clean print (Node.plain), as reading does not take it."""
    starts = _starts(text) + [len(text)]

    def logged(ev: bytes) -> bytes:  # the line after the first of kq_soft_max-7's print
        at = ev.index(b"\n    [", ev.index(b"kq_soft_max-7")) + 1
        return ev[:at] + b"I a log line\n" + ev[at:]

    data = text[:starts[0]] + b"".join(logged(text[a:b]) for a, b in zip(starts, starts[1:]))
    slow, _ = read(data, False, monkeypatch)
    fast, made = read(data, True, monkeypatch)
    assert made == 2
    assert fast == slow
    assert set(repeats._VARIES) <= set(_NUMBER_CHARS)  # Template.plain's argument: a repeat's skeleton is the print's


def test_second_run_is_read(text, monkeypatch):
    """The same run twice (`cat a b`): every evaluation but the first is made, the first run's last with the second
    run's start-up log after its print (which reading gives its last node, and where it finds the run start)."""
    data = text + text
    slow, _ = read(data, False, monkeypatch)
    fast, made = read(data, True, monkeypatch)
    assert made == 5
    assert fast == slow
    assert [len(p[1]) for p in fast] == [1, 0, 1, 0, 0, 0]  # the runs each part starts


# what a repeated print may hold that the template's does not: digits, signs and blanks (which the compare ignores),
# the bytes that change a layout, a separator, a non-finite number, log text
EDITS = [b"7", b"-", b" ", b"\t", b"\r", b"\n", b".", b"nan", b"inf", b",", b"[", b"]", b"\x01",
                          b"sum = ", b"...", b"  12345\n", b"I log line\n", b"common"]


@pytest.mark.parametrize("new", EDITS)
def test_an_insert_reads_as_read(text, monkeypatch, new):
    """Each kind of byte inserted in the middle of the repeated evaluation, and before a header line's prefix."""
    first = _starts(text)[-1]
    header = text.index(b"\ncommon_debug_cb_eval:", (first + len(text)) // 2) + 1
    for at in ((first + len(text)) // 2, header):
        data = text[:at] + new + text[at:]
        assert read(data, True, monkeypatch)[0] == read(data, False, monkeypatch)[0]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 3), st.sampled_from(EDITS)), min_size=1, max_size=3))
def test_an_edited_repeat_reads_as_read(text, monkeypatch, edits):
    """Bytes inserted, deleted or replaced in the evaluation that would be made from a template: the part's result
    is still exactly what reading it gives (made from the template, or read when it differs)."""
    first_of_last = _starts(text)[-1]
    data = bytearray(text)
    for where, drop, new in edits:
        at = first_of_last + int(where * (len(data) - first_of_last - 1))
        data[at:at + drop] = new
    data = bytes(data)
    assert read(data, True, monkeypatch)[0] == read(data, False, monkeypatch)[0]


def test_a_copy_told_apart_by_its_values_is_told_again(monkeypatch):
    """names.py tells a copy's source apart by printed values where two nodes share its name and ne (the RESHAPE and
    the ROPE both named Kcur-0): a made evaluation asks its own values again. gemma2-ubatch2's second evaluation is
    printed once as it is and once with the copy printing the other candidate's values (a hand-made edit: no shipped
    dump repeats a graph with rope), and the copy must then read that candidate, as reading gives."""
    # gemma2-ubatch2: Kcur-0 is MUL_MAT {64, 2, 1, 1}, RESHAPE and ROPE {32, 2, 2, 1}; `Kcur-0 (view)` {64, 2, 1, 1}
    # VIEWs Kcur-0 {32, 2, 2, 1}, which names both the RESHAPE and the ROPE
    data = (Path(__file__).resolve().parent.parent / "fixtures" / "arch" / "gemma2-ubatch2.txt").read_bytes()
    st = _starts(data)
    second = data[st[1]:st[2]]
    (span,) = repeats.cut(second)
    keys = [(h[0], h[4]) for h in span.headers]
    i, found = next((i, [k for k in range(i) if keys[k] == (h[3][0].name, h[3][0].ne)])
                    for i, h in enumerate(span.headers) if h[2] in ("VIEW", "RESHAPE") and h[3][0] is not None
                    and sum(keys[k] == (h[3][0].name, h[3][0].ne) for k in range(i)) > 1)
    other = found[0]  # the view repeats the latest (the ROPE); printed as the first (the RESHAPE), it reads that
    src = span.headers[i][3][0].name
    bodies = list(span.bodies)  # the RESHAPE's values, in the view's layout: the MUL_MAT it reshapes, as printed
    bodies[i] = next(span.bodies[k] for k in range(i) if keys[k] == (src, span.headers[i][4]))
    third = _rebuilt(second, span, bodies)
    text = data[:st[2]] + third
    slow, _ = read(text, False, monkeypatch)
    fast, made = read(text, True, monkeypatch)
    assert made == 2  # the second evaluation and the third, from the template of the first
    assert fast == slow
    two, three = slow[1][0][0], slow[2][0][0]  # describe() of the second and third evaluations
    assert two[6][i][10][0] == found[-1] and three[6][i][10][0] == other


def _rebuilt(text: bytes, span, bodies: list[bytes]) -> bytes:
    """An evaluation's text with its bodies replaced: each header line kept, each body as given."""
    out, pos = [], 0
    for old, new in zip(span.bodies, bodies):
        end = text.index(b"\n", pos) + 1  # the header line
        out += [text[pos:end], new]
        pos = end + len(old)
    return b"".join(out)


# log text a part may hold before its first header line or after its last node's print: printed rows and sums (noted
# before the first header, a damaged print after it), blank and empty lines, headers, a run start, a GGUF file's magic
LOG_EDITS = [b"    [      1.0000 ],\n", b"    sum = 1.000000\n", b"  12345\n", b"\n", b"I log line\n", b"GGUF",
             b"common_debug_cb_eval: x\n", b"0.1 I ggml_debug: y\n",
             b"0.1 I number of input tokens = 2\n0.1 I   5\n0.1 I   6\n"]


@pytest.mark.parametrize("new", LOG_EDITS)
@pytest.mark.parametrize("where", ["dump start", "first header", "print end", "second run's first header", "dump end"])
def test_log_text_around_evaluations_reads_as_read(text, monkeypatch, new, where):
    """The start-up log before a run's first evaluation is read the way reading reads it, whether it ends a part (the
    last node's print, then the next run's log) or begins the dump; text inserted at either end of such log (or at
    the dump's end, where reading calls the last node cut) gives what reading gives, made or not."""
    two = text[:_starts(text)[2]]  # the start-up log and two evaluations of one template
    lead = _starts(two)[0]
    at = {"dump start": 0, "first header": lead, "print end": len(two), "second run's first header": len(two) + lead,
          "dump end": 2 * len(two)}[where]
    data = (two + two)[:at] + new + (two + two)[at:]
    slow = read(data, False, monkeypatch)[0]
    assert read(data, True, monkeypatch)[0] == slow
    assert read(data, True, monkeypatch, fresh=False)[0] == slow  # the first part too may be made


def test_a_second_dump_is_made_from_the_first(text, monkeypatch):
    """A dump read after another in one process (`diff`): even its first part, start-up log and all, is made from the
    templates learned on the first, and reads as reading gives."""
    slow = read(text, False, monkeypatch)[0]
    read(text, True, monkeypatch)
    fast, made = read(text, True, monkeypatch, fresh=False)
    assert made == 3
    assert fast == slow
