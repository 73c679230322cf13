"""A dump's parts (dump/parts.py) gathered in worker processes, or in this one with -j 1, and handed back in dump
order with their absolute evaluation indices, runs and n_past, so that nothing the checks see depends on -j.

A part read alone numbers its evaluations, runs and n_past from its own start; `Replay` turns those into the
dump's: an evaluation before any run start of its part continues the run the previous part ended in (n_past carried
on), unless that part ended in a new run's start-up log.
"""
from __future__ import annotations

import gc
import io
import multiprocessing
import os
import signal
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from . import repeats
from .graph import Dump, Evaluation
from .parts import Part, parts, regular_size
from .records import NodeRef, Note, RunStart
from ..errors import DumpError


@dataclass
class PartResult:
    """What a worker gives back of one part: its evaluations gathered, the records around them, the first error."""

    evals: list  # what `take` kept of each evaluation: check/gather.py's EvalData, or `list`'s Listed
    runs: list[RunStart]
    notes: list[Note]
    cut: NodeRef | None  # the node the dump ended inside (last part only)
    error: DumpError | None
    size: int  # bytes


Take = Callable[[Evaluation, str, "frozenset[int] | None"], Any]  # what a worker keeps of each evaluation
# bytes: a regular file smaller is read in this process whatever -j says. On 2 cores two workers read the 35 MB
# benchmark dump no faster than one process (docs/benchmarks.md): the parent, which checks, shares the cores with
# them, and each part's results are sent back; less input pays even less for that
SERIAL = 64 << 20


def gather_part(part: Part, source: str, layers: frozenset[int] | None, take: Take) -> PartResult:
    """Read one part as a dump of its own and take each evaluation (runs in a worker process): check/gather.py's
    EvalData for the checks; `list` takes its rows (dump/listing.py's Listed). Either has Replay's interface: index,
    run, n_past, T, runs_before, tokens, and `placed` (Listed). A part whose every evaluation repeats one read before
    is made from those (dump/repeats.py); else it is read node by node, and what it repeats is learned."""
    # spans: when read node by node, what the part's evaluations may be learned from; runs: those its log text starts
    made, spans, runs = repeats.made(part, source)
    # a made part is not read again: its Dump reads nothing, and keeps no notes or cut
    d = Dump(part.reader() if made is None else io.BytesIO(), source, part.first_line, part.final)
    out: list = []
    error = None
    learned: list = []
    try:
        for ev in made if made is not None else d.evaluations():
            if spans is not None and not d.notes and d.runs == runs[:len(d.runs)] and len(learned) < len(spans):
                learned.append(repeats.template(spans[len(learned)], ev))
            out.append(take(ev, source, layers))
            repeats.release(ev)
    except DumpError as e:
        error = e
    if spans is not None and error is None and not (d.notes or d.cut) and d.runs == runs and len(learned) == len(spans):
        repeats.keep(spans, learned)  # a part with nothing odd in it but the runs its log text starts
    return PartResult(out, runs if made is not None else d.runs, d.notes, d.cut.ref if d.cut is not None else None,
                      error, part.size)


