"""What the GGUF keys attncheck reads must hold, as llama.cpp's loader requires it: a model file from anywhere may
say `block_count` 2^40, `head_count` "twelve" or a NaN epsilon, and each such value is one error naming the file and
the key (ModelError, exit 2), found once when the header is read, never a crash or a run out of memory later.

The bounds are llama.cpp's: at most LLAMA_MAX_LAYERS = 512 layers (src/llama-hparams.h: per-layer arrays have that
many entries), counts and lengths held in uint32/int32 hparams, general.alignment a power of two and GGUF versions 2
and 3 (ggml/src/gguf.cpp).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from ..errors import printable

MAX_LAYERS = 512  # LLAMA_MAX_LAYERS
MAX_COUNT = 2**31 - 1  # int32 hparams (n_embd, n_head, n_ctx_train, ...)
VERSIONS = (2, 3)  # gguf.cpp: version 1 is no longer read, later ones are unknown to it


def _shown(key: str, value: Any) -> str:
    """`metadata key K = V` as an error message quotes it: short, one line (an array by its length)."""
    if _is_array(value):
        return f"metadata key {printable(key)}"
    text = repr(value) if isinstance(value, str) else str(value)
    return f"metadata key {printable(key)} = {printable(text if len(text) <= 40 else text[:37] + '...')}"


def _is_array(value: Any) -> bool:
    return isinstance(value, (list, tuple, np.ndarray)) or (isinstance(value, Sequence) and not isinstance(value, str))


def _int(value: Any) -> int | None:
    """The value as an int when it is one (a GGUF integer type; bool is not a count), else None."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        return None
    return int(value)


def count(lo: int, hi: int = MAX_COUNT) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        v = _int(value)
        if v is None:
            return "is not an integer"
        return "" if lo <= v <= hi else f"is out of range ({lo}..{hi})"
    return check


def finite(lo: float = -math.inf, positive: bool = False) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
            return "is not a number"
        v = float(value)
        if not math.isfinite(v):
            return "is not a finite number"
        if positive and v <= 0:
            return "must be greater than 0"
        return "" if v >= lo else f"must be {lo:g} or more"
    return check


def per_layer(scalar: Callable[[Any], str], item: Callable[[Any], str]) -> Callable[[Any], str]:
    """A scalar for every layer, or one value per layer (hybrid models: 0 heads in their recurrent layers)."""
    def check(value: Any) -> str:
        if not _is_array(value):
            return scalar(value)
        if not 1 <= len(value) <= MAX_LAYERS:
            return f"has {len(value)} values (1..{MAX_LAYERS}, one per layer)"
        for i, v in enumerate(value):
            why = item(v)
            if why:
                return f"holds {printable(repr(v))[:40]} at [{i}], which {why}"
        return ""
    return check


def flags(value: Any) -> str:
    if not _is_array(value) or len(value) > MAX_LAYERS:
        return f"is not {MAX_LAYERS} flags or fewer (one per layer)"
    return "" if all(_int(v) is not None or isinstance(v, (bool, np.bool_)) for v in value) else "holds a non-flag"


def text(value: Any) -> str:
    return "" if isinstance(value, str) else "is not a string"


def boolean(value: Any) -> str:
    return "" if isinstance(value, (bool, np.bool_)) or _int(value) in (0, 1) else "is not a boolean"


def power_of_two(value: Any) -> str:
    v = _int(value)
    return "" if v is not None and 0 < v <= MAX_COUNT and v & (v - 1) == 0 else "is not a power of 2"


_HEADS = per_layer(count(1), count(0))
# after "<arch>.": every key any part of attncheck reads (arch/header.py, model/hparams.py, arch/table.py's keys)
ARCH_KEYS: dict[str, Callable[[Any], str]] = {
    "block_count": count(1, MAX_LAYERS),
    "embedding_length": count(1),
    "context_length": count(1),
    "attention.head_count": _HEADS,
    "attention.head_count_kv": _HEADS,
    "attention.key_length": count(0),
    "attention.value_length": count(0),
    "attention.key_length_mla": count(0),
    "rope.dimension_count": count(0),
    "attention.sliding_window": per_layer(count(0), count(0)),
    "attention.sliding_window_pattern": per_layer(count(0), boolean),
    "attention.recurrent_layers": flags,
    "full_attention_interval": count(1),
    "attention.causal": boolean,
    "rope.scaling.type": text,
    "attention.layer_norm_epsilon": finite(0.0),
    "attention.layer_norm_rms_epsilon": finite(0.0),
    "rope.freq_base": finite(positive=True),
    "rope.freq_base_swa": finite(positive=True),
    "rope.scaling.factor": finite(0.0),
    "rope.scale_linear": finite(0.0),
    "attention.scale": finite(0.0),
    "attn_logit_softcapping": finite(0.0),
    "final_logit_softcapping": finite(0.0),
    "embedding_scale": finite(),
    "residual_scale": finite(),
    "logit_scale": finite(),
    "attention.max_alibi_bias": finite(0.0),
}
PER_LAYER = ("attention.head_count", "attention.head_count_kv", "attention.sliding_window")
GENERAL_KEYS: dict[str, Callable[[Any], str]] = {
    "general.architecture": text,
    "general.alignment": power_of_two,
    "tokenizer.ggml.model": text,
}


def bad_keys(meta: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """Every key attncheck reads that does not hold what llama.cpp requires: (key, what is wrong, in words)."""
    for key, check in GENERAL_KEYS.items():
        if key in meta and (why := check(meta[key])):
            yield key, f"{_shown(key, meta[key])} {why}"
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        return
    for suffix, check in ARCH_KEYS.items():
        key = f"{arch}.{suffix}"
        if key in meta and (why := check(meta[key])):
            yield key, f"{_shown(key, meta[key])} {why}"
    n_layer = meta.get(f"{arch}.block_count")
    for suffix in PER_LAYER:
        key, value = f"{arch}.{suffix}", meta.get(f"{arch}.{suffix}")
        if isinstance(n_layer, int) and _is_array(value) and len(value) != n_layer:  # llama.cpp: "wrong array length"
            yield key, f"metadata key {printable(key)} has {len(value)} values for {n_layer} layers"
    tokens = meta.get("tokenizer.ggml.tokens")
    if tokens is not None and (not _is_array(tokens) or (len(tokens) and not isinstance(tokens[0], str))):
        yield "tokenizer.ggml.tokens", "metadata key tokenizer.ggml.tokens is not an array of strings"


def bad_key(meta: Mapping[str, Any]) -> str:
    """'' when every key attncheck reads holds what llama.cpp requires, else what the first that does not holds."""
    return next((why for _, why in bad_keys(meta)), "")
