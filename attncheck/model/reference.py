"""Numpy reference forward pass that reproduces llama.cpp's CPU graph node by node, for the families the architecture
table gives a `Forward` (gpt2, llama, qwen2, qwen3, gemma2, gemma3, phi3, granite, starcoder2, falcon).

Every node is computed in float64 where that is harmless and rounded to float32 after each op, as ggml stores every
node as f32. llama.cpp's CPU arithmetic is emulated where it moves results by more than f32 rounding: each weight
MUL_MAT's conversion of its activations to the weight type's vec_dot format (matmul.py), the KV cache's storage type
and Hadamard rotation, q and P converted before the attention MUL_MATs (attention.py), GELU's f16 table (blocks.py),
and under flash attention the output projection's input as FLASH_ATTN_EXT's kernel computed it (flash.py).
With that, layer 0 agrees with printed dumps to their print precision (1e-4), instead of 1e-2.

Weights are dequantized one tensor at a time, used and dropped (past layer 0, once for the pass and its twin:
weights.Shared); the token embedding is read only at the prompt's rows, and the output projection only at the
vocabulary entries a dump prints (the first and last three).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import numpy as np

from ..dump.sample import printed_indices
from . import blocks, chaos, flash
from .attention import Cache, attention
from .chaos import divergence
from .hparams import Hparams
from .matmul import F16_SRC1, weight_matmul, weight_rows
from .numerics import KV_TYPES
from .weights import Model, Shared

F32 = np.float32


@dataclass(frozen=True)
class Reference:
    """Reference node values keyed by (layer, role); layer is None for inp_embd, result_norm, result_output.

    Shapes are the reversed GGML ne of the llama.cpp node, with the KV axis of length n_tokens (unpadded):
    Qcur, q [T, H, D_h], Kcur/Vcur (and k_rot/v_rot) [T, H_kv, D_h], k_view [H_kv, T, D_h], v_view [H_kv, D_h, T],
    kq/kq_scores/kq_soft_max [H, T, T], kqv [H, T, D_h], result_output [T, len(vocab_cols)] (the logits at
    vocab_cols only), the others [T, D].
    """

    hparams: Hparams
    tokens: tuple[int, ...]
    kv_type: str
    tensors: Mapping[tuple[int | None, str], np.ndarray]
    f16_src1: str = "convert"  # matmul.F16_SRC1
    cache: Cache = Cache()
    vocab_cols: np.ndarray | None = None  # the vocabulary entries result_output holds
    # a role's value after each of its nodes, from its weight MUL_MAT on, where it has more than one (attn_out with a
    # bias; the logits: bias, logit scale, soft-cap); the last is tensors[(layer, role)]
    steps: Mapping[tuple[int | None, str], tuple[np.ndarray, ...]] = field(default_factory=dict)
    fa: flash.Plan | None = None  # the flash-attention kernel of each position (flash.py); None without
    # per layer held (None: the output), the divergence of the twin pass from this one (each weight MUL_MAT's output
    # moved by f32 summation noise): (chaos_max, chaos_row) (chaos.py); empty without the twin
    chaos: Mapping[int | None, tuple[float, float]] = field(default_factory=dict)
    # the live rms of each array the twin's divergence measured, keyed by chaos.where (the array held beside it)
    rms: Mapping[tuple, tuple[np.ndarray, float]] = field(default_factory=dict)

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

    def has(self, layer: int | None, role: str) -> bool:
        return (layer, role) in self.tensors

    def at_node(self, layer: int | None, role: str, position: int | None) -> tuple[np.ndarray, str]:
        """The role's value after its node at `position` after the weight MUL_MAT (dump/paths.py
        position_after_matmul), and what to say of it: a dump whose logger lost the tail may end on an earlier node of
        the role than its last (attn_out's MUL_MAT before the bias ADD)."""
        steps = self.steps.get((layer, role), ())
        if position is None or position >= len(steps) - 1:
            return self.get(layer, role), ""
        return steps[position], (f"{role} as of its node {position + 1} of {len(steps)}: the dump ends before the "
                                 "rest (llama.cpp's logger lost the tail)")


class _Pass:
    """One forward pass: the model, its arithmetic, and the nodes computed so far."""

    def __init__(self, model: Model, f16_src1: str, cache: Cache, fa: flash.Plan | None = None,
                 jitter: np.random.Generator | None = None, q_exact: np.ndarray | None = None,
                 weights: Shared | None = None, attention_only: bool = False):
        self.m, self.hp, self.fw, self.s1, self.cache = model, model.hparams, model.hparams.forward, f16_src1, cache
        self.weights = weights  # the weights dequantized once for this pass and its twin, None: for this pass only
        self.shared: Shared | None = None  # this layer's shared weights; none in layer 0 (f64 here, f32 in the twin)
        self.jitter = jitter  # the twin pass: each weight MUL_MAT's output moved by summation noise (chaos.py)
        self.q_exact = q_exact  # [T] queries whose kq took q as f32 (attention.py), None: none
        self.fa = fa  # the flash-attention kernel of each query position (flash.py), None without flash attention
        self.out: dict[tuple[int | None, str], np.ndarray] = {}
        self.steps: dict[tuple[int | None, str], tuple[np.ndarray, ...]] = {}  # Reference.steps
        self.exact = True  # f64 sums in layer 0 (held to print precision), f32 in deeper layers
        self.cols: np.ndarray | None = None  # the vocabulary entries the logits are computed at
        self.attention_only = attention_only  # a layer ends with its attention's nodes (forward_layers')

    def linear(self, prefix: str, x: np.ndarray, key: tuple[int | None, str] | None = None,
               memo: dict | None = None) -> np.ndarray:
        """MUL_MAT with `prefix.weight`, then ADD `prefix.bias` when the model has one; with a key (layer, role), the
        value after the MUL_MAT is kept as role@mm when a bias follows, the result as role (chains.py). memo: x's
        conversions, kept for the projections that read the same x (matmul.converted)."""
        steps = self.linear_steps(prefix, x, memo)
        if key is not None:
            self.keep(key, steps)
        return steps[-1]

    def keep(self, key: tuple[int | None, str], steps, names: tuple[str, ...] = ("mm",)) -> None:
        """A role's values after each of its nodes: the last as the role, the earlier ones as role@name."""
        layer, role = key
        steps = tuple(steps)
        for name, v in zip(names, steps[:-1]):
            self.out[(layer, f"{role}@{name}")] = v
        self.out[(layer, role)] = steps[-1]

    def linear_steps(self, prefix: str, x: np.ndarray, memo: dict | None = None) -> tuple[np.ndarray, ...]:
        """linear's value after the MUL_MAT, and after the bias ADD when the model has one."""
        y = weight_matmul(self.m, prefix + ".weight", x, self.s1, self.exact, memo, self.shared)
        if self.jitter is not None:
            y = chaos.jitter(y, x.shape[-1], self.jitter)
        if self.m.has(prefix + ".bias"):
            return y, (y + self.m.tensor(prefix + ".bias")).astype(F32)
        return (y,)

    def norm(self, prefix: str, x: np.ndarray, rms: bool | None = None,
             key: tuple[int | None, str] | None = None) -> np.ndarray:
        """build_norm over the last axis: NORM or RMS_NORM (Forward.norm), MUL by the weight, ADD the bias; with a
        key (layer, role), each node's value is kept (role@norm, role@mul, role)."""
        rms = self.fw.norm == "rms" if rms is None else rms
        steps = [blocks.rms_norm(x, self.hp.norm_eps) if rms else blocks.layer_norm(x, self.hp.norm_eps)]
        steps.append((steps[-1] * self.m.tensor(prefix + ".weight")).astype(F32))
        if self.m.has(prefix + ".bias"):
            steps.append((steps[-1] + self.m.tensor(prefix + ".bias")).astype(F32))
        if key is not None:
            self.keep(key, steps, ("norm", "mul"))
        return steps[-1]

    def residual(self, branch: np.ndarray) -> np.ndarray:
        """A branch output as added to the residual: granite scales it (residual_scale)."""
        return blocks.scale(branch, self.hp.residual_scale) if self.hp.residual_scale else branch

    def qkv(self, p: str, x: np.ndarray, il: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Q [T, H, D], K and V [T, H_kv, D]: three projections, or one fused [Q | K | V]; each kept before its
        bias (Qcur@mm) and as it enters RoPE (Qcur@proj), per head."""
        hp, t = self.hp, x.shape[0]
        d, d_kv = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim
        heads = {"Qcur": hp.n_head, "Kcur": hp.n_head_kv, "Vcur": hp.n_head_kv}
        if self.m.has(p + "attn_qkv.weight"):
            qkv = self.linear(p + "attn_qkv", x, (il, "qkv"))
            parts = {"Qcur": (qkv[:, :d],), "Kcur": (qkv[:, d:d + d_kv],), "Vcur": (qkv[:, d + d_kv:],)}
        else:
            memo: dict = {}  # x converted once for the three
            parts = {r: self.linear_steps(p + w, x, memo) for r, w in (("Qcur", "attn_q"), ("Kcur", "attn_k"),
                                                                       ("Vcur", "attn_v"))}
        for role, steps in parts.items():
            shaped = [np.ascontiguousarray(s).reshape(t, heads[role], -1) for s in steps]
            if len(shaped) > 1:
                self.out[(il, f"{role}@mm")] = shaped[0]
            self.out[(il, f"{role}@proj")] = shaped[-1]
        return tuple(self.out[(il, f"{r}@proj")] for r in ("Qcur", "Kcur", "Vcur"))  # type: ignore[return-value]

    def positions(self, il: int, q: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """q/k norms (qwen3, gemma3: RMS_NORM per head, MUL by attn_q_norm/attn_k_norm), then RoPE."""
        p = f"blk.{il}."
        if self.fw.qk_norm:
            q = self.norm(p + "attn_q_norm", q, rms=True, key=(il, "Qcur@normw"))
            k = self.norm(p + "attn_k_norm", k, rms=True, key=(il, "Kcur@normw"))
            for role in ("Qcur", "Kcur"):  # chains.py's names: RMS_NORM's value, then the weight's
                self.out[(il, f"{role}@norm")] = self.out.pop((il, f"{role}@normw@norm"))
        if not self.fw.positions.startswith("rope"):
            return q, k
        pos, neox = np.arange(q.shape[0]), self.fw.positions == "rope_neox"
        n_dims, base, freq_scale, factors = rope_setting(self.m, self.hp, il)
        r = lambda a: blocks.rope(a, pos, n_dims, base, freq_scale, neox, factors)  # noqa: E731
        return r(q), r(k)

    def ffn(self, p: str, x: np.ndarray) -> np.ndarray:
        """build_ffn of the family: gelu (up, GELU, down), swiglu/geglu (gate and up in parallel), swiglu_fused (one
        up projection holding [gate | up], phi3)."""
        kind = self.fw.ffn
        il = int(p.split(".")[1])
        memo: dict = {}  # x converted once for up and gate
        up = self.linear(p + "ffn_up", x, (il, "ffn_up"), memo=memo)
        if kind == "gelu":
            act = blocks.gelu(up)
        elif kind == "swiglu_fused":
            half = up.shape[-1] // 2
            act = blocks.swiglu(up[:, :half], up[:, half:])
        else:
            gate = self.linear(p + "ffn_gate", x, (il, "ffn_gate"), memo=memo)
            self.out[(il, "ffn_gate_act")] = blocks.gelu(gate) if kind == "geglu" else blocks.silu(gate)
            act = blocks.geglu(gate, up) if kind == "geglu" else blocks.swiglu(gate, up)
        self.out[(il, "ffn_act")] = act
        return self.linear(p + "ffn_down", act, (il, "ffn_out"))

    def layer(self, il: int, x: np.ndarray) -> np.ndarray:
        """One block; x [T, D] is the residual stream entering it; returns l_out."""
        p, fw, out = f"blk.{il}.", self.fw, self.out
        self.exact = il == 0 and self.jitter is None  # the twin needs no f64 sums: its noise is larger
        self.shared = self.weights if il > 0 else None
        cur = self.norm(p + "attn_norm", x, key=(il, "attn_norm"))
        src = self.norm(p + "attn_norm_2", x) if self.m.has(p + "attn_norm_2.weight") else cur
        q, k, v = self.qkv(p, src, il)
        q, k = self.positions(il, q, k)
        out[(il, "Qcur")], out[(il, "Kcur")], out[(il, "Vcur")] = q, k, v
        att = attention(q, k, v, self.hp, il, self.cache, self.s1, exact=self.exact, q_exact=self.q_exact)
        for role, arr in att.items():
            out[(il, role)] = arr
        if self.attention_only:
            return x
        if self.fa is not None:  # the output projection reads FLASH_ATTN_EXT's output as its kernel computed it
            out[(il, "kqv_unrot")] = flash.output(att, self.hp, il, self.cache, self.fa, self.exact)
        steps = self.linear_steps(p + "attn_output", out[(il, "kqv_unrot")])
        self.keep((il, "attn_out"), steps)
        attn_out = steps[-1]
        if len(steps) > 1:  # a dump whose logger lost the tail after the last attention may end between the two
            self.steps[(il, "attn_out")] = steps
        post = self.norm(p + "post_attention_norm", attn_out, key=(il, "attn_post")) if fw.post_norms else \
            self.residual(attn_out)
        out[(il, "attn_post")] = post
        if fw.parallel:  # falcon: the FFN reads attn_norm; l_out = (ffn_out + attn_out) + x
            ffn = self.ffn(p, cur)
            out[(il, "attn_ffn")] = (ffn + attn_out).astype(F32)
            y = (out[(il, "attn_ffn")] + x).astype(F32)
        else:
            ffn_inp = (post + x).astype(F32)
            out[(il, "ffn_inp")] = ffn_inp
            h = self.norm(p + "ffn_norm", ffn_inp, key=(il, "ffn_norm"))
            ffn = self.ffn(p, h)
            fpost = self.norm(p + "post_ffw_norm", ffn, key=(il, "ffn_post")) if fw.post_norms else self.residual(ffn)
            out[(il, "ffn_post")] = fpost
            y = (fpost + ffn_inp).astype(F32)
        out[(il, "l_out")] = y
        return y

    def logits(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """result_output at the vocabulary entries a dump prints ([T, K], the K entries); its value after each node
        of the output (the projection, its bias ADD, the logit SCALE, the soft-cap's SCALE, TANH and SCALE, those the
        model has) goes to steps."""
        hp = self.hp
        cols = printed_indices(hp.n_vocab)
        head = "output.weight" if self.m.has("output.weight") else "token_embd.weight"
        steps = [weight_rows(self.m, head, x, cols, self.s1)]
        if self.m.has("output.bias"):
            steps.append((steps[-1] + self.m.tensor("output.bias")[cols]).astype(F32))
        if hp.logit_scale:
            steps.append(blocks.scale(steps[-1], float(F32(1) / F32(hp.logit_scale))))
        if hp.final_softcap:  # blocks.softcap, node by node
            steps.append(blocks.scale(steps[-1], float(F32(1) / F32(hp.final_softcap))))
            steps.append(np.tanh(steps[-1]).astype(F32))
            steps.append(blocks.scale(steps[-1], hp.final_softcap))
        self.steps[(None, "result_output")] = tuple(steps)
        return steps[-1], cols


def rope_setting(model: Model, hp: Hparams, il: int) -> tuple[int, float, float, np.ndarray | None]:
    """(n_dims, base, freq_scale, freq factors) of layer il's ROPE: what the reference rotates by, and what layer 0's
    bound on the angles (layer0.py) reads, from one place."""
    factors = model.tensor("rope_freqs.weight") if model.has("rope_freqs.weight") else None
    return hp.rope_dim, hp.rope_base(il), hp.rope_freq_scale, factors


def _start(model: Model, tokens: Sequence[int], kv_type: str, v_type: str | None, f16_src1: str):
    v_type = v_type or kv_type
    for kind in (kv_type, v_type):
        if kind not in KV_TYPES:
            raise ValueError(f"the KV cache type must be one of {', '.join(KV_TYPES)}, not {kind!r}")
    if f16_src1 not in F16_SRC1:
        raise ValueError(f"f16_src1 must be one of {', '.join(F16_SRC1)}, not {f16_src1!r}")
    hp = model.hparams
    for kind in {kv_type, v_type} - {"f32", "f16", "bf16"}:
        if hp.head_dim % 32:  # each quantized cache type stores blocks of 32 values
            raise ValueError(f"a {kind} KV cache stores blocks of 32 values and head_dim {hp.head_dim} is not a "
                             "multiple of 32: llama.cpp's k·q and P·V then read blocks across heads, which the "
                             "reference does not reproduce (an f16, bf16 or f32 cache does not have this)")
    toks = [int(x) for x in tokens]
    if not toks:
        raise ValueError("forward needs at least one token")
    if max(toks) >= hp.n_vocab or min(toks) < 0:
        raise ValueError(f"token id out of range for a vocabulary of {hp.n_vocab}")
    if hp.forward.positions == "learned" and len(toks) > hp.n_ctx_train:
        raise ValueError(f"{len(toks)} tokens exceed the {hp.n_ctx_train} learned positions")
    return toks, v_type


def forward_layers(model: Model, tokens: Sequence[int], *, kv_type: str = "f16", v_type: str | None = None,
                   f16_src1: str = "convert", rotates: bool = True, fa: flash.Plan | None = None,
                   twin: bool = False, q_exact: np.ndarray | None = None, attention_only: bool = False
                   ) -> Iterator[Reference]:
    """The forward pass one layer at a time, for memory that does not grow with depth: a Reference per layer holding
    that layer's nodes (the first also inp_embd, each the l_out of the layer before it: a norm's input), then one
    holding result_norm and result_output (and the last l_out). Each is dropped by the pass once yielded. twin: run
    the twin pass beside it and measure its divergence (Reference.chaos; chaos.py); q_exact [n_tokens]: the queries
    whose kq took q as f32 (attention.py); attention_only: layer 0 alone, up to its attention's nodes (what runs.py
    weighs an arithmetic on), and nothing after it.

    Past layer 1, both passes compute layer il + 1 while the caller's thread measures the twin's divergence over
    layer il (each twin node dropped once measured) and checks it: two layers held at a time, but not beside layer
    0, whose checks hold its [H, T, T] error terms. The twin has a thread of its own: numpy lets go of the GIL.
    """
    toks, v_type = _start(model, tokens, kv_type, v_type, f16_src1)
    hp = model.hparams
    t = len(toks)
    cache = Cache.of(kv_type, v_type, hp.head_dim, hp.head_dim, rotates)
    if fa is not None and len(fa.kernels) != t:
        raise ValueError(f"the flash-attention plan covers {len(fa.kernels)} positions, the prompt {t}")
    weights = Shared(model, 2) if twin else None
    run = _Pass(model, f16_src1, cache, fa, q_exact=q_exact, weights=weights, attention_only=attention_only)
    rng = np.random.default_rng(chaos.TWIN_SEED)
    other = _Pass(model, f16_src1, cache, fa, rng, q_exact, weights) if twin else None
    last = hp.n_layer - 1

    def part() -> tuple[Reference, dict | None]:
        """The nodes computed since the last part, and the twin's."""
        ref = Reference(hparams=hp, tokens=tuple(toks), kv_type=kv_type, tensors=run.out, f16_src1=f16_src1,
                        cache=cache, vocab_cols=run.cols, steps=run.steps, fa=fa)
        twins = other.out if other is not None else None
        run.out, run.steps = {}, {}
        if other is not None:
            other.out, other.steps = {}, {}
        return ref, twins

    def step(il: int, x: np.ndarray, xt: np.ndarray, twin_thread: ThreadPoolExecutor):
        """Layer il of both passes (il = n_layer: the output) from the l_out before each: (x, xt, (the Reference of
        the layer, the twin's nodes of it))."""
        if il > 0:  # the next layer's norm input (and result_norm's)
            run.out[(il - 1, "l_out")] = x
            if other is not None:
                other.out[(il - 1, "l_out")] = xt
        if il == hp.n_layer:
            cur = run.norm("output_norm", x, key=(None, "result_norm"))
            run.out[(None, "result_output")], run.cols = run.logits(cur)
            if other is not None:
                xt = other.norm("output_norm", xt, key=(None, "result_norm"))
                other.out[(None, "result_output")], _ = other.logits(xt)
            return x, xt, part()
        twin_layer = twin_thread.submit(other.layer, il, xt) if other is not None else None
        x = run.layer(il, x)
        if twin_layer is not None:
            xt = twin_layer.result()
        if weights is not None:
            weights.clear()
        return x, xt, part()

    steps = [model.rows("token_embd.weight", toks)]  # GET_ROWS dequantizes exactly
    if hp.forward.positions == "learned":
        run.out[(None, "inp_pos")] = model.rows("position_embd.weight", np.arange(t))
        steps.append((steps[-1] + run.out[(None, "inp_pos")]).astype(F32))
    if hp.embd_scale:
        steps.append(blocks.scale(steps[-1], hp.embd_scale))
    run.keep((None, "inp_embd"), steps, ("tok", "pos"))
    x = xt = steps[-1]
    with ThreadPoolExecutor(1) as ahead, ThreadPoolExecutor(1) as twin_thread:
        coming = None
        for il in range(hp.n_layer + 1):
            x, xt, (ref, twins) = coming.result() if coming is not None else step(il, x, xt, twin_thread)
            coming = ahead.submit(step, il + 1, x, xt, twin_thread) if 0 < il < hp.n_layer else None
            if twins is not None:  # measured here, on the caller's thread, while the next layer is computed
                layer = il if il < hp.n_layer else None
                rms: dict = {}
                ref = replace(ref, chaos={layer: divergence(ref.tensors, twins, layer, last, rms)}, rms=rms)
                del twins
            yield ref
            del ref
            if attention_only:
                return


