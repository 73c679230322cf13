"""`diff --html`: two dumps compared, as a page. Per evaluation, a strip of the compared nodes in graph order (each
coloured by the tolerance it needed, the first divergent node outlined, a link to its row), and a table of every
compared node with the tolerance it needed against the one used; the first divergent node and the first divergent
computation are marked. Each side's check follows, with NEW's failing elements. Plain HTML: it reads
without JavaScript."""
from __future__ import annotations

import math

from ..present.html import bucket, document, esc, lines
from .report import DiffReport, NodeDiff
from .render import LIST_LIMIT, divergence_line, prompt_line, tolerance_line, verdict

BAR = 160  # px for |Δ|/tolerance from 1e-3 to 1e3, on a log scale


def _ratio(nd: NodeDiff) -> float:
    return nd.ratio if nd.ratio == nd.ratio else math.inf


def _bar(nd: NodeDiff) -> str:
    r = _ratio(nd)
    width = BAR if r > 1e3 else 0 if r <= 1e-3 else round((math.log10(r) + 3) / 6 * BAR)
    return f'<span class="bar{" fail" if nd.diverged else ""}" style="width:{width}px"></span>'


def _title(nd: NodeDiff) -> str:
    need = (f"drift {nd.drift:.1e} of its scale, {nd.allowed:.1e} allowed" if nd.roundings else
            f"needs atol {nd.needed_atol:.1e}")
    return (f"eval {nd.evaluation} {nd.role.group} {nd.role.name} '{nd.new.name}': |Δ| {nd.max_abs:.1e}, "
            f"{need} (|Δ|/tolerance {_ratio(nd):.2g})")


def _mark(nd: NodeDiff, rep: DiffReport) -> str:
    marks = []
    if nd is rep.first_divergent:
        marks.append("▶ first divergent node")
    if nd is rep.first_computed and nd is not rep.first_divergent:
        marks.append("▶ first divergent computation")
    return "; ".join(marks)


def strip(nodes: list[tuple[int, NodeDiff]], rep: DiffReport) -> str:
    cells = "".join(
        f'<a href="#n{i}" class="{bucket(nd.ratio, nd.diverged)}{" first" if nd is rep.first_divergent else ""}" '
        f'title="{esc(_title(nd))}"></a>' for i, nd in nodes)
    return f'<div class="strip">{cells}</div>'


def node_rows(nodes: list[tuple[int, NodeDiff]], rep: DiffReport) -> str:
    drift = rep.model is not None
    need = "NMSE" if rep.tolerance.nmse else "drift / allowed (of its scale)" if drift else "needed atol"
    head = "".join(f"<th>{esc(h)}</th>" for h in ("#", "where", "role", "node (OLD → NEW)", "lines", "op",
                                                   "compared", "max |Δ|", need, "|Δ| / tolerance", "", ""))
    rows = []
    for i, nd in nodes:
        old, new = nd.old.name, nd.new.name
        names = old if old == new else f"{old} → {new}"
        figure = (f"{nd.nmse:.1e}" if rep.tolerance.nmse else f"{nd.drift:.1e} / {nd.allowed:.1e}" if drift
                  else f"{nd.needed_atol:.1e}")
        cls = " ".join(c for c in ("first" if nd is rep.first_divergent else "",
                                   "diverged" if nd.diverged else "") if c)
        cells = (str(i), f"eval {nd.evaluation} {nd.role.group}", nd.role.name, names,
                 f"{nd.old.line} / {nd.new.line}", nd.new.op, str(nd.compared), f"{nd.max_abs:.1e}", figure)
        rows.append(f'<tr id="n{i}" class="{cls}">' + "".join(f"<td>{esc(c)}</td>" for c in cells) +
                    f'<td>{_bar(nd)} {esc(f"{_ratio(nd):.2g}")}</td>'
                    f'<td class="status">{"DIFF" if nd.diverged else "same"}</td><td>{esc(_mark(nd, rep))}</td></tr>')
    return f'<table class="list nodes"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def diff_page(rep: DiffReport) -> str:
    body = [f'<section class="dump"><h2>{esc(rep.old)} → {esc(rep.new)}</h2>',
            f'<p class="verdict {rep.verdict}">{esc(verdict(rep))}</p>',
            lines([x for x in (tolerance_line(rep), prompt_line(rep)) if x], "coverage")]
    numbered = [(i, nd) for i, nd in enumerate(rep.nodes) if not nd.skipped]
    evaluations = sorted({nd.evaluation for _, nd in numbered})
    if numbered:
        body.append('<h3>along the graph: each compared node by the tolerance it needed (red: beyond the one used; '
                    'outlined: the first divergent node; a click goes to its row)</h3>')
    for e in evaluations:
        mine = [(i, nd) for i, nd in numbered if nd.evaluation == e]
        body.append(f"<h3>evaluation {e}: {len(mine)} compared nodes</h3>{strip(mine, rep)}")
    for e in evaluations:
        body.append(f"<details open><summary>{esc(f'evaluation {e}: the nodes')}"
                    f"</summary>{node_rows([(i, nd) for i, nd in numbered if nd.evaluation == e], rep)}</details>")
    if rep.diverged:
        body.append(f"<details><summary>{len(rep.diverged)} divergent nodes, as the terminal lists them</summary>"
                    f"{lines([divergence_line(nd, rep.tolerance.nmse) for nd in rep.diverged], 'failures')}</details>")
    for side in rep.sides or ():
        body.append(lines([f"{side.name} {side.state()}"], "coverage"))
        if side.failed:
            body.append(f"<details{' open' if side.name == 'NEW' else ''}><summary>{esc(side.name)}: the failing "
                        f"elements, as check lists them</summary>{lines(side.failures(None), 'failures')}</details>")
    body.append(lines([f"only in {u.side.upper()}: eval {u.evaluation} {u.role.group} {u.role.name} "
                       f"'{u.node.name}' (line {u.node.line}, {u.node.op})" for u in rep.only], "warnings", LIST_LIMIT))
    body.append(lines(rep.warnings, "warnings", LIST_LIMIT))
    skipped = len(rep.nodes) - len(numbered)
    if skipped:
        body.append(f'<p class="note">{skipped} matched nodes not compared (diff -v lists them and why)</p>')
    body.append("</section>")
    return document(f"attncheck diff: {rep.old} → {rep.new}", "".join(body), {"kind": "diff", "dumps": []}, "diff")
