"""Element-wise and row-wise ops of the reference, as ggml-cpu computes them (ggml/src/ggml-cpu/ops.cpp, vec.h):
every result rounded to f32 as ggml stores it, reductions in double where ggml sums in double."""

from __future__ import annotations

from functools import cache

import numpy as np

from .numerics import f16_bits, round_f16

F32 = np.float32
F64 = np.float64
GELU_COEF_A = F32(0.044715)
SQRT_2_OVER_PI = F32(0.79788456080286535587989211986876)


def _reduce16(sq: np.ndarray) -> np.ndarray:
    """[..., k, 16] → [..., k]: _mm512_reduce_add_ps as gcc computes it (halves added, then quarters, then pairs)."""
    t8 = (sq[..., 8:] + sq[..., :8]).astype(F32)
    t4 = (t8[..., 4:] + t8[..., :4]).astype(F32)
    return ((t4[..., 0] + t4[..., 2]).astype(F32) + (t4[..., 1] + t4[..., 3]).astype(F32)).astype(F32)


def layer_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """GGML NORM over the last axis (ggml_vec_sum_f32, ggml_vec_cvar_f32 on AVX-512): the sum in double rounded to
    f32 and divided in f32; the squares of x − mean reduced 16 at a time in f32, those partial sums added in double;
    scale 1/sqrtf(var + eps) in f32."""
    n = x.shape[-1]
    mean = (x.astype(F64).sum(-1, keepdims=True).astype(F32) / F32(n)).astype(F32)
    v = (x - mean).astype(F32)
    sq = (v * v).astype(F32)
    full = n // 16 * 16
    total = _reduce16(sq[..., :full].reshape(*sq.shape[:-1], -1, 16)).astype(F64).sum(-1, keepdims=True)
    total = total + sq[..., full:].astype(F64).sum(-1, keepdims=True)
    var = (total / n).astype(F32)
    scale = F32(1) / np.sqrt(var + F32(eps))
    return (v * scale).astype(F32)


def rms_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """GGML RMS_NORM over the last axis: the f32 squares summed in double in order (as ggml's loop, so that every
    build computes the same value), scale 1/sqrtf(mean + eps) in f32."""
    n = x.shape[-1]
    mean = (np.cumsum((x * x).astype(F64), axis=-1)[..., -1:] / n).astype(F32)
    scale = F32(1) / np.sqrt(mean + F32(eps))
    return (x * scale).astype(F32)


def scale(x: np.ndarray, s: float) -> np.ndarray:
    """GGML SCALE: x · s in f32."""
    return (np.asarray(x, F32) * F32(s)).astype(F32)


def rope(x: np.ndarray, positions: np.ndarray, n_dims: int, base: float, freq_scale: float = 1.0,
         neox: bool = False, factors: np.ndarray | None = None) -> np.ndarray:
    """ROPE of x [T, heads, D] at positions [T]: mode 0 rotates pairs (2i, 2i+1), NEOX pairs (i, i + n_dims/2), by
    θ_i = freq_scale · pos · base^(-2i/n_dims) / factor_i (rope_angles). Dims past n_dims pass unchanged."""
    theta = rope_angles(positions, n_dims, _theta_scale(base, n_dims), freq_scale, factors)
    half = n_dims // 2
    cos = np.cos(theta.astype(F64)).astype(F32)[:, None, :]  # cosf/sinf round correctly; numpy's f32 SIMD may not
    sin = np.sin(theta.astype(F64)).astype(F32)[:, None, :]
    out = np.array(x, dtype=F32, copy=True)
    if neox:
        x0, x1 = x[..., :half], x[..., half:n_dims]
        out[..., :half] = x0 * cos - x1 * sin
        out[..., half:n_dims] = x0 * sin + x1 * cos
    else:
        x0, x1 = x[..., 0:n_dims:2], x[..., 1:n_dims:2]
        out[..., 0:n_dims:2] = x0 * cos - x1 * sin
        out[..., 1:n_dims:2] = x0 * sin + x1 * cos
    return out.astype(F32)


