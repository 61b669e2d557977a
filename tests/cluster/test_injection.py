"""Sidecar injection by the operator's mutating webhook, and the kubelet stand-in that runs
pods on the local control plane (volumes, tokens, env, mounts only where mounted)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from cluster_helpers import apply, enforced, tm, wait_for
from kubernetes import client

from unwind.controlplane.dev import OperatorProcess
from unwind.controlplane.kubelet import PodRunner
from unwind.operator.inject import CONTAINER

SHOP = {"tool": "shop.get_order", "effect": "read_only", "permission": "shop:read",
        "upstream": {"url": "http://127.0.0.1:8788/orders/{{args.id}}", "method": "GET",
                     "headers": {"Authorization": {"secretKeyRef": {"name": "shop-api", "key": "token"}}}}}


def labelled_pod(name: str, command: list[str], **extra: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"unwind.dev/inject": "true"}, **extra},
            "spec": {"serviceAccountName": "agent", "restartPolicy": "Never",
                     "containers": [{"name": "agent", "image": "agent:1", "command": command}]}}


def test_a_labelled_pod_gets_the_gateway_and_the_agent_keeps_no_token_and_no_secret(
        operator: OperatorProcess, kubeconfig: Path, k8s_api: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(k8s_api)
    core.create_namespaced_service_account(namespace, {"metadata": {
        "name": "agent", "annotations": {"unwind.dev/scopes": "shop:read"}}})
    core.create_namespaced_secret(namespace, {"metadata": {"name": "shop-api"}, "stringData": {"token": "s3cret"}})
    apply(kubeconfig, namespace, tm("get-order", SHOP))
    wait_for("published", lambda: enforced(k8s_api, namespace) == {"shop.get_order": 1})
    pod = core.create_namespaced_pod(namespace, labelled_pod("agent-1", ["sleep", "1"]))
    spec = pod.spec
    # a native sidecar on this server (1.29 and later): the first init container, restarted
    # by the kubelet, started before the agent once its startup probe passes
    assert [c.name for c in spec.containers] == ["agent"]
    (agent,), (gateway, *_) = spec.containers, spec.init_containers
    assert gateway.name == CONTAINER and gateway.restart_policy == "Always"
    assert gateway.startup_probe is not None
    assert spec.automount_service_account_token is False
    assert not [m for m in agent.volume_mounts or [] if "serviceaccount" in m.mount_path]
    env = {e.name: e.value for e in gateway.env}
    assert env["UNWIND_SCOPES"] == "shop:read"
    assert env["UNWIND_ACTOR"] == f"system:serviceaccount:{namespace}:agent"
    assert {m.mount_path for m in gateway.volume_mounts} >= {"/var/run/secrets/unwind", "/etc/unwind/secrets/shop-api"}
    assert not {m.mount_path for m in agent.volume_mounts or []} & {"/var/run/secrets/unwind", "/etc/unwind/secrets/shop-api"}
    unlabelled = core.create_namespaced_pod(namespace, {**labelled_pod("plain", ["sleep", "1"]),
                                                        "metadata": {"name": "plain"}})
    assert [c.name for c in unlabelled.spec.containers] == ["agent"]


def test_the_kubelet_stand_in_gives_each_container_only_the_volumes_it_mounts(
        operator: OperatorProcess, k8s_api: client.ApiClient, namespace: str, tmp_path: Path) -> None:
    core = client.CoreV1Api(k8s_api)
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "settings"}, "data": {"mode": "one"}})
    script = ("import os, sys, time\n"
              "path = sys.argv[1]\n"
              "deadline = time.time() + 20\n"
              "while time.time() < deadline:\n"
              "    if os.path.exists(path) and open(path).read() == 'two': break\n"
              "    time.sleep(0.2)\n"
              "print('seen', open(path).read(), 'token' if os.path.exists(os.environ.get('TOKEN', '/nope')) else 'none',"
              " os.environ['POD'], os.environ['KUBERNETES_SERVICE_HOST'])\n")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "runner"},
           "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False,
                    "volumes": [{"name": "settings", "configMap": {"name": "settings"}},
                                {"name": "token", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}],
                    "containers": [
                        {"name": "reader", "image": "x", "command": [sys.executable, "-c", script, "/conf/mode"],
                         "env": [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                                 {"name": "TOKEN", "value": "/tok/t"}],
                         "volumeMounts": [{"name": "settings", "mountPath": "/conf"}]},
                        {"name": "holder", "image": "x", "command": [sys.executable, "-c",
                         "import os; print('token' if os.path.getsize(os.environ['TOKEN']) > 20 else 'empty')"],
                         "env": [{"name": "TOKEN", "value": "/tok/t"}],
                         "volumeMounts": [{"name": "token", "mountPath": "/tok"}]}]}}
    core.create_namespaced_pod(namespace, pod)
    with PodRunner(k8s_api, namespace, "runner") as runner:
        time.sleep(1)
        core.patch_namespaced_config_map("settings", namespace, {"data": {"mode": "two"}})
        assert runner.wait("reader", 30) == 0 and runner.wait("holder", 30) == 0
        out = runner.output("reader")
        assert "seen two none runner 127.0.0.1" in out  # updated file; no token where not mounted
        assert runner.output("holder").strip() == "token"
    status = wait_for("reported", lambda: (p := core.read_namespaced_pod("runner", namespace)).status.phase
                      == "Succeeded" and p)
    assert len(status.status.container_statuses) == 2


def test_a_labelled_pod_whose_spec_would_let_the_agent_around_its_gateway_is_refused_with_what_to_change(
        operator: OperatorProcess, k8s_api: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(k8s_api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "agent"}})
    shared = labelled_pod("shared", ["sleep", "1"])
    shared["spec"]["shareProcessNamespace"] = True
    shared["spec"]["containers"][0]["volumeMounts"] = [{"name": "unwind-token", "mountPath": "/steal"}]
    try:
        core.create_namespaced_pod(namespace, shared)
    except client.ApiException as exc:
        assert exc.status == 400
        message = json.loads(exc.body)["message"]
    else:
        raise AssertionError("a pod sharing its process namespace with the gateway was created")
    assert "spec.shareProcessNamespace: true lets the agent's containers read the gateway's token" in message
    assert "spec.containers[0].volumeMounts[0]: volume 'unwind-token' is the gateway's alone" in message
    assert "remove its label unwind.dev/inject=true" in message
    assert not core.list_namespaced_pod(namespace).items


def test_the_upstream_secret_in_a_labelled_pods_env_is_refused_by_the_api_server(
        operator: OperatorProcess, kubeconfig: Path, k8s_api: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(k8s_api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "agent"}})
    core.create_namespaced_secret(namespace, {"metadata": {"name": "shop-api"}, "stringData": {"token": "s3cret"}})
    apply(kubeconfig, namespace, tm("get-order", SHOP))
    wait_for("published", lambda: enforced(k8s_api, namespace) == {"shop.get_order": 1})
    pod = labelled_pod("leaky", ["sleep", "1"])
    pod["spec"]["containers"][0]["env"] = [
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "shop-api", "key": "token"}}}]
    try:
        core.create_namespaced_pod(namespace, pod)
    except client.ApiException as exc:
        assert exc.status == 400
        message = json.loads(exc.body)["message"]
    else:
        raise AssertionError("a labelled pod reading the upstream Secret into its agent's env was created")
    assert ("spec.containers[0].env[0].valueFrom.secretKeyRef: Secret 'shop-api' holds credentials this "
            "namespace's ToolManifests send upstream") in message


def test_a_labelled_pod_bringing_its_own_unwind_gateway_is_refused_by_the_api_server(
        operator: OperatorProcess, kubeconfig: Path, k8s_api: client.ApiClient, namespace: str) -> None:
    """Issue 29, item 8: before, such a pod was admitted untouched, the upstream Secret in its
    agent's env and scopes of its choosing; now the webhook's isolation check runs and the
    container is not taken for the gateway."""
    core = client.CoreV1Api(k8s_api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "agent"}})
    core.create_namespaced_secret(namespace, {"metadata": {"name": "shop-api"}, "stringData": {"token": "s3cret"}})
    apply(kubeconfig, namespace, tm("get-order", SHOP))
    wait_for("published", lambda: enforced(k8s_api, namespace) == {"shop.get_order": 1})
    pod = labelled_pod("impostor", ["sleep", "1"])
    pod["spec"]["containers"][0]["env"] = [
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "shop-api", "key": "token"}}}]
    pod["spec"]["containers"].append({"name": CONTAINER, "image": "agent:1", "command": ["sleep", "1"],
                                      "env": [{"name": "UNWIND_SCOPES", "value": "*"}]})
    try:
        core.create_namespaced_pod(namespace, pod)
    except client.ApiException as exc:
        assert exc.status == 400
        message = json.loads(exc.body)["message"]
    else:
        raise AssertionError("a labelled pod with a container of its own named unwind-gateway was created")
    assert "spec.containers[1]: this pod brings its own container named unwind-gateway" in message
    assert not core.list_namespaced_pod(namespace).items


def test_with_the_operator_down_a_labelled_pod_is_refused_and_an_unlabelled_pod_is_admitted(
        operator: OperatorProcess, k8s_api: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(k8s_api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "agent"}})
    operator.stop()  # every replica: nothing answers the webhooks
    try:
        try:
            core.create_namespaced_pod(namespace, labelled_pod("governed", ["sleep", "1"]))
        except client.ApiException as exc:
            message = json.loads(exc.body)["message"]
            assert exc.status == 500, message
        else:
            raise AssertionError("a labelled pod was admitted with no operator to give it its gateway")
        assert 'failed calling webhook "pods.inject.unwind.dev"' in message
        plain = core.create_namespaced_pod(namespace, {**labelled_pod("plain", ["sleep", "1"]),
                                                       "metadata": {"name": "plain"}})
        assert [c.name for c in plain.spec.containers] == ["agent"]
        assert [p.metadata.name for p in core.list_namespaced_pod(namespace).items] == ["plain"]
    finally:
        operator.start()
    pod = core.create_namespaced_pod(namespace, labelled_pod("governed", ["sleep", "1"]))
    assert CONTAINER in [c.name for c in pod.spec.init_containers or []]
