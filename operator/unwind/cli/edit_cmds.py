"""`unwind manifests rename|remove`: edit manifest and contract test YAML by tool name."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from ..edit import apply_to_paths, remove, rename
from ..edit.result import EditResult, Skipped
from ..manifest.issues import Issue
from ..manifest.loader import LoadResult, check, load_text
from .output import fail, plural


def _issues(files: Mapping[str, str]) -> list[Issue]:
    """Every problem of the manifests in these files, set level included (the loader sets
    contract test cases and other documents aside)."""
    loaded = LoadResult()
    for name, text in files.items():
        loaded.extend(load_text(text, name))
    return check(loaded).issues


_HINT = re.compile(r" \(did you mean [^)]*\?\)")


class NewProblems:
    """The validator an edit must pass: the problems it adds to the files it edits.

    Run from a repository root, the files edited hold unrelated manifests too (examples,
    test fixtures, several namespaces), and their problems are not the edit's to fix;
    refusing for them would make any edit there impossible (semantic-edits-adr.txt makes
    the same choice for moves: only newly broken reads are reported). A problem is the
    same before and after when its file, tool, field and message are: its line is
    ignored (a removal moves lines) and, for a rename, the old name (as the tool, or
    quoted in the message) is read as the new one. `kept` counts the problems that were
    there and still are.
    """

    def __init__(self, renamed: Mapping[str, str] | None = None) -> None:
        self.renamed = dict(renamed or {})
        self.kept = 0

    @staticmethod
    def _key(issue: Issue, renamed: Mapping[str, str]) -> tuple[str, ...]:
        tool, message = issue.tool or "", _HINT.sub("", issue.message)  # a suggestion may change
        for old, new in renamed.items():  # messages quote the names they mention: 'a.b'
            tool = new if tool == old else tool
            message = message.replace(f"'{old}'", f"'{new}'").replace(f'"{old}"', f'"{new}"')
        return (issue.file or "", tool, issue.path, message)

    def __call__(self, after: Mapping[str, str], before: Mapping[str, str]) -> list[str]:
        found = _issues(after)
        if not found:
            return []
        was = Counter(self._key(issue, self.renamed) for issue in _issues(before))
        added: list[str] = []
        for issue in found:
            key = self._key(issue, {})
            if was[key]:
                was[key] -= 1
                self.kept += 1
            else:
                added.append(str(issue))
        return added


def _report(result: EditResult, as_json: bool, dry_run: bool = False, kept: int = 0) -> int:
    dry_run_note = " (dry run: nothing written)" if dry_run else ""
    if as_json:
        print(json.dumps({"ok": result.success, **result.to_json(), "dry_run": dry_run,
                          "written": result.success and not dry_run and bool(result.changes.files),
                          "existing_problems": kept}, indent=2))
    elif result.success:
        changes = result.changes
        for old, new in changes.renamed:
            print(f"renamed {old} -> {new}")
        for name in changes.removed:
            print(f"removed {name}")
        print(f"{plural(changes.rewrote, 'reference')} rewritten in "
              f"{plural(len(changes.files), 'file')}; revision {result.revision}{dry_run_note}")
    else:
        for error in result.errors:
            print(f"error: {error.code}: {error.message}", file=sys.stderr)
            for ref in error.references:
                print(f"  {ref.file}:{ref.line}: {ref.path}", file=sys.stderr)
    if result.skipped and not as_json:
        _print_skipped(result.skipped)
    if kept and not as_json:
        print(f"note: {kept} validation problem{'s were' if kept != 1 else ' was'} there "
              "before this edit and did not block it (`unwind validate` on your manifest "
              "folders lists them)",
              file=sys.stderr)
    return 0 if result.success else 1


def _print_skipped(skipped: Sequence[Skipped]) -> None:
    """Every file read and left alone, with why; a mention of an edited name is a warning."""
    print(f"skipped {len(skipped)} file{'s' if len(skipped) != 1 else ''} "
          "holding no tool manifest and no contract test:")
    for item in skipped:
        print(f"  {item.file}: {item.reason}")
    for item in skipped:
        if item.mentions:
            names = ", ".join(f'"{n}"' for n in item.mentions)
            print(f"warning: {item.file} was not edited but mentions {names}: check it by hand",
                  file=sys.stderr)


def _missing_path(exc: FileNotFoundError, as_json: bool) -> int:
    print(f"error: {exc}", file=sys.stderr)
    if as_json:  # the one document on stdout, shaped like a refused edit
        print(json.dumps({"ok": False, "success": False, "revision": None, "changes": None,
                          "errors": [{"code": "not_found", "message": str(exc), "references": []}],
                          "skipped": [], "dry_run": False, "written": False,
                          "existing_problems": 0}, indent=2))
    return 1


def _edit(args: argparse.Namespace, paths: list[str], validator: NewProblems, op: Any,
          *op_args: Any) -> int:
    try:
        result = apply_to_paths(paths or ["."], op, *op_args, base_revision=args.base_revision,
                                validator=validator, write=not args.dry_run)
    except FileNotFoundError as exc:
        return _missing_path(exc, _as_json(args))
    return _report(result, _as_json(args), args.dry_run, validator.kept)


def _as_json(args: argparse.Namespace) -> bool:
    return bool(args.json) or args.output == "json"


def cmd_rename(args: argparse.Namespace) -> int:
    return _edit(args, [*args.paths, *(args.more_paths or [])], NewProblems({args.old: args.new}),
                 rename, args.old, args.new)


def split_tools_and_paths(words: Sequence[str]) -> tuple[list[str], list[str]]:
    """`remove TOOL... [PATHS...]`: a word naming an existing file or folder is a path, any
    other is a tool name (a tool named like a file here can still be removed with --paths)."""
    tools = [w for w in words if not os.path.exists(w)]
    return tools, [w for w in words if os.path.exists(w)]


PATH_SUFFIXES = (".yaml", ".yml", ".json", "/")  # a word ending so meant a path, not a tool


def cmd_remove(args: argparse.Namespace) -> int:
    if args.more_paths is not None:  # --paths given: every positional word is a tool
        tools, paths = list(args.words), list(args.more_paths)
    else:
        tools, paths = split_tools_and_paths(args.words)
    if not tools:
        return fail(args, "usage", f"no tool to remove: {', '.join(args.words)} are all files or "
                    "folders; name the tools first: unwind manifests remove TOOL... [PATHS...]")
    for tool in tools:
        if tool.endswith(PATH_SUFFIXES):
            print(f'note: "{tool}" is not an existing file or folder, so it is read as a tool name',
                  file=sys.stderr)
    return _edit(args, paths, NewProblems(), remove, tools)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("rename", help="rename a tool and every reference to it, in place")
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("paths", nargs="*", metavar="PATHS", help="YAML files or folders (default: .)")
    _common(p)
    p.set_defaults(func=cmd_rename)
    p = subparsers.add_parser(
        "remove", help="remove tools; refused while something else reads them",
        description="Remove tools by name. Each argument naming an existing file or folder is a "
                    "path to edit; the others are tool names.")
    p.add_argument("words", nargs="+", metavar="TOOL_OR_PATH",
                   help="tool names, then YAML files or folders (default: .)")
    _common(p)
    p.set_defaults(func=cmd_remove)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--paths", dest="more_paths", nargs="+", default=None, metavar="PATH",
                   help="YAML files or folders, as an option (kept for scripts; with `remove`, "
                        "every positional argument is then a tool name)")
    p.add_argument("--base-revision", help="refuse with `stale` unless the files are at this revision")
    p.add_argument("--dry-run", action="store_true", help="report the change, write nothing")
    p.add_argument("-o", "--output", choices=("text", "json"), default=None, metavar="FORMAT",
                   help="output format: text or json (default text)")
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # deprecated: -o json
