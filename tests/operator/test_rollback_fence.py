"""The operator's rollback fences its run first, denies what awaits approval, waits for the
calls in flight, and plans with the holders of the pending entries' key Leases
(operator/rollback.py, ledger/rollback_rules.py)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from test_rollback_decisions import NOW, ctx, entry, ledger, story, versions

from unwind.ledger.entry import EntryApproval, Times, stamp
from unwind.ledger.plan import Versions
from unwind.ledger.store import Holder
from unwind.operator.rollback import Decision, LedgerView, decide

__all__ = ["versions"]  # the fixture


def pending(v: Versions, id_: str, *, deadline: Any = None, key: str | None = "charge-o9") -> Any:
    e = entry(v, id_, "stripe.create_charge", {"order_id": "o9", "amount": 5}, {}, 9,
              state="pending", key=key)
    return e.model_copy(update={"deadline": deadline, "scope": "global" if key else None,
                                "handle": e.handle})


def run(view: LedgerView, v: Versions, now: Any = NOW) -> Decision:
    return decide(view, lambda: v, {}, {}, ctx(now))


def condition(d: Decision, type_: str) -> dict[str, Any]:
    return next(c for c in d.status["conditions"] if c["type"] == type_)


def test_a_request_fences_every_page_and_waits_for_a_call_in_flight_before_it_plans(versions: Versions) -> None:
    flying = pending(versions, "pay-9", deadline=stamp(NOW + timedelta(seconds=40)))
    view = ledger([*story(versions), flying])
    view.pages, view.fenced_pages = 2, 0
    d = run(view, versions)
    assert d.fence is not None and d.fence["generation"] == 2 and d.fence["reason"] == "bad run"
    assert "rollback" not in d.status  # nothing planned while the call may still act
    assert d.waiting and not d.jobs
    planned = condition(d, "RollbackPlanned")
    assert (planned["status"], planned["reason"]) == ("Unknown", "WaitingForCalls")
    assert "waiting for 1 call in flight to finish or pass its deadline (pay-9; until " \
           f"{stamp(NOW + timedelta(seconds=40))} at the latest)" in planned["message"]
    assert condition(d, "RolledBack")["reason"] == "WaitingForCalls"
    # the call ends (its outcome written), the pages are fenced: now it plans, and undoes it
    done = flying.model_copy(update={"state": "succeeded", "handle": story(versions)[0].handle})
    view = ledger([*story(versions), done])
    view.pages, view.fenced_pages = 2, 2
    d = run(view, versions, NOW + timedelta(seconds=5))
    assert d.fence is None and not d.waiting
    assert next(s["entry"] for s in d.status["rollback"]["steps"]) == "pay-9"


def test_a_call_past_its_deadline_is_planned_as_a_lookup_not_waited_for(versions: Versions) -> None:
    late = pending(versions, "pay-9", deadline=stamp(NOW - timedelta(seconds=1)))
    d = run(ledger([late]), versions)
    assert not d.waiting
    assert [(s["entry"], s["action"]) for s in d.status["rollback"]["steps"]] == [("pay-9", "lookup")]


def test_an_entry_awaiting_approval_is_denied_by_the_rollback_and_never_runs(versions: Versions) -> None:
    waiting = entry(versions, "pay-2", "stripe.create_charge", {"order_id": "o2", "amount": 5}, {}, 5,
                    state="awaiting_approval")
    waiting = waiting.model_copy(update={"approval": EntryApproval(rules={"roles": ["finance"]},  # type: ignore[arg-type]
                                                                   identities="kubernetes")})
    d = run(ledger([waiting]), versions)
    denied = d.changes["pay-2"](waiting)
    assert denied.state == "denied" and denied.error is not None and denied.error.code == "rolled_back"
    assert denied.approval is not None and "a rollback of run-42 closed the run" in denied.approval.message


def test_a_withdrawn_request_lifts_the_fence(versions: Versions) -> None:
    view = ledger(story(versions), request={"requested": False})
    view.pages, view.fenced_pages = 1, 1
    assert run(view, versions).lift_fence


def test_a_pending_entry_whose_lease_names_another_run_is_skipped_not_looked_up(versions: Versions) -> None:
    killed = pending(versions, "pay-9", deadline=stamp(NOW - timedelta(seconds=1)))
    for holders, action in (({"pay-9": Holder("run-7", "pay-1", stamp(NOW))}, None),
                            ({"pay-9": None}, None),
                            ({"pay-9": Holder("run-42", "pay-9", stamp(NOW))}, "lookup")):
        view = ledger([killed])
        view.holders = holders
        steps = run(view, versions).status["rollback"]["steps"]
        assert [s["action"] for s in steps] == ([action] if action else []), holders
    # the skip is counted, and the entry recorded refused, as its gateway would have
    view = ledger([killed])
    view.holders = {"pay-9": Holder("run-7", "pay-1", stamp(NOW))}
    d = run(view, versions)
    assert d.status["rollback"]["skipped"] == 1
    refused = d.changes["pay-9"](killed)
    assert refused.state == "refused" and refused.error is not None and refused.error.code == "duplicate"
    assert "entry pay-1 of run run-7 holds its idempotency key" in refused.error.message


def test_a_pending_entry_written_before_deadlines_were_recorded_counts_as_past_its_deadline(
        versions: Versions) -> None:
    old = pending(versions, "pay-9", key=None).model_copy(update={"times": Times(requested=stamp(NOW))})
    assert not run(ledger([old]), versions).waiting
