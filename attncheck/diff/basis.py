"""Nodes two builds hold in different bases: today's llama.cpp rotates q and K by a Hadamard matrix before a quantized
K cache, and V before a quantized V cache, rotating the attention output back before the output projection
(src/llama-kv-cache.cpp, build_input_k_rot/_v_rot); 2024's does not. kq and the softmax weights are the same in
either basis (the rotation is orthonormal), q, the K and V views and stores, kqv and FLASH_ATTN_EXT's output are not:
compared element by element they would differ by the whole rotation. Such a pair is named as not comparable, and the
heads merged before the output projection are compared where both builds are back in the model's basis: the
unrotated side's kqv_out with the rotated side's kqv_unrot."""
from __future__ import annotations

from ..dump.roles import Role, Roles

# role names (and the names their derived roles start from) in the basis of the K rotation, and of the V rotation
K_BASIS = ("q", "k_view", "k_store")
V_BASIS = ("v_view", "v_store", "kqv", "flash_attn", "kqv_out")
PAIRED = {"kqv_out": "kqv_unrot", "kqv_unrot": "kqv_out"}  # what each side's output-projection input is called


def rotated(roles: Roles, layer: int | None) -> tuple[bool, bool]:
    """(K rotated, V rotated) in one evaluation's layer: whether its graph has the rotation nodes."""
    names = roles.layers[layer] if layer is not None and 0 <= layer < len(roles.layers) else {}
    return "q_rot" in names or "k_rot" in names, "v_rot" in names


def rebased(old: Roles, new: Roles) -> set[str]:
    """The cache types the two evaluations store in different bases: K's where one rotates K and the other does not,
    V's likewise (the drift model counts their own rounding: drift.unit_of_store)."""
    out: set[str] = set()
    for layer in range(min(len(old.layers), len(new.layers))):
        (k_old, v_old), (k_new, v_new) = rotated(old, layer), rotated(new, layer)
        for differs, view in ((k_old != k_new, "k_view"), (v_old != v_new, "v_view")):
            out |= {r[view].type for r in (old.layers[layer], new.layers[layer]) if differs and view in r}
    return out


def partner_key(role: Role, old: Roles, new: Roles) -> tuple | str | None:
    """For an OLD node's role: the key of its NEW partner when the bases move it (kqv_out ↔ kqv_unrot), a reason
    string when the pair is not comparable, None when the bases agree on it (the role's own key)."""
    if role.section != "layer":
        return None
    (k_old, v_old), (k_new, v_new) = rotated(old, role.layer), rotated(new, role.layer)
    base = role.name.split(".")[0]
    if k_old != k_new and base in K_BASIS:
        return _why("K", k_new)
    if v_old == v_new or base not in V_BASIS + ("kqv_unrot",):
        return None
    if role.ops == "" and role.name in PAIRED and (role.name == "kqv_unrot") == v_old:
        return (role.section, role.layer, PAIRED[role.name], "")  # both sides' output-projection input
    return _why("V", v_new)


def _why(which: str, new_rotates: bool) -> str:
    side, other = ("NEW", "OLD") if new_rotates else ("OLD", "NEW")
    return (f"in {side}'s basis rotated by the Hadamard matrix of its quantized {which} cache, which {other} does not "
            "rotate: not comparable element by element")
