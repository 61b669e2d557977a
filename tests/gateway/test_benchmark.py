"""The gateway's comparison benchmark (benchmarks/gateway.py) runs and prints its table and
the issue's targets: a short run, local rows only (the numbers themselves are not judged)."""

from __future__ import annotations

import subprocess
import sys

from .conftest import ROOT, env


def test_the_comparison_benchmark_prints_every_row_shape_and_target() -> None:
    out = subprocess.run([sys.executable, "-m", "benchmarks.gateway", "--no-cluster",
                          "--no-in-process", "--seconds", "0.5", "--peak-seconds", "0.5",
                          "--seq-rate", "20", "--conc-rate", "40"],
                         cwd=ROOT, env=env(), capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    for shape in ("1 in flight, 20/s", "1 in flight, unpaced", "10 concurrent, 40/s",
                  "10 concurrent, unpaced"):
        assert f"-- {shape}" in text, text
    rows = [line.split() for line in text.splitlines()
            if line.startswith("  gateway, file ledger ") and "<=" not in line]
    assert len(rows) == 4, text
    for row in rows:
        calls, errors = int(row[3]), int(row[4])
        assert calls > 0 and errors == 0, row
    for target in ("memory ledger CPU per call <= 1.5x bare", "file ledger CPU per call <= 2x bare",
                   "file ledger p50, 1 in flight, 20/s <= bare p50 + 1 ms + one fsync",
                   "one fsync per batch at 10 concurrent", "gateway RSS <= 90 MB"):
        assert target in text, text
    assert "one fsync on the ledger's folder" in text


def test_the_mcp_door_benchmark_prints_both_doors_in_both_eras() -> None:
    out = subprocess.run([sys.executable, "-m", "benchmarks.mcp_door", "--calls", "20"],
                         cwd=ROOT, env=env(), capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line for line in out.stdout.splitlines()
            if line.startswith(("| JSON-only door", "| streaming door"))]
    assert len(rows) == 4, out.stdout
    assert "handshake era: p50" in out.stdout and "2026-07-28: p50" in out.stdout


def test_the_authenticated_gateway_benchmark_prints_every_row_and_issue_32s_targets() -> None:
    out = subprocess.run([sys.executable, "-m", "benchmarks.gateway_auth", "--seconds", "0.5",
                          "--peak-seconds", "0.5", "--rounds", "2"],
                         cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    for row in ("bare aiohttp proxy", "+ oauth (cached)", "+ oauth + rate limits",
                "file ledger + oauth + limits", "memory, OTLP export, 1 in 10"):
        assert f"  {row} " in text, text
    authenticated = [line.split() for line in text.splitlines()
                     if line.startswith("  file ledger + oauth + limits ")]
    assert len(authenticated) == 2 and all(int(r[-1]) == 0 and float(r[-6]) > 0
                                           for r in authenticated), text  # no refusals
    for target in ("authentication (cached) + rate limit add <= 0.1 ms CPU per call",
                   ">= 1000 authenticated calls/s at 10 concurrent, file ledger",
                   "trace export <= 5% CPU at 200 calls/s", "one Redis round trip (PING"):
        assert target in text, text
    [split] = [line for line in text.splitlines() if "is off the event loop" in line]
    float(split.split("ms is off")[0].split(",")[-1])  # a figure (0.5 s may end before a batch)


def test_the_mcp_rows_print_each_door_beside_the_plain_proxy_with_upstream_requests_per_call() -> None:
    out = subprocess.run([sys.executable, "-m", "benchmarks.gateway_mcp_calls", "--calls", "20",
                          "--concurrency", "4"],
                         cwd=ROOT, env=env(), capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line.split() for line in out.stdout.splitlines()
            if line.startswith(("  plain MCP proxy", "  /mcp, "))]
    assert len(rows) == 6, out.stdout
    for row in rows:
        assert int(row[row.index("flight") + 1]) == 20, row  # every call answered
        assert float(row[-2]) >= 1.0, row  # upstream requests per call: at least the call
    assert "exactly one upstream request per call" in out.stdout
