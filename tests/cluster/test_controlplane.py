"""The local control plane behaves like the real thing Unwind relies on."""

from __future__ import annotations

import base64
import http.server
import json
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from kubernetes import client
from kubernetes.client.rest import ApiException

from unwind.controlplane import ControlPlane, make_token_kubeconfig, stop_from_dir
from unwind.controlplane.certs import issue_serving_cert
from unwind.controlplane.kubelet import TERMINATION_LOG_ENV, run_job_pods
from unwind.controlplane.procs import pid_alive

pytestmark = pytest.mark.cluster


def eventually(check: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.25)


def kubectl(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kubectl", f"--kubeconfig={kubeconfig}", *args],
                          capture_output=True, text=True, timeout=60)


def test_the_api_server_answers_real_kubectl(kubeconfig: Path) -> None:
    out = kubectl(kubeconfig, "get", "ns", "-o", "name")
    assert out.returncode == 0, out.stderr
    assert "namespace/default" in out.stdout.split()


def test_rbac_denies_a_service_account_until_a_role_binding_lets_it_through(
    control_plane: ControlPlane, k8s_api: client.ApiClient, namespace: str, tmp_path: Path,
) -> None:
    core, rbac = client.CoreV1Api(k8s_api), client.RbacAuthorizationV1Api(k8s_api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "robot"}})
    # a token from the TokenRequest API, as `kubectl create token` asks for (no token
    # Secret is made since 1.24); the CA a pod trusts is in every namespace's ConfigMap
    token = core.create_namespaced_service_account_token(
        "robot", namespace, {"spec": {"expirationSeconds": 600}}).status.token
    assert not [s for s in core.list_namespaced_secret(namespace).items
                if s.type == "kubernetes.io/service-account-token"]
    root_ca = eventually(lambda: next(iter(core.list_namespaced_config_map(
        namespace, field_selector="metadata.name=kube-root-ca.crt").items), None),
        what="the kube-root-ca.crt ConfigMap")
    assert root_ca.data["ca.crt"] == control_plane.ca_file.read_text()
    kc = make_token_kubeconfig(control_plane.server, control_plane.ca_file, token,
                               tmp_path / "robot.kubeconfig", namespace=namespace)

    denied = kubectl(kc, "get", "configmaps")
    assert denied.returncode != 0
    assert "forbidden" in denied.stderr.lower(), denied.stderr
    assert f"system:serviceaccount:{namespace}:robot" in denied.stderr

    rbac.create_namespaced_role(namespace, {
        "metadata": {"name": "read-configmaps"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}]})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "robot-reads"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-configmaps"},
        "subjects": [{"kind": "ServiceAccount", "name": "robot", "namespace": namespace}]})
    allowed = eventually(lambda: (r := kubectl(kc, "get", "configmaps")).returncode == 0 and r,
                         what="RoleBinding to take effect")
    assert "forbidden" not in allowed.stderr.lower()
    still_denied = kubectl(kc, "get", "secrets")
    assert still_denied.returncode != 0 and "forbidden" in still_denied.stderr.lower()


def test_a_crd_can_be_created_and_a_custom_resource_written(
    k8s_api: client.ApiClient, namespace: str,
) -> None:
    """The vendored reflect2 v1.0.1 crashed the API server on the first custom resource write."""
    ext, custom = client.ApiextensionsV1Api(k8s_api), client.CustomObjectsApi(k8s_api)
    group, plural = "test.unwind.dev", f"widgets{namespace.replace('-', '')}"
    crd_name = f"{plural}.{group}"
    ext.create_custom_resource_definition({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": crd_name},
        "spec": {"group": group, "scope": "Namespaced",
                 "names": {"plural": plural, "singular": plural[:-1], "kind": "Widget"},
                 "versions": [{"name": "v1", "served": True, "storage": True,
                               "subresources": {"status": {}},
                               "schema": {"openAPIV3Schema": {
                                   "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}})
    try:
        eventually(lambda: any(c.type == "Established" and c.status == "True" for c in
                               (ext.read_custom_resource_definition(crd_name).status.conditions or [])),
                   what="CRD Established")
        body = {"apiVersion": f"{group}/v1", "kind": "Widget", "metadata": {"name": "w1"},
                "spec": {"labels": {"a": "1", "b": "2"}, "nested": {"x": {"y": [1, 2, {"z": True}]}}}}
        eventually(lambda: _create_ok(custom, group, namespace, plural, body), what="custom resource create")
        custom.patch_namespaced_custom_object(group, "v1", namespace, plural, "w1",
                                              {"spec": {"labels": {"c": "3"}}})
        custom.patch_namespaced_custom_object_status(group, "v1", namespace, plural, "w1",
                                                     {"status": {"phase": "Ready"}})
        got = custom.get_namespaced_custom_object(group, "v1", namespace, plural, "w1")
        assert got["spec"]["labels"] == {"a": "1", "b": "2", "c": "3"}
        assert got["spec"]["nested"] == {"x": {"y": [1, 2, {"z": True}]}}
        assert got["status"] == {"phase": "Ready"}
        listed = custom.list_namespaced_custom_object(group, "v1", namespace, plural)
        assert [i["metadata"]["name"] for i in listed["items"]] == ["w1"]
    finally:
        ext.delete_custom_resource_definition(crd_name)


def _create_ok(custom: client.CustomObjectsApi, group: str, ns: str, plural: str, body: dict[str, Any]) -> bool:
    try:
        custom.create_namespaced_custom_object(group, "v1", ns, plural, body)
    except ApiException as exc:
        if exc.status == 404:  # discovery of the new CRD not yet served
            return False
        raise
    return True


def test_a_job_creates_a_pod_and_the_kubelet_stand_in_completes_it(
    k8s_api: client.ApiClient, namespace: str,
) -> None:
    batch, core = client.BatchV1Api(k8s_api), client.CoreV1Api(k8s_api)
    script = ("import os; open(os.environ['" + TERMINATION_LOG_ENV + "'], 'w')"
              ".write(os.environ['GREETING'] + ' from the job'); print('stdout line')")
    batch.create_namespaced_job(namespace, {
        "metadata": {"name": "hello"},
        "spec": {"backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "unused", "command": [sys.executable],
                            "args": ["-c", script], "env": [{"name": "GREETING", "value": "hello"}]}]}}}})
    results = run_job_pods(k8s_api, namespace, "hello")
    assert [(r.exit_code, r.phase, r.message) for r in results] == [(0, "Succeeded", "hello from the job")]
    assert "stdout line" in results[0].output

    job = eventually(lambda: (j := batch.read_namespaced_job("hello", namespace)).status.succeeded == 1
                     and any(c.type == "Complete" and c.status == "True" for c in j.status.conditions or [])
                     and j, what="Job Complete")
    assert job.status.completion_time is not None
    pod = core.read_namespaced_pod(results[0].name, namespace)
    assert pod.status.container_statuses[0].state.terminated.message == "hello from the job"

    # garbage collection: deleting the Job in the background removes its Pod
    batch.delete_namespaced_job("hello", namespace, propagation_policy="Background")
    eventually(lambda: not core.list_namespaced_pod(namespace, label_selector="job-name=hello").items,
               what="garbage collection of the Job's Pod")


def test_a_failing_container_fails_its_pod_with_the_output_tail_as_message(
    k8s_api: client.ApiClient, namespace: str,
) -> None:
    batch = client.BatchV1Api(k8s_api)
    batch.create_namespaced_job(namespace, {
        "metadata": {"name": "sad"},
        "spec": {"backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "unused", "command": [sys.executable, "-c",
                            "import sys; print('it broke'); sys.exit(3)"]}]}}}})
    [result] = run_job_pods(k8s_api, namespace, "sad")
    assert (result.exit_code, result.phase, result.message.strip()) == (3, "Failed", "it broke")
    eventually(lambda: any(c.type == "Failed" and c.status == "True" for c in
                           batch.read_namespaced_job("sad", namespace).status.conditions or []),
               what="Job Failed")


