"""Contract tests: for a fake call and a fake answer, does a manifest give the undo
arguments, verification and plan its author expects? Nothing outside the process is touched.

A test file is YAML or JSON: a list of cases, or a mapping ``{tests: [...]}``; several
documents may follow each other. Unknown fields in a case are errors, like in manifests.

Decisions where tool-manifests.txt is silent (each case runs in its own simulated run):

- Setup: the run first succeeds the ``after`` tools (default: the manifest's ``requires``).
  They are assumed to succeed; each must have a manifest or the case fails.
- Refusal is checked before the call, in this order: a draft manifest ("the manifest of X
  is a draft"), a ``requires`` tool that has not succeeded in the run, an idempotency key
  that cannot be rendered (keys.py's reason). ``expect_blocked`` passes when the reason
  contains its text; a refusal without ``expect_blocked`` fails the case with the reason.
  A case expecting a refusal cannot also expect a plan, handle, read-back or duplicate.
- ``fail``: the call failed, so the plan is ``skip`` and there is no handle; a case with
  ``fail`` and no expectations asserts exactly that (and passes). ``fail`` and ``result``
  together are an error. Without ``fail`` the answer is ``result`` (default ``{}``).
- Plan: read_only and idempotent → skip; irreversible → unrecoverable (nothing can undo
  it); reversible and compensable → compensate when every required argument_map reference
  resolves, else unrecoverable with the missing reasons. Only a compensate plan has a handle.
- ``expect_handle`` and ``expect_verification`` equal the resolved arguments exactly;
  ``verify_with`` is the read-back's answer and ``expect_verified`` (default true when
  ``verify_with`` is given; not allowed without it) says whether every ``expect`` entry
  must match. ``verify_status`` (default 200) is the read-back's status: with
  ``verification.absent``, a status it lists or an empty/declared not-found answer is
  verified; without it, a status that is not 2xx never is. Deep equality tells a bool from a number, but not 1 from 1.0 (JSON does not).
- ``expect_duplicate: true`` repeats the call with the same arguments: it must be refused as
  a duplicate, which needs an idempotency key and a first call that still stands (a failed
  first call frees its key). ``false`` or absent is not asserted.
- Every failed expectation is reported, joined with "; ". Case names must be unique.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from ..ledger.undo import Plan, absence_problem, first_mismatch, plan_call, same
from ..ledger.undo import show as _show
from ..workspace.walk import expand
from .issues import Issue, issues_from_validation_error
from .keys import KeyRenderError, render_key
from .loader import SUFFIXES, Skip, Sourced, documents, duplicate_keys, load_text
from .model import Lifecycle, ToolManifest
from .refs import RefSyntaxError, resolve_expected, resolve_map

_EXPECTATIONS = ("expect_plan", "expect_handle", "expect_verification", "verify_with",
                 "verify_status", "expect_verified", "expect_duplicate")


class TestCase(BaseModel):
    """One contract test case; ``file`` and ``line`` say where it was read."""

    __test__: ClassVar[bool] = False  # not a pytest class
    model_config = ConfigDict(extra="forbid")

    name: str
    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    result: Any = None
    before: Any = None  # what the manifest's capture reads before the call ($before)
    fail: str | None = None
    after: list[str] | None = None
    expect_plan: Plan | None = None
    expect_handle: dict[str, Any] | None = None
    expect_verification: dict[str, Any] | None = None
    verify_with: Any = None
    verify_status: int | None = None
    expect_verified: bool | None = None
    expect_duplicate: bool | None = None
    expect_blocked: str | None = None
    _file: str | None = PrivateAttr(None)
    _line: int | None = PrivateAttr(None)
    _lines: dict[str, int] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> TestCase:
        if self.fail is not None and self.result is not None:
            raise ValueError("a call either succeeds (result) or fails (fail): remove one")
        if self.expect_verified is not None and self.verify_with is None \
                and self.verify_status is None:
            raise ValueError("expect_verified needs verify_with (the answer the read-back "
                             "gets) or verify_status (its status)")
        if self.expect_blocked is not None:
            others = [f for f in _EXPECTATIONS if getattr(self, f) is not None]
            if others:
                raise ValueError("a refused call has no plan, handle, read-back or duplicate: "
                                 f"remove {', '.join(others)} or expect_blocked")
        return self

    def at(self, file: str | None, line: int | None, lines: Mapping[str, int] | None = None) -> TestCase:
        """Where the case was read: its file and line, and the line of each of its keys."""
        self._file, self._line, self._lines = file, line, dict(lines or {})
        return self

    def line_of(self, key: str) -> int | None:
        return self._lines.get(key, self._line)

    @property
    def file(self) -> str | None:
        return self._file

    @property
    def line(self) -> int | None:
        return self._line


# ---- loading ----------------------------------------------------------------------------

def load_cases_text(text: str, file: str | None = None) -> tuple[list[TestCase], list[Issue]]:
    """Read the cases of one file's text; a syntax error is one issue with its line."""
    cases: list[TestCase] = []
    errors: list[Issue] = []
    for part in documents(text, file):
        if isinstance(part, Issue):
            errors.append(part)
            continue
        node, value = part
        errors.extend(duplicate_keys(node, file))
        if value is None:
            continue
        where = Sourced(value, file, node)
        items, items_node = value, node
        if isinstance(value, dict):
            extra = sorted(str(k) for k in value if k != "tests")
            if "tests" not in value or extra:
                errors.append(Issue(None, "", "a test file holds a list of cases or a mapping "
                                    f"with only tests: [...]; found keys {extra or '[]'}",
                                    file=file, line=where.line))
                continue
            items = value["tests"]
            items_node = next(v for k, v in node.value if getattr(k, "value", None) == "tests")
        if not isinstance(items, list):
            errors.append(Issue(None, "", "expected a list of test cases", file=file,
                                line=items_node.start_mark.line + 1))
            continue
        for item, item_node in zip(items, items_node.value, strict=True):
            case, found = _load_case(Sourced(item, file, item_node))
            cases.extend([case] if case else [])
            errors.extend(found)
    return cases, errors


