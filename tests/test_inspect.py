"""`attncheck inspect`: the numbers it shows are the dumped ones, and its recomputations follow the formulas.

The dumped numbers are read here from the dump text with a few lines of parsing of its own, and the recomputed ones
are derived here from those numbers (scaled = kq / sqrt(D_h), softmax over the visible slots, Σ_j p_j v_j), never by
calling attncheck's own functions.
"""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import FIXTURES, attncheck as run
from formulas import pv_bound, softmax_bound

HEADER = re.compile(r"^\w+:\s*(?P<name>.*?) = \((?P<type>\w+)\)\s*(?P<op>\w+)\(.*\) = \{(?P<ne>[\d, ]+)\}\s*$")
NUMBER = re.compile(r"-?(?:\d+\.\d+|inf|nan)")


def printed(n: int) -> list[int]:
    """llama.cpp prints the first 3 and last 3 indices of a dimension longer than 6."""
    return list(range(n)) if n <= 6 else [0, 1, 2, n - 3, n - 2, n - 1]


def node(name: str, path, op: str | None = None):
    """The last node called `name` (of op `op`): its ne and, per printed i2, the printed rows [i1][i0]."""
    found = None
    lines = open(path, encoding="utf-8", errors="replace").read().split("\n")
    for i, line in enumerate(lines):
        m = HEADER.match(line)
        if m and m["name"].strip() == name and (op is None or m["op"] == op):
            found = (tuple(int(x) for x in m["ne"].split(",")), i)
    assert found, f"{name} not in {path}"
    ne, start = found
    blocks: list[list[list[float]]] = []
    depth = 0
    for line in lines[start + 1:]:
        s = line.strip()
        if s.startswith("sum ="):
            break
        if s == "[":
            depth += 1
            if depth == 2:
                blocks.append([])
        elif s in ("],", "]"):
            depth -= 1
        elif s.startswith("["):
            blocks[-1].append([float(x) for x in NUMBER.findall(s)])
    return ne, blocks


def node_type(name: str, path, op: str | None = None) -> str:
    """The storage type in the last header of that node (f16, f32, ...)."""
    found = [m["type"] for line in open(path, encoding="utf-8", errors="replace")
             if (m := HEADER.match(line.rstrip("\n"))) and m["name"].strip() == name and (op is None or m["op"] == op)]
    return found[-1]


def block(name: str, path, logical: int, op: str | None = None):
    """The printed [i1][i0] rows of logical index `logical` along ne2 (a head or KV head)."""
    ne, blocks = node(name, path, op)
    return blocks[printed(ne[2]).index(logical)]


def inspect_json(path, *args) -> dict:
    r = run("inspect", path, *map(str, args), "--json", "-")
    assert r.code == 0, r.err
    return r.json()


# (fixture, layer, head, H_kv ratio): GPT-2 "How are", Llama GQA (8 heads, 2 KV heads), GPT-2 with elided rows
CASES = [
    ("gpt2-how-are.txt", 0, 0, 1),
    ("gpt2-how-are.txt", 1, 11, 1),
    ("llama-gqa-draw.txt", 0, 5, 4),
    ("llama-gqa-draw.txt", 1, 2, 4),
    ("gpt2-long.txt", 1, 10, 1),
]


def names(layer: int) -> dict[str, tuple[str, str]]:
    return {
        "q": (f"Qcur-{layer} (view) (permuted)", "PERMUTE"),
        "k": (f"cache_k_l{layer} (view) (permuted)", "PERMUTE"),
        "v": (f"cache_v_l{layer} (view) (permuted)", "PERMUTE"),
        "kq": (f"kq-{layer}", "MUL_MAT"),
        "p": (f"kq_soft_max-{layer}", "SOFT_MAX"),
        "o": (f"kqv-{layer}", "MUL_MAT"),
    }


