"""A kubelet stand-in: run a Pod's containers as local processes, then report the Pod.

Why this exists: the local control plane has no nodes and no container runtime, yet Unwind
runs its gateway as a sidecar and its undo steps as Jobs, and both must be exercised for
real. ``PodRunner`` plays the kubelet for one Pod:

- every container's ``command + args`` runs as a local process (the image is ignored: the
  command must exist on this machine), all at once, as in a pod;
- env as the kubelet builds it: plain values, ``fieldRef`` (name, namespace, service
  account), ``secretKeyRef``/``configMapKeyRef``, and ``KUBERNETES_SERVICE_HOST/PORT``
  pointing at the local API server;
- volumes as files: ConfigMaps, Secrets, projected volumes (a ServiceAccount token from the
  TokenRequest API, ConfigMaps, Secrets, the downward API) and emptyDirs, each in a folder
  of its own, rewritten when the objects change (as the kubelet syncs them). Only the
  container that mounts a volume sees it: a mount path in the container's env or command
  line is rewritten to the volume's folder, so a container that does not mount the token
  cannot find it;
- the Pod's status is patched (status subresource) with each container's terminated state
  and the termination message (the file named by ``UNWIND_TERMINATION_LOG``, else the
  output's tail), which is all the Job controller needs.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from kubernetes import client

MAX_MESSAGE = 4096  # the kubelet's limit for a termination message
TERMINATION_LOG_ENV = "UNWIND_TERMINATION_LOG"


@dataclass(frozen=True)
class PodResult:
    name: str
    exit_code: int
    phase: str
    message: str
    output: str


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _tail(text: str, limit: int = MAX_MESSAGE) -> str:
    return text[-limit:]


class PodRunner:
    """``with PodRunner(api, ns, name) as pod: pod.wait(...)`` runs the Pod's containers."""

    def __init__(self, api: client.ApiClient, namespace: str, name: str, *,
                 extra_env: dict[str, str] | None = None, path: str | None = None) -> None:
        self.api, self.namespace, self.name = api, namespace, name
        self.core: Any = client.CoreV1Api(api)
        self.pod: Any = self.core.read_namespaced_pod(name, namespace)
        self.extra_env = extra_env or {}
        self.path = path or os.environ.get("PATH", "/usr/bin:/bin")
        self.root = Path(tempfile.mkdtemp(prefix=f"unwind-pod-{name[:40]}-"))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}
        self.started = _now()
        self._stop = threading.Event()
        self._sync: threading.Thread | None = None

    # ---- volumes ------------------------------------------------------------------------
    def _folder(self, volume: str) -> Path:
        return self.root / "volumes" / volume

    def _write(self, folder: Path, files: dict[str, bytes]) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            path = folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists() or path.read_bytes() != data:
                tmp = path.with_name(path.name + ".tmp")
                tmp.write_bytes(data)
                tmp.replace(path)  # a reader sees the old file or the new, never half

    def _items(self, data: dict[str, bytes], items: list[Any] | None) -> dict[str, bytes]:
        if not items:
            return data
        return {i.path: data[i.key] for i in items if i.key in data}

    def _config_map(self, name: str, optional: bool | None) -> dict[str, bytes]:
        try:
            cm = self.core.read_namespaced_config_map(name, self.namespace)
        except client.ApiException as exc:
            if exc.status == 404 and optional is not False:
                return {}
            raise
        return {k: v.encode() for k, v in (cm.data or {}).items()}

    def _secret(self, name: str, optional: bool | None) -> dict[str, bytes]:
        try:
            secret = self.core.read_namespaced_secret(name, self.namespace)
        except client.ApiException as exc:
            if exc.status == 404 and optional is not False:
                return {}
            raise
        return {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}

    def _token(self, expiration: int | None, audience: str | None = None) -> bytes:
        # as the kubelet asks: the source's audience, bound to the pod (it dies with it)
        request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
            audiences=[audience] if audience else [], expiration_seconds=expiration or 3600,
            bound_object_ref=client.V1BoundObjectReference(kind="Pod", api_version="v1", name=self.pod.metadata.name,
                                                           uid=self.pod.metadata.uid)))
        answer = self.core.create_namespaced_service_account_token(
            self.pod.spec.service_account_name or "default", self.namespace, request)
        return str(answer.status.token).encode()

    def _field(self, path: str) -> str:
        meta = self.pod.metadata
        fields = {"metadata.name": meta.name, "metadata.namespace": self.namespace,
                  "spec.serviceAccountName": self.pod.spec.service_account_name or "default",
                  "metadata.uid": meta.uid}
        return str(fields.get(path) or "")

    def sync_volumes(self, first: bool = False) -> None:
        for volume in self.pod.spec.volumes or []:
            folder = self._folder(volume.name)
            if volume.config_map is not None:
                data = self._config_map(volume.config_map.name, volume.config_map.optional)
                self._write(folder, self._items(data, volume.config_map.items))
            elif volume.secret is not None:
                data = self._secret(volume.secret.secret_name, volume.secret.optional)
                self._write(folder, self._items(data, volume.secret.items))
            elif volume.projected is not None:
                files: dict[str, bytes] = {}
                for source in volume.projected.sources or []:
                    if source.service_account_token is not None:
                        if first or not (folder / source.service_account_token.path).exists():
                            files[source.service_account_token.path] = self._token(
                                source.service_account_token.expiration_seconds,
                                source.service_account_token.audience)
                    elif source.config_map is not None:
                        data = self._config_map(source.config_map.name, source.config_map.optional)
                        files.update(self._items(data, source.config_map.items))
                    elif source.secret is not None:
                        data = self._secret(source.secret.name, source.secret.optional)
                        files.update(self._items(data, source.secret.items))
                    elif source.downward_api is not None:
                        files.update({i.path: self._field(i.field_ref.field_path).encode()
                                      for i in source.downward_api.items or [] if i.field_ref})
                self._write(folder, files)
            elif volume.downward_api is not None:
                self._write(folder, {i.path: self._field(i.field_ref.field_path).encode()
                                     for i in volume.downward_api.items or [] if i.field_ref})
            elif volume.empty_dir is not None:
                folder.mkdir(parents=True, exist_ok=True)

    def _keep_syncing(self) -> None:
        while not self._stop.wait(1.0):
            # a failed sync leaves the previous files, as the kubelet does
            with contextlib.suppress(Exception):
                self.sync_volumes()

    # ---- containers ---------------------------------------------------------------------
    def _base_env(self, container: Any) -> dict[str, str]:
        """What the kubelet sets: paths of this machine, never rewritten by mounts."""
        server = urlparse(self.api.configuration.host)
        return {"PATH": self.path, "HOME": str(self.root / "home" / container.name),
                "HOSTNAME": self.name, "KUBERNETES_SERVICE_HOST": server.hostname or "127.0.0.1",
                "KUBERNETES_SERVICE_PORT": str(server.port or 443)}

    def _env(self, container: Any) -> dict[str, str]:
        """The container's declared env (its paths are the container's: mounts rewrite them)."""
        env: dict[str, str] = {}
        for e in container.env or []:
            if e.value is not None:
                env[e.name] = e.value
            elif e.value_from is not None and e.value_from.field_ref is not None:
                env[e.name] = self._field(e.value_from.field_ref.field_path)
            elif e.value_from is not None and e.value_from.secret_key_ref is not None:
                ref = e.value_from.secret_key_ref
                env[e.name] = self._secret(ref.name, ref.optional).get(ref.key, b"").decode()
            elif e.value_from is not None and e.value_from.config_map_key_ref is not None:
                ref = e.value_from.config_map_key_ref
                env[e.name] = self._config_map(ref.name, ref.optional).get(ref.key, b"").decode()
        return env

    def _mounts(self, container: Any) -> list[tuple[str, str]]:
        """(mount path, local folder), longest path first so nested mounts win."""
        pairs = [(m.mount_path.rstrip("/"), str(self._folder(m.name) / (m.sub_path or "")).rstrip("/"))
                 for m in container.volume_mounts or []]
        return sorted(pairs, key=lambda p: -len(p[0]))

    @staticmethod
    def _remap(value: str, mounts: list[tuple[str, str]]) -> str:
        for path, folder in mounts:
            if value == path or value.startswith(path + "/"):
                return folder + value[len(path):]
        return value

    @property
    def sidecar_inits(self) -> list[Any]:
        """Native sidecars (init containers with ``restartPolicy: Always``): run beside the
        containers, as a kubelet from 1.29 does; other init containers are not run."""
        return [c for c in self.pod.spec.init_containers or [] if c.restart_policy == "Always"]

    def start(self) -> PodRunner:
        self.sync_volumes(first=True)
        for container in [*self.sidecar_inits, *self.pod.spec.containers]:
            mounts = self._mounts(container)
            argv = [self._remap(a, mounts) for a in [*(container.command or []), *(container.args or [])]]
            env = {**self._base_env(container),
                   **{k: self._remap(v, mounts) for k, v in self._env(container).items()}}
            Path(env["HOME"]).mkdir(parents=True, exist_ok=True)
            log = self.root / f"{container.name}.log"
            term = self.root / f"{container.name}.termination-log"
            term.touch()
            env.setdefault(TERMINATION_LOG_ENV, str(term))
            env.update(self.extra_env)
            self.logs[container.name] = log
            if not argv:
                log.write_text("unwind kubelet: container has no command (images are not run)\n")
                continue
            with log.open("wb") as out:
                try:
                    self.procs[container.name] = subprocess.Popen(
                        argv, env=env, cwd=env["HOME"], stdin=subprocess.DEVNULL, stdout=out,
                        stderr=subprocess.STDOUT, start_new_session=True)
                except FileNotFoundError as exc:
                    out.write(f"unwind kubelet: {exc}\n".encode())
        self._sync = threading.Thread(target=self._keep_syncing, daemon=True, name=f"kubelet-{self.name}")
        self._sync.start()
        self._patch_running()
        return self

    def __enter__(self) -> PodRunner:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def output(self, container: str) -> str:
        return self.logs[container].read_text(errors="replace") if container in self.logs else ""

    def wait(self, container: str, timeout: float = 60.0) -> int:
        proc = self.procs.get(container)
        if proc is None:
            return 127
        return proc.wait(timeout)

    def stop(self, report: bool = True, sidecars: frozenset[str] = frozenset(),
             keep_logs: Path | None = None) -> PodResult | None:
        """Stop every container still running (SIGTERM, then SIGKILL), keep each container's
        output in ``keep_logs/CONTAINER.log``, report, clean up."""
        self._stop.set()
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        # The logs are kept before the phase is reported: whoever waits for the phase reads them.
        if keep_logs is not None:
            keep_logs.mkdir(parents=True, exist_ok=True)
            for container, log in self.logs.items():
                with contextlib.suppress(OSError):
                    shutil.copyfile(log, keep_logs / f"{container}.log")
        try:
            return self.report(sidecars) if report else None
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def _patch_running(self) -> None:
        def running(containers: list[Any]) -> list[dict[str, Any]]:
            return [{"name": c.name, "image": c.image or "", "imageID": "", "ready": True, "restartCount": 0,
                     "started": True, "state": {"running": {"startedAt": self.started}}} for c in containers]
        status: dict[str, Any] = {"phase": "Running", "startTime": self.started,
                                  "containerStatuses": running(self.pod.spec.containers)}
        if self.sidecar_inits:
            status["initContainerStatuses"] = running(self.sidecar_inits)
        self.core.patch_namespaced_pod_status(self.name, self.namespace, {"status": status})

    def report(self, sidecars: frozenset[str] = frozenset()) -> PodResult:
        """Patch the Pod's status with each container's end; the Pod's result is its first
        container's (a Job's pod has one). ``sidecars`` were stopped because the others had
        finished: their end does not decide the phase (as for Kubernetes' native sidecars)."""
        statuses, results = [], []
        for container in [*self.sidecar_inits, *self.pod.spec.containers]:
            proc = self.procs.get(container.name)
            code = 127 if proc is None else (proc.returncode if proc.returncode is not None else 137)
            term = self.root / f"{container.name}.termination-log"
            written = term.read_text(errors="replace") if term.exists() else ""
            output = self.output(container.name)
            message = _tail(written) if written else _tail(output)
            statuses.append({"name": container.name, "image": container.image or "", "imageID": "",
                             "ready": False, "restartCount": 0, "started": False,
                             "state": {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                                                      "message": message, "startedAt": self.started,
                                                      "finishedAt": _now()}}})
            results.append(PodResult(self.name, code, "Succeeded" if code == 0 else "Failed", message, output))
        inits = len(self.sidecar_inits)  # a native sidecar never decides the phase
        deciding = [r for c, r in zip(self.pod.spec.containers, results[inits:], strict=True)
                    if c.name not in sidecars]
        phase = "Succeeded" if all(r.exit_code == 0 for r in deciding) else "Failed"
        status: dict[str, Any] = {
            "phase": phase, "startTime": self.started,
            "conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted",
                            "lastTransitionTime": _now()}],
            "containerStatuses": statuses[inits:]}
        if inits:
            status["initContainerStatuses"] = statuses[:inits]
        self.core.patch_namespaced_pod_status(self.name, self.namespace, {"status": status})
        return results[inits]


