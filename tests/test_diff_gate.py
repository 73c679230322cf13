"""diff as the upgrade gate: it never passes a NEW that check fails, and a softmax weight's drift allowance comes from
its row's scores (attncheck/diff/softmax.py), on real dumps: the SmolLM2 pair of two llama.cpp builds
(fixtures/drift/), random-weight models' dumps (fixtures/), with and without their models (fixtures/models/).

A NEW that check (check --model) fails is a regression whatever the drift, named as check names it; an OLD that fails
is said and fails nothing by itself; a NEW check cannot read is unusable input (exit 2), as for check.
"""
from __future__ import annotations

import re
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attncheck
from attncheck.diff.compare import diff
from attncheck.diff.softmax import DERIVED
from conftest import DUMPS, FIXTURES, attncheck as run
from dumpedit import DumpEdit, printed

DRIFT = FIXTURES / "drift"
OLD_LLAMA, NEW_LLAMA = FIXTURES / "old-llama-gqa-how-are-you.txt", FIXTURES / "llama-gqa-how-are-you.txt"
LLAMA = FIXTURES / "models" / "llama-mini-gqa-f16.gguf"
GPT2 = FIXTURES / "models" / "gpt2-mini-q8_0.gguf"
# head 1, query 1 of layer 10 (of 30) in NEW: 0.8891, 0.1109; moved to 0.8391, 0.1609 (the row still sums to 1)
PAIR = ("kq_soft_max-10", 1, 1)


@pytest.fixture(scope="module")
def moved_pair(smollm2_dumps, tmp_path_factory) -> Path:
    """NEW with one softmax pair of a deep layer moved by 0.05, its row sum kept."""
    node, head, query = PAIR
    edit = DumpEdit(smollm2_dumps[1], tmp_path_factory.mktemp("moved") / "new-moved.txt")
    assert (edit.get(node, (head, query, 0)), edit.get(node, (head, query, 1))) == (0.8891, 0.1109)
    edit.add(node, (head, query, 0), -0.05)
    edit.add(node, (head, query, 1), 0.05)
    return edit.save()


def test_a_moved_softmax_pair_of_a_deep_layer_is_a_regression(smollm2_dumps, moved_pair):
    """check fails the moved NEW (|err| 5.0e-02 > bound 6.2e-05); diff OLD NEW' fails it too, naming node, head and
    query as check does, whatever the drift."""
    old, _ = smollm2_dumps
    r = run("diff", old, moved_pair, "-q")
    assert r.code == 1, r.out[-2000:] + r.err
    verdict = r.out.strip().splitlines()[-1]
    assert verdict.startswith("FAIL diff ") and ": regression: NEW fails check: eval 0 layer 10 head 1, query 1, " \
        "slot 0: kq_soft_max-10 (line 6090) 0.8391, recomputed 0.8891: |err| 5.0e-02 > bound 6.2e-05" in verdict
    assert "NEW: eval 0 layer 10 head 1, query 1, slot 1: kq_soft_max-10 (line 6090) 0.1609" in r.out
    doc = run("diff", old, moved_pair, "--json", "-").json()
    assert (doc["verdict"], doc["outcome"], doc["regression"], doc["exit_code"]) == ("fail", "regression", "check", 1)
    new, base = doc["check"]["new"], doc["check"]["old"]
    assert (new["verdict"], new["exit_code"], base["verdict"], base["exit_code"]) == ("fail", 1, "pass", 0)
    assert new["totals"]["sites_failed"] == 1 and new["totals"]["softmax_rows_checked"] == 360
    first = new["failures"][0]
    assert (first["evaluation"], first["layer"], first["check"], first["node"], first["line"]) == (
        0, 10, "softmax", "kq_soft_max-10", 6090)
    assert first["at"] == {"head": 1, "query": 1, "slot": 0} and first["bound"] < 1e-4


