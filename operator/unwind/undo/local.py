"""The local rollback: run a plan's steps in order against a ledger file, and record each.

Each undo is written ahead like a call: the entry becomes ``undoing`` (with the step's
idempotency key) before the upstream sees the undo, then ``undone`` or ``undo_failed``
(with the first mismatch). Killed at any moment and run again, the rollback plans again
from the ledger: undone entries are skipped, an ``undoing`` one runs its step again with
the same key, which the upstream deduplicates, so no undo takes effect twice.

Order: lookups first (an entry found by its lookup is planned again and takes its place
among the undos), then the undos in plan order. A failed step stops the rollback: a later
step may undo what the failed one's effect was built on (``requires``), and a person should
look before anything else changes. Running it again retries from there.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from ..ledger.entry import Entry, EntryError, Handle, now, stamp
from ..ledger.filestore import FileLocks, FileStore, LedgerDirError, write_atomic
from ..ledger.plan import UNDOING, Plan, Selection, Step, Versions, make_plan
from ..ledger.stepinput import StepInput, ledger_identity, step_input
from ..ledger.store import EntryMissing, Stale, StoreUnavailable, lock_name
from ..upstream.client import Upstream
from ..upstream.secrets import Secrets
from .runner import Sleep, run_step
from .sources import SourceError, read_ledger_file

# Entry states an undo may start from (``undoing``: resumed; ``undo_failed``: retried).
UNDOABLE_STATES = frozenset({"succeeded", "undoing", "undo_failed"})
LOOKUP_STATES = frozenset({"uncertain", "pending"})
Report = Callable[[Step, dict[str, Any]], None]


@dataclass
class LocalLedger:
    path: Path
    name: str
    run: str
    store: FileStore
    locks: FileLocks

    def entries(self) -> list[Entry]:
        return self.store.entries_sync(self.run)

    @property
    def identity(self) -> str:
        """The ledger's identity for step keys: the uid the gateway wrote into the file, else
        (an older file) a digest of its first entry (ledger.stepinput)."""
        try:
            meta = json.loads(self.path.read_bytes()).get("metadata") or {}
        except (OSError, ValueError, AttributeError) as exc:
            raise SourceError(f"{self.path}: cannot read the ledger ({exc})") from None
        uid = meta.get("uid") if isinstance(meta, dict) else None
        return ledger_identity(None, uid if isinstance(uid, str) else None, self.entries())


@dataclass
class Summary:
    results: list[dict[str, Any]] = field(default_factory=list)
    stopped: dict[str, Any] | None = None  # the failed step's result
    left: list[Step] = field(default_factory=list)  # not_undoable / unrecoverable

    @property
    def ok(self) -> bool:
        return self.stopped is None


def open_ledger(path: str | Path) -> LocalLedger:
    """A ledger file the rollback may write: the first page ``<run>.json`` in its folder."""
    p = Path(path)
    snap = read_ledger_file(p)
    if p.name != f"{snap.run}.json":
        raise SourceError(f"{p}: a rollback writes the run's ledger in place: give the file "
                          f"{snap.run}.json in the gateway's ledger folder")
    try:
        return LocalLedger(p, snap.name, snap.run, FileStore(p.parent), FileLocks(p.parent))
    except LedgerDirError as exc:
        raise SourceError(str(exc)) from None


def plan_local(ledger: LocalLedger, versions: Versions, selection: Selection,
               moment: datetime | None = None) -> Plan:
    return make_plan(ledger.name, ledger.entries(), versions, now=moment or now(),
                     selection=selection)


async def execute(ledger: LocalLedger, plan: Plan, versions: Versions, selection: Selection, *,
                  by: str, secrets: Secrets, report: Report, sleep: Sleep | None = None,
                  clock: Callable[[], datetime] = now, moment: datetime | None = None,
                  upstream: Upstream | None = None) -> Summary:
    """Run ``plan`` (shown to and confirmed by ``by``; made as of ``moment``, default now)
    and record every outcome. ``upstream``: the client the steps call through (default:
    one of its own, closed at the end; the simulation in tests/sim gives its fake)."""
    summary = Summary()
    own = upstream is None
    if upstream is None:  # a local rollback starts a stdio MCP server as the gateway did
        upstream = Upstream(commands=True)
    extra: dict[str, Any] = {"sleep": sleep} if sleep is not None else {}
    _freeze(ledger, plan, selection, by, clock, None)

    def stops(step: Step, result: dict[str, Any]) -> bool:
        """Report and keep a step's result; True when the rollback stops at it."""
        report(step, result)
        summary.results.append(result)
        if not result["ok"]:
            summary.stopped = result
        return not result["ok"]

    try:
        found = False
        for step in [s for s in plan.steps if s.action == "lookup"]:
            result = await _lookup(ledger, step, versions, upstream, secrets, extra, clock)
            if result is None:
                continue
            if stops(step, result):
                return summary
            found = found or result["outcome"] == "found"
        steps = list(plan.steps)
        if found:  # found entries take their place among the undos
            steps = list(plan_local(ledger, versions, selection, moment or clock()).steps)
        summary.left = [s for s in steps if s.action in ("not_undoable", "unrecoverable")]
        for step in [s for s in steps if s.action in UNDOING]:
            result = await _undo(ledger, step, versions, by, upstream, secrets, extra, clock)
            if result is not None and stops(step, result):
                return summary
        return summary
    finally:
        if own:
            await upstream.aclose()
        _freeze(ledger, plan, selection, by, clock, summary)