def run_pod(api: client.ApiClient, namespace: str, name: str, *,
            timeout: float = 300.0, extra_env: dict[str, str] | None = None) -> PodResult:
    """Run a Pod to completion (a Job's pod: its containers run until they exit)."""
    runner = PodRunner(api, namespace, name, extra_env=extra_env).start()
    deadline = time.monotonic() + timeout
    try:
        for name, proc in runner.procs.items():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
                with runner.logs[name].open("a") as log:
                    log.write("\nunwind kubelet: timed out\n")
        runner._stop.set()
        return runner.report()
    finally:
        runner.stop(report=False)


def job_pods(api: client.ApiClient, namespace: str, job_name: str) -> list[Any]:
    core = client.CoreV1Api(api)
    return list(core.list_namespaced_pod(namespace, label_selector=f"job-name={job_name}").items)


def pending_pods(api: client.ApiClient, namespace: str, selector: str) -> Iterator[Any]:
    core: Any = client.CoreV1Api(api)
    for p in core.list_namespaced_pod(namespace, label_selector=selector).items:
        if p.status.phase in (None, "Pending") and p.metadata.deletion_timestamp is None:
            yield p


def run_job_pods(api: client.ApiClient, namespace: str, job_name: str, *,
                 timeout: float = 60.0) -> list[PodResult]:
    """Wait for the Job's Pods to appear (the controller manager makes them), run every Pending one."""
    deadline = time.monotonic() + timeout
    while True:
        pending = list(pending_pods(api, namespace, f"job-name={job_name}"))
        if pending or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    if not pending:
        raise TimeoutError(f"no Pending pod for job {namespace}/{job_name} after {timeout:.0f}s")
    return [run_pod(api, namespace, p.metadata.name) for p in pending]
