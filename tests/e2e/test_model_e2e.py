"""End to end with --model: a real llama-eval-callback (`make e2e` builds it) piped into `attncheck --model`.

These runs go beyond the shipped dumps (longer prompts, flash attention with many queries, -ub, f32 and bf16
caches): a correct llama.cpp must pass every check against the model's reference forward pass, with the error model
of attncheck/model/bounds.py, and a wrong model must not.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from pipeline import BIN, GPT2, LLAMA, pipe

LONG = ("In a hole in the ground there lived a hobbit. Not a nasty, dirty, wet hole, filled with the ends of worms "
        "and an oozy smell, nor yet a dry, bare, sandy hole with nothing in it to sit down on or to eat.")

pytestmark = pytest.mark.skipif(not BIN, reason="set LLAMA_EVAL_CALLBACK (make e2e builds and sets it)")


def pipe_model(model: Path, prompt: str, *llama_args: str, check_model: Path | None = None) -> tuple[int, dict, str]:
    """`llama-eval-callback ... 2>&1 | attncheck --model ... --json -`."""
    return pipe(model, prompt, *llama_args, check_args=("--model", str(check_model or model)))


@pytest.mark.parametrize("model", [GPT2, LLAMA], ids=["gpt2", "llama"])
@pytest.mark.parametrize("flags", [
    ("--flash-attn", "off"),
    ("--flash-attn", "on"),
    ("--flash-attn", "off", "-ub", "5"),
    ("--flash-attn", "on", "-ub", "16"),
    ("--flash-attn", "off", "-ctk", "f32", "-ctv", "f32"),
    ("--flash-attn", "off", "-ctk", "bf16", "-ctv", "bf16"),
], ids=lambda f: " ".join(f))
def test_long_prompt_passes_against_its_model(model, flags):
    code, doc, err = pipe_model(model, LONG, *flags)
    assert code == 0, err[-3000:]
    t = doc["totals"]
    assert t["model_elements_checked"] == t["model_elements_printed"] > 0
    assert doc["model"]["first_failed"] is None


def test_a_model_with_other_weights_fails():
    """The same geometry with different weights: llama-gqa's dump against a copy whose layer-0 Q is perturbed."""
    import gguf
    import numpy as np

    src = gguf.GGUFReader(str(LLAMA))
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"llama-perturbed-{os.getpid()}.gguf"
    w = gguf.GGUFWriter(str(out), "llama")
    for field in src.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        w.add_key_value(field.name, field.contents(), field.types[0],
                        field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None)
    for t in src.tensors:
        data = np.array(t.data)
        if t.name == "blk.0.attn_q.weight":
            data = (data.astype(np.float32) * 1.01).astype(data.dtype)
        w.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    try:
        code, doc, err = pipe_model(LLAMA, "How are you", "--flash-attn", "off", check_model=out)
        assert code == 1, err[-2000:]
        assert doc["model"]["first_failed"]["layer"] == 0
    finally:
        out.unlink()
