"""Where ledger entries live: the Store and Locks protocols the gateway writes through.

The gateway only ever talks to these two protocols, so the enforcement code is the same
whether entries go to a file on a laptop (``FileStore``, ``FileLocks``) or to the run's
EffectLedger and a Lease per key in a cluster. The contract every implementation keeps:

- ``create`` stores a new entry (and gives it the run's next ``seq``) or raises
  ``EntryExists`` with the entry already there: two callers never both create one id.
- A run has an **owner**: the actor whose entry created its ledger, recorded in the first
  page's ``spec.owner`` by that same create (a conditional create in a cluster: of two
  gateways starting one run, one creates it and the other reads it back and is refused).
  ``create`` and ``update`` refuse (``NotOwner``) an entry of another actor in the same
  locked or conditional write that stores it. A ledger written before owners were
  recorded is owned by the actor of its first entry. ``create`` also refuses
  (``RunFull``) an entry past ``max_entries`` in the run.
- ``transition`` applies one writer's ``lifecycle.Write`` to the stored entry atomically:
  under the run's lock for a file, with resourceVersion preconditions and a retry on
  conflict in a cluster (the write is then checked and applied again on the fresh entry,
  so its change must be a pure function of it). It is a compare-and-set: an entry no
  longer in the state (and attempt) the writer read, or a change the lifecycle does not
  allow that writer, raises (``lifecycle.StaleWrite``, ``IllegalTransition``: both
  ``Stale``). ``create`` is checked the same way (a gateway creates pending,
  awaiting_approval or refused entries). There is no other way to change an entry.
- A run a rollback has fenced (``fence.py``) refuses, in the same write, every write that
  opens a call (``Fenced``): the write-ahead, a new awaiting entry, the approved repeat.
- Anything that stops a write raises ``StoreUnavailable``: the caller gets 503 and the
  upstream is never called (no effect without a record).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from .entry import Entry

if TYPE_CHECKING:
    from .lifecycle import AnyWrite

# A run names its ledger (an EffectLedger object, a file), so it is a DNS label: that
# keeps it a valid object name, a safe file name, and free of the dot that page names use.
RUN_PATTERN = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# Entry ids come from callers (Idempotency-Key): printable, no spaces, bounded.
ENTRY_ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,128}")
Change = Callable[[Entry], Entry]


class StoreUnavailable(Exception):
    """The ledger cannot be read or written; the message says what failed."""


class EntryExists(Exception):
    def __init__(self, entry: Entry) -> None:
        super().__init__(f"entry {entry.id} exists ({entry.state})")
        self.entry = entry


class EntryMissing(Exception):
    """No entry with that id in the run."""


class Stale(Exception):
    """The entry is no longer in a state the writer may change (``lifecycle.TransitionRefused``
    says which, and who wrote)."""


class NotOwner(Exception):
    """The run is recorded as another actor's: its ledger takes no entries of this one."""

    def __init__(self, run: str, owner: str, actor: str) -> None:
        super().__init__(f"run {run} is recorded as {owner}'s, not {actor}'s")
        self.run, self.owner, self.actor = run, owner, actor


class RunFull(Exception):
    """The run holds ``limit`` entries already."""

    def __init__(self, run: str, limit: int) -> None:
        super().__init__(f"run {run} holds {limit} entries, the most one run may hold")
        self.run, self.limit = run, limit


def check_owner(run: str, owner: str | None, actor: str) -> None:
    """Raise NotOwner unless ``actor`` may write the run owned by ``owner`` (None: nobody yet)."""
    if owner is not None and owner != actor:
        raise NotOwner(run, owner, actor)


def check_room(run: str, count: int, limit: int | None) -> None:
    """Raise RunFull when a run of ``count`` entries may take no more (``limit`` None or 0:
    no limit)."""
    if limit and count >= limit:
        raise RunFull(run, limit)


def run_problem(run: str) -> str | None:
    if RUN_PATTERN.fullmatch(run):
        return None
    return (f"{run!r} is not a run name: use 1 to 63 lowercase letters, digits and '-', "
            "starting and ending with a letter or digit (it names the run's ledger)")


def page_name(run: str, page: int) -> str:
    """The ledger object (or file stem) of a run's page: the run itself, then run.p2, ..."""
    return run if page == 1 else f"{run}.p{page}"


class Store(Protocol):
    async def get(self, run: str, entry_id: str) -> Entry | None: ...

    async def create(self, run: str, entry: Entry, *, max_entries: int | None = None) -> Entry: ...

    async def transition(self, run: str, entry_id: str, write: AnyWrite) -> Entry: ...

    async def entries(self, run: str) -> list[Entry]: ...

    async def owner(self, run: str) -> str | None:
        """The run's owner as stored now (None: no ledger, or an older one still empty)."""
        ...


async def probe(store: Store, run: str, entry_id: str) -> Entry | None:
    """The entry a call's Idempotency-Key names, read just before that call is written
    ahead. A store whose create is conditional on the copy of the run it holds may answer
    "absent" from that copy with no read (``ClusterStore.probe``): an entry stored since
    by anyone else makes the create raise ``EntryExists``, so the write decides, not the
    read. Any other store (no ``probe`` method: ``FileStore``, ``MemoryStore``) reads."""
    cheaper = getattr(store, "probe", None)
    if cheaper is None:
        return await store.get(run, entry_id)
    found: Entry | None = await cheaper(run, entry_id)
    return found


@dataclass(frozen=True)
class Holder:
    """Who holds an idempotency key: the entry whose call stands, since when, and until when
    the lock stands even if its entry is not found (it is being written ahead: the capture's
    and the call's timeouts, retries included). None: an older lock (a grace from
    ``since`` applies). Once its entry is stored, the entry's state says whether it holds."""

    run: str
    entry: str
    since: str  # RFC 3339
    deadline: str | None = None  # RFC 3339


Scope = Literal["run", "actor", "global"]


def lock_name(scope: Scope, *, run: str, actor: str, tool: str, key: str) -> str:
    """The lock of one rendered key within its scope: a hash, so any key makes a valid
    file or object name and the key itself (which may be sensitive) is not spelled out."""
    where = {"run": run, "actor": actor, "global": ""}[scope]
    text = "\0".join((scope, where, tool, key))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:40]


class Locks(Protocol):
    async def acquire(self, name: str, holder: Holder) -> Holder | None:
        """Take the lock: None when taken, else the holder that has it."""
        ...

    async def release(self, name: str, holder: Holder) -> None:
        """Give the lock up, if ``holder`` still has it."""
        ...

    async def break_stale(self, name: str, stale: Holder) -> bool:
        """Remove the lock if ``stale`` still has it (its call failed or vanished)."""
        ...

    async def peek(self, name: str) -> Holder | None: ...
