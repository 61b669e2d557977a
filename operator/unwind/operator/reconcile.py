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

from collections.abc import Sequence

from ..bundle import SHARD_LIMIT, BundleData, BundleEntry
from ..manifest.canonical import canonical_json, checksum_bytes
from ..manifest.issues import Issue
from ..manifest.lint import lint
from ..manifest.model import ToolManifest
from ..manifest.validate import validate_manifest, validate_namespace
from ..registry.signing import TrustStore
from .approval import ApprovalObject, applier, decisions_by_manifest, is_trusted, tally
from .objects import (  # re-exported: the reconcile's data is imported from here
    Event,
    ManifestObject,
    Plan,
    Reason,
    Revision,
    Settings,
    Signer,
    State,
    revision_name,
)
from .readers import Held, finalizer_updates, readers_of
from .status import events_of, failure_statuses, status_of
from .versions import (
    bundle_lifecycles,
    bundle_to_write,
    fall_back,
    high_water_marks,
    restore_published,
    sorted_json,
    trusted_revisions,
    verified_bundle,
)

__all__ = ["Event", "ManifestObject", "Plan", "Reason", "Revision", "Settings", "failure_statuses",
           "plan", "revision_name"]

MAX_ENTRY_BYTES = SHARD_LIMIT - 1024  # one manifest must fit in one shard

def _approve(st: State, settings: Settings) -> None:
    """Decide whether the current version may be enforced, and with which lifecycle."""
    assert st.model is not None and st.digest is not None
    st.verdict = tally(st.decisions, st.digest, st.author, settings.four_eyes)
    trusted = st.model.lifecycle != "draft" and is_trusted(st.author, settings.trusted_appliers)
    st.approved = st.verdict.state == "approved" or (st.verdict.state != "denied" and trusted)
    st.chosen_lifecycle = "deprecated" if st.model.lifecycle == "deprecated" else "approved"


def plan(namespace: str, manifests: Sequence[ManifestObject], revisions: Sequence[Revision],
         current_bundle: BundleData, signer: Signer, key_id: str | None,
         settings: Settings, now: str, approvals: Sequence[ApprovalObject] = (), *,
         now_ms: int = 0, terminating: bool = False, mode: str = "enforce") -> Plan:
    """``terminating``: the namespace is being deleted; nothing may be created in it any more,
    so only finalizers and statuses are planned (the readers finalizer must still go).
    ``mode``: the namespace's ``unwind.dev/mode`` (observe: gateways record violations
    without refusing, for a rollout), signed into the bundle."""
    out = Plan()
    trust = settings.trust or TrustStore()
    current = verified_bundle(current_bundle, trust, namespace)
    by_owner = trusted_revisions(revisions, out)
    restore_published(manifests, current, by_owner, out, terminating)
    high_water = high_water_marks(manifests, by_owner, current)
    decisions, unstamped = decisions_by_manifest(namespace, approvals, trust)
    states = [State(o, decisions=decisions.get(o.name, []), four_eyes=settings.four_eyes)
              for o in sorted(manifests, key=lambda o: (o.created, o.name))]
    enforced_lifecycles = bundle_lifecycles(current)

    for st in states:
        model, issues = _validated(st.obj)
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
        st.author, st.author_problem = applier(namespace, st.obj.spec, st.obj.annotations, trust,
                                               {"name": st.obj.name, "uid": st.obj.uid,
                                                "creationTimestamp": st.obj.created})
        known = by_owner.setdefault(st.obj.uid, {})
        rev = known.get(st.digest)
        if rev is None and not (st.obj.deleting or terminating):  # a manifest going away needs no new version
            # Versions count per tool in the namespace and are never given out twice.
            high_water[model.tool] = high_water.get(model.tool, 0) + 1
            rev = Revision(revision_name(st.obj.name, st.digest), st.obj.name, st.obj.uid,
                           high_water[model.tool], st.digest, sorted_json(model.canonical_dict()),
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
            fall_back(st, by_owner, enforced_lifecycles)

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
        out.bundle = bundle_to_write(namespace, entries, high_water, current, current_bundle, signer, now_ms,
                                     mode)
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
        status = status_of(namespace, st, published.get(st.obj.name), key_id, findings, settings, now,
                         readers.get(st.obj.name, []), notes)
        if status != st.obj.status:
            # A merge patch keeps what it does not mention: name each dropped field as null.
            out.statuses[st.obj.name] = {**dict.fromkeys(set(st.obj.status) - set(status)), **status}
            out.events.extend(events_of(st, status))
    return out


def _validated(obj: ManifestObject) -> tuple[ToolManifest | None, list[Issue]]:
    """The spec validated alone. A spec the validator cannot handle (a bug met by one
    object's data) is that object's failure, reported on it: the namespace goes on."""
    try:
        return validate_manifest(obj.spec)
    except Exception as exc:
        return None, [Issue(None, "", f"the operator could not validate this spec ({type(exc).__name__}: "
                            f"{exc}); the other manifests of the namespace were reconciled")]


def _settle_set(states: list[State], by_owner: dict[str, dict[str, Revision]],
                enforced: dict[str, tuple[str, str]]) -> None:
    """Check the namespace with ``validate_namespace`` (the one set check ``unwind validate``
    runs offline too) until it is consistent: an enforced version that breaks the set falls
    back to the last approved one (or leaves the bundle), which may affect others, so
    repeat. Versions that are not enforced (drafts, versions waiting for approval) count as
    drafts: they never break the enforced set, and each is checked with itself in place of
    its tool's enforced version, so its author sees what would break."""
    def drafted(st: State) -> ToolManifest:
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
        broken: dict[int, list[Issue]] = {}  # every issue of a manifest, as offline validate lists them
        for issue in validate_namespace(models):
            if issue.index is not None and issue.index < len(live):
                broken.setdefault(issue.index, []).append(issue)
        for index, issues in broken.items():
            st = live[index]
            if st.current_chosen:  # the current spec breaks the set
                st.issues += issues
                st.set_reason = Reason.SET_INVALID
                st.approved = False
                fall_back(st, by_owner, enforced)
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


