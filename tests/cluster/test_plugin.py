"""The kubectl plugin as people run it: `python -m unwind.cli.main ...` and `kubectl unwind
...` (kubectl finding `kubectl-unwind` on PATH), each person with their own kubeconfig or
impersonated through the admin's, against the real API server, webhooks and operator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import (
    CANCEL,
    GROUP,
    READ,
    ROOT,
    VERSION,
    apply,
    condition,
    enforced,
    settled,
    tm,
    wait_for,
)
from kubernetes import client

from unwind.controlplane import ControlPlane
from unwind.controlplane.dev import OperatorProcess, kubectl

BIN = Path(sys.executable).parent  # the virtualenv's bin/, where pip put kubectl-unwind


def unwind(*args: str, kubectl: bool = False) -> subprocess.CompletedProcess[str]:
    """Run the plugin; ``kubectl=True`` goes through kubectl's plugin lookup."""
    if kubectl and not (BIN / "kubectl-unwind").exists():
        pytest.fail(f"no kubectl-unwind in {BIN}: install the package (pip install -e .)")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "operator"), os.environ.get("PYTHONPATH")) if p)}
    cmd = ["kubectl", "unwind", *args] if kubectl else [sys.executable, "-m", "unwind.cli.main", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120, check=False)


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def one_error_line(proc: subprocess.CompletedProcess[str], code: int = 1) -> str:
    assert proc.returncode == code, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def rows(table: str) -> dict[str, list[str]]:
    """A plugin table by its first column; cells split on the aligned column gaps."""
    lines = table.strip().splitlines()
    starts = [i for i, ch in enumerate(lines[0]) if ch != " " and (i == 0 or lines[0][i - 2:i] == "  ")]
    out = {}
    for line in lines:
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
        out[cells[0]] = cells
    return out


def test_bob_approves_alices_manifest_with_his_kubeconfig_after_four_eyes_refuses_alice(
        operator: OperatorProcess, control_plane: ControlPlane, k8s_api: client.ApiClient, namespace: str) -> None:
    alice, bob = control_plane.user_kubeconfig("alice"), control_plane.user_kubeconfig("bob")
    apply(alice, namespace, tm("read", READ))
    wait_for("settled", lambda: settled(k8s_api, namespace, "read"))

    own = one_error_line(unwind("approve", "tm/read", "-n", namespace, f"--kubeconfig={alice}"))
    assert own == ("error: four-eyes: you (alice) last changed the spec of ToolManifest 'read'; "
                   "someone else must approve it")

    table = rows(ok(unwind("status", "-n", namespace, "--kubeconfig", str(bob), kubectl=True)))
    assert table["NAME"] == ["NAME", "TOOL", "VERSION", "ENFORCED", "STATE", "WAITING FOR"]
    assert table["read"] == ["read", "shop.get_order", "1", "-", "waits for approval", "an approver other than alice"]

    out = ok(unwind("approve", "tm/read", "-n", namespace, "--kubeconfig", str(bob), "--reason", "reads one order",
                    "--wait", kubectl=True))
    first, second = out.strip().splitlines()
    assert first.startswith("approved version 1 of tm/read (sha256:") and " as bob (Approval read-approve-v1-" in first
    assert first.endswith("it will be enforced once the operator tallies it")
    assert second.startswith("Approved=True (Approved): version 1 approved by bob (Approval read-approve-v1-")
    assert enforced(k8s_api, namespace) == {"shop.get_order": 1}
    stored = client.CustomObjectsApi(k8s_api).list_namespaced_custom_object(GROUP, VERSION, namespace, "approvals")
    [record] = stored["items"]
    assert record["metadata"]["annotations"]["unwind.dev/approver"] == "bob"
    assert record["spec"]["reason"] == "reads one order"

    # kubectl's own flags may come before the command: `kubectl unwind -n NS status`
    table = rows(ok(unwind("-n", namespace, f"--kubeconfig={bob}", "status", kubectl=True)))
    assert table["read"][3:] == ["1", "enforced", "-"]


