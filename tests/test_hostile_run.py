"""`attncheck run` never waits for ever (issue 25): llama.cpp stand-ins (shell scripts: what is tested is attncheck's
waiting, which no real llama.cpp run shows on demand) that print nothing and sleep, close their output and keep
running, or exit leaving a child that holds the output. Each ends within the stall timeout and a grace, with one
line (or, for the last, the verdict of what was printed), and no process of theirs is left.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from conftest import FIXTURES
from hostile import attncheck_cmd, measured

MODEL = FIXTURES / "models" / "gpt2-mini-q8_0.gguf"
HELP = "[ \"$1\" = --help ] && { echo '--flash-attn [on|off|auto]'; exit 0; }\n"
BODIES = {
    "prints-nothing": "exec sleep 1000\n",
    "closes-its-output": "exec >&- 2>&-\nexec sleep 1000\n",
    "child-holds-output": f"cat {FIXTURES / 'gpt2-how-are.txt'}\nsleep 1000 &\necho $! >> {{pids}}\nexit 0\n",
}


def _fake(tmp_path: Path, body: str) -> tuple[Path, Path]:
    pids = tmp_path / "pids"
    fake = tmp_path / "llama-eval-callback"
    fake.write_text("#!/bin/sh\n" + HELP + f"echo $$ >> {pids}\n" + body.replace("{pids}", str(pids)))
    fake.chmod(0o755)
    return fake, pids


def _left(pids: Path) -> list[int]:
    """The fake's processes still running (zombies aside)."""
    time.sleep(0.2)
    out = []
    for pid in map(int, pids.read_text().split()):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.append(pid)
    return out


@pytest.mark.parametrize("kind", sorted(BODIES))
def test_run_ends_a_llama_cpp_that_stalls(kind, tmp_path):
    fake, pids = _fake(tmp_path, BODIES[kind])
    r = measured(attncheck_cmd("run", "--bin", fake, "-m", MODEL, "-p", "x", "--stall-timeout", "2", "-q"),
                 timeout=30)  # a stall of 2 s and a grace of 2 s: 30 s only if the wait had no end
    assert not r.timed_out and "Traceback" not in r.err, r.err
    if kind == "child-holds-output":  # it printed a whole dump and exited: its verdict, once the grace is over
        assert r.code == 0 and r.out.startswith("PASS"), (r.code, r.err)
    else:
        assert r.code == 2, (r.code, r.err)
        what = "printed nothing for 2 s" if kind == "prints-nothing" else "closed its output but kept running for 2 s"
        assert r.err.splitlines() == [f"attncheck: error: llama-eval-callback: {what}: ended it (--stall-timeout "
                                      f"SECONDS waits longer{'; 0 for ever' if kind == 'prints-nothing' else ''})"]
    leftover = _left(pids)
    for pid in leftover:
        os.kill(pid, 9)
    assert not leftover, "a process of llama.cpp's was left running"
