"""Recognising the gateway the injection webhook wrote (issue 29, item 8). Pure.

Before, a labelled pod that brought a container of its own named ``unwind-gateway`` was
admitted untouched: no isolation check, the ServiceAccount token and the upstream Secrets
left with the agent, scopes of the pod's choosing. A name proves nothing. A pod's gateway
is the webhook's when it is exactly what the webhook writes for this pod now
(``inject.gateway_parts``: the container, in the form the operator injects, and its
volumes), give or take what the API server fills in when it decodes a pod
(``terminationMessagePath``, a probe's ``successThreshold``, a fieldRef's ``apiVersion``, a
volume's ``defaultMode``) and the container's ``resources`` (which a VerticalPodAutoscaler's
webhook may set). That is what the pod holds when the webhook is called again for the same
pod (``reinvocationPolicy: IfNeeded``) after another webhook changed it, and it is harmless
in any pod: it is what the webhook would give it. Any other container of that name (another
image, another command, an env var more: ``PYTHONPATH`` into a folder the agent writes)
refuses the pod. The rest of the pod passes the isolation check like any labelled pod.

Why not a signature in an annotation: it would bind what was written at some earlier
time, for an earlier version of the ServiceAccount's scopes and the namespace's Secrets;
comparing with what would be written now binds the present.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .inject import CONTAINER, Sidecar, _remove_token_mounts, gateway_parts, isolation_problems

# What the API server writes into a pod it decodes, where the webhook wrote nothing.
_DEFAULTED: dict[str, Any] = {"terminationMessagePath": "/dev/termination-log",
                              "terminationMessagePolicy": "File", "successThreshold": 1,
                              "apiVersion": "v1", "defaultMode": 420}
_TOLERATED = ("resources",)  # set by other webhooks (VPA) on every container


def _as_written(actual: Any, written: Any, top: bool = False) -> bool:
    """Whether ``actual`` is ``written``, give or take the API server's defaults."""
    if isinstance(written, Mapping):
        if not isinstance(actual, Mapping) or not all(k in actual for k in written):
            return False
        for key, value in actual.items():
            if top and key in _TOLERATED:
                continue
            if key in written:
                if not _as_written(value, written[key]):
                    return False
            elif _DEFAULTED.get(key, object()) != value:
                return False
        return True
    if isinstance(written, list):
        return (isinstance(actual, list) and len(actual) == len(written)
                and all(_as_written(a, w) for a, w in zip(actual, written, strict=True)))
    return bool(actual == written)


def named_gateways(spec: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(field path, container) of every container called ``unwind-gateway``."""
    out = []
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        items = spec.get(kind)
        for i, c in enumerate(items if isinstance(items, list) else []):
            if isinstance(c, Mapping) and c.get("name") == CONTAINER:
                out.append((f"spec.{kind}[{i}]", c))
    return out


def foreign_gateway(pod: Mapping[str, Any], namespace: str, scopes: str | None,
                    secrets: Iterable[str], sidecar: Sidecar) -> list[str]:
    """Why the ``unwind-gateway`` the pod holds is not the one the webhook writes for it:
    one line per reason; empty when it holds none, or exactly that one."""
    spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
    assert isinstance(spec, Mapping)
    found = named_gateways(spec)
    if not found:
        return []
    container, volumes = gateway_parts(pod, namespace, scopes, secrets, sidecar)
    kind = "initContainers" if sidecar.native else "containers"
    rename = (f"the name {CONTAINER} is kept for the gateway the Unwind webhook injects; rename "
              "the container (the webhook adds the gateway itself)")
    if len(found) > 1:
        return [f"{path}: a second container named {CONTAINER}; {rename}" for path, _ in found[1:]]
    path, c = found[0]
    if not path.startswith(f"spec.{kind}[") or not _as_written(c, container, top=True):
        return [f"{path}: this pod brings its own container named {CONTAINER}, which is not what "
                f"the webhook writes for it; {rename}"]
    have = {v.get("name"): v for v in spec.get("volumes") or [] if isinstance(v, Mapping)}
    return [f"spec.volumes: the gateway's volume {v['name']!r} is not the webhook's; remove it "
            "and the gateway, and let the webhook add them" for v in volumes
            if not _as_written(have.get(v["name"]), v)]


def isolation_of(pod: Mapping[str, Any], namespace: str, scopes: str | None, secrets: Iterable[str],
                 sidecar: Sidecar, audiences: frozenset[str]) -> list[str]:
    """``isolation_problems`` of a pod that holds the webhook's gateway (``foreign_gateway``
    found nothing): judged without the gateway's container and volumes, so what remains is
    the pod's own."""
    names = set(secrets)
    _, volumes = gateway_parts(pod, namespace, scopes, names, sidecar)
    ours = {v["name"] for v in volumes}
    spec = dict(pod.get("spec") or {})
    for kind in ("initContainers", "containers"):
        if isinstance(spec.get(kind), list):
            spec[kind] = [c for c in spec[kind] if not (isinstance(c, Mapping)
                                                        and c.get("name") == CONTAINER)]
    spec["volumes"] = [v for v in spec.get("volumes") or []
                       if not (isinstance(v, Mapping) and v.get("name") in ours)]
    return isolation_problems({**pod, "spec": spec}, names, audiences)


def completed(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What a pod holding the webhook's gateway may still need (the API server's token
    plugin runs before webhooks): that token taken back from the agent's containers, and
    none mounted."""
    spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
    assert isinstance(spec, Mapping)
    ops = _remove_token_mounts(spec)
    if spec.get("automountServiceAccountToken") is not False:
        ops.append({"op": "add", "path": "/spec/automountServiceAccountToken", "value": False})
    return ops
