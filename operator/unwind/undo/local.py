"""The local rollback: fence the run, wait for its calls in flight, then run a plan's steps in
order against a ledger file, and record each.

First the run is closed to new calls (``FileStore.fence_sync``: the fence is written into
the run's first page under the run's lock, which every gateway's write-ahead holds too),
the entries still awaiting approval are denied (their call never runs), and the rollback
waits until every call written ahead has finished or passed its deadline (``say`` reports
what it waits for). Only then is the plan made, with the holders of the pending entries'
key locks (``ledger/rollback_rules.py``: the rules the operator's rollback uses too).

Each undo is written ahead like a call: the entry becomes ``undoing`` (with the step's
idempotency key) before the upstream sees the undo, then ``undone`` or ``undo_failed``
(with the first mismatch). Killed at any moment and run again, the rollback plans again
from the ledger: undone entries are skipped, an ``undoing`` one runs its step again with
the same key, which the upstream deduplicates, so no undo takes effect twice.

Order: lookups first (an entry found by its lookup is planned again and takes its place
among the undos), then the undos in plan order (entries on one object newest first). An
undo whose object the undo of an older entry removed is recorded ``moot`` and calls nothing
(``ledger/objects.py``). A failed step stops the rollback: a later
step may undo what the failed one's effect was built on (``requires``), and a person should
look before anything else changes. Running it again retries from there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from ..ledger import rollback_rules as rules
from ..ledger.entry import Entry, now, parse_stamp, stamp
from ..ledger.fence import Fence
from ..ledger.filestore import FileLocks, FileStore, LedgerDirError, write_atomic
from ..ledger.lifecycle import AnyWrite, deadline_passed
from ..ledger.objects import moot_reason
from ..ledger.plan import UNDOING, Plan, Selection, Step, Versions, make_plan, never_ran
from ..ledger.stepinput import StepInput, ledger_identity, step_input
from ..ledger.store import EntryMissing, Holder, Stale, StoreUnavailable
from ..upstream.client import Upstream
from ..upstream.secrets import Secrets
from .runner import Sleep, run_step
from .sources import SourceError, read_ledger_file

Report = Callable[[Step, dict[str, Any]], None]
Say = Callable[[str], None]
POLL_SECONDS = 0.2  # how often the wait for calls in flight reads the ledger again


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
    entries = ledger.entries()
    return make_plan(ledger.name, entries, versions, now=moment or now(), selection=selection,
                     holders=holders(ledger, entries))


def holders(ledger: LocalLedger, entries: list[Entry]) -> dict[str, Holder | None]:
    """Who holds the key of each keyed pending entry (the lock files beside the ledger,
    shared by every run of the folder): the planner's evidence of which never ran."""
    return {entry_id: ledger.locks.peek_sync(name)
            for entry_id, name in rules.keyed_pending(ledger.run, entries).items()}


def settle_never_sent(ledger: LocalLedger, plan: Plan, clock: Callable[[], datetime]) -> None:
    """The pending entries the plan skips because they never ran (their key's lock names
    another entry, or none) are recorded refused, as their gateway would have: no rollback
    leaves them pending for good."""
    entries = ledger.entries()
    by_id = {e.id: e for e in entries}
    held = holders(ledger, entries)
    moment = clock()
    for step in plan.steps:
        entry = by_id.get(step.entry)
        if step.action != "skip" or entry is None or entry.state != "pending":
            continue
        why = never_ran(ledger.name, entry, entries, held)
        if why is None or not deadline_passed(entry, moment):
            continue
        with contextlib.suppress(Stale, EntryMissing):
            ledger.store.transition_sync(ledger.run, entry.id, rules.never_sent(entry, why, moment))


def close_run(ledger: LocalLedger, by: str, clock: Callable[[], datetime],
              reason: str | None = None) -> Fence:
    """Fence the run and deny what still awaits approval (freeing those keys)."""
    fence = ledger.store.fence_sync(ledger.run, Fence(since=stamp(clock()), by=by, reason=reason))
    for entry in rules.awaiting(ledger.entries()):
        try:
            denied = ledger.store.transition_sync(ledger.run, entry.id,
                                                  rules.deny_for_rollback(entry, fence, ledger.name))
        except (Stale, EntryMissing):
            continue  # decided meanwhile
        _free_key(ledger, entry, denied)
    return fence


