"""A tiny kubelet stand-in: run a Pod's first container as a local process, then report it.

Why this exists: the local control plane has no nodes and no container runtime, yet Unwind
runs work as Jobs and reads each Pod's termination message. Here a Pod's first container
``command + args`` runs as a subprocess with the Pod's plain ``value`` env entries, and
the Pod's status is patched (status subresource) to ``Succeeded``/``Failed`` with a
terminated container state — which is what the real Job controller needs to complete
the Job. The file a container writes to ``/dev/termination-log`` is a temp file here, named
by the env var ``UNWIND_TERMINATION_LOG``; without it the message is the output's tail.
The image is ignored: the command must exist on this machine.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def run_pod(api: client.ApiClient, namespace: str, name: str, *,
            timeout: float = 300.0, extra_env: dict[str, str] | None = None) -> PodResult:
    """Run Pod ``namespace/name``'s first container locally and patch its status with the outcome."""
    core = client.CoreV1Api(api)
    pod: Any = core.read_namespaced_pod(name, namespace)
    container = pod.spec.containers[0]
    argv = [*(container.command or []), *(container.args or [])]
    started = _now()
    with tempfile.TemporaryDirectory(prefix="unwind-pod-") as tmp:
        term_log = Path(tmp) / "termination-log"
        term_log.touch()
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tmp,
               "HOSTNAME": name, TERMINATION_LOG_ENV: str(term_log)}
        env.update({e.name: e.value for e in (container.env or []) if e.value is not None})
        env.update(extra_env or {})
        if not argv:
            code, output = 127, "unwind kubelet: container has no command (images are not run)"
        else:
            try:
                proc = subprocess.run(argv, env=env, cwd=tmp, stdin=subprocess.DEVNULL,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      timeout=timeout, check=False)
                code, output = proc.returncode, proc.stdout.decode(errors="replace")
            except FileNotFoundError as exc:
                code, output = 127, f"unwind kubelet: {exc}"
            except subprocess.TimeoutExpired as exc:
                code = 137
                output = (exc.stdout or b"").decode(errors="replace") + "\nunwind kubelet: timed out"
        written = term_log.read_text(errors="replace")
    message = _tail(written) if written else _tail(output)
    phase = "Succeeded" if code == 0 else "Failed"
    terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                  "message": message, "startedAt": started, "finishedAt": _now()}
    body: dict[str, Any] = {"status": {
        "phase": phase, "startTime": started,
        "conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted",
                        "lastTransitionTime": _now()}],
        "containerStatuses": [{
            "name": container.name, "image": container.image or "", "imageID": "",
            "ready": False, "restartCount": 0, "started": False,
            "state": {"terminated": terminated},
        }],
    }}
    core.patch_namespaced_pod_status(name, namespace, body)
    return PodResult(name=name, exit_code=code, phase=phase, message=message, output=output)


def job_pods(api: client.ApiClient, namespace: str, job_name: str) -> list[Any]:
    core = client.CoreV1Api(api)
    return list(core.list_namespaced_pod(namespace, label_selector=f"job-name={job_name}").items)


def run_job_pods(api: client.ApiClient, namespace: str, job_name: str, *,
                 timeout: float = 60.0) -> list[PodResult]:
    """Wait for the Job's Pods to appear (the controller manager makes them), run every Pending one."""
    deadline = time.monotonic() + timeout
    while True:
        pending = [p for p in job_pods(api, namespace, job_name)
                   if p.status.phase in (None, "Pending") and p.metadata.deletion_timestamp is None]
        if pending or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    if not pending:
        raise TimeoutError(f"no Pending pod for job {namespace}/{job_name} after {timeout:.0f}s")
    return [run_pod(api, namespace, p.metadata.name) for p in pending]
