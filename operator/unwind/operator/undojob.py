"""The Job that runs one rollback step (``unwind undo-step``), as a pure function.

What the pod gets, and why:

- the operator's image running ``unwind undo-step``, the step's input in env
  ``UNWIND_STEP`` (one JSON value: the runner needs nothing else; a step input larger
  than ``MAX_STEP_BYTES`` is refused rather than split, see ``step_problem``);
- only the Secrets the called tools' upstream headers name (the undo or lookup tool and
  the read-back), mounted at ``/etc/unwind/secrets/<name>`` as in the gateway sidecar;
- no Kubernetes API access at all (``automountServiceAccountToken: false``): it writes
  its result to its termination message and the operator records it;
- ``restartPolicy: Never``, ``backoffLimit: 1`` (one more pod if the first is lost; the
  step's idempotency key makes the repeat harmless) and ``activeDeadlineSeconds`` from
  the time the step may take: the step's ``timeout_ms`` (else the called tool's upstream
  timeout), plus every read-back attempt and its backoff, plus start-up, for each pod;
- non-root, read-only root file system, no privilege escalation, no capabilities, the
  runtime's default seccomp profile: the Pod Security Standards' ``restricted`` profile, so
  a namespace that enforces it still runs its rollbacks.

Names are deterministic (``job_name``): the same step of the same request always gets the
same name, so a restarted operator that creates it again gets 409 and knows it ran.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from .. import API_GROUP, API_VERSION
from ..manifest.model import ToolManifest
from .inject import SECRETS_DIR, header_secrets

LEDGER_LABEL = f"{API_GROUP}/ledger"
ENTRY_LABEL = f"{API_GROUP}/entry"
STEP_LABEL = f"{API_GROUP}/step"  # the step's index, or "lookup" for a lost answer's lookup
ENTRY_ANNOTATION = f"{API_GROUP}/entry"
MANAGED = {"app.kubernetes.io/managed-by": "unwind", "app.kubernetes.io/component": "undo-step"}
CONTAINER = "undo-step"
BACKOFF_LIMIT = 1
STARTUP_SECONDS = 30  # pulling and starting the container, per pod
DEFAULT_UPSTREAM_MS = 30_000  # the gateway's default upstream timeout (upstream/client.py)
MAX_STEP_BYTES = 64 * 1024  # far below the kernel's 128 KiB limit for one env string
# the operator's OTLP settings an undo Job gets (its exporter's headers stay out: they would
# be readable by whoever reads Jobs)
TRACE_ENV = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
             "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


def _hex(*parts: object) -> str:
    return hashlib.sha256("\0".join(str(p) for p in parts).encode()).hexdigest()[:8]


def _stem(ledger: str) -> str:
    return ledger[:40].rstrip("-.") or "ledger"


def job_name(ledger: str, uid: str, index: int, entry: str, action: str, generation: int) -> str:
    """``<ledger[:40]>-undo-<index>-<8 hex>``: a DNS label (at most 63 characters), the same
    for every pass over one step of one request, different for the next request."""
    return f"{_stem(ledger)}-undo-{index}-{_hex(ledger, uid, entry, action, generation)}"


def lookup_job_name(ledger: str, uid: str, entry: str, attempt: int) -> str:
    """``<ledger[:40]>-lookup-<8 hex>`` for the reconciliation of a lost answer (one per
    attempt)."""
    return f"{_stem(ledger)}-lookup-{_hex(ledger, uid, entry, 'lookup', attempt)}"


def label_value(text: str) -> str:
    """The text when it is a valid label value (entry ids usually are, so ``kubectl get
    jobs -l unwind.dev/entry=ID`` works), else a stable hash of it."""
    if _LABEL_VALUE.fullmatch(text) and len(text) <= 63:
        return text
    return "x-" + hashlib.sha256(text.encode()).hexdigest()[:20]


def _tool_ms(m: ToolManifest | None) -> int:
    if m is None:
        return DEFAULT_UPSTREAM_MS
    upstream = m.upstream.timeout_ms if m.upstream is not None else None
    return int(upstream or m.timeout_ms or DEFAULT_UPSTREAM_MS)


def deadline_seconds(step_input: dict[str, Any], called: ToolManifest | None,
                     verifier: ToolManifest | None) -> int:
    """activeDeadlineSeconds: every pod the Job may start, each with time for the call,
    every read-back attempt with its backoff, and start-up."""
    call_ms = int(step_input.get("timeout_ms") or _tool_ms(called))
    v = step_input.get("verification") or {}
    retries: int = int(v.get("retries") or 0)
    backoff = int(v.get("backoff_ms") or 0)
    read_ms = retries * _tool_ms(verifier) + backoff * (2 ** max(retries - 1, 0) - 1)
    per_pod: int = math.ceil((call_ms + read_ms) / 1000) + STARTUP_SECONDS
    return per_pod * (BACKOFF_LIMIT + 1) + 10  # and the Job controller's wait between pods


def step_text(step_input: dict[str, Any]) -> str:
    return json.dumps(step_input, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def step_problem(text: str) -> str | None:
    """Why a step input cannot ride in the Job's environment, or None."""
    size = len(text.encode())
    if size <= MAX_STEP_BYTES:
        return None
    return (f"the step's input is {size // 1024} KiB, more than the {MAX_STEP_BYTES // 1024} KiB "
            "an undo Job carries: its arguments or manifests are too large")


