"""`unwind keygen` and `unwind manifests publish|approve|deprecate|rollback|history|diff|
list|verify|check`: thin wrappers that parse flags, call :mod:`unwind.registry`, and print.

Every handler returns an exit code; a refusal is one line ``error: ...`` on stderr and
exit 1, never a traceback, because these commands run in CI logs and pre-merge hooks
where the message is all a person sees.
"""

from __future__ import annotations

import argparse
import functools
import getpass
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from ..registry import (
    FolderStorage,
    HttpStorage,
    Outcome,
    Registry,
    RegistryError,
    VersionRecord,
    generate_keypair,
    load_config,
    load_private_key,
    resolve_trust,
)
from ..registry.storage import Storage
from .main import cmd_validate

Handler = Callable[[argparse.Namespace], int]


def _short(checksum: str) -> str:
    return checksum.removeprefix("sha256:")[:12]


def _emit(value: Any) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False))


def _guarded(func: Handler) -> Handler:
    @functools.wraps(func)
    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except RegistryError as exc:
            print(f"error: {exc.message}", file=sys.stderr)
        except OSError as exc:
            print(f"error: {exc.filename or ''}{': ' if exc.filename else ''}"
                  f"{exc.strerror or exc}", file=sys.stderr)
        return 1
    return run


def _storage(args: argparse.Namespace) -> Storage:
    location = args.registry or load_config().registry
    if "://" in location:
        return HttpStorage(location, getattr(args, "ca_file", None))
    return FolderStorage(location)


def _registry(args: argparse.Namespace) -> Registry:
    return Registry(_storage(args))


def _by(args: argparse.Namespace) -> str:
    by: str | None = args.by or os.environ.get("USER")
    if not by:
        try:
            by = getpass.getuser()
        except (KeyError, OSError) as exc:
            raise RegistryError("invalid", "who is making the change? pass --by NAME") from exc
    return by


def _key(args: argparse.Namespace) -> Any:
    return load_private_key(args.key) if args.key else None


def _outcome_line(o: Outcome) -> str:
    r = o.record
    if not o.changed:
        return f"{r.tool}  v{r.version}  {r.lifecycle}  {_short(r.checksum)}  unchanged"
    if r.action == "approve":
        return f"{r.tool}  v{r.version}  approved by {r.approved_by}"
    extra = {"deprecate": f"  replaced by {r.manifest.get('replaced_by')}"
             if r.manifest.get("replaced_by") else "",
             "rollback": f"  rolled back to v{r.source_version}"}.get(r.action, "")
    return f"{r.tool}  v{r.version}  {r.lifecycle}  {_short(r.checksum)}{extra}"


def _report(outcomes: list[Outcome], as_json: bool) -> int:
    if as_json:
        _emit([{**o.record.to_json(), "changed": o.changed} for o in outcomes])
    else:
        for o in outcomes:
            print(_outcome_line(o))
    return 0


def _history_line(r: VersionRecord) -> str:
    who = f"by {r.by}" + (f", approved by {r.approved_by}" if r.approved_by else "")
    signed = f"signed {r.signature.key_id}" if r.signature else "unsigned"
    note = f"  - {r.note}" if r.note else ""
    return f"v{r.version:<3} {r.lifecycle:<10} {r.created}  {who}  {_short(r.checksum)}  {signed}{note}"


@_guarded
def cmd_keygen(args: argparse.Namespace) -> int:
    key_path, pub_path, kid = generate_keypair(args.path)
    print(f"wrote {key_path} (private: keep it secret) and {pub_path}; key id {kid}")
    return 0


@_guarded
def cmd_publish(args: argparse.Namespace) -> int:
    outcomes = _registry(args).publish(args.paths, by=_by(args), status=args.status,
                                       key=_key(args), note=args.note)
    return _report(outcomes, args.json)


@_guarded
def cmd_approve(args: argparse.Namespace) -> int:
    outcome = _registry(args).approve(args.tool, by=_by(args), version=args.version,
                                      four_eyes=args.four_eyes, key=_key(args), note=args.note)
    return _report([outcome], args.json)


@_guarded
def cmd_deprecate(args: argparse.Namespace) -> int:
    outcome = _registry(args).deprecate(args.tool, by=_by(args), replaced_by=args.replaced_by,
                                        key=_key(args), note=args.note)
    return _report([outcome], args.json)


@_guarded
def cmd_rollback(args: argparse.Namespace) -> int:
    outcome = _registry(args).rollback(args.tool, args.n, by=_by(args), key=_key(args),
                                       note=args.note)
    return _report([outcome], args.json)


