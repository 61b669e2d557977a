"""Run a real local control plane (etcd, kube-apiserver, kube-controller-manager) on loopback.

Why this exists: Unwind's behaviour depends on things only a real API server does — RBAC,
admission webhooks, the status subresource, the Job controller, garbage collection and
service-account tokens — so tests and ``unwind dev up`` run the real components, on free
loopback ports chosen at run time, with everything (data, keys, logs, kubeconfig) in one
work directory. Pids are kept in ``workdir/state.json`` so that another process
(``unwind dev down``) can stop it with :func:`stop_from_dir`.

A work directory can be started again after a stop: etcd keeps its data, and the keys in
``pki/`` are reused (:func:`pki_problem`), because the data holds ServiceAccount tokens
signed with the service-account key and Secrets that carry the CA; new keys would make
every stored token invalid.
"""

from __future__ import annotations

import base64
import contextlib
import json
import secrets
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import yaml

from . import kubenode, nodeclean
from .build import PARTS, BinPaths, ensure_binaries
from .certs import CertFiles, pki_files, pki_problem, write_pki, write_webhook_client
from .procs import die_with_parent, pid_alive, pid_is_component, terminate

NODE_COMPONENTS = ("kube-proxy", "kube-scheduler", "kubelet", "containerd")  # stop order
# the node first (its kubelet reports to the API server), then the API server before etcd
STOP_ORDER = (*NODE_COMPONENTS, "kube-controller-manager", "kube-apiserver", "etcd")
NODE_USER = f"system:node:{kubenode.NODE_NAME}"
VERSIONS_FILE = "versions.json"


def control_plane_version() -> str:
    """The Kubernetes release of the control plane built here (``1.37.2``)."""
    return PARTS[0].kube_version


