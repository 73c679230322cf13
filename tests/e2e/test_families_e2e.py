"""End to end, every model family with a reference forward pass: scripts/make_arch_models.py's random models through
the real llama-eval-callback, checked with `--model` (flash attention off and on, several ubatches, quantized KV
caches), and one printed value of layer 0 moved in a copy of the dump, which must fail naming that node."""
from __future__ import annotations

import pytest
from dumpedit import DumpEdit
from pipeline import BIN, check_file, dump_file

pytestmark = pytest.mark.skipif(not BIN, reason="set LLAMA_EVAL_CALLBACK (make e2e builds and sets it)")

FAMILIES = ["llama", "gpt2", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "granite", "starcoder2", "falcon"]
PROMPT = "The animal didn't cross the street because it was too tired."  # 13 tokens of the models' vocabulary
CASES = [("--flash-attn", "off"), ("--flash-attn", "on"), ("--flash-attn", "off", "-ub", "5")]
# what each family prints that other families do not, and --model must check
OWN_CHECKS = {"gemma2": {"model_attn_post", "model_ffn_post", "model_kq_scores"},
              "gemma3": {"model_attn_post", "model_ffn_post"}, "granite": {"model_attn_post", "model_ffn_post"}}


def checks_of(doc: dict) -> set[str]:
    return {c["check"] for s in doc["sites"] for c in s["checks"]}


@pytest.mark.parametrize("flags", CASES, ids=lambda f: " ".join(f))
@pytest.mark.parametrize("family", FAMILIES)
def test_family_passes_against_its_model(family, flags, arch_models, tmp_path):
    model = arch_models / f"{family}.gguf"
    dump = dump_file(tmp_path / "dump.txt", model, PROMPT, *flags)
    code, doc, err = check_file(dump, "--model", str(model))
    assert code == 0, err[-3000:]
    m = doc["model"]
    assert m["arch"] == family and m["first_failed"] is None
    t = doc["totals"]
    assert t["model_elements_checked"] == t["model_elements_printed"] > 0
    flash = "on" in flags
    want = {"model_q", "model_kcur", "model_vcur", "model_attn_out", "model_l_out"} | OWN_CHECKS.get(family, set())
    want |= {"model_flash_attn"} if flash else {"model_kq", "model_softmax", "model_kqv"}
    if flash:
        want -= {"model_kq_scores"}  # soft-capping happens inside FLASH_ATTN_EXT
    assert want <= checks_of(doc), sorted(want - checks_of(doc))
    layer0 = [c for s in doc["sites"] if s["layer"] == 0 for c in s["checks"] if c["check"].startswith("model_")]
    assert layer0 and all(c["passed"] for c in layer0)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_moved_layer0_score_fails(family, arch_models, tmp_path):
    model = arch_models / f"{family}.gguf"
    dump = dump_file(tmp_path / "dump.txt", model, PROMPT, "--flash-attn", "off")
    edit = DumpEdit(dump, tmp_path / "moved.txt")
    delta = 0.05 * max(1.0, abs(edit.get("kq-0", (0, 1, 0))))  # 5 % of the score: granite's run about 50
    old, new = edit.add("kq-0", (0, 1, 0), delta)  # head 0, query 1, slot 0
    assert abs((new - old) - delta) < 1e-3
    code, doc, err = check_file(edit.save(), "--model", str(model))
    assert code == 1, err[-2000:]
    failed = [(s["layer"], c["node"], f) for s in doc["sites"] for c in s["checks"]
              if c["check"] == "model_kq" and not c["passed"] for f in c["failures"]]
    assert failed and failed[0][:2] == (0, "kq-0")
    assert failed[0][2]["at"]["head"] == 0 and failed[0][2]["at"]["query"] == 1 and failed[0][2]["at"]["slot"] == 0


@pytest.mark.parametrize("cache", [("-ctk", "q8_0"), ("-ctk", "q4_0", "-ctv", "q4_0", "-fa", "on"),
                                   ("-ctk", "q4_1", "-ctv", "q5_1", "-fa", "on"),
                                   ("-ctk", "q5_0", "-ctv", "iq4_nl", "-fa", "on"), ("-ctk", "bf16", "-ctv", "bf16"),
                                   ("-ctk", "f32", "-ctv", "f32")], ids=lambda f: " ".join(f))
def test_kv_cache_types(cache, quant_models, tmp_path):
    """The reference stores K and V as the cache type does, rotating q and k (and V) by llama.cpp's Hadamard matrix
    for a quantized cache; layer 0 stays within its derived bounds."""
    model = quant_models / "llama-q8_0.gguf"
    flags = cache if "-fa" in cache else ("--flash-attn", "off", *cache)
    dump = dump_file(tmp_path / "dump.txt", model, PROMPT, *flags)
    code, doc, err = check_file(dump, "--model", str(model))
    assert code == 0, err[-3000:]
    run = doc["model"]["runs"][0]
    assert run["kv_type"] == cache[1]
    layer0 = [c for s in doc["sites"] if s["layer"] == 0 for c in s["checks"] if c["check"].startswith("model_")]
    assert {c["error_model"].split("+")[0] for c in layer0 if c["check"] == "model_q"} == {"derived"}
    assert all(c["passed"] for c in layer0)
