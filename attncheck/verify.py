"""Dump → report: every evaluation through the checkers, their SiteReports merged per evaluation × layer.

The checkers (checker.py's interface): the dump-only checks (check/dumponly.py) always, the --model checks
(model/checker.py) with a model. Evaluations stream through: one is read, checked and dropped before the next, so
memory stays flat.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable, Protocol

from .arch.facts import LOG, MODEL, OPTION, AttentionFacts, Fact
from .arch.context import ModelContext, open_model
from .arch.gguf_header import Header
from .arch.header import facts_from_header, require_shape
from .arch.log_header import LogHeader
from .arch.vocab import token_text
from .check import checks
from .check.checks import Elements
from .check.dumponly import DumpChecker
from .check.hypotheses import pin
from .report import Report
from .dump.graph import Dump, Evaluation, read_dump
from .errors import DumpError, printable
from .results import SiteReport, Tolerance
from .sites.heads import SiteView, Stack
from .sites.resolve import Extra


@dataclass(frozen=True)
class Options:
    """What to check: kq_scale None means 1/sqrt(D_h) per site; layers/heads None mean all.

    model: a GGUF file, or its context opened once for a command's dumps (arch/context.py); every printed attention
    number is then also checked against its reference forward pass (model/checker.py); tokens: the prompt's token
    ids, for logs that do not print them.
    """

    kq_scale: float | None = None
    layers: frozenset[int] | None = None
    heads: frozenset[int] | None = None
    fail_fast: bool = False
    model: str | ModelContext | None = None
    tokens: tuple[int, ...] | None = None
    tolerance: Tolerance | None = None  # --atol/--rtol in place of the derived bounds of the dump-only checks
    jobs: int | None = None  # processes reading the dump (None: every core); results do not depend on it
    require_ids: bool = True  # False: a run whose token ids cannot be had gets its dump-only checks, and says why


def _options(options: Options | None, kw: dict) -> Options:
    return options or Options(**{k: (frozenset(v) if k in ("layers", "heads") and v is not None else v)
                                 for k, v in kw.items()})


def merge(*per_checker: list[SiteReport]) -> list[SiteReport]:
    """One SiteReport per evaluation × layer: the first checker's (dump-only) with the others' results added; a
    layer only a later checker reports (flash attention, which only --model checks) follows the evaluation's others."""
    by_key: dict[tuple[int, int], SiteReport] = {}
    order: list[tuple[int, int, int]] = []  # evaluation, which checker, position
    for c, reports in enumerate(per_checker):
        for i, sr in enumerate(reports):
            key = (sr.evaluation, sr.layer)
            if key in by_key:
                by_key[key].results.extend(sr.results)
            else:
                by_key[key] = sr
                order.append((sr.evaluation, c, i))
    firsts = {(c, i): sr for c, reports in enumerate(per_checker) for i, sr in enumerate(reports)}
    return [firsts[(c, i)] for _, c, i in sorted(order)]


def given_facts(opts: Options, header: Header | None = None, log: LogHeader | None = None) -> AttentionFacts:
    """The facts a model's header (else the GGUF keys a 2024 log printed) and the options give (an option over
    the header); the rest stay open to the hypotheses of check/hypotheses.py."""
    if header is not None:  # with a 2024 log, as a build of then read the header (arch/header.py era_2024)
        facts = facts_from_header(header.meta, MODEL, header.tensor, era_2024=log is not None)
    else:
        facts = AttentionFacts() if log is None else facts_from_header(log.meta, LOG, era_2024=True)
    if opts.kq_scale is not None:
        facts = facts.with_(kq_scale=Fact(float(opts.kq_scale), OPTION, "--kq-scale"))
    return facts


def pinned_facts(views: list[SiteView], given: AttentionFacts) -> tuple[AttentionFacts, Extra]:
    """The facts `check` pins on a run's sites (check/hypotheses.py: the given ones kept, the rest tested on the
    printed rows) and the uncertainties a fitted one adds: what inspect walks a head under."""
    scored, _ = pin(views, given)
    return scored.facts, scored.extra


