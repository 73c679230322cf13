"""The checker interface verify drives: an evaluation in, one SiteReport per evaluation × layer it checked out.

Two checkers exist: the dump-only checks (check/dumponly.py) and the --model checks (model/checker.py). verify.py
merges their SiteReports of the same evaluation × layer, so neither knows of the other.
"""
from __future__ import annotations

from typing import Any, Protocol

from .dump.graph import Evaluation
from .results import SiteReport


class Checker(Protocol):
    def check(self, ev: Evaluation) -> list[SiteReport]:
        """The SiteReports of one evaluation, in layer order; an evaluation is checked once, in dump order."""
        ...

    def finish(self, complete: bool) -> Any:
        """The end of the dump (complete: read to its end, not stopped early): what the report keeps of the run."""
        ...
