"""Unusable input: exit 2 and exactly one line on stderr, `attncheck: error: FILE:LINE: message` (or `FILE: message`
where no line applies), never a traceback. Damage to nodes no check needs: exit 0 and a warning line.

The damaged dumps are real dumps from fixtures/ cut or edited by tests/dumpedit.py, so that the damage sits where
real llama.cpp output puts it: inside the printed rows of a node, in its `sum =` line, in its header.
"""
from __future__ import annotations

import json
import re

import pytest

from conftest import FIXTURES, attncheck as run
from dumpedit import DumpEdit

HOW_ARE = FIXTURES / "gpt2-how-are.txt"
OLD = FIXTURES / "old-llama-gqa-how-are-you.txt"
LOG_LINE = "llama_perf_context_print:        load time =      12.34 ms"  # stderr text that 2>&1 interleaves


def error_line(r, source: str) -> tuple[int | None, str]:
    """Assert the shape of an input error and return (line or None, message)."""
    assert "Traceback" not in r.err + r.out, r.err
    assert r.code == 2, (r.code, r.err, r.out[-1000:])
    lines = r.err.splitlines()
    assert len(lines) == 1, r.err
    m = re.fullmatch(rf"attncheck: error: {re.escape(source)}(?::(\d+))?: (\S.*)", lines[0])
    assert m, lines[0]
    return (int(m.group(1)) if m.group(1) else None), m.group(2)


def n_lines(path) -> int:
    """Lines in a file, counting a last line without its newline."""
    data = path.read_bytes()
    return data.count(b"\n") + (0 if data.endswith(b"\n") else 1)


# --------------------------------------------------------------------------------------------------------------
# Not a dump at all
# --------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("content", [b"", b"\n\n   \n"], ids=["empty", "blank-lines"])
def test_empty_file(content, tmp_path):
    path = tmp_path / "dump.txt"
    path.write_bytes(content)
    line, message = error_line(run("check", path), str(path))
    assert line is None and "empty" in message


@pytest.mark.parametrize("args", [("check",), ()], ids=["check", "default-command"])
def test_empty_stdin(args):
    line, message = error_line(run(*args, stdin=b""), "<stdin>")
    assert line is None and "empty" in message


@pytest.mark.parametrize("model", sorted((FIXTURES / "models").glob("*.gguf")), ids=lambda p: p.name)
def test_gguf_model_file(model):
    """The real model files that made the dumps (fixtures/models/): given where the dump belongs."""
    line, message = error_line(run("check", model), str(model))
    assert line in (None, 1) and "GGUF" in message
    line, message = error_line(run("check", stdin=model.read_bytes()), "<stdin>")
    assert "GGUF" in message


def test_truncated_gguf_header(tmp_path):
    """Hand-made on purpose: the magic and a version, then nothing, as an interrupted download leaves a model.
    The real model files are covered above; this one shows the magic alone is enough to say what it is."""
    path = tmp_path / "partial.gguf"
    path.write_bytes(b"GGUF\x03\x00\x00\x00\x00\x00")
    line, message = error_line(run("check", path), str(path))
    assert line in (None, 1) and "GGUF" in message


def _log_only(tmp_path):
    """The log lines of a real run with no tensor printed: what llama.cpp says before its first node."""
    edit = DumpEdit(HOW_ARE, tmp_path / "log.txt")
    first = min(i for i, text in enumerate(edit.lines) if text.startswith("common_debug_cb_eval:"))
    edit.truncate(first - 1)
    edit.lines.append("")
    return edit.save()


@pytest.mark.parametrize("make", [_log_only, lambda tmp: FIXTURES / "MANIFEST.jsonl"], ids=["llama-log", "jsonl"])
def test_text_that_is_not_a_dump(make, tmp_path):
    path = make(tmp_path)
    assert path.read_text().strip()
    line, message = error_line(run("check", path), str(path))
    assert line is None
    assert "llama-eval-callback" in message or "no tensor dump" in message, message


def test_nonexistent_file(tmp_path):
    path = tmp_path / "missing.txt"
    line, message = error_line(run("check", path), str(path))
    assert line is None and "No such file" in message


def test_directory(tmp_path):
    line, _ = error_line(run("check", tmp_path), str(tmp_path))
    assert line is None


