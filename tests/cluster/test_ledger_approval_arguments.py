"""Approvals of calls bind to the arguments they approved (issue 17 #3), in the cluster: the
operator writes an Approval's decision into the entry bound to the arguments the entry held
when it first recorded it (or to the digest the Approval names), and keeps that binding when
the gateway reuses a failed call's id for other arguments."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import yaml
from cluster_helpers import GROUP, VERSION, wait_for
from kubernetes import client
from test_ledger_approvals import entry_of, make_ledger

from unwind.controlplane import ControlPlane
from unwind.controlplane.dev import OperatorProcess
from unwind.ledger.approvals import ApprovalRules
from unwind.ledger.clusterstore import compact_entry
from unwind.ledger.decide import record
from unwind.ledger.entry import Attempt, Entry, Times, stamp

SHA_A, SHA_B = "sha256:" + "a" * 64, "sha256:" + "b" * 64
RULES = ApprovalRules(roles=("finance",), quorum=1, timeout_ms=None, on_timeout="deny", escalate_to=())


def awaiting(sha: str, **more: Any) -> Entry:
    return Entry(id="e-1", seq=1, tool="stripe.create_charge", actor="system:serviceaccount:shop:agent",
                 state="awaiting_approval", arguments_sha256=sha, approval=record(RULES, "kubernetes"),
                 times=Times(requested=stamp(datetime.now(UTC))), **more)


def create(api: client.ApiClient, kubeconfig: Any, namespace: str, name: str, target: dict[str, Any]) -> None:
    import subprocess
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Approval", "metadata": {"name": name},
            "spec": {"target": {"effectLedger": "run-a", "entry": "e-1", **target}, "decision": "approve"}}
    done = subprocess.run(["kubectl", f"--kubeconfig={kubeconfig}", "-n", namespace, "create", "-f", "-"],
                          input=yaml.safe_dump(body), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def replace_entry(api: client.ApiClient, namespace: str, entry: Entry) -> None:
    custom = client.CustomObjectsApi(api)
    for _ in range(10):
        obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "effectledgers", "run-a")
        obj["status"]["entries"] = [compact_entry(entry.to_json())]
        try:
            custom.replace_namespaced_custom_object_status(GROUP, VERSION, namespace, "effectledgers", "run-a", obj)
            return
        except client.ApiException as exc:
            if exc.status != 409:
                raise
    raise AssertionError("the entry kept conflicting")


def test_an_approval_of_a_failed_call_does_not_approve_its_id_reused_with_other_arguments(
        operator: OperatorProcess, control_plane: ControlPlane, k8s_api: client.ApiClient, namespace: str) -> None:
    make_ledger(k8s_api, namespace, "run-a", [compact_entry(awaiting(SHA_A).to_json())])
    dave, carol = control_plane.user_kubeconfig("dave"), control_plane.user_kubeconfig("carol")
    create(k8s_api, dave, namespace, "dave-ok", {})
    approved = wait_for("approved", lambda: (e := entry_of(k8s_api, namespace, "run-a", "e-1"))
                        and e["approval"]["state"] == "approved" and e)
    assert approved["approval"]["decisions"][0]["arguments_sha256"] == SHA_A

    # The approved call failed upstream; the agent reused its id with other arguments, and the
    # gateway wrote the new call, its old approval kept with the failed attempt.
    old = Entry.model_validate(approved)
    replace_entry(k8s_api, namespace, awaiting(SHA_B, attempts=[
        Attempt(state="failed", arguments_sha256=SHA_A, approval=old.approval)]))
    create(k8s_api, carol, namespace, "carol-ok", {"argumentsSha256": SHA_B})
    done = wait_for("approved anew", lambda: (e := entry_of(k8s_api, namespace, "run-a", "e-1"))
                    and e["approval"]["state"] == "approved" and e)
    assert "carol" in done["approval"]["message"] and "dave" not in done["approval"]["message"]
    by = {d["user"]: d["arguments_sha256"] for d in done["approval"]["decisions"]}
    assert by == {"dave": SHA_A, "carol": SHA_B}  # dave's still bound to what he approved