def data_version(workdir: Path) -> str | None:
    """The release whose etcd made the data in workdir (None: unknown, made before the
    release was recorded, e.g. by the 1.20.2 cluster this project once ran)."""
    try:
        return str(json.loads((workdir / VERSIONS_FILE).read_text())["kubernetes"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class ControlPlaneError(RuntimeError):
    """A component did not come up; the message carries the tail of its log."""


def free_ports(n: int) -> list[int]:
    """n distinct free loopback TCP ports (all bound at once, so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def make_token_kubeconfig(
    server: str, ca: str | Path, token: str, path: str | Path, *,
    user: str = "token-user", namespace: str | None = None,
) -> Path:
    """Write a kubeconfig that talks to ``server`` with a bearer ``token`` (e.g. a ServiceAccount's)."""
    path = Path(path)
    ca_data = base64.b64encode(Path(ca).read_bytes()).decode()
    context: dict[str, Any] = {"cluster": "unwind-local", "user": user}
    if namespace:
        context["namespace"] = namespace
    config = {
        "apiVersion": "v1", "kind": "Config", "preferences": {},
        "clusters": [{"name": "unwind-local",
                      "cluster": {"server": server, "certificate-authority-data": ca_data}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "unwind-local", "context": context}],
        "current-context": "unwind-local",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


def running_in_dir(workdir: str | Path) -> dict[str, int]:
    """The components started in workdir that still run, by name (from ``state.json``; a
    pid that died or now belongs to another program does not count)."""
    workdir = Path(workdir).resolve()
    try:
        pids: dict[str, int] = json.loads((workdir / "state.json").read_text()).get("pids", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return {name: pid for name, pid in pids.items()
            if pid_alive(pid) and pid_is_component(pid, name, workdir)}


def stop_from_dir(workdir: str | Path) -> bool:
    """Stop a control plane started (possibly by another process) in workdir. True if one was found."""
    workdir = Path(workdir).resolve()
    state_file = workdir / "state.json"
    if not state_file.exists():
        return False
    pids: dict[str, int] = json.loads(state_file.read_text()).get("pids", {})
    dirs = kubenode.NodeDirs(workdir / "node")
    for name in STOP_ORDER:
        pid = pids.get(name)
        if pid and pid_alive(pid) and pid_is_component(pid, name, workdir):
            if name == "containerd":  # the kubelet is gone: it cannot start them again
                nodeclean.stop_containers(dirs)
            terminate(pid)
    if (workdir / "node").is_dir():
        nodeclean.clean_host(dirs, workdir / "node" / "host.json")
    state_file.unlink(missing_ok=True)
    return True


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager on loopback. Use as a context manager.

    ``with ControlPlane(workdir=tmp) as cp: ...`` or ``cp = ControlPlane(); cp.start(tmp); cp.stop()``.
    """

    def __init__(self, workdir: str | Path | None = None, bins: BinPaths | None = None, *,
                 startup_timeout: float = 120.0, die_with_parent: bool = False,
                 users: dict[str, tuple[str, ...]] | None = None, node: bool = False,
                 images: Any = None) -> None:
        self._workdir = Path(workdir).resolve() if workdir else None
        # A real node (kubenode): containerd, kubelet, scheduler, proxy; the API server then
        # listens on the node's bridge address instead of loopback. ``images``: what to
        # import into its containerd (unwind.controlplane.image.Images; built when None).
        self.node = node
        self.images = images
        self.address = kubenode.NODE_ADDRESS if node else "127.0.0.1"
        # Extra token users (name -> groups), for tests that need distinct identities.
        self.users = dict(users or {})
        self.tokens: dict[str, str] = {}
        self._bins = bins
        self.startup_timeout = startup_timeout
        self.die_with_parent = die_with_parent
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._state: dict[str, Any] = {}
        self._server = ""
        self._token = ""
        self.leftovers: list[str] = []  # what stop() could not clean on the host

    # -- public properties -------------------------------------------------------------
    @property
    def workdir(self) -> Path:
        if self._workdir is None:
            raise ControlPlaneError("control plane not started")
        return self._workdir

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    @property
    def server(self) -> str:
        return self._server

    @property
    def admin_token(self) -> str:
        return self._token

    @property
    def ca_file(self) -> Path:
        return self.workdir / "pki" / "ca.crt"

    @property
    def webhook_client_ca(self) -> Path:
        """The CA of the client certificate the API server presents to webhooks."""
        return self.workdir / "pki" / "webhook-client-ca.crt"

    @property
    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self._procs.items()}

    def user_kubeconfig(self, user: str) -> Path:
        """A kubeconfig that authenticates as one of ``users`` (written on first use)."""
        path = self.workdir / f"kubeconfig-{user}"
        if not path.exists():
            make_token_kubeconfig(self._server, self.ca_file, self.tokens[user], path, user=user)
        return path

    def log_file(self, name: str) -> Path:
        return self.workdir / "logs" / f"{name}.log"

    @property
    def node_dirs(self) -> kubenode.NodeDirs:
        return kubenode.NodeDirs(self.workdir / "node")

    # -- lifecycle -----------------------------------------------------------------------
    def __enter__(self) -> ControlPlane:
        if not self._procs:
            self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self, workdir: str | Path | None = None) -> ControlPlane:
        if workdir is not None:
            self._workdir = Path(workdir).resolve()
        if self._workdir is None:
            import tempfile
            self._workdir = Path(tempfile.mkdtemp(prefix="unwind-cp-"))
        bins = self._bins or ensure_binaries()
        if self.node and self.images is None:  # before anything starts: a build takes minutes
            from .image import ensure_images

            self.images = ensure_images()
        wd = self.workdir
        for sub in ("logs", "pki"):
            (wd / sub).mkdir(parents=True, exist_ok=True)
        try:
            self._start(wd, bins)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, wd: Path, bins: BinPaths) -> None:
        ips = (self.address,) if self.node else ()
        if self.node:
            if (other := kubenode.node_in_use()) is not None:
                raise ControlPlaneError(f"{other}; stop it first (`unwind dev down`): kube-proxy owns "
                                        "the host's KUBE-* chains, so one node runs per machine")
            if missing := kubenode.missing_packages():
                raise ControlPlaneError(f"the node needs Debian packages {' '.join(missing)}: "
                                        f"apt-get install {' '.join(missing)}")
            (wd / "node").mkdir(exist_ok=True)
            kubenode.setup_network(wd / "node" / "host.json")
        pki = pki_files(wd / "pki") if pki_problem(wd / "pki", ips=ips) is None else write_pki(wd / "pki", ips)
        self._token = secrets.token_hex(24)
        self.tokens = {"admin": self._token, **{u: secrets.token_hex(24) for u in self.users}}
        node_token = secrets.token_hex(24)
        tokens = wd / "tokens.csv"
        lines = [f'{self._token},admin,admin,"system:masters"']
        if self.node:  # the kubelet's identity, for the Node authorizer
            lines.append(f'{node_token},{NODE_USER},{NODE_USER},"system:nodes"')
        lines += [f'{self.tokens[u]},{u},{u},"{",".join(groups)}"' for u, groups in self.users.items()]
        tokens.write_text("\n".join(lines) + "\n")
        tokens.chmod(0o600)
        etcd_client, etcd_peer, api_port = free_ports(3)
        kept_port = self._kept_api_port(wd)
        if kept_port is not None:
            api_port = kept_port
        self._server = f"https://{self.address}:{api_port}"
        make_token_kubeconfig(self._server, pki.ca_cert, self._token, self.kubeconfig, user="admin")
        self._state = {"server": self._server, "kubeconfig": str(self.kubeconfig), "pids": {},
                       "ports": {"etcd": etcd_client, "etcd-peer": etcd_peer, "kube-apiserver": api_port}}

        etcd_url = f"http://127.0.0.1:{etcd_client}"
        self._spawn("etcd", [
            str(bins.etcd), "--name", "unwind", "--data-dir", str(wd / "etcd"),
            "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
            "--listen-peer-urls", f"http://127.0.0.1:{etcd_peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{etcd_peer}",
            "--initial-cluster", f"unwind=http://127.0.0.1:{etcd_peer}",
            "--log-level", "warn",
        ])
        self._wait("etcd", lambda: b"true" in self._get(f"{etcd_url}/health"))
        # which release's etcd made the data: `dev up` resumes only data of its own release
        (wd / VERSIONS_FILE).write_text(json.dumps({"kubernetes": control_plane_version()}) + "\n")

        node_flags = [
            # the `kubernetes` Service's endpoint is this address (pods reach 10.0.0.1:443)
            "--endpoint-reconciler-type=lease", "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-client-certificate={pki.kubelet_client_cert}",
            f"--kubelet-client-key={pki.kubelet_client_key}",
            # webhooks of Services are called at their pods' addresses on the bridge
            "--enable-aggregator-routing=true",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction,MutatingAdmissionWebhook,ValidatingAdmissionWebhook",
        ] if self.node else [
            "--endpoint-reconciler-type=none",  # 127.0.0.1 may not be an Endpoints address
            "--authorization-mode=RBAC",
            "--enable-admission-plugins=MutatingAdmissionWebhook,ValidatingAdmissionWebhook",
        ]
        self._spawn("kube-apiserver", [
            str(bins.kube_apiserver),
            f"--etcd-servers={etcd_url}",
            f"--bind-address={self.address}", f"--advertise-address={self.address}",
            f"--secure-port={api_port}",
            f"--cert-dir={wd / 'pki'}",
            f"--tls-cert-file={pki.serving_cert}", f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca_cert}",
            f"--token-auth-file={tokens}",
            f"--admission-control-config-file={write_webhook_client(wd / 'pki')}",
            *node_flags,
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-cluster-ip-range={kubenode.SERVICE_RANGE}",
            "--allow-privileged=true", "--profiling=false",
        ])
        self._wait("kube-apiserver", lambda: self._get(f"{self._server}/readyz") == b"ok")
        if self.node:
            self._keep_kubernetes_endpoint(wd, api_port)

        self._spawn("kube-controller-manager", [
            str(bins.kube_controller_manager),
            f"--kubeconfig={self.kubeconfig}",
            f"--service-account-private-key-file={pki.sa_key}",
            f"--root-ca-file={pki.ca_cert}",
            "--leader-elect=false", "--controllers=*",
            "--secure-port=0", "--bind-address=127.0.0.1",
        ])
        # the service-account controller making "default" shows the controller manager works
        sa = f"{self._server}/api/v1/namespaces/default/serviceaccounts/default"
        self._wait("kube-controller-manager", lambda: bool(self._get(sa)))
        if self.node:
            self._start_node(bins, pki, node_token)

    def _start_node(self, bins: BinPaths, pki: CertFiles, node_token: str) -> None:
        """containerd (with the images imported), then the kubelet, the scheduler and the
        proxy; returns once the node is Ready."""
        from .imageimport import import_images

        dirs = self.node_dirs
        images = self.images
        kubenode.write_configs(dirs, images.pause_image)
        self._spawn("containerd", ["containerd", "--config", str(dirs.containerd_config)])
        self._wait("containerd", lambda: dirs.containerd_socket.is_socket() and subprocess.run(
            ["ctr", "--address", str(dirs.containerd_socket), "version"],
            capture_output=True, check=False).returncode == 0)
        import_images(str(dirs.containerd_socket), images)
        kubelet_config = make_token_kubeconfig(self._server, pki.ca_cert, node_token,
                                               dirs.root / "kubelet.kubeconfig", user=NODE_USER)
        self._spawn("kubelet", kubenode.kubelet_args(bins.kubelet, dirs, kubelet_config, pki.ca_cert))
        self._spawn("kube-scheduler", kubenode.scheduler_args(bins.kube_scheduler, self.kubeconfig))
        self._spawn("kube-proxy", kubenode.proxy_args(bins.kube_proxy, self.kubeconfig))
        node = f"{self._server}/api/v1/nodes/{kubenode.NODE_NAME}"
        self._wait("kubelet", lambda: b'"type":"Ready","status":"True"' in self._get(node).replace(b" ", b""))
        self._wait("kube-proxy", kubenode.proxy_ready)
        self._wait("kube-scheduler", lambda: True)  # still running
        if (why := kubenode.check_no_forwarding()) is not None:
            raise ControlPlaneError(f"the node turned forwarding on: {why}")

    def _keep_kubernetes_endpoint(self, wd: Path, port: int) -> None:
        """Record the port; when the kept one could not be had, drop the stale `kubernetes`
        Endpoints, which the API server then writes again with its new port."""
        record = wd / "api-port"
        try:
            before = int(record.read_text())
        except (OSError, ValueError):
            before = port
        if before != port:
            req = urllib.request.Request(f"{self._server}/api/v1/namespaces/default/endpoints/kubernetes",
                                         method="DELETE", headers={"Authorization": f"Bearer {self._token}"})
            ctx = ssl.create_default_context(cafile=str(self.ca_file))
            with contextlib.suppress(urllib.error.URLError, OSError):
                urllib.request.urlopen(req, timeout=10, context=ctx).close()
        record.write_text(f"{port}\n")

    def _kept_api_port(self, wd: Path) -> int | None:
        """With a node, the API server keeps its port across restarts of a work directory:
        the `kubernetes` Service's endpoint (what every pod dials at 10.0.0.1:443) was
        stored with it, and an API server on another port leaves that endpoint stale. The
        port is recorded in ``api-port``; None when there is none or it is taken now."""
        if not self.node:
            return None
        record = wd / "api-port"
        try:
            port = int(record.read_text())
        except (OSError, ValueError):
            return None
        with socket.socket() as probe:
            # as the API server binds (Go sets SO_REUSEADDR): its old connections in TIME_WAIT
            # do not make the port taken
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((self.address, port))
            except OSError:
                return None
        return port

    def _spawn(self, name: str, argv: list[str]) -> None:
        sig = signal.SIGTERM if name == "etcd" else signal.SIGKILL
        log: IO[bytes] = self.log_file(name).open("ab")
        try:
            self._procs[name] = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.workdir, start_new_session=True,
                preexec_fn=die_with_parent(sig) if self.die_with_parent else None,
            )
        finally:
            log.close()
        self._state["pids"][name] = self._procs[name].pid
        tmp = self.workdir / "state.json.tmp"
        tmp.write_text(json.dumps(self._state, indent=2) + "\n")
        tmp.replace(self.workdir / "state.json")

    def _get(self, url: str) -> bytes:
        """Body of a 200 answer, or b"" for anything else."""
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {self._token}"})
        ctx = ssl.create_default_context(cafile=str(self.ca_file)) if url.startswith("https") else None
        try:
            with urllib.request.urlopen(req, timeout=5, context=ctx) as resp:
                return resp.read() if resp.status == 200 else b""
        except (urllib.error.URLError, OSError, ssl.SSLError):
            return b""

    def _wait(self, name: str, ready: Callable[[], bool]) -> None:
        deadline = time.monotonic() + self.startup_timeout
        proc = self._procs[name]
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ControlPlaneError(
                    f"{name} exited with code {proc.returncode} during start-up; "
                    f"log {self.log_file(name)}:\n{log_tail(self.log_file(name))}")
            if ready():
                return
            time.sleep(0.25)
        raise ControlPlaneError(
            f"{name} not ready after {self.startup_timeout:.0f}s; "
            f"log {self.log_file(name)}:\n{log_tail(self.log_file(name))}")

    def stop(self) -> None:
        """Stop the components we started (API server before etcd); safe to call twice."""
        for name in STOP_ORDER:
            proc = self._procs.get(name)
            if proc is not None and proc.poll() is None:
                if name == "containerd":  # after the kubelet, which would start them again
                    nodeclean.stop_containers(self.node_dirs)
                terminate(proc.pid, proc=proc)
        self._procs.clear()
        if self._workdir is not None:
            if self.node:
                self.leftovers = nodeclean.clean_host(self.node_dirs, self.node_dirs.root / "host.json")
            (self._workdir / "state.json").unlink(missing_ok=True)
