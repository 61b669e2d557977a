"""The approval tally: roles, quorum, four-eyes, deny, timeout and escalation, wording."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from unwind.ledger.approvals import (
    ApprovalRequest,
    ApprovalRules,
    Decision,
    Tally,
    merge,
    next_deadline,
    tally,
)
from unwind.manifest.model import ToolManifest

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
ACTOR = "system:serviceaccount:payments:agent"
FINANCE = ApprovalRules(roles=("finance",), quorum=2, timeout_ms=15 * 60_000,
                        on_timeout="escalate", escalate_to=("cfo",))
FINANCE_DENY = replace(FINANCE, on_timeout="deny", escalate_to=())


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def request(rules: ApprovalRules = FINANCE, actor: str = ACTOR) -> ApprovalRequest:
    return ApprovalRequest("run-42", "e-0007", actor, T0, rules)


def decision(name: str, user: str, *groups: str, minute: float = 1, verdict: str = "approve",
             reason: str = "", **target: Any) -> Decision:
    where = {"ledger": "run-42", "entry": "e-0007", **target}
    return Decision(name, user, groups, verdict, reason, at(minute),  # type: ignore[arg-type]
                    where["ledger"], where["entry"])


def run(*decisions: Decision, rules: ApprovalRules = FINANCE, minute: float = 5,
        **kwargs: Any) -> Tally:
    return tally(request(rules), decisions, at(minute), **kwargs)


# Who counts


def test_two_users_of_a_listed_group_reach_a_quorum_of_two() -> None:
    result = run(decision("a1", "alice", "finance", minute=1),
                 decision("a2", "bob", "finance", "system:authenticated", minute=2))
    assert result.state == "approved"
    assert result.approvers == ("alice", "bob")
    assert result.decided_at == at(2)
    assert result.ignored == ()


def test_one_approval_of_two_keeps_the_entry_waiting() -> None:
    result = run(decision("a1", "alice", "finance"))
    assert result.state == "awaiting_approval"
    assert result.approvers == ("alice",)
    assert result.decided_at is None


def test_the_same_user_approving_twice_counts_once() -> None:
    result = run(decision("a1", "alice", "finance", minute=1),
                 decision("a2", "alice", "finance", minute=2))
    assert result.state == "awaiting_approval"
    assert result.approvers == ("alice",)
    assert result.ignored == (("a2", "alice already approved (a1)"),)


def test_a_user_outside_the_roles_is_ignored_with_the_reason() -> None:
    result = run(decision("a1", "alice", "finance"), decision("a2", "mallory", "eng"))
    assert result.state == "awaiting_approval"
    assert result.ignored == (("a2", "mallory holds none of groups finance"),)


def test_the_callers_own_approval_is_ignored_under_four_eyes() -> None:
    result = run(decision("a1", ACTOR, "finance"), decision("a2", "alice", "finance"))
    assert result.approvers == ("alice",)
    assert result.ignored == (
        ("a1", f"{ACTOR} made the call, and nobody decides on their own call (four-eyes)"),)


def test_without_four_eyes_the_caller_may_approve() -> None:
    result = run(decision("a1", ACTOR, "finance"), decision("a2", "alice", "finance"),
                 four_eyes=False)
    assert result.state == "approved"
    assert result.approvers == (ACTOR, "alice")


def test_no_roles_means_anyone_but_the_actor() -> None:
    anyone = ApprovalRules()
    assert run(decision("a1", ACTOR), rules=anyone).state == "awaiting_approval"
    result = run(decision("a1", ACTOR), decision("a2", "dana"), rules=anyone)
    assert result.state == "approved"
    assert result.approvers == ("dana",)


@pytest.mark.parametrize(("changes", "why"), [
    ({"entry": "e-0008"}, "targets entry e-0008 of ledger run-42, not e-0007 of run-42"),
    ({"ledger": "run-9"}, "targets entry e-0007 of ledger run-9, not e-0007 of run-42"),
    ({"ledger": None, "entry": None}, "does not target a ledger entry"),
    ({"user": ""}, "has no approver username: the admission webhook did not stamp one"),
    ({"user": "system:anonymous"}, "was made anonymously"),
    ({"decision": "maybe"}, "decision 'maybe' is neither approve nor deny"),
    ({"created": datetime(2026, 11, 30, 10, 1)}, "its creation time has no time zone"),
    ({"created": at(-1)}, "was made at 2026-11-30T09:59:00Z, before the call was requested "
                          "at 2026-11-30T10:00:00Z"),
])
def test_a_decision_that_cannot_count_is_ignored_with_the_reason(
        changes: dict[str, Any], why: str) -> None:
    base = decision("a1", "alice", "finance", verdict="deny")
    result = run(replace(base, **changes))
    assert result.state == "awaiting_approval"
    assert result.ignored == (("a1", why),)


# Denials


def test_one_eligible_deny_is_final_even_when_approvals_reach_quorum_later() -> None:
    result = run(decision("d1", "carol", "finance", minute=1, verdict="deny", reason="too large"),
                 decision("a1", "alice", "finance", minute=2),
                 decision("a2", "bob", "finance", minute=3))
    assert result.state == "denied"
    assert result.decided_at == at(1)
    assert result.approvers == ()
    assert [name for name, _ in result.ignored] == ["a1", "a2"]
    assert result.ignored[0][1] == "was made after the entry was denied at 2026-11-30T10:01:00Z"


def test_a_deny_after_the_quorum_was_reached_changes_nothing() -> None:
    result = run(decision("a1", "alice", "finance", minute=1),
                 decision("a2", "bob", "finance", minute=2),
                 decision("d1", "carol", "finance", minute=3, verdict="deny"))
    assert result.state == "approved"
    assert result.ignored == (
        ("d1", "was made after the entry was approved at 2026-11-30T10:02:00Z"),)


def test_at_the_same_instant_a_deny_goes_before_an_approval() -> None:
    result = run(decision("a1", "alice", "finance", minute=1),
                 decision("a2", "bob", "finance", minute=2),
                 decision("d1", "carol", "finance", minute=2, verdict="deny"))
    assert result.state == "denied"


def test_an_ineligible_deny_is_ignored() -> None:
    result = run(decision("d1", "mallory", "eng", minute=1, verdict="deny"),
                 decision("d2", ACTOR, "finance", minute=1, verdict="deny"),
                 decision("a1", "alice", "finance", minute=2),
                 decision("a2", "bob", "finance", minute=3))
    assert result.state == "approved"
    assert [name for name, _ in result.ignored] == ["d1", "d2"]


# Timeout and escalation


def test_a_timeout_with_deny_denies_the_entry() -> None:
    result = run(decision("a1", "alice", "finance", minute=1), rules=FINANCE_DENY, minute=20)
    assert result.state == "denied"
    assert result.decided_at == at(15)
    assert result.message == "timed out after 15m without 2 approvals (1 of 2 from groups finance)"


def test_a_decision_made_at_the_deadline_is_late() -> None:
    result = run(decision("a1", "alice", "finance", minute=1),
                 decision("a2", "bob", "finance", minute=15), rules=FINANCE_DENY, minute=20)
    assert result.state == "denied"
    assert result.ignored == (
        ("a2", "was made after the entry was denied at 2026-11-30T10:15:00Z"),)


def test_a_decision_stamped_after_the_deadline_is_late_even_when_now_is_earlier() -> None:
    # The API server's clock may run ahead of the operator's: a re-run later must agree.
    late = decision("a2", "bob", "finance", minute=15.5)
    early = run(decision("a1", "alice", "finance"), late, rules=FINANCE_DENY, minute=14)
    later = run(decision("a1", "alice", "finance"), late, rules=FINANCE_DENY, minute=60)
    assert early == later
    assert early.state == "denied"


def test_a_timeout_with_escalate_lets_an_escalate_to_member_approve() -> None:
    rules = replace(FINANCE, quorum=1)
    waiting = run(rules=rules, minute=16)
    assert waiting.state == "awaiting_approval"
    assert waiting.escalated_at == at(15)
    result = run(decision("c1", "cleo", "cfo", minute=16), rules=rules, minute=17)
    assert result.state == "approved"
    assert result.approvers == ("cleo",)
    assert result.escalated_at == at(15)


def test_an_escalate_to_member_cannot_approve_before_the_escalation() -> None:
    result = run(decision("c1", "cleo", "cfo", minute=3), rules=replace(FINANCE, quorum=1))
    assert result.state == "awaiting_approval"
    assert result.ignored == (("c1", "cleo holds none of groups finance"),)


def test_approvals_before_the_timeout_still_count_after_escalation() -> None:
    result = run(decision("a1", "alice", "finance", minute=3),
                 decision("c1", "cleo", "cfo", minute=20), minute=21)
    assert result.state == "approved"
    assert result.approvers == ("alice", "cleo")
    assert result.decided_at == at(20)


def test_after_escalation_the_listed_groups_no_longer_decide() -> None:
    result = run(decision("a1", "alice", "finance", minute=3),
                 decision("a2", "bob", "finance", minute=20),
                 decision("d1", "dave", "finance", minute=21, verdict="deny"), minute=22)
    assert result.state == "awaiting_approval"
    assert result.ignored == (
        ("a2", "bob holds none of groups cfo, who decide since the escalation at "
               "2026-11-30T10:15:00Z"),
        ("d1", "dave holds none of groups cfo, who decide since the escalation at "
               "2026-11-30T10:15:00Z"),
    )


def test_after_escalation_there_is_no_second_timeout() -> None:
    req = request()
    result = tally(req, [], at(24 * 60))
    assert result.state == "awaiting_approval"
    assert next_deadline(req, result) is None


def test_an_escalate_to_member_may_deny_after_escalation() -> None:
    result = run(decision("c1", "cleo", "cfo", minute=16, verdict="deny"), minute=17)
    assert result.state == "denied"
    assert result.decided_at == at(16)


# Rules


def test_merged_rules_take_the_union_of_roles_the_largest_quorum_and_the_shortest_timeout() -> None:
    manifest = ApprovalRules(("finance",), 2, 15 * 60_000, "escalate", ("cfo",))
    policy = ApprovalRules(("risk", "finance"), 3, 5 * 60_000, "escalate", ("ceo",))
    assert merge(manifest, policy) == ApprovalRules(
        ("finance", "risk"), 3, 5 * 60_000, "escalate", ("cfo", "ceo"))


def test_merged_rules_escalate_only_when_every_source_with_a_timeout_says_so() -> None:
    escalate = ApprovalRules(("finance",), 1, 60_000, "escalate", ("cfo",))
    deny = ApprovalRules(("finance",), 1, 120_000, "deny")
    untimed = ApprovalRules()  # `always`: no timeout, so its default on_timeout does not vote
    assert merge(escalate, deny).on_timeout == "deny"
    assert merge(escalate, untimed).on_timeout == "escalate"
    assert merge(untimed, untimed).timeout_ms is None


def test_a_source_without_roles_adds_no_restriction_to_a_merge() -> None:
    assert merge(ApprovalRules(), FINANCE).roles == ("finance",)
    assert merge(ApprovalRules(), ApprovalRules()).roles == ()


def test_merging_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        merge()


def test_rules_come_from_the_manifest_in_each_approval_shape() -> None:
    base = {"tool": "stripe.create_charge", "effect": "compensable", "permission": "payments:write",
            "compensation": {"tool": "stripe.refund"}}
    assert ApprovalRules.from_manifest(ToolManifest.model_validate({**base, "approval": "never"})) is None
    assert ApprovalRules.from_manifest(
        ToolManifest.model_validate({**base, "approval": "always"})) == ApprovalRules()
    written = ToolManifest.model_validate({**base, "approval": {
        "roles": ["finance"], "quorum": 2, "timeout": "15m", "on_timeout": "escalate",
        "escalate_to": ["cfo"]}})
    assert ApprovalRules.from_manifest(written) == FINANCE
    assert ApprovalRules.from_manifest(written.approval) == FINANCE


def test_rules_round_trip_through_json() -> None:
    assert ApprovalRules.from_json(FINANCE.to_json()) == FINANCE
    assert ApprovalRules.from_json({}) == ApprovalRules()


@pytest.mark.parametrize(("data", "message"), [
    ({"quorum": 0}, "quorum must be a whole number of at least 1 (got 0)"),
    ({"quorum": True}, "quorum must be a whole number of at least 1"),
    ({"timeout_ms": -5}, "timeout_ms must be milliseconds, 0 or more (got -5)"),
    ({"on_timeout": "retry"}, "on_timeout must be deny or escalate (got 'retry')"),
    ({"on_timeout": "escalate"}, "on_timeout escalate needs escalate_to"),
    ({"roles": "finance"}, "roles must be a list of group names"),
    ({"roles": ["finance", ""]}, "roles must be group names"),
    ({"quorom": 2}, "unknown field quorom; the fields are roles, quorum"),
    (["finance"], "approval rules must be an object, not list"),
])
def test_rules_that_cannot_work_are_refused_naming_the_field(data: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ApprovalRules.from_json(data)


def test_times_without_a_time_zone_are_refused() -> None:
    with pytest.raises(ValueError, match="now must be a datetime with a time zone"):
        tally(request(), [], datetime(2026, 11, 30, 10, 5))
    with pytest.raises(ValueError, match="requested_at must be a datetime with a time zone"):
        ApprovalRequest("run-42", "e-0007", ACTOR, datetime(2026, 11, 30, 10), FINANCE)


# Wording and output


def test_the_message_says_how_many_are_awaited_until_when_and_what_follows() -> None:
    one = decision("a1", "alice", "finance")
    assert run(one, rules=FINANCE_DENY).message == (
        "1 of 2 approvals from groups finance; waiting for 1 more until 2026-11-30T10:15:00Z, "
        "then the call is denied")
    assert run(one).message == (
        "1 of 2 approvals from groups finance; waiting for 1 more until 2026-11-30T10:15:00Z, "
        "then groups cfo decide")
    assert run(rules=ApprovalRules()).message == (
        f"0 of 1 approvals from anyone but {ACTOR}; waiting for 1 more")
    assert run(rules=ApprovalRules(), four_eyes=False).message == (
        "0 of 1 approvals from anyone; waiting for 1 more")


def test_the_message_of_an_escalated_entry_names_the_groups_and_the_time() -> None:
    assert run(decision("a1", "alice", "finance"), minute=16).message == (
        "escalated to groups cfo at 2026-11-30T10:15:00Z: 1 of 2 approvals; waiting for 1 more, "
        "with no further timeout")


def test_the_message_of_an_approved_entry_names_the_approvers() -> None:
    both = run(decision("a1", "alice", "finance"), decision("a2", "bob", "finance", minute=2))
    assert both.message == "approved by alice, bob (2 of 2 from groups finance)"
    escalated = run(decision("a1", "alice", "finance"), decision("c1", "cleo", "cfo", minute=16),
                    minute=17)
    assert escalated.message == (
        "approved by alice, cleo (2 of 2, after escalation to groups cfo at 2026-11-30T10:15:00Z)")


def test_the_message_of_a_denied_entry_names_who_and_why() -> None:
    reason = "amount   too\nlarge " + "x" * 300
    result = run(decision("d1", "carol", "finance", verdict="deny", reason=reason))
    assert result.message.startswith("denied by carol at 2026-11-30T10:01:00Z: amount too large x")
    assert len(result.message) < 260
    assert run(decision("d1", "carol", "finance", verdict="deny")).message == (
        "denied by carol at 2026-11-30T10:01:00Z")
    one = replace(FINANCE_DENY, quorum=1, timeout_ms=90_500)
    assert run(rules=one, minute=3).message == (
        "timed out after 90500ms without 1 approval (0 of 1 from groups finance)")


def test_next_deadline_is_the_timeout_while_waiting_and_nothing_once_decided() -> None:
    req = request(FINANCE_DENY)
    assert next_deadline(req, tally(req, [], at(1))) == at(15)
    assert next_deadline(req, tally(req, [], at(16))) is None
    untimed = request(ApprovalRules())
    assert next_deadline(untimed, tally(untimed, [], at(1))) is None
    approved = tally(req, [decision("a1", "alice", "finance"), decision("a2", "bob", "finance")],
                     at(2))
    assert next_deadline(req, approved) is None


def test_a_tally_serializes_to_json() -> None:
    result = run(decision("a1", "alice", "finance"), decision("x", "mallory", "eng"), minute=16)
    assert result.to_json() == {
        "state": "awaiting_approval",
        "approvers": ["alice"],
        "ignored": [{"name": "x", "why": "mallory holds none of groups finance"}],
        "escalatedAt": "2026-11-30T10:15:00Z",
        "message": result.message,
        "decidedAt": None,
    }


# Properties

USERS = ["alice", "bob", "carol", "cleo", ACTOR]
GROUP_SETS = [("finance",), ("cfo",), ("finance", "cfo"), ()]


@st.composite
def decisions(draw: st.DrawFn) -> list[Decision]:
    made = []
    for i in range(draw(st.integers(0, 6))):
        made.append(decision(
            f"d{i}", draw(st.sampled_from(USERS)), *draw(st.sampled_from(GROUP_SETS)),
            minute=draw(st.integers(0, 40)), verdict=draw(st.sampled_from(["approve", "deny"])),
            entry=draw(st.sampled_from(["e-0007", "e-0007", "e-0007", "e-0008"]))))
    return made


RULES = st.sampled_from([FINANCE, FINANCE_DENY, replace(FINANCE, quorum=1), ApprovalRules(),
                         ApprovalRules(quorum=2, timeout_ms=600_000)])


def outcome(result: Tally) -> tuple[Any, ...]:
    return result.state, result.approvers, result.escalated_at, result.decided_at, result.message


@given(decisions(), RULES, st.integers(0, 60), st.randoms(use_true_random=False))
def test_the_order_decisions_are_listed_in_never_matters(
        made: list[Decision], rules: ApprovalRules, minute: int, rnd: random.Random) -> None:
    shuffled = list(made)
    rnd.shuffle(shuffled)
    assert run(*made, rules=rules, minute=minute) == run(*shuffled, rules=rules, minute=minute)


@given(decisions(), RULES, st.integers(0, 60), st.sampled_from([
    {"user": ""}, {"user": "mallory", "groups": ("eng",)}, {"entry": "e-9"},
    {"user": ACTOR}, {"created": at(-3)}]))
def test_adding_a_decision_that_cannot_count_never_changes_the_outcome(
        made: list[Decision], rules: ApprovalRules, minute: int, spoil: dict[str, Any]) -> None:
    # An outsider is only an outsider when roles are listed; made no later than now so it
    # does not move the clock.
    if "groups" in spoil and not rules.roles:
        spoil = {"user": ACTOR}
    extra = replace(decision("zz", "dana", "finance", "cfo", minute=min(minute, 30),
                             verdict="deny"), **spoil)
    assert outcome(run(*made, extra, rules=rules, minute=minute)) == outcome(
        run(*made, rules=rules, minute=minute))


@given(decisions(), RULES, st.integers(0, 60), st.integers(0, 600))
def test_a_decided_entry_stays_decided_when_tallied_later(
        made: list[Decision], rules: ApprovalRules, minute: int, later: int) -> None:
    first = run(*made, rules=rules, minute=minute)
    again = run(*made, rules=rules, minute=minute + later)
    if first.state != "awaiting_approval":
        assert again == first


def test_an_approval_stamped_to_the_second_of_the_request_still_counts() -> None:
    requested = T0 + timedelta(milliseconds=700)  # Kubernetes stamps the Approval T0, to the second
    anyone = ApprovalRules(roles=(), quorum=1, timeout_ms=None, on_timeout="deny", escalate_to=())
    req = ApprovalRequest("run-42", "e-0007", ACTOR, requested, anyone)
    same_second = Decision("a", "alice", ("x",), "approve", "", T0, "run-42", "e-0007")
    assert tally(req, [same_second], at(1)).state == "approved"
    earlier = Decision("b", "bob", ("x",), "approve", "", T0 - timedelta(seconds=1), "run-42", "e-0007")
    assert tally(req, [earlier], at(1)).state == "awaiting_approval"


# Arguments (issue 17 #3)

SHA_A, SHA_B = "sha256:" + "a" * 64, "sha256:" + "b" * 64


def test_a_decision_on_other_arguments_does_not_count_for_a_call_reusing_the_entry_id() -> None:
    req = replace(request(replace(FINANCE, quorum=1)), arguments_sha256=SHA_B)
    on_a = replace(decision("a1", "alice", "finance"), arguments_sha256=SHA_A)
    result = tally(req, [on_a], at(5))
    assert result.state == "awaiting_approval"
    assert "other arguments" in dict(result.ignored)["a1"]
    assert tally(req, [replace(on_a, arguments_sha256=SHA_B)], at(5)).state == "approved"
    unbound = tally(req, [replace(on_a, arguments_sha256=None)], at(5))
    assert unbound.state == "awaiting_approval" and "none named" in dict(unbound.ignored)["a1"]


def test_the_operator_keeps_an_unbound_approval_bound_to_the_arguments_it_first_saw() -> None:
    from unwind.ledger.decide import record
    from unwind.ledger.entry import ApprovalDecision, Attempt, Entry, Times
    from unwind.operator.ledgers import decide_entries

    made = ApprovalDecision(name="ok-a", user="alice", groups=["finance"], decision="approve",
                            created="2026-11-30T10:01:00Z")
    rules = replace(FINANCE, quorum=1)
    first = Entry(id="e-0007", tool="t", actor=ACTOR, state="awaiting_approval",
                  arguments_sha256=SHA_A, approval=record(rules, "kubernetes"),
                  times=Times(requested="2026-11-30T10:00:00.000Z"))
    [decided] = decide_entries("run-42", [first.to_json()], {"e-0007": [made]}, at(2)) or []
    assert decided["approval"]["state"] == "approved"
    assert decided["approval"]["decisions"][0]["arguments_sha256"] == SHA_A
    # The call failed; the agent reused the id with other arguments, in the same second.
    old = Entry.model_validate(decided)
    reused = first.model_copy(update={
        "arguments_sha256": SHA_B, "approval": record(rules, "kubernetes"),
        "times": Times(requested="2026-11-30T10:01:00.500Z"),
        "attempts": [Attempt(state="failed", arguments_sha256=SHA_A, approval=old.approval)]})
    [again] = decide_entries("run-42", [reused.to_json()], {"e-0007": [made]}, at(2)) or []
    assert again["approval"]["state"] == "awaiting_approval"
    assert again["approval"]["decisions"][0]["arguments_sha256"] == SHA_A
