#!/usr/bin/env python3
"""Deterministic tiny random-weight GGUF models, one per llama.cpp architecture.

    python scripts/make_arch_models.py OUTDIR [ARCH ...]      # default: every architecture below

Writes OUTDIR/<name>.gguf for each requested architecture (names in ARCHS; `deepseek2` writes two files,
`deepseek2-mla` with the split `attn_k_b`/`attn_v_b` tensors (absorbed MLA, MQA over the latent cache) and
`deepseek2-kvb` with the legacy fused `attn_kv_b` tensor (plain MHA), from the same random weights). Every model
is small (n_embd 128-192, 2-4 layers, 4-8 heads, F16 matrices and F32 vectors, 0.6-1.5 MB each), has random
weights drawn from numpy's default_rng with a fixed seed per architecture (same bytes on every run), and has
query/key projections scaled so that the attention scores (after the scale llama.cpp applies) have a standard
deviation of a few units: softmax rows are neither uniform nor one-hot. Sliding windows are 4 tokens, so short
prompts cross them.

Architecture-specific attention features that the models carry (what llama.cpp builds of each: docs/format.md §5):
    gemma2      attn_logit_softcapping 10 (soft-cap nodes before SOFT_MAX), Q pre-scaled, SWA on layers 0, 2
    gemma3      Q pre-scaled, q/k norms, sliding_window_pattern 3 (layers 0, 1, 3 windowed, layer 2 full)
    gemma-embedding  non-causal, symmetric window, per-layer sliding_window_pattern array [T, F, T, F]
    gpt-oss     attn_sinks (one logit per head, std 1.5), SWA on even layers, softmax MoE router
    granite     attention.scale 0.0625 (not 1/sqrt(32)), embedding/residual/logit scales
    bloom       ALiBi (max_bias 8, hard-coded), 6 heads (not a power of two)
    mpt         ALiBi (attention.max_alibi_bias 8), 8 heads
    phi3        Q pre-scaled by 1/sqrt(D_h); a sliding_window key that llama.cpp ignores
    falcon      MQA (1 KV head); qwen2 q/k/v biases; qwen3 head_dim 48 != n_embd/n_head; starcoder2 biases
    deepseek2   MLA (kv_lora_rank 32, qk_nope 24, qk_rope 16, v_head 24), q_lora_rank 32, one MoE layer
    qwen35      hybrid: gated delta-net layers 0, 2 and gated softmax attention layers 1, 3 (IMROPE)
    bert        WordPiece vocabulary, non-causal, no KV cache
    t5encoder   SentencePiece (UGM) vocabulary, relative position buckets (kq_b), kq_scale 1
    llama, gpt2 references (GQA llama; GPT-2 with learned positions)

Tokenizers: every decoder uses the byte-level GPT-2 BPE vocabulary of the models in fixtures/models/ (same
words, so the same token ids); bert a WordPiece ("bert") vocabulary, t5encoder a Unigram ("t5") one. No model
adds BOS/EOS/CLS/SEP tokens, so a prompt of n words is n tokens ("How are" is 2, "I like to draw the cat" is 6,
"The animal didn't cross the street because it was too tired." is 13; bert splits "didn't" into three words, so
its 13-token prompt is "The animal did not cross the street because it was too tired.").

The gguf package used is the one vendored with the llama.cpp sources that scripts/build_llama.sh keeps: this
script puts `$ATTNCHECK_LLAMA_DIR/src/gguf-py` (default ATTNCHECK_LLAMA_DIR: ~/.cache/attncheck/llama-0.3.36)
at the front of sys.path, because that gguf-py is newer than the released `gguf` package and knows every
architecture's keys and tensor names. If that folder is missing, the installed `gguf` package is used.
"""
import os
import sys
import time
import zlib

LLAMA_DIR = os.environ.get("ATTNCHECK_LLAMA_DIR") or os.path.expanduser("~/.cache/attncheck/llama-0.3.36")
_GGUF_PY = os.path.join(LLAMA_DIR, "src", "gguf-py")
if os.path.isdir(_GGUF_PY):
    sys.path.insert(0, _GGUF_PY)

import numpy as np  # noqa: E402
import gguf  # noqa: E402

sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository: attncheck
from attncheck.arch.vocab import bytes_to_unicode  # noqa: E402  (GPT-2's byte-level alphabet)

SCORE_STD = 3.0      # target std of the scaled attention scores
N_SWA = 4            # sliding window of every windowed model
N_CTX = 512          # context length written to the models (-c defaults to it)

# ---------------------------------------------------------------------------------------------------------
# vocabularies

WORDS = ["How", " are", " you", "I", " like", " to", " draw", "The", " cat", " sat", " on", " the",
         " mat", " animal", " didn", "'t", " cross", " street", " because", " it", " was", " too",
         " tired", ".", " Hello", " my", " name", " is", " bank", " river", " money", " attention",
         " head", " verify", " every", " number", ",", " and", " a", " of", " in", " we", "We"]


