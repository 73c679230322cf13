"""`attncheck check` fails loudly and precisely: one printed value changed in a copy of a real dump.

Every case edits a real llama.cpp dump from fixtures/ (tests/dumpedit.py maps a logical head, query, slot or dim
to the printed line and item) and asserts, on the JSON and on the text for people, that exactly the changed place
fails: the right evaluation, layer, head, query and slot or dim, and nothing else. The below-bound cases show the
other side: a change the print precision allows is not a failure.

Printed heads are 0, 1, 2 and H-3, H-2, H-1 (gpt2-mini: 0 1 2 9 10 11; llama-mini-gqa: 0 1 2 5 6 7), printed slots
0, 1, 2 and n_kv-3.. (n_kv = 256 today, 32 in the older format), printed dims 0 1 2 and D_h-3.. .
"""
from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from conftest import FIXTURES, attncheck as run
from dumpedit import DumpEdit, printed
from formulas import PRINT, STEP, pv_bound, sum_bound

OLD = "old-llama-gqa-how-are-you.txt"


def names(dump: str, layer: int) -> dict[str, str]:
    """Node names of a layer's attention: today's, or the older format's `kq_soft_max_ext-L`."""
    softmax = "kq_soft_max_ext-{}" if dump == OLD else "kq_soft_max-{}"
    return {"kq": f"kq-{layer}", "softmax": softmax.format(layer), "kqv": f"kqv-{layer}"}


def n_past(edit: DumpEdit, softmax: str, evaluation: int) -> int:
    """Tokens of the earlier evaluations (one run): the sum of their T (ne1 of the weights)."""
    return sum(edit.node(softmax, k).ne[1] for k in range(evaluation))


def strict_json(text: str) -> dict:
    """CI systems read the JSON: NaN and Infinity are not JSON, so they must not appear bare."""
    def reject(token):
        raise ValueError(f"bare {token} in the JSON report")

    return json.loads(text, parse_constant=reject)


def failures(doc: dict) -> list[tuple[int, int, str, dict | None, dict]]:
    """Every failing element of a report: (evaluation, layer, check, at, check record)."""
    return [(s["evaluation"], s["layer"], c["check"], f["at"], c)
            for s in doc["sites"] for c in s["checks"] for f in c["failures"]]


def check_json(path, *args) -> dict:
    r = run("check", path, "--json", "-", *args)
    assert "Traceback" not in r.err + r.out
    assert r.code == 1, r.err[-3000:]
    doc = strict_json(r.out)
    assert doc["exit_code"] == 1 and doc["verdict"] == "fail"
    return doc


def check_both(path, *args, sites_failed: int = 1) -> tuple[dict, list[str]]:
    """One run with `--json FILE`, which writes the JSON there and the text for people to stdout."""
    out = f"{path}.json"
    lines = check_text(path, "--json", out, *args, sites_failed=sites_failed)
    with open(out, encoding="utf-8") as f:
        doc = strict_json(f.read())
    assert doc["exit_code"] == 1 and doc["verdict"] == "fail"
    return doc, lines


def _without_old_sum(dump: str, fails: list) -> list:
    """The older `sum =` is the sum of the printed values (within their print rounding, 5e-5 each): a printed
    weight that moved far enough moves it too, so a sum failure of the same site may come along, at no element."""
    if dump != OLD:
        return fails
    assert [c for _, _, c, at, _ in fails if at is None] in ([], ["sum"]), fails
    return [f for f in fails if f[3] is not None]


def check_text(path, *args, sites_failed: int = 1) -> list[str]:
    """The human report: exit 1, a FAIL verdict, and the failure lines (they start with `eval `)."""
    r = run("check", path, *args)
    assert "Traceback" not in r.err + r.out
    assert r.code == 1
    assert re.search(rf"^FAIL {re.escape(str(path))}: {sites_failed} of \d+ sites failed", r.out, re.M), r.out[-2000:]
    return [line.rstrip() for line in r.out.splitlines() if line.startswith("eval ")]


def where(head: int, query: int, last: str, x: int) -> str:
    return f"head {head}, query {query}, {last} {x}"


