"""`unwind manifests rename|remove`: edit manifest and contract test YAML by tool name."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from ..edit import apply_to_paths, remove, rename
from ..edit.result import EditResult
from ..manifest.loader import LoadResult, check, load_text


def _is_test_case(data: Any) -> bool:
    return isinstance(data, dict) and "effect" not in data and ("tests" in data or "name" in data)


def validate_files(files: Mapping[str, str]) -> Sequence[str]:
    """The validator an edit must pass: every manifest in the edited files, set level
    included (contract test cases are not manifests and are skipped)."""
    loaded = LoadResult()
    for name, text in files.items():
        loaded.extend(load_text(text, name))
    loaded.items = [i for i in loaded.items if not _is_test_case(i.data)]
    return [str(issue) for issue in check(loaded).issues]


def _report(result: EditResult, as_json: bool) -> int:
    if as_json:
        print(json.dumps(result.to_json(), indent=2))
    elif result.success:
        changes = result.changes
        for old, new in changes.renamed:
            print(f"renamed {old} -> {new}")
        for name in changes.removed:
            print(f"removed {name}")
        print(f"{changes.rewrote} references rewritten in {len(changes.files)} files; "
              f"revision {result.revision}")
    else:
        for error in result.errors:
            print(f"error: {error.code}: {error.message}", file=sys.stderr)
            for ref in error.references:
                print(f"  {ref.file}:{ref.line}: {ref.path}", file=sys.stderr)
    return 0 if result.success else 1


def _missing_path(exc: FileNotFoundError) -> int:
    print(f"error: {exc}", file=sys.stderr)
    return 1


def cmd_rename(args: argparse.Namespace) -> int:
    try:
        result = apply_to_paths(args.paths or ["."], rename, args.old, args.new,
                                base_revision=args.base_revision, validator=validate_files,
                                write=not args.dry_run)
    except FileNotFoundError as exc:
        return _missing_path(exc)
    return _report(result, args.json)


def cmd_remove(args: argparse.Namespace) -> int:
    try:
        result = apply_to_paths(args.paths or ["."], remove, args.tools,
                                base_revision=args.base_revision, validator=validate_files,
                                write=not args.dry_run)
    except FileNotFoundError as exc:
        return _missing_path(exc)
    return _report(result, args.json)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("rename", help="rename a tool and every reference to it, in place")
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("paths", nargs="*", help="YAML files or folders (default: .)")
    _common(p)
    p.set_defaults(func=cmd_rename)
    p = subparsers.add_parser("remove", help="remove tools; refused while something else reads them")
    p.add_argument("tools", nargs="+", metavar="TOOL")
    p.add_argument("--paths", nargs="+", default=None, help="YAML files or folders (default: .)")
    _common(p)
    p.set_defaults(func=cmd_remove)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-revision", help="refuse with `stale` unless the files are at this revision")
    p.add_argument("--dry-run", action="store_true", help="report the change, write nothing")
    p.add_argument("--json", action="store_true")
