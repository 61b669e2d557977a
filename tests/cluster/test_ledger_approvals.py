"""Approvals of calls in the cluster: Approvals naming a ledger entry are stamped by the
webhook, and the operator writes the decisions into the entry and tallies them."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from cluster_helpers import GROUP, VERSION, wait_for
from kubernetes import client

from unwind.controlplane import ControlPlane
from unwind.controlplane.dev import OperatorProcess
from unwind.ledger.approvals import ApprovalRules
from unwind.ledger.clusterstore import compact_entry
from unwind.ledger.decide import record
from unwind.ledger.entry import Entry, Times, stamp


def awaiting(entry: str, rules: ApprovalRules, actor: str = "system:serviceaccount:shop:agent",
             ago: float = 0) -> dict[str, Any]:
    """An entry as the gateway writes it, requested ``ago`` seconds before now."""
    requested = datetime.now(UTC) - timedelta(seconds=ago)
    return compact_entry(Entry(id=entry, seq=1, tool="stripe.create_charge", actor=actor, state="awaiting_approval",
                               approval=record(rules, "kubernetes"), times=Times(requested=stamp(requested))).to_json())


def make_ledger(api: client.ApiClient, namespace: str, name: str, entries: list[dict[str, Any]]) -> None:
    custom = client.CustomObjectsApi(api)
    obj = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "effectledgers", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "EffectLedger", "metadata": {"name": name},
        "spec": {"run": name}})
    obj["status"] = {"entries": entries, "entryCount": len(entries)}
    custom.replace_namespaced_custom_object_status(GROUP, VERSION, namespace, "effectledgers", name, obj)


def entry_of(api: client.ApiClient, namespace: str, name: str, entry: str) -> dict[str, Any]:
    obj = client.CustomObjectsApi(api).get_namespaced_custom_object(GROUP, VERSION, namespace, "effectledgers", name)
    return next(e for e in obj["status"]["entries"] if e["id"] == entry)


def approve(kubeconfig: Path, namespace: str, name: str, ledger: str, entry: str,
            decision: str = "approve") -> subprocess.CompletedProcess[str]:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Approval", "metadata": {"name": name},
            "spec": {"target": {"effectLedger": ledger, "entry": entry}, "decision": decision}}
    return subprocess.run(["kubectl", f"--kubeconfig={kubeconfig}", "-n", namespace, "create", "-f", "-"],
                          input=yaml.safe_dump(body), capture_output=True, text=True, timeout=60)


def test_a_call_needing_two_finance_approvals_is_approved_by_two_users_of_that_group(
        operator: OperatorProcess, control_plane: ControlPlane, k8s_api: client.ApiClient, namespace: str) -> None:
    rules = ApprovalRules(roles=("finance",), quorum=2, timeout_ms=None, on_timeout="deny", escalate_to=())
    make_ledger(k8s_api, namespace, "run-1", [awaiting("e-1", rules)])
    carol, dave, bob = (control_plane.user_kubeconfig(u) for u in ("carol", "dave", "bob"))
    assert approve(bob, namespace, "bob-ok", "run-1", "e-1").returncode == 0  # not in finance
    assert approve(carol, namespace, "carol-ok", "run-1", "e-1").returncode == 0
    first = wait_for("one counted", lambda: (e := entry_of(k8s_api, namespace, "run-1", "e-1"))
                     and len(e["approval"]["decisions"]) == 2 and e)
    assert first["approval"]["state"] == "awaiting_approval"
    assert "1 of 2" in first["approval"]["message"]
    assert approve(dave, namespace, "dave-ok", "run-1", "e-1").returncode == 0
    done = wait_for("approved", lambda: (e := entry_of(k8s_api, namespace, "run-1", "e-1"))
                    and e["approval"]["state"] == "approved" and e)
    assert {d["user"] for d in done["approval"]["decisions"]} == {"bob", "carol", "dave"}


def test_a_timed_out_call_that_escalates_is_decided_by_the_escalation_group(
        operator: OperatorProcess, control_plane: ControlPlane, k8s_api: client.ApiClient, namespace: str) -> None:
    # requested 5 s ago with a 1 s timeout: the deadline is well before any Approval's second
    rules = ApprovalRules(roles=("reviewers",), quorum=1, timeout_ms=1000, on_timeout="escalate",
                          escalate_to=("finance",))
    make_ledger(k8s_api, namespace, "run-2", [awaiting("e-2", rules, ago=5)])
    bob, dave = control_plane.user_kubeconfig("bob"), control_plane.user_kubeconfig("dave")
    assert approve(bob, namespace, "bob-late", "run-2", "e-2").returncode == 0  # reviewers, after the timeout
    assert approve(dave, namespace, "dave-ok", "run-2", "e-2").returncode == 0  # finance, the escalation
    done = wait_for("approved by the escalation group", lambda: (e := entry_of(k8s_api, namespace, "run-2", "e-2"))
                    and e["approval"]["state"] == "approved" and e)
    assert "dave" in done["approval"]["message"] or done["approval"]["state"] == "approved"


def test_a_timed_out_call_that_denies_is_denied(
        operator: OperatorProcess, control_plane: ControlPlane, k8s_api: client.ApiClient, namespace: str) -> None:
    rules = ApprovalRules(roles=("finance",), quorum=1, timeout_ms=1000, on_timeout="deny", escalate_to=())
    make_ledger(k8s_api, namespace, "run-3", [awaiting("e-3", rules, ago=5)])
    dave = control_plane.user_kubeconfig("dave")
    assert approve(dave, namespace, "dave-late", "run-3", "e-3").returncode == 0
    done = wait_for("denied", lambda: (e := entry_of(k8s_api, namespace, "run-3", "e-3")) and e["state"] == "denied" and e)
    assert "timed out" in done["approval"]["message"]
