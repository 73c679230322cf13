"""The fit of `calibrate.py fit` and `calibrate.py check`: the deep-layer verdict's (systematic, gross) per regime,
node class and depth bin (attncheck/model/bounds.py: CASCADE) from the per-node figures `calibrate.py measure` wrote
(OUTDIR/SET.jsonl), and its confirmation: leave-one-model-out (fit without a model, then run every run of that model
against it) and the false alarms of the bounds in bounds.py on every run.

A cell's limits are HEADROOM times the largest need of its runs (largest z of a value for gross, largest median z of
a node for systematic), made non-decreasing with depth, and at least FLOOR; a depth bin without runs takes the
shallower bins' limits; a regime without runs, the largest of its class in the regimes with the same activations.
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from attncheck.model.bounds import CASCADE, DEPTH, depth_bin  # noqa: E402
from attncheck.model.chaos import TWIN_GROSS, TWIN_SYSTEMATIC  # noqa: E402

HEADROOM = 1.5
FLOOR = (2.0**-8, 5 * 2.0**-8)  # (systematic, gross) at least one / five bf16 steps of the value's rms: the resolution
CLASSES = ("scores", "values")


def load(root: Path, sets: list[str]) -> list[dict]:
    rows = []
    for s in sets:
        seen = {}
        for line in (root / f"{s}.jsonl").read_text().splitlines():
            r = json.loads(line)
            r["set"] = s
            seen[(r["model"], r["run"])] = r  # the last measurement of a run counts
        rows += seen.values()
    # 2024's llama.cpp masked phi3's keys outside its sliding window, today's ignores the window: a real difference
    # between the builds (docs/numerics.md §5.2), not a correct run of the reference's semantics
    return [r for r in rows if not (r["model"] == "arch/phi3" and r.get("build") == "old" and (r.get("T") or 0) > 4)]


def needs(rows: list[dict]) -> dict:
    """(activations, kv) → class → bin → [largest z, largest median, run that needed it]."""
    out: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(lambda: [0.0, 0.0, ""])))
    for r in rows:
        if "cascade" not in r:
            continue
        reg = tuple(r["regime"])
        for layer, cls, _check, _n, zmax, med in r["cascade"]:
            cell = out[reg][cls][depth_bin(layer, r["n_layer"])]
            if zmax > cell[0]:
                cell[0], cell[2] = zmax, f"{r['model']} {r['run']}"
            cell[1] = max(cell[1], med or 0.0)
    return out


def fit(rows: list[dict]) -> dict:
    """(activations, kv) → class → tuple per depth bin of (systematic, gross)."""
    got = needs(rows)
    table: dict = {}
    for reg in CASCADE:
        table[reg] = {}
        for cls in CLASSES:
            cells = got.get(reg, {}).get(cls, {})
            if not cells:  # no run of this regime: the class's largest of any regime with these activations
                cells = {b: [max(got[r][cls][b][k] for r in got if r[0] == reg[0] and cls in got[r])
                             for k in (0, 1)] for b in range(len(DEPTH))
                         if any(cls in got[r] and b in got[r][cls] for r in got if r[0] == reg[0])}
            sys_, gross = 0.0, 0.0
            limits = []
            deepest = max(cells, default=None)
            for b in range(len(DEPTH)):
                src = b if b in cells else (deepest if deepest is not None and b > deepest else None)
                if src is not None:  # a bin deeper than any run: the deepest run's (they level off with depth)
                    gross = max(gross, HEADROOM * cells[src][0])
                    sys_ = max(sys_, HEADROOM * cells[src][1])
                limits.append((round(max(sys_, FLOOR[0]), 4), round(max(gross, FLOOR[1]), 4)))
            table[reg][cls] = tuple(limits)
    return table


def _chaos(r: dict) -> list:
    """The twin's (chaos_max, chaos_row) of each cascade node's layer ((0, 0) where the run was measured without)."""
    return r.get("chaos") or [(0.0, 0.0)] * len(r.get("cascade", []))


def twin_factors(rows: list[dict]) -> tuple[tuple[float, float], int]:
    """(TWIN_GROSS, TWIN_SYSTEMATIC): HEADROOM times the largest ratio of a node's need beyond the floor to its
    layer's chaos (chaos.py); and how many such nodes had no chaos to read (the table alone holds them)."""
    worst, blind = [0.0, 0.0], 0
    for r in rows:
        for (_l, _c, _k, _n, zmax, med), chaos in zip(r.get("cascade", []), _chaos(r)):
            for i, (need, floor) in enumerate(((zmax, FLOOR[1]), (med or 0.0, FLOOR[0]))):
                if need > floor:
                    if chaos[i] > 0:
                        worst[i] = max(worst[i], need / chaos[i])
                    else:
                        blind += 1
    return (round(HEADROOM * worst[0], 3), round(HEADROOM * worst[1], 3)), blind


