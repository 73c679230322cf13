"""`--html` without a browser: the page's structure and data on the real dumps, and text from the input landing as
text (the browser test in tests/e2e/test_html.py opens the same pages in Chromium)."""
from __future__ import annotations

import json
from html.parser import HTMLParser

import numpy as np
import pytest

from attncheck.present.page import unpack
from conftest import FIXTURES, attncheck as run
from dumpedit import DumpEdit
from htmlcases import FAILING, GPT2, NASTY, NASTY_NODE, failing_copy, nasty_dump, nasty_model


class Page(HTMLParser):
    """The elements of a page (tag, attributes, the grid they sit in), its text, and its script data."""

    def __init__(self, text: str):
        super().__init__()
        self.elements: list[tuple[str, dict, dict]] = []  # tag, attributes, attributes of the enclosing grid table
        self.text: list[str] = []
        self.scripts: list[tuple[dict, str]] = []
        self._grid: dict = {}
        self._row: dict = {}
        self._col = 0
        self._script: dict | None = None
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self._grid = a if "grid" in (a.get("class") or "") else {}
        if tag == "tr":
            self._row, self._col = a, 0
        if tag in ("td", "th"):
            self._col += 1
        if tag == "script":
            self._script = a
        self.elements.append((tag, a, {**self._grid, **self._row, "column": self._col}))

    def handle_endtag(self, tag):
        if tag == "table":
            self._grid = {}

    def handle_data(self, data):
        if self._script is not None:
            self.scripts.append((self._script, data))
            self._script = None
        else:
            self.text.append(data)

    def cells(self, kind: str = "ev") -> list[tuple[dict, dict]]:
        """Head cells of the per-evaluation grids (class c; data-h their head, from the column) or of the
        worst-over-evaluations one (data-h): (attributes, grid and row)."""
        out = []
        for tag, a, g in self.elements:
            if tag != "td" or kind not in (g.get("class") or ""):
                continue
            if kind == "ev" and "c" in (a.get("class") or "").split():
                out.append(({**a, "data-h": str(g["column"] - 2)}, g))
            elif kind != "ev" and "data-h" in a:
                out.append((a, g))
        return out

    @property
    def data(self) -> dict:
        (text,) = [t for a, t in self.scripts if a.get("type") == "application/json"]
        return json.loads(text)


def page_of(tmp_path, dump, *args, code=0) -> tuple[Page, dict]:
    out, doc = tmp_path / "page.html", tmp_path / "report.json"
    r = run("check", dump, "--html", out, "--json", doc, "-q", *args)
    assert r.code == code, r.err
    return Page(out.read_text(encoding="utf-8")), json.loads(doc.read_text())


@pytest.mark.parametrize("dump", ["gpt2-how-are.txt", "gpt2-ubatch2.txt", "llama-gqa-draw.txt",
                                  "old-llama-gqa-how-are-you.txt"])
def test_the_grid_has_a_cell_per_evaluation_layer_and_head(dump, tmp_path):
    page, doc = page_of(tmp_path, FIXTURES / dump)
    want = {(s["evaluation"], s["layer"], h) for s in doc["sites"] for h in range(s["H"])}
    got = [(int(g["data-e"]), int(g["data-l"]), int(a["data-h"])) for a, g in page.cells()]
    assert len(got) == len(want) and set(got) == want
    worst = {(int(g["data-l"]), int(a["data-h"])) for a, g in page.cells("worst")}
    assert worst == {(layer, h) for _, layer, h in want}
    titles = [a["title"] for a, _ in page.cells("worst") if "np" not in a["class"]]  # counts without JavaScript
    assert titles and all("elements compared" in t and "beyond their bound" in t for t in titles)
    assert doc["verdict"] == "pass" and not any("failing" in classes(a) for a, _ in page.cells())
    assert "PASS " in "".join(page.text)  # the verdict is in the HTML itself, for a browser without JavaScript


