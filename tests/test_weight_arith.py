"""The reference's number formats and matrix products against independent formulas (no llama.cpp needed).

Each expected value is computed here the way ggml's C code does it, block by block with integers (ggml-quants.c,
ggml-cpu/arch/x86/quants.c), not with the module under test; the end-to-end tests then hold the same emulation to
llama.cpp's own output for every weight type (tests/e2e/test_weight_types_e2e.py).
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize as gguf_dequantize, quantize as gguf_quantize
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from attncheck.model import blocks, dequant, matmul, numerics, steps
from attncheck.model.attention import Cache, hadamard
from conftest import FIXTURES

F32 = np.float32
RNG = np.random.default_rng(7)


@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.BF16, QT.F16])
def test_fast_dequantizers_equal_gguf(qtype):
    x = (RNG.standard_normal((8, 256)) * 3).astype(F32)
    raw = gguf_quantize(x, qtype).view(np.uint8).reshape(8, -1)
    want = gguf_dequantize(raw, qtype).reshape(8, 256)
    np.testing.assert_array_equal(dequant.dequantize(raw, qtype, np.float64), want.astype(np.float64))


def test_dequantizing_a_shipped_model_matches_gguf():
    from attncheck.model.weights import load_model

    m = load_model(FIXTURES / "models" / "gpt2-mini-q8_0.gguf")
    name = "blk.0.attn_qkv.weight"
    want = gguf_dequantize(np.asarray(m.raw(name)), m.tensor_type(name)).reshape(m.matrix(name).shape)
    np.testing.assert_array_equal(m.matrix(name), want.astype(np.float64))
    np.testing.assert_array_equal(m.rows("token_embd.weight", [3, 257]), m.tensor("token_embd.weight")[[3, 257]])


def _q8_1_blocks(x: np.ndarray):
    """quantize_row_q8_1 (x86 AVX2): per block of 32, d = amax/127, q = round-half-even(x · 127/amax) as integers,
    d16 = f16(d), s = f16(d · Σq) with d in f32."""
    b = x.reshape(-1, 32).astype(F32)
    amax = np.abs(b).max(1)
    d = (amax / F32(127)).astype(F32)
    q = np.rint(b * (F32(127) / amax)[:, None]).astype(np.int64)
    return q, d.astype(np.float16).astype(np.float64), np.float16(F32(d * q.sum(1))).astype(np.float64)


@pytest.mark.parametrize("qtype", [QT.Q4_1, QT.Q5_1])
def test_q8_1_dot_uses_the_f16_block_sum_times_the_weight_min(qtype):
    """vec_dot_q4_1_q8_1 / vec_dot_q5_1_q8_1: Σ_blocks d_w·d_x·Σ q_w q_x + m_w·s_x, with s_x the f16 block sum."""
    x = RNG.standard_normal((1, 256)).astype(F32)
    w = (RNG.standard_normal((4, 256)) + 0.3).astype(F32)
    raw = gguf_quantize(w, qtype).view(np.uint8).reshape(4, -1)
    size = {QT.Q4_1: 20, QT.Q5_1: 24}[qtype]
    blocks_w = raw.reshape(4, -1, size)
    d_w = blocks_w[:, :, 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
    m_w = blocks_w[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
    w_deq = gguf_dequantize(raw, qtype).reshape(4, -1, 32).astype(np.float64)
    q_w = np.rint((w_deq - m_w[..., None]) / d_w[..., None])  # the stored integers
    q_x, d_x, s_x = _q8_1_blocks(x)
    want = ((d_w * d_x[None] * (q_w * q_x[None]).sum(-1)) + m_w * s_x[None]).sum(-1)
    got = matmul.dot(x, w_deq.reshape(4, 256), "q8_1", numerics.block_mins(raw, qtype))[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    without_s = matmul.dot(x, w_deq.reshape(4, 256), "q8_0")[0]  # what Q8_0 activations would give
    assert np.abs(without_s - want).max() > 10 * np.abs(got - want).max()


@settings(max_examples=40, deadline=None)
@given(arrays(np.float32, (3, 256), elements=st.floats(-100, 100, width=32, allow_subnormal=False)))
def test_q8_k_round_trip(x):
    """quantize_row_q8_K_ref: per 256, the first largest |x| gives iscale = -127/max; q = min(127, round(iscale·x))."""
    y = numerics.q8_k(x).reshape(3, 256).astype(np.float64)
    for row, out in zip(x, y):
        mx = row[np.argmax(np.abs(row))]
        if mx == 0:
            assert not out.any()
            continue
        iscale = F32(-127) / mx
        q = np.minimum(127, np.rint((row * iscale).astype(F32)))
        np.testing.assert_array_equal(out, (q * (F32(1) / iscale)).astype(F32))


def test_iq4_nl_cache_values_lie_on_its_table():
    x = RNG.standard_normal((4, 64)).astype(F32)
    y = numerics.iq4_nl(x).reshape(-1, 32)
    for block in y:
        d = np.abs(block).max() / 127
        levels = np.unique(np.round(block / d * 127 / np.abs(numerics.IQ4NL_VALUES).max()))
        assert len(np.unique(block)) <= 16 and len(levels) <= 16
    assert np.abs(y - x.reshape(-1, 32)).max() < 0.5


def test_kv_store_q4_1_keeps_mins_and_rounds_like_gguf():
    x = RNG.standard_normal((5, 64)).astype(F32)
    values, mins = numerics.store(x, "q4_1")
    raw = gguf_quantize(x, QT.Q4_1).view(np.uint8).reshape(5, -1)
    np.testing.assert_array_equal(values, gguf_dequantize(raw, QT.Q4_1).reshape(5, 64))
    assert mins is not None and mins.shape == (5, 2)
    assert numerics.store(x, "f16")[1] is None


def test_hadamard_is_the_orthonormal_walsh_matrix():
    n = 64
    h = np.array([[1.0]])
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])  # ggml_gen_hadamard's recursion
    h /= np.sqrt(n)
    x = RNG.standard_normal((3, 2, 128)).astype(F32)
    want = (x.reshape(-1, n).astype(np.float64) @ h.T).reshape(x.shape)
    got = hadamard(x, n)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    np.testing.assert_allclose(hadamard(got, n), x, atol=1e-5)  # its own inverse
    assert Cache.of("q8_0", "f16", 128, 128) == Cache("q8_0", "f16", 128, 0)
    assert Cache.of("q8_0", "q8_0", 64, 64) == Cache("q8_0", "q8_0", 64, 64)
    assert Cache.of("f16", "f16", 64, 64) == Cache()


def test_layer_norm_is_the_normalised_row():
    x = (RNG.standard_normal((4, 100)) * 3 + 1).astype(F32)
    y = blocks.layer_norm(x, 1e-5).astype(np.float64)
    xd = x.astype(np.float64)
    want = (xd - xd.mean(1, keepdims=True)) / np.sqrt(xd.var(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


def test_rope_neox_rotates_halves():
    x = RNG.standard_normal((3, 2, 8)).astype(F32)
    y = blocks.rope(x, np.arange(3), 8, 10000.0, neox=True)
    theta = np.arange(3)[:, None] * 10000.0 ** (-2 * np.arange(4) / 8)
    c, s = np.cos(theta)[:, None], np.sin(theta)[:, None]
    want = np.concatenate([x[..., :4] * c - x[..., 4:] * s, x[..., :4] * s + x[..., 4:] * c], -1)
    np.testing.assert_allclose(y, want, atol=1e-5)


@pytest.mark.parametrize("base, n_dims", [(100000.0, 64), (10000.0, 64), (10000.0, 128), (1e6, 256)])
def test_rope_theta_scale_is_powf_correctly_rounded(base, n_dims):
    """ggml's powf(base, -2.0f/n_dims), as glibc gives it: the f32 nearest the exact power. numpy's own f32 power is an
    ulp off for (100000, 64), SmolLM2's, and (10000, 64), which made --model fail layer 0's RoPE at position 620."""
    from decimal import Decimal, getcontext

    getcontext().prec = 40
    e = F32(-2.0) / F32(n_dims)
    exact = Decimal(float(F32(base))) ** Decimal(float(e))
    nearest = F32(float(exact))
    assert blocks._theta_scale(base, n_dims) == nearest
    below, above = np.nextafter(nearest, F32(0)), np.nextafter(nearest, F32(1))
    assert abs(Decimal(float(nearest)) - exact) <= min(abs(Decimal(float(below)) - exact),
                                                       abs(Decimal(float(above)) - exact))


def _rope_cache(positions, n_dims, theta_scale, freq_scale, factors, ulps):
    """ggml_rope_cache_init's cos and sin, computed as ggml-cpu computes them (θ multiplied by theta_scale in f32,
    divided by the freq factor, times freq_scale), each result then moved `ulps` ulps as another libm's could be."""
    half = n_dims // 2
    theta = np.empty((len(positions), half), F32)
    cur = np.asarray(positions, F32)
    for i in range(half):
        theta[:, i] = cur
        cur = (cur * theta_scale).astype(F32)
    if factors is not None:
        theta = (theta / factors).astype(F32)
    theta = (F32(freq_scale) * theta).astype(F32)
    cos, sin = np.cos(theta.astype(np.float64)).astype(F32), np.sin(theta.astype(np.float64)).astype(F32)
    move = lambda a: np.nextafter(a, np.copysign(np.inf, ulps) * np.ones_like(a)) if ulps else a  # noqa: E731
    return move(cos), move(sin)


