"""Benchmark: the latency the gateway adds, its peak throughput, and its memory.

    python -m benchmarks.gateway [--rate 500] [--seconds 10]

One run starts a small upstream (aiohttp, answering JSON) and the gateway in local mode as
processes, then drives, at a paced rate, first the upstream directly and then the same
call through the gateway: with the ledger in memory (ledger writes excluded) and with the
file store (every call written ahead and finished, fsync'ed). The added latency is the
gateway's p50/p99 minus the direct ones. Peak throughput is an unpaced run through the
gateway. The gateway's RSS is read from /proc after the load (peak and current), and the
RSS of importing what the gateway imports, alone. The last row runs the gateway in
cluster mode on a local control plane of its own (``bench_cluster``): every call written
ahead to the EffectLedger through the API server; it prints the bytes sent to the API
server per call (``--no-cluster`` skips it). Last, one call at a time in-process
(no HTTP server, no load generator): what the enforcement path itself costs per call.

The load comes from ``hey`` when it is installed (Go, so the client costs the machine
little), else from an in-process paced client.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import json
import logging
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

MANIFEST = """- tool: bench.echo
  description: Echo the arguments back.
  effect: idempotent
  permission: bench:write
  upstream: {{ url: "http://127.0.0.1:{port}/echo", method: POST }}
