"""The nodes a head's attention reads and writes, each with its GGML ne, the GGML axis that holds heads, and its
logical per-head shape (Q_h [T, D_h], K_h and V_h [n_kv, D_h], S_h and P_h [T, n_kv], O_h [T, D_h])."""
from __future__ import annotations

from typing import NamedTuple

from ..dump.attention import Site
from ..dump.records import Node

_CHAIN_OPS = ("PERMUTE", "VIEW", "RESHAPE", "CONT", "CPY")  # ops that only re-lay out q, k or v


class NodeShape(NamedTuple):
    """One node on the way to a head's attention: GGML ne, the GGML axis holding heads, the per-head shape."""

    role: str  # q | k_view | v_view | kq | kq_scores | kq_soft_max | kqv (dump/vocabulary.py)
    name: str
    op: str
    type: str
    line: int
    ne: tuple[int, int, int, int]
    head_axis: int | None  # 0..3 (ne0..ne3): query heads, or KV heads for k and v; None if the layout is unknown
    logical: str  # "Q_h [T, D_h]"
    logical_shape: tuple[int, int]


def _head_axis_back(node: Node, src: Node, axis: int) -> int | None:
    """The head axis of `src` given that of `node` = op(src): kept by a same-ne view, swapped by permute(0,2,1,3)."""
    a, b = node.ne, src.ne
    if node.op == "PERMUTE" and axis in (1, 2) and b == (a[0], a[2], a[1], a[3]):
        return 3 - axis
    return axis if a == b else None


def _chain(node: Node | None) -> list[tuple[Node, int]]:
    """`node` (head axis ne2, as MUL_MAT reads it) and the nodes it is a re-layout of, oldest first."""
    if node is None:
        return []
    out = [(node, 2)]
    while node.op in _CHAIN_OPS and node.inputs[0] is not None:
        axis = _head_axis_back(node, node.inputs[0], out[0][1])
        if axis is None:
            break
        node = node.inputs[0]
        out.insert(0, (node, axis))
    return out


def shapes(site: Site) -> list[NodeShape]:
    """GGML ne of every node a head's attention reads or writes, beside its logical per-head shape."""
    T, n_kv, D = site.T, site.n_kv, site.D_h or 0
    out: list[NodeShape] = []

    def add(role: str, n: Node | None, axis: int | None, logical: str, shape: tuple[int, int]) -> None:
        if n is not None:
            out.append(NodeShape(role, n.name, n.op, n.type, n.line, n.ne, axis, logical, shape))

    for n, axis in _chain(site.q):
        add("q", n, axis, "Q_h [T, D_h]", (T, D))
    for n, axis in _chain(site.k):
        add("k_view", n, axis, "K_h [n_kv, D_h]", (n_kv, D))
    for n, axis in _chain(site.v):
        add("v_view", n, axis, "V_h [n_kv, D_h]", (n_kv, D))
    add("kq", site.kq, 2, "S_h [T, n_kv]", (T, n_kv))
    if site.scores is not None and site.scores is not site.kq:
        add("kq_scores", site.scores, 2, "S_h [T, n_kv]", (T, n_kv))
    add("kq_soft_max", site.softmax, 2, "P_h [T, n_kv]", (T, n_kv))
    add("kqv", site.kqv, 2, "O_h [T, D_h]", (T, D))
    return out
