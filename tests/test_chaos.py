"""The twin pass (attncheck/model/chaos.py): past layer 0, how far a correct build may drift is measured on the run
itself, so a correct run whose chaos no calibrated table foresaw passes, and a value moved beyond that chaos fails.

fixtures/llama-quant-kv-q5_0-iq4_nl-flash.txt is a real, correct run (today's llama-eval-callback, the random llama
of scripts/make_quant_models.py in Q8_0, a q5_0 K and IQ4_NL V cache, flash attention). IQ4_NL's quantizer picks each
block's scale by a search, so f32 noise in layer 1's V changed a block's scale: llama.cpp's last query row of layer 1
lies 5 % of its rms from the reference's, beyond what the calibrated table allowed (a false alarm before the twin).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attncheck.model.chaos import _largest_row_median, _medians, layer_chaos
from attncheck.model.reference import forward
from conftest import FIXTURES, attncheck as run
from dumpedit import DumpEdit

DUMP = FIXTURES / "llama-quant-kv-q5_0-iq4_nl-flash.txt"
MODEL = FIXTURES / "models" / "llama-quant-q8_0.gguf"


def _check(path) -> tuple[int, dict]:
    r = run("check", str(path), "--model", str(MODEL), "--json", "-", "-q")
    assert "Traceback" not in r.err
    return r.code, json.loads(r.out)


def test_a_correct_run_with_a_block_scale_changed_by_noise_passes():
    code, doc = _check(DUMP)
    assert code == 0, [c for s in doc["sites"] for c in s["checks"] if not c["passed"]][:3]
    layer1 = next(x for x in doc["model"]["cascade_needed"]["by_layer"] if x["at"] == 1)
    # the run's own chaos in layer 1 is what its last row needed, and more
    assert layer1["chaos_max"] > layer1["gross_needed"] > 0.02
    assert layer1["chaos_row"] > layer1["systematic_needed"] > 0.01


def test_a_value_moved_beyond_the_chaos_fails(tmp_path):
    edit = DumpEdit(DUMP, tmp_path / "dump.txt")
    old = edit.get("node_79", (0, 0, 1))  # attn_out-1's last row, as GET_ROWS selected it: dim 1
    edit.set("node_79", (0, 0, 1), old + 2.0)  # about 6 times its rms: far beyond the twin's largest divergence
    edit.save()
    code, doc = _check(tmp_path / "dump.txt")
    assert code == 1
    failed = [(c["node"], c["check"]) for s in doc["sites"] for c in s["checks"] if not c["passed"]]
    assert ("node_79", "model_attn_out") in failed


def test_a_node_moved_as_a_whole_fails(tmp_path):
    edit = DumpEdit(DUMP, tmp_path / "dump.txt")
    for i0 in (0, 1, 2, 253, 254, 255):  # every printed value of ffn_out-1 (one row: the last query) doubled
        edit.set("ffn_out-1", (0, 0, i0), edit.get("ffn_out-1", (0, 0, i0)) * 2.0)
    edit.save()
    code, doc = _check(tmp_path / "dump.txt")
    assert code == 1
    failed = [c for s in doc["sites"] for c in s["checks"] if not c["passed"] and c["node"] == "ffn_out-1"]
    assert failed and "off as a whole" in failed[0]["note"]


@pytest.fixture(scope="module")
def twin_ref():
    from attncheck.model.weights import load_model

    model = load_model(str(MODEL))
    tokens = [275, 293, 296, 297, 301, 285, 306, 313, 315, 318, 319, 323, 13]  # the run's, as it logged them
    return forward(model, tokens, kv_type="q5_0", v_type="iq4_nl", twin=True), model, tokens


def test_the_twin_diverges_as_a_correct_build_does(twin_ref):
    ref, model, tokens = twin_ref
    assert set(ref.chaos) == set(range(model.hparams.n_layer)) | {None}  # every layer measured, and the output
    c0, c1, out = layer_chaos(ref, 0), layer_chaos(ref, 1), layer_chaos(ref, None)
    assert 0 < c0[0] < 0.05  # layer 0: noise and the few roundings it moves
    assert all(0 <= c[1] <= c[0] for c in (c0, c1, out))
    # deterministic: the same run, the same chaos (and so the same verdict)
    again = forward(model, tokens, kv_type="q5_0", v_type="iq4_nl", twin=True)
    assert layer_chaos(again, 1) == c1
    # without the twin there is no chaos to read: the calibrated table alone applies
    assert layer_chaos(forward(model, tokens, kv_type="q5_0", v_type="iq4_nl"), 1) == (0.0, 0.0)
    assert np.array_equal(again.get(1, "attn_out"), ref.get(1, "attn_out"))  # the reference itself is unmoved


@pytest.mark.parametrize("kind", ["cauchy", "ties", "zeros", "half-zero"])
def test_largest_row_median_is_numpys(kind):
    """The twin's chaos_row takes the largest row median without partitioning every row (chaos._largest_row_median):
    it must equal np.median's, ties, zeros and odd and even rows included."""
    rng = np.random.default_rng(3)
    for shape in [(1, 1), (1, 6), (9, 3), (200, 2), (300, 547)]:
        z = {"cauchy": lambda: np.abs(rng.standard_cauchy(shape)),
             "ties": lambda: rng.integers(0, 3, shape).astype(float),
             "zeros": lambda: np.zeros(shape),
             "half-zero": lambda: np.where(rng.random(shape) < 0.5, 0, rng.random(shape))}[kind]().astype(np.float32)
        assert _largest_row_median(z) == float(np.median(z, axis=-1).max())


