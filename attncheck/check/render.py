"""Report → text for people: a rich table per dump, failures by head, a one-line verdict."""
from __future__ import annotations

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..arch.vocab import shown
from ..results import describe
from .report import EXIT_FAIL, EXIT_PASS, Report

CHECK_TITLES = {
    "finite": "printed values are numbers",
    "masked": "masked weights are 0",
    "softmax": "kq_soft_max = softmax(kq·scale + mask)",
    "softmax_ratio": "p_j/p_k = exp(scale·(s_j − s_k))",
    "pv": "kqv = P·V",
    "sum": "SOFT_MAX sum line",
    "step": "a step between q or kq and SOFT_MAX (SCALE, TANH, ADD) from its printed input",
    # --model (model_checks.py): every printed element against the reference forward pass
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


def _status(ok: bool) -> str:
    return "[green]PASS[/]" if ok else "[bold red]FAIL[/]"


def site_table(report: Report, verbose: bool = False) -> Table:
    """One row per evaluation × layer: what was checked, the worst error against its bound, and the status."""
    t = Table(title=f"attention in {report.source}", title_justify="left", header_style="bold",
              box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("eval", "queries", "layer", "P rows", "ratios", "masked", "kqv", "worst err", "bound", "need", ""):
        t.add_column(col, justify="left" if col in ("", "queries") else "right", no_wrap=col != "")
    for s in report.sites:
        worst = max(s.results, key=lambda r: r.ratio)
        pv = s.result("pv")
        t.add_row(
            str(s.evaluation), f"{s.n_past}..{s.n_past + s.T - 1}", str(s.layer),
            f"{s.rows_whole}/{s.rows_printed}", str(s.checked("softmax_ratio")), str(s.checked("masked")),
            f"{pv.checked}/{pv.checked + pv.unchecked}" if pv else "-",
            f"{worst.max_error:.1e}", f"{worst.bound:.1e}", f"{worst.ratio:.2f}", _status(s.passed),
        )
        if verbose or not s.passed:
            for r in s.results:
                if verbose or not r.passed:
                    where = "" if r.worst is None or not r.max_error else " at " + describe(r.worst)
                    t.add_row("", f"[dim]{r.check}[/]", "", "", "", "", str(r.checked),
                              f"{r.max_error:.1e}", f"{r.bound:.1e}", f"{r.ratio:.2f}",
                              f"{_status(r.passed)} {_title(r.check)}{where}")
    return t


def _title(check: str) -> str:
    return CHECK_TITLES.get(check) or (f"{check[6:]} = the model's" if check.startswith("model_") else check)


def failure_lines(report: Report, limit: int = 10) -> list[str]:
    """The first failing elements, each with its logical place: evaluation, layer, head, query, slot or dim."""
    out: list[str] = []
    for s in report.failed_sites:
        for r in s.results:
            if r.passed:
                continue
            if r.check in ("sum", "model_sum"):
                f = r.failures[0]
                out.append(f"eval {s.evaluation} layer {s.layer}: {r.node} (line {r.line}) sum = {f.got:.6f}, "
                           f"expected {f.want:.6f} ± {f.bound:.1e} ({r.note})")
                continue
            for f in r.failures[: max(1, limit - len(out))]:
                if f.at is None:  # a whole-node figure (--model's NMSE)
                    out.append(f"eval {s.evaluation} layer {s.layer}: {r.node} (line {r.line}) {r.note} "
                               f"[{_title(r.check)}]")
                    continue
                recomputed = "reference" if r.check.startswith("model_") else "recomputed"
                out.append(f"eval {s.evaluation} layer {s.layer} {describe(f.at)}: {r.node} (line {r.line}) "
                           f"{f.got:.4f}, {recomputed} {f.want:.4f}: |err| {abs(f.got - f.want):.1e} > bound "
                           f"{f.bound:.1e} [{_title(r.check)}]")
            if len(out) >= limit:
                return out
    return out


def verdict(report: Report) -> str:
    """One line: PASS/FAIL/UNVERIFIED with what was covered."""
    t = report.totals()
    code = report.exit_code
    evs = f"{report.evaluations} evaluation{'s' * (report.evaluations != 1)}"
    covered = (f"{t['softmax_rows_checked']} softmax rows, {t['softmax_ratio_elements_checked']} weight ratios, "
               f"{t['masked_weights_checked']} masked weights, {t['kqv_elements_checked']} kqv elements checked "
               f"in {t['sites']} sites ({evs})" + (f"; {t['step_elements_checked']} elements of the steps between kq "
                                                  "and SOFT_MAX" if t["step_elements_checked"] else ""))
    if t.get("model_nodes_checked"):
        covered += (f"; with the model: {t['model_elements_checked']} printed elements of "
                    f"{t['model_nodes_checked']} nodes (kq {t['model_kq_elements_checked']}) and "
                    f"{t['model_sums_checked']} sums")
    used = hypotheses_used(report)
    if used:
        covered += f"; facts pinned by the data: {used}"
    if code == EXIT_PASS:
        return f"PASS {report.source}: {covered}"
    if code == EXIT_FAIL:
        return f"FAIL {report.source}: {t['sites_failed']} of {t['sites']} sites failed; {covered}"
    return f"UNVERIFIED {report.source}: {report.unverified_reason()}"


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
        return f"kq_scale {v:.6g}" if v is not None else "kq_scale 1/sqrt(D_h)"
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
        if rec.get("unexplained"):
            lines.append(f"run {rec['run']}: no stated hypothesis explains the printed weights: its softmax, ratio, "
                         "masked and P·V checks were not run (see the warning)")
        elif rec.get("rows"):
            lines.append(f"run {rec['run']}: {rec['rows'] - rec['rows_failing']} of {rec['rows']} printed rows fit "
                         f"the facts used" + (f"; {len(rec['tried'])} hypotheses tried" if len(rec["tried"]) > 1
                                               else ""))
    other = [f"layer {k}: {v}, no softmax attention: nothing to check" for k, v in report.layer_kinds.items()
             if v.startswith("recurrent") or v == "none"]
    lines += other
    if report.other_softmax:
        shown = ", ".join(report.other_softmax[:3]) + (f" and {len(report.other_softmax) - 3} more"
                                                        if len(report.other_softmax) > 3 else "")
        lines.append(f"{len(report.other_softmax)} SOFT_MAX nodes are not attention (no MUL_MAT(k, q) behind them, "
                     f"e.g. MoE routers): {shown}; not checked")
    return lines


def token_lines(report: Report) -> list[str]:
    """With a model: each run's tokens, id and text."""
    return [f"tokens of run {r}: " + "  ".join(f"{i} {escape(shown(t))}" for i, t in zip(ids, text))
            for r, (ids, text) in enumerate(zip(report.tokens, report.token_text)) if ids and text]


def coverage_lines(report: Report) -> list[str]:
    """What was checked under which facts, what could not be checked from the dump alone, and why."""
    if not report.sites:
        return []
    t = report.totals()
    s0 = report.sites[0]
    origin = next((r["kq_scale"] for r in report.facts), {"origin": "default"})
    if report.kq_scale is not None:
        scale = f"given {report.kq_scale:g}"
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
        lines.append(f"--model {m['path']} ({m['arch']}): every printed element of {t['model_nodes_checked']} nodes "
                     "against its reference forward pass, kq and every printed query row included; first node "
                     "beyond print precision: " + (f"{first['node']} (eval {first['evaluation']}, layer "
                                                    f"{first['layer']}, line {first['line']})" if first else "none"))
    if m is None or m.get("forward", True) is None:
        lines.append(f"not checkable from a dump alone: kq itself (k·q needs all D_h = {s0.D_h} components of q and "
                     "k; llama.cpp prints 6); --model GGUF checks it for architectures with a reference forward pass")
    unprinted = t["softmax_rows_printed"] - t["softmax_rows_checked"]
    if unprinted and not any(r.get("unexplained") for r in report.facts):
        lines.append(f"{unprinted} printed softmax rows have visible slots that were not printed: checked by weight "
                     f"ratios only; their {t['kqv_elements_unchecked']} kqv elements are not checkable"
                     + (" from the dump alone (--model checked them)" if model_checked(report) else ""))
    return lines


def model_checked(report: Report) -> bool:
    return report.model is not None and report.model.get("forward", True) is not None


def render(report: Report, console: Console, *, quiet: bool = False, verbose: bool = False) -> None:
    if not quiet and report.sites:
        console.print(site_table(report, verbose))
        for line in coverage_lines(report) + token_lines(report):
            console.print(f"[dim]{line}[/]", highlight=False)
    for line in failure_lines(report):
        console.print(f"[red]{line}[/]", highlight=False, soft_wrap=True)
    if report.hint:
        console.print(f"[yellow]hint: {report.hint}[/]", highlight=False)
    style = {EXIT_PASS: "bold green", EXIT_FAIL: "bold red"}.get(report.exit_code, "bold yellow")
    console.print(f"[{style}]{verdict(report)}[/]", highlight=False, soft_wrap=True)