def test_one_bad_dump_among_good_ones_is_named(tmp_path):
    """Several dumps: the unusable one gets its error line, the good one its verdict; exit 2 (nothing failed)."""
    missing = tmp_path / "missing.txt"
    r = run("check", HOW_ARE, missing)
    assert r.code == 2 and "Traceback" not in r.err
    assert [line for line in r.err.splitlines() if line.startswith("attncheck: error:")] == [
        line for line in r.err.splitlines() if line.startswith(f"attncheck: error: {missing}: ")] != []
    assert f"PASS {HOW_ARE}" in r.out


# --------------------------------------------------------------------------------------------------------------
# A dump cut off inside a node a check needs
# --------------------------------------------------------------------------------------------------------------
def _cut(tmp_path, dump, name, occurrence, where):
    """Cut a copy inside `name`'s body: ('row', k, chars) keeps the first chars of the k-th printed row,
    ('sum', chars) of the sum line; returns the path."""
    edit = DumpEdit(FIXTURES / dump, tmp_path / dump)
    node = edit.node(name, occurrence)
    if where[0] == "row":
        edit.truncate(node.rows[where[1]], where[2])
    else:
        edit.truncate(node.sums[0], where[1])
    return edit.save()


@pytest.mark.parametrize("dump,name,occurrence,where", [
    ("gpt2-how-are.txt", "kqv-0", 0, ("row", 5, 40)),  # inside a row, as the logger loses its tail
    ("gpt2-how-are.txt", "kqv-0", 0, ("row", 0, None)),  # after a whole row line, without its newline
    ("gpt2-how-are.txt", "kqv-0", 0, ("row", 11, None)),  # the last row: only the brackets and the sum are missing
    ("gpt2-how-are.txt", "kqv-0", 0, ("sum", 10)),  # inside the `sum =` line
    ("gpt2-how-are.txt", "kqv-1", 0, ("row", 7, 60)),
    ("gpt2-ubatch2.txt", "kqv-0", 1, ("row", 2, 30)),  # the second evaluation's kqv: the first one was whole
    ("llama-gqa-draw.txt", "kqv-0", 0, ("row", 13, 50)),
    ("old-llama-gqa-how-are-you.txt", "kqv-0", 0, ("row", 4, 60)),
])
def test_dump_cut_inside_kqv_names_the_line_where_it_ends(dump, name, occurrence, where, tmp_path):
    path = _cut(tmp_path, dump, name, occurrence, where)
    line, message = error_line(run("check", path), str(path))
    assert line == n_lines(path), message
    assert f"'{name}'" in message


def test_dump_cut_inside_kq_soft_max_names_the_line_where_it_ends(tmp_path):
    path = _cut(tmp_path, "gpt2-how-are.txt", "kq_soft_max-0", 0, ("row", 3, 50))
    line, message = error_line(run("check", path), str(path))
    assert line == n_lines(path), message
    assert "'kq_soft_max-0'" in message, message


def test_dump_cut_inside_kq_is_an_error(tmp_path):
    path = _cut(tmp_path, "gpt2-how-are.txt", "kq-0", 0, ("row", 3, 50))
    line, message = error_line(run("check", path), str(path))
    assert line == n_lines(path) and "'kq-0'" in message, message


def test_dump_cut_inside_the_kqv_header_is_an_error(tmp_path):
    edit = DumpEdit(HOW_ARE, tmp_path / "d.txt")
    edit.truncate(edit.node("kqv-0").header, 100)
    path = edit.save()
    line, message = error_line(run("check", path), str(path))
    assert line == n_lines(path), message


def test_dump_cut_right_after_the_kqv_header_names_a_real_line(tmp_path):
    edit = DumpEdit(HOW_ARE, tmp_path / "d.txt")
    header = edit.node("kqv-0").line
    edit.truncate(header - 1)
    edit.lines.append("")  # the header line is whole, with its newline
    path = edit.save()
    line, message = error_line(run("check", path), str(path))
    assert line == n_lines(path) == header, message
    assert "next node" not in message, message


