"""Benchmark: what the gateway costs per call beside a bare aiohttp proxy, in one run.

    .venv/bin/python -m benchmarks.gateway [--no-cluster] [--seconds 5] [--peak-seconds 3]

One run starts a small upstream (aiohttp, answering JSON) and, each as a process of its own
in front of it, a bare aiohttp proxy (an aiohttp server forwarding each POST with one
shared aiohttp client session: the least a Python proxy does, the baseline) and the gateway
in local mode with the ledger in memory (``--benchmark-memory-store``: ledger writes
excluded) and with the file ledger (``--ledger-dir``). Then, on a local control plane of
its own (``benchmarks.gateway_cluster``, under /tmp/unwind-cluster.lock), the gateway in
cluster mode, every call written ahead to the EffectLedger through the API server, beside
the bare proxy measured again while the control plane runs (``--no-cluster`` skips it).

Each server is driven at four load shapes: one call in flight paced at ``--seq-rate``
(20/s: a rate a sidecar sees) and unpaced (back to back), and ``--concurrency`` (10) in
flight paced at ``--conc-rate`` (50/s) and unpaced (saturation). Per load it prints the
CPU per call answered, from the serving process's own counters (the sum of its threads'
``/proc/<pid>/task/*/schedstat`` run time, in ns; ``/proc/<pid>/stat`` ticks when threads
came and went), latency p50/p99 and throughput, and the ratios to the bare proxy in the
same shape. After the loads: each process's RSS (VmRSS, and the peak VmHWM) and its CPU
with no load (a second before the loads), the time of one fsync on the ledger's folder
(median of 100 small appends, each fsync'ed, half before the loads and half after), the
file ledger's fsyncs per call and the cluster row's bytes sent to the API server and ledger
writes per call (from the gateway's /metrics), and the issue's targets, each marked met or
not met. Then, one call at a time in-process (no HTTP server, no load generator): what the
enforcement path itself costs per call. Last, the MCP rows (``benchmarks.gateway_mcp_calls``,
``--no-mcp`` skips them): ``tools/call`` through ``/mcp`` beside a plain forwarding Python
MCP proxy, with the upstream's HTTP requests per call.

The load comes from ``hey`` when it is installed (Go, so the client costs the machine
little), else from a paced aiohttp client in this process: never in the process measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import io
import json
import logging
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

MANIFEST = """- tool: bench.echo
  description: Echo the arguments back.
  effect: idempotent
  permission: bench:write
  upstream: {{ url: "http://127.0.0.1:{port}/echo", method: POST }}
