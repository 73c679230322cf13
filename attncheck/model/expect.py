"""Reference values and error-model terms for `--model`, per run, in the canonical layouts of model_roles.

One reference forward pass per llama.cpp run covers all of its tokens: attention is causal, so the whole-prompt pass
equals llama.cpp's evaluation ubatch by ubatch (each ubatch reads the K/V the earlier ones stored), and evaluation e
is the slice of positions [n_past, n_past + T). Arrays here span the run's T_all tokens; a slot axis has one entry
per token (slot j holds the token at position j; model_checks pads it to the printed view's n_kv with zeros).

Terms of layer 0, whose inputs llama.cpp and the reference share up to f32 noise (model_checks.py composes them):
- noise(): f32 summation order. A dot product of n terms summed in at least 8 SIMD lanes (ggml's vec_dot kernels,
  llamafile's tinyBLAS) errs by at most gamma(n) = (n/8 + 4)·2^-24 times Σ|terms|, whatever the order; the
  reference sums exactly. Qcur/Kcur/Vcur: Σ_i |W_i||x_i| + |b| over n_embd (a RoPE pair adds its two);
  kq: Σ_d |q_d||k_d| over D_h, plus the noise of q and k themselves when the cache is f32 (nothing rounds it away);
  kq_soft_max: the kq noise through softmax, 2 p_j·scale·max Δkq, and (n + 4)·2^-24·p_j of its own;
  kqv: Σ_j Δp_j |V_j| + gamma(n)·Σ_j P_j |V_j| (+ Σ_j P_j ΔV_j for an f32 cache).
- flips(): rounding flips. llama.cpp rounds q to the K cache type before k·q and P to the V cache type before P·V
  (f16 by default) and stores K and V rounded; noise can put a value on the other side of a rounding midpoint than
  the reference (one ulp of the cache type). Allowed: two q/k flips per score, dkq = 2·max_d max(ulp(q_d)|k_d|,
  |q_d| ulp(k_d)); their effect on P, dp_j = 2 p_j·scale·max_j' dkq (softmax's derivative); on kqv one P flip,
  one V flip and dp: max_j ulp(P_j)|V_j| + max_j P_j ulp(V_j) + Σ_j dp_j |V_j|; on the cache views one ulp.
  None for an f32 cache (nothing is rounded).
- flash(): what FLASH_ATTN_EXT on the CPU does differently from the reference's MUL_MAT/SOFT_MAX/MUL_MAT, in every
  layer (ggml/src/ggml-cpu/ops.cpp, ggml_compute_forward_flash_attn_ext_f16_one_chunk and _tiled). With an f16 V
  cache the one-chunk kernel accumulates Σ_j e^{s_j − M} V_j in an f16 buffer (ggml_vec_mad_f16 and
  ggml_vec_scale_f16 round to f16 at every slot): each of at most 2·n_visible roundings errs by 2^-11 of the running
  sum, which in units of the output is at most Σ_j P_j |V_j|. It does not round P to f16 (the reference does, as the
  non-flash graph does): Σ_j (2^-11 P_j + 2^-25)|V_j|. The tiled kernel (many queries) keeps q in f32 where the
  reference rounds it to f16: kq moves by up to 2^-11 Σ_d |q_d k_d|, P and the output as above.
"""
from __future__ import annotations

import numpy as np

from .weights import Model
from .reference import Reference

U32 = 2.0**-24  # f32 unit roundoff
U16 = 2.0**-11  # f16 rounding, relative (half an ulp)
UNIT = {"f16": U16, "bf16": 2.0**-8, "f32": 0.0}  # relative rounding of a value stored in the cache type


def gamma(n: int | np.ndarray) -> float | np.ndarray:
    """Worst f32 error of a sum of n terms accumulated in >= 8 SIMD lanes, relative to Σ|terms|."""
    return (np.asarray(n, dtype=np.float64) / 8 + 4) * U32


def ulp(x: np.ndarray, kv_type: str) -> np.ndarray:
    """One ulp of |x| in the KV cache type: the size of a rounding flip (0 for f32, where nothing is rounded)."""
    a = np.abs(np.asarray(x, dtype=np.float32))
    if kv_type == "f16":
        return np.spacing(a.astype(np.float16)).astype(np.float64)
    if kv_type == "bf16":
        with np.errstate(divide="ignore"):
            e = np.floor(np.log2(np.where(a > 0, a, 1.0)))
        return np.where(a > 0, 2.0 ** (np.maximum(e, -126) - 7), 2.0**-133)
    return np.zeros(a.shape)