def test_dump_ending_before_kqv_is_an_error(tmp_path):
    edit = DumpEdit(HOW_ARE, tmp_path / "d.txt")
    edit.truncate(edit.node("kq_soft_max-0").sums[0])
    edit.lines.append("")
    path = edit.save()
    line, message = error_line(run("check", path), str(path))
    assert line is not None and line <= n_lines(path), message


# --------------------------------------------------------------------------------------------------------------
# Garbled numbers and a header that disagrees with its rows
# --------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["0.12.34", "12,34", "1e309", "0.81O8", "--0.8108", "nana"])
@pytest.mark.parametrize("dump,name,element", [
    ("gpt2-how-are.txt", "kq_soft_max-0", (1, 1, 0)),
    ("old-llama-gqa-how-are-you.txt", "kq_soft_max_ext-1", (6, 2, 1)),
    ("gpt2-ubatch2.txt", "kq_soft_max-1", (9, 0, 254)),
])
def test_garbled_number_in_the_weights_names_its_line(dump, name, element, text, tmp_path):
    edit = DumpEdit(FIXTURES / dump, tmp_path / dump)
    line = edit.line_of(name, element)
    edit.set(name, element, text)
    path = edit.save()
    got, message = error_line(run("check", path), str(path))
    assert got == line, message
    assert f"'{name}'" in message


def test_garbled_number_on_stdin_names_its_line(tmp_path):
    edit = DumpEdit(HOW_ARE, tmp_path / "d.txt")
    line = edit.line_of("kq_soft_max-0", (10, 0, 2))
    edit.set("kq_soft_max-0", (10, 0, 2), "0.00.00")
    got, _ = error_line(run(stdin=edit.save().read_bytes()), "<stdin>")
    assert got == line


@pytest.mark.parametrize("text", ["1234", ".8108", "8108."])
def test_number_not_in_print_format_names_its_line(text, tmp_path):
    edit = DumpEdit(HOW_ARE, tmp_path / "d.txt")
    line = edit.line_of("kq_soft_max-0", (1, 1, 0))
    edit.set("kq_soft_max-0", (1, 1, 0), text)
    path = edit.save()
    got, message = error_line(run("check", path), str(path))
    assert got == line, message


@pytest.mark.parametrize("text", ["24.0.0", "abc", "24,000000", ""])
def test_garbled_softmax_sum_names_its_line(text, tmp_path):
    edit = DumpEdit(HOW_ARE, tmp_path / "d.txt")
    i = edit.sum_line("kq_soft_max-0")
    edit.lines[i] = "    sum = " + text
    path = edit.save()
    got, message = error_line(run("check", path), str(path))
    assert got == i + 1, message


def test_log_line_inside_a_row_names_the_line(tmp_path):
    """Interleaving mid-line (a buffered stream flushing into a printed row) inside a node a check needs."""
    edit = DumpEdit(HOW_ARE, tmp_path / "d.txt")
    row = edit.node("kq_soft_max-0").rows[2]
    text = edit.lines[row]
    edit.insert(row, [text[:40] + LOG_LINE, text[40:]], replace=1)
    path = edit.save()
    got, message = error_line(run("check", path), str(path))
    assert got == row + 1 and "'kq_soft_max-0'" in message, message


@pytest.mark.parametrize("ne,first_bad_row", [((256, 3, 12, 1), 1), ((256, 1, 12, 1), 0)], ids=["T=3", "T=1"])
def test_header_ne_disagreeing_with_its_rows_names_the_first_line_that_differs(ne, first_bad_row, tmp_path):
    """kq_soft_max-0 of gpt2-how-are prints T = 2 rows per head; a header claiming 3 (or 1) disagrees at the line
    after the last row that fits: the `],` where a third row was due (or the second row where `],` was due)."""
    edit = DumpEdit(HOW_ARE, tmp_path / "d.txt")
    node = edit.node("kq_soft_max-0")
    expected = node.rows[first_bad_row] + 2  # 1-based line after that row
    edit.set_header_ne("kq_soft_max-0", ne)
    path = edit.save()
    got, message = error_line(run("check", path), str(path))
    assert got == expected, message
    assert "'kq_soft_max-0'" in message


