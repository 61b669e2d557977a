"""Approvals of calls, written into the ledger entries they decide (pure).

A call that needs approval waits as an ``awaiting_approval`` entry of its run's
EffectLedger, with its approval rules frozen in it. Approvers create Approvals naming the
ledger and the entry (``kubectl unwind approve ledger/NAME --entry ID``); the admission
webhook stamps each approver. The operator copies every *stamped* decision into the entry
and tallies it with the same code the gateway and ``unwind approve --ledger`` use
(``unwind.ledger.decide``), so the entry says approved, denied or still waiting and why; the
gateway runs the call when the agent repeats it, or answers 403 ``denied``.

Each decision is bound to the arguments it decides on: the Approval's
``spec.target.argumentsSha256`` (``kubectl unwind approve`` fills it in), else the
arguments the entry held when the operator first recorded that decision, a binding kept
in the entry (also after a failed call's id is reused: the old approval moves to the
entry's ``attempts``). The tally counts only decisions on the arguments the entry holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from ..api.resources import ApprovalSpec
from ..ledger.clusterstore import compact_entry
from ..ledger.decide import settle
from ..ledger.entry import ApprovalDecision, Entry, EntryApproval, Settlement
from ..ledger.lifecycle import Expect, Write
from ..ledger.rollback_rules import settle as settle_by_hand
from ..ledger.rollback_rules import settle_problem
from ..registry.signing import TrustStore
from .approval import ApprovalObject
from .identity import stamped_identity


def ledger_targets(approvals: Iterable[ApprovalObject]) -> set[str]:
    """The EffectLedgers some Approval names."""
    out = set()
    for a in approvals:
        target = (a.spec or {}).get("target") if isinstance(a.spec, dict) else None
        if isinstance(target, dict) and isinstance(target.get("effectLedger"), str):
            out.add(target["effectLedger"])
    return out


def decisions_for(ledger: str, namespace: str, approvals: Iterable[ApprovalObject],
                  trust: TrustStore) -> dict[str, list[ApprovalDecision]]:
    """Stamped decisions by entry id, for one ledger, in creation order."""
    found: dict[str, list[ApprovalDecision]] = {}
    for a in sorted(approvals, key=lambda a: (a.created, a.name)):
        try:
            spec = ApprovalSpec.model_validate(a.spec)
        except ValidationError:
            continue
        if spec.target.effectLedger != ledger or not spec.target.entry or spec.decision == "settle":
            continue  # a settle is no approval (settles_for)
        who, _ = stamped_identity("Approval", namespace, a.spec, a.annotations, trust, a.meta())
        if who is None:
            continue  # written around the webhook: never counts
        found.setdefault(spec.target.entry, []).append(ApprovalDecision(
            name=a.name, user=who.user, groups=list(who.groups), decision=spec.decision,
            reason=spec.reason or "", created=a.created,
            arguments_sha256=spec.target.argumentsSha256))
    return found


def settles_for(ledger: str, namespace: str, approvals: Iterable[ApprovalObject],
                trust: TrustStore) -> dict[str, Settlement]:
    """The first stamped settle of each entry of one ledger (``kubectl unwind settle``): who
    (as the webhook stamped them), when, why."""
    found: dict[str, Settlement] = {}
    for a in sorted(approvals, key=lambda a: (a.created, a.name)):
        try:
            spec = ApprovalSpec.model_validate(a.spec)
        except ValidationError:
            continue
        if spec.decision != "settle" or spec.target.effectLedger != ledger or not spec.target.entry:
            continue
        who, _ = stamped_identity("Approval", namespace, a.spec, a.annotations, trust, a.meta())
        if who is None or spec.target.entry in found:
            continue  # written around the webhook: never counts
        found[spec.target.entry] = Settlement(by=who.user, groups=list(who.groups),
                                              identities="kubernetes", reason=spec.reason or "",
                                              at=a.created, was="", approval=a.name)
    return found


def settle_entries(entries: Sequence[dict[str, Any]], settles: dict[str, Settlement],
                   now: datetime) -> list[dict[str, Any]] | None:
    """The page's entries with each stamped settle written in through the lifecycle (the
    person writer); None when nothing changed. An entry that cannot be settled now (undone
    meanwhile, or a call still in flight) is left as it is."""
    out: list[dict[str, Any]] = []
    changed = False
    for raw in entries:
        settlement = settles.get(str(raw.get("id")))
        try:
            entry = Entry.model_validate(raw) if settlement is not None else None
        except ValidationError:
            entry = None
        if entry is None or settlement is None or settle_problem(entry, entry.id, now) is not None:
            out.append(raw)
            continue
        settled = settle_by_hand(entry, settlement, now)(entry)
        out.append(compact_entry(settled.to_json()))
        changed = True
    return out if changed else None


def bound(entry: Entry, decisions: Sequence[ApprovalDecision]) -> list[ApprovalDecision]:
    """The decisions, each bound to the arguments it decided on: its own digest, else the one
    recorded for it earlier (in the entry or an earlier attempt), else the entry's now."""
    seen: dict[str, str] = {}
    approvals = [a.approval for a in entry.attempts] + [entry.approval]
    for approval in approvals:
        for d in approval.decisions if approval is not None else ():
            if d.arguments_sha256:
                seen.setdefault(d.name, d.arguments_sha256)
    return [d if d.arguments_sha256 else d.model_copy(update={
        "arguments_sha256": seen.get(d.name, entry.arguments_sha256)}) for d in decisions]


def decide_entries(ledger: str, entries: Sequence[dict[str, Any]],
                   decisions: dict[str, list[ApprovalDecision]], now: datetime) -> list[dict[str, Any]] | None:
    """The page's entries with their decisions written in and tallied; None when nothing
    changed (entries no decision names are passed through untouched)."""
    out: list[dict[str, Any]] = []
    changed = False
    for raw in entries:
        found = decisions.get(str(raw.get("id")))
        if not found:
            out.append(raw)
            continue
        try:
            entry = Entry.model_validate(raw)
        except ValidationError:
            out.append(raw)
            continue
        if entry.approval is None or entry.state != "awaiting_approval":
            out.append(raw)
            continue
        found = bound(entry, found)
        if entry.approval.decisions == found:
            out.append(raw)
            continue
        approval = entry.approval.model_copy(update={"decisions": found})
        # through the lifecycle, as every write: an approver may only record and tally
        decided = Write("approver", Expect.of(entry), _deciding(ledger, approval, now))(entry)
        out.append(compact_entry(decided.to_json()))  # as the gateway writes entries
        changed = True
    return out if changed else None


def _deciding(ledger: str, approval: EntryApproval, now: datetime) -> Callable[[Entry], Entry]:
    def change(entry: Entry) -> Entry:
        return settle(ledger, entry.model_copy(update={"approval": approval}), now)
    return change
