"""One failing ledger stays its own: what a ledger shows when the operator could not decide
it or write what it decided (pure).

The rollback loop (jobs.py) and the approvals' decisions (handlers.py) go over a namespace
ledger by ledger. A ledger whose status the API server refuses, or whose pass raises, must
not hold up the others' rollbacks, lookups and retention (STYLE.md, "One failing object
stays its own"): its failure is recorded on it, as ``Degraded=True`` with a reason of
``rollback.Reason`` (and ``RolledBack=False`` while a rollback is asked for, so
``kubectl unwind rollback --watch`` ends with it) and a Warning Event, and it is retried
with a backoff of its own. A later pass that writes clears it (``rollback.decide``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..api.conditions import set_condition
from .objects import Event
from .rollback import DEGRADED, KIND, ROLLED_BACK, Reason, clean

RETRY_MAX = 300.0  # seconds: the longest wait before a failing ledger is tried again


def permanent(status: int | None) -> bool:
    """Whether an API answer is one only the object (or its owner) can fix: 4xx other than
    404 (gone), 409 (changed meanwhile) and 429 (slow down). 5xx and no answer are temporary."""
    return status is not None and 400 <= status < 500 and status not in (404, 409, 429)


def retry_after(failures: int, base: float) -> float:
    """The wait before the ``failures``-th retry of one ledger: doubling from ``base``."""
    return float(min(base * 2 ** max(failures - 1, 0), RETRY_MAX))


_WHAT = {
    Reason.STATUS_WRITE_FAILED: "the API server refused this ledger's status",
    Reason.RECONCILE_FAILED: "the operator failed deciding this ledger",
    Reason.DECISIONS_WRITE_FAILED: "the decisions of Approvals could not be written into this ledger's entries",
}
_WAITS = {
    Reason.STATUS_WRITE_FAILED: "its rollback, lookups and retention wait until a write is accepted",
    Reason.RECONCILE_FAILED: "its rollback, lookups and retention wait (the operator's log has the "
                             "traceback)",
    Reason.DECISIONS_WRITE_FAILED: "the calls they decide keep waiting",
}


@dataclass
class Failed:
    """What to write on a ledger the operator could not handle."""

    conditions: list[dict[str, Any]] | None = None  # None: they already say it
    events: list[Event] = field(default_factory=list)


def failure_message(reason: str, why: str) -> str:
    return (f"{_WHAT[reason]} ({why}): {_WAITS[reason]}; it is retried with backoff, and the "
            "other ledgers of the namespace go on")


def failed_ledger(name: str, generation: int, conditions: list[dict[str, Any]], rolling_back: bool,
                  reason: str, why: str, now: str) -> Failed:
    """The conditions and the Event of a ledger whose pass failed with ``reason``, because
    of ``why``. ``rolling_back``: a rollback is asked for and not finished, so RolledBack
    says it too. Nothing new when the conditions say it already (no Event at each retry)."""
    message = failure_message(reason, why)[:1024]
    conds = set_condition(list(conditions), DEGRADED, "True", reason, message, generation, now)
    if rolling_back:
        conds = set_condition(conds, ROLLED_BACK, "False", reason, message, generation, now)
    conds = clean(conds)
    if conds == conditions:
        return Failed()
    return Failed(conds, [Event(name, "Warning", reason, message, kind=KIND)])


def written_again(generation: int, conditions: list[dict[str, Any]], reason: str,
                  now: str) -> list[dict[str, Any]] | None:
    """The conditions once a write that failed with ``reason`` went through; None when
    they do not mention that failure."""
    current = next((c for c in conditions if c.get("type") == DEGRADED), None)
    if current is None or current.get("reason") != reason:
        return None
    conds: list[dict[str, Any]] = clean(set_condition(list(conditions), DEGRADED, "False", Reason.NO_FAILURES,
                                                      "the operator writes this ledger again", generation, now))
    return conds