def test_the_page_holds_the_printed_weights_and_outputs(tmp_path):
    page, _ = page_of(tmp_path, FIXTURES / "gpt2-ubatch2.txt")
    edit = DumpEdit(FIXTURES / "gpt2-ubatch2.txt", tmp_path / "unused.txt")  # an independent reader of the text
    (d,) = page.data["dumps"]
    for site in d["sites"]:
        heads, q, s, dims = site["heads"], site["q"], site["s"], site["d"]
        P = unpack(site["P"], (len(heads), len(q), len(s)))
        O = unpack(site["O"], (len(heads), len(q), len(dims)))
        layer, nth = site["l"], site["e"]
        for i, h in enumerate(heads):
            for k, t in enumerate(q):
                assert P[i, k].tolist() == pytest.approx(
                    [edit.get(f"kq_soft_max-{layer}", (h, t, j), nth) for j in s], abs=1e-6)
                assert O[i, k].tolist() == pytest.approx(
                    [edit.get(f"kqv-{layer}", (h, t, x), nth) for x in dims], abs=1e-6)
    assert d["tokens"] == {"0": doc_tokens(FIXTURES / "gpt2-ubatch2.txt")}


def doc_tokens(dump) -> list[int]:
    return run("check", dump, "--json", "-").json()["tokens"][0]


def classes(cell: dict) -> set[str]:
    return set((cell.get("class") or "").split())


PASSING = {"ok1", "ok2", "ok3"}  # need ≤ 0.5, ≤ 0.9, ≤ 1: one green, shaded (present/html.py)


@pytest.mark.parametrize("dump, model", [("gpt2-long.txt", None), ("gpt2-ubatch2.txt", GPT2),
                                         ("llama-gqa-draw.txt", None), ("old-llama-gqa-how-are-you.txt", None)])
def test_a_correct_run_reads_correct_and_a_failing_one_shows_red(dump, model, tmp_path):
    """A correct run's need is 0.9 to 1 by design: each of its cells is a passing green or, where nothing was
    compared, grey; never the failing red. The failing copy has red cells, exactly where the report fails."""
    page, doc = page_of(tmp_path, FIXTURES / dump, *(("--model", model) if model else ()))
    cells = [a for a, _ in page.cells()] + [a for a, _ in page.cells("worst")]
    assert cells and all(classes(a) & (PASSING | {"np"}) for a in cells)
    assert not any("failing" in classes(a) for a in cells)
    sites = {(s["e"], s["l"]): s for s in page.data["dumps"][0]["sites"]}
    near = {(int(g["data-e"]), int(g["data-l"]), int(a["data-h"])) for a, g in page.cells()
            if float(sites[(int(g["data-e"]), int(g["data-l"]))]["fig"].get(a["data-h"], [0, 0, 0])[2]) > 0.9}
    assert near  # heads this close to their bound pass by design: the same green, darkest shade
    assert all("ok3" in classes(a) for a, g in page.cells()
               if (int(g["data-e"]), int(g["data-l"]), int(a["data-h"])) in near)
    legend = " ".join(page.text)
    assert "need is the worst |err| ÷ bound" in " ".join(legend.split()) and "need ≤ 1 passes" in legend
    bad, _ = page_of(tmp_path, failing_copy(tmp_path / "bad.txt"), *(("--model", model) if model else ()), code=1)
    red = [a for a, _ in bad.cells() if "failing" in classes(a)]
    assert red and all(a.get("title") is None or "beyond their bound" in a["title"] for a in red)


def test_the_grid_colours_are_one_green_for_passing_and_red_for_failing():
    """page.css: the three passing shades are light greens close to each other; failing is the page's red."""
    import re
    from importlib import resources

    css = resources.files("attncheck.present").joinpath("page.css").read_text()
    rgb = {k: tuple(int(v[i:i + 2], 16) for i in (0, 2, 4))
           for k, v in re.findall(r"\.(ok\d) \{ background: #([0-9a-f]{6}); \}", css)}
    assert set(rgb) == PASSING
    assert all(g > r + 20 and g > b + 10 and min(r, g, b) > 150 for r, g, b in rgb.values())  # light green
    assert max(abs(x - y) for a in rgb.values() for b in rgb.values() for x, y in zip(a, b)) < 60  # shades of one
    assert ".failing { background: var(--fail); }" in css and "--fail: #c62828" in css


def test_a_failing_copy_marks_its_cell_and_its_element(tmp_path):
    page, doc = page_of(tmp_path, failing_copy(tmp_path / "bad.txt"), code=1)
    failing = {(int(g["data-e"]), int(g["data-l"]), int(a["data-h"])) for a, g in page.cells()
               if "failing" in classes(a)}
    assert failing == {(0, 0, 0)}
    (site,) = [s for s in page.data["dumps"][0]["sites"] if s["l"] == 0]
    head, query, slot = FAILING
    marked = [f for f in site["fails"] if f[:4] == [head, "P", query, slot]]
    assert marked and marked[0][4] == pytest.approx(0.031) and marked[0][5] == pytest.approx(0.029, abs=1e-4)
    assert marked[0][6] < 1e-4  # the bound the element broke
    assert {f[1] for f in site["fails"]} == {"P", "O"}  # the kqv elements the changed weight feeds fail too
    assert doc["sites"][0]["passed"] is False


