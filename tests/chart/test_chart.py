"""The Helm chart, checked offline with Helm's own Go library (helm-python-sdk).

Lint, render and schema validation run through ``helm_python`` exactly as
``helm lint`` / ``helm template`` would; no cluster is involved. Each test reads
like the property of the chart it guards.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = ROOT / "charts" / "unwind"
DOCS = ROOT / "docs" / "chart.md"
RELEASE = "unwind"
NAMESPACE = "unwind-system"

RBAC_KINDS = {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}

# The cluster-wide rules, exactly: (apiGroup, resource) -> verbs. docs/chart.md
# names the handler behind each one; a rule added here must be added there.
EXPECTED_CLUSTER_RULES = {
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"get", "list", "watch"},
    ("", "namespaces"): {"get", "list", "watch"},
    ("unwind.dev", "toolmanifests"): {"get", "list", "watch", "patch"},
    ("unwind.dev", "toolmanifests/status"): {"get", "patch", "update"},
    ("unwind.dev", "approvals"): {"get", "list", "watch"},
    ("", "serviceaccounts"): {"get", "create"},  # create: the namespace's unwind-gateway
    # the gateways' token exchange (operator/exchange.py)
    ("authentication.k8s.io", "tokenreviews"): {"create"},
    ("", "serviceaccounts/token"): {"create"},
    ("rbac.authorization.k8s.io", "rolebindings"): {"get", "create"},
    ("rbac.authorization.k8s.io", "clusterroles"): {"bind"},
    ("unwind.dev", "effectledgers"): {"get", "list", "watch", "delete"},
    ("unwind.dev", "effectledgers/status"): {"get", "update"},
    ("admissionregistration.k8s.io", "validatingwebhookconfigurations"): {"get", "patch"},
    ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"): {"get", "patch"},
    ("apps", "controllerrevisions"): {"get", "list", "watch", "create"},
    ("", "configmaps"): {"get", "list", "watch", "create", "update", "delete"},
    ("batch", "jobs"): {"get", "list", "watch", "create", "delete"},
    ("", "pods"): {"get", "list"},
    ("coordination.k8s.io", "leases"): {"get"},
    ("", "events"): {"create", "patch", "list"},  # list: why an undo pod cannot start
    ("events.k8s.io", "events"): {"create", "patch"},
}
# The gateway sidecar's rules (ClusterRole unwind-gateway, bound per namespace to agents).
EXPECTED_GATEWAY_RULES = {
    ("unwind.dev", "effectledgers"): {"get", "list", "watch", "create"},
    ("unwind.dev", "effectledgers/status"): {"get", "update", "patch"},
    ("coordination.k8s.io", "leases"): {"create", "get", "delete"},
    ("", "configmaps"): {"get"},
    ("unwind.dev", "approvals"): {"get", "list", "watch"},
}
EXPECTED_KEYS_RULES = {
    ("", "secrets"): {"get", "create", "update"},
    ("", "configmaps"): {"get", "create", "update"},
    ("coordination.k8s.io", "leases"): {"get", "create", "update"},
    ("", "services"): {"get"},  # the webhook Service's address, for the exchange
}


# --- helpers ------------------------------------------------------------------


@pytest.fixture(scope="module")
def chart(chart_dir: Path) -> Iterator[Any]:
    with helm.Chart.load(chart_dir) as loaded:
        yield loaded


def render(chart: Any, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Render like `helm template`, returning every object of every template."""
    manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    objects: list[dict[str, Any]] = []
    for path, text in manifests.items():
        if path.endswith("NOTES.txt"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


def only(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [obj for obj in objects if obj["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def operator_role(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return named(objects, "ClusterRole", "unwind-operator")


def named(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def rules_table(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    table: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                table.setdefault((group, resource), set()).update(rule["verbs"])
    return table


def operator_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    pod = only(objects, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return container


def value_paths(values: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted paths of every leaf value (maps recurse, anything else is a leaf)."""
    paths: list[str] = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            paths.extend(value_paths(value, f"{path}."))
        else:
            paths.append(path)
    return paths


def schema_node(schema: dict[str, Any], path: str) -> dict[str, Any] | None:
    node: dict[str, Any] | None = schema
    for part in path.split("."):
        if node is None:
            return None
        if "$ref" in node:
            node = schema["definitions"][node["$ref"].rsplit("/", 1)[-1]]
        props = node.get("properties", {})
        if part in props:
            node = props[part]
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        else:
            return None
    return node


# --- lint and render ------------------------------------------------------------


def test_the_chart_lints_clean_in_strict_mode(chart_dir: Path) -> None:
    report = helm.lint(chart_dir, strict=True, namespace=NAMESPACE)
    findings = [m for m in report["messages"] if m["severity"] >= 2]  # 2 warning, 3 error
    assert report["errors"] == []
    assert findings == []


def test_the_chart_is_unwind_0_1_0_with_app_version_0_1_0(chart: Any) -> None:
    meta = chart.metadata
    assert (meta["apiVersion"], meta["name"], meta["version"], meta["appVersion"]) == (
        "v2",
        "unwind",
        "0.1.0",
        "0.1.0",
    )


def test_the_chart_renders_every_object_with_default_values(chart: Any) -> None:
    kinds = sorted(obj["kind"] for obj in render(chart))
    assert kinds == sorted(
        [
            "ClusterRole",
            "ClusterRole",
            "ClusterRole",
            "ClusterRole",
            "ClusterRole",
            "ClusterRole",
            "ClusterRole",
            "ClusterRoleBinding",
            "Deployment",
            "MutatingWebhookConfiguration",
            "PodDisruptionBudget",
            "Role",
            "Role",
            "RoleBinding",
            "RoleBinding",
            "Service",
            "Service",
            "ServiceAccount",
            "ValidatingWebhookConfiguration",
        ]
    )


def test_every_object_carries_the_standard_kubernetes_labels(chart: Any) -> None:
    for obj in render(chart):
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "unwind"
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/version"] == "0.1.0"
        assert labels["helm.sh/chart"] == "unwind-0.1.0"


# --- the operator Deployment ------------------------------------------------------


def test_the_operator_runs_as_non_root_with_a_read_only_root_and_no_capabilities(
    chart: Any,
) -> None:
    objects = render(chart)
    pod = only(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = operator_container(objects)["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["runAsUser"] == 65532
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}


def test_the_operator_pod_gets_no_service_link_variables(chart: Any) -> None:
    # the webhook Service unwind-webhook would give it UNWIND_WEBHOOK_PORT=tcp://... (seen on a node)
    pod = only(render(chart), "Deployment")["spec"]["template"]["spec"]
    assert pod["enableServiceLinks"] is False


def test_the_only_writable_path_is_an_empty_dir_at_tmp(chart: Any) -> None:
    objects = render(chart)
    pod = only(objects, "Deployment")["spec"]["template"]["spec"]
    assert [m["mountPath"] for m in operator_container(objects)["volumeMounts"]] == ["/tmp"]
    assert [v["name"] for v in pod["volumes"] if "emptyDir" in v] == ["tmp"]


def test_the_operator_is_live_on_kopfs_endpoint_and_ready_when_its_webhooks_listen(chart: Any) -> None:
    container = operator_container(render(chart))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["health"] == 8080
    get = container["livenessProbe"]["httpGet"]
    assert (get["path"], get["port"]) == ("/healthz", "health")
    # ready when the webhooks listen: a replica still without its TLS gets no reviews
    assert container["readinessProbe"]["tcpSocket"] == {"port": "webhook"}
    assert "--liveness=http://0.0.0.0:8080/healthz" in container["args"]


def test_the_operator_has_resource_requests_and_limits_by_default(chart: Any) -> None:
    assert operator_container(render(chart))["resources"] == {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"cpu": "500m", "memory": "256Mi"},
    }


def test_two_replicas_roll_one_at_a_time_and_a_disruption_budget_keeps_one_up(chart: Any) -> None:
    objects = render(chart)
    spec = only(objects, "Deployment")["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    pdb = only(objects, "PodDisruptionBudget")
    assert pdb["spec"] == {"minAvailable": 1, "selector": {"matchLabels": spec["selector"]["matchLabels"]}}
    assert not [o for o in render(chart, {"podDisruptionBudget": {"enabled": False}})
                if o["kind"] == "PodDisruptionBudget"]


def test_the_webhooks_fail_closed_skip_the_operator_namespace_and_go_through_the_service(chart: Any) -> None:
    objects = render(chart)
    service = next(o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == "unwind-webhook")
    assert service["spec"]["ports"] == [{"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"},
                                        {"name": "exchange", "port": 9444, "targetPort": "exchange",
                                         "protocol": "TCP"}]
    hooks = [h for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")
             for h in only(objects, kind)["webhooks"]]
    assert {h["name"] for h in hooks} == {"toolmanifests.validate.unwind.dev", "approvals.validate.unwind.dev",
                                          "toolmanifests.stamp.unwind.dev", "approvals.stamp.unwind.dev",
                                          "effectledgers.stamp.unwind.dev", "pods.inject.unwind.dev"}
    for hook in hooks:
        # every webhook fails closed, the pods' too: it selects only labelled pods
        assert hook["failurePolicy"] == "Fail"
        assert hook["sideEffects"] == "None" and hook["timeoutSeconds"] == 5
        assert hook["namespaceSelector"]["matchExpressions"] == [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [NAMESPACE]}]
        assert hook["clientConfig"]["service"]["name"] == "unwind-webhook"
        assert "caBundle" not in hook["clientConfig"]  # the operator fills it in
    args = operator_container(objects)["args"]
    assert {"--webhook-port=9443", "--webhook-service=unwind-webhook", "--webhook-configuration=unwind",
            "--four-eyes=true"} <= set(args)


def test_the_injection_webhook_fails_closed_only_for_pods_labelled_to_be_governed(chart: Any) -> None:
    (hook,) = [h for h in only(render(chart), "MutatingWebhookConfiguration")["webhooks"]
               if h["name"] == "pods.inject.unwind.dev"]
    assert hook["failurePolicy"] == "Fail"
    assert hook["objectSelector"] == {"matchLabels": {"unwind.dev/inject": "true"}}
    assert hook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                              "resources": ["pods"], "scope": "Namespaced"}]


def test_the_webhook_port_is_closed_to_all_but_the_api_server_by_a_network_policy(chart: Any) -> None:
    assert not [o for o in render(chart) if o["kind"] == "NetworkPolicy"]  # off by default: needs the CIDRs
    values = {"webhook": {"networkPolicy": {"enabled": True, "apiServerCIDRs": ["10.0.0.0/28", "192.168.1.5/32"]}}}
    objects = render(chart, values)
    policy = only(objects, "NetworkPolicy")
    deployment = only(objects, "Deployment")
    assert policy["metadata"]["namespace"] == NAMESPACE
    assert policy["spec"]["podSelector"] == {"matchLabels": deployment["spec"]["selector"]["matchLabels"]}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    webhook, others = policy["spec"]["ingress"]
    assert webhook == {"from": [{"ipBlock": {"cidr": "10.0.0.0/28"}}, {"ipBlock": {"cidr": "192.168.1.5/32"}}],
                       "ports": [{"port": "webhook", "protocol": "TCP"}]}
    # the exchange is open to every pod: each caller is checked by TokenReview
    assert "from" not in others and {p["port"] for p in others["ports"]} == {"exchange", "health", "metrics"}
    ports = {p["name"] for p in operator_container(objects)["ports"]}
    assert ports == {"webhook", "exchange", "health", "metrics"}
    with pytest.raises(Exception, match="apiServerCIDRs"):
        render(chart, {"webhook": {"networkPolicy": {"enabled": True}}})
    with pytest.raises(helm.HelmValuesError, match="apiServerCIDRs"):
        render(chart, {"webhook": {"networkPolicy": {"enabled": True, "apiServerCIDRs": ["the api server"]}}})


def test_a_client_ca_makes_the_operator_answer_only_certified_callers(chart: Any) -> None:
    plain = operator_container(render(chart))
    assert not {e["name"] for e in plain["env"]} & {"UNWIND_WEBHOOK_CLIENT_CA", "UNWIND_WEBHOOK_CLIENT_NAMES"}
    objects = render(chart, {"webhook": {"clientAuth": {"caConfigMap": "apiserver-webhook-client-ca",
                                                        "names": ["kube-apiserver-webhook"]}}})
    container = operator_container(objects)
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["UNWIND_WEBHOOK_CLIENT_CA"] == "/etc/unwind/webhook-client-ca/ca.crt"
    assert env["UNWIND_WEBHOOK_CLIENT_NAMES"] == "kube-apiserver-webhook"
    assert {"name": "webhook-client-ca", "mountPath": "/etc/unwind/webhook-client-ca",
            "readOnly": True} in container["volumeMounts"]
    volumes = only(objects, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "webhook-client-ca", "configMap": {"name": "apiserver-webhook-client-ca",
                                                      "items": [{"key": "ca.crt", "path": "ca.crt"}]}} in volumes


def test_the_api_servers_audiences_reach_the_operator(chart: Any) -> None:
    env = {e["name"]: e.get("value") for e in operator_container(render(chart))["env"]}
    assert env["UNWIND_API_AUDIENCES"] == ""
    values = {"operator": {"apiAudiences": ["https://oidc.example/prod", "vault"]}}
    env = {e["name"]: e.get("value") for e in operator_container(render(chart, values))["env"]}
    assert env["UNWIND_API_AUDIENCES"] == "https://oidc.example/prod,vault"


def test_a_webhook_url_replaces_the_service_for_an_operator_outside_the_cluster(chart: Any) -> None:
    objects = render(chart, {"webhook": {"url": "https://127.0.0.1:9443"}})
    hook = only(objects, "ValidatingWebhookConfiguration")["webhooks"][0]
    assert hook["clientConfig"] == {"url": "https://127.0.0.1:9443/validate-toolmanifest"}
    assert not [o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == "unwind-webhook"]


def test_the_operator_watches_all_namespaces_unless_some_are_named(chart: Any) -> None:
    args = operator_container(render(chart))["args"]
    assert args[0] == "operator"
    assert not [a for a in args if a.startswith("--namespace")]
    assert f"--operator-namespace={NAMESPACE}" in args
    assert "--metrics-port=9090" in args

    named = operator_container(render(chart, {"operator": {"watchNamespaces": ["a", "b"]}}))
    assert [a for a in named["args"] if a.startswith("--namespace")] == [
        "--namespace=a",
        "--namespace=b",
    ]


def test_the_operator_learns_its_namespace_from_the_downward_api(chart: Any) -> None:
    env = {e["name"]: e for e in operator_container(render(chart))["env"]}
    assert env["UNWIND_OPERATOR_NAMESPACE"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.namespace"}
    }


def test_operator_settings_reach_the_container_environment(chart: Any) -> None:
    values = {
        "operator": {
            "trustedAppliers": ["system:serviceaccount:argocd:argocd-application-controller"],
            "bundleWindowSeconds": 2.5,
            "logLevel": "debug",
        }
    }
    env = {e["name"]: e.get("value") for e in operator_container(render(chart, values))["env"]}
    assert env["UNWIND_TRUSTED_APPLIERS"] == (
        "system:serviceaccount:argocd:argocd-application-controller"
    )
    assert env["UNWIND_BUNDLE_WINDOW_SECONDS"] == "2.5"
    assert env["UNWIND_LOG_LEVEL"] == "debug"

    defaults = {e["name"]: e.get("value") for e in operator_container(render(chart))["env"]}
    assert defaults["UNWIND_TRUSTED_APPLIERS"] == ""  # nobody is trusted unless named
    assert float(defaults["UNWIND_BUNDLE_WINDOW_SECONDS"]) == 1.0


def test_the_image_tag_defaults_to_the_app_version(chart: Any) -> None:
    assert operator_container(render(chart))["image"] == "unwind:0.1.0"
    pinned = render(chart, {"image": {"repository": "example/unwind", "tag": "dev"}})
    assert operator_container(pinned)["image"] == "example/unwind:dev"


def test_the_metrics_service_selects_the_operator_pod_on_port_9090(chart: Any) -> None:
    objects = render(chart)
    service = next(o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == "unwind-metrics")
    pod_labels = only(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}
    ]
    ports = {p["name"]: p["containerPort"] for p in operator_container(objects)["ports"]}
    assert ports["metrics"] == 9090


# --- RBAC ---------------------------------------------------------------------


def test_rbac_has_no_wildcard_verbs_resources_or_api_groups(chart: Any) -> None:
    for role in (obj for obj in render(chart) if obj["kind"] in {"ClusterRole", "Role"}):
        for rule in role["rules"]:
            for field in ("verbs", "resources", "apiGroups", "resourceNames"):
                assert "*" not in rule.get(field, []), (role["metadata"]["name"], rule)


def test_the_cluster_role_grants_exactly_what_the_handlers_use(chart: Any) -> None:
    cluster_role = operator_role(render(chart))
    assert cluster_role["metadata"]["name"] == "unwind-operator"
    assert rules_table(cluster_role) == EXPECTED_CLUSTER_RULES


def test_secrets_are_granted_only_by_a_role_in_the_release_namespace(chart: Any) -> None:
    objects = render(chart)
    assert ("", "secrets") not in rules_table(operator_role(objects))
    role = named(objects, "Role", "unwind-operator-keys")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert rules_table(role) == EXPECTED_KEYS_RULES
    readable = [r for r in role["rules"] if "secrets" in r["resources"] and "get" in r["verbs"]]
    assert [r["resourceNames"] for r in readable] == [["unwind-signing-key"], ["unwind-webhook-tls"]]


def test_both_roles_are_bound_to_the_operator_service_account(chart: Any) -> None:
    objects = render(chart)
    account = only(objects, "ServiceAccount")["metadata"]["name"]
    pod = only(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account
    for kind, role_kind, name in (("ClusterRoleBinding", "ClusterRole", "unwind-operator"),
                                  ("RoleBinding", "Role", "unwind-operator-keys")):
        binding = named(objects, kind, name)
        assert binding["roleRef"]["kind"] == role_kind
        role = named(objects, role_kind, name)
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
        ]


def test_configmap_writes_are_limited_to_the_bundles_names(chart: Any) -> None:
    from unwind.bundle import BUNDLE_NAME, shard_names

    rules = [r for r in operator_role(render(chart))["rules"] if "configmaps" in r["resources"]]
    named = [r for r in rules if r.get("resourceNames")]
    assert [set(r["verbs"]) for r in named] == [{"get", "update", "delete"}]
    assert named[0]["resourceNames"] == [BUNDLE_NAME, *shard_names()]
    assert {v for r in rules if not r.get("resourceNames") for v in r["verbs"]} == {"list", "watch", "create"}


def test_watching_some_namespaces_grants_configmaps_only_there(chart: Any) -> None:
    objects = render(chart, {"operator": {"watchNamespaces": ["payments", "code"]}})
    assert ("", "configmaps") not in rules_table(operator_role(objects))
    roles = {o["metadata"]["namespace"]: o for o in objects if o["kind"] == "Role"
             and o["metadata"]["name"] == "unwind-bundle"}
    assert set(roles) == {"payments", "code"}
    assert rules_table(roles["payments"])[("", "configmaps")] == {"get", "list", "watch", "create", "update", "delete"}
    assert rules_table(roles["payments"])[("batch", "jobs")] == {"get", "list", "watch", "create", "delete"}
    assert rules_table(roles["payments"])[("", "pods")] == {"get", "list"}
    assert rules_table(roles["payments"])[("", "events")] == {"list"}
    assert rules_table(operator_role(objects))[("", "events")] == {"create", "patch"}
    assert ("batch", "jobs") not in rules_table(operator_role(objects))
    bindings = {o["metadata"]["namespace"] for o in objects if o["kind"] == "RoleBinding"
                and o["metadata"]["name"] == "unwind-bundle"}
    assert bindings == {"payments", "code"}


def test_people_view_and_edit_through_the_builtin_roles_but_approving_is_granted_apart(chart: Any) -> None:
    roles = {o["metadata"]["name"]: o for o in render(chart) if o["kind"] == "ClusterRole"}
    aggregates = {name: {k.rsplit("-", 1)[-1] for k in r["metadata"]["labels"] if "aggregate-to" in k}
                  for name, r in roles.items()}
    assert aggregates == {"unwind-operator": set(), "unwind-view": {"view", "edit", "admin"},
                          "unwind-edit": {"edit", "admin"}, "unwind-approver": set(),
                          "unwind-gateway": set(), "unwind-gateway-tokenreview": set(),
                          "unwind-gateway-callers": set()}
    approver = rules_table(roles["unwind-approver"])
    assert approver[("unwind.dev", "approvals")] == {"create", "get", "list", "watch"}
    edit = rules_table(roles["unwind-edit"])
    assert "create" not in edit[("unwind.dev", "approvals")]
    # editors ask for rollbacks (spec.rollback, stamped by the webhook); entries stay the gateway's
    assert edit[("unwind.dev", "effectledgers")] == {"get", "list", "watch", "patch"}
    assert ("unwind.dev", "effectledgers/status") not in edit


def gateway_role(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return named(objects, "ClusterRole", "unwind-gateway")


def test_the_gateway_role_grants_exactly_what_the_sidecar_uses(chart: Any) -> None:
    role = gateway_role(render(chart))
    assert rules_table(role) == EXPECTED_GATEWAY_RULES
    assert not [k for k in role["metadata"]["labels"] if "aggregate-to" in k]  # bound on purpose


def test_a_gateway_that_authenticates_callers_may_review_tokens_and_read_serviceaccounts_only(
        chart: Any) -> None:
    objects = render(chart)
    assert rules_table(named(objects, "ClusterRole", "unwind-gateway-tokenreview")) == {
        ("authentication.k8s.io", "tokenreviews"): {"create"},
        ("authorization.k8s.io", "subjectaccessreviews"): {"create"}}
    assert rules_table(named(objects, "ClusterRole", "unwind-gateway-callers")) == {
        ("", "serviceaccounts"): {"get"}}


def test_the_gateway_writes_ledgers_only_through_the_status_and_never_deletes_them(chart: Any) -> None:
    table = rules_table(gateway_role(render(chart)))
    assert not {"update", "patch", "delete", "deletecollection"} & table[("unwind.dev", "effectledgers")]
    assert table[("unwind.dev", "effectledgers/status")] == {"get", "update", "patch"}


def test_the_gateway_may_create_get_and_delete_leases_and_nothing_more(chart: Any) -> None:
    rules = [r for r in gateway_role(render(chart))["rules"] if "leases" in r["resources"]]
    assert rules == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                      "verbs": ["create", "get", "delete"]}]


def test_the_gateway_reads_only_the_bundles_configmaps_by_name(chart: Any) -> None:
    from unwind.bundle import BUNDLE_NAME, shard_names

    rules = [r for r in gateway_role(render(chart))["rules"] if "configmaps" in r["resources"]]
    assert len(rules) == 1
    assert rules[0]["verbs"] == ["get"]
    assert rules[0]["resourceNames"] == [BUNDLE_NAME, *shard_names()]


def test_the_gateway_reads_approvals_and_never_writes_them(chart: Any) -> None:
    table = rules_table(gateway_role(render(chart)))
    assert table[("unwind.dev", "approvals")] == {"get", "list", "watch"}


def test_every_service_account_may_read_the_trust_configmap_and_nothing_else_there(chart: Any) -> None:
    objects = render(chart)
    role = named(objects, "Role", "unwind-trust-reader")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"],
                              "resourceNames": ["unwind-trust"], "verbs": ["get"]}]
    binding = named(objects, "RoleBinding", "unwind-trust-reader")
    assert binding["metadata"]["namespace"] == NAMESPACE
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": "unwind-trust-reader"}
    assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                                    "name": "system:serviceaccounts"}]


def test_rbac_create_false_renders_no_rbac_objects(chart: Any) -> None:
    kinds = {obj["kind"] for obj in render(chart, {"rbac": {"create": False}})}
    assert not kinds & RBAC_KINDS
    assert "Deployment" in kinds


def test_service_account_create_false_uses_the_named_account(chart: Any) -> None:
    objects = render(chart, {"serviceAccount": {"create": False, "name": "platform-unwind"}})
    assert "ServiceAccount" not in {obj["kind"] for obj in objects}
    pod = only(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "platform-unwind"
    assert named(objects, "RoleBinding", "unwind-operator-keys")["subjects"][0]["name"] == "platform-unwind"


# --- values and schema ------------------------------------------------------------


def test_an_unknown_top_level_value_is_refused_by_the_schema(chart: Any) -> None:
    with pytest.raises(helm.HelmValuesError, match="replicaCount"):
        render(chart, {"replicaCount": 2})


def test_an_unknown_operator_setting_is_refused_by_the_schema(chart: Any) -> None:
    with pytest.raises(helm.HelmValuesError, match="bundleWindow"):
        render(chart, {"operator": {"bundleWindow": 3}})


def test_a_log_level_outside_the_list_is_refused_by_the_schema(chart: Any) -> None:
    with pytest.raises(helm.HelmValuesError, match="logLevel"):
        chart.validate_schema({"operator": {"logLevel": "verbose"}})


def test_lint_reports_an_unknown_value_as_an_error(chart_dir: Path) -> None:
    report = helm.lint(chart_dir, {"replicas": 3})
    assert any("replicas" in error for error in report["errors"])


def test_the_schema_is_draft_07_and_closed_at_the_top(chart: Any) -> None:
    schema = chart.schema
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert schema["additionalProperties"] is False
    for name in ("image", "operator", "serviceAccount", "rbac", "metrics", "resources"):
        assert schema["properties"][name]["additionalProperties"] is False, name


def test_every_default_value_is_declared_in_the_schema(chart: Any) -> None:
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    undeclared = [p for p in value_paths(chart.values) if schema_node(schema, p) is None]
    assert undeclared == []


def test_every_value_is_documented_by_a_comment_in_values_yaml(chart: Any) -> None:
    commented: set[str] = set()  # dotted paths of keys with a comment right above them
    stack: list[tuple[int, str]] = []  # (indent, key) of the enclosing keys
    previous = ""
    for line in (CHART_DIR / "values.yaml").read_text().splitlines():
        match = re.match(r"^(\s*)([A-Za-z][\w-]*):", line)
        if match:
            indent = len(match.group(1))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, match.group(2)))
            if previous.lstrip().startswith("#"):
                commented.add(".".join(key for _, key in stack))
        if line.strip():
            previous = line

    def documented(path: str) -> bool:
        parts = path.split(".")
        return any(".".join(parts[:n]) in commented for n in range(1, len(parts) + 1))

    assert [p for p in value_paths(chart.values) if not documented(p)] == []


def test_every_value_is_listed_in_the_chart_docs(chart: Any) -> None:
    docs = DOCS.read_text()
    missing = [p for p in value_paths(chart.values) if f"`{p}`" not in docs]
    assert missing == []


def test_the_notes_say_how_to_check_the_operator_and_where_trust_lives(chart: Any) -> None:
    notes = chart.render(name=RELEASE, namespace=NAMESPACE)["unwind/templates/NOTES.txt"]
    assert "kubectl get toolmanifests -A" in notes
    assert "rollout status deployment/unwind-operator" in notes
    assert "configmap unwind-trust" in notes
    assert NAMESPACE in notes


def test_the_operator_runs_with_two_malloc_arenas_as_benchmarked(chart: Any) -> None:
    env = {e["name"]: e.get("value") for e in operator_container(render(chart))["env"]}
    assert env["MALLOC_ARENA_MAX"] == "2"


# --- the alerting rules as a PrometheusRule (issue 18 #9) -------------------------------------


def test_no_prometheus_rule_is_rendered_unless_asked_for(chart: Any) -> None:
    assert [o for o in render(chart) if o["kind"] == "PrometheusRule"] == []


def test_the_prometheus_rule_carries_the_checked_rules_for_this_releases_metrics_job(chart: Any) -> None:
    """The rules promtool checks (files/unwind-alerts.yaml), whole; the rules that read `up`
    name the metrics Service of this release, and the labels a Prometheus selects by are set."""
    values = {"metrics": {"prometheusRule": {"enabled": True, "labels": {"release": "kps"}}}}
    manifests = chart.render(values, name="r", namespace=NAMESPACE, is_install=True)
    (rule,) = [doc for doc in yaml.safe_load_all(manifests["unwind/templates/prometheusrule.yaml"]) if doc]
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["metadata"]["name"] == "r-unwind" and rule["metadata"]["namespace"] == NAMESPACE
    assert rule["metadata"]["labels"]["release"] == "kps"
    source = (CHART_DIR / "files" / "unwind-alerts.yaml").read_text()
    expected = yaml.safe_load(source.replace('job="unwind-metrics"', 'job="r-unwind-metrics"'))
    assert rule["spec"] == {"groups": expected["groups"]}
    assert 'job="unwind-metrics"' in source  # else the replacement above proves nothing
    service = yaml.safe_load(manifests["unwind/templates/service-metrics.yaml"])
    assert service["metadata"]["name"] == "r-unwind-metrics"


def test_a_prometheus_rule_label_that_is_not_a_string_is_refused_by_the_schema(chart: Any) -> None:
    with pytest.raises(helm.HelmValuesError):
        chart.render({"metrics": {"prometheusRule": {"enabled": True, "labels": {"release": 1}}}},
                     name=RELEASE, namespace=NAMESPACE, is_install=True)


def test_the_charts_minimum_kubernetes_is_the_docs_and_the_native_sidecars_and_what_runs_here_meets_it() -> None:
    from unwind.controlplane.build import PARTS
    from unwind.operator.inject import NATIVE_SINCE

    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    major, minor = NATIVE_SINCE
    assert chart["kubeVersion"] == f">={major}.{minor}.0-0"
    assert f"Kubernetes **{major}.{minor} or newer** (the chart's `kubeVersion`" in (ROOT / "docs" / "install.md").read_text()
    assert f'`kubeVersion: ">={major}.{minor}.0-0"`' in (ROOT / "docs" / "chart.md").read_text()
    for part in PARTS:  # the control plane and the node run here
        assert tuple(int(n) for n in part.kube_version.split(".")[:2]) >= NATIVE_SINCE


def test_shared_gateways_add_exactly_the_operators_rules_for_them_and_their_settings(
        chart: Any) -> None:
    values = {"sharedGateway": {"enabled": True, "replicas": 3,
                                "rateLimits": {"actor": {"requests": 9, "per": "1m"}}}}
    objects = render(chart, values)
    table = rules_table(named(objects, "ClusterRole", "unwind-operator"))
    added = {k: v for k, v in table.items() if EXPECTED_CLUSTER_RULES.get(k) != v}
    assert added == {
        ("apps", "deployments"): {"get", "create", "update", "delete"},
        ("", "services"): {"get", "create", "update", "delete"},
        ("", "serviceaccounts"): {"get", "create", "update", "delete"},
        ("rbac.authorization.k8s.io", "rolebindings"): {"get", "create", "update", "delete"},
        ("rbac.authorization.k8s.io", "clusterrolebindings"): {"get", "create", "update", "delete"},
    }
    bind = [r for r in named(objects, "ClusterRole", "unwind-operator")["rules"]
            if r["verbs"] == ["bind"]]
    assert bind[0]["resourceNames"] == ["unwind-gateway", "unwind-gateway-callers",
                                        "unwind-gateway-tokenreview"]
    container = named(objects, "Deployment", "unwind-operator")["spec"]["template"]["spec"][
        "containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    settings = json.loads(env["UNWIND_SHARED_GATEWAYS"])
    assert settings["replicas"] == 3 and settings["rolePrefix"] == "unwind"
    assert settings["rateLimits"] == {"actor": {"requests": 9, "per": "1m"}}
    assert "UNWIND_SHARED_GATEWAYS" not in {e["name"] for e in named(
        render(chart), "Deployment", "unwind-operator")["spec"]["template"]["spec"][
            "containers"][0]["env"]}
