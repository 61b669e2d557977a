"""kopf wiring: watch events mark a namespace dirty; one coalescing loop per namespace
reconciles it (gather → plan → write what changed).

Why not one handler per object: the bundle is a function of the whole namespace, so a
burst of 1000 applies should cost one consistent LIST and one bundle write, not 1000. The
window (``bundle_window``) is how long the loop waits for the burst to settle; a change that
arrives while a reconcile runs marks the namespace dirty again, so nothing is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import kopf
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .. import API_GROUP, API_VERSION, __version__
from ..api.conditions import now_rfc3339
from . import metrics
from .hooks import Admission, WebhookConfig, reader
from .inject import Sidecar, native_sidecars, server_version
from .jobs import RollbackConfig, RollbackLoop, RollbackWorker, mark_failed, mark_written, relevant
from .keys import KeyKeeper
from .kube import APPROVALS, BUNDLE_LABEL, LEDGERS, PLURAL, Kube, _message
from .leader import Elector, Timing
from .ledgerfailures import permanent
from .ledgers import decide_entries, decisions_for, ledger_targets, settle_entries, settles_for
from .reconcile import Settings, failure_statuses, plan
from .rollback import Reason
from .undojob import ledger_of_job, trace_env
from .webhook import TLSKeeper, WebhookServer

log = logging.getLogger("unwind.operator")


@dataclass
class Config:
    operator_namespace: str
    namespaces: tuple[str, ...] = ()
    trusted_appliers: tuple[str, ...] = ()
    four_eyes: bool = True
    bundle_window: float = 1.0
    resync_seconds: float = 300.0
    key_check_seconds: float = 10.0
    gateway_image: str = ""  # the sidecar's image (and the undo Jobs'); empty: pods are not injected
    # auto | native | container: the gateway's form (inject.native_sidecars); from
    # $UNWIND_SIDECAR_MODE (the chart's env), or `unwind operator --sidecar-mode`
    sidecar_mode: str = field(default_factory=lambda: os.environ.get("UNWIND_SIDECAR_MODE", "auto"))
    rollback_parallelism: int = 4  # undo Jobs running at once per ledger
    lookup_seconds: float = 60.0  # lost answers looked up, and retention checked, this often
    retention_dry_run: bool = False
    workers: int = 8
    webhook: WebhookConfig = field(default_factory=WebhookConfig)
    shared_gateway: Any = None  # shared_gateway.SharedSettings: namespaces may ask for one
    lease: Timing = field(default_factory=Timing)
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")


@dataclass
class Namespaces:
    """Dirty flags and one reconcile loop per namespace."""

    reconcile: Any  # async (namespace, first_seen) -> bool: False once the namespace is gone
    window: float
    leading: asyncio.Event | None = None  # reconcile only while this replica leads
    dirty: dict[str, float] = field(default_factory=dict)  # namespace -> first change seen
    wakeups: dict[str, asyncio.Event] = field(default_factory=dict)
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)

    def touch(self, namespace: str) -> None:
        self.dirty.setdefault(namespace, time.monotonic())
        self.wakeups.setdefault(namespace, asyncio.Event()).set()
        if namespace not in self.tasks or self.tasks[namespace].done():
            self.tasks[namespace] = asyncio.create_task(self._loop(namespace), name=f"unwind:{namespace}")

    async def _loop(self, namespace: str) -> None:
        wake = self.wakeups[namespace]
        backoff = 1.0
        while True:
            await wake.wait()
            # Coalesce: wait until no change arrived for one window, but not longer than
            # ten windows in all, so a steady stream of changes cannot starve the bundle.
            deadline = time.monotonic() + 10 * self.window
            while time.monotonic() < deadline:
                wake.clear()
                try:
                    await asyncio.wait_for(wake.wait(), timeout=self.window)
                except TimeoutError:
                    break
            wake.clear()
            if self.leading is not None:
                await self.leading.wait()
            first = self.dirty.pop(namespace, time.monotonic())
            try:
                if not await self.reconcile(namespace, first):
                    log.info("namespace %s is gone; stopped reconciling it", namespace)
                    return
                backoff = 1.0
                continue
            except ApiException as exc:
                why = f"{exc.status} {exc.reason}"
            except Exception as exc:  # retried: temporary trouble must not stop the loop
                why = str(exc)
            metrics.RECONCILES.labels("error").inc()
            log.warning("reconcile of namespace %s failed, retrying in %.0fs: %s", namespace, backoff, why)
            self.dirty.setdefault(namespace, first)
            # A new change wakes the retry at once (it may be the fix); a failure that stays
            # keeps doubling the wait.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=backoff)
            backoff = min(backoff * 2, 60.0)
            wake.set()

    async def stop(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)


def reconcile_namespace(kube: Kube, namespace: str, keeper: KeyKeeper, settings: Settings,
                        first_seen: float, shared: Any = None) -> bool:
    """Gather → plan → write. Runs in a thread: the Kubernetes client is synchronous.
    Returns False once the namespace is gone (nothing left to reconcile)."""
    with metrics.RECONCILE_SECONDS.time():
        snap = kube.snapshot(namespace)
        if snap.gone:
            keeper.forget(namespace)  # its bundle went with it: it keeps no key in trust
            return False
        now = now_rfc3339()
        settings = replace(settings, trust=keeper.keys.all_public())
        result = plan(namespace, snap.manifests, snap.revisions, snap.bundle, keeper.sign, keeper.keys.kid,
                      settings, now, snap.approvals, now_ms=int(time.time() * 1000), terminating=snap.terminating,
                      mode=snap.mode)
        # Finalizers first: in a terminating namespace nothing else may be written, and they
        # must go for the namespace to finish.
        failed = kube.patch_finalizers(namespace, result.finalizers)
        failed |= kube.create_revisions(namespace, result.new_revisions)
        if result.bundle is not None:
            writes, events = kube.write_bundle(namespace, result.bundle, snap.bundle, snap.versions, snap.stale)
            result.events.extend(events)
            metrics.BUNDLE_WRITES.labels(namespace).inc(writes)
            metrics.BUNDLE_LATENCY.observe(time.monotonic() - first_seen)
            log.info("namespace %s: bundle written with %d tools", namespace, result.published)
        failed |= kube.patch_statuses(namespace, result.statuses)
        metrics.STATUS_PATCHES.inc(len(result.statuses))
        if failed:
            statuses, events = failure_statuses(snap.manifests, result.statuses, failed, now)
            kube.patch_statuses(namespace, statuses)
            result.events.extend(events)
            log.warning("namespace %s: writes refused for %s", namespace, ", ".join(sorted(failed)))
        kube.post_events(namespace, result.events, {m.name: m.uid for m in snap.manifests})
        keeper.record(namespace, result.signed_by)
        if not snap.terminating:
            decide_ledgers(kube, namespace, snap.approvals, settings.trust or keeper.keys.all_public())
        if shared is not None and not snap.terminating:  # the namespace's shared gateway
            ns = kube._namespace(namespace) or {}
            shared.sync(namespace, (ns.get("metadata") or {}).get("annotations") or {},
                        result.bundle if result.bundle is not None else snap.bundle,
                        settings.trust or keeper.keys.all_public())
    metrics.RECONCILES.labels("ok").inc()
    return True


def decide_ledgers(kube: Kube, namespace: str, approvals: list[Any], trust: Any) -> None:
    """Write the stamped decisions of Approvals that name ledger entries into those entries,
    each ledger on its own: one the API server refuses gets Degraded=True
    (DecisionsWriteFailed) and an Event, and the others are written; a temporary failure
    (409, 429, 5xx) is raised once the others are done, so the reconcile is retried."""
    now = datetime.now(UTC)
    retry: ApiException | None = None
    for ledger in sorted(ledger_targets(approvals)):
        decisions = decisions_for(ledger, namespace, approvals, trust)
        settles = settles_for(ledger, namespace, approvals, trust)
        if not decisions and not settles:
            continue

        def change(entries: list[dict[str, Any]], d: Any = decisions, name: str = ledger,
                   s: Any = settles) -> list[dict[str, Any]] | None:
            decided = decide_entries(name, entries, d, now) if d else None
            settled = settle_entries(decided if decided is not None else entries, s, now) if s else None
            return settled if settled is not None else decided
        try:
            written = kube.update_ledger(namespace, ledger, change)
        except ApiException as exc:
            if not permanent(exc.status):
                retry = retry or exc
                continue
            why = f"{exc.status} {exc.reason}: {_message(exc)}"
            _with_ledger(kube, namespace, ledger, lambda obj, why=why: mark_failed(
                kube.custom, kube.core, namespace, obj, Reason.DECISIONS_WRITE_FAILED, why))
            continue
        if written:
            _with_ledger(kube, namespace, ledger, lambda obj: mark_written(
                kube.custom, namespace, obj, Reason.DECISIONS_WRITE_FAILED))
    if retry is not None:
        raise retry


def _with_ledger(kube: Kube, namespace: str, name: str, then: Any) -> None:
    try:
        obj = kube.custom.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace, LEDGERS, name)
    except ApiException as exc:
        log.warning("namespace %s: ledger %s could not be read (%s %s)", namespace, name, exc.status, exc.reason)
        return
    then(dict(obj))


def build_registry(config: Config, api: client.ApiClient) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    kube = Kube(api, workers=config.workers)
    state: dict[str, Any] = {}
    elector = Elector(api, config.operator_namespace, config.identity, config.lease)
    tls = TLSKeeper(api, config.operator_namespace, config.webhook.names, config.webhook.configurations,
                    config.webhook.lifetimes)

    shared = None
    if config.shared_gateway is not None:
        from .shared_gateway_kube import SharedGateways
        shared = SharedGateways(api, config.shared_gateway)

    async def reconcile(namespace: str, first_seen: float) -> bool:
        return await asyncio.to_thread(reconcile_namespace, kube, namespace, state["keeper"], settings,
                                       first_seen, shared)

    settings = Settings(config.trusted_appliers, config.four_eyes)
    namespaces = Namespaces(reconcile, config.bundle_window, elector.leading)
    admission = Admission(reader(kube), config.operator_namespace, config.four_eyes,
                          sidecar=Sidecar(config.gateway_image, config.operator_namespace,
                                          native=sidecar_form(api, config.sidecar_mode))
                          if config.gateway_image else None)
    exchange = None
    if config.webhook.exchange_port and config.gateway_image:
        # injected gateways trade their pod's token for one of unwind-gateway (exchange.py)
        from .exchange import TokenExchange
        from .hooks import ExchangeAddress

        exchange = TokenExchange(api, admission.api_audiences, config.webhook.role_prefix)
        core = client.CoreV1Api(api)
        admission.exchange = ExchangeAddress(
            lambda name: core.read_namespaced_service(name, config.operator_namespace),
            lambda: tls.ca_pem, config.webhook)
    server = WebhookServer(tls, admission, config.webhook.addr, config.webhook.port,
                           exchange=exchange, exchange_port=config.webhook.exchange_port)
    # Rollbacks, lost answers and retention (jobs.py): a loop of their own, leader only.
    rollbacks = RollbackLoop(RollbackWorker(kube, RollbackConfig(
        config.gateway_image, config.rollback_parallelism, config.lookup_seconds, config.retention_dry_run,
        trace_env=trace_env(os.environ)),
        lambda: state["keeper"].keys.all_public()), elector.leading)

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # A private registry gets none of kopf's default login handlers: use the same
        # credentials as the Kubernetes client (in-cluster, then $KUBECONFIG).
        return kopf.login_via_client(**kwargs)

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.level = logging.WARNING
        settings.watching.server_timeout = 300
        # Our handlers only mark a namespace dirty, so a per-object worker has nothing to wait
        # for: let idle workers go at once and cap them, so a burst of 1000 applies does not
        # hold 1000 object bodies in memory.
        settings.queueing.idle_timeout = 0.5
        settings.queueing.worker_limit = 200
        keeper = state["keeper"] = await asyncio.to_thread(KeyKeeper, kube.core, config.operator_namespace)
        admission.signer = keeper.sign
        admission.pod_context = kube.pod_context(lambda: keeper.keys.all_public())
        admission.trust = keeper.keys.all_public()  # identity stamps are ours alone
        log.info("signing with key %s; public keys in ConfigMap %s/unwind-trust",
                 keeper.keys.kid, config.operator_namespace)
        state["tasks"] = [asyncio.create_task(_resync(namespaces, config.resync_seconds)),
                          asyncio.create_task(tls.run()), asyncio.create_task(server.serve()),
                          asyncio.create_task(elector.run()),
                          asyncio.create_task(rollbacks.timer(config.lookup_seconds)),
                          asyncio.create_task(_keep_keys(keeper, admission, namespaces, elector.leading,
                                                         config.key_check_seconds))]

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        for task in state.get("tasks", ()):
            task.cancel()
        await namespaces.stop()
        await rollbacks.stop()

    @kopf.on.event(API_GROUP, API_VERSION, PLURAL, registry=registry)  # type: ignore[arg-type]
    async def manifest_changed(namespace: str, **_: Any) -> None:
        namespaces.touch(namespace)  # kopf starts watching only after startup completed

    if shared is not None:
        from .shared_gateway import ANNOTATION as SHARED

        @kopf.on.event("", "v1", "namespaces", registry=registry)
        def namespace_changed(name: str, meta: Any, **_: Any) -> None:
            # asked for a shared gateway, or one it has: its objects follow the annotation
            if SHARED in (meta.get("annotations") or {}) or name in namespaces.tasks:
                namespaces.touch(name)

    @kopf.on.event(API_GROUP, API_VERSION, APPROVALS, registry=registry)  # type: ignore[arg-type]
    async def approval_changed(namespace: str, spec: Any, **_: Any) -> None:
        namespaces.touch(namespace)
        ledger = ((spec or {}).get("target") or {}).get("effectLedger")
        if ledger:  # it may let a rollback step that waits for it run
            rollbacks.touch(namespace, str(ledger))

    @kopf.on.event("", "v1", "configmaps", labels={BUNDLE_LABEL: "true"},  # type: ignore[arg-type]
                   registry=registry)
    async def bundle_changed(namespace: str, **_: Any) -> None:
        # Our own writes come back here too: the reconcile then finds nothing to change.
        namespaces.touch(namespace)

    @kopf.on.event(API_GROUP, API_VERSION, LEDGERS, registry=registry)  # type: ignore[arg-type]
    async def ledger_changed(namespace: str, name: str, body: Any, **_: Any) -> None:
        rollbacks.seen(namespace)
        if relevant(dict(body)):
            rollbacks.touch(namespace, name)

    @kopf.on.event("batch", "v1", "jobs", labels={"unwind.dev/ledger": kopf.PRESENT},  # type: ignore[arg-type]
                   registry=registry)
    async def undo_job_changed(namespace: str, meta: Any, **_: Any) -> None:
        ledger = ledger_of_job(dict(meta))
        if ledger:
            rollbacks.touch(namespace, ledger)

    return registry


def sidecar_form(api: client.ApiClient, mode: str) -> bool:
    """Whether pods get a native sidecar (``UNWIND_SIDECAR_MODE``; auto: from the API
    server's version, read once at start-up). A version that cannot be read gets the plain container, which
    runs on every version."""
    native_sidecars(mode, None)  # a wrong mode fails before any request
    version = None
    if mode == "auto":
        try:
            info = client.VersionApi(api).get_code()
            version = server_version(info.major, info.minor, info.git_version)
        except Exception as exc:  # the container form works everywhere: start with it
            log.warning("cannot read the API server's version (%s): injecting the gateway as a plain "
                        "container; set UNWIND_SIDECAR_MODE=native on Kubernetes 1.29 or later", exc)
    native = native_sidecars(mode, version)
    log.info("injecting the gateway as a %s (sidecar mode %s, API server %s)",
             "native sidecar" if native else "plain container with POST /quitquitquit", mode,
             ".".join(map(str, version)) if version else "version unknown")
    return native


async def _keep_keys(keeper: KeyKeeper, admission: Admission, namespaces: Namespaces,
                     leading: asyncio.Event, every: float) -> None:
    """Reload the signing key (a rotation re-signs every bundle) and, on the leader, keep
    unwind-trust exactly right."""
    while True:
        try:
            if await asyncio.to_thread(keeper.reload):
                admission.trust = keeper.keys.all_public()
                log.info("signing key changed to %s: re-signing every bundle", keeper.keys.kid)
                for namespace in list(namespaces.tasks):
                    namespaces.touch(namespace)
            if leading.is_set():
                live = [n for n, t in namespaces.tasks.items() if not t.done()]
                written = await asyncio.to_thread(keeper.converge_trust, live)
                if written:
                    log.info("ConfigMap unwind-trust rewritten: it now holds keys %s", ", ".join(written))
        except Exception as exc:  # retried: the previous keys keep working meanwhile
            log.warning("signing keys: %s", exc)
        await asyncio.sleep(every)


async def _resync(namespaces: Namespaces, every: float) -> None:
    while True:
        await asyncio.sleep(every)
        for namespace in list(namespaces.tasks):
            namespaces.touch(namespace)


FIELD_MANAGER = "unwind-operator"
FIELD_MANAGER_AGENT = f"{FIELD_MANAGER}/{__version__}"


def run(config: Config, liveness: str | None, metrics_port: int | None) -> None:
    from kubernetes import config as kubeconfig
    from prometheus_client import start_http_server

    try:
        kubeconfig.load_incluster_config()  # type: ignore[no-untyped-call]
    except kubeconfig.ConfigException:
        kubeconfig.load_kube_config()  # type: ignore[no-untyped-call]
    try:
        native_sidecars(config.sidecar_mode, None)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    api = client.ApiClient()
    # The API server names a write's field manager after the client's User-Agent when the
    # request names none: so every object and field the operator writes shows "unwind-operator"
    # in managedFields (what `kubectl get --show-managed-fields` and GitOps tools read).
    api.user_agent = FIELD_MANAGER_AGENT
    try:
        client.CoreV1Api(api).read_namespace(config.operator_namespace)
    except ApiException as exc:
        if exc.status == 404:
            raise SystemExit(f"error: operator namespace {config.operator_namespace!r} does not "
                             "exist: create it or pass --operator-namespace") from None
    if metrics_port:
        start_http_server(metrics_port)
    kopf.run(registry=build_registry(config, api), standalone=True,
             clusterwide=not config.namespaces, namespaces=list(config.namespaces),
             liveness_endpoint=liveness)