def ledger_of_job(meta: dict[str, Any]) -> str | None:
    """The EffectLedger a Job belongs to: its controlling owner (the label may be a hash)."""
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == "EffectLedger" and str(ref.get("apiVersion", "")).startswith(f"{API_GROUP}/"):
            return str(ref.get("name"))
    value = (meta.get("labels") or {}).get(LEDGER_LABEL)
    return str(value) if value else None


def _volume(secret: str) -> str:
    clean = secret.replace(".", "-")[:40].strip("-")
    return f"s-{clean}-{hashlib.sha256(secret.encode()).hexdigest()[:8]}"


def trace_env(environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The OTLP settings of ``environ`` (the operator's) that its undo Jobs get."""
    return tuple((k, environ[k]) for k in TRACE_ENV if environ.get(k))


def job_body(*, name: str, ledger: str, uid: str, entry: str, step: str, text: str,
             image: str, deadline: int, manifests: Iterable[ToolManifest | None],
             trace: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The Job running ``unwind undo-step`` with the step input ``text``; ``trace``: its
    ``TRACEPARENT`` (the undone call's) and OTLP settings, so the step continues the trace."""
    secrets = sorted(header_secrets(m for m in manifests if m is not None))
    # a ledger's name may be 253 characters, a label value 63: long ones are hashed, and
    # the ledger is found from the owner reference (ledger_of_job)
    labels = {**MANAGED, LEDGER_LABEL: label_value(ledger), ENTRY_LABEL: label_value(entry), STEP_LABEL: step}
    env = [{"name": "UNWIND_STEP", "value": text},
           {"name": "UNWIND_SECRETS_DIR", "value": SECRETS_DIR},
           *({"name": k, "value": v} for k, v in sorted((trace or {}).items()))]
    mounts = [{"name": _volume(s), "mountPath": f"{SECRETS_DIR}/{s}", "readOnly": True} for s in secrets]
    volumes = [{"name": _volume(s), "secret": {"secretName": s}} for s in secrets]
    container: dict[str, Any] = {
        "name": CONTAINER, "image": image, "imagePullPolicy": "IfNotPresent",
        "command": ["unwind", "undo-step"], "env": env,
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"},
                      "limits": {"cpu": "500m", "memory": "128Mi"}},
        "terminationMessagePolicy": "File",
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "readOnlyRootFilesystem": True,
                            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                            "seccompProfile": {"type": "RuntimeDefault"}},
    }
    if mounts:
        container["volumeMounts"] = mounts
    pod: dict[str, Any] = {"restartPolicy": "Never", "automountServiceAccountToken": False,
                           "enableServiceLinks": False, "containers": [container],
                           "securityContext": {"runAsNonRoot": True, "runAsUser": 65532,
                                               "runAsGroup": 65532, "fsGroup": 65532,
                                               "seccompProfile": {"type": "RuntimeDefault"}}}
    if volumes:
        pod["volumes"] = volumes
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": labels, "annotations": {ENTRY_ANNOTATION: entry},
                     "ownerReferences": [{"apiVersion": f"{API_GROUP}/{API_VERSION}",
                                          "kind": "EffectLedger", "name": ledger, "uid": uid,
                                          "controller": True}]},
        "spec": {"backoffLimit": BACKOFF_LIMIT, "activeDeadlineSeconds": deadline,
                 "template": {"metadata": {"labels": labels}, "spec": pod}},
    }
