"""Records → evaluations, each with its attention sites (attention.py).

One evaluation is one run of the compute graph (one ubatch); with `-ub N` the node sequence repeats, and the
graph starting again (its first node recurring) is the only boundary mark. A `number of input tokens` line
starts a new llama.cpp run, and n_past starts again at 0.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import BinaryIO, Iterable, Iterator

from ..errors import DumpError
from .attention import RECURRENT_OPS, Site, find_sites, layer_of
from .names import Names
from .records import Node, Note, RunStart, Src, scan
from .sample import CUT_ADVICE, fits

# An evaluation's nodes are held until it ends (its graph is resolved then). llama.cpp's graph holds at most
# max(1024, 8·n_tensors) nodes for most architectures, max(40·n_tokens, 32·n_tensors) or max(160·n_tokens,
# 64·n_tensors) for the largest (src/llama-context.cpp, graph_max_nodes): 2^19 is 65,536 tensors, or a ubatch of 3,276
# tokens of the largest. Each node held costs about 1.3 KB, so an evaluation costs at most ~700 MB.
MAX_NODES = 1 << 19


def graph_start(name: str, op: str, src0: Src | None) -> tuple:
    """What the graph starting again is known by: its first node's name, op and first source's name (the source's ne,
    such as the token count, may change from ubatch to ubatch)."""
    return name, op, src0.name if src0 is not None else None


@dataclass(eq=False)
class Evaluation:
    """One evaluation of the graph: its nodes in print order, its attention sites, and where it sits in its run."""

    index: int  # 0-based over the whole dump
    run: int  # 0-based; a `number of input tokens` line starts a new run
    index_in_run: int
    n_past: int | None  # tokens of earlier evaluations of the same run (None once a T was unknown)
    tokens: tuple[int, ...] | None  # the run's token ids, when the log printed them
    runs_before: int = 0  # run starts read before it (0 for a part of a dump that continues a run)
    nodes: list[Node] = field(default_factory=list)
    sites: list[Site] = field(default_factory=list)
    flash: list[Node] = field(default_factory=list)  # FLASH_ATTN_EXT nodes: no scores or weights printed
    other_softmax: list[Node] = field(default_factory=list)  # SOFT_MAX that is not attention (MoE routers, pooling)
    damaged: list[int] = field(default_factory=list)  # lines of lost or garbled text within this evaluation
    damaged_names: dict[str, int] = field(default_factory=dict)  # node name → line of its damaged header
    lost: list[int] = field(default_factory=list)  # lines of damaged headers: nodes missing whole from `nodes`
    kinds: dict[int, str] | None = None  # layer_kinds(), where it is known before (dump/repeats.py's templates)
    template: bytes | None = None  # the key of the template it was made from, whose nodes it may hand back

    def __getstate__(self) -> dict:
        """What a worker process is sent (diff -j): the nodes without their links, as indices (a chain of inputs
        thousands of nodes deep would overflow pickle's recursion); __setstate__ links them and finds the sites
        again."""
        at = {id(n): i for i, n in enumerate(self.nodes)}
        link = lambda x: -1 if x is None else at[id(x)]  # noqa: E731
        nodes = [(n.name, n.type, n.op, n.srcs, n.ne, n.line, n.body, n.body_line, n.cut, link(n.inputs[0]),
                  link(n.inputs[1]), n.lost) for n in self.nodes]
        state = {k: v for k, v in self.__dict__.items() if k not in ("nodes", "sites", "flash", "other_softmax")}
        return {**state, "nodes": nodes}

    def __setstate__(self, state: dict) -> None:
        rows = state.pop("nodes")
        nodes = [Node(*row[:9]) for row in rows]
        for n, row in zip(nodes, rows):
            n.inputs = (None if row[9] < 0 else nodes[row[9]], None if row[10] < 0 else nodes[row[10]])
            n.lost = row[11]
        self.__dict__.update(state, nodes=nodes)
        self.sites, self.flash, self.other_softmax = find_sites(nodes)

    @property
    def T(self) -> int | None:
        """Queries in this evaluation: ne1 of kq, or ne2 of FLASH_ATTN_EXT ({D_h, H, T, 1})."""
        if self.sites:
            return self.sites[0].T
        if self.flash:
            return self.flash[0].ne[2]
        return None

    def flash_layers(self) -> dict[int, Node]:
        """The FLASH_ATTN_EXT nodes by layer: the layer their name says, or (an unnamed node_N) the layer of the cache
        view they read; a layer two of them would claim (layers sharing a cache) is left out, not guessed."""
        by: dict[int, list[Node]] = {}
        for f in self.flash:
            by.setdefault(layer_of(f, -1), []).append(f)
        return {L: fs[0] for L, fs in sorted(by.items()) if L >= 0 and len(fs) == 1}

    def layer_kinds(self) -> dict[int, str]:
        """What attention each numbered layer has: softmax, flash, recurrent (the op), or none; layers are read from
        the `-L` suffix of node names, the way llama.cpp names every node of layer L."""
        if self.kinds is not None:
            return dict(self.kinds)
        ops: dict[int, set[str]] = {}
        for n in self.nodes:
            layer = layer_of(n, -1)
            if layer >= 0:
                ops.setdefault(layer, set()).add(n.op)
        kinds = {L: next((f"recurrent ({op})" for op in RECURRENT_OPS if op in o), "none") for L, o in ops.items()}
        for s in self.sites:
            kinds[s.layer] = "softmax"
        for L in self.flash_layers():
            kinds[L] = "flash"
        kinds.pop(-1, None)
        return dict(sorted(kinds.items()))


class Dump:
    """A dump being read: iterate `evaluations()` once; `notes`, `runs` fill in as it is read."""

    def __init__(self, stream: BinaryIO, source: str, first_line: int = 1, final: bool = True):
        """first_line, final: a part of a dump (dump/parts.py) starts at that line; only the last part ends the
        dump (a site whose kqv is missing there is a cut, not a damaged graph)."""
        self.source = source
        self._stream = stream
        self.first_line = first_line
        self.final = final
        self.notes: list[Note] = []
        self.runs: list[RunStart] = []
        self.cut: Node | None = None  # the node the input ended inside, if any
        self._read = False
        self.bytes_read = 0
        self.newlines = 0  # read so far; at the end, the dump's last line is newlines (+1 without a final newline)
        self._final_newline = True

    @property
    def stream(self) -> BinaryIO:
        """The input, unread (verify reads it in parts)."""
        if self._read:
            raise RuntimeError("a dump is read once; call read_dump again")
        self._read = True
        return self._stream

    def _count(self, chunk: bytes) -> None:
        self.bytes_read += len(chunk)
        self.newlines += chunk.count(b"\n")
        if chunk:
            self._final_newline = chunk.endswith(b"\n")

    def evaluations(self) -> Iterator[Evaluation]:
        """Evaluations in order, each whole (its nodes resolved) before it is yielded, then dropped by the caller."""
        if self._read:
            raise RuntimeError("a dump is read once; call read_dump again")
        self._read = True
        return self._evaluations(scan(self._stream, self.source, self._count, self.first_line))

    def _evaluations(self, records: Iterable) -> Iterator[Evaluation]:
        current: Evaluation | None = None
        latest = Names()
        first_key: tuple | None = None
        run, index, in_run = -1, 0, 0
        n_past: int | None = 0
        tokens: tuple[int, ...] | None = None

        early: list[Note] = []  # damage read before an evaluation's first node (its first header the damaged one)
        split = False  # the header of an evaluation's first node came damaged: the next evaluation starts there
        lead: str | None = None  # the name of a run's first node whose header came damaged: its next print starts one

        def finish(ev: Evaluation, final: bool = False) -> Evaluation:
            ev.sites, ev.flash, ev.other_softmax = find_sites(ev.nodes)
            self._check_whole(ev, final)
            return ev

        def damage(ev: Evaluation, note: Note, names: Names) -> None:
            ev.damaged.append(note.line)
            if note.lost:
                ev.lost.append(note.line)
            if note.name:
                ev.damaged_names.setdefault(note.name, note.line)
                names.lose(note.name)

        for rec in records:
            if rec.__class__ is Note:
                self.notes.append(rec)
                if rec.lost and rec.name:  # an evaluation's first header lost: where evaluations start all the same
                    split = split or (current is not None and first_key is not None and rec.name == first_key[0])
                    lead = rec.name if current is None and first_key is None else lead
                if rec.damage and current is not None and not split:
                    damage(current, rec, latest)
                elif rec.damage:
                    early.append(rec)
                continue
            if rec.__class__ is RunStart:
                self.runs.append(rec)
                if current is not None:
                    yield finish(current)
                    index += 1
                current, latest, first_key, early, split, lead = None, Names(), None, [], False, None
                run, in_run, n_past, tokens = run + 1, 0, 0, rec.tokens
                continue
            node: Node = rec
            s0, s1 = node.srcs
            key = graph_start(node.name, node.op, s0)
            again = key == first_key or node.name == lead  # the graph starts again (its first header, or the one lost)
            if current is not None and (again or split):
                yield finish(current)
                T = current.T
                n_past = None if (T is None or n_past is None) else n_past + T
                index, in_run = index + 1, in_run + 1
                current, latest = None, Names()
                lead = None if node.name == lead else lead
            if current is None:
                if run < 0:
                    run = 0
                current = Evaluation(index, run, in_run, n_past, tokens, runs_before=len(self.runs))
                first_key = first_key if split else key  # a lost first header: the evaluations still start with it
                for note in early:
                    damage(current, note, latest)
                early, split = [], False
            node.inputs = (None if s0 is None else latest.source(node, 0),
                           None if s1 is None else latest.source(node, 1))
            if latest.lost:  # a header of this evaluation was damaged: does the node read the node it lost?
                node.lost = sum(1 << i for i, (s, found) in enumerate(zip(node.srcs, node.inputs))
                                if s is not None and found is None and s.name in latest.lost)
            latest.add(node)
            current.nodes.append(node)
            if len(current.nodes) > MAX_NODES:  # every node is held until its evaluation ends: memory has a ceiling
                raise DumpError(self.source, node.line, f"an evaluation of more than {MAX_NODES:,} nodes (from line "
                                                        f"{current.nodes[0].line}): more than llama.cpp's graph holds "
                                                        "for a model and ubatch a CPU runs (was an evaluation's start "
                                                        "lost?)")
            if node.cut and not self.final:  # a part ends between nodes: a node that does not end whole is damage
                node.cut = False
            if node.cut:
                self.cut = node
            elif not fits(node):  # a check that reads the node names the line; for the others, this is the word
                ne = ", ".join(map(str, node.ne))
                self.notes.append(Note(node.line, f"node '{node.name}' does not print as its ne {{{ne}}} says "
                                                  "(a line lost, repeated or garbled?)", damage=True))
                current.damaged.append(node.line)
        if current is not None:
            yield finish(current, final=self.final)


    def _check_whole(self, ev: Evaluation, final: bool) -> None:
        """The attention nodes a check needs must all be there: a dump cut or damaged among them is an error.

        What no check needs stays a warning; but a cut inside an attention MUL_MAT (two activations, not a weight),
        a SOFT_MAX no MUL_MAT(v, P) reads, or a SOFT_MAX or kq/kqv MUL_MAT reading a node whose header was lost, is
        named here.
        """
        src = self.source
        end = self.cut is not None and self.cut in ev.nodes
        last_line = self.cut.last_line if end else None
        for node in ev.nodes:
            if node.op not in ("MUL_MAT", "SOFT_MAX"):
                continue
            for i, (reads, found) in enumerate(zip(node.srcs, node.inputs)):
                if reads is None or found is not None:
                    continue
                other = node.inputs[1 - i]
                # attention's nodes: SOFT_MAX, and a MUL_MAT whose other input is an activation (kq, kqv), not a weight
                if node.op == "MUL_MAT" and other is None:
                    continue
                lost = ev.damaged_names.get(reads.name)
                if lost is None and node.op == "MUL_MAT" and i == 1 and ev.damaged:  # src1 is never a weight
                    lost = max((d for d in ev.damaged if d < node.line), default=None)
                if lost is not None and lost < node.line:
                    raise DumpError(src, lost, f"'{node.name}' (line {node.line}) reads '{reads.name}', whose "
                                               "header was lost or damaged here (interleaved output?)")
                if i == 0 and (node.op == "SOFT_MAX" or other.op == "SOFT_MAX"):  # the scores; MUL_MAT(v, P)'s V view
                    raise DumpError(src, node.line, f"'{node.name}' reads '{reads.name}', which is not printed before "
                                                    "it in this evaluation (its header line lost or damaged?)")
        if end and self.cut.op == "MUL_MAT" and all(i is not None for i in self.cut.inputs):
            raise DumpError(src, last_line, f"the dump ends inside node '{self.cut.name}', an attention MUL_MAT "
                                            f"(header at line {self.cut.line}); {CUT_ADVICE}")
        for s in ev.sites:
            if s.kqv is not None:
                continue
            if end and s.softmax is self.cut:
                raise DumpError(src, last_line, f"the dump ends inside node '{s.softmax.name}' "
                                                f"(header at line {s.softmax.line}); {CUT_ADVICE}")
            after = [d for d in ev.damaged if d > s.softmax.line]
            if after:
                raise DumpError(src, after[0], f"no MUL_MAT(v, P) reads '{s.softmax.name}' (line {s.softmax.line}): "
                                               "its header here was damaged (interleaved output?)")
            if final:
                raise DumpError(src, self._end_line(), f"the dump ends before a MUL_MAT(v, P) reads "
                                                       f"'{s.softmax.name}' (line {s.softmax.line}); {CUT_ADVICE}")
            raise DumpError(src, s.softmax.line, f"no MUL_MAT(v, P) reads '{s.softmax.name}' in this evaluation")

    def _end_line(self) -> int:
        """The dump's last line: every newline ends one, and text after the last newline is one more."""
        return self.first_line - 1 + self.newlines + (0 if self._final_newline else 1)


def read_dump(source: str | BinaryIO = "-", name: str | None = None) -> Dump:
    """Open a dump: a path, '-' for stdin, or a binary file object. Reading happens as evaluations are iterated."""
    import sys

    from .pipe import paced

    if hasattr(source, "read"):
        return Dump(source, name or getattr(source, "name", "<stream>"))  # type: ignore[arg-type]
    if source == "-":
        return Dump(paced(sys.stdin.buffer), name or "<stdin>")  # a pipe is read in few, large reads
    try:
        return Dump(open(source, "rb"), name or str(source))
    except OSError as e:
        raise DumpError(str(source), None, f"cannot read: {e.strerror}") from None
