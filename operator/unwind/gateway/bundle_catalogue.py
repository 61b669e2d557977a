"""The pod's catalogue: the namespace's signed bundle, read through the API and verified.

Shard names are dynamic (``unwind-bundle-{a,b}-{0..63}``, whichever slot the operator
wrote last), so they cannot be mounted as volumes: the catalogue reads ConfigMap
``unwind-bundle`` by name, then each shard its signed index lists, and the trusted public
keys from ConfigMap ``unwind-trust`` in the operator's namespace (readable by every
ServiceAccount; only the operator writes it). ``unwind.bundle.load_bundle`` verifies the
lot: the root signature, the namespace, a generation no older than the last one accepted
(an old bundle put back is refused), each shard's digest, each manifest's checksum.

Every ``poll_s`` seconds it asks for the root's and the trust's metadata only (a few
hundred bytes) and reloads, all or nothing, when either changed. A bundle that fails
verification is refused: the previous one keeps serving, and the refusal shows in the
log, ``unwind_gateway_catalogue_refusals_total{code}`` and ``/readyz`` (``problem``).
The gateway is ready once a first bundle verified.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any
from urllib.parse import quote

from ..bundle import BUNDLE_NAME, Bundle, BundleError, load_bundle, read_root
from ..manifest.mcp_names import collision_message, name_collisions
from ..registry.errors import RegistryError
from ..registry.signing import TrustStore
from .catalogue import Served
from .kube import ApiError, KubeClient, KubeUnreachable
from .metrics import Metrics

log = logging.getLogger("unwind.gateway")
TRUST_NAME = "unwind-trust"
DEFAULT_POLL_S = 2.0


class BundleCatalogue:
    def __init__(self, kube: KubeClient, namespace: str, operator_namespace: str,
                 metrics: Metrics, *, poll_s: float = DEFAULT_POLL_S) -> None:
        self.kube, self.namespace, self.operator_namespace = kube, namespace, operator_namespace
        self.metrics, self.poll_s = metrics, poll_s
        self._by_tool: dict[str, Served] = {}
        self._bundle: Bundle | None = None
        self._problem: str | None = f"no bundle of namespace {namespace} verified yet"
        self._seen: tuple[str, str] | None = None  # resourceVersions of (root, trust) last tried
        self._task: asyncio.Task[None] | None = None

    # ---- the Catalogue protocol ----

    @property
    def ready(self) -> bool:
        return self._bundle is not None

    @property
    def problem(self) -> str | None:
        return self._problem

    @property
    def generation(self) -> str:
        return str(self._bundle.generation) if self._bundle else "none"

    @property
    def observe(self) -> bool:
        """The namespace's mode, signed into its bundle (annotation unwind.dev/mode)."""
        return self._bundle is not None and self._bundle.mode == "observe"

    def get(self, tool: str) -> Served | None:
        return self._by_tool.get(tool)

    def tools(self) -> list[Served]:
        return sorted(self._by_tool.values(), key=lambda s: s.manifest.tool)

    async def start(self) -> None:
        await self.poll()
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # ---- loading ----

    def _cm(self, namespace: str, name: str) -> str:
        return f"/api/v1/namespaces/{quote(namespace, safe='')}/configmaps/{quote(name, safe='')}"

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                await self.poll()
            except Exception:  # never let the poller die: the next tick tries again
                log.exception("bundle poll failed")

    async def poll(self) -> bool:
        """Reload when the root or the trust changed; True when a new bundle was accepted."""
        try:
            root_meta = await self.kube.get(self._cm(self.namespace, BUNDLE_NAME), metadata_only=True)
            trust_meta = await self.kube.get(self._cm(self.operator_namespace, TRUST_NAME),
                                             metadata_only=True)
        except (KubeUnreachable, ApiError) as exc:
            self._fetch_failed(exc)
            return False
        seen = (_rv(root_meta), _rv(trust_meta))
        if seen == self._seen:
            return False
        try:
            accepted = await self._load()
        except (KubeUnreachable, ApiError) as exc:
            self._fetch_failed(exc)
            return False  # not remembered as seen: the next tick reads it again
        self._seen = seen
        return accepted

    async def _load(self) -> bool:
        root_cm = await self.kube.get(self._cm(self.namespace, BUNDLE_NAME))
        if root_cm is None:
            return self._refuse("missing_index", f"no ConfigMap {BUNDLE_NAME} in namespace "
                                f"{self.namespace} (the operator publishes it once a manifest is "
                                "approved there)")
        configmaps = {BUNDLE_NAME: _data(root_cm)}
        try:
            root = read_root(configmaps)
        except BundleError as exc:
            return self._refuse(exc.code, str(exc))
        shards = root.get("shards")
        for shard in shards if isinstance(shards, list) else []:
            name = shard.get("name") if isinstance(shard, dict) else None
            if isinstance(name, str) and name.startswith(BUNDLE_NAME):
                cm = await self.kube.get(self._cm(self.namespace, name))
                if cm is not None:
                    configmaps[name] = _data(cm)
        trust_cm = await self.kube.get(self._cm(self.operator_namespace, TRUST_NAME))
        if trust_cm is None:
            return self._refuse("no_trust", f"no ConfigMap {TRUST_NAME} in namespace "
                                f"{self.operator_namespace}: nothing to verify the bundle with")
        try:
            trust = TrustStore.from_pem_text("\n".join(_data(trust_cm).values()),
                                             f"ConfigMap {self.operator_namespace}/{TRUST_NAME}")
        except RegistryError as exc:
            return self._refuse("no_trust", str(exc))
        floor = self._bundle.generation if self._bundle else 0
        try:
            bundle = load_bundle(configmaps, trust, namespace=self.namespace, min_generation=floor)
        except BundleError as exc:
            return self._refuse(exc.code, str(exc))
        collisions = name_collisions(bundle.manifests)
        if collisions:
            return self._refuse("name_collision", collision_message(collisions))
        if self._bundle is not None and bundle.generation == self._bundle.generation \
                and bundle.checksums == self._bundle.checksums:
            self._problem = None
            return False  # the same bundle written again (e.g. a label changed)
        self._bundle = bundle
        self._by_tool = {t: Served(m, bundle.checksums[t], m.version)
                         for t, m in bundle.manifests.items()}
        self._problem = None
        self.metrics.serving(self.generation, True)
        log.info("serving bundle generation %d of namespace %s: %d tools, signed by key %s",
                 bundle.generation, self.namespace, len(self._by_tool), bundle.key_id)
        return True

    def _refuse(self, code: str, message: str) -> bool:
        self.metrics.catalogue_refusals.labels(code=code).inc()
        keeps = (f"; still serving generation {self._bundle.generation}" if self._bundle
                 else "; serving nothing until a bundle verifies")
        self._problem = f"bundle refused ({code}): {message}{keeps}"
        log.error("%s", self._problem)
        return False

    def _fetch_failed(self, exc: Exception) -> None:
        self.metrics.catalogue_refusals.labels(code="unreachable").inc()
        keeps = (f"; still serving generation {self._bundle.generation}" if self._bundle
                 else "")
        self._problem = f"cannot read the bundle: {exc}{keeps}"
        log.warning("%s", self._problem)


def _rv(obj: Any) -> str:
    if not isinstance(obj, dict):
        return ""
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


def _data(cm: Any) -> dict[str, str]:
    data = cm.get("data") if isinstance(cm, dict) else None
    return {str(k): str(v) for k, v in (data or {}).items()}