"""
BODY = json.dumps({"arguments": {"text": "hello", "n": 1}})
PATH = "/call/bench.echo"
LOCK = Path("/tmp/unwind-cluster.lock")
# headers every load sends besides the run (benchmarks.gateway_auth adds Authorization)
EXTRA_HEADERS: dict[str, str] = {}
FSYNC_METRICS = ("unwind_gateway_ledger_fsyncs_total", "unwind_gateway_ledger_fsyncs")

# the targets (issue 20)
FILE_CPU_RATIO = 2.0
MEMORY_CPU_RATIO = 1.5
FILE_P50_SLACK_MS = 1.0
CLUSTER_P50_ADDED_MS = 15.0
RSS_MB = 90.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve_upstream(port: int) -> None:
    from aiohttp import web

    async def echo(request: web.Request) -> web.Response:
        return web.json_response({"echo": await request.json()})

    app = web.Application()
    app.add_routes([web.post("/echo", echo), web.post(PATH, echo)])
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def _serve_proxy(port: int, upstream_port: int) -> None:
    """The baseline: an aiohttp server forwarding each POST to the upstream with one shared
    aiohttp client session, the answer passed back as it came."""
    import aiohttp
    from aiohttp import web

    target = f"http://127.0.0.1:{upstream_port}/echo"
    session: aiohttp.ClientSession | None = None

    async def forward(request: web.Request) -> web.Response:
        assert session is not None
        async with session.post(target, data=await request.read(),
                                headers={"Content-Type": "application/json"}) as answer:
            return web.Response(body=await answer.read(), status=answer.status,
                                content_type="application/json")

    async def start(app: web.Application) -> None:
        nonlocal session
        session = aiohttp.ClientSession()

    async def stop(app: web.Application) -> None:
        if session is not None:
            await session.close()

    app = web.Application()
    app.add_routes([web.post(PATH, forward)])
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
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


def _cpu(pid: int) -> tuple[float, float]:
    """(seconds on a CPU summed over the live threads' schedstat, in ns; seconds of
    utime + stime in clock ticks, which also count threads that have exited)."""
    ns = _schedstat_ns(pid)
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return ns / 1e9, ticks / os.sysconf("SC_CLK_TCK")


def _schedstat_ns(pid: int, *, main: bool = True) -> int:
    """ns on a CPU summed over the live threads of ``pid`` (without its main one: ``main=False``)."""
    ns = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        if main or task.name != str(pid):
            with contextlib.suppress(OSError, ValueError, IndexError):
                ns += int((task / "schedstat").read_text().split()[0])
    return ns


def _side_threads_s(pid: int) -> float:
    """CPU seconds of the live threads of ``pid`` other than its main one."""
    return _schedstat_ns(pid, main=False) / 1e9


def _cpu_delta(before: tuple[float, float], after: tuple[float, float]) -> float:
    precise, ticks = after[0] - before[0], after[1] - before[1]
    # a thread that exited during the load is missing from the schedstat sum: trust the
    # ticks then (10 ms each, so only when they differ by more than three)
    return ticks if ticks - precise > 3 / os.sysconf("SC_CLK_TCK") else precise


def _metric(port: int, names: tuple[str, ...]) -> float | None:
    """A metric's value summed over its labels from the gateway's /metrics (the first of
    ``names`` present), or None when the gateway does not expose it."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    for name in names:
        found = re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.M)
        if found:
            return sum(float(v) for v in found)
    return None


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


Driver = Callable[[str, int, float, int, str], Load]


def _hey(url: str, rate: int, seconds: float, workers: int, run: str) -> Load:
    per_worker = [] if rate <= 0 else ["-q", f"{rate / workers:g}"]
    cmd = ["hey", "-z", f"{seconds:g}s", "-c", str(workers), *per_worker, "-m", "POST",
           "-T", "application/json", "-H", f"X-Unwind-Run: {run}",
           *(a for k, v in EXTRA_HEADERS.items() for a in ("-H", f"{k}: {v}")),
           "-d", BODY, "-o", "csv", url]
    started = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    elapsed = time.monotonic() - started
    rows = list(csv.DictReader(io.StringIO(out)))
    ok = [float(r["response-time"]) * 1000 for r in rows if r.get("status-code") == "200"]
    return Load(ok, len(rows) - len(ok), min(elapsed, seconds) or elapsed)


def _paced(url: str, rate: int, seconds: float, workers: int, run: str) -> Load:
    """``workers`` calls in flight at most; paced at ``rate`` calls per second in total (call
    n is due at start + n / rate), or back to back when ``rate`` is 0."""
    import aiohttp

    async def drive() -> Load:
        latencies: list[float] = []
        errors = 0
        interval = 1 / rate if rate > 0 else 0.0
        headers = {"X-Unwind-Run": run, "Content-Type": "application/json", **EXTRA_HEADERS}
        connector = aiohttp.TCPConnector(limit=workers)
        async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
            start = time.perf_counter()

            async def one(n: int) -> None:
                nonlocal errors
                while True:
                    due = start + n * interval
                    if due - start >= seconds or time.perf_counter() - start >= seconds:
                        return
                    wait = due - time.perf_counter()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    t0 = time.perf_counter()
                    async with session.post(url, data=BODY) as answer:
                        await answer.read()
                        if answer.status == 200:
                            latencies.append((time.perf_counter() - t0) * 1000)
                        else:
                            errors += 1
                    n += workers
            await asyncio.gather(*(one(w) for w in range(workers)))
            return Load(latencies, errors, time.perf_counter() - start)

    return asyncio.run(drive())


