"""A progress bar for long checks: on a terminal only, never on pipes, in CI or with --quiet."""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Iterator

from ..errors import markup

SHOW_AFTER = 4 << 20  # bytes: small dumps finish before a bar would help


def wanted(quiet: bool) -> bool:
    return not quiet and sys.stderr.isatty() and not os.environ.get("CI")


class EvaluationProgress:
    """verify(progress=...) callback: bytes read and evaluations checked, on stderr once past SHOW_AFTER bytes."""

    def __init__(self, total: int | None):
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

        from .common import console

        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeElapsedColumn(),
                            TextColumn("{task.fields[evals]} evaluations"), transient=True,
                            console=console(stderr=True))  # NO_COLOR and emoji codes as every report's
        self.total = total
        self.task = None  # the bar's task, once shown
        self.evaluations = 0

    def __call__(self, dump, _evaluation) -> None:
        self.evaluations += 1
        if self.task is None:
            if dump.bytes_read < SHOW_AFTER:
                return
            self.bar.start()
            self.task = self.bar.add_task(f"checking {markup(dump.source)}", total=self.total, evals=0)
        self.bar.update(self.task, completed=dump.bytes_read, evals=self.evaluations)

    def stop(self) -> None:
        if self.task is not None:
            self.bar.stop()


@contextmanager
def evaluation_progress(path: str, enabled: bool) -> Iterator[EvaluationProgress | None]:
    """The callback for one dump (None when not wanted); the bar goes away when the check ends."""
    if not enabled:
        yield None
        return
    shown = EvaluationProgress(os.path.getsize(path) if path != "-" and os.path.isfile(path) else None)
    try:
        yield shown
    finally:
        shown.stop()
