"""Approval of a call, on its ledger entry: the frozen rules, the decisions and the tally.

The entry keeps what the tally needs (``approvals.tally``): its rules as they were when the
call was requested, and every decision. The gateway tallies when the call is repeated; the
local ``unwind approve --ledger`` records a decision and tallies at once; in a cluster the
operator writes the decisions from Approval objects. All three use this module, so the
same decisions always give the same outcome.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from .approvals import ApprovalRequest, ApprovalRules, Decision, Tally, tally
from .entry import ApprovalDecision, ApprovalRulesRecord, Entry, EntryApproval, parse_stamp
from .lifecycle import Expect, Write, Writer
from .store import Stale


def record(rules: ApprovalRules, identities: Literal["kubernetes", "self-declared"]) -> EntryApproval:
    return EntryApproval(rules=ApprovalRulesRecord.model_validate(rules.to_json()),
                         identities=identities)


def rules_of(approval: EntryApproval) -> ApprovalRules:
    return ApprovalRules.from_json(approval.rules.model_dump())


def tally_entry(ledger: str, entry: Entry, now: datetime) -> Tally:
    """Where the entry's approval stands at ``now``."""
    if entry.approval is None:
        raise ValueError(f"entry {entry.id} needs no approval")
    request = ApprovalRequest(ledger, entry.id, entry.actor, parse_stamp(entry.times.requested),
                              rules_of(entry.approval), entry.arguments_sha256)
    decisions = [Decision(d.name, d.user, tuple(d.groups), d.decision, d.reason,
                          parse_stamp(d.created), ledger, entry.id, d.arguments_sha256)
                 for d in entry.approval.decisions]
    return tally(request, decisions, now)


def settle(ledger: str, entry: Entry, now: datetime) -> Entry:
    """The entry with its tally written in; a denial (or a timeout) makes it denied."""
    if entry.approval is None or entry.state != "awaiting_approval":
        return entry
    result = tally_entry(ledger, entry, now)
    approval = entry.approval.model_copy(update={"state": result.state, "message": result.message})
    state = "denied" if result.state == "denied" else entry.state
    return entry.model_copy(update={"approval": approval, "state": state})


def settling(ledger: str, now: datetime, writer: Writer = "gateway") -> Write:
    """The write (for ``Store.transition``) that records the tally of an awaiting entry as
    of ``now``: still waiting (its message moves on), or denied."""
    return Write(writer, Expect("awaiting_approval"), lambda e: settle(ledger, e, now))


def add_decision(ledger: str, decision: ApprovalDecision, now: datetime) -> AddDecision:
    """The approver's write (for ``Store.transition``) that records one decision and
    tallies. A decision that names no arguments is bound to the entry's, read in the same
    write."""
    def change(entry: Entry) -> Entry:
        if entry.approval is None:
            raise Stale(f"entry {entry.id} ({entry.tool}) does not need approval: it is "
                        f"{entry.state}")
        made = decision if decision.arguments_sha256 else decision.model_copy(
            update={"arguments_sha256": entry.arguments_sha256})
        approval = entry.approval.model_copy(update={"decisions": [*entry.approval.decisions, made]})
        return settle(ledger, entry.model_copy(update={"approval": approval}), now)
    return AddDecision("approver", Expect("awaiting_approval"), change)


class AddDecision(Write):
    """A decision's write, whose refusal says what a person deciding needs to hear."""

    def __call__(self, entry: Entry) -> Entry:
        if entry.approval is None:
            raise Stale(f"entry {entry.id} ({entry.tool}) does not need approval: it is "
                        f"{entry.state}")
        if entry.state != "awaiting_approval":
            raise Stale(f"entry {entry.id} is {entry.state}, not awaiting approval: "
                        + (entry.approval.message or "nothing more to decide"))
        return super().__call__(entry)
