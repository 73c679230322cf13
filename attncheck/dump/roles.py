"""Evaluation → roles: what every node of the graph is (q, kq, k_store, ffn_out, ...), found by op and by the
sources headers name, relative to the attention sites, never by node names (they changed between llama.cpp
versions: kq_soft_max_ext vs kq_soft_max, k-0 vs cache_k_l0 (view) (permuted), kqv_merged_cont vs kqv_out).

Three kinds of role, so two dumps of different llama.cpp versions line up by (layer, role):
- role:    a node llama.cpp's attention and residual structure defines (vocabulary.py's table);
- derived: a node that feeds a role node, named by the path to it (`Qcur.src0` is the node Qcur reads first);
- other:   the catch-all, `other:OP#k` (k-th such node of that op in the layer), listed, matched only by position.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from .graph import Evaluation
from .paths import LAYOUT, back_to_cur, before_post, is_branch, output_chain, post_of, rotation
from .records import Node
from .vocabulary import ROLES  # the role names and their meanings, in graph order (vocabulary.py)

STORES = ("k_store", "v_store")


@dataclass(frozen=True)
class Role:
    """Where a node sits: section (input, layer, output), layer (None outside layers), role name and kind."""

    section: str
    layer: int | None
    name: str
    kind: str  # role | derived | other
    ops: str = ""  # derived: the ops along its path, so that `ffn_out.src1` of SWIGLU and of MUL stay apart

    @property
    def key(self) -> tuple:
        """What matches a node across dumps (with the evaluation): never its name."""
        return (self.section, -1 if self.layer is None else self.layer, self.name, self.ops)

    @property
    def group(self) -> str:
        """The evaluation × layer group it is reported under."""
        return f"layer {self.layer}" if self.section == "layer" else self.section


@dataclass
class Roles:
    """The roles of one evaluation's nodes; `layers` holds, per layer, the nodes of its named roles."""

    of: dict[int, Role]  # id(node) -> Role
    layers: list[dict[str, Node]]
    after_out_ids: set[int]  # id(node) of rows re-selected by GET_ROWS(..., out_ids), and all that reads them
    output: tuple[Node, ...] = ()  # the output's nodes: its projection MUL_MAT, ..., result_output (paths.output_chain)

    def role(self, node: Node) -> Role:
        return self.of[id(node)]


def _weight_matmul(n: Node | None) -> bool:
    """MUL_MAT of a weight: src0 is not a printed node (weights are not printed), src1 is."""
    return n is not None and n.op == "MUL_MAT" and n.unprinted(0) and n.inputs[1] is not None


def _cur(chain: list[Node], D_h: int | None, T: int) -> Node | None:
    """Qcur/Kcur/Vcur on a chain back from the attention: the RoPE when present, else the earliest node of the
    per-head shape {D_h, H, T, 1} (before the views), else the node that computed it."""
    if not chain:
        return None
    for n in chain:
        if n.op == "ROPE":
            return n
    shaped = [n for n in chain if n.ne[0] == D_h and n.ne[2] == T and n.ne[3] == 1]
    if shaped:
        return shaped[-1]
    return chain[-1] if chain[-1].op not in LAYOUT else None


def _norm_of(cur: Node | None) -> Node | None:
    """The normalised input of a projection: walk src0 back from a Qcur/Kcur/Vcur to its weight MUL_MAT."""
    n, steps = cur, 0
    while n is not None and steps < 16:
        if _weight_matmul(n):
            return n.inputs[1]
        n, steps = n.inputs[0], steps + 1
    return None


