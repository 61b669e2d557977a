"""The undo plan of a run: which step undoes each entry, in which order, and why.

Pure: it reads a snapshot of the ledger's entries and the manifests, and calls nothing. An
entry whose answer was lost shows as a ``lookup`` step; running the rollback resolves it
(``unwind.undo``) and plans that entry again.

Which manifest decides an entry's undo: the version the entry ran under, found by the
checksum the gateway recorded (``Versions.by_checksum``), never today's, because the undo
must match the call that was made. The tools the steps *call* (the undo, its read-back, the
lookup, the discard) are named by that manifest, never by the entry: a staged entry's
discard is the manifest's ``draft.discard``, and an entry whose recorded draft tool is not
the manifest's ``draft.tool`` is ``unrecoverable`` (an edited ledger must not choose what a
rollback calls). Their own manifests are taken from today's set (``Versions.tools``): they
run now, at today's upstream. An entry whose version is not known refuses the plan (``PlanError``)
unless ``current`` is set, which plans it with today's manifest of its tool and says so.

The order (docs/rollback.md): lookups first (an uncertain entry must be found before its
place among the undos is known), then the newest effect first, where an entry whose tool
``requires`` another tool is undone before every entry of the required tool (the undo of
what was built on top comes before the undo of what it was built on), and entries on one
object are undone newest first by their place in the run (``objects.py``). Ties keep
newest first; a cycle (only possible across manifest versions) falls back to newest first.
An entry whose object the undo of an older entry removed is ``moot``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from ..manifest.declared import restore_note
from ..manifest.model import Absent, Effect, ToolManifest
from ..manifest.refs import Missing, resolve
from . import objects as objects_mod
from .entry import Entry, Handle, Staged, parse_stamp, stamp
from .plan_refs import Refs, expected, resolve_late, resolve_refs
from .report import deadline_ms
from .store import Holder

Action = Literal["inverse", "compensate", "discard", "skip", "not_undoable", "unrecoverable",
                 "lookup", "moot"]
ACTIONS: tuple[Action, ...] = ("inverse", "compensate", "discard", "skip", "not_undoable",
                               "unrecoverable", "lookup", "moot")
# The actions a rollback runs (a moot step calls nothing: it records the entry moot); the
# others are reported only.
RUNNABLE: frozenset[Action] = frozenset({"inverse", "compensate", "discard", "lookup", "moot"})
UNDOING: frozenset[Action] = frozenset({"inverse", "compensate", "discard"})


class PlanError(Exception):
    """The plan cannot be made (an unknown entry, missing manifest versions); the message
    says what to give."""


@dataclass(frozen=True)
class ReadBack:
    """The verification of an undo, resolved: call ``tool`` with ``arguments``, expect."""

    tool: str
    arguments: dict[str, Any]
    expect: dict[str, Any]
    retries: int
    backoff_ms: int
    # With a capture: expect path -> what the call left there ($result at that path). The
    # step reads the state first and stops ("diverged") when a field no longer holds it.
    left: Mapping[str, Any] | None = None
    # The read-back proves the thing gone (manifest: verification.absent), and the undo
    # call's statuses that count as done when the read-back confirms (done_statuses).
    absent: Absent | None = None
    done_statuses: tuple[int, ...] = ()


@dataclass(frozen=True)
class ReadBefore:
    """``compensation.current``, resolved: call ``tool`` with ``arguments`` right before the
    undo; each of ``binds`` (``arguments.<name>`` or ``headers.<name>`` -> a ``$current``
    reference) is filled from its answer."""

    tool: str
    arguments: dict[str, Any]
    binds: Mapping[str, str]

    def to_json(self) -> dict[str, Any]:
        return {"tool": self.tool, "arguments": self.arguments, "binds": dict(self.binds)}


@dataclass(frozen=True)
class Step:
    entry: str
    tool: str
    action: Action
    undo_tool: str | None
    arguments: dict[str, Any] | None
    residue: tuple[str, ...]
    requires_approval: bool
    reason: str
    # Not in the plan's JSON; what the step runner needs besides it.
    verification: ReadBack | None = None
    timeout_ms: int | None = None
    # In the JSON: the values naming the object the entry touched (objects.py), the undo
    # call's headers resolved from the ledger, and the read made right before the undo.
    object: str | None = None
    headers: Mapping[str, Any] | None = None
    read_before: ReadBefore | None = None

    def to_json(self) -> dict[str, Any]:
        """Exactly the documented fields (docs/rollback.md), in that order."""
        return {"entry": self.entry, "tool": self.tool, "action": self.action,
                "undo_tool": self.undo_tool, "arguments": self.arguments,
                "residue": list(self.residue), "requires_approval": self.requires_approval,
                "reason": self.reason, "object": self.object,
                "headers": dict(self.headers) if self.headers else {},
                "read_before": self.read_before.to_json() if self.read_before else None}


@dataclass(frozen=True)
class Plan:
    ledger: str
    steps: tuple[Step, ...]

    def to_json(self) -> dict[str, Any]:
        return {"ledger": self.ledger, "steps": [s.to_json() for s in self.steps]}

    def runnable(self) -> list[Step]:
        return [s for s in self.steps if s.action in RUNNABLE]


@dataclass(frozen=True)
class Versions:
    """The manifests a plan may use: every known version by checksum, and today's set by
    tool (for the tools the steps call, and for ``current``)."""

    by_checksum: Mapping[str, ToolManifest]
    tools: Mapping[str, ToolManifest]
    current: bool = False

    def of(self, entry: Entry) -> tuple[ToolManifest | None, str]:
        """The manifest that decides the entry's undo, and a note when it is not the
        version the entry ran under ("" when it is)."""
        if entry.checksum is not None and entry.checksum in self.by_checksum:
            return self.by_checksum[entry.checksum], ""
        today = self.tools.get(entry.tool)
        if self.current and today is not None:
            return today, (f" (planned with today's manifest of {entry.tool}: the version it "
                           f"ran under, {_short(entry.checksum)}, was not given)")
        return None, ""


@dataclass(frozen=True)
class Selection:
    """Which entries to plan: all (the default), ``entries`` and what depends on them, or
    those after ``since`` (an entry id: strictly after it; or an RFC 3339 time: at or
    after it)."""

    entries: tuple[str, ...] = ()
    since: str | None = None


# States whose call never reached an upstream, or whose effect is gone.
_NOTHING: Mapping[str, str] = {
    "refused": "the call was refused: nothing ran",
    "awaiting_approval": "the call still waits for approval: nothing ran",
    "denied": "the call was denied: nothing ran",
    "failed": "the call failed: nothing to undo",
    "undone": "already undone",
}
# States whose outcome is unknown: the upstream may have acted.
_UNKNOWN = frozenset({"uncertain", "pending"})


def make_plan(ledger: str, entries: Sequence[Entry], versions: Versions, *,
              now: datetime, selection: Selection = Selection(),
              holders: Mapping[str, Holder | None] | None = None) -> Plan:
    """The ordered steps for the selected entries (see the module docstring). ``holders``:
    for each keyed ``pending`` entry (by id), who holds its key's lock now, in any run
    (None: nobody), as the runner read it (``rollback_rules.keyed_pending``); without it,
    only the ledger itself says who held a key."""
    ordered = sorted(entries, key=_when)  # oldest first
    chosen = select(ordered, versions, selection)
    missing = [e for e in chosen if _needs_manifest(e) and versions.of(e)[0] is None]
    if missing:
        raise PlanError(_missing_versions(missing, versions))
    refs = Refs()
    steps = {e.id: plan_entry(e, versions, now, refs) for e in chosen}
    for e in chosen:  # a pending entry that never had its key's lock never ran
        why = never_ran(ledger, e, ordered, holders)
        if why is not None and steps[e.id].action == "lookup":
            steps[e.id] = _report(e, "skip", why + ": this call was refused as a duplicate "
                                  "before anything was sent (the gateway stopped before it "
                                  "recorded the refusal)")
    objects = {e.id: objects_mod.object_key(e, versions.of(e)[0]) for e in ordered}
    for e in chosen:  # the undo of an older entry removed its object: nothing left to do
        if steps[e.id].action in UNDOING:
            moot = objects_mod.moot_reason(e, ordered, lambda x: versions.of(x)[0], objects)
            if moot is not None:
                steps[e.id] = _report(e, "moot", moot)
    steps = {i: dataclasses.replace(s, object=objects.get(i)) if s.action in UNDOING
             else s for i, s in steps.items()}
    lookups = [steps[e.id] for e in reversed(chosen) if steps[e.id].action == "lookup"]
    requires = {e.id: _requires(e, versions) for e in chosen}
    undoing = {i: objects.get(i) for i, s in steps.items() if s.action in UNDOING}
    rest = [e for e in objects_mod.undo_order(list(reversed(chosen)), requires, undoing)
            if steps[e.id].action != "lookup"]
    return Plan(ledger, tuple(lookups + [steps[e.id] for e in rest]))


# States in which an entry holds its key (lifecycle.HOLDING, which imports this package's
# store; spelled out here, and tests/ledger/test_lifecycle.py checks they agree). A pending
# one is left out: of two pending entries with one key, the ledger alone cannot tell which
# took the lock.
_HELD_KEY = frozenset({"awaiting_approval", "succeeded", "uncertain", "undoing", "undo_failed",
                       "settled"})


def never_ran(ledger: str, entry: Entry, entries: Sequence[Entry],
               holders: Mapping[str, Holder | None] | None) -> str | None:
    """Why a keyed ``pending`` entry never called its upstream, or None. A gateway calls
    the upstream only while the key's lock names the call (it reads the lock again right
    before), and a lock is never broken while its entry holds the key: so a pending entry
    whose lock names another entry (in any run, an uncertain one too), or nobody, never
    ran. A cluster gateway writes a keyed call's pending entry while it creates the key's
    Lease; one that loses to a standing call turns its entry ``refused``, and one killed in
    between leaves it ``pending``. Its lookup would find the holder's effect and undo it
    twice. Without the holders (a saved ledger file), another entry of this ledger holding
    the same key says the same."""
    if entry.state != "pending" or entry.key is None:
        return None
    if holders is not None and entry.id in holders:
        holder = holders[entry.id]
        if holder is None:
            return f"no lock holds its idempotency key {entry.key!r} (it never took it)"
        if (holder.run, holder.entry) == (ledger, entry.id):  # a run's ledger is named after it
            return None
        where = f" of run {holder.run}" if holder.run else ""
        return (f"entry {holder.entry or '(being recorded)'}{where} holds its idempotency key "
                f"{entry.key!r}")
    other = next((e for e in entries if e.id != entry.id and e.key == entry.key
                  and e.tool == entry.tool and e.scope == entry.scope and e.state in _HELD_KEY),
                 None)
    if other is None:
        return None
    return f"entry {other.id} held its idempotency key {entry.key!r} ({other.state})"


def plan_entry(entry: Entry, versions: Versions, now: datetime, refs: Refs | None = None) -> Step:
    """The one step that undoes (or accounts for) one entry."""
    refs = refs or Refs()
    if entry.state in _NOTHING:
        return _report(entry, "skip", _NOTHING[entry.state])
    if entry.state == "moot":
        why = str((entry.undo or {}).get("reason") or "its object was removed")
        return _report(entry, "skip", f"moot: nothing left to undo ({why})")
    if entry.state == "settled" and entry.settled is not None:
        s = entry.settled
        return _report(entry, "skip", f"settled by hand by {s.by} at {s.at}: {s.reason}")
    m, note = versions.of(entry)
    if m is None:
        return _report(entry, "unrecoverable", f"no manifest of {entry.tool} is known, neither "
                       f"the version it ran under ({_short(entry.checksum)}) nor today's")
    if entry.state in _UNKNOWN:
        return _unknown(entry, m, note, refs)
    step = _undo(entry, m, now, refs)
    again = {"undoing": "resumes an interrupted undo: ",
             "undo_failed": "retries a failed undo: "}.get(entry.state, "")
    if again and step.action in UNDOING:
        step = _with_reason(step, again + step.reason)
    return _with_reason(step, step.reason + note) if note else step


def _undo(entry: Entry, m: ToolManifest, now: datetime, refs: Refs) -> Step:
    if entry.staged is not None:
        return _discard(entry, entry.staged, m)
    if m.effect == Effect.idempotent:
        return _left_changed(entry, m, "")
    if m.effect == Effect.read_only:
        return _report(entry, "skip", f"{m.tool} is {m.effect}: nothing to undo")
    c = m.compensation
    if m.effect == Effect.irreversible or c is None:
        return _report(entry, "not_undoable", f"{m.tool} is {m.effect}: nothing can undo it")
    handle = entry.handle or Handle()
    compiled = refs.of(m)
    if compiled.masked:
        return _report(entry, "unrecoverable", "the undo is unavailable: " + compiled.masked)
    undo_args, missing, binds = resolve_late(compiled.undo, handle, entry.key, "arguments")
    headers, missing_h, binds_h = resolve_late(compiled.headers, handle, entry.key, "headers")
    missing += missing_h
    read_before: ReadBefore | None = None
    if c.current is not None:
        read_args, missing_r = resolve_refs(compiled.current, handle, entry.key)
        missing += [f"compensation.current.arguments.{m}" for m in missing_r]
        read_before = ReadBefore(c.current.tool, read_args, {**binds, **binds_h})
    if missing:
        return _report(entry, "unrecoverable", "the undo is unavailable: " + "; ".join(missing))
    read_back = None
    if c.verification is not None:
        v = c.verification
        args, missing = resolve_refs(compiled.verification, handle, entry.key)
        if missing:
            return _report(entry, "unrecoverable", "the read-back cannot be built: "
                           + "; ".join(missing))
        expect, missing = expected(compiled.expect, handle, entry.key)
        if missing:
            return _report(entry, "unrecoverable", "the read-back cannot be built: "
                           + "; ".join(missing))
        # what the call left: the read right after the call when one is recorded (like
        # with like), else the call's answer at the expect paths
        left_in = handle.after if v.after_call else handle.result
        was_left = {path: value for path, ref in compiled.guarded
                    if not isinstance(value := resolve(ref, handle.args, left_in,
                                                       entry.key, handle.before), Missing)}
        read_back = ReadBack(v.tool, args, expect, v.retries, v.backoff_ms, was_left or None,
                             absent=v.absent, done_statuses=tuple(c.done_statuses or ()))
    kind: Action = "inverse" if c.kind == "inverse" else "compensate"
    # An interrupted inverse is finished with the same step even past the deadline: it
    # may have been applied already, and its idempotency key makes the retry harmless.
    resuming = entry.state == "undoing" and (entry.undo or {}).get("action") == "inverse"
    if kind == "inverse" and c.deadline is not None and not resuming:
        left = deadline_ms(m, handle, entry.times.finished)
        if left is None or entry.times.finished is None:
            return _report(entry, "unrecoverable", "the inverse's deadline cannot be read from "
                           "the ledger (compensation.deadline names nothing in the handle)")
        end = parse_stamp(entry.times.finished) + timedelta(milliseconds=left)
        if now > end:
            return _report(entry, "not_undoable", f"the inverse {c.tool} was possible until "
                           f"{stamp(end)}, and the manifest declares no compensation for "
                           "after the deadline")
    verified = f", read back with {read_back.tool}" if read_back else ", not read back"
    captured = guard = ""
    if m.capture is not None:
        captured = f" (as {m.capture.tool} read it before the call)"
        if read_back is not None and read_back.left:
            what = ("what the read right after the call found" if c.verification is not None
                    and c.verification.after_call else "what the call left")
            verb = "holds" if len(read_back.left) == 1 else "hold"
            guard = (f"; it first checks that {', '.join(read_back.left)} still {verb} {what} "
                     "(else the step is diverged and changes nothing)")
        elif read_back is not None and read_back.absent is None:
            guard = "; " + _no_guard(m, handle)
    if read_before is not None:
        named = ", ".join(sorted(read_before.binds)) or "nothing"
        guard += (f"; right before the undo {read_before.tool} reads the object as it is now "
                  f"($current: {named})")
    if kind == "inverse":
        until = ""
        if c.deadline is not None and entry.times.finished is not None:
            left = deadline_ms(m, handle, entry.times.finished) or 0
            until = f" (possible until {stamp(parse_stamp(entry.times.finished) + timedelta(milliseconds=left))})"
        reason = (f"{m.effect}: the inverse {c.tool} restores the prior state{captured}{until}"
                  f"{verified}{guard}")
    else:
        reason = f"{m.effect}: {c.tool} makes amends{captured}{verified}{guard}"
        if c.residue:
            reason += "; it leaves residue"
    reason += restore_note(m)  # an update undone by writing back only some of its fields
    return Step(entry.id, entry.tool, kind, c.tool, undo_args, tuple(c.residue),
                c.requires_approval, reason, read_back, c.timeout_ms, headers=headers or None,
                read_before=read_before)


def _no_guard(m: ToolManifest, handle: Handle) -> str:
    """Why a captured tool's undo has no divergence check, plainly: nothing says what the
    call left to compare the state before the undo with."""
    v = m.compensation.verification if m.compensation else None
    if v is not None and v.after_call:
        return ("no divergence check: the read after the call was not recorded (it failed, "
                "or the gateway stopped first), so a later change would be overwritten")
    return ("no divergence check: the call's answer holds none of the expect paths (declare "
            "compensation.verification.after_call, or lint L043), so a later change would be "
            "overwritten")


def _discard(entry: Entry, staged: Staged, m: ToolManifest) -> Step:
    """A staged draft is thrown away by the discard tool of the manifest the entry ran
    under, never by the one the entry names: whoever can edit a ledger must not turn a
    rollback into a call of any tool. The entry's draft tool must be the manifest's."""
    if m.draft is None or staged.draft_tool != m.draft.tool:
        declared = (f"its draft tool is {m.draft.tool}" if m.draft is not None
                    else "it declares no draft form")
        return _report(entry, "unrecoverable", f"the ledger's draft does not match the manifest "
                       f"it ran under: the entry records a draft of {staged.draft_tool}, and "
                       f"{declared}; nothing is called (the ledger may have been edited: "
                       "discard the draft by hand)")
    discard = m.draft.discard
    if discard is None:
        return _report(entry, "not_undoable", f"a staged draft of {staged.draft_tool}, "
                       "and the manifest declares no discard tool")
    differs = (f" (the ledger names {staged.discard}; the manifest's discard is used)"
               if staged.discard is not None and staged.discard != discard else "")
    return Step(entry.id, entry.tool, "discard", discard, dict(staged.handle), (), False,
                f"a staged draft (never promoted): {discard} throws it away{differs}")


def _unknown(entry: Entry, m: ToolManifest, note: str, refs: Refs) -> Step:
    """An entry whose outcome is unknown: found through the lookup, never guessed."""
    what = ("its answer was lost" if entry.state == "uncertain"
            else "its outcome was never recorded (the gateway stopped during the call)")
    if m.effect == Effect.read_only:
        return _report(entry, "skip", f"{m.tool} is {m.effect}: nothing to undo, whatever "
                       f"happened{note}")
    settles = m.effect in (Effect.idempotent, Effect.irreversible)
    if settles and m.lookup is not None:
        # Nothing undoes it, but the lookup settles it: found, it stands (left behind);
        # not found, it never happened and its key is free. Unlooked-up, the entry would
        # hold its key for good.
        h = entry.handle or Handle()
        args, missing = resolve_refs(refs.of(m).lookup, h, entry.key_sent or entry.key)
        if not missing:
            return Step(entry.id, entry.tool, "lookup", m.lookup.tool, args, (), False,
                        f"{what}: {m.lookup.tool} finds whether it acted (found: {m.tool} is "
                        f"{m.effect}, it is left behind; not found: it never happened and its "
                        f"key is free){note}")
    if m.effect == Effect.idempotent:
        return _left_changed(entry, m, f" ({what}){note}")
    if m.effect == Effect.irreversible:
        return _report(entry, "not_undoable", f"{m.tool} is irreversible ({what}): nothing can "
                       f"undo it{note}")
    if m.lookup is None:
        return _report(entry, "unrecoverable", f"unresolvable: {what}, and {m.tool} declares "
                       f"no lookup to find out whether it acted{note}")
    h = entry.handle or Handle()
    args, missing = resolve_refs(refs.of(m).lookup, h, entry.key_sent or entry.key)
    if missing:
        return _report(entry, "unrecoverable", f"unresolvable: {what}, and the lookup cannot "
                       "be built: " + "; ".join(missing) + note)
    return Step(entry.id, entry.tool, "lookup", m.lookup.tool, args, (), False,
                f"{what}: {m.lookup.tool} finds whether it acted (found: undone like any other; "
                f"not found: it never happened){note}")


def _left_changed(entry: Entry, m: ToolManifest, note: str) -> Step:
    """An idempotent call is safe to repeat, but its first call changed the world (a file
    written, a record set) and nothing undoes an idempotent tool: not run, and said as what
    the rollback leaves behind (residue), never as "nothing to undo"."""
    return Step(entry.id, entry.tool, "skip", None, None,
                (f"what {m.tool} changed stays: an idempotent tool has no undo (to undo it, "
                 "declare it reversible, with a capture of what it overwrites)",), False,
                f"{m.tool} is idempotent: not undone, what its call changed stays{note}")


def _report(entry: Entry, action: Action, reason: str) -> Step:
    return Step(entry.id, entry.tool, action, None, None, (), False, reason)


def _with_reason(step: Step, reason: str) -> Step:
    return dataclasses.replace(step, reason=reason)


# ---- selection and order ----

def _when(entry: Entry) -> tuple[str, int]:
    """When the effect happened (started, else requested; RFC 3339 in UTC with
    milliseconds sorts as text), then the run's order."""
    return entry.times.started or entry.times.requested, entry.seq


