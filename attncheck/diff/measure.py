"""One matched node's printed elements, measured: the largest difference and where, NMSE, its scale and drift
under the drift model, the tolerance it would have needed, and its `sum =` lines."""
from __future__ import annotations

import numpy as np

from .. import precision
from ..dump.graph import Evaluation
from ..dump.sample import Sample, parse_sample
from ..errors import DumpError
from ..results import needed, within
from .align import Aligned
from .drift import SOURCE_OF, elementwise
from .nodes import SLACK, DiffTolerance, NodeDiff, SumDiff


def store_scales(ev: Evaluation, roles, source: str) -> dict[tuple, float]:
    """(layer, k_store | v_store) → the rms of the values it writes, read from its source or the cache view (a
    cache write prints a handful of values, too few for a scale of their own)."""
    out: dict[tuple, float] = {}
    for layer, r in enumerate(roles.layers):
        for store, sources in SOURCE_OF.items():
            if store not in r:
                continue
            for name in sources:
                n = r.get(name)
                if n is None or n.quantized or n.cut:
                    continue
                try:
                    v = parse_sample(n, source).values
                except DumpError:
                    continue
                v = v[np.isfinite(v)]
                if v.size:
                    out[(layer, store)] = max(out.get((layer, store), 0.0), float(np.sqrt(np.mean(v ** 2))))
    return out


