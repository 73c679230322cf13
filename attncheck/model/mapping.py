"""Evaluation → the printed nodes a reference forward pass predicts, each axis labelled (for `--model`).

Which node is what comes from roles.py (by op and sources, never by names); this module adds the layout: what
each numpy axis (i2, i1, i0) of a node's ne {ne0, ne1, ne2, 1} means, so that the reference can be sliced and
transposed to it. Labels: `head`, `kvhead`, `query` (index in the evaluation), `slot` (KV cache slot), `dim`
(within a head), `col` (a column of a [rows, width] node; for per-head quantities col = head·D_h + dim), `row`
(one of the last ne1 queries: the rows GET_ROWS(out_ids) kept), `one` (an axis of size 1).

The layout copies between Qcur and q, the K/V cache and its views, and kqv and kqv_out (VIEW, PERMUTE, CONT) are
followed too; a PERMUTE's new axis order is read from the sizes, and a copy whose axes cannot be told apart that
way (two axes of the same length > 1) is left out.
"""
from __future__ import annotations

from collections import defaultdict

from ..dump.graph import Evaluation
from ..dump.records import Node
from ..dump.roles import Roles, assign
from ..dump.vocabulary import ROWS, TERMS, per_kv_head, value_of
from .mapped import Layer, Mapped

LAYOUT = {"VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE", "CONT"}  # ops that move values without computing

# reference quantity -> its canonical labels (the axes of the array expect.Expected gives for it): each per-head name
# of the vocabulary with values of its own, and "rows" [1, T, width] for every row role (the reference keeps a row
# role's value per node: Reference.at_node)
CANONICAL = {t.name: t.axes for t in TERMS if t.holds is None and t.axes != ROWS} | {"rows": ROWS}
KV_QUANTITIES = tuple(q for q in CANONICAL if q != "rows" and per_kv_head(q))  # per KV head
ROW_ROLES = tuple(t.name for t in TERMS if t.kind == "role" and t.axes == ROWS)


def _fits(node: Node, labels: tuple[str, str, str], sizes: dict[str, int]) -> bool:
    """The node's ne {ne0, ne1, ne2, 1} matches labels (numpy order i2, i1, i0) for these sizes."""
    return node.ne[3] == 1 and all(sizes.get(x, -1) == n or x == "slot" for x, n in zip(labels, node.ne[2::-1]))


def _permuted(labels: tuple[str, str, str], ne_from: tuple[int, ...], ne_to: tuple[int, ...]) -> tuple | None:
    """Labels of a node of ne_to that holds the values of one of ne_from (labels) in another axis order.

    Axes are told apart by their sizes; None when two axes longer than 1 are equally long (ambiguous).
    """
    if ne_from[3] != 1 or ne_to[3] != 1 or sorted(ne_from) != sorted(ne_to):
        return None
    by_size: dict[int, list[str]] = defaultdict(list)
    for label, n in zip(labels, ne_from[2::-1]):
        by_size[n].append(label)
    if any(len(v) > 1 and n > 1 for n, v in by_size.items()):
        return None
    return tuple(by_size[n].pop(0) for n in ne_to[2::-1])


def _copies_back(m: Mapped) -> list[Mapped]:
    """The layout chain behind a mapped node: src0 while the op only moves values, labelled through PERMUTEs."""
    out: list[Mapped] = []
    n, lab = m.node, m.labels
    while n.op in LAYOUT and n.inputs[0] is not None and len(out) < 16:
        src = n.inputs[0]
        if n.op in ("PERMUTE", "TRANSPOSE"):
            lab = _permuted(lab, n.ne, src.ne)
        elif src.ne != n.ne:
            lab = None
        if lab is None:
            break
        out.append(Mapped(src, m.role, m.quantity, lab, m.ref_layer))
        n = src
    return out


def _copies_forward(m: Mapped, consumers: dict[int, list[Node]], stop: Node | None) -> list[Mapped]:
    """Layout copies read from a mapped node (kqv → its permuted view), up to `stop` (kqv_out, mapped apart)."""
    out: list[Mapped] = []
    n, lab = m.node, m.labels
    for _ in range(16):
        nxt = next((c for c in consumers[id(n)] if c.op in LAYOUT and c.inputs[0] is n and c is not stop), None)
        if nxt is None:
            break
        lab = _permuted(lab, n.ne, nxt.ne) if nxt.op in ("PERMUTE", "TRANSPOSE") else (lab if nxt.ne == n.ne else None)
        if lab is None:
            break
        out.append(Mapped(nxt, m.role, m.quantity, lab, m.ref_layer))
        n = nxt
    return out


