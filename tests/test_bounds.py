"""Each bound of the checks against a bound this file computes itself (tests/formulas.py, from docs/format.md §6 and
docs/numerics.md §2): one printed value moved so that its error is 1.5× that bound fails, at its place;
0.5× passes. A bound 2× too wide or too narrow is caught here, whatever attncheck computes.

A printed value moves in steps of 1e-4 while the softmax bounds are near 5e-5, so the softmax cases move a printed
kq score instead (its effect on the recomputed weight is continuous): the test searches the printable scores for
one that puts the row's worst error at 0.5× and at 1.5× of its bound. The P·V, sum and --model cases move the
printed value itself, on elements whose bound is wide enough for a 4-decimal print to land within 0.1× of the
target. Cases sit on rows with n_past > 0, on rows whose visible slots were not all printed (ratio rows), on a GQA
site whose query heads read KV heads that `h % H_kv` would get wrong, and on the older format.
"""
from __future__ import annotations

import numpy as np
import pytest

import attncheck
from conftest import FIXTURES
from dumpedit import DumpEdit, printed
from formulas import (Site, kv_head, nearest_printed, ratio_bound, softmax_bound, STEP, sum_bound, text, tokens,
                      F32, PRINT)

OLD = "old-llama-gqa-how-are-you.txt"
GPT2 = FIXTURES / "models" / "gpt2-mini-q8_0.gguf"
SCORE_MOVES = np.arange(-3000, 3001)  # candidate changes of one printed score, in printed steps (±0.3)


def verify(edit: DumpEdit, **options) -> dict:
    return attncheck.verify(text(edit), **options).to_dict()


def failures(doc: dict) -> list[tuple[int, int, str, dict | None, dict]]:
    """(evaluation, layer, check, at, failure) of every failing element."""
    return [(s["evaluation"], s["layer"], c["check"], f["at"], f)
            for s in doc["sites"] for c in s["checks"] for f in c["failures"]]


def search(worst, candidates: np.ndarray, targets=(0.5, 1.5), within: float = 0.03) -> dict[float, int]:
    """For each target, the candidate whose worst error/bound (`worst` maps candidates to ratios) is nearest it."""
    r = worst(candidates)
    out = {}
    for target in targets:
        i = int(np.argmin(np.abs(r - target)))
        if abs(r[i] - target) > within:
            return {}
        out[target] = i
    return out


def _assert_passes(doc: dict) -> None:
    assert doc["exit_code"] == 0, failures(doc)[:5]


def moved_scores(site: Site, dump: str, found: dict[float, int], s: np.ndarray, j: int, place, tmp_path):
    """For each target of `search`: the dump with score j of the row moved to the printable value found, checked.
    0.5× must pass; yields (candidate index, report) of the 1.5× case for the caller's assertions."""
    for target, i in found.items():
        edit = DumpEdit(FIXTURES / dump, tmp_path / f"{target}.txt")
        edit.set(site.kq, place, round(s[j] + SCORE_MOVES[i] * STEP, 4), site.ev)
        doc = verify(edit)
        if target < 1:
            _assert_passes(doc)
        else:
            yield i, doc


# --------------------------------------------------------------------------------------------------------------
# softmax: rows whose visible slots were all printed
# --------------------------------------------------------------------------------------------------------------
# (dump, layer, evaluation, head, query)
SOFTMAX_ROWS = [
    ("gpt2-ubatch2.txt", 1, 1, 9, 0),  # n_past = 2: query 0 reads slots 0..2
    ("gpt2-ubatch2.txt", 0, 1, 11, 0),
    ("llama-gqa-draw.txt", 0, 0, 7, 2),
    (OLD, 0, 0, 1, 1),
]