# --------------------------------------------------------------------------------------------------------------
# The helper itself: it must address the element the case names, or every test below proves nothing
# --------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dump", ["gpt2-how-are.txt", "gpt2-ubatch2.txt", "llama-gqa-draw.txt", OLD, "gpt2-long.txt"])
def test_dumpedit_finds_the_causal_mask_where_it_must_be(dump, tmp_path):
    """Read back through dumpedit, every printed weight row shows the mask at the logical slots the case
    geometry puts it: 0 beyond the query's position, a row sum of 1 where every visible slot is printed, and
    query 0 of the first evaluation reading only slot 0. An unedited copy is byte for byte the original."""
    edit = DumpEdit(FIXTURES / dump, tmp_path / dump)
    assert edit.save().read_bytes() == (FIXTURES / dump).read_bytes()
    softmax = names(dump, 0)["softmax"]
    for ev in range(len(edit.headers(softmax))):
        node = edit.node(softmax, ev)
        n_kv, T, H, _ = node.ne
        past = n_past(edit, softmax, ev)
        for h in printed(H):
            for t in printed(T):
                row = {j: edit.get(softmax, (h, t, j), ev) for j in printed(n_kv)}
                assert all(p == 0.0 for j, p in row.items() if j > past + t), (ev, h, t, row)
                if set(range(past + t + 1)) <= set(row):
                    assert sum(row.values()) == pytest.approx(1.0, abs=4e-4), (ev, h, t, row)
                if past + t == 0:
                    assert row[0] == 1.0


# --------------------------------------------------------------------------------------------------------------
# (a) weight, (b) masked weight, (c) kqv element, (d) score in a checked row, (d') score in a ratio-checked row
# --------------------------------------------------------------------------------------------------------------
# (kind, dump, evaluation, layer, head, query, slot or dim)
ELEMENT_CASES = [
    # (a) a weight of a checked row (query t sees slots 0..n_past+t, all printed) by 0.002
    ("weight", "gpt2-how-are.txt", 0, 0, 10, 1, 1),
    ("weight", "gpt2-ubatch2.txt", 1, 1, 9, 0, 2),  # n_past = 2: query 0 sits at position 2
    ("weight", "llama-gqa-draw.txt", 0, 0, 6, 2, 1),  # GQA; 0.9969 moves down
    ("weight", OLD, 0, 1, 5, 2, 2),
    ("weight", "gpt2-long.txt", 0, 1, 2, 2, 0),
    # (b) a masked weight to 0.0001, the smallest value a print can show: a later token of the same ubatch, or an
    # empty cache slot (softmax of −inf is exactly 0, so the bound is 0)
    ("masked", "gpt2-how-are.txt", 0, 1, 0, 0, 1),
    ("masked", "gpt2-ubatch2.txt", 1, 0, 2, 0, 255),
    ("masked", "gpt2-ubatch2.txt", 2, 0, 11, 1, 254),  # n_past = 4
    ("masked", "llama-gqa-draw.txt", 0, 1, 7, 0, 2),
    ("masked", "llama-gqa-draw.txt", 0, 0, 5, 3, 253),
    ("masked", OLD, 0, 0, 6, 1, 2),
    ("masked", OLD, 0, 1, 1, 2, 30),  # an empty slot of the older 32-slot KV view
    ("masked", "gpt2-long.txt", 0, 0, 9, 10, 253),  # a row whose visible slots are not all printed
    # (c) a kqv element of a checked row by 0.05
    ("kqv", "gpt2-how-are.txt", 0, 1, 11, 1, 62),
    ("kqv", "gpt2-ubatch2.txt", 1, 0, 1, 0, 63),
    ("kqv", "llama-gqa-draw.txt", 0, 0, 5, 2, 30),  # head 5 reads KV head 1
    ("kqv", OLD, 0, 1, 7, 2, 1),
    ("kqv", "gpt2-long.txt", 0, 0, 0, 2, 2),
    # (d) a score of a checked row, at a slot whose weight is between 0.05 and 0.95, by 2.0
    ("score", "gpt2-how-are.txt", 0, 0, 9, 1, 0),
    ("score", "gpt2-ubatch2.txt", 1, 1, 10, 0, 1),
    ("score", "llama-gqa-draw.txt", 0, 1, 2, 2, 2),
    ("score", OLD, 0, 0, 7, 2, 2),
    ("score", "gpt2-long.txt", 0, 0, 2, 2, 2),
    # (d') a score of a row checked by weight ratios only, at a printed visible slot that is not the row's largest
    ("ratio", "gpt2-long.txt", 0, 1, 9, 10, 0),
    ("ratio", "gpt2-long.txt", 0, 0, 10, 12, 2),
    ("ratio", "gpt2-ubatch2.txt", 2, 0, 9, 1, 1),  # n_past = 4
]

