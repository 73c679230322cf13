"""The printed nodes inside a role, for `--model`: a norm before its weight, a projection before its bias, q/k norm
and RoPE, the FFN's gate, up and activation, the embeddings before their scale — each is a node of llama.cpp's
graph with a value of its own in the reference forward pass (reference.py keeps it under the key named here).

A chain is the ops that compute one role, in graph order, from its first op to the role's node (roles.py): walking
back from the role's node, each node whose op is the chain's step holds that step's value; a layout op (RESHAPE,
VIEW, PERMUTE, CONT) between two steps holds the value below it. A step with two printed inputs names the chain
each one ends (SWIGLU: ffn_gate and ffn_up). The chains follow the model (biases, q/k norms, a fused qkv, the FFN
kind: arch/table.py's Forward) and the ops of both llama.cpp builds (2024's MUL(SILU(gate), up) beside today's
SWIGLU).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..dump.vocabulary import SCORES, axes, per_kv_head, value_of
from .mapped import Mapped
from .weights import Model

PREV = "prev"  # an input that holds the step before


@dataclass(frozen=True)
class Step:
    """One node of a chain: the ops that compute it, the reference key of its value, its canonical layout, and per
    op what its printed inputs hold (PREV, another chain's name, or None: not followed)."""

    ops: tuple[str, ...]
    key: str
    quantity: str  # "rows" [T, width] or a per-head quantity of mapping.CANONICAL
    srcs: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)

    def inputs(self, op: str) -> tuple[str | None, str | None]:
        return self.srcs.get(op, (PREV, None))


def _keys(role: str, names: list[str]) -> list[str]:
    """role@name for every step but the last, which holds the role's own value."""
    return [f"{role}@{n}" for n in names[:-1]] + [role]


def _chain(role: str, quantity: str, parts: list[tuple[str, tuple[str, ...], dict]]) -> tuple[Step, ...]:
    keys = _keys(role, [p[0] for p in parts])
    return tuple(Step(ops, k, quantity, srcs) for (_, ops, srcs), k in zip(parts, keys))


FIRST = {"MUL_MAT": (None, None), "GET_ROWS": (None, None), "NORM": (None, None), "RMS_NORM": (None, None)}


def _norm(m: Model, role: str, prefix: str, rms: bool) -> tuple[Step, ...] | None:
    """build_norm: NORM or RMS_NORM, MUL by the weight, ADD the bias."""
    if not m.has(prefix + ".weight"):
        return None
    parts = [("norm", ("RMS_NORM",) if rms else ("NORM",), FIRST), ("mul", ("MUL",), {})]
    if m.has(prefix + ".bias"):
        parts.append(("bias", ("ADD",), {}))
    return _chain(role, "rows", parts)


def _linear(m: Model, prefix: str) -> list[tuple[str, tuple[str, ...], dict]]:
    """MUL_MAT of prefix.weight (its printed input is the role before: not followed), ADD of prefix.bias."""
    parts = [("mm", ("MUL_MAT",), FIRST)]
    if m.has(prefix + ".bias"):
        parts.append(("bias", ("ADD",), {}))
    return parts