RECOMPUTED = {"softmax": checks.softmax_rows, "ratio": checks.softmax_ratio, "pv": checks.pv}


def recomputed(check: str, stack: Stack, head: int, query: int) -> Elements:
    """One printed row of a dump-only check's recomputation (check/checks.py) over a stack: its slots or dims (x),
    the dumped and recomputed values and their bounds, as `check` compares them (head, query: printed positions;
    check: a key of RECOMPUTED), so inspect shows the very numbers `check` compared."""
    el = RECOMPUTED[check](stack)
    sel = (el.h == head) & (el.t == query)
    return el._replace(**{k: getattr(el, k)[sel] for k in ("got", "want", "bound", "s", "h", "t", "x")})


def head_reports(source: str, ev: Evaluation, facts: AttentionFacts, layer: int, head: int) -> list[SiteReport]:
    """The dump-only checks of one head of one layer of an evaluation, under facts already pinned on its run
    (pinned_facts), as `check --layer --head` reports them: inspect --html's page."""
    checker = DumpChecker(source, facts, frozenset({layer}), frozenset({head}))
    return checker.check(ev) + checker.finish()[0]


def _fits(shape: tuple[int, list[int]], sites, source: str, header: Header) -> None:
    """A model's header must fit the dump's attention: its layer count and each layer's query heads (sites: Site or
    SiteInfo)."""
    n_layer, heads = shape
    for s in sites:
        if s.layer < n_layer and heads[s.layer] == s.H:
            continue
        m = header.meta
        h = next((n for n in heads if n), 1)  # a hybrid's first layers may have none
        kv = m.get(f"{header.arch}.attention.head_count_kv", h)
        d = m.get(f"{header.arch}.attention.key_length") or (m[f"{header.arch}.embedding_length"] // h)
        raise DumpError(source, s.softmax.line,
                        f"the model does not fit this dump: layer {s.layer} has {s.H} query heads, {s.H_kv} KV heads "
                        f"of D_h = {s.D_h}; {header.path} ({header.arch}) has {n_layer} layers, {h} query "
                        f"heads, {kv if not isinstance(kv, list) else kv[0]} KV heads of D_h = {d}")


class Observer(Protocol):
    """What verify shows a collector (the HTML page's, present/page.py) besides the report."""

    def evaluation(self, ev: Evaluation, reference: Any) -> None:
        """Each evaluation once the checkers have seen it, while its nodes are still there; reference: the run's
        reference forward pass with --model (get(layer, role)), else None."""

    def site(self, report: SiteReport) -> None:
        """Each SiteReport as the report takes it (after its run's facts were pinned)."""


@dataclass
class Read:
    """What reading the dump gave besides the sites: records for the report (notes, runs, the cut node)."""

    notes: list = field(default_factory=list)
    runs: list = field(default_factory=list)
    cut: object = None  # the node (or NodeRef) the dump ended inside
    evaluations: int = 0
    flash: int = 0
    log: object = None  # the 2024 log header whose facts the checker holds


def _log_facts(checker: DumpChecker, opts: Options, read: Read, log: LogHeader | None,
               header: Header | None = None) -> list[SiteReport]:
    """A run whose log printed its model's GGUF keys (a 2024 log) is checked under their facts, as under a model's
    header, and with --model under the model's as a build of 2024 read them: the run before ends under the facts it
    was read with."""
    if log is read.log:
        return []
    out = checker._close()
    checker.given, read.log = given_facts(opts, header, log), log
    return out


def _log_header(dump: Dump, ev: Evaluation) -> LogHeader | None:
    """The GGUF keys the log of the evaluation's run printed: its latest run start before it (the reader may have
    read the next run's start already)."""
    first = ev.nodes[0].line if ev.nodes else None
    starts = [r for r in dump.runs if first is None or r.line < first]
    return starts[-1].header if starts else None


def verify(dump: Dump | str | BinaryIO, options: Options | None = None, *,
           progress: Callable[[Dump, Evaluation | None], None] | None = None, observe: Observer | None = None,
           **kw) -> Report:
    """Check every attention site of a dump; keyword arguments build Options (kq_scale=, layers=, heads=...).

    progress(dump, evaluation) is called as the dump is read (dump.bytes_read says how far it is); observe (Observer)
    is shown each evaluation and each SiteReport. The dump-only checks read the dump in parts on every core
    (Options.jobs; dump/pool.py); with a model's reference forward pass, an observer or --fail-fast, evaluations are
    read one after another in this process.
    """
    opts = _options(options, kw)
    if not isinstance(dump, Dump):
        dump = read_dump(dump)
    context = open_model(opts.model) if opts.model is not None else None
    header, path = (context.header, context.path) if context is not None else (None, None)
    shape = require_shape(header.meta, header.path) if header is not None else None
    given = given_facts(opts, header)  # its kq_scale is the one the report, the dump-only and the --model checks use
    report = Report(source=dump.source, kq_scale=given.kq_scale, tolerance=opts.tolerance, heads=opts.heads)
    # per-head figures only for an observer (the HTML page): no report or JSON shows them, and they are half the
    # memory a SiteReport holds
    checker = DumpChecker(dump.source, given, opts.layers, opts.heads, opts.tolerance, per_head=observe is not None)
    model = None
    if header is not None:
        entry = context.entry
        if entry is not None and entry.forward is not None:
            from .model.checker import ModelChecker  # imports gguf: only when a model is given

            model = ModelChecker(path, dump.source, kq_scale=given.kq_scale.value, tokens=opts.tokens, header=header,
                                 layers=opts.layers, heads=opts.heads, require_ids=opts.require_ids,
                                 deferred=observe is None)  # the HTML page draws each evaluation's reference
        else:
            report.model = {"path": path, "arch": header.arch, "forward": None,
                            "note": f"attncheck has no reference forward pass for {header.arch!r}: the printed numbers "
                                    "are checked from the dump alone, under the attention facts its header gives"}
    fits = (lambda infos: _fits(shape, infos, dump.source, header)) if shape is not None else None
    identity = None
    if header is not None and model is None:  # no reference: the printed embedding rows still tell whose dump it is
        from .model.identity import checker as identity_checker

        identity = identity_checker(path, header, dump.source, opts.tokens)
    if model is None and identity is None and observe is None and not opts.fail_fast:
        from_dump, read = _by_parts(dump, checker, opts, progress, fits, header)
        from_model: list[SiteReport] = []
    else:
        from_dump, from_model, read = _by_evaluation(dump, checker, model, opts, report, progress, observe, fits,
                                                     identity, header)
    held, summary = checker.finish(complete=not report.stopped_early)
    from_dump += held
    if model is not None:
        more, report.model = model.finish(complete=not report.stopped_early)
        from_model += more
    for sr in merge(from_dump, from_model):
        report.sites.append(sr)
        if observe is not None:
            observe.site(sr)
        if opts.fail_fast and not sr.passed:
            report.stopped_early = True
            break
    _fill(report, dump.source, read, summary, model is not None)
    for r in (report.model or {}).get("runs") or []:
        if r.get("not_checked"):
            report.warnings.append(printable(f"{dump.source}: run {r['run']} not checked against the model "
                                             f"(its dump-only checks were run): {r['not_checked']}"))
    if header is not None:  # with a model, each run's tokens as text (its vocabulary)
        report.token_text = [token_text(header.meta, t if t is not None else opts.tokens) for t in report.tokens]
    return report


def _by_parts(dump: Dump, checker: DumpChecker, opts: Options, progress, fits,
              header: Header | None = None) -> tuple[list[SiteReport], Read]:
    """The dump read in parts (in worker processes when opts.jobs > 1), taken in by the checker in dump order; a
    2024 log's run under the facts its GGUF keys give (_log_facts)."""
    from .check.gather import gather
    from .dump.pool import Replay, gathered, jobs_default

    read = Read()
    replay = Replay(dump.source)
    out: list[SiteReport] = []
    def on_read(block: bytes) -> None:  # a stream read here as it comes: the bar moves with it
        dump.bytes_read += len(block)
        if progress is not None:
            progress(dump, None)

    for part in gathered(dump.stream, dump.source, checker.layers, opts.jobs or jobs_default(), gather,
                         on_read=on_read):
        for ev in replay.take(part):
            k = ev.run - replay.implicit
            out += _log_facts(checker, opts, read, replay.runs[k].header if 0 <= k < len(replay.runs) else None,
                              header)
            if fits is not None:
                fits([p.site for p in ev.pending])
            read.evaluations += 1
            read.flash += ev.flash
            out += checker.absorb(ev)
        read.notes += part.notes
        read.cut = part.cut or read.cut
        dump.bytes_read += part.size
        if progress is not None:
            progress(dump, None)
        if part.error is not None:
            raise part.error
    read.runs = replay.runs
    return out, read


def _by_evaluation(dump: Dump, checker: DumpChecker, model, opts: Options, report: Report, progress, observe,
                   fits, identity=None, header: Header | None = None
                   ) -> tuple[list[SiteReport], list[SiteReport], Read]:
    """The dump read evaluation by evaluation in this process: the --model checks need each evaluation's nodes (and
    identity, a model without a reference: model/identity.py); a 2024 log's run under the facts its GGUF keys give
    (_log_facts)."""
    read = Read()
    from_dump: list[SiteReport] = []
    from_model: list[SiteReport] = []
    for ev in dump.evaluations():
        if identity is not None:
            identity(ev)
        from_dump += _log_facts(checker, opts, read, _log_header(dump, ev), header)
        if fits is not None:
            fits(ev.sites)
        read.evaluations += 1
        read.flash += len(ev.flash)
        new_dump = checker.check(ev)
        new_model = model.check(ev) if model is not None else []
        if observe is not None:
            observe.evaluation(ev, model.current[0].ref if model is not None and model.current else None)
        from_dump += new_dump
        from_model += new_model
        if progress is not None:
            progress(dump, ev)
        if opts.fail_fast and any(not sr.passed for sr in (*new_dump, *new_model)):
            report.stopped_early = True
            break
    read.notes, read.runs, read.cut = dump.notes, dump.runs, dump.cut
    return from_dump, from_model, read


def _note(note, model: bool) -> str:
    """A note of the reading as a warning that says what it cost: damage that an attention check needed is an error
    (dump/graph.py), so the damage a warning names was needed by none; with a model, its checks skip it too."""
    if not note.damage:
        return note.message
    return note.message + "; no attention check needed it" + ("; --model checks skip it" if model else "")


def _fill(report: Report, source: str, read: Read, summary, model: bool = False) -> None:
    """The report's dump-wide figures and warnings (model: the --model checks ran)."""
    report.evaluations, report.flash_nodes = read.evaluations, read.flash
    report.layers_seen = summary.layers_seen
    report.layer_kinds = summary.layer_kinds
    report.other_softmax = summary.other_softmax
    report.facts = summary.facts
    report.inferred_kq_scale, report.inferred_rows, report.hint = (summary.inferred_kq_scale, summary.inferred_rows,
                                                                   summary.hint)
    report.runs = len(read.runs) or (1 if report.evaluations else 0)
    report.tokens = [r.tokens for r in read.runs]
    report.warnings = [f"{source}:{n.line}: {_note(n, model)}" for n in read.notes] + summary.warnings
    if read.cut is not None and not report.stopped_early:
        report.warnings.append(
            f"{source}:{read.cut.line}: the output ends inside node '{read.cut.name}' "
            "(llama.cpp's logger loses its tail at exit); no check needed it"
        )
    report.warnings = [printable(w) for w in report.warnings]  # one line each, whatever the input held
