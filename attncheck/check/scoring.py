"""A hypothesis (a set of attention facts) scored on a run's printed rows: which rows it leaves failing or not
checkable (each site under the run's facts resolved for it, sites/resolve.py). hypotheses.py pins the best; fits.py
fits the parameters some hypotheses need."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..arch.facts import AttentionFacts
from . import checks
from ..sites.heads import SiteView, Stack, stacks
from ..sites.resolve import Extra, sites_facts

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


def row_failures(st: Stack, els: tuple | None = None) -> np.ndarray:
    """[s, h, t] printed rows that some element of the masked, softmax or ratio check fails, or that a fitted sink
    leaves not checkable, in every site of a stack; els: those three checks' Elements, when computed already."""
    shape = st.P.shape[:3]
    bad = np.zeros(shape, bool)
    for el in els or (checks.masked(st), checks.softmax_rows(st), checks.softmax_ratio(st)):
        bad |= checks.failing_rows(el, shape)
    if st.sinks is not None and np.isnan(st.sinks).any():  # weights of such heads cannot be checked
        bad |= np.isnan(st.sinks)[:, :, None] & st.rows_whole[:, None, :]
    bad[~st.positions_known] = True
    return bad


def fingerprint(f) -> tuple:
    """What a site's checks depend on of its facts (SiteFacts), comparable with ==."""
    arr = lambda a: None if a is None else np.asarray(a).tobytes()  # noqa: E731
    return (f.kq_scale, f.causal, f.window, arr(f.slopes), arr(f.sinks), f.scale_err, arr(f.sink_err))


def fingerprints(facts: list) -> list[tuple]:
    """fingerprint of each of many SiteFacts, made once per object (sites_facts shares them between sites)."""
    made = {id(f): fingerprint(f) for f in {id(f): f for f in facts}.values()}
    return [made[id(f)] for f in facts]


Known = dict  # id of a view → (fingerprint of the facts it was checked under, its failing rows [h, t])


def score(views: list[SiteView], facts: AttentionFacts, extra: Extra | None = None,
          only: list[int] | None = None, known: Known | None = None) -> Scored:
    """Rows failing under a hypothesis, over all views or only some (to try it on the failures first); known: the
    failing rows of views already checked under some facts (dumponly.py), taken where those are these facts."""
    extra = extra or Extra()
    chosen = list(range(len(views))) if only is None else only
    per_view = [np.zeros(v.P.shape[:2], bool) for v in views]
    todo, todo_facts = [], []
    resolved = sites_facts(facts, [views[i] for i in chosen], extra)
    under = fingerprints(resolved) if known else [None] * len(chosen)
    for i, f, u in zip(chosen, resolved, under):
        hit = known.get(id(views[i])) if known else None
        if hit is not None and hit[0] == u:
            per_view[i] = hit[1]
        else:
            todo.append(i)
            todo_facts.append(f)
    for idx, st in stacks([views[i] for i in todo], todo_facts):
        bad = row_failures(st)
        for k, i in enumerate(idx):
            per_view[todo[i]] = bad[k]
    failing = sum(int(per_view[i].sum()) for i in chosen)
    rows = sum(per_view[i].size for i in chosen)
    return Scored(facts, extra, failing, rows, per_view)
