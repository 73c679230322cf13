"""Resolving the sources a header names to the nodes printed before it.

docs/format.md §2: a source named in a header is the most recent node of that name printed before it. llama.cpp reuses
names, though: with a quantized KV cache the rotated q, k and v are each ` (reshaped)`, and a view of one is printed
after all three. The header also gives the source's ne, which tells q from k and v; and a view prints the very
values of its source, which tells k from v when their ne are equal too.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..errors import DumpError
from .records import Node
from .sample import parse_sample

COPIES = {"VIEW", "RESHAPE"}  # ops whose values are their source's, element for element in memory order


def _printed(node: Node) -> dict[int, float] | None:
    """The printed values of a node by their flat (memory-order) index; None when it cannot be read."""
    if node.quantized or node.cut:
        return None
    try:
        s = parse_sample(node, "")
    except DumpError:
        return None
    ne = node.ne
    i3, i2, i1, i0 = np.ix_(*s.index)
    flat = ((i3 * ne[2] + i2) * ne[1] + i1) * ne[0] + i0
    return dict(zip(flat.ravel().tolist(), s.values.ravel().tolist()))


def _repeats(view: dict[int, float], source: dict[int, float] | None) -> bool:
    """A view (offset 0) of the source prints the source's values at the elements both printed."""
    if source is None:
        return False
    common = view.keys() & source.keys()
    return bool(common) and all(view[k] == source[k] for k in common)


class Names:
    """The nodes of one evaluation printed so far, by name and by (name, ne)."""

    def __init__(self) -> None:
        self.by_name: dict[str, Node] = {}
        self.by_key: dict[tuple, list[Node]] = defaultdict(list)
        self.lost: set[str] = set()  # names whose latest header was damaged

    def add(self, node: Node) -> None:
        self.lost.discard(node.name)
        self.by_name[node.name] = node
        self.by_key[(node.name, node.ne)].append(node)

    def lose(self, name: str) -> None:
        """A node of this name was printed but its header was damaged: until another of the name is printed, a
        source of that name is the lost node (resolved to None), never an earlier node that shares its name
        (llama.cpp names a RESHAPE and the ROPE after it both Qcur-0)."""
        self.lost.add(name)
        self.by_name.pop(name, None)
        for key in [k for k in self.by_key if k[0] == name]:
            del self.by_key[key]

    def source(self, node: Node, i: int) -> Node | None:
        """The node node.srcs[i] names: the latest of that name and ne (else of that name); among several of the same
        name and ne, the one whose printed values a copy repeats."""
        src = node.srcs[i]
        if src is None:
            return None
        found = self.by_key.get((src.name, src.ne))
        if not found:
            return self.by_name.get(src.name)
        if len(found) > 1 and i == 0 and node.op in COPIES:
            return told_apart(node, found)
        return found[-1]


def told_apart(node: Node, found: list[Node]) -> Node:
    """The one of several nodes of the name and ne a copy's source names whose printed values the copy repeats;
    the latest when not exactly one does."""
    mine = _printed(node)
    same = [c for c in found if mine is not None and _repeats(mine, _printed(c))]
    return same[0] if len(same) == 1 else found[-1]