@pytest.mark.parametrize("dump,layer,ev,head,query", SOFTMAX_ROWS)
def test_softmax_bound(dump, layer, ev, head, query, tmp_path):
    site = Site(DumpEdit(FIXTURES / dump, tmp_path / "d.txt"), layer, ev)
    assert site.whole(query), "a row whose visible slots are all printed"
    slots = site.visible(query)
    P, s = site.p(head, query, slots), site.s(head, query, slots)

    def rows(j: int, ks: np.ndarray) -> np.ndarray:  # recomputed rows with score j moved by k printed steps
        S = np.repeat(s[None], len(ks), 0)
        S[:, j] = np.round(s[j] + ks * STEP, 4)
        x = S * site.scale
        e = np.exp(x - x.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)

    def worst(j):
        return lambda ks: np.max(np.abs(P - rows(j, ks)) / softmax_bound(rows(j, ks), site.scale), axis=1)

    j, found = next((j, f) for j in range(len(slots)) if (f := search(worst(j), SCORE_MOVES)))
    for i, doc in moved_scores(site, dump, found, s, j, (head, query, slots[j]), tmp_path):
        p_hat = rows(j, SCORE_MOVES[i:i + 1])[0]
        ratio = np.abs(P - p_hat) / softmax_bound(p_hat, site.scale)
        fails = failures(doc)
        assert {(e, l, c) for e, l, c, *_ in fails} == {(ev, layer, "softmax")}, fails
        got = {f["at"]["slot"]: f for *_, at, f in fails if (at["head"], at["query"]) == (head, query)}
        assert len(got) == len(fails) and set(got) == {slots[k] for k in np.flatnonzero(ratio > 1)}
        for k, slot in enumerate(slots):
            if slot in got:
                assert got[slot]["got"] == P[k]
                assert got[slot]["want"] == pytest.approx(p_hat[k], abs=1e-7)
                assert got[slot]["bound"] == pytest.approx(softmax_bound(p_hat[k], site.scale), rel=1e-2)


# --------------------------------------------------------------------------------------------------------------
# softmax_ratio: rows with visible slots that were not printed
# --------------------------------------------------------------------------------------------------------------
RATIO_ROWS = [
    ("gpt2-long.txt", 1, 0, 9, 10),  # query 10 reads slots 0..10; 3..10 are not printed
    ("gpt2-ubatch2.txt", 0, 2, 9, 1),  # n_past = 4: query 1 reads slots 0..5; 3..5 are not printed
    ("llama-gqa-long.txt", 0, 0, 7, 12),
]


@pytest.mark.parametrize("dump,layer,ev,head,query", RATIO_ROWS)
def test_ratio_bound(dump, layer, ev, head, query, tmp_path):
    """p_j against p_k·exp(scale·(s_j − s_k)), k the printed visible slot with the largest printed weight."""
    site = Site(DumpEdit(FIXTURES / dump, tmp_path / "d.txt"), layer, ev)
    assert not site.whole(query), "a row checked by weight ratios"
    slots = site.printed_visible(query)
    P, s = site.p(head, query, slots), site.s(head, query, slots)
    k = int(np.argmax(P))

    def pred(j, ks):
        return P[k] * np.exp(site.scale * (np.round(s[j] + ks * STEP, 4) - s[k]))

    def worst(j):
        return lambda ks: np.abs(P[j] - pred(j, ks)) / ratio_bound(pred(j, ks), P[k], site.scale)

    j, found = next((j, f) for j in range(len(slots)) if j != k and P[j] >= 0.01 and (f := search(worst(j), SCORE_MOVES)))
    for i, doc in moved_scores(site, dump, found, s, j, (head, query, slots[j]), tmp_path):
        [(e, l, c, at, f)] = failures(doc)
        assert (e, l, c, at) == (ev, layer, "softmax_ratio", {"head": head, "query": query, "slot": slots[j]})
        want = float(pred(j, SCORE_MOVES[i:i + 1])[0])
        assert f["got"] == P[j] and f["want"] == pytest.approx(want, rel=1e-6)
        assert f["bound"] == pytest.approx(float(ratio_bound(want, P[k], site.scale)), rel=1e-2)


# --------------------------------------------------------------------------------------------------------------
# P·V
# --------------------------------------------------------------------------------------------------------------
PV_SITES = [
    ("gpt2-ubatch2.txt", 0, 1),  # n_past = 2
    ("gpt2-kv-f32.txt", 1, 0),  # an f32 V cache: no rounding of P before P·V
    ("llama-gqa-draw.txt", 1, 0),  # GQA 8/2
    (OLD, 0, 0),
]


def _landing(want: float, b: float, within: float = 0.1) -> dict[float, float]:
    """Printable values at 0.5× and 1.5× the bound b from `want` (either side), each within 0.1× of its target;
    {} when the 4-decimal print cannot get that close."""
    out = {}
    for r in (0.5, 1.5):
        v = min((nearest_printed(want + side * r * b) for side in (1, -1)), key=lambda v: abs(abs(v - want) / b - r))
        if abs(abs(v - want) / b - r) > within:
            return {}
        out[r] = v
    return out


