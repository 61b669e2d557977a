"""The chart installed into a real API server (the local control plane, docs/controlplane.md).

Helm's Go library (helm-python-sdk) installs the chart the way `helm install` does;
the API server's own RBAC authorizer then answers SubjectAccessReviews for the
operator's ServiceAccount, so the least-privilege claims are checked by Kubernetes,
not by reading YAML. There is no kubelet: the operator pod stays Pending, so the
install does not wait for it.

Skipped, with the reason, when the control-plane binaries are not built yet outside CI;
under CI=true they are built, and a failure to build fails the tests.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
from kubernetes import client
from kubernetes import config as k8s_config

from unwind.controlplane import ControlPlane, ensure_binaries
from unwind.controlplane.build import cached_binaries

pytestmark = pytest.mark.cluster

RELEASE = "unwind"
NAMESPACE = "unwind-system"
OPERATOR = f"system:serviceaccount:{NAMESPACE}:{RELEASE}"


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    bins = cached_binaries()
    if bins is None:
        if os.environ.get("CI", "").lower() != "true":
            pytest.skip("control-plane binaries not built (python -m unwind.controlplane.build)")
        bins = ensure_binaries()
    with ControlPlane(tmp_path_factory.mktemp("cp"), bins, die_with_parent=True) as cp:
        yield cp


@pytest.fixture(scope="module")
def installed(control_plane: ControlPlane, chart_dir: Path) -> Iterator[dict[str, Any]]:
    with helm.Config(kubeconfig_path=control_plane.kubeconfig, namespace=NAMESPACE) as cfg:
        release = cfg.install(chart_dir, RELEASE, create_namespace=True, timeout=120)
        yield release
        cfg.uninstall(RELEASE, ignore_not_found=True, timeout=60)


@pytest.fixture(scope="module")
def api(control_plane: ControlPlane) -> Iterator[Any]:
    api_client = k8s_config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    try:
        yield api_client
    finally:
        api_client.close()


def may(
    api: Any,
    verb: str,
    resource: str,
    *,
    group: str = "",
    namespace: str | None = None,
    name: str | None = None,
    subresource: str | None = None,
    user: str = OPERATOR,
) -> bool:
    account_ns = user.split(":")[2] if user.startswith("system:serviceaccount:") else NAMESPACE
    review = client.V1SubjectAccessReview(
        spec=client.V1SubjectAccessReviewSpec(
            user=user,
            groups=["system:serviceaccounts", f"system:serviceaccounts:{account_ns}"],
            resource_attributes=client.V1ResourceAttributes(
                verb=verb,
                group=group,
                resource=resource,
                namespace=namespace,
                name=name,
                subresource=subresource,
            ),
        )
    )
    answer = client.AuthorizationV1Api(api).create_subject_access_review(review)
    return bool(answer.status.allowed)


def test_the_chart_installs_as_a_deployed_release(installed: dict[str, Any], api: Any) -> None:
    assert installed["status"] == "deployed"
    assert installed["revision"] == 1
    apps = client.AppsV1Api(api)
    assert apps.read_namespaced_deployment("unwind-operator", NAMESPACE).spec.replicas == 2
    hooks = client.AdmissionregistrationV1Api(api)
    assert len(hooks.read_validating_webhook_configuration("unwind").webhooks) == 2
    assert len(hooks.read_mutating_webhook_configuration("unwind").webhooks) == 4
    rbac = client.RbacAuthorizationV1Api(api)
    assert rbac.read_cluster_role("unwind-operator").rules
    assert rbac.read_namespaced_role("unwind-operator-keys", NAMESPACE).rules


def test_the_crds_folder_is_installed_before_the_templates(
    installed: dict[str, Any], api: Any
) -> None:
    crds = client.ApiextensionsV1Api(api).list_custom_resource_definition()
    assert any(crd.spec.group == "unwind.dev" for crd in crds.items)


def test_the_operator_may_do_what_its_handlers_need(installed: dict[str, Any], api: Any) -> None:
    assert may(api, "watch", "customresourcedefinitions", group="apiextensions.k8s.io")
    assert may(api, "list", "namespaces")
    assert may(api, "patch", "toolmanifests", group="unwind.dev", namespace="payments")
    assert may(
        api,
        "update",
        "toolmanifests",
        group="unwind.dev",
        namespace="payments",
        subresource="status",
    )
    assert may(api, "create", "controllerrevisions", group="apps", namespace="payments")
    assert may(api, "update", "configmaps", namespace="payments", name="unwind-bundle")
    assert may(api, "create", "events", namespace="payments")
    assert may(api, "create", "secrets", namespace=NAMESPACE)
    assert may(api, "get", "secrets", namespace=NAMESPACE, name="unwind-signing-key")
    assert may(api, "update", "secrets", namespace=NAMESPACE, name="unwind-webhook-tls")
    assert may(api, "update", "leases", group="coordination.k8s.io", namespace=NAMESPACE, name="unwind-operator")
    assert may(api, "patch", "validatingwebhookconfigurations", group="admissionregistration.k8s.io",
               name="unwind")
    assert may(api, "list", "approvals", group="unwind.dev", namespace="payments")


def test_the_operator_may_write_only_the_bundles_configmaps(installed: dict[str, Any], api: Any) -> None:
    assert may(api, "update", "configmaps", namespace="payments", name="unwind-bundle")
    assert may(api, "delete", "configmaps", namespace="payments", name="unwind-bundle-b-63")
    assert not may(api, "update", "configmaps", namespace="kube-system", name="coredns")
    assert not may(api, "delete", "configmaps", namespace="kube-system", name="extension-apiserver-authentication")
    assert not may(api, "update", "configmaps", namespace="payments", name="unwind-trust")
    assert not may(api, "update", "configmaps", namespace="payments", name="unwind-bundle-c-0")
    assert not may(api, "patch", "configmaps", namespace="payments", name="unwind-bundle")
    assert may(api, "update", "configmaps", namespace=NAMESPACE, name="unwind-trust")  # its own namespace


def test_the_operator_may_touch_no_other_webhook_configuration_or_lease(installed: dict[str, Any], api: Any) -> None:
    assert not may(api, "patch", "validatingwebhookconfigurations", group="admissionregistration.k8s.io",
                   name="kyverno-resource-validating-webhook-cfg")
    assert not may(api, "update", "leases", group="coordination.k8s.io", namespace="kube-system",
                   name="kube-controller-manager")
    assert not may(api, "update", "leases", group="coordination.k8s.io", namespace=NAMESPACE, name="other")
    assert not may(api, "create", "approvals", group="unwind.dev", namespace="payments")


def test_the_operator_may_not_read_any_other_secret(installed: dict[str, Any], api: Any) -> None:
    assert not may(api, "get", "secrets", namespace=NAMESPACE, name="someone-elses")
    assert not may(api, "list", "secrets", namespace=NAMESPACE)
    assert not may(api, "get", "secrets", namespace="payments", name="unwind-signing-key")
    assert not may(api, "create", "secrets", namespace="payments")


def test_the_operator_may_not_delete_or_escalate(installed: dict[str, Any], api: Any) -> None:
    assert not may(api, "delete", "toolmanifests", group="unwind.dev", namespace="payments")
    assert not may(api, "delete", "secrets", namespace=NAMESPACE, name="unwind-signing-key")
    assert not may(api, "update", "controllerrevisions", group="apps", namespace="payments")
    assert not may(api, "create", "clusterrolebindings", group="rbac.authorization.k8s.io")
    assert not may(api, "create", "pods", namespace="payments")
    # the gateways' token exchange: tokens of unwind-gateway only, bindings to its role only
    assert may(api, "create", "serviceaccounts", subresource="token", namespace="payments", name="unwind-gateway")
    assert not may(api, "create", "serviceaccounts", subresource="token", namespace="payments", name="default")
    assert not may(api, "create", "serviceaccounts", subresource="token", namespace="kube-system",
                   name="clusterrole-aggregation-controller")
    assert may(api, "bind", "clusterroles", group="rbac.authorization.k8s.io", name="unwind-gateway")
    assert not may(api, "bind", "clusterroles", group="rbac.authorization.k8s.io", name="cluster-admin")
    assert not may(api, "escalate", "clusterroles", group="rbac.authorization.k8s.io", name="cluster-admin")
    assert not may(api, "update", "rolebindings", group="rbac.authorization.k8s.io", namespace="payments",
                   name="unwind-gateway")


def test_uninstall_removes_the_release_objects(
    control_plane: ControlPlane, chart_dir: Path, api: Any
) -> None:
    name = "second"
    with helm.Config(kubeconfig_path=control_plane.kubeconfig, namespace="unwind-two") as cfg:
        cfg.install(chart_dir, name, create_namespace=True, timeout=120)
        rbac = client.RbacAuthorizationV1Api(api)
        assert rbac.read_cluster_role("second-unwind-operator").rules
        result = cfg.uninstall(name, timeout=60)
        assert result["release"]["name"] == name
        assert cfg.list(name_filter=f"^{name}$") == []
    names = [r.metadata.name for r in rbac.list_cluster_role().items]
    assert "second-unwind-operator" not in names


def test_an_agent_bound_to_the_gateway_role_writes_its_ledgers_status_and_reads_the_trust(
        installed: dict[str, Any], api: Any) -> None:
    agent = "system:serviceaccount:agents:agent"
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": "agents"}})
    client.RbacAuthorizationV1Api(api).create_namespaced_role_binding("agents", {
        "metadata": {"name": "agent-gateway"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "unwind-gateway"},
        "subjects": [{"kind": "ServiceAccount", "name": "agent", "namespace": "agents"}]})
    try:
        ledger = {"group": "unwind.dev", "namespace": "agents", "user": agent}
        # The API server's RBAC authorizer learns of a new RoleBinding from its informer, a
        # moment after the create returns: wait for the binding to count before judging it.
        deadline = time.monotonic() + 10
        while not may(api, "create", "effectledgers", **ledger) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert may(api, "create", "effectledgers", **ledger)
        assert may(api, "update", "effectledgers", subresource="status", name="run-1", **ledger)
        assert not may(api, "update", "effectledgers", name="run-1", **ledger)  # spec: the rollback request
        assert not may(api, "patch", "effectledgers", name="run-1", **ledger)
        assert not may(api, "delete", "effectledgers", name="run-1", **ledger)
        assert may(api, "create", "leases", group="coordination.k8s.io", namespace="agents", user=agent)
        assert may(api, "get", "configmaps", namespace="agents", name="unwind-bundle-a-7", user=agent)
        assert not may(api, "get", "configmaps", namespace="agents", name="other", user=agent)
        assert not may(api, "create", "effectledgers", group="unwind.dev", namespace="payments", user=agent)
        assert not may(api, "create", "approvals", **ledger)
        assert may(api, "get", "configmaps", namespace=NAMESPACE, name="unwind-trust", user=agent)
        assert not may(api, "update", "configmaps", namespace=NAMESPACE, name="unwind-trust", user=agent)
    finally:
        core.delete_namespace("agents")
