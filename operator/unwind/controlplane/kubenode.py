"""A real node for the local control plane: containerd + runc + CNI, kubelet, kube-scheduler
and kube-proxy, with pods in network namespaces on a bridge this module creates.

Why this exists: what Unwind puts into pods (the gateway sidecar, undo Jobs, the operator's
Deployment) must be proved in containers on a real kubelet, not by a stand-in that runs
commands on the host (docs/controlplane.md). The recipe and its pitfalls were checked on a
machine of this kind (shared/reference/real-node.md); this module turns it into code:

- **network** (:func:`setup_network`): a bridge with the node's address, which is also the
  API server's; the CNI ``bridge`` plugin with ``isGateway: false`` and ``ipMasq: false`` (so
  it never turns ``ip_forward`` on), host-local addresses kept in the node's own folder, a
  route for the service range via the bridge address in every pod, and the service range
  routed ``local`` on ``lo`` so a service address never leaves the machine even without a
  kube-proxy rule. ``net.ipv4.ip_forward`` stays 0: pods reach the host (the API server, the
  examples' upstream) and each other's services only through the host's own stack.
- **processes** (:func:`containerd_config`, :func:`kubelet_args`, ...): the ControlPlane
  spawns them, so their pids sit in ``state.json`` with the others and
  :func:`~unwind.controlplane.cluster.stop_from_dir` stops them too.
- **stopping and cleaning** (:mod:`unwind.controlplane.nodeclean`): every container stopped
  through containerd, what is left of them killed by their cgroups, and what the kubelet,
  containerd and kube-proxy leave outside their folders removed.

One node per machine: kube-proxy owns the host's ``KUBE-*`` chains, so a second node would
fight the first. :func:`node_in_use` says when one already runs.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

NODE_NAME = "unwind-node"
BRIDGE = "unwind0"
BRIDGE_MAC = "02:75:77:0a:f4:01"  # locally administered, fixed: see setup_network
NODE_ADDRESS = "10.244.0.1"  # the bridge's address: the node's and the API server's
POD_SUBNET = "10.244.0.0/24"
SERVICE_RANGE = "10.0.0.0/24"
FIRST_SERVICE_IP = "10.0.0.1"  # the `kubernetes` Service
# Where manifests/ send their calls: the Service of the examples' upstream
# (examples/upstream-service.yaml), which `unwind dev up` runs on the node's address.
EXAMPLES_UPSTREAM = "http://10.0.0.88:8788"
CNI_NETWORK = "unwind"
CNI_BIN_DIR = "/usr/lib/cni"  # Debian's containernetworking-plugins
KUBELET_PORT = 10250
PROXY_HEALTHZ_PORT, PROXY_METRICS_PORT = 10256, 10249
ROUTE_LOCALNET = Path("/proc/sys/net/ipv4/conf/all/route_localnet")
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
# Written by the kubelet, runc and libcni outside the folders they are given.
HOST_LEFTOVERS = ("/var/log/pods", "/var/log/containers", "/run/containerd/runc/k8s.io",
                  "/var/lib/kubelet/device-plugins")
NODE_PACKAGES = {"containerd": "containerd", "runc": "runc", "iptables": "iptables", "ip": "iproute2",
                 "ctr": "containerd"}
NODE_PACKAGE_FILES = {f"{CNI_BIN_DIR}/bridge": "containernetworking-plugins"}


class NodeError(RuntimeError):
    """The node could not be set up or cleaned; the message says what to do."""


@dataclass(frozen=True)
class NodeDirs:
    """Where a node keeps its state: under the control plane's work directory, except what
    holds unix sockets (a socket's path is limited to 107 bytes, and a work directory under
    pytest's temporary folders is long): containerd's state and socket and the kubelet's root
    (its pod-resources and plugin sockets), under /run/unwind/<hash of the root>/."""

    root: Path

    @property
    def run(self) -> Path:
        return Path("/run/unwind") / hashlib.sha256(str(self.root).encode()).hexdigest()[:12]

    @property
    def containerd_socket(self) -> Path:
        return self.run / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.root / "containerd.toml"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni" / "net.d"

    @property
    def kubelet_root(self) -> Path:
        return self.run / "kubelet"


def missing_packages() -> list[str]:
    """Debian packages the node needs that are not installed."""
    out = {pkg for tool, pkg in NODE_PACKAGES.items() if shutil.which(tool) is None}
    out |= {pkg for path, pkg in NODE_PACKAGE_FILES.items() if not Path(path).exists()}
    return sorted(out)


def _toml_str(value: str | Path) -> str:
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def containerd_config(dirs: NodeDirs, sandbox_image: str) -> str:
    """A private containerd configuration: nothing in /var/lib/containerd or /run/containerd.

    ``restrict_oom_score_adj``: this machine lacks CAP_SYS_RESOURCE, and without it every
    sandbox fails (CRI asks runc for oom_score_adj -998). There is no systemd: cgroupfs.
    """
    s = _toml_str
    return f"""\
version = 2
root = {s(dirs.root / "containerd" / "root")}
state = {s(dirs.run / "state")}
oom_score = 0

[grpc]
  address = {s(dirs.containerd_socket)}

[ttrpc]
  address = {s(str(dirs.containerd_socket) + ".ttrpc")}

[debug]
  level = "warn"

[plugins."io.containerd.internal.v1.opt"]
  path = {s(dirs.root / "containerd" / "opt")}

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = {s(sandbox_image)}
  restrict_oom_score_adj = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = {s(CNI_BIN_DIR)}
    conf_dir = {s(dirs.cni_conf_dir)}
    max_conf_num = 1
"""


def cni_config(dirs: NodeDirs) -> dict[str, object]:
    """The pods' network: the node's bridge, no gateway on it from the plugin (so the plugin
    never turns ``ip_forward`` on), no masquerade, addresses kept in the node's folder."""
    return {
        "cniVersion": "0.4.0",
        "name": CNI_NETWORK,
        "plugins": [{
            "type": "bridge",
            "bridge": BRIDGE,
            "isGateway": False,
            "ipMasq": False,
            "hairpinMode": True,
            "ipam": {
                "type": "host-local",
                "dataDir": str(dirs.root / "cni" / "ipam"),
                "ranges": [[{"subnet": POD_SUBNET, "gateway": NODE_ADDRESS}]],
                "routes": [{"dst": SERVICE_RANGE, "gw": NODE_ADDRESS}],
            },
        }],
    }


def write_configs(dirs: NodeDirs, sandbox_image: str) -> None:
    for d in (dirs.root, dirs.run, dirs.cni_conf_dir, dirs.kubelet_root, dirs.root / "pki"):
        d.mkdir(parents=True, exist_ok=True)
    dirs.containerd_config.write_text(containerd_config(dirs, sandbox_image))
    (dirs.cni_conf_dir / "10-unwind.conflist").write_text(json.dumps(cni_config(dirs), indent=2) + "\n")


def kubelet_config(dirs: NodeDirs, ca_file: Path) -> dict[str, object]:
    """The KubeletConfiguration checked on this kind of machine (real-node.md): cgroup v1
    without systemd (``failCgroupV1: false``: from 1.35 the kubelet refuses v1 otherwise),
    no QoS cgroups or node-allocatable enforcement (no CAP_SYS_RESOURCE here), images never
    collected (they are imported, never pulled), and authentication: the kubelet's port is on
    the bridge every pod can reach, so it serves only clients the API server vouches for (no
    anonymous exec into a gateway)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "containerRuntimeEndpoint": f"unix://{dirs.containerd_socket}",
        "runtimeRequestTimeout": "5m",
        "cgroupDriver": "cgroupfs", "cgroupsPerQOS": False, "enforceNodeAllocatable": [],
        "failSwapOn": False, "oomScoreAdj": 0,
        "volumePluginDir": str(dirs.root / "volume-plugins"),
        "address": NODE_ADDRESS, "port": KUBELET_PORT, "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": 0,
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(ca_file)}},
        "authorization": {"mode": "Webhook"},
        "registerNode": True, "nodeStatusUpdateFrequency": "4s", "syncFrequency": "10s",
    }


def kubelet_args(kubelet: Path, dirs: NodeDirs, kubeconfig: Path, ca_file: Path) -> list[str]:
    """The kubelet's command line: its configuration in a file (:func:`kubelet_config`),
    and the flags that have no field there."""
    config = dirs.root / "kubelet-config.json"
    config.write_text(json.dumps(kubelet_config(dirs, ca_file), indent=2) + "\n")
    return [
        str(kubelet), f"--config={config}", f"--kubeconfig={kubeconfig}",
        f"--root-dir={dirs.kubelet_root}", f"--cert-dir={dirs.root / 'pki'}",
        f"--hostname-override={NODE_NAME}", f"--node-ip={NODE_ADDRESS}",
        "--v=1",
    ]


def scheduler_args(scheduler: Path, kubeconfig: Path) -> list[str]:
    return [str(scheduler), f"--kubeconfig={kubeconfig}", "--leader-elect=false",
            "--secure-port=0", "--bind-address=127.0.0.1"]


def proxy_args(proxy: Path, kubeconfig: Path) -> list[str]:
    return [str(proxy), f"--kubeconfig={kubeconfig}", "--proxy-mode=iptables",
            f"--hostname-override={NODE_NAME}", f"--cluster-cidr={POD_SUBNET}",
            # one node per machine, so fixed loopback ports (0 is refused as "not a valid port")
            "--bind-address=127.0.0.1", f"--healthz-bind-address=127.0.0.1:{PROXY_HEALTHZ_PORT}",
            f"--metrics-bind-address=127.0.0.1:{PROXY_METRICS_PORT}",
            "--conntrack-max-per-core=0",  # leave the host's conntrack table size alone
            "--oom-score-adj=0", "--profiling=false"]


# ---- the host's network -----------------------------------------------------------------

def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise NodeError(f"`ip {' '.join(args)}` failed: {proc.stderr.strip()}")
    return proc


def bridge_exists() -> bool:
    return _ip("link", "show", BRIDGE, check=False).returncode == 0


def setup_network(state: Path) -> None:
    """The bridge with the node's address, and the service range kept on this machine.

    ``state`` records what the host had before (``route_localnet``), for :func:`clean_host`.
    """
    if IP_FORWARD.read_text().strip() != "0":
        raise NodeError(f"{IP_FORWARD} is not 0 on this machine: the node's pods could be routed off it; "
                        "set it to 0 before starting a node")
    if not state.exists():
        state.write_text(json.dumps({"route_localnet": ROUTE_LOCALNET.read_text().strip()}) + "\n")
    if not bridge_exists():
        _ip("link", "add", "name", BRIDGE, "type", "bridge")
    # A bridge without an address of its own takes the lowest of its ports' MACs, so it
    # changes whenever a pod starts or ends, and the other pods' ARP entry for the node's
    # address goes stale: their packets to the API server and from the kubelet's probes
    # were dropped for half a minute at a time (seen: both operator replicas killed by
    # their liveness probes after a short-lived pod ended). A set address stays.
    _ip("link", "set", BRIDGE, "address", BRIDGE_MAC)
    addrs = _ip("-4", "-o", "addr", "show", "dev", BRIDGE).stdout
    if f" {NODE_ADDRESS}/" not in addrs:
        _ip("addr", "add", f"{NODE_ADDRESS}/{POD_SUBNET.split('/')[1]}", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")
    _ip("route", "replace", "local", SERVICE_RANGE, "dev", "lo")


def check_no_forwarding() -> str | None:
    """Why this machine could route a pod's traffic off it now, or None."""
    if IP_FORWARD.read_text().strip() != "0":
        return f"{IP_FORWARD} is {IP_FORWARD.read_text().strip()}, expected 0"
    return None


def _iptables(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["iptables", *args], capture_output=True, text=True, check=False)


def proxy_ready() -> bool:
    """kube-proxy has written the rule for the `kubernetes` Service (pods reach the API server)."""
    return "default/kubernetes" in _iptables("-t", "nat", "-S", "KUBE-SERVICES").stdout


def processes() -> Iterator[tuple[int, list[bytes]]]:
    """(pid, command line) of every process that can be read."""
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and argv[0]:
                yield int(proc.name), argv


def node_in_use() -> str | None:
    """Another node on this machine (a kubelet on the node's address), or None."""
    for pid, argv in processes():
        if Path(argv[0].decode(errors="replace")).name == "kubelet" and \
                f"--node-ip={NODE_ADDRESS}".encode() in argv:
            root = next((a.decode() for a in argv if a.startswith(b"--root-dir=")), "?")
            return f"a kubelet (pid {pid}, {root}) already runs a node on this machine"
    return None
