"""Hostile dump text (issue 25): a run of digits, a line or a field beyond anything llama.cpp prints. Each case
ends in one error line at its line (exit 2), in bounded time and memory.

The digit runs are made by the test inside a real dump (fixtures/gpt2-how-are.txt): a row of kq_soft_max-0, which
the softmax check parses. No real dump holds such a line; an attacker's or a corrupted log can.
"""
from __future__ import annotations

import re

import pytest

from conftest import FIXTURES
from dumpedit import DumpEdit
from hostile import attncheck_cmd, measured

HOW_ARE = FIXTURES / "gpt2-how-are.txt"


def _one_error(r, path) -> int:
    """The line of the one `attncheck: error: PATH:LINE: ...` line of a run that exited 2."""
    assert not r.timed_out and r.code == 2, (r.code, r.err[-2000:])
    lines = r.err.splitlines()
    assert len(lines) == 1 and "Traceback" not in r.err, r.err[-2000:]
    m = re.match(rf"attncheck: error: {re.escape(str(path))}:(\d+): ", lines[0])
    assert m, lines[0][:300]
    return int(m.group(1))


@pytest.mark.parametrize("where", ["own-word", "inside-a-number"])
def test_a_megabyte_of_digits_in_a_checked_row_is_an_error_at_its_line(where, tmp_path):
    """A row of 10^6 digits: the line-by-line search for the damage was quadratic in the run's length (1 MB: more
    than 300 s); bounded, it takes a fraction of a second. 20 s is the limit: the quadratic search needs ~30 s for
    a run of 10^5 digits already. A number of more than 39 integer digits is damage too: llama.cpp prints floats."""
    edit = DumpEdit(HOW_ARE, tmp_path / "d.txt")
    row = edit.node("kq_soft_max-0").rows[2]
    text = edit.lines[row]
    edit.lines[row] = "      " + "7" * 10**6 if where == "own-word" else text[:20] + "1" * 10**6 + text[20:]
    path = edit.save()
    r = measured(attncheck_cmd("check", path, "-j", "1"), timeout=20)
    assert _one_error(r, path) == row + 1


def test_a_value_of_40_integer_digits_is_damage(tmp_path):
    """FLT_MAX prints with 39 integer digits; a 40th cannot come from llama.cpp (it would read as 1e39 or inf)."""
    edit = DumpEdit(HOW_ARE, tmp_path / "d.txt")
    line = edit.line_of("kq_soft_max-0", (1, 1, 0))
    edit.set("kq_soft_max-0", (1, 1, 0), "1" * 40 + ".0000")
    path = edit.save()
    assert _one_error(measured(attncheck_cmd("check", path), timeout=60), path) == line
