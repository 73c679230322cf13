"""attncheck diff on real dumps: same dump, an edited copy, a prefix prompt, another model, an f16 vs f32 KV cache,
a 2024-format dump against today's; and the JUnit XML of diff and check. The tests of print precision run with
--exact (tolerance=EXACT); the drift model's own tests are in test_diff_drift.py."""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from attncheck.diff.compare import EXACT, diff
from attncheck.dump.roles import assign
from attncheck.dump.graph import read_dump
from conftest import FIXTURES, attncheck as run
from dumpedit import DumpEdit, printed
from formulas import diff_tolerance, nearest_printed

F16, F32 = FIXTURES / "gpt2-how-are-you.txt", FIXTURES / "gpt2-kv-f32.txt"
OLD_LLAMA, NEW_LLAMA = FIXTURES / "old-llama-gqa-how-are-you.txt", FIXTURES / "llama-gqa-how-are-you.txt"


def edit_row_value(src, dst, node: str, row: int, item: int, delta: float) -> float:
    """Copy a dump, moving one printed value of `node`: its row-th printed row line, item-th printed value."""
    lines = src.read_text().splitlines(keepends=True)
    head = next(i for i, line in enumerate(lines) if re.search(rf": +{re.escape(node)} = \(", line))
    rows = [i for i in range(head + 1, len(lines)) if re.match(r"\s+\[\s*-?\d", lines[i])]
    at = rows[row]
    values = list(re.finditer(r"-?\d+\.\d+", lines[at]))
    start, end = values[item].span()
    old = float(values[item].group())
    text = ("%.4f" % (old + delta)).rjust(end - start)
    start -= len(text) - (end - start)  # a longer number takes a leading space, as %12.4f would
    lines[at] = lines[at][:start] + text + lines[at][end:]
    dst.write_text("".join(lines))
    return old


def _moved_by_tolerance(src, tmp_path, nodes, within=None, other=None, slack=0.15):
    """Copies of `src` with one printed value moved so that |new − old| is 0.5× and 1.5× diff's print-precision
    tolerance 1e-4 + 2⁻¹⁶·max(|old|, |new|), computed here (within `slack`× of each target: 0.15 needs |x| of 20
    or more, as the print moves in steps of 1e-4). `old` is the value in `other` (default: src itself); `within`
    restricts the elements. Returns (node, logical index (i2, i1, i0), {0.5: path, 1.5: path})."""
    edit = DumpEdit(src, tmp_path / "scan.txt")
    ref = DumpEdit(other or src, tmp_path / "other.txt")

    def landing(x_old: float, x: float) -> dict[float, float]:
        out = {}
        for r in (0.5, 1.5):
            best = min((nearest_printed(x_old + side * r * diff_tolerance(x_old)) for side in (1, -1)),
                       key=lambda v: abs(abs(v - x_old) / diff_tolerance(max(abs(v), abs(x_old))) - r))
            if abs(abs(best - x_old) / diff_tolerance(max(abs(best), abs(x_old))) - r) > slack:
                return {}
            out[r] = best
        return out

    for node in nodes:
        if not edit.headers(node):
            continue
        n0, n1, n2, _ = edit.node(node).ne
        for index in sorted(((i2, i1, i0) for i2 in printed(n2) for i1 in printed(n1) for i0 in printed(n0)),
                            key=lambda i: -abs(edit.get(node, i))):
            if within is not None and not within(index):
                continue
            values = landing(ref.get(node, index), edit.get(node, index))
            if values:
                paths = {}
                for r, v in values.items():
                    moved = DumpEdit(src, tmp_path / f"{r}-{Path(src).name}")
                    moved.set(node, index, v)
                    paths[r] = moved.save()
                return node, index, paths
    raise AssertionError(f"no printed value of {nodes} large enough for a 4-decimal move of 0.5× and 1.5× the tolerance")


