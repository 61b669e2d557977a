"""`unwind gateway` (local mode) and `unwind approve|deny --ledger FILE` (local approvals).

Local mode is the gateway without a cluster: manifests from plain files (unsigned, and the
log says so), one ledger file per run, secrets from a folder or the environment. Local
approvals write the decision into the ledger file; the approver's identity is whatever
``--by`` says (the entry records that identities are self-declared).
"""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import os
import sys
from pathlib import Path

DEFAULT_LISTEN = "127.0.0.1:8787"


def _listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--listen {text}: give HOST:PORT, e.g. {DEFAULT_LISTEN}")
    return host.strip("[]") or "127.0.0.1", int(port)


def cmd_gateway(args: argparse.Namespace) -> int:
    import uvicorn

    from ..gateway.app import build_app
    from ..gateway.catalogue import LocalCatalogue
    from ..gateway.enforce import Gateway, Settings
    from ..gateway.secrets import LocalSecrets
    from ..gateway.upstream import Upstream
    from ..ledger.filestore import FileLocks, FileStore, LedgerDirError
    from ..ledger.memory import MemoryLocks, MemoryStore
    from ..ledger.store import Locks, Store, run_problem

    logging.basicConfig(level=getattr(logging, args.log_level.upper()), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        host, port = _listen(args.listen)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    run = args.run or os.environ.get("UNWIND_RUN") or None
    if run and run_problem(run):
        print(f"error: --run: {run_problem(run)}", file=sys.stderr)
        return 1
    scopes = frozenset(s.strip() for s in (args.scopes or os.environ.get("UNWIND_SCOPES", "")).split(",")
                       if s.strip())
    store: Store
    locks: Locks
    if args.benchmark_memory_store:
        store, locks = MemoryStore(), MemoryLocks()
        logging.getLogger("unwind.gateway").warning("ledger in memory (benchmark only): "
                                                    "nothing is written ahead")
    else:
        if not args.ledger_dir:
            print("error: --ledger-dir is required: the folder for the run ledgers", file=sys.stderr)
            return 1
        try:
            store, locks = FileStore(args.ledger_dir), FileLocks(args.ledger_dir)
        except LedgerDirError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # one line per upstream call is ours
    catalogue = LocalCatalogue(args.manifests)
    if not scopes:
        logging.getLogger("unwind.gateway").warning(
            "no --scopes: every call is refused (permission_denied); give e.g. --scopes "
            "payments:write,repo:write (or '*' for all)")
    settings = Settings(scopes=scopes, actor=args.actor or os.environ.get("UNWIND_ACTOR")
                        or f"local:{getpass.getuser()}")
    gateway = Gateway(catalogue, store, locks, Upstream(), LocalSecrets(args.secrets_dir), settings)
    app = build_app(gateway, default_run=run, host=host)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                            lifespan="on", timeout_graceful_shutdown=5)
    uvicorn.Server(config).run()
    return 0


def cmd_local_decide(args: argparse.Namespace) -> int:
    """Record an approve or deny decision in a local ledger file, and tally it."""
    from ..ledger.decide import add_decision, tally_entry
    from ..ledger.entry import ApprovalDecision, now, stamp
    from ..ledger.filestore import FileStore, LedgerDirError
    from ..ledger.store import EntryMissing, Stale, StoreUnavailable
    from ..ledger.ulid import new_ulid

    decision = "deny" if args.command == "deny" or args.deny else "approve"
    missing = [flag for flag, value in (("--entry", args.entry), ("--by", args.by)) if not value]
    if missing:
        print(f"error: --ledger needs {' and '.join(missing)}: which entry, and who decides",
              file=sys.stderr)
        return 1
    path = Path(args.ledger)
    try:
        run = json.loads(path.read_text(encoding="utf-8"))["spec"]["run"]
        store = FileStore(path.parent)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"error: {path}: not a ledger file ({exc})", file=sys.stderr)
        return 1
    except LedgerDirError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    made = ApprovalDecision(name=f"local-{new_ulid().lower()}", user=args.by,
                            groups=list(args.group or []), decision=decision,
                            reason=args.reason or "", created=stamp())
    try:
        entry = store.update_sync(run, args.entry, add_decision(run, made, now()))
    except (EntryMissing, Stale, StoreUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    assert entry.approval is not None
    verb = "approved" if decision == "approve" else "denied"
    groups = f"; groups {', '.join(made.groups)}" if made.groups else ""
    print(f"{verb} entry {entry.id} ({entry.tool}) of run {run} as {made.user} (self-declared"
          f"{groups}): {entry.approval.message}")
    ignored = dict(tally_entry(run, entry, now()).ignored)
    if made.name in ignored:
        print(f"note: your decision does not count: {ignored[made.name]}", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("gateway", help="run the gateway in local mode (no cluster)",
                       description="Serve POST /call/<tool> and /mcp from plain manifest files, "
                       "writing each run's ledger to <ledger-dir>/<run>.json before any upstream "
                       "call. See docs/gateway.md.")
    p.add_argument("--manifests", nargs="+", required=True, metavar="PATH",
                   help="manifest files or folders (validated as a set, unsigned)")
    p.add_argument("--ledger-dir", metavar="DIR", help="folder for the run ledgers (created if "
                   "missing; must be writable)")
    p.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                   help=f"where to listen (default {DEFAULT_LISTEN})")
    p.add_argument("--scopes", metavar="P1,P2", help="permissions calls may use, comma-separated "
                   "('*' for all; default UNWIND_SCOPES, else none)")
    p.add_argument("--actor", metavar="NAME", help="who the calls are made as (default "
                   "UNWIND_ACTOR, else local:<user>)")
    p.add_argument("--run", metavar="NAME", help="the run when a request sends no X-Unwind-Run "
                   "(default UNWIND_RUN)")
    p.add_argument("--secrets-dir", metavar="DIR", help="secrets as DIR/<name>/<key> files "
                   "(the environment's UNWIND_SECRET_<NAME>_<KEY> is read too)")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.add_argument("--benchmark-memory-store", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_gateway)
