"""Which entries touch the same object, the order their undos must run in, and when an undo
has nothing left to do (pure).

Undos of one object do not commute: a run that created ticket 11 and then updated it is
undone by restoring the update first and deleting the ticket after; run the other way
round (or at once), the delete wins and the restore finds nothing, or restores a ticket
that must not exist. So the plan knows each entry's **object**: the values that name it.
A manifest may declare them (``compensation.object``, e.g. ``[$result.id]`` for a create
and ``[$args.id]`` for an update); otherwise they are the values its read-back names
(``verification.arguments``), else its undo's arguments read from the call (``$args``,
``$result``; never literals, nor ``$before``, which hold old field values, not names), else
its lookup's, each with its name. Two entries touched the same object when those agree
(values as text: ``11`` and ``"11"`` are one value): the create of ticket 11, read back
with ``{id: $result.id}``, and its update, read back with ``{id: $args.id}``, both name
``{"id": "11"}``. Where two tools name one object differently (``id`` and ``ticket_id``),
declare ``compensation.object`` on both.

The order: entries on one object are undone newest first by their place in the run
(``seq``: the store numbers write-aheads under the run's lock or resourceVersion, and the
update of a created object is written ahead after the create answered, so ``seq`` is that
order even when two gateways' clocks disagree), one at a time. The rest of the plan's
order (newest first, ``requires``) stays; only undos on different objects run in parallel.

**Moot**: when the undo of an older entry removed the object (its read-back proves it gone,
``verification.absent``) and that entry is ``undone``, a newer entry on the same object has
nothing left to undo: the state before the run has no such object. Restoring it would bring
back what must not exist, and retrying would fail forever. Such an entry is planned
``moot`` and recorded so (a lifecycle state), with the reason.
"""

from __future__ import annotations

import heapq
import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..manifest.model import ToolManifest
from ..manifest.refs import Missing, RefSyntaxError, parse_ref, resolve
from .entry import Entry, Handle

MOOTABLE = frozenset({"succeeded", "undo_failed", "undoing"})


def object_key(entry: Entry, m: ToolManifest | None) -> str | None:
    """The object ``entry`` touched, as one text (None: not known); see the module
    docstring. Two entries with the same key touched the same object."""
    c = m.compensation if m is not None else None
    if c is None:
        return None
    h = entry.handle or Handle()
    if c.object:
        values = [_value(raw, h, entry.key, declared=True) for raw in c.object]
        if any(v is None for v in values):
            return None
        return _text(values)
    if c.verification is not None and c.verification.arguments:
        named = c.verification.arguments
        declared = True  # the read-back's arguments name the object whole, literals too
    elif c.argument_map:
        named, declared = c.argument_map, False
    elif m is not None and m.lookup is not None and m.lookup.arguments:
        named, declared = m.lookup.arguments, False
    else:
        return None
    found = {name: v for name, raw in named.items()
             if (v := _value(raw, h, entry.key, declared=declared)) is not None}
    return _text(found) if found else None


def _value(raw: Any, h: Handle, key: str | None, *, declared: bool) -> Any:
    try:
        ref = parse_ref(raw)
    except RefSyntaxError:
        return None
    if ref.root == "current" or (not declared and ref.root not in ("args", "result")):
        return None  # an undo's other arguments hold old field values, not names
    value = resolve(ref, h.args, h.result, key, h.before)
    return None if isinstance(value, Missing) else _plain(value)


def _plain(value: Any) -> Any:
    """Values compared as text: 11 and "11" name one object."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, str | int | float):
        return str(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def removes(m: ToolManifest | None) -> bool:
    """The undo of a call of ``m`` removes its object (its read-back proves it gone)."""
    c = m.compensation if m is not None else None
    return c is not None and c.verification is not None and c.verification.absent is not None


def moot_reason(entry: Entry, entries: Sequence[Entry],
                manifest_of: Callable[[Entry], ToolManifest | None],
                objects: Mapping[str, str | None] | None = None) -> str | None:
    """Why ``entry``'s undo has nothing left to do, or None (see the module docstring)."""
    if entry.state not in MOOTABLE:
        return None
    mine = objects.get(entry.id) if objects is not None and entry.id in objects \
        else object_key(entry, manifest_of(entry))
    if mine is None:
        return None
    for other in entries:
        if other.id == entry.id or other.state != "undone" or other.seq >= entry.seq:
            continue
        m = manifest_of(other)
        if not removes(m):
            continue
        theirs = objects.get(other.id) if objects is not None and other.id in objects \
            else object_key(other, m)
        if theirs == mine:
            return (f"moot: its object ({mine}) was removed by the undo of entry "
                    f"{other.id} ({other.tool}), which came before it in the run (seq "
                    f"{other.seq} < {entry.seq}): as before the run, the object does not "
                    "exist, so nothing is left to undo")
    return None


def undo_order(newest: Sequence[Entry], requires: Mapping[str, list[str]],
               objects: Mapping[str, str | None]) -> list[Entry]:
    """``newest`` (newest first) reordered so that (a) every entry of a tool T comes after
    every entry whose tool requires T, and (b) entries on one object come in descending
    ``seq``. Ties keep newest first; a cycle (only across manifest versions)
    falls back to newest first for what is left. Kahn's sort, O(n log n + edges)."""
    n = len(newest)
    blocking: dict[str, int] = {}  # tool -> entries left whose tool requires it
    for e in newest:
        for t in requires.get(e.id, ()):
            blocking[t] = blocking.get(t, 0) + 1
    before: list[int] = [0] * n  # same-object predecessors left
    after: list[list[int]] = [[] for _ in range(n)]
    chains: dict[str, list[int]] = {}
    for i, e in enumerate(newest):
        value = objects.get(e.id)
        if value is not None:
            chains.setdefault(value, []).append(i)
    for chain in chains.values():
        chain.sort(key=lambda i: -newest[i].seq)
        for a, b in itertools.pairwise(chain):
            after[a].append(b)
            before[b] += 1
    by_tool: dict[str, list[int]] = {}
    ready: list[int] = []
    for i, e in enumerate(newest):
        by_tool.setdefault(e.tool, []).append(i)
        if not blocking.get(e.tool, 0) and not before[i]:
            ready.append(i)
    heapq.heapify(ready)
    done = [False] * n
    queued = set(ready)
    out: list[Entry] = []

    def free(j: int) -> None:
        if not done[j] and j not in queued and not blocking.get(newest[j].tool, 0) and not before[j]:
            queued.add(j)
            heapq.heappush(ready, j)
    while len(out) < n:
        if not ready:  # a cycle: the newest entry left goes next
            i = next(k for k in range(n) if not done[k])
        else:
            i = heapq.heappop(ready)
            if done[i]:
                continue
        done[i] = True
        out.append(newest[i])
        for b in after[i]:
            before[b] -= 1
            free(b)
        for t in requires.get(newest[i].id, ()):
            blocking[t] -= 1
            if blocking[t] == 0:
                for j in by_tool.get(t, ()):
                    free(j)
    return out
