"""The namespace reconcile, as a pure function: snapshot in, plan out.

The operator gathers one consistent snapshot of a namespace (its ToolManifests, their
ControllerRevisions and the current bundle), calls ``plan`` and then writes only what the
plan says changed. Everything that decides anything is here, tested without a cluster:

- each spec is validated alone, then the namespace's set is checked (references exist,
  read-backs are read-only, no cycles, one manifest per tool);
- each distinct valid spec checksum is a version (an immutable ControllerRevision);
- a manifest whose current spec is invalid keeps its last good version in the bundle;
- the bundle holds the enforceable (approved or deprecated, never draft) version of every
  manifest, signed, and is rewritten only when its bytes differ.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..api.conditions import set_condition
from ..bundle import SHARD_LIMIT, BundleData, BundleEntry, build_bundle
from ..manifest.canonical import canonical_json, checksum_bytes
from ..manifest.issues import Issue
from ..manifest.lint import lint
from ..manifest.model import ToolManifest
from ..manifest.validate import validate_manifest, validate_set
from ..registry.signing import Signature, signing_message
from .readers import Held, Reader, blocked_message, finalizer_updates, readers_of

APPLIED_BY = "unwind.dev/applied-by"  # stamped by the admission webhook (next issue)
MAX_FINDINGS = 20
MAX_ENTRY_BYTES = SHARD_LIMIT - 1024  # one manifest must fit in one shard


class Reason:
    """Condition reasons (CamelCase constants, documented in docs/operator.md)."""

    VALID = "ValidationPassed"
    INVALID = "ValidationFailed"
    SET_INVALID = "SetValidationFailed"
    DUPLICATE = "DuplicateTool"
    TRUSTED = "TrustedApplier"
    UNTRUSTED = "UntrustedApplier"
    DRAFT = "Draft"
    DEPRECATED = "Deprecated"
    SIGNED = "Signed"
    NO_KEY = "NoSigningKey"
    NOT_ENFORCEABLE = "NotEnforceable"
    PUBLISHED = "Published"
    LAST_GOOD = "LastGoodVersionPublished"
    NOT_PUBLISHED = "NotPublished"
    READY = "Ready"
    DRAFT_RECORDED = "DraftRecorded"
    DELETION_BLOCKED = "DeletionBlocked"


@dataclass(frozen=True)
class ManifestObject:
    name: str
    uid: str
    generation: int
    spec: Any
    status: dict[str, Any]
    annotations: dict[str, str] = field(default_factory=dict)
    created: str = ""
    deleting: bool = False
    finalizers: tuple[str, ...] = ()
    resource_version: str = ""


@dataclass(frozen=True)
class Revision:
    name: str
    owner: str  # the ToolManifest's name
    owner_uid: str
    version: int
    checksum: str
    data: dict[str, Any]


@dataclass(frozen=True)
class Event:
    name: str  # the ToolManifest's name
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Settings:
    trusted_appliers: tuple[str, ...] = ("*",)


@dataclass
class Plan:
    new_revisions: list[Revision] = field(default_factory=list)
    statuses: dict[str, dict[str, Any]] = field(default_factory=dict)  # only changed ones
    bundle: BundleData | None = None  # None: the current bundle is already right
    events: list[Event] = field(default_factory=list)
    published: int = 0
    finalizers: dict[str, tuple[str, list[str]]] = field(default_factory=dict)  # name -> (rv, list)


Signer = Callable[[bytes], Signature] | None


def revision_name(manifest_name: str, digest: str) -> str:
    return f"{manifest_name[:240]}-{digest.removeprefix('sha256:')[:12]}"


@dataclass
class _State:
    obj: ManifestObject
    model: ToolManifest | None = None  # the current spec, when valid alone
    issues: list[Issue] = field(default_factory=list)
    version: int | None = None
    digest: str | None = None
    chosen: ToolManifest | None = None  # what goes to the bundle: current or last good
    chosen_version: int | None = None
    chosen_digest: str | None = None
    set_reason: str = ""


def _trusted(obj: ManifestObject, settings: Settings) -> tuple[bool, str]:
    applier = obj.annotations.get(APPLIED_BY)
    if "*" in settings.trusted_appliers:
        return True, ("lifecycle taken from the spec: trustedAppliers is '*' (every applier is "
                      "trusted until the admission webhook records who applied a manifest)")
    if applier and applier in settings.trusted_appliers:
        return True, f"lifecycle taken from the spec: applied by trusted {applier}"
    return False, (f"lifecycle: approved was applied by {applier or 'an unknown applier'}, who is "
                   "not in trustedAppliers: the manifest stays a draft until it is approved")


def _effective_lifecycle(model: ToolManifest, obj: ManifestObject, settings: Settings) -> str:
    if model.lifecycle == "draft":
        return "draft"
    return str(model.lifecycle) if _trusted(obj, settings)[0] else "draft"


def plan(namespace: str, manifests: Sequence[ManifestObject], revisions: Sequence[Revision],
         current_bundle: BundleData, signer: Signer, key_id: str | None,
         settings: Settings, now: str) -> Plan:
    out = Plan()
    by_owner: dict[str, dict[str, Revision]] = {}
    for rev in revisions:
        by_owner.setdefault(rev.owner_uid, {})[rev.checksum] = rev
    states = [_State(o) for o in sorted(manifests, key=lambda o: (o.created, o.name))]

    for st in states:
        model, issues = validate_manifest(st.obj.spec)
        st.issues = issues
        if model is not None and not issues:
            blob = canonical_json(model.canonical_dict())
            if len(blob) > MAX_ENTRY_BYTES:
                st.issues.append(Issue(model.tool, "", f"the manifest is {len(blob)} bytes in canonical "
                                       f"form; a bundle entry must stay under {MAX_ENTRY_BYTES} bytes: "
                                       "shorten descriptions or residue text"))
                continue
            st.model, st.digest = model, checksum_bytes(blob)
            known = by_owner.setdefault(st.obj.uid, {})
            found = known.get(st.digest)
            if found is not None:
                rev = found
            else:
                rev = Revision(revision_name(st.obj.name, st.digest), st.obj.name, st.obj.uid,
                               max((r.version for r in known.values()), default=0) + 1,
                               st.digest, model.canonical_dict())
                known[st.digest] = rev
                out.new_revisions.append(rev)
            st.version = rev.version
            st.chosen, st.chosen_version, st.chosen_digest = model, rev.version, st.digest

    for st in states:  # invalid alone: fall back to the last good (published) version
        if st.chosen is None:
            _fall_back(st, by_owner)

    # One manifest per tool: the oldest object keeps the name, whichever version it publishes.
    owner_of: dict[str, str] = {}
    for st in states:
        if st.chosen is None:
            continue
        first = owner_of.setdefault(st.chosen.tool, st.obj.name)
        if first != st.obj.name:
            if st.chosen is st.model:
                st.issues.append(Issue(st.chosen.tool, "tool", f"{st.chosen.tool!r} is already "
                                       f"declared by ToolManifest {first}: keep one manifest per tool"))
                st.set_reason = Reason.DUPLICATE
            st.chosen = None

    _settle_set(states, settings, by_owner)
    entries = []
    for st in states:
        if st.chosen is not None and _effective_lifecycle(st.chosen, st.obj, settings) != "draft":
            assert st.chosen_version is not None and st.chosen_digest is not None
            sig = signer(signing_message(st.chosen.tool, st.chosen_version, st.chosen_digest)) if signer else None
            entries.append(BundleEntry(st.chosen.tool, st.chosen_version, st.chosen_digest,
                                       canonical_json(st.chosen.canonical_dict()), sig, st.obj.name))
    published = {e.source: e for e in entries}
    out.published = len(entries)
    bundle = build_bundle(namespace, entries)
    # A namespace that never had a manifest gets no bundle; one whose manifests were all
    # deleted gets an empty one, so no gateway keeps enforcing what was removed.
    if bundle != current_bundle and (manifests or current_bundle):
        out.bundle = bundle

    held = []
    for st in states:
        declared = st.chosen or st.model
        held.append(Held(st.obj.name, st.obj.deleting, st.obj.finalizers,
                         declared.tool if declared else None,
                         tuple(m for m in (st.model, st.chosen) if m is not None)))
    readers = readers_of(held)
    versions = {st.obj.name: st.obj.resource_version for st in states}
    for name, finalizers in finalizer_updates(held, readers).items():
        out.finalizers[name] = (versions[name], finalizers)

    findings = _lint_by_tool([st.model for st in states if st.model is not None and not st.issues])
    for st in states:
        status = _status(st, published.get(st.obj.name), key_id, findings, settings, now,
                         readers.get(st.obj.name, []))
        if status != st.obj.status:
            # A merge patch keeps what it does not mention: name each dropped field as null.
            out.statuses[st.obj.name] = {**dict.fromkeys(set(st.obj.status) - set(status)), **status}
            out.events.extend(_events(st, status))
    return out


def _fall_back(st: _State, by_owner: dict[str, dict[str, Revision]]) -> None:
    last = st.obj.status.get("publishedChecksum")
    rev = by_owner.get(st.obj.uid, {}).get(last) if isinstance(last, str) else None
    if rev is None or (rev.checksum == st.digest and st.model is not None):
        st.chosen = None
        return
    model, issues = validate_manifest(rev.data)
    if model is not None and not issues:
        st.chosen, st.chosen_version, st.chosen_digest = model, rev.version, rev.checksum
    else:
        st.chosen = None


def _settle_set(states: list[_State], settings: Settings,
                by_owner: dict[str, dict[str, Revision]]) -> None:
    """Check the set until it is consistent: a manifest whose set-level check fails falls back
    to its last good version (or leaves the bundle), which may affect others, so repeat."""
    # Each round changes at least one manifest's choice, and a choice only moves
    # current -> last good -> none, so 2n + 1 rounds always suffice.
    for _ in range(2 * len(states) + 1):
        live = {st.chosen.tool: st for st in states if st.chosen is not None}
        enforceable = [st.chosen for st in live.values()
                       if st.chosen is not None and _effective_lifecycle(st.chosen, st.obj, settings) != "draft"]
        drafts = {st.chosen.tool for st in live.values()
                  if st.chosen is not None and _effective_lifecycle(st.chosen, st.obj, settings) == "draft"}
        problems: dict[str, list[Issue]] = {}
        for issue in validate_set(enforceable):
            problems.setdefault(issue.tool or "", []).append(issue)
        if drafts:  # a draft is checked against everything, drafts included
            everything = [s.chosen for s in live.values() if s.chosen is not None]
            for issue in validate_set(everything):
                if issue.tool in drafts:
                    problems.setdefault(issue.tool, []).append(issue)
        changed = False
        for tool, issues in problems.items():
            st = live.get(tool)
            if st is None or not issues:
                continue
            if st.chosen is st.model:  # the current spec breaks the set
                st.issues.extend(_explain(i, drafts) for i in issues)
                st.set_reason = Reason.SET_INVALID
                _fall_back(st, by_owner)
            else:  # the last good version no longer fits either
                st.chosen = None
            changed = True
        if not changed:
            return


def _explain(issue: Issue, drafts: set[str]) -> Issue:
    """Say so when a published manifest's missing reference is in fact only a draft."""
    if issue.ref in drafts:
        return Issue(issue.tool, issue.path, f"names {issue.ref!r}, which is only a draft: approve "
                     "it before a published manifest may use it")
    return issue


