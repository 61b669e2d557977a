"""What `unwind ledger list|show` print, decided here and tested without a folder.

A local ledger page holds exactly what ``kubectl get effectledger NAME -o json`` would, so
its row is the EffectLedger's own printer columns (``api.resources.KINDS``: the columns the
CRD gives kubectl) evaluated on it, as kubectl evaluates them; ``--wide`` adds the
priority-1 columns, as ``-o wide`` does. A run's entries get one row each. Tables are
``plugin_view.table``, the kubectl plugin's; ages are kubectl's (``5m12s``, ``3h``, ``2d``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from ..api.resources import KINDS, Column
from ..ledger.entry import parse_stamp
from ..ledger.rollback_rules import live_count
from .plugin_view import table

LEDGER_COLUMNS: tuple[Column, ...] = next(k.columns for k in KINDS if k.kind == "EffectLedger")
ENTRY_HEADERS = ("SEQ", "ENTRY", "TOOL", "EFFECT", "STATE", "ERROR", "AGE")
_FILTER = re.compile(r'\[\?\(@\.([A-Za-z0-9_]+)=="([^"]*)"\)\]')


def printer_value(obj: Any, path: str) -> Any:
    """A printer column's JSONPath (``.status.entryCount``, ``.metadata.annotations.a\\.b``,
    ``.status.conditions[?(@.type=="RolledBack")].reason``) on an object; None when absent."""
    current: Any = obj
    rest = path
    while rest and current is not None:
        if rest.startswith("["):
            match = _FILTER.match(rest)
            if match is None or not isinstance(current, list):
                return None
            key, want = match.groups()
            current = next((i for i in current if isinstance(i, Mapping) and i.get(key) == want),
                           None)
            rest = rest[match.end():]
            continue
        if not rest.startswith("."):
            return None
        name, rest = _name(rest[1:])
        current = current.get(name) if isinstance(current, Mapping) else None
    return current


def _name(text: str) -> tuple[str, str]:
    """The next field name (``\\.`` is a dot inside it) and what follows it."""
    out, i = [], 0
    while i < len(text) and text[i] not in ".[":
        if text[i] == "\\" and i + 1 < len(text):
            i += 1
        out.append(text[i])
        i += 1
    return "".join(out), text[i:]


def age(stamp: str | None, now: datetime) -> str | None:
    """kubectl's age of a time (its HumanDuration): 45s, 5m12s, 42m, 3h5m, 20h, 3d4h, 9d."""
    if not stamp:
        return None
    try:
        seconds = int((now - parse_stamp(stamp)).total_seconds())
    except ValueError:
        return None
    seconds = max(seconds, 0)
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if seconds < 120:
        return f"{seconds}s"
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 192:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if days < 730:
        return f"{days}d"
    return f"{days // 365}y{days % 365}d" if days < 2920 else f"{days // 365}y"


def ledger_columns(wide: bool) -> tuple[Column, ...]:
    return tuple(c for c in LEDGER_COLUMNS if wide or c.priority == 0)


def ledger_headers(wide: bool = False) -> tuple[str, ...]:
    return ("NAME", *(c.name.upper() for c in ledger_columns(wide)))


def ledger_row(page: Mapping[str, Any], now: datetime, wide: bool = False) -> tuple[Any, ...]:
    """One page as ``kubectl get effectledger`` prints it."""
    cells: list[Any] = [printer_value(page, ".metadata.name")]
    for c in ledger_columns(wide):
        value = printer_value(page, c.json_path)
        cells.append(age(value, now) if c.type == "date" else value)
    return tuple(cells)


def entry_row(entry: Mapping[str, Any], now: datetime) -> tuple[Any, ...]:
    error = entry.get("error") if isinstance(entry.get("error"), Mapping) else None
    times = entry.get("times") if isinstance(entry.get("times"), Mapping) else {}
    return (entry.get("seq"), entry.get("id"), entry.get("tool"), entry.get("effect"),
            entry.get("state"), error.get("code") if error else None,
            age(times.get("requested") if times else None, now))


def with_live(pages: Sequence[dict[str, Any]]) -> Sequence[dict[str, Any]]:
    """A local run's pages with ``status.live`` on its first page, counted from all its
    entries as the operator counts it in a cluster (``rollback_rules.live_count``): only
    the operator writes it, so a folder's pages never hold it of themselves."""
    if pages and isinstance(pages[0].get("status"), dict) and "live" not in pages[0]["status"]:
        pages[0]["status"]["live"] = live_count(entries_of(pages))
    return pages


def entries_of(pages: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [e for p in pages for e in ((p.get("status") or {}).get("entries") or [])
            if isinstance(e, Mapping)]


def ledger_table(pages: Sequence[Mapping[str, Any]], now: datetime, wide: bool = False) -> str:
    return table(ledger_headers(wide), (ledger_row(p, now, wide) for p in pages))


def run_text(pages: Sequence[Mapping[str, Any]], now: datetime, wide: bool = False) -> str:
    """`unwind ledger show RUN`: its pages as kubectl lists them, then its entries."""
    entries = entries_of(pages)
    shown = ledger_table(pages, now, wide)
    if not entries:
        return shown + "\n\nNo entries."
    return shown + "\n\n" + table(ENTRY_HEADERS, (entry_row(e, now) for e in entries))


def as_list(pages: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Pages as ``kubectl get effectledger -l unwind.dev/run=RUN -o json`` prints them (a
    file `unwind plan --ledger` reads back)."""
    return {"apiVersion": "v1", "kind": "List", "items": list(pages), "metadata": {}}


def changed_rows(before: Mapping[str, tuple[Any, ...]],
                 now: Mapping[str, tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """For ``--follow``: the rows that are new or changed, in the order of ``now``; the age
    column (last) does not count as a change, as kubectl -w prints a row per change."""
    return [row for key, row in now.items() if key not in before or before[key][:-1] != row[:-1]]
