"""The operator under faults an SRE would cause, each one found by probing the operator on
the local control plane: stuck namespaces, a poisoned reconcile, oversized bundles, versions
that went backwards, revisions that could not be patched."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import yaml
from cluster_helpers import (
    CANCEL,
    CREATE,
    READ,
    apply,
    condition,
    enforced,
    get,
    settled,
    tm,
    wait_for,
)
from kubernetes import client

from unwind.controlplane.dev import OperatorProcess, kubectl
from unwind.operator.readers import FINALIZER


def revisions(api: client.ApiClient, namespace: str) -> list[client.V1ControllerRevision]:
    return list(client.AppsV1Api(api).list_namespaced_controller_revision(namespace).items)


def test_deleting_a_namespace_whose_manifests_hold_the_readers_finalizer_finishes(
        operator: OperatorProcess, kubeconfig: Path, k8s_api: client.ApiClient) -> None:
    core = client.CoreV1Api(k8s_api)
    name = f"doomed-{int(time.time() * 1000) % 10**8}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    apply(kubeconfig, name, tm("read", READ), tm("cancel", CANCEL), tm("create", CREATE))
    wait_for("finalizer", lambda: FINALIZER in (get(k8s_api, name, "cancel")["metadata"].get("finalizers") or []))
    core.delete_namespace(name)

    def gone() -> bool:
        try:
            core.read_namespace(name)
        except client.ApiException as exc:
            return exc.status == 404
        return False
    wait_for("the namespace deleted", gone, timeout=90)


def test_a_253_character_manifest_name_does_not_poison_its_namespace(
        operator: OperatorProcess, kubeconfig: Path, k8s_api: client.ApiClient, namespace: str) -> None:
    long_name = "a" * 239 + "." + "b" * 13  # cut to 240 characters this used to end in "."
    apply(kubeconfig, namespace, tm(long_name, READ), tm("cancel", CANCEL))
    wait_for("both published", lambda: enforced(k8s_api, namespace) == {"shop.get_order": 1,
                                                                          "shop.cancel_order": 1})
    names = [r.metadata.name for r in revisions(k8s_api, namespace)]
    assert any(n.startswith("a" * 200) and len(n) <= 253 for n in names)


def test_one_manifests_refused_write_leaves_it_not_ready_and_the_rest_of_the_namespace_goes_on(
        operator: OperatorProcess, kubeconfig: Path, k8s_api: client.ApiClient, namespace: str) -> None:
    # a quota of one ControllerRevision: the second manifest's version cannot be recorded
    client.CoreV1Api(k8s_api).create_namespaced_resource_quota(namespace, {
        "metadata": {"name": "one-revision"}, "spec": {"hard": {"count/controllerrevisions.apps": "1"}}})
    apply(kubeconfig, namespace, tm("read", READ))
    wait_for("first published", lambda: enforced(k8s_api, namespace) == {"shop.get_order": 1})
    apply(kubeconfig, namespace, tm("cancel", CANCEL))
    obj = wait_for("the refused one reported", lambda: (o := get(k8s_api, namespace, "cancel"))
                   and condition(o, "Ready").get("reason") == "WriteFailed" and o)
    assert "exceeded quota" in condition(obj, "Ready")["message"]
    assert condition(settled(k8s_api, namespace, "read") or {}, "Ready")["status"] == "True"


def test_2000_manifests_get_a_sharded_bundle_that_verifies(
        operator: OperatorProcess, kubeconfig: Path, k8s_api: client.ApiClient, namespace: str,
        tmp_path: Path) -> None:
    docs = [tm(f"m{i:04d}", {"tool": f"svc{i:04d}.get", "effect": "read_only", "permission": "svc:read",
                             "description": f"Read record {i} of the service. " + "x" * 400})
            for i in range(2000)]
    path = tmp_path / "many.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    subprocess.run(["kubectl", f"--kubeconfig={kubeconfig}", "-n", namespace, "apply", "-f", str(path)],
                   check=True, capture_output=True, timeout=600)
    wait_for("all 2000 enforced", lambda: len(enforced(k8s_api, namespace)) == 2000, timeout=240)
    shards = client.CoreV1Api(k8s_api).list_namespaced_config_map(namespace, label_selector="unwind.dev/bundle")
    assert len(shards.items) > 1


def test_a_younger_draft_duplicate_does_not_take_the_readers_finalizer(
        operator: OperatorProcess, kubeconfig: Path, k8s_api: client.ApiClient, namespace: str) -> None:
    apply(kubeconfig, namespace, tm("cancel", CANCEL), tm("create", CREATE))
    wait_for("finalizer", lambda: FINALIZER in (get(k8s_api, namespace, "cancel")["metadata"].get("finalizers") or []))
    apply(kubeconfig, namespace, tm("cancel-copy", {**CANCEL, "lifecycle": "draft"}))
    wait_for("copy settled", lambda: settled(k8s_api, namespace, "cancel-copy"))
    assert FINALIZER not in (get(k8s_api, namespace, "cancel-copy")["metadata"].get("finalizers") or [])
    kubectl(kubeconfig, "-n", namespace, "delete", "tm", "cancel", "--wait=false")
    obj = wait_for("held", lambda: (o := get(k8s_api, namespace, "cancel"))
                   and condition(o, "Ready").get("reason") == "DeletionBlocked" and o)
    assert obj["metadata"]["deletionTimestamp"]
    assert enforced(k8s_api, namespace)["shop.cancel_order"] == 1


def test_deleting_a_controllerrevision_neither_drops_the_last_good_version_nor_reuses_its_number(
        operator: OperatorProcess, kubeconfig: Path, k8s_api: client.ApiClient, namespace: str) -> None:
    apply(kubeconfig, namespace, tm("plain", READ))
    wait_for("v1", lambda: enforced(k8s_api, namespace) == {"shop.get_order": 1})
    apply(kubeconfig, namespace, tm("plain", {**READ, "description": "v2"}))
    wait_for("v2", lambda: enforced(k8s_api, namespace) == {"shop.get_order": 2})
    wait_for("v2 settled", lambda: (o := settled(k8s_api, namespace, "plain")) and o["status"].get("publishedVersion") == 2)
    apps = client.AppsV1Api(k8s_api)
    for rev in revisions(k8s_api, namespace):
        apps.delete_namespaced_controller_revision(rev.metadata.name, namespace)
    apply(kubeconfig, namespace, tm("plain", {**READ, "description": "v3"}))
    wait_for("v3, not v1 again", lambda: enforced(k8s_api, namespace) == {"shop.get_order": 3})
    numbers = sorted(int(r.revision) for r in revisions(k8s_api, namespace))
    assert numbers[-1] == 3 and numbers.count(3) == 1


def test_a_tool_deleted_and_recreated_does_not_go_back_to_version_1(
        operator: OperatorProcess, kubeconfig: Path, k8s_api: client.ApiClient, namespace: str) -> None:
    apply(kubeconfig, namespace, tm("plain", READ))
    # versioned before it changes: an edit the operator sees first is version 1 itself
    wait_for("v1", lambda: enforced(k8s_api, namespace) == {"shop.get_order": 1})
    apply(kubeconfig, namespace, tm("plain", {**READ, "description": "v2"}))
    wait_for("v2", lambda: enforced(k8s_api, namespace) == {"shop.get_order": 2})
    kubectl(kubeconfig, "-n", namespace, "delete", "tm", "plain")
    wait_for("gone from the bundle", lambda: enforced(k8s_api, namespace) == {})
    apply(kubeconfig, namespace, tm("plain", {**READ, "description": "recreated"}))
    wait_for("v3", lambda: enforced(k8s_api, namespace) == {"shop.get_order": 3})


def test_an_orphaning_delete_of_a_manifest_finishes_and_its_revisions_can_be_labelled(
        operator: OperatorProcess, kubeconfig: Path, k8s_api: client.ApiClient, namespace: str) -> None:
    apply(kubeconfig, namespace, tm("plain", READ))
    wait_for("v1", lambda: enforced(k8s_api, namespace) == {"shop.get_order": 1})
    rev = revisions(k8s_api, namespace)[0].metadata.name
    kubectl(kubeconfig, "-n", namespace, "label", "controllerrevision", rev, "team=shop")
    subprocess.run(["kubectl", f"--kubeconfig={kubeconfig}", "-n", namespace, "delete", "tm", "plain",
                    "--cascade=orphan", "--timeout=30s"], check=True, capture_output=True, timeout=60)
    left = client.AppsV1Api(k8s_api).read_namespaced_controller_revision(rev, namespace)
    assert not left.metadata.owner_references  # orphaned, not deleted
