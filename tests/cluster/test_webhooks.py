"""The admission webhooks under failure: a second replica takes over when the leader is
killed while the webhooks keep answering, and the serving certificate renews in place."""

from __future__ import annotations

import base64
import datetime as dt
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from cluster_helpers import READ, apply, enforced, tm, wait_for
from kubernetes import client

from unwind.controlplane import ControlPlane
from unwind.controlplane.dev import OPERATOR_NAMESPACE, OperatorProcess


class Probe(threading.Thread):
    """Dry-run applies in a loop (each one calls both ToolManifest webhooks); counts refusals."""

    def __init__(self, kubeconfig: Path, namespace: str) -> None:
        super().__init__(daemon=True)
        self.kubeconfig, self.namespace = kubeconfig, namespace
        self.ok, self.failures = 0, []  # type: tuple[int, list[str]]
        self.stopping = threading.Event()

    def run(self) -> None:
        body = yaml.safe_dump(tm("probe", {**READ, "tool": "shop.probe"}))
        while not self.stopping.is_set():
            proc = subprocess.run(["kubectl", f"--kubeconfig={self.kubeconfig}", "-n", self.namespace, "apply",
                                   "--dry-run=server", "-f", "-"], input=body, capture_output=True, text=True,
                                  timeout=30)
            if proc.returncode == 0:
                self.ok += 1
            else:
                self.failures.append(proc.stderr.strip())
            time.sleep(0.2)

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)


def served_certificate(port: int) -> bytes:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock, ctx.wrap_socket(sock) as tls:
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        return der


def test_killing_the_leader_hands_reconciling_to_the_other_replica_while_the_webhooks_answer(
        operator: OperatorProcess, control_plane: ControlPlane, k8s_api: client.ApiClient, namespace: str,
        tmp_path: Path) -> None:
    args = tuple(a for a in operator.args if not a.startswith("--metrics-port"))
    second = OperatorProcess(operator.kubeconfig, tmp_path / "second.log", args,
                             webhook_port=operator.webhook_port,
                             exchange_port=operator.exchange_port).start()
    try:
        apply(control_plane.kubeconfig, namespace, tm("read", READ))
        wait_for("published by the leader", lambda: enforced(k8s_api, namespace) == {"shop.get_order": 1})
        operator.stop(sig=9)  # the leader: started first, it holds the Lease
        killed = time.monotonic()
        probe = Probe(control_plane.kubeconfig, namespace)
        probe.start()
        apply(control_plane.kubeconfig, namespace, tm("list", {**READ, "tool": "shop.list_orders"}))
        wait_for("published by the new leader", lambda: "shop.list_orders" in enforced(k8s_api, namespace),
                 timeout=30)
        took = time.monotonic() - killed
        probe.stop()
        lease = client.CoordinationV1Api(k8s_api).read_namespaced_lease("unwind-operator", OPERATOR_NAMESPACE)
        assert second.proc is not None and lease.spec.holder_identity.endswith(f"-{second.proc.pid}")
        assert took < 6 + 2 + 5  # lease duration, one retry, reconcile time
        assert probe.failures == [] and probe.ok > 5
    finally:
        second.stop()
        operator.start()


def test_the_serving_certificate_renews_in_place_without_a_refused_request(
        operator: OperatorProcess, control_plane: ControlPlane, k8s_api: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(k8s_api)

    def stored() -> str:
        return base64.b64decode(core.read_namespaced_secret("unwind-webhook-tls", OPERATOR_NAMESPACE)
                                .data["tls.crt"]).decode()

    first, served = stored(), served_certificate(operator.webhook_port)
    probe = Probe(control_plane.kubeconfig, namespace)
    probe.start()
    try:
        wait_for("a renewed certificate", lambda: stored() != first, timeout=40)
        wait_for("the new certificate served", lambda: served_certificate(operator.webhook_port) != served)
        # a few more reviews on the new certificate (the renewal may come before five did:
        # seen when the test started just before it)
        counted = probe.ok
        wait_for("reviews after the renewal", lambda: probe.ok >= max(6, counted + 3), timeout=30)
    finally:
        probe.stop()
    assert probe.failures == [] and probe.ok > 5


def test_an_operator_given_the_api_servers_client_ca_answers_the_api_server_and_no_one_else(
        operator: OperatorProcess, control_plane: ControlPlane, k8s_api: client.ApiClient, namespace: str,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from unwind.operator.certs import issue, new_ca

    operator.stop()
    monkeypatch.setenv("UNWIND_WEBHOOK_CLIENT_CA", str(control_plane.webhook_client_ca))
    monkeypatch.setenv("UNWIND_WEBHOOK_CLIENT_NAMES", "kube-apiserver-webhook-client")
    guarded = OperatorProcess(operator.kubeconfig, tmp_path / "guarded.log", operator.args,
                              webhook_port=operator.webhook_port,
                             exchange_port=operator.exchange_port).start()
    try:
        # the API server presents its webhook client certificate: applies are stamped
        apply(control_plane.kubeconfig, namespace, tm("read", READ))
        wait_for("published", lambda: enforced(k8s_api, namespace) == {"shop.get_order": 1})
        obj = client.CustomObjectsApi(k8s_api).get_namespaced_custom_object(
            "unwind.dev", "v1alpha1", namespace, "toolmanifests", "read")
        assert obj["metadata"]["annotations"]["unwind.dev/applied-by"] == "admin"
        # a pod that reaches the port with a made-up review gets no stamp, with or without a
        # certificate of its own
        review = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "x", "operation": "CREATE", "namespace": namespace, "object": tm("forged", READ),
            "userInfo": {"username": "system:serviceaccount:argocd:argocd-application-controller"}}}).encode()
        now = dt.datetime.now(dt.UTC)
        ca, ca_key = new_ca(now, dt.timedelta(days=1))
        cert, key = issue(ca, ca_key, ["kube-apiserver-webhook-client"], now, dt.timedelta(days=1), client=True)
        (tmp_path / "own.pem").write_text(cert + key)
        for own in (False, True):
            context = ssl.create_default_context()
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
            if own:
                context.load_cert_chain(str(tmp_path / "own.pem"))
            request = urllib.request.Request(f"https://127.0.0.1:{operator.webhook_port}/stamp-toolmanifest",
                                             data=review, headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, context=context, timeout=10) as answer:
                    raise AssertionError(f"answered a caller without the API server's certificate: {answer.read()!r}")
            except (ssl.SSLError, ConnectionError, urllib.error.URLError) as exc:
                assert "answered" not in str(exc)
    finally:
        guarded.stop()
        monkeypatch.delenv("UNWIND_WEBHOOK_CLIENT_CA")
        monkeypatch.delenv("UNWIND_WEBHOOK_CLIENT_NAMES")
        operator.start()
