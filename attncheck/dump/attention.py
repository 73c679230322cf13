"""An evaluation's nodes → its attention sites, found by op and by the sources headers name, never by fixed names:
a SOFT_MAX whose scores descend from MUL_MAT(k, q) and that a MUL_MAT(v, P) reads; and the layer each node belongs
to."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import NamedTuple

from .records import Node, NodeRef

# ops that pass scores through on their way to SOFT_MAX (kq_scaled, kq_tanh, kq_plus_kq_b, soft-capping)
_SCORE_PASSTHROUGH = {"SCALE", "TANH", "ADD", "MUL", "CPY", "CONT", "RESHAPE", "VIEW", "PERMUTE", "UNARY"}
_LAYOUT = {"VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE", "CONT", "CPY"}  # ops that move values without computing
# layers with these ops and no SOFT_MAX have attention of another kind (hybrid models: Mamba, RWKV, delta-net)
RECURRENT_OPS = ("GATED_DELTA_NET", "GATED_LINEAR_ATTN", "RWKV_WKV7", "RWKV_WKV6", "SSM_SCAN", "SSM_CONV")
_LAYER = re.compile(r"-(\d+)(?:\s|$)")
_CACHE_LAYER = re.compile(r"^cache_[kv]_l(\d+)(?:\s|$)")  # the KV cache's views: cache_k_l0 (view) (permuted)


@dataclass(eq=False)
class Site:
    """One layer's attention in one evaluation (flash attention off).

    kq:      MUL_MAT(k, q)          ne {n_kv, T, H, 1}    raw scores, not yet scaled
    softmax: SOFT_MAX(scores, mask) ne {n_kv, T, H, 1}    P = softmax(scores * kq_scale + mask)
    kqv:     MUL_MAT(v, softmax)    ne {D_v, T, H, 1}     O = P V per head
    k:       K cache view           ne {D_h, n_kv, H_kv, 1} (or Kcur itself without a cache)
    v:       V cache view           ne {n_kv, D_v, H_kv, 1}
    q:       queries                ne {D_h, T, H, 1}
    """

    layer: int
    softmax: Node
    scores: Node | None  # the node SOFT_MAX reads: kq itself, or kq_scaled etc.
    kq: Node | None
    k: Node | None
    q: Node | None
    kqv: Node | None
    v: Node | None
    # what its nodes' headers and sources fix, found once: a site made again from a template (dump/repeats.py)
    # keeps its nodes, and their headers and sources, with new lines and bodies
    _fixed: tuple | None = field(default=None, repr=False)

    @property
    def n_kv(self) -> int:
        return self.softmax.ne[0]

    @property
    def T(self) -> int:
        return self.softmax.ne[1]

    @property
    def H(self) -> int:
        return self.softmax.ne[2]

    @property
    def H_kv(self) -> int:
        if self.v is not None:
            return self.v.ne[2]
        return self.k.ne[2] if self.k is not None else self.H

    @property
    def D_h(self) -> int | None:
        if self.kq is not None and self.kq.srcs[0] is not None:
            return self.kq.srcs[0].ne[0]
        return self.kqv.ne[0] if self.kqv is not None else None

    @property
    def kv_cached(self) -> bool:
        """K comes from a KV cache: back from kq's src0 through views only, to a tensor the graph did not compute
        (the cache). Encoders read Kcur, computed in this graph, and have no cache."""
        n = self.k
        while n is not None and n.op in _LAYOUT:
            if n.inputs[0] is None:
                return True
            n = n.inputs[0]
        return n is None

    def q_scale_node(self) -> Node | None:
        """The SCALE node q passes through on its way to kq (gemma, phi3 pre-scale q), if printed."""
        n = self.q
        while n is not None and n.op in _LAYOUT:
            n = n.inputs[0]
        return n if n is not None and n.op == "SCALE" else None

    def info(self) -> "SiteInfo":
        """What the checks keep of the site: its sizes and its nodes' names and lines (no bodies, no graph)."""
        if self._fixed is None:
            self._fixed = ((self.layer, self.H, self.H_kv, self.T, self.n_kv, self.D_h, self.kv_cached),
                           (self.scores, self.kq, self.kqv, self.v, self.q_scale_node()))
        sizes, (scores, kq, kqv, v, q_scale) = self._fixed
        return SiteInfo(*sizes, self.softmax.ref, scores and scores.ref, kq and kq.ref, kqv and kqv.ref, v and v.ref,
                        q_scale and q_scale.ref)

    def steps(self) -> list[Node]:
        """The printed nodes between kq and SOFT_MAX, in graph order (soft-capping, a score bias ADD)."""
        out: list[Node] = []
        n = self.scores
        while n is not None and n is not self.kq:
            out.append(n)
            n = n.inputs[0]
        return out[::-1]


