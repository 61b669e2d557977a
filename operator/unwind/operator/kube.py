"""The operator's API calls, with the synchronous Kubernetes client (run in threads).

Gather a namespace snapshot in three LISTs, then write what a plan says: revisions
(create; 409 means already done), statuses (merge patches of the status subresource), the
bundle (shards first, then the index in one update with a resourceVersion precondition),
and Events. 409/429/5xx are worth retrying; the caller schedules that.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .. import API_GROUP, API_VERSION
from ..api.conditions import now_rfc3339
from ..bundle import BUNDLE_NAME, SHARD_PREFIX, BundleData, BundleError, read_root
from ..registry.signing import TrustStore
from .approval import ApprovalObject
from .identity import APPLIED, APPROVER
from .inject import SCOPES_ANNOTATION, gateway_secrets
from .reconcile import Event, ManifestObject, Revision

log = logging.getLogger("unwind.operator")
PLURAL = "toolmanifests"
APPROVALS = "approvals"
LEDGERS = "effectledgers"
MANAGED = {"app.kubernetes.io/managed-by": "unwind"}
BUNDLE_LABEL = "unwind.dev/bundle"
OWNER_LABEL = "unwind.dev/toolmanifest-uid"
CHECKSUM_ANNOTATION = "unwind.dev/checksum"
AUTHOR_ANNOTATION = "unwind.dev/applied-by"
MODE_ANNOTATION = "unwind.dev/mode"  # on a Namespace: observe = record violations, do not refuse
COMPONENT = "unwind-operator"
PAGE = 250


def _json(response: Any) -> Any:
    try:
        return json.loads(response.data)
    finally:
        response.release_conn()


def _message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except (ValueError, AttributeError):
        return str(exc.reason)


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
    bundle: BundleData  # unwind-bundle and the shards its index names, read by name
    versions: dict[str, str]  # bundle ConfigMap name -> resourceVersion
    approvals: list[ApprovalObject]
    terminating: bool = False  # the namespace is being deleted
    gone: bool = False  # the namespace does not exist any more
    stale: tuple[str, ...] = ()  # labelled shard ConfigMaps the current index does not name
    mode: str = "enforce"  # the namespace's unwind.dev/mode annotation: enforce or observe


def _kept(meta: dict[str, Any], keys: tuple[str, ...]) -> dict[str, str]:
    return {k: v for k, v in (meta.get("annotations") or {}).items() if k in keys}


def pages(call: Any, *args: Any, limit: int = PAGE, **kwargs: Any) -> Iterator[dict[str, Any]]:
    """Every item of a list call, ``limit`` at a time. Raw JSON: the client's model
    deserialization costs time and memory that a 1000-object namespace notices, and plain
    dicts are all the plans need."""
    token = None
    while True:
        page = _json(call(*args, **kwargs, limit=limit, _continue=token, _preload_content=False))
        yield from page["items"]
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return


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
            for i in pages(self.custom.list_namespaced_custom_object, API_GROUP, API_VERSION, namespace, PLURAL)]
        revisions = []
        for r in pages(self.apps.list_namespaced_controller_revision, namespace, label_selector=OWNER_LABEL):
            meta = r["metadata"]
            owner = next((o for o in meta.get("ownerReferences") or [] if o.get("kind") == "ToolManifest"), None)
            if owner is not None:
                ann = meta.get("annotations") or {}
                revisions.append(Revision(meta["name"], owner["name"], owner["uid"], int(r["revision"]),
                                          ann.get(CHECKSUM_ANNOTATION, ""), r.get("data") or {},
                                          ann.get(AUTHOR_ANNOTATION, "")))
        bundle, versions, stale = self._bundle(namespace)
        approvals = [ApprovalObject(a["metadata"]["name"], a["metadata"].get("creationTimestamp") or "",
                                    a.get("spec"), _kept(a["metadata"], APPROVER.all()))
                     for a in pages(self.custom.list_namespaced_custom_object,
                                    API_GROUP, API_VERSION, namespace, APPROVALS)]
        ns = self._namespace(namespace)
        phase = str(((ns or {}).get("status") or {}).get("phase") or "Active")
        mode = ((ns or {}).get("metadata", {}).get("annotations") or {}).get(MODE_ANNOTATION, "enforce")
        return Snapshot(manifests, revisions, bundle, versions, approvals, phase == "Terminating",
                        ns is None, stale, "observe" if mode == "observe" else "enforce")

    def _namespace(self, namespace: str) -> dict[str, Any] | None:
        try:
            return dict(_json(self.core.read_namespace(namespace, _preload_content=False)))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _read_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return dict(_json(self.core.read_namespaced_config_map(name, namespace, _preload_content=False)))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _bundle(self, namespace: str) -> tuple[BundleData, dict[str, str], tuple[str, ...]]:
        """The bundle by name: unwind-bundle, then each shard its index names (whatever labels
        they carry: removing a label must not hide the bundle from its writer), and the
        labelled shards it does not name (left over, to delete)."""
        found: dict[str, dict[str, Any]] = {}
        root = self._read_config_map(namespace, BUNDLE_NAME)
        if root is not None:
            found[BUNDLE_NAME] = root
            try:
                named = [str(s.get("name")) for s in read_root({BUNDLE_NAME: dict(root.get("data") or {})})
                         .get("shards") or [] if isinstance(s, dict)]
            except BundleError:
                named = []
            for name in named:
                if name.startswith(SHARD_PREFIX) and name not in found:
                    shard = self._read_config_map(namespace, name)
                    if shard is not None:
                        found[name] = shard
        labelled = [cm["metadata"]["name"] for cm in
                    pages(self.core.list_namespaced_config_map, namespace, label_selector=BUNDLE_LABEL)]
        stale = tuple(n for n in labelled if n.startswith(SHARD_PREFIX) and n not in found)
        return ({n: dict(cm.get("data") or {}) for n, cm in found.items()},
                {n: cm["metadata"]["resourceVersion"] for n, cm in found.items()}, stale)

    def pod_context(self, trust: Callable[[], TrustStore]) -> Callable[[str, str], tuple[str | None, set[str]]]:
        """For the injection webhook: a ServiceAccount's scopes annotation, and the Secrets
        the namespace's enforced manifests name for upstream headers (from its verified
        bundle; none while it has no bundle yet; a bundle that does not verify refuses the
        pod: ``inject.gateway_secrets``)."""
        def read(namespace: str, account: str) -> tuple[str | None, set[str]]:
            try:
                sa = _json(self.core.read_namespaced_service_account(account, namespace, _preload_content=False))
                scopes = (sa["metadata"].get("annotations") or {}).get(SCOPES_ANNOTATION)
            except ApiException as exc:
                if exc.status != 404:
                    raise
                scopes = None
            data, _, _ = self._bundle(namespace)
            return scopes, gateway_secrets(data, trust(), namespace)
        return read

    def update_ledger(self, namespace: str, name: str,
                      change: Callable[[list[dict[str, Any]]], list[dict[str, Any]] | None]) -> int:
        """Apply ``change`` to the entries of ledger ``name`` and each continuation page, writing
        a page's status only when it changed (conditional on its resourceVersion: a
        conflict is retried by the next reconcile). Returns the pages written."""
        written, seen = 0, set()
        page: str | None = name
        while page and page not in seen:
            seen.add(page)
            try:
                obj = _json(self.custom.get_namespaced_custom_object(
                    API_GROUP, API_VERSION, namespace, LEDGERS, page, _preload_content=False))
            except ApiException as exc:
                if exc.status == 404:
                    return written
                raise
            status = obj.get("status") or {}
            entries = change(list(status.get("entries") or []))
            if entries is not None:
                obj["status"] = {**status, "entries": entries}
                _discard(self.custom.replace_namespaced_custom_object_status(
                    API_GROUP, API_VERSION, namespace, LEDGERS, page, obj, _preload_content=False))
                written += 1
            page = status.get("next")
        return written

    # ---- write ----------------------------------------------------------------------
    def _each(self, items: Iterable[tuple[str, Any]], write: Callable[[Any], None],
              ignore: tuple[int, ...]) -> dict[str, str]:
        """Run one write per object on the pool. A refusal that only that object can fix (any
        other 4xx) is returned by object name, so one bad object never stops its namespace;
        ``ignore`` statuses mean done; 429 and 5xx are raised: the reconcile is retried."""
        def one(item: tuple[str, Any]) -> tuple[str, str] | None:
            name, value = item
            try:
                write(value)
            except ApiException as exc:
                if exc.status in ignore:
                    return None
                if exc.status is not None and 400 <= exc.status < 500 and exc.status != 429:
                    return name, f"{exc.status} {exc.reason}: {_message(exc)}"
                raise
            return None
        return dict(r for r in self.pool.map(one, items) if r is not None)

    def _post_text(self, path: str, text: str) -> None:
        """POST a body sent exactly as given (the generated client would re-serialize it)."""
        api = self.apps.api_client
        request = api.param_serialize("POST", path, header_params={
            "Content-Type": "application/yaml", "Accept": "application/json"}, body=text,
            auth_settings=["BearerToken"])
        response = api.call_api(*request)
        response.read()
        if not 200 <= response.status < 300:
            raise ApiException(http_resp=response)

    def create_revisions(self, namespace: str, revisions: Iterable[Revision]) -> dict[str, str]:
        """Create each version's ControllerRevision; returns failures by ToolManifest name."""
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
            # ControllerRevision data is immutable and kept as the bytes sent: send them as the
            # API server itself writes JSON (sorted keys, no spaces), or any later patch of the
            # revision's metadata (a label, the garbage collector orphaning it) sees the data
            # "changed" and is refused. JSON is YAML, and the YAML path sends the text as is.
            text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
            self._post_text(f"/apis/apps/v1/namespaces/{namespace}/controllerrevisions", text)
        # 409: recorded by an earlier run; revisions are immutable
        return self._each(((r.owner, r) for r in revisions), create, ignore=(409,))

    def patch_finalizers(self, namespace: str, updates: dict[str, tuple[str, list[str]]]) -> dict[str, str]:
        """Set each object's finalizers, conditional on the resourceVersion the plan saw (a
        concurrent change makes this 409, and the next reconcile decides again)."""
        def patch(item: tuple[str, tuple[str, list[str]]]) -> None:
            name, (rv, finalizers) = item
            body = {"metadata": {"resourceVersion": rv, "finalizers": finalizers or None}}
            _discard(self.custom.patch_namespaced_custom_object(
                API_GROUP, API_VERSION, namespace, PLURAL, name, body, _preload_content=False))
        return self._each(((n, (n, u)) for n, u in updates.items()), patch, ignore=(404, 409))

    def patch_statuses(self, namespace: str, statuses: dict[str, dict[str, Any]]) -> dict[str, str]:
        def patch(item: tuple[str, dict[str, Any]]) -> None:
            name, status = item
            _discard(self.custom.patch_namespaced_custom_object_status(
                API_GROUP, API_VERSION, namespace, PLURAL, name, {"status": status}, _preload_content=False))
        # 404: deleted meanwhile, nothing to report on
        return self._each(((n, (n, st)) for n, st in statuses.items()), patch, ignore=(404,))

    def write_bundle(self, namespace: str, bundle: BundleData, current: BundleData,
                     versions: dict[str, str], stale: Iterable[str] = ()) -> tuple[int, list[Event]]:
        """Shards first, then the index in one update, then shards no index names any more.
        A ConfigMap that cannot be updated in place (made immutable by hand, or created by
        someone else) is replaced: deleted and created, with a Warning event. Returns the
        number of writes and the events to post."""
        writes, events = 0, []
        labels = {**MANAGED, BUNDLE_LABEL: "true"}
        for name, data in sorted(bundle.items(), key=lambda item: item[0] == BUNDLE_NAME):
            if current.get(name) == data and name in versions:
                continue
            body = client.V1ConfigMap(metadata=client.V1ObjectMeta(
                name=name, labels=labels,
                # the index is conditional on what the plan saw; shards are simply ours
                resource_version=versions.get(name) if name == BUNDLE_NAME else None), data=data)
            replaced = self._put_config_map(namespace, name, body, exists=name in versions)
            writes += 1
            if replaced:
                events.append(Event(name, "Warning", "BundleReplaced", f"ConfigMap {name} could not be "
                                    f"updated ({replaced}): it was deleted and written again; a bundle "
                                    "is written only by the Unwind operator", kind="ConfigMap"))
        for name in {*current, *stale} - set(bundle):
            if name.startswith(SHARD_PREFIX):
                try:
                    self.core.delete_namespaced_config_map(name, namespace)
                except ApiException as exc:
                    if exc.status != 404:
                        raise
        return writes, events

    def _put_config_map(self, namespace: str, name: str, body: Any, exists: bool) -> str:
        """Create or update; on a 409/422 that retrying cannot fix, delete and create. Returns
        why it had to replace the object, or ""."""
        try:
            if exists:
                self.core.replace_namespaced_config_map(name, namespace, body)
            else:
                self.core.create_namespaced_config_map(namespace, body)
            return ""
        except ApiException as exc:
            if exists and exc.status == 409:
                raise  # changed since the snapshot: the next reconcile decides again
            if exc.status not in (409, 422):
                raise
            why = f"{exc.status} {exc.reason}"
        body.metadata.resource_version = None
        try:
            self.core.delete_namespaced_config_map(name, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
        self.core.create_namespaced_config_map(namespace, body)
        return why

    def post_events(self, namespace: str, events: Iterable[Event], uids: dict[str, str]) -> None:
        def post(event: Event) -> None:
            now = now_rfc3339()
            body = {
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{event.name[:200].rstrip('.-')}.", "namespace": namespace},
                "involvedObject": {"apiVersion": "v1" if event.kind == "ConfigMap" else f"{API_GROUP}/{API_VERSION}",
                                   "kind": event.kind, "name": event.name, "namespace": namespace,
                                   "uid": uids.get(event.name, "") if event.kind == "ToolManifest" else ""},
                "type": event.type, "reason": event.reason, "message": event.message[:1024],
                "source": {"component": COMPONENT}, "reportingComponent": COMPONENT,
                "firstTimestamp": now, "lastTimestamp": now, "count": 1,
            }
            try:
                _discard(self.core.create_namespaced_event(namespace, body, _preload_content=False))
            except ApiException as exc:  # an event is a courtesy; never fail a reconcile on it
                log.warning("could not post event %s/%s: %s", namespace, event.name, exc.reason)
        list(self.pool.map(post, events))
