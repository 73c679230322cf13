"""One role vocabulary (dump/vocabulary.py): the names roles.py gives a dump's nodes, the reference forward pass's keys,
the --model mapping's quantities, diff's role sets and inspect's labels are all its names, so a name means one thing
wherever it is read (k_view is the K cache kq reads, in the dump, the reference and the report alike)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from attncheck import read_dump
from attncheck.diff import drift, mean, softmax
from attncheck.dump.roles import ROLES, assign
from attncheck.dump.vocabulary import ROWS, TERMS, VOCABULARY, axes, value_of
from attncheck.inspect.shapes import shapes
from attncheck.model import bounds, compare, mapping, runs
from attncheck.model.chains import global_chains, layer_chains
from attncheck.model.reference import forward
from attncheck.model.weights import load_model

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
MODELS = sorted((FIXTURES / "models").glob("*.gguf"))
DUMPS = sorted(p for p in FIXTURES.rglob("*.txt") if p.parent.name != "refused")
AXES = {"query", "head", "kvhead", "dim", "slot", "one", "row", "col"}


def _name(key: str) -> str:
    """A reference key's vocabulary name: `role@step` is a step inside the role."""
    return key.split("@", 1)[0]


def test_every_term_is_complete_and_each_name_is_given_once():
    assert len(VOCABULARY) == len(TERMS)
    for t in TERMS:
        assert re.fullmatch(r"[A-Za-z_]+", t.name) and t.meaning and t.kind in ("role", "inner"), t
        assert len(t.axes) == 3 and set(t.axes) <= AXES, t
        if t.holds is not None:  # holds another's values: in that one's layout
            assert VOCABULARY[t.holds].holds is None and t.axes == axes(t.holds), t
    assert list(ROLES) == [t.name for t in TERMS if t.kind == "role"]


@pytest.mark.parametrize("dump", DUMPS, ids=lambda p: p.name)
def test_roles_assigned_to_a_dump_are_vocabulary_names(dump):
    names = set()
    for ev in read_dump(dump).evaluations():
        for role in assign(ev).of.values():
            if role.kind == "role":
                names.add(role.name)
            elif role.kind == "derived":  # Qcur.src0: the path back from a role
                names.add(role.name.split(".", 1)[0])
    assert names and names <= set(ROLES), names - set(ROLES)


@pytest.mark.parametrize("model", MODELS, ids=lambda p: p.name)
def test_the_reference_keeps_its_values_under_vocabulary_names(model):
    m = load_model(model)
    ref = forward(m, [1, 2, 3, 4], kv_type="q8_0" if "quant" in model.name else "f16")
    keys = {_name(role) for _, role in ref.tensors}
    assert {"k_view", "v_view", "kq_soft_max", "kqv", "l_out"} <= keys
    assert keys <= set(VOCABULARY), keys - set(VOCABULARY)
    chains = {**layer_chains(m, 0), **global_chains(m)}
    assert set(chains) <= set(VOCABULARY), set(chains) - set(VOCABULARY)
    steps = {_name(s.key) for c in chains.values() for s in c} | {s.quantity for c in chains.values() for s in c}
    assert steps - {"rows"} <= set(VOCABULARY)


def test_the_mapping_and_the_checks_name_vocabulary_terms():
    for q, labels in mapping.CANONICAL.items():  # each quantity in its vocabulary axes; "rows" is ROWS
        assert labels == (ROWS if q == "rows" else axes(q)), q
    assert set(mapping.KV_QUANTITIES) == {"Kcur", "Vcur", "k_rot", "v_rot", "k_view", "v_view"}
    assert set(mapping.ROW_ROLES) == {t.name for t in TERMS if t.kind == "role" and t.axes == ROWS}
    named = (set(compare.CHECK) | set(bounds.DERIVED) | set(bounds.DERIVED_ROWS) | set(runs.INPUT_ROLES)
             | set(drift.MEAN_ROLES) | set(drift.SOFTMAX_ROLES) | set(mean.ROW_ROLES) | set(softmax.SCORE_ROLES))
    assert named <= set(VOCABULARY), named - set(VOCABULARY)
    assert value_of("k_store") == "k_view" and value_of("flash_attn") == value_of("kqv_out") == "kqv"


def test_inspect_labels_its_nodes_with_vocabulary_names():
    dump = read_dump(FIXTURES / "llama-gqa-how-are-you.txt")
    site = next(dump.evaluations()).sites[0]
    labels = {s.role for s in shapes(site)}
    assert {"q", "k_view", "v_view", "kq", "kq_soft_max", "kqv"} <= labels <= set(ROLES)


def test_the_old_names_are_gone():
    """k_cache, Krot and Vrot were the reference's names for k_view, k_rot and v_rot; `k` and `v` the mapping's."""
    old = re.compile(r"[\"'](k_cache|v_cache|Krot|Vrot|k|v)[\"']\s*[:,)]")
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in (ROOT / "attncheck" / "model").rglob("*.py")
            for i, line in enumerate(p.read_text().splitlines(), 1) if old.search(line)]
    assert not hits, hits
