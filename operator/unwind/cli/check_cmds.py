"""`unwind validate|lint|test|schema|init`: the offline checks a GitOps pipeline runs
before merge, and the scaffolding to start from.

One truthful answer per run: every problem of every file in one go, exit 1 on any of
them, and never a green run that checked nothing (no manifest found is exit 1 unless
``--allow-empty``). Anything read that is not a manifest is listed with why it was left.
With a machine format (``--json``, ``-o json|yaml|junit|sarif``) stdout is one document.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..manifest.issues import Issue
from ..manifest.lint import Finding, Silenced
from ..manifest.loader import DEFAULT_NAMESPACE, CheckResult, Skip, check_paths
from .output import add_output_flags, emit, fail, output_format, paint, plural


def _where(namespace: str | None) -> str:
    return namespace if namespace is not None else "bare manifests"


def _namespaces(result: CheckResult) -> list[dict[str, Any]]:
    return [{"namespace": ns, "tools": len(idx)} for ns, idx in result.namespaces().items()]


def _skipped_lines(skipped: Sequence[Skip]) -> list[str]:
    """One line per file left unchecked, with each distinct reason once."""
    by_file: dict[str, list[str]] = {}
    for s in skipped:
        reasons = by_file.setdefault(s.file or "", [])
        if s.reason not in reasons:
            reasons.append(s.reason)
    lines = []
    for file, reasons in by_file.items():
        shown = "; ".join(reasons[:3]) + (f"; and {len(reasons) - 3} more" if len(reasons) > 3 else "")
        lines.append(f"  {file}: {shown}")
    return lines


def _no_manifest(paths: Sequence[str], result: CheckResult) -> Issue:
    where = ", ".join(paths)
    return Issue(None, "", (f"no tool manifest found in {where} ({plural(result.files, 'file')} "
                            f"read, {len(result.skipped)} not manifests): nothing was checked; "
                            "pass --allow-empty if that is expected"))


def _print_issues(issues: Sequence[Issue]) -> None:
    label = paint("error:", "red", sys.stderr)
    for issue in issues:
        print(f"{label} {issue}", file=sys.stderr)


# ---- validate -------------------------------------------------------------------------------

def cmd_validate(args: argparse.Namespace) -> int:
    from ..workspace.project import CHECKED, check_project

    fmt = output_format(args)
    project = check_project(args.paths, getattr(args, "namespace", None) or DEFAULT_NAMESPACE)
    result = project.result
    issues = list(project.issues)
    if result.read == 0 and not getattr(args, "allow_empty", False):
        issues.append(_no_manifest(args.paths, result))
    ok = not issues
    if fmt != "text":
        emit({"ok": ok, "count": len(result.manifests), "read": result.read, "files": result.files,
              "namespaces": _namespaces(result), "checked": dict(project.checked),
              "errors": [i.to_json() for i in issues],
              "skipped": [s.to_json() for s in project.skipped]}, fmt)
        _print_issues(issues)
        return 0 if ok else 1
    others = [plural(n, *CHECKED[kind]) for kind, n in project.checked.items()
              if kind != "tool_manifests" and n]
    if ok:
        groups = result.namespaces()
        where = ""
        if len(groups) == 1 and None not in groups:
            where = f" in namespace {next(iter(groups))}"
        elif len(groups) > 1:
            where = " (" + ", ".join(f"{_where(ns)}: {len(idx)}" for ns, idx in groups.items()) + ")"
        extra = f"; {', '.join(others)} checked" if others else ""
        print(f"{paint('ok:', 'green')} {plural(len(result.manifests), 'tool manifest')} "
              f"valid{where}{extra}")
    else:
        _print_issues(issues)
        files = {i.file for i in issues}
        print(f"{plural(len(issues), 'error')} in {plural(len(files), 'file')} "
              f"({plural(result.read, 'tool manifest')} read from {plural(result.files, 'file')})",
              file=sys.stderr)
    if project.skipped:
        print(f"not checked ({plural(len({s.file for s in project.skipped}), 'file')} holding no "
              "tool manifest):")
        print("\n".join(_skipped_lines(project.skipped)))
    return 0 if ok else 1


# ---- lint ------------------------------------------------------------------------------------

def _upstream_schemas(path: str) -> dict[str, Any]:
    try:
        schemas: Any = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise _Stop("invalid", f"{path}: cannot read upstream schemas: {exc}") from exc
    if not isinstance(schemas, dict):
        bad: str | None = "the file"
    else:
        bad = next((repr(name) for name, schema in schemas.items() if not isinstance(schema, dict)), None)
    if bad:
        raise _Stop("invalid", f"{path}: {bad} is not a JSON Schema object: expected "
                    '{"<tool>": {"type": "object", "properties": {...}}, ...}')
    return dict(schemas)


class _Stop(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _disabled(values: Sequence[str] | None) -> set[str]:
    from ..manifest.lint import CODES

    codes = {c.strip().upper() for v in values or [] for c in v.split(",") if c.strip()}
    unknown = sorted(codes - CODES)
    if unknown:
        raise _Stop("invalid", f"--disable: {', '.join(unknown)} "
                    f"{'is not a lint code' if len(unknown) == 1 else 'are not lint codes'} "
                    f"(codes: {', '.join(sorted(CODES))})")
    return codes


def mcp_tools(target: Any, timeout_s: float = 20.0, *, label: str | None = None) -> list[dict[str, Any]]:
    """Every tool an MCP server lists (all pages), as the protocol writes them (name,
    description, inputSchema, annotations). ``target`` is a streamable HTTP URL, or
    anything else the SDK's ``Client`` takes (a stdio transport; tests pass a server
    object); ``label`` names it in messages (default: ``target`` itself)."""
    label = label or str(target)
    import anyio
    from mcp import Client

    async def read() -> list[dict[str, Any]]:
        tools: list[dict[str, Any]] = []
        with anyio.fail_after(timeout_s):
            async with Client(target) as client:
                cursor: str | None = None
                for _ in range(1000):  # a server that pages forever is cut off
                    listed = await client.list_tools(cursor=cursor)
                    tools += [t.model_dump(mode="json", by_alias=True, exclude_none=True)
                              for t in listed.tools]
                    cursor = listed.next_cursor
                    if not cursor:
                        break
        return tools
    try:
        return anyio.run(read)
    except TimeoutError as exc:
        raise _Stop("upstream", f"{label}: no tools/list answer within {timeout_s:g}s") from exc
    except Exception as exc:  # the SDK raises many kinds; each means the list was not read
        reason = str(exc) or type(exc).__name__
        if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            reason = str(exc.exceptions[0]) or type(exc.exceptions[0]).__name__
        raise _Stop("upstream", f"{label}: cannot read the MCP server's tools/list: {reason}") from exc


def _upstream_urls(urls: Sequence[str] | None) -> dict[str, dict[str, Any]]:
    """Each MCP server's tool list (name -> input schema), by the URL given."""
    out: dict[str, dict[str, Any]] = {}
    for url in urls or []:
        if not url.startswith(("http://", "https://")):
            raise _Stop("invalid", f"--upstream-url {url!r}: give the MCP server's http(s) URL")
        out[url] = {str(t["name"]): dict(t.get("inputSchema") or {}) for t in mcp_tools(url)}
    return out