CHECK_OF = {"weight": "softmax", "masked": "masked", "kqv": "pv", "score": "softmax", "ratio": "softmax_ratio"}


def _case_id(case) -> str:
    kind, dump, ev, layer, head, query, x = case
    return f"{kind}-{dump.removesuffix('.txt')}-e{ev}-L{layer}-h{head}-q{query}-{x}"


@pytest.mark.parametrize("case", ELEMENT_CASES, ids=_case_id)
def test_one_changed_element_fails_at_its_place(case, tmp_path):
    kind, dump, ev, layer, head, query, x = case
    edit = DumpEdit(FIXTURES / dump, tmp_path / dump)
    nm = names(dump, layer)
    weights = edit.node(nm["softmax"], ev)
    n_kv, T, H, _ = weights.ne
    past = n_past(edit, nm["softmax"], ev)
    pos = past + query
    row_whole = set(range(pos + 1)) <= set(printed(n_kv))
    last = "dim" if kind == "kqv" else "slot"

    # the case is what it claims to be
    if kind == "masked":
        assert x > pos, "a masked slot lies after the query's position"
    else:
        assert row_whole == (kind != "ratio"), "checked rows see only printed slots; ratio rows do not"
    if kind in ("weight", "score", "ratio"):
        assert x <= pos
    if kind == "score":
        assert 0.05 < edit.get(nm["softmax"], (head, query, x), ev) < 0.95
    if kind == "ratio":
        row = {j: edit.get(nm["softmax"], (head, query, j), ev) for j in printed(n_kv) if j <= pos}
        assert x != max(row, key=row.get), "the row's largest printed weight is the ratio's reference"
        assert row[x] >= 0.01

    if kind == "weight":
        old = edit.get(nm["softmax"], (head, query, x), ev)
        node, (_, new) = weights, edit.add(nm["softmax"], (head, query, x), -0.002 if old > 0.99 else 0.002, ev)
    elif kind == "masked":
        assert edit.get(nm["softmax"], (head, query, x), ev) == 0.0
        node, new = weights, 0.0001
        edit.set(nm["softmax"], (head, query, x), new, ev)
    elif kind == "kqv":
        node, (_, new) = edit.node(nm["kqv"], ev), edit.add(nm["kqv"], (head, query, x), 0.05, ev)
    else:
        node, new = weights, edit.get(nm["softmax"], (head, query, x), ev)  # the weight stays, its score moves
        edit.add(nm["kq"], (head, query, x), 2.0, ev)
    edit.save()

    doc, lines = check_both(edit.path)
    assert doc["hint"] is None, "a changed value is not a kq_scale problem"
    fails = failures(doc)
    assert {(e, l) for e, l, *_ in fails} == {(ev, layer)}, "only the changed site fails"
    fails = _without_old_sum(dump, fails) if kind in ("weight", "masked") else fails
    assert all(at is not None and (at["head"], at["query"]) == (head, query) for *_, at, _ in fails), fails
    [site] = [s for s in doc["sites"] if not s["passed"]]
    assert (site["evaluation"], site["layer"], site["n_past"], site["T"]) == (ev, layer, past, T)
    [chk] = [c for c in site["checks"] if c["check"] == CHECK_OF[kind]]
    assert not chk["passed"] and chk["node"] == node.name and chk["line"] == node.line
    at = {"head": head, "query": query, last: x}
    hit = [f for f in chk["failures"] if f["at"] == at]
    assert hit, chk["failures"]
    assert hit[0]["got"] == pytest.approx(new, abs=1e-9)
    if kind in ("weight", "masked", "kqv", "ratio"):
        assert chk["failed"] == 1 and chk["worst"] == at, "exactly the changed element is beyond its bound"
    else:  # a score moves the whole row's softmax: the other visible weights of that row may fail with it
        assert all(f["at"]["slot"] <= pos for f in chk["failures"])

    lines = [line for line in lines if " sum = " not in line]
    assert lines and all(line.startswith(f"eval {ev} layer {layer} head {head}, query {query}, ") for line in lines), lines
    value_line = edit.line_of(node.name, (head, query, x), ev)  # the failure names the line of the value's own row
    assert hit[0]["line"] == value_line
    assert any(line.startswith(f"eval {ev} layer {layer} {where(head, query, last, x)}: {node.name} (line {value_line}) ")
               for line in lines), lines


