#!/usr/bin/env python3
"""Random-weight llama models in every weight type `--model` emulates, quantized by llama.cpp's own llama-quantize.

    python scripts/make_quant_models.py OUTDIR [TYPE ...]     # default: every type below

Writes OUTDIR/base-f32.gguf (a deterministic random llama model: 2 layers, n_embd 256, 4 query heads and 2 KV heads
of 64, n_ff 512, a separate output matrix, the 381-token vocabulary of make_arch_models.py; every dimension a weight
is quantized along is a multiple of 256, as the K-quants and IQ4_XS need), then OUTDIR/llama-TYPE.gguf for each type
with `llama-quantize --pure` (without --pure llama-quantize quietly picks other types for some tensors). Each output
is checked: every matrix must be of the requested type, else the script stops naming the tensor.

llama-quantize is `$ATTNCHECK_LLAMA_DIR/bin/llama-quantize` (scripts/build_llama.sh builds it beside
llama-eval-callback), or --quantize PATH. A model already in OUTDIR is kept.
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_arch_models as arch  # noqa: E402  (its gguf is llama.cpp's vendored gguf-py when present)

import numpy as np  # noqa: E402

TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
         "IQ4_NL", "IQ4_XS"]
LAYERS, EMBD, HEADS, HEADS_KV, HEAD_DIM, FF = 2, 256, 4, 2, 64, 512


def base(path):
    """The F32 model every type is quantized from."""
    m = arch.Model(path, "llama", "llama-quant-base", f32=("weight",))
    arch.base_hparams(m.w, LAYERS, EMBD, HEADS, HEADS_KV, FF)
    m.w.add_rope_dimension_count(HEAD_DIM)
    m.w.add_rope_freq_base(10000.0)
    nv = arch.add_gpt2_vocab(m.w)
    m.tensor("token_embd.weight", (EMBD, nv), 0.5)
    for i in range(LAYERS):
        p = f"blk.{i}."
        m.norm(p + "attn_norm", EMBD)
        arch.qkv_sep(m, p, EMBD, HEADS * HEAD_DIM, HEADS_KV * HEAD_DIM,
                     arch.qk_std(EMBD, HEAD_DIM, 1 / np.sqrt(HEAD_DIM)))
        m.norm(p + "ffn_norm", EMBD)
        arch.ffn_swiglu(m, p, EMBD, FF)
    m.norm("output_norm", EMBD)
    m.mat("output.weight", EMBD, nv, 0.05)
    m.write()


def matrix_types(path):
    """{tensor name: ggml type name} of the 2-D weights of a GGUF file."""
    r = arch.gguf.GGUFReader(path)
    return {t.name: t.tensor_type.name for t in r.tensors if len(t.shape) >= 2}


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--quantize")]
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.strip().split("\n\n")[0] + "\n\ntypes: " + " ".join(TYPES))
        return 0 if args else 2
    out, types = args[0], [t.upper() for t in args[1:]] or TYPES
    unknown = [t for t in types if t not in TYPES]
    if unknown:
        print(f"unknown type(s): {' '.join(unknown)} (known: {' '.join(TYPES)})", file=sys.stderr)
        return 2
    quantize = next((a.split("=", 1)[1] for a in argv[1:] if a.startswith("--quantize=")),
                    os.path.join(arch.LLAMA_DIR, "bin", "llama-quantize"))
    os.makedirs(out, exist_ok=True)
    src = os.path.join(out, "base-f32.gguf")
    if not os.path.exists(src):
        base(src)
    for t in types:
        dst = os.path.join(out, f"llama-{t.lower()}.gguf")
        if not os.path.exists(dst):
            done = subprocess.run([quantize, "--pure", src, dst + ".tmp", t], capture_output=True, text=True)
            if done.returncode != 0:
                print(f"llama-quantize {t} failed (exit {done.returncode}): {done.stderr.strip()[-400:]}",
                      file=sys.stderr)
                return 1
            wrong = {n: k for n, k in matrix_types(dst + ".tmp").items() if k != t}
            if wrong:
                print(f"llama-quantize wrote other types than {t}: {wrong}", file=sys.stderr)
                return 1
            os.replace(dst + ".tmp", dst)
        print(f"{dst}\t{os.path.getsize(dst)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
