"""What both rollbacks do to entries: one set of rules, two runners.

The local rollback (``undo/local.py``, in-process) and the operator's (``operator/rollback.py``,
Jobs) decide the same things the same way, here, through the lifecycle (``lifecycle.py``):

- **Fence, then wait.** A rollback closes its run (``fence.py``), denies the entries still
  awaiting approval (their call must not run later, and their key must not stay held), and
  waits for the calls already written ahead to finish or pass their deadline
  (``in_flight``). Only then does it plan.
- **Lookups** resolve ``uncertain`` and ``pending`` entries once their deadline has passed
  (``may_look_up``): never a call that may still be in flight, or still be applied by an
  upstream the gateway stopped waiting for.
- **Undos** start from ``succeeded``, ``undoing`` (resumed) or ``undo_failed`` (retried).
- **Keys**: an entry that no longer holds its key (undone, found never to have happened,
  denied) frees it (``frees_key``); its lock, when it still names the entry, is given up
  (locally at once; in a cluster the next call with the key breaks the Lease).
- **Which pending entries never ran**: the planner asks each keyed ``pending`` entry's lock
  who holds it, in any run (``lock_of``; ``plan.make_plan(holders=...)``): a call runs only
  while its lock names it, so an entry another holds never reached the upstream.

Every change is a ``lifecycle.Write``: a compare-and-set on the state the rollback read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from .entry import Entry, EntryError, Handle, Settlement, parse_stamp, stamp
from .fence import Fence
from .lifecycle import HOLDS, Expect, Write, deadline_passed
from .plan import Step
from .store import lock_name

LOOKUP_STATES = frozenset({"uncertain", "pending"})
UNDOABLE_STATES = frozenset({"succeeded", "undoing", "undo_failed"})
# States of an entry whose effect may still stand, and effects with nothing to undo (the
# planner's "skip"): the LIVE column (``status.live``) counts the live entries of a run.
LIVE_STATES = frozenset({"succeeded", "uncertain", "pending", "undoing", "undo_failed"})
NO_EFFECT = frozenset({"read_only", "idempotent"})
# What a person may settle by hand (the lifecycle's person rows): an effect that may stand.
SETTLEABLE = frozenset({"succeeded", "undo_failed", "undoing", "uncertain", "pending"})
# What a finished undo step records in the entry's ``undo``, from the step runner's result.
_UNDO_RESULT = ("outcome", "reason", "first_mismatch", "call", "verification", "finished")
_LOOKUP_RESULT = ("tool", "outcome", "reason", "call", "finished")


def is_live(state: Any, effect: Any) -> bool:
    """Whether an entry's effect may still stand in the world (an unknown effect counts)."""
    return state in LIVE_STATES and effect not in NO_EFFECT


def live_count(entries: Iterable[Mapping[str, Any]]) -> int:
    """LIVE of a run over its entries as stored (no model: the operator runs it on every
    ledger event, and ``unwind ledger`` on local pages, which the operator never writes)."""
    return sum(1 for e in entries if is_live(e.get("state"), e.get("effect")))


# ---- what to wait for, what may be looked up ----

def in_flight(entries: Iterable[Entry], now: datetime) -> list[Entry]:
    """The calls that may still take effect at ``now``: pending or uncertain (the gateway
    stopped waiting; the upstream may still apply it), their deadline ahead."""
    return [e for e in entries if e.state in LOOKUP_STATES and not deadline_passed(e, now)]


def last_deadline(entries: Iterable[Entry]) -> datetime | None:
    times = [parse_stamp(e.deadline) for e in entries if e.deadline]
    return max(times) if times else None


def awaiting(entries: Iterable[Entry]) -> list[Entry]:
    return [e for e in entries if e.state == "awaiting_approval"]


def may_look_up(entry: Entry, now: datetime) -> bool:
    """A lookup may resolve ``entry`` now: it is uncertain or pending, and its call can no
    longer take effect (its deadline has passed)."""
    return entry.state in LOOKUP_STATES and deadline_passed(entry, now)


