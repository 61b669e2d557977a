"""The namespace reconcile as a pure function: what it writes, and what it leaves alone."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from unwind.bundle import BUNDLE_NAME, INDEX_KEY, BundleError, load_bundle
from unwind.manifest.canonical import checksum
from unwind.manifest.validate import validate_manifest
from unwind.operator.approval import ApprovalObject
from unwind.operator.identity import Bound, Identity, stamp_annotations
from unwind.operator.readers import FINALIZER
from unwind.operator.reconcile import ManifestObject, Plan, Revision, Settings, plan
from unwind.registry.signing import TrustStore, key_id, sign

KEY = Ed25519PrivateKey.generate()
KID = key_id(KEY.public_key())
TRUST = TrustStore([KEY.public_key()])
NOW = "2026-11-30T00:00:00Z"
ARGO = "system:serviceaccount:argocd:argocd-application-controller"
SETTINGS = Settings(trusted_appliers=(ARGO,), trust=TRUST)


def load(bundle: dict[str, dict[str, str]], trust: TrustStore = TRUST) -> Any:
    return load_bundle(bundle, trust, namespace="shop")


def signer(message: bytes) -> Any:
    return sign(KEY, message)


def stamped(kind: str, spec: Any, user: str, groups: tuple[str, ...] = (),
            bound: Bound | None = None) -> dict[str, str]:
    """The annotations the admission webhook writes for this user, for the object ``bound``
    names (by default ToolManifest ``read``, changed)."""
    return stamp_annotations(kind, "shop", spec, Identity(user, groups), signer, bound or Bound("read", "uid-read"))


def version_of(spec: dict[str, Any]) -> str:
    model, issues = validate_manifest(spec)
    assert model is not None and not issues
    return checksum(model)

READ = {"tool": "shop.get_order", "effect": "read_only", "permission": "shop:read"}
CANCEL = {"tool": "shop.cancel_order", "effect": "idempotent", "permission": "shop:write"}
CREATE = {"tool": "shop.create_order", "effect": "compensable", "permission": "shop:write",
          "compensation": {"tool": "shop.cancel_order", "argument_map": {"id": "$result.id"}}}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch, as the API server applies a status patch."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


class Cluster:
    """Plays the API server for the planner: applies a plan's writes to in-memory state."""

    def __init__(self, **specs: dict[str, Any]) -> None:
        self.objects: dict[str, ManifestObject] = {}
        self.revisions: list[Revision] = []
        self.bundle: dict[str, dict[str, str]] = {}
        self.bundle_writes = 0
        self.approvals: list[ApprovalObject] = []
        self.clock = 0  # ms, as the planner's now_ms
        for name, spec in specs.items():
            self.apply(name, spec)

    def apply(self, name: str, spec: dict[str, Any], annotations: dict[str, str] | None = None,
              by: str = ARGO) -> None:
        """Apply as ``by`` (stamped by the webhook) unless raw annotations are given."""
        annotations = stamped("ToolManifest", spec, by, bound=Bound(name, f"uid-{name}")) \
            if annotations is None else annotations
        old = self.objects.get(name)
        gen = (old.generation + (old.spec != spec)) if old else 1
        self.objects[name] = ManifestObject(name, f"uid-{name}", gen, copy.deepcopy(spec),
                                            old.status if old else {}, annotations or {},
                                            created=old.created if old else f"t{len(self.objects):04d}")

    def mark_deleting(self, name: str) -> None:
        o = self.objects[name]
        self.objects[name] = ManifestObject(o.name, o.uid, o.generation, o.spec, o.status,
                                            o.annotations, o.created, True, o.finalizers)

    def delete(self, name: str) -> None:
        obj = self.objects.pop(name)
        self.revisions = [r for r in self.revisions if r.owner_uid != obj.uid]

    def decide(self, name: str, by: str, decision: str = "approve", digest: str | None = None,
               groups: tuple[str, ...] = (), reason: str = "", stamp: bool = True) -> None:
        spec = {"target": {"toolManifest": name, "checksum": digest or version_of(self.objects[name].spec)},
                "decision": decision, **({"reason": reason} if reason else {})}
        n = len(self.approvals)
        created = f"2026-11-30T10:{n // 60 % 60:02d}:{n % 60:02d}Z"  # in the order decided
        at = int(dt.datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp())
        annotations = stamped("Approval", spec, by, groups, Bound(f"{by}-{n}", "", at)) if stamp \
            else {"unwind.dev/approver": by}
        self.approvals.append(ApprovalObject(f"{by}-{n}", created,
                                             spec, annotations))

    def reconcile(self, settings: Settings | None = None) -> Plan:
        self.clock += 1
        result = plan("shop", list(self.objects.values()), self.revisions, self.bundle,
                      signer, KID, settings or SETTINGS, NOW, self.approvals, now_ms=self.clock)
        self.revisions.extend(result.new_revisions)
        for name, patch in result.statuses.items():
            o = self.objects[name]
            self.objects[name] = ManifestObject(o.name, o.uid, o.generation, o.spec,
                                                merge_patch(o.status, patch), o.annotations, o.created)
        for name, (_, finalizers) in result.finalizers.items():
            o = self.objects[name]
            self.objects[name] = ManifestObject(o.name, o.uid, o.generation, o.spec, o.status,
                                                o.annotations, o.created, o.deleting, tuple(finalizers))
        if result.bundle is not None:
            self.bundle = result.bundle
            self.bundle_writes += 1
        return result

    def condition(self, name: str, type_: str) -> dict[str, Any]:
        return next(c for c in self.objects[name].status["conditions"] if c["type"] == type_)

    def enforced(self) -> dict[str, int]:
        return {tool: m.version for tool, m in load(self.bundle).manifests.items()}