# --------------------------------------------------------------------------------------------------------------
# Interleaved output that damages a header
# --------------------------------------------------------------------------------------------------------------
def _split_header(tmp_path, name):
    """A log line lands in the middle of a header (as real older-format dumps show near their end)."""
    edit = DumpEdit(HOW_ARE, tmp_path / "d.txt")
    node = edit.node(name)
    text = edit.lines[node.header]
    edit.insert(node.header, [text[:70] + LOG_LINE, text[70:]], replace=1)
    return edit.save(), node.line


@pytest.mark.parametrize("name", ["kq-0", "kq_soft_max-0", "kqv-0", "cache_v_l0 (view) (permuted)"])
def test_damaged_header_of_a_needed_node_is_an_error(name, tmp_path):
    path, header = _split_header(tmp_path, name)
    got, message = error_line(run("check", path), str(path))
    assert got in (header, header + 1), message


# --------------------------------------------------------------------------------------------------------------
# Damage that no check needs: a warning, and the verdict stands
# --------------------------------------------------------------------------------------------------------------
def _said(err: str) -> list[str]:
    """stderr without the lines naming each report file written."""
    return [line for line in err.splitlines() if not line.startswith("attncheck: wrote ")]


def _warnings(r, source: str) -> list[int]:
    assert "Traceback" not in r.err + r.out
    lines = _said(r.err)
    assert lines and all(re.match(rf"attncheck: warning: {re.escape(source)}:\d+: \S", line) for line in lines), r.err
    return [int(re.match(rf"attncheck: warning: {re.escape(source)}:(\d+):", line).group(1)) for line in lines]


@pytest.mark.parametrize("dump", ["gpt2-ubatch2.txt", "llama-gqa-draw.txt", "llama-gqa-long.txt"])
def test_shipped_dump_with_a_lost_tail_passes_with_a_warning(dump):
    """llama.cpp's asynchronous logger loses the tail at exit: these real dumps end inside a late node."""
    path = FIXTURES / dump
    lines = path.read_bytes().decode("latin-1").split("\n")
    last_header = max(i for i, text in enumerate(lines) if text.startswith("common_debug_cb_eval:")) + 1
    r = run("check", path)
    assert r.code == 0, r.err
    assert _warnings(r, str(path)) == [last_header]
    assert f"PASS {path}" in r.out


def test_cut_inside_a_late_node_passes_with_a_warning(tmp_path):
    edit = DumpEdit(HOW_ARE, tmp_path / "d.txt")
    node = edit.node("ffn_up-1")
    edit.truncate(node.rows[0], 30)
    path = edit.save()
    r = run("check", path, "--json", tmp_path / "report.json")
    assert r.code == 0, r.err
    assert _warnings(r, str(path)) == [node.line]
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["totals"]["softmax_rows_checked"] == 24 and doc["totals"]["kqv_elements_checked"] == 144
    assert len(doc["warnings"]) == 1


def test_damaged_header_of_a_late_node_passes_with_a_warning(tmp_path):
    path, header = _split_header(tmp_path, "ffn_out-1")
    r = run("check", path)
    assert r.code == 0, r.err
    assert _warnings(r, str(path)) == [header]


GPT2_MODEL = FIXTURES / "models" / "gpt2-mini-q8_0.gguf"
LLAMA_MODEL = FIXTURES / "models" / "llama-mini-gqa-f16.gguf"


