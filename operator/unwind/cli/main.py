"""`unwind`: validate, lint and test manifests offline; manage a registry; run the operator.

Installed as `kubectl-unwind` too: `kubectl unwind approve|deny|history|diff|status`
decide on and inspect ToolManifest versions in a cluster (plugin_cmds.py).

Every command returns an exit code; errors are one line on stderr, never a traceback
(``main`` turns an unexpected exception into one line too, with the option to see more
via UNWIND_DEBUG=1).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ..manifest.loader import CheckResult, check_paths


def _print_json(value: object) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False))


def cmd_validate(args: argparse.Namespace) -> int:
    result = check_paths(args.paths)
    if args.json:
        _print_json({"ok": result.ok, "count": len(result.manifests),
                     "errors": [i.to_json() for i in result.issues]})
    elif result.ok:
        print(f"ok: {len(result.manifests)} tool manifests valid")
    else:
        for issue in result.issues:
            print(f"error: {issue}", file=sys.stderr)
        print(f"{len(result.issues)} errors in {len(result.sources) + len(result.issues)} "
              "checks", file=sys.stderr)
    return 0 if result.ok else 1


def _valid_or_report(result: CheckResult) -> bool:
    for issue in result.issues:
        print(f"error: {issue}", file=sys.stderr)
    return result.ok


def cmd_lint(args: argparse.Namespace) -> int:
    from ..manifest.lint import lint, lint_report_json, lint_report_text

    result = check_paths(args.paths)
    if not _valid_or_report(result):
        return 1
    schemas = None
    if args.upstream_schemas:
        try:
            schemas = json.loads(Path(args.upstream_schemas).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            print(f"error: {args.upstream_schemas}: cannot read upstream schemas: {exc}", file=sys.stderr)
            return 1
        if not isinstance(schemas, dict):
            bad: str | None = "the file"
        else:
            bad = next((repr(name) for name, schema in schemas.items() if not isinstance(schema, dict)), None)
        if bad:
            print(f"error: {args.upstream_schemas}: {bad} is not a JSON Schema object: expected "
                  '{"<tool>": {"type": "object", "properties": {...}}, ...}', file=sys.stderr)
            return 1
    findings = lint(result.manifests, schemas)
    report = lint_report_json(findings)
    if args.json:
        _print_json(report)
    else:
        print(lint_report_text(findings))
    if report["errors"] or (args.strict and report["warnings"]):
        return 1
    return 0


def cmd_test(args: argparse.Namespace) -> int:
    from ..manifest.contract import format_text, load_cases, report_json, run_cases

    result = check_paths(args.manifests)
    if not _valid_or_report(result):
        return 1
    cases, errors = load_cases(args.files or ["tests/contracts"])
    for error in errors:
        print(f"error: {error}", file=sys.stderr)
    if errors:
        return 1
    report = run_cases(cases, result.manifests)
    if args.json:
        _print_json(report_json(report))
    else:
        print(format_text(report))
    return 0 if report.failed == 0 else 1


def cmd_schema(args: argparse.Namespace) -> int:
    from ..manifest.schema import manifest_json_schema

    text = json.dumps(manifest_json_schema(), indent=2, ensure_ascii=False) + "\n"
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


def cmd_crds(args: argparse.Namespace) -> int:
    from ..api.crd import write_crds

    outs = [Path(p) for p in (args.out or ["crds", "charts/unwind/crds"])]
    for path in write_crds(outs):
        print(f"wrote {path}")
    return 0


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="unwind", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    for name in ("validate", "check"):
        p = sub.add_parser(name, help="validate manifest files and folders (set level included)")
        p.add_argument("paths", nargs="+", help="YAML/JSON files or folders")
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.set_defaults(func=cmd_validate)

    p = sub.add_parser("lint", help="find valid but unsafe or incomplete manifests")
    p.add_argument("paths", nargs="+")
    p.add_argument("--json", action="store_true")
    p.add_argument("--strict", action="store_true", help="exit 1 on warnings too")
    p.add_argument("--upstream-schemas", metavar="FILE",
                   help="JSON object: tool name -> the upstream tool's input JSON Schema")
    p.set_defaults(func=cmd_lint)

    p = sub.add_parser("test", help="run manifest contract tests")
    p.add_argument("files", nargs="*", help="test files or folders (default tests/contracts)")
    p.add_argument("-m", "--manifests", nargs="+", default=["manifests"], help="manifest files or folders")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_test)

    p = sub.add_parser("schema", help="print the manifest's JSON Schema")
    p.add_argument("--out", help="write to this file instead of stdout")
    p.set_defaults(func=cmd_schema)

    p = sub.add_parser("crds", help="write the CRDs generated from the models")
    p.add_argument("--out", action="append", help="output folder (repeatable; default crds/ and "
                   "charts/unwind/crds/)")
    p.set_defaults(func=cmd_crds)

    _register_optional(sub, command if command in _MODULE_COMMANDS else None)
    return parser


# Commands that live in other modules, imported only when needed, so that `unwind operator`
# does not carry the editor or the registry client in a long-running process.
# The kubectl plugin's commands (plugin_cmds.COMMANDS) are listed here too, so that
# looking them up imports no module.
PLUGIN_COMMANDS = ("approve", "deny", "history", "diff", "status")
_MODULE_COMMANDS = {"keygen": ("registry_cmds",), "manifests": ("registry_cmds", "edit_cmds"),
                    "operator": ("cluster_cmds",), "dev": ("cluster_cmds",),
                    "gateway": ("gateway_cmds",),
                    **{c: ("plugin_cmds",) for c in PLUGIN_COMMANDS}}


def _register_optional(sub: argparse._SubParsersAction[argparse.ArgumentParser],
                       command: str | None = None) -> None:
    """Register the commands of other modules: only the one for ``command`` when given."""
    import importlib

    wanted = {m for c, ms in _MODULE_COMMANDS.items() if command in (None, c) for m in ms}
    modules = {m: importlib.import_module(f"{__package__}.{m}") for m in sorted(wanted)}
    if "registry_cmds" in modules:
        modules["registry_cmds"].register_keygen(sub)
    if "registry_cmds" in modules or "edit_cmds" in modules:
        manifests = sub.add_parser("manifests", help="registry and editing commands")
        msub = manifests.add_subparsers(dest="manifests_command", required=True, metavar="COMMAND")
        for name in ("registry_cmds", "edit_cmds"):
            if name in modules:
                register = getattr(modules[name], "register_manifests", None) or modules[name].register
                register(msub)
    if "cluster_cmds" in modules:
        modules["cluster_cmds"].register(sub)
    if "plugin_cmds" in modules:
        modules["plugin_cmds"].register(sub)
    if "gateway_cmds" in modules:
        modules["gateway_cmds"].register(sub)


def main(argv: Sequence[str] | None = None) -> int:
    from .kubectl import hoist_kube_flags

    # `kubectl unwind -n NS status` hands the plugin `-n NS status`: accept kubectl's
    # connection flags before a plugin command too.
    argv = hoist_kube_flags(list(sys.argv[1:] if argv is None else argv), PLUGIN_COMMANDS)
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command)
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a last resort: one line, not a traceback
        if os.environ.get("UNWIND_DEBUG"):
            raise
        print(f"error: {type(exc).__name__}: {exc} (set UNWIND_DEBUG=1 for details)", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