def test_valid_manifests_are_versioned_signed_and_published() -> None:
    c = Cluster(read=READ, cancel=CANCEL, create=CREATE)
    result = c.reconcile()
    assert len(result.new_revisions) == 3
    assert c.enforced() == {"shop.get_order": 1, "shop.cancel_order": 1, "shop.create_order": 1}
    for name in ("read", "cancel", "create"):
        assert {t: c.condition(name, t)["status"] for t in ("Valid", "Approved", "Signed", "Published", "Ready")} \
            == dict.fromkeys(("Valid", "Approved", "Signed", "Published", "Ready"), "True")
        assert c.objects[name].status["keyId"] == KID
    assert [e.reason for e in result.events] == ["Published"] * 3


def test_a_second_reconcile_of_an_unchanged_namespace_writes_nothing() -> None:
    c = Cluster(read=READ, cancel=CANCEL, create=CREATE)
    c.reconcile()
    again = c.reconcile()
    assert (again.new_revisions, again.statuses, again.bundle, again.events) == ([], {}, None, [])


def test_an_invalid_edit_keeps_the_last_good_version_in_the_bundle() -> None:
    c = Cluster(read=READ, cancel=CANCEL, create=CREATE)
    c.reconcile()
    c.apply("create", {**CREATE, "retry": {"attempts": 2}})
    c.reconcile()
    assert c.enforced()["shop.create_order"] == 1
    valid = c.condition("create", "Valid")
    assert valid["status"] == "False" and "retry: retrying a compensable tool" in valid["message"]
    assert c.condition("create", "Published")["reason"] == "LastGoodVersionPublished"
    assert c.condition("create", "Ready")["status"] == "False"
    assert c.objects["create"].status["publishedVersion"] == 1


def test_a_valid_edit_is_a_new_version_and_reapplying_the_old_spec_reuses_its_version() -> None:
    c = Cluster(read=READ, cancel=CANCEL, create=CREATE)
    c.reconcile()
    c.apply("create", {**CREATE, "description": "Create an order."})
    c.reconcile()
    assert c.enforced()["shop.create_order"] == 2
    c.apply("create", CREATE)
    result = c.reconcile()
    assert result.new_revisions == [] and c.enforced()["shop.create_order"] == 1


