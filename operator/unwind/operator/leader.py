"""Leader election with a Lease, so two operator replicas never reconcile at once.

Both replicas serve the admission webhooks (stateless); only the holder of the Lease
``unwind-operator`` in the operator's namespace reconciles namespaces. The holder renews
it every ``retry`` seconds; the other replica takes it over when it has not changed for
``duration`` seconds *by its own clock* (as client-go does: comparing the Lease's
renewTime with the local clock would trust two machines' clocks to agree). A holder that
cannot renew within ``renew_deadline`` steps down before anyone else may take over.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

log = logging.getLogger("unwind.operator")
LEASE_NAME = "unwind-operator"


@dataclass(frozen=True)
class Timing:
    duration: float = 15.0
    renew_deadline: float = 10.0
    retry: float = 2.0


def _micro_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def may_take(holder: str | None, me: str, unchanged_for: float, duration: float) -> bool:
    """Whether ``me`` may write itself into a Lease last seen held by ``holder``."""
    return not holder or holder == me or unchanged_for >= duration


@dataclass
class Elector:
    api: client.ApiClient
    namespace: str
    identity: str
    timing: Timing = field(default_factory=Timing)
    leading: asyncio.Event = field(default_factory=asyncio.Event)
    _seen: tuple[Any, ...] | None = None
    _seen_at: float = 0.0
    _renewed_at: float = 0.0

    def __post_init__(self) -> None:
        self.coordination: Any = client.CoordinationV1Api(self.api)

    async def run(self) -> None:
        while True:
            try:
                held = await asyncio.to_thread(self._try)
            except Exception as exc:  # API trouble: keep trying, step down past the deadline
                log.warning("leader election: %s", exc)
                held = False
            now = time.monotonic()
            if held:
                self._renewed_at = now
                if not self.leading.is_set():
                    log.info("leader election: %s now leads (Lease %s/%s)", self.identity,
                             self.namespace, LEASE_NAME)
                    self.leading.set()
            elif self.leading.is_set() and now - self._renewed_at > self.timing.renew_deadline:
                log.warning("leader election: %s could not renew for %.0fs; stepping down",
                            self.identity, now - self._renewed_at)
                self.leading.clear()
            await asyncio.sleep(self.timing.retry)

    def _try(self) -> bool:
        """One round: read the Lease, and write ourselves into it when allowed."""
        try:
            lease = self.coordination.read_namespaced_lease(LEASE_NAME, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            return self._create()
        spec = lease.spec
        record = (spec.holder_identity, spec.renew_time, spec.lease_transitions)
        now = time.monotonic()
        if record != self._seen:
            self._seen, self._seen_at = record, now
        if not may_take(spec.holder_identity, self.identity, now - self._seen_at, self.timing.duration):
            return False
        stamp = _micro_now()
        taking = spec.holder_identity != self.identity
        body = {"metadata": {"name": LEASE_NAME, "namespace": self.namespace,
                             "resourceVersion": lease.metadata.resource_version},
                "spec": {"holderIdentity": self.identity,
                         "leaseDurationSeconds": int(self.timing.duration),
                         "acquireTime": stamp if taking else _iso(spec.acquire_time),
                         "renewTime": stamp,
                         "leaseTransitions": (spec.lease_transitions or 0) + (1 if taking else 0)}}
        try:
            self.coordination.replace_namespaced_lease(LEASE_NAME, self.namespace, body)
        except ApiException as exc:
            if exc.status == 409:  # another replica wrote first
                return False
            raise
        return True

    def _create(self) -> bool:
        stamp = _micro_now()
        body = {"metadata": {"name": LEASE_NAME, "namespace": self.namespace,
                             "labels": {"app.kubernetes.io/managed-by": "unwind"}},
                "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": int(self.timing.duration),
                         "acquireTime": stamp, "renewTime": stamp, "leaseTransitions": 0}}
        try:
            self.coordination.create_namespaced_lease(self.namespace, body)
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True


def _iso(value: Any) -> str | None:
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return str(value) if value else None
