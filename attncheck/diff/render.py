"""DiffReport → text for people (a table per matched node, the divergences, a verdict) and the JSON document."""
from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table

from .report import NMSE_MAX, NMSE_OTHER, DiffReport, NodeDiff
from ..errors import markup as escape, printable
from ..present.columns import NEVER, Col, fit
from .drift import MEAN_FACTOR, MEAN_ROLES, SOFTMAX_FACTOR
from .mean import WEIGHTED_MEANS, weighted_mean
from .render_drift import drift_table
from ..report import EXIT_FAIL, EXIT_INPUT, EXIT_PASS, EXIT_UNVERIFIED

FACTOR_ONLY = tuple(r for r in MEAN_ROLES if not weighted_mean(r))  # means whose scores are never printed
LIST_LIMIT = 20  # one-dump-only nodes and divergences listed without --verbose


def tolerance_line(rep: DiffReport) -> str:
    t = rep.tolerance
    if t.nmse:
        per_op = ", ".join(f"{op} {v:g}" for op, v in NMSE_MAX.items())
        return f"tolerance: NMSE per op as test-backend-ops ({per_op}, other ops {NMSE_OTHER:g})"
    if rep.model is not None:
        m, u = rep.model, rep.model.unit
        return (f"tolerance: the drift of correct builds, |new − old| ≤ {t.atol:g} + {t.rtol:.3g}·|x| + "
                f"{m.a:g}·u·n^{m.p:g}·rms (×{MEAN_FACTOR:g} for {', '.join(FACTOR_ONLY)}; "
                f"{', '.join(WEIGHTED_MEANS)}: D_V + (e^R − 1)·v + rounding, D_V and v their V rows' drift and rms, "
                f"R their scores' spread × kq_scale, or ×{MEAN_FACTOR:g} where none are printed; softmax weights: "
                f"p·(e^(|Δx|+L) − 1), their scores' drift through the softmax, or ×{SOFTMAX_FACTOR:g} of their "
                f"own size where no scores are printed), n the activation roundings before the node, "
                f"u = 2^{math.log2(u.value):.2f}: {u.origin}")
    return f"tolerance: |new − old| ≤ {t.atol:g} + {t.rtol:.3g}·|x| ({t.origin})"


def prompt_line(rep: DiffReport) -> str:
    if rep.prompt_note:
        return rep.prompt_note
    if rep.prompt == "prefix":
        return "prompt: one run's token ids extend the other's; compared what causality fixes (--prefix)"
    ids = next((a for a, _ in rep.tokens if a is not None), None)
    return f"prompt: the same token ids {list(ids)}" if ids is not None else ""


def where(nd: NodeDiff) -> str:
    return f"eval {nd.evaluation} {nd.role.group} {nd.role.name}"


_ORDER = ("head", "kv_head", "query", "token", "slot", "dim", "elem", "vocab", "flat", "i3", "i2", "i1", "i0")


def _at(place: dict[str, int] | None, n_past: int | None = None) -> str:
    """A logical place, in the order check's messages use: head, query (and its position), slot or dim."""
    items = sorted((place or {}).items(), key=lambda kv: _ORDER.index(kv[0]) if kv[0] in _ORDER else len(_ORDER))
    return ", ".join(f"{k} {v}" + (f" (position {n_past + v})" if k in ("query", "token") and n_past is not None
                                   else "") for k, v in items)


def divergence_line(nd: NodeDiff, nmse: bool) -> str:
    """The node, its worst element by logical place, and what it would have needed."""
    names = f"'{nd.old.name}' (OLD line {nd.old.line}) / '{nd.new.name}' (NEW line {nd.new.line})"
    worst = (f"{_at(nd.worst, nd.n_past)}: {nd.worst_old:.4f} vs {nd.worst_new:.4f}, |Δ| {nd.max_abs:.1e}")
    if nmse:
        need = f"NMSE {nd.nmse:.1e} > {nd.nmse_max:g} for {nd.new.op}"
    elif nd.failed and nd.roundings:
        of = "of its own size" if nd.scale_kind == "value" else f"of the rms {nd.scale:.3g}"
        need = (f"beyond the drift of correct builds in {nd.failed} of {nd.compared} elements: drift {nd.drift:.1e} "
                f"{of}, allowed {nd.allowed:.1e} (n = {nd.roundings}; {nd.ratio:.1f}× the tolerance at the worst "
                "element)")
    elif nd.failed:
        need = (f"> tol {nd.tol:.1e} in {nd.failed} of {nd.compared} elements; needs atol {nd.needed_atol:.1e} "
                f"or rtol {nd.needed_rtol:.1e}; NMSE {nd.nmse:.1e}")
    else:
        need = "elements within tolerance"
    s = nd.sum
    if s is not None and not s.passed and not nmse:
        need += f"; sum {s.old:.6f} vs {s.new:.6f}, |Δ| {s.diff:.1e} > {s.tol:.1e}"
    return f"{where(nd)}: {names} {worst} {need}"