def test_a_draft_is_recorded_but_not_published() -> None:
    c = Cluster(read=READ, draft={**CANCEL, "lifecycle": "draft"})
    c.reconcile()
    assert "shop.cancel_order" not in c.enforced()
    assert c.condition("draft", "Approved")["reason"] == "Draft"
    assert c.condition("draft", "Ready")["reason"] == "DraftRecorded"
    assert c.objects["draft"].status["version"] == 1
    assert c.objects["draft"].status["lifecycle"] == "draft"
    assert c.objects["read"].status["lifecycle"] == "approved"


def test_a_published_manifest_may_not_lean_on_a_draft() -> None:
    c = Cluster(read=READ, create=CREATE, cancel={**CANCEL, "lifecycle": "draft"})
    c.reconcile()
    valid = c.condition("create", "Valid")
    assert valid["reason"] == "SetValidationFailed"
    assert "'shop.cancel_order', which has no approved version: approve it first" in valid["message"]
    assert "shop.create_order" not in c.enforced()


def test_a_missing_reference_fails_set_validation_with_the_field_path() -> None:
    c = Cluster(read=READ, create=CREATE)
    c.reconcile()
    valid = c.condition("create", "Valid")
    assert valid["status"] == "False"
    assert valid["message"].startswith("compensation.tool: names 'shop.cancel_order'")
    assert c.enforced() == {"shop.get_order": 1}


def test_deleting_a_manifest_removes_it_from_the_bundle() -> None:
    c = Cluster(read=READ, cancel=CANCEL)
    c.reconcile()
    c.delete("cancel")
    c.reconcile()
    assert c.enforced() == {"shop.get_order": 1}


def test_a_hand_edited_bundle_is_rewritten() -> None:
    c = Cluster(read=READ)
    c.reconcile()
    good = copy.deepcopy(c.bundle)
    key = next(k for k in c.bundle[BUNDLE_NAME] if k != INDEX_KEY)
    c.bundle[BUNDLE_NAME][key] = c.bundle[BUNDLE_NAME][key].replace("shop:read", "shop:*")
    with pytest.raises(BundleError, match="checksum_mismatch"):
        load(c.bundle)
    result = c.reconcile()
    assert result.bundle is not None
    assert load(result.bundle).manifests == load(good).manifests
    assert load(result.bundle).generation > load(good).generation


def test_the_second_manifest_for_a_tool_is_refused() -> None:
    c = Cluster(first=READ, second={**READ, "description": "again"})
    c.reconcile()
    assert c.condition("second", "Valid")["reason"] == "DuplicateTool"
    assert "already declared by ToolManifest first" in c.condition("second", "Valid")["message"]
    assert c.condition("first", "Ready")["status"] == "True"


def test_approved_from_an_untrusted_applier_waits_and_says_how_to_approve_it() -> None:
    c = Cluster()
    c.apply("read", READ, by="mallory")
    c.reconcile()
    approved = c.condition("read", "Approved")
    assert approved["reason"] == "AwaitingApproval"
    assert "applied by mallory, who is not in trustedAppliers" in approved["message"]
    assert "`kubectl unwind approve tm/read -n shop` (as someone other than mallory)" in approved["message"]
    assert c.condition("read", "Ready")["status"] == "False"
    # not a draft: a version waiting for an approver says so in the Lifecycle column
    assert c.objects["read"].status["lifecycle"] == "awaiting-approval"
    assert c.enforced() == {}


def test_a_hand_written_applied_by_annotation_does_not_make_a_trusted_applier() -> None:
    c = Cluster()
    c.apply("read", READ, annotations={"unwind.dev/applied-by": ARGO})
    c.reconcile()
    approved = c.condition("read", "Approved")
    assert approved["reason"] == "AwaitingApproval"
    assert "not stamped by the Unwind admission webhook (unsigned)" in approved["message"]
    assert c.enforced() == {}


def test_a_stamp_copied_onto_another_spec_does_not_count() -> None:
    c = Cluster()
    c.apply("read", READ, annotations=stamped("ToolManifest", CANCEL, ARGO))
    c.reconcile()
    assert "bad_signature" in c.condition("read", "Approved")["message"]
    assert c.enforced() == {}