def test_the_softmax_allowance_alone_catches_the_moved_pair(smollm2_dumps, moved_pair):
    """The node diff alone (check=False), between the two builds: the weights' allowance derived from their scores'
    drift holds the moved pair; drift.py's 1.5× each weight's own size (n = 73 roundings deep) allowed it."""
    old, new = smollm2_dumps
    rep = diff(old, moved_pair, check=False)  # no check: the softmax keeps drift.py's allowance
    assert rep.exit_code == 0 and all(n.note.startswith("no kq_scale") for n in rep.compared
                                      if n.role.name == "kq_soft_max")
    rep = diff(old, moved_pair)
    [bad] = [n for n in rep.diverged]
    assert (bad.role.layer, bad.new.name, bad.worst["head"], bad.worst["query"]) == (10, "kq_soft_max-10", 1, 1)
    assert bad.note.startswith(DERIVED) and "kq_scale 0.125" in bad.note and "OLD's check" in bad.note
    assert bad.allowed < 0.1 < 0.9 < rep.model.rho(bad.roundings, "kq_soft_max")  # of the weight, here and before
    clean = diff(old, new)
    soft = [n for n in clean.compared if n.role.name == "kq_soft_max"]
    assert len(soft) == 30 and all(n.note.startswith(DERIVED) and not n.diverged for n in soft)


def test_same_build_with_a_moved_pair_is_a_regression(smollm2_dumps, moved_pair):
    """NEW against NEW' (one build, one softmax pair moved): print precision on the scores, the pair fails."""
    _, new = smollm2_dumps
    r = run("diff", new, moved_pair, "--json", "-")
    doc = r.json()
    assert r.code == 1 and doc["regression"] == "check"
    soft = next(n for n in doc["nodes"] if n["new"]["name"] == "kq_soft_max-10")
    assert soft["diverged"] and soft["failed"] == 2  # both weights of the pair, nothing else
    assert {k: v for k, v in soft["worst"]["at"].items() if k != "slot"} == {"query": 1, "head": 1}


@pytest.mark.parametrize("name", ["gpt2-how-are.txt", "llama-gqa-long.txt", "gpt2-ubatch2.txt"])
def test_a_random_model_weight_moved_by_0_002_in_layer_1(name, tmp_path):
    """A weight of layer 1 (head 0, query 1, slot 0) moved by 0.002 in a random-weight model's dump: check fails it,
    and diff fails it twice over: NEW fails check, and the weight is beyond its scores' drift (none: one build)."""
    edit = DumpEdit(FIXTURES / name, tmp_path / name)
    edit.add("kq_soft_max-1", (0, 1, 0), 0.002)
    bad = edit.save()
    assert attncheck.verify(str(bad)).exit_code == 1
    rep = diff(FIXTURES / name, bad)
    assert rep.exit_code == 1 and rep.regression == "check"
    [node] = rep.diverged
    assert (node.role.layer, node.role.name, node.worst["head"], node.worst["query"], node.worst["slot"]) == (
        1, "kq_soft_max", 0, 1, 0)


def test_a_random_model_weight_moved_between_builds(tmp_path):
    """The 2024 build against today's on a random llama: a weight of layer 1 moved by 0.002 in NEW."""
    edit = DumpEdit(NEW_LLAMA, tmp_path / "moved.txt")
    edit.add("kq_soft_max-1", (5, 2, 1), 0.002)  # head 5, query 2, slot 1
    rep = diff(OLD_LLAMA, edit.save())
    assert rep.exit_code == 1 and rep.regression == "check"
    [node] = rep.diverged
    assert node.new.name == "kq_soft_max-1" and node.worst == {"slot": 1, "query": 2, "head": 5}


def test_unchanged_pairs_pass(smollm2_dumps):
    long = (DRIFT / "old-llama-gqa-long.txt", FIXTURES / "llama-gqa-long.txt")
    for old, new in (smollm2_dumps, (OLD_LLAMA, NEW_LLAMA), long):
        r = run("diff", old, new, "-q")
        verdict = r.out.strip().splitlines()[-1]
        assert r.code == 0 and re.match(r"PASS diff .*: drift within correct builds: \d+ nodes", verdict), verdict
        assert "; check passes on both (NEW: " in verdict


