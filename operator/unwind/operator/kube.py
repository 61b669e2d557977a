"""The operator's API calls, with the synchronous Kubernetes client (run in threads).

Gather a namespace snapshot in three LISTs, then write what a plan says: revisions
(create; 409 means already done), statuses (merge patches of the status subresource), the
bundle (shards first, then the index in one update with a resourceVersion precondition),
and Events. 409/429/5xx are worth retrying; the caller schedules that.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .. import API_GROUP, API_VERSION
from ..api.conditions import now_rfc3339
from ..bundle import BUNDLE_NAME, SHARD_PREFIX, BundleData
from .approval import ApprovalObject
from .identity import APPLIED, APPROVER
from .reconcile import Event, ManifestObject, Revision

log = logging.getLogger("unwind.operator")
PLURAL = "toolmanifests"
APPROVALS = "approvals"
MANAGED = {"app.kubernetes.io/managed-by": "unwind"}
BUNDLE_LABEL = "unwind.dev/bundle"
OWNER_LABEL = "unwind.dev/toolmanifest-uid"
CHECKSUM_ANNOTATION = "unwind.dev/checksum"
AUTHOR_ANNOTATION = "unwind.dev/applied-by"
COMPONENT = "unwind-operator"
PAGE = 250


def _json(response: Any) -> Any:
    try:
        return json.loads(response.data)
    finally:
        response.release_conn()


def _discard(response: Any) -> None:
    """Read and drop an answer we do not need (an unread body would poison the pooled
    connection for the next request)."""
    try:
        response.read()
    finally:
        response.release_conn()


@dataclass
class Snapshot:
    manifests: list[ManifestObject]
    revisions: list[Revision]
    bundle: BundleData
    versions: dict[str, str]  # bundle ConfigMap name -> resourceVersion
    approvals: list[ApprovalObject]


def _kept(meta: dict[str, Any], keys: tuple[str, ...]) -> dict[str, str]:
    return {k: v for k, v in (meta.get("annotations") or {}).items() if k in keys}


class Kube:
    def __init__(self, api: client.ApiClient, workers: int = 8) -> None:
        # Typed as Any: the client's generated types do not fit dict bodies and raw reads.
        self.custom: Any = client.CustomObjectsApi(api)
        self.apps: Any = client.AppsV1Api(api)
        self.core: Any = client.CoreV1Api(api)
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="unwind-write")

    # ---- gather ---------------------------------------------------------------------
    def snapshot(self, namespace: str) -> Snapshot:
        """The namespace as the plan needs it: four paged LISTs (each list is consistent:
        later pages come from the first page's resourceVersion; the three may be a moment
        apart, which is harmless with one writer per namespace and a re-reconcile on every
        change). Each page is reduced to what the plan reads before the next is fetched, so
        a large namespace never sits in memory as raw objects."""
        manifests = [ManifestObject(
            name=i["metadata"]["name"], uid=i["metadata"]["uid"],
            generation=int(i["metadata"].get("generation") or 0), spec=i.get("spec"),
            status=i.get("status") or {},
            annotations=_kept(i["metadata"], APPLIED.all()),
            created=i["metadata"].get("creationTimestamp") or "",
            deleting=bool(i["metadata"].get("deletionTimestamp")),
            finalizers=tuple(i["metadata"].get("finalizers") or ()),
            resource_version=i["metadata"].get("resourceVersion") or "")
            for i in self._pages(self.custom.list_namespaced_custom_object,
                                 API_GROUP, API_VERSION, namespace, PLURAL)]
        revisions = []
        for r in self._pages(self.apps.list_namespaced_controller_revision, namespace,
                             label_selector=OWNER_LABEL):
            meta = r["metadata"]
            owner = next((o for o in meta.get("ownerReferences") or [] if o.get("kind") == "ToolManifest"), None)
            if owner is not None:
                ann = meta.get("annotations") or {}
                revisions.append(Revision(meta["name"], owner["name"], owner["uid"], int(r["revision"]),
                                          ann.get(CHECKSUM_ANNOTATION, ""), r.get("data") or {},
                                          ann.get(AUTHOR_ANNOTATION, "")))
        cms = list(self._pages(self.core.list_namespaced_config_map, namespace, label_selector=BUNDLE_LABEL))
        bundle = {cm["metadata"]["name"]: dict(cm.get("data") or {}) for cm in cms}
        versions = {cm["metadata"]["name"]: cm["metadata"]["resourceVersion"] for cm in cms}
        approvals = [ApprovalObject(a["metadata"]["name"], a["metadata"].get("creationTimestamp") or "",
                                    a.get("spec"), _kept(a["metadata"], APPROVER.all()))
                     for a in self._pages(self.custom.list_namespaced_custom_object,
                                          API_GROUP, API_VERSION, namespace, APPROVALS)]
        return Snapshot(manifests, revisions, bundle, versions, approvals)

    @staticmethod
    def _pages(call: Any, *args: Any, **kwargs: Any) -> Iterator[dict[str, Any]]:
        token = None
        while True:
            # Raw JSON: the client's model deserialization costs time and memory that a
            # 1000-object namespace notices, and plain dicts are all the plan needs.
            page = _json(call(*args, **kwargs, limit=PAGE, _continue=token, _preload_content=False))
            yield from page["items"]
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return

    # ---- write ----------------------------------------------------------------------
    def create_revisions(self, namespace: str, revisions: Iterable[Revision]) -> None:
        def create(rev: Revision) -> None:
            body = {
                "apiVersion": "apps/v1", "kind": "ControllerRevision",
                "metadata": {"name": rev.name, "namespace": namespace,
                             "labels": {**MANAGED, OWNER_LABEL: rev.owner_uid},
                             "annotations": {CHECKSUM_ANNOTATION: rev.checksum,
                                             **({AUTHOR_ANNOTATION: rev.author} if rev.author else {})},
                             "ownerReferences": [{"apiVersion": f"{API_GROUP}/{API_VERSION}",
                                                  "kind": "ToolManifest", "name": rev.owner,
                                                  "uid": rev.owner_uid}]},
                "revision": rev.version, "data": rev.data,
            }
            try:
                _discard(self.apps.create_namespaced_controller_revision(
                    namespace, body, _preload_content=False))
            except ApiException as exc:
                if exc.status != 409:  # 409: recorded by an earlier run; revisions are immutable
                    raise
        list(self.pool.map(create, revisions))

    def patch_finalizers(self, namespace: str, updates: dict[str, tuple[str, list[str]]]) -> None:
        """Set each object's finalizers, conditional on the resourceVersion the plan saw (a
        concurrent change makes this 409, and the next reconcile decides again)."""
        def patch(item: tuple[str, tuple[str, list[str]]]) -> None:
            name, (rv, finalizers) = item
            body = {"metadata": {"resourceVersion": rv, "finalizers": finalizers or None}}
            try:
                _discard(self.custom.patch_namespaced_custom_object(
                    API_GROUP, API_VERSION, namespace, PLURAL, name, body, _preload_content=False))
            except ApiException as exc:
                if exc.status != 404:
                    raise
        list(self.pool.map(patch, updates.items()))

    def patch_statuses(self, namespace: str, statuses: dict[str, dict[str, Any]]) -> None:
        def patch(item: tuple[str, dict[str, Any]]) -> None:
            name, status = item
            try:
                _discard(self.custom.patch_namespaced_custom_object_status(
                    API_GROUP, API_VERSION, namespace, PLURAL, name, {"status": status},
                    _preload_content=False))
            except ApiException as exc:
                if exc.status != 404:  # deleted meanwhile: nothing to report on
                    raise
        list(self.pool.map(patch, statuses.items()))

    def write_bundle(self, namespace: str, bundle: BundleData, current: BundleData,
                     versions: dict[str, str]) -> int:
        """Shards first, then the index in one update, then stale shards. Returns writes."""
        writes = 0
        labels = {**MANAGED, BUNDLE_LABEL: "true"}
        for name, data in bundle.items():
            if name == BUNDLE_NAME or current.get(name) == data:
                continue
            body = client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name, labels=labels),
                                      data=data, immutable=True)
            try:
                self.core.create_namespaced_config_map(namespace, body)
                writes += 1
            except ApiException as exc:
                if exc.status != 409:
                    raise
                # Content-addressed: the same name normally holds the same bytes already.
                # Only a shard edited by hand is replaced (it is immutable, so delete+create).
                existing = _json(self.core.read_namespaced_config_map(name, namespace, _preload_content=False))
                if existing.get("data") != data:
                    self.core.delete_namespaced_config_map(name, namespace)
                    self.core.create_namespaced_config_map(namespace, body)
                    writes += 1
        main = client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name=BUNDLE_NAME, labels=labels,
                                         resource_version=versions.get(BUNDLE_NAME)),
            data=bundle[BUNDLE_NAME])
        if BUNDLE_NAME in current:
            self.core.replace_namespaced_config_map(BUNDLE_NAME, namespace, main)
        else:
            self.core.create_namespaced_config_map(namespace, main)
        writes += 1
        for name in current:
            if name.startswith(SHARD_PREFIX) and name not in bundle:
                try:
                    self.core.delete_namespaced_config_map(name, namespace)
                except ApiException as exc:
                    if exc.status != 404:
                        raise
        return writes

    def post_events(self, namespace: str, events: Iterable[Event], uids: dict[str, str]) -> None:
        def post(event: Event) -> None:
            now = now_rfc3339()
            body = {
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{event.name[:200]}.", "namespace": namespace},
                "involvedObject": {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": "ToolManifest",
                                   "name": event.name, "namespace": namespace,
                                   "uid": uids.get(event.name, "")},
                "type": event.type, "reason": event.reason, "message": event.message[:1024],
                "source": {"component": COMPONENT}, "reportingComponent": COMPONENT,
                "firstTimestamp": now, "lastTimestamp": now, "count": 1,
            }
            try:
                _discard(self.core.create_namespaced_event(namespace, body, _preload_content=False))
            except ApiException as exc:  # an event is a courtesy; never fail a reconcile on it
                log.warning("could not post event %s/%s: %s", namespace, event.name, exc.reason)
        list(self.pool.map(post, events))
