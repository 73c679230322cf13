"""The error model of `--model`: how far a printed node may lie from the reference forward pass.

A dump alone cannot check k·q (it needs all D_h components of q and k) nor a query whose visible slots were not
printed. The GGUF weights and the token ids give everything back: reference.py recomputes every node of the run, and
each printed element of each node that mapping.py maps (Qcur and q, Kcur, Vcur, the K/V cache views and stores,
kq, kq_soft_max, kqv or FLASH_ATTN_EXT, kqv_out, attn_norm, attn_out, ffn_inp, ffn_norm, ffn_out, l_out,
inp_embd, result_norm, result_output) is compared with it at positions [n_past, n_past + T); slots at or past
n_past + T of a cache view, kq or kq_soft_max are empty and must print 0. So are the full-tensor `sum =` lines.

Error model (per node, the JSON says which applied; terms in expect.py):

- always, per element: 5e-5 (the `%12.4f` print) + 2^-20·|ref| (the last f32 rounding).
- "derived": layer 0's attention (q, Kcur, Vcur, the cache views, kq, kq_soft_max, kqv, kqv_out), inp_embd and
  attn_norm, whose inputs llama.cpp and the reference share up to f32 noise. Adds the f32 summation noise,
  (n/8 + 4)·2^-24·Σ|terms| of each dot product and its effect downstream, and the rounding flips (q and P rounded
  to the KV cache type before the two MUL_MATs, K and V stored rounded). Flips are rare: at most 10 % of a node's
  printed elements may use that allowance (measured: 3 of 108 in the shipped dumps); beyond that it is withdrawn
  and they fail (a wrong cache type makes 33-74 %). NMSE <= 5e-4, test-backend-ops' bound for one MUL_MAT.
- "cascade": everything after layer 0's attention. A flip changes a value that later conversions round again (the
  next weight MUL_MAT's input quantized to Q8_0 blocks or rounded to f16, q and P rounded), so disagreements grow
  with depth and prompt length. Allowance TAU·rms(ref), rms over the printed elements that hold values (not empty
  cache slots), TAU by the weights' activation conversion: 0.3 for quantized weights (8-bit activations), 0.1 for
  float weights; NMSE <= 5e-3. Measured with the real llama-eval-callback (the shipped dumps; 30 runs of gpt2-mini
  and llama-mini over 13-170 token prompts, flash attention on and off, -ub 5 and 16, f32 caches; random 12- and
  48-layer models made the same way): worst TAU needed 0.18 (12-layer Q8_0 gpt2, -ub 4, layer 9) and 0.036
  (12-layer f16 llama), worst NMSE 2e-3 (48-layer Q8_0, layer 46) — above test-backend-ops' 5e-4, which assumes
  identical inputs. This bound is honest, not tight: in those layers a single score of kq (rms ≈ 11 for the
  GPT-2-sized model) can move by 3, a weight of kq_soft_max by 0.1 unnoticed by these checks (the dump-only checks
  still tie kq, kq_soft_max and kqv of one layer to each other); layer 0 is held at print precision.
- "+flash": FLASH_ATTN_EXT adds its kernel's arithmetic (f16 accumulation of P·V, P not rounded, f32 q in the tiled
  kernel), in every layer.
- sums: the f32 accumulation of the printed `sum` (n·2^-24·Σ|x| + 5e-7) plus, derived, every element's allowance,
  or, cascade, sqrt(n·5e-3·Σref²) (the NMSE bound through Cauchy-Schwarz). Dumps from before llama.cpp PR #15637
  summed the printed values only; which meaning a run uses is decided by the first derived node whose tight bound
  tells them apart.
- the arithmetic of the build: an f16 src0 multiplies a contiguous f32 src1 converted to f16 (today) or as f32
  (2024 builds with llamafile's tinyBLAS); both are correct, they differ by ~1e-3 in layer 0, and the reference uses
  the one that fits layer 0's q and kqv (reference.F16_SRC1; the JSON says which).

Every element beyond its bound fails with its node, layer, head, query (and token position), slot or dim; NMSE is
reported per node and fails a node on its own (one moved element fails by its bound long before NMSE notices it).
The summary names the first node, in graph order, that leaves print precision, and the first that fails.
"""
from __future__ import annotations

from .. import precision

PRINT = precision.PRINT
F32_REL = 2.0**-20
# cascade allowance, by what a weight MUL_MAT does to its input: quantized to 8-bit blocks (Q8_0/Q8_K, for
# quantized weights) or rounded to f16/bf16 (float weights); see the module doc for the measurements
TAU = {"8-bit": 0.3, "float": 0.1}
NMSE_MAX = 5e-4  # test-backend-ops' MUL_MAT bound: one op, identical inputs (the derived model)
NMSE_CASCADE = 5e-3  # measured worst 2e-3 on correct runs (a 48-layer Q8_0 model)
FLIP_SHARE = 0.10  # the share of a layer-0 node's printed elements that may use the flip allowance, at least ...
FLIP_EXPECTED = 3.0  # ... and up to this many times the share a flip is expected to touch (layer0.touched)

DERIVED = ("Qcur", "q_scaled", "q", "Kcur", "Krot", "Vcur", "Vrot", "k", "v", "kq", "kq_scores", "kq_soft_max",
           "kqv")  # quantities held to the layer-0 bound
DERIVED_ROWS = ("inp_embd", "attn_norm")
ERROR_MODELS = {
    "derived": "5e-5 + 2^-20|ref| + f32 summation noise + layer-0 rounding flips (q, P to the KV type; K, V "
               "stored) for at most 10% of the printed elements; NMSE <= 5e-4",
    "cascade": "5e-5 + 2^-20|ref| + TAU·rms(ref over the printed values), TAU 0.3 (quantized weights) or 0.1 (float "
               "weights); NMSE <= 5e-3",
    "derived+flash": "derived, plus the flash-attention kernel's f16 accumulation and unrounded P",
    "cascade+flash": "cascade, plus the flash-attention kernel's f16 accumulation and unrounded P",
}
