"""Numpy reference forward pass (gpt2, llama) that reproduces llama.cpp's CPU graph node by node.

Every node is computed in float64 where that is harmless and rounded to float32 after each op, as ggml
stores every node as f32. llama.cpp's CPU arithmetic is emulated where it moves results by more than f32
rounding (each place says so): the f16 K/V cache, the conversion of a MUL_MAT's src1 to the weight's
"vec_dot_type" (f16 for F16 weights, Q8_0 blocks for Q8_0 weights, ...), and GELU's f16 lookup table.
With that, the reference agrees with printed dumps to about their print precision (1e-4), instead of 1e-2.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QT

from .weights import Hparams, Model

F32 = np.float32
F64 = np.float64

LAYER_ROLES = (
    "attn_norm", "Qcur", "Kcur", "Vcur", "k_cache", "v_cache", "kq", "kq_soft_max", "kqv", "kqv_out",
    "attn_out", "ffn_inp", "ffn_norm", "ffn_out", "l_out",
)
GLOBAL_ROLES = ("inp_embd", "result_norm", "result_output")
KV_TYPES = ("f16", "bf16", "f32")
# What a MUL_MAT with an f16 src0 does to a contiguous f32 src1 (a weight's input, or P before P·V with an f16 V
# cache): "convert" it to f16 first (ggml-cpu today converts src1 to the vec_dot_type before any kernel), or keep
# it "f32" (2024 builds called llamafile's tinyBLAS with the f32 src1 first, and its F16 kernels take f32 B).
# q before k·q is a permuted view, never contiguous: always converted.
F16_SRC1 = ("convert", "f32")


@dataclass(frozen=True)
class Reference:
    """Reference node values keyed by (layer, role); layer is None for inp_embd, result_norm, result_output.

    Shapes are the reversed GGML ne of the llama.cpp node, with the KV axis of length n_tokens (unpadded):
    Qcur [T, H, D_h], Kcur/Vcur [T, H_kv, D_h], k_cache [H_kv, T, D_h], v_cache [H_kv, D_h, T],
    kq/kq_soft_max [H, T, T], kqv [H, T, D_h], result_output [T, n_vocab], the others [T, D].
    """

    hparams: Hparams
    tokens: tuple[int, ...]
    kv_type: str
    tensors: Mapping[tuple[int | None, str], np.ndarray]
    f16_src1: str = "convert"  # F16_SRC1

    @property
    def n_tokens(self) -> int:
        """Number of prompt tokens (positions 0..n_tokens-1)."""
        return len(self.tokens)

    def get(self, layer: int | None, role: str) -> np.ndarray:
        """The reference value of one node; KeyError names what is missing."""
        try:
            return self.tensors[(layer, role)]
        except KeyError:
            raise KeyError(f"no reference node for layer={layer!r} role={role!r}") from None


# ---- llama.cpp CPU number formats -------------------------------------------------------------------

def _f16(x: np.ndarray) -> np.ndarray:
    """Round f32 to f16 and back (ggml's FP32_TO_FP16, round to nearest even)."""
    return x.astype(np.float16).astype(F32)


def _bf16(x: np.ndarray) -> np.ndarray:
    """Round f32 to bf16 and back (ggml_compute_fp32_to_bf16: round to nearest even)."""
    u = np.ascontiguousarray(x, dtype=F32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    out = r.astype(np.uint32).view(F32)
    return np.where(np.isnan(x), x, out).astype(F32)


def _q8_0(x: np.ndarray) -> np.ndarray:
    """Quantize rows to Q8_0 blocks of 32 and back, as ggml-cpu's quantize_row_q8_0 (x86) does.

    d = max|x|/127 is stored as f16, but q = round_half_even(x * (127/max|x|)) uses the f32 inverse.
    """
    b = x.reshape(*x.shape[:-1], -1, 32).astype(F32)
    amax = np.abs(b).max(axis=-1, keepdims=True)
    d = _f16(amax / F32(127))
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, F32(127) / amax, F32(0)).astype(F32)
    with np.errstate(invalid="ignore", over="ignore"):
        q = np.rint(b * inv)
    q = np.where(np.isfinite(q), q, 0)  # inv overflows only where d underflows to 0 in f16: block is 0
    return (q * d).reshape(x.shape).astype(F32)


def _q8_k(x: np.ndarray) -> np.ndarray:
    """Quantize rows to Q8_K blocks of 256 and back (quantize_row_q8_K: d = max/-127 as f32, signed max)."""
    b = x.reshape(*x.shape[:-1], -1, 256).astype(F32)
    i = np.abs(b).argmax(axis=-1)[..., None]
    mx = np.take_along_axis(b, i, axis=-1)
    with np.errstate(divide="ignore"):
        iscale = np.where(mx != 0, F32(-127) / mx, F32(0)).astype(F32)
        d = np.where(iscale != 0, F32(1) / iscale, F32(0)).astype(F32)
    q = np.minimum(127, np.rint(b * iscale))
    return (q * d).reshape(x.shape).astype(F32)


def _src1_conversion(qtype: QT) -> Callable[[np.ndarray], np.ndarray]:
    """What ggml-cpu's MUL_MAT does to the activation (src1) before its dot products with a weight of qtype.

    The activation is converted to the weight type's vec_dot_type (ggml-cpu.c type_traits_cpu): f16 for F16,
    bf16 for BF16, Q8_0 blocks of 32 for the 32-element quant types (Q4_0, Q5_0, Q8_0, ...; Q8_1 for Q4_1
    and Q5_1 quantizes the same way), Q8_K blocks of 256 for the K- and IQ-quants. Products of the converted
    values are then exact in f32 (llamafile's tinyBLAS and ggml's vec_dot agree up to f32 summation order).
    """
    if qtype == QT.F32:
        return lambda x: x
    if qtype == QT.F16:
        return _f16
    if qtype == QT.BF16:
        return _bf16
    block = GGML_QUANT_SIZES[qtype][0]
    if block == 32:
        return _q8_0
    if block == 256:
        return _q8_k
    return lambda x: x  # unknown: no emulation, the result only carries f32-level deviations


def _mm(model: Model, name: str, x: np.ndarray, f16_src1: str = "convert") -> np.ndarray:
    """MUL_MAT(weight, x) for x [T, n_in] -> [T, n_out], with ggml-cpu's src1 conversion, exact f64 sums."""
    w = model.tensor(name)
    qtype = model.tensor_type(name)
    xc = x if (qtype == QT.F16 and f16_src1 == "f32") else _src1_conversion(qtype)(x)
    return (xc.astype(F64) @ w.astype(F64).T).astype(F32)


def _linear(model: Model, prefix: str, x: np.ndarray, f16_src1: str = "convert") -> np.ndarray:
    """MUL_MAT with `prefix.weight`, then ADD `prefix.bias` when the model has one."""
    y = _mm(model, prefix + ".weight", x, f16_src1)
    if model.has(prefix + ".bias"):
        y = (y + model.tensor(prefix + ".bias")).astype(F32)
    return y


# ---- element-wise ops as in ggml/src/ggml-cpu/ops.cpp and vec.h ----------------------------------------

def _layer_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """GGML NORM: mean and variance summed in double, scale 1/sqrtf(var + eps) in f32."""
    n = x.shape[-1]
    mean = (x.astype(F64).sum(-1, keepdims=True) / n).astype(F32)
    v = (x - mean).astype(F32)
    var = ((v * v).astype(F64).sum(-1, keepdims=True) / n).astype(F32)
    scale = F32(1) / np.sqrt(var + F32(eps))
    return (v * scale).astype(F32)


def _rms_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """GGML RMS_NORM: sum of squares in double, scale 1/sqrtf(mean + eps) in f32."""
    n = x.shape[-1]
    mean = ((x * x).astype(F64).sum(-1, keepdims=True) / n).astype(F32)
    scale = F32(1) / np.sqrt(mean + F32(eps))
    return (x * scale).astype(F32)


def _norm(model: Model, prefix: str, x: np.ndarray) -> np.ndarray:
    """build_norm: NORM or RMS_NORM (the architecture table's Forward.norm), then MUL by the weight and ADD the bias
    if present."""
    hp = model.hparams
    y = _rms_norm(x, hp.norm_eps) if hp.forward.norm == "rms" else _layer_norm(x, hp.norm_eps)
    y = (y * model.tensor(prefix + ".weight")).astype(F32)
    if model.has(prefix + ".bias"):
        y = (y + model.tensor(prefix + ".bias")).astype(F32)
    return y


GELU_COEF_A = F32(0.044715)
SQRT_2_OVER_PI = F32(0.79788456080286535587989211986876)


def _gelu(x: np.ndarray) -> np.ndarray:
    """ggml-cpu GELU (GGML_GELU_FP16): the input is rounded to f16 and looked up in an f16 table of the tanh
    approximation; |x| >= 10 bypasses the table. Emulated because the table moves values by up to ~1e-3."""
    h = _f16(x)
    g = F32(0.5) * h * (F32(1) + np.tanh(SQRT_2_OVER_PI * h * (F32(1) + GELU_COEF_A * h * h)))
    y = _f16(g.astype(F32))
    return np.where(x <= -10, F32(0), np.where(x >= 10, x, y)).astype(F32)


def _swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """SWIGLU: silu(gate) * up in f32."""
    with np.errstate(over="ignore"):
        silu = gate / (F32(1) + np.exp(-gate))
    return (silu * up).astype(F32)


def _rope_norm(x: np.ndarray, n_dims: int, base: float) -> np.ndarray:
    """ROPE mode 0 (llama): rotate adjacent pairs (x[2i], x[2i+1]) by pos * base^(-2i/n_dims).

    ggml_rope_cache_init builds theta by repeated f32 multiplication by powf(base, -2/n_dims); emulated.
    """
    t = x.shape[0]
    theta_scale = np.power(F32(base), F32(-2.0) / F32(n_dims), dtype=F32)
    theta = np.empty((t, n_dims // 2), dtype=F32)
    cur = np.arange(t, dtype=F32)
    for i in range(n_dims // 2):
        theta[:, i] = cur
        cur = (cur * theta_scale).astype(F32)
    cos = np.cos(theta)[:, None, :]
    sin = np.sin(theta)[:, None, :]
    out = x.copy()
    x0 = x[..., 0:n_dims:2]
    x1 = x[..., 1:n_dims:2]
    out[..., 0:n_dims:2] = x0 * cos - x1 * sin
    out[..., 1:n_dims:2] = x0 * sin + x1 * cos
    return out.astype(F32)


# ---- attention -----------------------------------------------------------------------------------------

def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, hp: Hparams, kv_type: str,
               f16_src1: str = "convert") -> dict[str, np.ndarray]:
    """build_attn_mha without flash attention, over one causal sequence at positions 0..T-1."""
    store = {"f16": _f16, "bf16": _bf16, "f32": lambda a: a}[kv_type]
    t, h, d_h = q.shape
    group = h // hp.n_head_kv
    k_cache = store(k).transpose(1, 0, 2)  # [H_kv, T, D_h]: the stored (rounded) K
    v_cache = store(v).transpose(1, 2, 0)  # [H_kv, D_h, T]: V is stored transposed
    # MUL_MAT with an f16 (bf16) cache view as src0 converts src1 (q, then P) to f16 (bf16) first.
    qh = store(q).transpose(1, 0, 2).astype(F64)  # [H, T, D_h]
    kh = np.repeat(k_cache, group, axis=0).astype(F64)  # query head i reads KV head i // group
    kq = np.einsum("htd,hjd->htj", qh, kh).astype(F32)
    # SOFT_MAX (f32): scale, add the causal mask, subtract the max, expf, sum in double, multiply by 1/sum.
    s = kq * F32(hp.kq_scale)
    s = np.where(np.tri(t, dtype=bool)[None], s, F32(-np.inf))
    e = np.exp(s - s.max(axis=-1, keepdims=True)).astype(F32)
    p = (e * (1.0 / e.astype(F64).sum(axis=-1, keepdims=True)).astype(F32)).astype(F32)
    vh = np.repeat(v_cache, group, axis=0).astype(F64)  # [H, D_h, T]
    p_used = p if (kv_type == "f16" and f16_src1 == "f32") else store(p)
    kqv = np.einsum("htj,hdj->htd", p_used.astype(F64), vh).astype(F32)
    kqv_out = np.ascontiguousarray(kqv.transpose(1, 0, 2)).reshape(t, h * d_h)
    return {"k_cache": k_cache, "v_cache": v_cache, "kq": kq, "kq_soft_max": p, "kqv": kqv, "kqv_out": kqv_out}


def forward(model: Model, tokens: Sequence[int], *, kv_type: str = "f16", f16_src1: str = "convert") -> Reference:
    """Evaluate the whole prompt at once (causal), returning every attention-relevant node per layer."""
    if kv_type not in KV_TYPES:
        raise ValueError(f"kv_type must be one of {', '.join(KV_TYPES)}, not {kv_type!r}")
    if f16_src1 not in F16_SRC1:
        raise ValueError(f"f16_src1 must be one of {', '.join(F16_SRC1)}, not {f16_src1!r}")
    s1 = f16_src1
    hp = model.hparams
    toks = [int(x) for x in tokens]
    if not toks:
        raise ValueError("forward needs at least one token")
    if max(toks) >= hp.n_vocab or min(toks) < 0:
        raise ValueError(f"token id out of range for a vocabulary of {hp.n_vocab}")
    t = len(toks)
    out: dict[tuple[int | None, str], np.ndarray] = {}

    x = model.rows("token_embd.weight", toks)  # GET_ROWS dequantizes exactly
    if hp.forward.positions == "learned":
        if t > hp.n_ctx_train:
            raise ValueError(f"{t} tokens exceed the {hp.n_ctx_train} learned positions")
        x = (x + model.rows("position_embd.weight", np.arange(t))).astype(F32)
    out[(None, "inp_embd")] = x

    for il in range(hp.n_layer):
        p = f"blk.{il}."
        cur = _norm(model, p + "attn_norm", x)
        out[(il, "attn_norm")] = cur
        d, d_kv = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim
        if model.has(p + "attn_qkv.weight"):
            qkv = _linear(model, p + "attn_qkv", cur, s1)  # fused [Q | K | V]
            q, k, v = qkv[:, :d], qkv[:, d:d + d_kv], qkv[:, d + d_kv:]
        else:
            q = _linear(model, p + "attn_q", cur, s1)
            k = _linear(model, p + "attn_k", cur, s1)
            v = _linear(model, p + "attn_v", cur, s1)
        q = q.reshape(t, hp.n_head, hp.head_dim)
        k = k.reshape(t, hp.n_head_kv, hp.head_dim)
        v = v.reshape(t, hp.n_head_kv, hp.head_dim)
        if hp.forward.positions == "rope_norm":
            q = _rope_norm(q, hp.rope_dim, hp.rope_freq_base)
            k = _rope_norm(k, hp.rope_dim, hp.rope_freq_base)
        out[(il, "Qcur")], out[(il, "Kcur")], out[(il, "Vcur")] = q, k, v
        att = _attention(q, k, v, hp, kv_type, s1)
        for role, arr in att.items():
            out[(il, role)] = arr
        attn_out = _linear(model, p + "attn_output", att["kqv_out"], s1)
        out[(il, "attn_out")] = attn_out
        ffn_inp = (attn_out + x).astype(F32)
        out[(il, "ffn_inp")] = ffn_inp
        cur = _norm(model, p + "ffn_norm", ffn_inp)
        out[(il, "ffn_norm")] = cur
        if hp.forward.ffn == "gelu":
            ffn = _linear(model, p + "ffn_down", _gelu(_linear(model, p + "ffn_up", cur, s1)), s1)
        else:
            act = _swiglu(_linear(model, p + "ffn_gate", cur, s1), _linear(model, p + "ffn_up", cur, s1))
            ffn = _linear(model, p + "ffn_down", act, s1)
        out[(il, "ffn_out")] = ffn
        x = (ffn + ffn_inp).astype(F32)
        out[(il, "l_out")] = x

    cur = _norm(model, "output_norm", x)
    out[(None, "result_norm")] = cur
    head = "output.weight" if model.has("output.weight") else "token_embd.weight"
    out[(None, "result_output")] = _mm(model, head, cur, s1)
    return Reference(hparams=hp, tokens=tuple(toks), kv_type=kv_type, tensors=out, f16_src1=f16_src1)
