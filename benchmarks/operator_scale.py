"""Benchmark: 1000 ToolManifests applied at once on the local control plane.

    python -m benchmarks.operator_scale -n 1000

Starts a control plane, installs the CRDs and the chart, runs the operator under the
chart's ServiceAccount, then `kubectl apply`s N manifests in one file and reports, side by
side: the baseline (how long kubectl apply itself takes: the API server storing N objects),
the time from the start of the apply until the namespace bundle holds all N verified tools,
the number of bundle ConfigMap writes (from the operator's metrics), and the operator's
peak RSS (VmHWM). Then ``--ledgers L`` EffectLedgers (``--entries E`` entries each, as the
gateway writes them) are created and the operator's rollback loop makes a full pass over
them (lookups and retention, every ``--lookup-interval``): the RSS target counts them too.
Targets (DESIGN.md §10): converge <= 30 s, <= 10 writes, RSS <= 150 MB with 1000 manifests
and 1000 ledgers.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from unwind.bundle import BundleError, data_size, load_bundle
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
from unwind.ledger.clusterstore import compact_entry
from unwind.ledger.entry import Entry, Times
from unwind.registry.signing import TrustStore

NAMESPACE = "bench"


def manifests(n: int, description: int = 0) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for i in range(n):
        kind = i % 3
        spec: dict[str, object]
        base = i - kind
        if kind == 0:
            spec = {"tool": f"svc{base}.get", "effect": "read_only", "permission": f"svc{base}:read"}
        elif kind == 1:
            spec = {"tool": f"svc{base}.undo", "effect": "idempotent", "permission": f"svc{base}:write",
                    "owner": ["team"]}
        else:
            spec = {"tool": f"svc{base}.create", "effect": "compensable", "permission": f"svc{base}:write",
                    "owner": ["team"], "idempotency": {"key": "c-{{args.id}}"},
                    "compensation": {"tool": f"svc{base}.undo", "argument_map": {"id": "$result.id"},
                                     "verification": {"tool": f"svc{base}.get",
                                                      "arguments": {"id": "$result.id"},
                                                      "expect": {"state": "undone"}}}}
        if description:
            spec["description"] = ("Does one thing of service " + str(base) + ". ").ljust(description, "x")
        out.append({"apiVersion": "unwind.dev/v1alpha1", "kind": "ToolManifest",
                    "metadata": {"name": f"m{i:05d}", "namespace": NAMESPACE}, "spec": spec})
    return out


def ledger_body(n: int, entries: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """An EffectLedger of one finished run and the status the gateway would have written."""
    when = "2026-11-30T10:00:00.000Z"
    rows = [compact_entry(Entry(
        id=f"e-{j}", seq=j + 1, tool=f"svc{3 * (j % 300)}.create", checksum=f"{j:064x}", effect="compensable",
        key=f"c-{n}-{j}", scope="global", actor=f"system:serviceaccount:{NAMESPACE}:agent", state="succeeded",
        handle={"args": {"id": f"{n}-{j}"}, "result": {"id": f"{n}-{j}"}},
        times=Times(requested=when, started=when, finished=when)).to_json()) for j in range(entries)]
    body = {"apiVersion": "unwind.dev/v1alpha1", "kind": "EffectLedger",
            "metadata": {"name": f"run-{n:05d}"}, "spec": {"run": f"run-{n:05d}"}}
    return body, {"entries": rows, "entryCount": len(rows), "lastState": "succeeded"}


def create_ledgers(api: client.ApiClient, count: int, entries: int) -> float:
    """Create ``count`` ledgers with their entries (status subresource); seconds taken."""
    custom: Any = client.CustomObjectsApi(api)
    t0 = time.monotonic()
    for n in range(count):
        body, status = ledger_body(n, entries)
        obj = custom.create_namespaced_custom_object("unwind.dev", "v1alpha1", NAMESPACE, "effectledgers", body)
        obj["status"] = status
        custom.replace_namespaced_custom_object_status("unwind.dev", "v1alpha1", NAMESPACE, "effectledgers",
                                                       body["metadata"]["name"], obj)
    return time.monotonic() - t0


def bundle_configmaps(api: client.ApiClient) -> dict[str, dict[str, str]]:
    core: Any = client.CoreV1Api(api)
    cms = core.list_namespaced_config_map(NAMESPACE, label_selector="unwind.dev/bundle")
    return {c.metadata.name: dict(c.data or {}) for c in cms.items}


def bundle_tools(api: client.ApiClient) -> int:
    core: Any = client.CoreV1Api(api)
    trust_cm = core.read_namespaced_config_map("unwind-trust", OPERATOR_NAMESPACE)
    trust = TrustStore.from_pem_text("\n".join(trust_cm.data.values()))
    try:
        return len(load_bundle(bundle_configmaps(api), trust, namespace=NAMESPACE).manifests)
    except BundleError:
        return 0


def metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and f'namespace="{NAMESPACE}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def peak_rss_mb(pid: int, field: str = "VmHWM") -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(rf"{field}:\s+(\d+) kB", status)
    return int(match.group(1)) / 1024 if match else float("nan")


def rss_mb(pid: int) -> float:
    return peak_rss_mb(pid, "VmRSS")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-n", type=int, default=1000)
    parser.add_argument("--description", type=int, default=0, metavar="BYTES",
                        help="give every manifest a description this long (e.g. 400)")
    parser.add_argument("--ledgers", type=int, default=1000, help="EffectLedgers created after the apply")
    parser.add_argument("--entries", type=int, default=10, help="entries per ledger")
    parser.add_argument("--lookup-interval", type=float, default=10,
                        help="the operator's --lookup-interval: a full pass over the ledgers this often")
    parser.add_argument("--timeout", type=float, default=120)
    parser.add_argument("--operator-arg", dest="operator_args", action="append", default=[],
                        help="extra argument for `unwind operator` (repeatable), e.g. --bundle-window=5")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp, ControlPlane(Path(tmp) / "cp", die_with_parent=True) as cp:
        install_crds(cp.kubeconfig)
        metrics_port, webhook_port = free_ports(2)
        install_chart(cp.kubeconfig, local_values(webhook_port))
        sa = service_account_kubeconfig(cp, Path(tmp) / "sa.kubeconfig")
        op = OperatorProcess(sa, Path(tmp) / "operator.log",
                             (f"--metrics-port={metrics_port}", "--trusted-appliers=admin",
                              f"--lookup-interval={args.lookup_interval}", *args.operator_args),
                             webhook_port=webhook_port).start()
        api = config.new_client_from_config(config_file=str(cp.kubeconfig))  # type: ignore[no-untyped-call]
        try:
            kubectl(cp.kubeconfig, "create", "namespace", NAMESPACE)
            path = Path(tmp) / "manifests.yaml"
            path.write_text(yaml.safe_dump_all(manifests(args.n, args.description)))
            assert op.proc is not None
            idle = rss_mb(op.proc.pid)
            t0 = time.monotonic()
            subprocess.run(["kubectl", f"--kubeconfig={cp.kubeconfig}", "apply", "-f", str(path)],
                           check=True, capture_output=True)
            applied = time.monotonic() - t0
            converged = None
            while time.monotonic() - t0 < args.timeout:
                if bundle_tools(api) == args.n:
                    converged = time.monotonic() - t0
                    break
                time.sleep(0.25)
            if converged is None:
                print(op.log.read_text()[-4000:])
            time.sleep(3)  # let any trailing reconcile run, so its writes are counted
            writes = metric(metrics_port, "unwind_bundle_writes_total")
            final = bundle_configmaps(api)
            size = sum(data_size(d) for d in final.values())
            assert op.proc is not None
            rss = peak_rss_mb(op.proc.pid)
            made = create_ledgers(api, args.ledgers, args.entries)
            time.sleep(2 * args.lookup_interval + 2)  # at least one full pass over every ledger
            checked = metric(metrics_port, "unwind_ledgers_checked_total")
            rss_ledgers = peak_rss_mb(op.proc.pid)
        finally:
            op.stop()
            api.close()
    print(f"{'measure':<58}{'value':>12}{'target':>10}")
    print(f"{'baseline: kubectl apply of N manifests (API server only)':<58}{applied:>10.1f} s")
    print(f"{'apply start -> bundle holds all N verified tools':<58}"
          f"{(f'{converged:.1f} s' if converged else 'timeout'):>12}{'<= 30 s':>10}")
    print(f"{'bundle ConfigMap writes':<58}{writes:>12.0f}{'<= 10':>10}")
    print(f"{'bundle size (data bytes, all ConfigMaps)':<58}{size:>12}")
    print(f"{'bundle ConfigMaps (the index and its shards)':<58}{len(final):>12}")
    print(f"{'baseline: operator RSS idle, before the apply':<58}{idle:>9.0f} MB")
    print(f"{'operator peak RSS (VmHWM) with the N manifests':<58}{rss:>9.0f} MB{'<= 150 MB':>10}")
    print(f"{f'creating {args.ledgers} ledgers of {args.entries} entries':<58}{made:>10.1f} s")
    print(f"{'operator peak RSS (VmHWM) with the manifests and ledgers':<58}{rss_ledgers:>9.0f} MB{'<= 150 MB':>10}")
    print(f"N = {args.n}; ledgers checked by the rollback loop: {checked:.0f}")
    return 0 if converged else 1


if __name__ == "__main__":
    raise SystemExit(main())
