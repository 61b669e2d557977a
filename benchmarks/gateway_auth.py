"""Benchmark: what authentication, rate limits and trace export add to a gateway call,
beside a bare aiohttp proxy and the plain gateway, in one run.

    .venv/bin/python -m benchmarks.gateway_auth [--seconds 5] [--peak-seconds 3] [--rounds 3]

Servers, each a process of its own in front of one small upstream (benchmarks.gateway's):

- the bare aiohttp proxy (the baseline of benchmarks.gateway);
- the gateway with the ledger in memory, on loopback without authentication;
- the same with ``--auth oauth`` (one RS256 JWT, so the cached path: verified once, then
  looked up per call) and with ``--auth oauth --rate-limits`` (two buckets per call, one
  Lua script in a Redis from Debian);
- the gateway with the **file** ledger, authentication and rate limits: the shared gateway's
  path on a laptop's disk (the ≥ 1,000 calls/s target at 10 concurrent);
- the same with in-process buckets (`store: memory`: the limiter without Redis) and the
  file ledger without authentication, so each miss can be put down to its part;
- the memory-ledger gateway exporting traces (OTLP/HTTP to a sink that answers 200) beside
  the same without, at 200 calls/s, every call traced and one in ten (the SDK's
  ``parentbased_traceidratio`` sampler).

The loads and the CPU counting are benchmarks.gateway's (``_measure``): CPU per call from the
serving process's own counters. ServiceAccount tokens' cached path is the same lookup as
OAuth's (a sha256 and a dict); TokenReview itself is not measured here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import gateway as g

AUTH_CPU_MS = 0.1  # the targets (issue 32)
CALLS_PER_S = 1000
TRACE_CPU_RATIO = 1.05


def _serve_sink(port: int, jwks: str) -> None:
    """The issuer's JWKS at /jwks and an OTLP sink at /v1/traces (answers 200, keeps nothing)."""
    from aiohttp import web

    async def keys(_: web.Request) -> web.Response:
        return web.Response(text=Path(jwks).read_text(), content_type="application/json")

    async def traces(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=200, content_type="application/x-protobuf")

    app = web.Application()
    app.add_routes([web.get("/jwks", keys), web.post("/v1/traces", traces)])
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def _token(folder: Path, issuer: str) -> str:
    import jwt
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    (folder / "jwks.json").write_text(json.dumps({"keys": [{**public, "kid": "k1", "use": "sig",
                                                            "alg": "RS256"}]}))
    claims = {"iss": issuer, "sub": "bench", "aud": "bench", "scope": "bench.write",
              "exp": int(time.time()) + 3600}
    return jwt.encode(claims, key, algorithm="RS256", headers={"kid": "k1"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--peak-seconds", type=float, default=3)
    parser.add_argument("--rounds", type=int, default=3,
                        help="runs of every row, interleaved; each figure is their median")
    parser.add_argument("--serve-sink", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds: at least 1")
    if args.serve_sink:
        _serve_sink(int(args.serve_sink[0]), args.serve_sink[1])
        return 0
    shapes = [g.Shape(1, 0), g.Shape(10, 0)]
    traced_shape = [g.Shape(10, 200)]
    procs: list[subprocess.Popen[bytes]] = []
    rounds: dict[str, list[g.Server]] = {}  # kind -> its server in each round
    with tempfile.TemporaryDirectory(prefix="unwind-bench-auth-") as tmp:
        folder = Path(tmp)
        redis_port = g._free_port()
        redis = subprocess.Popen(["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1",
                                  "--save", "", "--appendonly", "no", "--dir", str(folder)],
                                 stdout=subprocess.DEVNULL)
        g._wait(redis_port, redis)
        redis_url = f"redis://127.0.0.1:{redis_port}/0"
        try:
            up_port, sink_port = g._free_port(), g._free_port()
            issuer = f"http://127.0.0.1:{sink_port}"
            token = _token(folder, issuer)
            for command in (["--serve-upstream", str(up_port)],):
                procs.append(subprocess.Popen([sys.executable, "-m", "benchmarks.gateway",
                                               *command], env=g._env()))
                g._wait(up_port, procs[-1])
            procs.append(subprocess.Popen([sys.executable, "-m", "benchmarks.gateway_auth",
                                           "--serve-sink", str(sink_port),
                                           str(folder / "jwks.json")], env=g._env()))
            g._wait(sink_port, procs[-1])
            manifest = folder / "bench.yaml"
            manifest.write_text(g.MANIFEST.format(port=up_port))
            oauth = json.dumps({"issuer": issuer, "jwks_uri": f"{issuer}/jwks",
                                "audiences": ["bench"], "scopes": {"bench:write": ["bench.write"]}})
            buckets = {"actor": {"requests": 10_000_000, "per": "1m"},
                       "tool": {"requests": 10_000_000, "per": "1m"}}
            limits = json.dumps({"store": redis_url, **buckets})
            local_limits = json.dumps({"store": "memory", **buckets})  # this process's buckets
            base = ["unwind.cli.main", "gateway", "--manifests", str(manifest), "--listen",
                    "127.0.0.1:{port}", "--scopes", "bench:write", "--log-level", "warning",
                    "--max-entries-per-run", "0"]

            def start(label: str, kind: str, *extra: str, env: dict[str, str] | None = None
                      ) -> g.Server:
                port = g._free_port()
                command = [c.replace("{port}", str(port)) for c in [*base, *extra]]
                if extra and extra[0] == "--serve-proxy":
                    command = ["benchmarks.gateway", "--serve-proxy", str(port), str(up_port)]
                proc = subprocess.Popen([sys.executable, "-m", *command],
                                        env={**g._env(), **(env or {})},
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                procs.append(proc)
                g._wait(port, proc)
                return g.Server(label, port, proc.pid, kind)

            plain = [("bare aiohttp proxy", "bare", ("--serve-proxy",), False),
                     ("gateway, memory, no auth", "memory", ("--benchmark-memory-store",), False),
                     ("+ oauth (cached)", "auth", ("--benchmark-memory-store", "--auth", "oauth",
                                                   "--oauth-config", oauth), True),
                     ("+ oauth + limits in-process", "local", (
                         "--benchmark-memory-store", "--auth", "oauth", "--oauth-config", oauth,
                         "--rate-limits", local_limits), True),
                     ("+ oauth + rate limits", "limits", ("--benchmark-memory-store", "--auth",
                                                          "oauth", "--oauth-config", oauth,
                                                          "--rate-limits", limits), True),
                     ("file ledger, no auth", "file-plain", (
                         "--ledger-dir", str(folder / "ledger-plain")), False),
                     ("file ledger + oauth + limits", "file", (
                         "--ledger-dir", str(folder / "ledger"), "--auth", "oauth",
                         "--oauth-config", oauth, "--rate-limits", limits), True)]
            traced = [("memory, no traces", "untraced", None),
                      ("memory, OTLP export", "traced", {"OTEL_EXPORTER_OTLP_ENDPOINT": issuer}),
                      ("memory, OTLP export, 1 in 10", "sampled", {
                          "OTEL_EXPORTER_OTLP_ENDPOINT": issuer,
                          "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                          "OTEL_TRACES_SAMPLER_ARG": "0.1"})]
            for _ in range(args.rounds):  # every row once a round: a slow minute hits them all
                for label, kind, extra, auth in plain:
                    server = start(label, kind, *extra)
                    g.EXTRA_HEADERS.clear()
                    if auth:
                        g.EXTRA_HEADERS["Authorization"] = f"Bearer {token}"
                    g._measure(server, shapes, g._paced, args.seconds, args.peak_seconds)
                    rounds.setdefault(kind, []).append(server)
                    g._stop(procs[-1:])
                    del procs[-1]
                g.EXTRA_HEADERS.clear()
                for label, kind, env in traced:
                    server = start(label, kind, "--benchmark-memory-store", env=env)
                    g._measure(server, traced_shape, g._paced, args.seconds, args.peak_seconds)
                    rounds.setdefault(kind, []).append(server)
                    g._stop(procs[-1:])
                    del procs[-1]
            ping_ms = _redis_floor(redis_url)
        finally:
            g._stop(procs)
            redis.terminate()
            redis.wait(10)
    _print(rounds, shapes, traced_shape, ping_ms)
    return 0


def _redis_floor(url: str, n: int = 5000) -> float:
    """CPU ms of one Redis round trip (PING) from redis.asyncio, the client the limiter uses:
    the floor under a limit shared through Redis, measured beside the rows above."""
    import asyncio

    import redis.asyncio as redis

    async def ping() -> float:
        client = redis.Redis.from_url(url)
        try:
            for _ in range(200):
                await client.ping()
            started = time.process_time()
            for _ in range(n):
                await client.ping()
            return (time.process_time() - started) / n * 1000
        finally:
            await client.aclose()
    return asyncio.run(ping())


def _print(rounds: dict[str, list[g.Server]], shapes: list[g.Shape], traced: list[g.Shape],
           ping_ms: float) -> None:
    n = min(len(servers) for servers in rounds.values())
    median = statistics.median
    def per_round(kind: str, shape: g.Shape) -> list[g.Result]:
        return [s.results[shape] for s in rounds[kind]]

    def cpu(kind: str, shape: g.Shape) -> list[float]:
        return [r.cpu_ms for r in per_round(kind, shape)]

    def added(kind: str, base: str, shape: g.Shape) -> float:
        """Median over the rounds of what ``kind`` adds to ``base`` in the same round."""
        return median([a - b for a, b in zip(cpu(kind, shape), cpu(base, shape), strict=True)])

    print(f"client: python (aiohttp), its own process; CPU per call from the serving process's "
          f"counters; each figure the median of {n} rounds (every row once a round); x = ratio "
          f"to the bare proxy in the same shape")
    print(f"{'':32} {'calls/s':>8} {'CPU ms':>7} {'x':>5} {'p50 ms':>7} {'p99 ms':>7} {'err':>4}")
    for shape in [*shapes, *traced]:
        print(f"-- {shape.label}")
        bare = median(cpu("bare", shape)) if shape in rounds["bare"][0].results else 0
        for kind, servers in rounds.items():
            if shape not in servers[0].results:
                continue
            results = per_round(kind, shape)
            ms = median([r.cpu_ms for r in results])
            x = f"{ms / bare:5.2f}" if bare else ""
            print(f"  {servers[0].label:30} {median([r.load.throughput for r in results]):8.0f} "
                  f"{ms:7.3f} {x:>5} {median([r.load.pct(50) for r in results]):7.2f} "
                  f"{median([r.load.pct(99) for r in results]):7.2f} "
                  f"{sum(r.load.errors for r in results):4d}")
    print("RSS after the loads (MB, now / peak, the last round): " + "; ".join(
        f"{s[-1].label} {s[-1].rss_kb[0] / 1024:.1f} / {s[-1].rss_kb[1] / 1024:.1f}"
        for s in rounds.values()))
    print("targets (issue 32), in this run:")
    for shape in shapes:
        both = added("limits", "memory", shape)
        print(f"  authentication (cached) + rate limit add <= {AUTH_CPU_MS} ms CPU per call, "
              f"{shape.label}: {both:+.3f} ms (authentication alone "
              f"{added('auth', 'memory', shape):+.3f}, with in-process buckets "
              f"{added('local', 'memory', shape):+.3f}) {g._met(both <= AUTH_CPU_MS)}")
    print(f"  one Redis round trip (PING, redis.asyncio) costs its client {ping_ms:.3f} ms CPU")
    rate = median([r.load.throughput for r in per_round("file", shapes[-1])])
    plain = median([r.load.throughput for r in per_round("file-plain", shapes[-1])])
    print(f"  >= {CALLS_PER_S} authenticated calls/s at 10 concurrent, file ledger: {rate:.0f}/s "
          f"(without auth and limits {plain:.0f}/s) {g._met(rate >= CALLS_PER_S)}")
    shape = traced[0]
    on = median([a / b for a, b in zip(cpu("traced", shape), cpu("untraced", shape), strict=True)])
    sampled = median([a / b for a, b in zip(cpu("sampled", shape), cpu("untraced", shape),
                                            strict=True)])
    exporter = median([a.threads_ms - b.threads_ms for a, b in zip(
        per_round("traced", shape), per_round("untraced", shape), strict=True)])
    print(f"  trace export <= 5% CPU at 200 calls/s: {on - 1:+.1%} (one call in ten "
          f"sampled: {sampled - 1:+.1%}) {g._met(on <= TRACE_CPU_RATIO)}")
    print(f"    of the {added('traced', 'untraced', shape):+.3f} ms a traced call adds, "
          f"{exporter:+.3f} ms is off the event loop (the batch exporter's thread: encoding and "
          f"sending the spans)")


if __name__ == "__main__":
    sys.exit(main())