def test_another_users_approval_publishes_the_version_and_names_the_approver() -> None:
    c = Cluster()
    c.apply("read", READ, by="alice")
    c.reconcile()
    c.decide("read", "bob", groups=("reviewers",))
    c.reconcile()
    assert c.enforced() == {"shop.get_order": 1}
    approved = c.condition("read", "Approved")
    assert (approved["status"], approved["reason"]) == ("True", "Approved")
    assert approved["message"].startswith("version 1 approved by bob (Approval bob-0)")
    by = c.objects["read"].status["approvedBy"]
    assert (by["user"], by["groups"], by["approval"]) == ("bob", ["reviewers"], "bob-0")
    assert c.objects["read"].status["lifecycle"] == "approved"


def test_the_authors_own_approval_does_not_count_under_four_eyes() -> None:
    c = Cluster()
    c.apply("read", READ, by="alice")
    c.decide("read", "alice")
    c.reconcile()
    assert c.enforced() == {}
    assert "Approval alice-0 is by alice, who last changed the spec" in c.condition("read", "Approved")["message"]
    c.reconcile(Settings(trusted_appliers=(), four_eyes=False, trust=TRUST))
    assert c.enforced() == {"shop.get_order": 1}


def test_an_approval_written_around_the_webhook_is_ignored_with_why() -> None:
    c = Cluster()
    c.apply("read", READ, by="alice")
    c.decide("read", "bob", stamp=False)
    c.reconcile()
    assert c.enforced() == {}
    assert "Approval bob-0: the recorded identity 'bob' is not stamped" in c.condition("read", "Approved")["message"]


def test_a_spec_change_needs_a_new_approval_and_the_approved_version_stays_meanwhile() -> None:
    c = Cluster()
    c.apply("read", READ, by="alice")
    c.decide("read", "bob")
    c.reconcile()
    c.apply("read", {**READ, "description": "changed"}, by="alice")
    c.reconcile()
    assert c.enforced() == {"shop.get_order": 1}
    assert c.condition("read", "Approved")["reason"] == "AwaitingApproval"
    assert c.condition("read", "Published")["reason"] == "LastApprovedVersionPublished"
    assert "version 1 stays enforced" in c.condition("read", "Ready")["message"]
    c.decide("read", "bob")
    c.reconcile()
    assert c.enforced() == {"shop.get_order": 2}
    assert c.objects["read"].status["lifecycle"] == "approved"


def test_a_deny_is_final_for_its_version() -> None:
    c = Cluster()
    c.apply("read", READ, by="alice")
    c.decide("read", "carol", "deny", reason="reads card numbers")
    c.decide("read", "bob")
    c.reconcile()
    assert c.enforced() == {}
    approved = c.condition("read", "Approved")
    assert approved["reason"] == "Denied"
    assert "denied by carol (Approval carol-0): reads card numbers; a deny is final" in approved["message"]
    assert c.objects["read"].status["lifecycle"] == "denied"
    assert [e.reason for e in c.reconcile().events] == []
    c.apply("read", {**READ, "description": "no card numbers"}, by="alice")
    c.decide("read", "bob")
    c.reconcile()
    assert c.enforced() == {"shop.get_order": 2}


def test_a_deny_keeps_a_trusted_appliers_version_out_of_the_bundle() -> None:
    c = Cluster(read=READ)
    c.decide("read", "carol", "deny")
    c.reconcile()
    assert c.enforced() == {}


def test_an_approved_draft_is_enforced_as_approved() -> None:
    c = Cluster()
    draft = {**READ, "lifecycle": "draft"}
    c.apply("read", draft, by="alice")
    c.reconcile()
    assert c.condition("read", "Approved")["reason"] == "Draft"
    assert c.condition("read", "Ready")["reason"] == "DraftRecorded"
    c.decide("read", "bob")
    c.reconcile()
    assert load(c.bundle).manifests["shop.get_order"].lifecycle == "approved"


