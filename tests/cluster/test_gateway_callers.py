"""A gateway that authenticates its callers (`unwind gateway --cluster --auth kubernetes`,
the shared gateway's mode) against the real API server's TokenReview: an agent proved by its
projected, pod-bound ServiceAccount token; tokens of another audience, expired, or of a
deleted pod refused; the actor recorded is the token's ServiceAccount.

The gateway runs under a ServiceAccount `unwind-gateway` of the namespace bound to the
chart's ClusterRoles unwind-gateway (RoleBinding), unwind-gateway-callers (RoleBinding) and
unwind-gateway-tokenreview (ClusterRoleBinding), as the shared gateway's identity is.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import jwt
import pytest
from cluster_helpers import wait_for
from gateway_fixtures import (
    AGENT,
    ClusterGateway,
    agent_namespace,
    service_account_token,
    start_cluster_gateway,
)
from kubernetes import client

from gateway.conftest import UpstreamProc, free_port, running_upstream, stop
from gateway.test_rest import COMMENT
from unwind.controlplane import ControlPlane
from unwind.controlplane.cluster import pki_files
from unwind.controlplane.dev import OperatorProcess

IDENTITY = "unwind-gateway"
AUDIENCE = "unwind-gateway"


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpstreamProc]:
    with running_upstream(tmp_path_factory.mktemp("upstream")) as up:
        yield up


def absent(create: Any) -> None:
    """Create an object unless it is there already (409)."""
    try:
        create()
    except client.ApiException as exc:
        if exc.status != 409:
            raise


@pytest.fixture(scope="module")
def agent_ns(operator: OperatorProcess, k8s_api: client.ApiClient, control_plane: ControlPlane,
             upstream: UpstreamProc) -> Iterator[str]:
    with agent_namespace(k8s_api, control_plane, "callers", upstream.url) as (ns, _):
        core = client.CoreV1Api(k8s_api)
        core.patch_namespaced_service_account(AGENT, ns, {"metadata": {"annotations": {
            "unwind.dev/scopes": "repo:read,repo:write"}}})
        rbac = client.RbacAuthorizationV1Api(k8s_api)
        # The operator keeps the namespace's gateway identity (ServiceAccount and its
        # RoleBinding unwind-gateway) and may have made it first: create what it has not yet.
        absent(lambda: core.create_namespaced_service_account(ns, {"metadata": {"name": IDENTITY}}))
        for role in ("unwind-gateway", "unwind-gateway-callers"):
            absent(lambda role=role: rbac.create_namespaced_role_binding(ns, {
                "metadata": {"name": role},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": IDENTITY, "namespace": ns}]}))
        binding = f"unwind-gateway-tokenreview-{ns}"
        rbac.create_cluster_role_binding({
            "metadata": {"name": binding},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "unwind-gateway-tokenreview"},
            "subjects": [{"kind": "ServiceAccount", "name": IDENTITY, "namespace": ns}]})
        try:
            yield ns
        finally:
            rbac.delete_cluster_role_binding(binding)


@pytest.fixture(scope="module")
def gateway(agent_ns: str, control_plane: ControlPlane, k8s_api: client.ApiClient,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterGateway]:
    token = service_account_token(k8s_api, agent_ns, IDENTITY)
    metrics = free_port()
    gw = start_cluster_gateway(control_plane, k8s_api, agent_ns, token,
                               tmp_path_factory.mktemp("gateway"), "--auth", "kubernetes",
                               "--token-review-ttl", "3", "--metrics-listen",
                               f"0.0.0.0:{metrics}", scopes="")
    gw.extra["metrics"] = f"http://127.0.0.1:{metrics}/metrics"
    try:
        yield gw
    finally:
        stop(gw.proc)


def agent_pod(api: client.ApiClient, ns: str) -> tuple[str, str]:
    """A pod of the agent's ServiceAccount (it need not run: a token is bound to the object)."""
    name = f"agent-{uuid.uuid4().hex[:6]}"
    pod = client.CoreV1Api(api).create_namespaced_pod(ns, {
        "metadata": {"name": name},
        "spec": {"serviceAccountName": AGENT, "automountServiceAccountToken": False,
                 "containers": [{"name": "agent", "image": "unwind:test"}]}})
    return name, pod.metadata.uid


def bound_token(api: client.ApiClient, ns: str, pod: tuple[str, str] | None,
                audience: str | None = AUDIENCE) -> str:
    spec: dict[str, Any] = {"expirationSeconds": 600}
    if audience is not None:
        spec["audiences"] = [audience]
    if pod is not None:
        spec["boundObjectRef"] = {"kind": "Pod", "apiVersion": "v1", "name": pod[0],
                                  "uid": pod[1]}
    made = client.CoreV1Api(api).create_namespaced_service_account_token(
        AGENT, ns, {"spec": spec})
    return str(made.status.token)


def call(gw: ClusterGateway, token: str, run: str, **args: Any) -> httpx2.Response:
    return httpx2.post(f"{gw.url}/call/github.create_comment",
                       json={"arguments": {**COMMENT, **args}}, timeout=30,
                       headers={"Content-Type": "application/json", "X-Unwind-Run": run,
                                "Authorization": f"Bearer {token}"})


