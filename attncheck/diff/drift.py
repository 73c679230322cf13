"""How far two correct llama.cpp builds may drift apart, per node: the allowance of `attncheck diff`'s default
verdict (the drift model; docs/numerics.md §4.2, its calibration §5.2).

Two correct builds compute the same graph with different kernels. Where a kernel rounds its activations (docs/format.md
§6: a weight MUL_MAT converts src1 to the weight's vec_dot_type, Q8 blocks for quantized weights or f16 for F16
ones; an f16 KV cache stores K and V in f16 and kq/kqv convert q and P to f16), one build may round where the other
does not (llamafile's sgemm takes f32 activations as they are), or round a value the other computed a hair apart to
the neighbouring step. Each such rounding moves a value by up to u of its size, u the unit of the conversion:

    f32 2^-24 (none)   f16 2^-11   bf16 2^-8
    Q8_0, Q8_1 (blocks of 32: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4 weights)   2.37/254 ≈ 2^-6.75
    Q8_K (blocks of 256: the K-quants, IQ2/IQ3/IQ1, IQ4_XS)                            3.05/254 ≈ 2^-6.4

(a Q8 block rounds to steps of amax/127, half a step is amax/254, and a block of 32 (256) normal values has an
amax of 2.37 (3.05) times its rms on average).

A printed node lies after n such roundings (counted on the graph: every MUL_MAT on the longest path from the
embeddings, GELU's f16 table, and every store into an f16 or quantized KV cache), and differences spread through
norms, softmax and residual additions, so the drift of a node, relative to its printed rms s, stays within

    |new − old| ≤ 1e-4 + 2^-16·|x| + A · u · n^P · s

times MEAN_FACTOR for the weighted means of V (flash attention, and attn_out, their projection), whose rms is below
that of the rows they carry. kqv and kqv_out, whose scores and V rows are printed, have an allowance derived from the
measured drift of those (mean.py); MEAN_FACTOR where they are not printed. Softmax weights move with their own size,
not the node's rms: their allowance is derived from their row's scores through the softmax (softmax.py); where no
scores node is printed in both dumps, each weight's own size in place of s, times SOFTMAX_FACTOR. A cache write
prints a handful of values: its s is that of the K or V it writes (SOURCE_OF).

The first two terms are the print precision (`--exact`); u and n are derived from the weight types (the GGUF given
with --model, else the 2024 log's `llama_model_loader: - type` lines, else Q8_K, the coarsest) and the graph; A, P
and the two factors were measured on pairs of real builds (llama.cpp of August 2024 against today's, on real and
random models of 8 architectures and 7 weight types: scripts/drift_pairs.py, scripts/drift_calibrate.py) and
confirmed on pairs not used for measuring them. Nodes before the first rounding (the embeddings, layer 0's norm)
get no allowance: there two correct builds agree to print precision.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ..dump.graph import Evaluation
from ..dump.roles import LAYOUT, Roles

# unit of each activation conversion, by ggml type name of the weight (or cache) that implies it
F16_UNIT, BF16_UNIT, F32_UNIT = 2.0**-11, 2.0**-8, 2.0**-24
Q8_UNIT, Q8K_UNIT = 2.37 / 254, 3.05 / 254  # half a step of a Q8 block, relative to the rms of 32 (256) values
Q8K_TYPES = ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s",
             "iq1_m", "iq4_xs", "tq1_0", "tq2_0")
A = 5.0  # measured: the largest need was 3.24 on the calibration set and 4.10 on the held-out one
P = 0.6  # measured: the growth with depth, between sqrt(n) (independent roundings) and n (all of one sign)
MEAN_ROLES = ("kqv", "kqv_out", "flash_attn", "attn_out")  # weighted means of V (and their projection): their
MEAN_FACTOR = 2.0  # rms is below that of the V rows they carry; measured: their largest need 6.35
SOFTMAX_ROLES = ("kq_soft_max",)  # a weight moves with its own size: |ΔP_j| ≤ P_j·(e^(|Δx_j| + L) − 1), softmax.py
SOFTMAX_FACTOR = 1.5  # on P_j instead of the rms, where no scores are printed in both; measured: largest need 4.45
SOURCE_OF = {"k_store": ("Kcur", "k_view"), "v_store": ("Vcur", "v_view")}  # a cache write carries their values
ROUNDING_OPS = ("MUL_MAT", "MUL_MAT_ID", "GELU")  # GELU reads an f16 table (docs/format.md §6)
STORE_OPS = ("SET_ROWS", "CPY")


# half a step of a KV cache type's own rounding, relative to the rms of a block of 32 normal values (amax 2.37 rms,
# max - min 4.1 rms on average): what a value stored in another basis by each build (basis.py) moves by
STORE_UNIT = {"q8_0": 2.37 / 254, "q5_0": 2.37 / 32, "q4_0": 2.37 / 16, "q5_1": 4.1 / 62, "q4_1": 4.1 / 30,
              "iq4_nl": 2.37 * 12 / 127}  # IQ4_NL: its table's widest gap, 24 of 127 units of amax


def unit_of_store(name: str) -> float:
    """The unit of a KV cache write of this type when the two builds write it in different bases (its own rounding,
    which then falls anywhere in the step on either side), else unit_of_type's."""
    return STORE_UNIT.get(name.lower(), unit_of_type(name))


