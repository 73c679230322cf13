"""Where a printed node's elements sit in a canonical reference array (mapping.CANONICAL), without building the node.

A node's numpy axes (i2, i1, i0) carry labels (mapping.py); its printed elements are a grid of logical indices per
axis (dump/sample.py). `locate` turns them into canonical indices: a query axis holds positions n_past..n_past+T-1,
a row axis the last ne1 of them (GET_ROWS(out_ids)), a slot axis cache slots (those at or past n_past + T are empty
and print 0), a merged column axis head·D_h + dim. The whole node is a block of the canonical array (`region`), which
is all its `sum =` line needs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Grid:
    """The printed grid [p2, p1, p0] of a node in canonical coordinates, and the block the whole node holds."""

    index: tuple[np.ndarray, ...]  # one integer array per canonical axis, each of the grid's shape
    valid: np.ndarray  # [p2, p1, p0] bool: False in empty cache slots (the node prints 0 there)
    region: tuple[slice, ...]  # the canonical block of the whole node (empty slots left out)

    def take(self, a: np.ndarray) -> np.ndarray:
        """a's values at the printed elements, float64 [p2, p1, p0]; 0 in empty slots."""
        return np.where(self.valid, np.asarray(a)[self.index], 0.0).astype(np.float64)

    def block(self, a: np.ndarray) -> np.ndarray:
        """a's values over the whole node (a view, canonical order)."""
        return np.asarray(a)[self.region]


def _along(p: int, values: np.ndarray) -> np.ndarray:
    shape = [1, 1, 1]
    shape[p] = -1
    return np.asarray(values).reshape(shape)


def locate(canon: tuple[str, ...], labels: tuple[str, str, str], ne: tuple[int, ...], n_past: int, T: int,
           printed: tuple[np.ndarray, ...], shape: tuple[int, ...]) -> Grid | None:
    """The Grid of a node of ne (labels) whose printed indices per axis are `printed`, in a canonical array of
    `shape`; None when the node does not fit it (another model or layout)."""
    sizes = (ne[2], ne[1], ne[0])
    grid_shape = tuple(len(p) for p in printed)
    merged = labels[2] == "col" and "col" not in canon
    rest = [c for c in canon if c != labels[1]] if merged else []
    index: list[np.ndarray] = []
    region: list[slice] = []
    valid = np.ones(grid_shape, dtype=bool)
    end = n_past + T
    for c, label in enumerate(canon):
        n_c = shape[c]
        if label in rest:  # (head or kvhead, dim) merged into columns, head-major
            a, b = rest
            size_b = shape[canon.index(b)]
            if shape[canon.index(a)] * size_b != sizes[2]:
                return None
            col = _along(2, printed[2])
            index.append(col // size_b if label == a else col % size_b)
            region.append(slice(None))
            continue
        if label not in labels:
            return None
        p = labels.index(label)
        size, vals = sizes[p], np.asarray(printed[p])
        if label == "query":
            if size != T or end > n_c:
                return None
            index.append(_along(p, n_past + vals))
            region.append(slice(n_past, end))
        elif label == "row":
            if size > T or end > n_c:
                return None
            index.append(_along(p, end - size + vals))
            region.append(slice(end - size, end))
        elif label == "slot":
            if size < end or end > n_c:
                return None
            valid &= np.broadcast_to(_along(p, vals < end), grid_shape)
            index.append(_along(p, np.minimum(vals, end - 1)))
            region.append(slice(0, end))
        else:
            if size != n_c:
                return None
            index.append(_along(p, vals))
            region.append(slice(None))
    return Grid(tuple(np.broadcast_to(i, grid_shape) for i in index), valid, tuple(region))
