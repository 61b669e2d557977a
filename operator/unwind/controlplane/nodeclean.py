"""Stopping the node so that nothing of it is left on the machine.

Why this exists: a kubelet that exits leaves its pods running, and containerd that exits
leaves its shims, and the shims' containers live in sessions of their own. Stopping only the
node's processes once left the operator's replicas and their pause processes running
(re-parented to PID 1) and their ``cni-*`` network namespaces in place, while ``dev down``
said "stopped". So, in order:

1. :func:`stop_containers`, after the kubelet (which would start them again) and before
   containerd: every task of the node's containerd asked to stop (SIGTERM, then SIGKILL) and
   deleted, through ``ctr``, as containerd itself would stop them;
2. :func:`kill_cgroups`, once containerd is gone: whatever still runs in a container's
   cgroup (``/sys/fs/cgroup/<controller>/k8s.io/<id>`` for the container ids in the node's
   containerd state) is killed, and the emptied cgroups removed; then the shims;
3. :func:`clean_host`: mounts, network namespaces no process uses any more, veths and the
   bridge, kube-proxy's iptables chains, what the kubelet and runc wrote outside their
   folders, ``route_localnet`` as it was.

:func:`leftovers` says what of a node still runs or exists (the test of ``dev down`` asks it).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

from .kubenode import (
    BRIDGE,
    CNI_NETWORK,
    HOST_LEFTOVERS,
    ROUTE_LOCALNET,
    SERVICE_RANGE,
    NodeDirs,
    _ip,
    _iptables,
    bridge_exists,
    check_no_forwarding,
    processes,
)

CGROUP_ROOT = Path("/sys/fs/cgroup")
CRI_NAMESPACE = "k8s.io"  # containerd's namespace for what the kubelet runs (CRI)
NETNS_FILE = "netns.json"


def _ctr(dirs: NodeDirs, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ctr", "--address", str(dirs.containerd_socket), "-n", CRI_NAMESPACE, *args],
                          capture_output=True, text=True, check=False, timeout=timeout)


def _tasks(dirs: NodeDirs) -> dict[str, str]:
    """Task id -> status (RUNNING, STOPPED...) of the node's containerd."""
    out = _ctr(dirs, "tasks", "ls").stdout.splitlines()[1:]
    return {f[0]: f[2] for f in (line.split() for line in out) if len(f) >= 3}


def netns_of(pids: set[int]) -> set[str]:
    """The names in /run/netns of the network namespaces those processes are in: the
    node's own pods' (another node's, or one's left by an older ``down``, are not)."""
    inodes = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            inodes.add(os.stat(f"/proc/{pid}/ns/net").st_ino)
    out = set()
    for ns in Path("/run/netns").glob("cni-*"):
        with contextlib.suppress(OSError):
            if os.stat(ns).st_ino in inodes:
                out.add(ns.name)
    return out


def _record_netns(dirs: NodeDirs, names: set[str]) -> None:
    """Kept beside the node's state (``netns.json``) until :func:`clean_host` removed them."""
    with contextlib.suppress(OSError):
        dirs.root.mkdir(parents=True, exist_ok=True)
        (dirs.root / NETNS_FILE).write_text(json.dumps(sorted(names | recorded_netns(dirs))) + "\n")


