"""The architecture table: per llama.cpp architecture (GGUF `general.architecture`), what its graph does.

`Attention` says how llama.cpp's `load_arch_hparams` (src/models/<arch>.cpp) and graph builder turn the GGUF header
into the attention facts of arch/facts.py; `Forward` says how the reference forward pass (model/reference.py)
computes the family. An architecture without a Forward is run by llama.cpp but not recomputed by attncheck; one
without an entry gets the generic rules (`GENERIC`), stated as such in the report. The switches are words of a
Literal type, checked when the table is built: an unknown word is an error at import, never a silent default.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal, get_args, get_origin, get_type_hints

from .facts import WindowKind

# the switches' words: a value outside them is an error when the table is built (at import), never a silent default
Norm = Literal["layer", "rms"]
Positions = Literal["learned", "rope_norm", "rope_neox"]
Ffn = Literal["gelu", "swiglu", "geglu", "swiglu_fused"]
Scale = Literal["head_dim", "attention.scale", "rope_dim", "one", "q_prescaled", "mla"]
QScale = Literal["head_dim", "gemma_27b"]
Recurrent = Literal["qwen35"]


def _literal(kind):
    """The Literal a field's type is, or holds as Optional; None for a field of another type."""
    if get_origin(kind) is Literal:
        return kind
    return next((a for a in get_args(kind) if get_origin(a) is Literal), None)


def _checked(entry) -> None:
    """Every Literal-typed field of a table entry holds one of its words (or None where the field is optional)."""
    hints = get_type_hints(type(entry))
    for f in fields(entry):
        literal, value = _literal(hints[f.name]), getattr(entry, f.name)
        if literal is None or value is None and type(None) in get_args(hints[f.name]):
            continue
        if value not in get_args(literal):
            raise ValueError(f"{type(entry).__name__}.{f.name} = {value!r}: not one of {', '.join(get_args(literal))}")


@dataclass(frozen=True)
class Forward:
    """How a family's layer is computed (llama.cpp's build_* of src/models/<arch>.cpp), for model/reference.py.

    The attention itself (SOFT_MAX scale, q pre-scale, soft-cap, window) follows from `Attention` and the header.
    """

    norm: Norm  # "layer": NORM (mean and variance), "rms": RMS_NORM
    norm_eps_key: str  # the GGUF key (after "<arch>.") holding the norm's epsilon
    positions: Positions  # "learned": position_embd added to the embeddings; "rope_norm" / "rope_neox": ROPE 0 / NEOX
    ffn: Ffn  # "gelu": up, GELU, down; "swiglu" / "geglu": act(gate)·up, down; "swiglu_fused": ffn_up = [gate | up]
    about: str = ""  # what the family's layer does, in a line
    qk_norm: bool = False  # q and k RMS-normed per head (attn_q_norm, attn_k_norm) before RoPE
    post_norms: bool = False  # attn_post_norm and ffn_post_norm on the branch outputs before the residual ADDs
    parallel: bool = False  # the FFN reads attn_norm too; l_out = ffn_out + attn_out + residual (falcon)
    embd_scale: str | None = None  # the embeddings' scale: "sqrt_n_embd" (gemma) or a GGUF key (granite)
    residual_scale_key: str | None = None  # each branch output scaled by it before its residual ADD (granite)
    logit_scale_key: str | None = None  # the logits divided by it (granite)
    final_softcap_key: str | None = None  # the logits soft-capped by it (gemma2/3) ...
    final_softcap_default: float | None = None  # ... or by this when the key is absent (gemma2: 30)
    swa_rope_base: float | None = None  # RoPE base of windowed layers without rope.freq_base_swa (gemma3: 10000)

    def __post_init__(self):
        _checked(self)
        if not self.about or not self.norm_eps_key:
            raise ValueError("a Forward says what its layer does (about) and where its norm's epsilon is")
        if self.final_softcap_default is not None and self.final_softcap_key is None:
            raise ValueError("final_softcap_default without final_softcap_key")


