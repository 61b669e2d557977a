"""Sidecar injection: what the mutating webhook adds to a pod labelled
``unwind.dev/inject: "true"``, as a pure function of the pod and what the operator knows.

The gateway container gets everything the pod's agent must not have:

- a token of the pod's ServiceAccount, projected into the gateway container only (the pod's
  ``automountServiceAccountToken`` is turned off, so the agent's containers get none), of the
  audience ``unwind-operator``: the gateway trades it at the operator for a token of
  ServiceAccount ``unwind-gateway`` bound to the pod (``Sidecar.exchange``, exchange.py), the
  only identity that writes ledgers; the agent's own ServiceAccount holds no Unwind right;
- the Secrets the namespace's manifests name for upstream headers, mounted into the
  gateway container only: the agent cannot call an upstream with those credentials;
- its scopes, read from the ServiceAccount's ``unwind.dev/scopes`` annotation *at
  admission* (a pod cannot widen them later), its run (annotation ``unwind.dev/run``,
  else the pod's name) and its actor (the ServiceAccount).

The gateway takes one of two forms (``Sidecar.native``, chosen by the operator from the
API server's version, ``native_sidecars``):

- from Kubernetes 1.29 a *native sidecar*: the first entry of ``spec.initContainers`` with
  ``restartPolicy: Always`` and a startup probe, so it starts before the pod's own init
  containers, the agent's containers start only once it is ready, and it is stopped when
  they have ended: a pod (or Job) whose agent finishes completes;
- before 1.29 a plain container (native sidecars do not run there), which would keep the
  pod Running after its agent ended; it gets ``UNWIND_QUIT_ENDPOINT=1`` instead, and the
  agent ends it with ``POST /quitquitquit`` (``unwind.gateway.quit``).

Both forms pass the Pod Security Standards' ``restricted`` profile (non-root, no
privilege escalation, every capability dropped, the runtime's default seccomp profile):
a compliant pod stays compliant with the gateway in it.

Injection is idempotent (a pod that already has the gateway, in either form, is left
alone) and fails closed for labelled pods: a labelled pod is a request to be governed, so
it is never admitted without its gateway. The webhook selects only labelled pods (failure
policy Fail: with the operator down the API server refuses them, and every other pod is
admitted as usual), and trouble inside it refuses the pod too: an unreadable bundle
(``gateway_secrets``), an API error, an operator started without a gateway image.

A pod whose own spec would hand the agent what the gateway keeps from it
(``isolation_problems``: a shared process namespace, the node's network, processes or
files, the gateway's volumes, an API token of its own, the upstream Secrets) is refused
with what to change. The token the ServiceAccount admission plugin mounted (the
Secret-based ``<sa>-token-*`` volume before 1.22, the projected ``kube-api-access-*`` volume
from 1.22 on) is not the pod's own: it is taken back from the agent's containers.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..bundle import BundleData, BundleError, load_bundle
from ..gateway.quit import ENV as QUIT_ENV
from ..registry.signing import TrustStore
from .admission import Refused

CONTAINER = "unwind-gateway"
INJECT_LABEL = "unwind.dev/inject"
RUN_ANNOTATION = "unwind.dev/run"
SCOPES_ANNOTATION = "unwind.dev/scopes"
INJECTED_ANNOTATION = "unwind.dev/injected"
TOKEN_DIR = "/var/run/secrets/unwind"
SECRETS_DIR = "/etc/unwind/secrets"
PORT = 8787
STATUS_PORT = 8788  # the probes' port (gateway/status.py): /healthz and /readyz, nothing else
TOKEN_VOLUME, TMP_VOLUME, SECRET_VOLUME_PREFIX = "unwind-token", "unwind-tmp", "unwind-s-"
# the audience of the token projected into the gateway with an exchange: the operator's,
# which the API server does not accept (exchange.py trades it for unwind-gateway's)
EXCHANGE_AUDIENCE = "unwind-operator"


@dataclass(frozen=True)
class Sidecar:
    """What the operator puts in every sidecar (from its flags and the chart)."""

    image: str
    operator_namespace: str
    pull_policy: str = "IfNotPresent"
    command: tuple[str, ...] = ("unwind", "gateway", "--cluster")
    # Small requests, so the pod fits on its agent's node; limits that do not throttle the
    # gateway under a burst of calls (each is ~0.65 ms of CPU) or kill it for a page of ledger
    cpu: tuple[str, str] = ("100m", "1")
    memory: tuple[str, str] = ("96Mi", "256Mi")
    native: bool = False  # a native sidecar (Kubernetes >= 1.29), else a plain container
    # where the gateway trades its pod's token for one of unwind-gateway (exchange.py):
    # (url, CA PEM, TLS server name); None: it acts as the pod's ServiceAccount (the way before)
    exchange: tuple[str, str, str] | None = None


NATIVE_SINCE = (1, 29)  # restartPolicy: Always on an init container is on by default from 1.29
SIDECAR_MODES = ("auto", "native", "container")


def server_version(major: Any, minor: Any, git_version: Any = "") -> tuple[int, int] | None:
    """(major, minor) of an API server from its ``/version`` answer. Providers decorate
    the minor ("29+" on GKE and EKS); ``gitVersion`` ("v1.29.4-gke.1043002") is read when
    major and minor say nothing. None when neither does."""
    def leading(text: Any) -> int | None:
        found = re.match(r"\s*(\d+)", str(text or ""))
        return int(found.group(1)) if found else None

    pair = leading(major), leading(minor)
    if pair[0] is not None and pair[1] is not None:
        return pair[0], pair[1]
    found = re.match(r"\s*v?(\d+)\.(\d+)", str(git_version or ""))
    return (int(found.group(1)), int(found.group(2))) if found else None


def native_sidecars(mode: str, version: tuple[int, int] | None) -> bool:
    """Whether to inject a native sidecar: ``native`` and ``container`` say so; ``auto``
    (the default) when the API server is 1.29 or later. An unknown version gets the plain
    container, which runs everywhere."""
    if mode not in SIDECAR_MODES:
        raise ValueError(f"sidecar mode {mode!r} (UNWIND_SIDECAR_MODE, --sidecar-mode): give one of "
                         f"{', '.join(SIDECAR_MODES)} (auto: a native sidecar from Kubernetes 1.29 on)")
    if mode != "auto":
        return mode == "native"
    return version is not None and version >= NATIVE_SINCE


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _volume_name(secret: str) -> str:
    # a volume name is a DNS label: 63 characters; the Secret name can be a subdomain
    import hashlib

    clean = secret.replace(".", "-")[:40].strip("-")
    return f"{SECRET_VOLUME_PREFIX}{clean}-{hashlib.sha256(secret.encode()).hexdigest()[:8]}"


def _has_gateway(spec: Mapping[str, Any]) -> bool:
    """Whether the gateway is in the pod already, in either form."""
    lists = [spec.get(kind) for kind in ("initContainers", "containers")]
    return any(isinstance(c, Mapping) and c.get("name") == CONTAINER
               for items in lists if isinstance(items, list) for c in items)


def has_gateway(pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec")
    return isinstance(spec, Mapping) and _has_gateway(spec)


# What the gateway's container asks of the node: the Pod Security Standards' restricted
# profile, set on the container so it holds whatever the pod's own securityContext says.
SECURITY_CONTEXT: dict[str, Any] = {
    "runAsNonRoot": True, "runAsUser": 65532, "readOnlyRootFilesystem": True,
    "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"}}


def _probe(path: str, **timing: int) -> dict[str, Any]:
    # httpGet to the status port: the kubelet's own GET, no process in the gateway's cgroup
    # (an exec of `unwind probe` cost 0.5 s of CPU a probe, and got the gateway killed)
    return {"httpGet": {"path": f"/{path}", "port": STATUS_PORT, "scheme": "HTTP"},
            "periodSeconds": 10, "timeoutSeconds": 2, "failureThreshold": 3, **timing}


def gateway_container(sidecar: Sidecar, env: list[dict[str, Any]],
                      mounts: list[dict[str, Any]]) -> dict[str, Any]:
    """The gateway's container in the form ``sidecar.native`` says (see the module's doc)."""
    container: dict[str, Any] = {
        "name": CONTAINER, "image": sidecar.image, "imagePullPolicy": sidecar.pull_policy,
        "command": [*sidecar.command, "--listen", f"127.0.0.1:{PORT}",
                    "--status-listen", f"0.0.0.0:{STATUS_PORT}"],
        "ports": [{"name": "unwind-status", "containerPort": STATUS_PORT, "protocol": "TCP"}],
        "env": env if sidecar.native else [*env, {"name": QUIT_ENV, "value": "1"}],
        "volumeMounts": mounts,
        "resources": {"requests": {"cpu": sidecar.cpu[0], "memory": sidecar.memory[0]},
                      "limits": {"cpu": sidecar.cpu[1], "memory": sidecar.memory[1]}},
        "readinessProbe": _probe("readyz", periodSeconds=5),
        # liveness: 3 misses in a row, 30 s, before a restart; the startup probe (native) or
        # the delay (plain container) covers the start
        "livenessProbe": _probe("healthz", **({} if sidecar.native else {"initialDelaySeconds": 10})),
        "securityContext": copy.deepcopy(SECURITY_CONTEXT),
    }
    if sidecar.native:
        # the pod's next init container, and so its agent, starts once this succeeds: the
        # gateway has its bundle (2 minutes, then the kubelet restarts it)
        container["restartPolicy"] = "Always"
        container["startupProbe"] = _probe("readyz", periodSeconds=1, failureThreshold=120)
    return container


def gateway_parts(pod: Mapping[str, Any], namespace: str, scopes: str | None, secrets: Iterable[str],
                  sidecar: Sidecar) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The gateway's container and volumes exactly as ``inject`` writes them for ``pod``."""
    spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
    assert isinstance(spec, Mapping)
    meta = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
    assert isinstance(meta, Mapping)
    annotations = meta.get("annotations") or {}
    account = str(spec.get("serviceAccountName") or spec.get("serviceAccount") or "default")
    run = annotations.get(RUN_ANNOTATION) if isinstance(annotations, Mapping) else None
    names = sorted(set(secrets))
    env: list[dict[str, Any]] = [
        {"name": "UNWIND_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "UNWIND_OPERATOR_NAMESPACE", "value": sidecar.operator_namespace},
        {"name": "UNWIND_RUN", **({"value": str(run)} if run else
                                  {"valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})},
        {"name": "UNWIND_SCOPES", "value": scopes or ""},
        {"name": "UNWIND_ACTOR", "value": f"system:serviceaccount:{namespace}:{account}"},
        {"name": "UNWIND_TOKEN_FILE", "value": f"{TOKEN_DIR}/token"},
        {"name": "UNWIND_CA_FILE", "value": f"{TOKEN_DIR}/ca.crt"},
        {"name": "UNWIND_SECRETS_DIR", "value": SECRETS_DIR},
    ]
    token: dict[str, Any] = {"path": "token", "expirationSeconds": 3600}
    if sidecar.exchange is not None:
        url, ca_pem, server_name = sidecar.exchange
        token["audience"] = EXCHANGE_AUDIENCE
        env += [{"name": "UNWIND_TOKEN_EXCHANGE", "value": url},
                {"name": "UNWIND_EXCHANGE_CA", "value": ca_pem},
                *([{"name": "UNWIND_EXCHANGE_SERVER_NAME", "value": server_name}] if server_name else [])]
    mounts: list[dict[str, Any]] = [
        {"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True},
        {"name": TMP_VOLUME, "mountPath": "/tmp"},
        *({"name": _volume_name(n), "mountPath": f"{SECRETS_DIR}/{n}", "readOnly": True} for n in names)]
    container = gateway_container(sidecar, env, mounts)
    volumes = [
        {"name": TOKEN_VOLUME, "projected": {"sources": [
            {"serviceAccountToken": token},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}},
        {"name": TMP_VOLUME, "emptyDir": {"sizeLimit": "16Mi"}},
        *({"name": _volume_name(n), "secret": {"secretName": n}} for n in names),
    ]
    return container, volumes


def inject(pod: Mapping[str, Any], namespace: str, scopes: str | None, secrets: Iterable[str],
           sidecar: Sidecar) -> list[dict[str, Any]]:
    """JSON patch operations adding the gateway to ``pod`` (empty when already there)."""
    spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
    assert isinstance(spec, Mapping)
    if _has_gateway(spec):
        return []
    meta = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
    assert isinstance(meta, Mapping)
    annotations = meta.get("annotations") or {}
    container, volumes = gateway_parts(pod, namespace, scopes, secrets, sidecar)
    ops = _remove_token_mounts(spec)  # first: their paths count the pod's containers as they are
    if not sidecar.native:
        ops.append({"op": "add", "path": "/spec/containers/-", "value": container})
    elif spec.get("initContainers"):  # first, so it runs before the pod's own init containers
        ops.append({"op": "add", "path": "/spec/initContainers/0", "value": container})
    else:
        ops.append({"op": "add", "path": "/spec/initContainers", "value": [container]})
    if spec.get("volumes"):
        ops += [{"op": "add", "path": "/spec/volumes/-", "value": v} for v in volumes]
    else:
        ops.append({"op": "add", "path": "/spec/volumes", "value": volumes})
    # no token for the agent's own containers: the gateway's projected one is the only copy
    ops.append({"op": "add", "path": "/spec/automountServiceAccountToken", "value": False})
    stamp = {INJECTED_ANNOTATION: CONTAINER}
    if isinstance(annotations, Mapping) and annotations:
        ops += [{"op": "add", "path": f"/metadata/annotations/{_escape(k)}", "value": v} for k, v in stamp.items()]
    else:
        ops.append({"op": "add", "path": "/metadata/annotations", "value": stamp})
    return ops


SA_TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
WHAT_TO_DO = "change the pod, or remove its label unwind.dev/inject=true to run it without Unwind"


def _is_gateway_volume(name: Any) -> bool:
    return isinstance(name, str) and (name in (TOKEN_VOLUME, TMP_VOLUME) or name.startswith(SECRET_VOLUME_PREFIX))


PLUGIN_VOLUME_PREFIX = "kube-api-access-"  # + 5 random characters


def _mounts(spec: Mapping[str, Any], volume: str) -> list[Mapping[str, Any]]:
    return [m for kind in ("initContainers", "containers", "ephemeralContainers")
            for c in spec.get(kind) or [] if isinstance(c, Mapping)
            for m in c.get("volumeMounts") or [] if isinstance(m, Mapping) and m.get("name") == volume]


def _plugin_sources(sources: Any) -> bool:
    """The projection the ServiceAccount admission plugin writes: a token for the API server
    at ``token``, the cluster's CA from ConfigMap ``kube-root-ca.crt``, the namespace from
    the downward API, and nothing else."""
    if not isinstance(sources, list) or not all(isinstance(s, Mapping) and len(s) == 1 for s in sources):
        return False
    kinds = {next(iter(s)): next(iter(s.values())) for s in sources}
    if len(kinds) != len(sources) or set(kinds) != {"serviceAccountToken", "configMap", "downwardAPI"}:
        return False
    token, ca = kinds["serviceAccountToken"], kinds["configMap"]
    return (isinstance(token, Mapping) and not token.get("audience") and token.get("path") == "token"
            and isinstance(ca, Mapping) and ca.get("name") == "kube-root-ca.crt")


def is_plugin_token_volume(volume: Mapping[str, Any], spec: Mapping[str, Any]) -> bool:
    """Whether ``volume`` is the API token the ServiceAccount admission plugin added (from
    Kubernetes 1.22 on; it runs before webhooks): named ``kube-api-access-*``, projected as
    the plugin projects it, and mounted only where the plugin mounts it. Injection takes
    it back from the agent's containers (``_remove_token_mounts``); a projected API token
    the pod declares itself is refused (``isolation_problems``)."""
    name = volume.get("name")
    projected = volume.get("projected")
    return (isinstance(name, str) and name.startswith(PLUGIN_VOLUME_PREFIX) and isinstance(projected, Mapping)
            and _plugin_sources(projected.get("sources"))
            and all(m.get("mountPath") == SA_TOKEN_PATH for m in _mounts(spec, name)))


# Audiences the API server accepts by default (``--api-audiences`` defaults to the issuer,
# and these are the issuers and audiences clusters are set up with); the operator adds the
# cluster's own (``api_audiences``: its token's ``aud`` and ``iss``) and
# ``$UNWIND_API_AUDIENCES``.
DEFAULT_API_AUDIENCES = frozenset({"https://kubernetes.default.svc", "https://kubernetes.default.svc.cluster.local",
                                   "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"})
AUDIENCES_ENV = "UNWIND_API_AUDIENCES"


def token_audiences(token: str) -> set[str]:
    """The audiences and issuer a ServiceAccount token names (its JWT claims ``aud`` and
    ``iss``, read, not verified: it is the operator's own token). A token Kubernetes
    projected without an audience carries every audience the API server accepts."""
    parts = token.strip().split(".")
    if len(parts) != 3:
        return set()
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, binascii.Error):
        return set()
    if not isinstance(claims, dict):
        return set()
    aud = claims.get("aud")
    found = [aud] if isinstance(aud, str) else [a for a in aud if isinstance(a, str)] if isinstance(aud, list) else []
    iss = claims.get("iss")
    return {a for a in [*found, iss] if isinstance(a, str) and a}


def api_audiences(configured: str = "", token: str = "") -> frozenset[str]:
    """What ``isolation_problems`` treats as an audience of the API server: the defaults,
    the comma-separated ``configured`` ones (``$UNWIND_API_AUDIENCES``, the chart's
    ``operator.apiAudiences``), and those of the operator's own ServiceAccount token."""
    extra = {a.strip() for a in configured.split(",") if a.strip()}
    return frozenset(DEFAULT_API_AUDIENCES | extra | token_audiences(token))


def _for_api_server(audience: Any, audiences: frozenset[str]) -> bool:
    if not audience:
        return True  # no audience: the API server's own
    wanted = str(audience).strip().rstrip("/").lower()
    return any(wanted == a.rstrip("/").lower() for a in audiences)


def _containers(spec: Mapping[str, Any]) -> Iterable[tuple[str, int, Mapping[str, Any]]]:
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        items = spec.get(kind)
        for c, container in enumerate(items if isinstance(items, list) else []):
            if isinstance(container, Mapping):
                yield kind, c, container


def _secret_refs(spec: Mapping[str, Any]) -> Iterable[tuple[str, Any]]:
    """(field path, Secret name) of every Secret the pod's own spec names: containers' env
    and envFrom, secret volumes and projected secret sources."""
    for kind, c, container in _containers(spec):
        env = container.get("env")
        for i, var in enumerate(env if isinstance(env, list) else []):
            ref = (var.get("valueFrom") or {}).get("secretKeyRef") if isinstance(var, Mapping) else None
            if isinstance(ref, Mapping):
                yield f"spec.{kind}[{c}].env[{i}].valueFrom.secretKeyRef", ref.get("name")
        env_from = container.get("envFrom")
        for i, source in enumerate(env_from if isinstance(env_from, list) else []):
            ref = source.get("secretRef") if isinstance(source, Mapping) else None
            if isinstance(ref, Mapping):
                yield f"spec.{kind}[{c}].envFrom[{i}].secretRef", ref.get("name")
    volumes = spec.get("volumes")
    for v, volume in enumerate(volumes if isinstance(volumes, list) else []):
        if not isinstance(volume, Mapping):
            continue
        if isinstance(volume.get("secret"), Mapping):
            yield f"spec.volumes[{v}].secret", volume["secret"].get("secretName")
        projected = volume.get("projected")
        sources = projected.get("sources") if isinstance(projected, Mapping) else None
        for i, source in enumerate(sources if isinstance(sources, list) else []):
            ref = source.get("secret") if isinstance(source, Mapping) else None
            if isinstance(ref, Mapping):
                yield f"spec.volumes[{v}].projected.sources[{i}].secret", ref.get("name")


def _host_problems(spec: Mapping[str, Any]) -> Iterable[str]:
    """The node's processes, network and files: each reaches the gateway's token or port."""
    for field in ("shareProcessNamespace", "hostPID"):
        if spec.get(field) is True:
            yield (f"spec.{field}: true lets the agent's containers read the gateway's token and "
                   "Secrets through /proc; leave it unset for an agent pod")
    if spec.get("hostNetwork") is True:
        yield ("spec.hostNetwork: true puts the gateway's port (127.0.0.1:8787) on the node, where every "
               "other host-network pod and process calls tools as this agent; leave it unset for an agent pod")
    volumes = spec.get("volumes")
    for v, volume in enumerate(volumes if isinstance(volumes, list) else []):
        if isinstance(volume, Mapping) and volume.get("hostPath") is not None:
            yield (f"spec.volumes[{v}].hostPath: a directory of the node lets the agent read the gateway's "
                   "token and Secrets where the kubelet keeps them; use an emptyDir, a ConfigMap or a "
                   "PersistentVolumeClaim")
    for kind, c, container in _containers(spec):
        context = container.get("securityContext")
        if isinstance(context, Mapping) and context.get("privileged") is True:
            yield (f"spec.{kind}[{c}].securityContext.privileged: true gives the container the node, and "
                   "with it the gateway's token and Secrets; an agent's container runs unprivileged")


def isolation_problems(pod: Mapping[str, Any], secrets: Iterable[str] = (),
                       audiences: frozenset[str] = DEFAULT_API_AUDIENCES) -> list[str]:
    """What in a pod's own spec would let its agent reach what the gateway keeps from it
    (the ServiceAccount token that writes the ledger, the upstream ``secrets`` the
    namespace's manifests name), one line per field, each saying why and what to change.
    ``audiences`` are those the API server accepts (``api_audiences``). Empty when the pod
    is fine. A pod that holds the gateway the webhook wrote is judged without it
    (``injected.isolation_of``): any container of that name here is the pod's own."""
    spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else None
    if not isinstance(spec, Mapping):
        return []
    out = list(_host_problems(spec))
    for kind, c, container in _containers(spec):
        mounts = container.get("volumeMounts")
        for m, mount in enumerate(mounts if isinstance(mounts, list) else []):
            if isinstance(mount, Mapping) and _is_gateway_volume(mount.get("name")):
                out.append(f"spec.{kind}[{c}].volumeMounts[{m}]: volume {mount.get('name')!r} is the "
                           "gateway's alone; mount it in no container of yours")
    volumes = spec.get("volumes")
    for v, volume in enumerate(volumes if isinstance(volumes, list) else []):
        if not isinstance(volume, Mapping):
            continue
        if _is_gateway_volume(volume.get("name")):
            out.append(f"spec.volumes[{v}]: the name {volume.get('name')!r} is kept for the gateway's "
                       "volumes; rename it")
        if is_plugin_token_volume(volume, spec):  # not the pod's own: injection takes it back
            continue
        projected = volume.get("projected")
        sources = projected.get("sources") if isinstance(projected, Mapping) else None
        for i, source in enumerate(sources if isinstance(sources, list) else []):
            token = source.get("serviceAccountToken") if isinstance(source, Mapping) else None
            if isinstance(token, Mapping) and token.get("audience") == EXCHANGE_AUDIENCE:
                out.append(f"spec.volumes[{v}].projected.sources[{i}].serviceAccountToken: a token of the "
                           f"audience {EXCHANGE_AUDIENCE!r} is the gateway's, which it trades at the operator "
                           "for the token that writes the ledger; remove it")
            elif isinstance(token, Mapping) and _for_api_server(token.get("audience"), audiences):
                said = f"audience {token.get('audience')!r}, which the API server accepts" \
                    if token.get("audience") else "no audience: the API server's"
                out.append(f"spec.volumes[{v}].projected.sources[{i}].serviceAccountToken: a token for the "
                           f"API server ({said}) in an agent's pod lets the agent write its own ledger as its "
                           "gateway does; give it the audience of the service it is for, or remove it (the "
                           f"token Kubernetes mounts at {SA_TOKEN_PATH} is taken back without asking)")
    kept = set(secrets)
    for path, name in _secret_refs(spec):
        if isinstance(name, str) and name in kept:
            out.append(f"{path}: Secret {name!r} holds credentials this namespace's ToolManifests send "
                       "upstream, which only the gateway may hold (it mounts the Secret itself); take it "
                       "out of the pod, or give the agent a Secret of its own")
    return out


BUNDLE_WHAT_TO_DO = ("the operator rewrites it on its next reconcile (within seconds while it runs); "
                     "if this persists, check who edited it (only the operator writes unwind-bundle)")


def gateway_secrets(bundle: BundleData, trust: TrustStore, namespace: str) -> set[str]:
    """The upstream Secrets the gateway of a pod in ``namespace`` mounts: those the
    manifests of its verified bundle name (none while the namespace has no bundle yet: the
    gateway waits for one). A bundle that is there but cannot be read or verified refuses
    the pod: its gateway would start without the Secrets, or never (``Refused``, 503)."""
    if not bundle:
        return set()
    try:
        manifests = load_bundle(bundle, trust, namespace=namespace).manifests.values()
    except BundleError as exc:
        raise Refused(f"the namespace's signed bundle unwind-bundle cannot be read ({exc}), and a pod "
                      f"labelled {INJECT_LABEL}=true is not admitted without its gateway; "
                      f"{BUNDLE_WHAT_TO_DO}", 503) from None
    return header_secrets(manifests)


def _remove_token_mounts(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Take back the token the ServiceAccount admission plugin (which runs before webhooks)
    already mounted into the agent's containers at ``SA_TOKEN_PATH``, and its volume: the
    Secret ``<sa>-token-*`` before Kubernetes 1.22, the projected ``kube-api-access-*`` from
    1.22 on (``is_plugin_token_volume``; ``isolation_problems`` refuses any other projected
    API token first)."""
    ops: list[dict[str, Any]] = []
    token_volumes: set[str] = set()
    for kind in ("initContainers", "containers"):
        for c, container in enumerate(spec.get(kind) or []):
            mounts = container.get("volumeMounts") or [] if isinstance(container, Mapping) else []
            for m in reversed(range(len(mounts))):
                if mounts[m].get("mountPath") == SA_TOKEN_PATH:
                    token_volumes.add(str(mounts[m].get("name")))
                    ops.append({"op": "remove", "path": f"/spec/{kind}/{c}/volumeMounts/{m}"})
    volumes = spec.get("volumes") or []
    still_used = {m.get("name") for kind in ("initContainers", "containers") for c in spec.get(kind) or []
                  for m in (c.get("volumeMounts") or []) if m.get("mountPath") != SA_TOKEN_PATH}
    for v in reversed(range(len(volumes))):
        name = volumes[v].get("name")
        if name in token_volumes and name not in still_used:
            ops.append({"op": "remove", "path": f"/spec/volumes/{v}"})
    return ops


def header_secrets(manifests: Iterable[Any]) -> set[str]:
    """The Secrets the manifests name for upstream headers (``{secretKeyRef: {name, key}}``)."""
    out: set[str] = set()
    for m in manifests:
        upstream = getattr(m, "upstream", None)
        for value in (getattr(upstream, "headers", None) or {}).values():
            ref = getattr(value, "secretKeyRef", None)
            if ref is not None:
                out.add(ref.name)
    return out
