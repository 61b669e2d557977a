"""Why an undo Job's pod cannot start or keeps dying, from the pod and its Events.

Pure: the rollback pass gathers the pods and Events (operator/jobs.py) and writes what
this returns into the ledger's RolledBack condition. A pod the kubelet cannot start
(a missing Secret or ConfigMap, an image it cannot pull, no node that fits) otherwise sits
silent until the Job's activeDeadlineSeconds; these are the causes an SRE can act on.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

# Waiting reasons of a container that will not start without someone's help.
_WAITING = {
    "ImagePullBackOff": "its image cannot be pulled",
    "ErrImagePull": "its image cannot be pulled",
    "InvalidImageName": "its image name is invalid",
    "CreateContainerConfigError": "its container cannot be configured",
    "CreateContainerError": "its container cannot be created",
    "CrashLoopBackOff": "its container keeps crashing",
}
_MISSING = re.compile(r'(secret|configmap)s? "([^"]+)" not found', re.IGNORECASE)
_FIX = {"secret": "recreate the Secret {name}{ns}; the step then starts by itself",
        "configmap": "recreate the ConfigMap {name}{ns}; the step then starts by itself"}


def _missing(text: str) -> tuple[str, str] | None:
    m = _MISSING.search(text)
    return (m.group(1).lower(), m.group(2)) if m else None


def _events_of(pod: Mapping[str, Any], events: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The Warning Events about this pod (by UID when the Event has one, else by name)."""
    meta = pod.get("metadata") or {}
    out = []
    for e in events:
        inv = e.get("involvedObject") or e.get("regarding") or {}
        if inv.get("kind") != "Pod" or e.get("type") != "Warning":
            continue
        if inv.get("uid") and meta.get("uid"):
            if inv["uid"] != meta["uid"]:
                continue
        elif inv.get("name") != meta.get("name"):
            continue
        out.append(e)
    return sorted(out, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))


def _with_fix(cause: str, text: str, namespace: str) -> str:
    missing = _missing(text)
    if missing is None:
        return cause
    kind, name = missing
    ns = f" in namespace {namespace}" if namespace else ""
    return f"{cause}: {kind.replace('configmap', 'ConfigMap').replace('secret', 'Secret')} " \
           f"{name!r} not found; {_FIX[kind].format(name=name, ns=ns)}"


def pod_problem(pod: Mapping[str, Any], events: Iterable[Mapping[str, Any]]) -> str | None:
    """Why this pod cannot run its step, in words an SRE acts on; None when nothing
    shows it is stuck (it may simply still be starting or running)."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    name, namespace = str(meta.get("name") or "?"), str(meta.get("namespace") or "")
    if status.get("phase") in ("Succeeded", "Failed") and not _oom(status):
        return None
    mine = _events_of(pod, events)
    for cs in status.get("containerStatuses") or []:
        term = ((cs.get("lastState") or {}).get("terminated") or (cs.get("state") or {}).get("terminated") or {})
        if term.get("reason") == "OOMKilled":
            return f"pod {name}: its container was killed for running out of memory (OOMKilled)"
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason = str(waiting.get("reason") or "")
        if reason in _WAITING:
            msg = str(waiting.get("message") or "")
            cause = f"pod {name}: {_WAITING[reason]} ({reason}" + (f": {msg}" if msg else "") + ")"
            return _with_fix(cause, msg, namespace)
    for c in status.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable":
            return f"pod {name}: no node can take it (Unschedulable: {c.get('message') or 'no reason given'})"
    for e in reversed(mine):
        reason, msg = str(e.get("reason") or ""), str(e.get("message") or e.get("note") or "")
        if reason in ("FailedMount", "FailedAttachVolume"):
            return _with_fix(f"pod {name}: a volume cannot be mounted ({reason}: {msg})", msg, namespace)
        if reason == "FailedScheduling":
            return f"pod {name}: no node can take it (FailedScheduling: {msg})"
    return None


def _oom(status: Mapping[str, Any]) -> bool:
    return any(((cs.get("state") or {}).get("terminated") or {}).get("reason") == "OOMKilled"
               for cs in status.get("containerStatuses") or [])


def job_problem(pods: Iterable[Mapping[str, Any]], events: Iterable[Mapping[str, Any]]) -> str:
    """The problem of a Job's newest pod that has one ("" when none shows any)."""
    events = list(events)
    newest = sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""),
                    reverse=True)
    for pod in newest:
        found = pod_problem(pod, events)
        if found:
            return found
    return ""
