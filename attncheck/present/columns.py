"""Tables that fit the terminal: columns are dropped, least needed first, until what is left fits whole.

Rich squeezes a table that is too wide by cutting every cell (`15.57…`) and then dropping the last columns, which is
where verdicts sit. Here a column says how much it is needed (`keep`: the higher, the later it goes) and whether its
cells may wrap between words; numbers and verdicts never wrap, so what is shown is shown whole.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text


class Col(NamedTuple):
    header: str
    justify: str = "right"
    keep: int = 1  # columns with the lowest keep are dropped first; 9: never dropped
    wrap: bool = False  # cells may wrap between words (text, names); numbers and verdicts do not
    min_width: int = 0  # a wrapping column: the narrowest it may get
    fold: bool = False  # a wrapping column whose long words (node names) may be cut across lines, down to min_width


NEVER = 9


def extent(values: Sequence[int]) -> str:
    """`lo..hi` of some integers, or the one value: how a table cell writes a span of queries, evaluations, lines."""
    lo, hi = min(values), max(values)
    return str(lo) if lo == hi else f"{lo}..{hi}"


def _len(cell) -> int:
    text = cell if isinstance(cell, Text) else Text.from_markup(str(cell))
    return max((t.cell_len for t in text.split("\n")), default=0)


def _word(cell) -> int:
    text = cell.plain if isinstance(cell, Text) else Text.from_markup(str(cell)).plain
    return max((len(w) for w in text.split()), default=0)


def needed(col: Col, cells: Sequence) -> int:
    """The narrowest a column can be with its cells whole: its widest cell, or its longest word when it wraps."""
    head = _word(col.header) if col.wrap else _len(col.header)
    if col.wrap and col.fold:  # its long words cut down to min_width; shorter ones whole
        return max([head, min(col.min_width, max((_word(c) for c in cells), default=0))])
    if col.wrap:
        return max([head, col.min_width, *(_word(c) for c in cells)])
    return max([head, *(_len(c) for c in cells)])


def _table(cols: Sequence[Col], **kw) -> Table:
    kw = {"box": box.SIMPLE_HEAD, "pad_edge": False, "header_style": "bold", **kw}
    t = Table(**kw)
    for c in cols:
        t.add_column(c.header, justify=c.justify, no_wrap=not c.wrap, overflow="fold")
    return t


def _overhead(cols: Sequence[Col], kw: dict) -> int:
    """What borders and padding add to the columns' widths."""
    probe = _table([Col("x", c.justify) for c in cols], **kw)
    probe.add_row(*["x"] * len(cols))
    return Console(width=10_000).measure(probe).maximum - len(cols)


TIGHT = (0, 1, 0, 0)  # padding on the right only: two spaces between columns instead of three


def _width(cols: Sequence[Col], need: list[int], keep: list[int], kw: dict) -> int:
    return sum(need[i] for i in keep) + _overhead([cols[i] for i in keep], kw)


def fit(cols: Sequence[Col], rows: Sequence[Sequence], width: int | None, **kw) -> Table:
    """A table of the columns that fit `width` (all of them when width is None), rows cut to match: first with
    tighter padding, then without the least needed columns, one at a time; wrapping columns give up their room
    first, widest first, so that numbers keep theirs."""
    keep = list(range(len(cols)))
    widths: dict[int, int] = {}
    if width is not None:
        need = [needed(c, [r[i] for r in rows]) for i, c in enumerate(cols)]
        full = [max([_len(c.header), *(_len(r[i]) for r in rows)]) for i, c in enumerate(cols)]
        if _width(cols, full, keep, kw) > width:  # rather than wrap a cell or drop a column
            kw = {**kw, "padding": TIGHT}
        while len(keep) > 1 and _width(cols, need, keep, kw) > width:
            drop = min((i for i in keep if cols[i].keep < NEVER), key=lambda i: (cols[i].keep, -i), default=None)
            if drop is None:
                break
            keep.remove(drop)
        natural = {i: full[i] for i in keep}
        excess = sum(natural.values()) + _overhead([cols[i] for i in keep], kw) - width
        if excess > 0:
            widths = dict(natural)
            while excess > 0:
                spare = [i for i in keep if cols[i].wrap and widths[i] > need[i]]
                if not spare:
                    break
                i = max(spare, key=lambda i: widths[i] - need[i])
                widths[i] -= 1
                excess -= 1
    t = _table([cols[i] for i in keep], **kw)
    for k, i in enumerate(keep):
        if i in widths:
            t.columns[k].width = widths[i]
    for r in rows:
        t.add_row(*[r[i] for i in keep])
    return t


def fits(cols: Sequence[Col], rows: Sequence[Sequence], width: int | None, **kw) -> bool:
    """Every column fits whole in `width` (with tighter padding if need be)."""
    if width is None:
        return True
    need = [needed(c, [r[i] for r in rows]) for i, c in enumerate(cols)]
    return _width(cols, need, list(range(len(cols))), {**kw, "padding": TIGHT}) <= width


def dropped(table: Table, cols: Sequence[Col]) -> list[str]:
    """The headers of the columns fit() left out."""
    shown = {c.header for c in table.columns}
    return [c.header for c in cols if c.header not in shown]
