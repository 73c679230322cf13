"""dump/sample.py's parse_samples, which parses many nodes' printed values in one pass of numpy (check reads every
site's scores, weights, output and V with it), gives what parse_sample gives node by node, or leaves the node to
it: the same floats bit for bit, the same shape and sums; never a Sample where parse_sample finds damage.

The nodes are real ones from fixtures/; a property test rewrites the words of a real kq_soft_max print (its
skeleton kept) with words of every kind a damaged or odd log can hold, since no real dump holds most of them."""
from __future__ import annotations

import re
from dataclasses import replace
from functools import lru_cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attncheck.dump.graph import read_dump
from attncheck.dump.sample import every_line_printed, parse_sample, parse_samples
from attncheck.dump.words import words_as_floats
from attncheck.errors import DumpError
from conftest import FIXTURES


@lru_cache(maxsize=None)
def _nodes(name: str) -> list:
    """Every node of a fixture, read once."""
    return [n for ev in read_dump(str(FIXTURES / name)).evaluations() for n in ev.nodes]


def _same(batch, node) -> None:
    """batch (parse_samples' answer for node) is None or parse_sample's Sample, bit for bit."""
    try:
        one = parse_sample(node, "x")
    except DumpError:
        assert batch is None, node.name
        return
    if batch is None:
        return
    assert batch.values.shape == one.values.shape and batch.values.tobytes() == one.values.tobytes(), node.name
    assert batch.sums == one.sums and all(np.array_equal(a, b) for a, b in zip(batch.index, one.index))


@pytest.mark.parametrize("name", ["gpt2-ubatch2.txt", "llama-gqa-long.txt", "old-llama-gqa-how-are-you.txt",
                                  "arch/gemma2-tail-lost.txt", "arch/gpt-oss-long.txt"])
def test_every_node_of_real_dumps_parses_as_one_by_one(name):
    nodes = _nodes(name)
    got = parse_samples(nodes)
    for node, batch in zip(nodes, got):
        _same(batch, node)
    printed = [n for n in nodes if not n.quantized and n.body.strip()]
    assert sum(s is not None for s in got) >= 0.9 * len(printed)  # the one pass parses nearly all of them


_WORD = st.one_of(
    st.from_regex(r"\A-?[0-9]{1,3}\.[0-9]{4}\Z"),  # what %12.4f prints
    st.from_regex(r"\A-?[0-9]{1,20}\.[0-9]{4}([0-9]{2})?\Z"),  # long ones, and %f's 6 decimals
    st.sampled_from(["-0.0000", "0.0000", "nan", "-nan", "inf", "-inf", "...", "sum", "1.2345...", "1.2.3456",
                     "12", ".1234", "1234.", "1e5", "--1.0000", "1.0000-", "1.23456", "+1.0000", "1.2345sum",
                     "0x1.0000", "1.2345\x00", "\u00bd.0000",
                     # words of 6 to 8 bytes, which the pass reads by their places from the end
                     "1-2.3456", "-12-.345", "1-.2345", "12.34-5", "-.12345", "-1.23456", "-9.9999", "-99.9999",
                     "999.9999", "-999.9999", "1000.0000", "a1.2345", "1.2a45", "1,2.3456"]),
)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_any_words_parse_as_one_by_one(data):
    """A real softmax print some of whose numbers are replaced: where the words are all finite prints of at most 15
    digits the one pass parses them itself; any other word leaves the node to parse_sample."""
    node = next(n for n in _nodes("gpt2-how-are.txt") if n.name == "kq_soft_max-0")
    body = node.body.decode()
    words = [w for w in body.replace("[", " ").replace("]", " ").replace(",", " ").replace("=", " ").split()
             if w not in ("...", "sum")]
    new = list(words)
    for i, w in data.draw(st.lists(st.tuples(st.integers(0, len(words) - 1), _WORD), min_size=1, max_size=6)):
        new[i] = w  # a few of the printed numbers replaced in place, the skeleton kept
    out, at = [], 0
    for w in words:
        i = body.index(w, at)
        out.append(body[at:i] + new[len(out)])
        at = i + len(w)
    edited = replace(node, body=("".join(out) + body[at:]).encode())
    batch = parse_samples([edited, node])
    _same(batch[0], edited)
    _same(batch[1], node)
    assert batch[1] is not None
    plain = all("..." not in w and "sum" not in w and len(w.lstrip("-").replace(".", "")) <= 15
                and ("nan" not in w and "inf" not in w) for w in new)
    try:
        parse_sample(edited, "x")
        clean = True
    except DumpError:
        clean = False
    if clean and plain:
        assert batch[0] is not None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([b"\n", b" ", b"  [", b"1.0", b"I log", b"\t", b"\r\n"]), max_size=12))
def test_every_line_printed_counts_as_it_searches(parts):
    """every_line_printed searches for two newlines that start no printed line; what it decides is what counting
    every newline decides (a body's newlines are one more than those followed by a blank when it starts with one)."""
    body = b"".join(parts)
    assert every_line_printed(body) == (body.count(b"\n") == body.count(b"\n ") + body.startswith(b" "))


_PRINT = re.compile(r"-?[0-9]{1,39}\.(?:[0-9]{4}|[0-9]{6})")


def _reference(bodies: list[bytes]) -> tuple[list[float], list[int], list[bool]]:
    """words_as_floats by its definition, word by word: the words parse_sample splits (standalone `...` and `sum`
    left out), float() of each that is a finite `%12.4f` or `%f` print of at most 15 digits."""
    values, counts, good = [], [], []
    for body in bodies:
        words = [w for w in body.translate(bytes.maketrans(b"[],=", b"    ")).split() if w not in (b"...", b"sum")]
        counts.append(len(words))
        for w in words:
            ok = _PRINT.fullmatch(w.decode("latin-1")) is not None and len(w.lstrip(b"-")) - 1 <= 15
            good.append(ok)
            values.append(float(w) if ok else None)
    return values, counts, good


@settings(max_examples=400, deadline=None)
@given(st.lists(st.lists(st.one_of(st.from_regex(r"\A-?[0-9]{1,3}\.[0-9]{4}\Z"),  # %12.4f's, read by places
                                   st.from_regex(r"\A-?[0-9]{1,16}\.[0-9]{4}([0-9]{2})?\Z"),
                                   st.from_regex(r"\A[-.0-9]{1,4}\.[-.0-9]{4}\Z"),  # near misses of those
                                   st.text("0123456789.-", min_size=1, max_size=10),
                                   st.text("0123456789.-+e sumna,[]=\t\n", max_size=10)), max_size=30), max_size=4))
def test_words_read_by_their_places_are_float(bodies):
    """words.py reads words of 6 to 8 bytes by their places, in 8-byte windows: whether a word is a print, and its
    value where it is, are what the definition gives, for words of any bytes in any place (a '-' or '.' out of place,
    a digit before a shorter word, words at a body's edge)."""
    texts = [" ".join(b).encode() for b in bodies]
    want, counts, good = _reference(texts)
    values, words, running = words_as_floats(texts)
    assert words == counts
    assert np.diff(running).astype(bool).tolist() == good
    assert [v.hex() for v, ok in zip(values.tolist(), good) if ok] == [v.hex() for v in want if v is not None]
