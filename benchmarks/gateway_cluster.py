"""The benchmark's cluster row: the gateway in cluster mode on a local control plane of its own.

No operator runs: the bundle is built and signed here with a throwaway key (the format
the operator writes, ``unwind.bundle.build_bundle``), and its public key is put in the
trust ConfigMap, so the gateway verifies exactly what it would in a pod. The gateway
authenticates with the control plane's admin token (RBAC does not change what is measured).

Imported only when the row runs: the control plane's code stays out of the gateway.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

NAMESPACE = "bench"
OPERATOR_NAMESPACE = "unwind-system"


@dataclass
class ClusterGateway:
    port: int
    proc: subprocess.Popen[bytes]
    variables: dict[str, str]  # the in-cluster environment the gateway runs with

    def metric(self, name: str) -> float:
        """A metric's value summed over its labels, from the gateway's /metrics."""
        import httpx2

        text = httpx2.get(f"http://127.0.0.1:{self.port}/metrics", timeout=10).text
        pattern = re.compile(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", re.M)
        return sum(float(m.group(2)) for m in pattern.finditer(text))


def _signed_bundle(manifest_yaml: str) -> tuple[dict[str, dict[str, str]], str]:
    """(the bundle ConfigMaps' data, the trust PEM) for the manifests in the YAML."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from unwind.bundle import BundleEntry, build_bundle
    from unwind.manifest.canonical import canonical_json, checksum_bytes
    from unwind.manifest.validate import validate_manifest
    from unwind.registry.signing import sign

    key = Ed25519PrivateKey.generate()
    entries = []
    for spec in yaml.safe_load(manifest_yaml):
        model, issues = validate_manifest(spec)
        assert model is not None and not issues, issues
        blob = canonical_json(model.canonical_dict())
        entries.append(BundleEntry(model.tool, 1, checksum_bytes(blob), blob, model.tool.replace("_", "-")))
    data = build_bundle(NAMESPACE, entries, generation=int(time.time() * 1000),
                        high_water={e.tool: 1 for e in entries}, signer=lambda m: sign(key, m))
    pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                        serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    return data, pem


def _configmap(name: str, namespace: str, data: dict[str, str]) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace},
            "data": data}


@contextlib.contextmanager
def cluster_gateway(manifest_yaml: str, env: dict[str, str], free_port: int, *,
                    page_kib: int = 16) -> Iterator[ClusterGateway]:
    """A control plane with the bundle published, and `unwind gateway --cluster` on it."""
    from unwind.controlplane import ControlPlane
    from unwind.controlplane.dev import install_crds, kubectl

    with tempfile.TemporaryDirectory(prefix="unwind-bench-cp-") as tmp, \
            ControlPlane(Path(tmp) / "cp", die_with_parent=True) as cp:
        install_crds(cp.kubeconfig)
        data, pem = _signed_bundle(manifest_yaml)
        objects: list[dict[str, object]] = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
            for ns in (NAMESPACE, OPERATOR_NAMESPACE)]
        objects += [_configmap(name, NAMESPACE, cm) for name, cm in data.items()]
        objects.append(_configmap("unwind-trust", OPERATOR_NAMESPACE, {"bench.pem": pem}))
        kubectl(cp.kubeconfig, "apply", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                           "items": objects}))
        token = Path(tmp) / "token"
        token.write_text(cp.admin_token)
        host, _, port = cp.server.removeprefix("https://").rpartition(":")
        variables = {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port,
                     "UNWIND_TOKEN_FILE": str(token), "UNWIND_CA_FILE": str(cp.ca_file),
                     "UNWIND_NAMESPACE": NAMESPACE, "UNWIND_OPERATOR_NAMESPACE": OPERATOR_NAMESPACE,
                     "UNWIND_ACTOR": "bench"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "unwind.cli.main", "gateway", "--cluster", "--listen",
             f"127.0.0.1:{free_port}", "--scopes", "bench:write", "--log-level", "warning",
             "--ledger-page-kib", str(page_kib), "--max-entries-per-run", "0"],
            env={**env, **variables}, stderr=subprocess.DEVNULL)
        try:
            _wait_ready(free_port, proc)
            yield ClusterGateway(free_port, proc, variables)
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def _wait_ready(port: int, proc: subprocess.Popen[bytes], seconds: float = 60) -> None:
    import httpx2

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the cluster gateway exited with {proc.returncode}")
        with contextlib.suppress(httpx2.HTTPError):
            if httpx2.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise SystemExit(f"the cluster gateway was not ready after {seconds}s")


def available() -> str | None:
    """Why the row cannot run here, or None."""
    from unwind.controlplane.build import cached_binaries

    if cached_binaries() is None:
        return ("no control-plane binaries in the cache (~/.cache/unwind): build them with "
                "scripts/install.sh, or run any cluster test once")
    if not any(os.access(Path(d) / "kubectl", os.X_OK) for d in os.environ.get("PATH", "").split(os.pathsep)):
        return "kubectl is not installed"
    return None


def in_process_ms(gw: ClusterGateway, manifest: Path, calls: int = 200) -> float:
    """Median ms per call, one at a time in this process, of the whole enforcement path with
    the EffectLedger store (no HTTP server in front, no concurrent load)."""
    import asyncio
    import statistics

    from unwind.gateway.catalogue import LocalCatalogue
    from unwind.gateway.enforce import CallRequest, Gateway, Settings
    from unwind.gateway.kube import InClusterConfig, KubeClient
    from unwind.ledger.clusterstore import ClusterStore, LeaseLocks
    from unwind.ledger.ulid import new_ulid
    from unwind.upstream.client import Upstream
    from unwind.upstream.secrets import LocalSecrets

    async def measure() -> float:
        kube = KubeClient(InClusterConfig.from_env(gw.variables))
        store = ClusterStore(kube, NAMESPACE)
        gateway = Gateway(LocalCatalogue([manifest]), store, LeaseLocks(kube, NAMESPACE), Upstream(),
                          LocalSecrets(), Settings(scopes=frozenset({"bench:write"}), actor="bench"))
        samples = []
        for n in range(calls + 20):
            t0 = time.perf_counter()
            await gateway.call(CallRequest("bench.echo", {"text": "hello", "n": 1}, "bench-one",
                                           new_ulid()))
            if n >= 20:
                samples.append((time.perf_counter() - t0) * 1000)
        await gateway.upstream.aclose()
        await kube.aclose()
        return statistics.median(samples)

    return asyncio.run(measure())