# --------------------------------------------------------------------------------------------------------------
# (e) the SOFT_MAX `sum = ` line by 0.5
# --------------------------------------------------------------------------------------------------------------
SUM_CASES = [
    ("gpt2-how-are.txt", 0, 1),
    ("gpt2-ubatch2.txt", 2, 0),
    ("llama-gqa-draw.txt", 0, 0),
    (OLD, 0, 1),  # the older sum of printed values only
    ("gpt2-long.txt", 0, 0),
]


@pytest.mark.parametrize("dump,ev,layer", SUM_CASES)
def test_changed_softmax_sum_fails_at_its_site(dump, ev, layer, tmp_path):
    edit = DumpEdit(FIXTURES / dump, tmp_path / dump)
    softmax = names(dump, layer)["softmax"]
    node = edit.node(softmax, ev)
    _, new = edit.add_sum(softmax, 0.5, ev)
    edit.save()

    doc, lines = check_both(edit.path)
    fails = failures(doc)
    assert [(e, l, c) for e, l, c, *_ in fails] == [(ev, layer, "sum")]
    (_, _, _, at, chk), = fails
    assert at is None, "a whole-tensor sum has no element"
    assert chk["node"] == softmax and chk["line"] == node.line
    assert chk["failures"][0]["got"] == pytest.approx(new, abs=1e-9)

    assert lines == [line for line in lines if line.startswith(f"eval {ev} layer {layer}: {softmax} (line {node.line}) "
                                                               f"sum = {new:.6f}, expected ")], lines
    assert len(lines) == 1


# --------------------------------------------------------------------------------------------------------------
# Non-finite values: `%12.4f` prints them as nan, -nan, inf, -inf; they are values that fail, never parse errors
# --------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dump,ev,layer,head,query,slot,text", [
    ("gpt2-how-are.txt", 0, 0, 2, 1, 0, "nan"),
    ("gpt2-how-are.txt", 0, 0, 2, 1, 1, "inf"),
    ("gpt2-ubatch2.txt", 1, 1, 11, 0, 2, "-nan"),
    ("llama-gqa-draw.txt", 0, 1, 5, 2, 0, "-inf"),
    (OLD, 0, 0, 7, 2, 1, "nan"),
])
def test_non_finite_weight_fails_at_its_place(dump, ev, layer, head, query, slot, text, tmp_path):
    edit = DumpEdit(FIXTURES / dump, tmp_path / dump)
    softmax = names(dump, layer)["softmax"]
    node = edit.node(softmax, ev)
    assert set(range(n_past(edit, softmax, ev) + query + 1)) <= set(printed(node.ne[0])), "a checked row"
    edit.set(softmax, (head, query, slot), text, ev)
    edit.save()

    doc, lines = check_both(edit.path)
    fails = _without_old_sum(dump, failures(doc))
    assert {(e, l) for e, l, *_ in fails} == {(ev, layer)}
    assert all((at["head"], at["query"]) == (head, query) for *_, at, _ in fails), fails
    at = {"head": head, "query": query, "slot": slot}
    for check in ("finite", "softmax"):
        assert any(c == check and a == at for _, _, c, a, _ in fails), (check, fails)
    row = edit.locate(softmax, (head, query, slot), ev)[0] + 1  # the value's own line, not the header's
    assert row > node.line
    assert any(line.startswith(f"eval {ev} layer {layer} head {head}, query {query}, slot {slot}: {softmax} "
                               f"(line {row}) {text.lstrip('-') if 'nan' in text else text}") for line in lines), lines
    assert {f["line"] for s in doc["sites"] for c in s["checks"] if c["check"] == "finite"
            for f in c["failures"]} == {row}


