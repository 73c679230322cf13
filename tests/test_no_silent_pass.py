"""No fault may switch a check off: a wrong printed value is a failure, never a reason to check less.

The attention facts a dump does not print are pinned per run by hypotheses tested on the printed rows
(attncheck/check/hypotheses.py). A wrong value is a row no hypothesis explains; it must fail under the hypothesis
that explains the most rows (llama.cpp's defaults on a tie), never make the run's checks "not checkable". The dumps
here are the real ones in fixtures/ with the fewest rows that tell hypotheses apart (2-token prompts, -ub 2), where
one wrong row is a large share of them.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

import attncheck
from conftest import FIXTURES, attncheck as run
from dumpedit import DumpEdit, printed, single_faults

FEW_ROWS = ["gpt2-how-are.txt", "gpt2-ubatch2.txt", "llama-gqa-how-are-you.txt", "arch/granite-how-are.txt",
            "arch/bert-how-are.txt", "arch/deepseek2-mla-how-are.txt", "arch/gemma2-ubatch2.txt"]


def _exit(path) -> int:
    return attncheck.verify(attncheck.read_dump(str(path)), jobs=1).exit_code


def _every_weight(dump: str, dst, row) -> DumpEdit:
    """Every printed row of every kq_soft_max node rewritten by row(values) (a hand-made dump: no real llama.cpp run
    prints weights that are all wrong)."""
    e = DumpEdit(FIXTURES / dump, dst)
    e.headers("")  # index the headers
    names = [n for n in e._index[1] if n.startswith("kq_soft_max")]  # type: ignore[index]
    assert names
    for name in names:
        for k in range(len(e.headers(name))):
            for i in e.node(name, k).rows:
                e.lines[i] = row(e.lines[i])
    return e


def _first_two(line: str) -> str:
    return re.sub(r"-?\d+\.\d{4}", "0.5000", line, count=2)


@pytest.mark.parametrize("dump", ["gpt2-how-are.txt", "llama-gqa-draw.txt", "gpt2-ubatch2.txt"])
def test_every_weight_wrong_fails(dump, tmp_path):
    """Every printed weight row's first two values set to 0.5: exit 1 in the text, the JSON and JUnit."""
    path = _every_weight(dump, tmp_path / "d.txt", _first_two).save()
    r = run("check", path, "--json", "-", "--junit", tmp_path / "j.xml")
    assert r.code == 1, r.err
    doc = r.json()
    assert doc["verdict"] == "fail" and doc["totals"]["softmax_rows_checked"] > 0
    assert int(ET.parse(tmp_path / "j.xml").getroot().get("failures")) > 0
    assert "no hypothesis tried explains every printed row" in run("check", path).out


def test_weights_of_the_future_token_fail(tmp_path):
    """gpt2-how-are: query 0 attends only to the later token, query 1 is 0.5, 0.5 (issue's case): exit 1."""
    e = DumpEdit(FIXTURES / "gpt2-how-are.txt", tmp_path / "d.txt")
    for name in ("kq_soft_max-0", "kq_soft_max-1"):
        for h in printed(e.node(name).ne[2]):
            e.set(name, (h, 0, 0), 0.0)
            e.set(name, (h, 0, 1), 1.0)
            e.set(name, (h, 1, 0), 0.5)
            e.set(name, (h, 1, 1), 0.5)
    assert _exit(e.save()) == 1


@pytest.mark.parametrize("dump", FEW_ROWS)
def test_every_single_fault_fails(dump, tmp_path):
    """One moved value in a dump where few rows tell hypotheses apart fails (exit 1): it never makes the run's checks
    not checkable. The clean dump passes."""
    assert _exit(FIXTURES / dump) == 0
    missed = []
    # layer 0's first evaluation: every third fault, for time
    faults = [f for f in single_faults(DumpEdit(FIXTURES / dump, tmp_path / "d.txt"), "kq_soft_max-0", "kqv-0")
              if f[1] == 0][::3]
    for name, occ, index, new in faults:
        e = DumpEdit(FIXTURES / dump, tmp_path / "d.txt")
        e.set(name, index, new, occ)
        if _exit(e.save()) != 1:
            missed.append((name, index, new))
    assert not missed


def test_a_scale_no_stated_hypothesis_has_is_fitted_and_named(tmp_path):
    """granite's scores rescaled as if its attention multiplier were 0.3 (its model says 0.0625; no round value is
    0.3): every row's weight ratios agree on one scale, which is pinned and named with the rows it rests on."""
    e = DumpEdit(FIXTURES / "arch/granite-how-are.txt", tmp_path / "d.txt")
    for name in ("kq-0", "kq-1"):
        ne = e.node(name).ne
        for h in printed(ne[2]):
            for t in printed(ne[1]):
                for j in printed(ne[0]):
                    if (v := e.get(name, (h, t, j))):
                        e.set(name, (h, t, j), v * 0.0625 / 0.3)
    r = run("check", e.save(), "--json", "-")
    assert r.code == 0, r.err
    doc = r.json()
    ks = doc["facts"][0]["kq_scale"]
    assert ks["origin"] == "inferred" and ks["detail"].startswith("fitted") and "(8 rows)" in ks["detail"]
    assert ks["value"] == pytest.approx(0.3, rel=2e-4) and doc["kq_scale"] == ks
    assert doc["totals"]["softmax_rows_checked"] == 16


def test_one_layer_off_fails_under_the_scale_the_others_give(tmp_path):
    """granite's layer 1 scores 2% off (a one-layer scale bug): no single scale explains both layers, so the round
    scale layer 0 gives (0.0625) is pinned for the run and layer 1 fails; layer 0 passes."""
    e = DumpEdit(FIXTURES / "arch/granite-how-are.txt", tmp_path / "d.txt")
    ne = e.node("kq-1").ne
    for h in printed(ne[2]):
        for t in printed(ne[1]):
            for j in printed(ne[0]):
                if (v := e.get("kq-1", (h, t, j))):
                    e.set("kq-1", (h, t, j), v * 1.02)
    r = run("check", e.save(), "--json", "-")
    assert r.code == 1
    doc = r.json()
    assert doc["kq_scale"]["value"] == pytest.approx(0.0625)
    assert [s["passed"] for s in doc["sites"]] == [True, False]


def test_nothing_checked_is_never_a_pass(tmp_path):
    """A run whose sites' weights no check could compare (only the finite values and the `sum =` lines were) exits
    3, not 0: hand-made, every site's positions unknown is the one real way and needs a long windowed run."""
    from attncheck.report import Report
    from attncheck.results import CheckResult, SiteReport

    site = SiteReport(evaluation=0, run=0, n_past=0, T=2, layer=0, H=1, H_kv=1, D_h=4, n_kv=2, kq_scale=0.5,
                      nodes={}, line=1, rows_whole=0, rows_printed=2,
                      results=[CheckResult("finite", "kq-0", 1, checked=4),
                                                 CheckResult("sum", "kq_soft_max-0", 2, checked=1)])
    report = Report(source="x", sites=[site])
    assert report.exit_code == 3 and report.verdict == "unverified"