def may_undo(entry: Entry) -> bool:
    return entry.state in UNDOABLE_STATES


# ---- keys ----

def frees_key(before: Entry, after: Entry) -> bool:
    """The change from ``before`` to ``after`` gives the entry's key up."""
    return before.key is not None and HOLDS[before.state] and not HOLDS[after.state]


def lock_of(run: str, entry: Entry) -> str | None:
    """The name of the lock of ``entry``'s rendered key (None: it has no key)."""
    if entry.key is None or entry.scope is None:
        return None
    return lock_name(entry.scope, run=run, actor=entry.actor, tool=entry.tool, key=entry.key)


def keyed_pending(run: str, entries: Iterable[Entry]) -> dict[str, str]:
    """entry id -> lock name, for the pending entries whose key's holder the planner needs."""
    out: dict[str, str] = {}
    for e in entries:
        name = lock_of(run, e) if e.state == "pending" else None
        if name is not None:
            out[e.id] = name
    return out


# ---- the writes ----

def deny_for_rollback(entry: Entry, fence: Fence, ledger: str) -> Write:
    """An entry still awaiting approval when its run is fenced: denied by the rollback (its
    call must not run later, and its key is free again)."""
    by = f" by {fence.by}" if fence.by else ""
    message = (f"denied: a rollback{by} of {ledger} closed the run at {fence.since}; the call "
               "was never made")

    def change(e: Entry) -> Entry:
        approval = e.approval.model_copy(update={"state": "denied", "message": message}) \
            if e.approval is not None else None
        return e.model_copy(update={"state": "denied", "approval": approval,
                                    "error": EntryError(code="rolled_back", message=message)})
    return Write("rollback", Expect.of(entry), change)


def never_sent(entry: Entry, why: str, moment: datetime) -> Write:
    """A keyed ``pending`` entry whose call never ran (the planner's skip: its key's lock
    names another entry, or none): recorded ``refused`` as its gateway would have, so no
    rollback leaves it pending for good. Only once its deadline has passed."""
    def change(e: Entry) -> Entry:
        times = e.times.model_copy(update={"finished": e.times.finished or stamp(moment)})
        return e.model_copy(update={"state": "refused", "handle": None, "times": times,
                                    "error": EntryError(code="duplicate", message=(
                                        f"recorded by the rollback: {why}; nothing was sent"))})
    return Write("rollback", Expect.of(entry), change, now=moment)


def undo_begin(entry: Entry, step: Step, key: str | None, *, by: str, started: str,
               job: str | None = None, approved: dict[str, Any] | None = None) -> Write:
    """The undo written ahead: the entry becomes ``undoing`` (with the step's idempotency key)
    before the upstream sees the undo."""
    def change(e: Entry) -> Entry:
        undo: dict[str, Any] = {"action": step.action, "tool": step.undo_tool,
                                "arguments": step.arguments, "residue": list(step.residue),
                                "idempotency_key": key, "by": by,
                                **({"job": job} if job is not None else {}),
                                "started": started, "tries": int((e.undo or {}).get("tries", 0)) + 1}
        if approved is not None:
            undo["approved_by"] = approved
        if e.undo and "lookup" in e.undo:
            undo["lookup"] = e.undo["lookup"]
        return e.model_copy(update={"state": "undoing", "undo": undo})
    return Write("rollback", Expect.of(entry), change)


def undo_end(result: Mapping[str, Any], *, keep_empty: bool = False) -> Write:
    """The undo's outcome, from the step runner's result: ``undone`` or ``undo_failed``.
    ``keep_empty``: the fields the result leaves empty are recorded too (the local
    rollback's record; the operator leaves them out, as the API server would drop nulls)."""
    def change(e: Entry) -> Entry:
        found = {k: result.get(k) for k in _UNDO_RESULT
                 if keep_empty or result.get(k) is not None}
        return e.model_copy(update={"state": result.get("entry_state") or "undo_failed",
                                    "undo": {**(e.undo or {}), **found}})
    return Write("rollback", Expect("undoing"), change)