def assign(ev: Evaluation) -> Roles:
    """Give every node of the evaluation a role and a layer (the k-th attention site is layer k)."""
    order = {id(n): i for i, n in enumerate(ev.nodes)}
    consumers: dict[int, list[Node]] = defaultdict(list)
    for n in ev.nodes:
        for s in n.inputs:
            if s is not None:
                consumers[id(s)].append(n)
    attn = [(s.kqv, s) for s in ev.sites] or [(f, None) for f in ev.flash]
    layers: list[dict[str, Node]] = []
    prev_end = -1
    for out, site in attn:
        r: dict[str, Node] = {}
        if site is not None:
            r.update(kq_soft_max=site.softmax, kq=site.kq, q=site.q, k_view=site.k, v_view=site.v, kqv=site.kqv)
            if site.scores is not site.kq:
                r["kq_scores"] = site.scores
            first = site.kq or site.softmax
            T, D_h = site.T, site.D_h
        else:
            k = out.inputs[1]
            if k is not None and k.op == "CPY" and k.inputs[0] is not None and k.inputs[0].type != k.type:
                k = k.inputs[0]  # an f32 cache cast to f16 for the op (build_attn_mha): K is the cache's view
            r.update(flash_attn=out, q=out.inputs[0], k_view=k)
            first, T, D_h = out, out.ne[2], out.ne[0]
        r = {k: v for k, v in r.items() if v is not None}
        span = ev.nodes[prev_end + 1: order[id(first)]]
        start = span[0].line if span else first.line
        _stores(span, r, ev.lost, start, first.line)
        if site is None and "k_view" in r:  # FLASH_ATTN_EXT does not name V: the other view of K's shape
            v = [n for n in span if n.ne == r["k_view"].ne and n is not r["k_view"] and n.op in LAYOUT]
            if v and not _lost_between(ev.lost, v[-1].line, first.line):  # else V's own view may be the lost one
                r["v_view"] = v[-1]
        for name, start, steps in (("Qcur", "q", {"scaled": "q_scaled", "rot": "q_rot"}),
                                   ("Kcur", "k_store", {"rot": "k_rot"}), ("Vcur", "v_store", {"rot": "v_rot"})):
            if start in r:
                chain, passed = back_to_cur(r[start].inputs[0], D_h, T)
                r.update({steps[k]: n for k, n in passed.items() if k in steps})
                cur = _cur(chain, D_h, T)
                if cur is not None:
                    r[name] = cur
        norm = _norm_of(r.get("Qcur")) or _norm_of(r.get("Kcur"))
        if norm is not None:
            r["attn_norm"] = norm
        end = _after_attention(out, r, ev.nodes, order, consumers, D_h, ev.lost)
        layers.append(r)
        prev_end = end if end is not None else order[id(out)] if out is not None else prev_end
    of: dict[int, Role] = {}
    sections: list[tuple[str, int | None, dict[str, Node]]] = []
    output: tuple[Node, ...] = ()
    if layers and ("ffn_inp" in layers[0] or "attn_ffn" in layers[0]):
        L0 = layers[0]
        add, branch = (L0["ffn_inp"], L0.get("attn_post", L0.get("attn_out"))) if "ffn_inp" in L0 else \
            (L0.get("l_out"), L0["attn_ffn"])
        inp = _residual(add, branch) if add is not None else None
        if inp is not None:
            sections.append(("input", None, {"inp_embd": inp}))
    sections += [("layer", L, r) for L, r in enumerate(layers)]
    if layers and "l_out" in layers[-1]:
        tail = [n for n in ev.nodes[order[id(layers[-1]["l_out"])] + 1:] if _weight_matmul(n)]
        if tail and not _lost_between(ev.lost, tail[-1].line, ev.nodes[-1].line + 1):  # else the logits may be lost
            output = tuple(output_chain(tail[-1], consumers))
            out_roles = {"result_output": output[-1]}
            if tail[-1].inputs[1] is not None:
                out_roles["result_norm"] = tail[-1].inputs[1]
            sections.append(("output", None, out_roles))
    for section, L, r in sections:
        for name in ROLES:
            n = r.get(name)
            if n is not None and id(n) not in of:
                of[id(n)] = Role(section, L, name, "role")
    for section, L, r in sections:
        for name in ROLES:
            if name in r:
                _derive(r[name], name, section, L, of)
    _catch_all(ev.nodes, of)
    return Roles(of, layers, _after_out_ids(ev.nodes, consumers), output)


def _lost_between(lost: Sequence[int], a: int, b: int) -> bool:
    """A damaged header (a node missing whole) between lines a and b: a role picked there by its position among
    the nodes (the first store, the first weight MUL_MAT) may belong to the node that was lost."""
    return any(a < x < b for x in lost)


def _stores(span: list[Node], r: dict[str, Node], lost: Sequence[int] = (), start: int = 0, end: int = 0) -> None:
    """The cache writes before a layer's attention: SET_ROWS, or CPY into a view (2024). K is written first
    (llama.cpp's build_attn stores K, then V, in every version). Fewer than both found while a header was lost in
    the span (lines start..end): which one was lost is not known, so neither is named."""
    stores = [n for n in span if n.op == "SET_ROWS" or (n.op == "CPY" and n.inputs[1] is not None
                                                        and n.inputs[1].op == "VIEW")]
    if len(stores) < len(STORES) and _lost_between(lost, start - 1, end):
        return
    for name, n in zip(STORES, stores):
        r[name] = n


