"""The namespace reconcile, as a pure function: snapshot in, plan out.

The operator gathers one consistent snapshot of a namespace (its ToolManifests, their
ControllerRevisions and the current bundle), calls ``plan`` and then writes only what the
plan says changed. Everything that decides anything is here, tested without a cluster:

- each spec is validated alone, then the namespace's set is checked (references exist,
  read-backs are read-only, no cycles, one manifest per tool);
- each distinct valid spec checksum is a version (an immutable ControllerRevision);
- a version is enforced only when approved (approval.py: an Approval of its checksum, or a
  trusted applier); one that waits for approval, or whose spec is invalid, leaves the last
  approved version in the bundle, while an explicit ``lifecycle: draft`` withdraws it;
- the bundle holds the enforced version of every manifest, signed, and is rewritten only
  when its bytes differ.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..api.conditions import set_condition
from ..bundle import (
    SHARD_LIMIT,
    SLOTS,
    Bundle,
    BundleData,
    BundleEntry,
    BundleError,
    build_bundle,
    load_bundle,
    read_root,
)
from ..manifest.canonical import canonical_json, checksum_bytes
from ..manifest.issues import Issue
from ..manifest.lint import lint
from ..manifest.model import ToolManifest
from ..manifest.validate import validate_manifest, validate_namespace
from ..registry.signing import Signature, TrustStore
from .approval import (
    ApprovalObject,
    Decision,
    Verdict,
    applier,
    decisions_by_manifest,
    is_trusted,
    tally,
)
from .identity import Identity
from .readers import Held, Reader, blocked_message, finalizer_updates, readers_of

MAX_FINDINGS = 20
MAX_ENTRY_BYTES = SHARD_LIMIT - 1024  # one manifest must fit in one shard


class Reason:
    """Condition reasons (CamelCase constants, documented in docs/operator.md)."""

    VALID = "ValidationPassed"
    INVALID = "ValidationFailed"
    SET_INVALID = "SetValidationFailed"
    DUPLICATE = "DuplicateTool"
    TRUSTED = "TrustedApplier"
    APPROVED = "Approved"
    AWAITING = "AwaitingApproval"
    DENIED = "Denied"
    DRAFT = "Draft"
    SIGNED = "Signed"
    NO_KEY = "NoSigningKey"
    NOT_ENFORCEABLE = "NotEnforceable"
    PUBLISHED = "Published"
    LAST_GOOD = "LastGoodVersionPublished"
    LAST_APPROVED = "LastApprovedVersionPublished"
    NOT_PUBLISHED = "NotPublished"
    READY = "Ready"
    DRAFT_RECORDED = "DraftRecorded"
    DELETION_BLOCKED = "DeletionBlocked"
    REVISION_IGNORED = "RevisionIgnored"
    WRITE_FAILED = "WriteFailed"
    REVISION_RESTORED = "RevisionRestored"


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
    author: str = ""  # who applied the spec that made this version (stamped identity)


@dataclass(frozen=True)
class Event:
    name: str  # the object's name
    type: str  # Normal | Warning
    reason: str
    message: str
    kind: str = "ToolManifest"  # or ConfigMap, for the bundle


@dataclass(frozen=True)
class Settings:
    trusted_appliers: tuple[str, ...] = ()
    four_eyes: bool = True
    # The operator's own public keys (current and retired): identity stamps and the current
    # bundle count only when they verify with one of these. None counts nothing.
    trust: TrustStore | None = None


@dataclass
class Plan:
    new_revisions: list[Revision] = field(default_factory=list)
    statuses: dict[str, dict[str, Any]] = field(default_factory=dict)  # only changed ones
    bundle: BundleData | None = None  # None: the current bundle is already right
    events: list[Event] = field(default_factory=list)
    published: int = 0
    finalizers: dict[str, tuple[str, list[str]]] = field(default_factory=dict)  # name -> (rv, list)
    signed_by: str | None = None  # the key the namespace's bundle is signed with once written


Signer = Callable[[bytes], Signature] | None


def revision_name(manifest_name: str, digest: str) -> str:
    """``<manifest>-<12 hex of the checksum>``, always a valid object name: a name too long
    for the suffix is cut, its end stripped of ``.``/``-`` and a hash of the whole added."""
    suffix = "-" + digest.removeprefix("sha256:")[:12]
    if len(manifest_name) + len(suffix) <= 253:
        return manifest_name + suffix
    whole = hashlib.sha256(manifest_name.encode()).hexdigest()[:8]
    return manifest_name[:253 - len(suffix) - 9].rstrip(".-") + "-" + whole + suffix


@dataclass
class _State:
    obj: ManifestObject
    model: ToolManifest | None = None  # the current spec, when valid alone
    issues: list[Issue] = field(default_factory=list)
    version: int | None = None
    digest: str | None = None
    author: Identity | None = None  # who last changed the spec (stamped), if known
    author_problem: str = ""
    verdict: Verdict = field(default_factory=lambda: Verdict("none"))
    approved: bool = False  # the current version may be enforced
    decisions: list[Decision] = field(default_factory=list)  # stamped Approvals naming this object
    four_eyes: bool = True
    chosen: ToolManifest | None = None  # what goes to the bundle: current or last approved
    chosen_version: int | None = None
    chosen_digest: str | None = None
    chosen_lifecycle: str = "approved"
    set_reason: str = ""

    @property
    def waiting(self) -> bool:
        """Valid, asks to be enforced, and is not (yet) approved."""
        return self.model is not None and not self.issues and not self.approved \
            and self.model.lifecycle != "draft"

    @property
    def current_chosen(self) -> bool:
        return self.chosen is not None and self.chosen is self.model


def _approve(st: _State, settings: Settings) -> None:
    """Decide whether the current version may be enforced, and with which lifecycle."""
    assert st.model is not None and st.digest is not None
    st.verdict = tally(st.decisions, st.digest, st.author, settings.four_eyes)
    trusted = st.model.lifecycle != "draft" and is_trusted(st.author, settings.trusted_appliers)
    st.approved = st.verdict.state == "approved" or (st.verdict.state != "denied" and trusted)
    st.chosen_lifecycle = "deprecated" if st.model.lifecycle == "deprecated" else "approved"


def plan(namespace: str, manifests: Sequence[ManifestObject], revisions: Sequence[Revision],
         current_bundle: BundleData, signer: Signer, key_id: str | None,
         settings: Settings, now: str, approvals: Sequence[ApprovalObject] = (), *,
         now_ms: int = 0, terminating: bool = False) -> Plan:
    """``terminating``: the namespace is being deleted; nothing may be created in it any more,
    so only finalizers and statuses are planned (the readers finalizer must still go)."""
    out = Plan()
    trust = settings.trust or TrustStore()
    current = _verified(current_bundle, trust, namespace)
    by_owner = _trusted_revisions(revisions, out)
    _restore_published(manifests, current, by_owner, out, terminating)
    high_water = _high_water(manifests, by_owner, current)
    decisions, unstamped = decisions_by_manifest(namespace, approvals, trust)
    states = [_State(o, decisions=decisions.get(o.name, []), four_eyes=settings.four_eyes)
              for o in sorted(manifests, key=lambda o: (o.created, o.name))]
    enforced_lifecycles = _bundle_lifecycles(current)

    for st in states:
        model, issues = validate_manifest(st.obj.spec)
        st.issues = issues
        if model is None or issues:
            continue
        blob = canonical_json(model.canonical_dict())
        if len(blob) > MAX_ENTRY_BYTES:
            st.issues.append(Issue(model.tool, "", f"the manifest is {len(blob)} bytes in canonical "
                                   f"form; a bundle entry must stay under {MAX_ENTRY_BYTES} bytes: "
                                   "shorten descriptions or residue text"))
            continue
        st.model, st.digest = model, checksum_bytes(blob)
        st.author, st.author_problem = applier(namespace, st.obj.spec, st.obj.annotations, trust)
        known = by_owner.setdefault(st.obj.uid, {})
        rev = known.get(st.digest)
        if rev is None and not (st.obj.deleting or terminating):  # a manifest going away needs no new version
            # Versions count per tool in the namespace and are never given out twice.
            high_water[model.tool] = high_water.get(model.tool, 0) + 1
            rev = Revision(revision_name(st.obj.name, st.digest), st.obj.name, st.obj.uid,
                           high_water[model.tool], st.digest, _sorted(model.canonical_dict()),
                           st.author.user if st.author else "")
            known[st.digest] = rev
            out.new_revisions.append(rev)
        if rev is None:
            continue
        st.version = rev.version
        _approve(st, settings)
        if st.approved:
            st.chosen, st.chosen_version, st.chosen_digest = model, rev.version, st.digest

    for st in states:  # invalid, or waiting for approval: the last approved version stays
        if st.chosen is None and (st.model is None or st.issues or st.waiting):
            _fall_back(st, by_owner, enforced_lifecycles)

    # One manifest per tool: the oldest object keeps the name, whichever version it publishes.
    owner_of: dict[str, str] = {}
    for st in states:
        declared = st.chosen or (st.model if not st.issues else None)
        if declared is None:
            continue
        first = owner_of.setdefault(declared.tool, st.obj.name)
        if first != st.obj.name:
            if st.model is not None and not st.issues:
                st.issues.append(Issue(declared.tool, "tool", f"{declared.tool!r} is already "
                                       f"declared by ToolManifest {first}: keep one manifest per tool"))
                st.set_reason = Reason.DUPLICATE
            st.chosen = None

    _settle_set(states, by_owner, enforced_lifecycles)
    entries = []
    for st in states:
        if st.chosen is not None:
            assert st.chosen_version is not None and st.chosen_digest is not None
            entries.append(BundleEntry(st.chosen.tool, st.chosen_version, st.chosen_digest,
                                       canonical_json(st.chosen.canonical_dict()), st.obj.name,
                                       st.chosen_lifecycle))
    published = {e.source: e for e in entries}
    out.published = len(entries)
    # A namespace that never had a manifest gets no bundle; one whose manifests were all
    # deleted gets an empty one, so no gateway keeps enforcing what was removed.
    if not terminating and (manifests or current_bundle):
        out.bundle = _bundle(namespace, entries, high_water, current, current_bundle, signer, now_ms)
    out.signed_by = key_id if out.bundle is not None else (current.key_id if current else None)

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
        notes = unstamped.get(st.obj.name, [])
        status = _status(namespace, st, published.get(st.obj.name), key_id, findings, settings, now,
                         readers.get(st.obj.name, []), notes)
        if status != st.obj.status:
            # A merge patch keeps what it does not mention: name each dropped field as null.
            out.statuses[st.obj.name] = {**dict.fromkeys(set(st.obj.status) - set(status)), **status}
            out.events.extend(_events(st, status))
    return out


def _sorted(value: Any) -> Any:
    """Keys in the order the API server stores them, so a patch of the object's metadata
    later compares its data as unchanged."""
    return json.loads(canonical_json(value))


def _verified(data: BundleData, trust: TrustStore, namespace: str) -> Bundle | None:
    """The current bundle when it verifies with our own keys (else: treated as absent)."""
    if not data:
        return None
    try:
        return load_bundle(data, trust, namespace=namespace)
    except BundleError:
        return None


def _trusted_revisions(revisions: Sequence[Revision], out: Plan) -> dict[str, dict[str, Revision]]:
    """Revisions by owner uid and checksum, keeping only those whose data has the checksum
    they claim: whoever can write ControllerRevisions must not get content signed."""
    by_owner: dict[str, dict[str, Revision]] = {}
    for rev in revisions:
        if checksum_bytes(canonical_json(rev.data)) != rev.checksum:
            out.events.append(Event(rev.owner, "Warning", Reason.REVISION_IGNORED,
                                    f"ControllerRevision {rev.name} holds data that does not match its "
                                    f"checksum {rev.checksum}: edited outside the operator, ignored"))
            continue
        by_owner.setdefault(rev.owner_uid, {})[rev.checksum] = rev
    return by_owner


def _restore_published(manifests: Sequence[ManifestObject], current: Bundle | None,
                       by_owner: dict[str, dict[str, Revision]], out: Plan, terminating: bool) -> None:
    """Re-create the revision of a published version from the signed bundle's bytes when it
    was deleted, so the last good version survives and its number is not reused."""
    if current is None or terminating:
        return
    published = {(current.sources[t], current.checksums[t]): t for t in current.manifests}
    for obj in manifests:
        last = obj.status.get("publishedChecksum")
        known = by_owner.setdefault(obj.uid, {})
        tool = published.get((obj.name, last)) if isinstance(last, str) else None
        if tool is None or last in known or obj.deleting:
            continue
        assert isinstance(last, str)
        version = current.manifests[tool].version
        rev = Revision(revision_name(obj.name, last), obj.name, obj.uid, version, last,
                       json.loads(current.blobs[tool]))
        known[last] = rev
        out.new_revisions.append(rev)
        out.events.append(Event(obj.name, "Warning", Reason.REVISION_RESTORED,
                                f"the ControllerRevision of published version {version} was missing: "
                                "re-created from the signed bundle"))


def _high_water(manifests: Sequence[ManifestObject], by_owner: dict[str, dict[str, Revision]],
                current: Bundle | None) -> dict[str, int]:
    """The highest version each tool has had in the namespace: from the signed bundle (which
    remembers tools whose manifests are gone), the revisions, and the statuses."""
    high = dict(current.high_water) if current else {}

    def see(tool: Any, version: Any) -> None:
        if isinstance(tool, str) and isinstance(version, int):
            high[tool] = max(high.get(tool, 0), version)
    if current is not None:
        for tool, model in current.manifests.items():
            see(tool, model.version)
    for known in by_owner.values():
        for rev in known.values():
            see(rev.data.get("tool"), rev.version)
    for obj in manifests:
        declared = obj.spec.get("tool") if isinstance(obj.spec, dict) else None
        for field_ in ("version", "publishedVersion"):
            see(declared, obj.status.get(field_))
    return high


def _bundle(namespace: str, entries: list[BundleEntry], high_water: dict[str, int], current: Bundle | None,
            current_data: BundleData, signer: Signer, now_ms: int) -> BundleData | None:
    """The bundle to write, or None when the current one already says exactly this. The
    generation only goes up: past the current one, and at least the clock in ms (so a
    bundle deleted by hand does not restart the count)."""
    if current is not None:
        slot = str(read_root(current_data).get("slot") or "a")
        same = build_bundle(namespace, entries, generation=current.generation, high_water=high_water,
                            signer=signer, slot=slot)
        if same == current_data:
            return None
        slot = SLOTS[1 - SLOTS.index(slot)] if slot in SLOTS else "a"
    else:
        slot = "a"
    generation = max((current.generation + 1) if current else 1, now_ms)
    return build_bundle(namespace, entries, generation=generation, high_water=high_water, signer=signer, slot=slot)


def _bundle_lifecycles(current: Bundle | None) -> dict[str, tuple[str, str]]:
    """tool -> (checksum, lifecycle) as the current bundle enforces it."""
    if current is None:
        return {}
    return {t: (current.checksums[t], str(m.lifecycle)) for t, m in current.manifests.items()}


def _fall_back(st: _State, by_owner: dict[str, dict[str, Revision]],
               enforced: dict[str, tuple[str, str]]) -> None:
    """Enforce the last approved version other than the current one: the version this
    manifest last published, unless a deny has struck it since; else the newest version an
    Approval approved. None of them (or none that still validates): nothing."""
    st.chosen = None
    revisions = by_owner.get(st.obj.uid, {})
    last = st.obj.status.get("publishedChecksum")

    def verdict(rev: Revision) -> str:
        author = Identity(rev.author) if rev.author else None
        return tally(st.decisions, rev.checksum, author, st.four_eyes).state

    candidates = [revisions[last]] if isinstance(last, str) and last in revisions else []
    candidates = [r for r in candidates if verdict(r) != "denied"]
    candidates += sorted((r for r in revisions.values() if r.checksum != last and verdict(r) == "approved"),
                         key=lambda r: -r.version)
    for rev in candidates:
        if rev.checksum == st.digest and not st.approved:
            continue
        model, issues = validate_manifest(rev.data)
        if model is None or issues:
            continue
        st.chosen, st.chosen_version, st.chosen_digest = model, rev.version, rev.checksum
        digest, lifecycle = enforced.get(model.tool, ("", ""))
        if digest == rev.checksum and lifecycle in ("approved", "deprecated"):
            st.chosen_lifecycle = lifecycle
        else:
            st.chosen_lifecycle = "deprecated" if model.lifecycle == "deprecated" else "approved"
        return


def _settle_set(states: list[_State], by_owner: dict[str, dict[str, Revision]],
                enforced: dict[str, tuple[str, str]]) -> None:
    """Check the namespace with ``validate_namespace`` (the one set check ``unwind validate``
    runs offline too) until it is consistent: an enforced version that breaks the set falls
    back to the last approved one (or leaves the bundle), which may affect others, so
    repeat. Versions that are not enforced (drafts, versions waiting for approval) count as
    drafts: they never break the enforced set, and each is checked with itself in place of
    its tool's enforced version, so its author sees what would break."""
    def drafted(st: _State) -> ToolManifest:
        assert st.model is not None
        return st.model.model_copy(update={"lifecycle": "draft"})

    # Each round changes at least one manifest's choice, and a choice only moves
    # current -> last good -> none, so 2n + 1 rounds always suffice.
    for _ in range(2 * len(states) + 1):
        live = [st for st in states if st.chosen is not None]
        tools = {st.chosen.tool for st in live if st.chosen is not None}
        # drafts of tools nothing enforces: they explain a missing reference ("approve it first")
        others = [st for st in states if st.model is not None and not st.issues and not st.current_chosen
                  and st.model.tool not in tools]
        models = [st.chosen.model_copy(update={"lifecycle": st.chosen_lifecycle}) for st in live
                  if st.chosen is not None] + [drafted(st) for st in others]
        changed = False
        for issue in validate_namespace(models):
            if issue.index is None or issue.index >= len(live):
                continue
            st = live[issue.index]
            if st.current_chosen:  # the current spec breaks the set
                st.issues.append(issue)
                st.set_reason = Reason.SET_INVALID
                st.approved = False
                _fall_back(st, by_owner, enforced)
            else:  # the last good version no longer fits either
                st.chosen = None
            changed = True
        if not changed:
            break
    enforced_models = {st.chosen.tool: st.chosen.model_copy(update={"lifecycle": st.chosen_lifecycle})
                       for st in states if st.chosen is not None}
    pending = [st for st in states if st.model is not None and not st.issues and not st.current_chosen]
    if not pending:
        return
    # one check of the namespace as it would be with every pending version in place
    replaced = {st.model.tool for st in pending if st.model is not None}
    models = [m for t, m in enforced_models.items() if t not in replaced]
    first = len(models)
    for issue in validate_namespace([*models, *(drafted(st) for st in pending)]):
        if issue.index is not None and issue.index >= first:
            st = pending[issue.index - first]
            st.issues.append(issue)
            st.set_reason = Reason.SET_INVALID


