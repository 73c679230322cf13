"""`inspect --model` on a flash-attention dump: the head walked from the model's reference, the printed flash
output checked against it (without --model: exit 3 with the advice, as before)."""
from __future__ import annotations

from conftest import FIXTURES, attncheck as run
from dumpedit import DumpEdit

FLASH = FIXTURES / "gpt2-flash-attn.txt"
MODEL = FIXTURES / "models" / "gpt2-mini-q8_0.gguf"
ARGS = ("--layer", "0", "--head", "0")


def test_flash_attention_with_the_model_is_walked_from_the_reference():
    r = run("inspect", FLASH, *ARGS, "--model", MODEL)
    assert r.code == 0, r.err
    assert "flash attention: node_21 (line 467) prints only its output" in r.out
    assert "15.5781" in r.out and "0.9710" in r.out  # the reference's score and weight of slot 0
    doc = run("inspect", FLASH, *ARGS, "--model", MODEL, "--json", "-").json()
    assert (doc["layer"], doc["head"], doc["query"], doc["passed"]) == (0, 0, {"index": 1, "position": 1}, True)
    edit = DumpEdit(FLASH, FLASH)  # read only: the printed flash output of (query 1, head 0)
    kqv = doc["model"]["rows"]["kqv"]
    printed = {d: edit.get("node_21", (1, 0, d)) for d in (0, 1, 2, 61, 62, 63)}
    assert {d: kqv["dumped"][d] for d in printed} == printed
    assert kqv["printed"] == 6 and all(v is None for d, v in enumerate(kqv["dumped"]) if d not in printed)
    p = doc["model"]["rows"]["kq_soft_max"]["reference"]
    assert len(p) == 2 and abs(sum(p) - 1) < 1e-6
    flash = [c for c in doc["model"]["checks"] if c["check"] == "model_flash_attn"]
    assert flash and all(c["passed"] and c["checked"] == 12 for c in flash)


def test_a_wrong_flash_output_fails_the_walk(tmp_path):
    edit = DumpEdit(FLASH, tmp_path / "bad.txt")
    edit.add("node_21", (1, 0, 1), 0.05)  # query 1, head 0, dim 1
    r = run("inspect", edit.save(), *ARGS, "--model", MODEL)
    assert r.code == 1
    assert any("model_flash_attn" in line and "FAIL" in line for line in r.out.splitlines())


def test_without_the_model_flash_attention_still_says_what_to_do():
    r = run("inspect", FLASH, *ARGS)
    assert r.code == 3 and "--model GGUF" in r.err and r.out == ""
    bad = run("inspect", FLASH, "--layer", "0", "--head", "12", "--model", MODEL)
    assert bad.code == 2 and bad.err.strip().endswith("head 12 does not exist: heads 0..11")


def test_an_unnamed_flash_node_of_a_quantized_cache_is_found_by_the_cache_it_reads():
    """FLASH_ATTN_EXT printed as node_30 over `cache_k_l0 (view) (permuted)` (q5_0 K, IQ4_NL V): its layer is the
    cache's, so `inspect --model` walks layer 1 and `list` names both layers' flash nodes (it said "none")."""
    dump = FIXTURES / "llama-quant-kv-q5_0-iq4_nl-flash.txt"
    r = run("inspect", dump, "--layer", "1", "--head", "2", "--model", FIXTURES / "models" / "llama-quant-q8_0.gguf")
    assert r.code == 0, r.err
    assert "PASS against the model: 576 printed elements of head 2 checked" in r.out
    text = run("list", dump).out
    assert "node_30 (556)" in text and "node_73 (1290)" in text, text


def test_two_unnamed_flash_nodes_over_one_cache_get_no_layer(tmp_path):
    """Layers that share a KV cache (gemma3n's last layers read an earlier layer's) would give two unnamed flash nodes
    one cache layer: neither is given it, rather than one walked as the other. Hand-made from the fixture above (its
    layer-1 node pointed at layer 0's cache view): no real dump of a cache-sharing model with flash attention ships."""
    from attncheck import read_dump

    src = FIXTURES / "llama-quant-kv-q5_0-iq4_nl-flash.txt"
    lines = src.read_text().splitlines(keepends=True)
    assert "cache_k_l1 (view) (permuted){" in lines[1289]
    lines[1289] = lines[1289].replace("cache_k_l1 (view) (permuted){", "cache_k_l0 (view) (permuted){")
    shared = tmp_path / "shared-cache.txt"
    shared.write_text("".join(lines))
    assert list(next(read_dump(src).evaluations()).flash_layers()) == [0, 1]
    assert next(read_dump(shared).evaluations()).flash_layers() == {}
    r = run("inspect", shared, "--layer", "0", "--head", "0", "--model", FIXTURES / "models" / "llama-quant-q8_0.gguf")
    assert r.code == 2 and "layer 0 has no flash attention in evaluation 0: layers none; 2 FLASH_ATTN_EXT" in r.err, r.err
