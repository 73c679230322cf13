"""Two dumps compared node by node (compare.py), each checked as `check` does (sides.py).

The package is callable (commands.py): `attncheck.diff(old, new, ...)` is `attncheck diff` for Python.
"""
from __future__ import annotations

from ..commands import callable_module


def diff(old: str, new: str, *, exact: bool = False, prefix: bool = False, model: str | None = None,
         atol: float | None = None, rtol: float | None = None, nmse: bool = False, jobs: int | None = None):
    """`attncheck diff OLD NEW` for Python: compare two dumps (paths) of one model and prompt node by node and check
    each; the compare.DiffReport its JSON is made from (`.to_dict()`; `.exit_code` 0 drift of correct builds, 1 a
    regression, 2 an unusable pair, as `.error` says). exact: print precision (two runs of one build); atol/rtol
    or nmse in place of the drift model; model: each side checked against the GGUF's reference too; prefix: NEW's
    prompt extends OLD's."""
    from ..dump.pool import jobs_default
    from .compare import diff as compare
    from .drift import weight_types_of

    return compare(old, new, prefix=prefix, tolerance=tolerance(exact, atol, rtol, nmse),
                   weight_types=weight_types_of(model) if model else None, jobs=jobs or jobs_default(), model=model)


def tolerance(exact: bool = False, atol: float | None = None, rtol: float | None = None, nmse: bool = False):
    """The tolerance the options ask for: --atol/--rtol, --nmse, --exact's print precision, else the drift of
    correct builds; ValueError for --nmse with either of the others."""
    from .compare import ATOL, EXACT, RTOL, DiffTolerance

    if nmse and (atol is not None or rtol is not None):
        raise ValueError("--nmse replaces --atol/--rtol: give one or the other")
    if nmse and exact:
        raise ValueError("--nmse replaces --exact: give one or the other")
    if atol is not None or rtol is not None:
        return DiffTolerance(ATOL if atol is None else atol, RTOL if rtol is None else rtol, False, "--atol/--rtol",
                             False)
    if nmse:
        return DiffTolerance(nmse=True, origin="nmse", drift=False)
    return EXACT if exact else DiffTolerance()


callable_module(__name__, diff)
