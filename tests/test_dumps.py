"""Every shipped real dump verifies, and the counts show that the checks really ran."""
from __future__ import annotations

import pytest

import attncheck
from conftest import DUMPS, FIXTURES, attncheck as run
from dumpedit import DumpEdit, printed
from formulas import Site

# rows whose visible slots are all printed, and their kqv elements (docs/check.md, "The table")
FULLY_CHECKABLE = {"gpt2-how-are.txt": (24, 144)}


def softmax_nodes(path) -> int:
    return sum(1 for line in open(path, encoding="utf-8", errors="replace") if " SOFT_MAX(" in line)


@pytest.mark.parametrize("name", sorted(DUMPS))
def test_exit_code(name):
    r = run("check", FIXTURES / name, "--json", "-")
    assert r.code == DUMPS[name], r.err + r.out[-2000:]
    assert "Traceback" not in r.err


@pytest.mark.parametrize("name", sorted(n for n, code in DUMPS.items() if code == 0))
def test_sites_and_coverage(name):
    report = attncheck.verify(FIXTURES / name)
    totals = report.totals()
    assert totals["sites"] == softmax_nodes(FIXTURES / name)
    assert all(len(ev_sites) == 2 for ev_sites in _sites_per_eval(report))
    rows, kqv = FULLY_CHECKABLE.get(name, (36, 216))
    assert totals["softmax_rows_checked"] == rows
    assert totals["kqv_elements_checked"] == kqv
    assert totals["masked_weights_checked"] > 0
    assert totals["sums_checked"] == totals["sites"]


def _sites_per_eval(report):
    evs = {}
    for s in report.sites:
        evs.setdefault(s.evaluation, []).append(s)
    return evs.values()


def test_json_counts_match_readme():
    doc = run("check", FIXTURES / "gpt2-how-are.txt", "--json", "-").json()
    assert doc["schema"] == 1 and doc["verdict"] == "pass"
    assert doc["totals"]["softmax_rows_checked"] == 24
    assert doc["totals"]["kqv_elements_checked"] == 144
    assert doc["tokens"] == [[257, 260]]


def test_ubatches_are_evaluations_with_n_past():
    report = attncheck.verify(FIXTURES / "gpt2-ubatch2.txt")
    assert [(s.evaluation, s.n_past, s.T) for s in report.sites if s.layer == 0] == [(0, 0, 2), (1, 2, 2), (2, 4, 2)]


def test_flash_attention_says_how_to_get_scores():
    r = run("check", FIXTURES / "gpt2-flash-attn.txt")
    assert r.code == 3
    assert "--flash-attn off" in r.out


def test_old_format_sum_is_recognised_as_printed_only():
    report = attncheck.verify(FIXTURES / "old-llama-gqa-how-are-you.txt")
    notes = {s.result("sum").note for s in report.sites}
    assert notes == {"printed values only (llama.cpp before PR #15637 summed what it printed)"}
    today = attncheck.verify(FIXTURES / "llama-gqa-draw.txt")
    assert {s.result("sum").note for s in today.sites} == {"full tensor: T·H rows that each sum to 1"}


def test_kq_scale_is_inferred():
    report = attncheck.verify(FIXTURES / "llama-gqa-long.txt")
    assert report.inferred_kq_scale == pytest.approx(32 ** -0.5, rel=1e-3)


def test_stdin_pipe():
    r = run(stdin=(FIXTURES / "gpt2-how-are.txt").read_bytes())
    assert r.code == 0
    assert "PASS <stdin>" in r.out


def test_atol_rtol_replace_the_derived_bounds():
    """--atol/--rtol override the derived bounds of the value checks, and the report says which bounds were used."""
    derived = run("check", FIXTURES / "gpt2-how-are.txt", "--json", "-").json()
    assert derived["tolerance"]["origin"].startswith("derived")
    loose = run("check", FIXTURES / "gpt2-how-are.txt", "--atol", "1e-3", "--json", "-")
    assert loose.code == 0 and loose.json()["tolerance"] == {"origin": "--atol/--rtol", "atol": 1e-3, "rtol": 0.0}
    assert {c["bound"] for s in loose.json()["sites"] for c in s["checks"] if c["check"] == "pv"} == {1e-3}
    # a tolerance below print precision (5e-5) cannot hold for 4-decimal prints: the same real dump fails, at
    # exactly the elements whose error, recomputed here from the printed numbers, exceeds 1e-5
    tight = run("check", FIXTURES / "gpt2-how-are.txt", "--atol", "1e-5", "--rtol", "0", "--json", "-")
    assert tight.code == 1
    edit = DumpEdit(FIXTURES / "gpt2-how-are.txt", FIXTURES / "gpt2-how-are.txt")
    for s in tight.json()["sites"]:
        site = Site(edit, s["layer"])
        err = {"softmax": {}, "pv": {}}
        for t in printed(site.T):  # T = 2: every row is whole
            for h in printed(site.H):
                slots = site.visible(t)
                for j, got, want in zip(slots, site.p(h, t, slots), site.recompute(h, t)):
                    err["softmax"][h, t, j] = abs(got - want)
                for d in printed(site.D_h):
                    err["pv"][h, t, d] = abs(site.o(h, t, d) - site.pv(h, t, d)[0])
        for c in s["checks"]:
            last = "dim" if c["check"] == "pv" else "slot"
            if c["check"] in err:
                beyond = {k for k, e in err[c["check"]].items() if e > 1e-5}
                assert c["failed"] == len(beyond)  # the JSON lists the first of them
                assert {(f["at"]["head"], f["at"]["query"], f["at"][last]) for f in c["failures"]} <= beyond
                h, t, x = max(err[c["check"]], key=err[c["check"]].get)
                assert c["worst"] == {"head": h, "query": t, last: x} and c["bound"] == 1e-5
            else:
                assert c["passed"], c  # masked weights print exactly 0; the sum is within 1e-5 of T·H


@pytest.mark.parametrize("name", ["gpt2-how-are-you.txt", "llama-gqa-how-are-you.txt", "gpt2-kv-f32.txt", "old-llama-gqa-how-are-you.txt"])
def test_a_site_view_has_every_field_its_class_declares(name):
    """heads.site_view fills a SiteView's fields without its __init__ (as `placed` copies one): each view holds
    exactly the declared fields, and equals the view the dataclass would make of them. GQA (llama) reads a printed
    V head per query head; gpt2's heads read V's printed heads as they are."""
    import dataclasses

    import numpy as np

    from attncheck.check.gather import gather
    from attncheck.sites.heads import SiteView

    names = [f.name for f in dataclasses.fields(SiteView)]
    views = [p.view for ev in attncheck.read_dump(FIXTURES / name).evaluations() for p in gather(ev, name).pending]
    assert views
    for view in views:
        assert list(vars(view)) == names
        made = SiteView(**vars(view))
        for f in names:
            a, b = getattr(view, f), getattr(made, f)
            assert (np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b), f
