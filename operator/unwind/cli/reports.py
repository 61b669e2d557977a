"""JUnit XML and SARIF reports of `unwind test` and `unwind lint`, for CI systems.

JUnit XML is what GitLab, Jenkins, Azure Pipelines and most test dashboards read; SARIF
2.1.0 is what GitHub code scanning (and other annotators) read to put a finding on the
line it is about. Both are built from the same results the text and JSON output show, and
a run that could not produce results (unreadable input, a bug) still gives a valid
document of the format with the error in it, so the CI step that uploads it never fails
on a missing or broken file.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from typing import Any

from .. import __version__
from ..manifest.contract import Report
from ..manifest.issues import Issue
from ..manifest.lint import RULES, Finding, Silenced

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
_SARIF_LEVEL = {"error": "error", "warning": "warning", "info": "note"}


def _xml(root: ET.Element) -> str:
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _where(file: str | None, line: int | None) -> str:
    return f"{file}:{line}" if file and line else (file or "")


def _invalid_suite(parent: ET.Element, invalid: Sequence[Issue]) -> int:
    """A suite with one errored case per problem that stopped the run (invalid input)."""
    if not invalid:
        return 0
    suite = ET.SubElement(parent, "testsuite", name="unwind: input", tests=str(len(invalid)),
                          failures="0", errors=str(len(invalid)))
    for issue in invalid:
        case = ET.SubElement(suite, "testcase", name=str(issue), classname=issue.tool or "input")
        if issue.file:
            case.set("file", issue.file)
        if issue.line:
            case.set("line", str(issue.line))
        ET.SubElement(case, "error", message=issue.message, type="invalid").text = str(issue)
    return len(invalid)


def junit_test(report: Report, invalid: Sequence[Issue] = ()) -> str:
    """One testsuite per test file, one testcase per case; each failed expectation is a
    line of the failure; tools no case calls are skipped cases of a suite of their own."""
    root = ET.Element("testsuites", name="unwind test")
    errors = _invalid_suite(root, invalid)
    by_file: dict[str, list[Any]] = {}
    for r in report.results:
        by_file.setdefault(r.file or "tests", []).append(r)
    for file, results in by_file.items():
        failed = sum(not r.ok for r in results)
        suite = ET.SubElement(root, "testsuite", name=file, tests=str(len(results)),
                              failures=str(failed), errors="0")
        for r in results:
            case = ET.SubElement(suite, "testcase", name=r.name, classname=r.tool or "",
                                 file=file)
            if r.line:
                case.set("line", str(r.line))
            if not r.ok:
                body = "\n".join(f"{_where(r.file, f.line)}: {f.field}: {f.message}" for f in r.failures)
                ET.SubElement(case, "failure", message=r.message or "failed",
                              type=r.failures[0].field if r.failures else "failure").text = body
    if report.not_covered:
        suite = ET.SubElement(root, "testsuite", name="not covered by any test",
                              tests=str(len(report.not_covered)), failures="0", errors="0",
                              skipped=str(len(report.not_covered)))
        for tool in report.not_covered:
            case = ET.SubElement(suite, "testcase", name=tool, classname=tool)
            ET.SubElement(case, "skipped", message="no contract test calls this tool")
    root.set("tests", str(len(report.results) + errors))
    root.set("failures", str(report.failed))
    root.set("errors", str(errors))
    return _xml(root)


def junit_lint(findings: Sequence[Finding], tools: Sequence[str], failing: set[str],
               invalid: Sequence[Issue] = ()) -> str:
    """One testcase per tool linted: it fails when it has a finding of a failing level
    (``failing``: error, plus warning under --strict); other findings go in system-out."""
    root = ET.Element("testsuites", name="unwind lint")
    errors = _invalid_suite(root, invalid)
    suite = ET.SubElement(root, "testsuite", name="unwind lint", tests=str(len(tools)), errors="0")
    failures = 0
    by_tool: dict[str, list[Finding]] = {}
    for f in findings:
        by_tool.setdefault(f.tool, []).append(f)
    for tool in [*tools, *sorted(set(by_tool) - set(tools))]:
        found = by_tool.get(tool, [])
        case = ET.SubElement(suite, "testcase", name=tool, classname="lint")
        first = next((f for f in found if f.file), None)
        if first is not None and first.file:
            case.set("file", first.file)
        bad = [f for f in found if f.level in failing]
        if bad:
            failures += 1
            ET.SubElement(case, "failure", message=f"{bad[0].code}: {bad[0].message}",
                          type=bad[0].code).text = "\n".join(map(str, bad))
        rest = [f for f in found if f.level not in failing]
        if rest:
            ET.SubElement(case, "system-out").text = "\n".join(map(str, rest))
    suite.set("failures", str(failures))
    root.set("tests", str(len(tools) + errors))
    root.set("failures", str(failures))
    root.set("errors", str(errors))
    return _xml(root)


def _location(file: str | None, line: int | None) -> list[dict[str, Any]]:
    if not file:
        return []
    physical: dict[str, Any] = {"artifactLocation": {"uri": file}}
    if line:
        physical["region"] = {"startLine": line}
    return [{"physicalLocation": physical}]


def _run(rules: list[dict[str, Any]], results: list[dict[str, Any]],
         ok: bool = True, notification: str | None = None) -> str:
    run: dict[str, Any] = {
        "tool": {"driver": {"name": "unwind", "version": __version__,
                            "rules": rules}},
        "results": results,
        "invocations": [{"executionSuccessful": ok}],
    }
    if notification:
        run["invocations"][0]["toolExecutionNotifications"] = [
            {"level": "error", "message": {"text": notification}}]
    doc = {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def _issue_result(issue: Issue) -> dict[str, Any]:
    return {"ruleId": "invalid", "level": "error", "message": {"text": str(issue)},
            "locations": _location(issue.file, issue.line),
            "properties": {"tool": issue.tool, "path": issue.path}}


_INVALID_RULE = {"id": "invalid", "shortDescription": {"text": "the input is not valid"},
                 "defaultConfiguration": {"level": "error"}}


def sarif_lint(findings: Sequence[Finding], silenced: Sequence[Silenced] = (),
               invalid: Sequence[Issue] = ()) -> str:
    """Each finding a result on its file and line; a silenced one carries a suppression
    with its reason (code scanning shows it as dismissed, not as gone)."""
    rules = [{"id": r.code, "name": r.check.__name__,
              "shortDescription": {"text": r.check.__name__.split("_", 1)[1].replace("_", " ")},
              "defaultConfiguration": {"level": _SARIF_LEVEL[r.level]}} for r in RULES]

    def result(f: Finding, reason: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"ruleId": f.code, "level": _SARIF_LEVEL[f.level],
                               "message": {"text": f"{f.tool}: {f.message}"},
                               "locations": _location(f.file, f.line),
                               "properties": {"tool": f.tool, "path": f.path}}
        if reason is not None:
            kind = "external" if reason == "--disable" else "inSource"
            out["suppressions"] = [{"kind": kind, "justification": reason}]
        return out

    results = [_issue_result(i) for i in invalid]
    results += [result(f) for f in findings] + [result(s.finding, s.reason) for s in silenced]
    return _run([*rules, _INVALID_RULE] if invalid else rules, results)


def sarif_test(report: Report, invalid: Sequence[Issue] = ()) -> str:
    """Each failed expectation a result on the line of the case's field it is about."""
    rules = [{"id": "contract-test", "shortDescription": {"text": "a contract test case fails"},
              "defaultConfiguration": {"level": "error"}}]
    results = [_issue_result(i) for i in invalid]
    for r in report.results:
        for f in r.failures:
            results.append({"ruleId": "contract-test", "level": "error",
                            "message": {"text": f"{r.name}: {f.field}: {f.message}"},
                            "locations": _location(r.file, f.line or r.line),
                            "properties": {"case": r.name, "tool": r.tool, "field": f.field}})
    return _run([*rules, _INVALID_RULE] if invalid else rules, results)


def error_report(fmt: str, code: str, message: str) -> str:
    """A valid JUnit or SARIF document that says the run failed before it had results."""
    if fmt == "sarif":
        return _run([], [], ok=False, notification=f"{code}: {message}")
    root = ET.Element("testsuites", name="unwind", tests="1", failures="0", errors="1")
    suite = ET.SubElement(root, "testsuite", name="unwind", tests="1", failures="0", errors="1")
    case = ET.SubElement(suite, "testcase", name="unwind", classname="unwind")
    ET.SubElement(case, "error", message=message, type=code).text = message
    return _xml(root)