"""
BODY = json.dumps({"arguments": {"text": "hello", "n": 1}})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve_upstream(port: int) -> None:
    from aiohttp import web

    async def echo(request: web.Request) -> web.Response:
        return web.json_response({"echo": await request.json()})

    app = web.Application()
    app.add_routes([web.post("/echo", echo), web.post("/call/bench.echo", echo)])
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def _wait(port: int, proc: subprocess.Popen[bytes], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args!r} exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise SystemExit(f"nothing listens on port {port} after {seconds}s")


def _rss_kb(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in KiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                  if ":" in line)
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


@dataclass
class Load:
    latencies_ms: list[float]
    errors: int
    seconds: float

    @property
    def throughput(self) -> float:
        return len(self.latencies_ms) / self.seconds if self.seconds else 0.0

    def pct(self, q: float) -> float:
        data = sorted(self.latencies_ms)
        if not data:
            return float("nan")
        return data[min(len(data) - 1, int(q / 100 * len(data)))]


def _hey(url: str, rate: int, seconds: float, workers: int) -> Load:
    per_worker = [] if rate <= 0 else ["-q", str(max(1, rate // workers))]
    cmd = ["hey", "-z", f"{seconds:g}s", "-c", str(workers), *per_worker, "-m", "POST",
           "-T", "application/json", "-H", "X-Unwind-Run: bench", "-d", BODY, "-o", "csv", url]
    started = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    elapsed = time.monotonic() - started
    rows = list(csv.DictReader(io.StringIO(out)))
    ok = [float(r["response-time"]) * 1000 for r in rows if r.get("status-code") == "200"]
    return Load(ok, len(rows) - len(ok), min(elapsed, seconds) or elapsed)


def _paced(url: str, rate: int, seconds: float, workers: int) -> Load:
    import httpx2

    async def drive() -> Load:
        latencies: list[float] = []
        errors = 0
        total = int(rate * seconds) if rate > 0 else 10**9
        interval = 1 / rate if rate > 0 else 0.0
        start = time.perf_counter()
        async with httpx2.AsyncClient(headers={"X-Unwind-Run": "bench",
                                               "Content-Type": "application/json"}) as client:
            async def one(n: int) -> None:
                nonlocal errors
                while n < total and time.perf_counter() - start < seconds:
                    wait = start + n * interval - time.perf_counter()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    t0 = time.perf_counter()
                    r = await client.post(url, content=BODY)
                    if r.status_code == 200:
                        latencies.append((time.perf_counter() - t0) * 1000)
                    else:
                        errors += 1
                    n += workers
            await asyncio.gather(*(one(w) for w in range(workers)))
        return Load(latencies, errors, time.perf_counter() - start)

    return asyncio.run(drive())


def _in_process(up_port: int, manifest: Path, ledger: Path, calls: int = 500) -> list[tuple[str, float]]:
    """Median ms per call, one at a time in this process: the upstream call alone, and the
    whole enforcement path around it with each store (no HTTP server in front)."""
    from unwind.gateway.catalogue import LocalCatalogue
    from unwind.gateway.enforce import CallRequest, Gateway, Settings
    from unwind.ledger.filestore import FileLocks, FileStore
    from unwind.ledger.memory import MemoryLocks, MemoryStore
    from unwind.ledger.ulid import new_ulid
    from unwind.upstream.client import Upstream, prepare
    from unwind.upstream.secrets import LocalSecrets

    logging.getLogger("unwind.gateway").setLevel(logging.ERROR)  # no line per call

    async def measure() -> list[tuple[str, float]]:
        catalogue = LocalCatalogue([manifest])
        settings = Settings(scopes=frozenset({"bench:write"}), actor="bench")
        upstream = Upstream()
        m = catalogue.get("bench.echo")
        assert m is not None
        prepared = prepare(m.manifest, {"text": "hello", "n": 1}, LocalSecrets(), {})

        async def timed(one: Callable[[], Awaitable[object]]) -> float:
            for _ in range(50):
                await one()
            samples = []
            for _ in range(calls):
                t0 = time.perf_counter()
                await one()
                samples.append((time.perf_counter() - t0) * 1000)
            return statistics.median(samples)

        rows = [("upstream call alone", await timed(lambda: upstream.send(prepared)))]
        for label, store, locks in (("enforce + memory ledger", MemoryStore(), MemoryLocks()),
                                    ("enforce + file ledger", FileStore(ledger), FileLocks(ledger))):
            gw = Gateway(catalogue, store, locks, upstream, LocalSecrets(), settings)
            rows.append((label, await timed(lambda gw=gw: gw.call(CallRequest(  # type: ignore[misc]
                "bench.echo", {"text": "hello", "n": 1}, "bench-in-process", new_ulid())))))
        await upstream.aclose()
        return rows

    return asyncio.run(measure())


def _import_rss_mb() -> float:
    code = ("import resource, unwind.gateway.app, unwind.cli.gateway_cmds, uvicorn; "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=_env())
    return int(out.stdout.strip()) / 1024


def _env() -> dict[str, str]:
    root = Path(__file__).resolve().parents[1]
    path = os.pathsep.join(p for p in (str(root / "operator"), str(root),
                                       os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rate", type=int, default=500, help="paced calls per second (default 500)")
    parser.add_argument("--seconds", type=float, default=10, help="length of each paced run")
    parser.add_argument("--workers", type=int, default=10, help="concurrent client workers")
    parser.add_argument("--client", choices=("auto", "hey", "python"), default="auto")
    parser.add_argument("--cluster-rate", type=int, help="paced calls per second of the "
                        "EffectLedger row (default --rate)")
    parser.add_argument("--no-cluster", action="store_true", help="skip the row with the ledger "
                        "on a local API server (it starts a control plane of its own, ~20 s)")
    parser.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_upstream:
        _serve_upstream(args.serve_upstream)
        return 0
    use_hey = args.client == "hey" or (args.client == "auto" and shutil.which("hey"))
    load = _hey if use_hey else _paced
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="unwind-bench-") as tmp:
        try:
            up_port = _free_port()
            procs.append(subprocess.Popen([sys.executable, "-m", "benchmarks.gateway",
                                           "--serve-upstream", str(up_port)], env=_env()))
            _wait(up_port, procs[-1])
            manifest = Path(tmp) / "bench.yaml"
            manifest.write_text(MANIFEST.format(port=up_port))

            def gateway(*store: str) -> tuple[int, subprocess.Popen[bytes]]:
                port = _free_port()
                proc = subprocess.Popen(
                    [sys.executable, "-m", "unwind.cli.main", "gateway", "--manifests",
                     str(manifest), "--listen", f"127.0.0.1:{port}", "--scopes", "bench:write",
                     "--log-level", "warning", "--max-entries-per-run", "0", *store],
                    env=_env(), stderr=subprocess.DEVNULL)
                procs.append(proc)
                _wait(port, proc)
                return port, proc

            direct_url = f"http://127.0.0.1:{up_port}/call/bench.echo"
            load(direct_url, args.rate, 1, args.workers)  # warm up
            direct = load(direct_url, args.rate, args.seconds, args.workers)
            rows: list[tuple[str, Load, tuple[Load, int, int] | None]] = [
                ("upstream directly", direct, None)]
            for label, store in (("gateway, ledger in memory", ["--benchmark-memory-store"]),
                                 ("gateway, file ledger", ["--ledger-dir", str(Path(tmp) / "ledger")])):
                port, proc = gateway(*store)
                url = f"http://127.0.0.1:{port}/call/bench.echo"
                load(url, args.rate, 1, args.workers)
                paced = load(url, args.rate, args.seconds, args.workers)
                peak = load(url, 0, min(5.0, args.seconds), args.workers * 2)
                rss, hwm = _rss_kb(proc.pid)
                rows.append((label, paced, (peak, rss, hwm)))
            ledger_stats = None
            if not args.no_cluster:
                ledger_stats = _cluster_row(args, load, up_port, rows)
            _print(args, direct, rows, bool(use_hey))
            if ledger_stats is not None:
                print(f"EffectLedger row: {ledger_stats[0] / 1024:.1f} KiB sent to the API server "
                      f"per call, {ledger_stats[1]:.2f} ledger writes per call (paced run, "
                      f"pages of {ledger_stats[2]} KiB); one call at a time in-process, "
                      f"enforce + EffectLedger: {ledger_stats[3]:.1f} ms (median)")
            print("in-process, one call at a time (median ms per call):")
            for label, ms in _in_process(up_port, manifest, Path(tmp) / "ledger-in-process"):
                print(f"  {label:28} {ms:6.3f}")
        finally:
            for proc in procs:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
    return 0


def _cluster_row(args: argparse.Namespace, load: Callable[[str, int, float, int], Load],
                 up_port: int, rows: list[tuple[str, Load, tuple[Load, int, int] | None]]
                 ) -> tuple[float, float, int, float] | None:
    """The gateway in cluster mode on a control plane of its own: the paced row, and the
    bytes sent to the API server and the ledger writes per call during it."""
    from benchmarks import gateway_cluster as bench_cluster

    why = bench_cluster.available()
    if why is not None:
        print(f"EffectLedger row skipped: {why}")
        return None
    page_kib = 16
    with bench_cluster.cluster_gateway(MANIFEST.format(port=up_port), _env(), _free_port(),
                                       page_kib=page_kib) as gw:
        url = f"http://127.0.0.1:{gw.port}/call/bench.echo"
        rate = args.cluster_rate or args.rate
        load(url, rate, 1, args.workers)
        before = [gw.metric(n) for n in ("unwind_gateway_calls_total",
                                         "unwind_gateway_api_request_bytes",
                                         "unwind_gateway_ledger_api_writes")]
        paced = load(url, rate, args.seconds, args.workers)
        after = [gw.metric(n) for n in ("unwind_gateway_calls_total",
                                        "unwind_gateway_api_request_bytes",
                                        "unwind_gateway_ledger_api_writes")]
        peak = load(url, 0, min(5.0, args.seconds), args.workers * 2)
        rss, hwm = _rss_kb(gw.proc.pid)
        manifest = Path(tempfile.mkdtemp(prefix="unwind-bench-")) / "bench.yaml"
        manifest.write_text(MANIFEST.format(port=up_port))
        one_at_a_time = bench_cluster.in_process_ms(gw, manifest)
        label = "gateway, EffectLedger (API)" + (f" @{rate}/s" if rate != args.rate else "")
        rows.append((label, paced, (peak, rss, hwm)))
    calls = max(1.0, after[0] - before[0])
    return (after[1] - before[1]) / calls, (after[2] - before[2]) / calls, page_kib, one_at_a_time


def _print(args: argparse.Namespace, direct: Load, rows: list[tuple[str, Load, tuple[Load, int, int] | None]],
           hey: bool) -> None:
    print(f"paced at {args.rate}/s for {args.seconds:g}s, {args.workers} workers, client "
          f"{'hey' if hey else 'python (httpx2)'}; {os.cpu_count()} cores")
    print(f"{'':28} {'calls':>7} {'err':>4} {'p50 ms':>7} {'p99 ms':>7} {'+p50':>6} {'+p99':>6} "
          f"{'peak/s':>7} {'RSS MB':>7} {'peak MB':>7}")
    for label, load, extra in rows:
        added = "" if extra is None else (f"{load.pct(50) - direct.pct(50):6.2f} "
                                          f"{load.pct(99) - direct.pct(99):6.2f}")
        tail = "" if extra is None else (f" {extra[0].throughput:7.0f} {extra[1] / 1024:7.1f} "
                                         f"{extra[2] / 1024:7.1f}")
        print(f"{label:28} {len(load.latencies_ms):7d} {load.errors:4d} {load.pct(50):7.2f} "
              f"{load.pct(99):7.2f} {added:13}{tail}")
    print(f"importing the gateway alone: {_import_rss_mb():.1f} MB RSS")
    if direct.latencies_ms:
        print(f"direct mean {statistics.fmean(direct.latencies_ms):.2f} ms")


if __name__ == "__main__":
    sys.exit(main())
