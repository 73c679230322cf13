"""Two dumps → per-node differences: nodes matched by (run, evaluation, layer, role), compared on the elements
printed in both (measure.py) under a tolerance (nodes.py: the drift of correct builds by default, drift.py; for
softmax weights, their scores' drift through the softmax, softmax.py; for kqv and kqv_out, the drift of V and of the
scores through the weighted mean, mean.py), and the first node where the builds diverge;
and each dump checked as `attncheck check` checks it (sides.py). The work on each pair of evaluations is pair.py's,
run here or in worker processes (pool.py); the result is report.py's DiffReport, which render.py prints.

The verdict: a NEW that check fails is a regression whatever the drift; so is a node beyond the tolerance (less
those in a layer where --model shows OLD off the reference and NEW on it); else the builds drift within it.
"""
from __future__ import annotations

import os
from itertools import zip_longest
from typing import BinaryIO

from ..dump.records import ne_text
from ..dump.graph import Dump, Evaluation, read_dump
from ..dump.roles import assign
from ..model.identity import same_model
from .drift import DriftModel, Unit, cache_types
from .report import DiffReport
from .nodes import (ATOL, DRIFT_ORIGIN, EXACT, NMSE_MAX, NMSE_OTHER, RTOL, DiffTolerance, NodeDiff, NodeRef,
                    SumDiff, Unmatched)
from . import basis, mean

__all__ = ["ATOL", "DRIFT_ORIGIN", "EXACT", "NMSE_MAX", "NMSE_OTHER", "RTOL", "DiffReport", "DiffTolerance", "NodeDiff",
           "NodeRef", "SumDiff", "Unmatched", "diff"]


def diff(old: Dump | str | BinaryIO, new: Dump | str | BinaryIO, *, prefix: bool = False,
         tolerance: DiffTolerance = DiffTolerance(), weight_types: tuple[tuple[str, ...], str] | None = None,
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
    ra, rb = assign(ea), assign(eb)
    caches, moved = cache_types(ea, ra) | cache_types(eb, rb), basis.rebased(ra, rb)
    if given is not None:
        return Unit.of(given[0], caches, given[1], moved)
    for d, side in ((da, "OLD"), (db, "NEW")):
        header = next((r.header for r in d.runs if r.header is not None), None)
        if header is not None and header.tensor_types:
            return Unit.of(header.tensor_types, caches, f"{side}'s log", moved)
    return Unit.of(None, caches, "", moved)


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
        return (f"different models: weight '{k}' is {ne_text(wa[k])} in OLD and {ne_text(wb[k])} in NEW"
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
