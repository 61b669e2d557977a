"""The shared gateway of a namespace, decided without a cluster (operator/shared_gateway.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from unwind.operator.shared_gateway import (
    ANNOTATION,
    HASH,
    LIMITS_ANNOTATION,
    SharedSettings,
    changes,
    desired,
    managed_names,
)

SETTINGS = SharedSettings(image="unwind:test", operator_namespace="unwind-system", replicas=3,
                          rate_limits={"store": "redis://r:6379/0",
                                       "actor": {"requests": 60, "per": "1m"}})
ON = {ANNOTATION: "true"}


def by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in objects}


def test_a_namespace_that_does_not_ask_keeps_only_the_gateway_identity_and_loses_the_rest() -> None:
    # the identity is every injected sidecar's too (operator/exchange.py): never deleted
    wanted = desired("payments", {}, SETTINGS, [])
    assert sorted(f"{o['kind']}/{o['metadata']['name']}" for o in wanted) == [
        "RoleBinding/unwind-gateway", "ServiceAccount/unwind-gateway"]
    assert by_kind(wanted)["RoleBinding/unwind-gateway"]["roleRef"]["name"] == "unwind-gateway"
    ours = {"metadata": {"labels": {"app.kubernetes.io/managed-by": "unwind-operator"}}}
    had = {key: ours for key in managed_names("payments")}
    assert sorted((c.action, c.kind, c.name) for c in changes("payments", wanted, had)) == [
        ("delete", "ClusterRoleBinding", "unwind-gateway-tokenreview-payments"),
        ("delete", "ConfigMap", "unwind-gateway"), ("delete", "Deployment", "unwind-gateway"),
        ("delete", "RoleBinding", "unwind-gateway-callers"), ("delete", "Service", "unwind-gateway"),
        # the two kept are replaced only because this stand-in lacks their hash
        ("replace", "RoleBinding", "unwind-gateway"), ("replace", "ServiceAccount", "unwind-gateway")]


def test_the_shared_gateway_runs_under_its_own_identity_with_the_bundles_secrets_only_in_it() -> None:
    objs = by_kind(desired("payments", ON, SETTINGS, ["stripe-key", "gh-token"]))
    pod = objs["Deployment/unwind-gateway"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "unwind-gateway"
    assert pod["automountServiceAccountToken"] is False
    assert sorted(v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v) == [
        "gh-token", "stripe-key"]
    command = pod["containers"][0]["command"]
    assert command[:5] == ["unwind", "gateway", "--cluster", "--listen", "0.0.0.0:8787"]
    assert command[command.index("--auth") + 1] == "kubernetes"
    assert "--rate-limits" in command
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["UNWIND_ALLOWED_HOSTS"].split(",")[:3] == [
        "unwind-gateway", "unwind-gateway.payments", "unwind-gateway.payments.svc"]
    assert objs["Deployment/unwind-gateway"]["spec"]["replicas"] == 3
    roles = {k: o["roleRef"]["name"] for k, o in objs.items() if "Binding" in k}
    assert roles == {"RoleBinding/unwind-gateway": "unwind-gateway",
                     "RoleBinding/unwind-gateway-callers": "unwind-gateway-callers",
                     "ClusterRoleBinding/unwind-gateway-tokenreview-payments":
                         "unwind-gateway-tokenreview"}
    assert all(o["subjects"] == [{"kind": "ServiceAccount", "name": "unwind-gateway",
                                  "namespace": "payments"}]
               for k, o in objs.items() if "Binding" in k)
    limits = json.loads(objs["ConfigMap/unwind-gateway"]["data"]["rate-limits.json"])
    assert limits["actor"] == {"requests": 60, "per": "1m"}


def test_oauth_in_the_settings_adds_the_oauth_door() -> None:
    settings = SharedSettings(image="i", operator_namespace="o",
                              oauth={"issuer": "https://idp.example", "scopes": {"a": ["b"]}})
    pod = by_kind(desired("ns", ON, settings, []))["Deployment/unwind-gateway"]
    command = pod["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--auth") + 1] == "kubernetes,oauth" and "--oauth-config" in command


def test_nothing_is_rewritten_while_nothing_changed_and_a_change_replaces_only_what_differs() -> None:
    first = desired("payments", ON, SETTINGS, ["a"])
    current: dict[tuple[str, str], Any] = {key: None for key in managed_names("payments")}
    for o in first:
        current[(o["kind"], o["metadata"]["name"])] = {**o, "metadata": {
            **o["metadata"], "resourceVersion": "7"}}
    assert changes("payments", first, current) == []
    second = desired("payments", ON, SETTINGS, ["a", "b"])  # the bundle names another Secret
    todo = changes("payments", second, current)
    assert [(c.action, c.kind, c.resource_version) for c in todo] == [
        ("replace", "Deployment", "7")]


def test_an_object_of_the_same_name_that_someone_else_made_is_left_alone() -> None:
    wanted = desired("payments", ON, SETTINGS, [])
    current: dict[tuple[str, str], Any] = {key: None for key in managed_names("payments")}
    current[("Service", "unwind-gateway")] = {"metadata": {"name": "unwind-gateway",
                                                           "annotations": {HASH: "other"}}}
    kinds = [(c.action, c.kind) for c in changes("payments", wanted, current)]
    assert ("replace", "Service") not in kinds and ("create", "Service") not in kinds


def test_a_namespaces_own_rate_limits_replace_the_charts_and_a_bad_one_is_refused() -> None:
    mine = json.dumps({"tool": {"requests": 5, "per": "1m"}})
    objs = by_kind(desired("payments", {**ON, LIMITS_ANNOTATION: mine}, SETTINGS, []))
    assert json.loads(objs["ConfigMap/unwind-gateway"]["data"]["rate-limits.json"]) == {
        "tool": {"requests": 5, "per": "1m"}}
    with pytest.raises(ValueError, match="rate-limits"):
        desired("payments", {**ON, LIMITS_ANNOTATION: '{"tool": {"requests": 0}}'}, SETTINGS, [])


def test_the_shared_gateways_probes_ask_a_port_its_command_listens_on() -> None:
    # the probes are the kubelet's GETs on the status port; a port nothing listens on
    # would restart every replica at its first liveness failure
    pod = by_kind(desired("payments", ON, SETTINGS, []))["Deployment/unwind-gateway"]
    container = pod["spec"]["template"]["spec"]["containers"][0]
    command = container["command"]
    listened = {int(command[i + 1].rsplit(":", 1)[1]) for i, arg in enumerate(command)
                if arg in ("--listen", "--metrics-listen", "--status-listen")}
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] in listened
    assert command[command.index("--status-listen") + 1] == "0.0.0.0:8788"