def jobs_default() -> int:
    """Every core this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def fork_context():
    """Workers forked where the platform can (they start at once and share the parent's pages), else its default."""
    return multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() else None


def _worker_signals() -> None:
    """A worker leaves Ctrl-C to the parent (a terminal sends SIGINT to the whole process group; the parent ends
    its workers and says it was interrupted, cli/interrupt.py) and dies quietly of SIGTERM."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def worker_pool(jobs: int) -> ProcessPoolExecutor:
    """The pool of `jobs` worker processes that `check`, `list` and `diff -j` read and diff in. What the parent holds
    is collected, then frozen for the cyclic garbage collector until end_pool (gc.freeze): a forked worker's
    collections would otherwise write to every object's header and copy the pages it shares with the parent (313 MB
    checked with -j 2: the tree's peak 152 MB before, 136-137 MB after)."""
    gc.collect()
    gc.freeze()
    return ProcessPoolExecutor(max_workers=jobs, mp_context=fork_context(), initializer=_worker_signals)


def end_pool(pool: ProcessPoolExecutor, interrupted: bool = False) -> None:
    """Shut a worker pool down. An interrupted one is not waited for: its workers were ended (cli/interrupt.py),
    and joining a pool whose workers died in the middle of a message can wait for ever. What worker_pool froze is
    the collector's again (and so is what the console script froze at its start, cli.collect_rarely: the collector
    has one frozen set)."""
    pool.shutdown(wait=not interrupted, cancel_futures=True)
    gc.unfreeze()


class _Counted:
    """A stream that tells `on_read` of each block read (progress through a stream read in this process)."""

    def __init__(self, stream, on_read: Callable[[bytes], None]):
        self.stream, self.on_read = stream, on_read

    def read(self, n: int = -1) -> bytes:
        data = self.stream.read(n)
        self.on_read(data)
        return data


def gathered(stream, source: str, layers: frozenset[int] | None, jobs: int, take: Take,
             on_read: Callable[[bytes], None] | None = None) -> Iterator[PartResult]:
    """The parts' results in dump order: in this process (jobs 1, a file of less than SERIAL bytes, or a dump of one
    part, which no worker could share) or a pool of `jobs` workers, a few parts ahead, after the first part is read
    here (else each worker would read the first evaluation it gets node by node, to learn what the first part
    teaches). on_read: told of each block of a stream that could not be cut in parts (read here, as it comes)."""
    size = regular_size(stream) if jobs > 1 else None
    if size is not None and size < SERIAL:
        jobs = 1
    todo = parts(stream)
    if jobs > 1:
        first = next(todo, None)
        if first is None or first.final:
            jobs = 1
            todo = iter([first] if first is not None else [])
        else:  # read here: the workers, forked after, start with the templates it taught (dump/repeats.py)
            yield gather_part(first, source, layers, take)
    if jobs <= 1:
        for part in todo:
            if part.stream is not None and on_read is not None:
                part = part._replace(stream=_Counted(part.stream, on_read))
            yield gather_part(part, source, layers, take)
        return
    pool = worker_pool(jobs)
    try:
        ahead: list[Future] = []
        for part in todo:
            if part.stream is not None:  # a stream that could not be cut: read here, after the parts before it
                for f in ahead:
                    yield f.result()
                ahead = []
                if on_read is not None:
                    part = part._replace(stream=_Counted(part.stream, on_read))
                yield gather_part(part, source, layers, take)
                continue
            ahead.append(pool.submit(gather_part, part, source, layers, take))
            while len(ahead) > 2 * jobs:
                yield ahead.pop(0).result()
        for f in ahead:
            yield f.result()
    except BaseException as e:
        end_pool(pool, interrupted=not isinstance(e, (Exception, GeneratorExit)))
        raise
    end_pool(pool)


class Replay:
    """Turns part-relative evaluations into the dump's, in order (see the module doc)."""

    def __init__(self, source: str):
        self.source = source
        self.evaluations = 0
        self.runs: list[RunStart] = []
        self.run = -1
        self.implicit = 0  # 1 when the dump's first evaluation came before any run start (a run of its own)
        self.carry: int | None = 0  # n_past of the next evaluation of the current run
        self.tokens: tuple[int, ...] | None = None
        self.new_run = False  # the previous part ended in a run's start-up log

    def take(self, part: PartResult) -> list:
        base = len(self.runs)
        start = 0 if self.new_run else self.carry  # n_past where the part's leading evaluations count from
        for ev in part.evals:
            if ev.runs_before == 0:  # before any run start in this part: the part's leading evaluations
                if self.new_run:  # the run whose start-up log ended the previous part
                    run, tokens = self.implicit + len(self.runs) - 1, self.runs[-1].tokens
                else:  # the run the previous part ended in
                    if self.run < 0:
                        self.run, self.implicit = 0, 1
                    run, tokens = self.run, self.tokens
                n_past = None if ev.n_past is None or start is None else start + ev.n_past
            else:  # after a run start in this part: numbered as read
                run, tokens, n_past = self.implicit + base + ev.runs_before - 1, ev.tokens, ev.n_past
            self._rebase(ev, run, n_past, tokens)
            self.run, self.tokens = run, tokens
            self.carry = None if n_past is None or ev.T is None else n_past + ev.T
        self.new_run = False
        last = part.evals[-1].runs_before if part.evals else 0
        self.runs += part.runs
        if len(part.runs) > last:  # a run starts after the part's last evaluation
            self.new_run, self.carry = True, 0
        return part.evals

    def _rebase(self, ev, run: int, n_past: int | None, tokens) -> None:
        ev.index, ev.run, ev.n_past, ev.tokens = self.evaluations, run, n_past, tokens
        self.evaluations += 1
        ev.placed(self.source)