def test_bob_approves_a_set_of_manifests_in_one_command_and_the_one_he_wrote_himself_is_refused_alone(
        operator: OperatorProcess, control_plane: ControlPlane, k8s_api: client.ApiClient, namespace: str) -> None:
    alice, bob = control_plane.user_kubeconfig("alice"), control_plane.user_kubeconfig("bob")
    apply(alice, namespace, tm("read", READ), tm("list", {**READ, "tool": "shop.list_orders"}))
    apply(bob, namespace, tm("own", CANCEL))
    for name in ("read", "list", "own"):
        wait_for(f"{name} settled", lambda n=name: settled(k8s_api, namespace, n))
    # waiting for an approver is not a draft: the LIFECYCLE column says what it is
    listed = kubectl(control_plane.kubeconfig, "-n", namespace, "get", "toolmanifests")
    assert rows(listed)["read"][3] == "awaiting-approval", listed

    out = unwind("approve", "tm/read", "tm/list", "tm/own", "tm/read", "-n", namespace, f"--kubeconfig={bob}",
                 "--reason", "the order tools, released together", "--wait", kubectl=True)
    assert out.returncode == 1, out.stderr
    assert out.stderr.strip().splitlines() == [
        "error: four-eyes: you (bob) last changed the spec of ToolManifest 'own'; someone else must approve it"]
    said = out.stdout.strip().splitlines()
    assert [line.split(" (sha256:")[0] for line in said if line.startswith("approved version")] == [
        "approved version 1 of tm/read", "approved version 1 of tm/list"]  # each once, in the order given
    assert said[-1] == "approved 2 of 3 manifests; not decided: tm/own (see the errors above)"
    assert enforced(k8s_api, namespace) == {"shop.get_order": 1, "shop.list_orders": 1}
    stored = client.CustomObjectsApi(k8s_api).list_namespaced_custom_object(GROUP, VERSION, namespace, "approvals")
    assert sorted(a["spec"]["target"]["toolManifest"] for a in stored["items"]) == ["list", "read"]
    assert {a["spec"]["reason"] for a in stored["items"]} == {"the order tools, released together"}
    assert rows(kubectl(control_plane.kubeconfig, "-n", namespace, "get", "toolmanifests"))["read"][3] == "approved"

    carol = json.loads(ok(unwind("approve", "tm/own", "tm/read", "-n", namespace, "-o", "json",
                                 f"--kubeconfig={control_plane.user_kubeconfig('carol')}")))
    assert [(d["target"]["toolManifest"], d["approver"]) for d in carol] == [("own", "carol"), ("read", "carol")]


def test_an_impersonated_approval_a_final_deny_the_history_and_the_diff_of_two_versions(
        operator: OperatorProcess, control_plane: ControlPlane, k8s_api: client.ApiClient, namespace: str) -> None:
    admin, alice, bob = (control_plane.kubeconfig, control_plane.user_kubeconfig("alice"),
                         control_plane.user_kubeconfig("bob"))
    apply(alice, namespace, tm("read", READ))
    v1 = wait_for("settled", lambda: settled(k8s_api, namespace, "read"))["status"]["checksum"]
    as_carol = (f"--kubeconfig={admin}", "--as=carol", "--as-group=reviewers")
    decided = json.loads(ok(unwind("approve", "tm/read", "-n", namespace, *as_carol, "-o", "json")))
    assert decided["approver"] == "carol" and "reviewers" in decided["approverGroups"]
    assert decided["target"] == {"toolManifest": "read", "checksum": v1, "version": 1}
    assert decided["decision"] == "approve" and decided["condition"] is None
    wait_for("v1 enforced", lambda: enforced(k8s_api, namespace) == {"shop.get_order": 1})

    apply(alice, namespace, tm("read", {**READ, "description": "Read one order."}))
    wait_for("v2", lambda: (o := settled(k8s_api, namespace, "read")) and o["status"].get("version") == 2)
    out = ok(unwind("deny", "tm/read", "-n", namespace, f"--kubeconfig={bob}", "--reason", "reads too much", "--wait"))
    assert out.startswith("denied version 2 of tm/read (sha256:") and " as bob " in out
    assert "Approved=False (Denied): version 2 was denied by bob" in out
    late = unwind("approve", "tm/read", "-n", namespace, *as_carol)
    assert late.returncode == 0 and "your approval is recorded but does not count" in late.stderr

    # bob may not read ConfigMaps: the enforced version and signer come from the status, said so
    as_bob = unwind("history", "tm/read", "-n", namespace, f"--kubeconfig={bob}")
    assert as_bob.returncode == 0 and "you may not read ConfigMap unwind-bundle" in as_bob.stderr
    as_admin = ok(unwind("history", "tm/read", "-n", namespace, f"--kubeconfig={admin}", kubectl=True))
    assert as_admin == as_bob.stdout
    key = settled(k8s_api, namespace, "read")["status"]["keyId"]
    history = rows(as_admin)
    assert history["VERSION"] == ["VERSION", "CHECKSUM", "AUTHOR", "APPROVED BY", "SIGNED BY", "ENFORCED", "CREATED"]
    assert history["1"][1:6] == [v1[7:19], "alice", "carol", key, "yes"]
    assert history["2"][2:6] == ["alice", "denied by bob", "-", "no"]
    listed = json.loads(ok(unwind("history", "tm/read", "-n", namespace, f"--kubeconfig={admin}", "-o", "json")))
    assert [(v["version"], v["approvedBy"], v["deniedBy"], v["current"]) for v in listed] == \
        [(1, ["carol"], [], False), (2, ["carol"], ["bob"], True)]

    changed = unwind("diff", "tm/read", "1", "v2", "-n", namespace, f"--kubeconfig={bob}", kubectl=True)
    assert changed.returncode == 1, changed.stderr
    assert changed.stdout.startswith(f"--- tm/read v1 (sha256:{v1[7:19]})\n+++ tm/read v2 (sha256:")
    assert "+description: Read one order.\n" in changed.stdout.splitlines(keepends=True)
    assert ok(unwind("diff", "tm/read", "2", "2", "-n", namespace, f"--kubeconfig={bob}")) == ""
    unknown = one_error_line(unwind("diff", "tm/read", "1", "9", "-n", namespace, f"--kubeconfig={bob}"), 2)
    assert unknown == "error: tm/read has no version 9; its versions: 1, 2"