async def _lookup(ledger: LocalLedger, step: Step, versions: Versions, upstream: Upstream,
                  secrets: Secrets, extra: dict[str, Any], clock: Callable[[], datetime]
                  ) -> dict[str, Any] | None:
    entry = ledger.store.get_sync(ledger.run, step.entry)
    if entry is None or entry.state not in LOOKUP_STATES:
        return None  # resolved meanwhile
    spec = StepInput.model_validate(step_input(ledger.name, step, entry, versions,
                                               identity=ledger.identity))
    result = await run_step(spec, upstream, secrets, clock=clock, **extra)
    lookup = {k: result.get(k) for k in ("tool", "outcome", "reason", "call", "finished")}

    def change(e: Entry) -> Entry:
        if e.state not in LOOKUP_STATES:
            raise Stale(e.state)
        undo = {**(e.undo or {}), "lookup": lookup}
        if result["outcome"] == "found":
            return e.model_copy(update={"state": "succeeded", "undo": undo,
                                        "handle": Handle.model_validate(result["handle"]),
                                        "warnings": [*e.warnings, "found by its lookup after "
                                                     "the answer was lost"]})
        if result["outcome"] == "not_found":
            return e.model_copy(update={"state": "failed", "undo": undo, "error": EntryError(
                code="not_found", message=f"the lookup found no effect: {result['reason']}")})
        return e.model_copy(update={"undo": undo})
    if not _record(ledger, step, change, result):
        return None
    if result["outcome"] == "not_found":
        _free_key(ledger, entry)
    return result


async def _undo(ledger: LocalLedger, step: Step, versions: Versions, by: str,
                upstream: Upstream, secrets: Secrets, extra: dict[str, Any],
                clock: Callable[[], datetime]) -> dict[str, Any] | None:
    entry = ledger.store.get_sync(ledger.run, step.entry)
    if entry is None or entry.state not in UNDOABLE_STATES:
        return None  # undone meanwhile (another rollback), or no longer undoable
    spec = StepInput.model_validate(step_input(ledger.name, step, entry, versions,
                                               identity=ledger.identity))
    started = stamp(clock())

    def begin(e: Entry) -> Entry:
        if e.state not in UNDOABLE_STATES:
            raise Stale(e.state)
        tries = int((e.undo or {}).get("tries", 0)) + 1
        undo: dict[str, Any] = {"action": step.action, "tool": step.undo_tool,
                                "arguments": step.arguments, "residue": list(step.residue),
                                "idempotency_key": spec.idempotency_key, "by": by,
                                "started": started, "tries": tries}
        if step.requires_approval:
            undo["approved_by"] = {"user": by, "identities": "self-declared"}
        if e.undo and "lookup" in e.undo:
            undo["lookup"] = e.undo["lookup"]
        return e.model_copy(update={"state": "undoing", "undo": undo})
    try:
        ledger.store.update_sync(ledger.run, step.entry, begin)
    except (Stale, EntryMissing):
        return None
    except StoreUnavailable as exc:  # nothing ran: no undo without its record
        return {"ok": False, "ledger": ledger.name, "entry": step.entry, "action": step.action,
                "tool": step.undo_tool, "outcome": "not_started", "entry_state": entry.state,
                "reason": f"the ledger cannot be written, so the undo was not run: {exc}",
                "first_mismatch": None}
    result = await run_step(spec, upstream, secrets, clock=clock, **extra)

    def finish(e: Entry) -> Entry:
        if e.state != "undoing":
            raise Stale(e.state)
        undo = {**(e.undo or {}), **{k: result.get(k) for k in (
            "outcome", "reason", "first_mismatch", "call", "verification", "finished")}}
        return e.model_copy(update={"state": result["entry_state"], "undo": undo})
    if not _record(ledger, step, finish, result):
        return None
    if result["entry_state"] == "undone":
        _free_key(ledger, entry)
    return result


def _record(ledger: LocalLedger, step: Step, change: Callable[[Entry], Entry],
            result: dict[str, Any]) -> bool:
    try:
        ledger.store.update_sync(ledger.run, step.entry, change)
    except (Stale, EntryMissing):
        return False
    except StoreUnavailable as exc:  # the outcome is not recorded: stop, a re-run finishes it
        result.update(ok=False, reason=f"{result['reason']}; but the ledger could not record "
                      f"it: {exc}")
    return True


def _free_key(ledger: LocalLedger, entry: Entry) -> None:
    """An undone (or never happened) entry's key is free again: remove its lock file."""
    if entry.key is None or entry.scope is None:
        return
    name = lock_name(entry.scope, run=ledger.run, actor=entry.actor, tool=entry.tool, key=entry.key)
    # A lock left behind is broken by the gateway: the entry no longer holds its key.
    with contextlib.suppress(OSError):
        ledger.locks.release_entry_sync(name, ledger.run, entry.id)


def _freeze(ledger: LocalLedger, plan: Plan, selection: Selection, by: str,
            clock: Callable[[], datetime], summary: Summary | None) -> None:
    """Keep the plan each rollback ran (``<run>.rollback.json`` beside the ledger): the
    evidence export includes it, as the operator freezes its plan in the ledger status."""
    path = ledger.path.with_name(f"{ledger.run}.rollback.json")
    try:
        history = json.loads(path.read_bytes()).get("rollbacks", [])
    except (OSError, ValueError, AttributeError):
        history = []
    if summary is None:
        history.append({"by": by, "started": stamp(clock()), "entries": list(selection.entries),
                        "since": selection.since, "plan": plan.to_json()})
    elif history:
        history[-1].update(finished=stamp(clock()), ok=summary.ok,
                           stopped_at=summary.stopped["entry"] if summary.stopped else None)
    # The ledger entries hold every outcome; this copy of the plan is for the evidence.
    with contextlib.suppress(OSError):
        write_atomic(path, json.dumps({"ledger": ledger.name, "rollbacks": history},
                                      ensure_ascii=False, indent=1).encode())