@pytest.mark.parametrize("dump, model, name, nth", [
    ("gpt2-how-are.txt", GPT2_MODEL, "result_norm", 0),  # the shape of the 2024 log's damage (fixtures/drift/)
    ("gpt2-how-are.txt", GPT2_MODEL, "ffn_up-1", 0),  # was exit 2: ffn_gelu-1 taken for ffn_norm, "does not fit"
    ("gpt2-how-are.txt", GPT2_MODEL, "cache_k_l0 (view)", 0),  # was exit 1: V's cache write taken for K's
    ("llama-gqa-how-are-you.txt", LLAMA_MODEL, "Qcur-0", 0),  # was exit 1: the RESHAPE also named Qcur-0 taken for it
    ("llama-gqa-how-are-you.txt", LLAMA_MODEL, "embd", 0),  # was exit 2: an internal error
    # an evaluation's first node: where the next evaluation starts (-ub 2: three evaluations)
    ("gpt2-ubatch2.txt", GPT2_MODEL, "embd", 0),  # was exit 2 with the model: evaluation 1's embd read as 0's
    ("gpt2-ubatch2.txt", GPT2_MODEL, "embd", 1),  # was exit 1 without the model too: evaluations 0 and 1 read as one
    ("gpt2-ubatch2.txt", GPT2_MODEL, "cache_k_l0 (view)", 1),  # was exit 1 without the model too
])
def test_damaged_header_no_check_needs_is_a_warning_with_the_model_too(dump, model, name, nth, tmp_path):
    """Hand-made: the one real damaged header (fixtures/drift/gpt2-deep-damaged.old.txt.xz, result_norm's) was made
    with a model that is not shipped, and damage lands anywhere; here a shipped dump's header of `name` is split by a
    log line the same way, so that --model runs on it. With the model as without: a warning naming the node, every
    other node checked (those placed by their position after a lost one counted as not checked, never guessed), the
    lost node counted among the printed nodes not checked."""
    edit = DumpEdit(FIXTURES / dump, tmp_path / "d.txt")
    node = edit.node(name, nth)
    text = edit.lines[node.header]
    edit.insert(node.header, [text[:70] + LOG_LINE, text[70:]], replace=1)
    path = edit.save()
    alone = run("check", path, "-q", "--json", "-")
    assert alone.code == 0, alone.err
    whole = run("check", FIXTURES / dump, "-q", "--json", "-").json()
    assert alone.json()["totals"] == whole["totals"]  # every attention check of the clean dump, in its evaluation
    r = run("check", path, "--model", model, "--json", tmp_path / "r.json")
    assert r.code == 0, r.err
    assert f"{path}:{node.line}: damaged header line of '{name}' (interleaved output?): skipped with its body; no " \
           "attention check needed it; --model checks skip it" in r.err
    doc = json.loads((tmp_path / "r.json").read_text())["model"]
    clean = json.loads(run("check", FIXTURES / dump, "--model", model, "--json", "-").out)["model"]
    assert doc["nodes_printed"] == clean["nodes_printed"]  # the lost node counts as printed, and not checked
    was = {u["line"] for u in clean["unchecked"]["nodes"]}
    now = {u["line"] - (u["line"] > node.line): u["why"] for u in doc["unchecked"]["nodes"]}  # the log line added
    assert now.pop(node.line) == "its header line was damaged (interleaved output?): its values were not read"
    # what else the model no longer checks says why: its place was hidden by the lost node, or it reads that node
    assert all(f"line {node.line}" in why for line, why in now.items() if line not in was), now
    assert clean["nodes_checked"] - 8 <= doc["nodes_checked"] < clean["nodes_checked"]


@pytest.mark.parametrize("name", ["ffn_out-1", "Qcur-1"])
def test_a_sum_split_by_log_lines_leaves_only_its_node_unchecked_with_the_model(name, tmp_path):
    """Hand-made after a real one (a 2024 SmolLM2 F16 run of the calibration set, not shipped: its model is 270 MB):
    llama.cpp's timing lines, on stderr, landed inside ffn_out-29's `sum = -41.830086` line, after `-41.83008`, its
    last digit on a line of its own. The whole run was refused (exit 2, nothing checked against the model); now that
    node alone is named as not checked, and every other one is checked. The same line cut without log lines in it
    is still an error, and so is a split node the attention checks read (kq, kq_soft_max, kqv: see the header case
    below)."""
    edit = DumpEdit(FIXTURES / "gpt2-how-are.txt", tmp_path / "d.txt")
    node = edit.node(name)
    at = next(i for i in range(node.header + 1, len(edit.lines)) if edit.lines[i].strip().startswith("sum = "))
    text = edit.lines[at]
    edit.insert(at, [text[:-1], LOG_LINE, text[-1]], replace=1)
    path = edit.save()
    r = run("check", path, "--model", GPT2_MODEL, "--json", tmp_path / "r.json")
    assert r.code == 0, r.err
    doc = json.loads((tmp_path / "r.json").read_text())["model"]
    clean = json.loads(run("check", FIXTURES / "gpt2-how-are.txt", "--model", GPT2_MODEL, "--json", "-").out)["model"]
    assert doc["nodes_printed"] == clean["nodes_printed"] and doc["nodes_checked"] == clean["nodes_checked"] - 1
    why = {u["line"]: u["why"] for u in doc["unchecked"]["nodes"]}
    assert why[node.line].startswith(f"its print was broken by interleaved log lines (line {at + 1}: ")
    edit = DumpEdit(FIXTURES / "gpt2-how-are.txt", tmp_path / "e.txt")
    edit.insert(at, [text[:-1]], replace=1)  # the digit lost, no log line: a damaged print
    got, message = error_line(run("check", edit.save(), "--model", GPT2_MODEL), str(tmp_path / "e.txt"))
    assert got == at + 1, message