def _lint_by_tool(models: list[ToolManifest]) -> dict[str, list[dict[str, str]]]:
    out: dict[str, list[dict[str, str]]] = {}
    for f in lint(models):
        out.setdefault(f.tool, []).append({"code": f.code, "level": f.level, "message": f.message})
    return out


def _how_to_approve(namespace: str, st: _State) -> str:
    cmd = f"kubectl unwind approve tm/{st.obj.name} -n {namespace}"
    return f"approve it with `{cmd}`" + (f" (as someone other than {st.author.user})" if st.author else "")


def _approval_condition(namespace: str, st: _State, settings: Settings,
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
    if st.model.lifecycle == "draft":
        return False, Reason.DRAFT, f"{v} is a draft: {_how_to_approve(namespace, st)}{note}"
    who = (f"applied by {st.author.user}, who is not in trustedAppliers" if st.author
           else f"the applier is unknown ({st.author_problem})")
    return False, Reason.AWAITING, f"{v} waits for approval ({who}): {_how_to_approve(namespace, st)}{note}"


def _approved_by(st: _State, entry: BundleEntry | None) -> dict[str, Any] | None:
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


def _status(namespace: str, st: _State, entry: BundleEntry | None, key_id: str | None,
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
        "lifecycle": (st.chosen_lifecycle if enforced_now else "draft") if st.model is not None else None,
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


def _events(st: _State, status: dict[str, Any]) -> list[Event]:
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
