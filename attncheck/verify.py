"""Dump → report: every evaluation through the checkers, their SiteReports merged per evaluation × layer.

The checkers (checker.py's interface): the dump-only checks (check/dumponly.py) always, the --model checks
(model/checker.py) with a model. Evaluations stream through: one is read, checked and dropped before the next, so
memory stays flat.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO, Callable

from .check.dumponly import DumpChecker
from .check.report import Report
from .dump.graph import Dump, Evaluation, read_dump
from .errors import printable
from .results import FixedTolerance, SiteReport


@dataclass(frozen=True)
class Options:
    """What to check: kq_scale None means 1/sqrt(D_h) per site; layers/heads None mean all.

    model: a GGUF file; every printed attention number is then also checked against its reference forward pass
    (model/checker.py); tokens: the prompt's token ids, for logs that do not print them.
    """

    kq_scale: float | None = None
    layers: frozenset[int] | None = None
    heads: frozenset[int] | None = None
    fail_fast: bool = False
    model: str | None = None
    tokens: tuple[int, ...] | None = None
    tolerance: FixedTolerance | None = None  # --atol/--rtol in place of the derived bounds of the dump-only checks


def _options(options: Options | None, kw: dict) -> Options:
    return options or Options(**{k: (frozenset(v) if k in ("layers", "heads") and v is not None else v)
                                 for k, v in kw.items()})


def merge(*per_checker: list[SiteReport]) -> list[SiteReport]:
    """One SiteReport per layer: the first checker's (dump-only) with the others' results added; a layer only a
    later checker reports (flash attention, which only --model checks) follows in that checker's order."""
    out: list[SiteReport] = []
    by_layer: dict[int, SiteReport] = {}
    for reports in per_checker:
        for sr in reports:
            if sr.layer in by_layer:
                by_layer[sr.layer].results.extend(sr.results)
            else:
                by_layer[sr.layer] = sr
                out.append(sr)
    return out


def verify(dump: Dump | str | BinaryIO, options: Options | None = None, *,
           progress: Callable[[Dump, Evaluation], None] | None = None, **kw) -> Report:
    """Check every attention site of a dump; keyword arguments build Options (kq_scale=, layers=, heads=...).

    progress(dump, evaluation) is called after each evaluation is checked (dump.bytes_read says how far it is).
    """
    opts = _options(options, kw)
    if not isinstance(dump, Dump):
        dump = read_dump(dump)
    report = Report(source=dump.source, kq_scale=opts.kq_scale, tolerance=opts.tolerance)
    checker = DumpChecker(dump.source, opts.kq_scale, opts.layers, opts.heads, opts.tolerance)
    model = None
    if opts.model is not None:
        from .model.checker import ModelChecker  # imports gguf: only when a model is given

        model = ModelChecker(opts.model, dump.source, kq_scale=opts.kq_scale, tokens=opts.tokens,
                             layers=opts.layers, heads=opts.heads)
    for ev in dump.evaluations():
        report.evaluations += 1
        report.flash_nodes += len(ev.flash)
        for sr in merge(checker.check(ev), model.check(ev) if model is not None else []):
            report.sites.append(sr)
            if opts.fail_fast and not sr.passed:
                report.stopped_early = True
                break
        if progress is not None:
            progress(dump, ev)
        if report.stopped_early:
            break
    summary = checker.finish(complete=not report.stopped_early)
    if model is not None:
        report.model = model.finish(complete=not report.stopped_early)
    report.layers_seen = summary.layers_seen
    report.inferred_kq_scale, report.inferred_rows, report.hint = (summary.inferred_kq_scale, summary.inferred_rows,
                                                                   summary.hint)
    report.runs = len(dump.runs) or (1 if report.evaluations else 0)
    report.tokens = [r.tokens for r in dump.runs]
    report.warnings = [f"{dump.source}:{n.line}: {n.message}" for n in dump.notes]
    if dump.cut is not None and not report.stopped_early:
        report.warnings.append(
            f"{dump.source}:{dump.cut.line}: the output ends inside node '{dump.cut.name}' "
            "(llama.cpp's logger loses its tail at exit); no check needed it"
        )
    report.warnings = [printable(w) for w in report.warnings]  # one line each, whatever the input held
    return report
