"""Benchmark: a rollback of N steps as Jobs on the local control plane.

    python -m benchmarks.rollback -n 100

Starts a control plane, installs the CRDs and the chart, runs the operator under the
chart's ServiceAccount and the test upstream, applies the example tools, makes N effects
at the upstream (issues and comments) and a ledger recording them, requests the rollback
(as `kubectl unwind rollback` does) and times it until the ledger is RolledBack, while the
kubelet stand-in runs each undo Job's pod as a local `unwind undo-step` process. Reports,
side by side: the baseline (the same N step inputs run as local `unwind undo-step`
processes, as many at once, no API server), Jobs per minute through the operator, and the
operator's RSS. Run from the repository root (the upstream is tests/upstream/server.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from benchmarks.operator_scale import peak_rss_mb, rss_mb
from benchmarks.rollback_world import (
    ROOT,
    Upstream,
    create_ledger,
    effect,
    job_kubelet,
    make_entry,
    tool_resources,
)
from unwind.bundle import BundleError, load_bundle
from unwind.controlplane import ControlPlane
from unwind.controlplane.cluster import free_ports
from unwind.controlplane.dev import (
    OPERATOR_NAMESPACE,
    OperatorProcess,
    install_chart,
    install_crds,
    kubectl,
    local_values,
    service_account_kubeconfig,
)
from unwind.registry.signing import TrustStore

NAMESPACE = "bench-rollback"
LEDGER = "run-bench"


def _bundle(api: client.ApiClient) -> Any:
    core: Any = client.CoreV1Api(api)
    try:
        trust_cm = core.read_namespaced_config_map("unwind-trust", OPERATOR_NAMESPACE)
    except client.ApiException:
        return None  # not written yet
    trust = TrustStore.from_pem_text("\n".join(trust_cm.data.values()))
    cms = core.list_namespaced_config_map(NAMESPACE, label_selector="unwind.dev/bundle")
    try:
        return load_bundle({c.metadata.name: dict(c.data or {}) for c in cms.items}, trust, namespace=NAMESPACE)
    except BundleError:
        return None


def _wait(what: str, check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.25)
    raise SystemExit(f"timed out waiting for {what}")


def _baseline(inputs: list[str], workers: int) -> float:
    """The same steps as local processes, ``workers`` at once (what the kubelet stand-in
    does, without the API server, the Job controller and the operator)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "operator"), "UNWIND_TERMINATION_LOG": os.devnull}
    unwind = str(Path(sys.executable).parent / "unwind")

    def one(text: str) -> int:
        return subprocess.run([unwind, "undo-step"], env={**env, "UNWIND_STEP": text},
                              capture_output=True, check=False).returncode
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        codes = list(pool.map(one, inputs))
    if any(codes):
        print(f"warning: {sum(1 for c in codes if c)} baseline steps failed", file=sys.stderr)
    return time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-n", type=int, default=100, help="steps (entries to undo)")
    parser.add_argument("--parallelism", type=int, default=4, help="undo Jobs at once "
                        "(--rollback-parallelism) and pods the kubelet stand-in runs at once")
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp, ControlPlane(Path(tmp) / "cp", die_with_parent=True) as cp:
        install_crds(cp.kubeconfig)
        webhook_port = free_ports(1)[0]
        install_chart(cp.kubeconfig, local_values(webhook_port))
        sa = service_account_kubeconfig(cp, Path(tmp) / "sa.kubeconfig")
        op = OperatorProcess(sa, Path(tmp) / "operator.log", (
            "--trusted-appliers=admin", "--gateway-image=unwind:bench", "--bundle-window=0.3",
            f"--rollback-parallelism={args.parallelism}"), webhook_port=webhook_port).start()
        upstream = Upstream(Path(tmp) / "upstream.log")
        api = config.new_client_from_config(config_file=str(cp.kubeconfig))  # type: ignore[no-untyped-call]
        try:
            kubectl(cp.kubeconfig, "create", "namespace", NAMESPACE)
            _wait("the default ServiceAccount", lambda: client.CoreV1Api(api).list_namespaced_service_account(
                NAMESPACE, field_selector="metadata.name=default").items, 60)
            path = Path(tmp) / "tools.yaml"
            resources = tool_resources(upstream.url)
            path.write_text(yaml.safe_dump_all(resources))
            kubectl(cp.kubeconfig, "-n", NAMESPACE, "apply", "-f", str(path))
            bundle = _wait("the tools enforced", lambda: (b := _bundle(api)) and len(b.manifests) == len(resources)
                           and b, 120)
            entries = []
            for i in range(args.n):
                if i % 2:
                    tool, call = "github.create_comment", {"repo": "octo/bench", "issue": i, "client_id": f"c{i}", "body": "x"}
                else:
                    tool, call = "github.create_issue", {"repo": "octo/bench", "title": f"issue {i}"}
                answer = effect(upstream, tool, call)
                entries.append(make_entry(bundle.manifests[tool], bundle.checksums[tool], f"e-{i:04d}", i + 1,
                                          call, answer))
            create_ledger(api, NAMESPACE, LEDGER, entries)
            assert op.proc is not None
            idle = rss_mb(op.proc.pid)
            custom: Any = client.CustomObjectsApi(api)
            with job_kubelet(api, NAMESPACE, workers=args.parallelism):
                t0 = time.monotonic()
                custom.patch_namespaced_custom_object("unwind.dev", "v1alpha1", NAMESPACE, "effectledgers", LEDGER,
                                                      {"spec": {"rollback": {"requested": True, "reason": "bench"}}})
                obj = _wait("the rollback", lambda: (o := custom.get_namespaced_custom_object(
                    "unwind.dev", "v1alpha1", NAMESPACE, "effectledgers", LEDGER))
                    and (o.get("status") or {}).get("rollback", {}).get("finished") and o, args.timeout)
                took = time.monotonic() - t0
            rss, peak = rss_mb(op.proc.pid), peak_rss_mb(op.proc.pid)
            rolled = {c["type"]: c for c in obj["status"].get("conditions") or []}.get("RolledBack", {})
            steps = obj["status"]["rollback"]["steps"]
            batch: Any = client.BatchV1Api(api)
            jobs = batch.list_namespaced_job(NAMESPACE, label_selector=f"unwind.dev/ledger={LEDGER}").items
            inputs = [str(next(e.value for e in j.spec.template.spec.containers[0].env if e.name == "UNWIND_STEP"))
                      for j in jobs]
            baseline = _baseline(inputs, args.parallelism)
            undone = sum(1 for s in steps if s.get("outcome") == "undone")
        finally:
            upstream.stop()
            op.stop()
            api.close()
    print(f"{'measure':<62}{'value':>14}")
    print(f"{'baseline: the N steps as local unwind undo-step processes':<62}{baseline:>12.1f} s")
    print(f"{'rollback requested -> ledger RolledBack (N Jobs)':<62}{took:>12.1f} s")
    print(f"{'Jobs per minute':<62}{len(jobs) / took * 60:>14.1f}")
    print(f"{'baseline: steps per minute as local processes':<62}{len(inputs) / baseline * 60:>14.1f}")
    print(f"{'operator RSS before the rollback':<62}{idle:>11.0f} MB")
    print(f"{'operator RSS after it / peak (VmHWM)':<62}{f'{rss:.0f} / {peak:.0f}':>11} MB")
    print(f"N = {args.n}, parallelism {args.parallelism}, steps undone {undone}, Jobs {len(jobs)}, "
          f"RolledBack={rolled.get('status')} ({rolled.get('reason')})")
    print(json.dumps({"n": args.n, "seconds": round(took, 1), "baseline_seconds": round(baseline, 1),
                      "rss_mb": round(rss), "peak_rss_mb": round(peak)}))
    return 0 if rolled.get("status") == "True" else 1


if __name__ == "__main__":
    raise SystemExit(main())