@dataclass(frozen=True)
class Attention:
    """How the attention facts follow from the header (keys after "<arch>."), per llama.cpp's source.

    scale: the SOFT_MAX scale: "head_dim" 1/sqrt(key_length); "attention.scale" that key, else head_dim (granite);
    "rope_dim" 1/sqrt(rope.dimension_count) (gpt-oss); "one" 1 (t5: no scaling); "q_prescaled" 1 in SOFT_MAX, q
    scaled before kq by q_scale; "mla" mscale²/sqrt(key_length_mla, else key_length) (deepseek2).
    q_scale: "head_dim" 1/sqrt(key_length); "gemma_27b" 1/sqrt(n_embd/n_head) when the model is the 27B one
    (gemma2: 46 layers; gemma3: 62), else head_dim.
    """

    scale: Scale = "head_dim"
    q_scale: QScale | None = None
    softcap_default: float | None = None  # soft-capping always on, this cap when attn_logit_softcapping is absent
    alibi_max_bias: float | None = None  # fixed in the source (bloom: 8)
    alibi_key: bool = False  # attention.max_alibi_bias (mpt; absent → no ALiBi)
    sinks: bool = False  # blk.L.attn_sinks.weight, one logit per head
    swa: WindowKind | None = None  # the kind of window the architecture uses
    swa_default: int | None = None  # n_swa when attention.sliding_window is absent (None: no window then)
    swa_pattern: int = 0  # the default pattern n (layer il windowed iff il % n < n - 1)
    swa_dense_first: bool = False  # pattern n: windowed iff il % n != 0
    # builds before SET_ROWS (2024's) masked by attention.sliding_window (standard) on every layer, which later
    # builds ignore: phi3 (llama.cpp's build_phi3 read build_inp_KQ_mask_swa then)
    swa_2024: bool = False
    causal: bool | None = None  # forced by the architecture (encoders); None: attention.causal, default true
    recurrent: Recurrent | None = None  # which layers have no softmax attention: "qwen35" (full_attention_interval)
    gemma_27b_layers: int = 0  # the 27B model's layer count, for q_scale gemma_27b

    def __post_init__(self):
        _checked(self)
        if (self.scale == "q_prescaled") != (self.q_scale is not None):
            raise ValueError(f"scale {self.scale!r} with q_scale {self.q_scale!r}: q is scaled before kq exactly when "
                             "SOFT_MAX's scale is q_prescaled")
        if (self.q_scale == "gemma_27b") != (self.gemma_27b_layers > 0):
            raise ValueError("q_scale gemma_27b needs the 27B model's layer count (gemma_27b_layers), and only it")
        if self.swa is None and (self.swa_default is not None or self.swa_pattern or self.swa_dense_first):
            raise ValueError("a window's default, pattern or layout without a window kind (swa)")
        if self.alibi_max_bias is not None and self.alibi_key:
            raise ValueError("ALiBi's max_bias is fixed in the source or read from the header, not both")


@dataclass(frozen=True)
class Arch:
    name: str  # llama.cpp's architecture name, as GGUF's general.architecture writes it
    about: str
    attention: Attention = field(default_factory=Attention)
    forward: Forward | None = None  # None: attncheck has no reference forward pass for it

    def __post_init__(self):
        if not self.name or not self.about:
            raise ValueError("an architecture has a name and says what it is (about)")
        if not isinstance(self.attention, Attention) or not isinstance(self.forward, (Forward, type(None))):
            raise ValueError(f"{self.name}: attention is an Attention, forward a Forward or None")


GENERIC = Attention()  # an architecture the table does not know: llama-like attention from the generic keys

_RMS = "attention.layer_norm_rms_epsilon"
_LN = "attention.layer_norm_epsilon"
_GPT2 = Forward(norm="layer", norm_eps_key=_LN, positions="learned", ffn="gelu",
                about="LayerNorm with biases, learned positions, fused QKV with bias, GELU FFN")
_LLAMA = Forward(norm="rms", norm_eps_key=_RMS, positions="rope_norm", ffn="swiglu",
                 about="RMSNorm, RoPE mode 0 (rope_freqs factors when present), SwiGLU FFN, GQA")
_QWEN2 = Forward(norm="rms", norm_eps_key=_RMS, positions="rope_neox", ffn="swiglu",
                 about="llama-like with q/k/v biases and RoPE NEOX; an output bias when present")
_QWEN3 = Forward(norm="rms", norm_eps_key=_RMS, positions="rope_neox", ffn="swiglu", qk_norm=True,
                 about="q and k RMS-normed per head before RoPE NEOX; head dim from key_length")
_GEMMA2 = Forward(norm="rms", norm_eps_key=_RMS, positions="rope_neox", ffn="geglu", post_norms=True,
                  embd_scale="sqrt_n_embd", final_softcap_key="final_logit_softcapping", final_softcap_default=30.0,
                  about="embeddings × sqrt(n_embd), post-norms on both branches, GEGLU, logits soft-capped (30)")
_GEMMA3 = Forward(norm="rms", norm_eps_key=_RMS, positions="rope_neox", ffn="geglu", post_norms=True, qk_norm=True,
                  embd_scale="sqrt_n_embd", final_softcap_key="final_logit_softcapping", swa_rope_base=10000.0,
                  about="gemma2's layer with q/k norms; windowed layers' RoPE base 10000 unless rope.freq_base_swa")
_PHI3 = Forward(norm="rms", norm_eps_key=_RMS, positions="rope_neox", ffn="swiglu_fused",
                about="fused QKV, RoPE NEOX, one up projection holding gate and up (SWIGLU of its halves)")
