"""Facts a dump does not print, pinned per llama.cpp run by stated hypotheses tested against the printed rows.

A hypothesis is a set of facts (check/mask.py's SiteFacts per site). Its score is how many printed rows (head ×
query of every site of the run) it leaves failing or not checkable; a hypothesis is pinned for the whole run, never
per row, so the rows it fails are failures. The defaults come first (llama.cpp's 1/sqrt(D_h), causal, no ALiBi,
no window, no sinks) and win ties; another is pinned only when it fails strictly fewer rows:

1. the SOFT_MAX scale and causality together: 1/sqrt(D_h); 1 (q pre-scaled by a printed SCALE node, or no scale
   at all, as T5); the scale the data give when it is a round value (1/sqrt(n), 2^-k); the data's own scale, with
   its uncertainty in every bound; each causal (decoders) or not (encoders);
2. ALiBi: slopes from ggml's formula with max_bias 8 (bloom; mpt's usual value) or the max_bias head 0's slope gives;
3. a sliding window: per layer, the smallest distance at which a visible-by-causality slot prints exactly 0 while the
   others would give it weight, and the largest at which one prints weight, pin n_swa and the windowed layers;
4. attention sinks: per layer and head, the one sink logit the whole rows agree on (a head with fewer than two whole
   rows agreeing cannot have its weights checked; its ratios can).

Facts given by an option or read from a model are not hypotheses: they are used as they are.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .. import precision
from ..arch.facts import DEFAULT, INFERRED, STRUCTURE, AttentionFacts, Fact, Window, alibi_slopes
from . import checks
from .heads import SiteView, Under
from .mask import SiteFacts

MIN_FIT_SHARE = 0.5  # a hypothesis fitting fewer of the informative rows explains nothing: they are not checkable
FIXED = ("option", "model", "log")


def default_scale(D_h: int | None) -> float:
    """llama.cpp's kq_scale for most architectures: 1/sqrt(D_h), D_h = ne0 of q."""
    return 1.0 / math.sqrt(D_h) if D_h else 1.0


def site_facts(facts: AttentionFacts, view: SiteView, extra: "Extra | None" = None) -> SiteFacts:
    """The run's facts resolved for one site (its layer, D_h, H)."""
    site = view.site
    s = facts.kq_scale.value
    scale = default_scale(site.D_h) if s is None else s
    mb = facts.alibi_max_bias.value
    sinks = facts.sinks_for(site.layer)
    err = None if extra is None else extra.sink_err.get(site.layer)
    return SiteFacts(kq_scale=scale, causal=facts.causal.value, window=facts.window_for(site.layer),
                     slopes=alibi_slopes(mb, site.H) if mb else None, sinks=sinks,
                     scale_err=0.0 if extra is None else extra.scale_err, sink_err=err)


@dataclass
class Extra:
    """What a fitted hypothesis knows beyond AttentionFacts: uncertainties that widen the bounds."""

    scale_err: float = 0.0
    sink_err: dict[int, np.ndarray] = field(default_factory=dict)


@dataclass
class Scored:
    """A hypothesis, the rows it leaves failing (or unchecked), and per view the rows that fail."""

    facts: AttentionFacts
    extra: Extra
    failing: int
    rows: int
    per_view: list[np.ndarray]  # [h, t] failing rows of each view
    informative: int = 0  # rows some hypothesis tried fails: the rows that tell hypotheses apart
    informative_failing: int = 0  # of those, the rows this one fails

    @property
    def passing(self) -> int:
        return self.rows - self.failing


def row_failures(u: Under) -> np.ndarray:
    """[h, t] printed rows that some element of the masked, softmax or ratio check fails, or that a fitted sink
    leaves not checkable."""
    shape = u.view.P.shape[:2]
    bad = np.zeros(shape, bool)
    for el in (checks.masked(u), checks.softmax_rows(u), checks.softmax_ratio(u)):
        bad |= checks.failing_rows(el, shape)
    if u.sinks is not None and np.isnan(u.sinks).any():  # weights of such heads cannot be checked
        bad[np.isnan(u.sinks)[:, None] & u.rows_whole[None, :]] = True
    if not u.view.geometry.positions_known:
        bad[:] = True
    return bad


