"""The shared gateway of a namespace, as a pure function: what the namespace should hold, and
what to change so it does.

Why: many small agent pods should not each pay a sidecar, and agents outside the cluster need
a gateway to reach. A Namespace annotated ``unwind.dev/shared-gateway: "true"`` gets one
Deployment of ``replicas`` gateways behind a Service ``unwind-gateway`` (port 8787, metrics
9464), the same enforcement, ledger and undo report as the sidecar. The replicas are
stateless between calls (the write-ahead ledger and the key locks live in the API server),
so any replica serves any call. Callers prove themselves (``--auth kubernetes``, and
``oauth`` when the chart configures an issuer); rate limits are shared through Redis.

Its identity (issue 29, item 10): a ServiceAccount ``unwind-gateway`` of the namespace, the
only holder of the gateway's rights (ClusterRole unwind-gateway, bound here), whose token only
the gateway's pods get; the upstream Secrets the bundle names are mounted into those pods
only. Agents calling it need no Unwind permission at all: their token proves who they are.

Everything this module writes carries ``unwind.dev/spec-hash``; a change of the desired
object changes the hash, and only then is it replaced. Objects it manages that the
namespace should no longer hold (the annotation removed) are deleted.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .inject import (
    CONTAINER,
    SECRETS_DIR,
    SECURITY_CONTEXT,
    STATUS_PORT,
    TOKEN_DIR,
    _probe,
    _volume_name,
)

NAME = "unwind-gateway"
ANNOTATION = "unwind.dev/shared-gateway"
LIMITS_ANNOTATION = "unwind.dev/rate-limits"  # a namespace's own limits (JSON), over the chart's
HASH = "unwind.dev/spec-hash"
LABELS = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/managed-by": "unwind-operator"}
PORT, METRICS_PORT = 8787, 9464
CONFIG_DIR = "/etc/unwind/gateway"
KINDS = ("ServiceAccount", "ConfigMap", "Service", "Deployment", "RoleBinding",
         "ClusterRoleBinding")


@dataclass(frozen=True)
class SharedSettings:
    """From the chart's ``sharedGateway`` values (operator flags)."""

    image: str
    operator_namespace: str
    role_prefix: str = "unwind"  # the chart's fullname: its ClusterRoles are <prefix>-gateway...
    replicas: int = 2
    pull_policy: str = "IfNotPresent"
    audience: str = "unwind-gateway"
    rate_limits: Mapping[str, Any] | None = None
    oauth: Mapping[str, Any] | None = None
    otel_endpoint: str = ""
    cpu: tuple[str, str] = ("100m", "1")
    memory: tuple[str, str] = ("96Mi", "192Mi")


@dataclass(frozen=True)
class Change:
    action: str  # create | replace | delete
    kind: str
    namespace: str  # "" for the cluster-scoped binding
    name: str
    body: dict[str, Any] | None = None
    resource_version: str = ""


def binding_name(namespace: str) -> str:
    return f"{NAME}-tokenreview-{namespace}"


def _meta(name: str, namespace: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": dict(LABELS)}
    if namespace is not None:
        meta["namespace"] = namespace
    return meta


def _hashed(obj: dict[str, Any]) -> dict[str, Any]:
    digest = hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode())
    obj["metadata"].setdefault("annotations", {})[HASH] = digest.hexdigest()[:32]
    return obj


def enabled(annotations: Mapping[str, str]) -> bool:
    return str(annotations.get(ANNOTATION, "")).strip().lower() == "true"


def limits_of(annotations: Mapping[str, str], settings: SharedSettings) -> Mapping[str, Any] | None:
    """The namespace's own rate limits (its annotation, checked) or the chart's."""
    text = annotations.get(LIMITS_ANNOTATION)
    if not text:
        return settings.rate_limits
    from ..gateway.ratelimit import LimitsConfig

    data = json.loads(text)  # a bad one raises ValueError: the caller reports it
    LimitsConfig.parse(data, f"the namespace annotation {LIMITS_ANNOTATION}")
    return dict(data)


def _role_binding(name: str, namespace: str, role: str, kind: str, ns: str | None) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
            "metadata": _meta(name, ns), "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": namespace}],
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role}}


