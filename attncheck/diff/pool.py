"""Evaluation pairs diffed in worker processes (diff -j), their results taken into the report in dump order.

The parent reads both dumps and decides, pair by pair and in order, what only it can: whether the two evaluations
line up (same model, prompt, n_past), the drift model from the first pair. What it hands a worker is a pure
function of the pair and those settings (pair.py's diff_evaluation), so nothing in the report depends on -j.
"""
from __future__ import annotations

import pickle
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor

from ..dump.pool import end_pool, worker_pool
from ..dump.graph import Evaluation
from .pair import diff_evaluation
from .report import DiffReport
from .nodes import NodeDiff, Unmatched


def _diff_pair(pair: bytes, settings: tuple) -> tuple[list[NodeDiff], list[Unmatched]]:
    """A pair of evaluations (pickled) diffed under the report's settings, in a worker process."""
    src_a, src_b, prefix, tolerance, model = settings
    ea, eb = pickle.loads(pair)
    scratch = DiffReport(src_a, src_b, prefix, tolerance, model=model)
    diff_evaluation(scratch, ea, eb, src_a, src_b)
    return scratch.nodes, scratch.only


class Pairs:
    """Diffs evaluation pairs into a report: in this process (jobs 1), or a few pairs ahead in a pool of `jobs`
    workers; either way the report's nodes and unmatched nodes come in dump order."""

    def __init__(self, rep: DiffReport, jobs: int):
        self.rep, self.jobs = rep, jobs
        self.queue: deque[Future | tuple[list, list]] = deque()
        self.pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> "Pairs":
        if self.jobs > 1:
            self.pool = worker_pool(self.jobs)
            self.pool.submit(int).result()  # fork the workers now, while this process holds no dump: less to copy
        return self

    def __exit__(self, kind, error, tb) -> None:
        try:
            if kind is None or issubclass(kind, Exception):  # not on Ctrl-C: stop at once
                self._drain(0)  # a worker's error comes before whatever stopped the reading after its pair
        finally:
            if self.pool is not None:
                end_pool(self.pool, interrupted=kind is not None and not issubclass(kind, Exception))

    def diff(self, ea: Evaluation, eb: Evaluation) -> None:
        rep = self.rep
        if self.pool is None:
            diff_evaluation(rep, ea, eb, rep.old, rep.new)
            return
        pair = pickle.dumps((ea, eb), pickle.HIGHEST_PROTOCOL)  # now: the caller drops the nodes after this call
        settings = (rep.old, rep.new, rep.prefix, rep.tolerance, rep.model)
        self.queue.append(self.pool.submit(_diff_pair, pair, settings))
        self._drain(self.jobs)  # a pair queued per worker beyond those diffing: few pickled pairs held at once

    def only(self, unmatched: list[Unmatched]) -> None:
        """Nodes of an evaluation one dump has and the other not, in their place among the pairs' results."""
        if self.pool is None:
            self.rep.only += unmatched
        else:
            self.queue.append(([], unmatched))

    def _drain(self, keep: int) -> None:
        while len(self.queue) > keep:
            item = self.queue.popleft()
            nodes, only = item.result() if isinstance(item, Future) else item
            self.rep.nodes += nodes
            self.rep.only += only