def test_a_baseline_that_fails_check_is_said_and_fails_nothing(smollm2_dumps, tmp_path):
    """OLD's kqv of layer 20 moved by 0.01: beyond check's P·V bound, within the drift of two builds 73 roundings
    deep: the baseline was already broken, said so; NEW is fine: PASS."""
    old, new = smollm2_dumps
    edit = DumpEdit(old, tmp_path / "old-moved.txt")
    n = edit.node("kqv-20")
    edit.add("kqv-20", (n.ne[2] - 1, 1, 0), 0.01)
    r = run("diff", edit.save(), new, "--junit", tmp_path / "diff.xml")
    verdict = r.out.strip().splitlines()[-1]
    assert r.code == 0 and verdict.startswith("PASS diff "), verdict
    assert "; NEW passes check (" in verdict and "; the baseline already fails check: eval 0 layer 20 head 8, " \
        "query 1, dim 0: kqv-20" in verdict
    assert "OLD: eval 0 layer 20 head 8, query 1, dim 0: kqv-20" in r.out
    cases = {c.get("name"): c for c in ET.parse(tmp_path / "diff.xml").getroot().iter("testcase")}
    assert cases["check OLD"].find("failure") is None and "baseline already fails" in cases["check OLD"].find(
        "system-out").text
    assert cases["check NEW"].find("failure") is None


def test_a_new_check_cannot_read_is_unusable_input(tmp_path):
    """A number garbled in a node check reads: check exits 2 naming its line, so does diff (the node diff alone
    skips that node as not readable)."""
    edit = DumpEdit(FIXTURES / "gpt2-how-are.txt", tmp_path / "garbled.txt")
    edit.set("kq_soft_max-1", (0, 1, 0), "0.12.34")
    line = edit.line_of("kq_soft_max-1", (0, 1, 0))
    r = run("diff", FIXTURES / "gpt2-how-are.txt", edit.save())
    [error] = [x for x in r.err.splitlines() if x.startswith("attncheck: error:")]
    assert r.code == 2 and f"{edit.path}:{line}:" in error and "Traceback" not in r.err
    r = run("diff", edit.path, FIXTURES / "gpt2-how-are.txt")  # as OLD: said; the other nodes compared
    verdict = r.out.strip().splitlines()[-1]
    assert r.code == 0 and f"; the baseline cannot be checked: {edit.path}:{line}: " in verdict, verdict
    assert "1 matched nodes not compared" in r.out


def test_a_dump_object_is_refused_before_any_work():
    """diff reads each dump twice: the command spools stdin to a file (tests/test_conventions.py); the function wants
    paths."""
    with pytest.raises(ValueError):
        diff(attncheck.read_dump(str(FIXTURES / "gpt2-how-are.txt")), FIXTURES / "gpt2-how-are.txt")


def test_with_the_model_a_new_that_check_model_fails_is_a_regression(tmp_path):
    """q of layer 0 moved by 3 print steps: the reference holds layer 0 to print precision (check --model fails
    NEW, 2.7× its bound), the drift of two builds allows far more (diff without the model passes it)."""
    edit = DumpEdit(NEW_LLAMA, tmp_path / "moved.txt")
    edit.add("Qcur-0", (2, 0, 1), 0.0003, 2)  # the ROPE: token 2, head 0, dim 1
    moved = edit.save()
    assert diff(OLD_LLAMA, moved).exit_code == 0
    assert run("check", moved, "--model", LLAMA).code == 1
    r = run("diff", OLD_LLAMA, moved, "--model", LLAMA, "--json", "-")
    doc = r.json()
    assert r.code == 1 and (doc["regression"], doc["check"]["new"]["command"]) == ("check", "check --model")
    assert not doc["nodes"] or not any(n["diverged"] for n in doc["nodes"])
    f = doc["check"]["new"]["failures"][0]
    assert (f["check"], f["node"], f["layer"], f["at"]) == ("model_q", "Qcur-0", 0,
                                                            {"head": 0, "query": 2, "dim": 1, "pos": 2})
    text = run("diff", OLD_LLAMA, moved, "--model", LLAMA, "-q").out.strip().splitlines()[-1]
    assert text.startswith("FAIL diff ") and ": regression: NEW fails check --model: eval 0 layer 0 head 0, " \
        "query 2, dim 1, position 2: Qcur-0 (line 97) 1.1898, reference 1.1895" in text


