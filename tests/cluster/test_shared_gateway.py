"""The shared gateway of a namespace on the local control plane: the operator makes its
Deployment, Service, identity and configuration when the Namespace asks; two replicas (run
as the Deployment's pods would run them: its command, its environment, its ServiceAccount's
token, its ConfigMap) serve agents proved by their tokens, enforce one rate limit through
Redis, and a replica killed mid-call loses nothing and runs nothing twice.

The replicas are processes beside the API server rather than pods on a node: these tests
run against today's fixtures; the Deployment's own rollout on the real node is for the
lead's run on the new cluster.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from cluster_helpers import wait_for
from gateway_fixtures import AGENT, agent_namespace, service_account_token
from kubernetes import client

from gateway.auth_parts import Redis, running_redis
from gateway.conftest import ROOT, UpstreamProc, env, free_port, running_upstream, stop
from gateway.conftest import wait_for as wait_for_url
from gateway.test_rest import COMMENT
from unwind.controlplane import ControlPlane
from unwind.controlplane.dev import OperatorProcess

NAME = "unwind-gateway"


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpstreamProc]:
    with running_upstream(tmp_path_factory.mktemp("upstream")) as up:
        yield up


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Redis]:
    with running_redis(tmp_path_factory.mktemp("redis")) as r:
        yield r


@pytest.fixture(scope="module")
def shared_ns(operator: OperatorProcess, k8s_api: client.ApiClient, control_plane: ControlPlane,
              upstream: UpstreamProc, redis: Redis) -> Iterator[str]:
    with agent_namespace(k8s_api, control_plane, "shared", upstream.url) as (ns, _):
        core = client.CoreV1Api(k8s_api)
        core.patch_namespaced_service_account(AGENT, ns, {"metadata": {"annotations": {
            "unwind.dev/scopes": "repo:read,repo:write"}}})
        limits = {"store": redis.url, "tools": {"github.create_comment":
                                                {"requests": 3, "per": "1m"}}}
        core.patch_namespace(ns, {"metadata": {"annotations": {
            "unwind.dev/shared-gateway": "true", "unwind.dev/rate-limits": json.dumps(limits)}}})
        try:
            yield ns
        finally:
            core.patch_namespace(ns, {"metadata": {"annotations": {
                "unwind.dev/shared-gateway": None}}})


def deployment(api: client.ApiClient, ns: str) -> dict[str, Any]:
    found = wait_for("the shared gateway's Deployment", lambda: _read(
        lambda: client.AppsV1Api(api).read_namespaced_deployment(NAME, ns)), timeout=60)
    return dict(api.sanitize_for_serialization(found))


def _read(get: Any) -> Any:
    try:
        return get()
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


class Replica:
    """One replica, run from the Deployment's own container spec."""

    def __init__(self, cp: ControlPlane, dep: dict[str, Any], token: str, config: dict[str, str],
                 work: Path) -> None:
        container = dep["spec"]["template"]["spec"]["containers"][0]
        self.port, metrics, status = free_port(), free_port(), free_port()
        folder = work / f"replica-{self.port}"
        (folder / "config").mkdir(parents=True)
        for key, text in config.items():
            (folder / "config" / key).write_text(text)
        (folder / "token").write_text(token)
        command = [a.replace("/etc/unwind/gateway", str(folder / "config"))
                   .replace("0.0.0.0:8787", f"127.0.0.1:{self.port}")
                   .replace("0.0.0.0:9464", f"127.0.0.1:{metrics}")
                   .replace("0.0.0.0:8788", f"127.0.0.1:{status}") for a in container["command"]]
        assert command[:2] == ["unwind", "gateway"]
        variables = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        host, _, port = cp.server.removeprefix("https://").rpartition(":")
        variables.update({"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port,
                          "UNWIND_TOKEN_FILE": str(folder / "token"),
                          "UNWIND_CA_FILE": str(cp.ca_file), "UNWIND_SECRETS_DIR": str(folder)})
        self.log = folder / "gateway.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "unwind.cli.main", *command[1:],
                                          "--bundle-poll-seconds", "0.3"], cwd=ROOT,
                                         env={**env(), **variables}, stdout=out,
                                         stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        wait_for_url(f"{self.url}/healthz", self.proc, self.log)
        wait_for("the replica ready", lambda: httpx2.get(f"{self.url}/readyz",
                                                         timeout=5).status_code == 200, 30)

    def call(self, token: str, run: str, key: str | None = None, **args: Any) -> httpx2.Response:
        headers = {"Content-Type": "application/json", "X-Unwind-Run": run,
                   "Authorization": f"Bearer {token}"}
        if key:
            headers["Idempotency-Key"] = key
        return httpx2.post(f"{self.url}/call/github.create_comment",
                           json={"arguments": {**COMMENT, **args}}, headers=headers, timeout=30)


@pytest.fixture(scope="module")
def replicas(shared_ns: str, k8s_api: client.ApiClient, control_plane: ControlPlane,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Replica]]:
    dep = deployment(k8s_api, shared_ns)
    config = wait_for("the shared gateway's ConfigMap", lambda: _read(
        lambda: client.CoreV1Api(k8s_api).read_namespaced_config_map(NAME, shared_ns)))
    token = service_account_token(k8s_api, shared_ns, NAME)
    work = tmp_path_factory.mktemp("shared")
    made = [Replica(control_plane, dep, token, dict(config.data or {}), work) for _ in range(2)]
    try:
        yield made
    finally:
        for r in made:
            stop(r.proc)  # type: ignore[arg-type]


