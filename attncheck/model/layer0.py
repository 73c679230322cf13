"""Layer 0's error terms, whose inputs llama.cpp and the reference share up to f32 noise (compare.py adds them to
print precision; derived in docs/numerics.md §3.2). Every term is a worst-case bound; none is a chance.

- Noise, f32 summation order. A dot product of n terms summed in at least 8 SIMD lanes (ggml's vec_dot kernels,
  llamafile's tinyBLAS) errs by at most gamma(n) = (n/8 + 4)·2^-24 times Σ|terms|, whatever the order; the
  reference sums exactly. attn_norm: the norm's sums in another order (gamma(n) on the variance of a LayerNorm,
  whose sum of squares ggml reduces in f32 lanes) and its few roundings. Qcur/Kcur/Vcur: Σ_i |W_i||x_i| + |b| over
  n_embd, or Σ over lanes of 4 products for symmetric-block weights (_grouped); a RoPE pair adds its two; a q/k
  norm passes it on scaled by its gain, plus its own scale's change; a q pre-scale scales it; a Hadamard rotation
  of block n sums it over the block / sqrt(n).
- Rounding. llama.cpp rounds some of these values into a coarser format: attn_norm's output into each projection's
  vec_dot format (f16 for f16 weights, Q8_0/Q8_1/Q8_K blocks for quantized ones), q into the K cache's vec_dot
  format before k·q, K and V into the cache type, P into the V cache's float type before P·V. A value within the
  noise N of the reference's rounds differently only where a rounding midpoint lies within N of the reference's
  value, and then by whole steps (steps.deviation: found exactly from the reference's value, so most elements
  have none). Each such deviation is added in full, every one the same way: on a projection Σ_i |W_oi|·dev(x_i)
  over its row; on kq Σ_d dev(q_d)|k_jd| + |q_d|dev(k_jd) (+ dev·dev) and the dot product's own noise (and,
  with a Q4_1/Q5_1 K, Σ_b dev(s_b)|m_jb| for q's Q8_1 block sums s); on P
  through softmax exactly, |Δp_j| <= p_j·(e^{s·D_j}·Σ_j' p_j' e^{s·D_j'} − 1) for score deviations D (s the
  scale), which a p-weighted mean keeps from growing with the row; on kqv Σ_j dev(P_j)|V_j| + P_j dev(V_j) (+
  dev·dev) and gamma(n)·Σ_j P_j|V_j|, the first term centred on V's offset where smaller (_centred); at the
  elements a node prints, the smaller of that and kqv's bound as a weighted mean of V (weighted_mean.py: each
  weight's move counted once, centred on the row's mean, q's rounding one vector for every key). A row whose values
  lie clear of every midpoint keeps print precision plus f32 noise, at any prompt length.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
from gguf import GGMLQuantizationType as QT

from .blocks import rope_angle_error
from .matmul import convert, vec_dot_type
from .numerics import KV_QT, block_mins, store
from .reference import rope_setting
from .steps import UNIT, deviation, q8_1_sum_deviation

U32 = 2.0**-24  # f32 unit roundoff
F64 = np.float64
PROJECTIONS = {"Qcur": "attn_q", "Kcur": "attn_k", "Vcur": "attn_v"}
# weight types whose blocks hold symmetric integers (no min, no sub-block scales): their dot product's float terms are
# scaled lane sums of integer products (Layer0._grouped)
SYMMETRIC_BLOCKS = frozenset({QT.Q4_0, QT.Q5_0, QT.Q8_0, QT.IQ4_NL})
ROWS = 256  # output rows of a layer-0 projection whose error terms are computed at once (Layer0._projection_terms)


def gamma(n: int | np.ndarray) -> float | np.ndarray:
    """Worst f32 error of a sum of n terms accumulated in >= 8 SIMD lanes, relative to Σ|terms|."""
    return (np.asarray(n, dtype=np.float64) / 8 + 4) * U32


def rowdot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a [..., m, k], b [..., n, k] → [..., m, n]: Σ_k a·b over the rows of both (a matmul: BLAS, where einsum is not;
    the error terms of kq and P·V over heads)."""
    return np.matmul(a, np.swapaxes(b, -1, -2))


