"""Unwind on the local control plane: CRDs, the Helm chart, and the operator.

``unwind dev up`` runs the control plane with a real node (:mod:`unwind.controlplane.kubenode`:
containerd, kubelet, scheduler, proxy) and installs the chart as a user would: the operator
is the chart's Deployment of the project's image, in containers on that node, and it injects
the same image as the gateway sidecar and runs it in undo Jobs. The cluster tests share
this, so a missing RBAC rule in the chart or a file the image lacks fails both.

:class:`OperatorProcess` (the operator as a process on this machine, under the chart's
ServiceAccount token) stays for the cluster tests that need many operators with short
timers; the kubelet stand-in (``unwind dev node``, :mod:`unwind.controlplane.node`) for a few
fast tests. No claim in README or docs rests on them alone.

``up`` after ``down`` resumes the stopped cluster (see :func:`resume_or_clean`): its etcd
data still holds the Helm release and everything the user applied, so the chart is
upgraded rather than installed (:func:`install_chart`), and the kubelet starts the pods
again.
"""

from __future__ import annotations

import json
import os
import shutil
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
from typing import Any, Literal, NamedTuple

from ..api.crd import write_crds
from ..api.resources import KINDS
from . import kubenode, nodeclean
from .build import kubectl_binary
from .certs import pki_problem
from .cluster import (
    ControlPlane,
    ControlPlaneError,
    control_plane_version,
    data_version,
    free_ports,
    make_token_kubeconfig,
    running_in_dir,
    stop_from_dir,
)
from .procs import pid_alive, terminate

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "unwind"
OPERATOR_NAMESPACE = "unwind-system"
RELEASE = "unwind"
SERVICE_ACCOUNT = "unwind"
DEV_IMAGE_REPOSITORY, DEV_IMAGE_TAG = "unwind", "dev"  # imported into the node's containerd, never pulled
DEV_IMAGE = f"{DEV_IMAGE_REPOSITORY}:{DEV_IMAGE_TAG}"
OPERATOR_DEPLOYMENT = f"{RELEASE}-operator"


