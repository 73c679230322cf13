"""attncheck diff's default verdict, the drift of correct builds, on real pairs of dumps: the same prompt through
llama.cpp 0.2.90 (August 2024) and 0.3.36 (fixtures/drift/MANIFEST.jsonl).

Real drift passes (exit 0) where print precision (--exact) fails; one value moved in NEW fails (exit 1) at its node,
layer, head and position; a real change between the builds (phi3's sliding window, applied in 2024 and ignored
today) fails at the first node it changes.
"""
from __future__ import annotations

import lzma
import math
import xml.etree.ElementTree as ET

import pytest

from attncheck.diff.compare import EXACT, diff
from attncheck.diff.drift import roundings
from attncheck.dump.graph import read_dump
from attncheck.dump.roles import assign
from conftest import FIXTURES, attncheck as run
from dumpedit import DumpEdit, printed

DRIFT = FIXTURES / "drift"
OLD_LLAMA, NEW_LLAMA = FIXTURES / "old-llama-gqa-how-are-you.txt", FIXTURES / "llama-gqa-how-are-you.txt"
OLD_LONG, NEW_LONG = DRIFT / "old-llama-gqa-long.txt", FIXTURES / "llama-gqa-long.txt"
PHI3_OLD, PHI3_NEW = DRIFT / "phi3-cat.old.txt", DRIFT / "phi3-cat.new.txt"


def _values(edit: DumpEdit, name: str, occurrence: int = 0) -> list[float]:
    """Every printed value of a node, read by the test's own parser."""
    n0, n1, n2, _ = edit.node(name, occurrence).ne
    return [edit.get(name, (i2, i1, i0), occurrence) for i2 in printed(n2) for i1 in printed(n1) for i0 in printed(n0)]


def _occurrence(edit: DumpEdit, name: str, op: str) -> int:
    """Which of the nodes called `name` is the one of op `op` (Qcur-L names a MUL_MAT, a RESHAPE and a ROPE)."""
    return next(i for i in range(len(edit.headers(name))) if f" {op}(" in edit.lines[edit.headers(name)[i]])


@pytest.mark.parametrize("pair", ["smollm2", "llama", "llama-long"])
def test_real_builds_drift_and_print_precision_does_not_hold(pair, smollm2_dumps):
    """Two correct builds: drift (exit 0), though they differ beyond print precision (--exact: exit 1)."""
    old, new = {"smollm2": smollm2_dumps, "llama": (OLD_LLAMA, NEW_LLAMA), "llama-long": (OLD_LONG, NEW_LONG)}[pair]
    rep = diff(old, new)
    assert rep.exit_code == 0 and not rep.diverged and rep.compared, [n.new.name for n in rep.diverged][:5]
    assert max(n.max_abs for n in rep.compared) > 2e-4  # they do differ, by more than two prints
    assert diff(old, new, tolerance=EXACT).exit_code == 1
    r = run("diff", old, new)
    assert r.code == 0 and "PASS diff" in r.out and ": drift within correct builds: " in r.out, r.out[-2000:] + r.err


def test_smollm2_reports_the_largest_drift_per_layer(smollm2_dumps):
    doc = run("diff", *smollm2_dumps, "--json", "-").json()
    assert doc["schema"] == 1 and doc["kind"] == "diff" and doc["verdict"] == "pass"
    assert doc["tolerance"]["mode"] == "drift"
    model = doc["tolerance"]["drift_model"]
    assert model["unit"] == pytest.approx(2.37 / 254) and "q4_1" in model["unit_origin"]  # OLD's log: q4_1 weights
    layers = {e["layer"]: e for e in doc["drift_per_layer"]}
    assert {f"layer {L}" for L in range(30)} <= set(layers)
    for L in range(30):
        e = layers[f"layer {L}"]
        assert e["beyond"] == 0 and e["largest_drift"]["drift"] <= e["largest_drift"]["allowed"]
    # the builds agree in layer 0's attention and drift apart after it
    assert layers["layer 0"]["largest_drift"]["role"] in ("ffn_out", "l_out", "attn_out", "ffn_inp", "ffn_norm")
    assert layers["layer 20"]["largest_drift"]["drift"] > 10 * layers["layer 0"]["largest_drift"]["drift"]


def test_kqv_of_layer_0_moved_by_0_01_is_a_regression(smollm2_dumps, tmp_path):
    old, new = smollm2_dumps
    edit = DumpEdit(new, tmp_path / "moved.txt")
    head, query, dim = 7, 1, 2  # kqv-0 {64, 2, 9, 1}: (i2, i1, i0) = (head, query, dim); heads 3..5 are not printed
    edit.add("kqv-0", (head, query, dim), 0.01)
    r = run("diff", old, edit.save(), "--json", "-")
    assert r.code == 1, r.err
    doc = r.json()
    first = doc["first_divergent"]
    assert (first["layer"], first["role"], first["new"]["name"]) == (0, "kqv", "kqv-0")
    assert first["worst"]["at"] == {"head": head, "query": query, "dim": dim} and first["position"] == query
    assert doc["totals"]["diverged"] == 1
    text = run("diff", old, edit.path)
    assert "FAIL diff" in text.out and ": regression: NEW fails check: " in text.out
    assert "layer 0 kqv 'kqv-0'" in text.out
    assert f"head {head}, query {query} (position {query}), dim {dim}" in text.out