def node_table(rep: DiffReport, verbose: bool, width: int | None = None) -> Table:
    """One row per matched node (compared ones; skipped ones too with --verbose); max rel is in the JSON. The
    evaluation/layer and the verdict always; the other columns as the width allows."""
    drift = rep.model is not None
    need = "NMSE max" if rep.tolerance.nmse else "need atol"
    numbers = ((Col("drift", keep=2), Col("allowed", keep=2), Col("|Δ|/tol", keep=5)) if drift
               else (Col("NMSE", keep=2), Col(need, keep=5)))
    cols = (Col("eval/layer", "left", NEVER), Col("role", "left", 6, wrap=True, min_width=16, fold=True),
            Col("node:line (OLD → NEW)", "left", 4, wrap=True, min_width=16), Col("n", keep=3),
            Col("max |Δ|", keep=7), *numbers, Col("", "left", NEVER, wrap=True, min_width=20, fold=True))
    rows = []
    for nd in rep.nodes:
        if nd.skipped and not verbose:
            continue
        at = f"{nd.evaluation}/{nd.role.group.replace('layer ', '')}"
        old, new = f"{nd.old.name}:{nd.old.line}", f"{nd.new.name}:{nd.new.line}"
        names = escape(old if old == new else f"{old} → {new}")
        role = escape(nd.role.name)
        if nd.skipped:
            rows.append([at, role, names, "0", "", *[""] * len(numbers), f"[dim]{escape(nd.skipped)}[/]"])
            continue
        if drift:
            status = "[bold red]BEYOND[/]" if nd.diverged else "[green]drift[/]" if nd.max_abs else "[green]same[/]"
            rows.append([at, role, names, str(nd.compared), f"{nd.max_abs:.1e}", f"{nd.drift:.1e}",
                         f"{nd.allowed:.1e}", f"{nd.ratio:.2f}", status])
            continue
        status = "[bold red]DIFF[/]" if nd.diverged else "[green]same[/]"
        rows.append([at, role, names, str(nd.compared), f"{nd.max_abs:.1e}", f"{nd.nmse:.1e}",
                     f"{nd.nmse_max:g}" if nd.nmse_max is not None else f"{nd.needed_atol:.1e}", status])
    return fit(cols, rows, width, title=escape(f"diff {rep.old} → {rep.new}"), title_justify="left")


def verdict(rep: DiffReport) -> str:
    """One line, beginning as check's does (PASS, FAIL, ERROR, UNVERIFIED), then what diff found: identical, drift
    within the tolerance, or a regression (NEW fails check, or a node beyond the tolerance); then each side's check."""
    t = rep.totals()
    pair = f"{rep.old} → {rep.new}"
    only = f"; {t['only_old'] + t['only_new']} nodes in one dump only" if rep.only else ""
    code = rep.exit_code
    if code == EXIT_INPUT:
        return f"ERROR diff {pair}: {rep.error or 'NEW ' + rep.new_side.state()}"
    if code == EXIT_UNVERIFIED:
        return f"UNVERIFIED diff {pair}: no printed element could be compared{_checks(rep)}{only}"
    head = "PASS" if code == EXIT_PASS else "FAIL"
    if rep.regression == "check":
        new = rep.new_side
        return f"{head} diff {pair}: regression: NEW {new.state()}; {_drift(rep, t)}{_baseline(rep)}{only}"
    if rep.regression:
        return f"{head} diff {pair}: regression: {_beyond(rep, t)}{_checks(rep)}{only}"
    return f"{head} diff {pair}: {_within(rep, t)}{_checks(rep)}{only}"


def _within(rep: DiffReport, t: dict) -> str:
    nodes = f"{t['compared']} nodes ({t['elements_compared']} printed elements)"
    tests = f"{t['tests']} evaluation×layer tests"
    if rep.identical:
        return f"identical: every printed element of {nodes} is the same in {tests}"
    if rep.model is None:
        return f"{nodes} agree in {tests} ({rep.tolerance.origin})"
    worst = max(rep.compared, key=lambda n: n.ratio)
    return (f"drift within correct builds: {nodes} in {tests}; closest to its allowance: {where(worst)} "
            f"'{worst.new.name}' ({worst.ratio:.2f} of it)")