def kubectl(kubeconfig: Path, *args: str, input_text: str | None = None, check: bool = True,
            timeout: float = 120) -> str:
    proc = subprocess.run([kubectl_binary(), f"--kubeconfig={kubeconfig}", *args], input=input_text,
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise ControlPlaneError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


def install_crds(kubeconfig: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        write_crds([Path(tmp)])
        kubectl(kubeconfig, "apply", "-f", tmp)
    names = [f"crd/{k.plural}.unwind.dev" for k in KINDS]
    deadline = time.monotonic() + 60
    while True:
        # A newer kubectl against a 1.20 API server fails the wait at once ("accessor error")
        # while a just-created CRD has no conditions yet: ask again until the deadline.
        try:
            kubectl(kubeconfig, "wait", "--for=condition=Established", "--timeout=60s", *names)
            return
        except ControlPlaneError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def local_values(webhook_port: int, trusted: tuple[str, ...] = ("admin",)) -> dict[str, object]:
    """Chart values for an operator running beside the local API server: the webhooks are
    called on loopback, and the control plane's own admin is a trusted applier so the
    quickstart publishes what it applies."""
    return {"webhook": {"url": f"https://127.0.0.1:{webhook_port}"},
            "operator": {"trustedAppliers": list(trusted)}}


ChartAction = Literal["install", "reinstall", "upgrade", "recover"]
PENDING = ("pending-upgrade", "pending-rollback")


def chart_action(history: list[dict[str, Any]]) -> ChartAction:
    """What `helm upgrade --install` semantics mean for a release with this history.

    No release: install. An install that never finished (``pending-install``) or a
    release being or already uninstalled: uninstall it, then install. An upgrade or
    rollback that never finished: roll back to the last good revision, then upgrade (a
    pending release refuses a plain upgrade; nobody else writes to a dev cluster's
    release while ``up`` runs). Anything else (deployed, failed, superseded): upgrade.
    """
    if not history:
        return "install"
    latest = max(history, key=lambda r: int(r.get("revision", 0)))
    status = str(latest.get("status", ""))
    if status in ("pending-install", "uninstalling", "uninstalled"):
        return "reinstall"
    if status in PENDING:
        return "recover"
    return "upgrade"


def install_chart(kubeconfig: Path, values: dict[str, object] | None = None) -> ChartAction:
    """Install charts/unwind, or upgrade the release that is there (CRDs already applied, so
    Helm skips them); returns what was done. Idempotent, like ``helm upgrade --install``;
    ``reset_values`` makes the release hold exactly ``values`` over the chart's defaults."""
    import helm_python as helm

    kubectl(kubeconfig, "create", "namespace", OPERATOR_NAMESPACE, check=False)
    # The chart's pods meet Pod Security "restricted": enforced, so a change that breaks it
    # fails here (docs/chart.md recommends the same label).
    kubectl(kubeconfig, "label", "--overwrite", "namespace", OPERATOR_NAMESPACE,
            "pod-security.kubernetes.io/enforce=restricted")
    with helm.Config(kubeconfig_path=str(kubeconfig), namespace=OPERATOR_NAMESPACE) as cfg:
        try:
            history = cfg.history(RELEASE)
        except helm.HelmNotFoundError:
            history = []
        action = chart_action(history)
        if action == "reinstall":
            cfg.uninstall(RELEASE, ignore_not_found=True)
        if action in ("install", "reinstall"):
            cfg.install(str(CHART), RELEASE, values=values or {}, namespace=OPERATOR_NAMESPACE)
            return action
        if action == "recover":
            cfg.rollback(RELEASE)
        cfg.upgrade(str(CHART), RELEASE, values=values or {}, namespace=OPERATOR_NAMESPACE,
                    reset_values=True, max_history=5)
        return action


def service_account_kubeconfig(cp: ControlPlane, path: Path, namespace: str = OPERATOR_NAMESPACE,
                               name: str = SERVICE_ACCOUNT, timeout: float = 60,
                               seconds: int = 86400) -> Path:
    """A kubeconfig holding a token of the ServiceAccount from the TokenRequest API (what
    `kubectl create token` does: Kubernetes makes no token Secrets since 1.24), valid for
    ``seconds``."""
    deadline = time.monotonic() + timeout
    while True:
        proc = subprocess.run([kubectl_binary(), f"--kubeconfig={cp.kubeconfig}", "-n", namespace,
                               "create", "token", name, f"--duration={seconds}s"],
                              capture_output=True, text=True, timeout=60)
        if proc.returncode == 0:
            return make_token_kubeconfig(cp.server, cp.ca_file, proc.stdout.strip(), path, user=name)
        if time.monotonic() > deadline:  # the chart's ServiceAccount may not be there yet
            raise ControlPlaneError(f"no token for ServiceAccount {namespace}/{name} after "
                                    f"{timeout:.0f}s: {proc.stderr.strip()}")
        time.sleep(0.5)


@dataclass
class OperatorProcess:
    """`unwind operator` as a child process, with its liveness endpoint on a free port."""

    kubeconfig: Path
    log: Path
    args: tuple[str, ...] = ()
    webhook_port: int = 0  # the admission webhooks' port on 127.0.0.1 (shared by replicas)
    exchange_port: int = 0  # the gateways' token exchange on 127.0.0.1 (shared by replicas)
    proc: subprocess.Popen[bytes] | None = None
    port: int = 0

    def start(self, detach: bool = False) -> OperatorProcess:
        self.port, webhook, exchange = free_ports(3)  # one call: three distinct ports
        self.webhook_port = self.webhook_port or webhook
        self.exchange_port = self.exchange_port or exchange
        # as the chart's Deployment runs it (MALLOC_ARENA_MAX: see charts/unwind/templates/deployment.yaml)
        env = {"MALLOC_ARENA_MAX": "2", **os.environ, "KUBECONFIG": str(self.kubeconfig), "PYTHONUNBUFFERED": "1"}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "unwind.cli.main", "operator",
                 f"--operator-namespace={OPERATOR_NAMESPACE}",
                 f"--liveness=http://127.0.0.1:{self.port}/healthz",
                 "--webhook-addr=127.0.0.1", f"--webhook-port={self.webhook_port}",
                 "--webhook-name=127.0.0.1", f"--webhook-configuration={RELEASE}",
                 f"--exchange-port={self.exchange_port}", *self.args],
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


class Start(NamedTuple):
    """How ``up`` treats the cluster folder: resume the stopped cluster, or start clean."""

    resume: bool
    why: str


# What ``up`` starts beside the control plane: pid file stem -> (how it is named, words
# its command line holds, so a pid reused by another process is never signalled).
DAEMONS = {"upstream": ("the examples' upstream", (b"tests.upstream.server",)),
           # started by `dev up` before the node ran the operator: still stopped by `down`
           "operator": ("the operator (as a process)", (b"unwind.cli.main", b"operator")),
           "node": ("the kubelet stand-in", (b"unwind.cli.main", b"node")),
           "exchange": ("the token exchange's relay", (b"unwind.controlplane.relay",))}
EXCHANGE_PORT = 9444  # the relay on the node's address to the operator's exchange (relay.py)
EXCHANGE_URL = f"https://{kubenode.NODE_ADDRESS}:{EXCHANGE_PORT}"
UPSTREAM_PORT = 8788  # where manifests/ point, through the Service in UPSTREAM_SERVICE
UPSTREAM_HOSTS = (kubenode.NODE_ADDRESS, "127.0.0.1")  # for pods, and for a gateway on this machine
UPSTREAM_SERVICE = ROOT / "examples" / "upstream-service.yaml"


def daemon_pid(workdir: Path, stem: str) -> int | None:
    """The pid in ``workdir/STEM.pid`` while that process is still ours, else None."""
    try:
        pid = int((workdir / f"{stem}.pid").read_text())
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    return pid if pid_alive(pid) and all(word in argv for word in DAEMONS[stem][1]) else None


def running(workdir: Path) -> str | None:
    """What still runs from ``up`` in workdir (a component, the operator, the node), or None."""
    components = running_in_dir(workdir / "cluster")
    if components:
        return ", ".join(f"{name} (pid {pid})" for name, pid in components.items())
    alive = [f"{what} (pid {pid})" for stem, (what, _) in DAEMONS.items()
             if (pid := daemon_pid(workdir, stem)) is not None]
    return ", ".join(alive) or None


def resume_or_clean(workdir: Path, *, clean: bool = False) -> Start:
    """Get workdir ready for ``up``: refuse while something from it runs, drop stale pid
    files (a reboot leaves them behind), then keep the stopped cluster's data if it can be
    resumed, or wipe the cluster folder.

    Resuming needs the etcd data of this release's etcd (``versions.json``: etcd does not
    read data two minors older) and the keys it was made with: the stored ServiceAccount
    tokens are signed with ``pki/sa.key`` and the stored Secrets carry ``pki/ca.crt``
    (ControlPlane reuses them). Expiring keys, or ``clean``, mean a clean start.
    """
    what = running(workdir)
    if what is not None:
        raise ControlPlaneError(
            f"a dev control plane is already running in {workdir}: {what}; use it "
            f"(export KUBECONFIG={workdir / 'cluster' / 'kubeconfig'}) or stop it first "
            f"with `unwind dev down --dir {workdir}`")
    cluster = workdir / "cluster"
    stale = [f for f in (cluster / "state.json", *(workdir / f"{d}.pid" for d in DAEMONS)) if f.exists()]
    for file in stale:  # their processes are gone (a reboot, a kill -9): not a running cluster
        file.unlink()
    if clean:
        start = Start(False, "--clean deletes the stopped cluster's data")
    elif not (cluster / "etcd" / "member").is_dir():
        start = Start(False, "there was no earlier cluster")
    elif (made := data_version(cluster)) != (now := control_plane_version()):
        start = Start(False, f"the stopped cluster was made by Kubernetes {made or '1.20.2 or unknown'} "
                             f"and this is {now}: its etcd data cannot be carried over")
    elif (problem := pki_problem(cluster / "pki", ips=(kubenode.NODE_ADDRESS,))) is not None:
        start = Start(False, f"the stopped cluster's keys cannot be reused ({problem}), "
                             "and its data is useless without them")
    else:
        why = "its etcd data and keys were kept, so what was applied is still there"
        return Start(True, why + (" (pid files of processes that had died were removed)"
                                  if stale else ""))
    shutil.rmtree(cluster, ignore_errors=True)
    (workdir / "operator.kubeconfig").unlink(missing_ok=True)
    return start


class Started(NamedTuple):
    control_plane: ControlPlane
    start: Start
    chart: ChartAction
    upstream: bool = False  # the examples' upstream was started (UPSTREAM_HOSTS, port 8788)


def _unverified() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def node_values(trusted: tuple[str, ...] = ("admin",)) -> dict[str, object]:
    """Chart values for the dev cluster's node: the image imported into its containerd
    (never pulled), and the control plane's own admin as a trusted applier so the
    quickstart publishes what it applies."""
    return {"image": {"repository": DEV_IMAGE_REPOSITORY, "tag": DEV_IMAGE_TAG, "pullPolicy": "Never"},
            "operator": {"trustedAppliers": list(trusted)},
            # pods here reach the operator's exchange through the relay (relay.py), not its Service
            "webhook": {"exchangeURL": EXCHANGE_URL}}


def wait_operator(kubeconfig: Path, since: float, timeout: float = 240) -> None:
    """Until the chart's operator Deployment is rolled out and each of its pods runs a
    container started after ``since`` (epoch seconds), Ready: on a resumed cluster the
    stored status still says Ready for containers the stopped node no longer has, and a
    pod admitted while the webhooks do not answer gets no gateway (they fail open)."""
    deadline = time.monotonic() + timeout
    try:
        kubectl(kubeconfig, "-n", OPERATOR_NAMESPACE, "rollout", "status", f"deployment/{OPERATOR_DEPLOYMENT}",
                f"--timeout={int(timeout)}s", timeout=timeout + 10)
        while time.monotonic() < deadline:
            pods = json.loads(kubectl(kubeconfig, "-n", OPERATOR_NAMESPACE, "get", "pods", "-o", "json",
                                      f"--selector=app.kubernetes.io/instance={RELEASE}"))["items"]
            if pods and all(_fresh_and_ready(p, since) for p in pods):
                return
            time.sleep(1)
        raise ControlPlaneError(f"the operator's pods were not Ready again within {timeout:.0f}s")
    except ControlPlaneError as exc:
        pods_table = kubectl(kubeconfig, "-n", OPERATOR_NAMESPACE, "get", "pods", "-o", "wide", check=False)
        raise ControlPlaneError(f"{exc}\n{pods_table}") from exc


def _fresh_and_ready(pod: dict[str, Any], since: float) -> bool:
    import datetime as dt

    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    for status in statuses:
        started = ((status.get("state") or {}).get("running") or {}).get("startedAt")
        if not (status.get("ready") and started):
            return False
        if dt.datetime.fromisoformat(started.replace("Z", "+00:00")).timestamp() < since - 1:
            return False
    return bool(statuses)


def up(workdir: Path, *, clean: bool = False, images: Any = None) -> Started:
    """Start everything, resuming a stopped cluster in workdir unless ``clean``: the control
    plane with its node, the CRDs, the chart (the operator as a Deployment of the project's
    image on the node), and the examples' upstream with its Service."""
    workdir.mkdir(parents=True, exist_ok=True)
    start = resume_or_clean(workdir, clean=clean)
    since = time.time()
    try:
        cp = ControlPlane(workdir / "cluster", node=True, images=images).start()
    except ControlPlaneError as exc:
        if not start.resume:
            raise
        raise ControlPlaneError(f"the stopped cluster in {workdir / 'cluster'} did not start again "
                                f"({exc}); `unwind dev up --clean` starts over, deleting its "
                                "data") from exc
    try:
        # first: its fixed address must not have been handed to another Service yet
        kubectl(cp.kubeconfig, "apply", "-f", str(UPSTREAM_SERVICE))
        install_crds(cp.kubeconfig)
        chart = install_chart(cp.kubeconfig, node_values())
        wait_operator(cp.kubeconfig, since)
        relay = start_relay(workdir, cp.kubeconfig)
        (workdir / "exchange.pid").write_text(str(relay.pid))
    except BaseException:
        cp.stop()
        raise
    upstream = start_upstream(workdir)
    if upstream is not None:
        (workdir / "upstream.pid").write_text(str(upstream.pid))
    return Started(cp, start, chart, upstream is not None)


def start_relay(workdir: Path, kubeconfig: Path) -> subprocess.Popen[bytes]:
    """The relay from the node's address to the webhook Service's port ``exchange``, where
    the gateways of the node's pods trade their token (relay.py says why)."""
    ip = kubectl(kubeconfig, "-n", OPERATOR_NAMESPACE, "get", "service", f"{RELEASE}-webhook",
                 "-o", "jsonpath={.spec.clusterIP}").strip()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "operator"),
                                                                     os.environ.get("PYTHONPATH")]))}
    with (workdir / "exchange.log").open("ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "unwind.controlplane.relay",
                                 f"{kubenode.NODE_ADDRESS}:{EXCHANGE_PORT}", f"{ip}:{EXCHANGE_PORT}"],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and proc.poll() is None:
        with socket.socket() as probe:
            if probe.connect_ex((kubenode.NODE_ADDRESS, EXCHANGE_PORT)) == 0:
                return proc
        time.sleep(0.2)
    raise ControlPlaneError(f"the token exchange's relay did not start; log {workdir / 'exchange.log'}")


