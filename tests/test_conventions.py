"""A command line's conventions (issue 28): `--junit -` is stdout as `--json -` is; every report file written is one
stderr line with its path and size; `attncheck help [COMMAND]`; `diff` reads one side from stdin."""
from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET

import pytest

from conftest import FIXTURES, attncheck as run

HOW_ARE = FIXTURES / "gpt2-how-are.txt"
YOU = FIXTURES / "gpt2-how-are-you.txt"


@pytest.mark.parametrize("args", [("check", HOW_ARE), ("diff", YOU, YOU)], ids=["check", "diff"])
def test_junit_dash_is_stdout_and_the_table_goes_to_stderr(args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a file named '-' would land here
    r = run(*args, "--junit", "-")
    assert r.code == 0 and not os.path.exists(tmp_path / "-")
    root = ET.fromstring(r.out)
    assert root.tag == "testsuites" and int(root.get("tests")) >= 2 and root.get("failures") == "0"
    assert "PASS" in r.err  # the table and verdict, on stderr
    both = run(*args, "--junit", "-", "--json", "-")
    assert both.code == 2 and both.out == "" and "would both write to stdout" in both.err


def test_each_report_file_written_is_one_line_with_its_size(tmp_path):
    out = {k: tmp_path / f"r.{k}" for k in ("json", "junit", "html")}
    r = run("check", HOW_ARE, "-q", "--json", out["json"], "--junit", out["junit"], "--html", out["html"])
    assert r.code == 0
    said = [line for line in r.err.splitlines() if line.startswith("attncheck: wrote ")]
    assert len(said) == 3 and len(r.err.splitlines()) == 3
    for line, (kind, path) in zip(said, out.items()):
        size = path.stat().st_size
        words = f"{size} bytes" if size < 10_000 else f"{size / 1000:.0f} KB"
        assert line == f"attncheck: wrote {path} ({words})", (kind, line)
    assert json.loads(out["json"].read_text())["verdict"] == "pass"
    for args in (("inspect", HOW_ARE, "--layer", "0", "--head", "0"), ("list", HOW_ARE), ("diff", HOW_ARE, HOW_ARE)):
        r = run(*args, "--json", tmp_path / "x.json")
        assert r.code == 0 and f"attncheck: wrote {tmp_path / 'x.json'} (" in r.err, args
    assert "attncheck: wrote" not in run("check", HOW_ARE, "--json", "-").err  # stdout is no file


def test_help_is_a_command():
    r = run("help")
    assert r.code == 0 and "Commands:" in r.out and "inspect" in r.out
    assert r.out == run("--help").out
    for command in ("check", "run", "inspect", "diff", "list", "help"):
        sub = run("help", command)
        assert sub.code == 0 and sub.out == run(command, "--help").out, command
    assert "after it, untouched" in run("help", "run").out  # where llama.cpp's options go
    bad = run("help", "chek")
    assert bad.code == 2 and "no command 'chek'" in bad.err and "did you mean check?" in bad.err


def test_diff_reads_one_side_from_stdin(tmp_path):
    old, new = FIXTURES / "drift" / "phi3-cat.old.txt", FIXTURES / "drift" / "phi3-cat.new.txt"
    files = run("diff", old, new, "--json", "-").json()
    spool = tmp_path / "tmp"
    spool.mkdir()
    piped = run("diff", old, "-", "--json", "-", stdin=new.read_bytes(), env={"TMPDIR": str(spool)}).json()
    assert not list(spool.iterdir())  # the spooled copy of stdin is gone
    assert files["exit_code"] == piped["exit_code"] == 1  # today's build ignores phi3's window: a regression
    assert piped["new"] == "<stdin>" and piped["totals"] == files["totals"]
    assert piped["check"] == json.loads(json.dumps(files["check"]).replace(json.dumps(str(new))[1:-1], "<stdin>"))
    first = run("diff", "-", new, "-q", stdin=old.read_bytes())
    assert first.code == 1 and "FAIL diff <stdin> → " in first.out
    both = run("diff", "-", "-", stdin=old.read_bytes())
    assert both.code == 2 and "stdin is one dump" in both.err
