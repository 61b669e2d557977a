"""Who owns a run, in a cluster (issue 17 #4 and #14): the EffectLedger records its owner in
``spec.owner`` when the run's first entry creates it, and the gateway's store checks it in
the same conditional write as each entry."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx2
import pytest
from gateway_fixtures import (
    ClusterGateway,
    agent_namespace,
    start_cluster_gateway,
)
from kubernetes import client

from gateway.conftest import UpstreamProc, running_upstream, stop
from gateway.test_rest import COMMENT
from unwind.controlplane import ControlPlane
from unwind.controlplane.dev import OperatorProcess

GROUP, VERSION = "unwind.dev", "v1alpha1"


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpstreamProc]:
    with running_upstream(tmp_path_factory.mktemp("upstream")) as up:
        yield up


@pytest.fixture(scope="module")
def agent_ns(operator: OperatorProcess, k8s_api: client.ApiClient, control_plane: ControlPlane,
             upstream: UpstreamProc) -> Iterator[tuple[str, str]]:
    with agent_namespace(k8s_api, control_plane, "own", upstream.url) as made:
        yield made


@pytest.fixture(scope="module")
def gateways(agent_ns: tuple[str, str], control_plane: ControlPlane, k8s_api: client.ApiClient,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ClusterGateway, ClusterGateway]]:
    """Two agents' gateways in one namespace: A (the pod's ServiceAccount) and B."""
    work = tmp_path_factory.mktemp("gateways")
    a = start_cluster_gateway(control_plane, k8s_api, agent_ns[0], agent_ns[1], work)
    b = start_cluster_gateway(control_plane, k8s_api, agent_ns[0], agent_ns[1], work,
                              "--actor", "agent-b")
    try:
        yield a, b
    finally:
        stop(a.proc)
        stop(b.proc)


def owner(api: client.ApiClient, ns: str, run: str) -> str:
    obj = client.CustomObjectsApi(api).get_namespaced_custom_object(GROUP, VERSION, ns, "effectledgers", run)
    return str(obj["spec"]["owner"])


def test_a_dry_run_does_not_claim_a_run_and_another_actors_gateway_can_neither_write_nor_read_it(
        gateways: tuple[ClusterGateway, ClusterGateway], upstream: UpstreamProc,
        k8s_api: client.ApiClient, agent_ns: tuple[str, str]) -> None:
    a, b = gateways
    run = f"r-{uuid.uuid4().hex[:8]}"
    comment = {**COMMENT, "client_id": run}
    assert b.call("github.create_comment", comment, run=run, dry_run=True).status_code == 200
    assert a.call("github.create_comment", comment, run=run, key="a-1").status_code == 200
    assert owner(k8s_api, agent_ns[0], run) == f"system:serviceaccount:{agent_ns[0]}:agent"
    stolen = b.call("github.create_comment", {**comment, "client_id": "b"}, run=run, key="b-1")
    assert stolen.status_code == 403 and stolen.json()["error"]["code"] == "permission_denied"
    assert httpx2.get(f"{b.url}/calls/{run}/a-1", timeout=10).status_code == 403
    assert httpx2.get(f"{a.url}/calls/{run}/a-1", timeout=10).status_code == 200
    assert [e["id"] for e in a.entries(run)] == ["a-1"]
    assert upstream.count("comments.create") == 1


def test_two_gateways_first_calls_on_a_brand_new_run_leave_it_to_one_actor(
        gateways: tuple[ClusterGateway, ClusterGateway], k8s_api: client.ApiClient,
        agent_ns: tuple[str, str]) -> None:
    a, b = gateways
    for n in range(4):
        run = f"new-{n}-{uuid.uuid4().hex[:6]}"

        def first(gw: ClusterGateway, run: str = run) -> int:
            return gw.call("github.get_issue", {"number": 1}, run=run).status_code

        with ThreadPoolExecutor(2) as pool:
            codes = list(pool.map(first, (a, b)))
        assert sorted(codes) == [403, 502], codes
        winner = owner(k8s_api, agent_ns[0], run)
        assert {e["actor"] for e in a.entries(run)} == {winner}
        assert len(a.entries(run)) == 1


def test_the_owner_of_a_run_cannot_be_edited_afterwards(
        gateways: tuple[ClusterGateway, ClusterGateway], k8s_api: client.ApiClient,
        agent_ns: tuple[str, str]) -> None:
    a, _ = gateways
    run = f"fixed-{uuid.uuid4().hex[:8]}"
    assert a.call("github.get_issue", {"number": 1}, run=run).status_code == 502
    objs = client.CustomObjectsApi(k8s_api)
    with pytest.raises(client.ApiException) as refused:
        objs.patch_namespaced_custom_object(GROUP, VERSION, agent_ns[0], "effectledgers", run,
                                            {"spec": {"owner": "agent-b"}})
    assert refused.value.status == 422 and "spec.owner" in str(refused.value.body)
