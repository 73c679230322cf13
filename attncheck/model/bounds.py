"""The error model of `--model`: how far a printed node may lie from the reference forward pass (docs/numerics.md §3).

A dump alone cannot check k·q (it needs all D_h components of q and k) nor a query whose visible slots were not
printed. The GGUF weights and the token ids give everything back: reference.py recomputes every node of the run, and
each printed node (mapping.py, chains.py: every node with a place in the reference, from the embeddings to the
logits, the nodes inside each role and the layout copies included) is compared with it at positions
[n_past, n_past + T); slots at or past n_past + T of a cache view, kq or kq_soft_max are empty and must print 0. So
are the full-tensor `sum =` lines.

Error model (per node, the JSON says which applied; terms in expect.py and layer0.py):

- always, per element: 5e-5 (the `%12.4f` print) + 2^-20·|ref| (the last f32 rounding).
- "derived": layer 0's attention (the q/k/v projections and every node up to kqv_out), inp_embd and attn_norm,
  whose inputs llama.cpp and the reference share up to f32 noise. Adds, as worst-case bounds (layer0.py): the f32
  summation noise (a float weight's n products in SIMD lanes: (n/8 + 4)·2^-24·Σ|terms|; a quantized one's exact
  integer blocks summed in f32: one term per block) and its effect downstream; and the roundings llama.cpp makes
  (attn_norm's output into each projection's vec_dot format, q into the K cache's, K and V stored, P before P·V):
  a value within the noise of the reference's rounds the other way only where a rounding midpoint lies within that
  noise of the reference's value, which the reference says exactly (steps.deviation), and then by whole steps;
  each such deviation is added in full, through k·q, softmax (exactly, by a p-weighted mean that does not grow with
  the row) and P·V. A row clear of every midpoint keeps print precision plus f32 noise. NMSE of the errors beyond
  the print's rounding <= 5e-4, test-backend-ops' bound for one MUL_MAT.
- "cascade": everything after layer 0's attention. A rounding the other way changes a value that later
  conversions round again (the next weight MUL_MAT's input quantized to 8-bit blocks or rounded to f16, q and P rounded, K and V stored in the
  cache type), so disagreements grow with depth and, past a few layers, make llama.cpp and the reference diverge
  chaotically: one element can move a lot while the node as a whole stays close. Each printed value's excess over
  print and f32 rounding is measured in units of the value's allowance unit, z = (|err| − rounding) / unit, the unit
  being the rms of the whole reference value (every token, every element but the softmax's masked zeros) times,
  for a norm's output, its row's gain rms(x)/rms(x_t) >= 1. The unit is the value's, not the node's: a value copied
  between nodes (Kcur, the K cache store, its views and permutes) has one allowance wherever it is read, and its
  class is that of the node that computed it (scores: kq and the soft-capped scores, the logits; values:
  everything else, the K cache included). A node fails when more than half its printed values lie beyond
  `systematic`·unit (the node is off as a whole), or one lies beyond `gross`·unit; the rest is reported as figures
  (the JSON's cascade_needed). Each limit is the larger of the run's own chaos, measured by the twin pass (chaos.py:
  a second reference pass whose weight MUL_MATs are moved by summation noise diverges as a correct build does;
  TWIN_GROSS·chaos_max and TWIN_SYSTEMATIC·chaos_row of the layer), and the table CASCADE, per regime (the weights'
  activation conversion: 8-bit blocks for quantized weights, f16/bf16 for float ones; the KV cache: f16/f32;
  q8_0/bf16; 4 and 5 bits; IQ4_NL), class and depth bin (DEPTH). Both were measured with scripts/calibrate.py and
  confirmed on runs the fit never saw (CASCADE's comment and chaos.py have the figures).
- "+flash": FLASH_ATTN_EXT adds its kernel's arithmetic (f16 accumulation of P·V, P not rounded, f32 q in the tiled
  kernel) to its output, in every layer. What reads that output (the output projection on) is compared with a
  reference that reads the kernel's output as the kernel computed it (flash.py: it agrees with the printed output to
  print precision), so the cascade allowance there is that of a run without flash attention.
- sums: the f32 accumulation of the printed `sum` (n·2^-24·Σ|x| + 5e-7) plus, derived, every element's allowance,
  or, cascade, gross·sqrt(n·Σref²). Dumps from before llama.cpp PR #15637 summed the printed values only; which
  meaning a run uses is decided by the first derived node whose tight bound tells them apart.
- the arithmetic of the build: an f16 src0 multiplies a contiguous f32 src1 converted to f16 (today) or as f32
  (2024 builds with llamafile's tinyBLAS); both are correct, they differ by ~1e-3 in layer 0, and the reference uses
  the one that fits layer 0's q and kqv (reference.F16_SRC1; the JSON says which).

Every element beyond its bound fails with its node, layer, head, query (and token position), slot or dim. The summary
names the first node, in graph order, that leaves print precision, and the first that fails.
"""
from __future__ import annotations

