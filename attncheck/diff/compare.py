"""Two dumps → per-node differences: nodes matched by (run, evaluation, layer, role), compared on the elements
printed in both (measure.py) under a tolerance (nodes.py: the drift of correct builds by default, drift.py; for
softmax weights, their scores' drift through the softmax, softmax.py; for kqv and kqv_out, the drift of V and of the
scores through the weighted mean, mean.py), and the first node where the builds diverge;
and each dump checked as `attncheck check` checks it (sides.py). Result objects only; render.py prints them.

The verdict: a NEW that check fails is a regression whatever the drift; so is a node beyond the tolerance (less
those in a layer where --model shows OLD off the reference and NEW on it); else the builds drift within it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from itertools import zip_longest
from typing import BinaryIO

from .align import Aligned, align, causal, geometry
from ..errors import DumpError
from ..dump.graph import Dump, Evaluation, read_dump
from ..dump.records import Node
from ..check.report import EXIT_FAIL, EXIT_INPUT, EXIT_PASS, EXIT_UNVERIFIED
from ..dump.roles import assign
from ..model.identity import same_model
from ..dump.sample import parse_sample, parse_samples
from .drift import DriftModel, Unit, cache_types, elementwise, roundings
from .measure import measure, store_scales, sum_diff
from .nodes import (ATOL, DRIFT_ORIGIN, EXACT, NMSE_MAX, NMSE_OTHER, NOT_COMPUTING, RTOL, NodeDiff, NodeRef, SumDiff,
                    Tolerance, Unmatched)
from . import mean
from .mean import ROW_ROLES, weighted_mean
from .softmax import NO_SCORES, SCORE_ROLES, pending

__all__ = ["ATOL", "DRIFT_ORIGIN", "EXACT", "NMSE_MAX", "NMSE_OTHER", "RTOL", "DiffReport", "NodeDiff", "NodeRef",
           "SumDiff", "Tolerance", "Unmatched", "diff"]


@dataclass
class DiffReport:
    old: str
    new: str
    prefix: bool
    tolerance: Tolerance
    nodes: list[NodeDiff] = field(default_factory=list)  # matched, in OLD's graph order
    only: list[Unmatched] = field(default_factory=list)
    tokens: list[tuple[tuple[int, ...] | None, tuple[int, ...] | None]] = field(default_factory=list)  # per run
    prompt: str = ""  # how the prompts compare: same | prefix | unknown
    prompt_note: str = ""
    evaluations: int = 0
    error: str = ""  # unusable pair (different models or prompts): exit 2
    warnings: list[str] = field(default_factory=list)
    model: DriftModel | None = None  # the drift model used (default tolerance)
    reference: object | None = None  # diff --model: reference.ReferenceDiff, per layer which side leaves the model
    sides: tuple | None = None  # (OLD, NEW) sides.Side: each dump checked as `check` (--model: `check --model`)
    paths: tuple[str, str] | None = None  # the files read, where they are not old and new (stdin spooled to a file)

    def to_dict(self) -> dict:
        """The JSON of `attncheck diff --json` (schema 1, kind diff)."""
        from .render import diff_dict

        return diff_dict(self)

    def path(self, side: str) -> str:
        """The file of side 'old' or 'new', to read again for its check."""
        return self.paths[side == "new"] if self.paths else getattr(self, side)

    @property
    def old_side(self):
        return self.sides[0] if self.sides else None

    @property
    def new_side(self):
        return self.sides[1] if self.sides else None

    @property
    def compared(self) -> list[NodeDiff]:
        return [n for n in self.nodes if not n.skipped]

    @property
    def diverged(self) -> list[NodeDiff]:
        """Nodes beyond the tolerance, less those in a layer where --model shows OLD off the reference and NEW on
        it (an upgrade that fixed what the old build got wrong)."""
        return [n for n in self.nodes if self._counts(n)]

    def _counts(self, n: NodeDiff) -> bool:
        ref = self.reference
        return n.diverged and (ref is None or not ref.fixed(n.evaluation, n.role.layer))  # type: ignore

    @property
    def first_divergent(self) -> NodeDiff | None:
        return next((n for n in self.nodes if self._counts(n)), None)

    @property
    def first_computed(self) -> NodeDiff | None:
        """The first divergent node that computes (not a view or a cache write of values computed before)."""
        return next((n for n in self.nodes if self._counts(n) and n.new.op not in NOT_COMPUTING), None)

    @property
    def exit_code(self) -> int:
        """2: unusable pair, or a NEW that check cannot read; 1: a regression; 0: drift; 3: nothing compared."""
        if self.error or (self.new_side is not None and self.new_side.error):
            return EXIT_INPUT
        if self.regression:
            return EXIT_FAIL
        return EXIT_PASS if self.compared else EXIT_UNVERIFIED

    @property
    def regression(self) -> str:
        """'check' when check fails NEW, else 'drift' when a node is beyond the tolerance, else ''."""
        if self.new_side is not None and self.new_side.failed:
            return "check"
        return "drift" if self.diverged else ""

    @property
    def identical(self) -> bool:
        """Every node of both dumps matched, and every printed element and sum the same."""
        return (bool(self.compared) and not self.only and not self.diverged
                and all(n.max_abs == 0 and (n.sum is None or n.sum.diff == 0) for n in self.compared))

    @property
    def verdict(self) -> str:
        return {EXIT_PASS: "pass", EXIT_FAIL: "fail", EXIT_INPUT: "error", EXIT_UNVERIFIED: "unverified"}[self.exit_code]

    @property
    def outcome(self) -> str:
        """The verdict in diff's words: identical | drift (pass) | regression (fail) | error | unverified."""
        code = self.exit_code
        if code == EXIT_PASS:
            return "identical" if self.identical else "drift"
        return {EXIT_FAIL: "regression", EXIT_INPUT: "error", EXIT_UNVERIFIED: "unverified"}[code]

    def groups(self) -> dict[tuple[int, str], list[NodeDiff]]:
        """Matched nodes per evaluation × layer (input and output are groups of their own), in graph order."""
        out: dict[tuple[int, str], list[NodeDiff]] = {}
        for n in self.nodes:
            out.setdefault((n.evaluation, n.role.group), []).append(n)
        return out

    def totals(self) -> dict[str, int]:
        g = self.groups().values()
        return {
            "evaluations": self.evaluations,
            "matched": len(self.nodes),
            "compared": len(self.compared),
            "diverged": len(self.diverged),
            "skipped": len(self.nodes) - len(self.compared),
            "elements_compared": sum(n.compared for n in self.nodes),
            "only_old": sum(u.side == "old" for u in self.only),
            "only_new": sum(u.side == "new" for u in self.only),
            "tests": len(g),
            "tests_failed": sum(any(self._counts(n) for n in ns) for ns in g),
            "tests_skipped": sum(all(n.skipped for n in ns) for ns in g),
        }