def lint_result(result: CheckResult, schemas: dict[str, Any] | None,
                upstreams: dict[str, dict[str, Any]] | None = None) -> tuple[list[Finding], list[Issue]]:
    """The findings of each namespace (lint, like validation, judges a namespace's set),
    each located on the line of the field it is about; and the problems of the
    ignore-check annotations."""
    from ..manifest.lint import ignores_from_annotations, lint

    findings: list[Finding] = []
    problems: list[Issue] = []
    declared = {m.tool for m in result.manifests}
    for positions in result.namespaces().values():
        models = [result.manifests[i] for i in positions]
        sources = {result.manifests[i].tool: result.sources[i] for i in positions}
        todos = {tool: src.todos for tool, src in sources.items() if src.todos}
        for f in lint(models, schemas, upstreams, todos):
            if f.code == "L035" and (f.tool in declared or any(g.code == "L035" and g.tool == f.tool
                                                                for g in findings)):
                continue  # the upstream tool has a manifest in another namespace, or is listed
            src = sources.get(f.tool)
            findings.append(f.located(src.file, src.line_of(f.path)) if src else f)
    for i, src in enumerate(result.sources):
        for key, message in ignores_from_annotations(src.annotations)[1]:
            problems.append(Issue(result.manifests[i].tool, f"metadata.annotations.{key}", message,
                                  file=src.file, line=src.annotation_lines.get(key, src.line)))
    return findings, problems