# (dump, nodes to move a value in, slack): the flash-attention dump prints no value above 3.3, where the 1e-4 step
# of the print is 0.67× the tolerance
SELF = [("gpt2-how-are.txt", ["kq-0", "kq-1"], 0.15), ("gpt2-ubatch2.txt", ["kq-0", "kq-1"], 0.15),
        ("llama-gqa-draw.txt", ["kq-0", "kq-1", "result_output"], 0.15),
        ("old-llama-gqa-how-are-you.txt", ["kq-0", "kq-1", "result_output"], 0.15),
        ("gpt2-flash-attn.txt", ["Kcur-0", "Qcur-1"], 0.2)]


@pytest.mark.parametrize("name,nodes,slack", SELF)
def test_every_kind_of_dump_equals_itself_and_not_a_moved_copy(name, nodes, slack, tmp_path):
    """A dump against itself: every node agrees (exit 0). Against a copy with one value moved by 1.5× the
    tolerance: exit 1 at that node and element; by 0.5×: exit 0."""
    assert diff(FIXTURES / name, FIXTURES / name).exit_code == 0  # the default, the drift of correct builds
    rep = diff(FIXTURES / name, FIXTURES / name, tolerance=EXACT)
    assert rep.exit_code == 0 and not rep.only and rep.compared
    assert all(n.max_abs == 0 for n in rep.compared)
    node, (i2, i1, i0), paths = _moved_by_tolerance(FIXTURES / name, tmp_path, nodes, slack=slack)
    assert diff(FIXTURES / name, paths[0.5], tolerance=EXACT).exit_code == 0
    rep = diff(FIXTURES / name, paths[1.5], tolerance=EXACT)
    assert rep.exit_code == 1
    [bad] = rep.diverged
    assert bad.new.name == node and bad.failed == 1
    if node.startswith("kq-"):
        assert bad.worst == {"head": i2, "query": i1, "slot": i0}


def test_same_dump_exit_0():
    """Two identical files: PASS, identical, with and without --exact; check passes on both."""
    r = run("diff", FIXTURES / "gpt2-how-are.txt", FIXTURES / "gpt2-how-are.txt")
    assert r.code == 0, r.out + r.err
    assert re.search(r"^PASS diff .*: identical: every printed element of \d+ nodes \(\d+ printed elements\) is "
                     r"the same in \d+ evaluation×layer tests; check passes on both \(NEW: 2 sites, 24 softmax rows",
                     r.out, re.M), r.out[-500:]
    doc = run("diff", FIXTURES / "gpt2-how-are.txt", FIXTURES / "gpt2-how-are.txt", "--exact", "--json", "-").json()
    assert (doc["verdict"], doc["outcome"], doc["regression"]) == ("pass", "identical", None)
    assert doc["check"]["new"]["verdict"] == doc["check"]["old"]["verdict"] == "pass"


def test_one_softmax_value_moved(tmp_path):
    bad = tmp_path / "moved.txt"
    # kq_soft_max-0 {256, 2, 12, 1}: row 1 is head 0, query 1; item 1 is slot 1
    edit_row_value(FIXTURES / "gpt2-how-are.txt", bad, "kq_soft_max-0", row=1, item=1, delta=0.01)
    r = run("diff", FIXTURES / "gpt2-how-are.txt", bad, "--json", "-")
    assert r.code == 1, r.err
    doc = r.json()
    first = doc["first_divergent"]
    assert (first["evaluation"], first["layer"], first["role"]) == (0, 0, "kq_soft_max")
    assert first["worst"]["at"] == {"slot": 1, "query": 1, "head": 0}
    assert first["max_abs"] == pytest.approx(0.01, abs=1e-9)
    assert doc["totals"]["diverged"] == 1
    text = run("diff", FIXTURES / "gpt2-how-are.txt", bad)
    assert "eval 0 layer 0 kq_soft_max 'kq_soft_max-0'" in text.out
    assert "head 0, query 1 (position 1), slot 1" in text.out
    assert "FAIL diff" in text.out and ": regression: NEW fails check: eval 0 layer 0 head 0, query 1, slot 1" in text.out


