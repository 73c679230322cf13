"""The documentation points at what exists: every file a page, a docstring or a comment names (a path ending .py,
.md, .txt or .toml that looks like one of this repository's), every section of a docs page named as `§N`, every
option of every command's --help on that command's page, and every architecture of the table in
docs/architectures.md."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import attncheck
from attncheck.arch.table import ARCHS

ROOT = Path(attncheck.__file__).resolve().parents[1]  # the checkout under test
DOCS = ROOT / "docs"
SKIP_DIRS = {".git", "build", "__pycache__", ".pytest_cache", ".hypothesis"}
SCANNED = (".py", ".md", ".toml", ".sh", ".html", ".css", ".js", ".cfg")  # text that may name a file
# a path: optional ../, folders, a name with one of the extensions; not followed by more of a name (`.txt.xz`)
REF = re.compile(r"(?<![\w./-])((?:\.\./)*(?:[\w.-]+/)*[\w.-]+\.(?:py|md|txt|toml))(?![\w/-]|\.\w)")
SECTION = re.compile(r"(?<![\w-])(?:docs/)?([\w-]+\.md),? §(\d+(?:\.\d+)?)|\[§(\d+(?:\.\d+)?)\]\(([\w-]+\.md)\)")
HEADING = re.compile(r"(?m)^#+ (\d+(?:\.\d+)?)\.?\s")


def repository_files() -> list[Path]:
    """Every file of the checkout (tracked or not), outside build output and caches."""
    out = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        out += [Path(folder, f) for f in files]
    return out


FILES = repository_files()
RELATIVE = {f.relative_to(ROOT).as_posix() for f in FILES}
TOP = {r.split("/")[0] for r in RELATIVE if "/" in r}
PACKAGE = {p.name for p in (ROOT / "attncheck").iterdir() if p.is_dir()}
FIXTURE_DIRS = {p.name for p in (ROOT / "fixtures").iterdir() if p.is_dir()}


def scanned() -> list[Path]:
    """The files whose text may point at a file: code, docs, the build files (not the dumps themselves)."""
    return [f for f in FILES if (f.suffix in SCANNED or f.name == "Makefile" or f.relative_to(ROOT).as_posix() ==
                                 ".ci/run") and not f.relative_to(ROOT).as_posix().startswith("fixtures/")]


def looks_like_ours(ref: str) -> bool:
    """A path of this repository's shape: under one of its folders (or the package's, or a fixture folder), or going
    up out of the file's folder; or a bare module or page name. A bare `x.txt` is a scratch file of an example, and a
    path under another root (llama.cpp's src/, ggml/) is not ours."""
    if ref.startswith("../"):
        return True
    if "/" in ref:
        return ref.split("/")[0] in TOP | PACKAGE | FIXTURE_DIRS
    return not ref.endswith(".txt")


def resolves(ref: str, source: Path) -> bool:
    """The file exists: from the repository's root, from the naming file's folder, from the package or fixtures/, or,
    for a bare name or a partial path, as the end of some file's path."""
    for base in (ROOT, source.parent, ROOT / "attncheck", ROOT / "fixtures"):
        target = Path(os.path.normpath(base / ref))
        if ROOT in target.parents and target.is_file():
            return True
    return not ref.startswith("../") and any(r.endswith("/" + ref) for r in RELATIVE)


def references() -> list[tuple[str, int, str]]:
    out = []
    for f in scanned():
        text = f.read_text(encoding="utf-8", errors="replace")
        for n, line in enumerate(text.splitlines(), 1):
            for m in REF.finditer(line):
                out.append((f.relative_to(ROOT).as_posix(), n, m.group(1)))
    return out


def test_every_file_named_exists():
    refs = references()
    assert len(refs) > 300  # the scan reads the code and the docs (a broken scan would pass everything)
    missing = [f"{src}:{n}: {ref}" for src, n, ref in refs if looks_like_ours(ref) and not resolves(ref, ROOT / src)]
    assert not missing, "\n".join(missing)


def test_a_missing_file_is_caught():
    """The rules above catch the kinds of reference that went stale: a module that was renamed, a folder beside the
    repository, a page that was never written."""
    src = ROOT / "attncheck" / "check" / "render.py"
    stale = ("model_checks" ".py", "arch/gguf_facts" ".py", "../shared/FORMAT" ".md", "FORMAT" ".md",
             "tests/test_weight_types" ".py")  # split: this file must not name them itself
    for ref in stale:
        assert looks_like_ours(ref) and not resolves(ref, src), ref
    for ref in ("bounds.py", "dump/pool.py", "attncheck/model/layer0.py", "drift/phi3-cat.old.txt", "../README.md"):
        assert resolves(ref, DOCS / "check.md" if ref.startswith("..") else src), ref


def test_every_section_named_exists():
    bad = []
    for f in scanned():
        text = f.read_text(encoding="utf-8", errors="replace")
        for n, line in enumerate(text.splitlines(), 1):
            for m in SECTION.finditer(line):
                page, section = (m.group(1), m.group(2)) if m.group(1) else (m.group(4), m.group(3))
                target = DOCS / page
                if not target.is_file():
                    if f.parent == DOCS or "docs/" in line:
                        bad.append(f"{f.relative_to(ROOT)}:{n}: {page} §{section}: no such page")
                    continue
                if section not in HEADING.findall(target.read_text(encoding="utf-8")):
                    bad.append(f"{f.relative_to(ROOT)}:{n}: {page} has no section {section}")
    assert not bad, "\n".join(bad)


def help_text(*command: str) -> str:
    out = subprocess.run([sys.executable, "-m", "attncheck", *command, "--help"], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}, check=True).stdout
    return " ".join(out.split())


@pytest.mark.parametrize("command", ["check", "diff", "inspect", "list", "run"])
def test_each_command_page_names_every_option(command):
    page = (DOCS / f"{command}.md").read_text(encoding="utf-8")
    options = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", help_text(command))) - {"--help"}
    assert options
    missing = sorted(o for o in options if f"`{o}" not in page and f", {o}" not in page)
    assert not missing, f"docs/{command}.md does not name {missing}"
    assert "## Exit codes" in page or "## Exit" in page


def test_model_help_names_the_families_with_a_reference_forward_pass():
    text = help_text("check")
    said = text[text.index("--model GGUF"):text.index("--tokens")]
    for name, arch in ARCHS.items():
        if arch.forward is not None:
            assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", said), name
        else:
            assert not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", said), name


def test_the_architecture_page_lists_the_table():
    page = (DOCS / "architectures.md").read_text(encoding="utf-8")
    rows = re.findall(r"(?m)^\| ([\w, -]+?) \|", page)
    named = {n.strip() for r in rows for n in r.split(",")}
    assert set(ARCHS) <= named, sorted(set(ARCHS) - named)


def test_the_page_picture_is_made_by_the_script_the_docs_name():
    """docs/html-page.png is drawn from the page as it is by scripts/page_picture.py (the browser test runs it), and
    the page that shows the picture says how to make it again."""
    page = (DOCS / "html.md").read_text(encoding="utf-8")
    script = (ROOT / "scripts" / "page_picture.py").read_text(encoding="utf-8")
    assert "](html-page.png)" in page and "scripts/page_picture.py" in page
    assert '"docs" / "html-page.png"' in script  # its default output is the picture the page shows
    assert (DOCS / "html-page.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
