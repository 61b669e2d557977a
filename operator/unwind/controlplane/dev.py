"""Unwind on the local control plane: CRDs, the Helm chart, and the operator as a local
process running under the chart's ServiceAccount token.

``unwind dev up`` and the cluster tests share this, so what a developer runs is what the
tests check: a missing RBAC rule in the chart fails both. There is no kubelet, so the
chart's Deployment stays Pending; the operator runs beside it with the same identity.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ..api.crd import write_crds
from ..api.resources import KINDS
from .cluster import (
    ControlPlane,
    ControlPlaneError,
    free_ports,
    make_token_kubeconfig,
    stop_from_dir,
)

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "unwind"
OPERATOR_NAMESPACE = "unwind-system"
RELEASE = "unwind"
SERVICE_ACCOUNT = "unwind"


def kubectl(kubeconfig: Path, *args: str, input_text: str | None = None, check: bool = True) -> str:
    proc = subprocess.run(["kubectl", f"--kubeconfig={kubeconfig}", *args], input=input_text,
                          capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise ControlPlaneError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


def install_crds(kubeconfig: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        write_crds([Path(tmp)])
        kubectl(kubeconfig, "apply", "-f", tmp)
    names = [f"crd/{k.plural}.unwind.dev" for k in KINDS]
    kubectl(kubeconfig, "wait", "--for=condition=Established", "--timeout=60s", *names)


def local_values(webhook_port: int, trusted: tuple[str, ...] = ("admin",)) -> dict[str, object]:
    """Chart values for an operator running beside the local API server: the webhooks are
    called on loopback, and the control plane's own admin is a trusted applier so the
    quickstart publishes what it applies."""
    return {"webhook": {"url": f"https://127.0.0.1:{webhook_port}"},
            "operator": {"trustedAppliers": list(trusted)}}


def install_chart(kubeconfig: Path, values: dict[str, object] | None = None) -> None:
    """A real Helm install of charts/unwind (CRDs already applied, so Helm skips them)."""
    import helm_python as helm

    kubectl(kubeconfig, "create", "namespace", OPERATOR_NAMESPACE, check=False)
    # Kubernetes >= 1.21 sets this label itself; the webhooks' namespaceSelector reads it
    # to leave the operator's own namespace alone.
    kubectl(kubeconfig, "label", "--overwrite", "namespace", OPERATOR_NAMESPACE,
            f"kubernetes.io/metadata.name={OPERATOR_NAMESPACE}")
    with helm.Config(kubeconfig_path=str(kubeconfig), namespace=OPERATOR_NAMESPACE) as cfg:
        cfg.install(str(CHART), RELEASE, values=values or {}, namespace=OPERATOR_NAMESPACE)


def service_account_kubeconfig(cp: ControlPlane, path: Path, namespace: str = OPERATOR_NAMESPACE,
                               name: str = SERVICE_ACCOUNT, timeout: float = 60) -> Path:
    """A kubeconfig holding the ServiceAccount's token (made by the token controller)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = kubectl(cp.kubeconfig, "-n", namespace, "get", "secrets", "-o", "json")
        for item in json.loads(out)["items"]:
            ann = item["metadata"].get("annotations") or {}
            if (item.get("type") == "kubernetes.io/service-account-token"
                    and ann.get("kubernetes.io/service-account.name") == name
                    and "token" in (item.get("data") or {})):
                token = base64.b64decode(item["data"]["token"]).decode()
                return make_token_kubeconfig(cp.server, cp.ca_file, token, path, user=name)
        time.sleep(0.5)
    raise ControlPlaneError(f"no token for ServiceAccount {namespace}/{name} after {timeout:.0f}s")


@dataclass
class OperatorProcess:
    """`unwind operator` as a child process, with its liveness endpoint on a free port."""

    kubeconfig: Path
    log: Path
    args: tuple[str, ...] = ()
    webhook_port: int = 0  # the admission webhooks' port on 127.0.0.1 (shared by replicas)
    proc: subprocess.Popen[bytes] | None = None
    port: int = 0

    def start(self, detach: bool = False) -> OperatorProcess:
        self.port = free_ports(1)[0]
        self.webhook_port = self.webhook_port or free_ports(1)[0]
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PYTHONUNBUFFERED": "1"}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "unwind.cli.main", "operator",
                 f"--operator-namespace={OPERATOR_NAMESPACE}",
                 f"--liveness=http://127.0.0.1:{self.port}/healthz",
                 "--webhook-addr=127.0.0.1", f"--webhook-port={self.webhook_port}",
                 "--webhook-name=127.0.0.1", f"--webhook-configuration={RELEASE}", *self.args],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=detach)
        self.wait_live()
        return self

    def wait_live(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise ControlPlaneError(f"the operator exited with {self.proc.returncode}; "
                                        f"log {self.log}:\n{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2):
                    pass
                with socket.create_connection(("127.0.0.1", self.webhook_port), timeout=2) as sock, \
                        _unverified().wrap_socket(sock):
                    return  # live, and the webhooks answer TLS handshakes
            except OSError:
                time.sleep(0.3)
        raise ControlPlaneError(f"the operator was not live after {timeout:.0f}s; log {self.log}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def _unverified() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def up(workdir: Path) -> tuple[ControlPlane, int]:
    """Start everything; return the control plane and the operator's pid."""
    workdir.mkdir(parents=True, exist_ok=True)
    if (workdir / "cluster" / "state.json").exists():
        raise ControlPlaneError(f"a dev control plane is already running in {workdir}: "
                                "run `unwind dev down` first")
    cp = ControlPlane(workdir / "cluster").start()
    op = OperatorProcess(workdir / "operator.kubeconfig", workdir / "operator.log",
                         ("--trusted-appliers=admin",), webhook_port=free_ports(1)[0])
    try:
        install_crds(cp.kubeconfig)
        install_chart(cp.kubeconfig, local_values(op.webhook_port))
        service_account_kubeconfig(cp, op.kubeconfig)
        op.start(detach=True)
    except BaseException:
        op.stop()
        cp.stop()
        raise
    assert op.proc is not None
    (workdir / "operator.pid").write_text(str(op.proc.pid))
    return cp, op.proc.pid


def down(workdir: Path) -> bool:
    stopped = False
    pid_file = workdir / "operator.pid"
    if pid_file.exists():
        try:
            os.kill(int(pid_file.read_text()), signal.SIGTERM)
            stopped = True
        except (ProcessLookupError, ValueError):
            pass
        pid_file.unlink()
    return stop_from_dir(workdir / "cluster") or stopped
