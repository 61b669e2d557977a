"""Fixtures for tests against the real local control plane (see docs/controlplane.md).

One control plane per test session (starting one takes ~10-20 s), one fresh namespace per
test. Every test under tests/cluster is marked ``cluster``. When the binaries cannot be
built the session fails under CI (CI=true) and is skipped, with the reason, elsewhere.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_helpers import METRICS_PORT
from kubernetes import client, config

from unwind.controlplane import BuildError, ControlPlane, ensure_binaries
from unwind.controlplane.cluster import free_ports
from unwind.controlplane.dev import (
    OperatorProcess,
    install_chart,
    install_crds,
    local_values,
    service_account_kubeconfig,
)

HERE = Path(__file__).parent.resolve()
# Token users with distinct identities (name -> groups), for approvals and four-eyes.
USERS = {"alice": ("dev",), "bob": ("reviewers",), "carol": ("reviewers", "finance"),
         "dave": ("finance",)}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    try:
        bins = ensure_binaries()
    except (BuildError, OSError) as exc:
        reason = f"control-plane binaries unavailable: {exc}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason)
        print(reason)
        pytest.skip(reason)
    cp = ControlPlane(bins=bins, die_with_parent=True, users=USERS)
    try:
        cp.start(tmp_path_factory.mktemp("controlplane"))
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def kubeconfig(control_plane: ControlPlane) -> Path:
    return control_plane.kubeconfig


@pytest.fixture(scope="session")
def k8s_api(kubeconfig: Path) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(config_file=str(kubeconfig))
    try:
        yield api
    finally:
        api.close()


@pytest.fixture
def namespace(k8s_api: client.ApiClient) -> Iterator[str]:
    core = client.CoreV1Api(k8s_api)
    name = f"t-{uuid.uuid4().hex[:10]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    # Pods are refused until the controller manager has made the "default" ServiceAccount
    deadline = time.monotonic() + 30
    while not core.list_namespaced_service_account(name, field_selector="metadata.name=default").items:
        if time.monotonic() > deadline:
            pytest.fail(f"no default ServiceAccount in {name} after 30s")
        time.sleep(0.1)
    # Every test user may edit ToolManifests and decide Approvals here, through the chart's
    # own user roles when the chart is installed (tests/cluster/test_operator.py does).
    rbac = client.RbacAuthorizationV1Api(k8s_api)
    for role in ("unwind-edit", "unwind-view", "unwind-approver"):
        rbac.create_namespaced_role_binding(name, {
            "metadata": {"name": f"test-users-{role}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": u} for u in USERS]})
    try:
        yield name
    finally:
        try:
            core.delete_namespace(name)  # finalized asynchronously by the namespace controller
        except client.ApiException as exc:
            if exc.status != 404:  # a test may have deleted it already
                raise


@pytest.fixture(scope="session")
def operator(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    install_crds(control_plane.kubeconfig)
    port = free_ports(1)[0]
    # shared gateways on (their RBAC in the chart, the flag below): only namespaces
    # annotated unwind.dev/shared-gateway=true get one (tests/cluster/test_shared_gateway.py)
    install_chart(control_plane.kubeconfig, {**local_values(port),
                                             "sharedGateway": {"enabled": True}})
    work = tmp_path_factory.mktemp("operator")
    sa = service_account_kubeconfig(control_plane, work / "sa.kubeconfig")
    op = OperatorProcess(sa, work / "operator.log", ("--bundle-window=0.3", f"--metrics-port={METRICS_PORT}",
                                                     # short lifetimes: renewals and takeovers
                                                     # happen during the tests, not in theory
                                                     "--webhook-cert-lifetime=20s", "--lease-duration=6",
                                                     "--key-check-seconds=1", "--gateway-image=unwind:test",
                                                     "--trusted-appliers=admin",
                                                     '--shared-gateways={"replicas": 2}'),
                        webhook_port=port).start()
    try:
        yield op
    finally:
        op.stop()