@pytest.mark.parametrize("name,layer,head,group", CASES)
def test_shown_numbers_are_the_dumped_ones(name, layer, head, group):
    path = FIXTURES / name
    doc = inspect_json(path, "--layer", layer, "--head", head)
    n = names(layer)
    g = head // group
    assert doc["kv_head"] == g
    t = doc["query"]["index"]
    T = node(n["p"][0], path, n["p"][1])[0][1]
    tp = printed(T).index(t)
    # Q_h: the q node's block of this head, rows = printed queries
    assert doc["Q_h"]["values"] == block(n["q"][0], path, head, n["q"][1])
    # K_h: the K view's block of KV head h // (H / H_kv), rows = printed slots
    assert doc["K_h"]["values"] == block(n["k"][0], path, g, n["k"][1])
    # V_h: the V view {n_kv, D_h, H_kv} holds V_h transposed
    v = block(n["v"][0], path, g, n["v"][1])
    assert doc["V_h"]["values"] == [list(col) for col in zip(*v)]
    kq = block(n["kq"][0], path, head, n["kq"][1])
    p = block(n["p"][0], path, head, n["p"][1])
    o = block(n["o"][0], path, head, n["o"][1])
    assert doc["scores"]["kq"] == kq[tp]
    assert doc["scores"]["kq_soft_max"] == p[tp]
    assert doc["weighted_sum"]["kqv"] == o[tp]
    assert doc["P_h"]["weights"] == p