def test_with_the_model_the_page_holds_reference_rows_over_the_visible_slots(tmp_path):
    page, _ = page_of(tmp_path, FIXTURES / "gpt2-ubatch2.txt", "--model", GPT2)
    (d,) = page.data["dumps"]
    for site in d["sites"]:
        widths = [site["n_past"] + t + 1 for t in range(site["T"])]  # visible slots only, not the empty cache
        H = len(site["rheads"])
        assert site["rheads"] == list(range(site["H"]))  # every head, printed or not
        rows = unpack(site["rP"], (H, sum(widths)))
        sums = np.add.reduceat(rows, np.cumsum([0, *widths[:-1]]), axis=1)
        assert np.allclose(sums, 1.0, atol=1e-5)
        assert unpack(site["rO"], (H, site["T"], site["rD"])).shape == (H, site["T"], 64)
    from gguf import GGUFReader

    vocab = GGUFReader(GPT2).fields["tokenizer.ggml.tokens"].contents()
    # token text as text: GPT-2's byte-level spelling of a space ("Ġ") undone (the prompt's tokens are plain ASCII)
    assert d["vocab"] and all(vocab[int(i)].replace("Ġ", " ") == text for i, text in d["vocab"].items())
    assert " like" in d["vocab"].values() and not any("Ġ" in t for t in d["vocab"].values())


def test_text_from_the_input_lands_as_text(tmp_path):
    """A node name and a token text holding markup: escaped in the HTML, intact in the data."""
    out = tmp_path / "page.html"
    r = run("check", nasty_dump(tmp_path / "nasty.txt"), "--model", nasty_model(tmp_path / "nasty.gguf"),
            "--html", out, "-q")
    assert r.code == 1, r.err
    text = out.read_text(encoding="utf-8")
    assert NASTY not in text and "<img" not in text
    page = Page(text)
    assert [tag for tag, _, _ in page.elements if tag in ("script", "img", "iframe")] == ["script", "script"]
    assert NASTY_NODE in "".join(page.text)  # the failure lines name the node, as text
    (d,) = page.data["dumps"]
    assert d["vocab"]["257"] == NASTY
    assert any(s["nodes"].get("kq_soft_max") == NASTY_NODE for s in d["sites"])


def test_an_html_target_in_a_missing_folder_is_a_usage_error_before_any_work(tmp_path):
    r = run("check", tmp_path / "no-such-dump.txt", "--html", tmp_path / "missing" / "page.html")
    assert r.code == 2 and "Traceback" not in r.err
    assert r.err.splitlines() == [f"attncheck: error: --html {tmp_path / 'missing' / 'page.html'}: the folder "
                                  f"{tmp_path / 'missing'} does not exist"]
    assert run("check", FIXTURES / "gpt2-how-are.txt", "--html", tmp_path).code == 2  # a folder, not a file
    started = run("run", "-m", GPT2, "-p", "x", "--bin", tmp_path / "no-such-binary", "--html", tmp_path / "no" / "p.html")
    assert started.code == 2 and started.err.startswith("attncheck: error: --html ")  # before llama.cpp starts


def test_an_unusable_dump_is_on_the_page_beside_the_others(tmp_path):
    out = tmp_path / "page.html"
    r = run("check", FIXTURES / "gpt2-how-are.txt", tmp_path / "missing.txt", "--html", out, "-q")
    assert r.code == 2
    page = Page(out.read_text(encoding="utf-8"))
    assert len(page.data["dumps"]) == 1 and "missing.txt: cannot read" in "".join(page.text)


def test_inspect_writes_the_one_head_view(tmp_path):
    out = tmp_path / "head.html"
    r = run("inspect", failing_copy(tmp_path / "bad.txt"), "--layer", "0", "--head", "0", "--html", out)
    assert r.code == 1, r.err
    page = Page(out.read_text(encoding="utf-8"))
    text = "".join(page.text)
    assert "FAIL 2 visible weights" in text and "0.0310" in text  # the walk, as the terminal shows it
    data = page.data
    assert data["kind"] == "inspect" and data["open"] == {"d": 0, "e": 0, "l": 0, "h": 0}
    (site,) = data["dumps"][0]["sites"]
    assert site["heads"] == [0] and [0, "P", 1, 1] in [f[:4] for f in site["fails"]]
    assert not page.cells()  # no grid: one head