class SiteInfo(NamedTuple):
    """A Site as the checks keep it: sizes and node references, small and picklable (a worker process sends it);
    a NamedTuple, as one is made per site of every evaluation."""

    layer: int
    H: int
    H_kv: int
    T: int
    n_kv: int
    D_h: int | None
    kv_cached: bool
    softmax: NodeRef
    scores: NodeRef | None
    kq: NodeRef | None
    kqv: NodeRef | None
    v: NodeRef | None
    q_scale: NodeRef | None  # the SCALE node q passes through before kq, if printed


def layer_of(node: Node, fallback: int) -> int:
    """The layer a node's name says (`-L`); an unnamed node (node_21) belongs to the layer of what it reads."""
    s0, s1 = node.srcs
    layer = _named_layer(node.name, s0.name if s0 is not None else "", s1.name if s1 is not None else "")
    return fallback if layer is None else layer


@lru_cache(maxsize=8192)
def _named_layer(*names: str) -> int | None:
    for name in names:
        m = _LAYER.search(name)
        if m:
            return int(m.group(1))
    for name in names[1:]:  # an unnamed node (FLASH_ATTN_EXT as node_30) that reads the cache of a layer
        m = _CACHE_LAYER.match(name)
        if m:
            return int(m.group(1))
    return None


def _scores_matmul(softmax: Node) -> Node | None:
    """The MUL_MAT(k, q) behind a SOFT_MAX: back through the ops that pass scores on, to a MUL_MAT of two activations
    (a weight's MUL_MAT, as an MoE router's logits, has an unprinted src0 named `*.weight`)."""
    n = softmax.inputs[0]
    while n is not None and n.op != "MUL_MAT" and n.op in _SCORE_PASSTHROUGH:
        n = n.inputs[0]
    if n is None or n.op != "MUL_MAT" or n.inputs[1] is None:
        return None
    if n.inputs[0] is None and (n.srcs[0] is None or n.srcs[0].name.endswith(".weight")):
        return None
    return n


def find_sites(nodes: list[Node]) -> tuple[list[Site], list[Node], list[Node]]:
    """Attention sites of one evaluation, found by structure: a SOFT_MAX whose scores descend from MUL_MAT(k, q)
    and that a MUL_MAT(v, P) reads. Also the FLASH_ATTN_EXT nodes, and the SOFT_MAXes that are not attention."""
    sites: list[Site] = []
    flash: list[Node] = []
    other: list[Node] = []
    readers: dict[int, Node] = {}  # id(softmax) -> the first MUL_MAT that reads it as src1
    for node in nodes:
        if node.op == "MUL_MAT" and node.inputs[1] is not None and node.inputs[1].op == "SOFT_MAX":
            readers.setdefault(id(node.inputs[1]), node)
    for node in nodes:
        if node.op == "FLASH_ATTN_EXT":
            flash.append(node)
        if node.op != "SOFT_MAX":
            continue
        kq = _scores_matmul(node)
        if kq is None:
            other.append(node)
            continue
        kqv = readers.get(id(node))
        sites.append(
            Site(
                layer=layer_of(node, layer_of(kq, len(sites))),
                softmax=node,
                scores=node.inputs[0],
                kq=kq,
                k=kq.inputs[0],
                q=kq.inputs[1],
                kqv=kqv,
                v=kqv.inputs[0] if kqv is not None else None,
            )
        )
    return sites, flash, other
