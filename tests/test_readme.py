"""The examples of README.md and of docs/*.md are the tool's own output: every fenced block whose first line is
`$ command` is run (in a scratch folder that sees the repository's fixtures/, with `attncheck` on PATH, 120 columns
as in a CI log) and its output must be the rest of the block. Lines are compared without trailing spaces; a line
`...` stands for any lines (an excerpt). `python3 tests/test_readme.py --write` rewrites the blocks without `...`
from the tool's output. The README's set-up commands are those CI runs, and the README stays a page a newcomer
reads to the end (under 200 lines)."""
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
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]  # every page whose examples are run
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


ALL = [(page, *ex) for page in PAGES for ex in examples(page.read_text(encoding="utf-8"))]


def commands_of(page: Path) -> list[str]:
    return [c for p, cmds, _, _ in ALL if p == page for c in cmds]


@pytest.mark.parametrize("page, wanted", [
    # the README's three uses, reading the table, and what to do after a FAIL
    ("README.md", ("attncheck fixtures/gpt2-how-are.txt", "attncheck check fixtures/gpt2-long.txt", "attncheck bad.txt",
                   "attncheck inspect fixtures/gpt2-how-are.txt", "attncheck diff old.txt new.txt",
                   "attncheck diff fixtures/drift/phi3-cat.old.txt")),
    ("docs/check.md", ("attncheck check fixtures/gpt2-long.txt",)),
    ("docs/diff.md", ("attncheck diff old.txt new.txt", "attncheck diff old.txt bad.txt",
                      "attncheck diff fixtures/gpt2-how-are-you.txt fixtures/gpt2-kv-f32.txt -q --exact")),
    ("docs/inspect.md", ("attncheck inspect fixtures/gpt2-how-are.txt --layer 0 --head 0",)),
    ("docs/list.md", ("attncheck list fixtures/gpt2-how-are.txt", "attncheck list fixtures/gpt2-ubatch2.txt")),
])
def test_each_page_has_its_examples(page, wanted):
    commands = commands_of(ROOT / page)
    for w in wanted:
        assert any(c.startswith(w) for c in commands), f"{page}: {w}"


@pytest.mark.parametrize("page, commands, expected", [(p, c, e) for p, c, e, _ in ALL],
                         ids=[f"{p.name}: {c[-1][:60]}" for p, c, _, _ in ALL])
def test_an_example_prints_what_its_page_shows(page, commands, expected, tmp_path):
    got = run_example(commands, tmp_path)
    assert matches(expected, got), "\n".join([f"{page.relative_to(ROOT)}:", *expected, "", "attncheck:", *got])


def test_the_readme_set_up_commands_are_those_ci_runs():
    """The two set-up commands of the README, word for word; CI installs the same extra and runs the same target."""
    text = README.read_text(encoding="utf-8")
    for line in ("pip install . && attncheck fixtures/gpt2-how-are.txt", "pip install '.[test]' && make test"):
        assert f"```\n{line}\n```" in text, line
    assert "\ntest = [" in (ROOT / "pyproject.toml").read_text(encoding="utf-8")  # the [test] extra
    assert re.search(r"(?m)^test:\n\t.*pytest", (ROOT / "Makefile").read_text(encoding="utf-8"))
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "pip install" in ci and "'.[test]'" in ci and "\nmake test\n" in ci


def test_the_readme_is_a_page_a_newcomer_reads_to_the_end():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) < 200, len(lines)
    for heading in ("## Install", "## Get llama-eval-callback", "## Reading the table", "## Exit codes",
                    "## After a FAIL", "## A CI recipe"):
        assert heading in lines, heading
    for page in ("check", "diff", "inspect", "list", "run", "format", "numerics", "architectures"):
        assert f"(docs/{page}.md)" in "\n".join(lines), page


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:  # refresh the blocks that hold a whole output
    import tempfile

    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for commands, expected, (a, b) in reversed(examples(text)):
            if "..." in expected:
                continue
            with tempfile.TemporaryDirectory() as d:
                got = run_example(commands, Path(d))
            text = text[:a] + "".join(f"$ {c}\n" for c in commands) + "".join(f"{line}\n" for line in got) + text[b:]
        page.write_text(text, encoding="utf-8")
