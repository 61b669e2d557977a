"""Sidecar injection as a pure function: what the webhook adds to a labelled pod."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from unwind.manifest.validate import validate_manifest
from unwind.operator.inject import (
    CONTAINER,
    DEFAULT_API_AUDIENCES,
    SA_TOKEN_PATH,
    Sidecar,
    gateway_parts,
    header_secrets,
    inject,
    isolation_problems,
    native_sidecars,
    server_version,
)
from unwind.operator.injected import isolation_of
from unwind.registry.signing import TrustStore

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
    assert gateway["command"][-4:] == ["--listen", "127.0.0.1:8787", "--status-listen", "0.0.0.0:8788"]
    assert gateway["securityContext"]["readOnlyRootFilesystem"] is True
    assert gateway["resources"]["limits"]["memory"] == "256Mi"


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
    injected = apply(pod(), inject(pod(), "shop", "shop:read", {"stripe-key"}, SIDECAR))
    assert isolation_of(injected, "shop", "shop:read", {"stripe-key"}, SIDECAR,
                        DEFAULT_API_AUDIENCES) == []  # judged without the webhook's own gateway


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


# ---- the token Kubernetes mounts, as the API server sends the pod to the webhook ----

PLUGIN_SOURCES = [
    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
    {"downwardAPI": {"items": [{"path": "namespace",
                                "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]


def defaulted_pod(token_volume: dict[str, Any]) -> dict[str, Any]:
    """A Job's agent pod after defaulting and the ServiceAccount admission plugin: the token
    volume mounted read-only in the init container and the container, beside a volume of
    the pod's own."""
    token = {"name": token_volume["name"], "readOnly": True, "mountPath": SA_TOKEN_PATH}
    work = {"name": "work", "mountPath": "/work"}
    def container(name: str, mounts: list[dict[str, Any]]) -> dict[str, Any]:
        return {"name": name, "image": f"registry.example/{name}:1", "imagePullPolicy": "IfNotPresent",
                "resources": {}, "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File", "volumeMounts": mounts}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "nightly-42-", "namespace": "shop",
                         "labels": {"unwind.dev/inject": "true", "job-name": "nightly-42"}},
            "spec": {"serviceAccountName": "agent", "serviceAccount": "agent", "restartPolicy": "Never",
                     "dnsPolicy": "ClusterFirst", "schedulerName": "default-scheduler", "securityContext": {},
                     "terminationGracePeriodSeconds": 30, "enableServiceLinks": True, "priority": 0,
                     "initContainers": [container("fetch", [dict(work), dict(token)])],
                     "containers": [container("agent", [dict(work), dict(token)])],
                     "volumes": [{"name": "work", "emptyDir": {}}, token_volume],
                     "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                                      "effect": "NoExecute", "tolerationSeconds": 300}]}}


SECRET_TOKEN = {"name": "agent-token-x2v9q", "secret": {"secretName": "agent-token-x2v9q", "defaultMode": 420}}
PROJECTED_TOKEN = {"name": "kube-api-access-7hq2z",
                   "projected": {"sources": copy.deepcopy(PLUGIN_SOURCES), "defaultMode": 420}}


@pytest.mark.parametrize("token_volume", [SECRET_TOKEN, PROJECTED_TOKEN], ids=["1.20-secret", "1.22-projected"])
@pytest.mark.parametrize("native", [False, True], ids=["container", "native"])
def test_the_token_kubernetes_mounted_is_taken_back_from_every_agent_container(
        token_volume: dict[str, Any], native: bool) -> None:
    p = defaulted_pod(copy.deepcopy(token_volume))
    assert isolation_problems(p) == []
    out = apply(p, inject(p, "shop", "shop:read", set(), Sidecar("unwind:1", "unwind-system", native=native)))
    for c in [*out["spec"]["initContainers"], *out["spec"]["containers"]]:
        if c["name"] != CONTAINER:
            assert c["volumeMounts"] == [{"name": "work", "mountPath": "/work"}], c["name"]
    names = [v["name"] for v in out["spec"]["volumes"]]
    assert token_volume["name"] not in names and "work" in names
    assert out["spec"]["automountServiceAccountToken"] is False
    sidecar = Sidecar("unwind:1", "unwind-system", native=native)
    assert isolation_of(out, "shop", "shop:read", set(), sidecar, DEFAULT_API_AUDIENCES) == []


def test_a_projected_api_token_is_the_pods_own_unless_the_plugin_made_it() -> None:
    def problems(volume: dict[str, Any], mount_path: str = SA_TOKEN_PATH) -> list[str]:
        p = defaulted_pod(volume)
        p["spec"]["containers"][0]["volumeMounts"][1]["mountPath"] = mount_path
        return isolation_problems(p)

    plugin = copy.deepcopy(PROJECTED_TOKEN)
    assert problems(plugin) == []
    # the same name and sources mounted somewhere else in one container: declared by the pod
    assert [x.split(":")[0] for x in problems(copy.deepcopy(plugin), "/tokens")] == [
        "spec.volumes[1].projected.sources[0].serviceAccountToken"]
    # the plugin's sources under another name
    own = {**copy.deepcopy(plugin), "name": "api-token"}
    assert len(problems(own)) == 1
    # the plugin's name with a source the plugin never adds
    extra = copy.deepcopy(plugin)
    extra["projected"]["sources"].append({"secret": {"name": "db"}})
    assert len(problems(extra)) == 1
    # a token for another audience beside the plugin's stays allowed
    p = defaulted_pod(copy.deepcopy(plugin))
    p["spec"]["volumes"].append({"name": "aws", "projected": {"sources": [
        {"serviceAccountToken": {"path": "t", "audience": "sts.amazonaws.com", "expirationSeconds": 3600}}]}})
    p["spec"]["containers"][0]["volumeMounts"].append({"name": "aws", "mountPath": "/var/run/aws"})
    assert isolation_problems(p) == []
    out = apply(p, inject(p, "shop", "", set(), SIDECAR))
    agent = next(c for c in out["spec"]["containers"] if c["name"] == "agent")
    assert {m["name"] for m in agent["volumeMounts"]} == {"work", "aws"}


# ---- the gateway's two forms ----

NATIVE = Sidecar("registry.example/unwind:0.1.0", "unwind-system", native=True)


def probe(path: str, **timing: int) -> dict[str, Any]:
    return {"httpGet": {"path": f"/{path}", "port": 8788, "scheme": "HTTP"},
            "periodSeconds": 10, "timeoutSeconds": 2, "failureThreshold": 3, **timing}


def test_from_1_29_the_gateway_is_a_native_sidecar_before_the_pods_own_init_containers() -> None:
    p = defaulted_pod(copy.deepcopy(PROJECTED_TOKEN))
    out = apply(p, inject(p, "shop", "shop:read", {"stripe-key"}, NATIVE))
    assert [c["name"] for c in out["spec"]["initContainers"]] == [CONTAINER, "fetch"]
    assert [c["name"] for c in out["spec"]["containers"]] == ["agent"]
    gateway = out["spec"]["initContainers"][0]
    secret_mount = next(m for m in gateway["volumeMounts"] if m["mountPath"] == "/etc/unwind/secrets/stripe-key")
    assert gateway == {
        "name": "unwind-gateway", "image": "registry.example/unwind:0.1.0", "imagePullPolicy": "IfNotPresent",
        "command": ["unwind", "gateway", "--cluster", "--listen", "127.0.0.1:8787",
                    "--status-listen", "0.0.0.0:8788"],
        "ports": [{"name": "unwind-status", "containerPort": 8788, "protocol": "TCP"}],
        "env": [
            {"name": "UNWIND_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "UNWIND_OPERATOR_NAMESPACE", "value": "unwind-system"},
            {"name": "UNWIND_RUN", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "UNWIND_SCOPES", "value": "shop:read"},
            {"name": "UNWIND_ACTOR", "value": "system:serviceaccount:shop:agent"},
            {"name": "UNWIND_TOKEN_FILE", "value": "/var/run/secrets/unwind/token"},
            {"name": "UNWIND_CA_FILE", "value": "/var/run/secrets/unwind/ca.crt"},
            {"name": "UNWIND_SECRETS_DIR", "value": "/etc/unwind/secrets"}],
        "volumeMounts": [{"name": "unwind-token", "mountPath": "/var/run/secrets/unwind", "readOnly": True},
                         {"name": "unwind-tmp", "mountPath": "/tmp"},
                         {"name": secret_mount["name"], "mountPath": "/etc/unwind/secrets/stripe-key",
                          "readOnly": True}],
        "resources": {"requests": {"cpu": "100m", "memory": "96Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}},
        "readinessProbe": probe("readyz", periodSeconds=5),
        "livenessProbe": probe("healthz"),
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "readOnlyRootFilesystem": True,
                            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "restartPolicy": "Always",
        "startupProbe": probe("readyz", periodSeconds=1, failureThreshold=120),
    }
    assert inject(out, "shop", "shop:read", {"stripe-key"}, NATIVE) == []  # idempotent
    assert inject(out, "shop", "shop:read", {"stripe-key"}, SIDECAR) == []  # whichever form finds it
    assert isolation_of(out, "shop", "shop:read", {"stripe-key"}, NATIVE, DEFAULT_API_AUDIENCES) == []


def test_a_native_sidecar_in_a_pod_without_init_containers_starts_the_list() -> None:
    ops = inject(pod(), "shop", "x", set(), NATIVE)
    [add] = [op for op in ops if op["path"].startswith("/spec/initContainers")]
    assert add["path"] == "/spec/initContainers" and [c["name"] for c in add["value"]] == [CONTAINER]
    out = apply(pod(), ops)
    assert [c["name"] for c in out["spec"]["initContainers"]] == [CONTAINER]
    assert [c["name"] for c in out["spec"]["containers"]] == ["agent"]


def test_before_1_29_the_gateway_is_a_container_its_agent_ends_with_quitquitquit() -> None:
    out = apply(pod(), inject(pod(), "shop", "x", set(), SIDECAR))
    gateway = out["spec"]["containers"][-1]
    assert gateway["name"] == CONTAINER and "initContainers" not in out["spec"]
    assert {"name": "UNWIND_QUIT_ENDPOINT", "value": "1"} in gateway["env"]
    assert "restartPolicy" not in gateway and "startupProbe" not in gateway
    native = apply(pod(), inject(pod(), "shop", "x", set(), NATIVE))["spec"]["initContainers"][0]
    assert "UNWIND_QUIT_ENDPOINT" not in {e["name"] for e in native["env"]}  # the kubelet stops it


@pytest.mark.parametrize(("major", "minor", "git", "expected"), [
    ("1", "29", "v1.29.0", (1, 29)),
    ("1", "29+", "v1.29.4-gke.1043002", (1, 29)),  # GKE, EKS
    ("1", "30+", "v1.30.2-eks-1552ad0", (1, 30)),
    ("", "", "v1.28.9+k3s1", (1, 28)),  # a build that leaves major and minor empty
    ("1", "", "v1.31.0", (1, 31)),
    ("1", "20", "v1.20.15", (1, 20)),
    ("", "", "v0.0.0-master+$Format:%H$", (0, 0)),  # built from a source tree without tags
    (None, None, None, None),
    ("x", "y", "unknown", None),
])
def test_the_api_servers_version_is_read_from_major_minor_then_git_version(
        major: Any, minor: Any, git: Any, expected: tuple[int, int] | None) -> None:
    assert server_version(major, minor, git) == expected


def test_auto_chooses_the_native_sidecar_from_1_29_and_the_container_when_unsure() -> None:
    assert [native_sidecars("auto", v) for v in [(1, 28), (1, 29), (1, 30), (2, 0), None]] == [
        False, True, True, True, False]
    assert native_sidecars("native", (1, 20)) is True
    assert native_sidecars("container", (1, 31)) is False
    with pytest.raises(ValueError, match=r"'sidecars'.*auto, native, container"):
        native_sidecars("sidecars", None)


def test_the_operator_reads_the_version_once_and_falls_back_to_the_container(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes import client

    from unwind.operator import handlers

    asked: list[int] = []

    class Version:
        def __init__(self, api: Any) -> None:
            pass

        def get_code(self) -> Any:
            asked.append(1)
            if answer is None:
                raise OSError("connection refused")
            return client.VersionInfo(major="1", minor="30+", git_version="v1.30.1-gke.1", build_date="",
                                      compiler="", git_commit="", git_tree_state="", go_version="",
                                      platform="")

    monkeypatch.setattr(handlers.client, "VersionApi", Version)
    answer: Any = True
    assert handlers.sidecar_form(None, "auto") is True  # type: ignore[arg-type]
    assert handlers.sidecar_form(None, "container") is False  # type: ignore[arg-type]
    answer = None
    assert handlers.sidecar_form(None, "auto") is False  # type: ignore[arg-type]
    assert len(asked) == 2  # only auto asks
    with pytest.raises(ValueError, match="UNWIND_SIDECAR_MODE"):
        handlers.sidecar_form(None, "yes")  # type: ignore[arg-type]


def test_the_sidecar_mode_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from unwind.operator.handlers import Config

    assert Config("unwind-system").sidecar_mode == "auto"
    monkeypatch.setenv("UNWIND_SIDECAR_MODE", "container")
    assert Config("unwind-system").sidecar_mode == "container"


def test_the_kubelet_stand_in_finds_the_gateway_in_either_form() -> None:
    from types import SimpleNamespace

    from unwind.controlplane.node import has_sidecar

    def k8s(pod: dict[str, Any]) -> Any:
        spec = pod["spec"]
        return SimpleNamespace(spec=SimpleNamespace(
            containers=[SimpleNamespace(name=c["name"]) for c in spec["containers"]],
            init_containers=[SimpleNamespace(name=c["name"]) for c in spec.get("initContainers") or []] or None))

    assert not has_sidecar(k8s(pod()))
    assert has_sidecar(k8s(apply(pod(), inject(pod(), "shop", "x", set(), SIDECAR))))
    assert has_sidecar(k8s(apply(pod(), inject(pod(), "shop", "x", set(), NATIVE))))


# ---- a crafted bundle: never "admitted without a gateway" --------------------------------

def _signed_bundle() -> tuple[dict[str, dict[str, str]], TrustStore, Any]:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from unwind.bundle import BundleEntry, build_bundle
    from unwind.manifest.canonical import canonical_json, checksum_bytes
    from unwind.registry.signing import sign

    key = Ed25519PrivateKey.generate()
    spec = {"tool": "stripe.refund", "effect": "idempotent", "permission": "payments:refund",
            "upstream": {"url": "https://api.example/refunds",
                         "headers": {"Authorization": {"secretKeyRef": {"name": "stripe", "key": "token"}}}}}
    model, _ = validate_manifest(spec)
    assert model is not None
    blob = canonical_json(model.canonical_dict())
    data = build_bundle("shop", [BundleEntry("stripe.refund", 1, checksum_bytes(blob), blob, "refund")],
                        generation=1, high_water={"stripe.refund": 1}, signer=lambda m: sign(key, m))
    return data, TrustStore([key.public_key()]), key


CRAFTED = {
    "NaN": '{"apiVersion":"unwind.dev/v1alpha1","kind":"ToolBundle","namespace":"shop","generation":NaN,'
           '"tools":{},"signature":{"key_id":"k","value":"AAAA"}}',
    "a number out of range": '{"namespace":"shop","generation":1e400,"signature":{"key_id":"k","value":"AAAA"}}',
    "deep nesting": "[" * 100000 + "]" * 100000,
    "deep objects": '{"a":' * 50000 + "1" + "}" * 50000,
    "truncated JSON": '{"apiVersion":"unwind.dev/v1alph',
    "a value that is not text": 5,
}


@pytest.mark.parametrize("index", CRAFTED.values(), ids=CRAFTED.keys())
def test_a_crafted_bundle_refuses_the_labelled_pod_instead_of_admitting_it_without_its_gateway(index: Any) -> None:
    from unwind.operator.admission import Refused
    from unwind.operator.inject import gateway_secrets

    data, trust, _ = _signed_bundle()
    assert gateway_secrets(data, trust, "shop") == {"stripe"}
    data["unwind-bundle"]["index.json"] = index
    with pytest.raises(Refused) as refused:
        gateway_secrets(data, trust, "shop")
    assert refused.value.code == 503
    message = str(refused.value)
    assert message.startswith("the namespace's signed bundle unwind-bundle cannot be read (")
    assert "not admitted without its gateway" in message and "the operator rewrites it on its next reconcile" in message


def test_a_bundle_configmap_of_the_wrong_shape_refuses_the_pod_too() -> None:
    from unwind.operator.admission import Refused
    from unwind.operator.inject import gateway_secrets

    _, trust, _ = _signed_bundle()
    with pytest.raises(Refused, match="unwind-bundle cannot be read"):
        gateway_secrets({"unwind-bundle": ["index.json"]}, trust, "shop")  # type: ignore[dict-item]


def test_a_namespace_without_a_bundle_yet_gets_the_gateway_without_secrets() -> None:
    from unwind.operator.inject import gateway_secrets

    _, trust, _ = _signed_bundle()
    assert gateway_secrets({}, trust, "shop") == set()


def test_an_edited_bundle_that_no_longer_verifies_refuses_the_pod() -> None:
    from unwind.operator.admission import Refused
    from unwind.operator.inject import gateway_secrets

    data, trust, _ = _signed_bundle()
    data["unwind-bundle"]["index.json"] = data["unwind-bundle"]["index.json"].replace('"generation":1', '"generation":2')
    with pytest.raises(Refused, match="bad_signature"):
        gateway_secrets(data, trust, "shop")


# ---- more ways to hand the agent what the gateway keeps -------------------------------------

def test_a_projected_token_for_an_audience_the_api_server_accepts_is_refused() -> None:
    def volume(audience: str) -> dict[str, Any]:
        return {"name": "tok", "projected": {"sources": [{"serviceAccountToken": {"path": "t", "audience": audience}}]}}

    for audience in ("https://kubernetes.default.svc", "https://kubernetes.default.svc.cluster.local/"):
        problems = isolation_problems(pod(volumes=[volume(audience)]))
        assert [p.split(": ")[0] for p in problems] == ["spec.volumes[0].projected.sources[0].serviceAccountToken"]
        assert "which the API server accepts" in problems[0]
    # the cluster's issuer, as the operator learns it from its own token or the chart
    issuer = "https://oidc.example/clusters/prod"
    assert isolation_problems(pod(volumes=[volume(issuer)])) == []
    from unwind.operator.inject import api_audiences

    audiences = api_audiences("https://api.example, other", _token({"iss": issuer, "aud": ["https://api.example"]}))
    assert {issuer, "https://api.example", "other", "https://kubernetes.default.svc"} <= audiences
    assert len(isolation_problems(pod(volumes=[volume(issuer)]), audiences=audiences)) == 1
    assert isolation_problems(pod(volumes=[volume("sts.amazonaws.com")]), audiences=audiences) == []


def _token(claims: dict[str, Any]) -> str:
    import base64
    import json

    def part(value: Any) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")
    return f"{part({'alg': 'RS256'})}.{part(claims)}.sig"


def test_the_operators_own_token_names_the_audiences_and_a_broken_one_names_none() -> None:
    from unwind.operator.inject import token_audiences

    assert token_audiences(_token({"iss": "https://i", "aud": "a"})) == {"https://i", "a"}
    assert token_audiences(_token({"iss": "kubernetes/serviceaccount"})) == {"kubernetes/serviceaccount"}
    assert token_audiences("not a token") == set() and token_audiences("a.%%%.c") == set()
    assert token_audiences(_token([1, 2])) == set()  # type: ignore[arg-type]


def test_the_upstream_secret_through_env_or_env_from_is_refused_with_its_field() -> None:
    p = pod()
    agent = p["spec"]["containers"][0]
    agent["env"] = [{"name": "A", "value": "1"}, {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "x"}}},
                    {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "stripe", "key": "token"}}},
                    {"name": "OWN", "valueFrom": {"secretKeyRef": {"name": "agent-own", "key": "k"}}}]
    p["spec"]["initContainers"] = [{"name": "fetch", "image": "x", "envFrom": [
        {"configMapRef": {"name": "settings"}}, {"secretRef": {"name": "stripe"}}]}]
    problems = isolation_problems(p, {"stripe"})
    assert [x.split(": ")[0] for x in problems] == ["spec.initContainers[0].envFrom[1].secretRef",
                                                    "spec.containers[0].env[2].valueFrom.secretKeyRef"]
    assert "Secret 'stripe' holds credentials this namespace's ToolManifests send upstream" in problems[0]
    assert isolation_problems(p, {"another"}) == []


def test_the_upstream_secret_as_a_volume_of_another_name_is_refused() -> None:
    p = pod(volumes=[{"name": "creds", "secret": {"secretName": "stripe"}},
                     {"name": "bundle", "projected": {"sources": [{"configMap": {"name": "c"}},
                                                                  {"secret": {"name": "stripe"}}]}},
                     {"name": "mine", "secret": {"secretName": "agent-own"}}])
    problems = isolation_problems(p, {"stripe"})
    assert [x.split(": ")[0] for x in problems] == ["spec.volumes[0].secret",
                                                    "spec.volumes[1].projected.sources[1].secret"]


def test_the_nodes_network_is_refused_for_an_agent_pod() -> None:
    problems = isolation_problems(pod(hostNetwork=True))
    assert [x.split(": ")[0] for x in problems] == ["spec.hostNetwork"]
    assert "127.0.0.1:8787" in problems[0]
    assert isolation_problems(pod(hostNetwork=False)) == []


def test_a_node_directory_or_a_privileged_container_is_refused_for_an_agent_pod() -> None:
    p = pod(volumes=[{"name": "node", "hostPath": {"path": "/var/lib/kubelet"}}])
    p["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    assert [x.split(": ")[0] for x in isolation_problems(p)] == [
        "spec.volumes[0].hostPath", "spec.containers[0].securityContext.privileged"]


def test_isolation_reads_any_shape_of_pod_without_crashing() -> None:
    weird: list[Any] = [{"spec": {"containers": "x", "volumes": {"a": 1}}},
                        {"spec": {"containers": [{"env": "x", "envFrom": [None, {"secretRef": "s"}]}],
                                  "volumes": [{"projected": {"sources": "x"}}, {"secret": None}]}},
                        {"spec": {"initContainers": [{"env": [{"valueFrom": None}]}]}}]
    for p in weird:
        assert isolation_problems(p, {"s"}) == []


def test_the_gateways_probes_are_http_gets_on_the_status_port_not_processes_in_its_cgroup() -> None:
    for sidecar in (SIDECAR, NATIVE):
        container, _ = gateway_parts(pod(), "shop", "x", set(), sidecar)
        probes = [container[k] for k in ("readinessProbe", "livenessProbe", "startupProbe") if k in container]
        assert len(probes) == (3 if sidecar.native else 2)
        assert all(set(p) - {"periodSeconds", "timeoutSeconds", "failureThreshold", "initialDelaySeconds"}
                   == {"httpGet"} and p["httpGet"]["port"] == 8788 for p in probes)
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        # the agent's door stays on loopback; only the status port is on the pod's address
        assert container["command"][-4:] == ["--listen", "127.0.0.1:8787", "--status-listen", "0.0.0.0:8788"]
