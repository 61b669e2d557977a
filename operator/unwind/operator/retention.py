"""Retention of ledgers, as a pure function: when a run's ledger may be deleted.

A ledger is kept as long as the longest ``audit.retention_days`` of the tools its entries
called (each entry judged by the manifest version it ran under, else today's manifest of
its tool), counted from its last entry (a run that goes on is not old). A ledger with an
entry whose tool declares no retention, or whose manifest is unknown, is kept: the
operator never deletes a record it cannot judge. A rollback in progress keeps it too.

Deletion is announced first: the pass that finds a ledger past its retention sets the
condition ``RetentionExpired`` (True, reason ``Expired``) and posts a ``RetentionDue``
Event, so ``kubectl get ledger`` and Events list what will go; only a later pass, at least
``grace`` seconds after that, deletes it (every page) and posts ``LedgerDeleted``. With
``--retention-dry-run`` the condition says ``DryRun`` and nothing is ever deleted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from ..api.conditions import get_condition, set_condition
from ..ledger.entry import parse_stamp, stamp
from ..ledger.plan import Versions
from .objects import Event
from .rollback import KIND, LedgerView, clean

CONDITION = "RetentionExpired"


@dataclass
class Retention:
    conditions: list[dict[str, Any]] | None = None  # the new conditions (None: unchanged)
    delete: bool = False
    events: list[Event] = field(default_factory=list)


def kept_until(ledger: LedgerView, created: str, versions: Versions) -> tuple[datetime | None, str]:
    """When the ledger's retention ends (None: kept), and why."""
    days, longest = 0, ""
    for e in ledger.entries:
        m = versions.of(e)[0] or versions.tools.get(e.tool)
        if m is None:
            return None, f"the manifest of {e.tool} is not known"
        declared = m.audit.retention_days if m.audit is not None else None
        if declared is None:
            return None, f"{e.tool} declares no audit.retention_days"
        if declared > days:
            days, longest = declared, e.tool
    if not ledger.entries:
        return None, "it has no entries"
    last = max(e.times.finished or e.times.started or e.times.requested for e in ledger.entries)
    start = parse_stamp(last or created)
    return start + timedelta(days=days), (f"{days} days (audit.retention_days of {longest}) "
                                           f"after its last entry at {stamp(start)}")


def decide(ledger: LedgerView, created: str, versions: Callable[[], Versions], now: datetime, *,
           dry_run: bool, grace: float, conditions: list[dict[str, Any]]) -> Retention:
    out = Retention()
    if ledger.rollback is not None and not ledger.rollback.get("finished"):
        return out
    if not ledger.entries:
        return out
    until, why = kept_until(ledger, created, versions())
    current = get_condition(conditions, CONDITION)
    now_text = stamp(now)[:19] + "Z"
    if until is None or now < until:
        if current is not None and current.get("status") == "True":
            out.conditions = clean(set_condition(conditions, CONDITION, "False", "NotExpired",
                                                 f"kept: {why}" if until is None else
                                                 f"kept until {stamp(until)}: {why}",
                                                 ledger.generation, now_text))
        return out
    reason = "DryRun" if dry_run else "Expired"
    message = (f"past its retention ({why}) since {stamp(until)}: "
               + ("--retention-dry-run: it is not deleted" if dry_run else
                  "it is deleted at the next retention pass"))
    if current is None or current.get("status") != "True" or current.get("reason") != reason:
        out.conditions = clean(set_condition(conditions, CONDITION, "True", reason, message,
                                             ledger.generation, now_text))
        out.events.append(Event(ledger.name, "Normal", "RetentionDue", message, kind=KIND))
        return out
    since = parse_stamp(str(current.get("lastTransitionTime")))
    if not dry_run and now >= since + timedelta(seconds=grace):
        out.delete = True
        out.events.append(Event(ledger.name, "Normal", "LedgerDeleted",
                                f"deleted: past its retention ({why})", kind=KIND))
    return out