def cmd_lint(args: argparse.Namespace) -> int:
    from ..manifest.lint import (
        counts,
        ignores_from_annotations,
        lint_report_json,
        lint_report_text,
        silence,
    )
    from .reports import junit_lint, sarif_lint

    fmt = output_format(args)
    try:
        disabled = _disabled(args.disable)
        schemas = _upstream_schemas(args.upstream_schemas) if args.upstream_schemas else None
        upstreams = _upstream_urls(args.upstream_url)
    except _Stop as stop:
        return fail(args, stop.code, stop.message)
    result = check_paths(args.paths, args.namespace or DEFAULT_NAMESPACE)
    invalid = list(result.issues)
    if result.read == 0 and not args.allow_empty:
        invalid.append(_no_manifest(args.paths, result))
    findings: list[Finding] = []
    silenced: list[Silenced] = []
    if not invalid:
        found, problems = lint_result(result, schemas, upstreams)
        invalid += problems
        ignores = {result.manifests[i].tool: ignores_from_annotations(s.annotations)[0]
                   for i, s in enumerate(result.sources)}
        findings, silenced = silence(found, disabled, ignores)
    errors, warnings, _ = counts(findings)
    failing = {"error", "warning"} if args.strict else {"error"}
    ok = not invalid and not errors and not (args.strict and warnings)
    if fmt in ("json", "yaml"):
        emit({"ok": ok, **lint_report_json(findings, silenced),
              "invalid": [i.to_json() for i in invalid]}, fmt)
    elif fmt == "junit":
        sys.stdout.write(junit_lint(findings, [m.tool for m in result.manifests], failing, invalid))
    elif fmt == "sarif":
        sys.stdout.write(sarif_lint(findings, silenced, invalid))
    elif not invalid:
        print(lint_report_text(findings, silenced))
    _print_issues(invalid)
    if invalid and fmt == "text":
        print(f"not linted: {plural(len(invalid), 'problem')} to fix first", file=sys.stderr)
    return 0 if ok else 1


# ---- test ------------------------------------------------------------------------------------

def cmd_test(args: argparse.Namespace) -> int:
    from ..manifest.contract import Report, format_text, load_case_files, report_json, run_cases
    from .reports import junit_test, sarif_test

    fmt = output_format(args)
    result = check_paths(args.manifests, args.namespace or DEFAULT_NAMESPACE)
    invalid = list(result.issues)
    if result.read == 0 and not args.allow_empty:
        invalid.append(_no_manifest(args.manifests, result))
    cases, errors, skipped = load_case_files(args.files or ["tests/contracts"])
    invalid += errors
    if not cases and not errors and not args.allow_empty:
        invalid.append(Issue(None, "", f"no contract test case found in "
                             f"{', '.join(args.files or ['tests/contracts'])}: nothing was "
                             "tested; pass --allow-empty if that is expected"))
    invalid += _ambiguous_tools(result)
    report = run_cases(cases, result.manifests) if not invalid else Report()
    ok = not invalid and report.ok
    if fmt in ("json", "yaml"):
        emit({**report_json(report), "ok": ok, "invalid": [i.to_json() for i in invalid],
              "skipped": [s.to_json() for s in skipped]}, fmt)
    elif fmt == "junit":
        sys.stdout.write(junit_test(report, invalid))
    elif fmt == "sarif":
        sys.stdout.write(sarif_test(report, invalid))
    elif not invalid:
        print(format_text(report))
    if skipped and fmt == "text":
        print(f"not test files ({plural(len(skipped), 'file')} found in the folders given):")
        print("\n".join(_skipped_lines(skipped)))
    _print_issues(invalid)
    return 0 if ok else 1


def _ambiguous_tools(result: CheckResult) -> list[Issue]:
    """A contract test names a tool, not a namespace: a tool declared differently in two
    namespaces of the manifests given cannot be tested without a guess."""
    from ..manifest.canonical import checksum

    seen: dict[str, dict[str, str | None]] = {}  # tool -> checksum -> a namespace holding it
    for m, src in zip(result.manifests, result.sources, strict=True):
        seen.setdefault(m.tool, {})[checksum(m.canonical_dict())] = src.namespace
    issues = []
    for tool, versions in sorted(seen.items()):
        if len(versions) > 1:
            where = " and ".join(sorted(_where(ns) for ns in versions.values()))
            issues.append(Issue(tool, "", f"declared differently in {where}: a contract test "
                                "names a tool, not a namespace; give -m one namespace's files"))
    return issues


# ---- schema ----------------------------------------------------------------------------------

def cmd_schema(args: argparse.Namespace) -> int:
    from ..manifest.schema import manifest_json_schema, resource_json_schema

    schema = resource_json_schema() if args.resource else manifest_json_schema()
    text = json.dumps(schema, indent=2, ensure_ascii=False) + "\n"
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


# ---- init ------------------------------------------------------------------------------------