def _after_attention(out: Node | None, r: dict[str, Node], nodes: list[Node], order: dict[int, int],
                     consumers: dict[int, list[Node]], d_h: int | None = None,
                     lost: Sequence[int] = ()) -> int | None:
    """kqv_out, attn_out, ffn_inp, ffn_norm, ffn_out, l_out after one layer's attention (and kqv_unrot, attn_post,
    ffn_post, attn_ffn where the family has them); returns l_out's index. lost: lines of damaged headers (ffn_norm
    is not named when one lies before the first weight MUL_MAT of the FFN: that MUL_MAT may be the lost node)."""
    if out is None:
        return None
    n = _merge_heads(out, r, consumers, d_h)
    mm = next((c for c in consumers[id(n)] if _weight_matmul(c) and c.inputs[1] is n), None)
    if mm is None:
        return None
    bias = next((c for c in consumers[id(mm)] if c.op == "ADD" and c.inputs[0] is mm and c.unprinted(1)), None)
    attn_out = bias or mm
    r["attn_out"] = attn_out
    n = attn_out
    while True:  # ffn_inp = residual + attn_out, after a post-norm or scale, and GET_ROWS(out_ids) in the last layer
        post = post_of(n, consumers)
        if post is not None:
            r["attn_post"] = n = post
            continue
        c = consumers[id(n)]
        add = next((x for x in c if x.op == "ADD"), None)
        if add is not None:
            break
        rows = next((x for x in c if x.op == "GET_ROWS" and x.inputs[0] is n), None)
        if rows is None:
            return None
        n = rows
    other = add.inputs[0] if add.inputs[1] is n else add.inputs[1]
    if is_branch(other):  # parallel attention and FFN (falcon): attn_out + ffn_out, then the residual
        r["attn_ffn"], r["ffn_out"] = add, other  # type: ignore[assignment]
        l_out = next((x for x in consumers[id(add)] if x.op == "ADD"), None)
        if l_out is None:
            return None
        r["l_out"] = l_out
        return order[id(l_out)]
    r["ffn_inp"] = ffn_inp = add
    later = nodes[order[id(ffn_inp)] + 1:]
    l_out = next((x for x in later if x.op == "ADD" and ffn_inp in x.inputs), None)
    if l_out is None:
        return None
    r["l_out"] = l_out
    other = l_out.inputs[0] if l_out.inputs[1] is ffn_inp else l_out.inputs[1]
    pre = before_post(other)
    if pre is not None:
        r["ffn_post"], other = other, pre  # type: ignore[assignment]
    if other is not None:
        r["ffn_out"] = other
    mm = next((x for x in nodes[order[id(ffn_inp)] + 1: order[id(l_out)]] if _weight_matmul(x)), None)
    if mm is not None and not _lost_between(lost, ffn_inp.line, mm.line):
        r["ffn_norm"] = mm.inputs[1]
    return order[id(l_out)]


def _merge_heads(out: Node, r: dict[str, Node], consumers: dict[int, list[Node]], d_h: int | None) -> Node:
    """From kqv (or FLASH_ATTN_EXT) through the permute/cont that merge the heads (kqv_out), and the rotation back of
    a quantized V cache (kqv_unrot); returns the node the output projection reads."""
    n = out
    width = out.ne[0] * (out.ne[1] if out.op == "FLASH_ATTN_EXT" else out.ne[2])
    merged = lambda x: x.ne[0] == width and x.ne[2] == x.ne[3] == 1  # noqa: E731  ({H·D, T, 1, 1})
    after_rot = False
    for _ in range(32):
        nxt = [c for c in consumers[id(n)] if c.op in LAYOUT and c.inputs[0] is n]
        if not nxt:
            rot = next((c for c in consumers[id(n)] if rotation(c, d_h) and c.inputs[1] is n), None)
            if rot is None or after_rot:
                break
            n, after_rot = rot, True
            continue
        n = nxt[0]
        if merged(n):
            r["kqv_unrot" if after_rot else "kqv_out"] = n
    if n is not out and "kqv_out" not in r:
        r["kqv_out"] = n
    return n


def _residual(ffn_inp: Node, attn_out: Node | None) -> Node | None:
    """The residual input of layer 0's ffn_inp (through GET_ROWS in a one-layer model): the embeddings."""
    for s in ffn_inp.inputs:
        while s is not None and s.op == "GET_ROWS" and s.inputs[0] is not None:
            if s.inputs[0] is attn_out:
                break
            s = s.inputs[0]
        if s is not None and s is not attn_out and not (s.op == "GET_ROWS" and s.inputs[0] is not None):
            return s
    return None


def _derive(node: Node, name: str, section: str, layer: int | None, of: dict[int, Role]) -> None:
    """Name the unnamed nodes feeding a role node by their path to it: `kq.src0.src1`."""
    stack = [(node, name, "")]
    while stack:
        n, path, ops = stack.pop()
        for i in (1, 0):  # pushed so that src0 is named first
            s = n.inputs[i]
            if s is not None and id(s) not in of:
                sub = (f"{path}.src{i}", f"{ops}/{s.op}")
                of[id(s)] = Role(section, layer, sub[0], "derived", sub[1])
                stack.append((s, *sub))


def _catch_all(nodes: list[Node], of: dict[int, Role]) -> None:
    """Nodes no role reaches: `other:OP#k`, placed in the section of the nearest named node before them."""
    where: tuple[str, int | None] = ("input", None)
    count: dict[tuple, int] = defaultdict(int)
    for n in nodes:
        r = of.get(id(n))
        if r is not None:
            where = (r.section, r.layer)
            continue
        k = (*where, n.op)
        of[id(n)] = Role(where[0], where[1], f"other:{n.op}#{count[k]}", "other")
        count[k] += 1


def _after_out_ids(nodes: list[Node], consumers: dict[int, list[Node]]) -> set[int]:
    """GET_ROWS of an activation (rows kept for output by out_ids) and every node that reads them."""
    seen: set[int] = set()
    stack = [n for n in nodes if n.op == "GET_ROWS" and n.inputs[0] is not None]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        stack.extend(consumers[id(n)])
    return seen