def test_prefix_prompt():
    r = run("diff", FIXTURES / "gpt2-how-are.txt", FIXTURES / "gpt2-how-are-you.txt", "--prefix", "--json", "-")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["prompt"]["relation"] == "prefix"
    nodes = {(n["layer"], n["role"]): n for n in doc["nodes"]}
    assert nodes[(0, "kq")]["compared"] == 6 * 3  # 6 printed heads × the 3 visible (query, slot) of T = 2
    assert nodes[(1, "ffn_inp")]["skipped"].startswith("rows re-selected by out_ids")
    # how-are-you's log lost its tail: the nodes after it are listed, not dropped
    assert {(u["side"], u["layer"], u["role"]) for u in doc["only"]} >= {("old", 1, "l_out"), ("old", None, "result_output")}


def _prefix_causal(index) -> bool:
    """kq's (head, query, slot) fixed by causality when "How are" (T = 2) is a prefix of "How are you": a query of
    the shorter run and a slot it may read."""
    _, query, slot = index
    return query < 2 and slot <= query


def test_prefix_fails_at_a_moved_causal_score(tmp_path):
    """--prefix still compares what causality fixes at the print-precision tolerance: a kq score of "How are you"
    moved to 1.5× the tolerance from "How are"'s fails there; 0.5× passes."""
    short = FIXTURES / "gpt2-how-are.txt"
    node, (h, t, j), paths = _moved_by_tolerance(F16, tmp_path, ["kq-0", "kq-1"], within=_prefix_causal, other=short)
    assert diff(short, paths[0.5], prefix=True, tolerance=EXACT).exit_code == 0
    rep = diff(short, paths[1.5], prefix=True, tolerance=EXACT)
    [bad] = rep.diverged
    assert rep.exit_code == 1 and bad.new.name == node and bad.worst == {"head": h, "query": t, "slot": j}


@pytest.mark.parametrize("node,index", [("kq-0", (0, 1, 2)), ("kq-0", (9, 0, 1)), ("kq-1", (11, 0, 2))])
def test_prefix_ignores_what_causality_does_not_fix(node, index, tmp_path):
    """The score of a query for a later token of the longer prompt (its own ubatch prints it, masked) is not fixed
    by the shorter prompt, where that slot is empty: moved by 1.0, --prefix still passes."""
    assert not _prefix_causal(index)
    edit = DumpEdit(F16, tmp_path / "new.txt")
    edit.add(node, index, 1.0)
    rep = diff(FIXTURES / "gpt2-how-are.txt", edit.save(), prefix=True)
    assert rep.exit_code == 0 and not rep.diverged
    assert diff(FIXTURES / "gpt2-how-are.txt", edit.path).exit_code == 2  # without --prefix: different prompts


def test_extended_prompt_needs_prefix():
    r = run("diff", FIXTURES / "gpt2-how-are.txt", FIXTURES / "gpt2-how-are-you.txt")
    assert r.code == 2
    assert "different prompts" in r.err and "--prefix" in r.err


def test_other_model_exit_2():
    r = run("diff", FIXTURES / "gpt2-how-are.txt", FIXTURES / "llama-gqa-draw.txt")
    assert r.code == 2
    assert "different models" in r.err
    assert "Traceback" not in r.err


def test_no_token_ids_and_different_T_exit_2():
    r = run("diff", OLD_LLAMA, FIXTURES / "llama-gqa-draw.txt")
    assert r.code == 2
    assert "different prompts" in r.err


def test_kv_cache_f16_vs_f32():
    r = run("diff", F16, F32, "--exact", "--json", "-")
    assert r.code == 1, r.err
    doc = r.json()
    first = doc["first_divergent"]
    assert (first["layer"], first["role"], first["new"]["op"]) == (0, "k_store", "SET_ROWS")
    # the same K stored as f16 and as f32, both printed: their largest printed difference, read here
    a, b = DumpEdit(F16, F16), DumpEdit(F32, F32)
    n0, n1, n2, _ = a.node("cache_k_l0 (view)").ne
    assert b.node("cache_k_l0 (view)").ne[:3] == (n0, n1, n2)
    elements = [(i2, i1, i0) for i2 in printed(n2) for i1 in printed(n1) for i0 in printed(n0)]
    want = max(abs(a.get("cache_k_l0 (view)", i) - b.get("cache_k_l0 (view)", i)) for i in elements)
    assert want > 1e-4 and first["max_abs"] == pytest.approx(want, abs=1e-9)
    assert doc["first_divergent_computation"]["role"] == "kq"
    assert doc["first_divergent_computation"]["layer"] == 0
    order = [(n["layer"], n["role"]) for n in doc["nodes"] if n["diverged"]]
    assert order.index((0, "k_store")) < order.index((0, "kq"))
    # everything before the cache write is the same computation
    before = doc["nodes"][: [n["role"] for n in doc["nodes"]].index("k_store")]
    assert before and all(n["max_abs"] == 0 for n in before)
    for n in doc["nodes"]:
        assert isinstance(n["nmse"], float) and isinstance(n["needed_atol"], float)