def identity(namespace: str, role_prefix: str) -> list[dict[str, Any]]:
    """The namespace's gateway identity: ServiceAccount unwind-gateway, the only holder of the
    ClusterRole ``<prefix>-gateway`` there (a RoleBinding). The shared gateway runs as it, and
    every injected sidecar trades its pod's token for one of it (exchange.py), so it is kept
    whether or not the namespace asks for a shared gateway."""
    return [_hashed({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(NAME, namespace),
                     "automountServiceAccountToken": False}),
            _hashed(_role_binding(NAME, namespace, f"{role_prefix}-gateway", "RoleBinding", namespace))]


def desired(namespace: str, annotations: Mapping[str, str], settings: SharedSettings,
            secrets: Iterable[str]) -> list[dict[str, Any]]:
    """The objects of the namespace's shared gateway, and its identity (``identity``) in
    every namespace."""
    if not enabled(annotations):
        return identity(namespace, settings.role_prefix)
    limits = limits_of(annotations, settings)
    config: dict[str, str] = {}
    if limits:
        config["rate-limits.json"] = json.dumps(limits, sort_keys=True)
    if settings.oauth:
        config["oauth.json"] = json.dumps(settings.oauth, sort_keys=True)
    prefix = settings.role_prefix
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(NAME, namespace),
         "data": config},
        {"apiVersion": "v1", "kind": "Service", "metadata": _meta(NAME, namespace),
         "spec": {"selector": dict(LABELS), "ports": [
             {"name": "http", "port": PORT, "targetPort": PORT},
             {"name": "metrics", "port": METRICS_PORT, "targetPort": METRICS_PORT}]}},
        _deployment(namespace, settings, sorted(set(secrets)), config),
        _role_binding(f"{NAME}-callers", namespace, f"{prefix}-gateway-callers", "RoleBinding", namespace),
        _role_binding(binding_name(namespace), namespace, f"{prefix}-gateway-tokenreview", "ClusterRoleBinding",
                      None),
    ]
    return identity(namespace, prefix) + [_hashed(o) for o in objects]


