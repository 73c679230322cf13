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


def _matmul_gamma(m, name: str, n: int) -> float:
    """The f32 error of one weight MUL_MAT's dot product of n terms, relative to Σ|W_i||x_i|, plus the bias ADD's and
    RoPE's roundings: a float weight sums n products in SIMD lanes (gamma(n)); a quantized one multiplies integer
    blocks exactly (its activations quantized as the reference does) and sums one scaled term per block of 32 or 256
    in f32, a few roundings each (Q4_1/Q8_1 and the K-quants' mins add one more)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QT

    qtype = m.tensor_type(name)
    if qtype in (QT.F32, QT.F16, QT.BF16):
        return float(gamma(n)) + 3 * U32
    block = GGML_QUANT_SIZES[qtype][0]
    return (n / block + 4 + 4) * U32 + 3 * U32


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
            g = _matmul_gamma(m, "blk.0.attn_qkv.weight", hp.n_embd)
            qkv = g * mag("blk.0.attn_qkv")
            q, k, v = qkv[:, :d], qkv[:, d:d + d_kv], qkv[:, d + d_kv:]
        else:
            q, k, v = (_matmul_gamma(m, f"blk.0.{w}.weight", hp.n_embd) * mag(f"blk.0.{w}")
                       for w in ("attn_q", "attn_k", "attn_v"))
        out = {"Qcur": q.reshape(t, hp.n_head, -1), "Kcur": k.reshape(t, hp.n_head_kv, -1),
               "Vcur": v.reshape(t, hp.n_head_kv, -1)}
        out["qkv"] = out["qkv@mm"] = np.concatenate([q, k, v], axis=-1)[None]  # fused: [1, T, width] (rows)
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
            out = self._attention_noise(quantity, exact_k, exact_v).astype(np.float32)  # f32: see _attention_flips
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

    def _chances(self) -> dict[str, np.ndarray]:
        """Per layer-0 value that llama.cpp rounds, the chance that it rounds to the other side of a midpoint than
        the reference (up to 2·noise/step: noise() bounds how far llama.cpp's value can lie from the reference's) and
        the step it then moves by (steps.py): q [H, T, D] as kq reads it, converted to the K cache's vec_dot format;
        k [H, T, D] and v [H, D, T] as stored; P [H, T, T] rounded before P·V (f16/bf16 V, not flash)."""
        if "chances" in self._cache:
            return self._cache["chances"]  # type: ignore[return-value]
        kt, vt = self.kv_type, self.v_type
        inputs, r = self._input_noise(), self.ref
        q, k, v, p = self._heads(0)

        def chance(noise: np.ndarray, x: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray]:
            st = step(x, fmt)
            return np.clip(np.divide(2 * noise, st, out=np.zeros(np.shape(x)), where=st > 0), 0.0, 1.0), st

        out = {}
        out["Pq"], out["sq"] = chance(inputs["q"].transpose(1, 0, 2), q, vec_dot_type(KV_QT[kt]))
        pk, sk = chance(inputs["Krot"].transpose(1, 0, 2), np.asarray(r.get(0, "k_cache")), kt)
        out["Pk"], out["sk"] = np.repeat(pk, self.group, axis=0), np.repeat(sk, self.group, axis=0)
        vv = np.asarray(r.get(0, "v_cache")).transpose(0, 2, 1)  # stored per token: blocks run along D_h
        pv, sv = chance(inputs["Vrot"].transpose(1, 0, 2), vv, vt)
        out["Pv"], out["sv"] = (np.repeat(a.transpose(0, 2, 1), self.group, axis=0) for a in (pv, sv))
        fmt = self._p_format()
        pp, sp = chance(self.noise("kq_soft_max"), p, fmt) if fmt != "f32" else (np.zeros(p.shape),) * 2
        out["Pp"], out["sp"] = pp.astype(np.float32), sp.astype(np.float32)
        self._cache["chances"] = out  # type: ignore[assignment]
        return out

    def _attention_flips(self, flash: bool) -> dict[str, np.ndarray]:
        """Layer 0's flip allowance and expected flip count per element of kq, kq_soft_max and kqv [H, T, ·], row by
        row (memory: one query row of every head at a time).

        Each flip is an independent event (chance P_i) that moves the element by ±e_i (linearised), up or down alike
        (the f32 noise that carries a value across a rounding midpoint is symmetric): their sum has mean 0 and
        variance V = Σ P_i e_i², and exceeds min(sqrt(2VL) + (2/3)ML, K·M) with chance below EPS (Bernstein, and
        K the Poisson(Σ P_i) count exceeded with chance below EPS; M = max e_i, L = ln 1/EPS). Events: a q_d flip
        moves kq_tj by step(q_d)·k_jd; a k_jd flip by q_d·step(k_jd); through softmax (derivative s·p_j(δ_j − Σ p δ))
        and P·V (s·Σ_j p_j δ_j (V_j − o)) they move kq_soft_max and kqv, a q flip all slots of its row at once (its
        effect on kqv bounded by Cauchy-Schwarz over the slots); P and V flips add step(P_j)·V_j and p_j·step(V_j)
        to kqv. Nothing here grows with the row: a long row spreads the same flips over more slots."""
        key = ("attention_flips", flash)
        if key in self._cache:
            return self._cache[key]  # type: ignore[return-value]
        q, k, v, p = self._heads(0)
        o = np.asarray(self.ref.get(0, "kqv"), np.float64)
        c = self._chances()
        H, T, D = q.shape
        s = self.scale
        vis = np.tri(T, dtype=bool)
        k2 = k * k
        pk, sk2 = c["Pk"], c["sk"] ** 2
        vk_q2 = pk * sk2  # [H, T, D]: Σ over a key's flips of P·step², times q_d² per row below
        mk = (pk > 0) * c["sk"]
        lam_k = pk.sum(-1)  # [H, T]
        # kept in f32 (a bound needs no more), [H, T, T] being the largest arrays a long prompt makes
        out = {n: np.zeros((H, T, T), np.float32) for n in ("kq", "kq_n", "kq_soft_max", "kq_soft_max_n")}
        out.update({n: np.zeros((H, T, v.shape[1]), np.float32) for n in ("kqv", "kqv_n")})
        pp = c["Pp"] if not flash else np.zeros(p.shape)  # P is not rounded in the flash kernel
        for t in range(T):
            qt, pq, sq = q[:, t], c["Pq"][:, t], c["sq"][:, t]  # [H, D]
            vq = pq * sq**2
            mq = (pq > 0) * sq
            # kq: per score (t, j), the q_d and k_jd events
            var_k = np.einsum("hd,hjd->hj", qt**2, vk_q2)  # [H, T]: the k events of each score
            m_k = (np.abs(qt)[:, None, :] * mk).max(-1)
            var = np.einsum("hd,hjd->hj", vq, k2) + var_k
            m = np.maximum((mq[:, None, :] * np.abs(k)).max(-1), m_k)
            lam = pq.sum(-1)[:, None] + lam_k
            out["kq"][:, t], out["kq_n"][:, t] = _tail(var, m, lam), lam
            # kq_soft_max: Δp_j = s·p_j·(δ_j − Σ_j' p_j' δ_j')
            pt = np.where(vis[t][None], p[:, t], 0.0)  # [H, T]
            kbar = np.einsum("hj,hjd->hd", pt, k)
            dk = k - kbar[:, None, :]
            var_q = np.einsum("hd,hjd->hj", vq, dk**2)
            m_q = (mq[:, None, :] * np.abs(dk)).max(-1)
            others = (pt**2 * var_k).sum(-1, keepdims=True)  # the other slots' k events, weighted by p_j'²
            var_s = s**2 * pt**2 * (var_q + (1 - pt) ** 2 * var_k + others)
            m_s = s * pt * np.maximum(np.maximum(m_q, m_k), (pt * m_k).max(-1, keepdims=True))
            lam_row = pq.sum(-1)[:, None] + (lam_k * vis[t][None]).sum(-1, keepdims=True)
            out["kq_soft_max"][:, t] = _tail(var_s, m_s, np.broadcast_to(lam_row, (H, T)))
            out["kq_soft_max_n"][:, t] = np.where(vis[t][None], lam_row, 0.0)
            # kqv: o_d' = Σ_j p_j V_jd'
            dev = v - o[:, t][:, :, None]  # [H, D', T]
            a = np.sqrt(np.einsum("hj,hjd->hd", pt, k2))  # [H, D]: Cauchy-Schwarz over the slots for a q flip
            b = np.sqrt(np.einsum("hj,hdj->hd", pt, dev**2))  # [H, D']
            var_o = s**2 * (vq * a**2).sum(-1)[:, None] * b**2
            m_o = s * (mq * a).max(-1)[:, None] * b
            var_o = var_o + s**2 * np.einsum("hj,hdj->hd", pt**2 * var_k, dev**2)
            m_o = np.maximum(m_o, s * (pt[:, None, :] * np.abs(dev) * m_k[:, None, :]).max(-1))
            ppt, spt = pp[:, t] * vis[t][None], c["sp"][:, t]
            var_o = var_o + np.einsum("hj,hdj->hd", ppt * spt**2, v**2) + np.einsum("hj,hdj->hd", pt**2,
                                                                                    c["Pv"] * c["sv"] ** 2)
            m_o = np.maximum(m_o, np.maximum(((ppt > 0) * spt)[:, None, :] * np.abs(v),
                                             pt[:, None, :] * (c["Pv"] > 0) * c["sv"]).max(-1))
            lam_o = lam_row + ppt.sum(-1)[:, None] + np.einsum("j,hdj->hd", vis[t] * 1.0, c["Pv"])
            out["kqv"][:, t], out["kqv_n"][:, t] = _tail(var_o, m_o, lam_o), lam_o
        self._cache[key] = out  # type: ignore[assignment]
        return out

    def _p_format(self) -> str:
        """What MUL_MAT(v, P) converts P to: the V cache's float type; nothing for f32 or a quantized V (flash)."""
        if self.v_type in ("f16", "bf16") and not self.p_exact:
            return self.v_type
        return "f32"

    def flips(self, quantity: str, flash: bool) -> np.ndarray | None:
        """Layer 0's flip allowance for a quantity, canonical layout (the cache views: one step of the cache's type;
        the attention: _attention_flips); None where nothing is rounded."""
        kt, vt = self.kv_type, self.v_type
        if quantity not in ("k", "v", "kq", "kq_scores", "kq_soft_max", "kqv") or (kt == vt == "f32"):
            return None
        r = self.ref
        if quantity == "k":
            return None if kt == "f32" else step(r.get(0, "k_cache"), kt)
        if quantity == "v":  # stored per token: blocks run along D_h
            return None if vt == "f32" else step(np.asarray(r.get(0, "v_cache")).transpose(0, 2, 1), vt).transpose(0, 2, 1)
        return self._attention_flips(flash)["kq" if quantity == "kq_scores" else quantity]  # tanh' <= 1

    def expected_flips(self, quantity: str, flash: bool) -> np.ndarray | None:
        """The expected number of flips that touch each element (the count compare.py allows is derived from it)."""
        if self.flips(quantity, flash) is None:
            return None
        if quantity in ("k", "v"):
            return self._chances_kv(quantity)
        return self._attention_flips(flash)[("kq" if quantity == "kq_scores" else quantity) + "_n"]

    def _chances_kv(self, which: str) -> np.ndarray:
        """The flip chance of each stored K [H_kv, T, D] or V [H_kv, D, T] element."""
        inputs, r = self._input_noise(), self.ref
        if which == "k":
            st = step(r.get(0, "k_cache"), self.kv_type)
            n = inputs["Krot"].transpose(1, 0, 2)
        else:
            vv = np.asarray(r.get(0, "v_cache")).transpose(0, 2, 1)
            st = step(vv, self.v_type).transpose(0, 2, 1)
            n = inputs["Vrot"].transpose(1, 2, 0)
        return np.clip(np.divide(2 * n, st, out=np.zeros(st.shape), where=st > 0), 0.0, 1.0)


EPS = 1e-9  # the chance, per element, that its flips exceed their allowance
_L = float(np.log(1 / EPS))


def poisson_bound(lam: np.ndarray) -> np.ndarray:
    """The count K a Poisson(lam) number of events exceeds with chance below EPS (elementwise): exact summation
    for lam <= 50, lam + 6.5·sqrt(lam) + 10 above (the normal tail at 6.5 sigmas, with room for the skew)."""
    lam = np.asarray(lam, np.float64)
    out = lam + 6.5 * np.sqrt(lam) + 10
    small = lam <= 50
    if small.any():
        lm = lam[small]
        pmf = np.exp(-lm)
        cdf = pmf.copy()
        k = np.zeros(lm.shape)
        for i in range(1, 160):
            done = 1 - cdf < EPS
            k = np.where(done, k, i)
            pmf = pmf * lm / i
            cdf = cdf + pmf
        out[small] = k
    return out


def _tail(var: np.ndarray, m: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """The bound on a sum of independent flip effects of either sign (variance V, largest M, expected count):
    min(Bernstein's sqrt(2VL) + (2/3)ML, K·M)."""
    return np.minimum(np.sqrt(2 * var * _L) + (2 / 3) * m * _L, poisson_bound(lam) * m)