def _load_case(src: Sourced) -> tuple[TestCase | None, list[Issue]]:
    if not isinstance(src.data, dict):
        return None, [Issue(None, "", "a test case must be a mapping with name and tool",
                            file=src.file, line=src.line)]
    name = src.data.get("name")
    label = f"case {name!r}: " if isinstance(name, str) else "case: "
    lines = {str(k.value): k.start_mark.line + 1 for k, _ in getattr(src.node, "value", [])
             if isinstance(k, yaml.ScalarNode)}
    try:
        return TestCase.model_validate(src.data).at(src.file, src.line, lines), []
    except ValidationError as exc:
        return None, [Issue(None, i.path, label + i.message, file=src.file, line=src.line_of(i.path))
                      for i in issues_from_validation_error(exc, src.data, None, TestCase)]


def load_cases(paths: Sequence[str | os.PathLike[str]]) -> tuple[list[TestCase], list[Issue]]:
    """Every case in the files and folders given (*.yaml, *.yml, *.json), and every error."""
    cases, errors, _ = load_case_files(paths)
    return cases, errors


def load_case_files(paths: Sequence[str | os.PathLike[str]]) -> tuple[list[TestCase], list[Issue], list[Skip]]:
    """``load_cases``, and the files found in folders that hold no test case (manifests,
    other YAML), which are listed rather than read as broken test files. A file named on
    the command line is always read as a test file."""
    walked = expand(paths, SUFFIXES)
    errors = [Issue(None, "", "no such file or folder", file=str(p)) for p in walked.missing]
    cases: list[TestCase] = []
    skipped: list[Skip] = []
    for path in walked.files:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            errors.append(Issue(None, "", f"cannot read the file: {exc}", file=str(path)))
            continue
        if path not in walked.given:
            what = load_text(text, str(path))
            if what.items or not any(s.kind == "contract_test" for s in what.skipped):
                reason = ("holds tool manifests" if what.items else
                          "; ".join(dict.fromkeys(s.reason for s in what.skipped)) or
                          "holds no test case")
                skipped.append(Skip(str(path), None, "not_tests", f"{reason}: not read as tests"))
                continue
        found, problems = load_cases_text(text, str(path))
        cases.extend(found)
        errors.extend(problems)
    seen: dict[str, TestCase] = {}
    for case in cases:
        first = seen.setdefault(case.name, case)
        if first is not case:
            errors.append(Issue(None, "name", f"case {case.name!r} is also defined at "
                                f"{first.file}:{first.line}: give each case its own name",
                                file=case.file, line=case.line))
    return cases, errors, skipped


# ---- running ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Failure:
    """One expectation a case does not meet: the case's field it is about (``expect_handle``,
    ``tool``...), a sentence, and the line of that field in the test file."""

    field: str
    message: str
    line: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"field": self.field, "message": self.message, "line": self.line}


