"""Benchmark: the admission webhook under 100 concurrent AdmissionReviews.

    python -m unwind.operator.bench_admission -c 100 -n 3000

Starts a control plane with Unwind installed (chart, webhooks on loopback, the operator
under the chart's ServiceAccount), then sends AdmissionReviews straight to the operator's
webhook server over HTTPS, ``-c`` at a time on kept-alive connections (as the API server
sends them), and reports latency percentiles side by side with a baseline: the same
requests to the same server's no-op endpoint (TLS, HTTP and JSON, no admission work).
Target (DESIGN.md §10): p99 <= 25 ms at 100 concurrent reviews.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import ssl
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes import client, config

from ..controlplane import ControlPlane
from ..controlplane.cluster import free_ports
from ..controlplane.dev import (
    OPERATOR_NAMESPACE,
    OperatorProcess,
    install_chart,
    install_crds,
    local_values,
    service_account_kubeconfig,
)
from .webhook import NOOP_PATH, TLS_SECRET

SPEC = {"tool": "stripe.create_charge", "effect": "compensable", "permission": "payments:write",
        "description": "Charge a card.", "owner": ["payments"], "idempotency": {"key": "c-{{args.order_id}}"},
        "compensation": {"tool": "stripe.refund", "argument_map": {"charge_id": "$result.id"},
                         "residue": ["the charge stays on the statement"],
                         "verification": {"tool": "stripe.get_charge", "arguments": {"charge_id": "$result.id"},
                                          "expect": {"refunded": True}}}}


def review(operation: str = "CREATE") -> dict[str, Any]:
    obj = {"apiVersion": "unwind.dev/v1alpha1", "kind": "ToolManifest",
           "metadata": {"name": "stripe.create-charge", "namespace": "bench"}, "spec": SPEC}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()), "kind": {"group": "unwind.dev", "version": "v1alpha1", "kind": "ToolManifest"},
        "resource": {"group": "unwind.dev", "version": "v1alpha1", "resource": "toolmanifests"},
        "requestKind": {"group": "unwind.dev", "version": "v1alpha1", "kind": "ToolManifest"},
        "requestResource": {"group": "unwind.dev", "version": "v1alpha1", "resource": "toolmanifests"},
        "name": "stripe.create-charge", "namespace": "bench", "operation": operation,
        "userInfo": {"username": "alice", "groups": ["dev", "system:authenticated"]},
        "object": obj, "oldObject": None, "dryRun": False,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}}}


async def drive(url: str, ca: bytes, path: str, n: int, concurrency: int) -> list[float]:
    ctx = ssl.create_default_context(cadata=ca.decode())
    ctx.check_hostname = False  # the certificate is for 127.0.0.1 as an IP SAN; aiohttp checks it
    latencies: list[float] = []
    queue = list(range(n))
    connector = aiohttp.TCPConnector(limit=concurrency, ssl=ctx)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def worker() -> None:
            while queue:
                queue.pop()
                body = json.dumps(review()).encode()
                t0 = time.perf_counter()
                async with session.post(url + path, data=body,
                                        headers={"Content-Type": "application/json"}) as resp:
                    answer = await resp.json()
                latencies.append(time.perf_counter() - t0)
                if resp.status != 200 or not answer["response"]["allowed"]:
                    raise RuntimeError(f"{path}: {resp.status} {answer}")
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-n", type=int, default=3000, help="reviews per endpoint")
    parser.add_argument("-c", type=int, default=100, help="concurrent reviews")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp, ControlPlane(Path(tmp) / "cp", die_with_parent=True) as cp:
        install_crds(cp.kubeconfig)
        port = free_ports(1)[0]
        install_chart(cp.kubeconfig, local_values(port))
        sa = service_account_kubeconfig(cp, Path(tmp) / "sa.kubeconfig")
        op = OperatorProcess(sa, Path(tmp) / "operator.log", webhook_port=port).start()
        api = config.new_client_from_config(config_file=str(cp.kubeconfig))  # type: ignore[no-untyped-call]
        try:
            core: Any = client.CoreV1Api(api)
            ca = base64.b64decode(core.read_namespaced_secret(TLS_SECRET, OPERATOR_NAMESPACE).data["ca.crt"])
            url = f"https://127.0.0.1:{port}"
            results = {}
            for name, path in (("warm-up", NOOP_PATH), ("baseline: no-op endpoint", NOOP_PATH),
                               ("validate-toolmanifest", "/validate-toolmanifest"),
                               ("stamp-toolmanifest (signs the identity)", "/stamp-toolmanifest")):
                results[name] = asyncio.run(drive(url, ca, path, args.n, args.c))
        finally:
            op.stop()
            api.close()
    print(f"{args.n} reviews per endpoint, {args.c} concurrent, kept-alive HTTPS connections")
    print(f"{'endpoint':<44}{'p50 ms':>9}{'p99 ms':>9}{'reviews/s':>11}")
    for name, values in results.items():
        if name == "warm-up":
            continue
        rate = len(values) / (sum(values) / args.c)
        print(f"{name:<44}{pct(values, 50):>9.1f}{pct(values, 99):>9.1f}{rate:>11.0f}")
    print("target: p99 <= 25 ms at 100 concurrent reviews")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
