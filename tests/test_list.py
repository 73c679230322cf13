"""`attncheck list` on dumps of several evaluations: an evaluation whose layers repeat those of the evaluation printed
in full before it is one row (`as eval E`), -v prints every layer, and --json always has every row."""
from __future__ import annotations

from conftest import FIXTURES, attncheck

UBATCH = FIXTURES / "gpt2-ubatch2.txt"  # 3 evaluations of the same 2 layers (ubatch 2, prompt of 6 tokens)


def body(out: str) -> list[str]:
    """The table's rows: the lines between its ─── rule and the first blank line."""
    lines = out.splitlines()
    rule = next(i for i, line in enumerate(lines) if "────" in line)
    rows = []
    for line in lines[rule + 1:]:
        if not line.strip():
            break
        rows.append(line)
    return rows


def evaluation_rows(rows: list[str]) -> dict[int, list[str]]:
    """The table's rows by evaluation: a row with its eval number begins an evaluation, blank-eval rows continue it."""
    out: dict[int, list[str]] = {}
    for row in rows:
        if row[:5].strip():
            current = int(row.split()[0])
            out[current] = []
        out[current].append(row)
    return out


def layers(rows: list[str]) -> list[str]:
    """The layer column of an evaluation's layer rows (layer, attention, a node and its line, H, H_kv, D_h, n_kv)."""
    return [row.split()[-8] for row in rows if len(row.split()) >= 8]


def test_evaluations_that_repeat_the_first_are_one_row_each():
    r = attncheck("list", UBATCH)
    assert r.code == 0
    evals = evaluation_rows(body(r.out))
    assert sorted(evals) == [0, 1, 2]
    full = "\n".join(evals[0])
    for name in ("kq-0 (497)", "kq_soft_max-0 (526)", "kqv-0 (555)", "kq-1 (1171)", "kqv-1 (1229)"):
        assert name in full
    assert layers(evals[0]) == ["0", "1"]
    for ev, n_past, nodes, lines in ((1, "2", "83", "lines 1885..2617"), (2, "4", "80", "lines 3273..4005")):
        (row,) = evals[ev]
        assert row.split()[:6] == [str(ev), "0", n_past, "2", nodes, "0..1"], row
        assert "as eval 0" in row and lines in row
    assert "kq-0 (1885)" not in r.out and "kqv-1 (4005)" not in r.out
    assert "2 evaluations on one row: layers as in the eval named; -v lists every layer" in r.out


def test_verbose_lists_every_layer_of_every_evaluation():
    r = attncheck("list", UBATCH, "-v")
    assert r.code == 0
    evals = evaluation_rows(body(r.out))
    assert sorted(evals) == [0, 1, 2]
    for ev, first in ((0, "kq-0 (497)"), (1, "kq-0 (1885)"), (2, "kq-0 (3273)")):
        assert len(evals[ev]) == 6 and first in evals[ev][0]  # 2 layers × 3 nodes, each on a line
        assert layers(evals[ev]) == ["0", "1"]
    assert "kqv-1 (4005)" in r.out and "as eval" not in r.out and "on one row" not in r.out


def test_json_has_every_row_with_or_without_verbose():
    plain, verbose = attncheck("list", UBATCH, "--json", "-"), attncheck("list", UBATCH, "-v", "--json", "-")
    assert plain.code == verbose.code == 0
    assert plain.json() == verbose.json()
    (doc,) = plain.json()["dumps"]
    assert doc["evaluations"] == 3
    assert [(row["evaluation"], row["layer"]) for row in doc["rows"]] == [(e, la) for e in range(3) for la in (0, 1)]
    assert [row["lines"][0] for row in doc["rows"]] == [497, 1171, 1885, 2559, 3273, 3947]
    assert "as eval" not in plain.out


def test_an_evaluation_is_compared_with_the_last_one_printed_in_full(tmp_path):
    # gpt2 (3 evaluations), then llama (8 heads, 2 KV heads), then gpt2 again: the second gpt2 differs from the
    # llama evaluation before it, so it is printed in full, and its repeats are as it, not as eval 0
    joined = tmp_path / "joined.txt"
    joined.write_bytes(b"".join(p.read_bytes() for p in (UBATCH, FIXTURES / "llama-gqa-draw.txt", UBATCH)))
    r = attncheck("list", joined)
    evals = evaluation_rows(body(r.out))
    assert sorted(evals) == list(range(7))
    assert [len(evals[e]) for e in range(7)] == [6, 1, 1, 6, 6, 1, 1]
    assert all("as eval 0" in evals[e][0] for e in (1, 2))
    assert all("as eval 4" in evals[e][0] for e in (5, 6))
    assert "4 evaluations on one row" in r.out
