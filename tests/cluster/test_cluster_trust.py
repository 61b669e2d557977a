"""The signing key and unwind-trust on the local control plane: the operator owns the trust
ConfigMap as an exact set, and a rotated key re-signs every bundle."""

from __future__ import annotations

import subprocess
import sys
import time

from cluster_helpers import READ, apply, bundle, condition, enforced, settled, tm, trust, wait_for
from kubernetes import client

from unwind.bundle import load_bundle
from unwind.controlplane import ControlPlane
from unwind.controlplane.dev import OPERATOR_NAMESPACE, OperatorProcess
from unwind.registry.signing import key_id

PLANTED = """-----BEGIN PUBLIC KEY-----
MCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=
-----END PUBLIC KEY-----
"""


def trust_keys(api: client.ApiClient) -> set[str]:
    cm = client.CoreV1Api(api).read_namespaced_config_map("unwind-trust", OPERATOR_NAMESPACE)
    return set(cm.data or {})


def test_a_key_planted_in_the_trust_configmap_is_removed_and_a_deleted_one_comes_back(
        operator: OperatorProcess, k8s_api: client.ApiClient) -> None:
    core = client.CoreV1Api(k8s_api)
    before = trust_keys(k8s_api)
    core.patch_namespaced_config_map("unwind-trust", OPERATOR_NAMESPACE, {"data": {"planted.pem": PLANTED}})
    wait_for("the planted key removed", lambda: trust_keys(k8s_api) == before)
    core.delete_namespaced_config_map("unwind-trust", OPERATOR_NAMESPACE)
    wait_for("trust written again", lambda: trust_keys(k8s_api) == before)


def publish_read(control_plane: ControlPlane, k8s_api: client.ApiClient, namespace: str) -> str:
    """Publish one tool (applied by alice, approved by bob); the key id its bundle is signed with."""
    alice, bob = control_plane.user_kubeconfig("alice"), control_plane.user_kubeconfig("bob")
    apply(alice, namespace, tm("read", READ))
    obj = wait_for("settled", lambda: settled(k8s_api, namespace, "read"))
    subprocess.run(["kubectl", f"--kubeconfig={bob}", "-n", namespace, "create", "-f", "-"], check=True,
                   capture_output=True, text=True, input=(
                       "apiVersion: unwind.dev/v1alpha1\nkind: Approval\nmetadata: {name: bob-ok}\n"
                       f"spec: {{target: {{toolManifest: read, checksum: '{obj['status']['checksum']}'}}, "
                       "decision: approve}\n"))
    wait_for("published", lambda: enforced(k8s_api, namespace) == {"shop.get_order": 1})
    kid = load_bundle(bundle(k8s_api, namespace), trust(k8s_api), namespace=namespace).key_id
    assert kid is not None
    return kid


def rotate(control_plane: ControlPlane, old: str) -> str:
    """``unwind rotate-signing-key``; the new key's id."""
    out = subprocess.run([sys.executable, "-m", "unwind.cli.main", "rotate-signing-key",
                          f"--kubeconfig={control_plane.kubeconfig}", f"--operator-namespace={OPERATOR_NAMESPACE}"],
                         capture_output=True, text=True, check=True).stdout
    assert f"signing key {old} retired" in out
    return out.split(", ")[1].split()[0]


def test_a_rotated_key_re_signs_every_bundle_and_then_leaves_trust(
        operator: OperatorProcess, control_plane: ControlPlane, k8s_api: client.ApiClient, namespace: str) -> None:
    old = publish_read(control_plane, k8s_api, namespace)
    new = rotate(control_plane, old)

    def signed_by() -> str | None:
        return load_bundle(bundle(k8s_api, namespace), trust(k8s_api), namespace=namespace).key_id
    wait_for("re-signed with the new key", lambda: signed_by() == new)
    wait_for("the old key leaves trust", lambda: f"{old}.pem" not in trust_keys(k8s_api), timeout=60)
    assert {key_id(k) for k in trust(k8s_api).keys.values()} >= {new}
    # approvals and appliers stamped with the old key still count
    obj = wait_for("status after rotation", lambda: settled(k8s_api, namespace, "read"))
    assert condition(obj, "Approved")["reason"] == "Approved"
    assert enforced(k8s_api, namespace) == {"shop.get_order": 1}


def test_a_namespace_being_deleted_keeps_its_signing_key_in_trust_until_it_is_gone(
        operator: OperatorProcess, control_plane: ControlPlane, k8s_api: client.ApiClient, namespace: str) -> None:
    # Found in CI: a namespace deleted after a rotation (its bundle, signed with the old key,
    # cannot be re-signed while it terminates) kept the old key in trust forever once gone.
    core = client.CoreV1Api(k8s_api)
    old = publish_read(control_plane, k8s_api, namespace)
    hold = {"metadata": {"finalizers": ["test.unwind.dev/hold"]}}
    for name in bundle(k8s_api, namespace):  # what a backup tool's finalizer would do
        core.patch_namespaced_config_map(name, namespace, hold)
    core.delete_namespace(namespace)
    wait_for("terminating", lambda: core.read_namespace(namespace).status.phase == "Terminating")
    new = rotate(control_plane, old)
    wait_for("the new key in trust", lambda: f"{new}.pem" in trust_keys(k8s_api))
    time.sleep(3)  # three key checks: the terminating namespace's bundle still needs the old key
    assert f"{old}.pem" in trust_keys(k8s_api)
    assert load_bundle(bundle(k8s_api, namespace), trust(k8s_api), namespace=namespace).key_id == old

    for name in bundle(k8s_api, namespace):
        core.patch_namespaced_config_map(name, namespace, {"metadata": {"finalizers": None}})
    wait_for("the namespace gone", lambda: namespace not in {n.metadata.name for n in core.list_namespace().items},
             timeout=60)
    wait_for("the old key leaves trust", lambda: f"{old}.pem" not in trust_keys(k8s_api), timeout=60)