def gpt2_vocab():
    """The byte-level BPE vocabulary of the models in fixtures/models/: 256 byte tokens, one merge chain per word,
    <|endoftext|>."""
    b2u = bytes_to_unicode()
    tokens = list(b2u.values())
    merges, seen = [], set(tokens)
    for w in WORDS:
        u = "".join(b2u[b] for b in w.encode())
        cur = u[0]
        for ch in u[1:]:
            nxt = cur + ch
            if nxt not in seen:
                merges.append(f"{cur} {ch}")
                tokens.append(nxt)
                seen.add(nxt)
            cur = nxt
    tokens.append("<|endoftext|>")
    types = [gguf.TokenType.NORMAL] * (len(tokens) - 1) + [gguf.TokenType.CONTROL]
    return tokens, types, merges


def add_gpt2_vocab(w, extra=()):
    """extra: control tokens appended after <|endoftext|> (ids of the words do not change)."""
    tokens, types, merges = gpt2_vocab()
    tokens = tokens + list(extra)
    types = types + [gguf.TokenType.CONTROL] * len(extra)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    eot = tokens.index("<|endoftext|>")
    w.add_bos_token_id(eot)
    w.add_eos_token_id(eot)
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    return len(tokens)


PLAIN_WORDS = sorted({x.strip().lower() for x in WORDS if x.strip().isalpha()} | {"did", "not", "didn", "t"})
PUNCT = [".", ",", "'", "!", "?", "-"]


def add_bert_vocab(w):
    """WordPiece ("bert"): llama.cpp stores word-initial pieces with a leading U+2581 and continuations bare."""
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    types = [gguf.TokenType.CONTROL, gguf.TokenType.UNKNOWN] + [gguf.TokenType.CONTROL] * 3
    pieces = ["\u2581" + x for x in PLAIN_WORDS + PUNCT]
    pieces += ["\u2581" + chr(c) for c in range(ord("a"), ord("z") + 1)] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    seen = set(tokens)
    for p in pieces:
        if p not in seen:
            tokens.append(p)
            types.append(gguf.TokenType.NORMAL)
            seen.add(p)
    w.add_tokenizer_model("bert")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_type_count(2)
    w.add_pad_token_id(0)
    w.add_unk_token_id(1)
    w.add_bos_token_id(2)     # [CLS]
    w.add_sep_token_id(3)
    w.add_mask_token_id(4)
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    w.add_add_sep_token(False)
    return len(tokens)


def add_t5_vocab(w):
    """Unigram ("t5"): whole words (with the U+2581 space marker) score -2, single characters -8."""
    tokens = ["<pad>", "</s>", "<unk>"]
    types = [gguf.TokenType.CONTROL, gguf.TokenType.CONTROL, gguf.TokenType.UNKNOWN]
    scores = [0.0, 0.0, 0.0]
    seen = set(tokens)

    def add(p, s):
        if p not in seen:
            tokens.append(p)
            types.append(gguf.TokenType.NORMAL)
            scores.append(s)
            seen.add(p)
    for x in WORDS:
        add(x.replace(" ", "\u2581") if x.startswith(" ") else "\u2581" + x, -2.0)
        add(x.strip(), -3.0)
    add("\u2581", -6.0)
    for c in [chr(c) for c in range(ord("a"), ord("z") + 1)] + [chr(c) for c in range(ord("A"), ord("Z") + 1)] + PUNCT:
        add(c, -8.0)
    w.add_tokenizer_model("t5")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_scores(scores)
    w.add_pad_token_id(0)
    w.add_eos_token_id(1)
    w.add_unk_token_id(2)
    w.add_add_space_prefix(True)
    w.add_remove_extra_whitespaces(True)
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    return len(tokens)


# ---------------------------------------------------------------------------------------------------------
# tensor helpers


class Model:
    """One GGUF file being written: a seeded rng, the writer and shape-aware tensor helpers.

    Shapes are given in GGML order (ne0 first), as in llama.cpp's create_tensor calls; numpy arrays are the
    reverse. Matrices (2-D and 3-D `.weight`) are stored as F16, vectors and the names in `f32` as F32.
    """

    def __init__(self, path, arch, name, f32=()):
        self.rng = np.random.default_rng(zlib.crc32(name.encode()))
        self.w = gguf.GGUFWriter(path, arch)
        self.w.add_name(name)
        self.w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
        self.path = path
        self.f32 = set(f32)

    def randn(self, ne, std):
        return (self.rng.standard_normal(tuple(reversed(ne))) * std).astype(np.float32)

    def put(self, name, arr):
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if arr.ndim >= 2 and name.endswith(".weight") and not any(f in name for f in self.f32):
            self.w.add_tensor(name, arr.astype(np.float16))
        else:
            self.w.add_tensor(name, arr)

    def mat(self, name, n_in, n_out, std=None):
        """A linear layer `{n_in, n_out}` (y = W x); default std keeps unit-variance outputs."""
        self.put(name, self.randn((n_in, n_out), (1.0 / np.sqrt(n_in)) if std is None else std))

    def vec(self, name, n, std=0.05, mean=0.0):
        self.put(name, mean + self.randn((n,), std))

    def norm(self, name, n, mean=1.0, bias=False):
        self.vec(name + ".weight", n, 0.1, mean)
        if bias:
            self.vec(name + ".bias", n, 0.05)

    def tensor(self, name, ne, std):
        self.put(name, self.randn(ne, std))

    def write(self):
        self.w.write_header_to_file()
        self.w.write_kv_data_to_file()
        self.w.write_tensors_to_file()
        self.w.close()


