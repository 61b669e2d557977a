"""Benchmark: the admission webhook under 100 concurrent AdmissionReviews.

    python -m benchmarks.admission -c 100 --rate 500     # needs hey and wrk (Debian)

Starts a control plane with Unwind installed (chart, webhooks on loopback, the operator
under the chart's ServiceAccount), then sends AdmissionReviews straight to the operator's
webhook server over HTTPS, up to ``-c`` at a time on kept-alive connections (as the API
server sends them), and reports latency percentiles side by side with a baseline: the same
requests to the same server's no-op endpoint (TLS, HTTP and JSON, no admission work).
Two loads: ``hey`` paces 100 workers at a fixed total rate (the target's case), and
``wrk`` keeps every connection busy (a closed loop: it finds the throughput ceiling, and
latency there is the length of the queue).
Target (DESIGN.md §10): p99 <= 25 ms at 100 concurrent reviews.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Any

from kubernetes import client, config

from benchmarks.operator_scale import peak_rss_mb
from unwind.controlplane import ControlPlane
from unwind.controlplane.cluster import free_ports
from unwind.controlplane.dev import (
    OPERATOR_NAMESPACE,
    OperatorProcess,
    install_chart,
    install_crds,
    local_values,
    service_account_kubeconfig,
)
from unwind.operator.webhook import NOOP_PATH, TLS_SECRET

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


def drive_hey(url: str, path: str, seconds: int, concurrency: int, rate: float, tmp: Path) -> tuple[float, float, float]:
    """hey (Go): ``concurrency`` workers sending at ``rate`` reviews/s in all (an open,
    paced load, as an API server sends them): p50 ms, p99 ms, reviews/s."""
    (tmp / "body.json").write_text(json.dumps(review()))
    out = subprocess.run(["hey", "-z", f"{seconds}s", "-c", str(concurrency), "-q", f"{rate / concurrency:g}",
                          "-m", "POST", "-T", "application/json", "-D", str(tmp / "body.json"), url + path],
                         capture_output=True, text=True, check=True).stdout
    found = dict(re.findall(r"(\d+)% in ([\d.]+) secs", out))
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    codes = re.findall(r"\[(\d+)\]\s+\d+ responses", out)
    if codes != ["200"] or not rps:
        raise RuntimeError(f"{path}: hey saw other answers than 200:\n{out}")
    return float(found["50"]) * 1000, float(found["99"]) * 1000, float(rps.group(1))


WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = io.open(os.getenv("UNWIND_BENCH_BODY")):read("*a")
done = function(summary, latency, requests)
  io.write(string.format("RESULT %.3f %.3f %d %.3f\\n", latency:percentile(50) / 1000,
    latency:percentile(99) / 1000, summary.requests, summary.duration / 1e6))
end
"""


def drive_wrk(url: str, path: str, seconds: int, concurrency: int, tmp: Path) -> tuple[float, float, float]:
    """wrk (C, two threads) as the load: p50 ms, p99 ms, reviews/s."""
    (tmp / "post.lua").write_text(WRK_SCRIPT)
    (tmp / "body.json").write_text(json.dumps(review()))
    out = subprocess.run(["wrk", "-t2", f"-c{concurrency}", f"-d{seconds}s", "-s", str(tmp / "post.lua"),
                          url + path], capture_output=True, text=True, check=True,
                         env={**os.environ, "UNWIND_BENCH_BODY": str(tmp / "body.json")}).stdout
    line = next(x for x in out.splitlines() if x.startswith("RESULT"))
    p50, p99, n, took = (float(v) for v in line.split()[1:])
    if "Non-2xx" in out:
        raise RuntimeError(f"{path}: wrk saw error answers:\n{out}")
    return p50, p99, n / took


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-c", type=int, default=100, help="concurrent reviews (default 100)")
    parser.add_argument("--rate", type=float, default=500.0, help="hey: reviews per second in all (default 500)")
    parser.add_argument("--seconds", type=int, default=15, help="seconds per endpoint and client (default 15)")
    args = parser.parse_args(argv)
    missing = [tool for tool in ("hey", "wrk") if not shutil.which(tool)]
    if missing:
        print(f"error: this benchmark drives the webhook with hey and wrk: apt-get install {' '.join(missing)}")
        return 2
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
            del ca  # both clients skip verification; the handshake and encryption are real
            results: dict[str, tuple[float, float, float]] = {}
            endpoints = (("baseline: no-op endpoint", NOOP_PATH), ("validate-toolmanifest", "/validate-toolmanifest"),
                         ("stamp-toolmanifest (signs the identity)", "/stamp-toolmanifest"))
            drive_wrk(url, NOOP_PATH, 2, args.c, Path(tmp))  # warm-up
            for name, path in endpoints:
                results[f"paced {name}"] = drive_hey(url, path, args.seconds, args.c, args.rate, Path(tmp))
            for name, path in endpoints:
                results[f"saturated {name}"] = drive_wrk(url, path, args.seconds, args.c, Path(tmp))
            assert op.proc is not None
            rss = peak_rss_mb(op.proc.pid)
        finally:
            op.stop()
            api.close()
    print(f"{args.c} concurrent, kept-alive HTTPS connections, {args.seconds} s per row; paced: hey at "
          f"{args.rate:.0f} reviews/s in all; saturated: wrk, every connection busy (latency is the queue)")
    print(f"{'endpoint':<54}{'p50 ms':>9}{'p99 ms':>9}{'reviews/s':>11}")
    for name, (p50, p99, rate) in results.items():
        print(f"{name:<54}{p50:>9.1f}{p99:>9.1f}{rate:>11.0f}")
    print(f"operator peak RSS (VmHWM): {rss:.0f} MB")
    print("target: p99 <= 25 ms at 100 concurrent reviews")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
