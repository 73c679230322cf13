"""Edit single printed values in a copy of a real llama.cpp dump, by logical position.

llama.cpp (`common/debug.cpp`) prints a tensor of ne {n0, n1, n2, n3} as nested `[` blocks (one per i3, one per
i2 inside it, one row line per i1, each row listing i0). Along every dimension with more than 6 entries only the
indices 0, 1, 2 and n-3, n-2, n-1 are printed, with a `...,` line (between blocks or rows) or a `...,` item (inside
a row) where the middle was skipped. Values are `%12.4f`; a `sum = %f` line closes each i3 block.

This module maps a logical element (i2, i1, i0) -- for attention nodes (head, query, slot) or (head, query, dim) --
to the printed row line and the item in it, and rewrites that one value with the same `%12.4f` formatting, so a
test can change exactly one number of a real dump and nothing else. It is written independently of attncheck's
own parser on purpose: a test helper that shared the parser would share its bugs.

    edit = DumpEdit(FIXTURES / "gpt2-how-are.txt", tmp_path / "dump.txt")
    old = edit.get("kq_soft_max-0", (0, 1, 1))          # head 0, query 1, slot 1
    edit.set("kq_soft_max-0", (0, 1, 1), old + 0.002)
    edit.save()
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

EDGE = 3  # llama.cpp prints the first and last 3 indices of a dimension longer than 2 * EDGE

_PREFIX = re.compile(r"^(?:common_debug_cb_eval|ggml_debug): ")
_NAME = re.compile(r"^(?:common_debug_cb_eval|ggml_debug): (.*?) = \(")
_NE = re.compile(r"\) = \{(\d+), (\d+), (\d+), (\d+)\}\s*$")
_TYPE_SRC0 = re.compile(r" = \((\w+)\) *[A-Z0-9_]+\(([^{]*)\{")  # `= (f32)    MUL_MAT(src0{...`
_VALUE = re.compile(r"-?(?:\d+\.\d+|nan|inf)")
_SUM = re.compile(r"^(\s*sum = )(\S+)")


def printed(n: int) -> list[int]:
    """Logical indices llama.cpp prints along a dimension of n entries."""
    return list(range(n)) if n <= 2 * EDGE else [*range(EDGE), *range(n - EDGE, n)]


def fmt(value: float) -> str:
    """`%12.4f` as llama.cpp prints it (Python's % follows C; for `-nan`, which Python never prints, pass the text)."""
    return "%12.4f" % value


@dataclass
class NodeText:
    """Where one printed node sits in the file (0-based line indices into DumpEdit.lines)."""

    name: str
    header: int  # line index of the header
    ne: tuple[int, int, int, int]
    type: str  # f32, f16, ...
    src0: str  # the name of its first source ('' if none)
    rows: list[int]  # line index of every printed row, in print order
    sums: list[int]  # line index of each `sum = ` line

    @property
    def line(self) -> int:
        """1-based line number of the header, as attncheck reports it."""
        return self.header + 1


class DumpEdit:
    """A copy of a dump, loaded as lines, edited by logical element, written back with save()."""

    def __init__(self, src: str | Path, dst: str | Path):
        self.src, self.path = Path(src), Path(dst)
        # latin-1 maps every byte to one character: whatever else the log holds comes back byte for byte
        self.lines = self.src.read_bytes().decode("latin-1").split("\n")
        self._index: tuple[int, dict[str, list[int]]] | None = None  # (line count, name -> header line indices)
        self._nodes: dict[tuple[str, int], NodeText] = {}

    # --- finding nodes -------------------------------------------------------------------------------------
    def headers(self, name: str) -> list[int]:
        """Line indices of every header of a node so named (the name field exactly, not a prefix of it)."""
        if self._index is None or self._index[0] != len(self.lines):  # value edits keep lines; cuts do not
            index: dict[str, list[int]] = {}
            for i, text in enumerate(self.lines):
                m = _NAME.match(text)
                if m:
                    index.setdefault(m.group(1).strip(), []).append(i)
            self._index, self._nodes = (len(self.lines), index), {}
        return list(self._index[1].get(name, []))

    def node(self, name: str, occurrence: int = 0) -> NodeText:
        """The occurrence-th node of that name in the file (with -ub, occurrence k is evaluation k)."""
        found = self.headers(name)
        if (name, occurrence) in self._nodes:
            return self._nodes[name, occurrence]
        if occurrence >= len(found):
            raise KeyError(f"{name!r}: {len(found)} headers, no occurrence {occurrence}")
        h = found[occurrence]
        m = _NE.search(self.lines[h])
        if not m:
            raise ValueError(f"line {h + 1}: no ne at the end of the header of {name!r}")
        ne = tuple(int(x) for x in m.groups())
        tm = _TYPE_SRC0.search(self.lines[h])
        type_, src0 = (tm.group(1), tm.group(2).strip()) if tm else ("", "")
        rows, sums = [], []
        for i in range(h + 1, len(self.lines)):
            text = self.lines[i]
            if _PREFIX.match(text):
                break
            if not text[:1].isspace():  # a log line interleaved by 2>&1: printed lines never start in column 0
                continue
            s = text.strip()
            if s.startswith("[") and s != "[":
                rows.append(i)
            elif _SUM.match(text):
                sums.append(i)
                if len(sums) == ne[3]:
                    break
        n0, n1, n2, n3 = ne
        expected = n3 * len(printed(n2)) * len(printed(n1)) if n0 else 0
        if n0 and len(rows) != expected:
            raise ValueError(f"{name!r} at line {h + 1}: {len(rows)} printed rows, ne {ne} makes {expected}")
        node = self._nodes[name, occurrence] = NodeText(name, h, ne, type_, src0, rows, sums)  # type: ignore[arg-type]
        return node

    def source0(self, name: str, occurrence: int = 0) -> NodeText:
        """The node a header names as its first source: the latest earlier node so called."""
        node = self.node(name, occurrence)
        before = [h for h in self.headers(node.src0) if h < node.header]
        if not before:
            raise KeyError(f"{name!r} at line {node.line}: no earlier node named {node.src0!r}")
        return self.node(node.src0, len(before) - 1)

    # --- one element ---------------------------------------------------------------------------------------
    def locate(self, name: str, index: tuple[int, int, int], occurrence: int = 0, i3: int = 0) -> tuple[int, int]:
        """(line index, position among the row's numbers) of logical element (i2, i1, i0) of block i3.

        Raises LookupError when llama.cpp did not print that element.
        """
        node = self.node(name, occurrence)
        n0, n1, n2, n3 = node.ne
        i2, i1, i0 = index
        p0, p1, p2 = printed(n0), printed(n1), printed(n2)
        for logical, shown, n, what in ((i0, p0, n0, "i0"), (i1, p1, n1, "i1"), (i2, p2, n2, "i2")):
            if not 0 <= logical < n:
                raise IndexError(f"{name!r}: {what} = {logical} outside 0..{n - 1}")
            if logical not in shown:
                raise LookupError(f"{name!r}: {what} = {logical} is not printed (only {shown})")
        row = (i3 * len(p2) + p2.index(i2)) * len(p1) + p1.index(i1)
        line = node.rows[row]
        values = _VALUE.findall(self.lines[line])
        if len(values) != len(p0):
            raise ValueError(f"line {line + 1}: {len(values)} values, expected {len(p0)}")
        return line, p0.index(i0)

    def line_of(self, name: str, index: tuple[int, int, int], occurrence: int = 0) -> int:
        """1-based line number of the printed row holding the element."""
        return self.locate(name, index, occurrence)[0] + 1

    def get(self, name: str, index: tuple[int, int, int], occurrence: int = 0) -> float:
        line, k = self.locate(name, index, occurrence)
        return float(_VALUE.findall(self.lines[line])[k])

    def set(self, name: str, index: tuple[int, int, int], value: float | str, occurrence: int = 0) -> float:
        """Rewrite one printed value (a float, printed %12.4f; or literal text such as 'nan' or '0.12.34',
        right-aligned to 12 like llama.cpp's field). Returns the old value."""
        line, k = self.locate(name, index, occurrence)
        text = self.lines[line]
        m = list(_VALUE.finditer(text))[k]
        new = fmt(value) if not isinstance(value, str) else value.rjust(12)
        # the field is %12.4f: the number right-aligned in 12 columns, spaces before it
        start = m.start()
        if m.end() - 12 >= 0 and text[m.end() - 12 : m.start()].strip() == "":
            start = m.end() - 12
        self.lines[line] = text[:start] + new + text[m.end():]
        return float(m.group())

    def add(self, name: str, index: tuple[int, int, int], delta: float, occurrence: int = 0) -> tuple[float, float]:
        """Change one printed value by delta; returns (old, new) as printed."""
        old = self.get(name, index, occurrence)
        new = float(fmt(old + delta))
        self.set(name, index, new, occurrence)
        return old, new

    # --- the sum line --------------------------------------------------------------------------------------
    def sum_line(self, name: str, occurrence: int = 0, i3: int = 0) -> int:
        node = self.node(name, occurrence)
        return node.sums[i3]

    def get_sum(self, name: str, occurrence: int = 0) -> float:
        return float(_SUM.match(self.lines[self.sum_line(name, occurrence)]).group(2))

    def set_sum(self, name: str, value: float, occurrence: int = 0) -> float:
        """Rewrite the `sum = %f` line of a node; returns the old value."""
        i = self.sum_line(name, occurrence)
        m = _SUM.match(self.lines[i])
        self.lines[i] = m.group(1) + "%f" % value + self.lines[i][m.end():]
        return float(m.group(2))

    def add_sum(self, name: str, delta: float, occurrence: int = 0) -> tuple[float, float]:
        old = self.get_sum(name, occurrence)
        new = float("%f" % (old + delta))
        self.set_sum(name, new, occurrence)
        return old, new

    # --- whole lines ---------------------------------------------------------------------------------------
    def set_header_ne(self, name: str, ne: tuple[int, int, int, int], occurrence: int = 0) -> None:
        """Rewrite the node's own ne at the end of its header (its sources keep theirs)."""
        h = self.node(name, occurrence).header
        m = _NE.search(self.lines[h])
        self.lines[h] = self.lines[h][: m.start()] + ") = {%d, %d, %d, %d}" % ne + self.lines[h][m.end():]
        self._index = None

    def truncate(self, line: int, keep: int | None = None) -> None:
        """Cut the file after 0-based line index `line`; keep the first `keep` characters of that line
        (None: the whole line, without its newline)."""
        last = self.lines[line] if keep is None else self.lines[line][:keep]
        self.lines = self.lines[:line] + [last]
        self._index = None

    def insert(self, line: int, texts: list[str], replace: int = 0) -> None:
        """Put whole lines at 0-based line index `line`, replacing `replace` lines there (interleaved output)."""
        self.lines[line : line + replace] = texts
        self._index = None

    def save(self) -> Path:
        self.path.write_bytes("\n".join(self.lines).encode("latin-1"))
        return self.path


def single_faults(edit: DumpEdit, weights: str, kqv: str) -> list[tuple[str, int, tuple[int, int, int], float]]:
    """(node, occurrence, (head, query, slot or dim), new value) for every printed element of a kq_soft_max and a kqv
    node, in every occurrence (evaluation): a masked weight (printed 0) set to 0.01, a visible one moved by 0.002
    towards 0.5, a kqv element moved by 0.01. Each is far beyond its bound where the check can see it."""
    out = []
    for name in (weights, kqv):
        for occ in range(len(edit.headers(name))):
            ne = edit.node(name, occ).ne
            for index in ((h, t, j) for h in printed(ne[2]) for t in printed(ne[1]) for j in printed(ne[0])):
                old = edit.get(name, index, occ)
                if name == kqv:
                    new = old + 0.01
                elif old == 0.0:
                    new = 0.01
                else:
                    new = old + (0.002 if old < 0.5 else -0.002)
                out.append((name, occ, index, new))
    return out
