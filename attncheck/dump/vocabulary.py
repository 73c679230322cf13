"""The role vocabulary: every name attncheck gives a value of llama.cpp's graph, with its axes and one-line meaning.

One table, in the spirit of TransformerLens's hook points. roles.py assigns the `role` names to a dump's nodes (by op
and sources, never by node names); the reference forward pass of `--model` keeps its values under the same names
(model/reference.py), and the values inside a role under its `inner` names (model/chains.py: `role@step` for the
steps before the role's own node); `diff` lines dumps up and the renderers label rows by them.

Axes are the reference's array for the name, in numpy order (TransformerLens's `[T, H, D_h]`): `query` (a position
of the run), `head`, `kvhead`, `dim` (within a head), `slot` (a KV cache slot: one per position), and ROWS
`[1, T, width]` for the residual-stream width and the FFN's. A role that only holds another's values (a store holds
the cache kq reads, kqv_out the heads of kqv merged) names it in `holds` and has its axes.
"""
from __future__ import annotations

from typing import Literal, NamedTuple

ROWS = ("one", "row", "col")  # [1, T, width]: one row per query, the heads (if any) merged into columns
HEADS = ("query", "head", "dim")  # [T, H, D_h]
KV_HEADS = ("query", "kvhead", "dim")  # [T, H_kv, D_h]
SCORES = ("head", "query", "slot")  # [H, T, n_kv]


class Term(NamedTuple):
    """One name of the vocabulary: what it is, its reference axes, and whose values it holds when not its own."""

    name: str
    axes: tuple[str, str, str]
    meaning: str
    kind: Literal["role", "inner"] = "role"  # role: a node roles.py assigns; inner: a value inside a role
    holds: str | None = None


TERMS = (  # roles in graph order within a layer (roles.py and diff list them so); inner values after
    Term("inp_embd", ROWS, "the residual stream entering layer 0 (token and position embeddings)"),
    Term("attn_norm", ROWS, "the normalised input of the Q/K/V projections"),
    Term("Qcur", HEADS, "queries before the views (after RoPE where present)"),
    Term("Kcur", KV_HEADS, "keys before the views, as stored (after RoPE where present)"),
    Term("Vcur", KV_HEADS, "values before the views, as stored"),
    Term("q_scaled", HEADS, "q pre-scaled before kq (a SCALE node: gemma, phi3)"),
    Term("q_rot", HEADS, "q rotated by the Hadamard matrix of a quantized K cache", holds="q"),
    Term("k_rot", KV_HEADS, "K rotated by the Hadamard matrix of a quantized K cache, before the cache"),
    Term("v_rot", KV_HEADS, "V rotated by the Hadamard matrix of a quantized V cache, before the cache"),
    Term("k_store", ("kvhead", "slot", "dim"), "the node writing K into the cache (SET_ROWS today, CPY in 2024)",
         holds="k_view"),
    Term("v_store", ("kvhead", "dim", "slot"), "the node writing V into the cache", holds="v_view"),
    Term("q", HEADS, "kq's src1: queries {D_h, T, H}"),
    Term("k_view", ("kvhead", "slot", "dim"), "kq's src0: K cache view {D_h, n_kv, H_kv}; the cache as stored"),
    Term("v_view", ("kvhead", "dim", "slot"), "kqv's src0: V cache view {n_kv, D_h, H_kv}; the cache as stored "
                                              "(transposed without flash attention)"),
    Term("kq", SCORES, "MUL_MAT(k, q): raw scores {n_kv, T, H}"),
    Term("kq_scores", SCORES, "what SOFT_MAX reads when it is not kq itself (kq_scaled, soft-capping)"),
    Term("kq_soft_max", SCORES, "SOFT_MAX: weights {n_kv, T, H}"),
    Term("kqv", ("head", "query", "dim"), "MUL_MAT(v, kq_soft_max): per-head outputs {D_h, T, H}"),
    Term("flash_attn", ("head", "query", "dim"), "FLASH_ATTN_EXT(q, k): per-head outputs {D_h, H, T}", holds="kqv"),
    Term("kqv_out", ("head", "query", "dim"), "the heads merged (the CONT/RESHAPE after kqv)", holds="kqv"),
    Term("kqv_unrot", ROWS, "kqv_out rotated back (a quantized V cache's Hadamard matrix), the output projection's "
                            "input"),
    Term("attn_out", ROWS, "the output projection of kqv_out (plus its bias when present)"),
    Term("attn_post", ROWS, "attn_out after its post-norm (gemma) or residual scale (granite), as added to the "
                            "residual"),
    Term("attn_ffn", ROWS, "attention and FFN outputs added, before the residual (parallel blocks: falcon)"),
    Term("ffn_inp", ROWS, "residual + attn_out"),
    Term("ffn_norm", ROWS, "the normalised input of the FFN"),
    Term("ffn_out", ROWS, "the FFN's output, added to ffn_inp"),
    Term("ffn_post", ROWS, "ffn_out after its post-norm (gemma) or residual scale (granite), as added to the residual"),
    Term("l_out", ROWS, "the layer's output: ffn_inp + ffn_out"),
    Term("result_norm", ROWS, "the final norm"),
    Term("result_output", ROWS, "the logits"),
    Term("inp_pos", ROWS, "learned position embeddings, added to the token embeddings (gpt2)", "inner"),
    Term("qkv", ROWS, "the fused Q/K/V projection, before its views split it", "inner"),
    Term("ffn_gate", ROWS, "the FFN's gate projection", "inner"),
    Term("ffn_up", ROWS, "the FFN's up projection", "inner"),
    Term("ffn_gate_act", ROWS, "the activation of the gate alone (2024 builds: MUL(SILU(gate), up))", "inner"),
    Term("ffn_act", ROWS, "the FFN's activation, ffn_down's input (SWIGLU, GEGLU, GELU)", "inner"),
)
VOCABULARY = {t.name: t for t in TERMS}
ROLES = {t.name: t.meaning for t in TERMS if t.kind == "role"}  # the names roles.py assigns, in graph order


def value_of(name: str) -> str:
    """The name whose reference value a node of this role shows (itself unless it `holds` another's)."""
    return VOCABULARY[name].holds or name


def axes(name: str) -> tuple[str, str, str]:
    """The reference's axes for a name (ROWS for a row role)."""
    return VOCABULARY[name].axes


def per_kv_head(name: str) -> bool:
    """Its values belong to a KV head (K, V and the cache), not to a query head."""
    return "kvhead" in VOCABULARY[name].axes
