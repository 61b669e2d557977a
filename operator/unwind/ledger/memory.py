"""An in-memory Store and Locks: for the benchmark (ledger writes excluded) and tests.

Never a gateway's real store: nothing survives the process, so nothing is written ahead.
It keeps the contract all the same (``store.py``): every write through the lifecycle, the
fence checked in the write.
"""

from __future__ import annotations

from datetime import UTC, datetime

from . import lifecycle
from .entry import Entry
from .fence import Fence, Fenced
from .store import EntryExists, EntryMissing, Holder, check_owner, check_room


class MemoryStore:
    def __init__(self) -> None:
        self.runs: dict[str, dict[str, Entry]] = {}
        self.owners: dict[str, str] = {}
        self.fences: dict[str, Fence] = {}
        self.created: dict[str, datetime] = {}

    async def get(self, run: str, entry_id: str) -> Entry | None:
        return self.runs.get(run, {}).get(entry_id)

    async def create(self, run: str, entry: Entry, *, max_entries: int | None = None) -> Entry:
        check_owner(run, self.owners.get(run), entry.actor)
        row = lifecycle.admit(entry)
        entries = self.runs.get(run, {})
        if entry.id in entries:
            raise EntryExists(entries[entry.id])
        if row.opens and run in self.fences:
            raise Fenced(run, self.fences[run])
        check_room(run, len(entries), max_entries)
        if run not in self.owners:
            self.owners[run] = entry.actor
            self.created[run] = datetime.now(UTC)
        stored = entry.model_copy(update={"seq": len(entries) + 1})
        self.runs.setdefault(run, {})[entry.id] = stored
        return stored

    async def transition(self, run: str, entry_id: str, write: lifecycle.AnyWrite) -> Entry:
        entries = self.runs.get(run, {})
        if entry_id not in entries:
            raise EntryMissing(f"no entry {entry_id} in run {run}")
        old = entries[entry_id]
        new = write(old)
        if run in self.fences and lifecycle.opens(old, new, write):
            raise Fenced(run, self.fences[run])
        check_owner(run, self.owners.get(run), new.actor)
        entries[entry_id] = new
        return new

    async def owner(self, run: str) -> str | None:
        return self.owners.get(run)

    async def entries(self, run: str) -> list[Entry]:
        return list(self.runs.get(run, {}).values())

    async def runs_created(self, actor: str, since: datetime) -> dict[str, datetime]:
        return {run: when for run, when in self.created.items()
                if self.owners.get(run) == actor and when >= since}

    async def fence(self, run: str, fence: Fence) -> Fence:
        """Close the run to new calls (a rollback); the first fence stays."""
        return self.fences.setdefault(run, fence)

    async def fenced(self, run: str) -> Fence | None:
        return self.fences.get(run)


class MemoryLocks:
    def __init__(self) -> None:
        self.held: dict[str, Holder] = {}

    async def acquire(self, name: str, holder: Holder) -> Holder | None:
        current = self.held.setdefault(name, holder)
        return None if current is holder else current

    async def release(self, name: str, holder: Holder) -> None:
        await self.break_stale(name, holder)

    async def break_stale(self, name: str, stale: Holder) -> bool:
        if self.held.get(name) == stale:
            del self.held[name]
            return True
        return False

    async def peek(self, name: str) -> Holder | None:
        return self.held.get(name)
