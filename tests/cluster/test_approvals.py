"""Approvals with real identities on the local control plane: token users in different
groups, a service account, and impersonation; the webhooks stamp, the operator tallies."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import yaml
from cluster_helpers import (
    GROUP,
    READ,
    VERSION,
    apply,
    condition,
    enforced,
    event,
    settled,
    tm,
    wait_for,
)
from kubernetes import client

from unwind.controlplane import ControlPlane
from unwind.controlplane.dev import OperatorProcess, kubectl


def run(kubeconfig: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kubectl", f"--kubeconfig={kubeconfig}", *args], input=stdin,
                          capture_output=True, text=True, timeout=60)


def decide(kubeconfig: Path, namespace: str, name: str, target: str, checksum: str,
           decision: str = "approve", reason: str = "", **extra: Any) -> subprocess.CompletedProcess[str]:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Approval",
            "metadata": {"name": name, **extra.pop("metadata", {})},
            "spec": {"target": {"toolManifest": target, "checksum": checksum}, "decision": decision,
                     **({"reason": reason} if reason else {}), **extra}}
    return run(kubeconfig, "-n", namespace, "create", "-f", "-", stdin=yaml.safe_dump(body))


def approval(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    return client.CustomObjectsApi(api).get_namespaced_custom_object(GROUP, VERSION, namespace, "approvals", name)


def test_the_author_waits_four_eyes_refuses_their_approval_and_another_user_publishes_it(
        operator: OperatorProcess, control_plane: ControlPlane, k8s_api: client.ApiClient, namespace: str) -> None:
    alice, bob = control_plane.user_kubeconfig("alice"), control_plane.user_kubeconfig("bob")
    apply(alice, namespace, tm("read", READ))
    obj = wait_for("settled", lambda: settled(k8s_api, namespace, "read"))
    assert obj["metadata"]["annotations"]["unwind.dev/applied-by"] == "alice"
    assert "dev" in json.loads(obj["metadata"]["annotations"]["unwind.dev/applied-by-groups"])
    approved = condition(obj, "Approved")
    assert approved["reason"] == "AwaitingApproval"
    assert f"`kubectl unwind approve tm/read -n {namespace}` (as someone other than alice)" in approved["message"]
    assert enforced(k8s_api, namespace) == {}
    checksum = obj["status"]["checksum"]

    own = decide(alice, namespace, "alice-ok", "read", checksum)
    assert own.returncode != 0 and "four-eyes: you (alice) last changed the spec" in own.stderr

    assert decide(bob, namespace, "bob-ok", "read", checksum, reason="looks right").returncode == 0
    wait_for("published", lambda: enforced(k8s_api, namespace) == {"shop.get_order": 1})
    obj = wait_for("approved", lambda: (o := settled(k8s_api, namespace, "read"))
                   and condition(o, "Approved")["status"] == "True" and o)
    assert condition(obj, "Approved")["message"].startswith("version 1 approved by bob (Approval bob-ok)")
    assert obj["status"]["approvedBy"]["user"] == "bob"
    assert condition(obj, "Signed")["status"] == condition(obj, "Published")["status"] == "True"
    stored = approval(k8s_api, namespace, "bob-ok")
    assert stored["metadata"]["annotations"]["unwind.dev/approver"] == "bob"
    assert [(o["kind"], o["name"]) for o in stored["metadata"]["ownerReferences"]] == [("ToolManifest", "read")]
    table = kubectl(control_plane.kubeconfig, "-n", namespace, "get", "approvals")
    assert table.split()[:6] == ["NAME", "DECISION", "TOOLMANIFEST", "LEDGER", "ENTRY", "APPROVER"]
    assert "bob" in table


def test_a_forged_approver_and_an_edited_approval_are_refused(
        operator: OperatorProcess, control_plane: ControlPlane, k8s_api: client.ApiClient, namespace: str) -> None:
    alice, bob = control_plane.user_kubeconfig("alice"), control_plane.user_kubeconfig("bob")
    apply(alice, namespace, tm("read", READ))
    checksum = wait_for("settled", lambda: settled(k8s_api, namespace, "read"))["status"]["checksum"]
    forged = decide(bob, namespace, "forged", "read", checksum,
                    metadata={"annotations": {"unwind.dev/approver": "cfo"}})
    assert forged.returncode != 0
    assert "metadata.annotations[unwind.dev/approver]: is written by the Unwind admission webhook" in forged.stderr
    assert decide(bob, namespace, "bob-ok", "read", checksum).returncode == 0
    # RBAC already keeps approvers from updating; even a cluster admin is refused by the webhook
    flip = run(control_plane.kubeconfig, "-n", namespace, "patch", "approval", "bob-ok", "--type=merge", "-p",
               '{"spec": {"decision": "deny"}}')
    assert flip.returncode != 0 and "an Approval is a record and cannot be changed" in flip.stderr
    rename = run(control_plane.kubeconfig, "-n", namespace, "annotate", "--overwrite", "approval", "bob-ok",
                 "unwind.dev/approver=cfo")
    assert rename.returncode != 0 and "the recorded approver cannot be changed" in rename.stderr
    stale = decide(bob, namespace, "stale", "read", "sha256:" + "0" * 64)
    assert stale.returncode != 0 and f"which is {checksum}" in stale.stderr


def test_a_spec_change_needs_a_new_approval_and_a_deny_is_final(
        operator: OperatorProcess, control_plane: ControlPlane, k8s_api: client.ApiClient, namespace: str) -> None:
    alice, bob, carol = (control_plane.user_kubeconfig(u) for u in ("alice", "bob", "carol"))
    apply(alice, namespace, tm("read", READ))
    v1 = wait_for("settled", lambda: settled(k8s_api, namespace, "read"))["status"]["checksum"]
    assert decide(bob, namespace, "bob-v1", "read", v1).returncode == 0
    wait_for("v1 published", lambda: enforced(k8s_api, namespace) == {"shop.get_order": 1})

    apply(alice, namespace, tm("read", {**READ, "description": "Read one order."}))
    obj = wait_for("v2 waits", lambda: (o := settled(k8s_api, namespace, "read"))
                   and o["status"].get("version") == 2 and o)
    assert condition(obj, "Approved")["reason"] == "AwaitingApproval"
    assert condition(obj, "Published")["reason"] == "LastApprovedVersionPublished"
    assert enforced(k8s_api, namespace) == {"shop.get_order": 1}  # v1 stays enforced meanwhile

    v2 = obj["status"]["checksum"]
    assert decide(carol, namespace, "carol-v2", "read", v2, "deny", "reads too much").returncode == 0
    obj = wait_for("denied", lambda: (o := settled(k8s_api, namespace, "read"))
                   and condition(o, "Approved")["reason"] == "Denied" and o)
    assert "denied by carol (Approval carol-v2): reads too much; a deny is final" in condition(obj, "Approved")["message"]
    assert decide(bob, namespace, "bob-v2", "read", v2).returncode == 0  # recorded, but too late
    wait_for("still denied", lambda: condition(settled(k8s_api, namespace, "read") or {}, "Approved")["reason"]
             == "Denied")
    assert enforced(k8s_api, namespace) == {"shop.get_order": 1}
    event(k8s_api, namespace, "read", "Denied", "Warning")


def test_a_trusted_appliers_approved_lifecycle_publishes_and_an_untrusted_ones_does_not(
        operator: OperatorProcess, control_plane: ControlPlane, k8s_api: client.ApiClient, namespace: str) -> None:
    admin, alice = control_plane.kubeconfig, control_plane.user_kubeconfig("alice")
    apply(admin, namespace, tm("trusted", READ))
    apply(alice, namespace, tm("untrusted", {**READ, "tool": "shop.list_orders"}))
    wait_for("trusted published", lambda: enforced(k8s_api, namespace) == {"shop.get_order": 1})
    obj = wait_for("settled", lambda: settled(k8s_api, namespace, "trusted"))
    assert condition(obj, "Approved")["reason"] == "TrustedApplier"
    assert "applied by trusted applier admin" in condition(obj, "Approved")["message"]
    untrusted = wait_for("settled", lambda: settled(k8s_api, namespace, "untrusted"))
    assert condition(untrusted, "Approved")["reason"] == "AwaitingApproval"
    # a hand-written applied-by is refused at admission, so it cannot be used to pose as admin
    forged = run(alice, "-n", namespace, "annotate", "--overwrite", "tm", "untrusted", "unwind.dev/applied-by=admin")
    assert forged.returncode != 0 and "is written by the Unwind admission webhook" in forged.stderr


def test_service_accounts_and_impersonated_users_are_stamped_as_the_api_server_saw_them(
        operator: OperatorProcess, control_plane: ControlPlane, k8s_api: client.ApiClient, namespace: str) -> None:
    admin = control_plane.kubeconfig
    sa = f"system:serviceaccount:{namespace}:deployer"
    kubectl(admin, "-n", namespace, "create", "rolebinding", "deployers", "--clusterrole=unwind-edit",
            f"--serviceaccount={namespace}:deployer", "--user=erin")
    proc = run(admin, "-n", namespace, f"--as={sa}", "apply", "-f", "-", stdin=yaml.safe_dump(tm("by-sa", READ)))
    assert proc.returncode == 0, proc.stderr
    proc = run(admin, "-n", namespace, "--as=erin", "--as-group=finance", "apply", "-f", "-",
               stdin=yaml.safe_dump(tm("by-erin", {**READ, "tool": "shop.list_orders"})))
    assert proc.returncode == 0, proc.stderr
    by_sa = wait_for("settled", lambda: settled(k8s_api, namespace, "by-sa"))["metadata"]["annotations"]
    assert by_sa["unwind.dev/applied-by"] == sa
    assert f"system:serviceaccounts:{namespace}" in json.loads(by_sa["unwind.dev/applied-by-groups"])
    by_erin = wait_for("settled", lambda: settled(k8s_api, namespace, "by-erin"))["metadata"]["annotations"]
    assert by_erin["unwind.dev/applied-by"] == "erin"
    assert "finance" in json.loads(by_erin["unwind.dev/applied-by-groups"])
