"""Two printed samples of one role → the elements printed in both, at the same logical place.

A printed element is compared only with the element at the same logical index: slot 29 of a 32-slot view is not
slot 253 of a 256-slot view, though both are "the third from the end". Coordinates are logical indices (Sample.index)
in GGML order (i0, i1, i2, i3); a reshape is matched by its logical flat index; a cache write by (elem, slot), which
is what a 2024 CPY into a view of T rows and a SET_ROWS into the whole cache have in common.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..dump.records import Node, ne_text
from ..dump.roles import STORES, Role, Roles
from ..dump.sample import Sample

# axis names, GGML order (i0, i1, i2, i3), of the roles whose layout llama.cpp fixes
_AXES = {
    "kq": ("slot", "query", "head"), "kq_scores": ("slot", "query", "head"), "kq_soft_max": ("slot", "query", "head"),
    "kqv": ("dim", "query", "head"), "q": ("dim", "query", "head"), "flash_attn": ("dim", "head", "query"),
    "k_view": ("dim", "slot", "kv_head"), "Qcur": ("dim", "head", "token"),
    "Kcur": ("dim", "kv_head", "token"), "Vcur": ("dim", "kv_head", "token"), "result_output": ("vocab", "token"),
}
_ROWS = ("inp_embd", "attn_norm", "kqv_out", "attn_out", "ffn_inp", "ffn_norm", "ffn_out", "l_out", "result_norm")
_GENERIC = ("i0", "i1", "i2", "i3")


@dataclass(frozen=True)
class Geometry:
    """One side of one layer: queries T at positions n_past.., n_kv view slots, and the K/V row widths."""

    T: int | None
    n_past: int
    n_kv: int | None
    n_embd_k: int | None  # D_h · H_kv: one K cache row
    n_embd_v: int | None
    v_slot_axis: int  # 0: V view {n_kv, D_h, H_kv} (kqv reads it transposed); 1: {D_h, n_kv, H_kv} (flash attention)
    k_lengths: tuple[int, int, int] | None = None  # (n_kv, D_h, H_kv) of the K cache view
    v_lengths: tuple[int, int, int] | None = None  # (n_kv, D_h, H_kv) of the V cache view


def geometry(roles: Roles, layer: int | None, T: int | None, n_past: int | None) -> Geometry:
    r = roles.layers[layer] if layer is not None and layer < len(roles.layers) else {}
    k, v = r.get("k_view"), r.get("v_view")
    n_kv = r["kq_soft_max"].ne[0] if "kq_soft_max" in r else k.ne[1] if k is not None else None
    v_axis = 0 if "kqv" in r else 1
    n_embd_v = None
    if v is not None:
        n_embd_v = v.ne[1 - v_axis] * v.ne[2]
    n_embd_k = k.ne[0] * k.ne[2] if k is not None else None
    k_len = (k.ne[1], k.ne[0], k.ne[2]) if k is not None else None
    v_len = (v.ne[v_axis], v.ne[1 - v_axis], v.ne[2]) if v is not None else None
    return Geometry(T, n_past or 0, n_kv, n_embd_k, n_embd_v or n_embd_k, v_axis, k_len, v_len)


_KV = ("slot", "dim", "kv_head")


def kv_axes(ne: tuple[int, ...], lengths: tuple[int, int, int] | None) -> tuple[str, ...] | None:
    """The logical axis (slot, dim, kv_head) of each axis of a view of the K or V cache, told apart by length;
    '' for axes of length 1; None when lengths do not tell them apart (two equal lengths) or do not fit."""
    if lengths is None:
        return None
    named = {n: a for n, a in zip(lengths, _KV) if n > 1}
    if len(named) != len([n for n in lengths if n > 1]):
        return None
    out = tuple(named.get(n) if n > 1 else "" for n in ne)
    if None in out or len(set(a for a in out if a)) != len(named):
        return None
    return out


def _kv_permutation(a: Node, b: Node, ga: Geometry, gb: Geometry, base: str) -> tuple[list[int], tuple] | str:
    """Two views of the same cache in different orders (the V cache transposed or not, flash attention or not):
    for each axis of OLD, the axis of NEW that holds the same logical index; or why they cannot be lined up."""
    la, lb = (ga.k_lengths, gb.k_lengths) if base == "k_view" else (ga.v_lengths, gb.v_lengths)
    xa, xb = kv_axes(a.ne, la), kv_axes(b.ne, lb)
    if xa is None or xb is None:
        return (f"layouts differ: ne {ne_text(a.ne)} vs {ne_text(b.ne)} hold the cache in different orders, and the "
                "lengths of slot, dim and KV head do not tell its axes apart: not comparable")
    ones = [j for j in range(4) if not xb[j]]
    return [xb.index(x) if x else ones.pop(0) for x in xa], xa


@dataclass(frozen=True)
class Aligned:
    """The elements printed in both: keys [N, 4] (coordinates), old [N] and new [N] values, axis names."""

    how: str  # index | flat | store
    keys: np.ndarray
    old: np.ndarray
    new: np.ndarray
    axes: tuple[str, ...]

    def where(self, i: int) -> dict[str, int]:
        """The logical place of element i, by axis name (axes of length 1 left out)."""
        return {a: int(self.keys[i, j]) for j, a in enumerate(self.axes) if a}


def axes_of(role: Role, node: Node, g: Geometry) -> tuple[str, ...]:
    if role.name == "v_view":
        return ("slot", "dim", "kv_head") if g.v_slot_axis == 0 else ("dim", "slot", "kv_head")
    if role.name in ("Kcur", "Vcur", "Qcur") and (node.ne[2] != g.T or node.ne[3] != 1):
        return ("elem", "token")
    if role.name in _ROWS or (role.name not in _AXES and node.ne[1] == g.T and node.ne[2] == node.ne[3] == 1):
        return ("elem", "token")  # one row per token
    return _AXES.get(role.name, _GENERIC)


def _index_points(s: Sample) -> tuple[np.ndarray, np.ndarray, bool]:
    """keys [N, 4] = (i0, i1, i2, i3) of every printed element, values [N], and whether no two elements share a
    logical index (true of every sample llama.cpp prints); the keys are shared (read-only) by every sample printed
    with the same indices, so two samples of one ne get the same array object."""
    keys, unique = _index_keys(tuple((ix.dtype.str, ix.tobytes()) for ix in s.index))
    return keys, s.values.ravel(), unique


@lru_cache(maxsize=1024)
def _index_keys(index: tuple[tuple[str, bytes], ...]) -> tuple[np.ndarray, bool]:
    """The keys of one set of printed indices, built once (a meshgrid per node was a fifth of diff's time), and
    whether every row differs from the others: then keys matched against themselves are all in common, in order."""
    i3, i2, i1, i0 = np.meshgrid(*(np.frombuffer(b, dtype=t) for t, b in index), indexing="ij")
    keys = np.stack([i0.ravel(), i1.ravel(), i2.ravel(), i3.ravel()], axis=1).astype(np.int64)
    keys.flags.writeable = False
    return keys, all(len(np.unique(np.frombuffer(b, dtype=t))) == len(b) // np.dtype(t).itemsize for t, b in index)


def _flat(keys: np.ndarray, ne: tuple[int, ...]) -> np.ndarray:
    n0, n1, n2, _ = ne
    f = keys[:, 0] + n0 * (keys[:, 1] + n1 * (keys[:, 2] + n2 * keys[:, 3]))
    return np.stack([f, np.zeros_like(f), np.zeros_like(f), np.zeros_like(f)], axis=1)


def _store_keys(keys: np.ndarray, node: Node, g: Geometry, width: int | None) -> np.ndarray | None:
    """(elem, slot) of a cache write, or None when its layout is not one llama.cpp uses."""
    if width is None or g.T is None:
        return None
    n0, n1, n2, n3 = node.ne
    if n2 != 1 or n3 != 1:
        return None
    if node.op == "SET_ROWS" and n0 == width:  # {n_embd, kv_size}: one row per slot
        e, s = keys[:, 0], keys[:, 1]
    elif node.op == "SET_ROWS" and n0 == 1 and n1 % width == 0:  # transposed V {1, n_embd·kv_size}: e·kv_size + s
        kv = n1 // width
        e, s = keys[:, 1] // kv, keys[:, 1] % kv
    elif node.op == "CPY" and n0 == width * g.T and n1 == 1:  # 2024 K: the T new rows, flat, from slot n_past
        e, s = keys[:, 0] % width, g.n_past + keys[:, 0] // width
    elif node.op == "CPY" and n0 == g.T and n1 == width:  # 2024 V: {T, n_embd} view of the transposed cache
        e, s = keys[:, 1], g.n_past + keys[:, 0]
    else:
        return None
    z = np.zeros_like(e)
    return np.stack([e, s, z, z], axis=1)


def _layout_matches(a: Node, b: Node, ga: Geometry, gb: Geometry) -> bool:
    """Same layout up to lengths: every axis that differs is the token axis (T), the KV view (n_kv), or the one
    outermost axis (a longer run of a flat tensor)."""
    diff = [i for i in range(4) if a.ne[i] != b.ne[i]]
    outer = lambda ne: max((i for i in range(4) if ne[i] > 1), default=0)  # noqa: E731
    for i in diff:
        pair = {a.ne[i], b.ne[i]}
        if ga.T != gb.T and pair == {ga.T, gb.T}:
            continue
        if ga.n_kv != gb.n_kv and pair == {ga.n_kv, gb.n_kv}:
            continue
        if len(diff) == 1 and outer(a.ne) == outer(b.ne) == i:
            continue
        return False
    return True


def align(sa: Sample, sb: Sample, role: Role, ga: Geometry, gb: Geometry) -> Aligned | str:
    """The elements printed in both samples, or why none can be compared."""
    a, b = sa.node, sb.node
    if not sa.values.size and not sb.values.size:
        return "empty in both dumps"
    ka, va, unique = _index_points(sa)
    kb, vb, _ = _index_points(sb)
    how = "index"
    axes = axes_of(role, b, gb)
    if role.name in STORES:
        width = (lambda g: g.n_embd_k if role.name == "k_store" else g.n_embd_v)
        sk_a, sk_b = _store_keys(ka, a, ga, width(ga)), _store_keys(kb, b, gb, width(gb))
        if sk_a is not None and sk_b is not None:
            ka, kb, how, axes = sk_a, sk_b, "store", ("elem", "slot", "", "")
    base = role.name.split(".")[0]
    if how == "index" and a.ne != b.ne and base in ("k_view", "v_view") and sorted(a.ne) == sorted(b.ne):
        perm = _kv_permutation(a, b, ga, gb, base)
        if isinstance(perm, str):
            return perm
        kb, axes = kb[:, perm[0]], perm[1]
    elif how == "index" and a.ne != b.ne and not _layout_matches(a, b, ga, gb):
        if np.prod(a.ne) != np.prod(b.ne):
            return f"layouts differ: ne {ne_text(a.ne)} vs {ne_text(b.ne)}"
        ka, kb, how, axes = _flat(ka, a.ne), _flat(kb, b.ne), "flat", ("flat", "", "", "")
    if how == "index":
        axes = tuple(name if max(a.ne[j], b.ne[j]) > 1 else "" for j, name in enumerate((*axes, *_GENERIC[len(axes):])))
    if how == "index" and ka is kb and unique:  # the same printed indices: every element, in order
        return Aligned(how, ka.copy(), va, vb, axes)
    common, ia, ib = np.intersect1d(key_view(ka), key_view(kb), return_indices=True)
    if not len(common):
        return "no element is printed in both"
    order = np.argsort(ia)  # keep OLD's print order
    ia, ib = ia[order], ib[order]
    return Aligned(how, ka[ia], va[ia], vb[ib], axes)


def key_view(keys: np.ndarray) -> np.ndarray:
    """keys [N, 4] as N opaque rows, so that np.intersect1d matches whole coordinates."""
    k = np.ascontiguousarray(keys, dtype=np.int64)
    return k.view(np.dtype((np.void, k.dtype.itemsize * k.shape[1]))).ravel()


def causal(al: Aligned, role: Role, node: Node, g: Geometry, T_short: int) -> np.ndarray | str:
    """--prefix: [N] True where causality fixes the element (queries < T_short and the slots they may read), or why
    the node is not fixed by it. Token axes were already cut to the shorter run by the alignment."""
    limit = g.n_past + T_short  # slots that hold tokens of the shorter run
    k = al.keys
    if role.name in ("kq", "kq_scores", "kq_soft_max"):
        return k[:, 0] <= g.n_past + k[:, 1]  # slot visible to the query: not masked
    if role.name == "k_view":
        return k[:, 1] < limit
    if role.name == "v_view":
        return k[:, g.v_slot_axis] < limit
    if al.how == "store":
        return k[:, 1] < limit
    if role.kind == "other":
        return "role unknown: causality does not say which of its elements are fixed"
    if role.kind == "derived" and role.name.split(".")[0] in ("k_view", "v_view"):
        if al.how != "index":
            return "a view of the KV cache whose slot axis is unknown"
        axis = [j for j in range(4) if node.ne[j] == g.n_kv]
        if len(axis) != 1:
            return "a view of the KV cache whose slot axis is unknown"
        return k[:, axis[0]] < limit
    return np.ones(len(k), bool)
