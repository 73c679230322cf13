"""check/scoring.py's score takes the failing rows of views already checked under the same facts (dumponly.py keeps
them from its reports, so that a run's pin does not check its sites a second time), and only then."""
from __future__ import annotations

import numpy as np

from attncheck.arch.facts import AttentionFacts
from attncheck.check.gather import gather
from attncheck.check.scoring import fingerprint, score
from attncheck.dump.graph import read_dump
from attncheck.sites.resolve import Extra, site_facts
from conftest import FIXTURES


def _views(name: str) -> list:
    """The site views of a real dump, as the checks take them."""
    return [p.view for ev in read_dump(str(FIXTURES / name)).evaluations() for p in gather(ev, name).pending]


def test_known_rows_are_taken_only_under_the_same_facts():
    views = _views("gpt2-ubatch2.txt")
    given = AttentionFacts()
    plain = score(views, given)
    assert plain.failing == 0 and len(views) >= 4  # a correct run: every row passes
    marked = {id(v): np.ones_like(plain.per_view[i]) for i, v in enumerate(views[:3])}  # rows said to fail
    same = {k: (fingerprint(site_facts(given, v, Extra())), marked[k]) for k, v in
            ((id(v), v) for v in views[:3])}
    taken = score(views, given, known=same)
    assert taken.failing == sum(int(m.sum()) for m in marked.values())  # taken as known, not found again
    assert all(taken.per_view[i] is marked[id(v)] for i, v in enumerate(views[:3]))
    other = {k: (fp + ("other facts",), rows) for k, (fp, rows) in same.items()}
    again = score(views, given, known=other)
    assert again.failing == 0 and all(np.array_equal(a, b) for a, b in zip(again.per_view, plain.per_view))
