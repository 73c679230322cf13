"""Report → text for people: a rich table per dump, failures by head, a one-line verdict."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ..arch.facts import OPTION, scale_words
from ..arch.vocab import token_unit
from ..errors import markup, printable
from ..results import SiteReport, describe
from .columns import NEVER, Col, dropped, extent, fit
from ..report import EXIT_FAIL, EXIT_PASS, Report

CHECK_TITLES = {
    "finite": "printed values are numbers",
    "masked": "masked weights are 0",
    "softmax": "kq_soft_max = softmax(kq·scale + mask)",
    "softmax_ratio": "p_j/p_k = exp(scale·(s_j − s_k))",
    "pv": "kqv = P·V",
    "sum": "SOFT_MAX sum line",
    "step": "a step between q or kq and SOFT_MAX (SCALE, TANH, ADD) from its printed input",
    # --model (model/compare.py): every printed element against the reference forward pass
    "model_q": "q = the model's Qcur",
    "model_kcur": "Kcur = the model's",
    "model_vcur": "Vcur = the model's",
    "model_k": "K cache = the model's",
    "model_v": "V cache = the model's",
    "model_kq": "kq = k·q from the model",
    "model_softmax": "kq_soft_max = the model's",
    "model_kqv": "kqv = the model's",
    "model_flash_attn": "flash attention = the model's kqv",
    "model_kqv_out": "kqv_out = the model's",
    "model_sum": "sum line = the model's",
}


def _status(ok: bool, checked: int = 1) -> str:
    if not checked:
        return "[yellow]none[/]"  # nothing of it could be checked (e.g. --head of a head that was not printed)
    return "[green]PASS[/]" if ok else "[bold red]FAIL[/]"


COLUMNS = (Col("eval", keep=8), Col("queries", "left", keep=2), Col("layer", keep=NEVER), Col("P rows", keep=4),
           Col("ratios", keep=3), Col("masked", keep=3), Col("kqv", keep=5), Col("worst err", keep=6),
           Col("bound", keep=6), Col("need", keep=7), Col("", "left", keep=NEVER))


def _cells(sites: list[SiteReport], evaluation: str) -> list[str]:
    """One row for some sites of one layer: counts summed, the worst element over all of them, one status."""
    results = [r for s in sites for r in s.results]
    worst = max(results, key=lambda r: r.ratio) if results else None
    pv = [r for r in results if r.check == "pv"]
    checked = sum(r.checked for r in results)
    kqv = f"{sum(r.checked for r in pv)}/{sum(r.checked + r.unchecked for r in pv)}" if pv else "-"
    return [evaluation, extent([q for s in sites for q in (s.n_past, s.n_past + s.T - 1)]), str(sites[0].layer),
            f"{sum(s.rows_whole for s in sites)}/{sum(s.rows_printed for s in sites)}",
            str(sum(s.checked("softmax_ratio") for s in sites)), str(sum(s.checked("masked") for s in sites)), kqv,
            f"{worst.max_error:.1e}" if worst else "-", f"{worst.bound:.1e}" if worst else "-",
            f"{worst.ratio:.2f}" if worst else "-", _status(all(s.passed for s in sites), checked)]


def per_layer(report: Report, verbose: bool = False) -> bool:
    """Whether the table has one row per layer (some layer was checked in several evaluations, and not -v)."""
    layers = [s.layer for s in report.sites]
    return not verbose and len(layers) > len(set(layers))


def site_rows(report: Report, verbose: bool = False) -> list[list[str]]:
    """One row per evaluation × layer; or, when per_layer(), one per layer (worst over its evaluations, counts
    summed) with a row below it for each failing evaluation × layer."""
    if not per_layer(report, verbose):
        return [_cells([s], str(s.evaluation)) for s in report.sites]
    by_layer: dict[int, list[SiteReport]] = {}
    for s in report.sites:
        by_layer.setdefault(s.layer, []).append(s)
    rows = []
    for layer, sites in sorted(by_layer.items()):
        evs = sorted({s.evaluation for s in sites})
        rows.append(_cells(sites, extent(evs) if evs == list(range(evs[0], evs[-1] + 1)) else f"{len(evs)} evals"))
        rows += [_cells([s], f"[red]{s.evaluation}[/]") for s in sites if not s.passed]
    return rows


def site_table(report: Report, verbose: bool = False, width: int | None = None) -> Table:
    """The sites as a table that fits `width`: the layer and its status always, other columns as room allows."""
    return fit(COLUMNS, site_rows(report, verbose), width, title=f"attention in {markup(report.source)}",
               title_justify="left")


def table_note(report: Report, table: Table, verbose: bool = False) -> str:
    """What the table's rows are, and the columns it had no room for."""
    notes = []
    if per_layer(report, verbose):
        n = len({s.evaluation for s in report.sites})
        notes.append(f"one row per layer over its evaluations ({n}): counts summed, the worst element of any; a failing "
                     "evaluation × layer has a row of its own below its layer; -v: a row per evaluation × layer")
    gone = dropped(table, COLUMNS)
    if gone:
        notes.append(f"columns left out for the terminal's width: {', '.join(gone)} (--json has every figure)")
    return "; ".join(notes)


