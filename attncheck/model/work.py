"""What `--model` keeps of a run's evaluations until its reference is computed: per evaluation its place, its mapped
layers and, per mapped node, the printed sample and what the graph said of it — light copies without the printed text
or the graph, so that a long run held whole costs its printed numbers only (the reference then comes one layer at a
time: runs.py parts)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ..dump.records import Node
from ..dump.sample import Sample, every_line_printed
from .mapping import Layer, Mapped

LOST = "its header line was damaged (interleaved output?): its values were not read"


def light(node: Node) -> Node:
    """The node without its graph links, and without its printed text when every line of it is printed (row_line
    then counts lines from the shape alone)."""
    body = node.body
    clean = not body or every_line_printed(body)
    return Node(node.name, node.type, node.op, node.srcs, node.ne, node.line, b"" if clean else body, node.body_line,
                node.cut)


def light_layer(L: Layer) -> Layer:
    return replace(L, anchor=light(L.anchor), mapped=[])


@dataclass(frozen=True)
class Item:
    """A mapped node to compare: the node (light), its printed sample, its place after a weight MUL_MAT."""

    m: Mapped
    sample: Sample
    position: int | None
    line: int


def item(m: Mapped, s: Sample, position: int | None) -> Item:
    node = light(m.node)
    return Item(replace(m, node=node), Sample(node, np.ascontiguousarray(s.values), s.index, s.sums), position,
                m.node.line)


@dataclass
class Evaluation:
    """One evaluation's place, layers and work; `nodes` and `why` count its printed nodes (Summary.count)."""

    index: int
    run: int
    n_past: int
    layers: list[Layer]
    work: list[list[Item]]  # per layer
    nodes: list[tuple[int, str, str, bool, bool, str]]  # (line, name, op, quantized, cut, role) of every node
    why: dict[int, str]  # line → why it was not compared ("" once it was)
    lost: list[int] = field(default_factory=list)  # lines of damaged headers (dump/graph.py Evaluation.lost)


@dataclass
class Work:
    evaluations: list[Evaluation] = field(default_factory=list)

    def add(self, ev, roles, why: dict[int, str], layers: list[tuple[Layer, list[Item]]]) -> None:
        nodes = []
        by_line: dict[int, str] = {}
        for n in ev.nodes:
            role = roles.of.get(id(n))
            nodes.append((n.line, n.name, n.op, n.quantized, n.cut, role.name if role is not None else ""))
            if id(n) in why:
                by_line[n.line] = why[id(n)]
        named = {line: name for name, line in ev.damaged_names.items()}
        for line in ev.lost:  # printed, but its header was damaged: not in the graph, counted all the same
            nodes.append((line, named.get(line, "?"), "?", False, False, ""))
            by_line[line] = LOST
        self.evaluations.append(Evaluation(ev.index, ev.run, ev.n_past or 0, [L for L, _ in layers],
                                           [items for _, items in layers], nodes, by_line, list(ev.lost)))

    def items(self):
        """(evaluation, layer, item) of every node kept, in dump order."""
        for ev in self.evaluations:
            for L, items in zip(ev.layers, ev.work):
                for it in items:
                    yield ev, L, it

    def clear(self) -> None:
        self.evaluations = []
