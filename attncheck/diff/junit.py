"""A diff as JUnit XML: one testcase per evaluation × layer (input and output sections are their own), not per
node: a graph has ~40 nodes per layer, most of them views, and a CI dashboard of thousands of testcases hides the
one that matters; the failure message names the first divergent node of the layer and its element, the body lists
every divergent node."""
from __future__ import annotations

import xml.etree.ElementTree as ET

from ..check.junit import add_case, add_suite, finish_tree
from .compare import DiffReport
from .render import divergence_line


def diff_xml(rep: DiffReport) -> ET.ElementTree:
    root = ET.Element("testsuites", name="attncheck diff")
    suite = add_suite(root, f"attncheck diff {rep.old} {rep.new}")
    cls = "attncheck.diff"
    if rep.error:
        add_case(suite, cls, "inputs", "error", rep.error)
        return finish_tree(root)
    ref = rep.reference if rep.reference is not None and rep.reference.forward else None
    left = {(lr.evaluation, f"layer {lr.layer}"): lr for lr in (ref.layers if ref else []) if lr.regression}
    counted = {id(n) for n in rep.diverged}
    for (ev, group), nodes in rep.groups().items():
        name = f"eval {ev} {group}"
        lines = [f"NEW leaves the model's reference where OLD does not: {left[(ev, group)].where('new')}"
                 ] if (ev, group) in left else []
        lines += [divergence_line(n, rep.tolerance.nmse) for n in nodes if id(n) in counted]
        if lines:
            add_case(suite, cls, name, "failure", lines[0], "\n".join(lines))
        elif all(n.skipped for n in nodes):
            add_case(suite, cls, name, "skipped", "; ".join(sorted({n.skipped for n in nodes})))
        else:
            add_case(suite, cls, name)
    notes = [rep.prompt_note] if rep.prompt_note else []
    notes += [f"only in {u.side.upper()}: eval {u.evaluation} {u.role.group} {u.role.name} '{u.node.name}' "
              f"(line {u.node.line}, {u.node.op})" for u in rep.only]
    if notes:
        ET.SubElement(suite, "system-out").text = "\n".join(notes)
    return finish_tree(root)
