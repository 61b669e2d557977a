"""One entry's lifecycle, as data: its states, the legal transitions, who may make each, and
what each does to the entry's idempotency key.

Five writers change entries: the gateway (a call's write-ahead, its outcome, a refusal),
the approver (`unwind approve`, the operator copying Approvals in), the rollback (local
and in the cluster), the lookup (a lost answer found, or not), and a person settling an
entry by hand (`unwind settle`: what no rollback can finish, resolved and recorded). Each used to write
states on its own terms, and one overwrote another: a call's outcome turned an entry a
rollback had just undone back into ``succeeded``. Kubernetes validates every Pod update
against the legal transitions in the API server (``ValidateUpdate``); here every store
(file, cluster, memory) applies every write through ``apply``:

- a write is a compare-and-set on what its writer read: the state (and, where it
  matters, the attempt: how many earlier attempts the id has had), ``Expect``. A write
  whose expectation is gone raises ``StaleWrite``, naming the entry, the state found,
  the state expected and the writer: nothing overwrites what another writer did since;
- the change must be a row of ``TRANSITIONS`` for that writer (``IllegalTransition``
  otherwise): a writer cannot move an entry where it may not go;
- a row that ``opens`` a call (the write-ahead, an awaiting entry, the approved repeat) is
  refused in a run a rollback has fenced (the store checks, ``opens``; ``fence.Fenced``);
- a row marked ``after_deadline`` holds only once the call's deadline has passed: a lookup
  never resolves a ``pending`` entry whose call may still be in flight, nor an
  ``uncertain`` one whose upstream may still apply the call it stopped waiting for (a
  lookup before that would say "not found" and free the key of an effect about to land).

Each row says what it does to the entry's key: ``take`` (the entry now holds its rendered
key: a second call with the same key is a duplicate), ``hold`` (it keeps holding), ``free``
(it no longer does: its lock, if it holds it, may be given up) or ``none``. A state holds
the key when an effect may still happen or stands (``StateInfo.holds_key``); the table is
checked against that at import.

A person's settle (``settled``) keeps the key held: the effect may still stand as the
person left it, so a repeat of the call stays a duplicate. A ``moot`` entry's object is
gone (an older entry's undo removed it), so it holds no key.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, get_args

from .entry import STATES, Entry, State, parse_stamp
from .store import Stale

Writer = Literal["gateway", "approver", "rollback", "lookup", "person"]
WRITERS: tuple[Writer, ...] = get_args(Writer)
KeyEffect = Literal["take", "hold", "free", "none"]


@dataclass(frozen=True)
class StateInfo:
    name: State
    holds_key: bool
    meaning: str


STATE_INFO: tuple[StateInfo, ...] = (
    StateInfo("refused", False, "the gateway refused the call (error.code says why): nothing ran"),
    StateInfo("awaiting_approval", True, "the call waits for a human; a repeat with the same "
              "rendered key is a duplicate meanwhile"),
    StateInfo("denied", False, "denied, timed out, or denied by a rollback of its run: nothing ran"),
    StateInfo("pending", True, "written ahead: the call may be under way until its deadline"),
    StateInfo("succeeded", True, "the effect stands"),
    StateInfo("failed", False, "the upstream refused or never received the call"),
    StateInfo("uncertain", True, "sent, answer lost: the effect may stand (its lookup finds out)"),
    StateInfo("undoing", True, "its undo is under way (written before the undo is sent)"),
    StateInfo("undone", False, "the undo took effect and was read back"),
    StateInfo("undo_failed", True, "the undo failed: the effect may still stand"),
    StateInfo("moot", False, "nothing left to undo: the undo of an older entry on the same object "
              "removed it (undo.reason says which)"),
    StateInfo("settled", True, "a person resolved it by hand (settled: who, when, why); no "
              "rollback touches it again, and its key stays held as the person left the effect"),
)
HOLDS: dict[State, bool] = {s.name: s.holds_key for s in STATE_INFO}
# While an entry is in one of these its rendered key stands: a second call with the same
# key is a duplicate.
HOLDING: frozenset[State] = frozenset(s for s, holds in HOLDS.items() if holds)
# An Idempotency-Key whose entry is in one of these may be used again: the call runs anew.
REUSABLE: frozenset[State] = frozenset({"failed", "refused"})


@dataclass(frozen=True)
class Transition:
    source: State | None  # None: the entry is created
    target: State
    writers: frozenset[Writer]
    key: KeyEffect
    why: str
    opens: bool = False  # starts (or may start) a call: refused in a fenced run
    after_deadline: bool = False  # only once the call's deadline has passed


def _t(source: State | None, target: State, writers: str, key: KeyEffect, why: str, *,
       opens: bool = False, after_deadline: bool = False) -> Transition:
    names = frozenset(writers.split())
    return Transition(source, target, names, key, why, opens, after_deadline)  # type: ignore[arg-type]


TRANSITIONS: tuple[Transition, ...] = (
    # a call arrives
    _t(None, "pending", "gateway", "take", "the write-ahead: stored before the upstream sees "
       "anything", opens=True),
    _t(None, "awaiting_approval", "gateway", "take", "the call needs approval: it waits "
       "holding its key", opens=True),
    _t(None, "refused", "gateway", "none", "a refusal is recorded"),
    # an Idempotency-Key used again after failed or refused: a new attempt
    _t("failed", "pending", "gateway", "take", "the id is used again: a new attempt (the old "
       "one moves to attempts)", opens=True),
    _t("refused", "pending", "gateway", "take", "the id is used again: a new attempt",
       opens=True),
    _t("failed", "awaiting_approval", "gateway", "take", "the id is used again, for a call "
       "that needs approval", opens=True),
    _t("refused", "awaiting_approval", "gateway", "take", "the id is used again, for a call "
       "that needs approval", opens=True),
    _t("failed", "refused", "gateway", "none", "the id is used again and refused"),
    _t("refused", "refused", "gateway", "none", "the id is used again and refused"),
    # approval
    _t("awaiting_approval", "awaiting_approval", "approver gateway", "hold",
       "a decision is recorded, or the tally moves on (still waiting)"),
    _t("awaiting_approval", "denied", "approver gateway rollback", "free",
       "denied, timed out (on_timeout: deny), or denied by a rollback of its run"),
    _t("awaiting_approval", "pending", "gateway", "hold", "approved: the agent repeated the "
       "call and it is written ahead", opens=True),
    # the call's outcome
    _t("pending", "succeeded", "gateway", "hold", "the upstream answered 2xx"),
    _t("pending", "failed", "gateway", "free", "the upstream refused it or never got it"),
    _t("pending", "uncertain", "gateway", "hold", "sent, and the answer was lost (or cannot be "
       "recorded)"),
    _t("pending", "refused", "gateway", "free", "its key turned out held by a standing call: "
       "nothing was sent"),
    _t("succeeded", "succeeded", "gateway", "hold", "the read right after the call "
       "(verification.after_call) is recorded"),
    # lost answers
    _t("uncertain", "uncertain", "lookup", "hold", "a lookup attempt is recorded",
       after_deadline=True),
    _t("uncertain", "succeeded", "lookup", "hold", "the lookup found the effect",
       after_deadline=True),
    _t("uncertain", "failed", "lookup", "free", "the lookup found no effect (404)",
       after_deadline=True),
    _t("pending", "pending", "lookup", "hold", "a lookup attempt is recorded", after_deadline=True),
    _t("pending", "succeeded", "lookup", "hold", "the lookup found the effect",
       after_deadline=True),
    _t("pending", "failed", "lookup", "free", "the lookup found no effect (404)",
       after_deadline=True),
    # rollback
    _t("pending", "refused", "rollback", "free", "the rollback found the call never ran (its "
       "key's lock names another entry, or none): what its gateway would have written",
       after_deadline=True),
    _t("succeeded", "undoing", "rollback", "hold", "the undo is written ahead"),
    _t("undo_failed", "undoing", "rollback", "hold", "a failed undo is retried"),
    _t("undoing", "undoing", "rollback", "hold", "an interrupted undo runs again (same step key)"),
    _t("undoing", "undone", "rollback", "free", "the undo took effect and was read back"),
    _t("undoing", "undo_failed", "rollback", "hold", "the undo or its read-back failed"),
    _t("succeeded", "moot", "rollback", "free", "its object was removed by the undo of an older "
       "entry on it: nothing left to undo"),
    _t("undo_failed", "moot", "rollback", "free", "its object was removed by the undo of an "
       "older entry on it: the failed undo is not retried"),
    _t("undoing", "moot", "rollback", "free", "its object was removed by the undo of an older "
       "entry on it while this undo was interrupted"),
    # settled by hand
    _t("succeeded", "settled", "person", "hold", "a person resolved the effect by hand"),
    _t("undo_failed", "settled", "person", "hold", "a person resolved what the failed undo "
       "could not"),
    _t("undoing", "settled", "person", "hold", "a person resolved an undo that cannot finish "
       "(its step is not running)"),
    _t("uncertain", "settled", "person", "hold", "a person found out by hand what the lost "
       "answer said", after_deadline=True),
    _t("pending", "settled", "person", "hold", "a person found out by hand what happened to a "
       "call whose outcome was never recorded", after_deadline=True),
)


def _key_effect(source: State | None, target: State) -> KeyEffect:
    before = source is not None and HOLDS[source]
    after = HOLDS[target]
    return ("hold" if before else "take") if after else ("free" if before else "none")


def _check_table() -> None:
    """The table is consistent: every state known, each key effect what the states say,
    no row twice, every writer named. A row added wrongly fails at import."""
    assert {s.name for s in STATE_INFO} == set(STATES), "every state needs a StateInfo"
    seen: set[tuple[State | None, State, Writer]] = set()
    for t in TRANSITIONS:
        assert t.writers and t.writers <= set(WRITERS), f"{t.source} -> {t.target}: unknown writer"
        for w in t.writers:
            assert (t.source, t.target, w) not in seen, \
                f"{t.source} -> {t.target} by the {w} is in the table twice"
            seen.add((t.source, t.target, w))
        assert t.key == _key_effect(t.source, t.target), \
            f"{t.source} -> {t.target} says {t.key}, the states say {_key_effect(t.source, t.target)}"


_check_table()
_ROWS: dict[tuple[State | None, State, Writer], Transition] = {
    (t.source, t.target, w): t for t in TRANSITIONS for w in t.writers}


def find(source: State | None, target: State, writer: Writer) -> Transition | None:
    """The row that lets ``writer`` move an entry from ``source`` to ``target``."""
    return _ROWS.get((source, target, writer))


def holds_key(entry: Entry) -> bool:
    return entry.key is not None and entry.state in HOLDING


# ---- errors ----

class TransitionRefused(Stale):
    """A write the lifecycle refuses (a ``Stale``, so callers that drop a stale change keep
    doing so); the message names the entry, the state found, the one expected, the writer."""

    def __init__(self, message: str, *, entry: str, found: State | None,
                 expected: State | None, writer: Writer) -> None:
        super().__init__(message)
        self.entry, self.found, self.expected, self.writer = entry, found, expected, writer


class StaleWrite(TransitionRefused):
    """The entry is no longer in the state (or attempt) its writer read."""


class IllegalTransition(TransitionRefused):
    """No row of the table lets this writer make this change."""


# ---- writes ----

@dataclass(frozen=True)
class Expect:
    """What the writer read: the entry's state and, when given, its attempt (how many earlier
    attempts the id had: a reused id is a new call, and a write meant for the old one must
    not land on it)."""

    state: State
    attempt: int | None = None

    @classmethod
    def of(cls, entry: Entry) -> Expect:
        return cls(entry.state, len(entry.attempts))


@dataclass(frozen=True)
class Write:
    """One writer's compare-and-set of one entry: ``change`` is a pure function of the entry
    (a cluster store calls it again on a fresh copy after a conflict, and the expectation
    is checked again each time). ``now`` is needed by rows that wait for a deadline."""

    writer: Writer
    expect: Expect
    change: Callable[[Entry], Entry]
    now: datetime | None = None

    def __call__(self, entry: Entry) -> Entry:
        return apply(entry, self)

    def then(self, other: Write | Writes) -> Writes:
        return Writes((self, *(other.writes if isinstance(other, Writes) else (other,))))


@dataclass(frozen=True)
class Writes:
    """Writes applied one after the other (a rollback pass that records a step and starts
    the next on one entry); each is checked against what the previous one left."""

    writes: tuple[Write, ...] = field(default_factory=tuple)

    def __call__(self, entry: Entry) -> Entry:
        for w in self.writes:
            entry = apply(entry, w)
        return entry

    def then(self, other: Write | Writes) -> Writes:
        return Writes((*self.writes, *(other.writes if isinstance(other, Writes) else (other,))))



AnyWrite = Write | Writes


def apply(entry: Entry, write: Write) -> Entry:
    """The entry after ``write``, or the reason it may not be written (see the module
    docstring). The fence is the store's to check (``opens``)."""
    expect = write.expect
    if entry.state != expect.state or (expect.attempt is not None
                                       and len(entry.attempts) != expect.attempt):
        found = entry.state if entry.state != expect.state else \
            f"{entry.state} (attempt {len(entry.attempts) + 1})"
        wanted = expect.state if expect.attempt is None or entry.state != expect.state else \
            f"{expect.state} (attempt {expect.attempt + 1})"
        raise StaleWrite(f"entry {entry.id} is {found}, not {wanted} as the {write.writer} "
                         "read it: another writer changed it since, and nothing overwrites "
                         "that", entry=entry.id, found=entry.state, expected=expect.state,
                         writer=write.writer)
    new = write.change(entry)
    if new.id != entry.id:
        raise ValueError("a change may not alter an entry's id")
    row = find(entry.state, new.state, write.writer)
    if row is None:
        raise IllegalTransition(
            f"entry {entry.id}: the {write.writer} may not move it from {entry.state} to "
            f"{new.state} (the entry lifecycle, docs/rollback.md)", entry=entry.id,
            found=entry.state, expected=expect.state, writer=write.writer)
    if row.after_deadline and not deadline_passed(entry, write.now):
        raise StaleWrite(f"entry {entry.id} is {entry.state} and its call may still be in "
                         f"flight (until {entry.deadline}): the {write.writer} waits for its "
                         "deadline", entry=entry.id, found=entry.state,
                         expected=expect.state, writer=write.writer)
    return new