def _lint_by_tool(models: list[ToolManifest]) -> dict[str, list[dict[str, str]]]:
    out: dict[str, list[dict[str, str]]] = {}
    for f in lint(models):
        out.setdefault(f.tool, []).append({"code": f.code, "level": f.level, "message": f.message})
    return out


def _status(st: _State, entry: BundleEntry | None, key_id: str | None,
            findings: dict[str, list[dict[str, str]]], settings: Settings, now: str,
            readers: list[Reader]) -> dict[str, Any]:
    obj, gen = st.obj, st.obj.generation
    conds: list[dict[str, object]] = list(obj.status.get("conditions") or [])
    valid = st.model is not None and not st.issues

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

    lifecycle = None
    if st.model is not None:
        trusted, why = _trusted(obj, settings)
        lifecycle = _effective_lifecycle(st.model, obj, settings)
        if st.model.lifecycle == "draft":
            cond("Approved", False, Reason.DRAFT, "lifecycle is draft: it is recorded but not enforced")
        elif not trusted:
            cond("Approved", False, Reason.UNTRUSTED, why)
        else:
            cond("Approved", True, Reason.DEPRECATED if lifecycle == "deprecated" else Reason.TRUSTED, why)
    else:
        cond("Approved", None, Reason.INVALID, "the spec is invalid")

    if entry is not None and entry.signature is not None:
        cond("Signed", True, Reason.SIGNED, f"version {entry.version} signed by key {entry.signature.key_id}")
    elif entry is not None:
        cond("Signed", False, Reason.NO_KEY, "the operator has no signing key")
    else:
        cond("Signed", False, Reason.NOT_ENFORCEABLE, "only enforceable versions are signed")

    if entry is not None and valid and entry.checksum == st.digest:
        cond("Published", True, Reason.PUBLISHED, f"version {entry.version} is in the namespace bundle")
    elif entry is not None:
        cond("Published", True, Reason.LAST_GOOD, f"the last good version {entry.version} stays in "
             "the bundle; the current spec is invalid (see Valid)")
    elif valid and lifecycle == "draft":
        cond("Published", False, Reason.DRAFT, "a draft is not published: approve it to enforce it")
    else:
        cond("Published", False, Reason.NOT_PUBLISHED, "no valid version of this manifest to publish")

    if obj.deleting and readers:
        cond("Ready", False, Reason.DELETION_BLOCKED, blocked_message(readers))
    elif valid and entry is not None and entry.checksum == st.digest:
        cond("Ready", True, Reason.READY, f"version {entry.version} is enforced")
    elif valid and lifecycle == "draft":
        cond("Ready", True, Reason.DRAFT_RECORDED, f"draft version {st.version} recorded, not enforced")
    else:
        cond("Ready", False, st.set_reason or Reason.INVALID,
             "fix the spec (see Valid)" + (f"; version {entry.version} stays enforced" if entry else ""))

    found = findings.get(st.model.tool, []) if st.model is not None and valid else []
    status: dict[str, Any] = {
        "observedGeneration": gen,
        "version": st.version if valid else None,
        "checksum": st.digest if valid else None,
        "lifecycle": lifecycle,
        "keyId": entry.signature.key_id if entry and entry.signature else None,
        "publishedVersion": entry.version if entry else None,
        "publishedChecksum": entry.checksum if entry else None,
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


def _events(st: _State, status: dict[str, Any]) -> list[Event]:
    old = st.obj.status
    events = []
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    old_ready: dict[str, Any] = next(
        (c for c in old.get("conditions") or [] if c.get("type") == "Ready"), {})
    if ready["reason"] == Reason.DELETION_BLOCKED and ready["message"] != old_ready.get("message"):
        events.append(Event(st.obj.name, "Warning", Reason.DELETION_BLOCKED, str(ready["message"])))
    valid = next(c for c in status["conditions"] if c["type"] == "Valid")
    old_valid: dict[str, Any] = next((c for c in old.get("conditions") or [] if c.get("type") == "Valid"), {})
    if valid["status"] == "False" and (old_valid.get("message") != valid["message"]
                                       or old.get("observedGeneration") != status["observedGeneration"]):
        events.append(Event(st.obj.name, "Warning", str(valid["reason"]), str(valid["message"])))
    if status.get("publishedChecksum") and status["publishedChecksum"] != old.get("publishedChecksum"):
        signed = f", signed by key {status['keyId']}" if status.get("keyId") else ", unsigned"
        events.append(Event(st.obj.name, "Normal", Reason.PUBLISHED,
                            f"version {status['publishedVersion']}{signed}, published in the bundle"))
    return events
