"""Facts a dump does not print, pinned per llama.cpp run by stated hypotheses tested against the printed rows.

A hypothesis is a set of facts (sites/mask.py's SiteFacts per site). Its score is how many printed rows (head ×
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

import numpy as np

from ..arch.facts import DEFAULT, INFERRED, STRUCTURE, AttentionFacts, Fact, scale_words
from .fits import FittedScale, alibi_candidates, fit_scale, fit_sinks, fit_window, inferred_scale, round_scale
from ..sites.heads import SiteView
from ..sites.resolve import Extra, default_scale
from .scoring import FIXED, Known, Scored, score

def pin(views: list[SiteView], given: AttentionFacts, known: Known | None = None) -> tuple[Scored, list[str]]:
    """The hypothesis pinned for a run's views, and what was tried (for the report).

    The bases (step 1, and each with ALiBi) are tried first on the rows the given facts fail; those that explain any
    of them are scored on every row, and the best few are refined by a window and sinks fitted under them. Rows that
    every hypothesis tried passes (one visible slot, say) tell nothing: `informative` counts the others. known: rows
    already found failing under some facts (scoring.score)."""
    tried: list[str] = [describe(given)]
    first = score(views, given, known=known)
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
    stated = [b for b in bases if not fitted(b.facts)]
    best = stated[0]
    for base in stated[:REFINED]:
        refined = _refine(views, base, given, tried, seen)
        if refined.failing < best.failing:
            best = refined
    for base in (b for b in bases if fitted(b.facts)):  # a fitted scale stands only if it explains every row
        refined = _refine(views, base, given, tried, seen)
        if refined.failing == 0 < best.failing:
            best = refined
    informative = [np.logical_or.reduce([s.per_view[i] for s in seen]) for i in range(len(views))]
    best.informative = int(sum(m.sum() for m in informative))
    best.informative_failing = int(sum((m & b).sum() for m, b in zip(informative, best.per_view)))
    return best, tried


REFINED = 3  # bases refined by a fitted window and sinks
FITTED = "fitted"  # how a fitted scale's detail begins


def fitted(facts: AttentionFacts) -> bool:
    """The scale is fitted to the rows (not a stated value): it may stand only where it explains every row."""
    return facts.kq_scale.detail.startswith(FITTED)


def _bases(views: list[SiteView], given: AttentionFacts):
    """Step 1's candidates, then each of them with ALiBi."""
    first = list(_scale_and_causality(views, given))
    yield from first
    if given.alibi_max_bias.origin in FIXED:
        return
    for facts, extra in first:  # ALiBi moves the scale the data give: try it with each stated one
        if not facts.causal.value or extra.scale_err:  # a fitted scale was fitted without ALiBi's bias
            continue
        for mb in alibi_candidates(views, facts):
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
    parts = [f"kq_scale {scale_words(s)}", "causal" if f.causal.value else "non-causal"]
    if f.alibi_max_bias.value:
        parts.append(f"ALiBi max_bias {f.alibi_max_bias.value:g}")
    if f.window.value is not None:
        w = f.window.value
        parts.append(f"window {w.n} ({w.kind}) on layers {','.join(map(str, sorted(w.layers)))}")
    if f.sinks.value is not None:
        parts.append("attention sinks")
    return ", ".join(parts)


# ---- step 1: scale and causality -------------------------------------------------------------------------------

def _scale_and_causality(views: list[SiteView], given: AttentionFacts):
    """Candidates for step 1, in order: each stated scale, causal first; then, under each causality, the one scale per
    D_h that every row's weight ratios agree on (fits.fit_scale), with its uncertainty."""
    scales: list[Fact] = []
    if given.kq_scale.origin in FIXED:
        scales = [given.kq_scale]
    else:
        pre = next((v.site.q_scale for v in views if v.site.q_scale is not None), None)
        one = Fact(1.0, STRUCTURE, f"q is pre-scaled by {pre.name} (line {pre.line})") if pre is not None else \
            Fact(1.0, INFERRED, "SOFT_MAX applies no scale")
        default = Fact(None, DEFAULT, "1/sqrt(D_h)")
        scales = [one, default] if pre is not None else [default, one]
        by_layer: dict[int, list[SiteView]] = {}
        for v in views:
            by_layer.setdefault(v.site.layer, []).append(v)
        # the run's own estimate, then each layer's: a layer whose scale is wrong must not hide the round value the
        # others give (the value is still one for the whole run: the wrong layer's rows then fail under it)
        for group in [views, *by_layer.values()]:
            got = inferred_scale(group, given.with_(kq_scale=default))
            r = round_scale(got[0]) if got is not None else None
            if r is not None and r not in [f.value for f in scales]:
                scales.append(Fact(r, INFERRED, f"the data give {got[0]:.6g} from {got[1]} rows, {_round_name(r)}"))
    causal = [given.causal] if given.causal.origin in FIXED else [Fact(True, DEFAULT), Fact(False, INFERRED,
                                                                                            "encoder: every token visible")]
    for sc in scales:
        for c in causal:
            yield given.with_(kq_scale=sc, causal=c), Extra()
    if given.kq_scale.origin in FIXED:
        return
    for c in causal:
        fit = fit_scale(views, given.with_(kq_scale=Fact(None, DEFAULT), causal=c))
        if fit is not None and not _holds_stated(fit, views, scales):
            yield given.with_(kq_scale=fitted_fact(fit), causal=c), Extra(scale_err=fit.err)


def _holds_stated(fit: FittedScale, views: list[SiteView], scales: list[Fact]) -> bool:
    """A stated scale lies within the fit's interval for every D_h: the fit then tells nothing it does not, and only
    loosens the bounds (by its uncertainty) where a wrong value could hide; the stated value, exact, is tried."""
    D_hs = {v.site.D_h for v in views}
    for sc in scales:
        value = {d: default_scale(d) for d in D_hs} if sc.value is None else {d: sc.value for d in D_hs}
        if all(abs(value[d] - s) <= fit.err for d, s in fit.scale.items() if d in value):
            return True
    return False


def fitted_fact(fit: FittedScale) -> Fact:
    """A fitted scale as a fact: one value when the run has one D_h (else one per D_h), named with its rows."""
    value = next(iter(fit.scale.values())) if len(fit.scale) == 1 else dict(sorted(fit.scale.items()))
    return Fact(value, INFERRED, f"{FITTED}: the one scale every row's weight ratios agree on, within ±{fit.err:.2g} "
                                 f"({fit.rows} rows)")


def _round_name(r: float) -> str:
    n = round(1 / (r * r))
    return f"1/sqrt({n})" if abs(1 / math.sqrt(n) / r - 1) < 1e-6 else f"2^{round(math.log2(r))}"
