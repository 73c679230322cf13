"""Reference values and error-model terms for `--model`, per run, in the canonical layouts of mapping.py.

One reference forward pass per llama.cpp run covers all of its tokens: attention is causal, so the whole-prompt pass
equals llama.cpp's evaluation ubatch by ubatch (each ubatch reads the K/V the earlier ones stored), and evaluation e
is the slice of positions [n_past, n_past + T). Arrays here span the run's T_all tokens; a slot axis has one entry
per token (slot j holds the token at position j; grid.py places a printed view's n_kv slots in it).

Layer 0's terms (f32 summation noise, the roundings a value within that noise can take the other way) are in
layer0.py; the flash-attention kernel's in flash().
"""
from __future__ import annotations

import numpy as np

from .chaos import layer_chaos
from .layer0 import U32, Layer0, gamma, rowdot
from .reference import Reference
from .steps import UNIT
from .weights import Model

U16 = 2.0**-11  # f16 rounding, relative (half an ulp)


class Expected(Layer0):
    """The reference of one run and the error-model terms derived from it (computed on first use, then kept)."""

    def __init__(self, ref: Reference, kv_type: str, model: Model):
        self.ref = ref
        self.kv_type = kv_type
        self.v_type = ref.cache.v_type
        self.model = model
        hp = ref.hparams
        self.group = hp.n_head // hp.n_head_kv
        self.scale = float(hp.kq_scale)
        # P·V took P unrounded: with an "f32" src1 (2024 tinyBLAS) or in FLASH_ATTN_EXT
        self.p_exact = self.v_type == "f16" and ref.f16_src1 == "f32"
        self._cache: dict[tuple, np.ndarray | None] = {}

    # ---- values ----------------------------------------------------------------------------------------

    def value(self, quantity: str, role: str, layer: int | None, position: int | None = None,
              key: str | None = None) -> np.ndarray:
        """The reference in the canonical layout of `quantity` (mapping.CANONICAL), as the reference holds it (f32: no
        copy; what reads it takes its elements or sums it in f64); rows [1, T, width]. A rows node at `position`
        after its weight MUL_MAT gets the role's value at that node (Reference.at_node); a node inside a role
        (chains.py) the value its key names."""
        r = self.ref
        if key is not None:
            v = np.asarray(r.get(layer, key))
            return v[None] if quantity == "rows" else v
        if quantity == "rows":
            return np.asarray(r.at_node(layer, role, position)[0][None])
        return np.asarray(r.get(layer, quantity))

    def chaos(self, layer: int | None) -> tuple[float, float]:
        """The twin's (chaos_max, chaos_row) of a reference layer (chaos.py)."""
        return layer_chaos(self.ref, layer)

    def norm_input(self, role: str, layer: int | None) -> np.ndarray | None:
        """The input [T, width] of the norm a rows node is the output of (None when it is not a norm's output): the
        residual entering the layer for attn_norm, ffn_inp for ffn_norm, the branch output for a post-norm, the last
        l_out for result_norm."""
        r, fw, n_layer = self.ref, self.ref.hparams.forward, self.ref.hparams.n_layer
        if role == "attn_norm" and layer is not None:
            return r.get(layer - 1, "l_out") if layer > 0 else r.get(None, "inp_embd")
        if role == "ffn_norm" and layer is not None and r.has(layer, "ffn_inp"):
            return r.get(layer, "ffn_inp")
        if role in ("attn_post", "ffn_post") and fw.post_norms and layer is not None:
            return r.get(layer, "attn_out" if role == "attn_post" else "ffn_out")
        if role == "result_norm":
            return r.get(n_layer - 1, "l_out")
        return None

    def _heads(self, layer: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """q [H, T, D_h] as kq reads it, k [H, T, D_h], v [H, D_h, T] per query head (GQA: head h reads KV head
        h // group), p [H, T, T]."""
        r = self.ref
        q = np.asarray(r.get(layer, "q"), np.float64).transpose(1, 0, 2)
        k = np.repeat(np.asarray(r.get(layer, "k_view"), np.float64), self.group, axis=0)
        v = np.repeat(np.asarray(r.get(layer, "v_view"), np.float64), self.group, axis=0)
        p = np.asarray(r.get(layer, "kq_soft_max"), np.float64)
        return q, k, v, p

    def _row_max(self, a: np.ndarray) -> np.ndarray:
        """[H, T, T] → [H, T, 1]: the largest entry over the slots each query may read (causal)."""
        t = a.shape[1]
        return np.where(np.tri(t, dtype=bool)[None], a, 0.0).max(axis=-1, keepdims=True)

    # ---- FLASH_ATTN_EXT against MUL_MAT/SOFT_MAX/MUL_MAT -----------------------------------------------

    def flash(self, layer: int) -> np.ndarray:
        """[H, T, D_h]: the bound on |FLASH_ATTN_EXT − reference kqv| from the kernels' arithmetic (ggml-cpu ops.cpp).

        The one-chunk kernel with an f16 V accumulates Σ_j e^{s_j − M} V_j in an f16 buffer (each of at most
        2·n_visible roundings errs by 2^-11 of the running sum, at most Σ_j P_j |V_j| in output units); with any
        other V type it dequantizes V and accumulates in f32. It does not round P to the V type (the reference does,
        as MUL_MAT(v, P) does). The tiled kernel (many queries, f16 or f32 K and V) keeps q in f32 where the
        reference rounds it to f16: kq moves by up to 2^-11 Σ_d |q_d k_d|. Today's build casts an f32 K or V cache
        to f16 before the op (flash.Plan.casts): V moves by 2^-11 |V| and is accumulated in f16; K and q (converted
        to f16 by the one-chunk kernel) move kq by up to (2·2^-11 + 2^-22) Σ_d |q_d k_d|."""
        key = ("flash", layer)
        if key in self._cache:
            return self._cache[key]  # type: ignore[return-value]
        q, k, v, p = self._heads(layer)
        av = np.abs(v)
        pv = rowdot(p, av)  # Σ_j P_j |V_j|
        n_vis = np.arange(1, p.shape[1] + 1, dtype=np.float64)[None, :, None]
        u = UNIT.get(self.v_type, 0.0)
        casts = self.ref.fa is not None and self.ref.fa.casts
        out = gamma(n_vis) * (1 + pv)  # f32 accumulation and normalisation
        if casts and self.v_type == "f32":
            out = out + U16 * pv  # V cast to f16
        if self.v_type == "f16" or (casts and self.v_type == "f32"):
            out = out + 2 * n_vis * U16 * pv + n_vis * U32  # the f16 accumulator of the one-chunk kernel
        dq = None
        if self.kv_type == "f16" and self.v_type == "f16":
            dq = U16 * rowdot(np.abs(q), np.abs(k))  # the tiled kernel's f32 q
        elif casts and self.kv_type == "f32":
            dq = (2 * U16 + U16**2) * rowdot(np.abs(q), np.abs(k))  # K cast, q converted: f16
        if dq is not None:
            out = out + rowdot(2 * p * self.scale * self._row_max(dq), av)
        if u and not self.p_exact:  # P not rounded to the cache type (the reference rounds it, as MUL_MAT(v, P) does)
            out = out + rowdot(u * p + 2.0**-25, av)
        self._cache[key] = out
        return out