async def wait_for_calls(ledger: LocalLedger, clock: Callable[[], datetime], say: Say,
                         pause: Sleep = asyncio.sleep) -> None:
    """Until no call of the run may still be in flight (each finished, or past its deadline)."""
    told: set[str] = set()
    while True:
        moment = clock()
        flying = rules.in_flight(ledger.entries(), moment)
        if not flying:
            if told:
                say("the calls in flight are over: planning")
            return
        ids = {e.id for e in flying}
        if not ids <= told:
            until = rules.last_deadline(flying)
            say(f"run {ledger.run} is closed to new calls; waiting for {len(flying)} "
                f"call{'' if len(flying) == 1 else 's'} in flight to finish "
                f"({', '.join(sorted(ids)[:5])}{', ...' if len(ids) > 5 else ''}; "
                f"until {stamp(until) if until else 'their deadline'} at the latest)")
            told |= ids
        soonest = min(parse_stamp(e.deadline) for e in flying if e.deadline)
        await pause(max(0.01, min(POLL_SECONDS, (soonest - moment).total_seconds())))


async def execute(ledger: LocalLedger, plan: Plan, versions: Versions, selection: Selection, *,
                  by: str, secrets: Secrets, report: Report, sleep: Sleep | None = None,
                  clock: Callable[[], datetime] = now, moment: datetime | None = None,
                  upstream: Upstream | None = None, say: Say | None = None,
                  reason: str | None = None, pause: Sleep = asyncio.sleep) -> Summary:
    """Fence the run, wait for its calls in flight, then run the plan, made again now (the
    ``plan`` shown to and confirmed by ``by`` may have grown since: ``say`` tells), and
    record every outcome. ``moment``: plan as of then (default now). ``upstream``: the
    client the steps call through (default: one of its own, closed at the end; the
    simulation in tests/sim gives its fake)."""
    summary = Summary()
    tell: Say = say or (lambda _: None)
    close_run(ledger, by, clock, reason)
    await wait_for_calls(ledger, clock, tell, pause)
    shown = plan
    plan = plan_local(ledger, versions, selection, moment or clock())
    if plan.to_json() != shown.to_json():
        n = len(plan.runnable())
        tell(f"the run changed since the plan was shown: planned again, {n} "
             f"step{'' if n == 1 else 's'} to run (the plan shown had {len(shown.runnable())})")
    settle_never_sent(ledger, plan, clock)
    own = upstream is None
    # a local rollback starts a stdio MCP server as the gateway did
    client = upstream if upstream is not None else Upstream(commands=True)
    extra: dict[str, Any] = {"sleep": sleep} if sleep is not None else {}
    _freeze(ledger, plan, selection, by, clock, None, reason)

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
            result = await _lookup(ledger, step, versions, client, secrets, extra, clock)
            if result is None:
                continue
            if stops(step, result):
                return summary
            found = found or result["outcome"] == "found"
        steps = list(plan.steps)
        if found:  # found entries take their place among the undos
            steps = list(plan_local(ledger, versions, selection, moment or clock()).steps)
        summary.left = [s for s in steps if s.action in ("not_undoable", "unrecoverable")]
        for step in [s for s in steps if s.action in UNDOING or s.action == "moot"]:
            result = await _undo(ledger, step, versions, by, client, secrets, extra, clock)
            if result is not None and stops(step, result):
                return summary
        return summary
    finally:
        if own:
            await client.aclose()
        _freeze(ledger, plan, selection, by, clock, summary, reason)


async def _lookup(ledger: LocalLedger, step: Step, versions: Versions, upstream: Upstream,
                  secrets: Secrets, extra: dict[str, Any], clock: Callable[[], datetime]
                  ) -> dict[str, Any] | None:
    entry = ledger.store.get_sync(ledger.run, step.entry)
    if entry is None or not rules.may_look_up(entry, clock()):
        return None  # resolved meanwhile (or, never, still in flight: the wait came first)
    spec = StepInput.model_validate(step_input(ledger.name, step, entry, versions,
                                               identity=ledger.identity))
    result = await run_step(spec, upstream, secrets, clock=clock, **extra)
    counts, done = _record(ledger, step, rules.lookup_end(entry.state, result, clock(),
                                                          fresh=True), result)
    if not counts:
        return None
    _free_key(ledger, entry, done)
    return result