def test_a_deprecated_version_is_enforced_as_deprecated() -> None:
    c = Cluster(read=READ, new={**READ, "tool": "shop.get_order_v2"})
    c.apply("read", {**READ, "lifecycle": "deprecated", "replaced_by": "shop.get_order_v2"})
    c.reconcile()
    assert load(c.bundle).manifests["shop.get_order"].lifecycle == "deprecated"
    assert c.objects["read"].status["lifecycle"] == "deprecated"


def test_a_large_bundle_is_sharded_and_still_verifies() -> None:
    specs = {f"t{i}": {**READ, "tool": f"shop.read_{i}", "description": "x" * 2000} for i in range(600)}
    c = Cluster(**specs)
    c.reconcile()
    assert len(c.bundle) > 2 and all(len(str(d)) < 1024 * 1024 for d in c.bundle.values())
    assert len(c.enforced()) == 600


def test_a_signature_from_another_key_is_refused() -> None:
    c = Cluster(read=READ)
    c.reconcile()
    with pytest.raises(BundleError, match="untrusted_key"):
        load(c.bundle, TrustStore([Ed25519PrivateKey.generate().public_key()]))


def test_lint_findings_are_reported_in_status() -> None:
    c = Cluster(cancel={**CANCEL})
    c.reconcile()
    lint = c.objects["cancel"].status["lint"]
    assert lint["warnings"] >= 1
    assert {"L011", "L012"} <= {f["code"] for f in lint["findings"]}


def test_a_namespace_without_manifests_gets_no_bundle() -> None:
    c = Cluster()
    assert c.reconcile().bundle is None


def test_deleting_every_manifest_leaves_an_empty_bundle_not_a_stale_one() -> None:
    c = Cluster(read=READ)
    c.reconcile()
    c.delete("read")
    c.reconcile()
    assert c.enforced() == {}


def test_demoting_a_published_manifest_to_draft_clears_its_published_fields() -> None:
    c = Cluster(read=READ)
    c.reconcile()
    c.apply("read", {**READ, "lifecycle": "draft"})
    c.reconcile()
    status = c.objects["read"].status
    assert "publishedChecksum" not in status and "keyId" not in status
    assert c.reconcile().statuses == {}
    c.apply("read", {**READ, "lifecycle": "draft", "retry": {"attempts": 99}})
    c.reconcile()
    assert c.enforced() == {}  # the old approved version does not come back


def test_a_chain_of_fallbacks_settles_into_a_consistent_bundle() -> None:
    z = {**READ, "tool": "t.z"}
    b = {**READ, "tool": "t.b", "requires": ["t.z"]}
    a = {**READ, "tool": "t.a", "requires": ["t.b"]}
    c = Cluster(z=z, b=b, a=a)
    c.reconcile()
    c.delete("z")
    c.apply("b", {**b, "description": "edited"})
    c.apply("a", {**a, "description": "edited"})
    c.reconcile()
    assert c.enforced() == {}
    assert c.reconcile().statuses == {}


def test_a_last_good_version_keeps_its_tool_against_a_newer_duplicate() -> None:
    c = Cluster(a=READ)
    c.reconcile()
    c.apply("a", {**READ, "retry": {"attempts": 99}})
    c.apply("b", READ)
    result = c.reconcile()
    assert result.published == 1
    assert c.condition("b", "Valid")["reason"] == "DuplicateTool"
    assert c.condition("a", "Published")["reason"] == "LastGoodVersionPublished"


def test_without_a_signing_key_versions_are_published_unsigned() -> None:
    c = Cluster(read=READ)
    result = plan("shop", list(c.objects.values()), [], {}, None, None, SETTINGS, NOW)
    assert result.published == 1
    status = result.statuses["read"]
    assert next(x for x in status["conditions"] if x["type"] == "Signed")["reason"] == "NoSigningKey"


def test_a_manifest_too_large_for_a_bundle_entry_is_invalid() -> None:
    c = Cluster(big={**READ, "description": "x" * 1_000_000})
    c.reconcile()
    assert "bytes in canonical form" in c.condition("big", "Valid")["message"]
    assert c.enforced() == {}


