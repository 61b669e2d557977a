"""The kubelet stand-in as a node (operator/unwind/controlplane/node.py) on the local
control plane: which pods it runs, how a pod with the gateway sidecar ends, and what it does
with pods an earlier node process left Running."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from cluster_helpers import wait_for
from kubernetes import client

from unwind.controlplane.node import Node

SIDECAR = "unwind-gateway"


def pod(name: str, containers: list[dict[str, Any]], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}},
            "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False, "containers": containers,
                     "volumes": [{"name": "tmp", "emptyDir": {}}]}}


def container(name: str, *command: str) -> dict[str, Any]:
    return {"name": name, "image": "x", "command": list(command),
            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]}


def phase(core: Any, namespace: str, name: str) -> str:
    return str(core.read_namespaced_pod(name, namespace).status.phase)


def test_a_pod_with_the_sidecar_succeeds_when_its_agent_does_and_a_path_under_a_mount_is_left_alone(
        k8s_api: client.ApiClient, namespace: str, tmp_path: Path) -> None:
    # tmp_path is under /tmp, which both containers mount: the node's PATH is this
    # machine's and must not be rewritten into the emptyDir (a clone in /tmp once broke so)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "hello").write_text("#!/bin/sh\necho hello from $0\n")
    (bin_dir / "hello").chmod(0o755)
    core = client.CoreV1Api(k8s_api)
    core.create_namespaced_pod(namespace, pod("agent", [container("agent", "hello"),
                                                        container(SIDECAR, "sleep", "600")]))
    core.create_namespaced_pod(namespace, pod("other", [container("main", "true")]))
    with Node(k8s_api, namespace=namespace, logs=tmp_path / "logs", path=f"{bin_dir}:/usr/bin:/bin") as node:
        done = wait_for("the agent pod ended", lambda: phase(core, namespace, "agent") in ("Succeeded", "Failed")
                        and phase(core, namespace, "agent"), timeout=60)
        assert done == "Succeeded", (tmp_path / "logs" / namespace / "agent" / "agent.log").read_text()
        assert (tmp_path / "logs" / namespace / "agent" / "agent.log").read_text() == f"hello from {bin_dir}/hello\n"
        time.sleep(1.5)  # several ticks: the pod without the sidecar or a ledger label is not ours
        assert phase(core, namespace, "other") == "Pending"
        assert len(node.results) == 1
    statuses = {s.name: s.state.terminated for s in core.read_namespaced_pod("agent", namespace).status.container_statuses}
    assert statuses["agent"].exit_code == 0
    assert statuses[SIDECAR].exit_code != 0  # stopped by the node, yet the pod succeeded


def test_an_undo_job_pod_left_running_by_an_earlier_node_fails_when_a_node_starts(
        k8s_api: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(k8s_api)
    core.create_namespaced_pod(namespace, pod("step", [container("undo-step", "sleep", "600")],
                                              {"unwind.dev/ledger": "run-1"}))
    core.patch_namespaced_pod_status("step", namespace, {"status": {"phase": "Running"}})
    with Node(k8s_api, namespace=namespace):
        wait_for("the orphan failed", lambda: phase(core, namespace, "step") == "Failed", timeout=30)
    assert core.read_namespaced_pod("step", namespace).status.reason == "NodeRestarted"


def test_a_pod_deleted_while_it_runs_is_stopped(k8s_api: client.ApiClient, namespace: str, tmp_path: Path) -> None:
    core = client.CoreV1Api(k8s_api)
    marker = tmp_path / "alive"
    core.create_namespaced_pod(namespace, pod("long", [container(
        "undo-step", "sh", "-c", f"while true; do date > {marker}; sleep 0.2; done")], {"unwind.dev/ledger": "run-1"}))
    with Node(k8s_api, namespace=namespace) as node:
        wait_for("the pod runs", lambda: marker.exists(), timeout=30)
        core.delete_namespaced_pod("long", namespace, grace_period_seconds=0)
        wait_for("the node gave up the pod", lambda: node.results, timeout=30)
        assert isinstance(node.results[0], RuntimeError)
        before = marker.read_text()
        time.sleep(1)
        assert marker.read_text() == before  # the process is gone