async def _undo(ledger: LocalLedger, step: Step, versions: Versions, by: str,
                upstream: Upstream, secrets: Secrets, extra: dict[str, Any],
                clock: Callable[[], datetime]) -> dict[str, Any] | None:
    entry = ledger.store.get_sync(ledger.run, step.entry)
    if entry is None or not rules.may_undo(entry):
        return None  # undone meanwhile (another rollback), or no longer undoable
    why = moot_reason(entry, ledger.entries(), lambda e: versions.of(e)[0])
    if why is not None:  # an older entry's undo removed the object (this rollback's, or one before)
        return _moot(ledger, step, entry, why, by, clock)
    if step.action == "moot":
        return None  # planned moot, and no longer (the entry changed meanwhile)
    spec = StepInput.model_validate(step_input(ledger.name, step, entry, versions,
                                               identity=ledger.identity))
    approved = {"user": by, "identities": "self-declared"} if step.requires_approval else None
    begin = rules.undo_begin(entry, step, spec.idempotency_key, by=by, started=stamp(clock()),
                             approved=approved)
    try:
        ledger.store.transition_sync(ledger.run, step.entry, begin)
    except (Stale, EntryMissing):
        return None
    except StoreUnavailable as exc:  # nothing ran: no undo without its record
        return {"ok": False, "ledger": ledger.name, "entry": step.entry, "action": step.action,
                "tool": step.undo_tool, "outcome": "not_started", "entry_state": entry.state,
                "reason": f"the ledger cannot be written, so the undo was not run: {exc}",
                "first_mismatch": None}
    result = await run_step(spec, upstream, secrets, clock=clock, **extra)
    counts, done = _record(ledger, step, rules.undo_end(result, keep_empty=True), result)
    if not counts:
        return None
    _free_key(ledger, entry, done)
    return result


def _moot(ledger: LocalLedger, step: Step, entry: Entry, why: str, by: str,
          clock: Callable[[], datetime]) -> dict[str, Any] | None:
    """Record ``entry`` moot (nothing is called) and free its key."""
    moment = clock()
    result: dict[str, Any] = {"ok": True, "ledger": ledger.name, "entry": step.entry,
                              "action": "moot", "tool": step.undo_tool, "outcome": "moot",
                              "entry_state": "moot", "reason": why, "first_mismatch": None,
                              "finished": stamp(moment)}
    counts, done = _record(ledger, step, rules.moot(entry, why, moment, by=by), result)
    if not counts:
        return None
    _free_key(ledger, entry, done)
    return result


def _record(ledger: LocalLedger, step: Step, write: AnyWrite,
            result: dict[str, Any]) -> tuple[bool, Entry | None]:
    """Write the step's outcome: whether the result counts, and the entry as written. False:
    another writer moved the entry, the result is not this rollback's to record. An outcome
    the ledger cannot take counts, marked failed (it stops the rollback; a re-run finishes
    it), and the entry is left as it was (None)."""
    try:
        return True, ledger.store.transition_sync(ledger.run, step.entry, write)
    except (Stale, EntryMissing):
        return False, None
    except StoreUnavailable as exc:
        result.update(ok=False, reason=f"{result['reason']}; but the ledger could not record "
                      f"it: {exc}")
        return True, None


def _free_key(ledger: LocalLedger, before: Entry, after: Entry | None) -> None:
    """An entry that gave its key up (undone, never happened, denied): its lock file goes,
    if it still names the entry."""
    name = rules.lock_of(ledger.run, before)
    if name is None or after is None or not rules.frees_key(before, after):
        return
    # A lock left behind is broken by the gateway: the entry no longer holds its key.
    with contextlib.suppress(OSError):
        ledger.locks.release_entry_sync(name, ledger.run, before.id)


MAX_HISTORY = 50  # rollbacks kept in <run>.rollback.json; older ones are counted in "dropped"


def _freeze(ledger: LocalLedger, plan: Plan, selection: Selection, by: str,
            clock: Callable[[], datetime], summary: Summary | None,
            reason: str | None = None) -> None:
    """Keep every rollback's request and plan (``<run>.rollback.json`` beside the ledger:
    who, when, why, what it planned, how it ended; at most ``MAX_HISTORY``, the oldest going
    first, counted in ``dropped``): the evidence export includes it, as the operator keeps
    its requests in the ledger status (``status.rollbacks``)."""
    path = ledger.path.with_name(f"{ledger.run}.rollback.json")
    try:
        kept = json.loads(path.read_bytes())
        history, dropped = kept.get("rollbacks", []), int(kept.get("dropped") or 0)
    except (OSError, ValueError, AttributeError, TypeError):
        history, dropped = [], 0
    if summary is None:
        history.append({"by": by, "started": stamp(clock()), "reason": reason,
                        "entries": list(selection.entries), "since": selection.since,
                        "plan": plan.to_json()})
        while len(history) > MAX_HISTORY:
            history.pop(0)
            dropped += 1
    elif history:
        history[-1].update(finished=stamp(clock()), ok=summary.ok,
                           stopped_at=summary.stopped["entry"] if summary.stopped else None)
    # The ledger entries hold every outcome; this copy of the plan is for the evidence.
    with contextlib.suppress(OSError):
        write_atomic(path, json.dumps({"ledger": ledger.name, "rollbacks": history,
                                       **({"dropped": dropped} if dropped else {})},
                                      ensure_ascii=False, indent=1).encode())
