"""`unwind settle`: record that a person resolved a ledger entry by hand.

Some steps can never succeed (the object they restore was changed by hand, a record was
closed in another system, an upstream went away); a rollback then stays short of
``RolledBack`` and the entry's effect counts as live for good. Settling records that a person
resolved it, who, when and why, through the lifecycle's ``person`` writer (the entry becomes
``settled``); no rollback touches it again, and the ledger's conditions and LIVE count agree.

- In a cluster, ``kubectl unwind settle ledger/RUN ENTRY --reason TEXT`` creates an Approval
  with ``decision: settle`` (as ``kubectl unwind approve`` creates its decisions, through
  kubectl, so credentials behave as kubectl's): the admission webhook stamps who made it,
  the operator writes it into the entry, and the command waits until it shows there.
- Locally, ``unwind settle --ledger FILE ENTRY --reason TEXT [--by NAME]`` writes the entry
  in the ledger file under the run's lock (``--by`` is taken at its word: self-declared).

Either way the settle is in the entry (``settled``) and in the signed evidence
(``unwind ledger export``: ``settles``).
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import secrets
import time
from pathlib import Path
from typing import Any

from ..ledger.entry import Entry, Settlement, now, stamp
from ..operator.identity import APPROVER
from . import plugin_view as view
from .kubectl import Kubectl, add_kube_flags
from .output import emit
from .plugin_cmds import Refusal, _approval_body, _create, _guarded, _read, _timeout
from .plugin_view import UsageError

POLL_SECONDS = 1.0


@_guarded()
def cmd_settle(args: argparse.Namespace) -> int:
    if not (args.reason or "").strip():
        raise UsageError("say what was done by hand: --reason TEXT (it is kept in the ledger "
                         "and the evidence)")
    if args.ledger:
        if args.target and args.entry:
            raise UsageError(f"--ledger settles an entry of a ledger file: drop {args.target}")
        return _settle_file(args, args.entry or args.target)
    if args.by:
        raise UsageError("--by is for local ledgers (--ledger FILE); in a cluster your identity "
                         "comes from your credentials")
    if not args.target or not args.entry:
        raise UsageError("say which entry: settle ledger/RUN ENTRY --reason TEXT (or --ledger "
                         "FILE ENTRY)")
    target = view.parse_target(args.target, ("EffectLedger",))
    return _settle_cluster(args, Kubectl.from_args(args), target)


def _settle_file(args: argparse.Namespace, entry_id: str | None) -> int:
    from ..ledger import rollback_rules as rules
    from ..ledger.filestore import FileStore, LedgerDirError
    from ..ledger.store import EntryMissing, Stale, StoreUnavailable

    if not entry_id:
        raise UsageError("say which entry: settle --ledger FILE ENTRY --reason TEXT")
    path = Path(args.ledger)
    try:
        run = json.loads(path.read_text(encoding="utf-8"))["spec"]["run"]
        store = FileStore(path.parent)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise Refusal(f"{path}: not a ledger file ({exc})") from None
    except LedgerDirError as exc:
        raise Refusal(str(exc)) from None
    moment = now()
    entry = store.get_sync(run, entry_id)
    problem = rules.settle_problem(entry, entry_id, moment)
    if problem is not None:
        raise Refusal(problem)
    assert entry is not None
    by = args.by or os.environ.get("UNWIND_ACTOR") or f"local:{getpass.getuser()}"
    made = Settlement(by=by, identities="self-declared", reason=args.reason.strip(),
                      at=stamp(moment), was=entry.state)
    try:
        settled = store.transition_sync(run, entry_id, rules.settle(entry, made, moment))
    except (EntryMissing, Stale, StoreUnavailable) as exc:
        raise Refusal(str(exc)) from None
    return _said(args, settled, f"run {run}", f"{by} (self-declared)", None)


def _entries(k: Kubectl, first: dict[str, Any]) -> list[dict[str, Any]]:
    out, page, seen = [], first, set()
    while True:
        out += [e for e in (page.get("status") or {}).get("entries") or [] if isinstance(e, dict)]
        nxt = (page.get("status") or {}).get("next")
        if not nxt or nxt in seen:
            return out
        seen.add(nxt)
        page = k.get("effectledger", nxt)


def _find(k: Kubectl, first: dict[str, Any], entry_id: str) -> Entry | None:
    from pydantic import ValidationError

    raw = next((e for e in _entries(k, first) if e.get("id") == entry_id), None)
    try:
        return Entry.model_validate(raw) if raw is not None else None
    except ValidationError:
        return None


def _settle_cluster(args: argparse.Namespace, k: Kubectl, target: view.Target) -> int:
    from ..ledger.rollback_rules import settle_problem

    first = _read(k, target)
    entry = _find(k, first, args.entry)
    problem = settle_problem(entry, args.entry, now())
    if problem is not None:
        raise Refusal(f"{target}: {problem}")
    steps = ((first.get("status") or {}).get("rollback") or {}).get("steps") or []
    running = next((s for s in steps if s.get("entry") == args.entry and s.get("state") == "running"), None)
    if running is not None:
        raise Refusal(f"{target}: entry {args.entry}'s undo step {running.get('index')} is running "
                      f"(Job {running.get('job')}): let it end, then settle what it left")
    spec = {"target": {"effectLedger": target.name, "entry": args.entry}, "decision": "settle",
            "reason": args.reason.strip()}
    created = _create(k, _approval_body(spec), lambda: view.approval_name(
        target.name, "settle", args.entry, secrets.token_hex(4)))
    name = str(view.meta(created).get("name"))
    who = view.annotations_of(created).get(APPROVER.user, "?")
    if args.no_wait:
        return _said(args, None, str(target), who, name, waited=False)
    deadline = time.monotonic() + _timeout(args.timeout)
    while True:
        obj = _read(k, target)
        found = _find(k, obj, args.entry)
        if found is not None and found.state == "settled":
            return _said(args, found, str(target), who, name,
                         live=(obj.get("status") or {}).get("live"))
        if time.monotonic() >= deadline:
            raise Refusal(f"the settle is recorded (Approval {name}, by {who}), but the operator "
                          f"has not written it into entry {args.entry} within {args.timeout} (is "
                          f"it running? `kubectl get events{' -n ' + k.namespace if k.namespace else ''} "
                          f"--field-selector involvedObject.name={target.name}`)")
        time.sleep(POLL_SECONDS)


def _said(args: argparse.Namespace, entry: Entry | None, where: str, who: str,
          approval: str | None, *, waited: bool = True, live: Any = None) -> int:
    if args.output:
        out = {"entry": args.entry or args.target, "ledger": where, "by": who,
               "approval": approval, "settled": entry.settled.model_dump(mode="json")
               if entry is not None and entry.settled else None, "live": live}
        emit(out, args.output)
        return 0
    via = f" (Approval {approval})" if approval else ""
    if not waited:
        print(f"settle of entry {args.entry} of {where} recorded as {who}{via}: the operator "
              "writes it into the entry")
        return 0
    assert entry is not None and entry.settled is not None
    tail = f"; LIVE {live}" if live is not None else ""
    print(f"settled entry {entry.id} ({entry.tool}, was {entry.settled.was}) of {where} as "
          f"{who}{via}: {entry.settled.reason}{tail}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("settle", help="record that a person resolved a ledger entry by hand",
                       description="Record that you resolved a ledger entry by hand (what a "
                       "rollback could not finish): the entry becomes settled, with who, when "
                       "and why, in the ledger and its evidence. In a cluster your identity "
                       "comes from your credentials (an Approval with decision: settle, stamped "
                       "by the admission webhook).")
    p.add_argument("target", metavar="ledger/RUN", nargs="?", help="the run's EffectLedger "
                   "(or, with --ledger, the entry)")
    p.add_argument("entry", metavar="ENTRY", nargs="?", help="the entry id")
    p.add_argument("--reason", metavar="TEXT", required=False, help="what was done by hand (required)")
    p.add_argument("--timeout", default="60s", help="how long to wait for the operator to write it "
                   "into the entry (default 60s)")
    p.add_argument("--no-wait", action="store_true", help="do not wait for the operator")
    local = p.add_argument_group("local ledgers (no cluster)")
    local.add_argument("--ledger", metavar="FILE", help="settle an entry of this local ledger "
                       "file (<ledger-dir>/<run>.json)")
    local.add_argument("--by", metavar="NAME", help="who settles it (self-declared)")
    p.add_argument("-o", "--output", choices=("json", "yaml"), help="machine-readable output")
    add_kube_flags(p)
    p.set_defaults(func=cmd_settle)
