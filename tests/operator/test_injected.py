"""Issue 29, item 8: a container named ``unwind-gateway`` does not pass for the gateway.

AdmissionReviews go through the webhook's own code (``Admission.review``, as the webhook
server calls it). Before, a labelled pod bringing its own ``unwind-gateway`` was admitted
untouched: no isolation check, the token and the upstream Secret left with the agent."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from unwind.operator.hooks import Admission
from unwind.operator.inject import CONTAINER, SA_TOKEN_PATH, Sidecar, gateway_parts
from unwind.registry.signing import TrustStore, sign

KEY = Ed25519PrivateKey.generate()
TRUST = TrustStore([KEY.public_key()])

SIDECAR = Sidecar("registry.example/unwind:0.1.0", "unwind-system")
NATIVE = Sidecar("registry.example/unwind:0.1.0", "unwind-system", native=True)


def agent_pod(**spec: Any) -> dict[str, Any]:
    """A labelled pod as the webhook sees it: the token plugin has mounted the API token."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "agent-1", "namespace": "shop", "labels": {"unwind.dev/inject": "true"}},
            "spec": {"serviceAccountName": "agent",
                     "containers": [{"name": "agent", "image": "agent:1", "volumeMounts": [
                         {"name": "agent-token-abcde", "mountPath": SA_TOKEN_PATH, "readOnly": True}]}],
                     "volumes": [{"name": "agent-token-abcde", "secret": {"secretName": "agent-token-abcde"}}],
                     **spec}}


def review(pod: dict[str, Any], sidecar: Sidecar = SIDECAR,
           secrets: frozenset[str] = frozenset({"stripe"})) -> dict[str, Any]:
    admission = Admission(lambda *_: None, "unwind-system", True, lambda m: sign(KEY, m), TRUST,
                          sidecar=sidecar, pod_context=lambda ns, sa: ("shop:read", set(secrets)))
    data = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "r-1", "operation": "CREATE", "namespace": "shop", "object": pod,
                        "userInfo": {"username": "system:serviceaccount:kube-system:job-controller"}}}
    answer: dict[str, Any] = asyncio.run(admission.review("inject-gateway", data))["response"]
    return answer


def patched(pod: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    """The pod after the webhook's JSON patch, with what the API server fills in when it
    decodes a pod (as the webhook sees it when it is called again)."""
    out = copy.deepcopy(pod)
    for op in json.loads(base64.b64decode(answer.get("patch") or "W10=")):
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = out
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        last = parts[-1]
        if op["op"] == "add" and isinstance(parent, list):
            parent.insert(len(parent) if last == "-" else int(last), op["value"])
        elif op["op"] == "add":
            parent[last] = op["value"]
        else:
            del parent[int(last) if isinstance(parent, list) else last]
    for kind in ("initContainers", "containers"):
        for c in out["spec"].get(kind) or []:
            c.setdefault("terminationMessagePath", "/dev/termination-log")
            c.setdefault("terminationMessagePolicy", "File")
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                if probe in c:
                    c[probe].setdefault("successThreshold", 1)
            for var in c.get("env") or []:
                if "fieldRef" in var.get("valueFrom", {}):
                    var["valueFrom"]["fieldRef"].setdefault("apiVersion", "v1")
    for v in out["spec"].get("volumes") or []:
        for kind in ("secret", "projected"):
            if kind in v:
                v[kind].setdefault("defaultMode", 420)
    return out


def own_gateway(pod: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """``pod`` with an ``unwind-gateway`` of its own: the webhook's, changed by ``changes``."""
    container, _ = gateway_parts(pod, "shop", "shop:read", {"stripe"}, SIDECAR)
    container.update(changes)
    pod["spec"]["containers"].append(container)
    return pod


def message(answer: dict[str, Any]) -> str:
    return str(answer["status"]["message"])


def test_a_labelled_pod_bringing_its_own_unwind_gateway_is_refused_not_admitted_untouched() -> None:
    pod = agent_pod()
    pod["spec"]["containers"][0]["env"] = [
        {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "stripe", "key": "token"}}}]
    pod["spec"]["containers"].append({"name": CONTAINER, "image": "evil:1",
                                      "env": [{"name": "UNWIND_SCOPES", "value": "*"}]})
    answer = review(pod)
    assert answer["allowed"] is False and answer["status"]["code"] == 400
    assert "spec.containers[1]: this pod brings its own container named unwind-gateway" in message(answer)
    assert "rename the container" in message(answer)


def test_a_copy_of_the_gateway_with_one_env_var_more_is_not_the_gateway() -> None:
    pod = own_gateway(agent_pod())
    pod["spec"]["containers"][-1]["env"].append({"name": "PYTHONPATH", "value": "/work/agent-writes"})
    answer = review(pod)
    assert answer["allowed"] is False and "brings its own container named unwind-gateway" in message(answer)
    for field in ("image", "command"):
        other = own_gateway(agent_pod(), **{field: ["x"] if field == "command" else "evil:1"})
        assert review(other)["allowed"] is False, field


def test_the_isolation_check_runs_on_a_pod_that_holds_the_webhooks_own_gateway() -> None:
    first = review(agent_pod())
    assert first["allowed"] is True
    again = patched(agent_pod(), first)  # the webhook called again for the same pod
    assert review(again)["allowed"] is True
    # ...but an agent container mounting the gateway's token volume is refused even then
    stolen = copy.deepcopy(again)
    stolen["spec"]["containers"][0].setdefault("volumeMounts", []).append(
        {"name": "unwind-token", "mountPath": "/stolen"})
    answer = review(stolen)
    assert answer["allowed"] is False
    assert "spec.containers[0].volumeMounts[0]: volume 'unwind-token' is the gateway's alone" in message(answer)
    # ...and so is the upstream Secret in the agent's env
    leaked = copy.deepcopy(again)
    leaked["spec"]["containers"][0]["env"] = [
        {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "stripe", "key": "token"}}}]
    assert "Secret 'stripe' holds credentials" in message(review(leaked))


@pytest.mark.parametrize("sidecar", [SIDECAR, NATIVE], ids=["container", "native"])
def test_the_webhook_called_again_for_a_pod_it_injected_admits_it_as_it_is(sidecar: Sidecar) -> None:
    first = review(agent_pod(), sidecar)
    again = patched(agent_pod(), first)
    again["spec"]["containers"][-1 if not sidecar.native else 0]["resources"] = {
        "requests": {"cpu": "80m", "memory": "70Mi"}}  # another webhook (a VPA) set them
    second = review(again, sidecar)
    assert second["allowed"] is True
    assert json.loads(base64.b64decode(second.get("patch") or "W10=")) == []  # nothing to add


def test_a_gateway_in_the_other_form_or_twice_is_not_the_webhooks() -> None:
    native = patched(agent_pod(), review(agent_pod(), NATIVE))
    assert review(native, SIDECAR)["allowed"] is False  # the operator injects containers here
    twice = own_gateway(own_gateway(agent_pod()))
    assert "a second container named unwind-gateway" in message(review(twice))


def test_the_webhooks_gateway_with_a_volume_of_the_pods_choosing_is_refused() -> None:
    again = patched(agent_pod(), review(agent_pod()))
    token = next(v for v in again["spec"]["volumes"] if v["name"] == "unwind-token")
    token["projected"]["sources"][0]["serviceAccountToken"]["audience"] = "https://kubernetes.default.svc"
    assert "the gateway's volume 'unwind-token' is not the webhook's" in message(review(again))
