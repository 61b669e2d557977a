"""Benchmark: what the streaming /mcp door (gateway/mcp_stream.py) costs a call that asks
for no progress, beside the JSON-only door it replaced, in one run.

    python -m benchmarks.mcp_door [--calls 300]

One process: a small aiohttp upstream answering JSON, and the gateway's app (memory ledger)
served by uvicorn twice on loopback: as it is, and with the door reduced to the SDK's
JSON-only app (every request straight to the JSON manager: what /mcp was before). The
official ``mcp`` client calls one REST tool through each, one call at a time, in both
protocol eras (2026-07-28, which the client picks by default and the door sends to the
streaming manager; the handshake era, whose bodies the door reads before routing). Prints
calls per second and p50/p95 per row, and the streaming door's p50 beside the baseline's.
The client runs in the same process (both rows pay for it alike).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

MANIFEST = """- tool: bench.read
  description: Read a thing.
  effect: read_only
  permission: bench:read
  upstream: {{ url: "http://127.0.0.1:{port}/thing", method: POST }}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def upstream() -> AsyncIterator[int]:
    from aiohttp import web

    async def thing(request: web.Request) -> web.Response:
        return web.json_response({"id": 1, **(await request.json())})
    app = web.Application()
    app.add_routes([web.post("/thing", thing)])
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield port
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def gateway(manifests: Path, json_only: bool) -> AsyncIterator[str]:
    import uvicorn

    from unwind.gateway import mcp_stream
    from unwind.gateway.app import build_app
    from unwind.gateway.catalogue import LocalCatalogue
    from unwind.gateway.enforce import Gateway, Settings
    from unwind.ledger.memory import MemoryLocks, MemoryStore
    from unwind.upstream.client import Upstream
    from unwind.upstream.secrets import LocalSecrets

    gw = Gateway(LocalCatalogue([str(manifests)]), MemoryStore(), MemoryLocks(), Upstream(),
                 LocalSecrets(), Settings(scopes=frozenset({"bench:read"}), actor="bench"))
    app = build_app(gw, default_run="bench")
    if json_only:  # the door as it was: the JSON manager answers every request
        async def plain(self: Any, scope: Any, receive: Any, send: Any) -> None:
            await self.json_app(scope, receive, send)
        mcp_stream.StreamingDoor.__call__ = plain  # type: ignore[method-assign]
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error",
                                           lifespan="on"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.should_exit = True
        await task


async def drive(url: str, mode: str, calls: int) -> list[float]:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    times: list[float] = []
    async with httpx2.AsyncClient(timeout=30) as http, \
            Client(streamable_http_client(url, http_client=http), mode=mode) as c:
        for i in range(calls + 10):
            started = time.perf_counter()
            result = await c.call_tool("bench__read", {"n": i})
            if i >= 10:  # the first calls warm up
                times.append(time.perf_counter() - started)
            assert not result.is_error, result
    return times


async def run(calls: int) -> None:
    from unwind.gateway.mcp_stream import StreamingDoor

    streaming = StreamingDoor.__call__
    rows: dict[tuple[str, str], list[float]] = {}
    async with upstream() as port:
        with tempfile.TemporaryDirectory() as folder:
            manifests = Path(folder) / "m.yaml"
            manifests.write_text(MANIFEST.format(port=port))
            for json_only in (True, False):
                StreamingDoor.__call__ = streaming  # type: ignore[method-assign]
                async with gateway(manifests, json_only) as url:
                    for mode in ("auto", "legacy"):
                        rows[("JSON-only door (before)" if json_only else "streaming door",
                              mode)] = await drive(url, mode, calls)
    print(f"{calls} calls, 1 at a time, client in the same process")
    print("| door | protocol | calls/s | p50 ms | p95 ms |")
    print("|---|---|--:|--:|--:|")
    for (door, mode), t in rows.items():
        era = "2026-07-28" if mode == "auto" else "handshake era"
        q = statistics.quantiles(t, n=20)
        print(f"| {door} | {era} | {len(t) / sum(t):.0f} | {statistics.median(t) * 1000:.2f} | "
              f"{q[18] * 1000:.2f} |")
    for mode in ("auto", "legacy"):
        before = statistics.median(rows[("JSON-only door (before)", mode)])
        after = statistics.median(rows[("streaming door", mode)])
        print(f"{'2026-07-28' if mode == 'auto' else 'handshake era'}: p50 {after * 1000:.2f} ms "
              f"beside {before * 1000:.2f} ms ({(after - before) * 1000:+.2f} ms)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args(argv)
    asyncio.run(run(args.calls))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
