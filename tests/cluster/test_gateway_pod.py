"""End to end on the local control plane: a pod labelled unwind.dev/inject=true is admitted
with the gateway sidecar, and run by the kubelet stand-in exactly as admitted. The agent's
container calls the gateway; the entry is in the run's EffectLedger; the agent finds no
token and no upstream secret of its own."""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from gateway_fixtures import AGENT, prepare_namespace
from kubernetes import client

from gateway.conftest import ROOT, SCOPES, UpstreamProc, running_upstream
from unwind.controlplane import ControlPlane
from unwind.controlplane.dev import OperatorProcess
from unwind.controlplane.kubelet import PodRunner
from unwind.operator.inject import CONTAINER

AGENT_SCRIPT = r"""
import json, os, sys, time, urllib.request
base = "http://127.0.0.1:8787"
deadline = time.time() + 60
while time.time() < deadline:
    try:
        if urllib.request.urlopen(base + "/readyz", timeout=2).status == 200:
            break
    except OSError:
        time.sleep(0.3)
body = json.dumps({"arguments": {"amount": 2500, "order_id": "o-77", "card_token": "tok_visa"}}).encode()
req = urllib.request.Request(base + "/call/test.charge", data=body, method="POST",
                             headers={"Content-Type": "application/json", "Idempotency-Key": "e-pod-1"})
answer = urllib.request.urlopen(req, timeout=30)
report = json.loads(answer.headers["X-Unwind-Effect"])
print("CALL", answer.status, report["class"], report["ledger"]["name"], report["ledger"]["entry"])
token = "/var/run/secrets/kubernetes.io/serviceaccount/token"
print("TOKEN", "present" if os.path.exists(token) else "absent")
print("SECRETS", sorted(os.listdir("/etc/unwind/secrets")) if os.path.isdir("/etc/unwind/secrets") else "absent")
"""


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpstreamProc]:
    with running_upstream(tmp_path_factory.mktemp("upstream")) as up:
        yield up


def test_an_injected_pod_calls_through_its_gateway_into_the_ledger_and_its_agent_holds_no_credentials(
        operator: OperatorProcess, control_plane: ControlPlane, k8s_api: client.ApiClient,
        upstream: UpstreamProc, tmp_path: Path) -> None:
    core = client.CoreV1Api(k8s_api)
    namespace = f"pod-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": namespace}})
    try:
        prepare_namespace(k8s_api, control_plane.kubeconfig, namespace, upstream.url)
        core.patch_namespaced_service_account(AGENT, namespace, {"metadata": {"annotations": {
            "unwind.dev/scopes": SCOPES}}})
        pod = core.create_namespaced_pod(namespace, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "agent-run-7", "labels": {"unwind.dev/inject": "true"}},
            "spec": {"serviceAccountName": AGENT, "restartPolicy": "Never",
                     "containers": [{"name": "agent", "image": "agent:1",
                                     "command": [sys.executable, "-c", AGENT_SCRIPT]}]}})
        assert [c.name for c in pod.spec.containers] == ["agent"]
        assert [(c.name, c.restart_policy) for c in pod.spec.init_containers] == [(CONTAINER, "Always")]
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        with PodRunner(k8s_api, namespace, "agent-run-7", path=path,
                       extra_env={"PYTHONPATH": str(ROOT / "operator")}) as runner:
            code = runner.wait("agent", 90)
            out = runner.output("agent")
            assert code == 0, out + runner.output(CONTAINER)
        assert "CALL 200 compensable agent-run-7 e-pod-1" in out
        assert "TOKEN absent" in out and "SECRETS absent" in out
        ledger = client.CustomObjectsApi(k8s_api).get_namespaced_custom_object(
            "unwind.dev", "v1alpha1", namespace, "effectledgers", "agent-run-7")
        entry = next(e for e in ledger["status"]["entries"] if e["id"] == "e-pod-1")
        assert entry["state"] == "succeeded"
        assert entry["actor"] == f"system:serviceaccount:{namespace}:{AGENT}"
        assert "tok_visa" not in json.dumps(ledger)  # only referenced values, redaction applied
        assert upstream.count("charges.create") == 1
    finally:
        core.delete_namespace(namespace)