def test_kv_cache_f16_vs_f32_nmse():
    doc = run("diff", F16, F32, "--nmse", "--json", "-").json()
    assert doc["exit_code"] == 1
    nodes = {(n["layer"], n["role"]): n for n in doc["nodes"]}
    assert not nodes[(0, "k_store")]["diverged"] and not nodes[(0, "kq")]["diverged"]  # within 1e-7 and 5e-4
    first = doc["first_divergent"]
    assert (first["layer"], first["role"], first["new"]["op"]) == (0, "attn_out", "ADD")
    assert first["nmse"] > first["nmse_max"] == 1e-7


def test_nmse_excludes_atol():
    assert run("diff", F16, F32, "--nmse", "--atol", "1").code == 2


def test_atol_passes_what_it_needs():
    doc = run("diff", F16, F32, "--exact", "--json", "-").json()
    need = max(n["needed_atol"] for n in doc["nodes"] if not n["skipped"])
    assert need > 1e-4  # the f16 cache moved K by more than the print: the default tolerance fails (above)
    assert run("diff", F16, F32, "--atol", str(need * 1.001)).code == 0
    assert run("diff", F16, F32, "--atol", str(need * 0.99)).code == 1  # and it is the least that passes


def test_2024_format_against_today():
    if not NEW_LLAMA.exists():
        pytest.skip("fixtures/llama-gqa-how-are-you.txt (today's llama.cpp, same model and prompt) is not there yet")
    assert run("diff", OLD_LLAMA, NEW_LLAMA).code == 0  # by default: the drift of correct builds
    r = run("diff", OLD_LLAMA, NEW_LLAMA, "--exact", "--json", "-")
    doc = r.json()
    assert doc["prompt"]["relation"] == "unknown"
    assert "the prompt could not be compared" in doc["prompt"]["note"]
    pairs = {(n["layer"], n["role"]): (n["old"]["name"], n["new"]["name"]) for n in doc["nodes"]}
    assert pairs[(0, "kq_soft_max")] == ("kq_soft_max_ext-0", "kq_soft_max-0")
    assert pairs[(0, "k_view")] == ("k-0", "cache_k_l0 (view) (permuted)")
    assert pairs[(0, "kqv_out")] == ("kqv_merged_cont-0", "kqv_out-0")
    assert pairs[(0, "attn_out")] == ("kqv_out-0", "attn_out-0")
    assert pairs[(0, "k_store")] == ("k_cache_view-0 (copy of Kcur-0)", "cache_k_l0 (view)")
    nodes = {(n["layer"], n["role"]): n for n in doc["nodes"]}
    assert nodes[(0, "kq")]["compared"] == 3 * 3 * 6  # slots 0..2 only: 29..31 of 32 are not 253..255 of 256
    assert nodes[(0, "k_store")]["matched_by"] == "store"
    # the 2024 build multiplied F16 weights by f32 activations (llamafile's tinyBLAS), today's rounds them to f16
    # first (docs/format.md §6; test_model's test_old_format_arithmetic_is_recognised): layer 0's first weight MUL_MAT
    # already moves by f16 roundings of the activations, ~1e-3, far beyond the 1e-4 print tolerance
    assert r.code == 1, r.err
    first = doc["first_divergent"]
    assert (first["layer"], first["new"]["name"], first["new"]["op"]) == (0, "Qcur-0", "MUL_MAT")
    assert first["max_abs"] > 2e-4
    text = run("diff", OLD_LLAMA, NEW_LLAMA)
    assert "the prompt could not be compared" in text.out


