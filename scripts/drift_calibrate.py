#!/usr/bin/env python3
"""Measure the drift of pairs of dumps (scripts/drift_pairs.py) against attncheck diff's drift model.

    python3 scripts/drift_calibrate.py [SET_DIR ...] [--pair OLD NEW ...] [--exclude NAME ...]
                                       [--expect-fail NAME ...] [--roles] [--layers] [--moves [ROLE ...]] [--nodes FILE]

For every OLD/NEW pair under each SET_DIR (<model>/<case>.old.txt and .new.txt, named SET/<model>/<case>), and every
--pair, it runs the diff and prints, per pair, the largest need: the factor A (attncheck/diff/drift.py) that pair's
worst node needs,

    need = (|new − old| beyond print precision) / (u · n^P · s · factor)

(u the unit of the pair's activation roundings, n the roundings on the node's path, s the node's printed rms, factor
MEAN_FACTOR for attn_out and the means without printed scores). A calibration set gives A (its largest need, with a
margin); on a held-out set every need must stay below A.
Two allowances are derived from measured drift, and measured apart: the share of its allowance the worst element
takes (≤ 1 passes). Softmax weights (attncheck/diff/softmax.py), and the weighted means kqv and kqv_out
(attncheck/diff/mean.py), whose allowance is their V rows' measured drift and rounding plus their weights' move: for
them also the share of the rows' part their worst element takes once the weights' move is taken off.
The pair's check verdicts (OLD, NEW) are printed beside: a correct pair passes check on both sides. A pair named by
--expect-fail is a real difference (phi3's window, applied by one build only): it must fail, and is left out of the
needs. --roles prints the largest need per model and role and per role and depth; --layers, per pair and layer, the
largest relative drift (|Δ| beyond print precision / s), the node it is in and that node's allowance; --moves, per
layer and role, the smallest move of one value the drift model catches; --nodes writes every compared node (JSON
lines: pair, evaluation, layer, role, n, rms, drift, allowance, need) for other analyses.
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from attncheck.diff.compare import diff  # noqa: E402
from attncheck.diff.drift import A  # noqa: E402
from attncheck.diff.mean import weighted_mean  # noqa: E402
from attncheck.diff.softmax import DERIVED  # noqa: E402

DEPTHS = (0, 1, 2, 4, 8, 16, 32, 64, 128)  # n buckets of the per-role table


def pairs(root: str, exclude: list[str]) -> list[tuple[str, str, str]]:
    out = []
    top = os.path.dirname(os.path.abspath(root))
    for old in sorted(glob.glob(os.path.join(root, "*", "*.old.txt"))):
        name = os.path.relpath(old, top)[: -len(".old.txt")]
        new = old[: -len(".old.txt")] + ".new.txt"
        if os.path.exists(new) and not any(x in name for x in exclude):
            out.append((name, old, new))
    return out


def needs(nd) -> tuple[str, float, float]:
    """(kind, need, share): kind softmax | mean | node; need the A the node needs (softmax: its share; mean: the share
    of the rows' part once the weights' move is taken off); share the part of its allowance it takes."""
    share = _share(nd.drift, nd.allowed)
    if nd.note.startswith(DERIVED) and not weighted_mean(nd.role.name):
        return "softmax", share, share
    if nd.note.startswith(DERIVED):
        return "mean", _share(max(nd.drift - nd.weights, 0.0), nd.allowed - nd.weights), share
    return "node", share * A, share


def _share(drift: float, allowed: float) -> float:
    return drift / allowed if allowed > 0 else (math.inf if drift > 0 else 0.0)


def depth(n: int) -> int:
    return max(d for d in DEPTHS if d <= n)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("roots", nargs="*", metavar="SET_DIR")
    ap.add_argument("--pair", nargs=2, action="append", default=[], metavar=("OLD", "NEW"), help="a pair of dumps")
    ap.add_argument("--exclude", action="append", default=[], help="pairs whose name contains this: left out")
    ap.add_argument("--expect-fail", action="append", default=[], help="pairs whose name contains this must fail")
    ap.add_argument("--roles", action="store_true", help="largest need per model and role, and per role and depth")
    ap.add_argument("--layers", action="store_true", help="per-layer figures of every pair")
    ap.add_argument("--moves", nargs="*", metavar="ROLE", help="per layer and role (default Qcur, kq): the smallest "
                                                                "move of one value the drift model catches")
    ap.add_argument("--nodes", metavar="FILE", help="write every compared node as a JSON line")
    a = ap.parse_args()
    overall, soft_overall, mean_overall, rows_overall = 0.0, 0.0, 0.0, 0.0
    by_role: dict = defaultdict(lambda: (0.0, ""))  # (model, role) → (need, pair)
    by_depth: dict = defaultdict(lambda: (0.0, ""))  # (role, depth) → (need, pair)
    alarms, expected = [], []
    out = open(a.nodes, "w") if a.nodes else None
    listed = [p for root in a.roots for p in pairs(root, a.exclude)]
    for name, old, new in listed + [(f"{o} → {n}", o, n) for o, n in a.pair]:
        rep = diff(old, new)
        if rep.error:
            print(f"{name}: unusable pair: {rep.error}")
            continue
        checks = "/".join(s.verdict for s in (rep.old_side.report, rep.new_side.report) if s is not None)
        if any(x in name for x in a.expect_fail):
            expected.append((name, rep.verdict))
            print(f"{name:40s} a real difference: verdict {rep.verdict} (check {checks})"
                  + ("" if rep.verdict == "fail" else "  <-- SILENT PASS"))
            continue
        if rep.verdict != "pass":
            alarms.append(name)
        worst, at, soft, soft_at, mean, mean_at = 0.0, None, 0.0, None, (0.0, 0.0), None
        fallback = 0
        layers: dict = {}
        model = name.split("/")[-2] if "/" in name else name
        for nd in rep.compared:
            kind, need, share = needs(nd)
            if out is not None:
                out.write(json.dumps({"pair": name, "evaluation": nd.evaluation, "n_past": nd.n_past,
                                      "layer": nd.role.layer, "role": nd.role.name, "node": nd.new.name,
                                      "n": nd.roundings, "rms": nd.scale, "drift": nd.drift, "allowed": nd.allowed,
                                      "kind": kind, "need": need, "share": share, "note": nd.note}) + "\n")
            if kind == "softmax":
                if need > soft:
                    soft, soft_at = need, nd
                continue
            if nd.drift > layers.get(nd.role.group, (0.0, None))[0]:
                layers[nd.role.group] = (nd.drift, nd)
            if kind == "mean":
                if share > mean[1]:
                    mean, mean_at = (mean[0], share), nd
                mean = (max(mean[0], need), mean[1])
                continue
            fallback += bool(nd.note)  # a derived allowance's fallback factor
            if need > worst:
                worst, at = need, nd
            role = nd.role.name.split(".")[0]
            if need > by_role[(model, role)][0]:
                by_role[(model, role)] = (need, name)
            if need > by_depth[(role, depth(nd.roundings))][0]:
                by_depth[(role, depth(nd.roundings))] = (need, name)
        overall, soft_overall = max(overall, worst), max(soft_overall, soft)
        mean_overall, rows_overall = max(mean_overall, mean[1]), max(rows_overall, mean[0])
        u = rep.model.unit if rep.model else None
        where = f"{at.role.group} {at.role.name} '{at.new.name}' n={at.roundings}" if at is not None else "-"
        soft_where = f"{soft_at.role.group} '{soft_at.new.name}' at {soft_at.worst}" if soft_at is not None else "-"
        mean_where = f" in '{mean_at.new.name}' (eval {mean_at.evaluation})" if mean_at is not None else ""
        print(f"{name:40s} u=2^{_log2(u.value) if u else '?'} verdict {rep.verdict:5s} (check {checks}) need "
              f"{worst:6.2f} at {where}; softmax share {soft:.3f} at {soft_where}; kqv share {mean[1]:.3f}"
              f" (rows' part {mean[0]:.3f}){mean_where}"
              + (f"; {fallback} nodes under a fallback factor" if fallback else ""), flush=True)
        if a.moves is not None:
            for role in a.moves or ("Qcur", "kq"):
                for nd in rep.compared:
                    if nd.role.name == role and nd.evaluation == 0:
                        caught = nd.allowed * nd.scale + rep.tolerance.atol  # at a value near 0 (rtol adds |x|·2^-16)
                        print(f"    {nd.role.group:10s} {role:8s} rms {nd.scale:8.4f}  drift {nd.drift:8.2e} of rms  "
                              f"caught beyond |new − old| ≈ {caught:.4f} ({caught / nd.scale:.2f} rms)")
        if a.layers:
            for group, (d, nd) in layers.items():
                print(f"    {group:10s} drift {d:9.2e} of rms in {nd.role.name:16s} '{nd.new.name}' "
                      f"(allowance {nd.allowed:.2e}, n={nd.roundings})")
    if out is not None:
        out.close()
    if a.roles:
        _tables(by_role, by_depth)
    print(f"{len(listed) + len(a.pair) - len(expected)} correct pairs, {len(alarms)} false alarms"
          + (f" ({', '.join(alarms)})" if alarms else "")
          + (f"; {len(expected)} real differences, {sum(v != 'fail' for _, v in expected)} passed" if expected else ""))
    print(f"largest need {overall:.2f} (A = {A}); largest share of the derived softmax allowance {soft_overall:.3f}, "
          f"of the weighted means' {mean_overall:.3f} (1 = all of it; of their rows' part {rows_overall:.3f})")
    return 0


def _tables(by_role: dict, by_depth: dict) -> None:
    """Largest need per model × role, and per role × depth (n bucket)."""
    roles = sorted({r for _, r in by_role})
    models = sorted({m for m, _ in by_role})
    print("largest need per model and role")
    print(f"{'':16s}" + "".join(f"{r[:9]:>10s}" for r in roles))
    for m in models:
        print(f"{m[:16]:16s}" + "".join(f"{by_role[(m, r)][0]:10.2f}" if (m, r) in by_role else f"{'-':>10s}"
                                        for r in roles))
    print("largest need per role and depth (n from)")
    print(f"{'':16s}" + "".join(f"{d:>7d}" for d in DEPTHS))
    for r in roles:
        print(f"{r[:16]:16s}" + "".join(f"{by_depth[(r, d)][0]:7.2f}" if (r, d) in by_depth else f"{'-':>7s}"
                                        for d in DEPTHS))


def _log2(x: float) -> str:
    return f"{math.log2(x):.0f}"


if __name__ == "__main__":
    sys.exit(main())