def cmd_init(args: argparse.Namespace) -> int:
    from .scaffold import scaffold

    try:
        files = scaffold(args.tool, args.effect, args.namespace, Path(args.dir))
    except (ValueError, FileExistsError) as exc:
        return fail(args, "invalid", str(exc))
    written = []
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "x", encoding="utf-8") as handle:
            handle.write(text)
        written.append(str(path))
    if output_format(args) != "text":
        emit({"ok": True, "written": written}, output_format(args))
    else:
        for path_text in written:
            print(f"wrote {path_text}")
        manifests, tests = (str(Path(args.dir) / d) for d in ("manifests", "tests/contracts"))
        print(f"next: fill in the TODOs, then `unwind validate {manifests} && unwind lint --strict "
              f"{manifests} && unwind test {tests} -m {manifests}`")
    return 0


# ---- wiring ----------------------------------------------------------------------------------

def add_input_args(p: argparse.ArgumentParser) -> None:
    """The flags every command that reads manifests takes (the checks here, the registry's)."""
    p.add_argument("-n", "--namespace", metavar="NS",
                   help="namespace of ToolManifest resources that name none (default: default, "
                   "as kubectl without a context namespace); bare manifests form a set of their own")
    p.add_argument("--allow-empty", action="store_true",
                   help="exit 0 when no tool manifest is found (by default that is an error)")


def register(sub: Any) -> None:
    for name in ("validate", "check"):
        p = sub.add_parser(name, help="validate manifests, and every other file of a project as "
                           "what it is (contract tests, a folder registry, unwind.yaml)",
                           description="Validate tool manifests (each one, then each namespace's "
                           "set) and check every other file found as what it is. PATHS are files "
                           "or folders; - reads standard input.")
        p.add_argument("paths", nargs="+", metavar="PATH", help="YAML/JSON files or folders, or -")
        add_input_args(p)
        add_output_flags(p)
        p.set_defaults(func=cmd_validate)

    p = sub.add_parser("lint", help="find valid but unsafe or incomplete manifests",
                       description="Lint tool manifests (the L-codes). Exit 1 on an error "
                       "finding, on a warning with --strict, or when the manifests are invalid.")
    p.add_argument("paths", nargs="+", metavar="PATH", help="YAML/JSON files or folders, or -")
    p.add_argument("--strict", action="store_true", help="exit 1 on warnings too")
    p.add_argument("--disable", action="append", metavar="CODE",
                   help="do not count these codes (repeatable, or comma-separated: L016,L022); "
                   "they are listed as silenced")
    p.add_argument("--upstream-schemas", metavar="FILE",
                   help="JSON object: tool name -> the upstream tool's input JSON Schema "
                   "(judges every manifest)")
    p.add_argument("--upstream-url", action="append", metavar="URL",
                   help="an MCP server's URL: its live tools/list judges the manifests whose "
                   "upstream.mcp.url is that URL (repeatable)")
    add_input_args(p)
    add_output_flags(p, extra=("junit", "sarif"))
    p.set_defaults(func=cmd_lint)

    p = sub.add_parser("test", help="run manifest contract tests",
                       description="Run contract tests against manifests, offline. Exit 1 on a "
                       "failing case, an invalid manifest or test file, or nothing to test.")
    p.add_argument("files", nargs="*", metavar="FILE", help="test files or folders (default tests/contracts)")
    p.add_argument("-m", "--manifests", nargs="+", default=["manifests"], metavar="PATH",
                   help="manifest files or folders, or - (default manifests)")
    add_input_args(p)
    add_output_flags(p, extra=("junit", "sarif"))
    p.set_defaults(func=cmd_test)

    p = sub.add_parser("schema", help="print the manifest's JSON Schema",
                       description="Print the JSON Schema of a bare manifest, or with --resource "
                       "of a kind: ToolManifest resource (for editors and CI schema checks).")
    p.add_argument("--resource", action="store_true",
                   help="the kind: ToolManifest form (apiVersion, kind, metadata, spec)")
    p.add_argument("--out", help="write to this file instead of stdout")
    p.set_defaults(func=cmd_schema)

    p = sub.add_parser("init", help="scaffold a manifest and its contract test",
                       description="Write manifests/<tool>.yaml (a ToolManifest resource) and "
                       "tests/contracts/<tool>.test.yaml to start from; never overwrites a file.")
    p.add_argument("tool", metavar="TOOL", help="the tool's name, e.g. billing.create_invoice")
    p.add_argument("--effect", default="read_only",
                   choices=["read_only", "idempotent", "reversible", "compensable", "irreversible"],
                   help="reversible and compensable also write their undo and read-back tools; "
                   "irreversible asks for an approval of each call (default read_only)")
    p.add_argument("-n", "--namespace", default="default", help="the resources' namespace")
    p.add_argument("--dir", default=".", help="project folder (default .)")
    add_output_flags(p)
    p.set_defaults(func=cmd_init)