def test_roles_do_not_use_names():
    old = next(read_dump(OLD_LLAMA).evaluations())
    roles = assign(old)
    by_role = {(r.layer, r.name): n for n in old.nodes if (r := roles.role(n)).kind == "role"}
    assert by_role[(0, "k_store")].op == "CPY" and by_role[(0, "v_store")].op == "CPY"
    assert by_role[(0, "Kcur")].op == "ROPE" and by_role[(0, "Qcur")].op == "ROPE"
    assert by_role[(1, "attn_out")].name == "kqv_out-1"


def _verdict_counts(out: str, what: str) -> tuple[int, int]:
    m = re.search(rf"(\d+) of (\d+) {what}", out)
    return int(m.group(1)), int(m.group(2))


def test_diff_junit_counts(tmp_path):
    xml = tmp_path / "diff.xml"
    r = run("diff", F16, F32, "--exact", "--junit", xml)
    failed, tests = _verdict_counts(r.out, "evaluation×layer tests")
    root = ET.parse(xml).getroot()
    assert root.tag == "testsuites"
    # the evaluation×layer tests of the node diff, then each side's check (both pass: f16 and f32 caches are correct)
    assert (int(root.get("tests")), int(root.get("failures"))) == (tests + 2, failed) == (5, 2)
    cases = root.findall("testsuite/testcase")
    assert [c.get("name") for c in cases] == ["eval 0 input", "eval 0 layer 0", "eval 0 layer 1", "check OLD",
                                              "check NEW"]
    assert "k_store" in cases[1].find("failure").get("message")
    assert cases[3].find("failure") is None and cases[4].find("failure") is None


def test_diff_junit_error(tmp_path):
    xml = tmp_path / "diff.xml"
    assert run("diff", FIXTURES / "gpt2-how-are.txt", FIXTURES / "llama-gqa-draw.txt", "--junit", xml).code == 2
    root = ET.parse(xml).getroot()
    assert root.get("errors") == "1" and "different models" in root.find(".//error").get("message")


def test_check_junit(tmp_path):
    bad = tmp_path / "moved.txt"
    edit_row_value(FIXTURES / "gpt2-how-are.txt", bad, "kq_soft_max-0", row=1, item=1, delta=0.01)
    xml = tmp_path / "check.xml"
    r = run("check", FIXTURES / "gpt2-how-are.txt", bad, "--junit", xml)
    assert r.code == 1
    failed, sites = _verdict_counts(r.out, "sites failed")
    root = ET.parse(xml).getroot()
    suites = root.findall("testsuite")
    assert [int(s.get("tests")) for s in suites] == [2, sites]
    assert [int(s.get("failures")) for s in suites] == [0, failed] == [0, 1]
    failure = suites[1].find("testcase/failure")
    assert "head 0, query 1" in failure.get("message")
    assert suites[1].find("testcase").get("name") == "eval 0 layer 0"


def test_slots_are_matched_by_logical_index():
    """A 32-slot view and a 256-slot view share printed slots 0..2; slot 29 is not slot 253."""
    import numpy as np

    from attncheck.diff.align import Geometry, align
    from attncheck.dump.records import Node
    from attncheck.dump.roles import Role
    from attncheck.dump.sample import Sample, printed_indices

    def kq(n_kv: int) -> Sample:
        node = Node("kq-0", "f32", "MUL_MAT", (None, None), (n_kv, 3, 8, 1), 1, b"", 2)
        index = (np.arange(1), printed_indices(8), printed_indices(3), printed_indices(n_kv))
        values = np.broadcast_to(index[3].astype(float), (1, 6, 3, 6)).copy()  # each value is its slot number
        return Sample(node, values, index, (0.0,))

    g = lambda n_kv: Geometry(T=3, n_past=0, n_kv=n_kv, n_embd_k=64, n_embd_v=64, v_slot_axis=0)  # noqa: E731
    al = align(kq(32), kq(256), Role("layer", 0, "kq", "role"), g(32), g(256))
    assert al.how == "index"
    assert sorted(set(al.keys[:, 0])) == [0, 1, 2]
    assert (al.old == al.new).all() and len(al.old) == 3 * 3 * 6