def qk_std(n_in, d_h, scale):
    """std of random Q and K projections of a unit-variance input that gives scaled scores of std SCORE_STD:
    score = scale * sum_d q_d k_d with q_d, k_d ~ N(0, n_in * std^2)  =>  std(score) = scale * sqrt(d_h) * n_in * std^2.
    """
    return float(np.sqrt(SCORE_STD / (scale * np.sqrt(d_h) * n_in)))


def qknorm_gain(scale, d_h):
    """Gain of q/k RMS-norm weights (q, k rows of unit RMS) for scaled scores of std SCORE_STD."""
    return float(np.sqrt(SCORE_STD / (scale * np.sqrt(d_h))))


def base_hparams(w, n_layer, n_embd, n_head, n_head_kv, n_ff, rms=True, ctx=N_CTX):
    w.add_context_length(ctx)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_block_count(n_layer)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    if rms:
        w.add_layer_norm_rms_eps(1e-6)
    else:
        w.add_layer_norm_eps(1e-5)


def ffn_swiglu(m, p, n_embd, n_ff):
    m.mat(p + "ffn_gate.weight", n_embd, n_ff)
    m.mat(p + "ffn_up.weight", n_embd, n_ff)
    m.mat(p + "ffn_down.weight", n_ff, n_embd, 0.5 / np.sqrt(n_ff))


def ffn_gelu(m, p, n_embd, n_ff, bias=True):
    m.mat(p + "ffn_up.weight", n_embd, n_ff)
    m.mat(p + "ffn_down.weight", n_ff, n_embd, 0.5 / np.sqrt(n_ff))
    if bias:
        m.vec(p + "ffn_up.bias", n_ff)
        m.vec(p + "ffn_down.bias", n_embd)


def qkv_sep(m, p, n_embd, n_q, n_kv, std, bias=False, n_v=None):
    """Separate attn_q/attn_k/attn_v (and attn_output) of a layer; n_q, n_kv are total output widths."""
    n_v = n_kv if n_v is None else n_v
    m.mat(p + "attn_q.weight", n_embd, n_q, std)
    m.mat(p + "attn_k.weight", n_embd, n_kv, std)
    m.mat(p + "attn_v.weight", n_embd, n_v)
    if bias:
        m.vec(p + "attn_q.bias", n_q, 0.1)
        m.vec(p + "attn_k.bias", n_kv, 0.1)
        m.vec(p + "attn_v.bias", n_v, 0.1)
    m.mat(p + "attn_output.weight", n_q, n_embd, 0.5 / np.sqrt(n_q))


def qkv_fused(m, p, n_embd, n_q, n_kv, std, bias=False):
    q = m.randn((n_embd, n_q), std)
    k = m.randn((n_embd, n_kv), std)
    v = m.randn((n_embd, n_kv), 1.0 / np.sqrt(n_embd))
    m.put(p + "attn_qkv.weight", np.concatenate([q, k, v]))
    if bias:
        m.vec(p + "attn_qkv.bias", n_q + 2 * n_kv, 0.1)
    m.mat(p + "attn_output.weight", n_q, n_embd, 0.5 / np.sqrt(n_q))


# ---------------------------------------------------------------------------------------------------------
# architectures: each writes OUTDIR/<name>.gguf and returns the list of paths


def llama(out, L=2, E=128, H=4, HKV=2, D=32, F=256, name="llama"):
    m = Model(f"{out}/{name}.gguf", "llama", name)
    base_hparams(m.w, L, E, H, HKV, F)
    m.w.add_rope_dimension_count(D)
    m.w.add_rope_freq_base(10000.0)
    nv = add_gpt2_vocab(m.w)
    m.tensor("token_embd.weight", (E, nv), 0.5)
    for i in range(L):
        p = f"blk.{i}."
        m.norm(p + "attn_norm", E)
        qkv_sep(m, p, E, H * D, HKV * D, qk_std(E, D, 1 / np.sqrt(D)))
        m.norm(p + "ffn_norm", E)
        ffn_swiglu(m, p, E, F)
    m.norm("output_norm", E)
    m.mat("output.weight", E, nv, 0.05)
    m.write()
    return [m.path]


def gpt2(out, L=2, E=128, H=4, F=512, name="gpt2", output=False):
    """output: write output.weight (the 2024 llama.cpp requires it; today's falls back to token_embd)."""
    D = E // H
    m = Model(f"{out}/{name}.gguf", "gpt2", name)
    base_hparams(m.w, L, E, H, H, F, rms=False)
    nv = add_gpt2_vocab(m.w)
    m.tensor("token_embd.weight", (E, nv), 0.5)
    m.tensor("position_embd.weight", (E, N_CTX), 0.3)
    for i in range(L):
        p = f"blk.{i}."
        m.norm(p + "attn_norm", E, bias=True)
        qkv_fused(m, p, E, E, E, qk_std(E, D, 1 / np.sqrt(D)), bias=True)
        m.vec(p + "attn_output.bias", E, 0.02)
        m.norm(p + "ffn_norm", E, bias=True)
        ffn_gelu(m, p, E, F)
    m.norm("output_norm", E, bias=True)
    if output:
        m.mat("output.weight", E, nv, 0.05)
    m.write()
    return [m.path]