def recorded_netns(dirs: NodeDirs) -> set[str]:
    try:
        return set(json.loads((dirs.root / NETNS_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return set()


def stop_containers(dirs: NodeDirs, grace: float = 5.0) -> None:
    """Through the node's containerd, while it runs: SIGTERM every task (all its processes),
    SIGKILL those still running after ``grace`` seconds, then delete them (their shims exit).
    The network namespaces they were in are recorded first, for :func:`clean_host`."""
    if not dirs.containerd_socket.is_socket():
        return
    _record_netns(dirs, netns_of(cgroup_pids(container_cgroups(container_ids(dirs)))))
    with contextlib.suppress(subprocess.TimeoutExpired):
        for sig, wait in (("SIGTERM", grace), ("SIGKILL", 5.0)):
            running = [t for t, status in _tasks(dirs).items() if status != "STOPPED"]
            for task in running:
                _ctr(dirs, "tasks", "kill", "--all", "--signal", sig, task)
            deadline = time.monotonic() + wait
            while running and time.monotonic() < deadline:
                time.sleep(0.2)
                running = [t for t, status in _tasks(dirs).items() if status != "STOPPED"]
            if not running:
                break
        for task in _tasks(dirs):
            _ctr(dirs, "tasks", "delete", "--force", task)


def container_ids(dirs: NodeDirs) -> set[str]:
    """The ids of every container the node's containerd ran (its task state folders)."""
    base = dirs.run / "state" / "io.containerd.runtime.v2.task" / CRI_NAMESPACE
    with contextlib.suppress(OSError):
        return {p.name for p in base.iterdir() if p.is_dir()}
    return set()


def container_cgroups(ids: set[str], root: Path = CGROUP_ROOT) -> list[Path]:
    """The cgroups of those containers in every cgroup v1 hierarchy (and v2's unified one)."""
    out = []
    with contextlib.suppress(OSError):
        for hierarchy in root.iterdir():
            for cid in sorted(ids):
                if (hierarchy / CRI_NAMESPACE / cid).is_dir():
                    out.append(hierarchy / CRI_NAMESPACE / cid)
    return out


def cgroup_pids(cgroups: list[Path]) -> set[int]:
    pids: set[int] = set()
    for group in cgroups:
        for procs in group.rglob("cgroup.procs"):
            with contextlib.suppress(OSError, ValueError):
                pids |= {int(line) for line in procs.read_text().split()}
    return pids


def kill_cgroups(ids: set[str], root: Path = CGROUP_ROOT) -> set[int]:
    """SIGKILL every process left in the containers' cgroups, remove the emptied cgroups
    (deepest first); returns the pids that still ran afterwards."""
    groups = container_cgroups(ids, root)
    for _ in range(3):
        pids = cgroup_pids(groups)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.3)
    for group in groups:
        for sub in sorted((d for d in group.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)):
            with contextlib.suppress(OSError):
                sub.rmdir()
        with contextlib.suppress(OSError):
            group.rmdir()
    return cgroup_pids(groups)


def kill_shims(dirs: NodeDirs) -> None:
    """The containerd shims of this node (they outlive containerd)."""
    sock = str(dirs.containerd_socket).encode()
    for pid, argv in processes():
        if argv[0].endswith(b"containerd-shim-runc-v2") and sock in argv:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def _mounts_under(*roots: Path) -> list[str]:
    out = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            point = line.split()[4].encode().decode("unicode_escape")
            if any(point == str(r) or point.startswith(f"{r}/") for r in roots):
                out.append(point)
    return sorted(set(out), key=lambda p: -p.count("/"))


def unmount_under(*roots: Path) -> None:
    """Unmount everything below the roots, deepest first (the kubelet bind-mounts its root
    onto itself, containerd mounts overlays and shm)."""
    for _ in range(3):  # a bind mount onto itself shows twice
        points = _mounts_under(*roots)
        if not points:
            return
        for point in points:
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def _netns_in_use() -> set[int]:
    inodes = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                inodes.add(os.stat(proc / "ns" / "net").st_ino)
    return inodes


def pod_netns() -> list[str]:
    """The pods' network namespaces (``/run/netns/cni-*``), used or not."""
    return sorted(ns.name for ns in Path("/run/netns").glob("cni-*"))


def remove_pod_netns(names: set[str] | None = None) -> None:
    """The pods' network namespaces (those ``names``, else every ``cni-*``) that no process
    uses any more."""
    used = _netns_in_use()
    for ns in Path("/run/netns").glob("cni-*"):
        if names is not None and ns.name not in names:
            continue
        try:
            if os.stat(ns).st_ino in used:
                continue
        except OSError:
            pass
        _ip("netns", "delete", ns.name, check=False)
        with contextlib.suppress(OSError):
            ns.unlink()


def remove_kube_chains() -> None:
    """kube-proxy's chains: ``kube-proxy --cleanup`` exits 1 without ipset, so by hand:
    first the rules that jump to a KUBE-* chain, then the chains."""
    for table in ("nat", "filter", "mangle"):
        rules = _iptables("-t", table, "-S").stdout.splitlines()
        for rule in rules:
            parts = shlex.split(rule)  # comments are quoted
            if parts[:1] == ["-A"] and not parts[1].startswith("KUBE-") and "KUBE-" in rule:
                _iptables("-t", table, "-D", *parts[1:])
        chains = [r.split()[1] for r in rules if r.startswith("-N KUBE-")]
        for chain in chains:
            _iptables("-t", table, "-F", chain)
        for chain in chains:
            _iptables("-t", table, "-X", chain)


def kube_chains() -> list[str]:
    return [f"{t}/{r.split()[1]}" for t in ("nat", "filter", "mangle")
            for r in _iptables("-t", t, "-S").stdout.splitlines() if r.startswith("-N KUBE-")]


def remove_bridge() -> None:
    for line in _ip("-o", "link", "show", "master", BRIDGE, check=False).stdout.splitlines():
        veth = line.split(":")[1].strip().split("@")[0]
        _ip("link", "delete", veth, check=False)
    if bridge_exists():
        _ip("link", "delete", BRIDGE, check=False)
    _ip("route", "del", "local", SERVICE_RANGE, "dev", "lo", check=False)


def leftovers(dirs: NodeDirs, ids: set[str] | None = None, netns: set[str] | None = None) -> list[str]:
    """What of the node still runs or exists: container processes (by their cgroups), shims,
    mounts, its pods' network namespaces, KUBE-* chains, the bridge, forwarding. Empty when
    clean."""
    ids = container_ids(dirs) if ids is None else ids
    netns = recorded_netns(dirs) if netns is None else netns
    sock = str(dirs.containerd_socket).encode()
    out = [f"process {pid} of a container" for pid in sorted(cgroup_pids(container_cgroups(ids)))]
    out += [f"shim {pid}" for pid, argv in processes()
            if argv[0].endswith(b"containerd-shim-runc-v2") and sock in argv]
    out += [f"mounted: {p}" for p in _mounts_under(dirs.root, dirs.run)]
    out += [f"network namespace {ns}" for ns in pod_netns() if ns in netns]
    out += [f"iptables chain left: {c}" for c in kube_chains()]
    if bridge_exists():
        out.append(f"bridge {BRIDGE} still exists")
    if (why := check_no_forwarding()) is not None:
        out.append(why)
    return out


def clean_host(dirs: NodeDirs, state: Path) -> list[str]:
    """After the node's processes stopped: kill what is left of its containers, remove what
    they left outside their folders. Returns what could not be cleaned (empty when clean)."""
    ids = container_ids(dirs)  # before dirs.run goes: it holds containerd's state
    netns = recorded_netns(dirs) | netns_of(cgroup_pids(container_cgroups(ids)))
    kill_cgroups(ids)
    kill_shims(dirs)
    unmount_under(dirs.root, dirs.run)
    remove_pod_netns()  # every cni-* no process uses: the node's, and what others left unused
    remove_kube_chains()
    remove_bridge()
    for path in HOST_LEFTOVERS:
        p = Path(path)
        if p.is_dir():
            for child in p.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        child.unlink()
    for p in Path("/var/lib/cni/results").glob(f"{CNI_NETWORK}-*"):
        with contextlib.suppress(OSError):
            p.unlink()
    try:
        before = json.loads(state.read_text()).get("route_localnet", "0")
        ROUTE_LOCALNET.write_text(f"{before}\n")
        state.unlink()
    except (OSError, ValueError):
        pass
    problems = leftovers(dirs, ids, netns)
    shutil.rmtree(dirs.run, ignore_errors=True)
    if not any(p.startswith("network namespace") for p in problems):
        (dirs.root / NETNS_FILE).unlink(missing_ok=True)
    return problems
