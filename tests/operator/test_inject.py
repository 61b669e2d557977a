"""Sidecar injection as a pure function: what the webhook adds to a labelled pod."""

from __future__ import annotations

import copy
from typing import Any

from unwind.manifest.validate import validate_manifest
from unwind.operator.inject import (
    CONTAINER,
    SA_TOKEN_PATH,
    Sidecar,
    header_secrets,
    inject,
    isolation_problems,
)

SIDECAR = Sidecar("registry.example/unwind:0.1.0", "unwind-system")


def apply(doc: Any, ops: list[dict[str, Any]]) -> Any:
    """RFC 6902 add/remove, as the API server applies a webhook's patch."""
    doc = copy.deepcopy(doc)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        last = parts[-1]
        if op["op"] == "add":
            if isinstance(parent, list):
                parent.insert(len(parent) if last == "-" else int(last), op["value"])
            else:
                parent[last] = op["value"]
        elif op["op"] == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        else:
            raise AssertionError(op)
    return doc


def pod(**spec: Any) -> dict[str, Any]:
    """A pod as the webhook sees it: the ServiceAccount plugin has already mounted a token."""
    return {"metadata": {"name": "agent-1", "namespace": "shop", "labels": {"unwind.dev/inject": "true"}},
            "spec": {"serviceAccountName": "agent",
                     "containers": [{"name": "agent", "image": "agent:1", "volumeMounts": [
                         {"name": "agent-token-abcde", "mountPath": SA_TOKEN_PATH, "readOnly": True}]}],
                     "volumes": [{"name": "agent-token-abcde", "secret": {"secretName": "agent-token-abcde"}}],
                     **spec}}


def test_the_gateway_joins_the_pod_with_its_scopes_run_and_actor() -> None:
    out = apply(pod(), inject(pod(), "shop", "shop:read,shop:write", set(), SIDECAR))
    gateway = next(c for c in out["spec"]["containers"] if c["name"] == CONTAINER)
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in gateway["env"]}
    assert env["UNWIND_SCOPES"] == "shop:read,shop:write"
    assert env["UNWIND_ACTOR"] == "system:serviceaccount:shop:agent"
    assert env["UNWIND_RUN"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert gateway["image"] == "registry.example/unwind:0.1.0"
    assert gateway["command"][-2:] == ["--listen", "127.0.0.1:8787"]
    assert gateway["securityContext"]["readOnlyRootFilesystem"] is True
    assert gateway["resources"]["limits"]["memory"] == "128Mi"


def test_the_agents_own_containers_keep_no_token_and_no_upstream_secret() -> None:
    out = apply(pod(), inject(pod(), "shop", "shop:read", {"stripe-key"}, SIDECAR))
    assert out["spec"]["automountServiceAccountToken"] is False
    agent = next(c for c in out["spec"]["containers"] if c["name"] == "agent")
    assert agent.get("volumeMounts") == []
    assert "agent-token-abcde" not in {v["name"] for v in out["spec"]["volumes"]}
    gateway = next(c for c in out["spec"]["containers"] if c["name"] == CONTAINER)
    assert {m["mountPath"] for m in gateway["volumeMounts"]} >= {"/var/run/secrets/unwind",
                                                                 "/etc/unwind/secrets/stripe-key"}
    secret_volume = next(v for v in out["spec"]["volumes"] if v.get("secret", {}).get("secretName") == "stripe-key")
    assert len(secret_volume["name"]) <= 63


def test_a_run_annotation_names_the_run() -> None:
    p = pod()
    p["metadata"]["annotations"] = {"unwind.dev/run": "nightly-42"}
    out = apply(p, inject(p, "shop", "", set(), SIDECAR))
    gateway = next(c for c in out["spec"]["containers"] if c["name"] == CONTAINER)
    assert {"name": "UNWIND_RUN", "value": "nightly-42"} in gateway["env"]
    assert out["metadata"]["annotations"]["unwind.dev/injected"] == CONTAINER


def test_injection_is_idempotent() -> None:
    once = apply(pod(), inject(pod(), "shop", "x", set(), SIDECAR))
    assert inject(once, "shop", "x", set(), SIDECAR) == []


def test_the_secrets_are_those_the_manifests_name_for_upstream_headers() -> None:
    spec = {"tool": "stripe.refund", "effect": "idempotent", "permission": "payments:refund",
            "upstream": {"url": "https://api.example/refunds",
                         "headers": {"Authorization": {"secretKeyRef": {"name": "stripe", "key": "token"}},
                                     "X-Plain": "literal"}}}
    model, issues = validate_manifest(spec)
    assert model is not None and not issues
    assert header_secrets([model]) == {"stripe"}


def test_a_plain_agent_pod_asks_for_nothing_the_gateway_keeps() -> None:
    assert isolation_problems(pod()) == []
    assert isolation_problems(apply(pod(), inject(pod(), "shop", "shop:read", {"stripe-key"}, SIDECAR))) == []


def test_a_shared_process_namespace_or_host_pids_would_let_the_agent_read_the_gateways_token() -> None:
    problems = isolation_problems(pod(shareProcessNamespace=True, hostPID=True))
    assert [p.split(":")[0] for p in problems] == ["spec.shareProcessNamespace", "spec.hostPID"]
    assert "/proc" in problems[0]


def test_an_agent_container_mounting_the_gateways_volumes_is_named_with_its_field() -> None:
    spec = pod()["spec"]
    spec["containers"][0]["volumeMounts"].append({"name": "unwind-token", "mountPath": "/steal"})
    spec["initContainers"] = [{"name": "init", "image": "x", "volumeMounts": [
        {"name": "unwind-s-stripe-key-0123abcd", "mountPath": "/s"}]}]
    problems = isolation_problems({"metadata": {}, "spec": spec})
    assert problems == [
        "spec.initContainers[0].volumeMounts[0]: volume 'unwind-s-stripe-key-0123abcd' is the gateway's alone; "
        "mount it in no container of yours",
        "spec.containers[0].volumeMounts[1]: volume 'unwind-token' is the gateway's alone; mount it in no "
        "container of yours"]


def test_a_projected_token_for_the_api_server_is_refused_and_one_for_another_audience_is_not() -> None:
    api = {"name": "tok", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}
    cloud = {"name": "aws", "projected": {"sources": [{"serviceAccountToken": {"path": "t",
                                                                               "audience": "sts.amazonaws.com"}}]}}
    problems = isolation_problems(pod(volumes=[api, cloud]))
    assert len(problems) == 1
    assert problems[0].startswith("spec.volumes[0].projected.sources[0].serviceAccountToken: ")