def qwen2(out):
    L, E, H, HKV, F = 2, 128, 4, 2, 256
    D = E // H
    m = Model(f"{out}/qwen2.gguf", "qwen2", "qwen2")
    base_hparams(m.w, L, E, H, HKV, F)
    m.w.add_rope_dimension_count(D)
    m.w.add_rope_freq_base(1000000.0)
    nv = add_gpt2_vocab(m.w)
    m.tensor("token_embd.weight", (E, nv), 0.5)
    for i in range(L):
        p = f"blk.{i}."
        m.norm(p + "attn_norm", E)
        qkv_sep(m, p, E, H * D, HKV * D, qk_std(E, D, 1 / np.sqrt(D)), bias=True)
        m.norm(p + "ffn_norm", E)
        ffn_swiglu(m, p, E, F)
    m.norm("output_norm", E)
    m.mat("output.weight", E, nv, 0.05)
    m.write()
    return [m.path]


def qwen3(out):
    L, E, H, HKV, D, F = 2, 128, 4, 2, 48, 256      # head_dim 48: H * D = 192 != n_embd
    m = Model(f"{out}/qwen3.gguf", "qwen3", "qwen3")
    base_hparams(m.w, L, E, H, HKV, F)
    m.w.add_key_length(D)
    m.w.add_value_length(D)
    m.w.add_rope_freq_base(1000000.0)
    nv = add_gpt2_vocab(m.w)
    m.tensor("token_embd.weight", (E, nv), 0.5)
    g = qknorm_gain(1 / np.sqrt(D), D)
    for i in range(L):
        p = f"blk.{i}."
        m.norm(p + "attn_norm", E)
        qkv_sep(m, p, E, H * D, HKV * D, None)
        m.norm(p + "attn_q_norm", D, mean=g)
        m.norm(p + "attn_k_norm", D, mean=g)
        m.norm(p + "ffn_norm", E)
        ffn_swiglu(m, p, E, F)
    m.norm("output_norm", E)
    m.write()     # tied output (token_embd)
    return [m.path]


def gemma2(out):
    L, E, H, HKV, D, F = 4, 128, 4, 2, 32, 256
    CAP = 10.0
    m = Model(f"{out}/gemma2.gguf", "gemma2", "gemma2")
    base_hparams(m.w, L, E, H, HKV, F)
    m.w.add_key_length(D)
    m.w.add_value_length(D)
    m.w.add_sliding_window(N_SWA)          # pattern: default 2 (layers 0, 2 windowed)
    m.w.add_attn_logit_softcapping(CAP)
    m.w.add_final_logit_softcapping(30.0)
    nv = add_gpt2_vocab(m.w)
    m.tensor("token_embd.weight", (E, nv), 0.5)
    for i in range(L):
        p = f"blk.{i}."
        m.norm(p + "attn_norm", E)
        # scores before the cap: std ~ 1.5 * SCORE_STD, so tanh(x / 10) bends the large ones
        qkv_sep(m, p, E, H * D, HKV * D, qk_std(E, D, 1 / np.sqrt(D)) * np.sqrt(1.5))
        m.norm(p + "post_attention_norm", E)
        m.norm(p + "ffn_norm", E)
        ffn_swiglu(m, p, E, F)
        m.norm(p + "post_ffw_norm", E)
    m.norm("output_norm", E)
    m.write()
    return [m.path]


def gemma3(out):
    L, E, H, HKV, D, F = 4, 128, 4, 2, 32, 256
    m = Model(f"{out}/gemma3.gguf", "gemma3", "gemma3")
    base_hparams(m.w, L, E, H, HKV, F)
    m.w.add_key_length(D)
    m.w.add_value_length(D)
    m.w.add_rope_freq_base(1000000.0)
    m.w.add_rope_freq_base_swa(10000.0)
    m.w.add_sliding_window(N_SWA)
    m.w.add_sliding_window_pattern(3)      # layers 0, 1 windowed, 2 full, 3 windowed
    nv = add_gpt2_vocab(m.w)
    m.tensor("token_embd.weight", (E, nv), 0.5)
    g = qknorm_gain(1 / np.sqrt(D), D)
    for i in range(L):
        p = f"blk.{i}."
        m.norm(p + "attn_norm", E)
        qkv_sep(m, p, E, H * D, HKV * D, None)
        m.norm(p + "attn_q_norm", D, mean=g)
        m.norm(p + "attn_k_norm", D, mean=g)
        m.norm(p + "post_attention_norm", E)
        m.norm(p + "ffn_norm", E)
        ffn_swiglu(m, p, E, F)
        m.norm(p + "post_ffw_norm", E)
    m.norm("output_norm", E)
    m.write()
    return [m.path]