def start_upstream(workdir: Path) -> subprocess.Popen[bytes] | None:
    """The test upstream the examples call (a fake GitHub and Stripe) on port 8788 of the
    node's address (pods reach it through the Service in UPSTREAM_SERVICE) and of 127.0.0.1,
    from this clone's tests/; None when there is no such file or the port is taken."""
    if not (ROOT / "tests" / "upstream" / "server.py").is_file():
        return None
    for host in UPSTREAM_HOSTS:
        with socket.socket() as probe:
            if probe.connect_ex((host, UPSTREAM_PORT)) == 0:
                return None
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT)])}
    hosts = [arg for host in UPSTREAM_HOSTS for arg in ("--host", host)]
    with (workdir / "upstream.log").open("ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tests.upstream.server", *hosts, "--port", str(UPSTREAM_PORT)],
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and proc.poll() is None:
        with socket.socket() as probe:
            if probe.connect_ex((UPSTREAM_HOSTS[0], UPSTREAM_PORT)) == 0:
                return proc
        time.sleep(0.2)
    raise ControlPlaneError(f"the examples' upstream did not start; log {workdir / 'upstream.log'}")


def start_node(kubeconfig: Path, workdir: Path) -> subprocess.Popen[bytes]:
    """``unwind dev node`` (the kubelet stand-in) detached, its containers' output kept in
    ``workdir/pods``; only a few fast tests use it now."""
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "operator"), os.environ.get("PYTHONPATH")]))}
    with (workdir / "node.log").open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "unwind.cli.main", "dev", "node",
                                 f"--logs={workdir / 'pods'}"], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)