def score(views: list[SiteView], facts: AttentionFacts, extra: Extra | None = None,
          only: list[int] | None = None) -> Scored:
    """Rows failing under a hypothesis, over all views or only some (to try it on the failures first)."""
    extra = extra or Extra()
    per_view = []
    failing = rows = 0
    for i, v in enumerate(views):
        if only is not None and i not in only:
            per_view.append(np.zeros(v.P.shape[:2], bool))
            continue
        bad = row_failures(v.under(site_facts(facts, v, extra)))
        per_view.append(bad)
        failing += int(bad.sum())
        rows += bad.size
    return Scored(facts, extra, failing, rows, per_view)


def pin(views: list[SiteView], given: AttentionFacts) -> tuple[Scored, list[str]]:
    """The hypothesis pinned for a run's views, and what was tried (for the report).

    The bases (step 1, and each with ALiBi) are tried first on the rows the given facts fail; those that explain any
    of them are scored on every row, and the best few are refined by a window and sinks fitted under them. Rows that
    every hypothesis tried passes (one visible slot, say) tell nothing: `informative` counts the others."""
    tried: list[str] = [describe(given)]
    first = score(views, given)
    if first.failing == 0 or not views:
        return first, tried
    seen = [first]
    bases = [first]
    failing_views = [i for i, b in enumerate(first.per_view) if b.any()]
    for facts, extra in _bases(views, given):
        tried.append(describe(facts))
        trial = score(views, facts, extra, only=failing_views)
        seen.append(trial)
        if trial.failing < first.failing:  # it explains some row the given facts fail
            bases.append(score(views, facts, extra))
            seen.append(bases[-1])
    bases.sort(key=lambda s: s.failing)  # stable: on ties the earlier (simpler) hypothesis stays first
    best = bases[0]
    for base in bases[:REFINED]:
        refined = _refine(views, base, given, tried, seen)
        if refined.failing < best.failing:
            best = refined
    informative = [np.logical_or.reduce([s.per_view[i] for s in seen]) for i in range(len(views))]
    best.informative = int(sum(m.sum() for m in informative))
    best.informative_failing = int(sum((m & b).sum() for m, b in zip(informative, best.per_view)))
    return best, tried


REFINED = 3  # bases refined by a fitted window and sinks


def _bases(views: list[SiteView], given: AttentionFacts):
    """Step 1's candidates, then each of them with ALiBi."""
    first = list(_scale_and_causality(views, given))
    yield from first
    if given.alibi_max_bias.origin in FIXED:
        return
    for facts, extra in first:  # ALiBi moves the scale the data give: try it with each
        if not facts.causal.value:
            continue
        for mb in _alibi_candidates(views, facts):
            yield facts.with_(alibi_max_bias=Fact(mb, INFERRED, "slopes from ggml's ALiBi formula")), extra


def _refine(views: list[SiteView], base: Scored, given: AttentionFacts, tried: list[str],
            seen: list[Scored]) -> Scored:
    """A base with a window, then sinks, fitted under it, each kept when it fails strictly fewer rows."""
    best = base
    if given.window.origin not in FIXED and best.failing:
        w = fit_window(views, best)
        if w is not None:
            best = _better(views, best, (best.facts.with_(window=w), best.extra), tried, seen)
    if given.sinks.origin not in FIXED and best.failing:
        fitted = fit_sinks(views, best)
        if fitted is not None:
            best = _better(views, best, fitted, tried, seen)
    return best


def _better(views, best: Scored, candidate: tuple[AttentionFacts, Extra], tried: list[str],
            seen: list[Scored]) -> Scored:
    """The candidate if it fails strictly fewer rows; tried first on the views where `best` fails rows."""
    facts, extra = candidate
    tried.append(describe(facts))
    failing_views = [i for i, b in enumerate(best.per_view) if b.any()]
    trial = score(views, facts, extra, only=failing_views)
    seen.append(trial)
    fixed_here = sum(int(best.per_view[i].sum()) for i in failing_views) - trial.failing
    if fixed_here <= 0:
        return best
    full = score(views, facts, extra)
    seen.append(full)
    return full if full.failing < best.failing else best


def describe(f: AttentionFacts) -> str:
    s = f.kq_scale.value
    parts = ["kq_scale " + ("1/sqrt(D_h)" if s is None else f"{s:.6g}"), "causal" if f.causal.value else "non-causal"]
    if f.alibi_max_bias.value:
        parts.append(f"ALiBi max_bias {f.alibi_max_bias.value:g}")
    if f.window.value is not None:
        w = f.window.value
        parts.append(f"window {w.n} ({w.kind}) on layers {','.join(map(str, sorted(w.layers)))}")
    if f.sinks.value is not None:
        parts.append("attention sinks")
    return ", ".join(parts)