def gemma_embedding(out):
    L, E, H, HKV, D, F = 4, 128, 4, 2, 32, 256
    m = Model(f"{out}/gemma-embedding.gguf", "gemma-embedding", "gemma-embedding")
    base_hparams(m.w, L, E, H, HKV, F)
    m.w.add_key_length(D)
    m.w.add_value_length(D)
    m.w.add_sliding_window(N_SWA)
    m.w.add_sliding_window_pattern([True, False, True, False])
    m.w.add_causal_attention(False)
    m.w.add_pooling_type(gguf.PoolingType.MEAN)
    nv = add_gpt2_vocab(m.w)
    m.tensor("token_embd.weight", (E, nv), 0.5)
    g = qknorm_gain(1 / np.sqrt(D), D)
    for i in range(L):
        p = f"blk.{i}."
        m.norm(p + "attn_norm", E)
        qkv_sep(m, p, E, H * D, HKV * D, None)
        m.norm(p + "attn_q_norm", D, mean=g)
        m.norm(p + "attn_k_norm", D, mean=g)
        m.norm(p + "post_attention_norm", E)
        m.norm(p + "ffn_norm", E)
        ffn_swiglu(m, p, E, F)
        m.norm(p + "post_ffw_norm", E)
    m.norm("output_norm", E)
    m.write()
    return [m.path]


def phi3(out):
    L, E, H, F = 2, 128, 4, 256
    D = E // H
    m = Model(f"{out}/phi3.gguf", "phi3", "phi3")
    base_hparams(m.w, L, E, H, H, F)
    m.w.add_rope_dimension_count(D)
    m.w.add_sliding_window(N_SWA)     # read, then ignored: "Phi SWA is currently disabled"
    # llama-vocab.cpp sets attributes of "</s>", "<unk>", "<s>" when general.name contains "phi3" (std::out_of_range
    # "unordered_map::at" if they are missing)
    nv = add_gpt2_vocab(m.w, extra=("<unk>", "<s>", "</s>"))
    m.tensor("token_embd.weight", (E, nv), 0.5)
    for i in range(L):
        p = f"blk.{i}."
        m.norm(p + "attn_norm", E)
        qkv_fused(m, p, E, E, E, qk_std(E, D, 1 / np.sqrt(D)))
        m.norm(p + "ffn_norm", E)
        m.mat(p + "ffn_up.weight", E, 2 * F)            # gate and up, fused
        m.mat(p + "ffn_down.weight", F, E, 0.5 / np.sqrt(F))
    m.norm("output_norm", E)
    m.mat("output.weight", E, nv, 0.05)
    m.write()
    return [m.path]


def granite(out):
    L, E, H, HKV, F = 2, 128, 4, 2, 256
    D = E // H
    SCALE = 0.0625
    m = Model(f"{out}/granite.gguf", "granite", "granite")
    base_hparams(m.w, L, E, H, HKV, F)
    m.w.add_rope_dimension_count(D)
    m.w.add_attention_scale(SCALE)
    m.w.add_embedding_scale(12.0)
    m.w.add_residual_scale(0.22)
    m.w.add_logit_scale(8.0)
    nv = add_gpt2_vocab(m.w)
    m.tensor("token_embd.weight", (E, nv), 0.5)
    for i in range(L):
        p = f"blk.{i}."
        m.norm(p + "attn_norm", E)
        qkv_sep(m, p, E, H * D, HKV * D, qk_std(E, D, SCALE))
        m.norm(p + "ffn_norm", E)
        ffn_swiglu(m, p, E, F)
    m.norm("output_norm", E)
    m.write()
    return [m.path]


def gpt_oss(out):
    L, E, H, HKV, D, FE, NE, NU = 4, 128, 4, 2, 32, 64, 4, 2
    m = Model(f"{out}/gpt-oss.gguf", "gpt-oss", "gpt-oss", f32=("ffn_gate_inp",))
    base_hparams(m.w, L, E, H, HKV, FE)
    m.w.add_key_length(D)
    m.w.add_value_length(D)
    m.w.add_rope_dimension_count(D)
    m.w.add_rope_freq_base(150000.0)
    m.w.add_sliding_window(N_SWA)          # pattern: default 2 (even layers windowed)
    m.w.add_expert_count(NE)
    m.w.add_expert_used_count(NU)
    m.w.add_expert_feed_forward_length(FE)
    nv = add_gpt2_vocab(m.w)
    m.tensor("token_embd.weight", (E, nv), 0.5)
    for i in range(L):
        p = f"blk.{i}."
        m.norm(p + "attn_norm", E)
        qkv_sep(m, p, E, H * D, HKV * D, qk_std(E, D, 1 / np.sqrt(D)), bias=True)
        m.vec(p + "attn_output.bias", E, 0.02)
        m.vec(p + "attn_sinks.weight", H, 1.5)
        m.norm(p + "post_attention_norm", E)
        m.tensor(p + "ffn_gate_inp.weight", (E, NE), 1.0 / np.sqrt(E))
        m.vec(p + "ffn_gate_inp.bias", NE, 0.1)
        m.tensor(p + "ffn_gate_exps.weight", (E, FE, NE), 1.0 / np.sqrt(E))
        m.tensor(p + "ffn_up_exps.weight", (E, FE, NE), 1.0 / np.sqrt(E))
        m.tensor(p + "ffn_down_exps.weight", (FE, E, NE), 0.5 / np.sqrt(FE))
        m.tensor(p + "ffn_gate_exps.bias", (FE, NE), 0.05)
        m.tensor(p + "ffn_up_exps.bias", (FE, NE), 0.05)
        m.tensor(p + "ffn_down_exps.bias", (E, NE), 0.02)
    m.norm("output_norm", E)
    m.mat("output.weight", E, nv, 0.05)
    m.write()
    return [m.path]