def test_a_manifest_another_reads_gets_the_readers_finalizer_and_lists_its_readers() -> None:
    c = Cluster(read=READ, cancel=CANCEL, create=CREATE)
    result = c.reconcile()
    assert {n for n, (_, f) in result.finalizers.items() if FINALIZER in f} == {"cancel"}
    assert c.objects["cancel"].status["readers"] == [{"name": "create", "path": "compensation.tool"}]
    assert "readers" not in c.objects["read"].status


def test_deleting_a_read_manifest_waits_and_says_who_reads_it() -> None:
    c = Cluster(read=READ, cancel=CANCEL, create=CREATE)
    c.reconcile()
    c.mark_deleting("cancel")
    result = c.reconcile()
    assert "cancel" not in result.finalizers  # kept
    assert [(e.name, e.reason) for e in result.events] == [("cancel", "DeletionBlocked")]
    assert "still read by ToolManifest create (compensation.tool)" in result.events[0].message
    assert c.enforced()["shop.cancel_order"] == 1  # still enforced while held


def test_deleting_the_readers_in_the_same_sync_releases_the_manifest() -> None:
    c = Cluster(read=READ, cancel=CANCEL, create=CREATE)
    c.reconcile()
    c.mark_deleting("cancel")
    c.mark_deleting("create")
    result = c.reconcile()
    assert result.finalizers["cancel"][1] == []
    assert not [e for e in result.events if e.reason == "DeletionBlocked"]


def test_a_deny_of_the_enforced_version_falls_back_to_the_version_approved_before_it() -> None:
    c = Cluster()
    c.apply("read", READ, by="alice")
    c.decide("read", "bob")
    c.reconcile()
    c.apply("read", {**READ, "description": "v2"}, by="alice")
    c.decide("read", "bob")
    c.reconcile()
    assert c.enforced() == {"shop.get_order": 2}
    c.decide("read", "carol", "deny", reason="too broad")
    c.reconcile()
    assert c.enforced() == {"shop.get_order": 1}
    assert c.condition("read", "Published")["reason"] == "LastApprovedVersionPublished"


def test_a_version_that_breaks_the_set_still_shows_its_version_and_checksum() -> None:
    c = Cluster()
    c.apply("create", CREATE, by="alice")  # its compensation tool is missing
    c.reconcile()
    status = c.objects["create"].status
    assert c.condition("create", "Valid")["reason"] == "SetValidationFailed"
    assert status["version"] == 1 and status["checksum"] == version_of(CREATE)


# ---- faults and attacks (issues 8 and 9) ------------------------------------------------

def test_a_tool_deleted_and_recreated_never_reuses_a_version_number() -> None:
    c = Cluster(read=READ)
    c.reconcile()
    c.apply("read", {**READ, "description": "v2"})
    c.reconcile()
    assert c.enforced() == {"shop.get_order": 2}
    c.delete("read")
    c.reconcile()
    c.apply("read", {**READ, "description": "v3, new object"})
    c.reconcile()
    assert c.enforced() == {"shop.get_order": 3}  # not 1 again: the signed index remembers
    assert load(c.bundle).high_water["shop.get_order"] == 3


def test_a_duplicate_taking_over_a_tool_continues_its_version_numbers() -> None:
    c = Cluster(a=READ)
    c.reconcile()
    c.apply("b", {**READ, "description": "younger duplicate"})
    c.reconcile()
    c.delete("a")
    c.reconcile()
    assert c.enforced() == {"shop.get_order": 2}


def test_a_deleted_revision_of_the_published_version_is_restored_from_the_signed_bundle() -> None:
    c = Cluster(read=READ)
    c.reconcile()
    gone = c.revisions.pop()
    c.apply("read", {**READ, "retry": {"attempts": 99}})  # now invalid: the fallback needs v1
    result = c.reconcile()
    assert [r.name for r in result.new_revisions] == [gone.name]
    assert result.new_revisions[0].data == gone.data and result.new_revisions[0].version == 1
    assert any(e.reason == "RevisionRestored" for e in result.events)
    assert c.enforced() == {"shop.get_order": 1}


