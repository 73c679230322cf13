"""Parameters of a hypothesis fitted on a run's printed rows: the scale the weights give (and whether it is a round
value), ALiBi's max_bias from head 0's slope, a sliding window from the printed zeros, each head's sink logit from
its whole rows. Each fit is then scored like any hypothesis (scoring.py): a fit never passes a row by itself."""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .. import precision
from ..arch.facts import DEFAULT, INFERRED, AttentionFacts, Fact, Window
from ..arch.header import inv_sqrt
from . import checks
from ..sites.heads import SiteView, Under, stacks
from ..sites.resolve import Extra, site_facts, sites_facts
from .scoring import Scored


def inferred_scale(views: list[SiteView], facts: AttentionFacts) -> tuple[float, int] | None:
    """The scale the printed weights and scores give (pooled least squares over the run), and the rows used."""
    num = den = 0.0
    rows = 0
    for _, st in stacks(views, sites_facts(facts, views)):
        n, d, r = checks.infer_scale(st)
        num, den, rows = num + n, den + d, rows + r
    return (num / den, rows) if den > 0 else None


class FittedScale(NamedTuple):
    """The SOFT_MAX scale every printed row's weight ratios agree on, per D_h: the middle of the interval common to
    all of them, its half-width (which widens every bound under it), and the rows it rests on."""

    scale: dict[int, float]  # D_h → scale
    err: float  # the largest half-width over the D_h groups
    rows: int


def fit_scale(views: list[SiteView], facts: AttentionFacts) -> FittedScale | None:
    """One scale per D_h for the whole run, from ln(p_j/p_k) = scale·(s_j − s_k) between printed visible slots of a
    row (k the row's largest printed weight): each pair, with the print precision of both weights and both scores,
    gives an interval of scales; the fit is the interval common to every pair of every row of the run's sites of that
    D_h. None when no pair tells a scale, or when the intervals of one D_h have nothing in common: then no single
    scale explains the rows, and a fit must not explain a wrong value away (never one scale per layer)."""
    lo: dict[int, float] = {}
    hi: dict[int, float] = {}
    rows: dict[int, int] = {}
    for _, st in stacks(views, sites_facts(facts, views)):
        got = _scale_intervals(st)
        if got is None:
            continue
        a, b, n = got
        D_h = st.views[0].site.D_h
        lo[D_h], hi[D_h] = max(lo.get(D_h, -math.inf), a), min(hi.get(D_h, math.inf), b)
        rows[D_h] = rows.get(D_h, 0) + n
    if not rows or any(not (0 < lo[d] <= hi[d] < math.inf) for d in rows):
        return None
    return FittedScale({d: (lo[d] + hi[d]) / 2 for d in rows}, max((hi[d] - lo[d]) / 2 for d in rows),
                       sum(rows.values()))


def _scale_intervals(st) -> tuple[float, float, int] | None:
    """The interval of scales common to every usable pair of a stack's rows, and how many rows gave a pair."""
    if st.S is None:
        return None
    P, S = st.P, st.S  # [s, h, t, j]
    vis = np.broadcast_to(st.visible[:, None], P.shape)
    k = np.where(vis, P, -1.0).argmax(axis=-1)[..., None]  # the row's largest printed visible weight
    p_k, s_k = np.take_along_axis(P, k, -1), np.take_along_axis(S, k, -1)
    e = precision.PRINT
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        D = S - s_k
        d_lo, d_hi = D - 2 * e, D + 2 * e  # both scores printed within e
        use = vis & (np.arange(P.shape[-1]) != k) & (P > e) & (p_k > e) & np.isfinite(D) & ((d_lo > 0) | (d_hi < 0))
        if st.bias is not None:
            use &= np.isfinite(st.bias)
        if not use.any():
            return None
        b = 0.0 if st.bias is None else (st.bias - np.take_along_axis(st.bias, k, -1))
        l_lo = np.log((P - e) / (p_k + e)) - b
        l_hi = np.log((P + e) / np.maximum(p_k - e, 1e-300)) - b
        # f32: SOFT_MAX rounds x = s·scale and exp's result; a few units of 2^-24 of |x|, at the pair's own scale
        slack = 4 * precision.F32 * (2 + (np.abs(S) + np.abs(s_k)) * np.maximum(1.0, np.abs(l_hi / D)))
        l_lo, l_hi = l_lo - slack, l_hi + slack
        corners = np.stack([l_lo / d_lo, l_lo / d_hi, l_hi / d_lo, l_hi / d_hi])
    c = corners[:, use]
    return float(c.min(axis=0).max()), float(c.max(axis=0).min()), int(use.any(axis=-1).sum())