def bloom(out):
    L, E, H, F = 2, 192, 6, 384
    D = E // H
    m = Model(f"{out}/bloom.gguf", "bloom", "bloom")
    base_hparams(m.w, L, E, H, H, F, rms=False)
    nv = add_gpt2_vocab(m.w)
    m.tensor("token_embd.weight", (E, nv), 0.5)
    m.norm("token_embd_norm", E, bias=True)
    for i in range(L):
        p = f"blk.{i}."
        m.norm(p + "attn_norm", E, bias=True)
        qkv_fused(m, p, E, E, E, qk_std(E, D, 1 / np.sqrt(D)), bias=True)
        m.vec(p + "attn_output.bias", E, 0.02)
        m.norm(p + "ffn_norm", E, bias=True)
        ffn_gelu(m, p, E, F)
    m.norm("output_norm", E, bias=True)
    m.write()
    return [m.path]


def mpt(out):
    L, E, H, F = 2, 128, 8, 512
    D = E // H
    m = Model(f"{out}/mpt.gguf", "mpt", "mpt")
    base_hparams(m.w, L, E, H, H, F, rms=False)
    m.w.add_max_alibi_bias(8.0)
    nv = add_gpt2_vocab(m.w)
    m.tensor("token_embd.weight", (E, nv), 0.5)
    for i in range(L):
        p = f"blk.{i}."
        m.norm(p + "attn_norm", E)
        qkv_fused(m, p, E, E, E, qk_std(E, D, 1 / np.sqrt(D)))
        m.norm(p + "ffn_norm", E)
        ffn_gelu(m, p, E, F, bias=False)
    m.norm("output_norm", E)
    m.write()
    return [m.path]


def falcon(out):
    L, E, H, HKV, F = 2, 128, 4, 1, 512
    D = E // H
    m = Model(f"{out}/falcon.gguf", "falcon", "falcon")
    base_hparams(m.w, L, E, H, HKV, F, rms=False)
    m.w.add_rope_dimension_count(D)
    nv = add_gpt2_vocab(m.w)
    m.tensor("token_embd.weight", (E, nv), 0.5)
    for i in range(L):
        p = f"blk.{i}."
        m.norm(p + "attn_norm", E, bias=True)
        qkv_fused(m, p, E, E, HKV * D, qk_std(E, D, 1 / np.sqrt(D)))
        ffn_gelu(m, p, E, F, bias=False)
    m.norm("output_norm", E, bias=True)
    m.write()
    return [m.path]


def starcoder2(out):
    L, E, H, HKV, F = 2, 128, 4, 2, 512
    D = E // H
    m = Model(f"{out}/starcoder2.gguf", "starcoder2", "starcoder2")
    base_hparams(m.w, L, E, H, HKV, F, rms=False)
    m.w.add_rope_dimension_count(D)
    m.w.add_rope_freq_base(100000.0)
    nv = add_gpt2_vocab(m.w)
    m.tensor("token_embd.weight", (E, nv), 0.5)
    for i in range(L):
        p = f"blk.{i}."
        m.norm(p + "attn_norm", E, bias=True)
        qkv_sep(m, p, E, H * D, HKV * D, qk_std(E, D, 1 / np.sqrt(D)), bias=True)
        m.vec(p + "attn_output.bias", E, 0.02)
        m.norm(p + "ffn_norm", E, bias=True)
        ffn_gelu(m, p, E, F)
    m.norm("output_norm", E, bias=True)
    m.write()
    return [m.path]