def test_nan_and_inf_in_one_dump_are_both_reported(tmp_path):
    """Two non-finite weights of two checked rows in two layers: both places are named."""
    edit = DumpEdit(FIXTURES / "gpt2-how-are.txt", tmp_path / "d.txt")
    edit.set("kq_soft_max-0", (9, 1, 0), "nan")
    edit.set("kq_soft_max-1", (1, 1, 1), "inf")
    edit.save()
    doc, lines = check_both(edit.path, sites_failed=2)
    finite = {(l, a["head"], a["query"], a["slot"]) for _, l, c, a, _ in failures(doc) if c == "finite"}
    assert finite == {(0, 9, 1, 0), (1, 1, 1, 1)}
    assert any(line.startswith("eval 0 layer 0 head 9, query 1, slot 0: kq_soft_max-0") for line in lines)
    assert any(line.startswith("eval 0 layer 1 head 1, query 1, slot 1: kq_soft_max-1") for line in lines)


def test_nan_in_v_cache_view_fails(tmp_path):
    """A nan llama.cpp printed in the V cache view fails P·V of every row that reads it, and the finite check names
    it (heads.site_view marks KV heads that were not printed with a mask, never with NaN)."""
    edit = DumpEdit(FIXTURES / "gpt2-how-are.txt", tmp_path / "d.txt")
    v = edit.source0("kqv-0")
    edit.set(v.name, (9, 62, 0), "nan")  # KV head 9, dim 62, slot 0: visible to both queries of head 9
    edit.save()
    r = run("check", edit.path, "--json", "-")
    assert r.code == 1, f"exit {r.code}; pv of layer 0: " + json.dumps(
        [c for c in r.json()["sites"][0]["checks"] if c["check"] == "pv"])
    fails = failures(strict_json(r.out))
    assert {(a["head"], a.get("query"), a.get("dim")) for *_, a, _ in fails} >= {(9, 0, 62), (9, 1, 62)}
    # and the value itself, where llama.cpp printed it: V of head 9, dim 62, slot 0 (no query: V is per slot)
    assert {"head": 9, "slot": 0, "dim": 62} in [a for _, _, c, a, _ in fails if c == "finite"]


# --------------------------------------------------------------------------------------------------------------
# Changes that do not matter, and changes within the bound: no failure
# --------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dump,ev,layer,head,query,slot", [
    ("gpt2-how-are.txt", 0, 0, 10, 0, 1),  # the score of a later token of the same ubatch
    ("gpt2-ubatch2.txt", 1, 1, 9, 0, 253),  # the score of an empty slot
    ("llama-gqa-draw.txt", 0, 0, 1, 1, 2),
    (OLD, 0, 1, 6, 0, 2),
])
def test_masked_score_change_is_not_a_failure(dump, ev, layer, head, query, slot, tmp_path):
    """Masked scores are printed but never read (softmax of −inf): changing one by 2.0 changes nothing."""
    edit = DumpEdit(FIXTURES / dump, tmp_path / dump)
    nm = names(dump, layer)
    assert slot > n_past(edit, nm["softmax"], ev) + query
    edit.add(nm["kq"], (head, query, slot), 2.0, ev)
    edit.save()
    r = run("check", edit.path, "--json", "-")
    assert r.code == 0, r.err[-2000:]