@pytest.mark.parametrize("name,model", [("gpt2-how-are.txt", GPT2), ("gpt2-ubatch2.txt", GPT2),
                                        ("llama-gqa-draw.txt", LLAMA)])
def test_with_the_model_a_dump_against_itself(name, model, tmp_path):
    """Unchanged: PASS, identical, check --model passes on both; a score moved by 0.05 in layer 1: FAIL."""
    r = run("diff", FIXTURES / name, FIXTURES / name, "--model", model, "-q")
    verdict = r.out.strip().splitlines()[-1]
    assert r.code == 0 and ": identical: " in verdict and "; check --model passes on both" in verdict, verdict
    edit = DumpEdit(FIXTURES / name, tmp_path / name)
    edit.add("kq-1", (0, 1, 0), 0.05)
    doc = run("diff", FIXTURES / name, edit.save(), "--model", model, "--json", "-").json()
    assert (doc["exit_code"], doc["regression"], doc["check"]["new"]["verdict"]) == (1, "check", "fail")


# --- the property: diff never passes what check fails -------------------------------------------------------

CHECKED = sorted(n for n, code in DUMPS.items() if code == 0)
STEP = 1e-4


def _checked_nodes(edit: DumpEdit) -> list[tuple[str, int]]:
    """(name, occurrence) of every printed node check reads: the scores SOFT_MAX reads, its weights, kqv and the V
    view kqv reads."""
    out = []
    for i, line in enumerate(edit.lines):
        m = re.match(r"^(?:common_debug_cb_eval|ggml_debug): +(.*?) = \(f32\) +(SOFT_MAX|MUL_MAT)\((.*?)\{", line)
        if not m or (m.group(2) == "MUL_MAT" and "soft_max" not in line):
            continue  # a MUL_MAT that does not read weights: kq is reached as SOFT_MAX's source
        name, src0 = m.group(1).strip(), m.group(3).strip()
        for node in (name, src0):
            before = [h for h in edit.headers(node) if h <= i]
            if before:
                out.append((node, len(before) - 1))
    return sorted(set(out))


@settings(max_examples=60, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_diff_never_passes_what_check_fails(data):
    """For a real dump D of fixtures/ and one printed value of a node check reads moved by 1 to 10,000 print steps
    (either sign): when check fails D', diff D D' fails (exit 1) too."""
    name = data.draw(st.sampled_from(CHECKED), label="dump")
    with tempfile.TemporaryDirectory() as tmp:
        edit = DumpEdit(FIXTURES / name, Path(tmp) / name)
        node, occ = data.draw(st.sampled_from(_checked_nodes(edit)), label="node")
        ne = edit.node(node, occ).ne
        index = tuple(data.draw(st.sampled_from(printed(n)), label=f"i{k}") for k, n in ((2, ne[2]), (1, ne[1]),
                                                                                             (0, ne[0])))
        steps = data.draw(st.integers(1, 10_000), label="steps") * data.draw(st.sampled_from([1, -1]), label="sign")
        edit.add(node, index, steps * STEP, occ)
        moved = edit.save()
        try:
            checked = attncheck.verify(str(moved)).exit_code
        except attncheck.DumpError:
            checked = 2
        rep = diff(FIXTURES / name, moved)
        if checked == 1:
            assert rep.exit_code == 1 and rep.regression == "check", (node, index, steps)
        elif checked == 2:
            assert rep.exit_code == 2
