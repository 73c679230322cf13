"""`llama-eval-callback ... 2>&1 | attncheck ...`, the way users run it, for the end-to-end tests.

llama.cpp's asynchronous logger loses the tail of its output at exit, at a point that changes from run to run (each
run prints a prefix of the same output). When the cut lands inside attention that a check needs, attncheck rightly
stops with exit 2 ("the dump ends inside ..."), so such a run is made again, at most ATTEMPTS times in all; a dump
saved for `check --model` is made again until it is whole (dump_file), so that its verdict covers the last layer
wherever it runs.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

BIN = os.environ.get("LLAMA_EVAL_CALLBACK")
MODELS = Path(__file__).resolve().parents[2] / "fixtures" / "models"
GPT2 = MODELS / "gpt2-mini-q8_0.gguf"
LLAMA = MODELS / "llama-mini-gqa-f16.gguf"
ATTEMPTS = 20  # the tail is lost in up to 7 of 12 runs of a small model (falcon, -ub 2): 20 tries leave ~2e-5 per case


def again_if_cut(run_once: Callable[[], subprocess.CompletedProcess]) -> subprocess.CompletedProcess:
    """Run attncheck on a fresh llama.cpp run until its output was not cut inside attention (ATTEMPTS at most)."""
    for _ in range(ATTEMPTS):
        done = run_once()
        assert "Traceback" not in done.stderr
        if not (done.returncode == 2 and "the dump ends" in done.stderr):
            break
    return done


def pipe(model: Path, prompt: str, *llama_args: str, check_args: tuple[str, ...] = (),
         timeout: int = 600) -> tuple[int, dict, str]:
    """Exit code, JSON report ({} when none) and stderr of attncheck reading llama.cpp's merged output."""

    def once() -> subprocess.CompletedProcess:
        llama = subprocess.Popen([BIN, "-m", str(model), "-p", prompt, "-t", "2", "--seed", "1", *llama_args],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        check = subprocess.run([sys.executable, "-m", "attncheck", "--json", "-", *check_args], stdin=llama.stdout,
                               capture_output=True, text=True, timeout=timeout)
        llama.stdout.close()
        assert llama.wait(timeout=timeout) == 0
        return check

    check = again_if_cut(once)
    return check.returncode, json.loads(check.stdout) if check.stdout.strip() else {}, check.stderr


def check_file(dump: Path, *args: str) -> tuple[int, dict, str]:
    """`attncheck check DUMP --json - ARGS`: exit code, JSON ({} when none), stderr."""
    done = subprocess.run([sys.executable, "-m", "attncheck", "check", str(dump), "--json", "-", *args],
                          capture_output=True, text=True, timeout=1800)
    assert "Traceback" not in done.stderr
    return done.returncode, json.loads(done.stdout) if done.stdout.strip() else {}, done.stderr


def complete(dump: Path) -> bool:
    """Whether llama.cpp's output holds its whole graph: the last node it prints is the logits, sum line included."""
    text = dump.read_text(errors="replace")
    last = max(text.rfind("common_debug_cb_eval:"), text.rfind("ggml_debug:"))  # today's header, 2024's
    return last >= 0 and "result_output = " in text[last:last + 300] and "sum = " in text[last:]


def dump_file(dump: Path, model: Path, prompt: str, *llama_args: str, timeout: int = 900) -> Path:
    """llama-eval-callback's merged output for a prompt, written to `dump`, whole: made again (ATTEMPTS at most)
    while llama.cpp's logger cuts its tail, so that a verdict covers every layer, as on a run that was not cut; a
    cut one is kept only when every attempt was cut, and then one that `check` without a model can read (not cut
    inside attention)."""
    readable = None
    for _ in range(ATTEMPTS):
        with open(dump, "wb") as out:
            done = subprocess.run([BIN, "-m", str(model), "-p", prompt, "-t", "2", "--seed", "1", *llama_args],
                                  stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=timeout)
        assert done.returncode == 0, dump.read_text(errors="replace")[-2000:]
        if complete(dump):
            return dump
        code, _, err = check_file(dump, "-q")
        if not (code == 2 and "the dump ends" in err) and readable is None:
            readable = dump.read_bytes()
    if readable is not None:
        dump.write_bytes(readable)
    return dump