def _deployment(namespace: str, s: SharedSettings, secrets: list[str],
                config: Mapping[str, str]) -> dict[str, Any]:
    hosts = [NAME, f"{NAME}.{namespace}", f"{NAME}.{namespace}.svc",
             f"{NAME}.{namespace}.svc.cluster.local"]
    auth = "kubernetes,oauth" if s.oauth else "kubernetes"
    command = ["unwind", "gateway", "--cluster", "--listen", f"0.0.0.0:{PORT}", "--auth", auth,
               "--audience", s.audience, "--metrics-listen", f"0.0.0.0:{METRICS_PORT}",
               # the probes' port, as in the sidecar: the kubelet's GET needs no token
               "--status-listen", f"0.0.0.0:{STATUS_PORT}"]
    if "rate-limits.json" in config:
        command += ["--rate-limits", f"{CONFIG_DIR}/rate-limits.json"]
    if "oauth.json" in config:
        command += ["--oauth-config", f"{CONFIG_DIR}/oauth.json"]
    env = [{"name": "UNWIND_NAMESPACE", "value": namespace},
           {"name": "UNWIND_OPERATOR_NAMESPACE", "value": s.operator_namespace},
           {"name": "UNWIND_ACTOR", "value": f"system:serviceaccount:{namespace}:{NAME}"},
           {"name": "UNWIND_TOKEN_FILE", "value": f"{TOKEN_DIR}/token"},
           {"name": "UNWIND_CA_FILE", "value": f"{TOKEN_DIR}/ca.crt"},
           {"name": "UNWIND_SECRETS_DIR", "value": SECRETS_DIR},
           {"name": "UNWIND_ALLOWED_HOSTS", "value": ",".join(hosts)}]
    if s.otel_endpoint:
        env += [{"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": s.otel_endpoint},
                {"name": "OTEL_SERVICE_NAME", "value": NAME}]
    mounts = [{"name": "token", "mountPath": TOKEN_DIR, "readOnly": True},
              {"name": "tmp", "mountPath": "/tmp"},
              {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
              *({"name": _volume_name(n), "mountPath": f"{SECRETS_DIR}/{n}", "readOnly": True}
                for n in secrets)]
    volumes = [{"name": "token", "projected": {"sources": [
                   {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}},
                   {"configMap": {"name": "kube-root-ca.crt",
                                  "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}},
               {"name": "tmp", "emptyDir": {"sizeLimit": "16Mi"}},
               {"name": "config", "configMap": {"name": NAME}},
               *({"name": _volume_name(n), "secret": {"secretName": n}} for n in secrets)]
    container = {
        "name": CONTAINER, "image": s.image, "imagePullPolicy": s.pull_policy,
        "command": command, "env": env, "volumeMounts": mounts,
        "ports": [{"name": "http", "containerPort": PORT},
                  {"name": "metrics", "containerPort": METRICS_PORT},
                  {"name": "unwind-status", "containerPort": STATUS_PORT, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": s.cpu[0], "memory": s.memory[0]},
                      "limits": {"cpu": s.cpu[1], "memory": s.memory[1]}},
        "readinessProbe": _probe("readyz"), "livenessProbe": _probe("healthz",
                                                                    initialDelaySeconds=10),
        "securityContext": copy.deepcopy(SECURITY_CONTEXT)}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(NAME, namespace),
            "spec": {"replicas": s.replicas, "selector": {"matchLabels": dict(LABELS)},
                     "strategy": {"type": "RollingUpdate",
                                  "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
                     "template": {"metadata": {"labels": dict(LABELS), "annotations": {
                         # a change of the configuration rolls the replicas
                         "unwind.dev/config-hash": hashlib.sha256(json.dumps(
                             dict(config), sort_keys=True).encode()).hexdigest()[:16]}}, "spec": {
                         "serviceAccountName": NAME, "automountServiceAccountToken": False,
                         "terminationGracePeriodSeconds": 30,
                         "securityContext": {"runAsNonRoot": True,
                                             "seccompProfile": {"type": "RuntimeDefault"}},
                         "containers": [container], "volumes": volumes}}}}


def changes(namespace: str, wanted: list[dict[str, Any]],
            current: Mapping[tuple[str, str], Mapping[str, Any] | None]) -> list[Change]:
    """``current``: (kind, name) -> the object as read (None: absent), for every object this
    module may manage in the namespace. Only objects labelled as ours are replaced or deleted:
    an object of the same name that someone else made is left alone (and reported by the
    caller when the create of ours fails)."""
    out: list[Change] = []
    seen = set()
    for obj in wanted:
        kind, meta = obj["kind"], obj["metadata"]
        key = (kind, meta["name"])
        seen.add(key)
        ns = meta.get("namespace", "")
        have = current.get(key)
        if have is None:
            out.append(Change("create", kind, ns, meta["name"], obj))
            continue
        have_meta = have.get("metadata") or {}
        if (have_meta.get("labels") or {}).get("app.kubernetes.io/managed-by") != \
                LABELS["app.kubernetes.io/managed-by"]:
            continue
        if (have_meta.get("annotations") or {}).get(HASH) != meta["annotations"][HASH]:
            out.append(Change("replace", kind, ns, meta["name"], obj,
                              str(have_meta.get("resourceVersion") or "")))
    for key, have in current.items():
        if have is None or key in seen:
            continue
        labels = (have.get("metadata") or {}).get("labels") or {}
        if labels.get("app.kubernetes.io/managed-by") == LABELS["app.kubernetes.io/managed-by"]:
            scoped = "" if key[0] == "ClusterRoleBinding" else namespace
            out.append(Change("delete", key[0], scoped, key[1]))
    return out


def managed_names(namespace: str) -> list[tuple[str, str]]:
    """Every (kind, name) this module may manage for ``namespace``: what the gather reads."""
    return [("ServiceAccount", NAME), ("ConfigMap", NAME), ("Service", NAME),
            ("Deployment", NAME), ("RoleBinding", NAME), ("RoleBinding", f"{NAME}-callers"),
            ("ClusterRoleBinding", binding_name(namespace))]
