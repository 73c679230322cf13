"""Hostile GGUF headers (issue 25): a model file from anywhere, its metadata set to what no llama.cpp model holds.
Each is one line naming the model file and the key (exit 2), in every command that takes --model, never an internal
error, never gigabytes of memory. The files are the real fixtures/models/gpt2-mini-q8_0.gguf with one value replaced
(tests/gguf_edit.py): a hand-made header, because no real model carries these values.
"""
from __future__ import annotations

import math
import os
import re

import pytest

from conftest import FIXTURES
from gguf_edit import F32, I32, STRING, U32, U64, array, edit, value
from hostile import attncheck_cmd, measured

GPT2 = FIXTURES / "models" / "gpt2-mini-q8_0.gguf"
DUMP = FIXTURES / "gpt2-how-are.txt"

CASES = {  # name: (changes, the key the message must name)
    "alignment-0": ({"general.alignment": value(U32, 0)}, "general.alignment"),
    "alignment-abc": ({"general.alignment": value(STRING, "abc")}, "general.alignment"),
    "head_count-0": ({"gpt2.attention.head_count": value(U32, 0)}, "gpt2.attention.head_count"),
    "head_count-empty": ({"gpt2.attention.head_count": array(U32, 0)}, "gpt2.attention.head_count"),
    "head_count-negative": ({"gpt2.attention.head_count": value(I32, -12)}, "gpt2.attention.head_count"),
    "head_count-twelve": ({"gpt2.attention.head_count": value(STRING, "twelve")}, "gpt2.attention.head_count"),
    "head_count-per-layer-wrong-length": ({"gpt2.attention.head_count": array(U32, 3, b"\x0c\0\0\0" * 3)},
                                          "gpt2.attention.head_count"),
    "block_count-0": ({"gpt2.block_count": value(U32, 0)}, "gpt2.block_count"),
    "block_count-2^31": ({"gpt2.block_count": value(U32, 2**31)}, "gpt2.block_count"),
    "block_count-2^40": ({"gpt2.block_count": value(U64, 2**40)}, "gpt2.block_count"),
    "array-2^28": ({"general.tags": array(U32, 2**28)}, "general.tags"),
    "array-2^40-strings": ({"tokenizer.ggml.tokens": array(STRING, 2**40)}, "tokenizer.ggml.tokens"),
    "array-2^62": ({"gpt2.attention.head_count": array(U32, 2**62)}, "gpt2.attention.head_count"),
    "array-of-arrays": ({"general.tags": array(9, 2**20)}, "general.tags"),
    "embedding_length-0": ({"gpt2.embedding_length": value(U32, 0)}, "gpt2.embedding_length"),
    "epsilon-nan": ({"gpt2.attention.layer_norm_epsilon": value(F32, math.nan)}, "gpt2.attention.layer_norm_epsilon"),
}


def _one_error(r, model, key: str | None) -> str:
    assert not r.timed_out and r.code == 2, (r.code, r.err[-2000:])
    assert "Traceback" not in r.err and "internal error" not in r.err and "Warning" not in r.err, r.err
    lines = r.err.splitlines()
    assert len(lines) == 1 and str(model) in lines[0], r.err
    assert key is None or key in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_hostile_header_value_is_one_error_naming_the_file_and_the_key(name, tmp_path):
    changes, key = CASES[name]
    model = edit(GPT2, tmp_path / f"{name}.gguf", changes)
    r = measured(attncheck_cmd("check", DUMP, "--model", model), timeout=60)
    _one_error(r, model, key)
    # block_count 2^31 took 16.8 GB (a list of heads per layer) before the header was checked; 400 MB is 4× what a
    # check --model of this dump takes
    assert r.peak_mb < 400, r.peak_mb


@pytest.mark.parametrize("command", [
    ("diff", DUMP, DUMP, "--model"),
    ("inspect", DUMP, "--layer", "0", "--head", "0", "--model"),
    ("list", DUMP, "--model"),
])
def test_every_command_with_a_model_refuses_it_alike(command, tmp_path):
    model = edit(GPT2, tmp_path / "m.gguf", {"gpt2.block_count": value(U32, 2**31)})
    _one_error(measured(attncheck_cmd(*command, model), timeout=60), model, "gpt2.block_count")


def test_a_gguf_version_llama_cpp_does_not_read(tmp_path):
    model = edit(GPT2, tmp_path / "v99.gguf", {}, version=99)
    assert "version 99" in _one_error(measured(attncheck_cmd("check", DUMP, "--model", model), timeout=60), model, None)


def test_a_fifo_as_model_is_refused_without_waiting(tmp_path):
    """Opening a FIFO for reading waits for a writer: a model that is not a regular file is refused first."""
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    for command in (("check", DUMP, "--model", fifo), ("diff", DUMP, DUMP, "--model", fifo),
                    ("run", "-m", fifo, "-p", "x", "--bin", "/bin/false")):
        line = _one_error(measured(attncheck_cmd(*command), timeout=30), fifo, None)
        assert re.search("not a regular file", line), line