def layer_chains(m: Model, il: int) -> dict[str, tuple[Step, ...]]:
    """The chains of layer il, by the role (or inner chain) they end in."""
    hp = m.hparams
    fw, p = hp.forward, f"blk.{il}."
    rms = fw.norm == "rms"
    out: dict[str, tuple[Step, ...]] = {}
    for role, prefix in (("attn_norm", "attn_norm"), ("ffn_norm", "ffn_norm")):
        c = _norm(m, role, p + prefix, rms)
        if c is not None:
            out[role] = c
    if fw.post_norms:
        for role, prefix in (("attn_post", "post_attention_norm"), ("ffn_post", "post_ffw_norm")):
            c = _norm(m, role, p + prefix, True)
            if c is not None:
                out[role] = c
    fused = m.has(p + "attn_qkv.weight")
    if fused:
        out["qkv"] = _chain("qkv", "rows", _linear(m, p + "attn_qkv"))
    for role, w, norm in (("Qcur", "attn_q", "attn_q_norm"), ("Kcur", "attn_k", "attn_k_norm"),
                          ("Vcur", "attn_v", None)):
        parts = [("proj", ("VIEW",), {"VIEW": ("qkv", None)})] if fused else _linear(m, p + w)
        if not fused and len(parts) == 2:
            parts = [("mm", parts[0][1], parts[0][2]), ("proj", parts[1][1], parts[1][2])]
        elif not fused:
            parts = [("proj", parts[0][1], parts[0][2])]
        if norm is not None and fw.qk_norm and m.has(p + norm + ".weight"):
            parts += [("norm", ("RMS_NORM",), {}), ("normw", ("MUL",), {})]
        if norm is not None and fw.positions.startswith("rope"):
            parts.append(("rope", ("ROPE",), {}))
        out[role] = _chain(role, role, parts)
    for role in ("k_rot", "v_rot", "q_rot"):  # the Hadamard rotation (q_rot holds q: what kq reads)
        out[role] = (Step(("MUL_MAT",), value_of(role), value_of(role), {"MUL_MAT": (None, None)}),)
    if hp.softcap:  # the scores soft-capped: SCALE(1/cap), TANH, SCALE(cap) from kq
        out["kq_scores"] = _chain("kq_scores", "kq_scores", [("scaled", ("SCALE",), {"SCALE": (None, None)}),
                                                             ("tanh", ("TANH",), {}), ("capped", ("SCALE",), {})])
    out["attn_out"] = _chain("attn_out", "rows", _linear(m, p + "attn_output"))
    out["ffn_out"] = _chain("ffn_out", "rows", [(n, ops, {"MUL_MAT": (None, "ffn_act")} if n == "mm" else srcs)
                                                for n, ops, srcs in _linear(m, p + "ffn_down")])
    out["ffn_up"] = _chain("ffn_up", "rows", _linear(m, p + "ffn_up"))
    if fw.ffn == "gelu":
        out["ffn_act"] = (Step(("GELU",), "ffn_act", "rows", {"GELU": ("ffn_up", None)}),)
    elif fw.ffn == "swiglu_fused":
        out["ffn_act"] = (Step(("SWIGLU",), "ffn_act", "rows", {"SWIGLU": ("ffn_up", None)}),)
    else:
        glu = "GEGLU" if fw.ffn == "geglu" else "SWIGLU"
        act = "GELU" if fw.ffn == "geglu" else "SILU"
        out["ffn_gate"] = _chain("ffn_gate", "rows", _linear(m, p + "ffn_gate"))
        # today one fused op; 2024 builds: MUL(act(gate), up)
        out["ffn_act"] = (Step((glu, "MUL"), "ffn_act", "rows",
                               {glu: ("ffn_gate", "ffn_up"), "MUL": ("ffn_gate_act", "ffn_up")}),)
        out["ffn_gate_act"] = (Step((act,), "ffn_gate_act", "rows", {act: ("ffn_gate", None)}),)
    return out


def global_chains(m: Model) -> dict[str, tuple[Step, ...]]:
    """The embeddings (GET_ROWS, + learned positions, × scale) and the final norm."""
    hp = m.hparams
    parts: list[tuple[str, tuple[str, ...], dict]] = [("tok", ("GET_ROWS",), FIRST)]
    out: dict[str, tuple[Step, ...]] = {}
    if hp.forward.positions == "learned":
        parts.append(("pos", ("ADD",), {"ADD": (PREV, "inp_pos")}))
        out["inp_pos"] = (Step(("GET_ROWS",), "inp_pos", "rows", FIRST),)
    if hp.embd_scale:
        parts.append(("scaled", ("SCALE",), {}))
    out["inp_embd"] = _chain("inp_embd", "rows", parts)
    norm = _norm(m, "result_norm", "output_norm", hp.forward.norm == "rms")
    if norm is not None:
        out["result_norm"] = norm
    return out


# ---- the walk: printed nodes → (chain step, labels) --------------------------------------------------------------

LAYOUT = {"VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE", "CONT"}
_OPTIONS = {  # the natural ggml layouts of a chain's values, before any permute
    "head": (("query", "head", "dim"), ("one", "query", "col")),
    "kvhead": (("query", "kvhead", "dim"), ("one", "query", "col")),
    "rows": (("one", "row", "col"),),
    "slots": (("head", "query", "slot"),),
}


def _options(quantity: str):
    if quantity == "rows":
        return _OPTIONS["rows"]
    if axes(quantity) == SCORES:
        return _OPTIONS["slots"]
    return _OPTIONS["kvhead" if per_kv_head(quantity) else "head"]


def labels_for(quantity: str, ne: tuple[int, ...], sizes: dict[str, int]) -> tuple[str, str, str] | None:
    """The first natural layout of the quantity that ne fits (rows: any width, checked against the reference
    later); None when none does."""
    if ne[3] != 1:
        return None
    for labels in _options(quantity):
        if labels[2] == "col" and labels[1] != "row":
            group = sizes["kvhead" if "kvhead" in _options(quantity)[0] else "head"]
            if ne[2] == 1 and ne[1] == sizes[labels[1]] and ne[0] == group * sizes["dim"]:
                return labels
        elif labels[1] == "row":
            if ne[2] == 1:
                return labels
        elif all(sizes.get(x, -1) == n for x, n in zip(labels, ne[2::-1])):
            return labels
    return None


