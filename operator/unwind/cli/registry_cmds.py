"""`unwind keygen` and `unwind manifests publish|approve|deprecate|rollback|sign-index|
history|diff|list|verify|check`: thin wrappers that parse flags, call :mod:`unwind.registry`,
and print.

Every handler returns an exit code; a refusal is one line ``error: ...`` on stderr and
exit 1, never a traceback, because these commands run in CI logs and pre-merge hooks
where the message is all a person sees. With ``--json`` (or ``-o json|yaml``) stdout is
one document, the refusal included (``{"ok": false, "error": {"code", "message"}}``).
"""

from __future__ import annotations

import argparse
import functools
import getpass
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
from ..registry.config import signing_key_path
from ..registry.index import format_time
from ..registry.records import IndexEntry
from ..registry.storage import Storage
from .check_cmds import add_input_args, cmd_validate
from .output import add_output_flags, emit, fail, machine, output_format, plural, table
from .scaffold_cmds import register_scaffold

Handler = Callable[[argparse.Namespace], int]


def _short(checksum: str) -> str:
    return checksum.removeprefix("sha256:")[:12]


def _guarded(func: Handler, error_code: int = 1) -> Handler:
    @functools.wraps(func)
    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except RegistryError as exc:
            return fail(args, exc.code, exc.message, error_code)
        except OSError as exc:
            where = f"{exc.filename}: " if exc.filename else ""
            return fail(args, "io", f"{where}{exc.strerror or exc}", error_code)
    return run


def version_number(text: str) -> int:
    """A version as people write it: ``2`` or ``v2``."""
    digits = text[1:] if text[:1] in ("v", "V") else text
    if not digits.isascii() or not digits.isdigit() or int(digits) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a version: write 2 or v2")
    return int(digits)


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
    if hasattr(args, "key"):  # a writer: what it accepts the current index from, and whether
        # readers trust keys at all (then an unsigned write is refused)
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
    path = signing_key_path(args.key, load_config())
    return load_private_key(path) if path else None


def _enforcement(r: VersionRecord, enforced: IndexEntry | None) -> str:
    """What a gateway enforces for the tool after this change."""
    if enforced is None:
        return "not enforced: no approved version"
    if enforced.version == r.version:
        return "enforced"
    return f"v{enforced.version} stays enforced"


def _outcome_line(o: Outcome, enforced: IndexEntry | None) -> str:
    r = o.record
    now = _enforcement(r, enforced)
    if not o.changed:
        return f"{r.tool}  v{r.version}  {r.lifecycle}  {_short(r.checksum)}  unchanged  ({now})"
    if r.action == "approve":
        return f"{r.tool}  v{r.version}  approved by {r.approved_by}  ({now})"
    extra = {"deprecate": f"  replaced by {r.manifest.get('replaced_by')}"
             if r.manifest.get("replaced_by") else "",
             "rollback": f"  rolled back to v{r.source_version}"
             + (", a draft" if r.lifecycle == "draft" else "")}.get(r.action, "")
    return f"{r.tool}  v{r.version}  {r.lifecycle}  {_short(r.checksum)}{extra}  ({now})"


def _report(registry: Registry, outcomes: list[Outcome], args: argparse.Namespace) -> int:
    enforced = {o.record.tool: registry.enforced(o.record.tool) for o in outcomes}
    if machine(args):
        emit([{**o.record.to_json(), "changed": o.changed,
               "enforced": e.version if (e := enforced[o.record.tool]) else None}
              for o in outcomes], output_format(args))
    else:
        for o in outcomes:
            print(_outcome_line(o, enforced[o.record.tool]))
    return 0


def _history_row(r: VersionRecord) -> list[str]:
    return [f"v{r.version}", r.lifecycle, r.created, r.by, r.approved_by or "-",
            _short(r.checksum), r.signature.key_id if r.signature else "unsigned", r.note or ""]


def key_base(path: str) -> str:
    """`keygen keys/bob` and `keygen keys/bob.key` both mean keys/bob.key and keys/bob.pub."""
    for suffix in (".key", ".pub"):
        if path.endswith(suffix) and len(path) > len(suffix):
            return path[: -len(suffix)]
    return path


@_guarded
def cmd_keygen(args: argparse.Namespace) -> int:
    key_path, pub_path, kid = generate_keypair(key_base(args.path))
    print(f"wrote {key_path} (private: keep it secret) and {pub_path}; key id {kid}")
    return 0


@_guarded
def cmd_publish(args: argparse.Namespace) -> int:
    registry = _registry(args)
    outcomes = registry.publish(args.paths, by=_by(args), status=args.status, key=_key(args),
                                note=args.note)
    return _report(registry, outcomes, args)


