"""A guard against structural bugs: what every shipped dump's checks must count, derived here from the headers.

For each attention site the counts follow from the ne printed in the headers and from n_past (the T of the earlier
evaluations) alone: llama.cpp prints indices 0, 1, 2, n-3, n-2, n-1 of a dimension longer than 6; query t of an
evaluation sits at position n_past + t and reads slots 0..n_past + t. So, with pH, pT, pS, pD the printed heads,
queries, slots and dims:

- masked:  for each printed query, pH × (printed slots past its position)
- softmax: rows whose visible slots are all printed ("whole"), pH × (n_past + t + 1) weights each
- softmax_ratio: the other rows' printed visible slots but the reference one (the row's largest printed weight),
  for rows whose largest printed weight is above 5e-5; the rest unchecked
- pv:      whole rows × heads whose KV head h // (H / H_kv) was printed × pD; the rest unchecked
- finite:  every printed score, weight and output, and V of every head whose KV head was printed
- sum:     one per site

A mask, an n_past, a GQA mapping or an elision rule off by one changes one of these numbers. The headers are parsed
here by a few regular expressions, not by attncheck.
"""
from __future__ import annotations

import re
from collections import defaultdict

import pytest

import attncheck
from conftest import DUMPS, FIXTURES
from dumpedit import DumpEdit, printed

_HEADER = re.compile(r"^(?:common_debug_cb_eval|ggml_debug): +(.*?) = \((\w+)\) *([A-Z0-9_]+)\((.*)\) = "
                     r"\{(\d+), (\d+), (\d+), (\d+)\}\s*$")
_SRC = re.compile(r"(.*?)\{(\d+), (\d+), (\d+), (\d+)\}")


def headers(path) -> list[tuple[str, str, list[tuple[str, tuple[int, ...]]], tuple[int, ...]]]:
    """(name, op, [(source name, its ne)], ne) of every header line, in order."""
    out = []
    for line in path.read_text(encoding="latin-1").splitlines():
        m = _HEADER.match(line)
        if m:
            srcs = [(s.strip(" ,"), tuple(map(int, ne))) for s, *ne in _SRC.findall(m[4])]
            out.append((m[1].strip(), m[3], srcs, tuple(int(x) for x in m.group(5, 6, 7, 8))))
    return out


def expected(name: str, tmp_path) -> list[dict[str, tuple[int, int]]]:
    """Per site, in order: {check: (checked, unchecked)}."""
    hs = headers(FIXTURES / name)
    edit = DumpEdit(FIXTURES / name, tmp_path / name)
    T_seen: dict[str, list[int]] = defaultdict(list)  # T of each evaluation so far, per SOFT_MAX name
    sites = []
    for i, (node, op, srcs, ne) in enumerate(hs):
        if op != "SOFT_MAX":
            continue
        ev = len(T_seen[node])
        n_past = sum(T_seen[node])
        T_seen[node].append(ne[1])
        kqv = next(h for h in hs[i + 1:] if h[1] == "MUL_MAT" and h[2][1][0] == node)
        n_kv, T, H, _ = ne
        D_h = kqv[3][0]
        H_kv = kqv[2][0][1][2]  # the V view {n_kv, D_h, H_kv, 1}
        pH, pT, pS, pD = printed(H), printed(T), printed(n_kv), printed(D_h)
        kv_printed = [h for h in pH if h // (H // H_kv) in printed(H_kv)]
        c = defaultdict(lambda: [0, 0])
        c["finite"][0] = 2 * len(pH) * len(pT) * len(pS) + len(pH) * len(pT) * len(pD) + len(kv_printed) * len(pD) * len(pS)
        for t in pT:
            pos = n_past + t
            visible = [j for j in pS if j <= pos]
            c["masked"][0] += len(pH) * (len(pS) - len(visible))
            if len(visible) == pos + 1:  # every visible slot printed
                c["softmax"][0] += len(pH) * len(visible)
                c["pv"][0] += len(kv_printed) * len(pD)
                c["pv"][1] += (len(pH) - len(kv_printed)) * len(pD)
                continue
            c["softmax"][1] += len(pH) * len(visible)
            c["pv"][1] += len(pH) * len(pD)
            for h in pH:
                usable = max(edit.get(node, (h, t, j), ev) for j in visible) > 5e-5
                c["softmax_ratio"][0] += len(visible) - 1 if usable else 0
                c["softmax_ratio"][1] += 1 if usable else len(visible)
        c["sum"][0] = 1
        sites.append({k: tuple(v) for k, v in c.items()})
    return sites


def counted(doc: dict) -> list[dict[str, tuple[int, int]]]:
    out = []
    for s in doc["sites"]:
        c = defaultdict(lambda: [0, 0])
        for r in s["checks"]:
            c[r["check"]][0] += r["checked"]
            c[r["check"]][1] += r["unchecked"]
        out.append({k: tuple(v) for k, v in c.items() if k != "softmax_ratio" or v != [0, 0]})
    return out


@pytest.mark.parametrize("name", sorted(DUMPS))
def test_every_check_counts_what_the_headers_say(name, tmp_path):
    want = expected(name, tmp_path)
    doc = attncheck.verify(FIXTURES / name).to_dict()
    assert doc["exit_code"] == DUMPS[name]
    for w in want:  # a site without ratio rows reports no ratio check elements either way
        if w.get("softmax_ratio") == (0, 0):
            del w["softmax_ratio"]
    assert counted(doc) == want
    t = doc["totals"]
    assert t["sites"] == len(want)
    assert t["softmax_elements_checked"] == sum(w["softmax"][0] for w in want)
    assert t["softmax_ratio_elements_checked"] == sum(w.get("softmax_ratio", (0, 0))[0] for w in want)
    assert t["masked_weights_checked"] == sum(w["masked"][0] for w in want)
    assert t["kqv_elements_checked"] == sum(w["pv"][0] for w in want)
    assert t["kqv_elements_unchecked"] == sum(w["pv"][1] for w in want)
    assert t["sums_checked"] == len(want)


def test_the_counts_are_not_empty(tmp_path):
    """The guard above means something only if the shipped dumps hold every kind of row: whole rows, ratio rows,
    masked slots, later evaluations (n_past > 0) and GQA."""
    sites = {name: expected(name, tmp_path) for name in DUMPS}
    assert sites["gpt2-flash-attn.txt"] == []
    every = [s for v in sites.values() for s in v]
    assert all(s["masked"][0] for s in every)
    assert all(sum(s["softmax"][0] for s in v) and sum(s["pv"][0] for s in v) for v in sites.values() if v)
    assert sum(1 for s in every if s.get("softmax_ratio", (0, 0))[0]) >= 6
    # gpt2-ubatch2: 3 evaluations × 2 layers; the third (n_past = 4) has ratio rows only
    assert len(sites["gpt2-ubatch2.txt"]) == 6
    assert [s["softmax"][0] > 0 for s in sites["gpt2-ubatch2.txt"]] == [True] * 4 + [False] * 2