class Expected:
    """The reference of one run and the error-model terms derived from it (computed on first use, then kept)."""

    def __init__(self, ref: Reference, kv_type: str, model: Model):
        self.ref = ref
        self.kv_type = kv_type
        self.model = model
        hp = ref.hparams
        self.group = hp.n_head // hp.n_head_kv
        self.scale = float(hp.kq_scale)
        # P·V took P unrounded: with an "f32" src1 (2024 tinyBLAS) or in FLASH_ATTN_EXT
        self.p_exact = kv_type == "f16" and ref.f16_src1 == "f32"
        self._cache: dict[tuple, np.ndarray | None] = {}

    # ---- values ----------------------------------------------------------------------------------------

    def value(self, quantity: str, role: str, layer: int | None) -> np.ndarray:
        """The reference in the canonical layout of `quantity` (model_roles.CANONICAL), float64."""
        r = self.ref  # not cached: the reference holds it in f32 already, so memory stays that of one reference
        if quantity == "q":
            a = r.get(layer, "Qcur")  # [T, H, D_h]
        elif quantity in ("Kcur", "Vcur"):
            a = r.get(layer, quantity)  # [T, H_kv, D_h]
        elif quantity == "k":
            a = r.get(layer, "k_cache")  # [H_kv, T, D_h]
        elif quantity == "v":
            a = r.get(layer, "v_cache")  # [H_kv, D_h, T]
        elif quantity in ("kq", "kq_soft_max", "kqv"):
            a = r.get(layer, quantity)  # [H, T, T] or [H, T, D_h]
        else:  # rows: [1, T, width]
            a = r.get(layer, role)[None]
        return np.asarray(a, dtype=np.float64)

    def _heads(self, layer: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """q [H, T, D_h], k [H, T, D_h], v [H, D_h, T] per query head (GQA: head h reads KV head h // group), p."""
        r = self.ref
        q = np.asarray(r.get(layer, "Qcur"), np.float64).transpose(1, 0, 2)
        k = np.repeat(np.asarray(r.get(layer, "k_cache"), np.float64), self.group, axis=0)
        v = np.repeat(np.asarray(r.get(layer, "v_cache"), np.float64), self.group, axis=0)
        p = np.asarray(r.get(layer, "kq_soft_max"), np.float64)
        return q, k, v, p

    def _row_max(self, a: np.ndarray) -> np.ndarray:
        """[H, T, T] → [H, T, 1]: the largest entry over the slots each query may read (causal)."""
        t = a.shape[1]
        return np.where(np.tri(t, dtype=bool)[None], a, 0.0).max(axis=-1, keepdims=True)

    def _pair_max(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """[H, T, D] × [H, T', D] → [H, T, T']: max over d of a[h,t,d]·b[h,j,d] (one head at a time)."""
        out = np.empty((a.shape[0], a.shape[1], b.shape[1]))
        for h in range(a.shape[0]):
            out[h] = (a[h][:, None, :] * b[h][None]).max(-1)
        return out

    # ---- layer 0: f32 noise --------------------------------------------------------------------------------

    def _projection_noise(self) -> dict[str, np.ndarray]:
        """Layer 0's Qcur [T, H, D_h], Kcur and Vcur [T, H_kv, D_h]: gamma(n_embd)·(Σ_i |W_i||x_i| + |b|)."""
        if "proj" in self._cache:
            return self._cache["proj"]  # type: ignore[return-value]
        hp, m = self.ref.hparams, self.model
        x = np.abs(np.asarray(self.ref.get(0, "attn_norm"), np.float64))  # [T, n_embd]
        t = x.shape[0]

        def mag(prefix: str) -> np.ndarray:
            y = x @ np.abs(m.tensor(prefix + ".weight").astype(np.float64)).T
            if m.has(prefix + ".bias"):
                y = y + np.abs(m.tensor(prefix + ".bias"))
            return y

        d, d_kv = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim
        if m.has("blk.0.attn_qkv.weight"):
            qkv = mag("blk.0.attn_qkv")
            q, k, v = qkv[:, :d], qkv[:, d:d + d_kv], qkv[:, d + d_kv:]
        else:
            q, k, v = mag("blk.0.attn_q"), mag("blk.0.attn_k"), mag("blk.0.attn_v")
        out = {"q": q.reshape(t, hp.n_head, hp.head_dim), "Kcur": k.reshape(t, hp.n_head_kv, hp.head_dim),
               "Vcur": v.reshape(t, hp.n_head_kv, hp.head_dim)}
        for name in ("q", "Kcur") if hp.rope_dim else ():  # RoPE mixes each pair (2i, 2i+1)
            a = out[name]
            pair = a[..., 0:hp.rope_dim:2] + a[..., 1:hp.rope_dim:2]
            a = a.copy()
            a[..., 0:hp.rope_dim:2] = pair
            a[..., 1:hp.rope_dim:2] = pair
            out[name] = a
        g = gamma(hp.n_embd) + 3 * U32  # + the bias ADD and RoPE's own roundings
        out = {k: g * a for k, a in out.items()}
        self._cache["proj"] = out  # type: ignore[assignment]
        return out

    def noise(self, quantity: str) -> np.ndarray | None:
        """Layer 0's f32-noise bound for a quantity, canonical layout (module doc); None where there is none."""
        key = ("noise", quantity)
        if key in self._cache:
            return self._cache[key]
        exact_kv = self.kv_type == "f32"  # nothing rounds the noise of K, V and q away
        proj = self._projection_noise() if quantity in ("q", "Kcur", "Vcur", "k", "v", "kq", "kq_soft_max",
                                                                        "kqv") else {}
        out: np.ndarray | None = None
        if quantity in ("q", "Kcur", "Vcur"):
            out = proj[quantity]
        elif quantity == "k" and exact_kv:
            out = proj["Kcur"].transpose(1, 0, 2)  # [H_kv, T, D_h]
        elif quantity == "v" and exact_kv:
            out = proj["Vcur"].transpose(1, 2, 0)  # [H_kv, D_h, T]
        elif quantity in ("kq", "kq_soft_max", "kqv"):
            q, k, v, p = self._heads(0)
            d_h = q.shape[-1]
            dkq = gamma(d_h) * np.einsum("htd,hjd->htj", np.abs(q), np.abs(k))
            if exact_kv:
                nq = proj["q"].transpose(1, 0, 2)
                nk = np.repeat(proj["Kcur"].transpose(1, 0, 2), self.group, axis=0)
                dkq = dkq + np.einsum("htd,hjd->htj", nq, np.abs(k)) + np.einsum("htd,hjd->htj", np.abs(q), nk)
            n_vis = np.arange(1, p.shape[1] + 1, dtype=np.float64)[None, :, None]
            dp = 2 * p * self.scale * self._row_max(dkq) + (n_vis + 4) * U32 * p
            if quantity == "kq":
                out = dkq
            elif quantity == "kq_soft_max":
                out = dp
            else:
                av = np.abs(v)
                out = np.einsum("htj,hdj->htd", dp, av) + gamma(n_vis) * np.einsum("htj,hdj->htd", p, av)
                if exact_kv:
                    nv = np.repeat(proj["Vcur"].transpose(1, 2, 0), self.group, axis=0)
                    out = out + np.einsum("htj,hdj->htd", p, nv)
        self._cache[key] = out
        return out

    # ---- layer 0: rounding flips -----------------------------------------------------------------------

    def flips(self, quantity: str, flash: bool) -> np.ndarray | None:
        """Layer 0's flip allowance for a quantity, canonical layout; None where nothing is rounded."""
        if self.kv_type == "f32" or quantity not in ("k", "v", "kq", "kq_soft_max", "kqv"):
            return None
        key = ("flips", quantity, flash)
        if key in self._cache:
            return self._cache[key]
        r, kv = self.ref, self.kv_type
        if quantity == "k":
            out = ulp(r.get(0, "k_cache"), kv)
        elif quantity == "v":
            out = ulp(r.get(0, "v_cache"), kv)
        else:
            q, k, v, p = self._heads(0)
            dkq = 2 * np.maximum(self._pair_max(ulp(q, kv), np.abs(k)), self._pair_max(np.abs(q), ulp(k, kv)))
            dp = 2 * p * self.scale * self._row_max(dkq)
            if quantity == "kq":
                out = dkq
            elif quantity == "kq_soft_max":
                out = dp
            else:
                av = np.abs(v)
                out = np.einsum("htj,hdj->htd", dp, av) + (p[:, :, None, :] * ulp(v, kv)[:, None, :, :]).max(-1)
                if not flash and not self.p_exact:  # a P rounded to the cache type may flip
                    out += (ulp(p, kv)[:, :, None, :] * av[:, None, :, :]).max(-1)
        self._cache[key] = np.asarray(out, dtype=np.float64)
        return self._cache[key]

    # ---- FLASH_ATTN_EXT against MUL_MAT/SOFT_MAX/MUL_MAT -----------------------------------------------

    def flash(self, layer: int) -> np.ndarray:
        """[H, T, D_h]: the bound on |FLASH_ATTN_EXT − reference kqv| from the kernels' arithmetic (module doc)."""
        key = ("flash", layer)
        if key in self._cache:
            return self._cache[key]  # type: ignore[return-value]
        q, k, v, p = self._heads(layer)
        av = np.abs(v)
        pv = np.einsum("htj,hdj->htd", p, av)  # Σ_j P_j |V_j|
        n_vis = np.arange(1, p.shape[1] + 1, dtype=np.float64)[None, :, None]
        u = UNIT[self.kv_type]
        out = gamma(n_vis) * (1 + pv)  # f32 accumulation and normalisation
        if self.kv_type == "f16":
            out = out + 2 * n_vis * U16 * pv + n_vis * U32  # the f16 accumulator of the one-chunk kernel
            dq = U16 * np.einsum("htd,hjd->htj", np.abs(q), np.abs(k))  # the tiled kernel's f32 q
            out = out + np.einsum("htj,hdj->htd", 2 * p * self.scale * self._row_max(dq), av)
        if u and not self.p_exact:  # P not rounded to the cache type (the reference rounds it, as MUL_MAT(v, P) does)
            out = out + np.einsum("htj,hdj->htd", u * p + 2.0**-25, av)
        self._cache[key] = out
        return out
