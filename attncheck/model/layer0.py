"""Layer 0's error terms, whose inputs llama.cpp and the reference share up to f32 noise (compare.py composes them).

- noise(): f32 summation order. A dot product of n terms summed in at least 8 SIMD lanes (ggml's vec_dot kernels,
  llamafile's tinyBLAS) errs by at most gamma(n) = (n/8 + 4)·2^-24 times Σ|terms|, whatever the order; the
  reference sums exactly. Qcur/Kcur/Vcur: Σ_i |W_i||x_i| + |b| over n_embd (a RoPE pair adds its two; a q/k norm
  passes it on scaled by its gain, plus its own scale's change); a q pre-scale scales it; a Hadamard rotation of
  block n sums it over the block / sqrt(n). kq: Σ_d |q_d||k_d| over D_h, plus the noise of q and k themselves when the
  cache is f32 (nothing rounds it away); the scores' soft-cap passes it on (tanh' <= 1); kq_soft_max: the score noise
  through softmax, 2 p_j·scale·max Δs, and (n + 4)·2^-24·p_j of its own; kqv: Σ_j Δp_j |V_j| + gamma(n)·Σ_j P_j |V_j|
  (+ Σ_j P_j ΔV_j for an f32 V).
- flips(): rounding flips. llama.cpp converts q to the K cache's vec_dot format before k·q (f16, or Q8_0/Q8_1 blocks
  for a quantized K) and P to the V cache's before P·V (f16 by default), and stores K and V rounded to the cache
  type; noise can put a value on the other side of a rounding midpoint than the reference (one step of that format,
  steps.py). Allowed: two q/k flips per score, dkq = 2·max_d max(step(q_d)|k_d|, |q_d| step(k_d)); their effect on
  P, dp_j = 2 p_j·scale·max_j' dkq (softmax's derivative); on kqv one P flip, one V flip and dp: max_j step(P_j)|V_j|
  + max_j P_j step(V_j) + Σ_j dp_j |V_j|; on the cache views one step. None for an f32 cache (nothing is rounded).
"""
from __future__ import annotations

import numpy as np

from .matmul import vec_dot_type
from .numerics import KV_QT
from .steps import step

U32 = 2.0**-24  # f32 unit roundoff


def gamma(n: int | np.ndarray) -> float | np.ndarray:
    """Worst f32 error of a sum of n terms accumulated in >= 8 SIMD lanes, relative to Σ|terms|."""
    return (np.asarray(n, dtype=np.float64) / 8 + 4) * U32