def _pv_elements(edit: DumpEdit, dump: str, ev: int, layer: int):
    """Every checked kqv element of a site with its recomputation and its bound, from printed P and V alone:
    (head, query, dim, printed O, Σ_j P_j V_j over the visible slots, its bound as docs/numerics.md §2.5 derives it)."""
    nm = names(dump, layer)
    P = edit.node(nm["softmax"], ev)
    O = edit.node(nm["kqv"], ev)
    V = edit.source0(nm["kqv"], ev)
    n_kv, T, H, _ = P.ne
    H_kv = V.ne[2]
    past = n_past(edit, nm["softmax"], ev)
    out = []
    for t in printed(T):
        slots = list(range(past + t + 1))
        if not set(slots) <= set(printed(n_kv)):
            continue
        for h in printed(H):
            g = h // (H // H_kv)
            p = np.array([edit.get(P.name, (h, t, j), ev) for j in slots])
            for d in printed(O.ne[0]):
                v = np.array([edit.get(V.name, (g, d, j), edit.headers(V.name).index(V.header)) for j in slots])
                bound = pv_bound(p, v, V.type)
                out.append((h, t, d, edit.get(O.name, (h, t, d), ev), float(p @ v), bound))
    return out


PV_SITES = [("gpt2-how-are.txt", 0, 0), ("gpt2-ubatch2.txt", 1, 1), ("gpt2-kv-f32.txt", 0, 1),
            ("llama-gqa-draw.txt", 0, 0), (OLD, 0, 1)]


@pytest.mark.parametrize("dump,ev,layer", PV_SITES)
def test_kqv_changes_within_the_bound_pass(dump, ev, layer, tmp_path):
    """Every checked kqv element of a site moved AWAY from its recomputed value, by less than half its bound and
    by no more than its slack: still a pass. The sharpest no-false-alarm test the 4-decimal print allows."""
    edit = DumpEdit(FIXTURES / dump, tmp_path / dump)
    kqv = names(dump, layer)["kqv"]
    moved = 0
    elements = _pv_elements(edit, dump, ev, layer)
    for h, t, d, got, want, bound in elements:
        err = got - want
        assert abs(err) <= bound, "the shipped dump passes"
        k = math.floor(min(bound / 2, bound - abs(err)) / STEP * (1 - 1e-6))
        if k >= 1:
            edit.add(kqv, (h, t, d), math.copysign(k * STEP, err if err else 1.0), ev)
            moved += 1
    assert moved >= len(elements) // 4, "many elements have room for a change the print can show"
    edit.save()
    r = run("check", edit.path, "--json", "-")
    assert r.code == 0, r.err[-3000:]
    doc = strict_json(r.out)
    [pv] = [c for s in doc["sites"] if (s["evaluation"], s["layer"]) == (ev, layer) for c in s["checks"]
            if c["check"] == "pv"]
    assert pv["checked"] == len(elements) and pv["ratio"] > 0.5, "the changes used up much of the bound"


@pytest.mark.parametrize("dump,ev,layer", PV_SITES)
def test_kqv_change_just_beyond_the_bound_fails(dump, ev, layer, tmp_path):
    """The element with the most room, moved away by the smallest printable step that leaves its bound: exit 1 there."""
    edit = DumpEdit(FIXTURES / dump, tmp_path / dump)
    kqv = names(dump, layer)["kqv"]
    h, t, d, got, want, bound = max(_pv_elements(edit, dump, ev, layer), key=lambda e: e[5] - abs(e[3] - e[4]))
    err = got - want
    k = math.floor((bound - abs(err)) / STEP) + 1
    if abs(err) + k * STEP <= bound * (1 + 1e-6):
        k += 1
    edit.add(kqv, (h, t, d), math.copysign(k * STEP, err if err else 1.0), ev)
    edit.save()
    doc = check_json(edit.path)
    at = {"head": h, "query": t, "dim": d}
    assert [(e, l, c, a) for e, l, c, a, _ in failures(doc)] == [(ev, layer, "pv", at)]


