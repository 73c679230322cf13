"""A hypothesis (a set of attention facts) scored on a run's printed rows: which rows it leaves failing or not
checkable (each site under the run's facts resolved for it, sites/resolve.py). hypotheses.py pins the best; fits.py
fits the parameters some hypotheses need."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..arch.facts import AttentionFacts
from . import checks
from ..sites.heads import SiteView, Stack, stacks
from ..sites.resolve import Extra, site_facts

FIXED = ("option", "model", "log")


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