@pytest.mark.parametrize("name", ["kq-0", "cache_v_l0 (view) (permuted)"])
def test_damaged_header_of_a_needed_node_is_an_error_with_the_model_too(name, tmp_path):
    path, header = _split_header(tmp_path, name)
    got, message = error_line(run("check", path, "--model", GPT2_MODEL), str(path))
    assert got in (header, header + 1), message


def test_log_lines_between_rows_are_skipped(tmp_path):
    """Whole log lines between the rows of a needed node (stderr flushed between two stdout lines) are not
    damage: the node reads as printed and nothing is lost."""
    edit = DumpEdit(HOW_ARE, tmp_path / "d.txt")
    for name in ("kqv-0", "kq_soft_max-0"):  # later lines first, so earlier line numbers stay put
        row = edit.node(name).rows[2]
        edit.insert(row, [LOG_LINE], replace=0)
    path = edit.save()
    r = run("check", path, "--json", "-")
    assert r.code == 0, r.err
    assert r.json()["totals"]["kqv_elements_checked"] == 144


# --------------------------------------------------------------------------------------------------------------
# Text from the input on every output: no terminal control sequence, no rich markup, JUnit that parses
# --------------------------------------------------------------------------------------------------------------
# Hand-made on purpose: no llama.cpp run names a node `kq_soft_max\x1b[2J[bold red]-0`, and no shipped model holds
# such a token; the dumps and models are the real fixtures with those strings written into them. Each drawn string is
# put where a dump, a path, a log line or a GGUF can carry it, every command runs with every output it has, and
# no output may hold a control character (an ESC, a BEL, a C1, a bidi override), show markup's effect (the
# brackets must print as written), or hold JUnit that does not parse.
import contextlib
import io
import os
import signal
import sys
import xml.etree.ElementTree as ET

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from attncheck.errors import printable
from dumpedit import DumpEdit as _Edit
from htmlcases import nasty_model

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
PIECES = ["\x1b]0;title\x1b\\", "\x1b[2J", "\x1b[31m", "\x07", "\x9b", "\x00", "\r", "\x7f", "\u202e", "[bold red]",
          "[/]", "[/bold]", "[link=x]", "]", "[", "\\", "x", " ", "é", "'", "\""]
HOSTILE = st.lists(st.sampled_from(PIECES), min_size=1, max_size=6).map("".join)


def _cli(*args) -> tuple[int, str, str]:
    """The command line in this process (the console script's, without its os._exit), its exit code and output."""
    from attncheck.cli import command_line

    out, err = io.StringIO(), io.StringIO()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    argv = sys.argv
    sys.argv = ["attncheck", *map(str, args)]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = command_line()
    finally:
        sys.argv = argv
        for s, h in handlers.items():
            signal.signal(s, h)
    return code, out.getvalue(), err.getvalue()


def _clean_output(*texts: str) -> None:
    for text in texts:
        assert "Traceback" not in text and "internal error" not in text, text[-2000:]
        bad = CONTROL.search(text)
        assert bad is None, f"control character {bad.group()!r} in the output: ...{text[max(0, bad.start() - 80):bad.end() + 80]!r}"


def _files(*paths) -> None:
    """Every report written: no raw control character, JUnit that parses."""
    for p in paths:
        if not os.path.exists(p):
            continue
        text = open(p, encoding="utf-8").read()
        _clean_output(text)
        if str(p).endswith(".xml"):
            ET.parse(p)