def check_lines(report: Report) -> list[str]:
    """Every check of every site (-v): one line each, its node named."""
    out = []
    for s in report.sites:
        for r in s.results:
            where = "" if r.worst is None or not r.max_error else f" at {describe(r.worst)}"
            status = "PASS" if r.passed else "FAIL"
            if not r.checked:
                status = "none"
            why = f"; {r.unchecked} not checkable: {r.why_unchecked}" if r.unchecked and r.why_unchecked else ""
            out.append(f"eval {s.evaluation} layer {s.layer}: {status} {r.check} {r.node} (line {r.line}): "
                       f"{r.checked} checked, worst |err| {r.max_error:.1e}, bound {r.bound:.1e}, need {r.ratio:.2f}"
                       f"{where} [{_title(r.check)}]{why}")
    return out


def _title(check: str) -> str:
    return CHECK_TITLES.get(check) or (f"{check[6:]} = the model's" if check.startswith("model_") else check)


def _failure(s: SiteReport, r, f) -> str:
    if r.check in ("sum", "model_sum"):
        return (f"eval {s.evaluation} layer {s.layer}: {r.node} (line {r.line}) sum = {f.got:.6f}, "
                f"expected {f.want:.6f} ± {f.bound:.1e} ({r.note})")
    if f.at is None:  # a whole-node figure (--model's NMSE)
        return f"eval {s.evaluation} layer {s.layer}: {r.node} (line {r.line}) {r.note} [{_title(r.check)}]"
    recomputed = "reference" if r.check.startswith("model_") else "recomputed"
    line = f.line or r.line
    return (f"eval {s.evaluation} layer {s.layer} {describe(f.at)}: {r.node} (line {line}) "
            f"{f.got:.4f}, {recomputed} {f.want:.4f}: |err| {abs(f.got - f.want):.1e} > bound "
            f"{f.bound:.1e} [{_title(r.check)}]")


def failure_lines(report: Report, limit: int | None = 10) -> list[str]:
    """The failing elements, each with its logical place: evaluation, layer, head, query, slot or dim.

    With a limit, the first failures of every failing site in turn (so each failing site shows), then one line
    saying how many more there are and in which sites; without (-v), every failing element the report kept."""
    per_site: list[tuple[str, list[str], int]] = []  # site, its lines, its failing elements (kept or not)
    for s in report.failed_sites:
        lines, n = [], 0
        for r in s.results:
            if r.passed:
                continue
            one = r.check in ("sum", "model_sum") or not r.failures
            lines += [_failure(s, r, f) for f in (r.failures[:1] if one else r.failures)]
            n += 1 if one else r.failed
        per_site.append((f"eval {s.evaluation} layer {s.layer}", lines, n))
    taken = [len(lines) for _, lines, _ in per_site]
    if limit is not None:
        taken = [0] * len(per_site)
        while sum(taken) < limit and any(t < len(lines) for t, (_, lines, _) in zip(taken, per_site)):
            for i, (_, lines, _) in enumerate(per_site):
                if taken[i] < len(lines) and sum(taken) < limit:
                    taken[i] += 1
    shown = [line for t, (_, lines, _) in zip(taken, per_site) for line in lines[:t]]
    rest = [(site, n - t) for t, (site, _, n) in zip(taken, per_site) if n > t]
    if rest:
        total = sum(n for _, n in rest)
        where = ", ".join(f"{site}: {n}" for site, n in rest[:4]) + (f" and {len(rest) - 4} more sites"
                                                                     if len(rest) > 4 else "")
        how = ("-v lists every one kept, " if limit is not None else "") + "--json has each check's count and its first 20"
        shown.append(f"... and {total} more failing element{'s' * (total != 1)} ({where}; {how})")
    return shown