from .. import precision

PRINT = precision.PRINT
F32_REL = 2.0**-20
NMSE_MAX = 5e-4  # test-backend-ops' MUL_MAT bound: one op, identical inputs (the derived model)
# the deep-layer verdict (module doc): by (activations, KV class), node class and depth
KV_CLASS = {"f16": "float", "f32": "float", "bf16": "q8", "q8_0": "q8", "q5_0": "coarse", "q5_1": "coarse",
            "iq4_nl": "search", "q4_0": "coarse", "q4_1": "coarse"}  # coarse: 4 and 5 bits
# search: IQ4_NL, whose quantizer picks each block's scale by a search over candidates, so f32 noise in its input can
# change a whole block of 32 values by whole steps (a value of another class rounds one element the other way)
_COARSER = ("float", "q8", "coarse", "search")
SCORES = ("kq", "kq_scores")  # computed scores (and the logits); the K cache is a copy of Kcur: a value


def regime(activations: str, k_type: str, v_type: str) -> tuple[str, str]:
    """(activations, the coarser KV class of the K and V cache types)."""
    kv = max(KV_CLASS.get(k_type, "coarse"), KV_CLASS.get(v_type, "coarse"), key=_COARSER.index)
    return activations, kv


def node_class(quantity: str, role: str) -> str:
    return "scores" if quantity in SCORES or role == "result_output" else "values"


# layer 0's q, kq or kqv beyond print precision on more than this share: try the other arithmetic, keep the one with
# fewer (0: any; at 10 %, a 2024 SmolLM2 run with 17 of 1,116 beyond under the wrong one failed kqv-0 at need 1.03)
MISFIT_SHARE = 0.0

DERIVED = ("Qcur", "q_scaled", "q", "Kcur", "k_rot", "Vcur", "v_rot", "k_view", "v_view", "kq", "kq_scores",
           "kq_soft_max", "kqv")  # quantities held to the layer-0 bound
DERIVED_ROWS = ("inp_embd", "inp_pos", "attn_norm", "qkv")
ERROR_MODELS = {
    "derived": "5e-5 + 2^-20|ref| + f32 summation noise + every rounding a value within that noise can take the "
               "other way (attn_norm to the weights' format, q to the K cache's, K and V stored, P before P·V: only "
               "where a midpoint lies within the noise of the reference's value), in full; NMSE beyond print <= 5e-4",
    "cascade": "5e-5 + 2^-20|ref| + gross·unit per value, systematic·unit for more than half of them (unit: the "
               "value's rms over the whole reference, times a norm output's row gain); (systematic, gross) the larger "
               "of the run's own chaos in that layer (a twin reference pass moved by summation noise) and the table "
               "by the run's activations and KV cache type, the node's class and depth (model.cascade); NMSE "
               "reported",
    "derived+flash": "derived, plus the flash-attention kernel's f16 accumulation, unrounded P and an f32 cache's "
                     "f16 cast",
    "cascade+flash": "cascade, plus the flash-attention kernel's f16 accumulation, unrounded P and an f32 cache's "
                     "f16 cast",
}