def test_a_revision_whose_data_does_not_match_its_checksum_is_never_signed() -> None:
    c = Cluster(read=READ)
    c.reconcile()
    honest = c.revisions[0]
    forged = Revision(honest.name, honest.owner, honest.owner_uid, honest.version, honest.checksum,
                      {**honest.data, "permission": "shop:admin"})
    c.revisions = [forged]
    c.apply("read", {**READ, "retry": {"attempts": 99}})
    result = c.reconcile()
    assert any(e.reason == "RevisionIgnored" for e in result.events)
    bundle = load(c.bundle).manifests
    assert "shop.get_order" not in bundle or bundle["shop.get_order"].permission == "shop:read"


def test_revision_names_of_the_longest_manifest_names_are_valid_object_names() -> None:
    import re

    from unwind.operator.reconcile import revision_name

    subdomain = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
    for name in ("a" * 253, "a" * 239 + "." + "b" * 13, "x" * 240 + "-" + "y" * 12, "short"):
        rev = revision_name(name, "sha256:" + "f" * 64)
        assert len(rev) <= 253 and subdomain.fullmatch(rev), rev
    assert revision_name("a" * 239 + ".b" * 7, "sha256:" + "0" * 64) != revision_name(
        "a" * 239 + ".c" * 7, "sha256:" + "0" * 64)


def test_a_terminating_namespace_creates_nothing_and_releases_the_readers_finalizer() -> None:
    c = Cluster(read=READ, cancel=CANCEL, create=CREATE)
    c.reconcile()
    for name in ("cancel", "create"):
        c.mark_deleting(name)
    c.apply("read", {**READ, "description": "edited while the namespace goes"})
    result = plan("shop", list(c.objects.values()), c.revisions, c.bundle, signer, KID, SETTINGS, NOW,
                  now_ms=10, terminating=True)
    assert result.new_revisions == [] and result.bundle is None
    assert result.finalizers["cancel"][1] == []


def test_the_readers_finalizer_lands_on_the_manifest_in_force_not_a_younger_duplicate() -> None:
    c = Cluster(cancel=CANCEL, create=CREATE)
    c.reconcile()
    c.apply("cancel-draft", {**CANCEL, "lifecycle": "draft"})
    result = c.reconcile()
    assert "cancel-draft" not in result.finalizers
    assert FINALIZER in c.objects["cancel"].finalizers
    c.mark_deleting("cancel")
    c.reconcile()
    assert c.enforced()["shop.cancel_order"] == 1  # held: create still reads it


def test_the_generation_goes_up_with_every_change_and_an_unchanged_namespace_writes_nothing() -> None:
    c = Cluster(read=READ)
    c.reconcile()
    first = load(c.bundle).generation
    assert c.reconcile().bundle is None
    c.apply("read", {**READ, "description": "changed"})
    c.reconcile()
    assert load(c.bundle).generation > first


def test_a_namespace_in_observe_mode_gets_a_bundle_that_says_so() -> None:
    c = Cluster(read=READ)
    result = plan("shop", list(c.objects.values()), [], {}, signer, KID, SETTINGS, NOW, now_ms=5, mode="observe")
    assert result.bundle is not None and load(result.bundle).mode == "observe"


def test_a_manifest_the_validator_cannot_handle_is_its_own_failure_and_the_others_are_reconciled(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import unwind.operator.reconcile as reconcile

    real = reconcile.validate_manifest

    def crashing(spec: Any) -> Any:
        if isinstance(spec, dict) and spec.get("tool") == "shop.cancel_order":
            raise RecursionError("maximum recursion depth exceeded")
        return real(spec)
    monkeypatch.setattr(reconcile, "validate_manifest", crashing)
    c = Cluster()
    for name, spec in (("read", READ), ("cancel", CANCEL)):
        c.apply(name, spec, annotations={})
    c.reconcile()
    assert c.condition("read", "Valid")["status"] == "True"
    bad = c.condition("cancel", "Valid")
    assert bad["status"] == "False" and "could not validate this spec (RecursionError" in bad["message"]
