"""The package layout keeps its import order: what everything shares at the bottom, the dump-only and --model
checkers beside each other, verify above both, inspect/diff/cli on top (docs/internals.md)."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "attncheck"

# layer of each top-level part: a module may import parts of its own layer or below, never above, and `check`
# and `model` never each other
LAYER = {"errors": 0, "precision": 0, "commands": 0, "results": 1, "report": 1, "arch": 1, "dump": 1, "checker": 2,
         "sites": 2, "check": 3, "model": 3, "present": 3, "verify": 4, "listing": 4, "inspect": 5, "diff": 5,
         "cli": 6, "__init__": 6, "__main__": 7}


def _part(module_path: Path) -> str:
    rel = module_path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py")


def _imports(path: Path) -> set[str]:
    """The top-level parts of attncheck a module imports (relative imports resolved)."""
    tree = ast.parse(path.read_text())
    depth = len(path.relative_to(PACKAGE).parts) - 1
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            up = node.level - 1  # levels above the module's own package
            base = list(path.relative_to(PACKAGE).parts[:depth])
            base = base[: len(base) - up] if up else base
            target = [*base, *(node.module.split(".") if node.module else [])]
            if target:
                out.add(target[0])
            else:  # `from .. import x`: x is a part
                out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("attncheck."):
            out.add(node.module.split(".")[1])
    return out


def test_every_part_has_a_layer():
    parts = {_part(p) for p in PACKAGE.rglob("*.py")}
    assert parts <= set(LAYER), sorted(parts - set(LAYER))


def test_imports_go_down():
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        me = _part(path)
        for other in _imports(path) - {me, "__version__"}:
            if LAYER.get(other, 99) > LAYER[me] or {me, other} == {"check", "model"}:
                wrong.append(f"{path.relative_to(PACKAGE)} imports {other}")
    assert not wrong, wrong


def test_no_architecture_names_outside_the_table():
    """What attncheck knows per architecture lives in arch/: no other module compares with an architecture name."""
    names = ('"gpt2"', '"llama"', "'gpt2'", "'llama'")
    found = [f"{p.relative_to(PACKAGE)}:{i}" for p in PACKAGE.rglob("*.py") if p.parts[-2] != "arch"
             for i, line in enumerate(p.read_text().splitlines(), 1) if any(n in line for n in names)]
    assert not found, found


def test_modules_stay_small():
    big = [f"{p.relative_to(PACKAGE)}: {n}" for p in PACKAGE.rglob("*.py")
           if (n := len(p.read_text().splitlines())) > 450]
    assert not big, big