def approval_order(registry: Registry, tools: list[str]) -> list[str]:
    """The tools given, each after the tools it names among them (its undo, its read-back,
    what it requires...): an approved version may only name tools that are approved. Tools
    that do not depend on each other keep the order they were given in."""
    from ..manifest.validate import tool_references, validate_manifest

    graph: dict[str, set[str]] = {}
    for tool in dict.fromkeys(tools):
        newest = registry.history(tool)[-1]
        manifest, _ = validate_manifest(newest.manifest)
        names = {name for _, name in tool_references(manifest)} if manifest else set()
        graph[tool] = (names & set(tools)) - {tool}
    order: list[str] = []
    while len(order) < len(graph):
        ready = next((t for t in graph if t not in order and graph[t] <= set(order)), None)
        if ready is None:
            left = ", ".join(t for t in graph if t not in order)
            raise RegistryError("invalid", f"{left} name each other in a cycle: no order "
                                "approves each after the tools it names")
        order.append(ready)
    return order


@_guarded
def cmd_approve(args: argparse.Namespace) -> int:
    registry = _registry(args)
    if args.version is not None and len(args.tools) > 1:
        raise RegistryError("invalid", "--version names one draft: approve one tool with it")
    outcomes = []
    for tool in approval_order(registry, args.tools):
        outcomes.append(registry.approve(tool, by=_by(args), version=args.version,
                                         four_eyes=args.four_eyes, key=_key(args), note=args.note))
    return _report(registry, outcomes, args)


@_guarded
def cmd_deprecate(args: argparse.Namespace) -> int:
    registry = _registry(args)
    outcome = registry.deprecate(args.tool, by=_by(args), replaced_by=args.replaced_by,
                                 key=_key(args), note=args.note)
    return _report(registry, [outcome], args)


@_guarded
def cmd_rollback(args: argparse.Namespace) -> int:
    registry = _registry(args)
    outcome = registry.rollback(args.tool, args.n, by=_by(args), key=_key(args), note=args.note)
    return _report(registry, [outcome], args)


def _index_line(index: RegistryIndex, where: str, now: datetime) -> str:
    if index.signature is None or index.expires is None:
        folder = os.path.dirname(where) if "://" not in where else "DIR"
        return (f"index: generation {index.generation}, not signed: review it, then sign it "
                f"with `unwind manifests sign-index --registry {folder} --key KEY`")
    line = (f"index: generation {index.generation}, signed by {index.signature.key_id}, "
            f"expires {format_time(index.expires)}")
    left = index.expires - now
    if timedelta(0) < left < timedelta(days=7):
        line += (f" (in {plural(left.days, 'day')} {left.seconds // 3600} h: re-sign it soon, "
                 "with sign-index)")
    return line


@_guarded
def cmd_sign_index(args: argparse.Namespace) -> int:
    registry = _registry(args)
    index = registry.sign_index(load_private_key(args.key))
    where = registry.storage.location()
    if machine(args):
        emit({"index": where, "generation": index.generation,
              "expires": format_time(index.expires) if index.expires else None,
              "key_id": index.signature.key_id if index.signature else None}, output_format(args))
    else:
        print(f"signed {where}: " + _index_line(index, where, datetime.now(UTC)).removeprefix("index: "))
    return 0


@_guarded
def cmd_history(args: argparse.Namespace) -> int:
    registry = _registry(args)
    records = registry.history(args.tool)
    if machine(args):
        emit([r.to_json() for r in records], output_format(args))
    else:
        print(table([_history_row(r) for r in records],
                    ["VERSION", "LIFECYCLE", "CREATED", "BY", "APPROVED BY", "CHECKSUM", "SIGNED BY",
                     "NOTE"]))
        enforced = registry.enforced(args.tool)
        print(f"enforced: v{enforced.version}" if enforced else
              "enforced: none (only drafts: approve one)")
    return 0


def _diff(args: argparse.Namespace) -> int:
    registry = _registry(args)
    text = registry.diff(args.tool, args.a, args.b)
    if machine(args):
        a, b = (registry.version(args.tool, n) for n in (args.a, args.b))
        emit({"tool": args.tool, "a": {"version": a.version, "checksum": a.checksum,
                                       "manifest": a.manifest},
              "b": {"version": b.version, "checksum": b.checksum, "manifest": b.manifest},
              "equal": not text, "diff": text}, output_format(args))
    else:
        print(text or f"{args.tool} v{args.a} and v{args.b} are the same manifest",
              end="" if text.endswith("\n") else "\n")
    return 1 if text else 0


cmd_diff = _guarded(_diff, error_code=2)  # like diff(1): 0 same, 1 different, 2 trouble


