"""The CLI says what it does and does it one way (issue 18, #5 and #6): a repeated
decision says "already decided", one output flag (`-o json|yaml`, `--json` a hidden
alias), `ledger export --file`, the plugin's help without internal commands, `unwind init`
for every effect, and counts in the right number."""

from __future__ import annotations

from typing import Any

from unwind.cli import plugin_view as view

APPROVER = "unwind.dev/approver"


def approval(name: str, who: str, target: dict[str, Any], decision: str = "approve",
             created: str = "2026-12-02T10:00:00Z") -> dict[str, Any]:
    return {"metadata": {"name": name, "creationTimestamp": created, "annotations": {APPROVER: who}},
            "spec": {"target": target, "decision": decision}}


ENTRY = {"effectLedger": "checkout-8", "entry": "pay-1"}


def test_a_second_identical_decision_by_the_same_person_is_found_as_already_decided() -> None:
    first = approval("a-1", "bob", ENTRY, created="2026-12-02T10:00:00Z")
    later = approval("a-0", "bob", ENTRY, created="2026-12-02T10:00:05Z")
    new = approval("a-2", "bob", ENTRY, created="2026-12-02T10:01:00Z")
    found = view.already_decided(new, [later, new, first], APPROVER)
    assert found is not None and found["metadata"]["name"] == "a-1"  # the earliest


def test_another_person_another_entry_or_another_decision_is_not_already_decided() -> None:
    new = approval("a-2", "bob", ENTRY)
    others = [approval("x-1", "carol", ENTRY), approval("x-2", "bob", {**ENTRY, "entry": "pay-2"}),
              approval("x-3", "bob", ENTRY, decision="deny"),
              approval("x-4", "bob", {"toolManifest": "checkout-8", "checksum": "sha256:" + "a" * 64})]
    assert view.already_decided(new, [*others, new], APPROVER) is None
    unstamped = {"metadata": {"name": "u"}, "spec": new["spec"]}
    assert view.already_decided(unstamped, [new], APPROVER) is None


def test_counts_of_one_are_singular_in_the_watch_and_the_plan() -> None:
    line = view.planned_line({"planned": "2026-12-02T10:00:00Z", "steps": [{"entry": "c1"}], "skipped": 0})
    assert line.startswith("planned at 2026-12-02T10:00:00Z: 1 step, 0 with nothing to undo"), line
    # the plan's "1 of 1 step run": tests/rollback/test_local_rollback.py


def test_the_operators_rollback_counts_are_singular_for_one() -> None:
    from unwind.operator.rollback import _n

    assert (_n(1, "step"), _n(2, "step"), _n(0, "lookup")) == ("1 step", "2 steps", "0 lookups")
