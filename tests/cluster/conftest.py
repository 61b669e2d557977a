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
from kubernetes import client, config

from unwind.controlplane import BuildError, ControlPlane, ensure_binaries

HERE = Path(__file__).parent.resolve()


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
    cp = ControlPlane(bins=bins, die_with_parent=True)
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
    try:
        yield name
    finally:
        core.delete_namespace(name)  # finalized asynchronously by the namespace controller