@settings(max_examples=200, deadline=None)
@given(k=st.integers(1, 40), n=st.integers(1, 200), seed=st.integers(0, 2**31), grid=st.booleans(),
       zeros=st.integers(0, 100))
def test_row_medians_are_numpys_bit_for_bit(k, n, seed, grid, zeros):
    """chaos._medians (one partition) gives np.median's values and type exactly: the middle value, or the mean of the
    two in f32, ties and rows of zeros (masked weights) included; so the twin's chaos did not move when it came in."""
    rng = np.random.default_rng(seed)
    z = np.abs(rng.standard_normal((k, n))).astype(np.float32)
    if grid:
        z = np.round(z * 4) / np.float32(4)  # ties
    z[:, :n * zeros // 100] = 0
    want = np.median(z, axis=-1)
    got = _medians(z)
    assert got.dtype == want.dtype and np.array_equal(got, want)
    assert _largest_row_median(z) == float(want.max())


def test_the_twin_measures_each_values_rms_once_for_the_cascade_unit(twin_ref):
    """divergence() keeps the live rms of each array it measured (Reference.rms), and the cascade allowance's unit
    reads it there, through any view of the same elements ([None], as a rows node reads its value): it must be
    live_rms's own figure, and an array the twin never measured (another object, the same values copied) is computed."""
    from attncheck.model.chaos import kept_rms, live_rms, where

    ref, model, tokens = twin_ref
    a = ref.get(1, "attn_out")
    assert where(a) in ref.rms and ref.rms[where(a)][0] is a
    assert kept_rms(ref.rms, a[None]) == live_rms(a) == ref.rms[where(a)][1]
    copy = a.copy()
    assert where(copy) not in ref.rms and kept_rms(ref.rms, copy) == live_rms(a)
    half = a[:, : a.shape[1] // 2]  # other elements of the same memory: not the kept figure
    assert where(half) not in ref.rms and kept_rms(ref.rms, half) == live_rms(half)


def test_a_checked_layer_is_not_held_while_the_next_is_computed(monkeypatch):
    """check --model holds one layer's reference at a time (memory flat in depth): while the reference pass computes
    layer l, no layer-(l-1) Expected (its error terms, [H, T, T] arrays at layer 0) may be alive. An enumerate() over
    the layers held the last one in its result tuple until the next was computed: 130 MB more at gemma-3-270m's
    layer 1 (545 tokens), the run's peak."""
    import gc

    import attncheck
    from attncheck.model import reference
    from attncheck.model.expect import Expected

    layer, seen = reference._Pass.layer, []

    def watched(self, il, x):
        if self.jitter is None and il > 0:  # the reference pass, not the twin
            seen.append((il, [e for e in gc.get_objects() if isinstance(e, Expected) and (il - 1, "Qcur") in
                              e.ref.tensors]))
        return layer(self, il, x)

    monkeypatch.setattr(reference._Pass, "layer", watched)
    report = attncheck.verify(str(DUMP), model=str(MODEL), jobs=1)
    assert report.exit_code == 0
    assert [il for il, _ in seen] == [1]  # the random llama's two layers: layer 1 computed once, after layer 0
    assert all(not alive for _, alive in seen), seen