def _hostile_dump(folder, junk: str, path_junk: str):
    """gpt2-how-are.txt with one weight moved (a FAIL) and kq_soft_max-0 renamed to carry `junk`, at a path that
    carries `path_junk`."""
    name = "kq_soft_max" + junk + "-0"
    path = folder / ("d" + path_junk.replace("/", "").replace("\x00", "") + ".txt")
    edit = _Edit(HOW_ARE, path)
    edit.set("kq_soft_max-0", (0, 1, 1), edit.get("kq_soft_max-0", (0, 1, 1)) + 0.002)
    edit.save()
    path.write_bytes(path.read_bytes().decode("latin-1").replace("kq_soft_max-0", name).encode("utf-8"))
    return path


SAFE_NAME = HOSTILE.filter(lambda s: not re.search(r"[{}=,\d-]|^\s|\s$", s) and "\n" not in s)


FUZZ = dict(derandomize=True, database=None, deadline=None, phases=[Phase.explicit, Phase.generate],  # no shrinking:
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # a fail shows at once


@settings(max_examples=8, **FUZZ)
@given(junk=SAFE_NAME, path_junk=HOSTILE)
def test_names_and_paths_from_the_input_reach_no_output_as_control_or_markup(junk, path_junk, tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile")
    dump = _hostile_dump(folder, junk, path_junk)
    (folder / "x[").mkdir()
    other = folder / "x[" / "].txt"  # the path `x[/].txt`: a closing tag in markup
    other.write_bytes(HOW_ARE.read_bytes())
    j, x, h = folder / "r.json", folder / "r.xml", folder / "r.html"
    shown = printable(str(dump))
    code, out, err = _cli("check", dump, "-v", "-j", "1", "--json", j, "--junit", x, "--html", h)
    assert code == 1, err
    _clean_output(out, err)
    _files(j, x, h)
    assert f"FAIL {shown}: " in out and json.loads(j.read_text())["source"] == str(dump)
    code, out, err = _cli("check", dump, other, "-q", "--fail-fast", "-j", "1", "--junit", x)
    assert code == 1 and printable(str(other)) in out, (out, err)
    _clean_output(out, err)
    _files(x)
    for args in (("list", dump, "-v", "-j", "1"), ("list", dump, "--json", "-"),
                 ("inspect", dump, "--layer", "0", "--head", "0", "--json", j, "--html", h),
                 ("diff", HOW_ARE, dump, "-v", "-j", "1", "--json", j, "--junit", x, "--html", h),
                 ("diff", HOW_ARE, dump, "-q", "-j", "1")):
        code, out, err = _cli(*args)
        assert code in (0, 1), (args, code, err)
        _clean_output(out, err)
        _files(j, x, h)


@settings(max_examples=6, **FUZZ)
@given(junk=HOSTILE.filter(lambda s: "\n" not in s and "\r" not in s and s.strip() == s and s))
def test_log_lines_and_a_2024_logs_keys_reach_no_output_as_control_or_markup(junk, tmp_path_factory):
    folder = tmp_path_factory.mktemp("log")
    edit = _Edit(OLD, folder / "old.txt")
    edit.lines = [line.replace("general.architecture str              = llama",
                               "general.architecture str              = " + junk) for line in edit.lines]
    row = edit.node("kqv-0").rows[1]
    edit.insert(row, ["llama_log: " + junk], replace=0)  # a log line between a node's rows: skipped, not quoted
    old = edit.save()
    old.write_bytes(old.read_bytes().decode("latin-1").encode("utf-8"))
    x = folder / "r.xml"
    for args in (("check", old, "-v", "--junit", x), ("list", old, "-v"), ("diff", old, OLD, "--junit", x)):
        code, out, err = _cli(*args)
        assert code in (0, 1), (args, code, err)
        _clean_output(out, err)
        _files(x)
    bad = _Edit(HOW_ARE, folder / "bad.txt")  # the same line inside a checked row: an error that quotes it
    i = bad.node("kq_soft_max-0").rows[2]
    bad.lines[i] = bad.lines[i][:30] + junk + bad.lines[i][30:]
    path = bad.save()
    path.write_bytes(path.read_bytes().decode("latin-1").encode("utf-8"))
    code, out, err = _cli("check", path, "--junit", x)
    assert code == 2 and len(_said(err)) == 1, err
    _clean_output(out, err)
    _files(x)


@settings(max_examples=4, **FUZZ)
@given(junk=HOSTILE)
def test_a_models_token_text_reaches_no_output_as_control_or_markup(junk, tmp_path_factory, monkeypatch):
    import htmlcases

    folder = tmp_path_factory.mktemp("model")
    monkeypatch.setattr(htmlcases, "NASTY", junk)
    model = nasty_model(folder / "m.gguf")
    j, h = folder / "r.json", folder / "r.html"
    for args in (("check", HOW_ARE, "--model", model, "-v", "--json", j, "--html", h),
                 ("list", HOW_ARE, "--model", model),
                 ("inspect", HOW_ARE, "--layer", "0", "--head", "0", "--model", model, "--html", h)):
        code, out, err = _cli(*args)
        assert code == 0, (args, code, err)
        _clean_output(out, err)
        _files(j, h)
    from gguf_edit import STRING, edit, value  # the same text as the architecture's name: quoted in the error

    named = edit(htmlcases.GPT2, folder / "arch.gguf", {"general.architecture": value(STRING, junk)})
    code, out, err = _cli("check", HOW_ARE, "--model", named, "--junit", folder / "r.xml")
    assert code == 2 and len(_said(err)) == 1, err
    _clean_output(out, err)
    _files(folder / "r.xml")


def test_paths_that_read_as_emoji_codes_print_as_written(tmp_path):
    """rich's console turned `:smile:` in a path (or a token's text) into an emoji: `PASS /tmp/a😄b.txt`."""
    path = tmp_path / "a:smile:b:1st_place_medal:.txt"
    path.write_bytes(HOW_ARE.read_bytes())
    r = run("check", path)
    assert r.code == 0 and f"PASS {path}: " in r.out and str(path) in r.out.replace("\n", ""), r.out
    assert "\N{SMILING FACE WITH OPEN MOUTH AND SMILING EYES}" not in r.out and "\N{FIRST PLACE MEDAL}" not in r.out


def test_paths_that_read_as_markup_print_as_written(tmp_path):
    """`y[bold red]RED.txt` printed red, and `x[/].txt` was an internal error that lost the reports (issue 25): both
    print as written in the --fail-fast line, the verdict stays the failing dump's, and the reports are written."""
    bad = tmp_path / "bad.txt"
    edit = DumpEdit(FIXTURES / "llama-gqa-draw.txt", bad)
    edit.set("kq_soft_max-0", (0, 1, 0), edit.get("kq_soft_max-0", (0, 1, 0)) + 0.002)
    edit.save()
    red = tmp_path / "y[bold red]RED.txt"
    red.write_bytes(HOW_ARE.read_bytes())
    (tmp_path / "x[").mkdir()
    close = tmp_path / "x[" / "].txt"
    close.write_bytes(HOW_ARE.read_bytes())
    r = run("check", bad, red, close, "--fail-fast", "-q", "--json", tmp_path / "r.json", "--junit",
            tmp_path / "r.xml")
    assert r.code == 1 and "internal error" not in r.err, r.err
    assert f"2 of 3 dumps not checked: {red}, {tmp_path}/x[/].txt" in r.out
    assert json.loads((tmp_path / "r.json").read_text())["not_checked"] == [str(red), str(close)]
    ET.parse(tmp_path / "r.xml")
    r = run(red, "-q")
    assert r.code == 0 and f"PASS {red}: " in r.out


def test_a_path_with_escapes_is_written_escaped_and_junit_parses(tmp_path):
    path = tmp_path / "d\x1b]0;title\x07\x1b[2J.txt"
    path.write_bytes(HOW_ARE.read_bytes())
    r = run("check", path, "--junit", tmp_path / "r.xml")
    assert r.code == 0 and "\x1b" not in r.out + r.err
    assert f"PASS {printable(str(path))}: " in r.out
    root = ET.parse(tmp_path / "r.xml").getroot()
    assert root.find("testsuite").get("name") == f"attncheck check {printable(str(path))}"
    r = run("diff", path, HOW_ARE, "--junit", tmp_path / "d.xml", "-q")
    assert r.code == 0 and "\x1b" not in r.out + r.err
    ET.parse(tmp_path / "d.xml")
