"""The MCP rows of ``benchmarks.gateway``: ``tools/call`` through the gateway's ``/mcp`` beside a
plain forwarding Python MCP proxy, in front of one MCP upstream, in one run.

    .venv/bin/python -m benchmarks.gateway_mcp_calls [--calls 300]   # these rows alone

Each server is a process of its own: the upstream (the SDK's MCPServer, one ``echo`` tool,
streamable HTTP with sessions, JSON answers) counts the HTTP requests it is sent; the
baseline is an MCPServer whose one tool forwards each call to the upstream through one
shared SDK client (the least a Python MCP proxy does); the gateway runs in local mode with
the ledger in memory and with the file ledger. The SDK's client drives each from this
process, one call at a time and ``--concurrency`` in flight (one client session per
worker). Per row: the serving process's CPU per call (its threads' schedstat), p50/p99,
and the upstream's HTTP requests per call (the target is exactly 1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from .gateway import _cpu, _cpu_delta, _env, _free_port, _rss_kb, _stop, _wait

UPSTREAM = '''
import sys, json
import uvicorn
from mcp.server.mcpserver import MCPServer
server = MCPServer("bench-upstream")

@server.tool()
def echo(text: str) -> dict:
    return {"echo": text}

inner = server.streamable_http_app(json_response=True)
count = 0

async def app(scope, receive, send):
    global count
    if scope["type"] == "http" and scope["path"] == "/count":
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": json.dumps(count).encode()})
        return
    if scope["type"] == "http":
        count += 1
    await inner(scope, receive, send)

uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
'''

PROXY = '''
import sys, contextlib
import uvicorn
from mcp import Client
from mcp.server.mcpserver import MCPServer

shared = {}

@contextlib.asynccontextmanager
async def lifespan(server):
    async with Client(sys.argv[2]) as client:  # one client for every call
        shared["client"] = client
        yield {}

server = MCPServer("bench-proxy", lifespan=lifespan)

@server.tool(name="bench__echo")
async def echo(text: str) -> dict:
    result = await shared["client"].call_tool("echo", {"text": text})
    return result.structured_content or {}

uvicorn.run(server.streamable_http_app(json_response=True, stateless_http=True),
            host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
'''

MANIFEST = """- tool: bench.echo
  description: Echo the text back.
  effect: idempotent
  permission: bench:write
  upstream: {{ mcp: {{ url: "http://127.0.0.1:{port}/mcp", tool: echo }} }}