def alarms(rows: list[dict], table: dict, factors: tuple[float, float] = (0.0, 0.0)) -> list[str]:
    """The cascade nodes of correct runs the limits would fail: the table's, or the twin's chaos times factors
    (gross, systematic) where larger."""
    out = []
    for r in rows:
        reg = tuple(r.get("regime") or ())
        for (layer, cls, check, n, zmax, med), chaos in zip(r.get("cascade", []), _chaos(r)):
            s, g = table[reg][cls][depth_bin(layer, r["n_layer"])]
            s, g = max(s, factors[1] * chaos[1]), max(g, factors[0] * chaos[0])
            if zmax > g or (med or 0.0) > s:
                out.append(f"{r['model']} {r['run']} layer {layer} {check}: z {zmax:.3g} (gross {g}), median "
                           f"{med:.3g} (systematic {s})")
    return out


def report(rows: list[dict]) -> None:
    """Largest needs per family, KV type and prompt length."""
    by: dict = defaultdict(lambda: [0.0, 0.0, 0])
    for r in rows:
        fam = r.get("arch", "?") + ("" if r["model"].startswith(("arch/", "quant/")) else f" ({r['model']})")
        kv = "-".join(r.get("regime") or ["?"])
        t = r.get("T") or 0
        size = "1-2" if t <= 2 else "3-20" if t <= 20 else "21-100" if t <= 100 else "101-600"
        for key in (("family", fam), ("regime", kv), ("tokens", size), ("build", r.get("build", "new"))):
            cell = by[key]
            cell[2] += 1
            for _l, _c, _k, _n, zmax, med in r.get("cascade", []):
                cell[0], cell[1] = max(cell[0], zmax), max(cell[1], med or 0.0)
    for key in sorted(by):
        zmax, med, n = by[key]
        print(f"  {key[0]:7s} {key[1]:40s} runs {n:4d}  largest z {zmax:8.3g}  largest median {med:8.3g}")


def main(cmd: str, root: Path, sets: list[str]) -> int:
    if cmd == "confirm":  # fit on the first set, count the false alarms on the others
        fit_sets = sets[0].split(",")  # FIT[,FIT...]
        fitted, held = [r for r in load(root, fit_sets) if "cascade" in r], [r for r in load(root, sets[1:])
                                                                             if "cascade" in r]
        factors, _ = twin_factors(fitted)
        bad = alarms(held, fit(fitted), factors)
        print(f"fitted on {sets[0]} ({len(fitted)} runs; twin factors {factors}), confirmed on {', '.join(sets[1:])} "
              f"({len(held)} runs): {len(bad)} false alarms in {len({b.split(' layer')[0] for b in bad})} runs")
        alone = alarms(held, {reg: {c: ((0.0, 0.0),) * len(DEPTH) for c in CLASSES} for reg in CASCADE}, factors)
        print(f"  the twin alone (no table): {len(alone)} false alarms")
        for b in bad[:30]:
            print("  " + b)
        return 1 if bad else 0
    rows = load(root, sets)
    errors = [r for r in rows if "error" in r]
    for r in errors:
        print(f"error: {r['model']} {r['run']}: {r['error'][-200:]}")
    rows = [r for r in rows if "cascade" in r]
    derived_fail = [f"{r['model']} {r['run']}: {f}" for r in rows for f in r.get("failed", [])
                    if any(d[1] > 1 for d in r.get("derived", []))]
    print(f"{len(rows)} runs of {len({r['model'] for r in rows})} models; layer-0 (derived) failures: "
          f"{len(derived_fail)}")
    for f in derived_fail[:20]:
        print("  " + f)
    if cmd == "check":
        bad = alarms(rows, CASCADE, (TWIN_GROSS, TWIN_SYSTEMATIC))
        print(f"bounds.py's CASCADE and chaos.py's factors ({TWIN_GROSS}, {TWIN_SYSTEMATIC}): {len(bad)} false alarms")
        for b in bad[:30]:
            print("  " + b)
        report(rows)
        return 1 if bad or derived_fail else 0
    table = fit(rows)
    print("fitted (systematic, gross) per depth bin " + str(DEPTH) + ":")
    for reg, by_cls in table.items():
        for cls, lim in by_cls.items():
            print(f"  {reg!s:24s} {cls:7s} {lim}")
    print("CASCADE = {")
    for reg, by_cls in table.items():
        print(f"    {reg!r}: {{" + ", ".join(f"{cls!r}: {lim!r}" for cls, lim in by_cls.items()) + "},")
    print("}")
    factors, blind = twin_factors(rows)
    print(f"twin factors (TWIN_GROSS, TWIN_SYSTEMATIC) = {factors}; {blind} needs beyond the floor with no chaos")
    print("leave one model out (the table and the twin factors fitted without it; the table alone):")
    total = total_table = 0
    for model in sorted({r["model"] for r in rows}):
        held = [r for r in rows if r["model"] == model]
        others = [r for r in rows if r["model"] != model]
        table_wo = fit(others)
        bad = alarms(held, table_wo, twin_factors(others)[0])
        bad_table = alarms(held, table_wo)
        total += len(bad)
        total_table += len(bad_table)
        worst = max((c[4] for r in held for c in r["cascade"]), default=0.0)
        print(f"  {model:24s} {len(held):3d} runs, largest z {worst:7.3g}: {len(bad)} false alarms (table alone "
              f"{len(bad_table)})" + (f" ({bad[0]})" if bad else ""))
    print(f"leave-one-model-out false alarms: {total} (table alone: {total_table})")
    report(rows)
    return 0
