"""The architecture table: per llama.cpp architecture (GGUF `general.architecture`), what its graph does.

`Forward` says how the reference forward pass (model/reference.py) computes a family: norm kind, where positions
come from, the FFN. An architecture without one is run by llama.cpp but not recomputed by attncheck.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Forward:
    """How a family's layer is computed (llama.cpp's build_* of src/models/<arch>.cpp)."""

    norm: str  # "layer": NORM (mean and variance), "rms": RMS_NORM
    norm_eps_key: str  # the GGUF key (after "<arch>.") holding the norm's epsilon
    positions: str  # "learned": position_embd added to the embeddings; "rope_norm": ROPE mode 0 on q and k
    ffn: str  # "gelu": up, GELU, down; "swiglu": silu(gate)·up, down


@dataclass(frozen=True)
class Arch:
    name: str  # llama.cpp's architecture name, as GGUF's general.architecture writes it
    about: str
    forward: Forward | None = None  # None: attncheck has no reference forward pass for it


ARCHS: dict[str, Arch] = {a.name: a for a in (
    Arch("gpt2", "GPT-2: LayerNorm, learned positions, fused QKV, GELU FFN",
         Forward(norm="layer", norm_eps_key="attention.layer_norm_epsilon", positions="learned", ffn="gelu")),
    Arch("llama", "Llama (SmolLM2, Mistral-style): RMSNorm, RoPE (mode 0), SwiGLU FFN, GQA",
         Forward(norm="rms", norm_eps_key="attention.layer_norm_rms_epsilon", positions="rope_norm", ffn="swiglu")),
)}


def lookup(name: str | None) -> Arch | None:
    """The table's entry for an architecture name, None when attncheck knows nothing of it."""
    return ARCHS.get(name or "")
