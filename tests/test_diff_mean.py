"""kqv and kqv_out, weighted means of V rows, held to the allowance derived from the measured drift of their V rows and
scores (attncheck/diff/mean.py), on the real pairs of two llama.cpp builds in fixtures/drift/ (SmolLM2 Q4_1 with
"How are"; a random llama with 3 and 15 tokens).

The pair that showed the need, a 16-layer F16 llama with a 190-token prompt and -ub 7 whose kqv_out-13 moved 11.6·u·n^P
of its rms between the two correct builds (beyond drift.py's former 2×5), is 58 MB of dumps, too large for fixtures/:
scripts/drift_pairs.py makes it (llama-deep, long-ub7) and scripts/drift_calibrate.py measures it.
"""
from __future__ import annotations

import math
import re

import pytest

from attncheck.diff.compare import diff
from attncheck.diff.mean import NO_SCALE, ROW_ROLES, weighted_mean
from attncheck.diff.sides import kq_scales
from attncheck.diff.softmax import DERIVED, SCORE_ROLES
from attncheck.precision import F32, PRINT
from conftest import FIXTURES
from dumpedit import DumpEdit

DRIFT = FIXTURES / "drift"
PAIRS = {"llama": (FIXTURES / "old-llama-gqa-how-are-you.txt", FIXTURES / "llama-gqa-how-are-you.txt"),
         "llama-long": (DRIFT / "old-llama-gqa-long.txt", FIXTURES / "llama-gqa-long.txt")}
F16_UNIT = 2.0**-11  # the f16 KV cache of every pair here


def _pair(name, smollm2_dumps):
    return smollm2_dumps if name == "smollm2" else PAIRS[name]


def _note(nd, key: str) -> float:
    return float(re.search(rf"{key} = ([-0-9.e+]+)", nd.note).group(1))


@pytest.mark.parametrize("name", ["smollm2", "llama", "llama-long"])
def test_every_mean_is_held_to_the_drift_of_its_v_rows_and_scores(name, smollm2_dumps):
    """Every kqv and kqv_out node of a real pair gets the derived allowance, none is beyond it, and its parts are
    those of the layer's other nodes: D_V the largest |Δ| of its V rows (+ 2 prints), R between kq_scale·(the
    scores' largest |Δ|) and twice that (+ 4 prints), the whole D_V + (e^R − 1)·v + (4·u + n_kv·2^-24)·v."""
    rep = diff(*_pair(name, smollm2_dumps))
    assert rep.exit_code == 0
    means = [n for n in rep.compared if weighted_mean(n.role.name)]
    assert means and all(n.note.startswith(f"{DERIVED} the V rows") and not n.diverged for n in means), \
        [(n.new.name, n.note) for n in means if not n.note.startswith(DERIVED) or n.diverged][:3]
    scales = kq_scales(rep.sides)
    for nd in means:
        site = [n for n in rep.compared if (n.evaluation, n.role.layer) == (nd.evaluation, nd.role.layer)]
        rows = max(n.max_abs for n in site if n.role.name in ROW_ROLES) + 2 * PRINT
        scores = max(n.max_abs for n in site if n.role.name in SCORE_ROLES)
        c = abs(scales[(nd.evaluation, nd.role.layer)][0])
        D_V, R, v = _note(nd, "D_V"), _note(nd, "R"), _note(nd, "v")
        assert D_V == pytest.approx(rows, rel=2e-3)
        assert c * (scores + 4 * PRINT) * 0.999 <= R <= c * (2 * scores + 4 * PRINT) * 1.001
        n_kv = next(n for n in site if n.role.name == "kq_soft_max").new.ne[0]
        whole = rows + math.expm1(R) * v + (4 * F16_UNIT + n_kv * F32) * v
        assert nd.allowed * nd.scale == pytest.approx(whole, rel=2e-3)


def test_a_deep_kqv_moved_within_the_former_allowance_is_caught(smollm2_dumps, tmp_path):
    """SmolLM2's layer 27: V and the scores barely move between the builds, so the derived allowance of kqv-27 is a
    fraction of drift.py's former 2×A·u·n^P; a kqv element moved by their geometric mean, which the former passed, is
    beyond drift (the diff's own verdict, whatever check says of the P·V)."""
    old, new = smollm2_dumps
    clean = diff(old, new)
    [nd] = [n for n in clean.compared if n.new.name == "kqv-27" and n.role.name == "kqv"]
    former = clean.model.rho(nd.roundings, "kqv")
    assert nd.allowed < former / 2
    move = math.sqrt(nd.allowed * former) * nd.scale
    edit = DumpEdit(new, tmp_path / "moved.txt")
    n = edit.node("kqv-27")
    edit.add("kqv-27", (n.ne[2] - 1, 1, 0), round(move, 4))  # the last head, query 1, dim 0
    rep = diff(old, edit.save())
    bad = [m for m in rep.diverged if m.new.name == "kqv-27" and m.role.name == "kqv"]
    assert rep.exit_code == 1 and bad and bad[0].worst == {"head": n.ne[2] - 1, "query": 1, "dim": 0}


def test_without_the_sites_kq_scale_a_mean_keeps_drift_pys_allowance(smollm2_dumps):
    """The node diff alone (no check, so no kq_scale pinned): kqv keeps 2×A·u·n^P, and says so."""
    rep = diff(*smollm2_dumps, check=False)
    means = [n for n in rep.compared if weighted_mean(n.role.name)]
    assert means and all(n.note == NO_SCALE and n.allowed == rep.model.rho(n.roundings, n.role.name) for n in means)


def test_scores_beyond_their_own_drift_do_not_widen_the_mean():
    """phi3, whose window 2024's build applied and today's ignores (a real change): layer 1's scores differ by far
    more than correct builds' (kq-1 is beyond drift); kqv-1 is held as if they had moved by their allowance only, so it
    is beyond drift too, not hidden behind e^(8) − 1 of its V rows."""
    rep = diff(DRIFT / "phi3-cat.old.txt", DRIFT / "phi3-cat.new.txt")
    by_name = {(n.new.name, n.role.name): n for n in rep.compared}
    kq, kqv = by_name[("kq-1", "kq")], by_name[("kqv-1", "kqv")]
    assert kq.diverged and kq.max_abs > 4
    assert kqv.diverged and kqv.note.startswith(DERIVED) and _note(kqv, "R") < 0.1
