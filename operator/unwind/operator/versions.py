"""Versions and the bundle, for the reconcile: which revisions count, the high-water mark
of each tool's version numbers, restoring a deleted revision, the last approved version to
fall back to, and whether the bundle must be written (pure)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..bundle import (
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
from ..manifest.validate import validate_manifest
from ..registry.signing import TrustStore
from .approval import tally
from .identity import Identity
from .objects import Event, ManifestObject, Plan, Reason, Revision, Signer, State, revision_name


def sorted_json(value: Any) -> Any:
    """Keys in the order the API server stores them, so a patch of the object's metadata
    later compares its data as unchanged."""
    return json.loads(canonical_json(value))


def verified_bundle(data: BundleData, trust: TrustStore, namespace: str) -> Bundle | None:
    """The current bundle when it verifies with our own keys (else: treated as absent)."""
    if not data:
        return None
    try:
        return load_bundle(data, trust, namespace=namespace)
    except BundleError:
        return None


def trusted_revisions(revisions: Sequence[Revision], out: Plan) -> dict[str, dict[str, Revision]]:
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


def restore_published(manifests: Sequence[ManifestObject], current: Bundle | None,
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


def high_water_marks(manifests: Sequence[ManifestObject], by_owner: dict[str, dict[str, Revision]],
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


def bundle_to_write(namespace: str, entries: list[BundleEntry], high_water: dict[str, int], current: Bundle | None,
                    current_data: BundleData, signer: Signer, now_ms: int, mode: str = "enforce") -> BundleData | None:
    """The bundle to write, or None when the current one already says exactly this. The
    generation only goes up: past the current one, and at least the clock in ms (so a
    bundle deleted by hand does not restart the count)."""
    if current is not None:
        slot = str(read_root(current_data).get("slot") or "a")
        same = build_bundle(namespace, entries, generation=current.generation, high_water=high_water,
                            signer=signer, slot=slot, mode=mode)
        if same == current_data:
            return None
        slot = SLOTS[1 - SLOTS.index(slot)] if slot in SLOTS else "a"
    else:
        slot = "a"
    generation = max((current.generation + 1) if current else 1, now_ms)
    return build_bundle(namespace, entries, generation=generation, high_water=high_water, signer=signer,
                        slot=slot, mode=mode)


def bundle_lifecycles(current: Bundle | None) -> dict[str, tuple[str, str]]:
    """tool -> (checksum, lifecycle) as the current bundle enforces it."""
    if current is None:
        return {}
    return {t: (current.checksums[t], str(m.lifecycle)) for t, m in current.manifests.items()}


def fall_back(st: State, by_owner: dict[str, dict[str, Revision]],
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