def deepseek2(out):
    """Two files from one set of weights: absorbed MLA (attn_k_b/attn_v_b) and legacy attn_kv_b (MHA)."""
    L, E, H, F = 2, 128, 4, 256
    QLORA, KVLORA, NOPE, ROPE, VH = 32, 32, 24, 16, 24
    NE, NU, NS, FE = 4, 2, 1, 32
    paths = []
    for mla in (True, False):
        name = "deepseek2-mla" if mla else "deepseek2-kvb"
        m = Model(f"{out}/{name}.gguf", "deepseek2", name, f32=("ffn_gate_inp",))
        m.rng = np.random.default_rng(zlib.crc32(b"deepseek2"))      # same weights in both files
        w = m.w
        base_hparams(w, L, E, H, 1 if mla else H, F)
        w.add_rope_dimension_count(ROPE)
        w.add_q_lora_rank(QLORA)
        w.add_kv_lora_rank(KVLORA)
        if mla:
            w.add_key_length(KVLORA + ROPE)
            w.add_value_length(KVLORA)
            w.add_key_length_mla(NOPE + ROPE)
            w.add_value_length_mla(VH)
        else:
            w.add_key_length(NOPE + ROPE)
            w.add_value_length(VH)
        w.add_leading_dense_block_count(1)
        w.add_expert_count(NE)
        w.add_expert_used_count(NU)
        w.add_expert_shared_count(NS)
        w.add_expert_feed_forward_length(FE)
        nv = add_gpt2_vocab(w)
        w.add_vocab_size(nv)
        m.tensor("token_embd.weight", (E, nv), 0.5)
        # scores: q . k over NOPE + ROPE dims, q from a normed rank-32 latent, k_nope from the normed kv latent,
        # k_pe straight from the (normed) layer input
        s = qk_std(1, NOPE + ROPE, 1 / np.sqrt(NOPE + ROPE))
        for i in range(L):
            p = f"blk.{i}."
            m.norm(p + "attn_norm", E)
            m.mat(p + "attn_q_a.weight", E, QLORA)
            m.norm(p + "attn_q_a_norm", QLORA)
            m.mat(p + "attn_q_b.weight", QLORA, H * (NOPE + ROPE), s / np.sqrt(QLORA))
            kva = m.randn((E, KVLORA + ROPE), 1.0 / np.sqrt(E))
            kva[KVLORA:, :] *= s          # the k_pe rows (numpy axis 0 is the output)
            m.put(p + "attn_kv_a_mqa.weight", kva)
            m.norm(p + "attn_kv_a_norm", KVLORA)
            kv_b = m.randn((KVLORA, H * (NOPE + VH)), 1.0 / np.sqrt(KVLORA))   # numpy (H*(NOPE+VH), KVLORA)
            kv_b3 = kv_b.reshape(H, NOPE + VH, KVLORA)
            kv_b3[:, :NOPE, :] *= s
            if mla:
                m.put(p + "attn_k_b.weight", kv_b3[:, :NOPE, :].transpose(0, 2, 1))   # ne {NOPE, KVLORA, H}
                m.put(p + "attn_v_b.weight", kv_b3[:, NOPE:, :])                       # ne {KVLORA, VH, H}
            else:
                m.put(p + "attn_kv_b.weight", kv_b3.reshape(H * (NOPE + VH), KVLORA))
            m.mat(p + "attn_output.weight", H * VH, E, 0.5 / np.sqrt(H * VH))
            m.norm(p + "ffn_norm", E)
            if i < 1:
                ffn_swiglu(m, p, E, F)
            else:
                m.tensor(p + "ffn_gate_inp.weight", (E, NE), 1.0 / np.sqrt(E))
                m.tensor(p + "ffn_gate_exps.weight", (E, FE, NE), 1.0 / np.sqrt(E))
                m.tensor(p + "ffn_up_exps.weight", (E, FE, NE), 1.0 / np.sqrt(E))
                m.tensor(p + "ffn_down_exps.weight", (FE, E, NE), 0.5 / np.sqrt(FE))
                m.mat(p + "ffn_gate_shexp.weight", E, FE * NS)
                m.mat(p + "ffn_up_shexp.weight", E, FE * NS)
                m.mat(p + "ffn_down_shexp.weight", FE * NS, E, 0.5 / np.sqrt(FE))
        m.norm("output_norm", E)
        m.mat("output.weight", E, nv, 0.05)
        m.write()
        paths.append(m.path)
    return paths


def qwen35(out):
    """Hybrid: gated delta-net (recurrent) layers 0, 2; gated full softmax attention layers 1, 3."""
    L, E, H, HKV, D, F = 4, 128, 4, 2, 32, 256
    NROT, SECTIONS = 16, [3, 3, 2, 0]
    DCONV, DSTATE, NGROUP, DTRANK = 4, 16, 2, 4
    DINNER = DSTATE * DTRANK
    KEY_DIM, VALUE_DIM = DSTATE * NGROUP, DSTATE * DTRANK
    CONV_DIM = 2 * KEY_DIM + VALUE_DIM
    m = Model(f"{out}/qwen35.gguf", "qwen35", "qwen35", f32=("ssm_conv1d",))
    base_hparams(m.w, L, E, H, HKV, F)
    m.w.add_key_length(D)
    m.w.add_value_length(D)
    m.w.add_rope_dimension_count(NROT)
    m.w.add_rope_dimension_sections(SECTIONS)
    m.w.add_rope_freq_base(10000000.0)
    m.w.add_full_attention_interval(2)
    m.w.add_ssm_conv_kernel(DCONV)
    m.w.add_ssm_inner_size(DINNER)
    m.w.add_ssm_state_size(DSTATE)
    m.w.add_ssm_time_step_rank(DTRANK)
    m.w.add_ssm_group_count(NGROUP)
    nv = add_gpt2_vocab(m.w)
    m.tensor("token_embd.weight", (E, nv), 0.5)
    g = qknorm_gain(1 / np.sqrt(D), D)
    for i in range(L):
        p = f"blk.{i}."
        m.norm(p + "attn_norm", E)
        m.norm(p + "post_attention_norm", E)
        if (i + 1) % 2 != 0:     # recurrent (linear attention) layer
            m.mat(p + "attn_qkv.weight", E, CONV_DIM)
            m.mat(p + "attn_gate.weight", E, VALUE_DIM)
            m.tensor(p + "ssm_conv1d.weight", (DCONV, CONV_DIM), 0.5)
            m.vec(p + "ssm_dt.bias", DTRANK, 0.5)
            m.put(p + "ssm_a", -np.exp(m.randn((DTRANK,), 0.5)))
            m.mat(p + "ssm_beta.weight", E, DTRANK)
            m.mat(p + "ssm_alpha.weight", E, DTRANK)
            m.norm(p + "ssm_norm", DSTATE)
            m.mat(p + "ssm_out.weight", VALUE_DIM, E, 0.5 / np.sqrt(VALUE_DIM))
        else:
            m.mat(p + "attn_q.weight", E, 2 * H * D)   # query and gate, interleaved per head
            m.mat(p + "attn_k.weight", E, HKV * D)
            m.mat(p + "attn_v.weight", E, HKV * D)
            m.mat(p + "attn_output.weight", H * D, E, 0.5 / np.sqrt(H * D))
            m.norm(p + "attn_q_norm", D, mean=g)
            m.norm(p + "attn_k_norm", D, mean=g)
        ffn_swiglu(m, p, E, F)
    m.norm("output_norm", E)
    m.write()
    return [m.path]