def diff(old: Dump | str | BinaryIO, new: Dump | str | BinaryIO, *, prefix: bool = False,
         tolerance: Tolerance = Tolerance(), weight_types: tuple[tuple[str, ...], str] | None = None,
         jobs: int = 1, check: bool = True, model: str | None = None,
         names: tuple[str | None, str | None] = (None, None)) -> DiffReport:
    """Compare two dumps node by node, and check each as `attncheck check` does; DumpError when either cannot be
    read for the node diff.

    weight_types: (ggml type names of the model's tensors, where they were read) for the drift model; by default
    from the logs' `- type` lines, when either printed them. jobs: processes diffing evaluation pairs (pool.py) and
    reading each dump for its check. check: each dump is read once more for its check, so old and new must be paths
    (check=False: the node diff alone, the softmax weights under drift.py's allowance). model: a GGUF, each side
    checked against its reference too (reference.py). names: what the report calls each side, where it is not its
    path (a spooled stdin: '<stdin>')."""
    from .pool import Pairs
    from .sides import check_both, kq_scales
    from .softmax import settle

    if check or model is not None:
        for path in (old, new):
            if not isinstance(path, (str, os.PathLike)) or str(path) == "-":
                raise ValueError("diff reads each dump twice (the node diff, then its check): give paths, "
                                 "or check=False")
    da = old if isinstance(old, Dump) else read_dump(old, names[0])
    db = new if isinstance(new, Dump) else read_dump(new, names[1])
    rep = DiffReport(da.source, db.source, prefix, tolerance)
    if any(names) and isinstance(old, (str, os.PathLike)) and isinstance(new, (str, os.PathLike)):
        rep.paths = (str(old), str(new))
    with Pairs(rep, jobs) as pairs:
        for ea, eb in zip_longest(da.evaluations(), db.evaluations()):
            if tolerance.drift and rep.model is None and ea is not None and eb is not None:
                rep.model = DriftModel(_unit(da, db, ea, eb, weight_types))
            if ea is None or eb is None:
                one, side = (ea, "old") if eb is None else (eb, "new")
                roles = assign(one)
                pairs.only([Unmatched(one.index, one.run, side, roles.role(n), n.ref) for n in one.nodes])
                rep.warnings.append(f"evaluation {one.index} (run {one.run}) is in {side.upper()} only")
                continue
            rep.error = _same_inputs(rep, ea, eb) or same_model(ea, eb, da.source, db.source)
            if rep.error:
                break
            rep.evaluations += 1
            pairs.diff(ea, eb)
            ea.nodes.clear()
            eb.nodes.clear()
    for d in (da, db):
        rep.warnings += [f"{d.source}:{n.line}: {n.message}" for n in d.notes]
    if rep.error:
        return rep
    if model is not None:
        from .reference import check_sides

        rep.reference = check_sides(rep, model, jobs)
        rep.sides = (rep.reference.old, rep.reference.new)
    elif check:
        rep.sides = check_both(rep, jobs)
    scales = kq_scales(rep.sides)
    settle(rep.nodes, scales, tolerance)
    mean.settle(rep.nodes, scales, rep.model, tolerance)
    return rep