def _per_head(node: Node | None, role: str, quantity: str, options, sizes, ref_layer: int) -> Mapped | None:
    """The first of the candidate labellings the node's ne fits; (one, X, col) is the heads merged into columns."""
    if node is None or node.quantized:
        return None
    for labels in options:
        if labels[2] == "col":
            if node.ne[3] == 1 and node.ne[2] == 1 and (labels[1] == "slot" or node.ne[1] == sizes[labels[1]]) and \
                    node.ne[0] == sizes["dim"] * sizes["kvhead" if quantity in KV_QUANTITIES else "head"]:
                return Mapped(node, role, quantity, labels, ref_layer)
        elif _fits(node, labels, sizes):
            return Mapped(node, role, quantity, labels, ref_layer)
    return None


def _layer(r: dict[str, Node], L: int, ref_layer: int, consumers) -> Layer | None:
    flash = "flash_attn" in r
    anchor = r.get("flash_attn") or r.get("kq_soft_max")
    k = r.get("k_view")
    if anchor is None or k is None:
        return None
    if flash:
        D_h, H, T = anchor.ne[0], anchor.ne[1], anchor.ne[2]
    else:
        H, T = anchor.ne[2], anchor.ne[1]
        D_h = r["kqv"].ne[0] if "kqv" in r else k.ne[0]
    n_kv, H_kv = k.ne[1], k.ne[2]
    sizes = {"head": H, "kvhead": H_kv, "query": T, "dim": D_h, "one": 1, "slot": n_kv}
    picks = [  # (role, the layouts its node may have): it shows the reference value of vocabulary.value_of(role)
        ("q", [("head", "query", "dim")]),
        ("q_scaled", [("query", "head", "dim")]),
        ("Qcur", [("query", "head", "dim"), ("one", "query", "col")]),
        ("Kcur", [("query", "kvhead", "dim"), ("one", "query", "col")]),
        ("k_rot", [("query", "kvhead", "dim")]),
        ("Vcur", [("query", "kvhead", "dim"), ("one", "query", "col")]),
        ("v_rot", [("query", "kvhead", "dim")]),
        ("k_view", [("kvhead", "slot", "dim")]),
        ("v_view", [("kvhead", "slot", "dim")] if flash else [("kvhead", "dim", "slot")]),
        ("k_store", [("one", "slot", "col")]),
        ("kq", [("head", "query", "slot")]),
        ("kq_scores", [("head", "query", "slot")]),
        ("kq_soft_max", [("head", "query", "slot")]),
        ("kqv", [("head", "query", "dim")]),
        ("flash_attn", [("query", "head", "dim")]),
        ("kqv_out", [("one", "query", "col")]),
    ]
    if flash:  # not transposed with flash attention: one row per slot, like K
        picks.append(("v_store", [("one", "slot", "col")]))
    mapped: list[Mapped] = []
    seen: set[int] = set()

    def add(m: Mapped | None) -> None:
        if m is not None and id(m.node) not in seen and not m.node.quantized:
            seen.add(id(m.node))
            mapped.append(m)

    for role, options in picks:
        m = _per_head(r.get(role), role, value_of(role), options, sizes, ref_layer)
        if m is None:
            continue
        add(m)
        if role in ("q", "k_view", "v_view"):
            for c in _copies_back(m):
                add(c)
        if role in ("kqv", "flash_attn"):
            for c in _copies_forward(m, consumers, r.get("kqv_out")):
                add(c)
    for role in ROW_ROLES:
        n = r.get(role)
        if n is not None and n.ne[2] == 1 and n.ne[3] == 1:
            add(Mapped(n, role, "rows", CANONICAL["rows"], ref_layer))
    v = r.get("v_view")
    return Layer(L, anchor, flash, H, H_kv, D_h, n_kv, T, k.type, mapped, v.type if v is not None else None)


def map_evaluation(ev: Evaluation, roles: Roles | None = None, chains=None) -> list[Layer]:
    """Every layer's attention in the evaluation, with the printed nodes a reference predicts.

    inp_embd is listed with the first layer, result_norm and result_output with the last. With `chains` (a function
    of the layer, None for the input and output: chains.py), the nodes inside each role and the layout copies of
    every mapped node are mapped too.
    """
    roles = roles or assign(ev)
    consumers: dict[int, list[Node]] = defaultdict(list)
    for n in ev.nodes:
        for s in n.inputs:
            if s is not None:
                consumers[id(s)].append(n)
    numbers = [s.layer for s in ev.sites] if ev.sites else list(range(len(ev.flash)))
    out: list[Layer] = []
    by_index: dict[int, Layer] = {}
    for k, r in enumerate(roles.layers):
        layer = _layer(r, numbers[k] if k < len(numbers) else k, k, consumers)
        if layer is not None:
            out.append(layer)
            by_index[k] = layer
    if not out:
        return out
    for n in ev.nodes:
        role = roles.of.get(id(n))
        if role is None or role.kind != "role" or role.section == "layer" or n.quantized:
            continue
        if role.name in ROW_ROLES and n.ne[2] == 1 and n.ne[3] == 1:
            target = out[0] if role.section == "input" else out[-1]
            target.mapped.append(Mapped(n, role.name, "rows", CANONICAL["rows"], None))
    if chains is not None:  # the output's nodes before the logits' last (projection, bias, scale, soft-cap)
        for n in roles.output[:-1]:
            if not n.quantized and n.ne[2] == 1 and n.ne[3] == 1:
                out[-1].mapped.append(Mapped(n, "result_output", "rows", CANONICAL["rows"], None))
        _inner(ev, roles, out, by_index, chains)
    return out