@pytest.mark.parametrize("name,op,index", [("Qcur-20", "ROPE", (1, 7, 2)), ("kq-20", "MUL_MAT", (7, 1, 0))])
def test_a_deep_value_moved_by_2_5_rms_is_caught_and_by_2_percent_is_not(smollm2_dumps, tmp_path, name, op,
                                                                         index):
    """Layer 20 of 30: the builds drift by up to a few % of a node's rms there, and the allowance holds a moved
    value to under twice the rms (scripts/drift_calibrate.py --moves); 2.5 rms is beyond drift, 0.02 rms is drift.
    A score moved by 0.02 rms no longer gives the printed weights, though: check fails NEW, and so does diff."""
    old, new = smollm2_dumps
    edit = DumpEdit(new, tmp_path / "scan.txt")
    occ = _occurrence(edit, name, op)
    vals = _values(edit, name, occ)
    rms = math.sqrt(sum(v * v for v in vals) / len(vals))
    for k, beyond in ((2.5, True), (0.02, False)):
        moved = DumpEdit(new, tmp_path / f"moved-{k}.txt")
        moved.add(name, index, k * rms, occ)
        rep = diff(old, moved.save())
        assert bool(rep.diverged) == beyond, (k, [(n.new.name, n.ratio) for n in rep.diverged])
        fails_check = name == "kq-20"  # check recomputes the weights from kq; q is not checkable from a dump alone
        assert rep.new_side.failed == fails_check and rep.old_side.exit_code == 0
        assert rep.exit_code == (1 if beyond or fails_check else 0)
        assert rep.regression == ("check" if fails_check else "drift" if beyond else "")  # check's comes first
        if beyond:
            [bad] = rep.diverged
            assert bad.new.name == name and bad.role.layer == 20
            axes = {"Qcur-20": ("token", "head", "dim"), "kq-20": ("head", "query", "slot")}[name]
            assert bad.worst == dict(zip(axes, index))


def test_phi3_sliding_window_is_a_real_change(tmp_path):
    """2024's llama.cpp masked phi3's keys outside its sliding window (4 here), today's ignores the window: the
    scores agree within drift, the weights of query 4 on do not."""
    rep = diff(PHI3_OLD, PHI3_NEW)
    assert rep.exit_code == 1
    first = rep.first_divergent
    assert (first.role.layer, first.role.name) == (0, "kq_soft_max")
    assert first.worst["query"] >= 4 and first.worst["slot"] <= first.worst["query"] - 4  # outside the window
    assert first.worst_old == 0.0 and first.worst_new > 0.0
    before = rep.nodes[: rep.nodes.index(first)]
    assert any(n.role.name == "kq" for n in before) and not any(n.diverged for n in before)
    xml = tmp_path / "diff.xml"
    assert run("diff", PHI3_OLD, PHI3_NEW, "--junit", xml).code == 1
    case = next(c for c in ET.parse(xml).getroot().iter("testcase") if c.get("name") == "eval 0 layer 0")
    assert "kq_soft_max" in case.find("failure").get("message")


def test_roundings_are_counted_on_the_graph():
    """Today's llama graph: q, k and v convert attn_norm once (1), the f16 cache write rounds K (2), kq converts q
    (3), kqv converts P (4), the output projection (5), gate/up (6) and down (7); layer 1 starts from 7."""
    ev = next(read_dump(NEW_LLAMA).evaluations())
    roles, k = assign(ev), roundings(ev)
    at = {(roles.role(n).layer, roles.role(n).name): k[id(n)] for n in ev.nodes if roles.role(n).kind == "role"}
    assert at[(0, "attn_norm")] == 0 and at[(0, "Qcur")] == 1 and at[(0, "k_view")] == 2
    assert (at[(0, "kq")], at[(0, "kq_soft_max")], at[(0, "kqv")], at[(0, "attn_out")]) == (3, 3, 4, 5)
    assert at[(0, "ffn_out")] == at[(0, "l_out")] == 7 and at[(1, "Qcur")] == 8


def test_exact_and_nmse_exclude_each_other():
    r = run("diff", OLD_LLAMA, NEW_LLAMA, "--exact", "--nmse")
    assert r.code == 2 and "Traceback" not in r.err