def round_scale(s: float, rel: float = 2e-4) -> float | None:
    """s as a round value llama.cpp uses (1/sqrt(n) for an integer n, 2^-k), when within rel of one. Neighbouring
    1/sqrt(n) lie 1/(2n) apart (relative): past n ~ 1/(4·rel) nearly every scale is near one, so 1/sqrt(n) is taken
    only within a quarter of that spacing (a scale that is no round value is the fitted one, fits.fit_scale)."""
    if not s > 0:
        return None
    n = round(1.0 / (s * s)) if s < 1 else 0
    cands = ((inv_sqrt(n), min(rel, 1 / (4 * n))) if n else None, (2.0 ** round(math.log2(s)), rel))
    for cand in cands:
        if cand and abs(cand[0] / s - 1) < cand[1]:
            return float(np.float32(cand[0]))
    return None


# ---- ALiBi ---------------------------------------------------------------------------------------------------

def alibi_candidates(views: list[SiteView], facts: AttentionFacts) -> list[float]:
    """max_bias 8, and the max_bias head 0's slope gives when it is a multiple of 1/2."""
    out = [8.0]
    slopes = []
    for v in views:
        if v.S is None or not len(v.heads) or v.heads[0] != 0:
            continue
        u = Under(v, site_facts(facts.with_(alibi_max_bias=Fact(0.0, DEFAULT)), v))
        P, S = v.P[0], v.S[0]  # head 0: [t, j]
        pos = (v.geometry.n_past + v.queries)[:, None]
        k_pos = v.geometry.slot_base + v.slots
        for t in range(P.shape[0]):
            ok = u.visible[t] & (P[t] > 1e-3)
            j = np.flatnonzero(ok)
            if len(j) < 2:
                continue
            a, b = j[:, None], j[None, :]
            dist = (np.abs(pos[t] - k_pos[b]) - np.abs(pos[t] - k_pos[a])).astype(float)
            use = dist != 0
            with np.errstate(divide="ignore", invalid="ignore"):  # a non-finite score: the finite check fails it
                m = (np.log(P[t][a] / P[t][b]) - u.scale * (S[t][a] - S[t][b]))[use] / dist[use]
            slopes.extend(m.tolist())
    if slopes:
        m0 = float(np.median(slopes))
        H = views[0].site.H
        n2 = 1 << int(np.floor(np.log2(H)))
        if 0 < m0 < 1:
            mb = -n2 * math.log2(m0)
            snapped = round(mb * 2) / 2
            if abs(mb - snapped) < 0.05 and snapped not in out and snapped > 0:
                out.append(snapped)
    return out


# ---- sliding window ------------------------------------------------------------------------------------------

def fit_window(views: list[SiteView], best: Scored) -> Fact | None:
    """Per layer, the distances at which a slot is surely visible (printed weight) or surely masked (printed 0 where
    its ratio to the row's largest weight predicts weight); the one n_swa that leaves the fewest of them
    unexplained over all layers, each layer windowed where that explains more than no window does."""
    facts = best.facts.with_(window=Fact(None, DEFAULT))
    kind = "standard" if facts.causal.value else "symmetric"
    seen: dict[int, tuple[list[np.ndarray], list[np.ndarray]]] = {}  # layer → (visible distances, masked distances)
    for v in views:
        if v.S is None:
            continue
        u = Under(v, site_facts(facts, v, best.extra))
        vis = u.visible  # [t, j] without a window
        P = v.P
        x = u.scaled()
        Pv = np.where(vis[None], P, -1.0)
        k = Pv.argmax(axis=-1)[..., None]
        p_ref = np.take_along_axis(P, k, -1)
        with np.errstate(over="ignore", invalid="ignore"):
            pred = p_ref * np.exp(x - np.take_along_axis(x, k, -1))
        d = (v.geometry.n_past + v.queries)[:, None] - (v.geometry.slot_base + v.slots)[None, :]
        d = np.broadcast_to(d if kind == "standard" else np.abs(d), P.shape)
        surely_visible = vis[None] & (P > 0)
        surely_masked = vis[None] & (P == 0) & (pred > 10 * precision.PRINT) & (p_ref > precision.PRINT)
        V, M = seen.setdefault(v.site.layer, ([], []))
        V.append(d[surely_visible])
        M.append(d[surely_masked])
    dist = {L: (np.concatenate(V), np.concatenate(M)) for L, (V, M) in seen.items()}
    if not any(len(M) for _, M in dist.values()):
        return None
    # standard: masked iff d >= n; symmetric: masked iff d > n // 2, i.e. d >= n // 2 + 1 =: cut
    cuts = sorted({int(c) for _, M in dist.values() for c in M})
    best_cut, best_bad, layers = None, None, frozenset()
    for cut in cuts:
        bad, on = 0, []
        for L, (V, M) in dist.items():
            windowed = int((V >= cut).sum() + (M < cut).sum())
            if windowed < len(M):  # the window explains more of this layer than no window does
                bad += windowed
                on.append(L)
            else:
                bad += len(M)
        if best_bad is None or bad < best_bad:
            best_cut, best_bad, layers = cut, bad, frozenset(on)
    if not layers:
        return None
    lo = max((int(V[V < best_cut].max()) for L, (V, _) in dist.items() if L in layers and (V < best_cut).any()),
             default=-1)
    if kind == "standard":  # masked iff p_q − p_k >= n: n in (lo, cut]
        rng, n = (lo + 1, best_cut), best_cut
    else:  # masked iff |p_q − p_k| > n // 2: n // 2 in [lo, cut − 1]
        rng = (2 * max(lo, 0), 2 * (best_cut - 1) + 1)
        n = rng[0]
    rows = int(sum(len(M) for L, (_, M) in dist.items() if L in layers))
    if rows < 2:  # one printed zero (one wrong weight) is not a window
        return None
    detail = f"n_swa in [{rng[0]}, {rng[1]}] fits alike: {rows} printed zeros where the slot would have weight"
    return Fact(Window(n, kind, layers, rng), INFERRED, detail)


