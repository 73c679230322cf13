"""A model's header → its attention facts, as llama.cpp's load_arch_hparams and graph builder derive them.

The header is the GGUF metadata (a GGUF file, or the `llama_model_loader: - kv` lines a 2024 log prints), read
through the architecture table (table.py). Sinks are a tensor, not a key: they come from the file only.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable, Mapping

import numpy as np

from ..errors import ModelError
from .facts import MODEL, AttentionFacts, Fact, Window
from .table import GENERIC, lookup


def facts_from_header(meta: Mapping[str, Any], origin: str = MODEL,
                      tensor: Callable[[str], np.ndarray | None] | None = None, *,
                      era_2024: bool = False) -> AttentionFacts:
    """The facts a header fixes; what it cannot tell stays at DEFAULT (open to the dump's hypotheses).

    meta: GGUF key → value; tensor(name): a small tensor's values, or None when absent (sinks); era_2024: as a build
    from before SET_ROWS read it (a 2024 log: its loader printed the keys), which applied some windows today's
    ignore (Attention.swa_2024)."""
    arch = meta.get("general.architecture")
    entry = lookup(arch)
    a = entry.attention if entry is not None else GENERIC
    key = lambda k, default=None: meta.get(f"{arch}.{k}", default)  # noqa: E731
    name = arch if entry is not None else f"{arch} (not in attncheck's table: generic rules)"
    facts = AttentionFacts(arch=arch)
    notes: list[str] = []
    n_layer = int(key("block_count", 0) or 0)
    n_head = _first(key("attention.head_count", 0))
    n_embd = int(key("embedding_length", 0) or 0)
    head_dim = int(key("attention.key_length", 0) or (n_embd // n_head if n_head else 0))

    if entry is None:
        notes.append(f"architecture {arch!r} is not in attncheck's table: the SOFT_MAX scale, window, ALiBi and sinks "
                     "are left to the dump's hypotheses")
    else:
        scale = _scale(a, key, head_dim, notes)
        if scale is not None:
            facts = facts.with_(kq_scale=Fact(scale[0], origin, f"{name}: {scale[1]}"))
        qs = q_scale(a, head_dim, n_embd, n_head, n_layer)
        if qs is not None:
            facts = facts.with_(q_scale=Fact(qs, origin, f"{name}: q is scaled by {qs:.6g} before kq"))
        if a.alibi_max_bias is not None:
            facts = facts.with_(alibi_max_bias=Fact(a.alibi_max_bias, origin, f"{name}: fixed in llama.cpp"))
        elif a.alibi_key:
            mb = float(key("attention.max_alibi_bias", 0.0) or 0.0)
            facts = facts.with_(alibi_max_bias=Fact(mb, origin, f"{name}: attention.max_alibi_bias"))
        else:
            facts = facts.with_(alibi_max_bias=Fact(0.0, origin, f"{name}: no ALiBi"))
        if a.softcap_default is not None:
            cap = float(key("attn_logit_softcapping", a.softcap_default))
            facts = facts.with_(softcap=Fact(cap, origin, f"{name}: attn_logit_softcapping"))
        facts = facts.with_(window=_window(a, key, n_layer, origin, name, era_2024))
        if a.sinks and tensor is not None:
            sinks = {il: s for il in range(n_layer) if (s := tensor(f"blk.{il}.attn_sinks.weight")) is not None}
            facts = facts.with_(sinks=Fact(sinks or None, origin, f"{name}: blk.L.attn_sinks.weight"))
        elif a.sinks:
            notes.append("attention sinks are a tensor of the model file: the log's header does not hold them")
        else:
            facts = facts.with_(sinks=Fact(None, origin, f"{name}: no sinks"))
        if a.recurrent is not None:
            facts = facts.with_(recurrent=Fact(_recurrent(a, key, n_layer), origin, f"{name}: layers without "
                                                                                     "softmax attention"))
    if a.causal is not None:
        facts = facts.with_(causal=Fact(a.causal, origin, f"{name}: an encoder"))
    else:
        causal = key("attention.causal")
        facts = facts.with_(causal=Fact(True if causal is None else bool(causal), origin,
                                        f"{name}: attention.causal" + (" (absent: true)" if causal is None else "")))
    return facts.with_(notes=tuple(notes))


REQUIRED = ("block_count", "embedding_length", "attention.head_count")  # llama.cpp refuses a model without them


def require_shape(meta: Mapping[str, Any], path: str) -> tuple[int, list[int]]:
    """(n_layer, heads per layer) of a header; ModelError naming the first key llama.cpp would need and not find."""
    arch = meta.get("general.architecture")
    if arch is None:
        raise ModelError(path, "missing metadata key general.architecture (not a llama.cpp model?)")
    for k in REQUIRED:
        if meta.get(f"{arch}.{k}") is None:
            raise ModelError(path, f"missing metadata key {arch}.{k} (llama.cpp cannot load such a model)")
    n_layer = int(meta[f"{arch}.block_count"])
    heads = meta[f"{arch}.attention.head_count"]
    per_layer = [int(h) for h in heads] if isinstance(heads, (list, tuple, np.ndarray)) else [int(heads)] * n_layer
    return n_layer, per_layer


def _first(v: Any) -> int:
    """A per-layer array's first value, or the scalar."""
    if isinstance(v, (list, tuple, np.ndarray)):
        return int(v[0]) if len(v) else 0
    return int(v or 0)


def _f32(x: float) -> float:
    """llama.cpp computes the scales in f32."""
    return float(np.float32(x))


@lru_cache(maxsize=1024)
def inv_sqrt(n: int) -> float:
    """llama.cpp's 1.0f/sqrtf(float(n)): one f32 rounding after sqrtf and one after the division, which is an ulp
    from 1/sqrt(n) rounded once for 958 of the n up to 4096 (96, phi3's head size, among them)."""
    return float(np.float32(1) / np.sqrt(np.float32(n)))


def _head_dim_scale(key, head_dim: int, notes: list[str]):
    return (inv_sqrt(head_dim), f"1/sqrt(key_length {head_dim})") if head_dim else None


def _attention_scale(key, head_dim: int, notes: list[str]):
    s = float(key("attention.scale", 0.0) or 0.0)
    return (_f32(s), "attention.scale") if s else (inv_sqrt(head_dim), "1/sqrt(key_length)")


def _rope_dim_scale(key, head_dim: int, notes: list[str]):
    n_rot = int(key("rope.dimension_count", head_dim) or head_dim)
    return inv_sqrt(n_rot), f"1/sqrt(rope.dimension_count {n_rot})"


def _mla_scale(key, head_dim: int, notes: list[str]):
    k_mla = int(key("attention.key_length_mla", 0) or head_dim)
    if str(key("rope.scaling.type", "none")) == "yarn" and float(key("rope.scaling.factor", 1.0) or 1.0) > 1:
        notes.append("YaRN's mscale enters deepseek2's SOFT_MAX scale: left to the dump's hypotheses")
        return None
    return inv_sqrt(k_mla), f"1/sqrt(key_length_mla {k_mla})"


# Attention.scale's words (table.py's Scale) → (SOFT_MAX scale, how it was derived), or None when the header cannot
# tell it
SCALES = {
    "head_dim": _head_dim_scale,
    "attention.scale": _attention_scale,
    "rope_dim": _rope_dim_scale,
    "one": lambda key, head_dim, notes: (1.0, "no scaling"),
    "q_prescaled": lambda key, head_dim, notes: (1.0, "q is pre-scaled before kq; SOFT_MAX's scale is 1"),
    "mla": _mla_scale,
}


def _scale(a, key, head_dim: int, notes: list[str]):
    """(SOFT_MAX scale, how it was derived), None when the header cannot tell it."""
    return SCALES[a.scale](key, head_dim, notes)


# Attention.q_scale's words (table.py's QScale) → the head size q is scaled by 1/sqrt of
Q_SCALE_DIMS = {
    "head_dim": lambda a, head_dim, n_embd, n_head, n_layer: head_dim,
    "gemma_27b": lambda a, head_dim, n_embd, n_head, n_layer:
        n_embd // n_head if n_layer == a.gemma_27b_layers and n_head else head_dim,
}


def q_scale(a, head_dim: int, n_embd: int, n_head: int, n_layer: int) -> float | None:
    """The factor a q_prescaled architecture scales q by before kq."""
    if a.q_scale is None:
        return None
    return inv_sqrt(Q_SCALE_DIMS[a.q_scale](a, head_dim, n_embd, n_head, n_layer))


def _window(a, key, n_layer: int, origin: str, name: str, era_2024: bool = False) -> Fact:
    """The sliding window and its layers (llama_model_base::load_swa_pattern, llama_hparams::set_swa_pattern); in a
    2024 build's, attention.sliding_window on every layer where the table says so (phi3)."""
    if a.swa_2024 and era_2024 and key("attention.sliding_window"):
        n = int(key("attention.sliding_window"))
        return Fact(Window(n, "standard", frozenset(range(n_layer))), origin,
                    f"{name}: attention.sliding_window {n} on every layer (a 2024 build's)")
    if a.swa is None:
        return Fact(None, origin, f"{name}: no sliding window")
    n = key("attention.sliding_window")
    if n is None:
        n = a.swa_default
    if not n:
        return Fact(None, origin, f"{name}: no attention.sliding_window")
    pattern = key("attention.sliding_window_pattern")
    if isinstance(pattern, (list, tuple, np.ndarray)):
        layers = frozenset(i for i, on in enumerate(pattern) if on)
        how = "attention.sliding_window_pattern (per layer)"
    else:
        p = int(pattern) if pattern is not None else a.swa_pattern
        if a.swa_dense_first:
            layers = frozenset(il for il in range(n_layer) if p == 0 or il % p != 0)
        else:
            layers = frozenset(il for il in range(n_layer) if p == 0 or il % p < p - 1)
        how = f"pattern {p}"
    return Fact(Window(int(n), a.swa, layers), origin, f"{name}: attention.sliding_window {int(n)}, {how}")


def _recurrent(a, key, n_layer: int) -> frozenset[int]:
    """Layers without softmax attention, by the rule of Attention.recurrent."""
    return RECURRENT[a.recurrent](key, n_layer)


def _qwen35_recurrent(key, n_layer: int) -> frozenset[int]:
    """qwen35: attention.recurrent_layers, else every layer but each full_attention_interval-th."""
    arr = key("attention.recurrent_layers")
    if isinstance(arr, (list, tuple, np.ndarray)):
        return frozenset(i for i, on in enumerate(arr) if on)
    interval = int(key("full_attention_interval", 4) or 4)
    return frozenset(i for i in range(n_layer) if (i + 1) % interval != 0)


# Attention.recurrent's words (table.py's Recurrent) → the layers without softmax attention
RECURRENT = {"qwen35": _qwen35_recurrent}
