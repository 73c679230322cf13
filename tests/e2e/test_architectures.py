"""End to end over the architectures llama.cpp builds attention for: tiny random-weight GGUFs of each
(scripts/make_arch_models.py), run through the real llama-eval-callback, checked from the dump alone and with the
model's header (and reference forward pass where attncheck has one).

Every run is a correct llama.cpp run, so both ways must pass (3 for flash attention, which prints no scores); one
printed value moved past its bound must fail both ways. The facts the checks used are asserted too: a pass under
the wrong facts would be luck, not a verdict. Each model's dumps are checked in one attncheck process per way
(`check A B C` reports every dump), which keeps the run short.
"""
from __future__ import annotations

import json
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

# (node, (head, query, slot or dim), how) per fault in the 13-token run (the 2-token one for bert, whose 13-token
# rows see 13 slots of which llama.cpp prints 6); queries 0 and 1 have whole rows, query 0 even under a symmetric
# window of 4 (slots 0..2); the soft-cap output exists in gemma2 only, a masked slot in layer 0 not for bert
FAULTS = {
    "weight": ("kq_soft_max-0", (0, 1, 0), lambda v: v + 0.003),
    "masked": ("kq_soft_max-0", (0, 0, -1), lambda v: 0.01),
    "kqv": ("kqv-0", (0, 0, 0), lambda v: v + 0.05),
    "softcap": ("kq_scaled_2-0", (0, 1, 0), lambda v: v + 0.01),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("arch-models")
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_arch_models.py"), str(out)], check=True,
                   capture_output=True)
    return out


def dump(models: Path, name: str, prompt: str, *flags: str, into: Path) -> Path:
    """A real llama.cpp run's merged output, made again while its tail was cut inside attention, or, for a model with
    MoE routers, before its last router's print (llama.cpp's logger loses the tail of its output at exit: deepseek2's
    only router is in its last layer, and a router never printed is none attncheck could report)."""
    path = into / f"{name}-{len(prompt)}-{'-'.join(f.strip('-') for f in flags)}.txt"
    for _ in range(ATTEMPTS):
        with open(path, "wb") as f:
            subprocess.run([BIN, "-m", str(models / f"{name}.gguf"), "-p", prompt, "-t", "2", "--seed", "1", *flags],
                           stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=300, check=True)
        _, docs, err = check([path])
        if "the dump ends" not in err and not (name in ROUTERS and docs and not docs[0]["other_softmax"]):
            break
    return path


def check(paths: list[Path], *args: str) -> tuple[int, list[dict], str]:
    """One attncheck process over several dumps: its exit code, each dump's JSON report, stderr."""
    r = subprocess.run([sys.executable, "-m", "attncheck", "check", *map(str, paths), "--json", "-", *args],
                       capture_output=True, text=True, timeout=600)
    assert "Traceback" not in r.stderr
    doc = json.loads(r.stdout) if r.stdout.strip() else {}
    return r.returncode, doc.get("dumps", [doc] if doc else []), r.stderr


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
def test_architecture(name, models, tmp_path):
    model = str(models / f"{name}.gguf")
    long = PROMPT13.get(name, THIRTEEN)
    runs = [(TWO, ("--flash-attn", "off")), (long, ("--flash-attn", "off"))]
    if name not in ENCODERS:
        runs.append((SIX, ("--flash-attn", "off", "-ub", "2")))
    paths = [dump(models, name, prompt, *flags, into=tmp_path) for prompt, flags in runs]

    # correct runs pass, from the dump alone and with the model
    for args in ((), ("--model", model)):
        code, docs, err = check(paths, *args)
        assert code == 0, (name, args, err)
        for doc in docs:
            assert_facts(doc, name)
            t = doc["totals"]
            assert t["sites"] == doc["evaluations"] * sum(k == "softmax" for k in doc["layers"].values())
            assert t["softmax_rows_checked"] + t["softmax_ratio_elements_checked"] > 0
            assert bool(doc["other_softmax"]) is (name in ROUTERS)
            for layer in HYBRID.get(name, ()):
                assert doc["layers"][str(layer)].startswith("recurrent"), doc["layers"]

    # flash attention: 3 (no scores printed), except where a score bias needs kq (t5) and the dump stays checkable
    flash = dump(models, name, long, "--flash-attn", "on", into=tmp_path)
    code, docs, err = check([flash])
    assert (code, docs[0]["flash_attention_nodes"] == 0) == ((0, True) if name == "t5encoder" else (3, False)), err

    # one moved value fails both ways, at its node
    source = paths[0] if name == "bert" else paths[1]
    moved, nodes = [], []
    for fault, (node, index, how) in FAULTS.items():
        if (fault == "softcap" and name != "gemma2") or (fault == "masked" and name == "bert"):
            continue
        e = DumpEdit(source, tmp_path / f"{name}-{fault}.txt")
        if not e.headers(node):  # a hybrid's first layer has no softmax attention
            node = node.replace("-0", "-1")
        if index[2] == -1:
            index = (index[0], index[1], e.node(node).ne[0] - 1)
        e.set(node, index, how(e.get(node, index)))
        moved.append(e.save())
        nodes.append(node)
    for args in ((), ("--model", model)):
        code, docs, err = check(moved, *args)
        assert code == 1, (name, args, err)
        for doc, node in zip(docs, nodes):
            assert doc["verdict"] == "fail", (name, node, args)
            failing = [c for s in doc["sites"] for c in s["checks"] if not c["passed"]]
            assert any(c["node"] == node for c in failing), (name, node, [c["node"] for c in failing])
