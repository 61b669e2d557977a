"""An in-memory Store and Locks: for the benchmark (ledger writes excluded) and tests.

Never a gateway's real store: nothing survives the process, so nothing is written ahead.
"""

from __future__ import annotations

from .entry import Entry
from .store import Change, EntryExists, EntryMissing, Holder, check_owner, check_room


class MemoryStore:
    def __init__(self) -> None:
        self.runs: dict[str, dict[str, Entry]] = {}
        self.owners: dict[str, str] = {}

    async def get(self, run: str, entry_id: str) -> Entry | None:
        return self.runs.get(run, {}).get(entry_id)

    async def create(self, run: str, entry: Entry, *, max_entries: int | None = None) -> Entry:
        check_owner(run, self.owners.get(run), entry.actor)
        entries = self.runs.get(run, {})
        if entry.id in entries:
            raise EntryExists(entries[entry.id])
        check_room(run, len(entries), max_entries)
        self.owners.setdefault(run, entry.actor)
        stored = entry.model_copy(update={"seq": len(entries) + 1})
        self.runs.setdefault(run, {})[entry.id] = stored
        return stored

    async def update(self, run: str, entry_id: str, change: Change) -> Entry:
        entries = self.runs.get(run, {})
        if entry_id not in entries:
            raise EntryMissing(f"no entry {entry_id} in run {run}")
        new = change(entries[entry_id])
        check_owner(run, self.owners.get(run), new.actor)
        entries[entry_id] = new
        return new

    async def owner(self, run: str) -> str | None:
        return self.owners.get(run)

    async def entries(self, run: str) -> list[Entry]:
        return list(self.runs.get(run, {}).values())


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