def _unit(da: Dump, db: Dump, ea: Evaluation, eb: Evaluation, given: tuple | None) -> Unit:
    """The drift model's unit: from the given weight types, else either log's `- type` lines; and the caches."""
    caches = cache_types(ea, assign(ea)) | cache_types(eb, assign(eb))
    if given is not None:
        return Unit.of(given[0], caches, given[1])
    for d, side in ((da, "OLD"), (db, "NEW")):
        header = next((r.header for r in d.runs if r.header is not None), None)
        if header is not None and header.tensor_types:
            return Unit.of(header.tensor_types, caches, f"{side}'s log")
    return Unit.of(None, caches, "")


def _weights(ev: Evaluation) -> dict[str, tuple]:
    """Weights as headers name them: unprinted src0 of MUL_MAT and GET_ROWS, by GGUF tensor name."""
    return {n.srcs[0].name: n.srcs[0].ne for n in ev.nodes
            if n.op in ("MUL_MAT", "GET_ROWS") and n.srcs[0] is not None and n.inputs[0] is None}


def _same_inputs(rep: DiffReport, ea: Evaluation, eb: Evaluation) -> str:
    """'' when the two evaluations ran the same model on the same (or, with --prefix, an extended) prompt."""
    wa, wb = _weights(ea), _weights(eb)
    bad = [k for k in sorted(wa.keys() & wb.keys()) if wa[k] != wb[k]]
    if bad:
        k = bad[0]
        return (f"different models: weight '{k}' is {_ne(wa[k])} in OLD and {_ne(wb[k])} in NEW"
                f"{f' ({len(bad) - 1} more weights differ)' if len(bad) > 1 else ''}")
    if wa and wb and not wa.keys() & wb.keys():
        return "different models: the two dumps have no weight in common"
    if (ea.run, ea.index_in_run) != (eb.run, eb.index_in_run):
        return f"the evaluations do not line up: OLD evaluation {ea.index} is run {ea.run}, NEW's is run {eb.run}"
    ta, tb = ea.tokens, eb.tokens
    if ea.index_in_run == 0:
        rep.tokens.append((ta, tb))
        if ta is not None and tb is not None:
            extends = ta[: len(tb)] == tb or tb[: len(ta)] == ta
            if ta != tb and not (rep.prefix and extends):
                hint = "; one extends the other: pass --prefix" if extends else ""
                return f"different prompts: token ids {list(ta)} in OLD, {list(tb)} in NEW{hint}"
            if rep.prompt != "unknown":
                rep.prompt = "prefix" if ta != tb or rep.prompt == "prefix" else "same"
        else:
            which = "neither dump" if ta is None and tb is None else "OLD" if ta is None else "NEW"
            rep.prompt = "unknown"
            rep.prompt_note = (f"the prompt could not be compared: {which} printed no token ids (older llama.cpp "
                               "format); nodes are aligned by role")
    if ea.T != eb.T and not rep.prefix:
        return (f"different prompts: evaluation {ea.index} has T = {ea.T} queries in OLD and {eb.T} in NEW "
                "(diff needs the same prompt and -ub; --prefix if one prompt extends the other)")
    if ea.n_past != eb.n_past:
        return f"the evaluations do not line up: evaluation {ea.index} starts at n_past {ea.n_past} in OLD, {eb.n_past} in NEW"
    return ""