def test_stop_leaves_no_processes_even_from_another_process(tmp_path: Path,
                                                           control_plane: ControlPlane) -> None:
    workdir = tmp_path / "second"
    cp = ControlPlane(workdir, die_with_parent=True).start()
    try:
        pids = cp.pids
        assert set(pids) == {"etcd", "kube-apiserver", "kube-controller-manager"}
        assert json.loads((workdir / "state.json").read_text())["pids"] == pids
        assert cp.server != control_plane.server
        # as `unwind dev down` does, from the state file alone
        assert stop_from_dir(workdir) is True
        assert not [name for name, pid in pids.items() if pid_alive(pid)]
        assert not (workdir / "state.json").exists()
        assert stop_from_dir(workdir) is False
    finally:
        cp.stop()
    assert not [name for name, pid in pids.items() if pid_alive(pid)]


def test_the_api_server_calls_an_admission_webhook_served_on_loopback(
    control_plane: ControlPlane, k8s_api: client.ApiClient, namespace: str, tmp_path: Path,
) -> None:
    server, url = _serve_denying_webhook(control_plane, tmp_path)
    adm, core = client.AdmissionregistrationV1Api(k8s_api), client.CoreV1Api(k8s_api)
    name = f"deny-bad-{namespace}"
    adm.create_validating_webhook_configuration({
        "metadata": {"name": name},
        "webhooks": [{
            "name": "deny.test.unwind.dev", "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "failurePolicy": "Fail", "timeoutSeconds": 5,
            "clientConfig": {"url": url, "caBundle": base64.b64encode(
                control_plane.ca_file.read_bytes()).decode()},
            "objectSelector": {"matchLabels": {"webhook-test": namespace}},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["configmaps"]}]}]})
    labels = {"webhook-test": namespace}

    def denied(n: int) -> bool:
        try:
            core.create_namespaced_config_map(namespace, {
                "metadata": {"name": f"bad-{n}", "labels": labels}, "data": {"bad": "yes"}})
        except ApiException as exc:
            assert exc.status == 403 and "denied by the test webhook" in str(exc.body), exc.body
            return True
        return False

    try:
        counter = iter(range(1000))
        eventually(lambda: denied(next(counter)), what="webhook to deny")
        core.create_namespaced_config_map(namespace, {
            "metadata": {"name": "good", "labels": labels}, "data": {"fine": "yes"}})
    finally:
        adm.delete_validating_webhook_configuration(name)
        server.shutdown()


def _serve_denying_webhook(cp: ControlPlane, tmp_path: Path) -> tuple[Any, str]:
    """An HTTPS admission webhook on 127.0.0.1 with a cert from the control plane's CA."""
    ca_key = serialization.load_pem_private_key((cp.workdir / "pki/ca.key").read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca_cert = x509.load_pem_x509_certificate(cp.ca_file.read_bytes())
    key, cert = issue_serving_cert(ca_key, ca_cert, "webhook", ["localhost"], ["127.0.0.1"])
    (tmp_path / "wh.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    (tmp_path / "wh.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            bad = "bad" in (review["request"]["object"].get("data") or {})
            response: dict[str, Any] = {"uid": review["request"]["uid"], "allowed": not bad}
            if bad:
                response["status"] = {"code": 403, "message": "denied by the test webhook"}
            body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                               "response": response}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tmp_path / "wh.crt", tmp_path / "wh.key")
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"https://127.0.0.1:{server.server_address[1]}/validate"