@dataclass(frozen=True)
class CaseResult:
    name: str
    ok: bool
    message: str | None
    file: str | None = None
    line: int | None = None
    tool: str | None = None
    failures: tuple[Failure, ...] = ()


@dataclass
class Report:
    results: list[CaseResult] = field(default_factory=list)
    not_covered: list[str] = field(default_factory=list)

    @property
    def passed(self) -> int:
        return sum(r.ok for r in self.results)

    @property
    def failed(self) -> int:
        return len(self.results) - self.passed

    @property
    def ok(self) -> bool:
        return self.failed == 0


@dataclass
class _Run:
    """The simulated run: which tools succeeded and which idempotency keys still stand."""

    succeeded: set[str] = field(default_factory=set)
    standing: set[tuple[str, str]] = field(default_factory=set)

    def refusal(self, m: ToolManifest, args: Mapping[str, Any]) -> tuple[str | None, str | None]:
        """(why the call is refused or None, the rendered idempotency key)."""
        if m.lifecycle == Lifecycle.draft:
            return f"the manifest of {m.tool} is a draft: approve it before calling", None
        missing = [r.tool for r in m.requires if r.tool not in self.succeeded]
        if missing:
            return (f"{m.tool} requires {', '.join(missing)} to have succeeded earlier in the "
                    "run: call it first (or list it in after)"), None
        try:
            key = render_key(m.idempotency.key, args) if m.idempotency else None
        except KeyRenderError as exc:
            return exc.reason, None
        if key is not None and (m.tool, key) in self.standing:
            return (f"duplicate call: a call of {m.tool} with the idempotency key {key!r} "
                    "still stands"), key
        return None, key


def run_case(case: TestCase, by_name: Mapping[str, ToolManifest]) -> CaseResult:
    try:
        problems = _check(case, by_name)
    except RefSyntaxError as exc:
        problems = [("tool", f"the manifest has a reference that does not parse: {exc}")]
    failures = tuple(Failure(f, msg, case.line_of(f)) for f, msg in problems)
    return CaseResult(case.name, not failures, "; ".join(f.message for f in failures) or None,
                      case.file, case.line, case.tool, failures)


