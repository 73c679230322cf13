"""What the check report says in words: failures named at the line of the value itself, cut lists that say what
they left out, -v lines that name their node, one row per layer for long runs."""
from __future__ import annotations

import re

from conftest import FIXTURES, attncheck as run
from dumpedit import DumpEdit

HOW_ARE = FIXTURES / "gpt2-how-are.txt"


def test_a_failure_names_the_line_of_its_value(tmp_path):
    edit = DumpEdit(FIXTURES / "llama-gqa-draw.txt", tmp_path / "bad.txt")
    edit.set("kq_soft_max-0", (0, 1, 0), 0.0156)  # head 0, query 1, slot 0: the README's example
    path = edit.save()
    row = edit.line_of("kq_soft_max-0", (0, 1, 0))
    assert edit.node("kq_soft_max-0").line != row
    r = run("check", path, "--json", "-")
    first = next(c for s in r.json()["sites"] for c in s["checks"] if c["check"] == "softmax" and not c["passed"])
    assert first["failures"][0]["line"] == row and first["line"] == edit.node("kq_soft_max-0").line
    text = run("check", path).out
    assert f"eval 0 layer 0 head 0, query 1, slot 0: kq_soft_max-0 (line {row}) 0.0156" in text
    assert "0.0156" in path.read_text().splitlines()[row - 1]


def test_a_log_line_inside_the_node_moves_the_line_named(tmp_path):
    """A log line interleaved into the body (what llama.cpp's two streams do): the value's line counts it. Made by
    hand: no shipped dump has a log line inside a failing node."""
    edit = DumpEdit(HOW_ARE, tmp_path / "bad.txt")
    edit.add("kqv-1", (11, 1, 63), 0.05)  # head 11, query 1, dim 63: the last printed row
    header = edit.node("kqv-1").header
    edit.insert(header + 3, ["llama_log: an interleaved line"])
    path = edit.save()
    row = edit.line_of("kqv-1", (11, 1, 63))
    assert path.read_text().splitlines()[header + 3].startswith("llama_log")
    r = run("check", path)
    assert f"head 11, query 1, dim 63: kqv-1 (line {row}) " in r.out
    assert str(round(edit.get("kqv-1", (11, 1, 63)), 4)) in path.read_text().splitlines()[row - 1]


def test_a_cut_failure_list_says_how_many_more_and_where():
    r = run("check", HOW_ARE, "--kq-scale", "0.1", "--json", "-")
    failed = sum(c["failed"] for s in r.json()["sites"] for c in s["checks"])
    assert failed == 24
    text = run("check", HOW_ARE, "--kq-scale", "0.1").out.splitlines()
    shown = [line for line in text if line.startswith("eval 0 layer ")]
    assert len(shown) == 10
    assert {line.split(" head")[0] for line in shown} == {"eval 0 layer 0", "eval 0 layer 1"}  # both sites show
    (more,) = [line for line in text if line.startswith("... and")]
    assert more.startswith("... and 14 more failing elements (eval 0 layer 0: 7, eval 0 layer 1: 7; -v lists")
    every = [line for line in run("check", HOW_ARE, "--kq-scale", "0.1", "-v").out.splitlines()
             if re.match(r"eval 0 layer \d head", line)]
    assert len(every) == 24 and not any(line.startswith("... and") for line in every)


def test_diff_quiet_says_how_many_divergences_it_left_out():
    r = run("diff", FIXTURES / "gpt2-how-are-you.txt", FIXTURES / "gpt2-kv-f32.txt", "--exact", "-q")
    lines = r.out.splitlines()
    listed = [line for line in lines if line.startswith("eval ")]
    assert len(listed) == 20
    assert "... and 31 more divergent nodes (-v or --json lists them all)" in lines
    assert lines[-1].startswith("FAIL diff") and "51 of 70 nodes differ" in lines[-1]
    everything = run("diff", FIXTURES / "gpt2-how-are-you.txt", FIXTURES / "gpt2-kv-f32.txt", "--exact", "-q", "-v").out
    assert len([line for line in everything.splitlines() if line.startswith("eval ")]) == 51


def test_verbose_lines_name_their_node_and_do_not_wrap():
    r = run("check", FIXTURES / "gpt2-how-are.txt", "-v")
    finite = [line for line in r.out.splitlines() if " finite " in line]
    assert [line.split(" finite ")[1].split(" (line")[0] for line in finite] == [
        "kq-0", "kq_soft_max-0", "kqv-0", "cache_v_l0 (view) (permuted)",
        "kq-1", "kq_soft_max-1", "kqv-1", "cache_v_l1 (view) (permuted)"]
    assert len(set(finite)) == len(finite)
    sm = next(line for line in r.out.splitlines() if line.startswith("eval 0 layer 0: PASS softmax "))
    assert sm.endswith("[kq_soft_max = softmax(kq·scale + mask)]")  # the description on the check's own line


def test_many_evaluations_give_one_row_per_layer():
    r = run("check", FIXTURES / "gpt2-ubatch2.txt")
    rows = [line.split() for line in r.out.splitlines() if re.match(r"\s+0\.\.2\s", line)]
    assert [row[2] for row in rows] == ["0", "1"] and all(row[-1] == "PASS" for row in rows)
    doc = run("check", FIXTURES / "gpt2-ubatch2.txt", "--json", "-").json()
    for row in rows:
        sites = [s for s in doc["sites"] if s["layer"] == int(row[2])]
        assert len(sites) == 3
        assert row[3] == f"{sum(s['softmax_rows']['checked'] for s in sites)}/" \
                         f"{sum(s['softmax_rows']['printed'] for s in sites)}"
        worst = max((c for s in sites for c in s["checks"]), key=lambda c: c["ratio"])
        assert row[-2] == f"{worst['ratio']:.2f}"
    assert "one row per layer over its evaluations (3)" in r.out
    verbose = run("check", FIXTURES / "gpt2-ubatch2.txt", "-v").out
    assert len([line for line in verbose.splitlines() if re.match(r"\s+[012]\s+\d+\.\.\d+\s+[01]\s", line)]) == 6


def test_a_failing_evaluation_has_its_own_row_below_its_layer(tmp_path):
    edit = DumpEdit(FIXTURES / "gpt2-ubatch2.txt", tmp_path / "bad.txt")
    edit.add("kqv-1", (0, 0, 0), 0.05, occurrence=1)  # evaluation 1, layer 1
    r = run("check", edit.save())
    assert r.code == 1
    rows = [line.split() for line in r.out.splitlines() if re.match(r"\s+(0\.\.2|[012])\s+\d", line)]
    assert [(row[0], row[2], row[-1]) for row in rows] == [("0..2", "0", "PASS"), ("0..2", "1", "FAIL"),
                                                           ("1", "1", "FAIL")]