def test_the_namespace_status_shows_what_each_manifest_waits_for(
        operator: OperatorProcess, control_plane: ControlPlane, k8s_api: client.ApiClient, namespace: str) -> None:
    admin, alice = control_plane.kubeconfig, control_plane.user_kubeconfig("alice")
    apply(admin, namespace, tm("trusted", READ))
    apply(alice, namespace, tm("drafted", {**READ, "tool": "shop.list_orders", "lifecycle": "draft"}),
          tm("broken", {"tool": "shop.cancel_order", "effect": "compensable", "permission": "shop:write",
                        "compensation": {"tool": "shop.nothing", "argument_map": {"id": "$args.id"}}}))
    for name in ("trusted", "drafted", "broken"):
        wait_for(f"{name} settled", lambda n=name: settled(k8s_api, namespace, n))
    wait_for("trusted enforced", lambda: enforced(k8s_api, namespace) == {"shop.get_order": 1})

    table = rows(ok(unwind("status", "-n", namespace, f"--kubeconfig={alice}")))
    assert table["trusted"][1:] == ["shop.get_order", "1", "1", "enforced", "-"]
    assert table["drafted"][2:] == ["1", "-", "draft", "an approver other than alice, to promote it"]
    # valid alone, refused by the set: a version exists, nothing is enforced
    assert table["broken"][2:5] == ["1", "-", "invalid"]
    assert table["broken"][5].startswith("fix: compensation.tool: ") and "shop.nothing" in table["broken"][5]
    listed = json.loads(ok(unwind("status", "-n", namespace, f"--kubeconfig={alice}", "-o", "json")))
    assert [(m["name"], m["state"]) for m in listed] == [("broken", "invalid"), ("drafted", "draft"),
                                                          ("trusted", "enforced")]

    detail = ok(unwind("status", "tm/trusted", "-n", namespace, f"--kubeconfig={alice}", kubectl=True))
    assert "Approved by:     admin (trusted applier)" in detail
    assert any(line.split()[:3] == ["Approved", "True", "TrustedApplier"] for line in detail.splitlines())
    one: dict[str, Any] = json.loads(ok(unwind("status", "tm/broken", "-n", namespace, f"--kubeconfig={alice}",
                                               "-o", "json")))
    assert one["state"] == "invalid" and one["lastChangedBy"] == "alice"
    assert condition({"status": {"conditions": one["conditions"]}}, "Valid")["reason"] == "SetValidationFailed"

    invalid = one_error_line(unwind("approve", "tm/broken", "-n", namespace,
                                    f"--kubeconfig={control_plane.user_kubeconfig('bob')}"))
    assert invalid.startswith("error: tm/broken is invalid, so there is nothing to approve: compensation.tool")
    missing = one_error_line(unwind("deny", "tm/nope", "-n", namespace, f"--kubeconfig={alice}"))
    assert missing == f"error: tm/nope does not exist in namespace {namespace}"


def test_a_ledger_entry_decision_is_recorded_for_the_operators_tally_and_a_second_says_already_decided(
        operator: OperatorProcess, control_plane: ControlPlane, k8s_api: client.ApiClient, namespace: str) -> None:
    bob = control_plane.user_kubeconfig("bob")
    apply(control_plane.kubeconfig, namespace, {"apiVersion": f"{GROUP}/{VERSION}", "kind": "EffectLedger",
                                                "metadata": {"name": "run-42"}, "spec": {"run": "run-42"}})
    out = ok(unwind("approve", "ledger/run-42", "--entry", "e-0007", "-n", namespace, f"--kubeconfig={bob}",
                    kubectl=True))
    assert out.startswith("approved entry e-0007 of ledger/run-42 as bob (Approval run-42-approve-e-0007-")
    assert "the operator tallies it into the entry" in out and "not tallied" not in out
    assert f"`kubectl get ledger/run-42 -n {namespace} -o yaml`" in out  # works as written
    [record] = client.CustomObjectsApi(k8s_api).list_namespaced_custom_object(
        GROUP, VERSION, namespace, "approvals")["items"]
    assert record["spec"]["target"] == {"effectLedger": "run-42", "entry": "e-0007"}
    assert record["metadata"]["annotations"]["unwind.dev/approver"] == "bob"
    again = unwind("approve", "ledger/run-42", "--entry", "e-0007", "-n", namespace, f"--kubeconfig={bob}",
                   kubectl=True)
    assert again.returncode == 0, again.stderr
    assert f"note: already decided: bob made the same decision (approve) on entry e-0007 of ledger/run-42 " \
           f"in Approval {record['metadata']['name']}; this one is recorded but changes nothing" in again.stderr
    needs_entry = one_error_line(unwind("deny", "effectledger/run-42", "-n", namespace, f"--kubeconfig={bob}"))
    assert needs_entry == "error: ledger/run-42: say which entry with --entry ID"
