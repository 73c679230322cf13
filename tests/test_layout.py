"""The package layout keeps its import order: what everything shares at the bottom, the dump-only and --model
checkers beside each other, verify above both, inspect/diff/cli on top (docs/internals.md); `check/` is the dump-only
checker that only verify and the command line reach into; no two modules import each other, however indirectly;
modules stay small."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "attncheck"

# layer of each top-level part: a module may import parts of its own layer or below, never above, and `check`
# and `model` never each other
LAYER = {"errors": 0, "precision": 0, "commands": 0, "results": 1, "report": 1, "arch": 1, "dump": 1, "checker": 2,
         "sites": 2, "check": 3, "model": 3, "present": 3, "verify": 4, "listing": 4, "inspect": 5, "diff": 5,
         "cli": 6, "__init__": 6, "__main__": 7}
# the parts that may import the dump-only checker's modules besides itself: verify drives it (and hands inspect the
# facts it pins and the recomputations of one head), the command line builds its options
INTO_CHECK = {"check", "verify", "cli"}
MAX_LINES = 400


def _module(path: Path) -> str:
    """attncheck.dump.graph for attncheck/dump/graph.py; attncheck.diff for attncheck/diff/__init__.py."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in PACKAGE.rglob("*.py")}


def _part(module_path: Path) -> str:
    rel = module_path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py")


def _targets(path: Path) -> set[str]:
    """The attncheck modules a module imports, at its top or inside a function (relative imports resolved; a name
    imported from a package is its module when it is one; attncheck's __version__ is no module)."""
    tree = ast.parse(path.read_text())
    me = _module(path).split(".")
    package = me if path.name == "__init__.py" else me[:-1]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in MODULES)
            continue
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package[: len(package) - (node.level - 1)]
            target = [*base, *(node.module.split(".") if node.module else [])]
        elif node.module and node.module.split(".")[0] == "attncheck":
            target = node.module.split(".")
        else:
            continue
        for alias in node.names:
            if alias.name == "__version__":
                continue
            name = ".".join([*target, alias.name])
            out.add(name if name in MODULES else ".".join(target))
    return out - {_module(path)}


def _imports(path: Path) -> set[str]:
    """The top-level parts of attncheck a module imports."""
    return {t.split(".")[1] for t in _targets(path) if t != "attncheck"}


def test_every_part_has_a_layer():
    parts = {_part(p) for p in PACKAGE.rglob("*.py")}
    assert parts <= set(LAYER), sorted(parts - set(LAYER))


def test_imports_go_down():
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        me = _part(path)
        for other in _imports(path) - {me}:
            if LAYER.get(other, 99) > LAYER[me] or {me, other} == {"check", "model"}:
                wrong.append(f"{path.relative_to(PACKAGE)} imports {other}")
    assert not wrong, wrong


def test_only_verify_and_the_command_line_reach_into_check():
    wrong = [f"{p.relative_to(PACKAGE)}" for p in PACKAGE.rglob("*.py")
             if _part(p) not in INTO_CHECK and "check" in _imports(p)]
    assert not wrong, wrong


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative): each a circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_cycle_finder_finds_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles():
    """No module imports one that imports it back, directly or through others, not even inside a function: a
    circle makes two modules one, and the order they load in matters."""
    edges = {m: _targets(p) & set(MODULES) for m, p in MODULES.items()}
    edges["attncheck"] = set()  # the package's __init__ imports the public names of everything; nothing needs it
    assert cycles(edges) == []


def test_no_architecture_names_outside_the_table():
    """What attncheck knows per architecture lives in arch/: no other module compares with an architecture name."""
    names = ('"gpt2"', '"llama"', "'gpt2'", "'llama'")
    found = [f"{p.relative_to(PACKAGE)}:{i}" for p in PACKAGE.rglob("*.py") if p.parts[-2] != "arch"
             for i, line in enumerate(p.read_text().splitlines(), 1) if any(n in line for n in names)]
    assert not found, found


def test_modules_stay_small():
    big = [f"{p.relative_to(PACKAGE)}: {n}" for p in PACKAGE.rglob("*.py")
           if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert not big, big
