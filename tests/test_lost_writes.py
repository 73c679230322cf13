"""A lost write loses no verdict (issue 25): a report to /dev/full, stdout whose reader went away (`| head -1`),
stdout or stderr closed (`>&-`, `2>&-`), stdout to a full disk. Every report that can be written is; the one that
cannot is one line naming it; the exit code is the verdict's when it is a FAIL, 2 when the verdict passed but a
report could not be written (stderr carries no report: a closed stderr changes nothing).

The failing dump is fixtures/llama-gqa-draw.txt with one printed weight moved (the README's example).
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import xml.etree.ElementTree as ET

import pytest

from conftest import FIXTURES
from dumpedit import DumpEdit
from hostile import attncheck_cmd, environ

PASSING = FIXTURES / "gpt2-how-are.txt"


@pytest.fixture
def failing(tmp_path):
    edit = DumpEdit(FIXTURES / "llama-gqa-draw.txt", tmp_path / "bad.txt")
    edit.set("kq_soft_max-0", (0, 1, 0), edit.get("kq_soft_max-0", (0, 1, 0)) + 0.002)
    return edit.save()


def _errors(err: str) -> list[str]:
    """stderr without the warnings (the failing dump's lost tail is one)."""
    return [line for line in err.splitlines() if not line.startswith("attncheck: warning:")]


def _shell(command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120, env=environ())


def _cmd(*args) -> str:
    return " ".join(map(shlex.quote, attncheck_cmd(*args)))


@pytest.mark.parametrize("verdict", [0, 1], ids=["pass", "fail"])
@pytest.mark.parametrize("lost", ["--json", "--junit", "--html"])
def test_a_report_to_a_full_disk_is_one_line_and_the_others_are_written(lost, verdict, failing, tmp_path):
    dump = failing if verdict else PASSING
    targets = {"--json": tmp_path / "r.json", "--junit": tmp_path / "r.xml", "--html": tmp_path / "r.html"}
    targets[lost] = "/dev/full"
    r = _shell(_cmd("check", dump, "-q", *[x for kv in targets.items() for x in kv]))
    assert r.returncode == (1 if verdict else 2), (r.returncode, r.stderr)
    assert _errors(r.stderr) == [f"attncheck: error: {lost} /dev/full: cannot write it: No space left on device"]
    assert ("FAIL " if verdict else "PASS ") + str(dump) in r.stdout
    for option, path in targets.items():
        if option != lost:
            assert path.stat().st_size > 0, option
    if lost != "--json":
        assert json.loads(targets["--json"].read_text())["exit_code"] == verdict
    if lost != "--junit":
        ET.parse(targets["--junit"])


@pytest.mark.parametrize("command", ["diff", "inspect", "list"])
def test_every_command_says_which_report_it_could_not_write(command, tmp_path):
    args = {"diff": ("diff", PASSING, PASSING, "--junit", tmp_path / "r.xml"),
            "inspect": ("inspect", PASSING, "--layer", "0", "--head", "0"), "list": ("list", PASSING)}[command]
    r = _shell(_cmd(*args, "--json", "/dev/full"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.splitlines()[-1] == "attncheck: error: --json /dev/full: cannot write it: No space left on device"


@pytest.mark.parametrize("verdict", [0, 1], ids=["pass", "fail"])
@pytest.mark.parametrize("how", ["reader-gone", "closed", "full"])
def test_stdout_lost_keeps_the_reports_and_a_failed_verdict(how, verdict, failing, tmp_path):
    """reader-gone: a pipe whose read end is closed before attncheck writes (what `| head -1` becomes once head has
    its line), made so here to be certain; closed: `>&-`; full: `> /dev/full`."""
    dump = failing if verdict else PASSING
    j, x = tmp_path / "r.json", tmp_path / "r.xml"
    args = attncheck_cmd("check", dump, "-v", "--json", j, "--junit", x)
    if how == "reader-gone":
        read, write = os.pipe()
        os.close(read)
        proc = subprocess.run(args, stdout=write, stderr=subprocess.PIPE, text=True, timeout=120, env=environ())
        os.close(write)
        code, err = proc.returncode, proc.stderr
    else:
        r = _shell(" ".join(map(shlex.quote, args)) + (" >&-" if how == "closed" else " > /dev/full"))
        code, err = r.returncode, r.stderr
    assert code == (1 if verdict else 2), (code, err)
    assert "Traceback" not in err and "internal error" not in err, err
    lines = _errors(err)
    assert len(lines) == 1 and lines[0].startswith("attncheck: error: stdout: the report could not be written"), err
    assert json.loads(j.read_text())["exit_code"] == verdict
    ET.parse(x)


@pytest.mark.parametrize("verdict", [0, 1], ids=["pass", "fail"])
def test_stderr_closed_changes_no_verdict(verdict, failing, tmp_path):
    dump = failing if verdict else PASSING
    r = _shell(_cmd("check", dump, "--json", tmp_path / "r.json") + " 2>&-")
    assert r.returncode == verdict
    assert ("FAIL " if verdict else "PASS ") + str(dump) in r.stdout
    assert json.loads((tmp_path / "r.json").read_text())["exit_code"] == verdict
