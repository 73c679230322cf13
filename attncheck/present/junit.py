"""Reports → JUnit XML as CI systems read it: <testsuites>/<testsuite>/<testcase> with <failure message=...>,
<error> for unusable input, <skipped> for what could not be verified.

check: one testcase per evaluation × layer (an attention site), failures naming head, query and slot or dim.
The helpers that build suites and testcases serve diff/junit.py too.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from ..errors import printable
from ..results import SiteReport, describe
from ..report import EXIT_INPUT, EXIT_UNVERIFIED, Report


def add_suite(root: ET.Element, name: str) -> ET.Element:
    return ET.SubElement(root, "testsuite", name=name, tests="0", failures="0", errors="0", skipped="0", time="0")


def add_case(suite: ET.Element, classname: str, name: str, kind: str | None = None, message: str = "",
          text: str = "") -> None:
    """A testcase; kind failure | error | skipped adds that child. Counts go up on the suite."""
    case = ET.SubElement(suite, "testcase", classname=classname, name=name, time="0")
    suite.set("tests", str(int(suite.get("tests")) + 1))
    if kind is None:
        return
    child = ET.SubElement(case, kind, message=message.splitlines()[0] if message else "")
    if kind != "skipped":
        child.set("type", kind)
    if text:
        child.text = text
    count = {"failure": "failures", "error": "errors", "skipped": "skipped"}[kind]
    suite.set(count, str(int(suite.get(count)) + 1))


def finish_tree(root: ET.Element) -> ET.ElementTree:
    """The counts summed up to the root, and every text from the input (paths, node names, error lines) written
    printable: XML 1.0 holds no control character, not even as a reference, and a CI log shows the messages."""
    for key in ("tests", "failures", "errors", "skipped"):
        root.set(key, str(sum(int(s.get(key)) for s in root.iter("testsuite"))))
    for element in root.iter():
        for key, value in element.attrib.items():
            element.set(key, printable(value))
        if element.text:
            element.text = printable(element.text, lines=True)
    ET.indent(root)
    return ET.ElementTree(root)


def _site_failures(s: SiteReport) -> list[str]:
    out = []
    for r in s.results:
        for f in r.failures if not r.passed else ():
            out.append(f"{r.check}: {r.node} (line {f.line or r.line}) {describe(f.at)}: dumped {f.got:.6g}, recomputed "
                       f"{f.want:.6g}, |err| {abs(f.got - f.want):.1e} > bound {f.bound:.1e}")
    return out


def check_xml(reports: list[Report], inputs: list[tuple[str, int, str | None]]) -> ET.ElementTree:
    """inputs: every dump checked, with its exit code and, for unusable input (exit 2), attncheck's error line,
    which becomes the <error> testcase's message. A site of which nothing could be checked (a --head that was
    not printed) is <skipped>, with the reason."""
    root = ET.Element("testsuites", name="attncheck check")
    done = iter(reports)
    for path, code, error in inputs:
        if code == EXIT_INPUT and error is not None:
            suite = add_suite(root, f"attncheck check {path}")
            add_case(suite, "attncheck.check", "read dump", "error", error, error)
            continue
        report = next(done)
        suite = add_suite(root, f"attncheck check {report.source}")
        cls = f"attncheck.check.{Path(report.source).stem}"
        if code == EXIT_UNVERIFIED and not report.sites:
            add_case(suite, cls, "attention", "skipped", report.unverified_reason())
        for s in report.sites:
            name = f"eval {s.evaluation} layer {s.layer}"
            lines = _site_failures(s)
            if lines:
                add_case(suite, cls, name, "failure", f"eval {s.evaluation} layer {s.layer} {lines[0]}", "\n".join(lines))
            elif not any(r.checked for r in s.results):
                add_case(suite, cls, name, "skipped", _nothing_checked(report))
            else:
                add_case(suite, cls, name)
    return finish_tree(root)


def _nothing_checked(report: Report) -> str:
    missing, printed = report.unprinted_heads()
    if missing:
        return (f"nothing checked: head{'s' * (len(missing) > 1)} {', '.join(map(str, missing))} not printed "
                f"(printed: {', '.join(map(str, printed))})")
    return "nothing checked: no printed element of this site could be recomputed"
