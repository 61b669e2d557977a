"""What one call costs the API server in cluster mode: requests, bytes sent and time, one call
at a time, for a tool without an idempotency key and for one with a key (its Lease).

    python -m benchmarks.cluster_requests [--calls 100]

Starts a local control plane (benchmarks.gateway_cluster; it takes /tmp/unwind-cluster.lock
only if you run it under ``flock``), then drives the whole enforcement path in this process
with the EffectLedger store and a Lease per key, against an aiohttp upstream on loopback.
Each request to the API server is counted and timed at the client, so the figures say how
many round trips a call makes and what each costs on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import gateway_cluster
from benchmarks.gateway import MANIFEST, _env, _free_port

TOOLS = """- tool: rt.echo
  description: No idempotency key.
  effect: idempotent
  permission: bench:write
  upstream: {{ url: "http://127.0.0.1:{port}/echo", method: POST }}
- tool: rt.pay
  description: Keyed by the order; the key rides in the Idempotency-Key header.
  effect: idempotent
  permission: bench:write
  idempotency: {{ key: "o-{{{{args.order}}}}", scope: global, carrier: {{ header: Idempotency-Key }} }}
  upstream: {{ url: "http://127.0.0.1:{port}/echo", method: POST }}
"""
WARMUP = 20


async def measure(gw: gateway_cluster.ClusterGateway, calls: int) -> None:
    from aiohttp import web

    from unwind.gateway.catalogue import LocalCatalogue
    from unwind.gateway.enforce import CallRequest, Gateway, Settings
    from unwind.gateway.kube import InClusterConfig, KubeClient
    from unwind.ledger.clusterstore import ClusterStore, LeaseLocks
    from unwind.ledger.ulid import new_ulid
    from unwind.upstream.client import Upstream
    from unwind.upstream.secrets import LocalSecrets

    async def echo(request: web.Request) -> web.Response:
        return web.json_response({"echo": await request.json()})
    app = web.Application()
    app.add_routes([web.post("/echo", echo)])
    runner = web.AppRunner(app)
    await runner.setup()
    port = _free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    manifest = Path(tempfile.mkdtemp(prefix="unwind-bench-")) / "tools.yaml"
    manifest.write_text(TOOLS.format(port=port))

    kube = KubeClient(InClusterConfig.from_env(gw.variables))
    inner = kube.request
    timing: dict[str, list[float]] = {}

    async def request(method: str, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        started = time.perf_counter()
        try:
            return await inner(method, path, body, **kw)
        finally:
            timing.setdefault(method, []).append((time.perf_counter() - started) * 1000)
    kube.request = request  # type: ignore[method-assign]
    gateway = Gateway(LocalCatalogue([manifest]), ClusterStore(kube, gateway_cluster.NAMESPACE),
                      LeaseLocks(kube, gateway_cluster.NAMESPACE), Upstream(), LocalSecrets(),
                      Settings(scopes=frozenset({"bench:write"}), actor="bench"))
    try:
        for tool, run in (("rt.echo", "rt-keyless"), ("rt.pay", "rt-keyed")):
            samples: list[float] = []
            requests = sent = 0
            timing.clear()
            for n in range(calls + WARMUP):
                args = {"order": f"{run}-{n}"} if tool == "rt.pay" else {"text": "hello", "n": n}
                count, before = sum(len(v) for v in timing.values()), kube.bytes_sent
                t0 = time.perf_counter()
                result = await gateway.call(CallRequest(tool, args, run, new_ulid()))
                if result.status != 200:
                    raise SystemExit(f"{tool}: {result.status} {result.body}")
                if n >= WARMUP:
                    samples.append((time.perf_counter() - t0) * 1000)
                    requests += sum(len(v) for v in timing.values()) - count
                    sent += kube.bytes_sent - before
            print(f"{tool} ({'keyed' if tool == 'rt.pay' else 'no key'}), one call at a time: "
                  f"p50 {statistics.median(samples):.1f} ms, {requests / calls:.2f} API requests "
                  f"per call, {sent / calls / 1024:.2f} KiB sent per call")
            print("  per request (median ms): " + ", ".join(
                f"{m} {statistics.median(v):.1f} (n={len(v)})" for m, v in sorted(timing.items())))
    finally:
        await gateway.upstream.aclose()
        await kube.aclose()
        await runner.cleanup()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100, help="calls measured per tool")
    args = parser.parse_args()
    why = gateway_cluster.available()
    if why is not None:
        raise SystemExit(why)
    with gateway_cluster.cluster_gateway(MANIFEST.format(port=9), _env(), _free_port()) as gw:
        asyncio.run(measure(gw, args.calls))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
