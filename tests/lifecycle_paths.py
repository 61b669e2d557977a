"""Ledger fixtures in any state, written the way entries really get there.

Every store write goes through the entry lifecycle (ledger/lifecycle.py), so a fixture of
an ``undone`` entry is not created ``undone``: it is created as a gateway creates entries
and walked along the table's rows (the shortest path) to the state the test wants.
"""

from __future__ import annotations

from collections import deque

from unwind.ledger.entry import Entry, State
from unwind.ledger.filestore import FileStore
from unwind.ledger.lifecycle import TRANSITIONS, Expect, Transition, Write


def path_to(state: State) -> list[Transition]:
    """The shortest list of rows from a new entry to ``state`` (created by the gateway)."""
    queue: deque[tuple[State, list[Transition]]] = deque(
        (t.target, [t]) for t in TRANSITIONS if t.source is None and "gateway" in t.writers)
    seen: set[State] = set()
    while queue:
        at, rows = queue.popleft()
        if at == state:
            return rows
        if at in seen:
            continue
        seen.add(at)
        queue.extend((t.target, [*rows, t]) for t in TRANSITIONS
                     if t.source == at and not t.after_deadline)
    raise ValueError(f"no path to {state}")


def store_entry(store: FileStore, run: str, entry: Entry) -> Entry:
    """Create ``entry`` in ``run``, in its state, through the lifecycle."""
    first, *rest = path_to(entry.state)
    stored = store.create_sync(run, entry.model_copy(update={"state": first.target}))
    for row in rest:
        target = row.target
        final = row is rest[-1]
        writer = sorted(row.writers)[0]
        stored = store.transition_sync(run, entry.id, Write(
            writer, Expect(stored.state),  # type: ignore[arg-type]
            lambda e, t=target, f=final: (entry.model_copy(update={"seq": e.seq}) if f
                                          else e.model_copy(update={"state": t}))))
    return stored
