"""How far a correct build may drift from the reference past layer 0, measured on the run itself (docs/numerics.md
§3.3): the twin pass.

Past layer 0, llama.cpp and the reference part ways chaotically: their f32 sums differ in order, so now and then a
value lies on the other side of a rounding midpoint of the next conversion (an activation quantized to 8-bit blocks,
K or V stored in a 4-bit cache, an IQ4_NL block whose scale a search picks), and what follows moves by whole steps.
How much depends on the model, the prompt and the cache type, which a table fitted on other runs cannot know. So the
reference runs twice: the second pass, the twin, moves every weight MUL_MAT's output by noise of the size by which
another summation order moves it (TWIN_JITTER), and diverges from the first as a correct llama.cpp does.
Its divergence per layer, in the units of the cascade allowance (the rms of each value), is the run's own chaos:

    chaos_max(layer)  the largest |twin − reference| / rms over every node of the layer, every token and element
    chaos_row(layer)  the largest, over the layer's nodes and their rows, of a row's median |twin − reference| / rms

A printed value fails only beyond TWIN_GROSS·chaos_max (and the calibrated table's gross), a node as a whole only
beyond TWIN_SYSTEMATIC·chaos_row (and the table's systematic): the factors are measured on correct runs and confirmed
on runs they never saw (scripts/calibrate.py).
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np


# The twin's chaos times these is what a printed value (gross) and a node as a whole (systematic) may move past layer
# 0: HEADROOM 1.5 times the largest ratio of a correct run's need to its twin's chaos, over the 315 runs of the `wide`
# and `iq4` sets (scripts/calibrate.py fit: 1.74 and 1.47, SmolLM2 F16 on the 2024 build and gemma-3-270m). Held out,
# on the 121 runs of `iq4-confirm` and `wide-confirm`, the largest ratios were 1.50 and 1.33: no false alarm, with or
# without the table; leaving each of 28 models out in turn, none either (docs/numerics.md §5.1)
TWIN_GROSS = 2.62
TWIN_SYSTEMATIC = 2.21


# The twin pass's perturbation of each weight MUL_MAT output y [T, n_out] with n_in inputs: uniform in
# ±TWIN_JITTER·2^-24·sqrt(n_in)·rms(y's row), the size of the f32 summation noise by which llama.cpp's sums differ
# from the reference's (their order differs), a few times over, so that the twin rounds values the other way at least
# as often
TWIN_JITTER = 4.0
TWIN_SEED = 1  # fixed: the same run gives the same verdict


def jitter(y: np.ndarray, n_in: int, rng: np.random.Generator) -> np.ndarray:
    """y [T, n_out] moved as another f32 summation order could move it (the twin pass)."""
    rms = np.sqrt(np.mean(np.square(y, dtype=np.float64), axis=-1, keepdims=True))
    moved = rng.uniform(-1, 1, y.shape)
    moved *= TWIN_JITTER * 2.0**-24 * np.sqrt(n_in) * rms
    moved += y
    return moved.astype(np.float32)


def divergence(tensors: Mapping, twin: dict, layer: int | None, last: int, rms: dict | None = None
               ) -> tuple[float, float]:
    """(chaos_max, chaos_row) of one layer from the two passes' nodes, keyed (layer, role) (layer None: the output
    and the last l_out before it): measured as the forward pass goes (reference.forward_layers). The twin's nodes
    are taken out of `twin` as they are measured: they are read nowhere else. rms: each measured array's live_rms is
    put there (by where(), with the array), for the cascade allowance's unit to read instead of computing it again."""
    worst, row = 0.0, 0.0
    # a value kept under two keys in both passes (Vcur and Vcur@proj, q and q_scaled, kq_scores and kq: the same
    # arrays) is measured once; the pairs are held until the end, so that no id is reused meanwhile
    measured: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for key, a in tensors.items():
        if not (key[0] == layer or (layer is None and key[0] == last and key[1] == "l_out")):
            continue
        t = twin.pop(key, None)
        if t is None or t.shape != a.shape or a.size == 0:
            continue
        same = measured.get(id(a))
        if same is not None and same[0] is a and same[1] is t:
            continue
        measured[id(a)] = (a, t)
        a32 = np.asarray(a, np.float32)
        unit = live_rms(a32)
        if rms is not None and a32 is a:
            rms[where(a)] = (a, unit)
        m, r = _divergence(a32, np.asarray(t, np.float32), unit)
        worst, row = max(worst, m), max(row, r)
    return worst, row