def _diff_evaluation(rep: DiffReport, ea: Evaluation, eb: Evaluation, src_a: str, src_b: str) -> None:
    ra, rb = assign(ea), assign(eb)
    ka, kb = (roundings(ea), roundings(eb)) if rep.model is not None else ({}, {})
    by_key = {rb.role(n).key: n for n in eb.nodes}
    matched: set[int] = set()
    partner: dict[int, Node] = {}  # id(OLD node) -> the NEW node it was matched with
    floors = store_scales(ea, ra, src_a) if rep.model is not None else {}
    sites = mean.Sites()  # per layer, the drift of the scores and V rows a weighted mean averages through
    T_short = min(t for t in (ea.T, eb.T) if t is not None) if (ea.T or eb.T) is not None else None
    geometries: dict = {}
    scores: dict[int, tuple[NodeDiff, Aligned]] = {}  # id(OLD node) → its diff and elements, of what SOFT_MAX reads
    output = _output_pairs(ra.output, rb.output)
    both = [*ea.nodes, *eb.nodes]  # every printed node of both sides parsed in one pass (dump/sample.py)
    parsed = {id(n): s for n, s in zip(both, parse_samples(both)) if s is not None}
    for a in ea.nodes:
        role = ra.role(a)
        b = output[id(a)] if id(a) in output else by_key.get(role.key)
        if b is not None and role.kind == "other" and ((a.op, a.ne) != (b.op, b.ne)
                                                       or not _same_reads(a, b, partner)):
            # a catch-all role is matched by position only: not across nodes of another op or shape, nor when they
            # read other nodes (a damaged or cut dump moves its catch-alls: the output norm into the last layer)
            b = None
        if b is not None and a.op != b.op and a.op not in NOT_COMPUTING and b.op not in NOT_COMPUTING:
            b = None  # another computation in the same place (a dump cut before a bias ADD): not comparable
        if b is None or id(b) in matched:
            rep.only.append(Unmatched(ea.index, ea.run, "old", role, a.ref))
            continue
        matched.add(id(b))
        partner[id(a)] = b
        nd = NodeDiff(ea.index, ea.run, role, a.ref, b.ref, n_past=ea.n_past or 0)
        if rep.model is not None:
            nd.roundings = max(ka.get(id(a), 0), kb.get(id(b), 0))
            nd.allowed = rep.model.rho(nd.roundings, role.name)
        al = _diff_node(nd, rep, (a, ra, ea, src_a), (b, rb, eb, src_b), T_short,
                        floors.get((role.layer, role.name), 0.0), geometries, parsed)
        if rep.model is not None and al is not None:
            if role.name in SCORE_ROLES:
                scores[id(a)] = (nd, al)
            elif elementwise(role.name):
                s = a.inputs[0]
                both = s is not None and id(s) in scores and partner.get(id(s)) is b.inputs[0]
                nd.pending = pending(al, scores[id(s)][1], scores[id(s)][0], rep.tolerance) if both else None
                nd.note = "" if nd.pending is not None else NO_SCORES
                if both:
                    sites.scores(scores[id(s)][0], scores[id(s)][1], b.ne[0], rep.tolerance)
            elif role.name in ROW_ROLES:
                sites.rows(nd, al, rep.tolerance)
            elif weighted_mean(role.name):
                nd.pending = sites.pending(role.layer, al, floors.get((role.layer, "v_store")))
                nd.note = "" if nd.pending is not None else mean.NO_SCORES
        rep.nodes.append(nd)
    rep.only += [Unmatched(eb.index, eb.run, "new", rb.role(n), n.ref) for n in eb.nodes if id(n) not in matched]