# ---- 1. scale and causality -----------------------------------------------------------------------------------

def inferred_scale(views: list[SiteView], facts: AttentionFacts) -> tuple[float, int] | None:
    """The scale the printed weights and scores give (pooled least squares over the run), and the rows used."""
    num = den = 0.0
    rows = 0
    for v in views:
        n, d, r = checks.infer_scale(v.under(site_facts(facts, v)))
        num, den, rows = num + n, den + d, rows + r
    return (num / den, rows) if den > 0 else None


def round_scale(s: float, rel: float = 2e-4) -> float | None:
    """s as a round value llama.cpp uses (1/sqrt(n) for an integer n, 2^-k), when within rel of one."""
    if not s > 0:
        return None
    for cand in (1.0 / math.sqrt(round(1.0 / (s * s))) if s < 1 else None, 2.0 ** round(math.log2(s))):
        if cand and abs(cand / s - 1) < rel:
            return float(np.float32(cand))
    return None


def _scale_and_causality(views: list[SiteView], given: AttentionFacts):
    """Candidates for step 1, in order: each scale, causal first."""
    scales: list[Fact] = []
    if given.kq_scale.origin in FIXED:
        scales = [given.kq_scale]
    else:
        pre = next((n for n in (v.site.q_scale_node() for v in views) if n is not None), None)
        one = Fact(1.0, STRUCTURE, f"q is pre-scaled by {pre.name} (line {pre.line})") if pre is not None else \
            Fact(1.0, INFERRED, "SOFT_MAX applies no scale")
        default = Fact(None, DEFAULT, "1/sqrt(D_h)")
        scales = [one, default] if pre is not None else [default, one]
        got = inferred_scale(views, given.with_(kq_scale=default))
        if got is not None:
            s, rows = got
            r = round_scale(s)
            if r is not None:
                scales.append(Fact(r, INFERRED, f"the data give {s:.6g} from {rows} rows, {_round_name(r)}"))
    causal = [given.causal] if given.causal.origin in FIXED else [Fact(True, DEFAULT), Fact(False, INFERRED,
                                                                                            "encoder: every token visible")]
    for sc in scales:
        for c in causal:
            yield given.with_(kq_scale=sc, causal=c), Extra()


def _round_name(r: float) -> str:
    n = round(1 / (r * r))
    return f"1/sqrt({n})" if abs(1 / math.sqrt(n) / r - 1) < 1e-6 else f"2^{round(math.log2(r))}"


# ---- 2. ALiBi ---------------------------------------------------------------------------------------------------

def _alibi_candidates(views: list[SiteView], facts: AttentionFacts) -> list[float]:
    """max_bias 8, and the max_bias head 0's slope gives when it is a multiple of 1/2."""
    out = [8.0]
    slopes = []
    for v in views:
        if v.S is None or not len(v.heads) or v.heads[0] != 0:
            continue
        u = v.under(site_facts(facts.with_(alibi_max_bias=Fact(0.0, DEFAULT)), v))
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
            with np.errstate(divide="ignore"):
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


# ---- 3. sliding window ------------------------------------------------------------------------------------------

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
        u = v.under(site_facts(facts, v, best.extra))
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
    detail = f"n_swa in [{rng[0]}, {rng[1]}] fits alike: {rows} printed zeros where the slot would have weight"
    return Fact(Window(n, kind, layers, rng), INFERRED, detail)


# ---- 4. attention sinks -----------------------------------------------------------------------------------------

def fit_sinks(views: list[SiteView], best: Scored) -> tuple[AttentionFacts, Extra] | None:
    """Per layer and head, the sink logit z that the whole rows agree on: a row whose printed weights sum to 1 − σ
    gives z = log(σ / (1 − σ)) + log Σ_j exp(x_j) within the print precision of σ."""
    facts = best.facts.with_(sinks=Fact(None, DEFAULT))
    intervals: dict[tuple[int, int], list[tuple[float, float]]] = {}
    H_of: dict[int, int] = {}
    for v in views:
        if v.S is None:
            continue
        u = v.under(site_facts(facts, v, best.extra))
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
        lo, hi, n = _consensus(iv)
        if n < 2:
            continue  # one whole row cannot test the logit it gives
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


def _consensus(intervals: list[tuple[float, float]]) -> tuple[float, float, int]:
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
