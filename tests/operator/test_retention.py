"""When a ledger may be deleted (operator/unwind/operator/retention.py), without a cluster."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from unwind.api.conditions import get_condition
from unwind.ledger.entry import Entry, Handle, Times, stamp
from unwind.ledger.plan import Versions
from unwind.manifest.canonical import checksum
from unwind.operator.retention import decide
from unwind.operator.rollback import LedgerView
from unwind.undo.sources import load_versions

ROOT = Path(__file__).resolve().parents[2]
LAST = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def versions() -> Versions:
    return load_versions([str(ROOT / "manifests")])


def charge(versions: Versions, when: datetime = LAST) -> Entry:
    m = versions.tools["stripe.create_charge"]  # audit.retention_days: 2555
    return Entry(id="pay-1", tool=m.tool, checksum=checksum(m), actor="agent", state="succeeded",
                 handle=Handle(), times=Times(requested=stamp(when), finished=stamp(when)))


def view(entries: list[Entry], rollback: Any = None) -> LedgerView:
    return LedgerView("run-1", "uid", "run-1", 1, None, rollback, [], entries)


def test_a_ledger_within_its_longest_retention_is_kept(versions: Versions) -> None:
    r = decide(view([charge(versions)]), "", lambda: versions, LAST + timedelta(days=2554),
               dry_run=False, grace=60, conditions=[])
    assert r.conditions is None and not r.delete and not r.events


def test_a_ledger_past_its_retention_is_announced_first_then_deleted_a_pass_later(versions: Versions) -> None:
    past = LAST + timedelta(days=2556)
    first = decide(view([charge(versions)]), "", lambda: versions, past, dry_run=False, grace=60, conditions=[])
    assert not first.delete and [e.reason for e in first.events] == ["RetentionDue"]
    cond = get_condition(first.conditions or [], "RetentionExpired")
    assert cond is not None and cond["reason"] == "Expired"
    assert "2555 days (audit.retention_days of stripe.create_charge)" in str(cond["message"])
    soon = decide(view([charge(versions)]), "", lambda: versions, past + timedelta(seconds=10),
                  dry_run=False, grace=60, conditions=first.conditions or [])
    assert not soon.delete
    later = decide(view([charge(versions)]), "", lambda: versions, past + timedelta(seconds=61),
                   dry_run=False, grace=60, conditions=first.conditions or [])
    assert later.delete and [e.reason for e in later.events] == ["LedgerDeleted"]


def test_the_dry_run_marks_a_ledger_past_its_retention_and_never_deletes_it(versions: Versions) -> None:
    past = LAST + timedelta(days=3000)
    first = decide(view([charge(versions)]), "", lambda: versions, past, dry_run=True, grace=0, conditions=[])
    cond = get_condition(first.conditions or [], "RetentionExpired")
    assert cond is not None and cond["reason"] == "DryRun"
    again = decide(view([charge(versions)]), "", lambda: versions, past + timedelta(days=1), dry_run=True,
                   grace=0, conditions=first.conditions or [])
    assert not again.delete and again.conditions is None


def test_a_ledger_with_a_tool_declaring_no_retention_is_kept(versions: Versions) -> None:
    m = versions.tools["github.create_issue"]
    issue = Entry(id="i-1", tool=m.tool, checksum=checksum(m), actor="agent", state="succeeded",
                  times=Times(requested=stamp(LAST)))
    r = decide(view([charge(versions), issue]), "", lambda: versions, LAST + timedelta(days=9000),
               dry_run=False, grace=0, conditions=[])
    assert not r.delete and r.conditions is None


def test_a_ledger_whose_rollback_runs_is_kept(versions: Versions) -> None:
    r = decide(view([charge(versions)], rollback={"generation": 1, "planned": "x", "steps": []}), "",
               lambda: versions, LAST + timedelta(days=9000), dry_run=False, grace=0, conditions=[])
    assert not r.delete and r.conditions is None
