"""End to end: a real llama-eval-callback built here (`make llama`), piped into attncheck.

Run by `make e2e`, which builds the binary once into a cache folder and passes it in $LLAMA_EVAL_CALLBACK.
Without it these tests skip: the unit suite stays runnable on a machine that has not built llama.cpp.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from pipeline import BIN, GPT2, LLAMA, again_if_cut, pipe

pytestmark = pytest.mark.skipif(not BIN, reason="set LLAMA_EVAL_CALLBACK (make e2e builds and sets it)")


@pytest.mark.parametrize(
    "model, prompt, flags",
    [
        (GPT2, "How are you", ("--flash-attn", "off")),
        (GPT2, "The animal didn't cross the street because it was too tired.", ("--flash-attn", "off")),
        (GPT2, "I like to draw the cat", ("--flash-attn", "off", "-ub", "2")),
        (GPT2, "How are you", ("--flash-attn", "off", "-ctk", "f32", "-ctv", "f32")),
        (LLAMA, "We verify every number in the attention head, and we like it.", ("--flash-attn", "off")),
        (LLAMA, "How are you", ("--flash-attn", "off", "-ub", "1")),
    ],
)
def test_pipe_passes(model, prompt, flags):
    code, doc, err = pipe(model, prompt, *flags)
    assert code == 0, err
    t = doc["totals"]
    assert t["sites"] > 0 and t["softmax_rows_checked"] > 0 and t["kqv_elements_checked"] > 0
    ub = int(flags[flags.index("-ub") + 1]) if "-ub" in flags else None
    if ub:
        assert doc["evaluations"] > 1
        assert sorted({s["n_past"] for s in doc["sites"]}) == list(range(0, ub * doc["evaluations"], ub))


def test_flash_attention_without_model_is_unverified():
    code, doc, _ = pipe(GPT2, "How are", "--flash-attn", "on")
    assert code == 3
    assert doc["flash_attention_nodes"] > 0 and "--flash-attn off" in doc["reason"]


def test_wrong_kq_scale_fails_with_a_hint():
    code, doc, _ = pipe(GPT2, "How are you", "--flash-attn", "off", check_args=("--kq-scale", "0.2"))
    assert code == 1
    assert "0.125" in doc["hint"] or "0.124" in doc["hint"]


def test_run_command_keeps_the_dump(tmp_path):
    keep = tmp_path / "dump.txt"
    r = again_if_cut(lambda: subprocess.run(
        [sys.executable, "-m", "attncheck", "run", "-m", str(LLAMA), "-p", "I like to draw", "--keep", str(keep),
         "--json", "-", "--", "-t", "2", "--seed", "1"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "LLAMA_EVAL_CALLBACK": BIN}))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["totals"]["softmax_rows_checked"] == 36
    again = subprocess.run([sys.executable, "-m", "attncheck", "check", str(keep), "-q"], capture_output=True)
    assert again.returncode == 0


def test_run_reports_the_binary_failing(tmp_path):
    """A missing model stops attncheck before llama.cpp starts; an option llama.cpp refuses (after `--`) is its exit
    code and its own error line, on one line."""
    env = {**os.environ, "LLAMA_EVAL_CALLBACK": BIN}
    r = subprocess.run([sys.executable, "-m", "attncheck", "run", "-m", str(tmp_path / "missing.gguf"), "-p", "x"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 2 and r.stderr == f"attncheck: error: -m {tmp_path / 'missing.gguf'}: no such file\n"
    r = subprocess.run([sys.executable, "-m", "attncheck", "run", "-m", str(LLAMA), "-p", "x", "--", "--junit", "r.xml"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 2
    assert r.stderr == ("attncheck: error: llama-eval-callback: exited with code 1; it said: error: invalid argument: "
                        "--junit\n"), r.stderr
