"""Where a gateway call's CPU goes: py-spy samples the gateway (file ledger) under a load of
one call at a time, and prints the share of samples per function.

    .venv/bin/pip install py-spy
    .venv/bin/python -m benchmarks.profile_call [--door rest|mcp] [--seconds 8] [--out FILE]

It starts the upstream and the gateway as ``benchmarks.gateway`` (REST) or
``benchmarks.gateway_mcp_calls`` (MCP) do, drives the door from this process, and runs
``py-spy record --format raw --gil`` on the gateway meanwhile (only samples holding the GIL:
Python running, not waiting on a socket or an fsync). It prints
the functions with the largest inclusive share ("in it or below it") and self share; ``--out``
keeps the collapsed stacks (a flame graph's input).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from . import gateway as rest
from . import gateway_mcp_calls as mcp


def _frames(line: str) -> tuple[list[str], int]:
    stack, _, count = line.rpartition(" ")
    return stack.split(";"), int(count)


def summarise(collapsed: str, top: int = 25) -> str:
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.splitlines():
        if not line.strip():
            continue
        frames, count = _frames(line)
        total += count
        for name in set(frames):
            inclusive[name] += count
        own[frames[-1]] += count
    out = [f"{total} samples"]
    out.append("inclusive (in it or below it):")
    out += [f"  {n * 100 / total:5.1f}%  {name}" for name, n in inclusive.most_common(top)]
    out.append("self:")
    out += [f"  {n * 100 / total:5.1f}%  {name}" for name, n in own.most_common(top)]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--door", choices=("rest", "mcp"), default="rest")
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="unwind-profile-") as tmp:
        try:
            def start(*argv: str) -> tuple[int, subprocess.Popen[bytes]]:
                port = rest._free_port()
                proc = subprocess.Popen([sys.executable, *(a.replace("{port}", str(port))
                                                           for a in argv)], env=rest._env(),
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                procs.append(proc)
                rest._wait(port, proc, 60)
                return port, proc
            manifest = Path(tmp) / "bench.yaml"
            if args.door == "rest":
                up, _ = start("-m", "benchmarks.gateway", "--serve-upstream", "{port}")
                manifest.write_text(rest.MANIFEST.format(port=up))
            else:
                (Path(tmp) / "upstream.py").write_text(mcp.UPSTREAM)
                up, _ = start(str(Path(tmp) / "upstream.py"), "{port}")
                manifest.write_text(mcp.MANIFEST.format(port=up))
            port, gw = start("-m", "unwind.cli.main", "gateway", "--manifests", str(manifest),
                             "--listen", "127.0.0.1:{port}", "--scopes", "bench:write",
                             "--run", "bench-mcp", "--log-level", "warning",
                             "--max-entries-per-run", "0", "--ledger-dir", f"{tmp}/ledger")
            out = Path(tmp) / "stacks.txt"

            def load() -> None:
                if args.door == "rest":
                    rest._paced(f"http://127.0.0.1:{port}{rest.PATH}", 0, args.seconds + 2, 1,
                                "profile")
                else:
                    asyncio.run(mcp._drive(f"http://127.0.0.1:{port}/mcp",
                                           int(200 * (args.seconds + 2)), 1))
            driver = threading.Thread(target=load)
            driver.start()
            subprocess.run([spy, "record", "--pid", str(gw.pid), "--duration",
                            str(int(args.seconds)), "--format", "raw", "--rate", "500",
                            "--output", str(out), "--nonblocking", "--gil", "--function"], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            driver.join()
            collapsed = out.read_text()
            if args.out:
                args.out.write_text(collapsed)
            print(summarise(collapsed))
        finally:
            rest._stop(procs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
