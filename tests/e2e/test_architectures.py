"""End to end over the architectures llama.cpp builds attention for: tiny random-weight GGUFs of each
(scripts/make_arch_models.py), run through the real llama-eval-callback, checked from the dump alone and with the
model's header (and reference forward pass where attncheck has one).

Every run is a correct llama.cpp run, so both ways must pass (3 for flash attention, which prints no scores); one
printed value moved past its bound must fail both ways. The facts the checks used are asserted too: a pass under
the wrong facts would be luck, not a verdict.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pipeline import ATTEMPTS, BIN

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dumpedit import DumpEdit  # noqa: E402

pytestmark = pytest.mark.skipif(not BIN, reason="set LLAMA_EVAL_CALLBACK (make e2e builds and sets it)")

ROOT = Path(__file__).resolve().parents[2]
TWO = "How are"
THIRTEEN = "The animal didn't cross the street because it was too tired."
SIX = "I like to draw the cat"
ENCODERS = {"bert", "gemma-embedding"}  # llama.cpp cannot split their batch: no -ub 2 run
PROMPT13 = {"bert": "The animal did not cross the street because it was too tired."}  # WordPiece splits "didn't"

# model → what the facts of its runs must be (the dump-only hypotheses, or the model's header)
FACTS = {
    "llama": {}, "gpt2": {}, "qwen2": {}, "qwen3": {}, "starcoder2": {}, "falcon": {}, "qwen35": {},
    "granite": {"kq_scale": 0.0625},
    "phi3": {"kq_scale": 1.0}, "gemma2": {"kq_scale": 1.0, "window": 4}, "gemma3": {"kq_scale": 1.0, "window": 4},
    "gemma-embedding": {"kq_scale": 1.0, "causal": False, "window": 4}, "bert": {"causal": False},
    "t5encoder": {"kq_scale": 1.0}, "bloom": {"alibi_max_bias": 8.0}, "mpt": {"alibi_max_bias": 8.0},
    "gpt-oss": {"sinks": True, "window": 4}, "deepseek2-mla": {"kq_scale": 40 ** -0.5},
    "deepseek2-kvb": {"kq_scale": 40 ** -0.5},
}
ROUTERS = {"gpt-oss", "deepseek2-mla", "deepseek2-kvb"}  # softmax MoE routers: SOFT_MAX nodes that are not attention
HYBRID = {"qwen35": {0, 2}}  # layers without softmax attention


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("arch-models")
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_arch_models.py"), str(out)], check=True,
                   capture_output=True)
    return out


def dump(models: Path, name: str, prompt: str, *flags: str, into: Path) -> Path:
    """A real llama.cpp run's merged output, made again while its tail was cut inside the first layer's attention."""
    path = into / f"{name}-{abs(hash((prompt, flags)))}.txt"
    for _ in range(ATTEMPTS):
        with open(path, "wb") as f:
            subprocess.run([BIN, "-m", str(models / f"{name}.gguf"), "-p", prompt, "-t", "2", "--seed", "1", *flags],
                           stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=300, check=True)
        if check(path)[0] != 2:
            break
    return path


def check(path: Path, *args: str) -> tuple[int, dict, str]:
    r = subprocess.run([sys.executable, "-m", "attncheck", "check", str(path), "--json", "-", *args],
                       capture_output=True, text=True, timeout=300)
    assert "Traceback" not in r.stderr
    return r.returncode, (json.loads(r.stdout) if r.stdout.strip() else {}), r.stderr


def assert_facts(doc: dict, name: str) -> None:
    want = FACTS[name]
    f = doc["facts"][0]
    for s in doc["sites"]:  # the scale each site used: 1/sqrt(D_h) unless the architecture says otherwise
        assert abs(s["kq_scale"] - want.get("kq_scale", s["D_h"] ** -0.5)) < 1e-6, (name, f["kq_scale"])
    assert f["causal"]["value"] is want.get("causal", True), (name, f["causal"])
    assert f["alibi_max_bias"]["value"] == want.get("alibi_max_bias", 0.0), (name, f["alibi_max_bias"])
    assert bool(f["sinks"]["value"]) is want.get("sinks", False), (name, f["sinks"])
    w = f["window"]["value"]
    if w is not None:  # a window shows only where a printed row reaches past it; the data fit a range of n_swa
        a, b = w.get("n_swa_range", (w["n_swa"], w["n_swa"]))
        assert a <= want["window"] <= b, (name, w)


@pytest.mark.parametrize("name", sorted(FACTS))
def test_correct_runs_pass_dump_only_and_with_the_model(name, models, tmp_path):
    runs = [(TWO, ("--flash-attn", "off")), (PROMPT13.get(name, THIRTEEN), ("--flash-attn", "off"))]
    if name not in ENCODERS:
        runs.append((SIX, ("--flash-attn", "off", "-ub", "2")))
    model = str(models / f"{name}.gguf")
    for prompt, flags in runs:
        path = dump(models, name, prompt, *flags, into=tmp_path)
        for args in ((), ("--model", model)):
            code, doc, err = check(path, *args)
            assert code == 0, (name, prompt, flags, args, err)
            assert_facts(doc, name)
            t = doc["totals"]
            assert t["sites"] == doc["evaluations"] * sum(k == "softmax" for k in doc["layers"].values())
            assert t["softmax_rows_checked"] + t["softmax_ratio_elements_checked"] > 0
            assert bool(doc["other_softmax"]) is (name in ROUTERS)
            for layer in HYBRID.get(name, ()):
                assert doc["layers"][str(layer)].startswith("recurrent"), doc["layers"]


@pytest.mark.parametrize("name", sorted(FACTS))
def test_flash_attention(name, models, tmp_path):
    """llama.cpp keeps flash attention on except where a score bias needs kq (t5): then the dump is checkable."""
    path = dump(models, name, PROMPT13.get(name, THIRTEEN), "--flash-attn", "on", into=tmp_path)
    code, doc, err = check(path)
    if name == "t5encoder":
        assert code == 0 and doc["flash_attention_nodes"] == 0, err
    else:
        assert code == 3 and doc["flash_attention_nodes"] > 0, err


# (node, (head, query, slot or dim), how) per fault; query 0 and 1 of the 13-token run have whole rows (n_past 0),
# and query 0 even under a symmetric window of 4 (slots 0..2)
FAULTS = {
    "weight": ("kq_soft_max-0", (0, 1, 0), lambda v: v + 0.003),
    "masked": ("kq_soft_max-0", (0, 0, -1), lambda v: 0.01),
    "kqv": ("kqv-0", (0, 0, 0), lambda v: v + 0.05),
}


@pytest.mark.parametrize("fault", sorted(FAULTS) + ["softcap"])
@pytest.mark.parametrize("name", sorted(FACTS))
def test_one_moved_value_fails_both_ways(name, fault, models, tmp_path):
    if fault == "softcap" and name != "gemma2":
        pytest.skip("soft-capping nodes exist in gemma2 only")
    # bert's 13-token rows see 13 slots and llama.cpp prints 6: no whole row there, the 2-token run has them
    prompt = TWO if name == "bert" else PROMPT13.get(name, THIRTEEN)
    path = dump(models, name, prompt, "--flash-attn", "off", into=tmp_path)
    e = DumpEdit(path, tmp_path / f"{name}-{fault}.txt")
    node, index, how = FAULTS.get(fault, ("kq_scaled_2-0", (0, 1, 0), lambda v: v + 0.01))
    layer0 = [n for n in ("kq_soft_max-0", "kqv-0") if e.headers(n)]
    if not layer0:  # a hybrid's first layer has no softmax attention
        node = node.replace("-0", "-1")
    if index[2] == -1:
        index = (index[0], index[1], e.node(node).ne[0] - 1)
    if name in ("bert", "gemma-embedding") and fault == "masked":
        pytest.skip("an encoder's query sees every slot it has: no masked slot in its layer 0")
    e.set(node, index, how(e.get(node, index)))
    moved = e.save()
    for args in ((), ("--model", str(models / f"{name}.gguf"))):
        code, doc, err = check(moved, *args)
        assert code == 1, (name, fault, args, err)
        failing = [c for s in doc["sites"] for c in s["checks"] if not c["passed"]]
        assert any(c["node"] == node for c in failing), (name, fault, [c["node"] for c in failing])
