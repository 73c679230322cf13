"""The checker interface verify drives: evaluations in, one SiteReport per evaluation × layer it checked out.

Two checkers exist: the dump-only checks (check/dumponly.py) and the --model checks (model/checker.py). verify.py
merges their SiteReports of the same evaluation × layer, so neither knows of the other.
"""
from __future__ import annotations

from typing import Any, Protocol

from .dump.graph import Evaluation
from .results import SiteReport


class Checker(Protocol):
    def check(self, ev: Evaluation) -> list[SiteReport]:
        """SiteReports, in dump order: of this evaluation, or of earlier ones a checker held back until their run's
        facts were pinned (the dump-only checks pin them on a whole run)."""
        ...

    def finish(self, complete: bool) -> tuple[list[SiteReport], Any]:
        """The end of the dump (complete: read to its end, not stopped early): the SiteReports still held back, and
        what the report keeps of the checker's work."""
        ...