def _count(ne: tuple[int, ...]) -> int:
    return ne[0] * ne[1] * ne[2] * ne[3]


def reshaped(node, src) -> tuple | None:
    """(Reshape transform, labels, base ne, via) for a node whose flat order is that of a labelled Mapped `src`
    (RESHAPE, CONT, a whole VIEW), or None."""
    from .grid import Reshape

    if node.ne[3] != 1 or src.node.ne[3] != 1 or _count(node.ne) != _count(src.node.ne):
        return None
    return (Reshape(node.ne, src.node.ne), *src.via)


def permuted(node, src) -> tuple | None:
    """The Permute transform of a PERMUTE/TRANSPOSE of a labelled `src`: axes told apart by their lengths; None when
    two axes longer than 1 are equally long."""
    from .grid import Permute

    if node.ne[3] != 1 or src.node.ne[3] != 1 or sorted(node.ne) != sorted(src.node.ne):
        return None
    own, theirs = list(node.ne[2::-1]), list(src.node.ne[2::-1])
    if any(theirs.count(n) > 1 and n > 1 for n in theirs):
        return None
    axes, used = [], set()
    for n in own:
        a = next(i for i, m in enumerate(theirs) if m == n and i not in used)
        used.add(a)
        axes.append(a)
    return (Permute(tuple(axes)), *src.via)


def _via(node, after, sizes, quantity) -> tuple | None:
    """(labels, base ne, via) of `node`, the input of `after` (a labelled Mapped, a layout op of node): node's own
    natural layout if it has one, else through after's transform."""
    own = labels_for(quantity, node.ne, sizes)
    if own is not None:
        return own, None, ()
    if after is None or after.node.inputs[0] is not node:
        return None
    if after.node.op in ("PERMUTE", "TRANSPOSE"):
        via = permuted(node, after)
    elif after.node.op in ("RESHAPE", "CONT", "VIEW"):
        via = reshaped(node, after)
    else:
        return None
    return None if via is None else (after.labels, after.ne, via)


def walk(start, name: str, chains: dict, sizes: dict[str, int], layer: int | None, emit, depth: int = 0) -> None:
    """Map the nodes of chain `name` from its last node `start` back (module doc); emit(Mapped) for each."""
    steps = chains.get(name)
    if steps is None or start is None or depth > 8:
        return
    i = len(steps) - 1
    if start.op not in LAYOUT:
        while i >= 0 and start.op not in steps[i].ops:  # a role whose node is an earlier one (the dump ended)
            i -= 1
    node, after = start, None
    for _ in range(64):
        if node is None or i < 0:
            return
        st = steps[i]
        step_op = node.op in st.ops
        if not step_op and not (node.op in LAYOUT or (node.op == "GET_ROWS" and st.quantity == "rows"
                                                        and node.inputs[0] is not None)):
            return
        found = _via(node, after, sizes, st.quantity)
        m = None if found is None else Mapped(node, name, st.quantity, found[0], layer, key=st.key, via=found[2],
                                              base=found[1])
        if m is not None:
            m = emit(m) or m
        if not step_op:
            node, after = node.inputs[0], m
            continue
        nxt = None
        for s, target in enumerate(st.inputs(node.op)):
            if target == PREV:
                nxt = node.inputs[s]
            elif target is not None:
                walk(node.inputs[s], target, chains, sizes, layer, emit, depth + 1)
        node, after, i = nxt, None, i - 1


def copies(nodes, mapped: dict[int, object], sizes_of, emit) -> None:
    """Layout copies of mapped nodes, in graph order (Kcur's view that the store reads, V flattened for the
    transposed cache, GET_ROWS(out_ids) of a row role): the same values, located through the copy."""
    for n in nodes:
        if id(n) in mapped or n.inputs[0] is None or id(n.inputs[0]) not in mapped:
            continue
        src = mapped[id(n.inputs[0])]
        if n.op == "GET_ROWS" and src.quantity == "rows" and not src.via and n.ne[2] == n.ne[3] == 1:
            m = Mapped(n, src.role, "rows", src.labels, src.ref_layer, key=src.key)
        elif n.op in LAYOUT:
            if n.ne == src.node.ne and n.op != "PERMUTE" and n.op != "TRANSPOSE":
                via = src.via
            elif n.op in ("PERMUTE", "TRANSPOSE"):
                via = permuted(n, src)
            else:
                via = reshaped(n, src)
            if via is None:
                continue
            m = Mapped(n, src.role, src.quantity, src.labels, src.ref_layer, key=src.key, via=via, base=src.ne,
                       before=src.before)
        else:
            continue
        emit(m)