def _sum_expected(edit: DumpEdit, dump: str, ev: int, layer: int) -> tuple[float, float]:
    """(what the `sum =` line must say, its bound), from the headers and printed weights. Today's line sums the
    whole tensor: T·H rows of 1, f32-accumulated over the H·Σ_t (n_past + t + 1) weights not masked. The older
    line sums the printed weights only: their sum, each within 5e-5 of the stored value."""
    softmax = names(dump, layer)["softmax"]
    node = edit.node(softmax, ev)
    n_kv, T, H, _ = node.ne
    if dump != OLD:
        past = n_past(edit, softmax, ev)
        return T * H, sum_bound(H * sum(past + t + 1 for t in range(T)), T * H, T * H, past + T)
    P = [edit.get(softmax, (h, t, j), ev) for h in printed(H) for t in printed(T) for j in printed(n_kv)]
    return sum(P), len(P) * PRINT + sum_bound(sum(p != 0 for p in P), sum(P))


@pytest.mark.parametrize("dump,ev,layer", SUM_CASES)
def test_sum_change_within_the_bound_passes_and_beyond_fails(dump, ev, layer, tmp_path):
    """The `sum = %f` line moved away from what it must say, by less than half its slack: a pass; just past
    its bound (two printed steps of %f beyond): a failure at that site."""
    softmax = names(dump, layer)["softmax"]
    edit = DumpEdit(FIXTURES / dump, tmp_path / "below.txt")
    want, bound = _sum_expected(edit, dump, ev, layer)
    got = edit.get_sum(softmax, ev)
    err = got - want
    assert abs(err) <= bound, "the shipped dump passes"
    step = 1e-6  # the last printed decimal of %f
    side = 1.0 if err >= 0 else -1.0
    below = math.floor(0.4 * (bound - abs(err)) / step) * step
    assert below >= step, f"the bound {bound:.2e} leaves room for a printable change"
    edit.set_sum(softmax, got + side * below, ev)
    edit.save()
    r = run("check", edit.path, "--json", "-")
    assert r.code == 0, r.err[-2000:]

    edit = DumpEdit(FIXTURES / dump, tmp_path / "beyond.txt")
    edit.set_sum(softmax, want + side * (math.ceil(bound / step) + 2) * step, ev)
    edit.save()
    fails = failures(check_json(edit.path))
    assert [(e, l, c) for e, l, c, *_ in fails] == [(ev, layer, "sum")]


# --------------------------------------------------------------------------------------------------------------
# kq_scale
# --------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dump,scale", [("gpt2-how-are.txt", 1 / 8), ("llama-gqa-draw.txt", 32 ** -0.5)])
def test_wrong_kq_scale_fails_and_the_hint_gives_the_right_one(dump, scale):
    doc = check_json(FIXTURES / dump, "--kq-scale", "0.2")
    assert doc["kq_scale"] == {"value": 0.2, "origin": "option", "detail": "--kq-scale"}
    assert {c for _, _, c, _, _ in failures(doc)} >= {"softmax"}
    assert doc["inferred_kq_scale"]["value"] == pytest.approx(scale, rel=1e-3)
    for text in (doc["hint"], *[line for line in _text(FIXTURES / dump, "--kq-scale", "0.2") if line.startswith("hint:")]):
        suggested = re.search(r"kq_scale = ([0-9.]+)", text)
        option = re.search(r"--kq-scale ([0-9.]+)", text)
        assert suggested and option, text
        assert float(suggested.group(1)) == pytest.approx(scale, rel=1e-3), text
        assert float(option.group(1)) == pytest.approx(scale, rel=1e-3), text
    assert run("check", FIXTURES / dump, "--kq-scale", f"{scale:.9f}").code == 0


def _text(path, *args) -> list[str]:
    r = run("check", path, *args)
    assert r.code == 1
    assert sum(line.startswith("hint:") for line in r.out.splitlines()) == 1, r.out[-2000:]
    return r.out.splitlines()


def test_default_scale_is_right_and_gives_no_hint():
    r = run("check", FIXTURES / "gpt2-how-are.txt")
    assert r.code == 0 and "hint:" not in r.out


# --------------------------------------------------------------------------------------------------------------
# --layer and --head restrict what is checked
# --------------------------------------------------------------------------------------------------------------
def _totals(path, *args):
    r = run("check", path, "--json", "-", *args)
    return r.code, strict_json(r.out)


