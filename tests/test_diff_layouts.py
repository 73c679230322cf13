"""diff lines up two views of the K or V cache held in different orders by logical index (slot, dim, KV head),
never by flat index, and says so when the lengths cannot tell the axes apart."""
from __future__ import annotations

from conftest import FIXTURES, attncheck as run

HOW_ARE = FIXTURES / "gpt2-how-are.txt"


def test_diff_lines_up_v_caches_of_two_layouts_by_logical_index():
    """Flash attention keeps V as {D_h, H_kv, n_kv}, the other path transposed {n_kv, H_kv, D_h}: same model, same
    prompt, same V values, so layer 0's V views agree element by element."""
    r = run("diff", FIXTURES / "gpt2-flash-attn.txt", HOW_ARE, "--json", "-")
    doc = r.json()
    views = {n["role"]: n for n in doc["nodes"] if n["layer"] == 0 and n["role"] in ("v_view", "v_view.src0")}
    assert views["v_view.src0"]["old"]["ne"] == [64, 12, 256, 1] and views["v_view.src0"]["new"]["ne"] == [256, 12, 64, 1]
    for n in views.values():
        assert (n["compared"], n["diverged"], n["max_abs"], n["matched_by"]) == (216, False, 0.0, "index")
        assert set(n["worst"]["at"]) == {"slot", "dim", "kv_head"}
    text = run("diff", FIXTURES / "gpt2-flash-attn.txt", HOW_ARE).out
    assert "flat" not in text and "v_view" not in "".join(line for line in text.splitlines() if "DIFF" in line
                                                          and line.startswith(" 0/0"))


def test_cache_axes_that_lengths_cannot_tell_apart_are_not_lined_up():
    from attncheck.diff.align import kv_axes

    assert kv_axes((64, 12, 256, 1), (256, 64, 12)) == ("dim", "kv_head", "slot", "")
    assert kv_axes((256, 1, 64, 1), (256, 64, 1)) == ("slot", "", "dim", "")
    assert kv_axes((64, 64, 12, 1), (64, 64, 12)) is None  # n_kv = D_h: which axis is which is unknown
