"""`unwind dev up` after `unwind dev down` resumes the stopped cluster with what was applied.

The cluster test starts its own dev cluster in a temporary folder (not the session's
control plane), the way a user runs `unwind dev up`, `down` and `up` again in one folder.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from unwind.controlplane import BuildError, ControlPlaneError, ensure_binaries, kubenode, nodeclean
from unwind.controlplane.certs import write_pki
from unwind.controlplane.cluster import VERSIONS_FILE, control_plane_version, running_in_dir
from unwind.controlplane.dev import (
    DAEMONS,
    OPERATOR_DEPLOYMENT,
    OPERATOR_NAMESPACE,
    Start,
    chart_action,
    daemon_pid,
    down,
    kubectl,
    resume_or_clean,
    running,
    up,
)
from unwind.controlplane.procs import pid_alive

NAMESPACE = "shop"


def manifest(tool: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "unwind.dev/v1alpha1", "kind": "ToolManifest",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"tool": tool, "effect": "read_only", "permission": "shop:read"}}


def apply(kubeconfig: Path, *objs: dict[str, Any]) -> None:
    kubectl(kubeconfig, "apply", "-f", "-", input_text=yaml.safe_dump_all(objs))


def wait_ready(kubeconfig: Path, *names: str) -> None:
    kubectl(kubeconfig, "-n", NAMESPACE, "wait", "--for=condition=Ready", "--timeout=90s",
            *(f"toolmanifest/{n}" for n in names))


def tool_manifests(kubeconfig: Path) -> list[str]:
    out = kubectl(kubeconfig, "-n", NAMESPACE, "get", "toolmanifests", "-o", "name")
    return sorted(out.split())


@pytest.fixture
def dev_dir(tmp_path: Path) -> Iterator[Path]:
    try:
        ensure_binaries()
    except (BuildError, OSError) as exc:
        reason = f"control-plane binaries unavailable: {exc}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    workdir = tmp_path / "dev"
    try:
        yield workdir
    finally:
        down(workdir)


def test_up_after_down_resumes_the_cluster_with_the_manifests_that_were_applied(
        dev_dir: Path) -> None:
    first = up(dev_dir)
    assert first.start == Start(False, "there was no earlier cluster")
    assert first.chart == "install"
    kubeconfig = first.control_plane.kubeconfig
    apply(kubeconfig, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
          manifest("shop.get_order", "shop.get-order"))
    wait_ready(kubeconfig, "shop.get-order")

    with pytest.raises(ControlPlaneError, match=r"already running in .*unwind dev down"):
        up(dev_dir)
    daemons = {stem: daemon_pid(dev_dir, stem) for stem in DAEMONS}
    components = running_in_dir(dev_dir / "cluster")
    assert {"containerd", "kubelet", "kube-scheduler", "kube-proxy"} <= set(components), components
    assert bool(daemons["upstream"]) == first.upstream  # not started when port 8788 is taken
    assert daemons["exchange"]  # the relay to the operator's token exchange: pods need it to start
    assert down(dev_dir)
    assert not running_in_dir(dev_dir / "cluster")
    assert not [stem for stem, pid in {**daemons, **components}.items() if pid and pid_alive(pid)]
    assert running(dev_dir) is None
    assert nodeclean.kube_chains() == [] and not kubenode.bridge_exists()  # down cleaned the host

    second = up(dev_dir)
    assert second.start.resume, second.start
    assert second.chart == "upgrade"
    assert second.control_plane.kubeconfig == kubeconfig
    assert tool_manifests(kubeconfig) == ["toolmanifest.unwind.dev/shop.get-order"]
    # the operator works again under its (kept) ServiceAccount token: a new manifest settles
    apply(kubeconfig, manifest("shop.list_orders", "shop.list-orders"))
    wait_ready(kubeconfig, "shop.get-order", "shop.list-orders")
    assert down(dev_dir)

    third = up(dev_dir, clean=True)
    assert not third.start.resume
    assert third.chart == "install"
    out = kubectl(kubeconfig, "get", "namespace", NAMESPACE, check=False)
    assert out == ""


def test_down_after_up_and_a_scale_leaves_no_process_and_no_network_namespace_of_the_cluster(
        dev_dir: Path) -> None:
    started = up(dev_dir)
    kubeconfig, dirs = started.control_plane.kubeconfig, started.control_plane.node_dirs
    kubectl(kubeconfig, "-n", OPERATOR_NAMESPACE, "scale", f"deployment/{OPERATOR_DEPLOYMENT}", "--replicas=3")
    kubectl(kubeconfig, "-n", OPERATOR_NAMESPACE, "rollout", "status", f"deployment/{OPERATOR_DEPLOYMENT}",
            "--timeout=180s", timeout=200)
    containers = nodeclean.cgroup_pids(nodeclean.container_cgroups(nodeclean.container_ids(dirs)))
    # three replicas, each a pause process and the operator: all in containers of this node
    assert len(containers) >= 6, containers
    # their network namespaces (others on the machine, e.g. left by an older `down`, are not ours)
    ours = nodeclean.netns_of(containers)
    assert len(ours) >= 3, ours
    components = running_in_dir(dev_dir / "cluster")
    assert down(dev_dir)
    assert [pid for pid in [*containers, *components.values()] if pid_alive(pid)] == []
    assert set(nodeclean.pod_netns()) & ours == set()
    assert nodeclean.leftovers(dirs) == []
    assert not down(dev_dir)  # and a second down finds nothing, because nothing is there


def test_a_stale_state_file_whose_processes_are_dead_does_not_block_up(tmp_path: Path) -> None:
    dead = subprocess.Popen(["sleep", "0"])
    dead.wait()
    assert not pid_alive(dead.pid)
    cluster = tmp_path / "cluster"
    cluster.mkdir()
    (cluster / "state.json").write_text(f'{{"pids": {{"etcd": {dead.pid}}}}}')
    (tmp_path / "operator.pid").write_text(str(dead.pid))
    assert resume_or_clean(tmp_path) == Start(False, "there was no earlier cluster")
    assert not (cluster / "state.json").exists()
    assert not (tmp_path / "operator.pid").exists()


def test_up_refuses_while_a_process_of_the_folder_still_runs(tmp_path: Path) -> None:
    # a process whose command line is that of the folder's etcd, as the pid check reads it
    fake = tmp_path / "etcd"
    fake.symlink_to(os.path.realpath(sys.executable))
    cluster = tmp_path / "cluster"
    cluster.mkdir()
    proc = subprocess.Popen([str(fake), "-c", "import time; time.sleep(30)", str(cluster.resolve())])
    try:
        (cluster / "state.json").write_text(f'{{"pids": {{"etcd": {proc.pid}}}}}')
        with pytest.raises(ControlPlaneError, match=rf"etcd \(pid {proc.pid}\).*unwind dev down"):
            resume_or_clean(tmp_path)
        assert (cluster / "state.json").exists()
    finally:
        proc.kill()
        proc.wait()


def write_expired_ca(pki: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "old")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(1)
            .not_valid_before(now - dt.timedelta(days=400))
            .not_valid_after(now - dt.timedelta(days=35)).sign(key, hashes.SHA256()))
    pem = cert.public_bytes(serialization.Encoding.PEM)
    for name_ in ("ca.crt", "apiserver.crt"):
        (pki / name_).write_bytes(pem)
    for name_ in ("ca.key", "apiserver.key", "sa.key", "sa.pub", "apiserver-kubelet-client.crt",
                  "apiserver-kubelet-client.key"):
        (pki / name_).write_text("key")


def test_a_stopped_cluster_whose_keys_expired_is_started_clean(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster"
    (cluster / "etcd" / "member").mkdir(parents=True)
    (cluster / "pki").mkdir()
    write_expired_ca(cluster / "pki")
    (cluster / VERSIONS_FILE).write_text(json.dumps({"kubernetes": control_plane_version()}))
    start = resume_or_clean(tmp_path)
    assert not start.resume
    assert "ca.crt expires on" in start.why
    assert not cluster.exists()


def test_a_stopped_cluster_is_resumed_and_clean_wipes_it(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster"
    (cluster / "etcd" / "member").mkdir(parents=True)
    write_pki(cluster / "pki", (kubenode.NODE_ADDRESS,))
    (cluster / VERSIONS_FILE).write_text(json.dumps({"kubernetes": control_plane_version()}))
    assert resume_or_clean(tmp_path).resume
    assert (cluster / "etcd" / "member").is_dir()
    start = resume_or_clean(tmp_path, clean=True)
    assert start == Start(False, "--clean deletes the stopped cluster's data")
    assert not cluster.exists()


@pytest.mark.parametrize("recorded", [None, "1.36.3"], ids=["the 1.20 cluster, unrecorded", "another release"])
def test_a_stopped_cluster_of_another_kubernetes_release_is_started_clean(tmp_path: Path, recorded: str | None) -> None:
    cluster = tmp_path / "cluster"
    (cluster / "etcd" / "member").mkdir(parents=True)
    write_pki(cluster / "pki", (kubenode.NODE_ADDRESS,))
    if recorded:
        (cluster / VERSIONS_FILE).write_text(json.dumps({"kubernetes": recorded}))
    start = resume_or_clean(tmp_path)
    assert not start.resume and not cluster.exists()
    assert start.why == (f"the stopped cluster was made by Kubernetes {recorded or '1.20.2 or unknown'} and this "
                         f"is {control_plane_version()}: its etcd data cannot be carried over")


def test_a_stopped_cluster_whose_serving_certificate_lacks_the_nodes_address_is_started_clean(
        tmp_path: Path) -> None:
    cluster = tmp_path / "cluster"
    (cluster / "etcd" / "member").mkdir(parents=True)
    write_pki(cluster / "pki")  # made before the node: loopback only
    (cluster / VERSIONS_FILE).write_text(json.dumps({"kubernetes": control_plane_version()}))
    start = resume_or_clean(tmp_path)
    assert not start.resume
    assert f"apiserver.crt is not valid for {kubenode.NODE_ADDRESS}" in start.why


@pytest.mark.parametrize(("statuses", "action"), [
    ([], "install"),
    (["deployed"], "upgrade"),
    (["superseded", "failed"], "upgrade"),
    (["pending-install"], "reinstall"),
    (["uninstalled"], "reinstall"),
    (["deployed", "pending-upgrade"], "recover"),
    (["superseded", "deployed", "pending-rollback"], "recover"),
])
def test_the_chart_is_installed_or_upgraded_by_what_the_release_history_says(
        statuses: list[str], action: str) -> None:
    history = [{"revision": i + 1, "status": s} for i, s in enumerate(statuses)]
    assert chart_action(list(reversed(history))) == action
