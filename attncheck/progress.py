"""A progress bar for long checks: on a terminal only, never on pipes, in CI or with --quiet."""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Iterator

SHOW_AFTER = 4 << 20  # bytes: small dumps finish before a bar would help


def wanted(quiet: bool) -> bool:
    return not quiet and sys.stderr.isatty() and not os.environ.get("CI")


@contextmanager
def evaluation_progress(path: str, enabled: bool) -> Iterator:
    """Yield a verify(progress=...) callback that shows bytes read and evaluations checked once past SHOW_AFTER."""
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

    total = os.path.getsize(path) if path != "-" and os.path.isfile(path) else None
    bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeElapsedColumn(),
                   TextColumn("{task.fields[evals]} evaluations"), transient=True, console=Console(stderr=True))
    state = {"task": None, "evals": 0}

    def update(dump, _evaluation) -> None:
        state["evals"] += 1
        if state["task"] is None:
            if dump.bytes_read < SHOW_AFTER:
                return
            bar.start()
            state["task"] = bar.add_task(f"checking {dump.source}", total=total, evals=0)
        bar.update(state["task"], completed=dump.bytes_read, evals=state["evals"])

    try:
        yield update
    finally:
        if state["task"] is not None:
            bar.stop()