def measure(nd: NodeDiff, al: Aligned, tol: DiffTolerance, scale_floor: float = 0.0,
            allowance: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """max abs/rel error, NMSE, the worst element and the tolerance that would have been needed; under the drift
    model, the node's scale (OLD's rms over the elements printed in both, or the elements' own size for softmax
    weights; a cache write's is at least its source's, scale_floor) and its drift beyond print precision relative to it.

    allowance: (each element's allowed |new − old| beyond print precision, its size) in place of the drift model's
    nd.allowed × size (softmax.py's, derived per weight); nd.drift and nd.allowed are then those of the element
    that needs the most of its allowance."""
    a, b = al.old, al.new
    fin = np.isfinite(a) & np.isfinite(b)
    finite = bool(fin.all())
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        err, mag, same, delta = _err_mag(a, b, fin, finite)
        a_fin, b_fin = (a, b) if finite else (a[fin], b[fin])
        # OLD's rms (the build trusted so far): a value moved in NEW does not widen its own tolerance
        nd.scale = max(float(np.sqrt(np.mean(a_fin ** 2))) if a_fin.size else 0.0, scale_floor)
        t = tol.bound(mag)
        if allowance is None:
            size = mag if elementwise(nd.role.name) else nd.scale
            beyond = _beyond(np.maximum(err - t, 0.0), size)
            nd.drift = float(np.max(beyond)) if len(beyond) else 0.0
            t = t + nd.allowed * size
        else:
            allowed, size = allowance
            beyond = _beyond(np.maximum(err - t, 0.0), size)
            frac = allowed / size
            k = int(np.argmax(_beyond(beyond, frac)))
            nd.drift, nd.allowed = float(beyond[k]), float(frac[k])
            t = t + allowed
        ratio = needed(err, t)
        rel = needed(err, mag)
        num, den = float(np.sum((delta if finite else delta[fin]) ** 2)), float(np.sum(b_fin ** 2))
        need_r = np.where(err <= tol.atol, 0.0, (err - tol.atol) / mag)
    w = int(np.argmax(ratio))
    nd.compared = len(a)
    nd.failed = int(np.count_nonzero(~within(err, t + SLACK)))
    nd.max_abs, nd.max_rel = float(err.max()), float(rel.max())
    nd.nmse = np.inf if not finite and not same.all() else (num / den if den > 0 else (0.0 if num == 0 else np.inf))
    nd.tol, nd.ratio = float(t[w]), float(ratio[w])
    nd.needed_atol = float(np.max(np.maximum(err - tol.rtol * mag, 0.0)))
    nd.needed_rtol = float(need_r.max())
    nd.worst, nd.worst_old, nd.worst_new = al.where(w), float(a[w]), float(b[w])
    if tol.nmse:
        nd.nmse_max = tol.nmse_max(nd.new.op)
        nd.ratio = nd.nmse / nd.nmse_max if nd.nmse else 0.0


def _beyond(over: np.ndarray, size: np.ndarray | float) -> np.ndarray:
    """Each element's excess over print precision relative to its size (inf where it exceeds a size of 0). The
    node's rms is one number for all its elements: divided by it directly, not through an array of copies of it."""
    if isinstance(size, np.ndarray):
        return np.where(size > 0, over / np.where(size > 0, size, 1.0), np.where(over > 0, np.inf, 0.0))
    return over / size if size > 0 else np.where(over > 0, np.inf, 0.0)


def _err_mag(a: np.ndarray, b: np.ndarray, fin: np.ndarray, finite: bool) -> tuple:
    """|b - a| per element (0 where equal or both NaN, inf where either is not finite), max(|a|, |b|) (0 where either
    is not finite), which elements are equal (None when all are finite: not needed then) and b - a. When every
    element is finite (the common case) the masks are skipped: they change no value there."""
    delta = b - a
    if finite:  # equal finite values differ by ±0.0, whose abs is the 0.0 the mask would put there
        return np.abs(delta), np.maximum(np.abs(a), np.abs(b)), None, delta
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    err = np.where(same, 0.0, np.where(fin, np.abs(delta), np.inf))
    return err, np.where(fin, np.maximum(np.abs(a), np.abs(b)), 0.0), same, delta


def full_sum(s: Sample) -> bool:
    """The `sum =` line is of the whole tensor: nothing elided, or too far from the printed values' sum for a sum
    of printed values only (llama.cpp before PR #15637)."""
    if s.complete:
        return True
    for block, total in zip(s.values, s.sums):
        printed = float(_nansum(block))
        slack = block.size * precision.PRINT + precision.SUM_PRINT + 1e-6 * float(_nansum(np.abs(block)))
        if not abs(total - printed) > slack:
            return False
    return True


def sum_diff(sa: Sample, sb: Sample, tol: DiffTolerance, drift: float = 0.0) -> SumDiff | None:
    """Sums of equal-ne full tensors: 2·5e-7 for the two `%f` prints, n·sum_atol, plus rtol and f32 accumulation
    (n·2^-24, docs/format.md §6) of Σ|x|, estimated as n times the mean printed |x|; plus n times the drift each element
    may show (drift model)."""
    if not (full_sum(sa) and full_sum(sb)):
        return None
    n0, n1, n2, _ = sa.node.ne
    n = n0 * n1 * n2
    worst: SumDiff | None = None
    for i, (x, y) in enumerate(zip(sa.sums, sb.sums)):
        with np.errstate(invalid="ignore"):
            mag = n * max(float(_nanmean(np.abs(sa.values[i]))), float(_nanmean(np.abs(sb.values[i]))), 0.0)
        d = SumDiff(x, y, 2 * precision.SUM_PRINT + n * (tol.sum_atol + drift) + (tol.rtol + n * precision.F32) * mag)
        if worst is None or d.diff / d.tol > worst.diff / worst.tol:
            worst = d
    return worst


def _nansum(x: np.ndarray):
    """np.nansum(x), without its copy and mask when a C-contiguous x holds no NaN: the same sum of the same values
    in the same memory order, so the same bits (np.nansum was a third of sum_diff's time). A sum that is not NaN
    says x holds none; one that is (a NaN, or inf - inf) is redone by np.nansum."""
    if x.flags.c_contiguous:
        total = np.add.reduce(x, axis=None)
        if total == total:
            return total
    return np.nansum(x)


def _nanmean(x: np.ndarray):
    """np.nanmean(x) the way nanmean computes it (sum, then divided by the count), without its copy and mask when
    a non-empty C-contiguous x holds no NaN."""
    if x.size and x.flags.c_contiguous:
        total = np.add.reduce(x, axis=None)
        if total == total:
            return total / np.intp(x.size)
    return np.nanmean(x)
