"""Benchmark: calls through an MCP upstream with the session pool against a new session per
call (what the gateway did before), in one run.

    python -m benchmarks.gateway_mcp [--calls 200] [--concurrency 1]

It starts a small MCP server (the SDK's MCPServer, one ``echo`` tool) over streamable HTTP
twice, stateless and with sessions (``Mcp-Session-Id``), and calls it through the gateway's
own client path (``prepare`` then ``Upstream.send``): pooled and not, in the protocol the
SDK negotiates (``auto``: 2026-07-28 here) and with the ``initialize`` handshake forced
(``legacy``: the session-based protocol most deployed servers speak). Last, the same tool
from a stdio server the gateway started (one process, shared). It prints calls per second
and p50/p95 per row.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SERVER = '''
import sys
from mcp.server.mcpserver import MCPServer
server = MCPServer("bench")

@server.tool()
def echo(text: str) -> dict:
    return {"echo": text}

if len(sys.argv) > 1:
    import uvicorn
    app = server.streamable_http_app(stateless_http=sys.argv[2] == "stateless", json_response=True)
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
else:
    server.run()
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(script: Path, port: int, kind: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, str(script), str(port), kind],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the {kind} MCP server did not start")


async def _row(label: str, upstream_mcp: dict[str, Any], calls: int, concurrency: int,
               pooled: bool, mode: str, commands: bool = False) -> tuple[str, float, float, float]:
    from unwind.manifest.model import ToolManifest
    from unwind.upstream.client import Upstream, prepare
    from unwind.upstream.mcp_client import McpClients
    from unwind.upstream.secrets import LocalSecrets

    m = ToolManifest.model_validate({
        "tool": "bench.echo", "effect": "idempotent", "permission": "bench:write",
        "upstream": {"mcp": {**upstream_mcp, "tool": "echo"}, "timeout_ms": "30s"}})
    upstream = Upstream(mcp=McpClients(commands=commands, pooled=pooled, mode=mode))
    latencies: list[float] = []
    try:
        warm = await upstream.send(prepare(m, {"text": "warm"}, LocalSecrets(None), {}))
        if warm.kind != "ok":
            raise RuntimeError(f"{label}: {warm.kind} {warm.text}")
        queue = list(range(calls))

        async def worker() -> None:
            while queue:
                queue.pop()
                started = time.perf_counter()
                answer = await upstream.send(prepare(m, {"text": "hello"}, LocalSecrets(None), {}))
                latencies.append(time.perf_counter() - started)
                if answer.kind != "ok":
                    raise RuntimeError(f"{label}: {answer.kind} {answer.text}")
        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    finally:
        await upstream.aclose()
    latencies.sort()
    p95 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.95))]
    return label, calls / elapsed, statistics.median(latencies) * 1000, p95 * 1000


async def _run(calls: int, concurrency: int) -> list[tuple[str, float, float, float]]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "bench_mcp_server.py"
        script.write_text(SERVER)
        procs = {kind: (_free_port(), None) for kind in ("stateless", "stateful")}
        started = {kind: _start(script, port, kind) for kind, (port, _) in procs.items()}
        try:
            for kind, (port, _) in procs.items():
                url = {"url": f"http://127.0.0.1:{port}/mcp"}
                for mode in ("auto", "legacy"):
                    era = "2026-07-28" if mode == "auto" else "initialize handshake"
                    for pooled in (True, False):
                        how = "pooled" if pooled else "new session per call"
                        rows.append(await _row(f"HTTP {kind} server, {era}, {how}", url,
                                               calls, concurrency, pooled, mode))
            command = {"command": [sys.executable, str(script)]}
            rows.append(await _row("stdio server started by the gateway (one process)",
                                   command, calls, concurrency, True, "auto", commands=True))
        finally:
            for proc in started.values():
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=1)
    args = parser.parse_args(argv)
    rows = asyncio.run(_run(args.calls, args.concurrency))
    print(f"{args.calls} calls, {args.concurrency} at a time, {os.cpu_count()} CPUs")
    print(f"| {'upstream':<66} | calls/s | p50 ms | p95 ms |")
    print(f"|{'-' * 68}|--------:|-------:|-------:|")
    for label, rate, p50, p95 in rows:
        print(f"| {label:<66} | {rate:7.0f} | {p50:6.1f} | {p95:6.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
