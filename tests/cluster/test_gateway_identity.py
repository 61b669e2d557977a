"""The injected gateway's own identity (issue 29, item 10), each refusal by the API server or
the operator's token exchange on the local control plane: the agent's ServiceAccount holds no
Unwind right, only a pod the webhook injected trades its token for one of unwind-gateway,
and that token dies with its pod."""

from __future__ import annotations

import base64
import datetime as dt
import json
import ssl
import tempfile
import urllib.error
import urllib.request
from typing import Any

from cluster_helpers import apply, enforced, tm, wait_for
from kubernetes import client

from unwind.controlplane import ControlPlane
from unwind.controlplane.dev import OPERATOR_NAMESPACE, OperatorProcess

SHOP = {"tool": "shop.get_order", "effect": "read_only", "permission": "shop:read",
        "upstream": {"url": "http://127.0.0.1:8788/orders/{{args.id}}", "method": "GET",
                     "headers": {"Authorization": {"secretKeyRef": {"name": "shop-api", "key": "token"}}}}}
LEDGER = {"apiVersion": "unwind.dev/v1alpha1", "kind": "EffectLedger", "metadata": {"name": "forged"},
          "spec": {"run": "forged"}}


def pod_token(core: Any, namespace: str, pod: Any, audience: str | None, bound: bool = True) -> str:
    """A token of the pod's ServiceAccount as the kubelet projects one (bound to the pod), or
    as `kubectl create token` makes one (``bound=False``)."""
    spec: dict[str, Any] = {"audiences": [audience] if audience else [], "expirationSeconds": 3600}
    if bound:
        spec["boundObjectRef"] = {"kind": "Pod", "apiVersion": "v1", "name": pod.metadata.name,
                                  "uid": pod.metadata.uid}
    return str(core.create_namespaced_service_account_token(pod.spec.service_account_name, namespace,
                                                            {"spec": spec}).status.token)


def as_token(cp: ControlPlane, token: str) -> client.ApiClient:
    config = client.Configuration()
    config.host, config.ssl_ca_cert = cp.server, str(cp.ca_file)
    config.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(config)


def status_of(call: Any) -> int:
    try:
        call()
    except client.ApiException as exc:
        return int(exc.status)
    return 200


def trade(operator: OperatorProcess, k8s_api: client.ApiClient, token: str) -> tuple[int, dict[str, Any]]:
    """POST the token to the operator's exchange, checking its certificate as a gateway does."""
    secret = client.CoreV1Api(k8s_api).read_namespaced_secret("unwind-webhook-tls", OPERATOR_NAMESPACE)
    ca = base64.b64decode(secret.data["ca.crt"]).decode()
    with tempfile.NamedTemporaryFile("w", suffix=".pem") as f:
        f.write(ca)
        f.flush()
        context = ssl.create_default_context(cafile=f.name)
    request = urllib.request.Request(f"https://127.0.0.1:{operator.exchange_port}/v1/gateway-token",
                                     method="POST", data=b"", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, context=context, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def agent_pod(name: str, labelled: bool) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"unwind.dev/inject": "true"} if labelled else {}},
            "spec": {"serviceAccountName": "agent", "restartPolicy": "Never",
                     "containers": [{"name": "agent", "image": "agent:1", "command": ["sleep", "1"]}]}}


def published_namespace(k8s_api: client.ApiClient, kubeconfig: Any, namespace: str) -> Any:
    core = client.CoreV1Api(k8s_api)
    core.create_namespaced_service_account(namespace, {"metadata": {
        "name": "agent", "annotations": {"unwind.dev/scopes": "shop:read"}}})  # and no RoleBinding at all
    core.create_namespaced_secret(namespace, {"metadata": {"name": "shop-api"}, "stringData": {"token": "s3cret"}})
    apply(kubeconfig, namespace, tm("get-order", SHOP))
    wait_for("published", lambda: enforced(k8s_api, namespace) == {"shop.get_order": 1})
    return core


