"""What mapping.py finds in an evaluation, as records: a printed node with the reference quantity it shows and its axes
labelled (Mapped), and one layer's attention with its sizes and mapped nodes (Layer). Apart from mapping.py so that
chains.py, which mapping.py calls, builds them without importing it back."""
from __future__ import annotations

from dataclasses import dataclass

from ..dump.records import Node


@dataclass(frozen=True)
class Mapped:
    """A printed node, the reference quantity it shows, and its axes labelled (numpy order i2, i1, i0)."""

    node: Node
    role: str  # roles.py's name (q, Qcur, k_view, kq, kqv_out, l_out, ...) or that of the node it copies
    quantity: str  # a key of CANONICAL
    labels: tuple[str, str, str]  # of this node, or with `via` of the node whose values it copies
    ref_layer: int | None  # the reference layer (None for inp_embd, result_norm, result_output)
    key: str | None = None  # the reference's value it holds (Reference.get(layer, key)); None: the quantity's own
    via: tuple = ()  # grid.py transforms from this node's indices to those of the node `labels` describe
    base: tuple[int, ...] | None = None  # that node's ne (None: this node's own)
    before: bool = False  # a cache as it was before this evaluation's store (its slots from n_past on empty)

    @property
    def ne(self) -> tuple[int, ...]:
        """The ne `labels` describe."""
        return self.base or self.node.ne


@dataclass(frozen=True)
class Layer:
    """One layer's attention in one evaluation: its sizes (for the model's shape check) and the mapped nodes."""

    layer: int
    anchor: Node  # kq_soft_max, or FLASH_ATTN_EXT
    flash: bool
    H: int
    H_kv: int
    D_h: int
    n_kv: int
    T: int
    kv_type: str | None  # storage type of the K cache view (f16 by default)
    mapped: list[Mapped]
    v_type: str | None = None  # storage type of the V cache view