# The deep-layer verdict (module doc): per (activations, KV class), node class and depth bin, (systematic, gross):
# a node fails when more than half its printed values lie beyond systematic·unit, or one lies beyond gross·unit.
DEPTH = (0, 1, 2, 4, 8)  # depth bins by reference layer: 0 (after its attention), 1, 2-3, 4-7, 8 and deeper
# Fitted by scripts/calibrate.py (`fit` on the `wide` and `wide-confirm` sets: 179 correct runs of 25 models — SmolLM2
# Q4_1 and F16, gemma-3-270m Q4_K_M, the random models of 10 families and 14 weight types; every KV cache type,
# prompts of 1 to 600 tokens, -ub 1 to 512, both llama.cpp builds): HEADROOM 1.5 times the largest need of each cell,
# at least one bf16 step of the rms for systematic and five for gross. Fitted on `wide` alone, `wide-confirm` had one
# false alarm (SmolLM2, 2 tokens, f32 cache: a layer-18 kq value at 1.08 times gross). Leaving each model out in
# turn, 19 of 25 models pass; gemma-3-270m (largest z 5.7 with a 4-bit cache), SmolLM2 (2.1) and four random models
# (z 0.02-0.1 in cells only they fill) need more than the others give (scripts/calibrate.py fit prints the list).
CASCADE: dict[tuple[str, str], dict[str, tuple[tuple[float, float], ...]]] = {
    ("8-bit", "float"): {"scores": ((0.0039, 0.0195), (0.0039, 0.0382), (0.0124, 0.0568), (0.0124, 0.1036),
                                   (0.0776, 0.2666)),
                         "values": ((0.008, 0.0422), (0.02, 0.145), (0.0521, 0.3735), (0.1523, 2.1492), (0.2041, 2.957))},
    ("8-bit", "q8"): {"scores": ((0.0039, 0.0195), (0.0039, 0.0596), (0.0187, 0.0621), (0.0187, 0.1099),
                                (0.0423, 0.1969)),
                      "values": ((0.0039, 0.031), (0.0174, 0.0968), (0.0205, 0.3455), (0.0514, 0.5132), (0.1086, 0.8549))},
    ("8-bit", "coarse"): {"scores": ((0.0039, 0.0195), (0.0039, 0.0195), (0.0089, 0.0195), (0.0089, 0.0195),
                                    (0.1349, 0.3916)),
                          "values": ((0.0039, 0.0291), (0.0154, 0.6708), (0.0992, 1.2563), (0.1443, 2.5496),
                                     (0.3545, 8.5699))},
    ("8-bit", "search"): {"scores": ((0.0039, 0.0195), (0.0039, 0.0195), (0.0295, 0.1114), (0.0295, 0.1114),
                                    (0.072, 0.1313)),
                          "values": ((0.0039, 0.0371), (0.0446, 0.6105), (0.062, 0.8766), (0.1907, 2.2732),
                                     (0.4833, 8.1236))},
    ("float", "float"): {"scores": ((0.0039, 0.0195),) * 5,
                         "values": ((0.0039, 0.0195), (0.0039, 0.0195), (0.0039, 0.0301), (0.0039, 0.0301),
                                    (0.0039, 0.0301))},
    ("float", "q8"): {"scores": ((0.0039, 0.0195),) * 5, "values": ((0.0039, 0.0195),) * 5},
    ("float", "coarse"): {"scores": ((0.0039, 0.0195),) * 5,
                          "values": ((0.0039, 0.0195), (0.0355, 0.1618), (0.0355, 0.1618), (0.0355, 0.1618),
                                     (0.0355, 0.1618))},
    ("float", "search"): {"scores": ((0.0039, 0.0195), (0.0039, 0.0195), (0.0039, 0.0195), (0.0039, 0.0195),
                                    (0.0554, 0.1179)),
                          "values": ((0.0039, 0.0195), (0.0082, 0.1133), (0.0206, 0.4783), (0.0619, 2.4488),
                                     (0.1772, 5.8458))},
}


def depth_bin(layer: int | None, n_layer: int) -> int:
    """The index into DEPTH of a reference layer (None: the output, after the last layer)."""
    at = n_layer if layer is None else layer
    return max(i for i, d in enumerate(DEPTH) if at >= d)


def cascade(activations: str, k_type: str, v_type: str, cls: str, layer: int | None, n_layer: int) -> tuple[float, float]:
    """(systematic, gross) of a cascade node (CASCADE)."""
    return CASCADE[regime(activations, k_type, v_type)][cls][depth_bin(layer, n_layer)]
