"""What a dump holds, evaluation by evaluation: each numbered layer's attention (a softmax site with its nodes, flash
attention, or a layer of another kind: recurrent, none), the SOFT_MAX nodes that are not attention, the runs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, NamedTuple

from .graph import Dump, Evaluation


class Row(NamedTuple):
    """One line of `attncheck list`: an evaluation's layer, or a SOFT_MAX that is not attention (layer None)."""

    evaluation: int
    run: int
    n_past: int | None
    T: int | None
    nodes: int  # nodes printed in the evaluation
    layer: int | None
    kind: str  # softmax | flash | recurrent (OP) | none | not attention
    names: tuple[str, ...]  # kq, kq_soft_max, kqv (softmax); FLASH_ATTN_EXT (flash); the SOFT_MAX (not attention)
    lines: tuple[int, ...]
    H: int | None = None
    H_kv: int | None = None
    D_h: int | None = None
    n_kv: int | None = None


def rows(ev: Evaluation) -> Iterator[Row]:
    """The rows of one evaluation: its layers in order, then its SOFT_MAXes that are not attention."""
    head = (ev.index, ev.run, ev.n_past, ev.T, len(ev.nodes))
    sites = {s.layer: s for s in ev.sites}
    flash = ev.flash_layers()
    for layer, kind in ev.layer_kinds().items():
        if layer in sites:
            s = sites[layer]
            nodes = [n for n in (s.kq, s.softmax, s.kqv) if n is not None]
            yield Row(*head, layer, kind, tuple(n.name for n in nodes), tuple(n.line for n in nodes),
                      s.H, s.H_kv, s.D_h, s.n_kv)
        elif layer in flash:
            f = flash[layer]
            yield Row(*head, layer, kind, (f.name,), (f.line,), f.ne[1], None, f.ne[0], None)
        else:
            yield Row(*head, layer, kind, (), ())
    for n in ev.other_softmax:
        yield Row(*head, None, "not attention", (n.name,), (n.line,))
    if not ev.sites and not ev.flash and not ev.layer_kinds():
        yield Row(*head, None, "none", (), ())


def listing(dump: Dump) -> Iterator[Row]:
    """Every evaluation's rows, reading the dump once (each evaluation's nodes dropped after its rows)."""
    for ev in dump.evaluations():
        yield from rows(ev)
        ev.nodes.clear()


@dataclass
class Listed:
    """One evaluation's rows as a part of the dump read alone numbers them (dump/pool.py's Replay renumbers index,
    run, n_past and tokens in the dump's terms; `renumbered` gives the rows those)."""

    index: int
    run: int
    n_past: int | None
    T: int | None
    rows: list[Row]
    runs_before: int
    tokens: tuple[int, ...] | None

    def placed(self, source: str) -> None:
        """Nothing to renumber beyond Replay's fields (Replay's interface, dump/pool.py)."""

    def renumbered(self) -> list[Row]:
        return [r._replace(evaluation=self.index, run=self.run, n_past=self.n_past) for r in self.rows]


def listed(ev: Evaluation, source: str, layers=None) -> Listed:
    """An evaluation's rows, for a worker reading a part of the dump (the signature of dump/pool.py's Take)."""
    return Listed(ev.index, ev.run, ev.n_past, ev.T, list(rows(ev)), ev.runs_before, ev.tokens)