@_guarded
def cmd_list(args: argparse.Namespace) -> int:
    summaries = _registry(args).list()
    if machine(args):
        emit([{"tool": s.tool, "newest": s.newest.to_json(),
               "enforced": s.enforced.version if s.enforced else None} for s in summaries],
             output_format(args))
        return 0
    rows = [[s.tool, f"v{s.newest.version}", s.newest.lifecycle, _short(s.newest.checksum),
             f"v{s.enforced.version}" if s.enforced else "none (draft only)"] for s in summaries]
    print(table(rows, ["TOOL", "NEWEST", "LIFECYCLE", "CHECKSUM", "ENFORCED"]))
    if not summaries:
        print(f"(no tools: {plural(0, 'version')} published yet)")
    return 0


@_guarded
def cmd_verify(args: argparse.Namespace) -> int:
    trust = resolve_trust(args.trust, load_config())
    registry = _registry(args)
    problems = registry.verify(trust, min_generation=args.min_generation)
    index = registry.read_index()
    count = sum(len(entries) for entries in index.tools.values())
    where = registry.storage.location()
    if machine(args):
        emit({"ok": not problems, "trusted_keys": len(trust) if trust else 0,
               "index": {"location": where, "generation": index.generation,
                         "expires": format_time(index.expires) if index.expires else None,
                         "signed_by": index.signature.key_id if index.signature else None},
               "problems": [p.to_json() for p in problems]}, output_format(args))
    else:
        for p in problems:
            print(f"error: {p}", file=sys.stderr)
        how = f"signatures checked against {plural(len(trust), 'trusted key')}" if trust else \
            "checksums only (no trusted key: pass --trust or set UNWIND_MANIFEST_PUBLIC_KEY)"
        status = "ok" if not problems else plural(len(problems), "problem")
        out = sys.stderr if problems else sys.stdout
        print(f"{status}: {plural(count, 'version')} checked, {how}", file=out)
        print(_index_line(index, where, datetime.now(UTC)), file=out)
    return 1 if problems else 0


def register_keygen(subparsers: Any) -> None:
    p = subparsers.add_parser("keygen", help="make an Ed25519 key pair for signing manifests",
                              description="Write PATH.key (private, mode 0600) and PATH.pub; "
                              "PATH is a base name (keys/bob and keys/bob.key both write "
                              "keys/bob.key and keys/bob.pub). Never overwrites a key.")
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
                           "index with (default: $UNWIND_SIGNING_KEY, then signing_key in "
                           "unwind.yaml; required once the index is signed or a key is trusted)")
            p.add_argument("--note", help="a note kept with the version")
        if writes or name == "sign-index":
            p.add_argument("--index-ttl", metavar="DURATION",
                           help="how long the signed index stays valid (default 30d)")
            p.add_argument("--trust", action="append", metavar="PEM",
                           help="also accept the current index signed by this key (repeatable; "
                           "default: $UNWIND_MANIFEST_PUBLIC_KEY, then unwind.yaml)")
        add_output_flags(p)
        p.set_defaults(func=func)
        return p

    p = add("publish", cmd_publish, "add manifest files or folders as new versions", writes=True)
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.add_argument("--status", choices=["draft", "approved"], default="draft",
                   help="lifecycle of the new versions; overrides the files' lifecycle")
    p = add("approve", cmd_approve, "approve drafts (each a new, approved version), in "
            "dependency order", writes=True)
    p.add_argument("tools", nargs="+", metavar="TOOL")
    p.add_argument("--version", type=version_number,
                   help="the draft to approve, 2 or v2 (default: the newest; one tool only)")
    p.add_argument("--four-eyes", action="store_true",
                   help="refuse when the approver is the draft's author")
    p = add("deprecate", cmd_deprecate, "deprecate the approved version of a tool", writes=True)
    p.add_argument("tool")
    p.add_argument("--replaced-by", help="the tool to use instead (must be approved)")
    p = add("rollback", cmd_rollback, "publish an old version again as the newest", writes=True)
    p.add_argument("tool")
    p.add_argument("n", type=version_number, metavar="N", help="the version, 2 or v2")
    p = add("sign-index", cmd_sign_index, "sign the index as it is: a new generation and "
            "expiry (for an unsigned registry, and on a schedule before it expires)")
    p.add_argument("--key", required=True, help="private key (PEM) to sign the index with")
    p = add("history", cmd_history, "list a tool's versions, oldest first")
    p.add_argument("tool")
    p = add("diff", cmd_diff, "unified diff of two versions of a tool; exit 0 when they are "
            "the same, 1 when they differ, 2 on an error")
    p.add_argument("tool")
    p.add_argument("a", type=version_number, metavar="A", help="a version, 2 or v2")
    p.add_argument("b", type=version_number, metavar="B")
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
    p = subparsers.add_parser("check", help="validate manifest files (like `unwind validate`)",
                              description="Validate manifest files (the same check as `unwind "
                              "validate`).")
    p.add_argument("paths", nargs="+", metavar="PATH")
    add_input_args(p)
    add_output_flags(p)
    p.set_defaults(func=cmd_validate)  # the same check as `unwind validate`
    register_scaffold(subparsers)