def lookup_begin(entry: Entry, job: str, tool: str | None, now: str, moment: datetime) -> Write:
    """A lookup Job is started for ``entry``: its attempt is recorded in ``undo.lookup``."""
    def change(e: Entry) -> Entry:
        before = (e.undo or {}).get("lookup") or {}
        record = {"tool": tool, "job": job, "attempts": int(before.get("attempts") or 0) + 1,
                  "started": now}
        return e.model_copy(update={"undo": {**(e.undo or {}), "lookup": record}})
    return Write("lookup", Expect.of(entry), change, now=moment)


def lookup_end(state: str, result: Mapping[str, Any], moment: datetime, *,
               fresh: bool = False) -> Write:
    """A lookup's result: ``found`` makes the entry ``succeeded`` with the handle completed
    from the answer, ``not_found`` makes it ``failed`` (it never happened); anything else
    records the attempt and leaves it as it was. ``fresh``: the record replaces an earlier
    one (a local lookup starts none) instead of adding to it."""
    def change(e: Entry) -> Entry:
        before = {} if fresh else (e.undo or {}).get("lookup") or {}
        record = {**before, **{k: result.get(k) for k in _LOOKUP_RESULT
                               if fresh or result.get(k) is not None}}
        undo = {**(e.undo or {}), "lookup": record}
        if result.get("outcome") == "found" and isinstance(result.get("handle"), dict):
            return e.model_copy(update={"state": "succeeded", "undo": undo,
                                        "handle": Handle.model_validate(result["handle"]),
                                        "warnings": [*e.warnings, "found by its lookup after the "
                                                     "answer was lost"]})
        if result.get("outcome") == "not_found":
            return e.model_copy(update={"state": "failed", "undo": undo, "error": EntryError(
                code="not_found", message=f"the lookup found no effect: {result.get('reason')}")})
        return e.model_copy(update={"undo": undo})
    return Write("lookup", Expect(state), change, now=moment)  # type: ignore[arg-type]


def moot(entry: Entry, why: str, moment: datetime, *, by: str) -> Write:
    """The undo of ``entry`` has nothing left to do: an older entry's undo removed its
    object (``objects.moot_reason``). Recorded ``moot`` with why; nothing is called."""
    def change(e: Entry) -> Entry:
        undo = {**(e.undo or {}), "outcome": "moot", "reason": why, "by": by,
                "finished": stamp(moment)}
        return e.model_copy(update={"state": "moot", "undo": undo})
    return Write("rollback", Expect.of(entry), change, now=moment)


def settle(entry: Entry, settlement: Settlement, moment: datetime) -> Write:
    """A person settles ``entry`` by hand (``unwind settle``): ``settled``, with who, when, why
    and the state it was in. A pending or uncertain entry only once its call's deadline has
    passed (the lifecycle's rows say so)."""
    def change(e: Entry) -> Entry:
        return e.model_copy(update={"state": "settled",
                                    "settled": settlement.model_copy(update={"was": e.state})})
    return Write("person", Expect.of(entry), change, now=moment)


def settle_problem(entry: Entry | None, entry_id: str, moment: datetime) -> str | None:
    """Why ``entry`` cannot be settled now, in a sentence, or None."""
    if entry is None:
        return f"there is no entry {entry_id} in this ledger"
    if entry.state == "settled":
        s = entry.settled
        return (f"entry {entry_id} is settled already" + (f" (by {s.by} at {s.at}: {s.reason})"
                                                           if s else ""))
    if entry.state not in SETTLEABLE:
        return (f"entry {entry_id} is {entry.state}: nothing stands to settle (only "
                f"{', '.join(sorted(SETTLEABLE))} entries are settled by hand)")
    if entry.state in LOOKUP_STATES and not deadline_passed(entry, moment):
        return (f"entry {entry_id} is {entry.state} and its call may still be in flight (until "
                f"{entry.deadline}): settle it after that")
    return None
