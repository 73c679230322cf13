"""Attention facts: what SOFT_MAX does to the scores of each layer, and where each fact came from.

llama.cpp's build_attn_mha computes P = softmax(kq · kq_scale + slope_h · mask) along the slots, with a sink logit
per head joining the denominator where the model has sinks (ggml_compute_forward_soft_max_f32). The mask holds 0 for
a visible slot and -inf for a masked one (-|p_q − p_k| for a visible one under ALiBi). Which slots are visible: the
causal rule, or every token of the sequence (encoders), narrowed by a sliding window on some layers
(llama_hparams::is_masked_swa). None of these is printed in today's dumps: they come from an option, the GGUF header
(arch/header.py), the 2024 log's GGUF keys, or hypotheses pinned by the printed data (check/hypotheses.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Generic, Literal, TypeVar, get_args

import numpy as np

T = TypeVar("T")

# where a fact came from
OPTION, MODEL, LOG, INFERRED, STRUCTURE, DEFAULT = "option", "model", "log", "inferred", "structure", "default"


@dataclass(frozen=True)
class Fact(Generic[T]):
    """A value and its provenance: origin (option, model, log, inferred, structure, default) and a line of detail
    ("granite: attention.scale", "q pre-scaled by node_7 (×0.1768)", "pinned by 120 rows")."""

    value: T
    origin: str
    detail: str = ""

    def to_dict(self) -> dict:
        v = self.value
        if isinstance(v, np.ndarray):
            v = [round(float(x), 6) for x in v]
        elif isinstance(v, frozenset):
            v = sorted(v)
        return {"value": v, "origin": self.origin, "detail": self.detail or None}


# the rules a sliding window masks by (llama_hparams::is_masked_swa)
WindowKind = Literal["standard", "symmetric", "chunked"]


@dataclass(frozen=True)
class Window:
    """A sliding window: n_swa and the rule that masks by it (standard: p_q − p_k >= n; symmetric: |p_q − p_k| >
    n/2; chunked: p_k before the query's chunk of n), on some layers."""

    n: int
    kind: WindowKind = "standard"
    layers: frozenset[int] = frozenset()
    n_range: tuple[int, int] | None = None  # inferred: every n_swa in [a, b] fits the printed data alike

    def __post_init__(self):
        if self.kind not in get_args(WindowKind):
            raise ValueError(f"window kind {self.kind!r}: not one of {', '.join(get_args(WindowKind))}")

    def masks(self, q_pos: np.ndarray, k_pos: np.ndarray) -> np.ndarray:
        """[t, j] True where the window masks slot position k_pos[j] for the query at q_pos[t]."""
        d = q_pos[:, None] - k_pos[None, :]
        if self.kind == "standard":
            return d >= self.n
        if self.kind == "symmetric":
            return np.abs(d) > self.n // 2
        if self.kind == "chunked":
            chunk_start = (q_pos // self.n) * self.n
            return k_pos[None, :] < chunk_start[:, None]
        raise ValueError(f"window kind {self.kind!r}")


def alibi_slopes(max_bias: float, n_head: int) -> np.ndarray:
    """ALiBi slope per head as ggml's SOFT_MAX computes it (f32): n2 = 2^floor(log2 H), m0 = 2^(-max_bias/n2),
    m1 = 2^(-max_bias/2/n2); slope_h = m0^(h+1) for h < n2, else m1^(2(h-n2)+1)."""
    n2 = 1 << int(np.floor(np.log2(n_head)))
    m0 = np.float32(2.0) ** np.float32(-max_bias / n2)
    m1 = np.float32(2.0) ** np.float32(-(max_bias / 2.0) / n2)
    h = np.arange(n_head)
    return np.where(h < n2, m0 ** (h + 1).astype(np.float32), m1 ** (2 * (h - n2) + 1).astype(np.float32)).astype(
        np.float64)


@dataclass(frozen=True)
class AttentionFacts:
    """The facts of one llama.cpp run (or what a model's header says), each with its provenance.

    kq_scale None: 1/sqrt(D_h) per site (llama.cpp's default), unless q is pre-scaled (structure) or a hypothesis
    pins another; alibi_max_bias 0: no ALiBi; sinks: {layer: [H] sink logits} (None: no sinks; {} with origin
    inferred: fitted per head from the data); window None: no sliding window; recurrent: layers without softmax
    attention (hybrid models).
    """

    kq_scale: Fact[float | None] = Fact(None, DEFAULT, "1/sqrt(D_h)")
    causal: Fact[bool] = Fact(True, DEFAULT)
    alibi_max_bias: Fact[float] = Fact(0.0, DEFAULT)
    sinks: Fact[dict | None] = Fact(None, DEFAULT)
    window: Fact[Window | None] = Fact(None, DEFAULT)
    softcap: Fact[float | None] = Fact(None, DEFAULT)
    q_scale: Fact[float | None] = Fact(None, DEFAULT)  # the factor q is scaled by before kq (gemma, phi3)
    recurrent: Fact[frozenset[int]] = Fact(frozenset(), DEFAULT)
    arch: str | None = None
    notes: tuple[str, ...] = field(default=())  # what a source could not tell (e.g. an architecture without a table entry)

    def with_(self, **kw) -> "AttentionFacts":
        return replace(self, **kw)

    def window_for(self, layer: int) -> Window | None:
        w = self.window.value
        return w if w is not None and layer in w.layers else None

    def sinks_for(self, layer: int) -> np.ndarray | None:
        s = self.sinks.value
        return None if s is None else s.get(layer)

    def to_dict(self) -> dict:
        w = self.window.value
        window = self.window.to_dict()
        if w is not None:
            window["value"] = {"n_swa": w.n, "kind": w.kind, "layers": sorted(w.layers)}
            if w.n_range is not None:
                window["value"]["n_swa_range"] = list(w.n_range)
        sinks = self.sinks.to_dict()
        if self.sinks.value is not None:
            # -inf: no sink in that head; NaN: its rows agreed on none (JSON has neither: null)
            sinks["value"] = {str(k): [round(float(x), 6) if np.isfinite(x) else None for x in v]
                              for k, v in sorted(self.sinks.value.items())}
        return {
            "arch": self.arch,
            "kq_scale": self.kq_scale.to_dict(),
            "causal": self.causal.to_dict(),
            "alibi_max_bias": self.alibi_max_bias.to_dict(),
            "sinks": sinks,
            "window": window,
            "softcap": self.softcap.to_dict(),
            "q_scale": self.q_scale.to_dict(),
            "recurrent_layers": self.recurrent.to_dict(),
            "notes": list(self.notes),
        }


def scale_words(s) -> str:
    """A kq_scale fact's value in words: 1/sqrt(D_h), one number, or one per D_h."""
    if s is None:
        return "1/sqrt(D_h)"
    if isinstance(s, dict):
        return ", ".join(f"{v:.6g} (D_h {d})" for d, v in s.items())
    return f"{s:.6g}"
