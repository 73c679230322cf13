"""A model's hyperparameters as its family's forward pass needs them: read from the GGUF header through the
architecture table's `Forward` (how the family computes) and `facts_from_header` (what its attention does), with the
defaults llama.cpp's load_arch_hparams gives when a key is absent."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..arch import Arch, Forward, Window, lookup
from ..arch.gguf_header import Header
from ..arch.header import facts_from_header
from ..errors import ModelError

F32 = np.float32


@dataclass(frozen=True)
class Hparams:
    """What a reference forward pass needs (GGUF keys after "<arch>."; llama.cpp's defaults where absent).

    kq_scale is the SOFT_MAX scale, q_scale the factor q is multiplied by before kq (gemma, phi3), softcap the cap
    of tanh soft-capping of the scores (gemma2), window the sliding window and its layers. embd_scale multiplies the
    token embeddings (gemma: sqrt(n_embd), granite: embedding_scale), residual_scale each branch output before its
    residual ADD (granite), logit_scale divides the logits (granite), final_softcap soft-caps them (gemma2/3).
    """

    arch: str
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_layer: int
    n_ctx_train: int
    norm_eps: float
    rope_dim: int  # 0 when the architecture has no RoPE
    rope_freq_base: float
    kq_scale: float
    n_vocab: int
    rope_freq_scale: float = 1.0
    rope_base_swa: float = 0.0  # RoPE base of the windowed layers (0: rope_freq_base)
    q_scale: float | None = None
    softcap: float | None = None
    window: Window | None = None
    window_2024: Window | None = None  # the window builds before SET_ROWS applied where today's apply none (swa_2024)
    embd_scale: float | None = None
    residual_scale: float | None = None
    logit_scale: float | None = None
    final_softcap: float | None = None

    @property
    def forward(self) -> Forward:
        """How the architecture table says this family computes (arch/table.py)."""
        return lookup(self.arch).forward  # type: ignore[union-attr]  # load_model admits only such architectures

    def rope_base(self, layer: int) -> float:
        """The RoPE frequency base of a layer (windowed layers may have their own: gemma2/3)."""
        if self.rope_base_swa and self.window is not None and layer in self.window.layers:
            return self.rope_base_swa
        return self.rope_freq_base


def _first(v: Any) -> Any:
    """A per-layer array's first value, or the scalar."""
    return v[0] if isinstance(v, (list, tuple, np.ndarray)) and len(v) else v


def read_hparams(header: Header, spec: Arch) -> Hparams:
    """The hyperparameters of a model whose architecture has a Forward; ModelError names a missing key or a
    configuration the reference does not emulate."""
    meta, arch, path, fw = header.meta, header.arch, header.path, spec.forward
    assert fw is not None and arch is not None

    def key(name: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise ModelError(path, f"missing metadata key {arch}.{name}")
        return _first(value)

    n_embd = int(key("embedding_length"))
    n_head = int(key("attention.head_count"))
    head_dim = int(key("attention.key_length", n_embd // n_head))
    if "token_embd.weight" not in header.tensors:
        raise ModelError(path, "no tensor named 'token_embd.weight'")
    scaling = str(key("rope.scaling.type", "linear"))
    if fw.positions.startswith("rope") and scaling not in ("none", "linear"):
        raise ModelError(path, f"RoPE scaling {scaling!r} is not emulated by attncheck's reference (none, linear)")
    factor = float(key("rope.scaling.factor", 0.0) or key("rope.scale_linear", 0.0) or 0.0)
    facts = facts_from_header(meta)
    window = facts.window.value if facts.window.origin != "default" else None
    kq = facts.kq_scale.value
    rope = fw.positions.startswith("rope")
    return Hparams(
        arch=arch, n_embd=n_embd, n_head=n_head, n_head_kv=int(key("attention.head_count_kv", n_head)),
        head_dim=head_dim, n_layer=int(key("block_count")), n_ctx_train=int(key("context_length")),
        norm_eps=float(key(fw.norm_eps_key)),
        rope_dim=int(key("rope.dimension_count", head_dim)) if rope else 0,
        rope_freq_base=float(key("rope.freq_base", 10000.0)) if rope else 0.0,
        kq_scale=float(kq) if kq is not None else float(F32(1) / F32(math.sqrt(head_dim))),  # 1.0f/sqrtf(D_h)
        n_vocab=int(header.tensors["token_embd.weight"].ne[1]),
        rope_freq_scale=float(F32(1) / F32(factor)) if factor else 1.0,
        rope_base_swa=float(key("rope.freq_base_swa", fw.swa_rope_base or 0.0)) if window is not None else 0.0,
        q_scale=facts.q_scale.value, softcap=facts.softcap.value, window=window,
        window_2024=_window_2024(spec, meta),
        embd_scale=_embd_scale(fw, key, n_embd),
        residual_scale=float(key(fw.residual_scale_key, 0.0)) or None if fw.residual_scale_key else None,
        logit_scale=float(key(fw.logit_scale_key, 0.0)) or None if fw.logit_scale_key else None,
        final_softcap=_final_softcap(fw, key),
    )


def _window_2024(spec: Arch, meta) -> Window | None:
    """The window a build before SET_ROWS applied where today's apply none (Attention.swa_2024), else None."""
    return facts_from_header(meta, era_2024=True).window.value if spec.attention.swa_2024 else None


def _embd_scale(fw: Forward, key, n_embd: int) -> float | None:
    """gemma: sqrtf(n_embd); granite: embedding_scale (none when absent or 0)."""
    if fw.embd_scale is None:
        return None
    if fw.embd_scale == "sqrt_n_embd":
        return float(np.sqrt(F32(n_embd)))
    return float(key(fw.embd_scale, 0.0)) or None


def _final_softcap(fw: Forward, key) -> float | None:
    """final_logit_softcapping, or the family's default (gemma2: 30; gemma3: none)."""
    if not fw.final_softcap_key:
        return None
    return float(key(fw.final_softcap_key, fw.final_softcap_default or 0.0)) or None
