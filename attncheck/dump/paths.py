"""Structural steps between the nodes roles.py names, found by op and shape: a q pre-scale (gemma, phi3), the
Hadamard rotation of a quantized KV cache (llama.cpp's llama_mul_mat_hadamard), the post-norm or residual scale of a
branch output (gemma, granite), the soft-cap and scale after the output projection (gemma2, granite)."""
from __future__ import annotations

from .records import Node

LAYOUT = {"VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE", "CONT"}  # ops that move values without computing
NORMS = ("NORM", "RMS_NORM")


def chain_back(start: Node | None) -> list[Node]:
    """start, then src0 after src0 through layout ops, ending at the first node that computes (included)."""
    out: list[Node] = []
    n = start
    while n is not None and len(out) < 32:
        out.append(n)
        if n.op not in LAYOUT:
            break
        n = n.inputs[0]
    return out


def rotation(n: Node | None, d_h: int | None) -> bool:
    """A Hadamard rotation (attn_inp_k_rot / attn_inp_v_rot): MUL_MAT of an unprinted square {r, r} input, r
    dividing the head dim, over an activation reshaped into rows of r; its result has the rows' shape."""
    if n is None or n.op != "MUL_MAT" or not n.unprinted(0) or n.inputs[1] is None or n.srcs[0] is None:
        return False
    r = n.srcs[0].ne
    return (r[0] == r[1] and r[2] == r[3] == 1 and bool(d_h) and d_h % r[0] == 0 and n.ne == n.inputs[1].ne
            and n.ne[0] == r[0] and n.inputs[1].op in LAYOUT)


def _per_head(n: Node, d_h: int | None, t: int) -> bool:
    return n.ne[0] == d_h and n.ne[2] == t and n.ne[3] == 1


def back_to_cur(start: Node | None, d_h: int | None, t: int) -> tuple[list[Node], dict[str, Node]]:
    """The chain back from an attention input towards its Qcur/Kcur/Vcur, through a q pre-scale (a SCALE of the
    per-head shape) and a KV-cache rotation: (the chain beyond them, {"scaled": the SCALE, "rot": the rotated
    per-head node}) — what is passed is named so that Qcur stays the RoPE output, as in every other model."""
    steps: dict[str, Node] = {}
    chain = chain_back(start)
    for _ in range(4):
        if not chain:
            break
        end = chain[-1]
        if rotation(end, d_h):
            shaped = [n for n in chain[:-1] if _per_head(n, d_h, t)]
            if shaped:
                steps.setdefault("rot", shaped[-1])
            chain = chain_back(end.inputs[1])
        elif end.op == "SCALE" and end.inputs[0] is not None and end.inputs[0].ne == end.ne and _per_head(end, d_h, t):
            steps.setdefault("scaled", end)
            chain = chain_back(end.inputs[0])
        else:
            break
    return chain, steps


def post_of(branch: Node, consumers: dict[int, list[Node]]) -> Node | None:
    """What a branch output becomes before its residual ADD, when anything: a post-norm (NORM or RMS_NORM, MUL by
    its weight, ADD of a bias; gemma2/3) or a SCALE (granite's residual_scale)."""
    c = consumers[id(branch)]
    if len(c) != 1:
        return None
    n = c[0]
    if n.op == "SCALE":
        return n
    if n.op not in NORMS:
        return None
    mul = next((x for x in consumers[id(n)] if x.op == "MUL" and x.inputs[0] is n and x.unprinted(1)), None)
    if mul is None:
        return None
    bias = next((x for x in consumers[id(mul)] if x.op == "ADD" and x.inputs[0] is mul and x.unprinted(1)), None)
    return bias or mul


def before_post(n: Node | None) -> Node | None:
    """The branch output a post-norm or residual SCALE (post_of) was applied to; None when n is neither."""
    if n is None:
        return None
    if n.op == "SCALE":
        return n.inputs[0]
    if n.op == "ADD" and n.unprinted(1) and n.inputs[0] is not None:
        n = n.inputs[0]
    if n.op == "MUL" and n.unprinted(1) and n.inputs[0] is not None and n.inputs[0].op in NORMS:
        return n.inputs[0].inputs[0]
    return None


def _after_matmul(n: Node) -> bool:
    """A node that may follow a weight MUL_MAT within one role, reading it as src0: the bias ADD (of a weight, not a
    printed node), a SCALE (logit scale, soft-cap), a TANH (soft-cap)."""
    return n.op in ("SCALE", "TANH") or (n.op == "ADD" and n.unprinted(1))


def output_chain(mm: Node, consumers: dict[int, list[Node]]) -> list[Node]:
    """The output's nodes as printed: the projection, then its bias ADD, logit SCALE, soft-cap SCALE/TANH/SCALE when
    present; the last holds the logits, unless the dump ends before them (llama.cpp's logger loses its tail)."""
    chain = [mm]
    for _ in range(8):
        n = chain[-1]
        nxt = [c for c in consumers[id(n)] if c.inputs[0] is n and _after_matmul(c)]
        if len(nxt) != 1 or len(consumers[id(n)]) != 1:
            break
        chain.append(nxt[0])
    return chain


def position_after_matmul(node: Node) -> int | None:
    """How many nodes that may follow a weight MUL_MAT (_after_matmul) lie between a node and the MUL_MAT it comes
    from, itself included: 0 for the MUL_MAT, 1 for its bias ADD (attn_out) or the node after the output projection (output_chain),
    ...; None when its sources do not lead back to a MUL_MAT that way."""
    k = 0
    while node is not None and node.op != "MUL_MAT":
        if not _after_matmul(node) or k >= 8:
            return None
        node, k = node.inputs[0], k + 1
    return None if node is None else k


def is_branch(n: Node | None) -> bool:
    """A branch output (a weight MUL_MAT, or its bias ADD), as opposed to a residual stream."""
    if n is not None and n.op == "ADD" and n.unprinted(1):
        n = n.inputs[0]
    return n is not None and n.op == "MUL_MAT" and n.unprinted(0) and n.inputs[1] is not None