def select(ordered: Sequence[Entry], versions: Versions, selection: Selection) -> list[Entry]:
    """The selected entries, oldest first."""
    if selection.entries and selection.since is not None:
        raise PlanError("give either entries or since, not both")
    if selection.since is not None:
        return _since(ordered, selection.since)
    if not selection.entries:
        return list(ordered)
    known = {e.id for e in ordered}
    unknown = [i for i in selection.entries if i not in known]
    if unknown:
        raise PlanError(f"no entry {', '.join(unknown)} in this ledger")
    chosen = set(selection.entries)
    tools: set[str] = set()  # tools with a chosen entry so far (oldest first)
    out: list[Entry] = []
    for e in ordered:
        if e.id not in chosen and tools.intersection(_requires(e, versions)):
            chosen.add(e.id)  # it required a chosen entry's tool, later in the run
        if e.id in chosen:
            out.append(e)
            tools.add(e.tool)
    return out


def _since(ordered: Sequence[Entry], since: str) -> list[Entry]:
    for i, e in enumerate(ordered):
        if e.id == since:
            return list(ordered[i + 1:])
    try:
        moment = stamp(parse_stamp(since))
    except ValueError:
        raise PlanError(f"since {since!r} is neither an entry of this ledger nor an RFC 3339 "
                        "time (2026-01-31T10:00:00Z)") from None
    return [e for e in ordered if _when(e)[0] >= moment]


def _requires(entry: Entry, versions: Versions) -> list[str]:
    m = versions.of(entry)[0]
    return [r.tool for r in m.requires] if m is not None else []


# ---- missing versions ----

def _needs_manifest(entry: Entry) -> bool:
    return entry.state not in _NOTHING


def _missing_versions(missing: Iterable[Entry], versions: Versions) -> str:
    rows = list(missing)
    shown = ", ".join(f"{e.id} ({e.tool} {_short(e.checksum)})" for e in rows[:5])
    more = f" and {len(rows) - 5} more" if len(rows) > 5 else ""
    today = [e for e in rows if e.tool in versions.tools]
    hint = ("give the manifest files of those versions (--versions), or --current to plan "
            "them with today's manifests" if today else
            "give the manifest files of those versions (--versions)")
    return (f"{len(rows)} {'entry ran' if len(rows) == 1 else 'entries ran'} under manifest "
            f"versions that were not given: {shown}{more}; {hint}")


def _short(checksum: str | None) -> str:
    return checksum[:19] if checksum else "no checksum recorded"
