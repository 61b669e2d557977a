"""The gateway in cluster mode as a pod would run it, on the local control plane.

`unwind gateway --cluster` runs as a local process with the environment the injection sets
(UNWIND_NAMESPACE, UNWIND_OPERATOR_NAMESPACE, UNWIND_ACTOR, ...) and the in-cluster
configuration pointing at the local API server: KUBERNETES_SERVICE_HOST/PORT, the control
plane's CA, and the token of a ServiceAccount bound to the chart's ClusterRole
unwind-gateway (from the TokenRequest API, as `kubectl create token` asks for one). The example manifests are applied by the admin (a trusted
applier), so the operator publishes and signs them into the namespace's bundle.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import yaml
from cluster_helpers import ROOT, apply, enforced, tm, wait_for
from kubernetes import client

from gateway.conftest import SCOPES, GatewayProc, env, free_port
from gateway.conftest import wait_for as wait_for_url
from unwind.controlplane import ControlPlane
from unwind.controlplane.dev import OPERATOR_NAMESPACE
from unwind.controlplane.kubenode import EXAMPLES_UPSTREAM

GATEWAY_ROLE = "unwind-gateway"
AGENT = "agent"
EXTRA_TOOLS = {"test.charge", "test.needs_comment", "test.admin_read", "test.approve_or_deny",
               "test.approve_or_escalate"}


def example_manifests(upstream_url: str) -> list[dict[str, Any]]:
    """The examples of manifests/ and the gateway tests' extra tools, as ToolManifests of
    one namespace, pointed at the test upstream with short timeouts."""
    out: list[dict[str, Any]] = []
    for path in sorted((ROOT / "manifests").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "ToolManifest":
                out.append(tm(doc["metadata"]["name"], doc["spec"]))
    for spec in yaml.safe_load((ROOT / "tests" / "gateway" / "extra.yaml").read_text()):
        if spec["tool"] in EXTRA_TOOLS:
            out.append(tm(spec["tool"].replace("_", "-"), spec))
    text = json.dumps(out).replace("http://127.0.0.1:8788", upstream_url).replace(EXAMPLES_UPSTREAM, upstream_url)
    text = text.replace('"timeout_ms": "10s"', '"timeout_ms": "2s"').replace(
        '"timeout_ms": "30s"', '"timeout_ms": "2s"')
    return list(json.loads(text))


def service_account_token(api: client.ApiClient, namespace: str, name: str,
                          seconds: int = 3600) -> str:
    """A token for the ServiceAccount from the TokenRequest API (what `kubectl create token`
    asks for; token Secrets are no longer made since Kubernetes 1.24)."""
    answer = client.CoreV1Api(api).create_namespaced_service_account_token(
        name, namespace, {"spec": {"expirationSeconds": seconds}})
    return str(answer.status.token)


@contextmanager
def agent_namespace(api: client.ApiClient, cp: ControlPlane, prefix: str,
                    upstream_url: str) -> Iterator[tuple[str, str]]:
    """A namespace of its own with the examples published, deleted afterwards;
    (namespace, agent token)."""
    core = client.CoreV1Api(api)
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    try:
        yield name, prepare_namespace(api, cp.kubeconfig, name, upstream_url)
    finally:
        core.delete_namespace(name)


def prepare_namespace(api: client.ApiClient, kubeconfig: Path, namespace: str,
                      upstream_url: str) -> str:
    """The agent's ServiceAccount bound to unwind-gateway, the manifests applied and
    published; returns the agent's token."""
    core = client.CoreV1Api(api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": AGENT}})
    client.RbacAuthorizationV1Api(api).create_namespaced_role_binding(namespace, {
        "metadata": {"name": "agent-gateway"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": GATEWAY_ROLE},
        "subjects": [{"kind": "ServiceAccount", "name": AGENT, "namespace": namespace}]})
    manifests = example_manifests(upstream_url)
    apply(kubeconfig, namespace, *manifests)
    tools = {m["spec"]["tool"] for m in manifests}
    wait_for("the examples in the signed bundle",
             lambda: tools <= set(enforced(api, namespace)), timeout=90)
    return service_account_token(api, namespace, AGENT)


@dataclass
class ClusterGateway(GatewayProc):
    """A gateway process in cluster mode; its ledger is read from the API server."""

    api: client.ApiClient | None = None
    namespace: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    def pages(self, run: str) -> list[dict[str, Any]]:
        objs = client.CustomObjectsApi(self.api)
        out: list[dict[str, Any]] = []
        name: str | None = run
        while name:
            try:
                page = objs.get_namespaced_custom_object("unwind.dev", "v1alpha1", self.namespace,
                                                         "effectledgers", name)
            except client.ApiException as exc:
                if exc.status == 404:
                    break
                raise
            out.append(page)
            name = (page.get("status") or {}).get("next")
        return out

    def entries(self, run: str = "run-1") -> list[dict[str, Any]]:
        return [e for p in self.pages(run) for e in (p.get("status") or {}).get("entries", [])]

    def readyz(self) -> httpx2.Response:
        return httpx2.get(f"{self.url}/readyz", timeout=10)

    def metric(self, name: str, **labels: str) -> float:
        """The value of one sample on /metrics (0 when absent)."""
        text = httpx2.get(f"{self.url}/metrics", timeout=10).text
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in text.splitlines():
            if line.startswith("#"):
                continue
            key, _, value = line.rpartition(" ")
            if key == (f"{name}{{{want}}}" if want else name):
                return float(value)
        return 0.0


def start_cluster_gateway(cp: ControlPlane, api: client.ApiClient, namespace: str, token: str,
                          work: Path, *extra: str, server: str | None = None,
                          scopes: str = SCOPES) -> ClusterGateway:
    token_file = work / f"token-{time.monotonic_ns()}"
    token_file.write_text(token)
    host, _, port = (server or cp.server).removeprefix("https://").rpartition(":")
    variables = {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port,
                 "UNWIND_TOKEN_FILE": str(token_file), "UNWIND_CA_FILE": str(cp.ca_file),
                 "UNWIND_NAMESPACE": namespace, "UNWIND_OPERATOR_NAMESPACE": OPERATOR_NAMESPACE,
                 "UNWIND_ACTOR": f"system:serviceaccount:{namespace}:{AGENT}",
                 "UNWIND_SCOPES": scopes}
    listen = free_port()
    log = work / f"gateway-{listen}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "unwind.cli.main", "gateway", "--cluster",
             "--listen", f"127.0.0.1:{listen}", "--bundle-poll-seconds", "0.3", *extra],
            cwd=ROOT, env={**env(), **variables}, stdout=out, stderr=subprocess.STDOUT)
    gw = ClusterGateway(f"http://127.0.0.1:{listen}", proc, Path("/nonexistent"), log, api,
                        namespace, variables)
    wait_for_url(f"{gw.url}/healthz", proc, log)
    wait_for(f"gateway {gw.url} ready", lambda: gw.readyz().status_code == 200, timeout=30)
    return gw


class TcpProxy:
    """A TCP proxy on loopback in a thread: ``cut()`` closes it and every connection through
    it, as an API server that went away looks to a client."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.server: asyncio.AbstractServer | None = None
        self.writers: set[asyncio.StreamWriter] = set()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    async def _start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self.writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                dst.close()
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    @property
    def address(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def cut(self) -> None:
        async def close() -> None:
            assert self.server is not None
            self.server.close()
            for w in list(self.writers):
                w.close()
        asyncio.run_coroutine_threadsafe(close(), self.loop).result(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # nothing listens any more
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) != 0:
                    return
            time.sleep(0.05)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

