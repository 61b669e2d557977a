"""The kubelet stand-in as a long-running node: what Unwind puts into pods runs on this machine.

The local control plane has no nodes. ``Node`` watches for Pending pods and runs, through
``PodRunner`` (one local process per container), the two kinds Unwind makes:

- the pods of undo Jobs (label ``unwind.dev/ledger``), a few at a time; the Job controller
  sees them succeed or fail and retries them as on a real node;
- pods with the injected gateway sidecar (container ``unwind-gateway``), one at a time:
  every pod shares this machine's network, and a second agent pod would reach the first
  pod's gateway on 127.0.0.1:8787, with the first pod's identity.

Any other pod stays Pending (the chart's operator Deployment among them: ``unwind dev up``
runs the operator as a local process). A pod with the sidecar ends when its other
containers have: the sidecar is stopped then and its end does not decide the pod's phase,
as Kubernetes does for native sidecars. A pod deleted while it runs is stopped. A pod left
Running by an earlier node process (killed, or ``unwind dev down``) is marked Failed when
the node starts, as after a node's reboot, so a Job makes a new one.

``unwind dev up`` starts one (``unwind dev node``); the cluster tests run one per namespace.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client

from ..operator.inject import CONTAINER as SIDECAR
from ..operator.undojob import LEDGER_LABEL
from .kubelet import PodResult, PodRunner

Select = Callable[[Any], bool]


def has_sidecar(pod: Any) -> bool:
    return any(c.name == SIDECAR for c in [*(pod.spec.init_containers or []), *pod.spec.containers])


def unwind_pod(pod: Any) -> bool:
    """An undo Job's pod or a pod with the gateway sidecar."""
    return LEDGER_LABEL in (pod.metadata.labels or {}) or has_sidecar(pod)


def undo_job_pod(pod: Any) -> bool:
    return LEDGER_LABEL in (pod.metadata.labels or {})


def local_path() -> str:
    """PATH for the containers: this Python's bin folder first (``unwind``, ``python``)."""
    return f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}"


class Node:
    """``with Node(api) as node: ...`` runs the selected pods until stopped."""

    def __init__(self, api: client.ApiClient, *, namespace: str | None = None,
                 select: Select = unwind_pod, workers: int = 4, logs: Path | None = None,
                 extra_env: dict[str, str] | None = None, interval: float = 0.3,
                 path: str | None = None) -> None:
        self.api, self.namespace, self.select, self.logs = api, namespace, select, logs
        self.core: Any = client.CoreV1Api(api)
        self.extra_env = extra_env or {}
        self.interval = interval
        self.path = path or local_path()
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="node")
        self.started: set[str] = set()
        self.results: list[PodResult | Exception] = []
        self._one_gateway = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self.run, daemon=True, name="node")

    def __enter__(self) -> Node:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        self.pool.shutdown(wait=True, cancel_futures=True)

    def _list(self, phase: str) -> Iterator[Any]:
        selector = f"status.phase={phase}"
        try:
            pods = (self.core.list_namespaced_pod(self.namespace, field_selector=selector) if self.namespace
                    else self.core.list_pod_for_all_namespaces(field_selector=selector))
        except (client.ApiException, OSError):
            return  # the API server restarting: try again on the next tick
        for pod in pods.items:
            if pod.metadata.deletion_timestamp is None and self.select(pod):
                yield pod

    def fail_orphans(self) -> None:
        """Pods this node was running when an earlier node process ended are Failed."""
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        for pod in self._list("Running"):
            with contextlib.suppress(client.ApiException):
                self.core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace, {"status": {
                    "phase": "Failed", "reason": "NodeRestarted",
                    "message": f"the node stand-in restarted at {now} while this pod ran"}})

    def run(self) -> None:
        self.fail_orphans()
        while not self._stop.wait(self.interval):
            for pod in self._list("Pending"):
                if pod.metadata.uid not in self.started:
                    self.started.add(pod.metadata.uid)
                    self.pool.submit(self._guarded, pod)

    def _guarded(self, pod: Any) -> None:
        try:
            with self._one_gateway if has_sidecar(pod) else contextlib.nullcontext():
                if not self._stop.is_set():
                    self.results.append(self._one(pod))
        except Exception as exc:  # a pod deleted meanwhile: a Job controller makes another
            self.results.append(exc)

    def _gone(self, namespace: str, name: str, uid: str) -> bool:
        try:
            pod = self.core.read_namespaced_pod(name, namespace)
        except client.ApiException as exc:
            return bool(exc.status == 404)
        except OSError:
            return False
        return bool(pod.metadata.uid != uid or pod.metadata.deletion_timestamp is not None)

    def _one(self, pod: Any) -> PodResult | Exception:
        namespace, name, uid = pod.metadata.namespace, pod.metadata.name, pod.metadata.uid
        runner = PodRunner(self.api, namespace, name, extra_env=self.extra_env, path=self.path).start()
        keep = self.logs / namespace / name if self.logs else None
        main = [n for n in runner.procs if n != SIDECAR]
        while any(runner.procs[n].poll() is None for n in main):
            if self._stop.is_set() or self._gone(namespace, name, uid):
                runner.stop(report=False, keep_logs=keep)
                return RuntimeError(f"pod {namespace}/{name} stopped before its containers ended")
            time.sleep(0.5)
        result = runner.stop(sidecars=frozenset({SIDECAR}), keep_logs=keep)
        assert result is not None
        return result