def _missing_tool(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _check(case: TestCase, by_name: Mapping[str, ToolManifest]) -> list[tuple[str, str]]:
    m = by_name.get(case.tool)
    if m is None:
        return [("tool", f"no manifest for tool {case.tool}{_missing_tool(case.tool, by_name)}")]
    run = _Run()
    for tool in case.after if case.after is not None else [r.tool for r in m.requires]:
        if tool not in by_name:
            return [("after", f"after names {tool}, which has no manifest"
                     f"{_missing_tool(tool, by_name)}: it cannot run first")]
        run.succeeded.add(tool)
    reason, key = run.refusal(m, case.args)
    if case.expect_blocked is not None:
        if reason is None:
            return [("expect_blocked", f"the call was not refused; expected a refusal containing "
                     f"{case.expect_blocked!r}")]
        if case.expect_blocked not in reason:
            return [("expect_blocked", f"the call was refused for another reason: {reason} "
                     f"(expected one containing {case.expect_blocked!r})")]
        return []
    if reason is not None:
        return [("tool", f"the call was refused: {reason}")]
    result = {} if case.result is None else case.result
    if case.fail is None:
        run.succeeded.add(m.tool)
        if key is not None:
            run.standing.add((m.tool, key))
        plan, handle, why = plan_call(m, case.args, result, key, before=case.before)
    else:
        plan, handle, why = "skip", None, f"the call failed ({case.fail}): nothing to undo"
    return list(_expectations(case, m, run, plan, handle, why, result, key))


def _expectations(case: TestCase, m: ToolManifest, run: _Run, plan: Plan,
                  handle: dict[str, Any] | None, why: str | None, result: Any,
                  key: str | None) -> Iterator[tuple[str, str]]:
    """(the case's field, a sentence) per expectation the simulated call does not meet."""
    if case.expect_plan is not None and case.expect_plan != plan:
        yield "expect_plan", (f"the plan is {plan}" + (f" ({why})" if why else "")
                              + f", expected {case.expect_plan}")
    if case.expect_handle is not None and handle is None:
        yield "expect_handle", f"there are no undo arguments ({why}), expected {_show(case.expect_handle)}"
    elif case.expect_handle is not None and not same(handle, case.expect_handle):
        yield "expect_handle", (f"the undo arguments are {_show(handle)}, expected "
                                f"{_show(case.expect_handle)}: {differences(handle, case.expect_handle)}")
    v = m.compensation.verification if m.compensation else None
    field = "expect_verification" if case.expect_verification is not None else "verify_with"
    read_back = case.verify_with is not None or case.verify_status is not None
    if case.expect_verification is not None or read_back:
        if case.fail is not None:
            yield field, "the call failed, so nothing is undone or read back"
            v = None
        elif v is None:
            yield field, f"{m.tool} declares no compensation.verification: there is no read-back to check"
    if v is not None and case.expect_verification is not None:
        got, missing = resolve_map(v.arguments, case.args, result, key, case.before)
        if missing:
            yield "expect_verification", "the verification arguments are unavailable: " + "; ".join(missing)
        elif not same(got, case.expect_verification):
            yield "expect_verification", (
                f"the verification arguments are {_show(got)}, expected "
                f"{_show(case.expect_verification)}: {differences(got, case.expect_verification)}")
    if v is not None and read_back:
        status = 200 if case.verify_status is None else case.verify_status
        if v.absent is not None:
            mismatch = absence_problem(v.absent, status, case.verify_with)
        elif not 200 <= status < 300:
            mismatch = f"the read-back answered {status}, not a 2xx answer to compare"
        else:
            expect, unknown = resolve_expected(v.expect, case.args, result, key, case.before)
            mismatch = ("the expected values are unavailable: " + "; ".join(unknown) if unknown
                        else first_mismatch(expect, case.verify_with))
        if case.expect_verified is not False and mismatch is not None:
            yield "verify_with", f"the read-back would be rejected: {mismatch}"
        elif case.expect_verified is False and mismatch is None:
            yield "expect_verified", "the read-back would be accepted, but expect_verified is false"
    if case.expect_duplicate and m.idempotency is None:
        yield "expect_duplicate", (f"{m.tool} declares no idempotency key, so a repeated call is "
                                   "not recognized as a duplicate: add idempotency: {key: ...} or "
                                   "remove expect_duplicate")
    elif case.expect_duplicate and run.refusal(m, case.args)[0] is None:
        yield "expect_duplicate", ("the same call a second time was not refused as a duplicate"
                                   + (": the first call failed, so its key is free again"
                                      if case.fail else ""))


def differences(got: Any, want: Any) -> str:
    """Which keys differ between two argument maps, as a sentence: the ones missing, the
    ones not expected, and each value that is not the one expected."""
    if not isinstance(got, dict) or not isinstance(want, dict):
        return f"{_show(got)} is not {_show(want)}"
    parts = [f"{k} is missing" for k in sorted(want) if k not in got]
    parts += [f"{k} is not expected (it is {_show(got[k])})" for k in sorted(got) if k not in want]
    parts += [f"{k} is {_show(got[k])}, expected {_show(want[k])}" for k in sorted(want)
              if k in got and not same(got[k], want[k])]
    return ", ".join(parts)


def run_cases(cases: Iterable[TestCase], manifests: Sequence[ToolManifest]) -> Report:
    by_name = {m.tool: m for m in manifests}
    cases = list(cases)
    covered = {c.tool for c in cases}
    return Report([run_case(c, by_name) for c in cases],
                  sorted({m.tool for m in manifests} - covered))


def report_json(report: Report) -> dict[str, Any]:
    return {"ok": report.ok, "passed": report.passed, "failed": report.failed,
            "results": [{"name": r.name, "ok": r.ok, "message": r.message, "tool": r.tool,
                         "file": r.file, "line": r.line,
                         "failures": [f.to_json() for f in r.failures]}
                        for r in report.results],
            "not_covered": list(report.not_covered)}


def format_text(report: Report) -> str:
    """One line per passing case; for a failing one, the case and then each failed
    expectation on its own line with the file:line of that expectation."""
    lines: list[str] = []
    for r in report.results:
        if r.ok:
            lines.append(f"ok   {r.name}")
            continue
        where = f" ({r.file}:{r.line})" if r.file and r.line else ""
        lines.append(f"FAIL {r.name}{where}")
        for f in r.failures:
            at = f"{r.file}:{f.line}: " if r.file and f.line else ""
            lines.append(f"  {at}{f.field}: {f.message}")
    if report.not_covered:
        lines.append("not covered by any test: " + ", ".join(report.not_covered))
    lines.append(f"{report.passed} passed" + (f", {report.failed} failed" if report.failed else ""))
    return "\n".join(lines)