@_guarded
def cmd_history(args: argparse.Namespace) -> int:
    records = _registry(args).history(args.tool)
    if args.json:
        _emit([r.to_json() for r in records])
    else:
        for r in records:
            print(_history_line(r))
    return 0


@_guarded
def cmd_diff(args: argparse.Namespace) -> int:
    text = _registry(args).diff(args.tool, args.a, args.b)
    print(text, end="" if text.endswith("\n") or not text else "\n")
    return 0


@_guarded
def cmd_list(args: argparse.Namespace) -> int:
    summaries = _registry(args).list()
    if args.json:
        _emit([{"tool": s.tool, "newest": s.newest.to_json(),
                "enforced": s.enforced.version if s.enforced else None} for s in summaries])
        return 0
    for s in summaries:
        enforced = f"enforced v{s.enforced.version}" if s.enforced else "not enforced (draft only)"
        print(f"{s.tool}  v{s.newest.version}  {s.newest.lifecycle}  "
              f"{_short(s.newest.checksum)}  {enforced}")
    return 0


@_guarded
def cmd_verify(args: argparse.Namespace) -> int:
    trust = resolve_trust(args.trust, load_config())
    registry = _registry(args)
    problems = registry.verify(trust)
    count = sum(s.versions for s in registry.list())
    if args.json:
        _emit({"ok": not problems, "trusted_keys": len(trust) if trust else 0,
               "problems": [p.to_json() for p in problems]})
    else:
        for p in problems:
            print(f"error: {p}", file=sys.stderr)
        how = f"signatures checked against {len(trust)} trusted key(s)" if trust else \
            "checksums only (no trusted key: pass --trust or set UNWIND_MANIFEST_PUBLIC_KEY)"
        status = "ok" if not problems else f"{len(problems)} problem(s)"
        print(f"{status}: {count} versions checked, {how}", file=sys.stderr if problems else sys.stdout)
    return 1 if problems else 0


def register_keygen(subparsers: Any) -> None:
    p = subparsers.add_parser("keygen", help="make an Ed25519 key pair for signing manifests",
                              description="Write PATH.key (private, mode 0600) and PATH.pub.")
    p.add_argument("path", metavar="PATH")
    p.set_defaults(func=cmd_keygen)


def register_manifests(subparsers: Any) -> None:
    """Add the registry commands to the `unwind manifests` sub-command group."""

    def add(name: str, func: Handler, help_text: str, writes: bool = False) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = subparsers.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--registry", help="registry folder or https:// URL (default: manifests: "
                       "in unwind.yaml, else ./registry)")
        if writes:
            p.add_argument("--by", help="who makes the change (default: $USER)")
            p.add_argument("--key", help="private key (PEM) to sign the new version with")
            p.add_argument("--note", help="a note kept with the version")
        p.add_argument("--json", action="store_true", help="print JSON")
        p.set_defaults(func=func)
        return p

    p = add("publish", cmd_publish, "add manifest files or folders as new versions", writes=True)
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.add_argument("--status", choices=["draft", "approved"], default="draft",
                   help="lifecycle of the new versions; overrides the files' lifecycle")
    p = add("approve", cmd_approve, "approve a draft (a new, approved version)", writes=True)
    p.add_argument("tool")
    p.add_argument("--version", type=int, help="the draft to approve (default: the newest)")
    p.add_argument("--four-eyes", action="store_true",
                   help="refuse when the approver is the draft's author")
    p = add("deprecate", cmd_deprecate, "deprecate the approved version of a tool", writes=True)
    p.add_argument("tool")
    p.add_argument("--replaced-by", help="the tool to use instead (must be approved)")
    p = add("rollback", cmd_rollback, "publish an old version again as the newest", writes=True)
    p.add_argument("tool")
    p.add_argument("n", type=int, metavar="N")
    p = add("history", cmd_history, "list a tool's versions, oldest first")
    p.add_argument("tool")
    p = add("diff", cmd_diff, "unified diff of two versions of a tool")
    p.add_argument("tool")
    p.add_argument("a", type=int, metavar="A")
    p.add_argument("b", type=int, metavar="B")
    add("list", cmd_list, "each tool's newest and enforced versions")
    p = add("verify", cmd_verify, "check every checksum and signature; exit 1 on a problem")
    p.add_argument("--trust", action="append", metavar="PEM",
                   help="trusted public key file (repeatable; default: "
                   "$UNWIND_MANIFEST_PUBLIC_KEY, then manifest_public_key in unwind.yaml)")
    for name in ("list", "verify", "history"):
        subparsers.choices[name].add_argument("--ca-file", help="CA bundle for an https registry")
    p = subparsers.add_parser("check", help="validate plain manifest files",
                              description="Validate plain manifest files (like `unwind validate`).")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_validate)  # the same check as `unwind validate`