def test_diff_writes_the_nodes_along_the_graph_with_the_first_divergent_marked(tmp_path):
    out, doc = tmp_path / "diff.html", tmp_path / "diff.json"
    r = run("diff", FIXTURES / "gpt2-how-are-you.txt", FIXTURES / "gpt2-kv-f32.txt", "--exact", "-q", "--html", out,
            "--json", doc)
    assert r.code == 1, r.err
    report = json.loads(doc.read_text())
    page = Page(out.read_text(encoding="utf-8"))
    compared = [n for n in report["nodes"] if not n["skipped"]]
    rows = [a for tag, a, _ in page.elements if tag == "tr" and (a.get("id") or "").startswith("n")]
    links = [a for tag, a, _ in page.elements if tag == "a" and (a.get("href") or "").startswith("#n")]
    assert len(rows) == len(links) == len(compared)
    (first,) = [a for a in rows if "first" in (a.get("class") or "")]
    assert compared[int(first["id"][1:])]["new"]["name"] == report["first_divergent"]["new"]["name"]
    assert sum("failing" in classes(a) for a in links) == report["totals"]["diverged"]
    assert "▶ first divergent computation" in "".join(page.text)


@pytest.mark.parametrize("facts", [
    {"kq_scale": {"value": 0.125, "origin": "GGUF attention.scale", "rows": 12}, "sinks": {"value": None,
                                                                                          "origin": "none"}},
    [{"name": "kq_scale", "value": 0.125, "origin": "GGUF attention.scale", "rows": 12},
     {"name": "sinks", "value": None, "origin": "none"}],
])
def test_facts_of_the_report_show_whatever_their_form(facts):
    """The report's `facts` entry (a dict or a list of facts, each a value and an origin) becomes rows as it is."""
    from attncheck.present.html import fact_rows, table

    rows = fact_rows(facts)
    assert rows == [("kq_scale", "0.125", "GGUF attention.scale", "rows: 12"), ("sinks", "—", "none", "")]
    assert "<td>GGUF attention.scale</td>" in table(("fact", "value", "origin", "details"), rows)


def test_the_facts_each_run_was_checked_under_are_on_the_page(tmp_path):
    """The report's per-run records (facts, and how they were pinned) become rows named by run."""
    page, doc = page_of(tmp_path, FIXTURES / "gpt2-ubatch2.txt", "--kq-scale", "0.125")
    (record,) = doc["facts"]
    text = " ".join(page.text)
    assert "run 0 kq_scale" in text and record["kq_scale"]["origin"] in text
    assert "run 0: how" in text and f"rows: {record['rows']}" in text


def test_masked_slots_carry_their_reason(tmp_path):
    """gpt2-ubatch2 (-ub 2): a later token of the ubatch is causal (1), slots past the tokens are empty (2), and the
    unprinted slots 3..252 hold as many visible slots as the query's position passes 2."""
    page, _ = page_of(tmp_path, FIXTURES / "gpt2-ubatch2.txt")
    sites = {(s["e"], s["l"]): s for s in page.data["dumps"][0]["sites"]}
    first, last = sites[(0, 0)], sites[(2, 0)]
    assert first["s"] == last["s"] == [0, 1, 2, 253, 254, 255] and first["q"] == [0, 1]
    assert first["mask"] == "012222" + "002222"  # query 0 at position 0: slot 1 is the next token's
    assert last["mask"] == "000222" * 2 and last["gaps"] == [[2], [3]]  # positions 4 and 5 see slots 3.. of the gap
    assert page.data["reasons"]["3"] == "outside the window"


def test_a_window_masks_by_its_own_reason():
    """No shipped dump has a sliding window; the reasons come from sites/mask.py under the site's facts."""
    from types import SimpleNamespace

    from attncheck.sites.mask import Geometry
    from attncheck.present.page import mask_codes

    sr = SimpleNamespace(kq_scale=0.125, facts={"mask": "causal", "window": {"n_swa": 2, "kind": "standard"}})
    out = mask_codes(Geometry(4, 2, 256, True), sr, {"q": [0, 1], "s": [0, 1, 2, 253, 254, 255], "rP": None})
    assert out["mask"] == "333222" + "333222"  # positions 4 and 5 see only themselves and the slot before
    assert out["gaps"] == [[2], [2]]