# ---- attention sinks -----------------------------------------------------------------------------------------

def fit_sinks(views: list[SiteView], best: Scored) -> tuple[AttentionFacts, Extra] | None:
    """Per layer and head, the sink logit z that the whole rows agree on: a row whose printed weights sum to 1 − σ
    gives z = log(σ / (1 − σ)) + log Σ_j exp(x_j) within the print precision of σ."""
    facts = best.facts.with_(sinks=Fact(None, DEFAULT))
    intervals: dict[tuple[int, int], list[tuple[float, float]]] = {}
    H_of: dict[int, int] = {}
    for v in views:
        if v.S is None:
            continue
        u = Under(v, site_facts(facts, v, best.extra))
        H_of[v.site.layer] = v.site.H
        whole = u.rows_whole
        if not whole.any():
            continue
        x = u.scaled()[:, whole]  # [h, t', j]
        with np.errstate(invalid="ignore", over="ignore"):
            m = x.max(axis=-1)
            lse = m + np.log(np.exp(x - m[..., None]).sum(axis=-1))
        P = np.where(u.visible[None, whole], v.P[:, whole], 0.0)
        sigma = 1.0 - P.sum(axis=-1)
        err = u.n_visible[whole][None, :] * precision.PRINT + 1e-6
        for hi, h in enumerate(v.heads):
            for ti in range(sigma.shape[1]):
                s, e = sigma[hi, ti], float(err[0, ti])
                lo_s, hi_s = max(s - e, 0.0), min(s + e, 1.0)
                if not lo_s < 1.0 or not np.isfinite(lse[hi, ti]):  # weights summing below 0: no sink explains it
                    continue
                dz = 2 * u.scale * precision.PRINT
                z_lo = -math.inf if lo_s <= 0 else math.log(lo_s / (1 - lo_s)) + lse[hi, ti] - dz
                z_hi = math.inf if hi_s >= 1 else (math.log(hi_s / (1 - hi_s)) + lse[hi, ti] + dz if hi_s > 0
                                                   else -math.inf)
                intervals.setdefault((v.site.layer, int(h)), []).append((z_lo, z_hi))
    if not intervals:
        return None
    sinks: dict[int, np.ndarray] = {L: np.full(H, np.nan) for L, H in H_of.items()}
    errs: dict[int, np.ndarray] = {L: np.zeros(H) for L, H in H_of.items()}
    agreed = 0
    for (L, h), iv in intervals.items():
        lo, hi, n = consensus(iv)
        if n < 2:
            continue  # one whole row cannot test the logit it gives
        # a sink rests on the rows that need one (weights summing below 1 beyond print precision), not on those
        # that merely allow one: a single row that needs it (one wrong weight) must not be explained by it
        needing = sum(1 for a, b in iv if a > -math.inf and a <= hi and b >= lo)
        if lo > -math.inf and needing < 2:
            continue
        agreed += n
        if lo == -math.inf:  # no sink visible in this head: its weights sum to 1 within print precision
            sinks[L][h], errs[L][h] = -math.inf, 0.0
        else:
            z = hi if hi < math.inf else lo
            sinks[L][h], errs[L][h] = (lo + z) / 2, (z - lo) / 2
    if not agreed:
        return None
    fact = Fact(sinks, INFERRED, f"one logit per layer and head, agreed by {agreed} whole rows")
    return facts.with_(sinks=fact), Extra(best.extra.scale_err, errs)


def consensus(intervals: list[tuple[float, float]]) -> tuple[float, float, int]:
    """The region covered by the most intervals: (lo, hi, how many)."""
    events = sorted([(lo, 0) for lo, _ in intervals] + [(hi, 1) for _, hi in intervals])
    best, count, lo = 0, 0, -math.inf
    region = (-math.inf, math.inf)
    for x, kind in events:
        if kind == 0:
            count += 1
            if count > best:
                best, lo = count, x
                region = (x, math.inf)
        else:
            if count == best and region[1] == math.inf and region[0] == lo:
                region = (lo, x)
            count -= 1
    return region[0], region[1], best
