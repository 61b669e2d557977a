"""A demo agent: makes tool calls through its pod's gateway sidecar and says what each did.

``python -m unwind.controlplane.demo_agent`` reads the calls from ``$UNWIND_DEMO_CALLS``, a
JSON list of ``{"tool": str, "arguments": {...}, "key": str?, "stage": bool?, "pause":
seconds?}`` (``pause``: wait that long before the call, as an agent thinking), waits for
the gateway on ``$UNWIND_GATEWAY`` (default http://127.0.0.1:8787, where the injection puts
it) to be ready, makes each call in order (REST: ``POST /call/TOOL``), and prints one line
per call: the tool, the HTTP status, the effect class, the ledger entry and how to undo it.
A call that needs approval (428 ``approval_required``, with a ``key``) is repeated with
the same key every 2 s until it is decided or ``$UNWIND_DEMO_APPROVAL_WAIT`` seconds (default
900) have passed, as an agent waiting for ``kubectl unwind approve ledger/RUN --entry KEY``.
It exits 1 at the first call that is not a 2xx in the end (the gateway's error printed), 2
when the calls cannot be read, 3 when the gateway does not become ready within a minute.

Whichever way it ends, its last act is ``POST /quitquitquit`` to the gateway
(``unwind.gateway.quit.request_quit``): where the gateway is a plain container (API servers
before 1.29) that ends it, so the pod completes; a native sidecar has no such endpoint and
is stopped by the kubelet, and the 404 (or no answer at all) is ignored.

This is what ``examples/demo-agent.yaml`` runs on ``unwind dev up``; a real agent is any
program that calls the gateway the same way (or through MCP).
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from ..gateway.quit import request_quit

GATEWAY = "http://127.0.0.1:8787"


def read_calls(text: str) -> list[dict[str, Any]]:
    calls = json.loads(text)
    if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("tool"), str)
                                              for c in calls):
        raise ValueError("UNWIND_DEMO_CALLS must be a JSON list of objects with a string `tool`")
    return calls


def wait_ready(base: str, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{base}/readyz", timeout=2) as answer:
                if answer.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.3)
    return False


def call(base: str, spec: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """(status, the effect report, the answer's body) of one call."""
    body = {"arguments": spec.get("arguments") or {}, **({"stage": True} if spec.get("stage") else {})}
    headers = {"Content-Type": "application/json", **({"Idempotency-Key": spec["key"]} if spec.get("key") else {})}
    req = urllib.request.Request(f"{base}/call/{spec['tool']}", data=json.dumps(body).encode(),
                                 method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as answer:
            status, raw, report = answer.status, answer.read(), answer.headers.get("X-Unwind-Effect")
    except urllib.error.HTTPError as exc:
        status, raw, report = exc.code, exc.read(), exc.headers.get("X-Unwind-Effect")
    try:
        parsed = json.loads(raw) if raw else {}
    except ValueError:
        parsed = {"raw": raw.decode(errors="replace")}
    return status, json.loads(report) if report else {}, parsed if isinstance(parsed, dict) else {"body": parsed}


def describe(tool: str, status: int, report: dict[str, Any], body: dict[str, Any]) -> str:
    if not 200 <= status < 300:
        error: dict[str, Any] = body["error"] if isinstance(body.get("error"), dict) else body
        return f"{tool}: {status} {error.get('code', '')}: {error.get('message', body)}"
    ledger = report.get("ledger") or {}
    undo = report.get("undo") or {}
    how = f"undo: {undo.get('kind')} {undo.get('tool')}" if undo.get("tool") else "undo: none"
    if report.get("staged"):
        how = f"staged: discard {report['staged'].get('discard')}, promote {report['staged'].get('promote')}"
    return (f"{tool}: {status} {report.get('class', '?')}, ledger {ledger.get('name')} "
            f"entry {ledger.get('entry')}; {how}")


def main() -> int:
    base = os.environ.get("UNWIND_GATEWAY", GATEWAY).rstrip("/")
    try:
        return run_calls(base)
    finally:  # succeeded or not: the pod is done once the agent is
        print(request_quit(base), file=sys.stderr, flush=True)


def run_calls(base: str) -> int:
    try:
        calls = read_calls(os.environ.get("UNWIND_DEMO_CALLS", "[]"))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not wait_ready(base):
        print(f"error: the gateway at {base} was not ready within 60 s", file=sys.stderr)
        return 3
    patience = float(os.environ.get("UNWIND_DEMO_APPROVAL_WAIT", "900"))
    for spec in calls:
        time.sleep(float(spec.get("pause") or 0))
        status, report, body = call(base, spec)
        print(describe(spec["tool"], status, report, body), flush=True)
        deadline = time.monotonic() + patience
        while waiting_for_approval(status, body) and spec.get("key") and time.monotonic() < deadline:
            time.sleep(2)  # the same call with the same key again: the gateway tallies the Approvals
            status, report, body = call(base, spec)
            if not waiting_for_approval(status, body):
                print(describe(spec["tool"], status, report, body), flush=True)
        if not 200 <= status < 300:
            return 1
    return 0


def waiting_for_approval(status: int, body: dict[str, Any]) -> bool:
    error = body.get("error")
    return status == 428 and isinstance(error, dict) and error.get("code") == "approval_required"


if __name__ == "__main__":
    sys.exit(main())
