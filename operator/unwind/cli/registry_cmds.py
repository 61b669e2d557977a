"""`unwind keygen` and `unwind manifests publish|approve|deprecate|rollback|sign-index|
history|diff|list|verify|check`: thin wrappers that parse flags, call :mod:`unwind.registry`,
and print.

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
from datetime import UTC, datetime, timedelta
from typing import Any

from ..manifest.durations import parse_duration
from ..registry import (
    DEFAULT_INDEX_TTL,
    FileGenerations,
    FolderStorage,
    Generations,
    HttpStorage,
    Outcome,
    Registry,
    RegistryError,
    RegistryIndex,
    VersionRecord,
    default_state_file,
    generate_keypair,
    load_config,
    load_private_key,
    resolve_trust,
)
from ..registry.index import format_time
from ..registry.storage import Storage
from .check_cmds import cmd_validate

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


def _generations(args: argparse.Namespace, storage: Storage) -> Generations | None:
    """The state file of accepted index generations: --generation-state, else the default
    file for an https registry (a rollback there is an attack), else none (a folder is
    usually a git checkout, where going back to an older commit is normal)."""
    if getattr(args, "no_generation_state", False):
        return None
    path = getattr(args, "generation_state", None)
    if path:
        return FileGenerations(path)
    return FileGenerations(default_state_file()) if "://" in storage.location() else None


def _index_ttl(args: argparse.Namespace) -> timedelta:
    value = getattr(args, "index_ttl", None)
    if value is None:
        return DEFAULT_INDEX_TTL
    if value.strip().isdigit():  # a duration field's bare number means ms: 30 would expire at once
        raise RegistryError("invalid", f"--index-ttl: give {value!r} a unit, such as 30d or 12h")
    try:
        return timedelta(milliseconds=parse_duration(value))
    except ValueError as exc:
        raise RegistryError("invalid", f"--index-ttl: {exc}") from exc


def _registry(args: argparse.Namespace) -> Registry:
    storage = _storage(args)
    writer_trust = None
    if getattr(args, "key", None) is not None:  # what a writer accepts the current index from
        writer_trust = resolve_trust(getattr(args, "trust", None), load_config())
    return Registry(storage, generations=_generations(args, storage), trust=writer_trust,
                    index_ttl=_index_ttl(args))


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


def _index_line(index: RegistryIndex, where: str, now: datetime) -> str:
    if index.signature is None or index.expires is None:
        folder = os.path.dirname(where) if "://" not in where else "DIR"
        return (f"index: generation {index.generation}, not signed: review it, then sign it "
                f"with `unwind manifests sign-index --registry {folder} --key KEY`")
    line = (f"index: generation {index.generation}, signed by {index.signature.key_id}, "
            f"expires {format_time(index.expires)}")
    left = index.expires - now
    if timedelta(0) < left < timedelta(days=7):
        line += f" (in {left.days} day(s) {left.seconds // 3600} h: re-sign it soon, with sign-index)"
    return line


@_guarded
def cmd_sign_index(args: argparse.Namespace) -> int:
    registry = _registry(args)
    index = registry.sign_index(load_private_key(args.key))
    where = registry.storage.location()
    if args.json:
        _emit({"index": where, "generation": index.generation,
               "expires": format_time(index.expires) if index.expires else None,
               "key_id": index.signature.key_id if index.signature else None})
    else:
        print(f"signed {where}: " + _index_line(index, where, datetime.now(UTC)).removeprefix("index: "))
    return 0


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
    problems = registry.verify(trust, min_generation=args.min_generation)
    index = registry.read_index()
    count = sum(len(entries) for entries in index.tools.values())
    where = registry.storage.location()
    if args.json:
        _emit({"ok": not problems, "trusted_keys": len(trust) if trust else 0,
               "index": {"location": where, "generation": index.generation,
                         "expires": format_time(index.expires) if index.expires else None,
                         "signed_by": index.signature.key_id if index.signature else None},
               "problems": [p.to_json() for p in problems]})
    else:
        for p in problems:
            print(f"error: {p}", file=sys.stderr)
        how = f"signatures checked against {len(trust)} trusted key(s)" if trust else \
            "checksums only (no trusted key: pass --trust or set UNWIND_MANIFEST_PUBLIC_KEY)"
        status = "ok" if not problems else f"{len(problems)} problem(s)"
        out = sys.stderr if problems else sys.stdout
        print(f"{status}: {count} versions checked, {how}", file=out)
        print(_index_line(index, where, datetime.now(UTC)), file=out)
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
            p.add_argument("--key", help="private key (PEM) to sign the new version and the "
                           "index with (required once the index is signed)")
            p.add_argument("--note", help="a note kept with the version")
        if writes or name == "sign-index":
            p.add_argument("--index-ttl", metavar="DURATION",
                           help="how long the signed index stays valid (default 30d)")
            p.add_argument("--trust", action="append", metavar="PEM",
                           help="also accept the current index signed by this key (repeatable; "
                           "default: $UNWIND_MANIFEST_PUBLIC_KEY, then unwind.yaml)")
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
    p = add("sign-index", cmd_sign_index, "sign the index as it is: a new generation and "
            "expiry (for an unsigned registry, and on a schedule before it expires)")
    p.add_argument("--key", required=True, help="private key (PEM) to sign the index with")
    p = add("history", cmd_history, "list a tool's versions, oldest first")
    p.add_argument("tool")
    p = add("diff", cmd_diff, "unified diff of two versions of a tool")
    p.add_argument("tool")
    p.add_argument("a", type=int, metavar="A")
    p.add_argument("b", type=int, metavar="B")
    add("list", cmd_list, "each tool's newest and enforced versions")
    p = add("verify", cmd_verify, "check the index and every checksum and signature; exit 1 "
            "on a problem")
    p.add_argument("--trust", action="append", metavar="PEM",
                   help="trusted public key file (repeatable; default: "
                   "$UNWIND_MANIFEST_PUBLIC_KEY, then manifest_public_key in unwind.yaml)")
    p.add_argument("--min-generation", type=int, metavar="N",
                   help="refuse an index whose generation is below N")
    p.add_argument("--generation-state", metavar="FILE",
                   help="remember accepted generations in FILE and refuse lower ones (default "
                   "for an https registry: ~/.cache/unwind/registry-generations.json)")
    p.add_argument("--no-generation-state", action="store_true",
                   help="neither read nor record accepted generations")
    for name in ("list", "verify", "history"):
        subparsers.choices[name].add_argument("--ca-file", help="CA bundle for an https registry")
    p = subparsers.add_parser("check", help="validate plain manifest files",
                              description="Validate plain manifest files (like `unwind validate`).")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_validate)  # the same check as `unwind validate`