def kq_deviation(aq: np.ndarray, ak: np.ndarray, rd: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """kq's deviation [..., T_q, T_k] (module doc) from |q| [..., T_q, D], |k| [..., T_k, D] and _read()'s rows (dq like
    q; dk like k; with a Q4_1/Q5_1 K, ds and mins): (q's rounding, one vector for every key: Σ_d dev(q_d)|k_jd|; the
    whole, which adds the dot product's noise, Δk, Δq·Δk and q's Q8_1 block sums rounded the other way)."""
    common = rowdot(rd["dq"], ak)
    whole = gamma(aq.shape[-1]) * rowdot(aq, ak) + common + rowdot(aq, rd["dk"])
    whole = whole + rowdot(rd["dq"], rd["dk"])
    if "ds" in rd:  # q's Q8_1 block sum s rounded the other way: kq moves by Σ_b Δs_b·|m_jb|
        whole = whole + rowdot(rd["ds"], rd["mins"])
    return common, whole


def weight_deviation(p: np.ndarray, ex: np.ndarray, n_vis) -> np.ndarray:
    """[..., T]: how far softmax moves each weight p_j of a row when its scores move by at most x (ex = e^x): p_j·(e^x_j
    Σ_j' p_j' e^x_j' − 1) (the normaliser's most), plus llama.cpp's (n_vis + 4) f32 roundings of it."""
    mean = (p * ex).sum(-1, keepdims=True)
    return p * (ex * mean - 1) + (n_vis + 4) * U32 * p


def _concurrently(*calls):
    """Each call's result, in order, computed on two threads: layer 0's terms are checked while no other layer is
    computed (reference.forward_layers), so the second core is free; numpy lets go of the GIL in its loops. Each
    result is the one the call gives alone: the callers split the work only where each part's values are computed
    from that part alone (a head, a weight's rows), so the terms are bit for bit the same."""
    with ThreadPoolExecutor(2) as pool:
        return [f.result() for f in [pool.submit(c) for c in calls]]


def _matmul_gamma(m, name: str, n: int) -> float:
    """The f32 error of one weight MUL_MAT's dot product of n terms, relative to Σ|W_i||x_i|, plus the bias ADD's and
    RoPE's roundings: a float weight sums n products in SIMD lanes (gamma(n)); a quantized one multiplies integer
    blocks exactly (its activations quantized as the reference does) and sums one scaled term per block of 32 or 256
    in f32, a few roundings each (Q4_1/Q8_1 and the K-quants' mins add one more)."""
    from gguf import GGML_QUANT_SIZES

    qtype = m.tensor_type(name)
    if qtype in (QT.F32, QT.F16, QT.BF16):
        return float(gamma(n)) + 3 * U32
    block = GGML_QUANT_SIZES[qtype][0]
    return (n / block + 4 + 4) * U32 + 3 * U32


def _rotated(noise: np.ndarray, x: np.ndarray, n: int, rounding: bool = True) -> np.ndarray:
    """[..., D] noise of a Hadamard rotation's input → its output's: Σ over each block of n / sqrt(n), plus (rounding)
    the f32 roundings of the log2(n) butterfly stages over |x|."""
    shape = noise.shape
    b = noise.reshape(*shape[:-1], -1, n).sum(-1, keepdims=True) / np.sqrt(n)
    if rounding:
        m = np.abs(x).reshape(*shape[:-1], -1, n).sum(-1, keepdims=True) / np.sqrt(n)
        b = b + np.log2(n) * U32 * m
    return np.broadcast_to(b, (*shape[:-1], shape[-1] // n, n)).reshape(shape)


class Layer0:
    """Mixed into Expected: noise() of layer 0, from its reference (self.ref) and model."""

    # ---- the projections' inputs and outputs ---------------------------------------------------------------

    def _x_noise(self) -> np.ndarray:
        """[T, n_embd]: how far llama.cpp's attn_norm output can lie from the reference's. The input (the embedding
        lookup) is shared exactly. ggml sums a norm's mean and an RMS norm's squares in double, in order, as the
        reference does (blocks.py): an RMS norm's output is the same. A LayerNorm's squares are summed in f32 only
        within one SIMD vector of at most 16 (then in double): its variance differs by at most 5·2^-24 of itself on
        either side, the scale 1/sqrt(var + eps) by half that plus its own two roundings, the mean by one rounding;
        the weight MUL and bias ADD then round once more each, on either side."""
        r, hp = self.ref, self.ref.hparams
        y = np.abs(np.asarray(r.get(0, "attn_norm"), np.float64))
        if hp.forward.norm == "rms":
            return np.zeros(y.shape)
        if not r.has(0, "attn_norm@norm"):
            return 16 * U32 * y
        yn = np.abs(np.asarray(r.get(0, "attn_norm@norm"), np.float64))
        x = np.asarray(self.norm_input("attn_norm", 0), np.float64)  # [T, n_embd]
        mean = np.abs(x.mean(-1, keepdims=True))
        sc = 1 / np.sqrt(x.var(-1, keepdims=True) + hp.norm_eps)
        side = 5 * U32 * yn + U32 * mean * sc
        w = np.abs(self.model.tensor("blk.0.attn_norm.weight")) if self.model.has("blk.0.attn_norm.weight") else 1.0
        return 2 * side * w + 4 * U32 * y

    def _x_format(self, name: str) -> str:
        """The format a layer-0 projection's MUL_MAT converts attn_norm's output to (matmul.vec_dot_type)."""
        qtype = self.model.tensor_type(name)
        return "f32" if qtype == QT.F16 and self.ref.f16_src1 == "f32" else vec_dot_type(qtype)

    def _x_deviation(self, fmt: str) -> tuple[np.ndarray, np.ndarray | None]:
        """[T, n_embd]: the deviation of attn_norm's output converted to fmt (steps.deviation; the noise itself for
        f32 activations), and for q8_1 [T, n_embd / 32] that of its block sums, the noise they were found from added
        (q8_1_sum_deviation; as calibrated), else None."""
        x, noise = np.asarray(self.ref.get(0, "attn_norm"), np.float64), self._x_noise()
        dev = deviation(x, noise, fmt)
        if fmt != "q8_1":
            return dev, None
        s_dev, s_noise = q8_1_sum_deviation(x, noise, dev)
        return dev, s_dev + s_noise

    def _converted(self, name: str, w: np.ndarray, dev: tuple[np.ndarray, np.ndarray | None],
                   rows: slice = slice(None)) -> np.ndarray:
        """[T, out]: how far a layer-0 projection can move through its converted input: Σ_i |W_oi|·dev(x_i), dev the
        deviation of attn_norm's output in the weight's vec_dot format (_x_deviation); w: |W| [out, n_embd], the
        weight's `rows`. Q4_1/Q5_1 weights multiply their block min by the Q8_1 block sum s = f16(d·Σq), whose own
        deviation adds |m|·dev(s)."""
        x_dev, s_dev = dev
        if not x_dev.any():
            return np.zeros((x_dev.shape[0], w.shape[0]))
        qtype = self.model.tensor_type(name)
        if s_dev is None or qtype not in (QT.Q4_1, QT.Q5_1):
            return x_dev @ w.T
        mins = np.abs(block_mins(self.model.raw(name), qtype)[rows]).astype(np.float64)  # [out, n/32]
        return x_dev @ (w + np.repeat(mins, 32, axis=1)).T + s_dev @ mins.T

    def _projections(self, kind: str) -> dict[str, np.ndarray]:
        """Layer 0's Qcur [T, H, D_h], Kcur and Vcur [T, H_kv, D_h], through the q/k norms and RoPE, for one kind of
        term: "noise" (f32 summation: gamma(n_embd)·(Σ_i |W_i||x_i| + |b|), and each op's rounding) or "converted"
        (_converted: the input's rounding into the weights' format). Both kinds are made at once, each weight
        dequantized once."""
        if ("proj", kind) not in self._cache:
            for k, (q, kv, v) in self._projection_terms().items():
                self._cache[("proj", k)] = self._through_heads(q, kv, v, k == "noise")  # type: ignore[assignment]
        return self._cache[("proj", kind)]  # type: ignore[return-value]

    def _projection_terms(self) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Both kinds of term of the Q, K and V projections [T, width] (_projections), in parts of at most ROWS output
        rows on two threads (_concurrently; each output's terms are computed from its own row of the weight, so a
        part's are the whole's)."""
        hp, m = self.ref.hparams, self.model
        norm = np.asarray(self.ref.get(0, "attn_norm"), np.float64)  # [T, n_embd]
        x = np.abs(norm)
        fused = m.has("blk.0.attn_qkv.weight")
        names = ["blk.0.attn_qkv"] if fused else [f"blk.0.{w}" for w in PROJECTIONS.values()]
        signed = dict(zip(names, _concurrently(*(lambda n=n: m.matrix(n + ".weight") for n in names))))
        fmts = {n: self._x_format(n + ".weight") for n in names}
        devs = dict(zip(set(fmts.values()), _concurrently(*(lambda f=f: self._x_deviation(f)
                                                            for f in set(fmts.values())))))
        hats = {f: np.asarray(convert(norm, f)[0], np.float64)  # x̂ once per format, for every part of _grouped's
                for f in {fmts[n] for n in names if m.tensor_type(n + ".weight") in SYMMETRIC_BLOCKS}}

        def terms(prefix: str, rows: slice) -> tuple[np.ndarray, np.ndarray]:
            name = prefix + ".weight"
            part = signed[prefix][rows]
            w = np.abs(part)
            if m.tensor_type(name) in SYMMETRIC_BLOCKS:
                y = self._grouped(part, hats[fmts[prefix]], len(signed[prefix]))
            else:
                y = x @ w.T
            if m.has(prefix + ".bias"):
                y = y + np.abs(m.tensor(prefix + ".bias")[rows])
            return _matmul_gamma(m, name, hp.n_embd) * y, self._converted(name, w, devs[fmts[prefix]], rows)

        parts = [(n, slice(lo, lo + ROWS)) for n in names for lo in range(0, len(signed[n]), ROWS)]
        done = _concurrently(*(lambda n=n, r=r: terms(n, r) for n, r in parts))
        whole = {n: [np.concatenate([t[i] for (pn, _), t in zip(parts, done) if pn == n], axis=-1) for i in (0, 1)]
                 for n in names}
        d, d_kv = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim
        if fused:
            both = whole[names[0]]
            return {k: (a[:, :d], a[:, d:d + d_kv], a[:, d + d_kv:]) for k, a in zip(("noise", "converted"), both)}
        q, k, v = (whole[n] for n in names)
        return {"noise": (q[0], k[0], v[0]), "converted": (q[1], k[1], v[1])}

    @staticmethod
    def _grouped(w: np.ndarray, x_hat: np.ndarray, width: int) -> np.ndarray:
        """[T, out]: Σ over groups g of 4 consecutive inputs of |Σ_{i in g} W_oi·x̂_ti|, x̂ attn_norm's output in the
        weight's vec_dot format, for a weight whose blocks are symmetric integers (SYMMETRIC_BLOCKS): what its f32
        noise is relative to. Its kernels sum a block's integer products exactly, in lanes of at least 4
        consecutive products (AVX2's maddubs and madd: 4; NEON's dot products and the scalar code: more), and only
        scale and accumulate those lane sums in f32; a coarser lane sums groups of these, whose |sum| is no larger.
        w: some of the weight's rows; x_hat [T, n_embd] (f64); width: the whole weight's row count, which sizes the
        chunks of groups (so the sums are those of the whole)."""
        t, n = x_hat.shape
        xg = x_hat.reshape(t, n // 4, 4).transpose(1, 0, 2)  # [G, T, 4]
        wg = w.reshape(w.shape[0], n // 4, 4).transpose(1, 2, 0)  # [G, 4, out]
        out = np.zeros((t, w.shape[0]))
        step = max(1, 2**20 // (t * width))  # groups per chunk: about 8 MB of the whole weight's lane sums
        for g in range(0, n // 4, step):
            out += np.abs(np.matmul(xg[g:g + step], wg[g:g + step])).sum(axis=0)  # [c, T, out] summed over c
        return out

    def _through_heads(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, noise: bool) -> dict[str, np.ndarray]:
        """One kind of projection term [T, width] per head and through the q/k norms and RoPE (with each op's own
        rounding where noise)."""
        hp, m, r = self.ref.hparams, self.model, self.ref
        t = q.shape[0]
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
                raw = (out[name] + np.abs(p) * ds) / np.sqrt(ms)
                if noise:
                    raw = raw + 3 * U32 * np.abs(r.get(0, name + "@norm"))
                out[name + "@norm"] = raw
                out[name] = out[name + "@normw"] = wn * raw + (U32 * np.abs(r.get(0, name + "@normw")) if noise else 0)
        angle = rope_angle_error(np.arange(t), *rope_setting(m, hp, 0))[:, None] if hp.rope_dim and noise else None
        # [T, 1, rope_dim/2]: how far RoPE's cos and sin may lie from the reference's
        for name in ("Qcur", "Kcur") if hp.rope_dim else ():  # RoPE mixes each pair, by its angle's error too
            a, n = out[name].copy(), hp.rope_dim
            first, second = (slice(0, n // 2), slice(n // 2, n)) if hp.forward.positions == "rope_neox" else \
                (slice(0, n, 2), slice(1, n, 2))
            pair = a[..., first] + a[..., second]
            if angle is not None:  # x: the value RoPE rotates
                x = np.abs(np.asarray(r.get(0, name + ("@normw" if r.has(0, name + "@norm") else "@proj")), F64))
                pair = pair + (x[..., first] + x[..., second]) * angle
            a[..., first], a[..., second] = pair, pair
            out[name] = a
        return out

    def _input_noise(self) -> dict[str, np.ndarray]:
        """Everything by which layer 0's projections and the values kq and P·V read can lie from the reference's:
        both kinds of _projections, then q_scaled, q (what kq reads), k_rot and v_rot, scaled and rotated."""
        if "inputs" in self._cache:
            return self._cache["inputs"]  # type: ignore[return-value]
        r, hp, c = self.ref, self.ref.hparams, self.ref.cache
        noise, conv = self._projections("noise"), self._projections("converted")
        out = {name: noise[name] + conv[name] for name in noise}
        q = out["Qcur"]
        if hp.q_scale is not None:
            q = out["q_scaled"] = abs(hp.q_scale) * q + U32 * np.abs(r.get(0, "q_scaled"))
        out["q"] = _rotated(q, r.get(0, "q"), c.k_rot) if c.k_rot else q
        out["k_rot"] = _rotated(out["Kcur"], r.get(0, "k_rot"), c.k_rot) if c.k_rot else out["Kcur"]
        out["v_rot"] = _rotated(out["Vcur"], r.get(0, "v_rot"), c.v_rot) if c.v_rot else out["Vcur"]
        self._cache["inputs"] = out  # type: ignore[assignment]
        return out

    # ---- the values attention reads, as llama.cpp rounds them -----------------------------------------------

    def _read(self) -> dict[str, np.ndarray]:
        """The deviations of what the attention MUL_MATs read: dq [H, T, D] (q in the K cache's vec_dot format), dk
        [H, T, D] and dv [H, D, T] (K and V as stored, per query head), and the stored cache views' own: k [H_kv, T,
        D], v [H_kv, D, T]."""
        if "read" in self._cache:
            return self._cache["read"]  # type: ignore[return-value]
        r, inputs = self.ref, self._input_noise()
        k_stored = np.asarray(r.get(0, "k_rot") if r.has(0, "k_rot") else r.get(0, "Kcur"), np.float64)  # [T, H_kv, D]
        v_stored = np.asarray(r.get(0, "v_rot") if r.has(0, "v_rot") else r.get(0, "Vcur"), np.float64)
        k_fmt = vec_dot_type(KV_QT[self.kv_type])
        q = np.asarray(r.get(0, "q"), np.float64)  # [T, H, D]
        dq, k, v = _concurrently(lambda: deviation(q, inputs["q"], k_fmt),
                                 lambda: deviation(k_stored, inputs["k_rot"], self.kv_type),
                                 lambda: deviation(v_stored, inputs["v_rot"], self.v_type))
        k, v = k.transpose(1, 0, 2), v.transpose(1, 2, 0)  # [H_kv, T, D], [H_kv, D, T]
        out = {"dq": dq.transpose(1, 0, 2), "k_view": k, "v_view": v, "dk": np.repeat(k, self.group, axis=0),
               "dv": np.repeat(v, self.group, axis=0)}
        mins = store(k_stored, self.kv_type)[1] if k_fmt == "q8_1" else None  # [T, H_kv, D/32]: Q4_1/Q5_1 K's
        if mins is not None:  # block mins, which multiply q's block sums s
            out["ds"] = q8_1_sum_deviation(q, inputs["q"], dq)[0].transpose(1, 0, 2)  # [H, T, D/32]
            out["mins"] = np.repeat(np.abs(mins.astype(np.float64)).transpose(1, 0, 2), self.group, axis=0)
        self._cache["read"] = out  # type: ignore[assignment]
        return out

    def noise(self, quantity: str) -> np.ndarray | None:
        """Layer 0's bound on |llama.cpp − reference| beyond print and the last f32 rounding, for a quantity in its
        canonical layout (module doc); None where there is none."""
        key = ("noise", quantity)
        if key in self._cache:
            return self._cache[key]
        out: np.ndarray | None = None
        if quantity in self._input_noise():
            out = self._input_noise()[quantity]
        elif quantity in ("k_view", "v_view"):
            out = self._read()[quantity]
        elif quantity in ("kq", "kq_scores", "kq_soft_max", "kqv", "kqv@flash"):
            for name, term in self._attention(quantity == "kqv@flash").items():  # each kept for its own nodes
                self._cache[("noise", name)] = term
            return self._cache[key]
        elif quantity.startswith("kq_scores@"):  # kq/cap and its tanh (tanh' <= 1): kq's bound over the cap
            cap = self.ref.hparams.softcap
            out = self.noise("kq") / cap + 4 * U32 * np.abs(self.ref.get(0, quantity))  # type: ignore[operator]
        self._cache[key] = out
        return out

    def _attention(self, flash: bool) -> dict[str, np.ndarray]:
        """kq, kq_scores, kq_soft_max [H, T, T] and kqv [H, T, D_v] (module doc), each from the one before, at once, in
        f32; flash: kqv@flash alone, FLASH_ATTN_EXT's, which reads P unrounded (expect.flash() adds its kernel's own
        arithmetic). Head by head on two threads (_concurrently): every term of a head is computed from that head's
        rows alone, so each is the one the whole computed at once gives, and no [H, T, T] f64 array is held."""
        q, k, v, p = self._heads(0)
        rd = self._read()
        h, t, d_v = p.shape[0], p.shape[1], v.shape[1]
        names = ("kqv@flash",) if flash else ("kq", "kq_scores", "kq_soft_max", "kqv")
        out = {n: np.empty((h, t, d_v if n.startswith("kqv") else t), np.float32) for n in names}
        vis = np.tri(t, dtype=bool)
        n_vis = np.arange(1, t + 1, dtype=np.float64)[:, None]
        scores = self.ref.get(0, "kq_scores") if self.ref.hparams.softcap else None
        per_head = [n for n in ("dq", "dk", "dv", "ds", "mins") if n in rd]  # [H, ...] (not the cache views)

        def head(i: int) -> None:
            for n, term in self._head_terms(q[i], k[i], v[i], p[i], {n: rd[n][i] for n in per_head},
                                            None if scores is None else scores[i], vis, n_vis, flash).items():
                out[n][i] = term

        _concurrently(*(lambda i=i: head(i) for i in range(h)))
        return out

    def _head_terms(self, q, k, v, p, rd, scores, vis, n_vis, flash: bool) -> dict[str, np.ndarray]:
        """One query head's terms (_attention): q, k [T, D], v [D_v, T], p [T, T], rd its rows of _read()'s, scores
        its kq_scores (under a soft-cap; else None)."""
        aq, ak = np.abs(q), np.abs(k)
        _, dkq = kq_deviation(aq, ak, rd)
        cap = self.ref.hparams.softcap
        ds = dkq + 4 * U32 * (np.abs(scores) + cap) if cap else dkq  # tanh' <= 1
        out = {} if flash else {"kq": dkq, "kq_scores": ds}
        x = np.where(vis, np.minimum(self.scale * ds, 30.0), 0.0)  # score deviations in softmax's units
        ex = np.exp(x)
        dp = np.where(vis, weight_deviation(p, ex, n_vis), 0.0)
        if not flash:
            out["kq_soft_max"] = dp
        fmt = "f32" if flash else self._p_format()
        dpv = deviation(p, dp, fmt) if fmt != "f32" else dp  # P as P·V reads it
        av = np.abs(v)
        moved = np.minimum(rowdot(dpv, av), self._centred(p, dp, dpv, v, fmt, vis))
        out["kqv@flash" if flash else "kqv"] = moved + rowdot(p, rd["dv"]) + rowdot(dpv, rd["dv"]) + \
            gamma(n_vis) * rowdot(p, av)
        return out

    @staticmethod
    def _centred(p: np.ndarray, dp: np.ndarray, dpv: np.ndarray, v: np.ndarray, fmt: str, vis: np.ndarray
                 ) -> np.ndarray:
        """[..., T, D]: another bound on |Σ_j E_j V_jd|, E_j = P_j as P·V reads it in llama.cpp minus the reference's
        (|E_j| <= dpv_j): Σ_j E_j V_jd = Σ_j E_j (V_jd − c_d) + c_d Σ_j E_j for any c, here each dim's median over
        the slots (V's common offset, which Σ_j dpv_j |V_jd| counts in full). Both rows of P sum to 1 within two
        roundings each (ggml's SOFT_MAX: exps times a rounded 1/sum), and each side's rounding into fmt moves each
        weight by at most half an ulp: |Σ_j E_j| <= 8·2^-24 + Σ_j (u·(2 P_j + dp_j) + a subnormal's step)."""
        off = np.median(v, axis=-1, keepdims=True)  # [..., D, 1]
        half = UNIT.get(fmt, 0.0)
        tiny = 2.0**-24 if fmt == "f16" else 0.0
        sum_e = 8 * U32 + np.where(vis, half * (2 * p + dp) + tiny, 0.0).sum(-1)  # [..., T]
        out = rowdot(dpv, np.abs(v - off)) + sum_e[..., None] * np.abs(np.swapaxes(off, -1, -2))
        whole = np.abs(p.sum(-1) - 1) <= 16 * U32  # rows that sum to 1 (not where a sink takes a share)
        return np.where(whole[..., None], out, np.inf)

    def _p_format(self) -> str:
        """What MUL_MAT(v, P) converts P to: the V cache's float type; nothing for f32 or a quantized V (flash), nor
        in a 2024 build (p_exact), nor inside FLASH_ATTN_EXT (whose kqv expect.flash() bounds)."""
        if self.v_type in ("f16", "bf16") and not self.p_exact:
            return self.v_type
        return "f32"
