"""Where a printed node's elements sit in a canonical reference array (mapping.CANONICAL), without building the node.

A node's numpy axes (i2, i1, i0) carry labels (mapping.py); its printed elements are a grid of logical indices per
axis (dump/sample.py). `locate` turns them into canonical indices: a query axis holds positions n_past..n_past+T-1,
a row axis the last ne1 of them (GET_ROWS(out_ids)), a slot axis cache slots (those at or past n_past + T are empty
and print 0), a merged column axis head·D_h + dim. A node that copies another's values in another shape (a RESHAPE,
a CONT, a PERMUTE) is located through the transforms `via` that take its indices to those of the labelled node it
copies. The whole node is a block of the canonical array (`region`), which is all its `sum =` line needs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

Coords = tuple[np.ndarray, np.ndarray, np.ndarray]  # (i2, i1, i0) per element


@dataclass(frozen=True)
class Reshape:
    """A node of ne `own` holding, in row-major order, the elements of a node of ne `src` (RESHAPE, CONT, a whole
    VIEW): the same flat index in both."""

    own: tuple[int, ...]
    src: tuple[int, ...]

    def __call__(self, c: Coords) -> Coords:
        flat = (c[0].astype(np.int64) * self.own[1] + c[1]) * self.own[0] + c[2]
        plane = self.src[1] * self.src[0]
        return flat // plane, (flat % plane) // self.src[0], flat % self.src[0]


@dataclass(frozen=True)
class Permute:
    """A node whose numpy axis a is its source's axis src_axis[a] (PERMUTE, TRANSPOSE)."""

    src_axis: tuple[int, int, int]

    def __call__(self, c: Coords) -> Coords:
        out: list[np.ndarray] = [c[0]] * 3
        for a, s in enumerate(self.src_axis):
            out[s] = c[a]
        return out[0], out[1], out[2]


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


def coords(printed: tuple[np.ndarray, ...], via: tuple = ()) -> Coords:
    """The printed grid [p2, p1, p0] of a node as indices (i2, i1, i0), each of the grid's shape: the node's own, or
    through `via` those of the node it copies."""
    at: Coords = tuple(np.meshgrid(*[np.asarray(p, dtype=np.int64) for p in printed], indexing="ij"))  # type: ignore
    for step in via:
        at = step(at)
    return at


def locate(canon: tuple[str, ...], labels: tuple[str, str, str], ne: tuple[int, ...], n_past: int, T: int,
           printed: tuple[np.ndarray, ...], shape: tuple[int, ...], via: tuple = (),
           before: bool = False) -> Grid | None:
    """The Grid of a node whose printed indices per axis are `printed`, in a canonical array of `shape`: the node
    itself of ne (labels), or one that copies such a node through `via`. `before`: a cache as it was before this
    evaluation stored its T rows (slots from n_past on empty). None when the node does not fit (another model or
    layout)."""
    sizes = (ne[2], ne[1], ne[0])
    grid_shape = tuple(len(p) for p in printed)
    at = coords(printed, via)
    slot_as_query = "slot" in canon and "slot" not in labels and "query" in labels
    merged = "col" in labels and "col" not in canon
    rest = [c for c in canon if c not in labels and not (c == "slot" and slot_as_query)] if merged else []
    index: list[np.ndarray] = []
    region: list[slice] = []
    valid = np.ones(grid_shape, dtype=bool)
    end = n_past + (0 if before else T)
    for c, label in enumerate(canon):
        n_c = shape[c]
        if label in rest:  # (head or kvhead, dim) merged into columns, head-major
            if len(rest) != 2:
                return None
            a, b = rest
            size_b = shape[canon.index(b)]
            if shape[canon.index(a)] * size_b != sizes[labels.index("col")]:
                return None
            col = at[labels.index("col")]
            index.append(col // size_b if label == a else col % size_b)
            region.append(slice(None))
            continue
        if label == "slot" and slot_as_query:  # a store's rows: this evaluation's positions
            p = labels.index("query")
            if sizes[p] != T or n_past + T > n_c:
                return None
            vals = n_past + at[p]
            valid &= vals < end
            index.append(np.minimum(vals, max(n_c - 1, 0)))
            region.append(slice(n_past, end))
            continue
        if label not in labels:
            return None
        p = labels.index(label)
        size, vals = sizes[p], at[p]
        if label == "query":
            if size != T or n_past + T > n_c:
                return None
            index.append(n_past + vals)
            region.append(slice(n_past, n_past + T))
        elif label == "row":
            if size > T or n_past + T > n_c:
                return None
            index.append(n_past + T - size + vals)
            region.append(slice(n_past + T - size, n_past + T))
        elif label == "slot":
            if size < n_past + T or n_past + T > n_c:
                return None
            valid &= vals < end
            index.append(np.minimum(vals, max(end - 1, 0)))
            region.append(slice(0, end))
        else:
            if size != n_c:
                return None
            index.append(vals)
            region.append(slice(None))
    return Grid(tuple(np.broadcast_to(i, grid_shape) for i in index), valid, tuple(region))
