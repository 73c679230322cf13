"""The README's examples are the tool's own output: every fenced block whose first line is `$ command` is run (in a
scratch folder that sees the repository's fixtures/, with `attncheck` on PATH, 120 columns as in a CI log) and its
output must be the rest of the block. Lines are compared without trailing spaces; a line `...` stands for any lines
(an excerpt). `python3 tests/test_readme.py --write` rewrites the blocks without `...` from the tool's output."""
from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if __name__ == "__main__":  # --write: the tool of this checkout
    sys.path.insert(0, str(ROOT))
import attncheck  # noqa: E402

README = ROOT / "README.md"
TOOL = Path(attncheck.__file__).resolve().parents[1]  # the checkout whose attncheck is under test
BLOCK = re.compile(r"^```[^\n]*\n(\$ .*?)^```", re.M | re.S)


def examples(text: str) -> list[tuple[list[str], list[str], tuple[int, int]]]:
    """(commands, expected output lines, span of the block's body in the text) of every example block."""
    out = []
    for m in BLOCK.finditer(text):
        lines = m.group(1).splitlines()
        n = next(i for i, line in enumerate(lines) if not line.startswith("$ ")) if any(
            not line.startswith("$ ") for line in lines) else len(lines)
        out.append(([line[2:] for line in lines[:n]], lines[n:], m.span(1)))
    return out


def run_example(commands: list[str], scratch: Path) -> list[str]:
    """stdout and stderr of the commands, run one after another in bash in the scratch folder."""
    bin_dir = scratch / "bin"
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / "attncheck"
    tool.write_text(f"#!/bin/sh\nexec {sys.executable} -m attncheck \"$@\"\n")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    if not (scratch / "fixtures").exists():
        (scratch / "fixtures").symlink_to(ROOT / "fixtures")
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "NO_COLOR", "CI")}
    env.update(COLUMNS="120", PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
               PYTHONPATH=f"{TOOL}{os.pathsep}{env.get('PYTHONPATH', '')}")
    proc = subprocess.run(["bash", "-c", "\n".join(commands)], cwd=scratch, env=env, capture_output=True, text=True,
                          timeout=300)
    return [line.rstrip() for line in (proc.stdout + proc.stderr).rstrip("\n").splitlines()]


def matches(expected: list[str], got: list[str]) -> bool:
    """The output is the expected lines, where `...` stands for any lines."""
    expected = [line.rstrip() for line in expected]
    if "..." not in expected:
        return expected == got
    parts, current = [], []
    for line in expected:
        if line == "...":
            parts.append(current)
            current = []
        else:
            current.append(line)
    parts.append(current)
    at = 0
    for k, part in enumerate(parts):
        if k == 0:
            if got[:len(part)] != part:
                return False
            at = len(part)
            continue
        if k == len(parts) - 1:
            return len(got) - at >= len(part) and (not part or got[len(got) - len(part):] == part)
        found = next((i for i in range(at, len(got) - len(part) + 1) if got[i:i + len(part)] == part), None)
        if found is None:
            return False
        at = found + len(part)
    return True


ALL = examples(README.read_text(encoding="utf-8"))


def test_the_readme_has_its_examples():
    commands = [c for cmds, _, _ in ALL for c in cmds]
    for wanted in ("attncheck fixtures/gpt2-how-are.txt", "attncheck bad.txt", "attncheck inspect",
                   "attncheck diff fixtures/gpt2-how-are-you.txt fixtures/gpt2-kv-f32.txt -q", "attncheck list"):
        assert any(c.startswith(wanted) for c in commands), wanted


@pytest.mark.parametrize("commands, expected", [(c, e) for c, e, _ in ALL], ids=[c[-1][:60] for c, _, _ in ALL])
def test_a_readme_example_prints_what_the_readme_shows(commands, expected, tmp_path):
    got = run_example(commands, tmp_path)
    assert matches(expected, got), "\n".join(["README:", *expected, "", "attncheck:", *got])


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:  # refresh the blocks that hold a whole output
    import tempfile

    text = README.read_text(encoding="utf-8")
    for commands, expected, (a, b) in reversed(ALL):
        if "..." in expected:
            continue
        with tempfile.TemporaryDirectory() as d:
            got = run_example(commands, Path(d))
        text = text[:a] + "".join(f"$ {c}\n" for c in commands) + "".join(f"{line}\n" for line in got) + text[b:]
    README.write_text(text, encoding="utf-8")