@pytest.mark.parametrize("base, n_dims, freq_scale, with_factors", [
    (100000.0, 64, 1.0, False), (10000.0, 64, 1.0, False), (10000.0, 128, 0.25, False), (500000.0, 128, 1.0, True)])
def test_rope_angle_error_bounds_a_libm_an_ulp_off(base, n_dims, freq_scale, with_factors):
    """blocks.rope_angle_error against what a build whose powf is an ulp off either way, and whose cosf and sinf are
    an ulp off, gives at positions up to 8191 (ggml's cache emulated here on its own); without its angles' part
    the bound does not hold."""
    pos = np.arange(8192)
    factors = np.linspace(1.0, 8.0, n_dims // 2).astype(F32) if with_factors else None
    ts = blocks._theta_scale(base, n_dims)
    ref_cos, ref_sin = _rope_cache(pos, n_dims, ts, freq_scale, factors, 0)
    bound = blocks.rope_angle_error(pos, n_dims, base, freq_scale, factors)
    err = np.zeros_like(bound)
    for off, ulps in ((F32(0), 1), (F32(1), -1), (F32(0), -1)):
        cos, sin = _rope_cache(pos, n_dims, np.nextafter(ts, off), freq_scale, factors, ulps)
        err = np.maximum(err, np.maximum(np.abs(cos.astype(np.float64) - ref_cos),
                                         np.abs(sin.astype(np.float64) - ref_sin)))
    assert (err <= bound).all()
    assert (err / bound).max() > 0.5  # not vacuous
    assert not (err <= 2.0**-23).all()  # the angles' part is needed


def test_steps_of_each_format():
    x = np.array([[1.0] * 31 + [127.0]], dtype=F32)
    assert steps.step(x, "q8_0")[0, 0] == pytest.approx(1.0)
    assert steps.step(x, "q4_0")[0, 0] == pytest.approx(127 / 8)
    assert steps.step(x, "q4_1")[0, 0] == pytest.approx(126 / 15)
    assert steps.step(np.array([1.0], F32), "f16")[0] == 2.0**-10
    assert not steps.step(x, "f32").any()
    assert matmul.vec_dot_type(QT.Q4_K) == "q8_k" and matmul.vec_dot_type(QT.IQ4_NL) == "q8_0"
    assert matmul.vec_dot_type(QT.Q5_1) == "q8_1" and matmul.vec_dot_type(QT.BF16) == "bf16"


def _f32_patterns() -> np.ndarray:
    """f32 values around every f16 value and rounding midpoint (±4096 ulps), and random bit patterns: zeros, f16
    subnormals, the overflow edge at 65520, inf and NaN included."""
    f16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(F32).view(np.uint32)
    near = (f16.astype(np.int64)[:, None] + np.arange(-4096, 4097, 97)[None, :]).ravel()
    rand = RNG.integers(0, 1 << 32, 2_000_000, dtype=np.uint64)
    return np.concatenate([near.clip(0, (1 << 32) - 1), rand]).astype(np.uint32).view(F32)


def test_round_f16_and_its_bits_are_numpys_conversion_bit_for_bit():
    """numerics.round_f16 and f16_bits round with integer arithmetic (twice numpy's speed): every pattern must give
    numpy's own float16 conversion (round to nearest even, subnormals, overflow to inf, NaN)."""
    x = _f32_patterns()
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    got = numerics.round_f16(x)
    same = (got.view(np.uint32) == want.astype(F32).view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), x[~same][:5]
    np.testing.assert_array_equal(numerics.f16_bits(x), want.view(np.uint16))
    grid = x[:300_000].reshape(3, 100, 1000)[:, ::3, ::2]  # any shape, any strides
    np.testing.assert_array_equal(numerics.round_f16(grid).view(np.uint32),
                                  grid.astype(np.float16).astype(F32).view(np.uint32))


def test_gelu_is_the_f16_table_of_the_tanh_formula():
    """blocks.gelu looks its f16 table up by f16_bits: each input gives ggml's f32 formula at the input's f16 value,
    rounded to f16 (GGML_GELU_FP16), x <= -10 gives 0 and x >= 10 gives x; and that formula is GELU's tanh
    approximation (within an f16 step where f32 does not cancel: 1 + tanh → 0 for x below about -3)."""
    x = np.concatenate([(RNG.standard_normal(100_000) * 4).astype(F32), F32([0, -0.0, 10, -10, 9.999, 1e-7, 3e4])])
    h = x.astype(np.float16).astype(F32)
    with np.errstate(over="ignore"):
        g = F32(0.5) * h * (F32(1) + np.tanh(F32(0.7978845608028654) * h * (F32(1) + F32(0.044715) * h * h)))
    want = np.where(x <= -10, F32(0), np.where(x >= 10, x, g.astype(np.float16).astype(F32)))
    got = blocks.gelu(x)
    assert got.dtype == F32
    np.testing.assert_array_equal(got, want)
    h64 = h.astype(np.float64)
    exact = 0.5 * h64 * (1 + np.tanh(np.sqrt(2 / np.pi) * h64 * (1 + 0.044715 * h64 * h64)))
    calm = (x > -3) & (x < 10)
    np.testing.assert_allclose(got[calm], exact[calm], rtol=2.0**-10, atol=2.0**-24)


def test_the_pass_and_its_twin_dequantize_a_weight_once_and_convert_an_input_once(monkeypatch):
    """Past layer 0 the reference and its twin read each weight from one dequantization (weights.Shared), and the
    projections that read one input (q, k, v; gate and up) convert it once (matmul.converted): the reference must be
    what it was with a dequantization and a conversion per MUL_MAT."""
    from attncheck.model import matmul
    from attncheck.model.reference import forward
    from attncheck.model.weights import Model, Shared, load_model

    model = load_model(str(FIXTURES / "models" / "llama-quant-q8_0.gguf"))
    tokens = [275, 293, 296, 297, 301]
    calls = {"matrix": 0, "convert": 0}
    real_matrix, real_convert = Model.matrix, matmul.convert

    def matrix(self, *a, **k):
        calls["matrix"] += 1
        return real_matrix(self, *a, **k)

    def convert(*a, **k):
        calls["convert"] += 1
        return real_convert(*a, **k)

    monkeypatch.setattr(Model, "matrix", matrix)
    monkeypatch.setattr(matmul, "convert", convert)
    ref = forward(model, tokens, twin=True)
    shared = dict(calls)
    monkeypatch.setattr(Shared, "matrix", lambda self, name, dtype=np.float64: matrix(self.model, name, dtype))
    monkeypatch.setattr(matmul, "converted", lambda x, fmt, dtype, memo=None: (lambda c: (
        c[0].astype(dtype, copy=False), c[1]))(convert(x, fmt)))
    calls.update(matrix=0, convert=0)
    alone = forward(model, tokens, twin=True)
    n_layer, per_layer = model.hparams.n_layer, 7  # q, k, v, attn_output, gate, up, down
    assert calls["matrix"] == 2 * n_layer * per_layer  # each pass its own, in every layer
    assert shared["matrix"] == 2 * per_layer + (n_layer - 1) * per_layer  # layer 0: f64 and f32; then one for both
    assert shared["convert"] < calls["convert"]
    assert ref.tensors.keys() == alone.tensors.keys() and ref.chaos == alone.chaos
    for key, value in alone.tensors.items():
        assert np.array_equal(ref.tensors[key], value, equal_nan=True), key