def restart_operator(workdir: Path, *, images: Any = None, timeout: float = 240) -> list[Path]:
    """Only the operator, on the dev cluster running from workdir: the project's image built
    again when its inputs changed (the operator's code, the Dockerfile...; cached otherwise)
    and imported into the node's containerd as the same ``unwind:dev``, then the chart's
    Deployment restarted (``kubectl rollout restart``) and waited for until each of its pods
    runs a container started now, Ready. The control plane, the node, the upstream and
    everything applied stay as they are. Returns the archives imported (none: the image had
    not changed)."""
    from .image import ensure_images
    from .imageimport import import_images

    cluster = workdir / "cluster"
    if not running_in_dir(cluster):
        raise ControlPlaneError(f"no dev cluster runs from {workdir}: start one with `unwind dev up`")
    imported = import_images(str(kubenode.NodeDirs(cluster / "node").containerd_socket),
                             images if images is not None else ensure_images())
    kubeconfig = cluster / "kubeconfig"
    since = time.time()
    kubectl(kubeconfig, "-n", OPERATOR_NAMESPACE, "rollout", "restart", f"deployment/{OPERATOR_DEPLOYMENT}")
    wait_operator(kubeconfig, since, timeout)
    return imported


def down(workdir: Path) -> bool:
    """Stop what ``up`` started in workdir, the node's containers included; True if
    anything ran (or was left of a node that stopped without being cleaned)."""
    stopped = False
    for stem in DAEMONS:
        pid = daemon_pid(workdir, stem)
        if pid is not None:
            terminate(pid)  # SIGTERM, then SIGKILL after 15 s: gone when down returns
            stopped = True
        (workdir / f"{stem}.pid").unlink(missing_ok=True)
    stopped = stop_from_dir(workdir / "cluster") or stopped
    node = kubenode.NodeDirs(workdir / "cluster" / "node")
    # a node killed without `down` (or by an older `down`) left its containers running:
    # clean them too, unless another node runs now (the host's chains and bridge are its)
    if not stopped and node.root.is_dir() and kubenode.node_in_use() is None and nodeclean.leftovers(node):
        nodeclean.clean_host(node, node.root / "host.json")
        stopped = True
    return stopped