_GRANITE = Forward(norm="rms", norm_eps_key=_RMS, positions="rope_norm", ffn="swiglu",
                   embd_scale="embedding_scale", residual_scale_key="residual_scale", logit_scale_key="logit_scale",
                   about="llama's layer with embedding, residual and logit scales")
_STARCODER2 = Forward(norm="layer", norm_eps_key=_LN, positions="rope_neox", ffn="gelu",
                      about="LayerNorm with biases, biased projections, RoPE NEOX, GELU FFN with biases")
_FALCON = Forward(norm="layer", norm_eps_key=_LN, positions="rope_neox", ffn="gelu", parallel=True,
                  about="fused QKV, RoPE NEOX, attention and FFN in parallel from one LayerNorm (attn_norm_2 "
                        "for the projections when present)")

ARCHS: dict[str, Arch] = {a.name: a for a in (
    Arch("gpt2", "GPT-2: LayerNorm, learned positions, fused QKV, GELU FFN", forward=_GPT2),
    Arch("llama", "Llama (SmolLM2, Mistral-style): RMSNorm, RoPE (mode 0), SwiGLU FFN, GQA", forward=_LLAMA),
    Arch("qwen2", "Qwen2: llama-like with q/k/v biases, RoPE NEOX", forward=_QWEN2),
    Arch("qwen3", "Qwen3: q/k RMS norms before RoPE; head dim from key_length", forward=_QWEN3),
    Arch("qwen2moe", "Qwen2-MoE: qwen2 attention, softmax MoE router"),
    Arch("qwen3moe", "Qwen3-MoE: qwen3 attention, softmax MoE router"),
    Arch("starcoder2", "StarCoder2: LayerNorm, biases, RoPE", forward=_STARCODER2),
    Arch("falcon", "Falcon: fused QKV, MQA or GQA, parallel attention and FFN", forward=_FALCON),
    Arch("phi2", "Phi-2: q pre-scaled by 1/sqrt(D_h)", Attention(scale="q_prescaled", q_scale="head_dim")),
    Arch("phi3", "Phi-3: q pre-scaled by 1/sqrt(D_h); its sliding_window key is ignored (SWA disabled), but "
                 "2024's builds masked by it on every layer",
         Attention(scale="q_prescaled", q_scale="head_dim", swa_2024=True), forward=_PHI3),
    Arch("gemma", "Gemma: q pre-scaled by 1/sqrt(D_h)", Attention(scale="q_prescaled", q_scale="head_dim")),
    Arch("gemma2", "Gemma 2: q pre-scaled, soft-cap (default 50), window (default 4096) on every other layer",
         Attention(scale="q_prescaled", q_scale="gemma_27b", gemma_27b_layers=46, softcap_default=50.0,
                   swa="standard", swa_default=4096, swa_pattern=2), forward=_GEMMA2),
    Arch("gemma3", "Gemma 3: q pre-scaled, q/k norms; a window only when sliding_window is set (5 of 6 layers)",
         Attention(scale="q_prescaled", q_scale="gemma_27b", gemma_27b_layers=62, swa="standard", swa_pattern=6),
         forward=_GEMMA3),
    Arch("gemma-embedding", "EmbeddingGemma: non-causal, q pre-scaled, symmetric window (5 of 6 layers)",
         Attention(scale="q_prescaled", q_scale="head_dim", swa="symmetric", swa_pattern=6, causal=False)),
    Arch("granite", "Granite: attention.scale (attention_multiplier) as the SOFT_MAX scale",
         Attention(scale="attention.scale"), forward=_GRANITE),
    Arch("gpt-oss", "gpt-oss: attention sinks, window on every other layer, softmax MoE router",
         Attention(scale="rope_dim", sinks=True, swa="standard", swa_pattern=2)),
    Arch("bloom", "BLOOM: ALiBi with max_bias 8 (fixed in llama.cpp), no RoPE", Attention(alibi_max_bias=8.0)),
    Arch("mpt", "MPT: ALiBi when attention.max_alibi_bias is set", Attention(alibi_key=True)),
    Arch("deepseek2", "DeepSeek-V2/V3: MLA (absorbed with attn_k_b/attn_v_b, or legacy attn_kv_b); scale from the "
                      "MLA key length and YaRN's mscale", Attention(scale="mla")),
    Arch("qwen35", "Qwen3.5: gated delta-net (linear attention) layers among softmax ones (every 4th by default)",
         Attention(recurrent="qwen35")),
    Arch("bert", "BERT: encoder, every token visible, no KV cache", Attention(causal=False)),
    Arch("t5encoder", "T5 encoder: relative position bias added to kq (kq_b), no scaling",
         Attention(scale="one")),
)}


def lookup(name: str | None) -> Arch | None:
    """The table's entry for an architecture name, None when attncheck knows nothing of it."""
    return ARCHS.get(name or "")