def forward(model: Model, tokens: Sequence[int], *, kv_type: str = "f16", v_type: str | None = None,
            f16_src1: str = "convert", rotates: bool = True, fa: flash.Plan | None = None,
            twin: bool = False, q_exact: np.ndarray | None = None) -> Reference:
    """Evaluate the whole prompt at once (causal), returning every node the mapping compares, per layer.

    kv_type is the K cache's type (and V's, unless v_type is given): f16, bf16, f32, q8_0, q4_0, q4_1, q5_0, q5_1,
    iq4_nl."""
    tensors: dict = {}
    steps: dict = {}
    by_layer: dict = {}
    rms: dict = {}
    ref = None
    for ref in forward_layers(model, tokens, kv_type=kv_type, v_type=v_type, f16_src1=f16_src1, rotates=rotates,
                              fa=fa, twin=twin, q_exact=q_exact):
        tensors.update(ref.tensors)
        steps.update(ref.steps)
        by_layer.update(ref.chaos)
        rms.update(ref.rms)
    assert ref is not None
    return Reference(hparams=ref.hparams, tokens=ref.tokens, kv_type=kv_type, tensors=tensors, f16_src1=f16_src1,
                     cache=ref.cache, vocab_cols=ref.vocab_cols, steps=steps, fa=fa, chaos=by_layer, rms=rms)