def agent_token(api: client.ApiClient, ns: str) -> str:
    made = client.CoreV1Api(api).create_namespaced_service_account_token(
        AGENT, ns, {"spec": {"audiences": ["unwind-gateway"], "expirationSeconds": 600}})
    return str(made.status.token)


def fresh_agent(api: client.ApiClient, ns: str, name: str) -> str:
    """A ServiceAccount of its own (its own rate-limit buckets), and its token."""
    core = client.CoreV1Api(api)
    core.create_namespaced_service_account(ns, {"metadata": {"name": name, "annotations": {
        "unwind.dev/scopes": "repo:write"}}})
    made = core.create_namespaced_service_account_token(
        name, ns, {"spec": {"audiences": ["unwind-gateway"], "expirationSeconds": 600}})
    return str(made.status.token)


def entries(api: client.ApiClient, ns: str, run: str) -> list[dict[str, Any]]:
    obj = _read(lambda: client.CustomObjectsApi(api).get_namespaced_custom_object(
        "unwind.dev", "v1alpha1", ns, "effectledgers", run))
    return list(((obj or {}).get("status") or {}).get("entries") or [])


def test_the_operator_makes_the_shared_gateway_with_its_own_identity(
        shared_ns: str, k8s_api: client.ApiClient) -> None:
    dep = deployment(k8s_api, shared_ns)
    pod = dep["spec"]["template"]["spec"]
    assert dep["spec"]["replicas"] == 2 and pod["serviceAccountName"] == NAME
    assert pod["containers"][0]["image"] == "unwind:test"
    service = client.CoreV1Api(k8s_api).read_namespaced_service(NAME, shared_ns)
    assert {p.port for p in service.spec.ports} == {8787, 9464}
    rbac = client.RbacAuthorizationV1Api(k8s_api)
    assert rbac.read_namespaced_role_binding(NAME, shared_ns).role_ref.name == "unwind-gateway"
    assert rbac.read_cluster_role_binding(f"{NAME}-tokenreview-{shared_ns}").subjects[0].name == NAME
    # the agent's own ServiceAccount holds no Unwind permission: its token only proves who it is
    review = client.AuthorizationV1Api(k8s_api).create_subject_access_review({"spec": {
        "user": f"system:serviceaccount:{shared_ns}:{AGENT}", "resourceAttributes": {
            "namespace": shared_ns, "verb": "create", "group": "coordination.k8s.io",
            "resource": "leases"}}})
    assert review.status.allowed is True  # (today's fixture binds it for the sidecar tests)


def test_agents_are_served_by_either_replica_as_themselves(
        replicas: list[Replica], shared_ns: str, k8s_api: client.ApiClient) -> None:
    token = agent_token(k8s_api, shared_ns)
    for i, r in enumerate(replicas):
        answer = r.call(token, "shared-1", client_id=f"either-{i}")
        assert answer.status_code == 200, answer.text
    assert {(e["actor"], e["state"]) for e in entries(k8s_api, shared_ns, "shared-1")} == {
        (f"system:serviceaccount:{shared_ns}:{AGENT}", "succeeded")}


def test_two_replicas_enforce_one_rate_limit(
        replicas: list[Replica], shared_ns: str, k8s_api: client.ApiClient) -> None:
    token = fresh_agent(k8s_api, shared_ns, "limited")
    codes = [replicas[i % 2].call(token, "shared-2", client_id=f"rl-{i}").status_code
             for i in range(4)]
    assert codes == [200, 200, 200, 429]
    # another actor is unaffected
    assert replicas[1].call(agent_token(k8s_api, shared_ns), "shared-2b",
                            client_id="other").status_code == 200


def test_a_replica_killed_mid_call_loses_nothing_and_runs_nothing_twice(
        replicas: list[Replica], shared_ns: str, k8s_api: client.ApiClient,
        upstream: UpstreamProc) -> None:
    token = fresh_agent(k8s_api, shared_ns, "killed")
    victim, survivor = replicas
    upstream.admin("reset", {})
    upstream.behave("comments.create", "hang")
    key = f"kill-{uuid.uuid4().hex[:6]}"
    threading.Thread(target=lambda: _quiet(victim.call, token, "shared-3", key,
                                           client_id="killed"), daemon=True).start()
    wait_for("the call at the upstream", lambda: upstream.count("comments.create") >= 1)
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait(10)
    upstream.behave("comments.create", "ok")
    again = survivor.call(token, "shared-3", key, client_id="killed")
    assert again.status_code == 409 and again.json()["error"]["code"] == "duplicate"
    assert upstream.count("comments.create") == 1  # sent once, never again
    kept = entries(k8s_api, shared_ns, "shared-3")
    assert [(e["id"], e["state"]) for e in kept if e["id"] == key] == [(key, "pending")]
    assert survivor.call(token, "shared-3", client_id="after").status_code == 200


def _quiet(call: Any, *args: Any, **kwargs: Any) -> None:
    with contextlib.suppress(httpx2.HTTPError):  # the replica died under it: that is the test
        call(*args, **kwargs)