def test_html_page_shows_drift_and_allowance(tmp_path):
    out = tmp_path / "diff.html"
    assert run("diff", PHI3_OLD, PHI3_NEW, "-q", "--html", out).code == 1
    page = out.read_text()
    assert "drift / allowed (of its scale)" in page and "kq_soft_max-0" in page and "FAIL diff" in page


def test_a_damaged_and_a_cut_dump_make_no_regression(tmp_path):
    """A real pair from the end-to-end tests: in OLD, the timings llama.cpp 0.2.90 prints at exit cut into
    result_norm's header line; in NEW, the logger lost the tail inside layer 11's FFN. Each side then has a catch-all
    NORM and MUL at the end of layer 11, of one op and shape: OLD's output norm, NEW's FFN norm. They read other
    nodes (l_out-11, ffn_inp-11), so they are not compared: no false regression."""
    old, new = tmp_path / "old.txt", tmp_path / "new.txt"
    old.write_bytes(lzma.decompress((DRIFT / "gpt2-deep-damaged.old.txt.xz").read_bytes()))
    new.write_bytes(lzma.decompress((DRIFT / "gpt2-deep-cut.new.txt.xz").read_bytes()))
    rep = diff(old, new)
    assert rep.exit_code == 0 and not rep.diverged and len(rep.compared) > 250
    pairs = {(n.old.name, n.new.name) for n in rep.nodes}
    assert ("norm", "norm-11") not in pairs and ("norm_w", "norm_w-11") not in pairs
    assert any("damaged header" in w for w in rep.warnings)


def test_a_dump_that_ends_before_the_logits_is_no_regression(tmp_path):
    """Two runs of one build on gemma2: one whole; in the other (fixtures/arch/gemma2-tail-lost.txt) the logger lost
    the output's last two nodes, the TANH and SCALE of the final soft-cap. Roles name the output's nodes back from the
    last one printed, which paired the logits with the logits / 30: a false REGRESSION. The output's nodes are paired
    by their place after the projection, and the two that one dump lacks are in one dump only, both ways round."""
    whole, cut = tmp_path / "whole.txt", FIXTURES / "arch" / "gemma2-tail-lost.txt"
    whole.write_bytes(lzma.decompress((DRIFT / "gemma2-how-are.whole.txt.xz").read_bytes()))
    for old, new in ((whole, cut), (cut, whole)):
        rep = diff(old, new)
        assert rep.exit_code == 0 and not rep.diverged and len(rep.compared) > 150
        pairs = {(n.old.name, n.new.name) for n in rep.nodes}
        assert {("node_182", "node_182"), ("node_183", "node_183")} <= pairs
        assert not any("result_output" in p for p in pairs)
        assert sorted(u.node.name for u in rep.only) == ["node_184", "result_output"]


@pytest.mark.parametrize("pair", ["llama-quant-kq8_0", "llama-quant-kq4_0", "llama-quant-kvq8_0-flash"])
def test_a_cache_rotated_by_one_build_only_is_no_regression(pair, tmp_path):
    """Today's llama.cpp rotates q and K by a Hadamard matrix before a quantized K cache (and V before a quantized V
    cache, rotating the output back), 2024's does not (attncheck/diff/basis.py). q, FLASH_ATTN_EXT's output and the
    heads merged in the rotated basis are named as not comparable; what the output projection reads is compared
    across bases (OLD's kqv_out with NEW's kqv_unrot); the cache's own rounding, which falls elsewhere in another
    basis, is the drift model's unit (q4_0: 2.37/16 of the rms). All three were regressions, q at 70x its
    tolerance; kq, the weights and the layers after pass. A kq moved by its rms still fails."""
    old, new = DRIFT / f"{pair}.old.txt", DRIFT / f"{pair}.new.txt"
    rep = diff(old, new)
    assert rep.exit_code == 0, rep.regression
    rotated = {n.role.name.split(".")[0] for n in rep.nodes if "Hadamard" in n.skipped}
    compared = {n.role.name for n in rep.compared}
    assert {"attn_out", "ffn_out", "l_out"} <= compared and not rotated & compared
    if "flash" in pair:  # kq is not printed under flash attention; V is rotated too
        assert rotated == {"q", "k_view", "k_store", "v_view", "v_store", "flash_attn"}
        [out] = [n for n in rep.compared if n.role.name == "kqv_out" and n.role.layer == 1]
        assert out.new.name == "(reshaped)"  # NEW's kqv_unrot, after the rotation back (not NEW's 'kqv_out-1')
        return
    assert rotated == {"q", "k_view", "k_store"} and {"kq", "kq_soft_max", "kqv"} <= compared
    node = next(n for n in rep.compared if n.role.name == "kq" and n.role.layer == 1)
    e = DumpEdit(new, tmp_path / "new.txt")
    e.add(node.new.name, (0, 2, 1), 3 * node.scale)
    assert diff(old, e.save()).exit_code == 1
