#!/usr/bin/env python3
"""Deterministic deeper random-weight GGUFs, for measuring how two llama.cpp builds drift apart with depth.

    python3 scripts/make_deep_models.py OUTDIR

Writes OUTDIR/llama-deep.gguf (llama, 16 layers, n_embd 256, 8 query heads, 2 KV heads, D_h 32, SwiGLU) and
OUTDIR/gpt2-deep.gguf (gpt2, 12 layers, n_embd 128, 4 heads, GELU, `output.weight` spelled out so that the 2024
llama.cpp loads it). F16 matrices and F32 vectors, random weights from a fixed seed, built with the helpers of
make_arch_models.py (same vocabulary: a prompt of n listed words is n tokens). Quantized copies for other weight
types are made with llama-quantize (e.g. `llama-quantize --allow-requantize llama-deep.gguf llama-deep-q4_1.gguf
Q4_1`); scripts/drift_pairs.py does that.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

from make_arch_models import (N_CTX, Model, add_gpt2_vocab, base_hparams, ffn_gelu, ffn_swiglu,  # noqa: E402
                              qk_std, qkv_fused, qkv_sep)


def llama_deep(out: str) -> str:
    L, E, H, HKV, D, F = 16, 256, 8, 2, 32, 512
    m = Model(f"{out}/llama-deep.gguf", "llama", "llama-deep")
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
    return m.path


def gpt2_deep(out: str) -> str:
    L, E, H, F = 12, 128, 4, 512
    D = E // H
    m = Model(f"{out}/gpt2-deep.gguf", "gpt2", "gpt2-deep")
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
    m.mat("output.weight", E, nv, 0.05)
    m.write()
    return m.path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: make_deep_models.py OUTDIR")
    os.makedirs(sys.argv[1], exist_ok=True)
    for make in (llama_deep, gpt2_deep):
        path = make(sys.argv[1])
        print(f"{path}\t{os.path.getsize(path)} bytes")