def test_an_in_cluster_agent_is_authenticated_by_its_token_and_recorded_as_its_serviceaccount(
        gateway: ClusterGateway, agent_ns: str, k8s_api: client.ApiClient,
        upstream: UpstreamProc) -> None:
    token = bound_token(k8s_api, agent_ns, agent_pod(k8s_api, agent_ns))
    r = call(gateway, token, "callers-1")
    assert r.status_code == 200, r.text
    assert [(e["actor"], e["state"]) for e in gateway.entries("callers-1")] == [
        (f"system:serviceaccount:{agent_ns}:{AGENT}", "succeeded")]
    sent = [q for q in upstream.admin("requests")["requests"] if q["route"] == "comments.create"]
    assert sent and all(token not in str(q.get("authorization")) for q in sent)


def test_a_token_of_another_audience_is_refused(
        gateway: ClusterGateway, agent_ns: str, k8s_api: client.ApiClient) -> None:
    token = bound_token(k8s_api, agent_ns, agent_pod(k8s_api, agent_ns), audience=None)
    r = call(gateway, token, "callers-2")
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    assert gateway.entries("callers-2") == []


def test_an_expired_token_signed_by_the_cluster_is_refused(
        gateway: ClusterGateway, agent_ns: str, k8s_api: client.ApiClient,
        control_plane: ControlPlane) -> None:
    sa = client.CoreV1Api(k8s_api).read_namespaced_service_account(AGENT, agent_ns)
    now = int(time.time())
    claims = {"iss": "https://kubernetes.default.svc", "aud": [AUDIENCE], "iat": now - 7200,
              "nbf": now - 7200, "exp": now - 3600,
              "sub": f"system:serviceaccount:{agent_ns}:{AGENT}",
              "kubernetes.io": {"namespace": agent_ns,
                                "serviceaccount": {"name": AGENT, "uid": sa.metadata.uid}}}
    key = Path(pki_files(control_plane.workdir / "pki").sa_key).read_bytes()
    r = call(gateway, jwt.encode(claims, key, algorithm="RS256"), "callers-3")
    assert r.status_code == 401, r.text


def test_a_deleted_pods_token_is_refused_within_the_review_ttl(
        gateway: ClusterGateway, agent_ns: str, k8s_api: client.ApiClient) -> None:
    pod = agent_pod(k8s_api, agent_ns)
    token = bound_token(k8s_api, agent_ns, pod)
    assert call(gateway, token, "callers-4", client_id="d1").status_code == 200
    client.CoreV1Api(k8s_api).delete_namespaced_pod(pod[0], agent_ns, grace_period_seconds=0)
    wait_for("the pod gone", lambda: not [
        p for p in client.CoreV1Api(k8s_api).list_namespaced_pod(agent_ns).items
        if p.metadata.name == pod[0]], timeout=30)
    gone = time.monotonic()
    answers: list[int] = []

    def refused() -> bool:
        answers.append(call(gateway, token, "callers-4", client_id=f"d{len(answers) + 2}")
                       .status_code)
        return answers[-1] == 401
    wait_for("the deleted pod's token refused", refused, timeout=40)
    # our review TTL (3 s here) plus the API server's own cache of token authentications
    # (10 s for an accepted token), plus the time calls take here
    assert time.monotonic() - gone <= 3 + 10 + 5


def test_a_call_without_a_token_is_401_and_the_probes_answer(gateway: ClusterGateway) -> None:
    r = httpx2.post(f"{gateway.url}/call/github.create_comment", json={"arguments": COMMENT},
                    headers={"Content-Type": "application/json", "X-Unwind-Run": "callers-5"},
                    timeout=10)
    assert r.status_code == 401 and r.headers["WWW-Authenticate"].startswith("Bearer realm=")
    assert httpx2.get(f"{gateway.url}/readyz", timeout=10).status_code == 200


def test_the_metrics_port_serves_only_scrapers_the_api_server_lets_get_metrics(
        gateway: ClusterGateway, agent_ns: str, k8s_api: client.ApiClient) -> None:
    url = gateway.extra["metrics"]
    assert httpx2.get(url, timeout=10).status_code == 401
    agent = bound_token(k8s_api, agent_ns, None, audience=None)
    assert httpx2.get(url, headers={"Authorization": f"Bearer {agent}"},
                      timeout=10).status_code == 403
    rbac = client.RbacAuthorizationV1Api(k8s_api)
    core = client.CoreV1Api(k8s_api)
    core.create_namespaced_service_account(agent_ns, {"metadata": {"name": "scraper"}})
    name = f"metrics-reader-{agent_ns}"
    rbac.create_cluster_role({"metadata": {"name": name}, "rules": [
        {"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]})
    rbac.create_cluster_role_binding({"metadata": {"name": name}, "roleRef": {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": agent_ns}]})
    try:
        scraper = str(core.create_namespaced_service_account_token(
            "scraper", agent_ns, {"spec": {"expirationSeconds": 600}}).status.token)
        r = wait_for("the scraper admitted", lambda: (lambda r: r if r.status_code == 200
                     else None)(httpx2.get(url, headers={"Authorization": f"Bearer {scraper}"},
                                           timeout=10)), timeout=20)
        assert "unwind_gateway_calls_total" in r.text
    finally:
        rbac.delete_cluster_role_binding(name)
        rbac.delete_cluster_role(name)
