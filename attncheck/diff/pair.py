"""One pair of evaluations diffed into a report: each OLD node matched with its NEW partner by role, compared on the
elements printed in both (measure.py) under the report's tolerance. A pure function of the pair and the report's
settings, so that pool.py can run it in a worker process."""
from __future__ import annotations

from .align import Aligned, align, causal, geometry
from ..dump.graph import Evaluation
from ..errors import DumpError
from ..dump.records import Node
from ..dump.roles import assign
from ..dump.sample import parse_sample, parse_samples
from .drift import elementwise, roundings
from .measure import measure, store_scales, sum_diff
from .nodes import NOT_COMPUTING, NodeDiff, Unmatched
from . import basis, mean
from .mean import ROW_ROLES, weighted_mean
from .report import DiffReport
from .softmax import NO_SCORES, SCORE_ROLES, pending


def diff_evaluation(rep: DiffReport, ea: Evaluation, eb: Evaluation, src_a: str, src_b: str) -> None:
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
    printed = [*ea.nodes, *eb.nodes]  # every printed node of both sides parsed in one pass (dump/sample.py)
    parsed = {id(n): s for n, s in zip(printed, parse_samples(printed)) if s is not None}
    for a in ea.nodes:
        role = ra.role(a)
        moved = basis.partner_key(role, ra, rb)  # the builds hold it in different bases (basis.py)
        b = output[id(a)] if id(a) in output else by_key.get(moved if isinstance(moved, tuple) else role.key)
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
        if isinstance(moved, str):
            nd.skipped = moved
            rep.nodes.append(nd)
            continue
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
