"""The architecture table (attncheck/arch/table.py) is complete and every word of its switches has a reader: an
entry names itself and says what it is; a switch's word outside its Literal type is an error when the entry is
built (at import for the table), never a silent default; and each word is handled by the code that reads it
(arch/header.py, arch/facts.py and sites/mask.py for the window, model/reference.py for the forward pass).

Hand-made entries and stand-ins: no dump holds a wrong table; the readers are driven with each word in turn."""
from __future__ import annotations

from types import SimpleNamespace
from typing import get_args

import numpy as np
import pytest

from attncheck.arch import header
from attncheck.arch.facts import Window, WindowKind
from attncheck.arch.table import (ARCHS, Arch, Attention, Ffn, Forward, Norm, Positions, QScale, Recurrent, Scale,
                                  lookup)
from attncheck.model.reference import _Pass
from attncheck.sites.mask import OUTSIDE_WINDOW, reasons

GOOD_FORWARD = dict(norm="rms", norm_eps_key="attention.layer_norm_rms_epsilon", positions="rope_neox", ffn="swiglu",
                    about="a layer")


def test_every_entry_is_complete():
    assert len(ARCHS) >= 20
    for name, a in ARCHS.items():
        assert a.name == name and lookup(name) is a
        assert a.about and isinstance(a.attention, Attention)
        if a.forward is not None:
            assert a.forward.about and a.forward.norm_eps_key


@pytest.mark.parametrize("field, word", [("norm", "batch"), ("positions", "alibi"), ("ffn", "relu")])
def test_an_unknown_forward_word_is_an_error(field, word):
    with pytest.raises(ValueError, match=f"Forward.{field} = '{word}'"):
        Forward(**{**GOOD_FORWARD, field: word})


@pytest.mark.parametrize("kw", [dict(scale="sqrt"), dict(scale="q_prescaled", q_scale="gemma"),
                                dict(swa="sliding"), dict(recurrent="mamba")])
def test_an_unknown_attention_word_is_an_error(kw):
    with pytest.raises(ValueError, match="not one of"):
        Attention(**kw)


@pytest.mark.parametrize("kw", [dict(scale="q_prescaled"), dict(q_scale="head_dim"),
                                dict(scale="q_prescaled", q_scale="gemma_27b"), dict(swa_pattern=2),
                                dict(alibi_max_bias=8.0, alibi_key=True)])
def test_an_incomplete_or_contradictory_attention_is_an_error(kw):
    with pytest.raises(ValueError):
        Attention(**kw)


def test_an_entry_without_its_words_is_an_error():
    with pytest.raises(ValueError):
        Arch("x", "")
    with pytest.raises(ValueError):
        Forward(**{**GOOD_FORWARD, "about": ""})
    with pytest.raises(ValueError, match="window kind"):
        Window(4, "sliding")


def test_every_word_is_used_by_the_table():
    """A word no entry uses is a reader branch no dump exercises."""
    attention = [a.attention for a in ARCHS.values()]
    forward = [a.forward for a in ARCHS.values() if a.forward is not None]
    used = {Scale: {x.scale for x in attention}, QScale: {x.q_scale for x in attention},
            Recurrent: {x.recurrent for x in attention}, Norm: {f.norm for f in forward},
            Positions: {f.positions for f in forward}, Ffn: {f.ffn for f in forward}}
    for kind, words in used.items():
        assert set(get_args(kind)) <= words, kind
    assert {x.swa for x in attention} - {None} <= set(get_args(WindowKind))


def test_header_reads_every_scale_word():
    """Each SOFT_MAX scale word has its rule in arch/header.py, and each gives a scale from a plain header."""
    assert set(header.SCALES) == set(get_args(Scale))
    meta = {"attention.key_length": 64, "rope.dimension_count": 32, "attention.scale": 0.5,
            "attention.key_length_mla": 16}
    key = lambda k, default=None: meta.get(k, default)  # noqa: E731
    got = {w: header.SCALES[w](key, 64, [])[0] for w in get_args(Scale)}
    assert got == {"head_dim": 0.125, "attention.scale": 0.5, "rope_dim": np.float32(1 / np.sqrt(32)), "one": 1.0,
                   "q_prescaled": 1.0, "mla": 0.25}


def test_header_reads_every_q_scale_and_recurrent_word():
    assert set(header.Q_SCALE_DIMS) == set(get_args(QScale))
    assert set(header.RECURRENT) == set(get_args(Recurrent))
    gemma = Attention(scale="q_prescaled", q_scale="gemma_27b", gemma_27b_layers=46)
    assert header.q_scale(gemma, 128, 4608, 32, 46) == np.float32(1 / np.sqrt(4608 / 32))  # the 27B model
    assert header.q_scale(gemma, 128, 4608, 32, 42) == np.float32(1 / np.sqrt(128))
    assert header.q_scale(Attention(), 128, 4608, 32, 46) is None
    key = lambda k, default=None: {"full_attention_interval": 4}.get(k, default)  # noqa: E731
    assert header.RECURRENT["qwen35"](key, 8) == frozenset({0, 1, 2, 4, 5, 6})


def test_every_window_kind_masks_by_its_own_rule():
    """arch/facts.py's Window.masks and sites/mask.py's reasons agree, and the three kinds differ: standard masks
    slots n or more behind, symmetric beyond n/2 either side, chunked before the query's chunk of n."""
    q, k = np.arange(8), np.arange(8)
    seen = {}
    for kind in get_args(WindowKind):
        m = Window(4, kind).masks(q, k)
        r = reasons(np.array([0]), np.array([0]), np.array([8]), q, k, False, np.array([4]), kind)[0]
        assert np.array_equal(m, r == OUTSIDE_WINDOW), kind
        seen[kind] = m
    assert seen["standard"][7].tolist() == [True] * 4 + [False] * 4
    assert seen["symmetric"][3].tolist() == [True] + [False] * 5 + [True] * 2
    assert seen["chunked"][5].tolist() == [True] * 4 + [False] * 4
    with pytest.raises(ValueError):
        reasons(np.array([0]), np.array([0]), np.array([8]), q, k, False, np.array([4]), "sliding")


def test_the_reference_computes_every_ffn_word_its_own_way():
    """model/reference.py's build_ffn per word: gelu reads no gate, swiglu_fused splits its up projection, swiglu and
    geglu read a gate and differ in its activation."""
    x = np.linspace(-2, 2, 8, dtype=np.float32).reshape(2, 4)
    out = {}
    for word in get_args(Ffn):
        read = []

        def linear(prefix, v, key=None, memo=None, read=read):
            read.append(prefix.split(".")[-1])
            return np.asarray(v, np.float32) * (1.0 if prefix.endswith("up") else 0.5)

        stand_in = SimpleNamespace(fw=SimpleNamespace(ffn=word), linear=linear, out={})
        out[word] = (_Pass.ffn(stand_in, "blk.0.", x), tuple(read))
    assert out["gelu"][1] == ("ffn_up", "ffn_down") and out["swiglu_fused"][1] == ("ffn_up", "ffn_down")
    assert out["swiglu"][1] == out["geglu"][1] == ("ffn_up", "ffn_gate", "ffn_down")
    assert out["swiglu_fused"][0].shape == (2, 2)  # [gate | up] halves
    values = [out[w][0] for w in ("gelu", "swiglu", "geglu")]
    assert not any(np.allclose(a, b) for i, a in enumerate(values) for b in values[i + 1:])
