"""Ctrl-C and SIGTERM (issues 23 and 25): every command ends with exit 130 (SIGINT) or 143 (SIGTERM), one line on
stderr, never a traceback (workers of -j 2 included: a terminal sends SIGINT to the whole process group), never
exit 1 (a CI timeout that interrupts a check is not a failed check), and no process of its group is left running.

The input is a real dump (fixtures/gpt2-long.txt, repeated to 5 MB so that -j 2 cuts it into parts for two workers)
written into a pipe that is never closed: attncheck is interrupted while it waits for more, as a CI job is.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import FIXTURES
from hostile import ROOT, attncheck_cmd, environ

DATA = FIXTURES.joinpath("gpt2-long.txt").read_bytes() * 60  # 9 MB: more than one block of stdin (8 MB)


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _interrupt(args: list[str], sig: int, *, workers: int = 0, feed: bytes | None = DATA) -> tuple[int, str]:
    """Start attncheck in a process group of its own, feed its stdin (left open), wait until it works (its input
    read, `workers` child processes started), send `sig` as a terminal (SIGINT: the group) or `kill` (SIGTERM: the
    process) does; its exit code and stderr. The group must be gone within 10 s."""
    proc = subprocess.Popen(attncheck_cmd(*args), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=environ(), start_new_session=True)
    fed = threading.Event()

    def write() -> None:
        try:
            proc.stdin.write(feed or b"")
            proc.stdin.flush()
        except BrokenPipeError:
            pass
        fed.set()  # the pipe holds 64 KB: past this, attncheck has read the rest

    threading.Thread(target=write, daemon=True).start()
    deadline = time.monotonic() + 60
    while not (fed.is_set() and len(_children(proc.pid)) >= workers):
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline, "attncheck never got to work"
        time.sleep(0.05)
    time.sleep(0.5)
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)
    else:
        os.kill(proc.pid, sig)
    try:
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    err = proc.stderr.read().decode()
    gone = time.monotonic() + 10
    while _group_alive(proc.pid) and time.monotonic() < gone:
        time.sleep(0.1)
    left = _group_alive(proc.pid)
    if left:
        os.killpg(proc.pid, signal.SIGKILL)
    assert not left, "a process of attncheck's group was left running"
    return code, err


COMMANDS = {
    "check": ("check", "-", "-j", "1"),
    "check-j2": ("check", "-", "-j", "2"),
    "list-j2": ("list", "-", "-j", "2"),
    "diff-j2": ("diff", FIXTURES / "gpt2-long.txt", "/dev/stdin", "-j", "2"),
    "inspect": ("inspect", "/dev/stdin", "--layer", "0", "--head", "0", "--eval", "1000000"),
}
WORKERS = {"check-j2": 2, "list-j2": 2, "diff-j2": 2}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_an_interrupted_command_exits_128_plus_the_signal_without_a_traceback(name, sig):
    code, err = _interrupt(list(COMMANDS[name]), sig, workers=WORKERS.get(name, 0))
    assert code == 128 + sig, (code, err)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.splitlines() == [f"attncheck: interrupted ({signal.Signals(sig).name}): no verdict"], err


def test_ctrl_c_during_run_ends_llama_cpp_too(tmp_path):
    """`run` starts llama.cpp in a process group of its own (a terminal's Ctrl-C reaches attncheck alone): attncheck
    ends that group on its way out, so no llama.cpp is left computing."""
    pidfile = tmp_path / "pid"
    fake = tmp_path / "llama-eval-callback"
    fake.write_text(f"#!/bin/sh\n[ \"$1\" = --help ] && {{ echo '--flash-attn [on|off|auto]'; exit 0; }}\n"
                    f"echo $$ > {pidfile}\nhead -c 2000000 {FIXTURES / 'gpt2-long.txt'}\nexec sleep 1000\n")
    fake.chmod(0o755)
    model = FIXTURES / "models" / "gpt2-mini-q8_0.gguf"
    code, err = _interrupt(["run", "--bin", fake, "-m", model, "-p", "x", "--dump-only"], signal.SIGINT, workers=1,
                           feed=None)
    assert code == 130 and "Traceback" not in err, err
    pid = int(pidfile.read_text())
    time.sleep(0.2)
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2], \
        "llama.cpp was left running"
