"""A rollback's world on the local control plane, for the cluster tests and the benchmark.

- the test upstream (``tests/upstream/server.py``) as a process, and effects made on it
  directly (``effect``), as an agent's calls through a gateway would have made them;
- the example ToolManifests and the rollback tests' extra tools, pointed at that upstream
  (``tool_resources``), applied into a namespace by a trusted applier;
- ledger entries as the gateway writes them (``make_entry``: the handle built by the
  gateway's own ``build_handle``, the checksum of the version that ran);
- ``job_kubelet``: the kubelet stand-in playing the node for every undo Job's pod of one
  namespace, a few at a time, each as a local ``unwind undo-step`` process.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from unwind.controlplane.node import Node, undo_job_pod
from unwind.ledger.entry import Entry, Staged, Times, stamp
from unwind.ledger.handle import build_handle
from unwind.manifest.model import ToolManifest

ROOT = Path(__file__).resolve().parents[1]
# The upstream route each effectful tool of the examples calls (for ``effect``).
ROUTES = {"stripe.create_charge": "/charges", "github.create_comment": "/comments",
          "github.create_issue": "/issues", "github.create_release": "/releases",
          "test.issue_checked_wrongly": "/issues", "test.issue_without_number": "/issues",
          "test.issue_closed_with_approval": "/issues"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Upstream:
    """``python -m tests.upstream.server`` on a free port."""

    def __init__(self, log: Path) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        env = {**os.environ, "PYTHONPATH": f"{ROOT / 'operator'}{os.pathsep}{ROOT}"}
        with log.open("wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "tests.upstream.server", "--port",
                                          self.url.rsplit(":", 1)[1]], cwd=ROOT, env=env,
                                         stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.admin("requests")
                return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"the test upstream did not start: {log.read_text()[-2000:]}") from None
                time.sleep(0.1)

    def request(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
        with urllib.request.urlopen(req, timeout=10) as answer:
            return json.loads(answer.read())

    def admin(self, what: str, body: Any = None) -> Any:
        return self.request("GET" if body is None else "POST", f"/_admin/{what}", body)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def tool_resources(upstream_url: str) -> list[dict[str, Any]]:
    """The example manifests and tests/rollback/extra.yaml as ToolManifest objects (no
    namespace: applied into the one given), reaching ``upstream_url``."""
    out: list[dict[str, Any]] = []
    for path in (ROOT / "manifests/code-hosting.yaml", ROOT / "manifests/payments.yaml"):
        text = path.read_text().replace("http://127.0.0.1:8788", upstream_url).replace("http://10.0.0.88:8788", upstream_url)
        for doc in yaml.safe_load_all(text):
            if isinstance(doc, dict) and doc.get("kind") == "ToolManifest":
                doc["metadata"].pop("namespace", None)
                out.append(doc)
    extra = yaml.safe_load((ROOT / "tests/rollback/extra.yaml").read_text()
                           .replace("http://127.0.0.1:8788", upstream_url).replace("http://10.0.0.88:8788", upstream_url))
    for spec in extra:
        out.append({"apiVersion": "unwind.dev/v1alpha1", "kind": "ToolManifest",
                    "metadata": {"name": spec["tool"].replace("_", "-")}, "spec": spec})
    for doc in out:  # short timeouts: a test waits for the slowest step
        spec = doc["spec"]
        for part in (spec, spec.get("compensation") or {}):
            if "timeout_ms" in part:
                part["timeout_ms"] = "5s"
        if "upstream" in spec:
            spec["upstream"]["timeout_ms"] = "5s"
    return out


def effect(upstream: Upstream, tool: str, args: dict[str, Any], key: str | None = None) -> Any:
    """Make the effect the call would have made, at the upstream; its answer."""
    headers = {"Idempotency-Key": key} if key else {}
    return upstream.request("POST", ROUTES[tool], args, headers)


def make_entry(m: ToolManifest, checksum: str, id_: str, seq: int, args: dict[str, Any], result: Any, *,
               state: str = "succeeded", key: str | None = None, staged: bool = False,
               at: datetime | None = None) -> Entry:
    """An entry as the gateway writes it after the call (``at``: when it was made)."""
    when = stamp(at or datetime.now(UTC) - timedelta(minutes=5) + timedelta(milliseconds=seq))
    draft = None
    if staged:
        assert m.draft is not None
        draft = Staged(draft_tool=m.draft.tool, promote=m.draft.promote, discard=m.draft.discard,
                       handle={"repo": args["repo"], "release_id": result["id"]})
    return Entry(id=id_, seq=seq, tool=m.tool, checksum=checksum, effect=str(m.effect), key=key,
                 scope="global" if key else None, actor="system:serviceaccount:shop:agent",
                 state=state,
                 handle=build_handle(m, args, result if result is not None else {}, staged=staged),
                 staged=draft, times=Times(requested=when, started=when, finished=when))


def create_ledger(api: client.ApiClient, namespace: str, name: str, entries: list[Entry]) -> dict[str, Any]:
    custom: Any = client.CustomObjectsApi(api)
    obj = custom.create_namespaced_custom_object("unwind.dev", "v1alpha1", namespace, "effectledgers", {
        "apiVersion": "unwind.dev/v1alpha1", "kind": "EffectLedger", "metadata": {"name": name},
        "spec": {"run": name}})
    raw = [e.to_json() for e in entries]
    obj["status"] = {"entries": raw, "entryCount": len(raw), "lastState": raw[-1]["state"] if raw else None}
    return dict(custom.replace_namespaced_custom_object_status("unwind.dev", "v1alpha1", namespace,
                                                                "effectledgers", name, obj))


def job_kubelet(api: client.ApiClient, namespace: str, workers: int = 4) -> Node:
    """The kubelet stand-in running every Pending undo-Job pod of ``namespace`` as a local
    ``unwind undo-step`` process (at most ``workers`` at once), until stopped."""
    return Node(api, namespace=namespace, select=undo_job_pod, workers=workers,
                extra_env={"PYTHONPATH": str(ROOT / "operator")})