def verdict(report: Report) -> str:
    """One line: PASS/FAIL/UNVERIFIED with what was covered."""
    t = report.totals()
    code = report.exit_code
    evs = f"{report.evaluations} evaluation{'s' * (report.evaluations != 1)}"
    covered = (f"{t['softmax_rows_checked']} softmax rows, {t['softmax_ratio_elements_checked']} weight ratios, "
               f"{t['masked_weights_checked']} masked weights, {t['kqv_elements_checked']} kqv elements checked "
               f"in {t['sites']} site{'s' * (t['sites'] != 1)} ({evs})" + (f"; {t['step_elements_checked']} elements of the steps between kq "
                                                  "and SOFT_MAX" if t["step_elements_checked"] else ""))
    if t.get("model_nodes_checked"):
        of = f" of {report.model['nodes_printed']} printed" if report.model and report.model.get("nodes_printed") else ""
        covered += (f"; with the model: {t['model_elements_checked']} printed elements of "
                    f"{t['model_nodes_checked']}{of} nodes (kq {t['model_kq_elements_checked']}) and "
                    f"{t['model_sums_checked']} sums")
    unchecked = t["kqv_elements_unchecked"]
    if unchecked and not model_checked(report):  # what was not checked, as a share of what was printed
        printed = unchecked + t["kqv_elements_checked"]
        covered += (f"; {unchecked} of {printed} printed kqv elements ({share(unchecked, printed)}) not checkable "
                    "from the dump alone")
    used = hypotheses_used(report)
    if used:
        covered += f"; facts pinned by the data: {used}"
    if code == EXIT_PASS:
        return f"PASS {report.source}: {covered}"
    if code == EXIT_FAIL:
        return f"FAIL {report.source}: {t['sites_failed']} of {t['sites']} sites failed; {covered}"
    return f"UNVERIFIED {report.source}: {report.unverified_reason()}"


def share(part: int, whole: int) -> str:
    """part/whole as a percentage that never rounds to 0% or 100% when it is neither."""
    pct = 100 * part / whole
    if 0 < pct < 1:
        return "<1%"
    if 99 < pct < 100:
        return ">99%"
    return f"{pct:.0f}%"


def hypotheses_used(report: Report) -> str:
    """The facts no option or model gave that the data pinned, as words: "kq_scale 1 (q is pre-scaled by node_7
    (line 12)), window 4 on layers 0, 2 (n_swa in (3, 4]: ...)"; '' when every fact is a default or given."""
    parts: list[str] = []
    for rec in report.facts:
        for name in ("kq_scale", "causal", "alibi_max_bias", "window", "sinks"):
            f = rec.get(name) or {}
            if f.get("origin") not in ("inferred", "structure") or not _says(name, f.get("value")):
                continue
            parts.append(f"{_fact_value(name, f['value'])} ({f['detail']})")
    return "; ".join(dict.fromkeys(parts))


def _says(name: str, v) -> bool:
    """Whether a fact's value is worth a word: a scale or causality always, the others when present."""
    return name in ("kq_scale", "causal") or bool(v)


def _fact_value(name: str, v) -> str:
    if name == "kq_scale":
        return f"kq_scale {scale_words(v)}"
    if name == "causal":
        return "causal" if v else "non-causal (every token visible)"
    if name == "alibi_max_bias":
        return f"ALiBi max_bias {v:g}"
    if name == "window":
        return f"{v['kind']} window {v['n_swa']} on layers {', '.join(map(str, v['layers']))}"
    if name == "sinks":
        return "attention sinks"
    return f"{name} {v}"


def facts_lines(report: Report) -> list[str]:
    """Where each attention fact came from, per run (only what is not llama.cpp's default, or was given)."""
    lines = []
    for rec in report.facts:
        given = [f"{_fact_value(n, rec[n]['value'])} ({rec[n]['origin']}: {rec[n]['detail']})"
                 for n in ("kq_scale", "causal", "alibi_max_bias", "window", "sinks")
                 if rec.get(n, {}).get("origin") in ("option", "model", "log") and _says(n, rec[n]["value"])]
        if given:
            lines.append(f"run {rec['run']}: given: " + "; ".join(given))
        if rec.get("rows_failing"):
            lines.append(f"run {rec['run']}: no hypothesis tried explains every printed row: checked under the one "
                         f"that explains most, whose {rec['rows_failing']} failing rows of {rec['rows']} are failures; "
                         f"tried: {'; '.join(rec['tried'])}")
        elif rec.get("rows"):
            lines.append(f"run {rec['run']}: {rec['rows']} of {rec['rows']} printed rows fit the facts used"
                         + (f"; {len(rec['tried'])} hypotheses tried" if len(rec["tried"]) > 1 else ""))
    other = [f"layer {k}: {v}, no softmax attention: nothing to check" for k, v in report.layer_kinds.items()
             if v.startswith("recurrent")]
    lines += other
    if report.other_softmax:
        shown = ", ".join(report.other_softmax[:3]) + (f" and {len(report.other_softmax) - 3} more"
                                                        if len(report.other_softmax) > 3 else "")
        lines.append(f"{len(report.other_softmax)} SOFT_MAX nodes are not attention (no MUL_MAT(k, q) behind them, "
                     f"e.g. MoE routers): {shown}; not checked")
    return lines


def token_lines(report: Report) -> list[str]:
    """With a model: each run's tokens, id and text."""
    return [f"tokens of run {r}: " + "  ".join(token_unit(i, t, markup=True) for i, t in zip(ids, text))
            for r, (ids, text) in enumerate(zip(report.tokens, report.token_text)) if ids and text]


