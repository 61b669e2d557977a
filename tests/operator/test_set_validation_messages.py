"""What a ToolManifest that fails set-level validation says in the cluster: every error
offline `unwind validate` lists, and an Approved condition that does not call a trusted
applier untrusted (issue 18: "applied by admin, who is not in trustedAppliers")."""

from __future__ import annotations

from test_reconcile import ARGO, CANCEL, CREATE, READ, Cluster

from unwind.manifest.validate import validate_manifest, validate_namespace

TWO_MISSING = {**CREATE, "compensation": {
    "tool": "shop.nope", "argument_map": {"id": "$result.id"},
    "verification": {"tool": "shop.nope2", "arguments": {"id": "$result.id"}, "expect": {"status": "x"}}}}


def offline_errors() -> list[str]:
    models = [validate_manifest(spec)[0] for spec in (READ, CANCEL, TWO_MISSING)]
    return [f"{i.path}: {i.message}" for i in validate_namespace([m for m in models if m is not None])]


def test_a_new_manifest_breaking_the_set_twice_shows_both_errors_as_offline_validate_does() -> None:
    assert len(offline_errors()) == 2
    c = Cluster(read=READ, cancel=CANCEL, create=TWO_MISSING)
    c.reconcile()
    valid = c.condition("create", "Valid")
    assert valid["reason"] == "SetValidationFailed"
    assert valid["message"] == "; ".join(offline_errors())


def test_an_enforced_manifest_edited_to_break_the_set_twice_shows_both_errors() -> None:
    c = Cluster(read=READ, cancel=CANCEL, create=CREATE)
    c.reconcile()
    c.apply("create", TWO_MISSING)
    c.reconcile()
    assert c.condition("create", "Valid")["message"] == "; ".join(offline_errors())
    assert c.enforced()["shop.create_order"] == 1


def test_a_trusted_appliers_version_failing_the_set_is_not_said_to_wait_for_an_untrusted_applier() -> None:
    c = Cluster(read=READ, cancel=CANCEL, create=TWO_MISSING)
    c.reconcile()
    approved = c.condition("create", "Approved")
    assert "not in trustedAppliers" not in approved["message"]
    assert (approved["status"], approved["reason"]) == ("True", "TrustedApplier")
    assert approved["message"] == (f"version 1 applied by trusted applier {ARGO}; not enforced while it "
                                   "fails set-level validation (see Valid)")
    assert c.condition("create", "Ready")["status"] == "False"
    assert "shop.create_order" not in c.enforced()


def test_an_untrusted_appliers_version_failing_the_set_still_waits_for_approval() -> None:
    c = Cluster(read=READ, cancel=CANCEL)
    c.apply("create", TWO_MISSING, by="mallory")
    c.reconcile()
    approved = c.condition("create", "Approved")
    assert approved["reason"] == "AwaitingApproval"
    assert "applied by mallory, who is not in trustedAppliers" in approved["message"]