def _rotated(noise: np.ndarray, x: np.ndarray, n: int) -> np.ndarray:
    """[..., D] noise of a Hadamard rotation's input → its output's: Σ over each block of n / sqrt(n), plus the f32
    roundings of the log2(n) butterfly stages over |x|."""
    shape = noise.shape
    b = noise.reshape(*shape[:-1], -1, n).sum(-1, keepdims=True) / np.sqrt(n)
    m = np.abs(x).reshape(*shape[:-1], -1, n).sum(-1, keepdims=True) / np.sqrt(n)
    return np.broadcast_to(b + np.log2(n) * U32 * m, (*shape[:-1], shape[-1] // n, n)).reshape(shape)


class Layer0:
    """Mixed into Expected: noise() and flips() of layer 0, from its reference (self.ref) and model."""

    def _projection_noise(self) -> dict[str, np.ndarray]:
        """Layer 0's Qcur [T, H, D_h], Kcur and Vcur [T, H_kv, D_h]: gamma(n_embd)·(Σ_i |W_i||x_i| + |b|), through
        the q/k norms and RoPE."""
        if "proj" in self._cache:
            return self._cache["proj"]  # type: ignore[return-value]
        hp, m, r = self.ref.hparams, self.model, self.ref
        x = np.abs(np.asarray(r.get(0, "attn_norm"), np.float64))  # [T, n_embd]
        t = x.shape[0]

        def mag(prefix: str) -> np.ndarray:
            y = x @ np.abs(m.matrix(prefix + ".weight")).T
            if m.has(prefix + ".bias"):
                y = y + np.abs(m.tensor(prefix + ".bias"))
            return y

        d, d_kv = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim
        if m.has("blk.0.attn_qkv.weight"):
            qkv = mag("blk.0.attn_qkv")
            q, k, v = qkv[:, :d], qkv[:, d:d + d_kv], qkv[:, d + d_kv:]
        else:
            q, k, v = mag("blk.0.attn_q"), mag("blk.0.attn_k"), mag("blk.0.attn_v")
        g = gamma(hp.n_embd) + 3 * U32  # + the bias ADD and RoPE's own roundings
        out = {"Qcur": g * q.reshape(t, hp.n_head, -1), "Kcur": g * k.reshape(t, hp.n_head_kv, -1),
               "Vcur": g * v.reshape(t, hp.n_head_kv, -1)}
        out["qkv"] = out["qkv@mm"] = g * np.concatenate([q, k, v], axis=-1)[None]  # fused: [1, T, width] (rows)
        for name in ("Qcur", "Kcur", "Vcur"):  # the projection before its bias, reshape, q/k norm and RoPE
            out[name + "@mm"] = out[name + "@proj"] = out[name]
        for name, proj, w in (("Qcur", "Qcur@proj", "attn_q_norm"), ("Kcur", "Kcur@proj", "attn_k_norm")):
            if r.has(0, name + "@norm"):  # RMS_NORM per head, MUL by its weight: y = p·s·w, s = 1/sqrt(mean p² + eps)
                p = np.asarray(r.get(0, proj), np.float64)
                ms = (p * p).mean(-1, keepdims=True) + hp.norm_eps
                ds = (np.abs(p) * out[name]).mean(-1, keepdims=True) / ms  # |Δs / s|
                wn = np.abs(m.tensor(f"blk.0.{w}.weight"))
                raw = (out[name] + np.abs(p) * ds) / np.sqrt(ms) + 3 * U32 * np.abs(r.get(0, name + "@norm"))
                out[name + "@norm"] = raw
                out[name] = out[name + "@normw"] = wn * raw + U32 * np.abs(r.get(0, name + "@normw"))
        for name in ("Qcur", "Kcur") if hp.rope_dim else ():  # RoPE mixes each pair
            a, n = out[name].copy(), hp.rope_dim
            if hp.forward.positions == "rope_neox":
                pair = a[..., :n // 2] + a[..., n // 2:n]
                a[..., :n // 2], a[..., n // 2:n] = pair, pair
            else:
                pair = a[..., 0:n:2] + a[..., 1:n:2]
                a[..., 0:n:2], a[..., 1:n:2] = pair, pair
            out[name] = a
        self._cache["proj"] = out  # type: ignore[assignment]
        return out

    def _input_noise(self) -> dict[str, np.ndarray]:
        """Layer 0's q_scaled, q (what kq reads), Krot and Vrot: the projections' noise scaled and rotated."""
        if "inputs" in self._cache:
            return self._cache["inputs"]  # type: ignore[return-value]
        r, hp, c = self.ref, self.ref.hparams, self.ref.cache
        out = dict(self._projection_noise())
        q = out["Qcur"]
        if hp.q_scale is not None:
            q = out["q_scaled"] = abs(hp.q_scale) * q + U32 * np.abs(r.get(0, "q_scaled"))
        out["q"] = _rotated(q, r.get(0, "q"), c.k_rot) if c.k_rot else q
        out["Krot"] = _rotated(out["Kcur"], r.get(0, "Krot"), c.k_rot) if c.k_rot else out["Kcur"]
        out["Vrot"] = _rotated(out["Vcur"], r.get(0, "Vrot"), c.v_rot) if c.v_rot else out["Vcur"]
        self._cache["inputs"] = out  # type: ignore[assignment]
        return out

    def noise(self, quantity: str) -> np.ndarray | None:
        """Layer 0's f32-noise bound for a quantity, canonical layout (module doc); None where there is none."""
        key = ("noise", quantity)
        if key in self._cache:
            return self._cache[key]
        out: np.ndarray | None = None
        exact_k, exact_v = self.kv_type == "f32", self.v_type == "f32"  # nothing rounds their noise away
        if quantity in self._input_noise():
            out = self._input_noise()[quantity]
        elif quantity == "k" and exact_k:
            out = self._input_noise()["Krot"].transpose(1, 0, 2)  # [H_kv, T, D_h]
        elif quantity == "v" and exact_v:
            out = self._input_noise()["Vrot"].transpose(1, 2, 0)  # [H_kv, D_h, T]
        elif quantity in ("kq", "kq_scores", "kq_soft_max", "kqv"):
            out = self._attention_noise(quantity, exact_k, exact_v)
        elif quantity.startswith("kq_scores@"):  # kq/cap and its tanh (tanh' <= 1): kq's noise over the cap
            cap = self.ref.hparams.softcap
            out = self.noise("kq") / cap + 4 * U32 * np.abs(self.ref.get(0, quantity))  # type: ignore[operator]
        self._cache[key] = out
        return out

    def _attention_noise(self, quantity: str, exact_k: bool, exact_v: bool) -> np.ndarray:
        q, k, v, p = self._heads(0)
        inputs = self._input_noise()
        dkq = gamma(q.shape[-1]) * np.einsum("htd,hjd->htj", np.abs(q), np.abs(k))
        if exact_k:
            nq = inputs["q"].transpose(1, 0, 2)
            nk = np.repeat(inputs["Krot"].transpose(1, 0, 2), self.group, axis=0)
            dkq = dkq + np.einsum("htd,hjd->htj", nq, np.abs(k)) + np.einsum("htd,hjd->htj", np.abs(q), nk)
        if quantity == "kq":
            return dkq
        cap = self.ref.hparams.softcap
        ds = dkq + 4 * U32 * (np.abs(self.ref.get(0, "kq_scores")) + cap) if cap else dkq  # tanh' <= 1
        if quantity == "kq_scores":
            return ds
        n_vis = np.arange(1, p.shape[1] + 1, dtype=np.float64)[None, :, None]
        dp = 2 * p * self.scale * self._row_max(ds) + (n_vis + 4) * U32 * p
        if quantity == "kq_soft_max":
            return dp
        av = np.abs(v)
        out = np.einsum("htj,hdj->htd", dp, av) + gamma(n_vis) * np.einsum("htj,hdj->htd", p, av)
        if exact_v:
            nv = np.repeat(inputs["Vrot"].transpose(1, 2, 0), self.group, axis=0)
            out = out + np.einsum("htj,hdj->htd", p, nv)
        return out

    # ---- rounding flips -------------------------------------------------------------------------------------

    def touched(self, quantity: str) -> np.ndarray | None:
        """The chance that a rounding flip touches each element of a quantity, canonical layout: a value rounds to
        the other side of a midpoint with probability up to 2·noise/step (noise() bounds how far llama.cpp's value
        can lie from the reference's); a q flip touches a row of kq, a k flip a column, any flip of a row's scores the
        whole softmax row, which a P or V flip adds to in kqv. None where nothing is rounded."""
        if quantity not in ("k", "v", "kq", "kq_scores", "kq_soft_max", "kqv"):
            return None
        key = ("touched", quantity)
        if key in self._cache:
            return self._cache[key]
        kt, vt = self.kv_type, self.v_type
        inputs = self._input_noise()
        chance = lambda n, x, fmt: np.clip(np.divide(2 * n, step(x, fmt), out=np.zeros(np.shape(x)),  # noqa: E731
                                                     where=step(x, fmt) > 0), 0.0, 1.0)
        r = self.ref
        if quantity == "k":
            out = chance(inputs["Krot"].transpose(1, 0, 2), r.get(0, "k_cache"), kt)
        elif quantity == "v":
            vv = np.asarray(r.get(0, "v_cache")).transpose(0, 2, 1)
            out = chance(inputs["Vrot"].transpose(1, 0, 2), vv, vt).transpose(0, 2, 1)
        else:
            q, k, v, p = self._heads(0)
            pq = chance(inputs["q"].transpose(1, 0, 2), q, vec_dot_type(KV_QT[kt]))
            pk = np.repeat(chance(inputs["Krot"].transpose(1, 0, 2), r.get(0, "k_cache"), kt), self.group, axis=0)
            kq = 1 - np.prod(1 - pq, axis=-1)[:, :, None] * np.prod(1 - pk, axis=-1)[:, None, :]
            vis = np.tri(kq.shape[1], dtype=bool)[None]
            row = 1 - np.prod(np.where(vis, 1 - kq, 1.0), axis=-1, keepdims=True)  # [H, T, 1]
            if quantity in ("kq", "kq_scores"):
                out = kq
            elif quantity == "kq_soft_max":
                out = np.broadcast_to(row, kq.shape)
            else:
                nv = np.repeat(inputs["Vrot"].transpose(1, 0, 2), self.group, axis=0)  # [H, T, D] (rows of the cache)
                pv = chance(nv, v.transpose(0, 2, 1), vt).transpose(0, 2, 1)  # [H, D, T]
                pp = chance(self.noise("kq_soft_max"), p, self._p_format())  # [H, T, T]
                keep_p = np.prod(np.where(vis, 1 - pp, 1.0), axis=-1, keepdims=True)  # [H, T, 1]
                keep_v = np.exp(np.einsum("htj,hdj->htd", vis * 1.0, np.log1p(-np.minimum(pv, 1 - 1e-12))))
                out = 1 - (1 - row) * keep_p * keep_v
        self._cache[key] = np.asarray(out, dtype=np.float64)
        return self._cache[key]

    def _pair_max(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """[H, T, D] × [H, T', D] → [H, T, T']: max over d of a[h,t,d]·b[h,j,d] (one head at a time)."""
        out = np.empty((a.shape[0], a.shape[1], b.shape[1]))
        for h in range(a.shape[0]):
            out[h] = (a[h][:, None, :] * b[h][None]).max(-1)
        return out

    def _p_format(self) -> str:
        """What MUL_MAT(v, P) converts P to: the V cache's float type; nothing for f32 or a quantized V (flash)."""
        if self.v_type in ("f16", "bf16") and not self.p_exact:
            return self.v_type
        return "f32"

    def flips(self, quantity: str, flash: bool) -> np.ndarray | None:
        """Layer 0's flip allowance for a quantity, canonical layout; None where nothing is rounded."""
        kt, vt = self.kv_type, self.v_type
        if quantity not in ("k", "v", "kq", "kq_scores", "kq_soft_max", "kqv") or (kt == vt == "f32"):
            return None
        key = ("flips", quantity, flash)
        if key in self._cache:
            return self._cache[key]
        r = self.ref
        if quantity == "k":
            out = None if kt == "f32" else step(r.get(0, "k_cache"), kt)
        elif quantity == "v":  # stored per token: blocks run along D_h
            out = None if vt == "f32" else step(np.asarray(r.get(0, "v_cache")).transpose(0, 2, 1), vt).transpose(0, 2, 1)
        else:
            q, k, v, p = self._heads(0)
            qf = vec_dot_type(KV_QT[kt])  # q converted as the K cache's vec_dot format
            dkq = 2 * np.maximum(self._pair_max(step(q, qf), np.abs(k)), self._pair_max(np.abs(q), step(k, kt)))
            dp = 2 * p * self.scale * self._row_max(dkq)
            if quantity in ("kq", "kq_scores"):
                out = dkq
            elif quantity == "kq_soft_max":
                out = dp
            else:
                av = np.abs(v)
                sv = step(v.transpose(0, 2, 1), vt).transpose(0, 2, 1)
                out = np.einsum("htj,hdj->htd", dp, av) + (p[:, :, None, :] * sv[:, None, :, :]).max(-1)
                if not flash and self._p_format() != "f32":  # a P rounded to the cache type may flip
                    out += (step(p, self._p_format())[:, :, None, :] * av[:, None, :, :]).max(-1)
        self._cache[key] = None if out is None else np.asarray(out, dtype=np.float64)
        return self._cache[key]