def coverage_lines(report: Report) -> list[str]:
    """What was checked under which facts, what could not be checked from the dump alone, and why."""
    if not report.sites:
        return []
    t = report.totals()
    s0 = report.sites[0]
    origin = next((r["kq_scale"] for r in report.facts), {"origin": "default"})
    if report.kq_scale.origin == OPTION:
        scale = f"given {report.kq_scale.value:g}"
    elif origin.get("origin") == "default":
        scale = f"1/sqrt(D_h) = {s0.kq_scale:.6g}"
    else:
        scale = f"{s0.kq_scale:.6g} ({origin['origin']}: {origin['detail']})"
    lines = [f"kq_scale: {scale}" + (f"; inferred from the data: {report.inferred_kq_scale:.6g} "
                                     f"({report.inferred_rows} rows)" if report.inferred_kq_scale is not None else "")]
    used = hypotheses_used(report)
    if used:
        lines.append(f"pinned by the data: {used}; --model GGUF gives these from the model")
    lines += facts_lines(report)
    if report.tolerance is not None:
        lines.append(f"bounds: --atol {report.tolerance.atol:g} --rtol {report.tolerance.rtol:g} in place of the "
                     "bounds derived from print precision and storage types (softmax, ratios, P·V, sums)")
    m = report.model
    if m is not None and m.get("forward", True) is None:
        lines.append(f"--model {m['path']} ({m['arch']}): {m['note']}")
    elif m is not None:
        first = m.get("first_beyond_print")
        lines.append(f"--model {m['path']} ({m['arch']}): {m['nodes_checked']} of {m['nodes_printed']} printed nodes "
                     "checked, every printed element of each against the reference forward pass at its own place, "
                     "kq and every printed query row included; first node beyond print precision: "
                     + (f"{first['node']} (eval {first['evaluation']}, layer {first['layer']}, line {first['line']})"
                        if first else "none"))
        unchecked = (m.get("unchecked") or {}).get("by_reason") or {}
        if unchecked:
            lines.append("not checked against the model: " + "; ".join(f"{n} node{'s' * (n != 1)}: {why}"
                                                                       for why, n in unchecked.items()))
    for r in (m or {}).get("runs") or []:
        if r.get("tokens_from") not in (None, "log"):
            lines.append(f"token ids of run {r['run']}: {r['tokens']} ({TOKENS_FROM.get(r['tokens_from'], r['tokens_from'])})")
    if m is None or m.get("forward", True) is None:
        lines.append(f"not checkable from a dump alone: kq itself (k·q needs all D_h = {s0.D_h} components of q and "
                     "k; llama.cpp prints 6); --model GGUF checks it for architectures with a reference forward pass")
    unprinted = t["softmax_rows_printed"] - t["softmax_rows_checked"]
    if unprinted:
        lines.append(f"{unprinted} printed softmax rows have visible slots that were not printed: checked by weight "
                     f"ratios only; their {t['kqv_elements_unchecked']} kqv elements are not checkable"
                     + (" from the dump alone (--model checked them)" if model_checked(report) else ""))
    return lines


TOKENS_FROM = {"embeddings": "the log printed none: looked up from its printed embedding rows in the model's "
                             "token_embd.weight", "--tokens": "given with --tokens"}


def model_checked(report: Report) -> bool:
    return (report.model is not None and report.model.get("forward", True) is not None
            and report.model.get("nodes_checked", 1) > 0)


def render(report: Report, console: Console, *, quiet: bool = False, verbose: bool = False) -> None:
    if not quiet and report.sites:
        table = site_table(report, verbose, console.width)
        console.print(table)
        note = table_note(report, table, verbose)
        for line in ([note] if note else []) + coverage_lines(report):
            console.print(f"[dim]{markup(line)}[/]", highlight=False)
        for line in token_lines(report):  # their text escaped already
            console.print(f"[dim]{line}[/]", highlight=False)
    for line in check_lines(report) if verbose and not quiet else []:
        console.print(printable(line), style="red" if " FAIL " in line else None, markup=False, highlight=False,
                      soft_wrap=True)
    for line in failure_lines(report, None if verbose else 10):
        console.print(printable(line), style="red", markup=False, highlight=False, soft_wrap=True)
    if report.hint:
        console.print(printable(f"hint: {report.hint}"), style="yellow", markup=False, highlight=False,
                      soft_wrap=True)
    if report.stopped_early:
        console.print("stopped early (--fail-fast): at the first failing site; later sites not checked", style="red",
                      markup=False, highlight=False)
    style = {EXIT_PASS: "bold green", EXIT_FAIL: "bold red"}.get(report.exit_code, "bold yellow")
    console.print(printable(verdict(report)), style=style, markup=False, highlight=False, soft_wrap=True)