def where(a: np.ndarray) -> tuple:
    """What names the elements an array views, whichever object views them (a value, its [None] view): their
    address, shape, strides and type, leading axes of one left out."""
    a = np.asarray(a)
    while a.ndim and a.shape[0] == 1:
        a = a[0]
    return a.__array_interface__["data"][0], a.shape, a.strides, a.dtype.str


def kept_rms(rms: Mapping, a: np.ndarray) -> float:
    """live_rms(a), from `rms` when divergence() measured the same elements (where())."""
    got = rms.get(where(a))
    return got[1] if got is not None else live_rms(a)


def layer_chaos(ref, layer: int | None) -> tuple[float, float]:
    """(chaos_max, chaos_row) of one layer of a reference.Reference (its chaos, measured by forward_layers as it
    went; not imported: reference.py imports this module), (0, 0) without a twin."""
    return ref.chaos.get(layer, (0.0, 0.0))


def _divergence(a: np.ndarray, t: np.ndarray, rms: float) -> tuple[float, float]:
    """|t − a| in units of rms, a's live_rms (exact zeros, the softmax's masked weights, left out): the largest, and
    the largest median of a row (the last axis)."""
    if rms == 0:
        return 0.0, 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        z = np.subtract(t, a, dtype=np.float32)  # f32 (the values' own type): the median's partition is the cost
        np.abs(z, out=z)
        z *= np.float32(1 / rms)
    top = z.max()
    if not np.isfinite(top):
        z[~np.isfinite(z)] = 0
        top = z.max()
    return float(top), _largest_row_median(z.reshape(-1, z.shape[-1]))


def live_rms(a: np.ndarray) -> float:
    """The rms of a's nonzero elements (exact zeros, the softmax's masked weights, left out), summed in f64: the unit
    of the cascade allowance (node_expectation.py) and of the twin's divergence."""
    n = np.count_nonzero(np.not_equal(a, 0))  # as count_nonzero(a) counts (NaN too), 5x faster on floats
    if n == 0:
        return 0.0
    flat = np.asarray(a).reshape(-1)
    return float(np.sqrt(np.einsum("i,i->", flat, flat, dtype=np.float64) / n))


def _largest_row_median(z: np.ndarray) -> float:
    """max over rows of np.median(row), z [rows, n], exactly, with few rows partitioned (the partition was most of the
    twin's cost): the largest median among the 64 rows of largest mean is a floor L; a row's median exceeds L only
    if at least n // 2 of its values do, and only those rows are partitioned."""
    n = z.shape[-1]
    top = np.argpartition(z.mean(axis=-1), max(0, len(z) - 64))[-64:]
    best = float(_medians(z[top]).max())
    above = np.flatnonzero(np.greater(z, best).view(np.uint8).sum(axis=-1, dtype=np.int64) >= n // 2)
    if above.size:
        best = max(best, float(_medians(z[above]).max()))
    return best


def _medians(rows: np.ndarray) -> np.ndarray:
    """np.median(rows, axis=-1) of finite rows [k, n], bit for bit (the middle value, or the mean of the two in the
    rows' type), with one partition instead of np.median's two-index one (10x faster)."""
    n = rows.shape[-1]
    part = np.partition(rows, n // 2, axis=-1)
    hi = part[:, n // 2]
    if n % 2:
        return hi
    lo = part[:, :n // 2].max(axis=-1)  # every value left of the partition point is at most hi
    return np.mean(np.stack([lo, hi]), axis=0)
