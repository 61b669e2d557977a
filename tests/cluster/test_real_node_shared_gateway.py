"""The shared gateway on the real node: the chart's operator (sharedGateway enabled) makes a
namespace's Deployment of two gateways, which the kubelet runs from the project's image
under Pod Security "restricted"; an agent's projected-style token (TokenRequest, audience
unwind-gateway) is proved by the API server's TokenReview from inside the pods, the ledger
records the agent's ServiceAccount, a call without a token is 401, and a replica deleted
between calls is replaced with nothing lost or run twice; with the chart's
``sharedGateway.otelEndpoint``, the replicas' spans reach an OTLP/HTTP receiver on the
node's address (tests/gateway/otlp_receiver.py, decoding the real export requests) with
the caller's parent and Unwind's attributes.

A dev cluster of its own (test_real_node.py's fixtures, one node per machine).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import test_real_node as node
import yaml
from cluster_helpers import wait_for
from kubernetes import client

from unwind.controlplane.dev import (
    OPERATOR_DEPLOYMENT,
    OPERATOR_NAMESPACE,
    install_chart,
    kubectl,
    node_values,
)

dev, kc, api, manifests = node.dev, node.kc, node.api, node.manifests  # its fixtures, for this module
NS, NAME, AGENT = "code-hosting", "unwind-gateway", "demo-agent"
ACTOR = f"system:serviceaccount:{NS}:{AGENT}"


@pytest.fixture(scope="module")
def shared(kc: Path, api: client.ApiClient, manifests: None) -> list[str]:
    """The pod IPs of the namespace's two ready shared gateways."""
    install_chart(kc, {**node_values(), "sharedGateway": {"enabled": True, "replicas": 2}})
    kubectl(kc, "-n", OPERATOR_NAMESPACE, "rollout", "status", f"deploy/{OPERATOR_DEPLOYMENT}",
            "--timeout=240s", timeout=260)
    kubectl(kc, "apply", "-f", "-", input_text=yaml.safe_dump_all(node.demo_account()))
    client.CoreV1Api(api).patch_namespace(NS, {"metadata": {"annotations": {
        "unwind.dev/shared-gateway": "true"}}})
    wait_for("the shared gateway's Deployment", lambda: NAME in kubectl(
        kc, "-n", NS, "get", "deployments", "-o", "name"), timeout=120)
    kubectl(kc, "-n", NS, "rollout", "status", f"deploy/{NAME}", "--timeout=240s", timeout=260)
    return pod_ips(api)


def pod_ips(api: client.ApiClient) -> list[str]:
    pods = client.CoreV1Api(api).list_namespaced_pod(
        NS, label_selector=f"app.kubernetes.io/name={NAME}").items
    return sorted(p.status.pod_ip for p in pods if p.status.phase == "Running"
                  and p.metadata.deletion_timestamp is None and all(
                      c.ready for c in p.status.container_statuses or []))


def token(api: client.ApiClient) -> str:
    made = client.CoreV1Api(api).create_namespaced_service_account_token(
        AGENT, NS, {"spec": {"audiences": [NAME], "expirationSeconds": 600}})
    return str(made.status.token)


