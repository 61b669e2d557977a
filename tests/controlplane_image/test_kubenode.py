"""The node's configuration, as pure values: the network rules of real-node.md (no gateway
from the CNI plugin, no masquerade, no default route in pods), a private containerd, and
a kubelet that serves only clients the API server vouches for."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from unwind.controlplane import kubenode
from unwind.controlplane.kubenode import NodeDirs


def test_the_pod_network_never_lets_the_plugin_turn_forwarding_on_nor_routes_off_the_machine(tmp_path: Path) -> None:
    (plugin,) = kubenode.cni_config(NodeDirs(tmp_path))["plugins"]  # type: ignore[misc]
    assert plugin["type"] == "bridge" and plugin["bridge"] == kubenode.BRIDGE
    assert plugin["isGateway"] is False and plugin["ipMasq"] is False
    ipam = plugin["ipam"]
    assert ipam["dataDir"].startswith(str(tmp_path))  # not /var/lib/cni/networks
    # the service range via the node, and nothing else: no default route
    assert ipam["routes"] == [{"dst": kubenode.SERVICE_RANGE, "gw": kubenode.NODE_ADDRESS}]


def test_containerd_keeps_everything_in_the_nodes_folders_and_restricts_oom_score_adj(tmp_path: Path) -> None:
    dirs = NodeDirs(tmp_path / "node")
    config = tomllib.loads(kubenode.containerd_config(dirs, "localhost/unwind-pause:1"))
    assert config["root"].startswith(str(dirs.root)) and config["state"].startswith(str(dirs.run))
    assert config["grpc"]["address"] == str(dirs.containerd_socket)
    assert len(str(dirs.containerd_socket)) < 100  # a unix socket path has 107 bytes
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["restrict_oom_score_adj"] is True  # no CAP_SYS_RESOURCE on these machines
    assert cri["sandbox_image"] == "localhost/unwind-pause:1"
    assert cri["cni"] == {"bin_dir": "/usr/lib/cni", "conf_dir": str(dirs.cni_conf_dir), "max_conf_num": 1}
    assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is False
    assert cri["stream_server_address"] == "127.0.0.1"


def test_two_nodes_folders_get_two_socket_folders(tmp_path: Path) -> None:
    assert NodeDirs(tmp_path / "a").run != NodeDirs(tmp_path / "b").run


def test_the_kubelets_sockets_fit_a_unix_socket_path_however_deep_the_work_directory(tmp_path: Path) -> None:
    # seen: F... Failed to create listener for podResources endpoint: listen unix
    # /tmp/pytest-of-root/pytest-15/test_up_after_down_resumes_the0/dev/cluster/node/kubelet/pod-resources/...
    dirs = NodeDirs(tmp_path / ("deep-" * 30) / "cluster" / "node")
    longest = dirs.kubelet_root / "pod-resources" / "4033583363"
    assert len(str(longest)) < 100


def test_the_kubelet_serves_only_clients_the_api_server_vouches_for(tmp_path: Path) -> None:
    config = kubenode.kubelet_config(NodeDirs(tmp_path), tmp_path / "ca.crt")
    assert config["authentication"] == {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                                        "x509": {"clientCAFile": str(tmp_path / "ca.crt")}}
    assert config["authorization"] == {"mode": "Webhook"}
    assert config["readOnlyPort"] == 0  # the unauthenticated port is off
    assert config["imageGCHighThresholdPercent"] == 100  # imported images cannot be pulled again


def test_the_kubelet_runs_on_cgroup_v1_without_systemd_and_reads_its_configuration_file(tmp_path: Path) -> None:
    dirs = NodeDirs(tmp_path)
    config = kubenode.kubelet_config(dirs, tmp_path / "ca.crt")
    # from 1.35 a kubelet refuses cgroup v1 (these machines) unless told not to
    assert config["failCgroupV1"] is False and config["cgroupDriver"] == "cgroupfs"
    assert config["cgroupsPerQOS"] is False and config["enforceNodeAllocatable"] == []
    assert config["containerRuntimeEndpoint"] == f"unix://{dirs.containerd_socket}"
    args = kubenode.kubelet_args(Path("/bin/kubelet"), dirs, tmp_path / "kc", tmp_path / "ca.crt")
    written = json.loads((tmp_path / "kubelet-config.json").read_text())
    assert f"--config={tmp_path / 'kubelet-config.json'}" in args and written == config
    assert f"--node-ip={kubenode.NODE_ADDRESS}" in args
    assert f"--root-dir={dirs.kubelet_root}" in args and f"--cert-dir={tmp_path / 'pki'}" in args
    # its own work directory is in its command line: a pid is checked to be the one started
    assert any(str(tmp_path) in a for a in args)


def test_kube_proxy_listens_on_loopback_only() -> None:
    args = kubenode.proxy_args(Path("/bin/kube-proxy"), Path("/kc"))
    binds = [a for a in args if "bind-address" in a]
    assert binds and all("=127.0.0.1" in a for a in binds)
