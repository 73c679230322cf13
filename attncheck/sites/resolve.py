"""A run's attention facts resolved for one site (its layer, D_h, H): the SiteFacts its checks, its pinning and
inspect's walk of it use, and what a fitted hypothesis adds to them (the uncertainties that widen the bounds)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..arch.facts import AttentionFacts, alibi_slopes
from ..arch.header import inv_sqrt
from .heads import SiteView
from .mask import SiteFacts


def default_scale(D_h: int | None) -> float:
    """llama.cpp's kq_scale for most architectures: 1.0f/sqrtf(D_h), D_h = ne0 of q (the value a model's or a log's
    header gives too: one kq_scale with and without them)."""
    return inv_sqrt(D_h) if D_h else 1.0


@dataclass
class Extra:
    """What a fitted hypothesis knows beyond AttentionFacts: uncertainties that widen the bounds."""

    scale_err: float = 0.0
    sink_err: dict[int, np.ndarray] = field(default_factory=dict)


def site_facts(facts: AttentionFacts, view: SiteView, extra: Extra | None = None) -> SiteFacts:
    """The run's facts resolved for one site (its layer, D_h, H)."""
    site = view.site
    s = facts.kq_scale.value
    if isinstance(s, dict):  # fitted per D_h (check/hypotheses.fitted_fact)
        s = s.get(site.D_h)
    scale = default_scale(site.D_h) if s is None else s
    mb = facts.alibi_max_bias.value
    sinks = facts.sinks_for(site.layer)
    err = None if extra is None else extra.sink_err.get(site.layer)
    return SiteFacts(kq_scale=scale, causal=facts.causal.value, window=facts.window_for(site.layer),
                     slopes=alibi_slopes(mb, site.H) if mb else None, sinks=sinks,
                     scale_err=0.0 if extra is None else extra.scale_err, sink_err=err)


def sites_facts(facts: AttentionFacts, views: list[SiteView], extra: Extra | None = None) -> list[SiteFacts]:
    """site_facts of many views, resolved once per (layer, D_h, H), all it reads of a site: sites of one key share
    one SiteFacts (a run's thousands of sites have a few dozen)."""
    memo: dict[tuple, SiteFacts] = {}
    out = []
    for v in views:
        key = (v.site.layer, v.site.D_h, v.site.H)
        f = memo.get(key)
        if f is None:
            f = memo[key] = site_facts(facts, v, extra)
        out.append(f)
    return out