def call(ip: str, bearer: str | None, run: str, key: str, client_id: str,
         traceparent: str | None = None) -> tuple[int, dict[str, Any]]:
    body = json.dumps({"arguments": {"repo": "octo/hello", "issue": 7, "client_id": client_id,
                                     "body": "from the shared gateway"}}).encode()
    # to a pod's address, as the Service's name (the Host an agent sends; others are 421)
    headers = {"Content-Type": "application/json", "X-Unwind-Run": run, "Idempotency-Key": key,
               "Host": f"{NAME}.{NS}.svc:8787"}
    if bearer:
        headers["Authorization"] = f"Bearer {bearer}"
    if traceparent:
        headers["traceparent"] = traceparent
    request = urllib.request.Request(f"http://{ip}:8787/call/github.create_comment", body, headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return int(r.status), json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return int(exc.code), json.loads(exc.read() or b"{}")


def entries(api: client.ApiClient, run: str) -> list[dict[str, Any]]:
    obj = client.CustomObjectsApi(api).get_namespaced_custom_object(
        "unwind.dev", "v1alpha1", NS, "effectledgers", run)
    return list((obj.get("status") or {}).get("entries") or [])


def test_the_shared_gateways_run_on_the_node_as_their_own_identity_under_restricted(
        shared: list[str], api: client.ApiClient) -> None:
    assert len(shared) == 2
    pods = client.CoreV1Api(api).list_namespaced_pod(
        NS, label_selector=f"app.kubernetes.io/name={NAME}").items
    for pod in pods:
        assert pod.spec.service_account_name == NAME
        assert all(s.container_id.startswith("containerd://") for s in pod.status.container_statuses)
    labels = client.CoreV1Api(api).read_namespace(NS).metadata.labels
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


def test_an_agent_is_proved_by_its_token_at_either_replica_and_recorded_as_its_serviceaccount(
        shared: list[str], api: client.ApiClient) -> None:
    bearer = token(api)
    for i, ip in enumerate(shared):
        status, body = call(ip, bearer, "shared-node-1", f"either-{i}", f"either-{i}")
        assert status == 200, body
    assert {(e["actor"], e["state"]) for e in entries(api, "shared-node-1")} == {(ACTOR, "succeeded")}
    status, body = call(shared[0], None, "shared-node-1", "no-token", "no-token")
    assert status == 401 and body["error"]["code"] == "unauthorized", body


def test_a_replica_deleted_between_calls_is_replaced_and_nothing_is_lost_or_run_twice(
        shared: list[str], kc: Path, api: client.ApiClient) -> None:
    bearer = token(api)
    status, _ = call(shared[0], bearer, "shared-node-2", "before", "before")
    assert status == 200
    made = comments_created()
    victim = next(p for p in client.CoreV1Api(api).list_namespaced_pod(
        NS, label_selector=f"app.kubernetes.io/name={NAME}").items if p.status.pod_ip == shared[0])
    client.CoreV1Api(api).delete_namespaced_pod(victim.metadata.name, NS, grace_period_seconds=0)

    def replaced() -> list[str] | None:
        ips = pod_ips(api)
        return ips if len(ips) == 2 and shared[0] not in ips else None
    now = wait_for("two ready replicas again, one of them new", replaced, timeout=180)
    for ip in now:  # the repeat of "before", at either replica, is refused: a call runs once
        status, body = call(ip, bearer, "shared-node-2", "before", "before")
        assert status == 409 and body["error"]["code"] == "duplicate", body
    assert comments_created() == made
    status, _ = call(now[0], bearer, "shared-node-2", "after", "after")
    assert status == 200
    got = {e["id"]: e for e in entries(api, "shared-node-2")}
    assert (got.pop("before")["state"], got.pop("after")["state"]) == ("succeeded", "succeeded")
    # the two refused repeats are recorded as refused, under ids of their own
    assert [(e["state"], e["actor"]) for e in got.values()] == [("refused", ACTOR)] * 2, got
    assert comments_created() == made + 1


def comments_created() -> int:
    return sum(1 for r in node.upstream_requests() if r.get("route") == "comments.create")


OTLP_SERVICE = "10.0.0.89"  # a fixed ClusterIP, as examples/upstream-service.yaml has


def test_the_replicas_traces_reach_an_otlp_receiver_with_the_callers_parent_and_attributes(
        shared: list[str], kc: Path, api: client.ApiClient) -> None:
    from gateway.otlp_receiver import Receiver
    from unwind.controlplane import kubenode

    receiver = Receiver(host=kubenode.NODE_ADDRESS)
    try:
        kubectl(kc, "apply", "-f", "-", input_text=yaml.safe_dump_all([
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "otlp", "namespace": NS},
             "spec": {"clusterIP": OTLP_SERVICE, "ports": [
                 {"name": "http", "port": 4318, "targetPort": receiver.port}]}},
            {"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "otlp", "namespace": NS},
             "subsets": [{"addresses": [{"ip": kubenode.NODE_ADDRESS}],
                          "ports": [{"name": "http", "port": receiver.port}]}]}]))
        install_chart(kc, {**node_values(), "sharedGateway": {
            "enabled": True, "replicas": 2, "otelEndpoint": f"http://{OTLP_SERVICE}:4318"}})
        kubectl(kc, "-n", OPERATOR_NAMESPACE, "rollout", "status",
                f"deploy/{OPERATOR_DEPLOYMENT}", "--timeout=240s", timeout=260)
        wait_for("the Deployment to carry the endpoint", lambda: OTLP_SERVICE in kubectl(
            kc, "-n", NS, "get", "deploy", NAME, "-o", "jsonpath={.spec.template.spec.containers[0].env}"),
            timeout=120)
        kubectl(kc, "-n", NS, "rollout", "status", f"deploy/{NAME}", "--timeout=240s", timeout=260)
        ip = wait_for("two ready replicas", lambda: (ips := pod_ips(api)) and len(ips) == 2 and ips,
                      timeout=120)[0]
        trace, parent = "7bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
        status, body = call(ip, token(api), "shared-node-3", "traced", "traced",
                            traceparent=f"00-{trace}-{parent}-01")
        assert status == 200, body
        [server] = receiver.wait(lambda s: s.kind == "SERVER" and s.trace_id == trace, 60)
        assert server.parent_id == parent and server.service == NAME
        assert server.name == "execute_tool github.create_comment"
        assert server.attributes["unwind.entry.id"] == "traced"
        assert server.attributes["unwind.actor"] == ACTOR
        assert server.attributes["unwind.run"] == "shared-node-3"
        children = receiver.wait(lambda s: s.parent_id == server.span_id and s.kind == "CLIENT"
                                 and len([c for c in receiver.spans if c.parent_id == server.span_id]) >= 3, 30)
        assert "POST github.create_comment" in {c.name for c in children}
        [entry] = entries(api, "shared-node-3")  # what its undo Jobs would continue
        assert entry["traceparent"] == f"00-{trace}-{server.span_id}-01"
    finally:
        receiver.close()
