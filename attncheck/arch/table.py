"""The architecture table: per llama.cpp architecture (GGUF `general.architecture`), what its graph does.

`Attention` says how llama.cpp's `load_arch_hparams` (src/models/<arch>.cpp) and graph builder turn the GGUF header
into the attention facts of arch/facts.py; `Forward` says how the reference forward pass (model/reference.py)
computes the family. An architecture without a Forward is run by llama.cpp but not recomputed by attncheck; one
without an entry gets the generic rules (`GENERIC`), stated as such in the report.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Forward:
    """How a family's layer is computed (llama.cpp's build_* of src/models/<arch>.cpp)."""

    norm: str  # "layer": NORM (mean and variance), "rms": RMS_NORM
    norm_eps_key: str  # the GGUF key (after "<arch>.") holding the norm's epsilon
    positions: str  # "learned": position_embd added to the embeddings; "rope_norm": ROPE mode 0 on q and k
    ffn: str  # "gelu": up, GELU, down; "swiglu": silu(gate)·up, down


@dataclass(frozen=True)
class Attention:
    """How the attention facts follow from the header (keys after "<arch>."), per llama.cpp's source.

    scale: the SOFT_MAX scale: "head_dim" 1/sqrt(key_length); "attention.scale" that key, else head_dim (granite);
    "rope_dim" 1/sqrt(rope.dimension_count) (gpt-oss); "one" 1 (t5: no scaling); "q_prescaled" 1 in SOFT_MAX, q
    scaled before kq by q_scale; "mla" mscale²/sqrt(key_length_mla, else key_length) (deepseek2).
    q_scale: "head_dim" 1/sqrt(key_length); "gemma_27b" 1/sqrt(n_embd/n_head) when the model is the 27B one
    (gemma2: 46 layers; gemma3: 62), else head_dim.
    """

    scale: str = "head_dim"
    q_scale: str | None = None
    softcap_default: float | None = None  # soft-capping always on, this cap when attn_logit_softcapping is absent
    alibi_max_bias: float | None = None  # fixed in the source (bloom: 8)
    alibi_key: bool = False  # attention.max_alibi_bias (mpt; absent → no ALiBi)
    sinks: bool = False  # blk.L.attn_sinks.weight, one logit per head
    swa: str | None = None  # standard | symmetric | chunked: the kind of window the architecture uses
    swa_default: int | None = None  # n_swa when attention.sliding_window is absent (None: no window then)
    swa_pattern: int = 0  # the default pattern n (layer il windowed iff il % n < n - 1)
    swa_dense_first: bool = False  # pattern n: windowed iff il % n != 0
    causal: bool | None = None  # forced by the architecture (encoders); None: attention.causal, default true
    recurrent: str | None = None  # which layers have no softmax attention: "qwen35" (full_attention_interval)
    gemma_27b_layers: int = 0  # the 27B model's layer count, for q_scale gemma_27b


@dataclass(frozen=True)
class Arch:
    name: str  # llama.cpp's architecture name, as GGUF's general.architecture writes it
    about: str
    attention: Attention = field(default_factory=Attention)
    forward: Forward | None = None  # None: attncheck has no reference forward pass for it


GENERIC = Attention()  # an architecture the table does not know: llama-like attention from the generic keys

_GPT2 = Forward(norm="layer", norm_eps_key="attention.layer_norm_epsilon", positions="learned", ffn="gelu")
_LLAMA = Forward(norm="rms", norm_eps_key="attention.layer_norm_rms_epsilon", positions="rope_norm", ffn="swiglu")

ARCHS: dict[str, Arch] = {a.name: a for a in (
    Arch("gpt2", "GPT-2: LayerNorm, learned positions, fused QKV, GELU FFN", forward=_GPT2),
    Arch("llama", "Llama (SmolLM2, Mistral-style): RMSNorm, RoPE (mode 0), SwiGLU FFN, GQA", forward=_LLAMA),
    Arch("qwen2", "Qwen2: llama-like with q/k/v biases, RoPE NEOX"),
    Arch("qwen3", "Qwen3: q/k RMS norms before RoPE; head dim from key_length"),
    Arch("qwen2moe", "Qwen2-MoE: qwen2 attention, softmax MoE router"),
    Arch("qwen3moe", "Qwen3-MoE: qwen3 attention, softmax MoE router"),
    Arch("starcoder2", "StarCoder2: LayerNorm, biases, RoPE"),
    Arch("falcon", "Falcon: fused QKV, MQA or GQA, parallel attention and FFN"),
    Arch("phi2", "Phi-2: q pre-scaled by 1/sqrt(D_h)", Attention(scale="q_prescaled", q_scale="head_dim")),
    Arch("phi3", "Phi-3: q pre-scaled by 1/sqrt(D_h); its sliding_window key is ignored (SWA disabled)",
         Attention(scale="q_prescaled", q_scale="head_dim")),
    Arch("gemma", "Gemma: q pre-scaled by 1/sqrt(D_h)", Attention(scale="q_prescaled", q_scale="head_dim")),
    Arch("gemma2", "Gemma 2: q pre-scaled, soft-cap (default 50), window (default 4096) on every other layer",
         Attention(scale="q_prescaled", q_scale="gemma_27b", gemma_27b_layers=46, softcap_default=50.0,
                   swa="standard", swa_default=4096, swa_pattern=2)),
    Arch("gemma3", "Gemma 3: q pre-scaled, q/k norms; a window only when sliding_window is set (5 of 6 layers)",
         Attention(scale="q_prescaled", q_scale="gemma_27b", gemma_27b_layers=62, swa="standard", swa_pattern=6)),
    Arch("gemma-embedding", "EmbeddingGemma: non-causal, q pre-scaled, symmetric window (5 of 6 layers)",
         Attention(scale="q_prescaled", q_scale="head_dim", swa="symmetric", swa_pattern=6, causal=False)),
    Arch("granite", "Granite: attention.scale (attention_multiplier) as the SOFT_MAX scale",
         Attention(scale="attention.scale")),
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
