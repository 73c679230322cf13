"""Another model of matching shapes is not blamed on llama.cpp (issue 25): a dump checked with a model it was not made
with is refused, "this dump was not made with this model" (exit 2), not FAILed against a reference it never ran; and
a correct run with its own model is never refused.

The other model is the real fixture model with its embedding table rolled by one row (tests/gguf_edit.py): every
shape and key the same, the rows of the prompt's tokens not. No real pair of models differs in that way alone.
"""
from __future__ import annotations

import json
import re

import pytest

from conftest import DUMPS, FIXTURES, attncheck as run
from dumpedit import DumpEdit
from gguf_edit import rolled_embeddings

MODELS = FIXTURES / "models"
MANIFEST = [json.loads(line) for line in (FIXTURES / "MANIFEST.jsonl").read_text().splitlines() if line.strip()]
OWN = {e["dump"]: MODELS / e["model"] for e in MANIFEST if (MODELS / e["model"]).exists() and e["dump"] in DUMPS}
NOT_THIS = "this dump was not made with this model"


@pytest.fixture(scope="module")
def others(tmp_path_factory):
    folder = tmp_path_factory.mktemp("other-models")
    return {m.name: rolled_embeddings(m, folder / m.name) for m in MODELS.glob("*.gguf")}


@pytest.mark.parametrize("dump", sorted(OWN))
def test_every_fixture_with_its_own_model_is_not_refused(dump):
    r = run("check", FIXTURES / dump, "--model", OWN[dump], "-q")
    assert NOT_THIS not in r.err and r.code in (0, 3), (r.code, r.err)


@pytest.mark.parametrize("dump", ["gpt2-how-are.txt", "gpt2-ubatch2.txt", "llama-gqa-draw.txt"])
def test_another_model_of_the_same_shapes_is_refused(dump, others):
    """With the log's token ids, the printed embedding rows are not the other model's rows of those ids. (A 2024 log
    prints no ids: they are looked up in the model's table, and the rolled table gives other ids for the same rows,
    under which that model is the dump's: nothing to refuse.)"""
    model = others[OWN[dump].name]
    r = run("check", FIXTURES / dump, "--model", model, "-q")
    assert r.code == 2 and r.out == "", (r.code, r.out[-500:], r.err)
    (line,) = [x for x in r.err.splitlines() if x.startswith("attncheck: error:")]
    assert re.match(rf"attncheck: error: {re.escape(str(FIXTURES / dump))}:\d+: {NOT_THIS}: ", line), line
    r = run("diff", FIXTURES / dump, FIXTURES / dump, "--model", model, "-q")
    assert r.code == 2 and NOT_THIS in r.err, (r.code, r.err)


def _embeddings_moved(tmp_path, moved: int):
    """gpt2-how-are.txt with `moved` printed values of its embedding lookup ('embd') changed by 0.5."""
    edit = DumpEdit(FIXTURES / "gpt2-how-are.txt", tmp_path / f"moved{moved}.txt")
    cells = [(0, t, i) for t in range(2) for i in (0, 1, 2, 765, 766, 767)][:moved]
    for cell in cells:
        edit.set("embd", cell, edit.get("embd", cell) + 0.5)
    return edit.save()


def test_diff_of_dumps_whose_embedding_lookups_differ_is_refused(tmp_path):
    """Two dumps of one prompt whose printed embedding rows differ in most values were not made with one model."""
    r = run("diff", FIXTURES / "gpt2-how-are.txt", _embeddings_moved(tmp_path, 12), "-q")
    assert r.code == 2 and "not made with the same model and prompt" in r.err, (r.code, r.err)


def test_one_moved_embedding_value_is_a_difference_not_another_model(tmp_path):
    """A lookup that moves one value is a build's bug, for the checks to name: neither command refuses the dump, and
    check --model, which compares every printed node, fails it at the lookup."""
    moved = _embeddings_moved(tmp_path, 1)
    r = run("diff", FIXTURES / "gpt2-how-are.txt", moved, "-q")
    assert "not made with" not in r.err and r.code in (0, 1), (r.code, r.err)
    r = run("check", moved, "--model", OWN["gpt2-how-are.txt"], "-q", "--json", "-")
    assert "not made with" not in r.err and r.code == 1, (r.code, r.err)
    failed = {c["node"] for s in r.json()["sites"] for c in s["checks"] if not c["passed"]}
    assert failed == {"embd"}, failed  # the lookup, named as the dump names it