def _output_pairs(a: tuple[Node, ...], b: tuple[Node, ...]) -> dict[int, Node | None]:
    """id(OLD node) → its NEW partner among the output's nodes, when one dump prints fewer of them (llama.cpp's
    logger lost the tail before the logits): the nodes at the same place after the projection compute the same, and
    OLD's nodes beyond NEW's last have no partner. Roles name the output's nodes back from its last, which would
    pair the logits with what the shorter dump printed last. Empty when both print as many."""
    if len(a) == len(b) or not a or not b:
        return {}
    return {id(x): (b[k] if k < len(b) else None) for k, x in enumerate(a)}


def _same_reads(a: Node, b: Node, partner: dict[int, Node]) -> bool:
    """a and b read the same things: each printed source of a was matched with b's source in its place, and an
    unprinted source (a weight) is unprinted on both sides."""
    return all((x is None and y is None) or (x is not None and partner.get(id(x)) is y)
               for x, y in zip(a.inputs, b.inputs))


def _diff_node(nd: NodeDiff, rep: DiffReport, side_a: tuple, side_b: tuple, T_short: int | None,
               scale_floor: float = 0.0, geometries: dict | None = None,
               parsed: dict | None = None) -> Aligned | None:
    """Measure one node pair (or say why it is skipped); the elements compared, None when skipped. parsed: Samples
    already parsed, by id of their node (parse_samples; a node it left is parsed here)."""
    (a, ra, _, src_a), (b, rb, _, src_b) = side_a, side_b
    role, tol = nd.role, rep.tolerance
    if rep.prefix and (id(a) in ra.after_out_ids or id(b) in rb.after_out_ids):
        nd.skipped = "rows re-selected by out_ids: not fixed by causality"
        return None
    if a.quantized or b.quantized:
        nd.skipped = f"{a.type if a.quantized else b.type}: quantized tensors print no values"
        return None
    try:
        sa = (parsed or {}).get(id(a)) or parse_sample(a, src_a)
        sb = (parsed or {}).get(id(b)) or parse_sample(b, src_b)
    except DumpError as e:
        nd.skipped = f"not readable: {e}"
        return None
    ga, gb = _geometries(geometries if geometries is not None else {}, role.layer, side_a, side_b)
    al = align(sa, sb, role, ga, gb)
    if isinstance(al, str):
        nd.skipped = al
        return None
    nd.how = al.how
    if rep.prefix and T_short is not None:
        keep = causal(al, role, b, gb, T_short)
        if isinstance(keep, str):
            nd.skipped = keep
            return None
        if not keep.any():
            nd.skipped = "no printed element is fixed by causality"
            return None
        al = Aligned(al.how, al.keys[keep], al.old[keep], al.new[keep], al.axes)
    measure(nd, al, tol, scale_floor)
    if a.ne == b.ne and not rep.prefix:  # a sum covers elements causality may not fix
        nd.sum = sum_diff(sa, sb, tol, nd.allowed * nd.scale)  # softmax: drift.py's allowance, each row sums to 1
    return al


def _geometries(memo: dict, layer: int | None, side_a: tuple, side_b: tuple) -> tuple:
    """Both sides' geometry of a layer, computed once per evaluation (a layer's nodes share it) and kept in memo."""
    if layer not in memo:
        (_, ra, ea, _), (_, rb, eb, _) = side_a, side_b
        memo[layer] = geometry(ra, layer, ea.T, ea.n_past), geometry(rb, layer, eb.T, eb.n_past)
    return memo[layer]


def _ne(ne) -> str:
    return "{" + ", ".join(map(str, ne)) + "}"