@dataclass(frozen=True)
class Shape:
    concurrency: int
    rate: int  # calls per second in total; 0: unpaced

    @property
    def label(self) -> str:
        inflight = "1 in flight" if self.concurrency == 1 else f"{self.concurrency} concurrent"
        return f"{inflight}, " + (f"{self.rate}/s" if self.rate else "unpaced")


@dataclass
class Result:
    load: Load
    cpu_ms: float  # per call answered
    per_call: dict[str, float | None] = field(default_factory=dict)  # metric deltas per call
    threads_ms: float = 0.0  # of cpu_ms, what threads other than the main one spent (a batch
    # span exporter's, the ledger's fsync threads)


@dataclass
class Server:
    label: str
    port: int
    pid: int
    kind: str  # bare, memory, file, cluster
    metrics: dict[str, tuple[str, ...]] = field(default_factory=dict)  # shown per call
    results: dict[Shape, Result] = field(default_factory=dict)
    rss_kb: tuple[int, int] = (0, 0)
    idle_ms: float = 0.0  # CPU ms per second with no load, before the loads


def _measure(server: Server, shapes: list[Shape], drive: Driver, seconds: float,
             peak_seconds: float) -> None:
    url = f"http://127.0.0.1:{server.port}{PATH}"
    cpu0, t0 = _cpu(server.pid), time.perf_counter()
    time.sleep(1)
    server.idle_ms = _cpu_delta(cpu0, _cpu(server.pid)) * 1000 / (time.perf_counter() - t0)
    for n, shape in enumerate(shapes):
        length = seconds if shape.rate else peak_seconds
        drive(url, shape.rate, 0.5, shape.concurrency, f"warm-{n}")  # connections, caches
        before = {k: _metric(server.port, names) for k, names in server.metrics.items()}
        cpu0, side0 = _cpu(server.pid), _side_threads_s(server.pid)
        load = drive(url, shape.rate, length, shape.concurrency, f"bench-{n}")
        cpu1, side1 = _cpu(server.pid), _side_threads_s(server.pid)
        after = {k: _metric(server.port, names) for k, names in server.metrics.items()}
        calls = len(load.latencies_ms)
        per_call: dict[str, float | None] = {}
        for key in server.metrics:
            a, b = after[key], before[key]
            per_call[key] = None if a is None or b is None or not calls else (a - b) / calls
        cpu = _cpu_delta(cpu0, cpu1) * 1000 / calls if calls else float("nan")
        side = (side1 - side0) * 1000 / calls if calls else 0.0
        server.results[shape] = Result(load, cpu, per_call, max(side, 0.0))
    server.rss_kb = _rss_kb(server.pid)