def rope_angles(positions: np.ndarray, n_dims: int, theta_scale: np.float32, freq_scale: float = 1.0,
                factors: np.ndarray | None = None) -> np.ndarray:
    """[T, n_dims/2] θ_i as ggml_rope_cache_init computes it in f32: pos, multiplied by theta_scale (powf(base,
    -2/n_dims)) once per pair, divided by the freq factor, times freq_scale; each an IEEE f32 operation, so that
    given theta_scale every build gets these bits."""
    half = n_dims // 2
    theta = np.empty((len(positions), half), dtype=F32)
    cur = np.asarray(positions, dtype=F32)
    for i in range(half):
        theta[:, i] = cur
        cur = (cur * theta_scale).astype(F32)
    if factors is not None:
        theta = (theta / factors[:half].astype(F32)).astype(F32)
    return (F32(freq_scale) * theta).astype(F32)


def _theta_scale(base: float, n_dims: int) -> np.float32:
    """powf(base, -2.0f/n_dims) correctly rounded, as glibc's powf gives it: numpy's f32 power is not (100000^(-1/32):
    0.6978306, one ulp above glibc's 0.69783056), and one ulp moves θ at position 600 by 4e-5 radians."""
    return F32(F64(F32(base)) ** F64(F32(-2.0) / F32(n_dims)))


def rope_angle_error(positions: np.ndarray, n_dims: int, base: float, freq_scale: float = 1.0,
                     factors: np.ndarray | None = None) -> np.ndarray:
    """[T, n_dims/2] a bound on |Δ cos θ_i| and |Δ sin θ_i| between a build's ROPE and the reference's, whatever its C
    library (docs/numerics.md §3.2): its powf may be an ulp off either way, and θ_i then follows from it bit for bit
    (rope_angles), so |Δθ_i| is the larger of the two angles' distance from the reference's; cosf and sinf may each
    be an ulp off (2^-23 with the reference's own rounding). A pair (x_a, x_b) moves by at most (|x_a| + |x_b|)
    times this."""
    ts = _theta_scale(base, n_dims)
    ref = rope_angles(positions, n_dims, ts, freq_scale, factors).astype(F64)
    off = [np.abs(rope_angles(positions, n_dims, np.nextafter(ts, F32(to)), freq_scale, factors) - ref)
           for to in (0, 2)]
    return np.maximum(*off) + 2.0**-23


def gelu(x: np.ndarray) -> np.ndarray:
    """ggml-cpu GELU (GGML_GELU_FP16): the input rounded to f16 and looked up in an f16 table of the tanh
    approximation; x <= -10 gives 0, x >= 10 gives x. Emulated because the table moves values by up to ~1e-3."""
    x = np.asarray(x, F32)
    y = _gelu_table()[f16_bits(x)]
    np.copyto(y, x, where=x >= 10)
    y[x <= -10] = 0
    return y


@cache
def _gelu_table() -> np.ndarray:
    """[65536] f32: ggml's table_gelu_f16, the tanh approximation at every f16 value, rounded to f16."""
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(F32)
    with np.errstate(invalid="ignore", over="ignore"):
        g = F32(0.5) * h * (F32(1) + np.tanh(SQRT_2_OVER_PI * h * (F32(1) + GELU_COEF_A * h * h)))
        return round_f16(g.astype(F32))


def silu(x: np.ndarray) -> np.ndarray:
    """SILU in f32."""
    with np.errstate(over="ignore"):
        return (x / (F32(1) + np.exp(-x))).astype(F32)


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """SWIGLU: silu(gate) · up in f32."""
    return (silu(gate) * up).astype(F32)


def geglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """GEGLU (ggml_vec_geglu_f32 with the f16 table): gelu(gate) · up; gate >= 10 gives gate · up."""
    return (gelu(gate) * up).astype(F32)


def softcap(x: np.ndarray, cap: float) -> np.ndarray:
    """SCALE(1/cap), TANH, SCALE(cap): the soft-capping of scores (kq_scaled_1, kq_tanh, kq_scaled_2) and logits."""
    return scale(np.tanh(scale(x, float(F32(1) / F32(cap)))).astype(F32), cap)