def opens(before: Entry, after: Entry, write: AnyWrite) -> bool:
    """Whether ``write``'s change from ``before`` to ``after`` opens a call (so a fenced run
    refuses it): the write-ahead, a new awaiting entry, the approved repeat."""
    if not isinstance(write, Write):
        return False  # only the gateway opens calls, one write at a time
    row = find(before.state, after.state, write.writer)
    return row is not None and row.opens


def admit(entry: Entry, writer: Writer = "gateway") -> Transition:
    """The row that lets ``writer`` create ``entry`` (in its state), or IllegalTransition."""
    row = find(None, entry.state, writer)
    if row is None:
        raise IllegalTransition(f"entry {entry.id}: the {writer} may not create an entry "
                                f"{entry.state} (the entry lifecycle, docs/rollback.md)",
                                entry=entry.id, found=None, expected=None, writer=writer)
    return row


def deadline_passed(entry: Entry, now: datetime | None) -> bool:
    """Whether the call of ``entry`` can no longer be in flight at ``now``. An entry written
    before deadlines were recorded has none: it counts as past."""
    if entry.deadline is None:
        return True
    if now is None:
        return False
    return now >= parse_stamp(entry.deadline)


# ---- the documentation's table ----

def markdown(rows: Iterable[Transition] = TRANSITIONS) -> str:
    """The table docs/rollback.md shows (tests/ledger/test_lifecycle.py compares them)."""
    lines = ["| from | to | who | key | when |", "| --- | --- | --- | --- | --- |"]
    for t in rows:
        notes = []
        if t.opens:
            notes.append("refused in a fenced run")
        if t.after_deadline:
            notes.append("only after the call's deadline")
        extra = f" ({'; '.join(notes)})" if notes else ""
        who = ", ".join(w for w in WRITERS if w in t.writers)
        lines.append(f"| {t.source or '(new)'} | {t.target} | {who} | {t.key} | {t.why}{extra} |")
    lines += ["", "| state | holds its key | meaning |", "| --- | --- | --- |"]
    lines += [f"| {s.name} | {'yes' if s.holds_key else 'no'} | {s.meaning} |" for s in STATE_INFO]
    return "\n".join(lines) + "\n"
