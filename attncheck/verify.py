"""Dump → report: find every attention site, run the checks on it, and keep what the report needs.

Evaluations stream through: one is read, checked and dropped before the next, so memory stays flat.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import BinaryIO, Callable

from .check import checks
from .check.bounds import FixedTolerance
from .errors import DumpError, printable
from .dump.graph import Dump, Evaluation, Site, read_dump
from .check.heads import SiteView, select_heads, site_view
from .check.report import Report, SiteReport
from .dump.sample import parse_sample


@dataclass(frozen=True)
class Options:
    """What to check: kq_scale None means 1/sqrt(D_h) per site; layers/heads None mean all.

    model: a GGUF file; every printed attention number is then also checked against its reference forward pass
    (model_checks.py); tokens: the prompt's token ids, for logs that do not print them.
    """

    kq_scale: float | None = None
    layers: frozenset[int] | None = None
    heads: frozenset[int] | None = None
    fail_fast: bool = False
    model: str | None = None
    tokens: tuple[int, ...] | None = None
    tolerance: FixedTolerance | None = None  # --atol/--rtol in place of the derived bounds of the dump-only checks


def default_scale(site: Site) -> float:
    """llama.cpp passes kq_scale = 1/sqrt(D_h) for GPT-2 and Llama (D_h = ne0 of q)."""
    return 1.0 / math.sqrt(site.D_h) if site.D_h else 1.0


def verify(dump: Dump | str | BinaryIO, options: Options | None = None, *,
           progress: Callable[[Dump, Evaluation], None] | None = None, **kw) -> Report:
    """Check every attention site of a dump; keyword arguments build Options (kq_scale=, layers=, heads=...).

    progress(dump, evaluation) is called after each evaluation is checked (dump.bytes_read says how far it is).
    """
    opts = options or Options(**{k: (frozenset(v) if k in ("layers", "heads") and v is not None else v)
                                 for k, v in kw.items()})
    if not isinstance(dump, Dump):
        dump = read_dump(dump)
    report = Report(source=dump.source, kq_scale=opts.kq_scale, tolerance=opts.tolerance)
    num = den = 0.0
    rows = 0
    failed_views: list[tuple[SiteReport, SiteView]] = []
    checker = None
    if opts.model is not None:
        from .model.checker import ModelChecker

        checker = ModelChecker(opts.model, dump.source, kq_scale=opts.kq_scale, tokens=opts.tokens,
                               layers=opts.layers, heads=opts.heads)
    for ev in dump.evaluations():
        report.evaluations += 1
        report.flash_nodes += len(ev.flash)
        model_results, model_layers = checker.check(ev) if checker is not None else ({}, [])
        for site in ev.sites:
            report.layers_seen.add(site.layer)
            if opts.layers is not None and site.layer not in opts.layers:
                continue
            sr, view = _check_site(dump, ev, site, opts)
            sr.results.extend(model_results.pop(site.layer, []))
            report.sites.append(sr)
            n, d, r = checks.infer_scale(view)
            num, den, rows = num + n, den + d, rows + r
            if any(not c.passed for c in sr.results if c.check in ("softmax", "softmax_ratio")):
                failed_views.append((sr, view))
            if opts.fail_fast and not sr.passed:
                report.stopped_early = True
                break
        if checker is not None and not report.stopped_early:  # flash attention: sites only --model checks
            flash = checker.flash_sites(ev, model_layers, model_results)
            report.sites.extend(flash)
            report.stopped_early = opts.fail_fast and any(not s.passed for s in flash)
        if progress is not None:
            progress(dump, ev)
        if report.stopped_early:
            break
    if checker is not None:
        report.model = checker.summary(complete=not report.stopped_early)
    report.runs = len(dump.runs) or (1 if report.evaluations else 0)
    report.tokens = [r.tokens for r in dump.runs]
    if den > 0:
        report.inferred_kq_scale, report.inferred_rows = num / den, rows
    _hint(report, failed_views, opts.tolerance)
    report.warnings = [f"{dump.source}:{n.line}: {n.message}" for n in dump.notes]
    if dump.cut is not None and not report.stopped_early:
        report.warnings.append(
            f"{dump.source}:{dump.cut.line}: the output ends inside node '{dump.cut.name}' "
            "(llama.cpp's logger loses its tail at exit); no check needed it"
        )
    report.warnings = [printable(w) for w in report.warnings]  # one line each, whatever the input held
    return report


def _check_site(dump: Dump, ev: Evaluation, site: Site, opts: Options) -> tuple[SiteReport, SiteView]:
    src = dump.source
    if ev.n_past is None:
        raise DumpError(src, site.softmax.line, "cannot place this evaluation: an earlier one had no attention to count T")
    P = parse_sample(site.softmax, src)
    S = parse_sample(site.scores, src) if site.scores is not None and not site.scores.quantized else None
    O = parse_sample(site.kqv, src) if site.kqv is not None else None
    V = parse_sample(site.v, src) if site.v is not None and not site.v.quantized else None
    view = site_view(site, ev.n_past, P, S, O, V, src)
    if opts.heads is not None:
        view = select_heads(view, set(opts.heads))
    scale = opts.kq_scale if opts.kq_scale is not None else default_scale(site)
    tol = opts.tolerance
    results = [
        *checks.finite(view),
        checks.masked(view),
        checks.softmax_rows(view, scale, tol),
        checks.softmax_ratio(view, scale, tol),
        checks.pv(view, tol),
    ]
    if opts.heads is None:
        results.append(checks.softmax_sum(view, P.sums, P.values, tol))
    sr = SiteReport(
        evaluation=ev.index, run=ev.run, n_past=ev.n_past, T=site.T, layer=site.layer,
        H=site.H, H_kv=site.H_kv, D_h=site.D_h, n_kv=site.n_kv, kq_scale=scale,
        nodes={"kq": site.kq.name if site.kq else None, "kq_soft_max": site.softmax.name,
               "kqv": site.kqv.name if site.kqv else None, "v": site.v.name if site.v else None},
        line=site.softmax.line,
        results=results,
        rows_whole=int(view.rows_whole.sum()) * len(view.heads),
        rows_printed=len(view.queries) * len(view.heads),
    )
    return sr, view


def _hint(report: Report, failed: list[tuple[SiteReport, SiteView]], tol: FixedTolerance | None) -> None:
    """When the softmax checks fail and the scale inferred from the data would pass them, say so.

    The estimate carries print noise, so 1/sqrt(D_h) is tried first when it lies within 1% of it.
    """
    s = report.inferred_kq_scale
    if not failed or s is None:
        return
    candidates = [s]
    canonical = default_scale(failed[0][1].site)
    if abs(s / canonical - 1) < 0.01:
        candidates.insert(0, canonical)
    for c in candidates:
        if all(checks.softmax_rows(v, c, tol).passed and checks.softmax_ratio(v, c, tol).passed for _, v in failed):
            name = " = 1/sqrt(D_h)" if c == canonical else ""
            report.hint = (f"the data suggest kq_scale = {c:.6g}{name} (inferred {s:.6g} from "
                           f"{report.inferred_rows} rows); pass --kq-scale {c:.6g} if the model uses it")
            return
