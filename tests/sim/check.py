"""The invariants, checked against the upstream's record (docs/rollback.md, "What Unwind
guarantees, and under which faults"), and which known bug of issue 26 a breach looks like.

Checked as they happen, at the upstream (``upstream.py``):

- ``at_most_once``: an effect happens at most once per rendered key within its scope: no
  second effect under a key while the first stands (a key is free again once its effect
  is undone, or never happened);
- ``undo_twice``: no effect is undone twice (an undo repeated with the same step key is a
  retry and is fine).

Checked once the calls are over (``after the calls``: everything that answered, answered)
and again after a fault-free final rollback of every run (``after the final rollback``):

- ``ledger_disagrees``: every effect is either recorded live or recorded undone, and the
  upstream agrees: a ``succeeded`` entry names an effect that stands, an ``undone`` one an
  effect undone, and no effect stands that no live entry records (a ``pending``,
  ``uncertain`` or ``undoing`` entry may go either way until it is settled);
- ``stuck`` (final only): no entry is left where neither a retry nor a rollback can settle
  it: after the final rollback nothing is ``pending``, ``uncertain``, ``undoing`` or
  ``undo_failed``, and nothing undoable is still ``succeeded``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from unwind.ledger.entry import Entry
from unwind.ledger.store import lock_name

from .tools import EFFECT_TOOLS
from .upstream import ACTOR, Breach, Ground

MAYBE_LIVE = frozenset({"pending", "uncertain", "undoing"})
LIVE = frozenset({"succeeded", "undo_failed"}) | MAYBE_LIVE
UNSETTLED = MAYBE_LIVE | {"undo_failed"}
KNOWN = {
    "1": "a rollback during a call is overwritten by the call's outcome",
    "2": "two approved repeats of one key both run",
    "3": "a slow capture loses its key lock",
    "5": "one effect undone twice through the plan's skip rule",
}


def claims(run: str, e: Entry) -> list[str]:
    """The upstream effects an entry says are its own: the id its handle kept, else (a tool
    whose handle keeps none) whatever the calls under its id made."""
    id_field = EFFECT_TOOLS.get(e.tool)
    result = e.handle.result if e.handle is not None else None
    if id_field and isinstance(result, dict) and result.get(id_field):
        return [str(result[id_field])]
    return []


def agreement(ground: Ground, ledgers: dict[str, list[Entry]], phase: str, at: float, *,
              final: bool) -> list[Breach]:
    out: list[Breach] = []

    def breach(kind: str, message: str, e: Entry | None = None, run: str = "",
               effect: str | None = None) -> None:
        out.append(Breach(kind, f"{phase}: {message}", at, e.tool if e else "",
                          (effect,) if effect else (), e.key if e else None,
                          entry=f"{run}/{e.id}" if e else ""))
    recorded: set[str] = set()
    by_intent = {(run, e.id): e for run, entries in ledgers.items() for e in entries}
    for run, entries in ledgers.items():
        for e in entries:
            if e.tool not in EFFECT_TOOLS:
                continue
            mine = claims(run, e)
            where = f"{run}/{e.id} ({e.tool}) is {e.state}"
            if e.state in LIVE:
                recorded.update(mine)
            for x in mine:
                effect = ground.effects.get(x)
                if effect is None:
                    breach("ledger_disagrees", f"{where} and names {x}, which never happened", e, run)
                elif e.state == "succeeded" and not effect.live:
                    breach("ledger_disagrees", f"{where}, but its effect {x} was undone "
                           f"at {effect.undone_at:.3f}", e, run, x)
                elif e.state == "undone" and effect.live:
                    breach("ledger_disagrees", f"{where}, but its effect {x} stands", e, run, x)
            if final and e.state in UNSETTLED:
                breach("stuck", f"{where} after the final rollback", e, run)
            elif final and e.state == "succeeded" and e.effect != "irreversible":
                breach("stuck", f"{where} after the final rollback: its effect was not undone", e, run)
    for effect in ground.effects.values():
        if not effect.live or effect.id in recorded:
            continue
        run, entry_id = effect.call.split("/")[:2]
        e = by_intent.get((run, entry_id))
        if e is not None and e.state in LIVE and not claims(run, e):
            continue  # recorded live without an id (an irreversible tool), or not settled yet
        state = f"is {e.state}" if e is not None else "does not exist"
        out.append(Breach("ledger_disagrees", f"{phase}: {effect.id} ({effect.tool}, key "
                          f"{effect.key}) of call {effect.call} stands, but no live entry records "
                          f"it: entry {run}/{entry_id} {state}", at, effect.tool, (effect.id,),
                          effect.key, entry=f"{run}/{entry_id}"))
    return out


def known_bug(b: Breach, ground: Ground, owners: dict[str, str], grace: float) -> str:
    """Which known bug a breach looks like ("other" when none), by what happened before it:
    (1) a lookup answered while a call with the same key was at the upstream, or an effect
    undone by its entry's own undo that the entry records live again; (2) a second
    effect of the approval tool; (3) a second effect after a lock older than the grace was
    broken; (5) an effect undone by the undo of another entry (``owners``: step key ->
    entry, from ``stepinput.step_key``)."""
    effects = [ground.effects[x] for x in b.effects if x in ground.effects]
    key = b.key or next((e.key for e in effects if e.key), None)
    if any(k == key and t <= b.at for t, k in ground.lookups_during_calls):
        return "1"
    if b.invariant == "at_most_once" and b.tool == "vault.wire":
        return "2"
    if b.invariant == "at_most_once" and effects and effects[0].scope_key is not None:
        tool, scope, where, k = effects[0].scope_key
        name = lock_name(scope, run=where, actor=ACTOR, tool=tool, key=k)  # type: ignore[arg-type]
        if any(n == name and age >= grace and t <= b.at for t, n, age in ground.broken_locks):
            return "3"
    if b.invariant == "undo_twice" and len({owners.get(k, k) for k in b.undo_keys}) > 1:
        return "5"
    if b.invariant == "ledger_disagrees" and effects and not effects[0].live:
        # undone by its own entry's rollback, then recorded live again by the call: (1);
        # undone by another entry's undo, which took it for its own: (5)
        return "1" if owners.get(str(effects[0].undone_by)) == b.entry else "5"
    return "other"


def summary(breaches: Iterable[Breach], ground: Ground, owners: dict[str, str],
            grace: float) -> list[dict[str, Any]]:
    return [{"invariant": b.invariant, "bug": known_bug(b, ground, owners, grace), "at": b.at,
             "message": b.message} for b in breaches]
