"""What a ToolManifest's status says: its conditions (Valid, Approved, Signed, Published,
Ready), the fields beside them, and the Events a change of them is worth (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..api.conditions import set_condition
from ..bundle import BundleEntry
from .approval import is_trusted
from .objects import Event, ManifestObject, Reason, Settings, State
from .readers import Reader, blocked_message

MAX_FINDINGS = 20


def _how_to_approve(namespace: str, st: State) -> str:
    cmd = f"kubectl unwind approve tm/{st.obj.name} -n {namespace}"
    return f"approve it with `{cmd}`" + (f" (as someone other than {st.author.user})" if st.author else "")


def _approval_condition(namespace: str, st: State, settings: Settings,
                        notes: list[str]) -> tuple[bool | None, str, str]:
    """The Approved condition for the current version: (status, reason, message)."""
    if st.model is None or (st.issues and st.set_reason != Reason.SET_INVALID):
        return None, Reason.INVALID, "the spec is invalid (see Valid)"
    v = f"version {st.version}"
    note = st.verdict.note() + (f" (not counted: {'; '.join(notes)})" if notes else "")
    by = st.verdict.by
    if st.verdict.state == "denied" and by is not None:
        because = f": {by.reason}" if by.reason else ""
        return False, Reason.DENIED, (f"{v} was denied by {by.who.user} (Approval {by.name}){because}; a "
                                      "deny is final for this version: change the spec to propose a new one")
    if st.verdict.state == "approved" and by is not None:
        return True, Reason.APPROVED, f"{v} approved by {by.who.user} (Approval {by.name}){note}"
    if st.approved and st.author is not None:
        return True, Reason.TRUSTED, f"{v} applied by trusted applier {st.author.user}{note}"
    if st.set_reason == Reason.SET_INVALID and st.model.lifecycle != "draft" \
            and st.verdict.state != "denied" and is_trusted(st.author, settings.trusted_appliers):
        assert st.author is not None
        return True, Reason.TRUSTED, (f"{v} applied by trusted applier {st.author.user}{note}; not "
                                      "enforced while it fails set-level validation (see Valid)")
    if st.model.lifecycle == "draft":
        return False, Reason.DRAFT, f"{v} is a draft: {_how_to_approve(namespace, st)}{note}"
    who = (f"applied by {st.author.user}, who is not in trustedAppliers" if st.author
           else f"the applier is unknown ({st.author_problem})")
    return False, Reason.AWAITING, f"{v} waits for approval ({who}): {_how_to_approve(namespace, st)}{note}"


# What the Lifecycle column shows for a version that is not enforced, by its Approved reason:
# a version waiting for an approver is not a draft (issue 27: `draft` shown for it misled).
_NOT_ENFORCED = {Reason.DRAFT: "draft", Reason.AWAITING: "awaiting-approval", Reason.DENIED: "denied"}


def _lifecycle(st: State, enforced_now: bool, approved: bool | None, reason: str) -> str | None:
    """The current version's lifecycle as it really is: approved or deprecated once approved
    (enforced, or held back only by set-level validation, which Ready says), else draft,
    awaiting-approval or denied."""
    if st.model is None:
        return None
    if enforced_now or approved:
        return st.chosen_lifecycle
    return _NOT_ENFORCED.get(reason, "draft")


def _approved_by(st: State, entry: BundleEntry | None) -> dict[str, Any] | None:
    if entry is None:
        return None
    if st.current_chosen and entry.checksum == st.digest:
        by = st.verdict.by
        if st.verdict.state == "approved" and by is not None:
            return {"user": by.who.user, "groups": list(by.who.groups), "approval": by.name,
                    "checksum": entry.checksum}
        if st.author is not None:
            return {"user": st.author.user, "groups": list(st.author.groups), "checksum": entry.checksum}
    old = st.obj.status.get("approvedBy")
    return old if isinstance(old, dict) and old.get("checksum") == entry.checksum else None


def status_of(namespace: str, st: State, entry: BundleEntry | None, key_id: str | None,
            findings: dict[str, list[dict[str, str]]], settings: Settings, now: str,
            readers: list[Reader], notes: list[str]) -> dict[str, Any]:
    obj, gen = st.obj, st.obj.generation
    conds: list[dict[str, object]] = list(obj.status.get("conditions") or [])
    valid = st.model is not None and not st.issues
    enforced_now = entry is not None and valid and entry.checksum == st.digest

    def cond(type_: str, ok: bool | None, reason: str, message: str) -> None:
        nonlocal conds
        status = "Unknown" if ok is None else ("True" if ok else "False")
        conds = set_condition(conds, type_, status, reason, message, gen, now)  # type: ignore[arg-type]

    if valid:
        cond("Valid", True, Reason.VALID, "the manifest passed single and set-level validation")
    else:
        detail = "; ".join(f"{i.path}: {i.message}" if i.path else i.message for i in st.issues[:5])
        more = f" (and {len(st.issues) - 5} more)" if len(st.issues) > 5 else ""
        cond("Valid", False, st.set_reason or Reason.INVALID, detail + more)

    approved, reason, message = _approval_condition(namespace, st, settings, notes)
    cond("Approved", approved, reason, message)
    waiting_reason = reason  # Draft, AwaitingApproval or Denied when the current version is not enforced

    if entry is not None and key_id is not None:
        cond("Signed", True, Reason.SIGNED, f"version {entry.version} signed by key {key_id} in the bundle index")
    elif entry is not None:
        cond("Signed", False, Reason.NO_KEY, "the operator has no signing key")
    else:
        cond("Signed", False, Reason.NOT_ENFORCEABLE, "only approved versions are signed")

    if enforced_now:
        assert entry is not None
        cond("Published", True, Reason.PUBLISHED, f"version {entry.version} is in the namespace bundle")
    elif entry is not None and valid:
        cond("Published", True, Reason.LAST_APPROVED, f"the last approved version {entry.version} stays "
             f"in the bundle; version {st.version} is not approved (see Approved)")
    elif entry is not None:
        cond("Published", True, Reason.LAST_GOOD, f"the last good version {entry.version} stays in "
             "the bundle; the current spec is invalid (see Valid)")
    elif valid:
        cond("Published", False, waiting_reason, "only approved versions are published (see Approved)")
    else:
        cond("Published", False, Reason.NOT_PUBLISHED, "no valid version of this manifest to publish")

    stays = f"; version {entry.version} stays enforced" if entry is not None and not enforced_now else ""
    if obj.deleting and readers:
        cond("Ready", False, Reason.DELETION_BLOCKED, blocked_message(readers))
    elif enforced_now:
        assert entry is not None
        cond("Ready", True, Reason.READY, f"version {entry.version} is enforced")
    elif valid and waiting_reason == Reason.DRAFT:
        cond("Ready", True, Reason.DRAFT_RECORDED, f"draft version {st.version} recorded, not enforced{stays}")
    elif valid:
        cond("Ready", False, waiting_reason, f"version {st.version} is not approved{stays}: {message}")
    else:
        cond("Ready", False, st.set_reason or Reason.INVALID, "fix the spec (see Valid)" + stays)

    found = findings.get(st.model.tool, []) if st.model is not None and valid else []
    status: dict[str, Any] = {
        "observedGeneration": gen,
        # a spec valid alone is a version (approvable) even while the set refuses it
        "version": st.version if st.model is not None else None,
        "checksum": st.digest if st.model is not None else None,
        "lifecycle": _lifecycle(st, enforced_now, approved, reason),
        "keyId": key_id if entry else None,
        "publishedVersion": entry.version if entry else None,
        "publishedChecksum": entry.checksum if entry else None,
        "approvedBy": _approved_by(st, entry),
        "lint": {"errors": sum(f["level"] == "error" for f in found),
                 "warnings": sum(f["level"] == "warning" for f in found),
                 "notes": sum(f["level"] == "info" for f in found),
                 "findings": found[:MAX_FINDINGS]},
        "readers": [r.to_json() for r in readers] or None,
        "conditions": conds,
    }
    # Unset fields are left out rather than null, so an unchanged status compares equal to
    # what the API server stored and is not patched again.
    return {k: v for k, v in status.items() if v is not None}


def _condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), {})


def events_of(st: State, status: dict[str, Any]) -> list[Event]:
    old = st.obj.status
    events = []
    ready, old_ready = _condition(status, "Ready"), _condition(old, "Ready")
    if ready["reason"] == Reason.DELETION_BLOCKED and ready["message"] != old_ready.get("message"):
        events.append(Event(st.obj.name, "Warning", Reason.DELETION_BLOCKED, str(ready["message"])))
    valid, old_valid = _condition(status, "Valid"), _condition(old, "Valid")
    if valid["status"] == "False" and (old_valid.get("message") != valid["message"]
                                       or old.get("observedGeneration") != status["observedGeneration"]):
        events.append(Event(st.obj.name, "Warning", str(valid["reason"]), str(valid["message"])))
    approved, old_approved = _condition(status, "Approved"), _condition(old, "Approved")
    if approved.get("reason") in (Reason.DENIED, Reason.APPROVED) and approved != old_approved \
            and approved.get("message") != old_approved.get("message"):
        kind = "Warning" if approved["reason"] == Reason.DENIED else "Normal"
        events.append(Event(st.obj.name, kind, str(approved["reason"]), str(approved["message"])))
    if status.get("publishedChecksum") and status["publishedChecksum"] != old.get("publishedChecksum"):
        signed = f", signed by key {status['keyId']}" if status.get("keyId") else ", unsigned"
        by = status.get("approvedBy") or {}
        who = f", approved by {by['user']}" if by.get("user") else ""
        events.append(Event(st.obj.name, "Normal", Reason.PUBLISHED,
                            f"version {status['publishedVersion']}{who}{signed}, published in the bundle"))
    return events


def failure_statuses(manifests: Sequence[ManifestObject], planned: dict[str, dict[str, Any]],
                     failed: dict[str, str], now: str) -> tuple[dict[str, dict[str, Any]], list[Event]]:
    """Ready=False for each manifest a write was refused for (the rest of the namespace went
    on without it), on top of the status just planned for it."""
    statuses, events = {}, []
    for m in manifests:
        if m.name not in failed:
            continue
        message = (f"the operator could not write what this manifest needs ({failed[m.name]}); "
                   "the other manifests of the namespace were reconciled")
        base = planned.get(m.name, {}).get("conditions") or m.status.get("conditions") or []
        statuses[m.name] = {"conditions": set_condition(list(base), "Ready", "False", Reason.WRITE_FAILED,
                                                        message, m.generation, now)}
        events.append(Event(m.name, "Warning", Reason.WRITE_FAILED, message))
    return statuses, events
