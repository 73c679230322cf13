"""One kq_scale per report: the top-level fact, each run's pinned fact, each site's value and the --model checks'
hyperparameters all give the same SOFT_MAX scale (per D_h where the fact is 1/sqrt(D_h)), on real dumps with and
without their model, with --kq-scale, and for inspect's walk of a head."""
from __future__ import annotations

import numpy as np
import pytest

from attncheck import verify
from attncheck.inspect.model_walk import walk_with_model
from attncheck.inspect.walk import walk

from conftest import FIXTURES

MODELS = FIXTURES / "models"


def scales(doc: dict) -> list[tuple[str, int | None, float]]:
    """Every place a check --json document gives a kq_scale: (where, the D_h it is for (None: every D_h), value);
    a fact of 1/sqrt(D_h) gives no number of its own."""
    out: list[tuple[str, int | None, float]] = []

    def fact(where: str, f: dict) -> None:
        v = f["value"]
        if isinstance(v, dict):  # fitted per D_h
            out.extend((where, int(d), s) for d, s in v.items())
        elif v is not None:
            out.append((where, None, v))

    fact("kq_scale", doc["kq_scale"])
    for i, r in enumerate(doc["facts"]):
        fact(f"facts[{i}].kq_scale", r["kq_scale"])
    for s in doc["sites"]:
        out.append((f"sites[evaluation {s['evaluation']}, layer {s['layer']}].kq_scale", s["D_h"], s["kq_scale"]))
        if "kq_scale" in (s.get("facts") or {}):
            out.append((f"sites[evaluation {s['evaluation']}, layer {s['layer']}].facts.kq_scale", s["D_h"],
                        s["facts"]["kq_scale"]))
    hp = (doc.get("model") or {}).get("hparams")
    if hp:
        out.append(("model.hparams.kq_scale", hp["head_dim"], hp["kq_scale"]))
    return out


def disagreements(places: list[tuple[str, int | None, float]]) -> list[str]:
    """Pairs of places whose D_h match (or either is for every D_h) but whose values differ."""
    return [f"{a} = {x!r} but {b} = {y!r}" for i, (a, da, x) in enumerate(places) for b, db, y in places[i + 1:]
            if (da is None or db is None or da == db) and x != y]


def test_disagreements_are_found():
    """The test's own check fails on a report whose site says another scale than its model."""
    places = [("kq_scale", None, 0.125), ("sites[0].kq_scale", 64, 0.125), ("model.hparams.kq_scale", 64, 0.2)]
    assert disagreements(places) == ["kq_scale = 0.125 but model.hparams.kq_scale = 0.2",
                                     "sites[0].kq_scale = 0.125 but model.hparams.kq_scale = 0.2"]
    assert disagreements([("a", 32, 0.17), ("b", 64, 0.125)]) == []


CASES = [  # dump, model, --kq-scale: the default, a log's header, q pre-scaled, an inferred scale, flash, an option
    ("llama-gqa-long.txt", None, None),
    ("llama-gqa-long.txt", "llama-mini-gqa-f16.gguf", None),
    ("llama-gqa-long.txt", "llama-mini-gqa-f16.gguf", 0.2),
    ("old-llama-gqa-how-are-you.txt", None, None),
    ("arch/gemma2-ubatch2.txt", None, None),
    ("arch/granite-how-are.txt", None, None),
    ("gpt2-flash-attn.txt", "gpt2-mini-q8_0.gguf", None),
    ("gpt2-how-are.txt", "gpt2-mini-q8_0.gguf", 0.25),
]


@pytest.mark.parametrize("dump,model,kq_scale", CASES)
def test_one_report_gives_one_kq_scale(dump, model, kq_scale):
    report = verify(str(FIXTURES / dump), kq_scale=kq_scale, model=str(MODELS / model) if model else None, jobs=1)
    places = scales(report.to_dict())
    assert any(w.startswith("sites") for w, _, _ in places), places  # the sites were checked and say their scale
    assert not disagreements(places)
    if kq_scale is not None:
        assert {v for _, _, v in places} == {kq_scale}


def test_a_given_scale_reaches_every_place():
    """Without any run's pinned facts (--layer of a layer the dump lacks a site for is refused, so the report is
    built here as verify builds it), the top-level fact is the given one: the model's header, as its checks use."""
    report = verify(str(FIXTURES / "gpt2-flash-attn.txt"), model=str(MODELS / "gpt2-mini-q8_0.gguf"), jobs=1)
    report.facts = []
    assert report.kq_scale_fact() == {"value": 0.125, "origin": "model", "detail": "gpt2: 1/sqrt(key_length 64)"}
    assert not disagreements(scales(report.to_dict()))


def test_inspect_walks_under_the_scale_it_is_given():
    """walk()'s kq_scale is the scale of its recomputation, and with a model the same scale its reference uses."""
    w = walk(str(FIXTURES / "gpt2-how-are.txt"), 1, 1, kq_scale=0.3)
    assert w.kq_scale == 0.3 and w.scale_origin == "--kq-scale"
    gap = {}
    for given in (None, 0.2):
        w, mw = walk_with_model(str(FIXTURES / "llama-gqa-draw.txt"), 0, 5, str(MODELS / "llama-mini-gqa-f16.gguf"),
                                kq_scale=given)
        assert w.kq_scale == (0.1767766922712326 if given is None else given)  # the header's, in f32
        row = next(r for r in mw.rows if r.name == "kq_soft_max")
        gap[given] = float(np.nanmax(np.abs(row.dumped - row.reference)))
    assert gap[None] < 1e-4 < gap[0.2]  # the reference's weights are computed under the same scale


@pytest.mark.parametrize("n", [24, 32, 96, 128])
def test_the_default_scale_is_llama_cpps_f32_as_a_header_gives_it(n):
    """Without a header the scale 1/sqrt(D_h) is llama.cpp's 1.0f/sqrtf(float(D_h)), two f32 roundings (an ulp from
    1/sqrt rounded once for 24 and 96), the value a model's or a log's header gives: one kq_scale either way."""
    from attncheck.arch.header import facts_from_header
    from attncheck.check.fits import round_scale
    from attncheck.sites.resolve import default_scale

    want = float(np.float32(1) / np.sqrt(np.float32(n)))
    meta = {"general.architecture": "llama", "llama.attention.key_length": n, "llama.attention.head_count": 4,
            "llama.embedding_length": 4 * n, "llama.block_count": 1}
    assert default_scale(n) == want == facts_from_header(meta).kq_scale.value
    assert round_scale(want * (1 + 1e-6)) == want  # a fitted scale near it is named that value
