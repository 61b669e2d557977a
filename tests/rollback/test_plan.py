"""The undo planner's rules, one test each (unwind.ledger.plan, pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from unwind.ledger.entry import Entry, Handle, Staged, Times
from unwind.ledger.plan import PlanError, Selection, Versions, make_plan
from unwind.ledger.stepinput import step_input, step_key
from unwind.manifest.canonical import checksum
from unwind.manifest.model import ToolManifest

T0 = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)
NOW = T0 + timedelta(hours=1)


def manifest(**fields: Any) -> ToolManifest:
    return ToolManifest.model_validate({"permission": "p:w", **fields})


def read(tool: str) -> ToolManifest:
    return manifest(tool=tool, effect="read_only")


def idem(tool: str) -> ToolManifest:
    return manifest(tool=tool, effect="idempotent")


CHARGE = manifest(
    tool="charge", effect="compensable", idempotency={"key": "c-{{args.order}}"},
    lookup={"tool": "get_charge", "by": "idempotency_key", "arguments": {"key": "$key"}},
    compensation={"tool": "refund", "residue": ["stays on the statement"],
                  "argument_map": {"charge_id": "$result.id", "amount": "$args.amount"},
                  "verification": {"tool": "get_charge", "arguments": {"charge_id": "$result.id"},
                                   "expect": {"refunded": True}, "retries": 2, "backoff_ms": 10}})
COMMENT = manifest(
    tool="comment", effect="reversible",
    compensation={"tool": "delete_comment", "kind": "inverse",
                  "argument_map": {"id": "$result.id"}, "deadline": {"within_ms": "1d"}})
ISSUE = manifest(tool="issue", effect="compensable", requires=["comment"],
                 compensation={"tool": "close_issue", "argument_map": {"n": "$result.n"},
                               "requires_approval": True})
NOTE = manifest(tool="note", effect="compensable",
                compensation={"tool": "close_issue", "argument_map": {"n": "$result.n"}})
EMAIL = manifest(tool="email", effect="irreversible")
RELEASE = manifest(tool="release", effect="irreversible",
                   draft={"tool": "release", "arguments": {"tag": "$args.tag"},
                          "handle": {"id": "$result.id"}, "promote": "publish",
                          "discard": "delete_release"})
SECRET = manifest(tool="secret_charge", effect="compensable",
                  audit={"redaction": ["$args.card"]},
                  compensation={"tool": "refund", "argument_map": {"card": "$args.card"}})
TODAY = [CHARGE, COMMENT, ISSUE, NOTE, EMAIL, RELEASE, SECRET, read("get_charge"),
         idem("refund"), idem("delete_comment"), idem("close_issue"), idem("delete_release"),
         read("lookup_only"), idem("publish")]
VERSIONS = Versions({checksum(m): m for m in TODAY}, {m.tool: m for m in TODAY})
BY_TOOL = {m.tool: m for m in TODAY}


def entry(eid: str, tool: str, minute: int, state: str = "succeeded", *,
          args: dict[str, Any] | None = None, result: Any = None, **extra: Any) -> Entry:
    m = BY_TOOL[tool]
    at = T0 + timedelta(minutes=minute)
    text = at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return Entry(id=eid, seq=minute, tool=tool, checksum=checksum(m), effect=str(m.effect),
                 actor="agent", state=state,  # type: ignore[arg-type]
                 handle=Handle(args=args or {}, result=result if result is not None else {}),
                 times=Times(requested=text, started=text, finished=text), **extra)


def plan(ledger: list[Entry], versions: Versions = VERSIONS, now: datetime = NOW,
         **selection: Any) -> list[tuple[str, str]]:
    p = make_plan("run-1", ledger, versions, now=now, selection=Selection(**selection))
    return [(s.entry, s.action) for s in p.steps]


def step(entries: list[Entry], eid: str, now: datetime = NOW) -> dict[str, Any]:
    p = make_plan("run-1", entries, VERSIONS, now=now)
    return next(s.to_json() for s in p.steps if s.entry == eid)


def test_entries_are_undone_newest_first() -> None:
    entries = [entry("a", "note", 1, result={"n": 1}), entry("b", "note", 2, result={"n": 2}),
               entry("c", "note", 3, result={"n": 3})]
    assert plan(entries) == [("c", "compensate"), ("b", "compensate"), ("a", "compensate")]


def test_a_tool_that_requires_another_is_undone_before_what_it_requires() -> None:
    # The comment's clock ran ahead (two gateways): by time it looks newer than the issue
    # that required it, yet the issue is undone first.
    entries = [entry("issue-1", "issue", 2, result={"n": 5}),
               entry("comment-1", "comment", 3, result={"id": 9}),
               entry("note-1", "note", 1, result={"n": 4})]
    assert plan(entries) == [("issue-1", "compensate"), ("comment-1", "inverse"),
                             ("note-1", "compensate")]


def test_read_only_and_idempotent_entries_are_skipped_and_an_idempotent_change_is_left_behind() -> None:
    got = make_plan("run-1", [entry("r", "get_charge", 1), entry("i", "refund", 2)], VERSIONS,
                    now=NOW).to_json()["steps"]
    assert [(s["action"], s["reason"]) for s in got] == [
        ("skip", "refund is idempotent: not undone, what its call changed stays"),
        ("skip", "get_charge is read_only: nothing to undo")]
    # an idempotent call (a file write) changed the world once: the plan says what stays
    assert got[0]["residue"] and "what refund changed stays" in got[0]["residue"][0]
    assert got[1]["residue"] == []


def test_an_irreversible_entry_is_reported_as_not_undoable() -> None:
    s = step([entry("mail", "email", 1)], "mail")
    assert s["action"] == "not_undoable" and s["undo_tool"] is None
    assert s["reason"] == "email is irreversible: nothing can undo it"


def test_a_reversible_entry_is_undone_by_its_inverse_before_the_deadline() -> None:
    s = step([entry("c1", "comment", 1, result={"id": 9})], "c1")
    assert (s["action"], s["undo_tool"], s["arguments"]) == ("inverse", "delete_comment", {"id": 9})
    assert "possible until 2026-03-02T10:01:00.000Z" in s["reason"]


def test_after_the_deadline_a_reversible_entry_with_no_compensation_is_not_undoable() -> None:
    s = step([entry("c1", "comment", 1, result={"id": 9})], "c1", now=T0 + timedelta(days=2))
    assert s["action"] == "not_undoable" and s["undo_tool"] is None
    assert s["reason"] == ("the inverse delete_comment was possible until "
                           "2026-03-02T10:01:00.000Z, and the manifest declares no compensation "
                           "for after the deadline")


def test_a_compensable_entry_is_compensated_and_its_residue_is_listed() -> None:
    s = step([entry("ch", "charge", 1, args={"amount": 5}, result={"id": "ch_1"})], "ch")
    assert s == {"entry": "ch", "tool": "charge", "action": "compensate", "undo_tool": "refund",
                 "arguments": {"charge_id": "ch_1", "amount": 5},
                 "residue": ["stays on the statement"], "requires_approval": False,
                 "reason": "compensable: refund makes amends, read back with get_charge; it "
                           "leaves residue", "object": '{"charge_id":"ch_1"}', "headers": {},
                 "read_before": None}


def test_an_entry_whose_handle_is_incomplete_is_unrecoverable_and_says_what_is_missing() -> None:
    s = step([entry("ch", "charge", 1, args={"amount": 5}, result={})], "ch")
    assert s["action"] == "unrecoverable"
    assert s["reason"] == "the undo is unavailable: charge_id: $result has no 'id'"


def test_an_undo_that_needs_a_redacted_value_is_unrecoverable() -> None:
    s = step([entry("s", "secret_charge", 1, args={"card": "[redacted]"})], "s")
    assert s["action"] == "unrecoverable" and "audit.redaction masks" in s["reason"]


def test_an_uncertain_entry_is_looked_up_before_any_undo_runs() -> None:
    entries = [entry("ch", "charge", 1, "uncertain", key="c-o1"),
               entry("n", "note", 2, result={"n": 1})]
    assert plan(entries) == [("ch", "lookup"), ("n", "compensate")]
    s = step(entries, "ch")
    assert (s["undo_tool"], s["arguments"]) == ("get_charge", {"key": "c-o1"})
    assert s["reason"].startswith("its answer was lost: get_charge finds whether it acted")


def test_an_uncertain_entry_with_no_lookup_is_unresolvable_and_never_guessed() -> None:
    s = step([entry("n", "note", 1, "uncertain")], "n")
    assert s["action"] == "unrecoverable" and s["undo_tool"] is None
    assert s["reason"].startswith("unresolvable: its answer was lost, and note declares no lookup")


def test_a_pending_entry_is_treated_as_uncertain() -> None:
    assert plan([entry("ch", "charge", 1, "pending", key="c-o1")]) == [("ch", "lookup")]


def test_a_pending_duplicate_of_a_call_that_kept_its_key_is_skipped_not_looked_up() -> None:
    # A cluster gateway writes a keyed call's pending entry while it creates the key's Lease;
    # killed after losing the Lease to "won", the loser stays pending: its lookup would find
    # the winner's charge, and a rollback would refund it twice.
    won = entry("won", "charge", 1, key="c-o1", result={"id": "ch_1"})
    lost = entry("lost", "charge", 2, "pending", key="c-o1")
    assert dict(plan([won, lost]))["lost"] == "skip"
    assert "entry won held its idempotency key 'c-o1'" in step([won, lost], "lost")["reason"]
    # a key given back (undone, failed) may be taken again: then the pending call may have run
    freed = won.model_copy(update={"state": "undone"})
    assert dict(plan([freed, lost]))["lost"] == "lookup"
    other = entry("other", "charge", 1, key="c-o2", result={"id": "ch_2"})
    assert dict(plan([other, lost]))["lost"] == "lookup"


def test_failed_undone_refused_denied_and_waiting_entries_are_skipped() -> None:
    states = ["failed", "undone", "refused", "denied", "awaiting_approval"]
    entries = [entry(s, "charge", i, s) for i, s in enumerate(states)]
    assert sorted(plan(entries)) == sorted((s, "skip") for s in states)


def test_a_staged_entry_is_discarded_with_the_drafts_handle() -> None:
    staged = Staged(draft_tool="release", handle={"id": 7}, promote="publish",
                    discard="delete_release")
    s = step([entry("rel", "release", 1, staged=staged)], "rel")
    assert (s["action"], s["undo_tool"], s["arguments"]) == ("discard", "delete_release", {"id": 7})


def test_a_staged_entry_whose_manifest_declares_no_discard_is_not_undoable() -> None:
    no_discard = manifest(tool="release2", effect="irreversible",
                          draft={"tool": "release2", "handle": {"id": "$result.id"},
                                 "promote": "publish"})
    versions = Versions({checksum(no_discard): no_discard}, {"release2": no_discard})
    e = Entry(id="r", tool="release2", checksum=checksum(no_discard), actor="a", state="succeeded",
              staged=Staged(draft_tool="release2", handle={"id": 1}, promote="publish"),
              times=Times(requested="2026-03-01T10:00:00.000Z"))
    [s] = make_plan("run-1", [e], versions, now=NOW).steps
    assert s.action == "not_undoable" and "declares no discard" in s.reason


def test_an_edited_ledger_naming_a_charge_as_a_drafts_discard_calls_no_charge() -> None:
    # Whoever can edit the ledger writes "charge" as the discard of a staged release: the
    # rollback must call the manifest's discard, never the tool the entry names.
    staged = Staged(draft_tool="release", handle={"order": 9900, "amount": 990000},
                    promote="publish", discard="charge")
    p = make_plan("run-1", [entry("rel", "release", 1, staged=staged)], VERSIONS, now=NOW)
    assert [s.undo_tool for s in p.steps] == ["delete_release"]
    assert "charge" not in [s.undo_tool for s in p.runnable()]
    assert "the ledger names charge; the manifest's discard is used" in p.steps[0].reason


def test_an_edited_ledger_whose_draft_tool_is_not_the_manifests_is_unrecoverable() -> None:
    staged = Staged(draft_tool="charge", handle={"order": 1}, promote="charge", discard="charge")
    p = make_plan("run-1", [entry("rel", "release", 1, staged=staged)], VERSIONS, now=NOW)
    [s] = p.steps
    assert (s.action, s.undo_tool, s.arguments) == ("unrecoverable", None, None)
    assert "the ledger's draft does not match the manifest it ran under" in s.reason
    assert p.runnable() == []


def test_a_staged_entry_of_a_tool_whose_manifest_has_no_draft_calls_nothing() -> None:
    staged = Staged(draft_tool="note", handle={"n": 1}, promote="charge", discard="charge")
    [s] = make_plan("run-1", [entry("n", "note", 1, staged=staged)], VERSIONS, now=NOW).steps
    assert s.action == "unrecoverable" and s.undo_tool is None
    assert "declares no draft form" in s.reason


def test_a_step_whose_compensation_requires_approval_says_so() -> None:
    s = step([entry("i", "issue", 1, result={"n": 3})], "i")
    assert s["requires_approval"] is True and s["residue"] == []


def test_entry_selection_adds_what_requires_it_later_in_the_run_and_leaves_the_rest_out() -> None:
    entries = [entry("i0", "issue", 0, result={"n": 0}),
               entry("c1", "comment", 1, result={"id": 1}),
               entry("n2", "note", 2, result={"n": 2}),
               entry("i3", "issue", 3, result={"n": 3})]
    assert plan(entries, entries=("c1",)) == [("i3", "compensate"), ("c1", "inverse")]
    assert plan(entries, entries=("n2",)) == [("n2", "compensate")]


def test_since_an_entry_plans_only_what_came_after_it() -> None:
    entries = [entry("a", "note", 1, result={"n": 1}), entry("mark", "get_charge", 2),
               entry("b", "note", 3, result={"n": 3}), entry("c", "note", 4, result={"n": 4})]
    assert plan(entries, since="mark") == [("c", "compensate"), ("b", "compensate")]
    assert plan(entries, since="2026-03-01T10:03:00Z") == [("c", "compensate"), ("b", "compensate")]


def test_an_unknown_entry_or_checkpoint_is_an_error_naming_it() -> None:
    entries = [entry("a", "note", 1, result={"n": 1})]
    with pytest.raises(PlanError, match="no entry zz in this ledger"):
        plan(entries, entries=("zz",))
    with pytest.raises(PlanError, match="'nope' is neither an entry of this ledger nor an RFC 3339"):
        plan(entries, since="nope")


def test_an_entry_whose_manifest_version_is_not_given_refuses_the_plan_unless_current() -> None:
    old = entry("a", "note", 1, result={"n": 1}).model_copy(update={"checksum": "sha256:" + "0" * 64})
    with pytest.raises(PlanError, match=r"1 entry ran under manifest versions that were not "
                                        r"given: a \(note sha256:000000000000\).*--current"):
        plan([old])
    current = Versions(VERSIONS.by_checksum, VERSIONS.tools, current=True)
    [s] = make_plan("run-1", [old], current, now=NOW).steps
    assert s.action == "compensate" and "planned with today's manifest of note" in s.reason


def test_skipped_entries_need_no_manifest_version() -> None:
    old = entry("a", "note", 1, "refused").model_copy(update={"checksum": "sha256:" + "0" * 64})
    assert plan([old]) == [("a", "skip")]


def test_an_undo_failed_entry_is_planned_again() -> None:
    s = step([entry("n", "note", 1, "undo_failed", result={"n": 1})], "n")
    assert s["action"] == "compensate" and s["reason"].startswith("retries a failed undo: ")


def test_an_interrupted_inverse_is_finished_even_past_its_deadline() -> None:
    e = entry("c", "comment", 1, "undoing", result={"id": 9}, undo={"action": "inverse"})
    s = step([e], "c", now=T0 + timedelta(days=3))
    assert s["action"] == "inverse" and s["reason"].startswith("resumes an interrupted undo: ")


def test_the_plan_json_has_exactly_the_documented_fields() -> None:
    p = make_plan("run-1", [entry("n", "note", 1, result={"n": 1})], VERSIONS, now=NOW).to_json()
    assert list(p) == ["ledger", "steps"] and p["ledger"] == "run-1"
    assert list(p["steps"][0]) == ["entry", "tool", "action", "undo_tool", "arguments", "residue",
                                   "requires_approval", "reason", "object", "headers",
                                   "read_before"]


def test_the_step_input_carries_the_called_manifest_the_read_back_and_a_stable_key() -> None:
    e = entry("ch", "charge", 1, args={"amount": 5}, result={"id": "ch_1"})
    [s] = make_plan("run-1", [e], VERSIONS, now=NOW).steps
    got = step_input("run-1", s, e, VERSIONS, identity="uid:ns/u-1")
    assert got["idempotency_key"] == step_key("uid:ns/u-1", "ch", "compensate")
    assert got["ledger"] == "run-1"
    assert got["manifest"]["tool"] == "refund"
    assert got["verification"] == {"manifest": read("get_charge").canonical_dict(),
                                   "arguments": {"charge_id": "ch_1"},
                                   "expect": {"refunded": True}, "retries": 2, "backoff_ms": 10}


def test_the_step_key_is_the_same_for_one_step_and_differs_between_steps() -> None:
    key = step_key("run-1", "e1", "compensate")
    assert key == step_key("run-1", "e1", "compensate") and key.startswith("unwind-compensate-")
    assert len({key, step_key("run-2", "e1", "compensate"), step_key("run-1", "e2", "compensate"),
                step_key("run-1", "e1", "inverse")}) == 4


def test_a_pending_entry_whose_key_an_uncertain_entry_holds_is_skipped() -> None:
    # the answer of "sent" was lost; the agent's repeat was refused as a duplicate, and the
    # refusal lost: both lookups would find the one charge
    sent = entry("sent", "charge", 1, "uncertain", key="c-o1")
    repeat = entry("repeat", "charge", 2, "pending", key="c-o1")
    assert plan([sent, repeat]) == [("sent", "lookup"), ("repeat", "skip")]
    assert "entry sent held its idempotency key 'c-o1' (uncertain)" in step([sent, repeat], "repeat")["reason"]


def test_the_holder_of_a_pending_entrys_key_lock_in_any_run_decides_whether_it_may_have_run() -> None:
    from unwind.ledger.store import Holder

    pending = entry("b-1", "charge", 2, "pending", key="c-o1", scope="global")

    def action(holders: dict[str, Holder | None]) -> tuple[str, str]:
        p = make_plan("run-1", [pending], VERSIONS, now=NOW, holders=holders)
        return p.steps[0].action, p.steps[0].reason
    assert action({"b-1": Holder("run-1", "b-1", "2026-03-01T10:02:00.000Z")})[0] == "lookup"
    act, why = action({"b-1": Holder("run-a", "a-1", "2026-03-01T10:01:00.000Z")})
    assert act == "skip" and why.startswith("entry a-1 of run run-a holds its idempotency key 'c-o1'")
    act, why = action({"b-1": None})
    assert act == "skip" and why.startswith("no lock holds its idempotency key 'c-o1'")
    # the lock names it even though another entry of the ledger kept the same key: it may
    # have run (the lock, not the ledger, says who held the key)
    other = entry("won", "charge", 1, key="c-o1", scope="global", result={"id": "ch_1"})
    p = make_plan("run-1", [other, pending], VERSIONS, now=NOW,
                  holders={"b-1": Holder("run-1", "b-1", "2026-03-01T10:02:00.000Z")})
    assert dict((s.entry, s.action) for s in p.steps)["b-1"] == "lookup"