def unit_of_type(name: str) -> float:
    """The unit of the activation rounding a weight (or KV cache) of this ggml type implies."""
    t = name.lower()
    if t in ("f32", "f64", "i32", "i16", "i8"):
        return F32_UNIT
    if t == "f16":
        return F16_UNIT
    if t == "bf16":
        return BF16_UNIT
    return Q8K_UNIT if t in Q8K_TYPES else Q8_UNIT  # quantized weights: activations to Q8 blocks (Q8_0, Q8_1, Q8_K)


@dataclass(frozen=True)
class Unit:
    """u: the coarsest activation rounding either build may do, and where that was learnt."""

    value: float
    origin: str

    @classmethod
    def of(cls, weight_types: Iterable[str] | None, cache_types: Iterable[str], origin: str,
           rebased: Iterable[str] = ()) -> "Unit":
        """rebased: the cache types the two builds store in different bases (basis.py), whose own rounding counts."""
        caches = [t for t in cache_types if t]
        moved = sorted({t for t in rebased if t})
        stores = [unit_of_store(t) for t in moved]
        why = f"; KV cache {'/'.join(moved)} stored in another basis by each build: its own rounding" if moved else ""
        if weight_types is None:
            return cls(max([Q8K_UNIT, *map(unit_of_type, caches), *stores]),
                       "weight types unknown (no --model, no types in either log): Q8 activations assumed" + why)
        types = sorted({t.lower() for t in weight_types})
        u = max([F32_UNIT, *map(unit_of_type, types), *map(unit_of_type, caches), *stores])
        cache = f", KV cache {'/'.join(sorted(set(caches)))}" if caches else ""
        return cls(u, f"weights {', '.join(types)} ({origin}){cache}{why}")


@dataclass(frozen=True)
class DriftModel:
    """The allowance of a node's elements beyond print precision, relative to its printed rms."""

    unit: Unit
    a: float = A
    p: float = P

    def to_dict(self) -> dict:
        return {"a": self.a, "p": self.p, "unit": self.unit.value, "unit_origin": self.unit.origin,
                "mean_roles": list(MEAN_ROLES), "mean_factor": MEAN_FACTOR, "softmax_roles": list(SOFTMAX_ROLES),
                "softmax_factor": SOFTMAX_FACTOR,
                "formula": "|new - old| <= atol + rtol*|x| + a*factor*unit*roundings^p*scale"}

    def rho(self, roundings: int, role_name: str) -> float:
        """Allowed |new − old| beyond print precision, as a fraction of the node's printed rms (of each element's
        own size for softmax weights: elementwise(role_name))."""
        if roundings <= 0:
            return 0.0
        base = role_name.split(".")[0]
        factor = MEAN_FACTOR if base in MEAN_ROLES else SOFTMAX_FACTOR if elementwise(role_name) else 1.0
        return self.a * factor * self.unit.value * roundings ** self.p


def elementwise(role_name: str) -> bool:
    """Softmax weights drift in proportion to their own size, not to the node's rms."""
    return role_name in SOFTMAX_ROLES


def roundings(ev: Evaluation) -> dict[int, int]:
    """id(node) → how many activation roundings lie on the longest path from the graph's inputs to the node: every
    MUL_MAT (and GELU's f16 table), and every store into a cache narrower than f32. A view of an unprinted tensor
    (the KV cache) counts as the latest cache write before it."""
    out: dict[int, int] = {}
    latest = 0
    for n in ev.nodes:
        sources = n.inputs[:1] if n.op in STORE_OPS else n.inputs  # a write's src1 is where, not what
        k = max((out.get(id(s), 0) for s in sources if s is not None), default=0)
        if n.op in LAYOUT and all(s is None for s in n.inputs):
            k = max(k, latest)
        if n.op in ROUNDING_OPS or (n.op in STORE_OPS and n.type not in ("f32", "f64")):
            k += 1
        if n.op in STORE_OPS:
            latest = k
        out[id(n)] = k
    return out


def cache_types(ev: Evaluation, roles: Roles) -> set[str]:
    """The KV cache's types, as its printed views say."""
    return {r[v].type for r in roles.layers for v in ("k_view", "v_view") if v in r}


def weight_types_of(model) -> tuple[tuple[str, ...], str]:
    """The ggml types of a model's matrices (what its MUL_MATs convert activations for), from its GGUF header, and
    where they were read. model: a path, or the context the command opened (arch/context.py)."""
    from gguf import GGMLQuantizationType

    from ..arch.context import open_model

    c = open_model(model)
    types = {GGMLQuantizationType(t.type).name.lower() for t in c.header.tensors.values() if len(t.ne) >= 2}
    return tuple(sorted(types)), f"--model {c.path}"
