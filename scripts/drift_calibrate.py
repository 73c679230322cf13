#!/usr/bin/env python3
"""Measure the drift of pairs of dumps (scripts/drift_pairs.py) against attncheck diff's drift model.

    python3 scripts/drift_calibrate.py [PAIRS_DIR] [--pair OLD NEW ...] [--exclude NAME ...] [--layers]

For every OLD/NEW pair under PAIRS_DIR (<model>/<case>.old.txt and .new.txt), and every --pair, it runs the diff
and prints, per pair, the largest need: the factor A (attncheck/diff/drift.py) that pair's worst node needs,

    need = (|new − old| beyond print precision) / (u · n^P · s · mean factor)

(u the unit of the pair's activation roundings, n the roundings on the node's path, s the node's printed rms).
A calibration set gives A (its largest need, with a margin); on a confirmation set every need must stay below A.
Softmax weights whose allowance is derived from their scores' drift (attncheck/diff/softmax.py) are measured
apart: their need is the fraction of that allowance the worst weight takes (≤ 1 passes; it is a bound, not a fit,
except where a score is not printed in both and the scores' own allowance stands for it). The pair's check
verdicts (OLD, NEW) are printed beside: a correct pair passes check on both sides.
With --layers it also prints, per pair and layer, the largest relative drift (|Δ| beyond print precision / s), the
node it is in, and that node's allowance: the per-layer figures of docs/numerics.md §5.2.
"""
from __future__ import annotations

import argparse
import glob
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from attncheck.diff.compare import diff  # noqa: E402
from attncheck.diff.drift import A  # noqa: E402
from attncheck.diff.softmax import DERIVED  # noqa: E402


def pairs(root: str, exclude: list[str]) -> list[tuple[str, str, str]]:
    out = []
    for old in sorted(glob.glob(os.path.join(root, "*", "*.old.txt"))):
        name = os.path.relpath(old, root)[: -len(".old.txt")]
        new = old[: -len(".old.txt")] + ".new.txt"
        if os.path.exists(new) and not any(name.startswith(x) for x in exclude):
            out.append((name, old, new))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("root", nargs="?")
    ap.add_argument("--pair", nargs=2, action="append", default=[], metavar=("OLD", "NEW"), help="a pair of dumps")
    ap.add_argument("--exclude", action="append", default=[], help="pairs (model or model/case) to leave out")
    ap.add_argument("--layers", action="store_true", help="per-layer figures of every pair")
    ap.add_argument("--moves", nargs="*", metavar="ROLE", help="per layer and role (default Qcur, kq): the smallest "
                                                                "move of one value the drift model catches")
    a = ap.parse_args()
    overall, by_depth, softmax_overall = 0.0, defaultdict(float), 0.0
    listed = pairs(a.root, a.exclude) if a.root else []
    for name, old, new in listed + [(f"{o} → {n}", o, n) for o, n in a.pair]:
        rep = diff(old, new)
        if rep.error:
            print(f"{name}: unusable pair: {rep.error}")
            continue
        worst, at = 0.0, None
        soft, soft_at, fallback = 0.0, None, 0
        layers: dict = {}
        for nd in rep.compared:
            if nd.note.startswith(DERIVED):
                need = nd.drift / nd.allowed if nd.allowed > 0 else (float("inf") if nd.drift > 0 else 0.0)
                if need > soft:
                    soft, soft_at = need, nd
                continue
            fallback += bool(nd.note)
            need = nd.drift * A / nd.allowed if nd.allowed > 0 else (float("inf") if nd.drift > 0 else 0.0)
            if need > worst:
                worst, at = need, nd
            group = nd.role.group
            if nd.drift > layers.get(group, (0.0, None))[0]:
                layers[group] = (nd.drift, nd)
            by_depth[nd.roundings // 6] = max(by_depth[nd.roundings // 6], need)
        overall, softmax_overall = max(overall, worst), max(softmax_overall, soft)
        u = rep.model.unit if rep.model else None
        where = f"{at.role.group} {at.role.name} '{at.new.name}' n={at.roundings}" if at is not None else "-"
        soft_where = f"{soft_at.role.group} '{soft_at.new.name}' at {soft_at.worst}" if soft_at is not None else "-"
        checks = "/".join(s.verdict for s in (rep.old_side.report, rep.new_side.report) if s is not None)
        print(f"{name:30s} u=2^{_log2(u.value) if u else '?'} verdict {rep.verdict:5s} (check {checks}) need "
              f"{worst:6.2f} at {where}; softmax need {soft:.3f} at {soft_where}"
              + (f"; {fallback} softmax nodes under SOFTMAX_FACTOR" if fallback else ""))
        if a.moves is not None:
            for role in a.moves or ("Qcur", "kq"):
                for nd in rep.compared:
                    if nd.role.name == role and nd.evaluation == 0:
                        caught = nd.allowed * nd.scale + rep.tolerance.atol  # at a value near 0 (rtol adds |x|·2^-16)
                        print(f"    {nd.role.group:10s} {role:6s} rms {nd.scale:8.4f}  drift {nd.drift:8.2e} of rms  "
                              f"caught beyond |new − old| ≈ {caught:.4f} ({caught / nd.scale:.2f} rms)")
        if a.layers:
            for group, (d, nd) in layers.items():
                print(f"    {group:10s} drift {d:9.2e} of rms in {nd.role.name:16s} '{nd.new.name}' "
                      f"(allowance {nd.allowed:.2e}, n={nd.roundings})")
    print(f"largest need {overall:.2f} (A = {A}); by depth (n // 6): "
          + " ".join(f"{k}:{v:.2f}" for k, v in sorted(by_depth.items()))
          + f"; largest need of the derived softmax allowance {softmax_overall:.3f} (1 = all of it)")
    return 0


def _log2(x: float) -> str:
    import math

    return f"{math.log2(x):.0f}"


if __name__ == "__main__":
    sys.exit(main())