def _beyond(rep: DiffReport, t: dict) -> str:
    """The first node beyond the tolerance, its element by logical place and what it was allowed."""
    first = rep.first_divergent
    counts = f"in {t['tests_failed']} of {t['tests']} evaluation×layer tests"
    if rep.model is not None:
        return (f"first node beyond the drift of correct builds: {where(first)} '{first.new.name}' (NEW line "
                f"{first.new.line}) at {_at(first.worst, first.n_past)}: {first.worst_old:.4f} → {first.worst_new:.4f}, "
                f"|Δ| {abs(first.worst_new - first.worst_old):.1e} > {first.tol:.1e} allowed; {t['diverged']} of "
                f"{t['compared']} nodes beyond drift, {counts}")
    msg = (f"{t['diverged']} of {t['compared']} nodes differ, {counts}; first divergent node: {where(first)} "
           f"'{first.new.name}' (|Δ| {first.max_abs:.1e} at {_at(first.worst)})")
    comp = rep.first_computed
    if comp is not None and comp is not first:
        msg += f"; first divergent computation: {where(comp)} '{comp.new.name}' ({comp.new.op})"
    return msg


def _drift(rep: DiffReport, t: dict) -> str:
    """The node diff in a few words, beside a regression that check found."""
    if rep.diverged:
        first = rep.first_divergent
        beyond = "beyond the drift of correct builds" if rep.model is not None else "beyond the tolerance"
        n = t["diverged"]
        return f"{n} node{'s' * (n != 1)} {beyond}, first {where(first)} '{first.new.name}'"
    if not rep.compared:
        return "no printed element compared"
    return ("every node within the drift of correct builds" if rep.model is not None
            else "every node within the tolerance")


def _checks(rep: DiffReport) -> str:
    """'; check passes on both (NEW: ...)', or what it says of each side."""
    new = rep.new_side
    if new is None:
        return ""
    if new.exit_code == EXIT_PASS and rep.old_side.exit_code == EXIT_PASS:
        return f"; {new.command} passes on both (NEW: {new.covered()})"
    return f"; NEW {new.state()}{_baseline(rep)}"


def _baseline(rep: DiffReport) -> str:
    """What check says of OLD when it does not pass: said, and failing nothing by itself."""
    old = rep.old_side
    return "" if old is None or old.exit_code == EXIT_PASS else f"; {old.as_baseline()}"


def render_diff(rep: DiffReport, console: Console, *, quiet: bool = False, verbose: bool = False) -> None:
    """The table, tolerance and prompt, nodes in one dump only, divergences, verdict (an unusable pair: the
    command line has said why on stderr)."""
    if rep.exit_code == EXIT_INPUT:
        return
    if not quiet:
        console.print(drift_table(rep, console.width) if rep.model is not None and not verbose and rep.compared
                      else node_table(rep, verbose, console.width))
        skipped = rep.totals()["skipped"]
        if skipped and not verbose:
            console.print(f"[dim]{skipped} matched nodes not compared (-v lists them and why)[/]")
    for line in filter(None, (tolerance_line(rep), prompt_line(rep))):
        console.print(f"[dim]{escape(line)}[/]", highlight=False)
    if rep.reference is not None:
        from .reference import reference_lines

        for line in reference_lines(rep.reference):
            console.print(printable(line), highlight=False, soft_wrap=True, markup=False)
    limit = None if verbose else LIST_LIMIT
    drift = rep.model is not None and not verbose  # two builds' graphs differ: nodes of one dump only are expected
    if drift and rep.only and not quiet:
        console.print(f"[dim]{len(rep.only)} nodes in one dump only, where the builds' graphs differ (-v lists "
                      "them)[/]")
    for u in [] if quiet or drift else rep.only[:limit]:
        console.print(printable(f"only in {u.side.upper()}: eval {u.evaluation} {u.role.group} {u.role.name} "
                                f"'{u.node.name}' (line {u.node.line}, {u.node.op})"), style="yellow", markup=False,
                      highlight=False, soft_wrap=True)
    if limit is not None and len(rep.only) > limit and not quiet and not drift:
        console.print(f"[yellow]... and {len(rep.only) - limit} more nodes in one dump only (-v or --json)[/]")
    for nd in rep.diverged[:limit]:
        console.print(printable(divergence_line(nd, rep.tolerance.nmse)), style="red", markup=False, highlight=False,
                      soft_wrap=True)
    if limit is not None and len(rep.diverged) > limit:
        console.print(f"... and {len(rep.diverged) - limit} more divergent nodes (-v or --json lists them all)",
                      style="red", markup=False, highlight=False)
    for side in rep.sides or ():  # what check says of each side, as check says it
        style = "red" if side.name == "NEW" else "yellow"
        for line in side.failures(10 if limit is not None else None):
            console.print(printable(f"{side.name}: {line}"), style=style, markup=False, highlight=False, soft_wrap=True)
    style = {EXIT_PASS: "bold green", EXIT_FAIL: "bold red"}.get(rep.exit_code, "bold yellow")
    console.print(printable(verdict(rep)), style=style, markup=False, highlight=False, soft_wrap=True)
