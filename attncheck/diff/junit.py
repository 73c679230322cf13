"""A diff as JUnit XML: one testcase per evaluation × layer (input and output sections are their own), not per
node: a graph has ~40 nodes per layer, most of them views, and a CI dashboard of thousands of testcases hides the
one that matters; the failure message names the first divergent node of the layer and its element, the body lists
every divergent node. Then a testcase for each side's check: NEW's fails as check does (its failing elements, as
check names them); OLD's never fails (the gate is about NEW), what check says of it goes to its system-out."""
from __future__ import annotations

import xml.etree.ElementTree as ET

from ..present.junit import add_case, add_suite, finish_tree
from ..report import EXIT_FAIL, EXIT_INPUT, EXIT_PASS, EXIT_UNVERIFIED
from .report import DiffReport
from .render import divergence_line


def diff_xml(rep: DiffReport) -> ET.ElementTree:
    root = ET.Element("testsuites", name="attncheck diff")
    suite = add_suite(root, f"attncheck diff {rep.old} {rep.new}")
    cls = "attncheck.diff"
    if rep.error:
        add_case(suite, cls, "inputs", "error", rep.error)
        return finish_tree(root)
    counted = {id(n) for n in rep.diverged}
    for (ev, group), nodes in rep.groups().items():
        name = f"eval {ev} {group}"
        lines = [divergence_line(n, rep.tolerance.nmse) for n in nodes if id(n) in counted]
        if lines:
            add_case(suite, cls, name, "failure", lines[0], "\n".join(lines))
        elif all(n.skipped for n in nodes):
            add_case(suite, cls, name, "skipped", "; ".join(sorted({n.skipped for n in nodes})))
        else:
            add_case(suite, cls, name)
    for side in rep.sides or ():
        _side_case(suite, side)
    notes = [rep.prompt_note] if rep.prompt_note else []
    notes += [f"only in {u.side.upper()}: eval {u.evaluation} {u.role.group} {u.role.name} '{u.node.name}' "
              f"(line {u.node.line}, {u.node.op})" for u in rep.only]
    if notes:
        ET.SubElement(suite, "system-out").text = "\n".join(notes)
    return finish_tree(root)


def _side_case(suite: ET.Element, side) -> None:
    """The check of one side (sides.Side): NEW's verdict is check's; OLD's is said, never a failure."""
    name = f"{side.command} {side.name}"
    code = side.exit_code
    if side.name == "OLD":
        add_case(suite, "attncheck.diff", name)
        if code != EXIT_PASS:
            out = ET.SubElement(suite.findall("testcase")[-1], "system-out")
            out.text = "\n".join([side.as_baseline(), *side.failures(None)])
    elif code == EXIT_FAIL:
        lines = side.failures(None)
        add_case(suite, "attncheck.diff", name, "failure", lines[0], "\n".join(lines))
    elif code == EXIT_INPUT:
        add_case(suite, "attncheck.diff", name, "error", side.error)
    elif code == EXIT_UNVERIFIED:
        add_case(suite, "attncheck.diff", name, "skipped", side.state())
    else:
        add_case(suite, "attncheck.diff", name)
