"""Layer 0's kqv bound at the elements a node prints, as what kqv is: a P-weighted mean of V (docs/numerics.md §3.2).

layer0.py bounds kqv slot by slot: each weight's worst move, the normaliser's included, against |V_j| (or V's common
offset). But llama.cpp's P is the softmax of scores s + Δ, so the mean moves by exactly

    f(Δ) − f = Σ_j P_j (e^{Δ_j} − 1)(V_j − f) / Σ_j P_j e^{Δ_j}    (both weight sets sum to 1),

each weight's move counted once and centred on the row's own mean f. And Δ_j = s·Σ_d Δq_d k_jd + E_j: q is rounded
once for every key, so its part goes through Σ_d Δq_d Σ_j P_j k_jd (V_j − f), where the keys' terms cancel. Every
term is still a worst case. A matmul per (head, query) row ([D_v, n] by [n, D_h]), so only a node's printed
elements get it; each keeps the smaller of the two bounds.
"""
from __future__ import annotations

import numpy as np

from .expect import Expected
from .layer0 import U32, gamma, kq_deviation, weight_deviation
from .steps import deviation, round_to, step

QUANTITIES = ("kqv", "kqv@flash")  # the layer-0 noise() quantities this bounds


def refined(exp: Expected, quantity: str, at: tuple[np.ndarray, ...]) -> np.ndarray:
    """exp.noise(quantity) ([H, T, D_v]), lowered to weighted_mean's bound at the canonical indices `at` (one array
    per axis: a node's printed elements), each (head, query, dim) once per run."""
    whole = exp.noise(quantity)
    done = exp._cache.setdefault(("refined", quantity), set())  # type: ignore[arg-type]
    rows: dict[tuple[int, int], set[int]] = {}
    for h, t, d in zip(*(np.asarray(a).ravel().tolist() for a in at)):
        if (h, t, d) not in done:  # type: ignore[operator]
            rows.setdefault((h, t), set()).add(d)
    for (h, t), dims in rows.items():
        ds = np.array(sorted(dims))
        bound = weighted_mean(exp, h, t, ds, quantity == "kqv@flash")
        if bound is not None:
            whole[h, t, ds] = np.minimum(whole[h, t, ds], bound)  # type: ignore[index]
        done.update((h, t, int(d)) for d in ds)  # type: ignore[attr-defined]
    return whole  # type: ignore[return-value]


def weighted_mean(exp: Expected, h: int, t: int, dims: np.ndarray, flash: bool) -> np.ndarray | None:
    """[len(dims)]: a bound on |llama.cpp's kqv − the reference's| at query head h, query t and dims (module doc);
    then llama.cpp's softmax roundings, P rounded into the V cache's float type (half a step of llama.cpp's weight,
    and the reference's own rounding, known), V's deviations and the dot product's noise. flash: FLASH_ATTN_EXT's,
    which reads P unrounded. None where a score may move by 30 (the linear split means nothing there) or where P's
    row does not sum to 1 (a sink's share: layer0's _centred keeps those rows out too)."""
    r, rd, n_vis = exp.ref, exp._read(), t + 1
    kv = h // exp.group
    q = np.asarray(r.get(0, "q")[t, h], np.float64)  # [D]
    kt = np.asarray(r.get(0, "k_view")[kv, :n_vis], np.float64)  # [n, D]: the slots query t reads (P 0 if masked)
    vt = np.asarray(r.get(0, "v_view")[kv, :, :n_vis], np.float64)  # [D_v, n]
    pt = np.asarray(r.get(0, "kq_soft_max")[h, t, :n_vis], np.float64)  # [n]
    aq, ak, dq = np.abs(q), np.abs(kt), rd["dq"][h, t]
    rows = {"dq": dq, "dk": rd["dk"][h, :n_vis]} | ({"ds": rd["ds"][h, t], "mins": rd["mins"][h, :n_vis]}
                                                   if "ds" in rd else {})
    common, whole = kq_deviation(aq, ak, rows)  # [n] each
    cap = r.hparams.softcap
    if cap:  # tanh between kq and the scores: no common Δq term
        a = np.zeros(n_vis)
        y = exp.scale * (whole + 4 * U32 * (np.abs(np.asarray(r.get(0, "kq_scores")[h, t, :n_vis])) + cap))
    else:
        a = exp.scale * common  # what Δq moves each score by, at most
        y = exp.scale * (whole - common)  # each key's own: the dot product's noise, Δk, Δq·Δk, the Q8_1 sums
    x = a + y  # |Δ_j| <= x_j, in softmax's units
    if x.max(initial=0.0) >= 30.0:
        return None
    ex = np.exp(x)
    dp = weight_deviation(pt, ex, n_vis)  # layer0's per-slot bound
    sigma = pt.sum()
    if abs(sigma - 1) > 16 * U32:
        return None
    ph = pt / sigma  # weights that sum to 1
    vd = vt[dims]  # [m, n]
    f = vd @ ph  # [m]: the row's mean
    vc = vd - f[:, None]
    z_min = float(ph @ np.exp(-x))  # Σ_j P_j e^{Δ_j} >= this
    common = 0.0 if cap else exp.scale * (np.abs((vc * ph) @ kt) @ dq)  # [m]: Σ_d Δq_d |Σ_j P_j k_jd (V_j − f)|
    moved = (common + np.abs(vc) @ (ph * (y + np.expm1(x) - x))) / z_min  # e^Δ − 1 − Δ <= e^x − 1 − x
    av = np.abs(vd)
    out = moved + (n_vis + 4) * U32 * (av @ (ph * ex)) / z_min + abs(1 / sigma - 1) * np.abs(vd @ pt)
    fmt = "f32" if flash else exp._p_format()
    dpv = dp
    if fmt != "f32":  # P rounded into fmt: llama.cpp's weight by at most half a step, the reference's as it did
        dpv = deviation(pt, dp, fmt)
        top = np.minimum(pt + dp, 1.0)  # llama.cpp's weight at most: exp(s_j − max) <= 1 over a sum >= 1
        out = out + av @ (step(top, fmt) / 2) + np.abs(vd @ (np.asarray(round_to(pt, fmt), np.float64) - pt))
    dv = rd["dv"][h, dims, :n_vis]  # llama.cpp's weight is within dpv of the reference's rounded one
    weight = pt + dpv + (step(pt, fmt) / 2 if fmt != "f32" else 0.0)
    out = out + dv @ weight + gamma(n_vis) * (av @ pt)
    return out if np.isfinite(out).all() else None