"""


@dataclass
class Row:
    label: str
    shape: str
    calls: int
    cpu_ms: float
    p50: float
    p99: float
    upstream_requests: float
    rss_mb: float


def _count(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/count", timeout=10) as answer:
        return int(json.loads(answer.read()))


async def _drive(url: str, calls: int, workers: int) -> list[float]:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    latencies: list[float] = []
    queue = list(range(calls))

    async def worker() -> None:
        async with httpx2.AsyncClient(timeout=30, headers={"X-Unwind-Run": "bench-mcp"}) as http, \
                Client(streamable_http_client(url, http_client=http)) as c:
            while queue:
                queue.pop()
                t0 = time.perf_counter()
                result = await c.call_tool("bench__echo", {"text": "hello"})
                latencies.append((time.perf_counter() - t0) * 1000)
                if result.is_error:
                    raise RuntimeError(f"{url}: {result.content}")
    await asyncio.gather(*(worker() for _ in range(workers)))
    return latencies


def _measure(label: str, port: int, pid: int, up_port: int, calls: int,
             concurrency: int) -> list[Row]:
    url = f"http://127.0.0.1:{port}/mcp"
    rows = []
    for workers in (1, concurrency):
        asyncio.run(_drive(url, 30, workers))  # sessions, caches, the SDK loaded
        sent0, cpu0 = _count(up_port), _cpu(pid)
        latencies = sorted(asyncio.run(_drive(url, calls, workers)))
        cpu1, sent1 = _cpu(pid), _count(up_port)
        shape = "1 in flight" if workers == 1 else f"{workers} in flight"
        rows.append(Row(label, shape, len(latencies), _cpu_delta(cpu0, cpu1) * 1000 / calls,
                        statistics.median(latencies),
                        latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
                        (sent1 - sent0) / calls, _rss_kb(pid)[1] / 1024))
    return rows


def rows(calls: int = 300, concurrency: int = 10) -> list[Row]:
    procs: list[subprocess.Popen[bytes]] = []
    out: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="unwind-bench-mcp-") as tmp:
        try:
            def start(*argv: str) -> tuple[int, subprocess.Popen[bytes]]:
                port = _free_port()
                proc = subprocess.Popen([sys.executable, *(a.replace("{port}", str(port))
                                                           for a in argv)],
                                        env=_env(), stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
                procs.append(proc)
                _wait(port, proc, 60)
                return port, proc

            (Path(tmp) / "upstream.py").write_text(UPSTREAM)
            (Path(tmp) / "proxy.py").write_text(PROXY)
            up_port, _ = start(str(Path(tmp) / "upstream.py"), "{port}")
            manifest = Path(tmp) / "bench.yaml"
            manifest.write_text(MANIFEST.format(port=up_port))
            gateway = ("-m", "unwind.cli.main", "gateway", "--manifests", str(manifest),
                       "--listen", "127.0.0.1:{port}", "--scopes", "bench:write", "--run",
                       "bench-mcp", "--log-level", "warning", "--max-entries-per-run", "0")
            servers = [
                ("plain MCP proxy", ("{tmp}/proxy.py", "{port}", f"http://127.0.0.1:{up_port}/mcp")),
                ("/mcp, memory ledger", (*gateway, "--benchmark-memory-store")),
                ("/mcp, file ledger", (*gateway, "--ledger-dir", f"{tmp}/ledger")),
            ]
            for label, argv in servers:
                port, proc = start(*(a.replace("{tmp}", tmp) for a in argv))
                out += _measure(label, port, proc.pid, up_port, calls, concurrency)
                _stop(procs[1:])
                del procs[1:]
        finally:
            _stop(procs)
    return out


def print_rows(found: list[Row]) -> None:
    print("MCP tools/call through /mcp, beside a plain forwarding MCP proxy (one shared client), "
          "one MCP upstream; x = CPU ratio to the proxy in the same shape")
    print(f"{'':26} {'shape':>13} {'calls':>6} {'CPU ms':>7} {'x':>5} {'p50 ms':>7} "
          f"{'p99 ms':>7} {'upstream req/call':>17} {'RSS MB':>7}")
    base = {r.shape: r for r in found if r.label == "plain MCP proxy"}
    for r in sorted(found, key=lambda r: (r.shape != "1 in flight", r.shape)):
        ratio = "" if r.label == "plain MCP proxy" else f"{r.cpu_ms / base[r.shape].cpu_ms:5.2f}"
        print(f"  {r.label:24} {r.shape:>13} {r.calls:6d} {r.cpu_ms:7.3f} {ratio:>5} "
              f"{r.p50:7.2f} {r.p99:7.2f} {r.upstream_requests:17.2f} {r.rss_mb:7.1f}")
    gateways = [r for r in found if r.label != "plain MCP proxy"]
    print("  targets (issue 31): gateway CPU per tools/call <= the plain proxy's: " + "; ".join(
        f"{r.label.split(', ')[1]} {r.shape} {'met' if r.cpu_ms <= base[r.shape].cpu_ms else 'NOT MET'}"
        for r in gateways))
    print("  exactly one upstream request per call: " + "; ".join(
        f"{r.label.split(', ')[1]} {r.shape} {r.upstream_requests:.2f} "
        f"{'met' if abs(r.upstream_requests - 1) < 0.005 else 'NOT MET'}" for r in gateways))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=10)
    args = parser.parse_args(argv)
    print_rows(rows(args.calls, args.concurrency))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