@pytest.mark.parametrize("name,layer,head,group", CASES)
def test_recomputed_numbers_follow_the_formulas(name, layer, head, group):
    path = FIXTURES / name
    doc = inspect_json(path, "--layer", layer, "--head", head)
    n = names(layer)
    ne_q = node(n["q"][0], path, n["q"][1])[0]
    ne_p = node(n["p"][0], path, n["p"][1])[0]
    D_h, n_kv, T = ne_q[0], ne_p[0], ne_p[1]
    t = doc["query"]["index"]  # n_past = 0: one evaluation
    tp = printed(T).index(t)
    slots = printed(n_kv)
    kq = block(n["kq"][0], path, head, n["kq"][1])[tp]
    p = block(n["p"][0], path, head, n["p"][1])[tp]
    v = block(n["v"][0], path, head // group, n["v"][1])  # [d][j]

    # scaled scores: kq · (1 / sqrt(D_h)), the scale as llama.cpp computes it: 1.0f/sqrtf(D_h)
    scale = float(np.float32(1) / np.sqrt(np.float32(D_h)))
    assert doc["kq_scale"]["value"] == pytest.approx(scale, rel=1e-15)
    assert doc["scores"]["scaled"] == pytest.approx([s * scale for s in kq], abs=1e-12)
    # mask: slot j is visible to the query at position t iff j <= t
    visible = [j <= t for j in slots]
    assert doc["scores"]["mask"] == [0.0 if vis else "-inf" for vis in visible]
    # softmax over the visible slots (all printed for the default query), 0 elsewhere
    assert sum(visible) == t + 1
    x = [s * scale for s, vis in zip(kq, visible) if vis]
    e = [math.exp(xi - max(x)) for xi in x]
    want = iter([ei / sum(e) for ei in e])
    softmax = [next(want) if vis else 0.0 for vis in visible]
    assert doc["scores"]["softmax"] == pytest.approx(softmax, abs=1e-12)
    assert doc["scores"]["error"] == pytest.approx([abs(a - b) for a, b in zip(p, softmax)], abs=1e-12)
    # bounds (docs/numerics.md §2.3): 5e-5 + p·(e^{2·scale·5e-5} − 1) for a visible slot, exactly 0 for a masked one
    want_bound = [float(softmax_bound(q, scale)) if vis else 0.0 for q, vis in zip(softmax, visible)]
    assert doc["scores"]["bound"] == pytest.approx(want_bound, rel=1e-2)
    assert all(err <= b for err, b in zip(doc["scores"]["error"], want_bound))
    # weighted sum: O_h[t, d] = Σ_j p_j v_j over the visible slots, with the dumped p_j
    o = [sum(pj * v[d][j] for j, pj in enumerate(p) if visible[j]) for d in range(len(v))]
    assert doc["weighted_sum"]["weighted_sum"] == pytest.approx(o, abs=1e-12)
    kqv = block(n["o"][0], path, head, n["o"][1])[tp]
    assert doc["weighted_sum"]["error"] == pytest.approx([abs(a - b) for a, b in zip(kqv, o)], abs=1e-12)
    vis_p = np.array([pj for pj, vis in zip(p, visible) if vis])
    v_type = node_type(n["v"][0], path, n["v"][1])
    want_bound = [pv_bound(vis_p, np.array([v[d][j] for j in range(len(p)) if visible[j]]), v_type)
                  for d in range(len(v))]
    assert doc["weighted_sum"]["bound"] == pytest.approx(want_bound, rel=2e-3)
    assert all(err <= b for err, b in zip(doc["weighted_sum"]["error"], want_bound))
    assert doc["passed"] is True


def test_default_query_is_the_last_whose_visible_slots_are_printed():
    # "How are": the query " are" (position 1) reads "How" and itself
    assert inspect_json(FIXTURES / "gpt2-how-are.txt", "--layer", 0, "--head", 0)["query"]["index"] == 1
    # 13 queries, slots 0, 1, 2, 253.. printed: query 2 is the last that sees only printed slots
    assert inspect_json(FIXTURES / "gpt2-long.txt", "--layer", 0, "--head", 0)["query"]["index"] == 2


def test_partly_printed_row_is_recomputed_relative_to_a_printed_slot():
    path = FIXTURES / "gpt2-long.txt"
    doc = inspect_json(path, "--layer", 1, "--head", 10, "--query", 11)
    kq = block("kq-1", path, 10)[printed(13).index(11)]
    p = block("kq_soft_max-1", path, 10)[printed(13).index(11)]
    k = max(range(3), key=lambda j: p[j])  # slots 0, 1, 2 visible and printed; 3..11 visible, not printed
    assert doc["scores"]["reference_slot"] == k
    want = [p[k] * math.exp((kq[j] - kq[k]) / 8) for j in range(3)]
    shown = doc["scores"]["softmax"]
    assert shown[k] is None
    assert [shown[j] for j in range(3) if j != k] == pytest.approx([want[j] for j in range(3) if j != k], abs=1e-12)
    assert shown[3:] == [0.0, 0.0, 0.0]  # slots 253..255: empty
    assert doc["weighted_sum"] is None and "not all printed" in doc["weighted_sum_why_not"]


@pytest.mark.parametrize("head", [0, 1, 2, 5, 6, 7])
def test_gqa_rows_are_those_of_kv_head_h_div_4(head):
    path = FIXTURES / "llama-gqa-draw.txt"
    doc = inspect_json(path, "--layer", 0, "--head", head)
    g = head // 4
    assert (doc["H"], doc["H_kv"], doc["kv_head"]) == (8, 2, g)
    k_mine, k_other = block("cache_k_l0 (view) (permuted)", path, g), block("cache_k_l0 (view) (permuted)", path, 1 - g)
    assert doc["K_h"]["values"] == k_mine != k_other
    v = block("cache_v_l0 (view) (permuted)", path, g)
    assert doc["V_h"]["values"] == [list(col) for col in zip(*v)]
    r = run("inspect", path, "--layer", "0", "--head", str(head))
    assert f"head {head} reads KV head {g}" in r.out


@pytest.mark.parametrize("name,args,valid", [
    ("gpt2-how-are.txt", ["--layer", "2", "--head", "0"], "layers 0..1"),
    ("gpt2-how-are.txt", ["--layer", "0", "--head", "12"], "heads 0..11"),
    ("gpt2-how-are.txt", ["--layer", "0", "--head", "-1"], "heads 0..11"),
    ("gpt2-how-are.txt", ["--layer", "0", "--head", "0", "--query", "2"], "queries 0..1"),
    ("gpt2-how-are.txt", ["--layer", "0", "--head", "0", "--eval", "1"], "evaluations 0"),
    ("gpt2-long.txt", ["--layer", "0", "--head", "5"], "heads 0, 1, 2, 9, 10, 11 of 0..11"),
    ("gpt2-long.txt", ["--layer", "0", "--head", "0", "--query", "7"], "queries 0, 1, 2, 10, 11, 12 of 0..12"),
    ("llama-gqa-draw.txt", ["--layer", "0", "--head", "8"], "heads 0..7"),
    ("gpt2-ubatch2.txt", ["--layer", "0", "--head", "0", "--eval", "3"], "evaluations 0..2"),
])
def test_what_does_not_exist_is_one_line_naming_the_valid_range(name, args, valid):
    r = run("inspect", FIXTURES / name, *args)
    assert r.code == 2
    lines = r.err.strip().splitlines()
    assert len(lines) == 1, r.err
    assert lines[0].startswith(f"attncheck: error: {FIXTURES / name}: ")
    assert valid in lines[0]
    assert r.out == ""


def test_flash_attention_exits_3_with_the_advice_of_check():
    r = run("inspect", FIXTURES / "gpt2-flash-attn.txt", "--layer", "0", "--head", "0")
    assert r.code == 3
    assert "--flash-attn off" in r.err and len(r.err.strip().splitlines()) == 1


def test_unreadable_model_is_one_line_exit_2():
    r = run("inspect", FIXTURES / "gpt2-how-are.txt", "--layer", "0", "--head", "0", "--model", "m.gguf")
    assert r.code == 2 and "m.gguf" in r.err and len(r.err.strip().splitlines()) == 1


def _colour_run(env: dict) -> str:
    full = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "TERM")}
    proc = subprocess.run([sys.executable, "-m", "attncheck", "inspect", str(FIXTURES / "gpt2-how-are.txt"),
                           "--layer", "0", "--head", "0"], env={**full, **env}, capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.decode()


def test_no_color_has_no_escapes_and_still_shows_the_heatmap():
    coloured = _colour_run({"FORCE_COLOR": "1"})
    assert "\x1b[" in coloured  # forced colour does colour: the next assertion means something
    plain = _colour_run({"FORCE_COLOR": "1", "NO_COLOR": "1"})
    assert "\x1b" not in plain
    heat = plain[plain.index("P_h = kq_soft_max"):]
    assert re.search(r"▶ 1 \(pos 1 tok 260\)\s+██ 0\.9710\s+0\.0290", heat)  # shade + dumped weight, no colour
    assert re.search(r"0 \(pos 0 tok 257\)\s+██ 1\.0000\s+·", heat)  # a masked cell
    assert "masked" in heat and "not printed" in heat  # the legend


def test_json_file_and_table(tmp_path):
    out = tmp_path / "walk.json"
    r = run("inspect", FIXTURES / "gpt2-how-are.txt", "--layer", "0", "--head", "0", "--json", out)
    assert r.code == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == 1 and doc["command"] == "inspect"
    assert "P_h = kq_soft_max" in r.out and "PASS" in r.out


def test_a_changed_weight_fails(tmp_path):
    text = (FIXTURES / "gpt2-how-are.txt").read_text()
    start = text.index("kq_soft_max-0 = ")
    old = "0.9710,       0.0290"
    at = text.index(old, start)
    bad = tmp_path / "bad.txt"
    bad.write_text(text[:at] + "0.9730,       0.0290" + text[at + len(old):])
    r = run("inspect", bad, "--layer", "0", "--head", "0", "--json", "-")
    assert r.code == 1
    doc = r.json()
    # query 1 reads slots 0 and 1; the weight of slot 0 moved from 0.9710 by 0.002, 40× its bound of about 5e-5
    assert doc["query"]["index"] == 1 and doc["passed"] is False
    scores = doc["scores"]
    assert scores["kq_soft_max"][0] == 0.973
    beyond = [j for j, e, b in zip(scores["slots"], scores["error"], scores["bound"]) if e > b]
    assert beyond == [0]
    # P·V reads the moved weight: every printed dim of query 1 moves by 0.002·|V_0,d|
    assert all(e > b for e, b in zip(doc["weighted_sum"]["error"], doc["weighted_sum"]["bound"]))
    text = run("inspect", bad, "--layer", "0", "--head", "0")
    assert text.code == 1
    assert re.search(r"^ 0 tok 257 .* 0\.9730 .* FAIL\s*$", text.out, re.M), text.out
    assert re.search(r"^ 1 tok 260 .* 0\.0290 .* ok\s*$", text.out, re.M), text.out
    assert re.search(r"^FAIL 2 visible weights, 4 masked weights, 6 kqv elements of query 1", text.out, re.M)
