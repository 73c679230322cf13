"""Narrow terminals: under a real pseudo-terminal of 80 and 60 columns, every table keeps its verdict column and
prints its numbers whole (fewer columns or wrapped cells, never `15.57…`); a pipe follows COLUMNS."""
from __future__ import annotations

import re

import pytest

import terminal
from conftest import FIXTURES, attncheck as run
from terminal import plain

CUT_NUMBER = re.compile(r"\d…|\d\.…|-…")  # a number rich cut short


def in_terminal(columns: int, *args: str) -> tuple[int, list[str]]:
    """Run attncheck in a pseudo-terminal of `columns` × 50 (no COLUMNS in the environment): exit code, lines."""
    code, raw = terminal.in_terminal(columns, *args)
    return code, plain(raw)


def rows_between(lines: list[str], title: str, stop=lambda line: not line.strip()) -> list[str]:
    """The body rows of the table under the first line starting with `title` (after its ─── rule)."""
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    rule = next(i for i in range(start, len(lines)) if "────" in lines[i])
    out = []
    for line in lines[rule + 1:]:
        if stop(line):
            break
        out.append(line)
    return out


@pytest.mark.parametrize("columns", [80, 60])
def test_check_keeps_each_rows_verdict(columns):
    code, lines = in_terminal(columns, "check", FIXTURES / "gpt2-how-are.txt", "--kq-scale", "0.1")
    assert code == 1
    rows = rows_between(lines, "attention in")
    assert len(rows) == 2 and all(r.rstrip().endswith("FAIL") for r in rows), rows
    assert all(len(r) <= columns for r in rows)
    assert not any(CUT_NUMBER.search(r) for r in rows)
    assert [r.split()[1] for r in rows] == ["0", "1"]  # eval and layer always shown


@pytest.mark.parametrize("columns", [80, 60])
def test_list_names_its_nodes_whole(columns):
    code, lines = in_terminal(columns, "list", FIXTURES / "gpt2-how-are.txt")
    assert code == 0
    text = "\n".join(lines)
    for name in ("kq-0 (493)", "kq_soft_max-0 (522)", "kqv-0 (551)", "kq_soft_max-1 (1196)"):
        assert name in text
    assert all(len(line) <= columns for line in lines)


@pytest.mark.parametrize("columns", [80, 60])
def test_list_keeps_its_one_row_evaluations_whole(columns):
    dump = FIXTURES / "gpt2-ubatch2.txt"
    code, lines = in_terminal(columns, "list", dump)
    assert code == 0
    rows = rows_between(lines, str(dump)[:20])
    ones = [r for r in rows if "as eval 0" in r]
    assert [r.split()[0] for r in ones] == ["1", "2"]
    assert "lines 1885..2617" in ones[0] and "lines 3273..4005" in ones[1]
    assert all(len(line) <= columns for line in lines)


@pytest.mark.parametrize("columns", [80, 60])
def test_inspect_keeps_its_numbers_and_verdicts(columns):
    code, lines = in_terminal(columns, "inspect", FIXTURES / "gpt2-how-are.txt", "--layer", "0", "--head", "0")
    assert code == 0
    assert not any(CUT_NUMBER.search(line) for line in lines), [line for line in lines if CUT_NUMBER.search(line)]
    scores = [r for r in rows_between(lines, "query 1 (position 1)") if re.match(r" \d", r) and len(r.split()) >= 3]
    assert [r.split()[0] for r in scores] == ["0", "1", "2", "3..252", "253", "254", "255"]
    assert [r.split()[-1] for r in scores if r.split()[0] != "3..252"] == ["ok"] * 6
    assert "0.9710" in scores[0] and "0.0290" in scores[1]
    dims = rows_between(lines, "O_h[1, d]")
    assert [r.split()[0] for r in dims if r.startswith(" d")] == ["d0", "d1", "d2", "d61", "d62", "d63"]
    assert all(r.split()[-1] == "ok" for r in dims if r.startswith(" d"))
    assert lines[-1].startswith("PASS") or any(line.startswith("PASS 2 visible weights") for line in lines)
    if columns == 80:
        assert "15.5782" in "\n".join(lines)  # the score of slot 0, whole


@pytest.mark.parametrize("columns", [80, 60])
def test_diff_keeps_each_nodes_verdict(columns):
    code, lines = in_terminal(columns, "diff", FIXTURES / "gpt2-how-are-you.txt", FIXTURES / "gpt2-kv-f32.txt",
                              "--exact")
    assert code == 1
    rows = rows_between(lines, "diff", stop=lambda line: not line.strip())
    verdicts = [r.split()[-1] for r in rows if re.match(r" \d+/", r)]
    assert len(verdicts) == 70 and set(verdicts) == {"same", "DIFF"} and verdicts.count("DIFF") == 51
    assert all(re.match(r" \d+/(input|output|\d+) ", r) for r in rows if not r.startswith("    "))
    assert not any(CUT_NUMBER.search(r) for r in rows)


def test_a_pipe_follows_columns():
    r = run("check", FIXTURES / "gpt2-ubatch2.txt", env={"COLUMNS": "70"})
    table = rows_between(r.out.splitlines(), "attention in")
    assert table and all(len(line) <= 70 for line in table)
    assert all(line.rstrip().endswith("PASS") for line in table)
    wide = run("check", FIXTURES / "gpt2-ubatch2.txt", env={"COLUMNS": ""})
    assert max(len(line) for line in rows_between(wide.out.splitlines(), "attention in")) > 70
