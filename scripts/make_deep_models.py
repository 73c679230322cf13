#!/usr/bin/env python3
"""Deterministic deeper random-weight GGUFs, for measuring how two llama.cpp builds drift apart with depth.

    python3 scripts/make_deep_models.py OUTDIR

Writes OUTDIR/llama-deep.gguf (llama, 16 layers, n_embd 256, 8 query heads, 2 KV heads, D_h 32, SwiGLU) and
OUTDIR/gpt2-deep.gguf (gpt2, 12 layers, n_embd 128, 4 heads, GELU, `output.weight` spelled out so that the 2024
llama.cpp loads it): make_arch_models.py's llama and gpt2 at other sizes (F16 matrices, F32 vectors, random weights
seeded by the name; same vocabulary: a prompt of n listed words is n tokens). Quantized copies for other weight types
are made with llama-quantize, e.g. `llama-quantize --allow-requantize llama-deep.gguf llama-deep-q4_1.gguf Q4_1`.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from make_arch_models import gpt2, llama  # noqa: E402

if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: make_deep_models.py OUTDIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    paths = llama(out, L=16, E=256, H=8, HKV=2, D=32, F=512, name="llama-deep")
    paths += gpt2(out, L=12, name="gpt2-deep", output=True)
    for path in paths:
        print(f"{path}\t{os.path.getsize(path)} bytes")