def _inner(ev: Evaluation, roles: Roles, out: list[Layer], by_index: dict[int, Layer], chains) -> None:
    """The nodes inside roles (chains.walk), the cache stores and views before them, and layout copies."""
    from . import chains as inner

    mapped: dict[int, Mapped] = {}
    home: dict[int, Layer] = {}
    for L in out:
        for m in L.mapped:
            mapped[id(m.node)], home[id(m.node)] = m, L

    def emitter(L: Layer):
        def emit(m: Mapped) -> Mapped:
            if id(m.node) in mapped:
                return mapped[id(m.node)]
            if not m.node.quantized:
                mapped[id(m.node)], home[id(m.node)] = m, L
                L.mapped.append(m)
            return m
        return emit

    unprinted: dict[int, Node] = {}  # a store → the view of the cache it writes into, printed before it (SET_ROWS)
    last: dict[tuple, Node] = {}
    for n in ev.nodes:
        if n.op in ("RESHAPE", "VIEW") and n.inputs[0] is None and n.srcs[0] is not None:
            last[n.ne] = n
        elif n.op == "SET_ROWS" and n.ne in last:
            unprinted[id(n)] = last.pop(n.ne)
    for k, L in by_index.items():
        r = roles.layers[k]
        sizes = {"head": L.H, "kvhead": L.H_kv, "query": L.T, "dim": L.D_h, "one": 1, "slot": L.n_kv}
        spec = chains(k)
        for name in spec:
            if name in r:
                inner.walk(r[name], name, spec, sizes, k, emitter(L))
        for m in _stores(r, L, k, unprinted):
            emitter(L)(m)
    g = chains(None)
    sizes = {"head": out[0].H, "kvhead": out[0].H_kv, "query": out[0].T, "dim": out[0].D_h, "one": 1}
    for n in ev.nodes:
        role = roles.of.get(id(n))
        if role is not None and role.kind == "role" and role.section != "layer" and role.name in g:
            inner.walk(n, role.name, g, sizes, None, emitter(out[0] if role.section == "input" else out[-1]))
    inner.copies(ev.nodes, mapped, None, lambda m: emitter(home[id(m.node.inputs[0])])(m))


def _stores(r: dict[str, Node], L: Layer, k: int, unprinted: dict[int, Node]) -> list[Mapped]:
    """The K and V stores in shapes the per-head picks do not take, and the cache as it was before them.

    SET_ROWS writes into the whole cache: K as {H_kv·D_h, slots}, V (transposed, without flash attention) flattened
    as {1, H_kv·D_h·slots} with slot fastest; a 2024 CPY writes this evaluation's rows into a view of the cache (K
    flattened, V transposed {T, H_kv·D_h}), and that view, printed before the copy, holds the cache before it."""
    from .grid import Reshape

    out: list[Mapped] = []
    width = L.H_kv * L.D_h
    for role in ("k_store", "v_store"):
        n = r.get(role)
        if n is None or n.quantized or n.ne[3] != 1:
            continue
        count = n.ne[0] * n.ne[1] * n.ne[2]
        m = None
        if n.op == "CPY" and count == width * L.T:
            if n.ne[:3] == (L.T, width, 1):
                m = Mapped(n, role, value_of(role), ("one", "col", "query"), k)
            else:
                base = (width, L.T, 1, 1)
                m = Mapped(n, role, value_of(role), ("one", "query", "col"), k, via=(Reshape(n.ne, base),), base=base)
            dst = n.inputs[1]
        elif n.op == "SET_ROWS" and role == "v_store" and not L.flash and n.ne[0] == 1 and count % width == 0:
            base = (count // width, width, 1, 1)
            m = Mapped(n, role, "v_view", ("one", "col", "slot"), k, via=(Reshape(n.ne, base),), base=base)
            dst = unprinted.get(id(n))
        elif n.op == "SET_ROWS":
            m, dst = None, unprinted.get(id(n))
            if dst is not None:  # the whole cache, as the store's own labelled view (k_store: picked in _layer)
                lab = ("one", "slot", "col") if n.ne[0] == width else None
                if lab is not None:
                    out.append(Mapped(dst, role, value_of(role), lab, k, before=True))
                dst = None
        else:
            continue
        if m is not None:
            out.append(m)
            if dst is not None and dst.ne == n.ne and not dst.quantized:
                out.append(Mapped(dst, role, m.quantity, m.labels, k, via=m.via, base=m.base, before=True))
    return out
