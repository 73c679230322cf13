"""Memory has a ceiling (issue 25): a stream of `y` lines, one line of 100 MB, an evaluation of more nodes than
llama.cpp's graph holds, `list` on many evaluations, `run` on a binary that prints for ever. Each is held to what a
check needs (a few blocks of text, a node's print, an evaluation's headers), measured as the child's peak RSS (wait4).

Inputs are made by the test (no real dump is hostile); sizes are small but each case compares N with 4N, or holds a
peak far below what the unbounded reading took (numbers in each test).
"""
from __future__ import annotations

import io
import shlex

import pytest

import attncheck
from attncheck.dump import graph
from conftest import FIXTURES
from hostile import attncheck_cmd, measured

MODEL = FIXTURES / "models" / "gpt2-mini-q8_0.gguf"
NODE = (b"common_debug_cb_eval: %24s = (f32)        ADD(%s{1, 1, 1, 1}, y{1, 1, 1, 1}}) = {1, 1, 1, 1}\n"
        b"    [\n        [\n            [      0.0000  ],\n        ],\n    ]\n    sum = 0.000000\n")


def _pipe(producer: str, *args) -> str:
    return f"{producer} | " + " ".join(map(shlex.quote, attncheck_cmd(*args)))


@pytest.mark.slow
def test_a_stream_of_y_lines_is_read_in_bounded_memory():
    """`yes | head -c 200M | attncheck check -` held the whole stream, twice (865 MB, 39 s for 100 MB); now it is read
    in blocks, its text dropped once no dump can be in it: 50 MB and 200 MB peak alike, far under 200 MB."""
    peaks = []
    for size in ("50M", "200M"):
        r = measured(_pipe(f"yes | head -c {size}", "check", "-", "-j", "2"), shell=True, timeout=120)
        assert r.code == 2 and "no tensor dump found" in r.err and len(r.err.splitlines()) == 1, r.err
        peaks.append(r.peak_mb)
    assert peaks[1] < 250 and peaks[1] - peaks[0] < 40, peaks


def test_a_line_of_100_mb_is_an_error_at_its_line(tmp_path):
    """A line no llama.cpp prints, inside a real dump: one error at its line; it took 1.6-3.1 GB for 500 MB."""
    head = (FIXTURES / "gpt2-how-are.txt").read_bytes()[:5000]
    producer = (f"{{ head -c 5000 {FIXTURES / 'gpt2-how-are.txt'}; head -c 100M /dev/zero | tr '\\0' x; echo; "
                f"tail -c +5001 {FIXTURES / 'gpt2-how-are.txt'}; }}")
    r = measured(_pipe(producer, "check", "-", "-j", "2"), shell=True, timeout=120)
    assert r.code == 2, r.err
    line = head.count(b"\n") + 1
    assert r.err.splitlines() == [f"attncheck: error: <stdin>:{line}: a line of more than 1 MiB: "
                                  "llama.cpp prints none longer than a header (under 512 bytes), nor does any log "
                                  "beside it"]
    assert r.peak_mb < 250, r.peak_mb


def test_an_evaluation_of_more_nodes_than_the_ceiling_is_an_error_at_its_line(monkeypatch):
    """2 million tiny nodes in one evaluation took 2.7 GB: an evaluation is held whole until it ends, so it has a
    ceiling (graph.MAX_NODES, from llama.cpp's graph_max_nodes). Shown with the ceiling lowered to 1,000 (the real
    one takes 500,000 nodes to reach)."""
    monkeypatch.setattr(graph, "MAX_NODES", 1000)
    dump = b"".join(NODE % (b"t%d" % i, b"t%d" % (i - 1) if i else b"x") for i in range(1500))
    with pytest.raises(attncheck.DumpError) as e:
        attncheck.verify(io.BytesIO(dump), jobs=1)
    assert e.value.line == 1000 * 7 + 1 and "more than 1,000 nodes" in e.value.message


@pytest.mark.slow
def test_list_on_many_evaluations_holds_the_rows_it_shows(tmp_path):
    """`list` on a million one-node evaluations reached 4.9 GB (and took 734 s for 100,000): without -v or --json the
    table shows the first 200 evaluations and counts the rest, so 25,000 and 100,000 evaluations peak alike."""
    peaks = []
    for n in (25_000, 100_000):
        path = tmp_path / f"{n}.txt"
        path.write_bytes(NODE % (b"t0", b"x") * n)
        r = measured(attncheck_cmd("list", path, "-j", "2"), timeout=120)
        assert r.code == 0 and f"the first 200 of {n} evaluations" in r.out, r.err
        peaks.append(r.peak_mb)
    assert peaks[1] - peaks[0] < 20, peaks


@pytest.mark.slow
def test_run_on_a_binary_that_prints_for_ever_stays_bounded(tmp_path):
    """A llama-eval-callback stand-in that prints log lines without end grew attncheck by 35 MB/s; after 15 s of it,
    attncheck (ended by SIGINT, as a CI timeout would) peaked far below the 500 MB it would have reached."""
    fake = tmp_path / "llama-eval-callback"
    fake.write_text("#!/bin/sh\n[ \"$1\" = --help ] && { echo '--flash-attn [on|off|auto]'; exit 0; }\n"
                    "exec yes 'llama_log: some output'\n")
    fake.chmod(0o755)
    r = measured("timeout -s INT 15 " + " ".join(map(shlex.quote, attncheck_cmd(
        "run", "--bin", fake, "-m", MODEL, "-p", "x", "--dump-only", "-q"))), shell=True, timeout=60)
    assert r.code == 124 and "Traceback" not in r.err, (r.code, r.err)  # timeout's code: it sent the SIGINT
    assert r.peak_mb < 300, r.peak_mb