def test_layer_filter_restricts_sites_and_counts():
    _, full = _totals(FIXTURES / "gpt2-ubatch2.txt")
    code, one = _totals(FIXTURES / "gpt2-ubatch2.txt", "--layer", "1")
    assert code == 0
    assert {s["layer"] for s in one["sites"]} == {1} and [s["evaluation"] for s in one["sites"]] == [0, 1, 2]
    assert one["totals"]["sites"] == full["totals"]["sites"] // 2 == 3
    for key in ("softmax_rows_checked", "kqv_elements_checked", "masked_weights_checked",
                "softmax_ratio_elements_checked", "sums_checked"):
        assert 0 < one["totals"][key] < full["totals"][key], key


def test_head_filter_restricts_counts():
    _, full = _totals(FIXTURES / "gpt2-how-are.txt")
    code, one = _totals(FIXTURES / "gpt2-how-are.txt", "--head", "0")
    assert code == 0
    t, f = one["totals"], full["totals"]
    assert t["sites"] == f["sites"] == 2
    # 6 of gpt2-mini's 12 heads are printed: one head is a sixth of every per-head count
    assert (t["softmax_rows_checked"], t["kqv_elements_checked"], t["masked_weights_checked"]) == (
        f["softmax_rows_checked"] // 6, f["kqv_elements_checked"] // 6, f["masked_weights_checked"] // 6) == (4, 24, 18)
    code, two = _totals(FIXTURES / "gpt2-how-are.txt", "--head", "0", "--head", "10")
    assert code == 0 and two["totals"]["kqv_elements_checked"] == 48
    for site in one["sites"]:
        for c in site["checks"]:
            assert c["worst"] is None or c["worst"]["head"] == 0


def test_mutation_is_seen_only_through_its_own_layer_and_head(tmp_path):
    """gpt2-mini prints heads 0 1 2 9 10 11 (head 3 is never printed): the change is in layer 0, head 10."""
    edit = DumpEdit(FIXTURES / "gpt2-how-are.txt", tmp_path / "d.txt")
    edit.add("kq_soft_max-0", (10, 1, 0), 0.002)
    edit.save()
    assert run("check", edit.path, "--head", "0").code == 0
    assert run("check", edit.path, "--head", "0", "--head", "9").code == 0
    assert run("check", edit.path, "--layer", "1").code == 0
    assert run("check", edit.path, "--layer", "1", "--head", "10").code == 0
    for args in (("--head", "10"), ("--layer", "0"), ("--layer", "0", "--head", "10"), ("--head", "2", "--head", "10")):
        doc, lines = check_both(edit.path, *args)
        fails = failures(doc)
        assert {(e, l, a["head"], a["query"]) for e, l, c, a, _ in fails} == {(0, 0, 10, 1)}, args
        assert (0, 0, "softmax", {"head": 10, "query": 1, "slot": 0}) in [f[:4] for f in fails], args
        assert lines and lines[0].startswith("eval 0 layer 0 head 10, query 1, slot 0: kq_soft_max-0"), lines


def test_filter_on_a_head_that_was_never_printed_verifies_nothing():
    """Head 3 of gpt2-mini is elided by the 3+3 print: nothing is checked, and that is not a pass."""
    code, doc = _totals(FIXTURES / "gpt2-how-are.txt", "--head", "3")
    assert code == 3 and doc["verdict"] == "unverified"
    assert doc["totals"]["softmax_rows_checked"] == doc["totals"]["kqv_elements_checked"] == 0


def test_filter_on_an_absent_layer_says_so():
    """gpt2-how-are has the attention of layers 0 and 1 (kq_soft_max-0, kq_soft_max-1): --layer 5 is a usage error
    (exit 2, not a pass), one line naming the layers there are, and no JSON document that could read as a verdict."""
    r = run("check", FIXTURES / "gpt2-how-are.txt", "--layer", "5", "--json", "-")
    assert r.code == 2 and r.out == ""
    assert r.err.strip().endswith("--layer 5: no such layer in " + str(FIXTURES / "gpt2-how-are.txt") +
                                  ": its layers are 0..1")