def _fsync_ms(folder: Path, n: int = 50) -> list[float]:
    """ms of each of ``n`` small appends and their fsync, in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / ".fsync-probe"
    samples = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        record = (json.dumps({"id": "x" * 26, "state": "pending", "tool": "bench.echo"}) + "\n").encode()
        for _ in range(n + 5):
            t0 = time.perf_counter()
            os.write(fd, record)
            os.fsync(fd)
            samples.append((time.perf_counter() - t0) * 1000)
    finally:
        os.close(fd)
        path.unlink()
    return samples[5:]


def _in_process(up_port: int, manifest: Path, ledger: Path,
                calls: int = 300) -> list[tuple[str, float, float]]:
    """Median wall ms and mean CPU ms per call, one at a time in this process: the upstream
    call alone, and the whole enforcement path around it with each store (no HTTP server in
    front). Their differences split a gateway's cost into the upstream client's, the
    enforcement's and each store's; what the HTTP rows add beyond them is the server."""
    from unwind.gateway.catalogue import LocalCatalogue
    from unwind.gateway.enforce import CallRequest, Gateway, Settings
    from unwind.ledger.filestore import FileLocks, FileStore
    from unwind.ledger.memory import MemoryLocks, MemoryStore
    from unwind.ledger.ulid import new_ulid
    from unwind.upstream.client import Upstream, prepare
    from unwind.upstream.secrets import LocalSecrets

    async def measure() -> list[tuple[str, float, float]]:
        catalogue = LocalCatalogue([manifest])
        settings = Settings(scopes=frozenset({"bench:write"}), actor="bench")
        upstream = Upstream()
        m = catalogue.get("bench.echo")
        assert m is not None
        prepared = prepare(m.manifest, {"text": "hello", "n": 1}, LocalSecrets(), {})

        async def timed(label: str, one: Callable[[], Awaitable[object]]) -> tuple[str, float, float]:
            for _ in range(30):
                await one()
            samples = []
            cpu0 = time.process_time()  # this process's threads: the fsync thread's too
            for _ in range(calls):
                t0 = time.perf_counter()
                await one()
                samples.append((time.perf_counter() - t0) * 1000)
            cpu = (time.process_time() - cpu0) * 1000 / calls
            return label, statistics.median(samples), cpu

        rows = [await timed("upstream call alone", lambda: upstream.send(prepared))]
        for label, store, locks in (("enforce + memory ledger", MemoryStore(), MemoryLocks()),
                                    ("enforce + file ledger", FileStore(ledger), FileLocks(ledger))):
            gw = Gateway(catalogue, store, locks, upstream, LocalSecrets(), settings)
            rows.append(await timed(label, lambda gw=gw: gw.call(CallRequest(  # type: ignore[misc]
                "bench.echo", {"text": "hello", "n": 1}, "bench-in-process", new_ulid()))))
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


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    procs.clear()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=5, help="length of each paced load "
                        "(default 5)")
    parser.add_argument("--peak-seconds", type=float, default=3, help="length of each unpaced "
                        "load (default 3)")
    parser.add_argument("--seq-rate", type=int, default=20, help="calls per second of the paced "
                        "load with one call in flight (default 20)")
    parser.add_argument("--conc-rate", type=int, default=50, help="calls per second of the paced "
                        "concurrent load (default 50)")
    parser.add_argument("--concurrency", type=int, default=10, help="calls in flight of the "
                        "concurrent loads (default 10)")
    parser.add_argument("--client", choices=("auto", "hey", "python"), default="auto")
    parser.add_argument("--no-cluster", action="store_true", help="skip the rows on a local API "
                        "server (they start a control plane of their own, ~20 s)")
    parser.add_argument("--no-in-process", action="store_true", help="skip the in-process lines")
    parser.add_argument("--no-mcp", action="store_true", help="skip the MCP tools/call rows "
                        "(benchmarks.gateway_mcp_calls)")
    parser.add_argument("--mcp-calls", type=int, default=300, help="calls per MCP row (300)")
    parser.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-proxy", type=int, nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_upstream:
        _serve_upstream(args.serve_upstream)
        return 0
    if args.serve_proxy:
        _serve_proxy(*args.serve_proxy)
        return 0
    logging.getLogger("unwind.gateway").setLevel(logging.ERROR)  # in-process rows: no line per call
    use_hey = args.client == "hey" or (args.client == "auto" and bool(shutil.which("hey")))
    drive: Driver = _hey if use_hey else _paced
    shapes = [Shape(1, args.seq_rate), Shape(1, 0), Shape(args.concurrency, args.conc_rate),
              Shape(args.concurrency, 0)]
    procs: list[subprocess.Popen[bytes]] = []
    servers: list[Server] = []
    notes: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="unwind-bench-") as tmp:
        try:
            up_port = _free_port()
            procs.append(subprocess.Popen([sys.executable, "-m", "benchmarks.gateway",
                                           "--serve-upstream", str(up_port)], env=_env()))
            _wait(up_port, procs[-1])
            manifest = Path(tmp) / "bench.yaml"
            manifest.write_text(MANIFEST.format(port=up_port))
            ledger = Path(tmp) / "ledger"
            fsyncs = _fsync_ms(ledger)

            def start(*command: str) -> tuple[int, subprocess.Popen[bytes]]:
                port = _free_port()
                proc = subprocess.Popen([sys.executable, "-m", *command[:1], *(
                    c.replace("{port}", str(port)) for c in command[1:])],
                    env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                procs.append(proc)
                _wait(port, proc)
                return port, proc

            gateway = ("unwind.cli.main", "gateway", "--manifests", str(manifest), "--listen",
                       "127.0.0.1:{port}", "--scopes", "bench:write", "--log-level", "warning",
                       "--max-entries-per-run", "0")
            port, proc = start("benchmarks.gateway", "--serve-proxy", "{port}", str(up_port))
            bare = Server("bare aiohttp proxy", port, proc.pid, "bare")
            port, proc = start(*gateway, "--benchmark-memory-store")
            memory = Server("gateway, memory ledger", port, proc.pid, "memory")
            port, proc = start(*gateway, "--ledger-dir", str(ledger))
            file = Server("gateway, file ledger", port, proc.pid, "file",
                          {"fsyncs": FSYNC_METRICS})
            for server in (bare, memory, file):
                _measure(server, shapes, drive, args.seconds, args.peak_seconds)
                servers.append(server)
            # the disk is shared with whatever else runs: sampled before and after the loads
            after = _fsync_ms(ledger)
            notes["fsync_ms"] = (statistics.median(fsyncs + after), statistics.median(fsyncs),
                                 statistics.median(after))
            _stop(procs[2:])  # the gateways: the control plane gets the machine
            del procs[2:]
            if not args.no_cluster:
                _cluster_rows(args, drive, shapes, up_port, bare, servers, notes)
            if not args.no_in_process:
                notes["in_process"] = _in_process(up_port, manifest, Path(tmp) / "ledger-in-process")
        finally:
            _stop(procs)
    notes["import_rss_mb"] = _import_rss_mb()
    _print(args, shapes, servers, notes, use_hey)
    if not args.no_mcp:
        from . import gateway_mcp_calls

        gateway_mcp_calls.print_rows(gateway_mcp_calls.rows(args.mcp_calls, args.concurrency))
    return 0


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        status = Path(f"/proc/{pid}/status").read_text()
        pid = int(re.search(r"^PPid:\s+(\d+)", status, re.M).group(1))  # type: ignore[union-attr]
    return pids


@contextlib.contextmanager
def _cluster_lock() -> Iterator[None]:
    """/tmp/unwind-cluster.lock, held while the control plane runs (one per machine), unless
    a process this one runs under holds it already (``flock /tmp/unwind-cluster.lock ...``)."""
    import fcntl

    with open(LOCK, "a") as lock:
        inode = os.fstat(lock.fileno()).st_ino
        holders = {int(f[4]) for f in (line.split() for line in
                                       Path("/proc/locks").read_text().splitlines())
                   if len(f) > 5 and f[1] == "FLOCK" and f[5].rsplit(":", 1)[-1] == str(inode)}
        if holders & _ancestors():
            yield
            return
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for {LOCK} (another control plane runs here)", flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _cluster_rows(args: argparse.Namespace, drive: Driver, shapes: list[Shape], up_port: int,
                  bare: Server, servers: list[Server], notes: dict[str, object]) -> None:
    """The gateway in cluster mode on a control plane of its own, beside the bare proxy
    measured again while the control plane runs."""
    from benchmarks import gateway_cluster

    why = gateway_cluster.available()
    if why is not None:
        notes["cluster_skipped"] = why
        return
    page_kib = 16
    with _cluster_lock(), gateway_cluster.cluster_gateway(
            MANIFEST.format(port=up_port), _env(), _free_port(), page_kib=page_kib) as gw:
        again = Server("bare proxy, control plane up", bare.port, bare.pid, "bare-cp")
        _measure(again, shapes, drive, args.seconds, args.peak_seconds)
        cluster = Server("gateway, EffectLedger (API)", gw.port, gw.proc.pid, "cluster",
                         {"api_bytes": ("unwind_gateway_api_request_bytes",),
                          "api_writes": ("unwind_gateway_ledger_api_writes",)})
        _measure(cluster, shapes, drive, args.seconds, args.peak_seconds)
        servers += [again, cluster]
        notes["page_kib"] = page_kib
        if not args.no_in_process:
            manifest = Path(tempfile.mkdtemp(prefix="unwind-bench-")) / "bench.yaml"
            manifest.write_text(MANIFEST.format(port=up_port))
            notes["cluster_in_process_ms"] = gateway_cluster.in_process_ms(gw, manifest)


def _met(ok: bool) -> str:
    return "met" if ok else "NOT MET"


def _print(args: argparse.Namespace, shapes: list[Shape], servers: list[Server],
           notes: dict[str, object], hey: bool) -> None:
    by_kind = {s.kind: s for s in servers}
    bare = by_kind["bare"]
    print(f"client {'hey' if hey else 'python (aiohttp), its own process'}; paced loads "
          f"{args.seconds:g}s, unpaced {args.peak_seconds:g}s; {os.cpu_count()} cores; CPU from "
          "the serving process's counters; x = ratio to the bare proxy in the same shape "
          "(the cluster row: to the bare proxy measured while the control plane ran)")
    print(f"{'':30} {'calls':>6} {'err':>4} {'calls/s':>8} {'CPU ms':>7} {'x':>5} {'p50 ms':>7} "
          f"{'+p50':>6} {'p99 ms':>7}  per call")
    for shape in shapes:
        print(f"-- {shape.label}")
        for server in servers:
            r = server.results.get(shape)
            if r is None:
                continue
            base = by_kind["bare-cp"] if server.kind == "cluster" else bare
            b = base.results[shape]
            ratio = r.cpu_ms / b.cpu_ms if b.cpu_ms else float("nan")
            added = r.load.pct(50) - b.load.pct(50)
            extra = []
            for key, value in r.per_call.items():
                if key == "api_bytes":
                    extra.append("n/a KiB to the API" if value is None else
                                 f"{value / 1024:.2f} KiB to the API")
                elif key == "api_writes":
                    extra.append("n/a API writes" if value is None else f"{value:.2f} API writes")
                else:
                    extra.append(f"{'n/a' if value is None else f'{value:.2f}'} {key}")
            same = server is base
            print(f"  {server.label:28} {len(r.load.latencies_ms):6d} {r.load.errors:4d} "
                  f"{r.load.throughput:8.0f} {r.cpu_ms:7.3f} "
                  f"{'' if same else f'{ratio:5.2f}':>5} {r.load.pct(50):7.2f} "
                  f"{'' if same else f'{added:+6.2f}':>6} {r.load.pct(99):7.2f}  {', '.join(extra)}")
    print("RSS after the loads (MB, now / peak VmHWM): " + "; ".join(
        f"{s.label} {s.rss_kb[0] / 1024:.1f} / {s.rss_kb[1] / 1024:.1f}" for s in servers
        if s.kind != "bare-cp"))
    print("CPU with no load (ms per second, counted in the paced rows' CPU per call): " + "; ".join(
        f"{s.label} {s.idle_ms:.2f}" for s in servers))
    print(f"importing the gateway alone: {notes['import_rss_mb']:.1f} MB RSS")
    fsync, before, after = cast(tuple[float, float, float], notes["fsync_ms"])
    print(f"one fsync on the ledger's folder (small append + fsync): median {fsync:.2f} ms of 100 "
          f"(50 before the loads: {before:.2f} ms, 50 after: {after:.2f} ms)")
    if "cluster_skipped" in notes:
        print(f"cluster rows skipped: {notes['cluster_skipped']}")
    elif "page_kib" in notes:
        print(f"cluster rows: ledger pages of {notes['page_kib']} KiB")
    for label, ms, cpu in notes.get("in_process", []):  # type: ignore[attr-defined]
        print(f"in-process, one call at a time: {label:26} {ms:6.3f} ms (median), "
              f"{cpu:6.3f} ms CPU per call")
    if "cluster_in_process_ms" in notes:
        print(f"in-process, one call at a time: {'enforce + EffectLedger':26} "
              f"{notes['cluster_in_process_ms']:6.3f} ms (median)")

    print("targets (issue 20), in this run:")

    def cpu_line(kind: str, limit: float) -> None:
        server = by_kind[kind]
        parts, met = [], 0
        for shape in shapes:
            ratio = server.results[shape].cpu_ms / bare.results[shape].cpu_ms
            met += ratio <= limit
            parts.append(f"{shape.label} {ratio:.2f}x {_met(ratio <= limit)}")
        print(f"  {server.label} CPU per call <= {limit:g}x bare: {'; '.join(parts)} "
              f"({met} of {len(shapes)} shapes)")

    cpu_line("memory", MEMORY_CPU_RATIO)
    cpu_line("file", FILE_CPU_RATIO)
    seq = shapes[0]
    bound = bare.results[seq].load.pct(50) + FILE_P50_SLACK_MS + fsync
    p50 = by_kind["file"].results[seq].load.pct(50)
    print(f"  file ledger p50, {seq.label} <= bare p50 + {FILE_P50_SLACK_MS:g} ms + one fsync "
          f"({bare.results[seq].load.pct(50):.2f} + {FILE_P50_SLACK_MS:g} + {fsync:.2f} = "
          f"{bound:.2f} ms): {p50:.2f} ms {_met(p50 <= bound)}")
    fsyncs = {shape: by_kind["file"].results[shape].per_call.get("fsyncs") for shape in shapes}
    if all(v is None for v in fsyncs.values()):
        print("  file ledger fsyncs per call: n/a (the gateway exposes no "
              f"{FSYNC_METRICS[0]})")
    else:
        text = "; ".join(f"{s.label} {'n/a' if v is None else f'{v:.2f}'}"
                         for s, v in fsyncs.items())
        peak = fsyncs[shapes[-1]]
        verdict = "n/a" if peak is None else _met(peak < 1)
        print(f"  file ledger, one fsync per batch at {args.concurrency} concurrent (fewer than "
              f"one per call unpaced): {text}: {verdict}")
    if "cluster" in by_kind:
        again, cluster = by_kind["bare-cp"], by_kind["cluster"]
        added = cluster.results[seq].load.pct(50) - again.results[seq].load.pct(50)
        print(f"  cluster ledger p50 added at {seq.label} <= {CLUSTER_P50_ADDED_MS:g} ms: "
              f"{added:+.2f} ms {_met(added <= CLUSTER_P50_ADDED_MS)}")
    else:
        print("  cluster ledger p50 added: not measured (--no-cluster or no control plane)")
    # the memory store keeps every entry of the run (a benchmark's store, never a sidecar's)
    gateways = [s for s in servers if s.kind in ("file", "cluster")]
    worst = max(s.rss_kb[1] for s in gateways) / 1024
    print(f"  gateway RSS <= {RSS_MB:g} MB (peak VmHWM after the loads): " + ", ".join(
        f"{s.kind} ledger {s.rss_kb[1] / 1024:.1f}" for s in gateways) + f" MB "
        f"{_met(worst <= RSS_MB)} (the memory ledger, which keeps every entry: "
        f"{by_kind['memory'].rss_kb[1] / 1024:.1f} MB)")


if __name__ == "__main__":
    sys.exit(main())
