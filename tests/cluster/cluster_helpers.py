"""Helpers shared by the cluster tests: apply as someone, wait for a settled status, read
the verified bundle."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from unwind.bundle import BundleError, load_bundle
from unwind.controlplane.cluster import free_ports
from unwind.controlplane.dev import OPERATOR_NAMESPACE, kubectl
from unwind.registry.signing import TrustStore

ROOT = Path(__file__).resolve().parents[2]
GROUP, VERSION, PLURAL = "unwind.dev", "v1alpha1", "toolmanifests"
METRICS_PORT = free_ports(1)[0]


def wait_for(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (client.ApiException, KeyError, StopIteration, BundleError) as exc:
            last = exc
        if last and not isinstance(last, Exception):
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def tm(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ToolManifest", "metadata": {"name": name},
            "spec": spec}


def apply(kubeconfig: Path, namespace: str, *objs: dict[str, Any]) -> None:
    kubectl(kubeconfig, "-n", namespace, "apply", "-f", "-",
            input_text=yaml.safe_dump_all(objs))


def get(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    return client.CustomObjectsApi(api).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in obj.get("status", {}).get("conditions", []) if c["type"] == type_)


def settled(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    obj = get(api, namespace, name)
    status = obj.get("status") or {}
    return obj if status.get("observedGeneration") == obj["metadata"]["generation"] else None


def bundle(api: client.ApiClient, namespace: str) -> dict[str, dict[str, str]]:
    cms = client.CoreV1Api(api).list_namespaced_config_map(namespace, label_selector="unwind.dev/bundle")
    return {cm.metadata.name: dict(cm.data or {}) for cm in cms.items}


def trust(api: client.ApiClient) -> TrustStore:
    """The operator's public keys (it publishes them a moment after it starts)."""
    cm = wait_for("the operator's unwind-trust ConfigMap", lambda: client.CoreV1Api(
        api).read_namespaced_config_map("unwind-trust", OPERATOR_NAMESPACE), timeout=60)
    return TrustStore.from_pem_text("\n".join(cm.data.values()))


def enforced(api: client.ApiClient, namespace: str) -> dict[str, int]:
    loaded = load_bundle(bundle(api, namespace), trust(api), namespace=namespace)
    return {t: m.version for t, m in loaded.manifests.items()}


READ = {"tool": "shop.get_order", "effect": "read_only", "permission": "shop:read"}
CANCEL = {"tool": "shop.cancel_order", "effect": "idempotent", "permission": "shop:write"}
CREATE = {"tool": "shop.create_order", "effect": "compensable", "permission": "shop:write",
          "compensation": {"tool": "shop.cancel_order", "argument_map": {"id": "$result.id"}}}



def refused(kubeconfig: Path, namespace: str, *objs: dict[str, Any]) -> str:
    """Apply what must be refused; return kubectl's error output."""
    proc = subprocess.run(["kubectl", f"--kubeconfig={kubeconfig}", "-n", namespace, "apply", "-f", "-"],
                          input=yaml.safe_dump_all(objs), capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0, proc.stdout
    return proc.stderr


def event(api: client.ApiClient, namespace: str, name: str, reason: str, type_: str | None = None) -> Any:
    """Wait for an Event on object ``name`` (posted at the end of the reconcile that caused it)."""
    def found() -> Any:
        items = client.CoreV1Api(api).list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
        return next((e for e in items if e.reason == reason and (type_ is None or e.type == type_)), None)
    return wait_for(f"event {reason} on {name}", found)