def test_a_pod_of_the_agents_account_without_the_label_can_neither_write_a_ledger_nor_read_the_upstream_secret(
        operator: OperatorProcess, control_plane: ControlPlane, kubeconfig: Any, k8s_api: client.ApiClient,
        namespace: str) -> None:
    core = published_namespace(k8s_api, kubeconfig, namespace)
    plain = core.create_namespaced_pod(namespace, agent_pod("plain", labelled=False))
    assert not [c for c in plain.spec.init_containers or [] if c.name == "unwind-gateway"]
    # the token such a pod gets for the API server, bound to it as the kubelet binds it
    agent = as_token(control_plane, pod_token(core, namespace, plain, None))
    custom, secrets = client.CustomObjectsApi(agent), client.CoreV1Api(agent)
    assert status_of(lambda: custom.create_namespaced_custom_object(
        "unwind.dev", "v1alpha1", namespace, "effectledgers", LEDGER)) == 403
    assert status_of(lambda: custom.list_namespaced_custom_object("unwind.dev", "v1alpha1", namespace,
                                                                  "effectledgers")) == 403
    assert status_of(lambda: secrets.read_namespaced_secret("shop-api", namespace)) == 403
    assert status_of(lambda: secrets.read_namespaced_config_map("unwind-bundle", namespace)) == 403
    # ...and none of its tokens buys the gateway's at the operator
    code, body = trade(operator, k8s_api, pod_token(core, namespace, plain, None))
    assert code == 401 and "audience unwind-operator" in body["error"], body
    code, body = trade(operator, k8s_api, pod_token(core, namespace, plain, "unwind-operator"))
    assert code == 403 and "is not labelled unwind.dev/inject=true" in body["error"], body
    code, body = trade(operator, k8s_api, pod_token(core, namespace, plain, "unwind-operator", bound=False))
    assert code == 403 and "not bound to a pod" in body["error"], body
    code, body = trade(operator, k8s_api, "not-a-token")
    assert code == 401, body


def test_an_injected_gateway_trades_its_pods_token_for_unwind_gateways_which_dies_with_the_pod(
        operator: OperatorProcess, control_plane: ControlPlane, kubeconfig: Any, k8s_api: client.ApiClient,
        namespace: str) -> None:
    core = published_namespace(k8s_api, kubeconfig, namespace)
    pod = core.create_namespaced_pod(namespace, agent_pod("agent-1", labelled=True))
    (gateway,) = [c for c in pod.spec.init_containers if c.name == "unwind-gateway"]
    env = {e.name: e.value for e in gateway.env}
    assert env["UNWIND_TOKEN_EXCHANGE"] == f"https://127.0.0.1:{operator.exchange_port}"
    assert "BEGIN CERTIFICATE" in env["UNWIND_EXCHANGE_CA"]
    (volume,) = [v for v in pod.spec.volumes if v.name == "unwind-token"]
    assert [s.service_account_token.audience for s in volume.projected.sources if s.service_account_token] == [
        "unwind-operator"]

    code, body = trade(operator, k8s_api, pod_token(core, namespace, pod, "unwind-operator"))
    assert code == 200, body
    assert body["serviceAccount"] == f"system:serviceaccount:{namespace}:unwind-gateway"
    gateway_api = as_token(control_plane, body["token"])
    custom = client.CustomObjectsApi(gateway_api)
    assert status_of(lambda: custom.list_namespaced_custom_object("unwind.dev", "v1alpha1", namespace,
                                                                  "effectledgers")) == 200
    assert status_of(lambda: client.CoreV1Api(gateway_api).read_namespaced_config_map(
        "unwind-bundle", namespace)) == 200
    # the identity holds the gateway's rights only: no Secret, and nothing in another namespace
    assert status_of(lambda: client.CoreV1Api(gateway_api).read_namespaced_secret("shop-api", namespace)) == 403
    assert status_of(lambda: custom.list_namespaced_custom_object("unwind.dev", "v1alpha1", "default",
                                                                  "effectledgers")) == 403
    # ten minutes, the shortest the API server issues (it binds to a pod only tokens of the
    # pod's own ServiceAccount), and never renewed once the pod is gone: its own token dies with it
    assert 0 < (dt.datetime.fromisoformat(body["expiresAt"].replace("Z", "+00:00"))
                - dt.datetime.now(dt.UTC)).total_seconds() <= 600
    projected = pod_token(core, namespace, pod, "unwind-operator")
    core.delete_namespaced_pod("agent-1", namespace, grace_period_seconds=0)
    wait_for("the pod gone", lambda: not core.list_namespaced_pod(namespace).items)
    code, body = trade(operator, k8s_api, projected)
    assert code == 401, body