def bert(out):
    L, E, H, F = 2, 128, 4, 512
    D = E // H
    m = Model(f"{out}/bert.gguf", "bert", "bert", f32=("token_types",))
    base_hparams(m.w, L, E, H, H, F, rms=False)
    m.w.add_causal_attention(False)
    m.w.add_pooling_type(gguf.PoolingType.MEAN)
    nv = add_bert_vocab(m.w)
    m.tensor("token_embd.weight", (E, nv), 0.5)
    m.tensor("token_types.weight", (E, 2), 0.1)
    m.tensor("position_embd.weight", (E, N_CTX), 0.3)
    m.norm("token_embd_norm", E, bias=True)
    for i in range(L):
        p = f"blk.{i}."
        qkv_sep(m, p, E, E, E, qk_std(E, D, 1 / np.sqrt(D)), bias=True)
        m.vec(p + "attn_output.bias", E, 0.02)
        m.norm(p + "attn_output_norm", E, bias=True)
        ffn_gelu(m, p, E, F)
        m.norm(p + "layer_output_norm", E, bias=True)
    m.write()
    return [m.path]


def t5encoder(out):
    L, E, H, D, F, NB = 2, 128, 4, 32, 256, 32
    m = Model(f"{out}/t5encoder.gguf", "t5encoder", "t5encoder", f32=("attn_rel_b",))
    base_hparams(m.w, L, E, H, H, F)
    m.w.add_key_length(D)
    m.w.add_value_length(D)
    m.w.add_relative_attn_buckets_count(NB)
    nv = add_t5_vocab(m.w)
    m.tensor("token_embd.weight", (E, nv), 0.5)
    for i in range(L):
        p = f"enc.blk.{i}."
        m.norm(p + "attn_norm", E)
        if i == 0:      # as in T5 checkpoints: only the first layer has the relative-position bias table
            m.tensor(p + "attn_rel_b.weight", (H, NB), 1.5)
        s = qk_std(E, D, 1.0)          # T5 does not scale the scores
        m.mat(p + "attn_q.weight", E, H * D, s)
        m.mat(p + "attn_k.weight", E, H * D, s)
        m.mat(p + "attn_v.weight", E, H * D)
        m.mat(p + "attn_o.weight", H * D, E, 0.5 / np.sqrt(H * D))
        m.norm(p + "ffn_norm", E)
        ffn_swiglu(m, p, E, F)
    m.norm("enc.output_norm", E)
    m.write()
    return [m.path]


ARCHS = {
    "llama": llama, "gpt2": gpt2,
    "qwen2": qwen2, "qwen3": qwen3, "gemma2": gemma2, "gemma3": gemma3, "gemma-embedding": gemma_embedding,
    "phi3": phi3, "granite": granite, "gpt-oss": gpt_oss, "bloom": bloom, "mpt": mpt, "falcon": falcon,
    "starcoder2": starcoder2, "deepseek2": deepseek2, "qwen35": qwen35, "bert": bert, "t5encoder": t5encoder,
}


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip().split("\n\n")[0] + "\n\narchitectures: " + " ".join(ARCHS))
        return 0 if len(argv) >= 2 else 2
    out = argv[1]
    names = argv[2:] or list(ARCHS)
    unknown = [a for a in names if a not in ARCHS]
    if unknown:
        print(f"unknown architecture(s): {' '.join(unknown)} (known: {' '.join(ARCHS)})", file=sys.stderr)
        return 2
    os.makedirs(out, exist_ok=True)
    t0 = time.time()
    for a in names:
        for path in ARCHS[a](out):
            print(f"{path}\t{os.path.getsize(path)} bytes")
    print(f"{len(names)} architecture(s) in {time.time() - t0:.2f} s (gguf from {os.path.dirname(gguf.__file__)})",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