def _pv_moves(site: Site, heads) -> tuple[tuple[int, int, int], float, float, dict[float, float]]:
    """The whole-row kqv element with the widest bound whose printed value can land within 0.1× of 0.5× and 1.5×
    its bound: (place, Σ P·V, bound, {target: printed value})."""
    best = None
    for t in printed(site.T):
        if not site.whole(t):
            continue
        for h in heads:
            for d in printed(site.D_h):
                want, b = site.pv(h, t, d)
                values = _landing(want, b)
                if values and (best is None or b > best[2]):
                    best = ((h, t, d), want, b, values)
    assert best is not None, "an element whose bound a 4-decimal print can resolve"
    return best


@pytest.mark.parametrize("dump,layer,ev", PV_SITES)
def test_pv_bound(dump, layer, ev, tmp_path):
    site = Site(DumpEdit(FIXTURES / dump, tmp_path / "d.txt"), layer, ev)
    # GQA: only heads that read another KV head than h % H_kv would, so that the mapping is tested too
    heads = [h for h in printed(site.H) if site.H == site.H_kv or kv_head(h, site.H, site.H_kv) != h % site.H_kv]
    (h, t, d), want, b, values = _pv_moves(site, heads)
    for target, value in values.items():
        edit = DumpEdit(FIXTURES / dump, tmp_path / f"{target}.txt")
        edit.set(site.kqv, (h, t, d), value, ev)
        doc = verify(edit)
        if target < 1:
            _assert_passes(doc)
            continue
        [(e, l, c, at, f)] = failures(doc)
        assert (e, l, c, at) == (ev, layer, "pv", {"head": h, "query": t, "dim": d})
        assert f["got"] == value and f["want"] == pytest.approx(want, abs=1e-9)
        assert f["bound"] == pytest.approx(b, rel=2e-3)


# --------------------------------------------------------------------------------------------------------------
# the SOFT_MAX `sum =` line
# --------------------------------------------------------------------------------------------------------------
SUM_SITES = [
    ("gpt2-ubatch2.txt", 0, 2),  # n_past = 4
    ("gpt2-long.txt", 1, 0),
    ("llama-gqa-long.txt", 0, 0),
]


@pytest.mark.parametrize("dump,layer,ev", SUM_SITES)
def test_sum_bound(dump, layer, ev, tmp_path):
    """Today's `sum =` is of the whole tensor: T·H rows that each sum to 1 (each at most n_past + T long),
    accumulated in f32 over the H·Σ_t (n_past + t + 1) weights that are not masked."""
    site = Site(DumpEdit(FIXTURES / dump, tmp_path / "d.txt"), layer, ev)
    T, H = site.T, site.H
    n_terms = H * sum(site.n_past + t + 1 for t in range(T))
    b = sum_bound(n_terms, T * H, T * H, site.n_past + T)
    for target in (0.5, 1.5):
        edit = DumpEdit(FIXTURES / dump, tmp_path / f"{target}.txt")
        edit.set_sum(site.softmax, T * H + target * b, ev)
        doc = verify(edit)
        if target < 1:
            _assert_passes(doc)
            continue
        [(e, l, c, at, f)] = failures(doc)
        assert (e, l, c, at) == (ev, layer, "sum", None)
        assert f["got"] == pytest.approx(T * H + 1.5 * b, abs=1e-6) and f["want"] == T * H
        assert f["bound"] == pytest.approx(b, rel=1e-9)


# --------------------------------------------------------------------------------------------------------------
# --model, layer 0: held at print precision plus f32 summation noise
# --------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpt2_model():
    from attncheck.model.weights import load_model

    return load_model(GPT2)


# (dump, evaluation, queries to search): gpt2-mini, Q8_0 weights, no RoPE, an f16 KV cache
MODEL_ROWS = [
    ("gpt2-ubatch2.txt", 2, [0, 1]),  # n_past = 4
    ("gpt2-long.txt", 0, [10, 11, 12]),  # rows whose visible slots the dump alone cannot recompute
    ("gpt2-how-are-you.txt", 0, [0, 1, 2]),
]


