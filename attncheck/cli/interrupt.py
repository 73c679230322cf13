"""Ctrl-C and SIGTERM in every command: one line, exit 128 + the signal (130, 143), never a traceback. Worker
processes are ended at once (they ignore SIGINT themselves: dump/pool.py), not after their current task."""
from __future__ import annotations

import multiprocessing
import signal


class Interrupted(BaseException):
    """A signal ended the command (a BaseException: no `except Exception` of a command takes it for a bug)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


def _on_signal(signum, _frame) -> None:
    for worker in multiprocessing.active_children():  # the pools' workers; `run` ends llama.cpp itself (cli/llama.py)
        worker.terminate()
    raise Interrupted(signum)


def catch_signals() -> None:
    """From now on SIGINT and SIGTERM raise Interrupted in this process."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _on_signal)


def ignore_signals() -> None:
    """A second Ctrl-C while the first is being reported is not another traceback."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
