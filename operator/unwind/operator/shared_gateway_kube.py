"""Gather and write for the shared gateway (shared_gateway.py decides): read the namespace's
annotations, the Secrets its verified bundle names, and each object the shared gateway may
consist of; then create, replace or delete only what the decision lists."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ..bundle import BundleData
from ..registry.signing import TrustStore
from .admission import Refused
from .inject import gateway_secrets
from .shared_gateway import Change, SharedSettings, changes, desired, managed_names

log = logging.getLogger("unwind.operator")


class SharedGateways:
    def __init__(self, api: client.ApiClient, settings: SharedSettings) -> None:
        self.settings = settings
        self.core: Any = client.CoreV1Api(api)
        self.apps: Any = client.AppsV1Api(api)
        self.rbac: Any = client.RbacAuthorizationV1Api(api)

    def _calls(self, kind: str, namespace: str) -> dict[str, Callable[..., Any]]:
        """read/create/replace/delete of ``kind`` (bound to the namespace where it has one)."""
        api, plural = {"ServiceAccount": (self.core, "service_account"),
                       "ConfigMap": (self.core, "config_map"),
                       "Service": (self.core, "service"),
                       "Deployment": (self.apps, "deployment"),
                       "RoleBinding": (self.rbac, "role_binding"),
                       "ClusterRoleBinding": (self.rbac, "cluster_role_binding")}[kind]
        if kind == "ClusterRoleBinding":
            return {op: getattr(api, f"{op}_{plural}") for op in
                    ("read", "create", "replace", "delete")}
        ns = f"namespaced_{plural}"
        return {"read": lambda name, **kw: getattr(api, f"read_{ns}")(name, namespace, **kw),
                "create": lambda body, **kw: getattr(api, f"create_{ns}")(namespace, body, **kw),
                "replace": lambda name, body, **kw: getattr(api, f"replace_{ns}")(
                    name, namespace, body, **kw),
                "delete": lambda name, **kw: getattr(api, f"delete_{ns}")(name, namespace, **kw)}

    def _read(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            raw = self._calls(kind, namespace)["read"](name, _preload_content=False)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return dict(json.loads(raw.data))

    def sync(self, namespace: str, annotations: Mapping[str, str], bundle: BundleData,
             trust: TrustStore) -> list[Change]:
        """Gather → decide → write; the changes made. A bad rate-limit annotation keeps the
        chart's limits and says so in the log (the Namespace's owner reads it there)."""
        try:
            secrets = gateway_secrets(bundle, trust, namespace)
        except Refused as exc:
            log.warning("namespace %s: shared gateway without upstream Secrets: %s", namespace,
                        exc)
            secrets = set()
        try:
            wanted = desired(namespace, annotations, self.settings, secrets)
        except ValueError as exc:
            log.warning("namespace %s: %s; the chart's rate limits apply", namespace, exc)
            safe = {k: v for k, v in annotations.items() if k != "unwind.dev/rate-limits"}
            wanted = desired(namespace, safe, self.settings, secrets)
        current = {key: self._read(key[0], namespace, key[1]) for key in managed_names(namespace)}
        todo = changes(namespace, wanted, current)
        for change in todo:
            calls = self._calls(change.kind, namespace)
            if change.action == "create":
                try:
                    calls["create"](change.body)
                except ApiException as exc:
                    if exc.status != 409:  # made meanwhile: the next reconcile compares it
                        raise
            elif change.action == "replace":
                assert change.body is not None
                body = {**change.body, "metadata": {**change.body["metadata"],
                                                    "resourceVersion": change.resource_version}}
                calls["replace"](change.name, body)
            else:
                try:
                    calls["delete"](change.name)
                except ApiException as exc:
                    if exc.status != 404:
                        raise
            log.info("namespace %s: shared gateway: %s %s %s", namespace, change.action,
                     change.kind, change.name)
        return todo
