"""Layer 0's kqv bound as a weighted mean (attncheck/model/weighted_mean.py; docs/numerics.md §3.2).

kqv is a P-weighted mean of V: llama.cpp's scores differ from the reference's by q's rounding Δq (one vector for
every key), each key's Δk and the dot product's f32 noise, and its softmax of them moves the mean by
Σ_j P_j (e^{Δ_j} − 1)(V_j − f) / Σ_j P_j e^{Δ_j}. The bound is tested here against that arithmetic itself: on the
reference of a real dump, llama.cpp's side is made with every admissible deviation at its extreme (each sign at
random, and the signs that push the mean hardest), P rounded to f16 as MUL_MAT(v, P) reads it; no draw may exceed
the bound. A real dump cannot show this: its deviations are the ones its run took, not the worst.
"""
from __future__ import annotations

import numpy as np
import pytest

import attncheck
from attncheck.model.checker import ModelChecker
from attncheck.model.layer0 import gamma
from attncheck.model.matmul import convert, vec_dot_type
from attncheck.model.numerics import KV_QT, round_f16
from attncheck.model.weighted_mean import weighted_mean
from conftest import FIXTURES

GPT2 = FIXTURES / "models" / "gpt2-mini-q8_0.gguf"
LLAMA = FIXTURES / "models" / "llama-mini-gqa-f16.gguf"


def expected(dump: str, model):
    """The Expected of a fixture run, once its first evaluation is checked."""
    d = attncheck.read_dump(FIXTURES / dump)
    mc = ModelChecker(str(model), d.source)
    mc.check(next(iter(d.evaluations())))
    return mc.current[0]


def llama_side(exp, h: int, t: int, signs: np.ndarray, rng: np.random.Generator, flash: bool) -> np.ndarray:
    """kqv [D_v] of query t, head h as llama.cpp could compute it: q, K and V moved by their whole deviations with
    the given signs (signs[0] for q [D], signs[1] per key [T, D], V's at random), each score by its f32 noise,
    the softmax rounded by its few roundings, P rounded to f16 (not inside FLASH_ATTN_EXT)."""
    q, k, v, p = exp._heads(0)
    rd = exp._read()
    n = t + 1
    k_fmt = vec_dot_type(KV_QT[exp.kv_type])  # q as k·q reads it: f16 for an f16 K cache, f32 for an f32 one
    qq = np.asarray(convert(q[h, t], k_fmt)[0], np.float64) + signs[0] * rd["dq"][h, t]
    kk = k[h, :n] + signs[1][:n] * rd["dk"][h, :n]
    noise = rng.uniform(-1, 1, n) * gamma(q.shape[-1]) * (np.abs(q[h, t]) @ np.abs(k[h, :n]).T)
    s = exp.scale * (kk @ qq + noise)
    w = np.exp(s - s.max())
    pt = w / w.sum() * (1 + rng.uniform(-1, 1, n) * (n + 4) * 2.0**-24)
    vv = v[h, :, :n] + rng.choice((-1.0, 1.0), (v.shape[1], n)) * rd["dv"][h, :, :n]
    return vv @ (pt if flash else round_f16(pt).astype(np.float64))


@pytest.mark.parametrize("dump,model,head,flash", [("gpt2-long.txt", GPT2, 3, False),
                                                   ("llama-gqa-long.txt", LLAMA, 5, False),
                                                   ("gpt2-flash-attn.txt", GPT2, 7, True),
                                                   ("gpt2-kv-f32-flash.txt", GPT2, 6, True)])
def test_no_admissible_deviation_exceeds_the_bound(dump, model, head, flash):
    """The draws reach 0.90 to 0.999 of the bound (a row of two keys can take its worst case exactly). FLASH_ATTN_EXT
    reads P unrounded: there the reference's side does too (expect.flash() bounds the rest)."""
    exp = expected(dump, model)
    q, k, v, p = exp._heads(0)
    rd = exp._read()
    t = q.shape[1] - 1
    dims = np.arange(v.shape[1])
    bound = weighted_mean(exp, head, t, dims, flash)
    pt = p[head, t, :t + 1]
    ref = v[head, :, :t + 1] @ (pt if flash else round_f16(pt).astype(np.float64))
    rng = np.random.default_rng(0)
    worst = np.zeros(len(dims))
    for trial in range(200):
        signs = [rng.choice((-1.0, 1.0), q.shape[-1]), rng.choice((-1.0, 1.0), k.shape[1:])]
        if trial % 2:  # the signs that raise the scores of the keys above the mean of dim trial % D_v, lower the rest
            d = trial % len(dims)
            up = np.sign(v[head, d, :t + 1] - ref[d])
            signs[0] = np.sign(k[head, :t + 1].T @ (p[head, t, :t + 1] * up)) + (k[head, :t + 1].sum(0) == 0)
            signs[1] = np.zeros(k.shape[1:])
            signs[1][:t + 1] = up[:, None] * np.sign(q[head, t])[None, :]
        worst = np.maximum(worst, np.abs(llama_side(exp, head, t, signs, rng, flash) - ref))
    assert np.all(worst <= bound), (worst / bound).max()
    assert (worst / bound).max() > 0.5  # the adversarial draws come near it: it is tight


def test_the_mean_is_tighter_than_each_weight_in_full():
    """On llama-gqa-long's last query, each head's median dim gets a bound under 0.9 of _head_terms' per-slot one:
    each weight's move counted once, centred on the row's mean."""
    exp = expected("llama-gqa-long.txt", LLAMA)
    q, _, v, _ = exp._heads(0)
    t = q.shape[1] - 1
    whole = exp.noise("kqv")
    for h in range(q.shape[0]):
        dims = np.arange(v.shape[1])
        mean = weighted_mean(exp, h, t, dims, False)
        assert np.median(mean / whole[h, t]) < 0.9


def test_large_score_deviations_keep_the_bound_finite():
    """An IQ4_NL K cache moves K by two of its largest steps, so a score may move by 25 in softmax's units and a
    weight's per-slot bound (about p·e^50) passes f16's range: the half step of llama.cpp's weight is taken at most at 1
    (a softmax weight is at most 1), not as f16's overflow (a NaN bound failed every such run). Made here from
    gpt2-long's reference with its K deviations scaled up: no fixture run has such a cache without flash attention."""
    exp = expected("gpt2-long.txt", GPT2)
    q, k, v, _ = exp._heads(0)
    rd = exp._read()
    t = q.shape[1] - 1
    x = exp.scale * (np.abs(k[3, :t + 1]) @ rd["dq"][3, t] + rd["dk"][3, :t + 1] @ np.abs(q[3, t]))
    rd["dk"] = rd["dk"] * (25 / x.max())
    bound = weighted_mean(exp, 3, t, np.arange(v.shape[1]), False)
    assert bound is not None and np.isfinite(bound).all() and bound.max() > 0.1
