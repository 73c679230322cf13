"""A hypothesis (a set of attention facts) scored on a run's printed rows: which rows it leaves failing or not
checkable. hypotheses.py pins the best; fits.py fits the parameters some hypotheses need."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..arch.facts import AttentionFacts, alibi_slopes
from . import checks
from ..sites.heads import SiteView, Stack, stacks
from ..sites.mask import SiteFacts

FIXED = ("option", "model", "log")


def default_scale(D_h: int | None) -> float:
    """llama.cpp's kq_scale for most architectures: 1/sqrt(D_h), D_h = ne0 of q."""
    return 1.0 / math.sqrt(D_h) if D_h else 1.0


def site_facts(facts: AttentionFacts, view: SiteView, extra: "Extra | None" = None) -> SiteFacts:
    """The run's facts resolved for one site (its layer, D_h, H)."""
    site = view.site
    s = facts.kq_scale.value
    if isinstance(s, dict):  # fitted per D_h (hypotheses.fitted_fact)
        s = s.get(site.D_h)
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


def row_failures(st: Stack) -> np.ndarray:
    """[s, h, t] printed rows that some element of the masked, softmax or ratio check fails, or that a fitted sink
    leaves not checkable, in every site of a stack."""
    shape = st.P.shape[:3]
    bad = np.zeros(shape, bool)
    for el in (checks.masked(st), checks.softmax_rows(st), checks.softmax_ratio(st)):
        bad |= checks.failing_rows(el, shape)
    if st.sinks is not None and np.isnan(st.sinks).any():  # weights of such heads cannot be checked
        bad |= np.isnan(st.sinks)[:, :, None] & st.rows_whole[:, None, :]
    bad[~st.positions_known] = True
    return bad


def score(views: list[SiteView], facts: AttentionFacts, extra: Extra | None = None,
          only: list[int] | None = None) -> Scored:
    """Rows failing under a hypothesis, over all views or only some (to try it on the failures first)."""
    extra = extra or Extra()
    chosen = list(range(len(views))) if only is None else only
    per_view = [np.zeros(v.P.shape[:2], bool) for v in views]
    picked = [views[i] for i in chosen]
    for idx, st in stacks(picked, [site_facts(facts, v, extra) for v in picked]):
        bad = row_failures(st)
        for k, i in enumerate(idx):
            per_view[chosen[i]] = bad[k]
    failing = sum(int(per_view[i].sum()) for i in chosen)
    rows = sum(per_view[i].size for i in chosen)
    return Scored(facts, extra, failing, rows, per_view)