@pytest.mark.parametrize("dump,ev,queries", MODEL_ROWS)
def test_model_layer0_q_bound(dump, ev, queries, tmp_path, gpt2_model):
    """Layer 0's q, from the weights and the reference's attn_norm row x (model/bounds.py's error model):
    5e-5 (print) + 2⁻²⁰·|q| (the last f32 rounding) + (n/32 + 8 + 3)·2⁻²⁴·(Σ_g |Σ_{i∈g} W_i x̂_i| + |b|) over
    n = n_embd, g the groups of 4 consecutive inputs, x̂ x in Q8_0: Q8_0 weights multiply integer blocks of 32
    exactly, in lanes of 4 products, and sum the scaled lane sums in f32 (a few roundings each,
    layer0._matmul_gamma and _grouped), and 3·2⁻²⁴ for the bias ADD. Rows where an element of x (or a block's scale) lies
    near enough to a Q8_0 rounding midpoint that llama.cpp's x, a few f32 ulps from the reference's, may round the
    other way are left out: the bound allows for that too (layer0._converted), and the noise alone is tested here."""
    from attncheck.model.reference import forward

    edit = DumpEdit(FIXTURES / dump, tmp_path / "d.txt")
    site = Site(edit, 0, ev)
    hp = gpt2_model.hparams
    ref = forward(gpt2_model, tokens(edit))
    q = ref.get(0, "Qcur").astype(np.float64)  # [T_all, H, D_h]
    x = ref.get(0, "attn_norm").astype(np.float64)  # [T_all, n_embd]
    blocks = x.reshape(len(x), -1, 32)  # Q8_0: q = round(x·127/amax), stored with d = f16(amax/127)
    amax = np.abs(blocks).max(-1, keepdims=True)
    x_hat = (np.rint(blocks * np.float32(127) / amax) * np.float16(amax / 127).astype(np.float64)).reshape(x.shape)
    d = hp.n_head * hp.head_dim
    W = gpt2_model.tensor("blk.0.attn_qkv.weight")[:d].astype(np.float64)
    bias = np.abs(gpt2_model.tensor("blk.0.attn_qkv.bias")[:d].astype(np.float64))
    lanes = np.abs((x_hat[:, None, :] * W[None]).reshape(len(x), d, -1, 4).sum(-1)).sum(-1)  # [T_all, d]
    noise = ((hp.n_embd / 32 + 11) * F32 * (lanes + bias)).reshape(q.shape)
    from attncheck.model.expect import Expected

    converted = Expected(ref, "f16", gpt2_model)._projections("converted")["Qcur"]
    clear = ~(converted > 0).any(axis=(1, 2))  # [T_all]: rows no rounding the other way can reach
    bound = PRINT + 2.0**-20 * np.abs(q) + noise
    node = "Qcur-0 (view) (permuted)"  # {D_h, T, H}: (head, query, dim)
    best = None
    for t in queries:
        pos = site.n_past + t
        if not clear[pos]:
            continue
        for h in printed(hp.n_head):
            for dim in printed(hp.head_dim):
                want, b = q[pos, h, dim], bound[pos, h, dim]
                values = _landing(want, b, within=0.3)  # a bound this close to print: 0.2-0.8× and 1.2-1.8× of it
                if values and (best is None or b > best[2]):
                    best = ((h, t, dim), want, b, values)
    assert best is not None, "an element whose bound a 4-decimal print can resolve"
    (h, t, dim), want, b, values = best
    for target, value in values.items():
        moved = DumpEdit(FIXTURES / dump, tmp_path / f"{target}.txt")
        moved.set(node, (h, t, dim), value, ev)
        doc = verify(moved, model=str(GPT2))
        if target < 1:
            _assert_passes(doc)
            continue
        fails = [(e, l, c, at, f) for e, l, c, at, f in failures(doc) if c != "model_sum"]
        assert [(e, l, c, at) for e, l, c, at, _ in fails] == [
            (ev, 0, "model_q", {"head": h, "query": t, "dim": dim, "pos": site.n_past + t})]
        f = fails[0][4]
        assert f["got"] == value and f["want"] == pytest.approx(want, abs=1e-6)
        assert b <= f["bound"] <= b + 0.05 * (b - PRINT)
