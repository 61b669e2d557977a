"""The Pod Security Standards' ``restricted`` profile as a pure checker of a pod spec.

Why here: the namespaces Unwind runs in may enforce ``pod-security.kubernetes.io/enforce:
restricted``; what Unwind adds (the gateway, in either form) and the pods it makes (undo
Jobs) must never turn a compliant pod into a refused one. One function per control, named
as https://kubernetes.io/docs/concepts/security/pod-security-standards/ names it (the
restricted profile is every baseline control plus its own); each returns one line per
offending field. No cluster needed: the tests run the pods through ``violations``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

Spec = Mapping[str, Any]
ALLOWED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                   "projected", "secret"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes"}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}


def containers(spec: Spec) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        for i, c in enumerate(spec.get(kind) or []):
            yield f"spec.{kind}[{i}]", c


def _sc(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("securityContext") or {}


# ---- baseline ----

def host_process(spec: Spec) -> list[str]:
    """Baseline "HostProcess": windowsOptions.hostProcess unset or false."""
    out = ["spec.securityContext.windowsOptions.hostProcess"] if (_sc(spec).get("windowsOptions") or {}).get(
        "hostProcess") else []
    out += [f"{at}.securityContext.windowsOptions.hostProcess" for at, c in containers(spec)
            if (_sc(c).get("windowsOptions") or {}).get("hostProcess")]
    return out


def host_namespaces(spec: Spec) -> list[str]:
    """Baseline "Host Namespaces": hostNetwork, hostPID, hostIPC unset or false."""
    return [f"spec.{f}" for f in ("hostNetwork", "hostPID", "hostIPC") if spec.get(f)]


def privileged_containers(spec: Spec) -> list[str]:
    """Baseline "Privileged Containers": securityContext.privileged unset or false."""
    return [f"{at}.securityContext.privileged" for at, c in containers(spec) if _sc(c).get("privileged")]


def hostpath_volumes(spec: Spec) -> list[str]:
    """Baseline "HostPath Volumes": none."""
    return [f"spec.volumes[{i}].hostPath" for i, v in enumerate(spec.get("volumes") or []) if "hostPath" in v]


def host_ports(spec: Spec) -> list[str]:
    """Baseline "Host Ports": hostPort unset or 0."""
    return [f"{at}.ports[{i}].hostPort" for at, c in containers(spec)
            for i, p in enumerate(c.get("ports") or []) if p.get("hostPort")]


def apparmor(spec: Spec) -> list[str]:
    """Baseline "AppArmor": unset, RuntimeDefault or Localhost."""
    bad = [("spec.securityContext.appArmorProfile", _sc(spec).get("appArmorProfile"))]
    bad += [(f"{at}.securityContext.appArmorProfile", _sc(c).get("appArmorProfile")) for at, c in containers(spec)]
    return [at for at, p in bad if p and p.get("type") not in ("RuntimeDefault", "Localhost")]


def selinux(spec: Spec) -> list[str]:
    """Baseline "SELinux": type unset or a container type; user and role unset."""
    out = []
    for at, obj in [("spec", spec), *containers(spec)]:
        options = _sc(obj).get("seLinuxOptions") or {}
        if options.get("type", "") not in SELINUX_TYPES:
            out.append(f"{at}.securityContext.seLinuxOptions.type")
        out += [f"{at}.securityContext.seLinuxOptions.{f}" for f in ("user", "role") if options.get(f)]
    return out


def proc_mount(spec: Spec) -> list[str]:
    """Baseline "/proc Mount Type": procMount unset or Default."""
    return [f"{at}.securityContext.procMount" for at, c in containers(spec)
            if _sc(c).get("procMount") not in (None, "Default")]


def sysctls(spec: Spec) -> list[str]:
    """Baseline "Sysctls": only the safe set."""
    return [f"spec.securityContext.sysctls[{i}]" for i, s in enumerate(_sc(spec).get("sysctls") or [])
            if s.get("name") not in SAFE_SYSCTLS]


# ---- restricted ----

def volume_types(spec: Spec) -> list[str]:
    """Restricted "Volume Types": only configMap, csi, downwardAPI, emptyDir, ephemeral,
    persistentVolumeClaim, projected, secret."""
    return [f"spec.volumes[{i}] ({', '.join(sorted(set(v) - {'name'}))})" for i, v in enumerate(spec.get("volumes") or [])
            if not set(v) - {"name"} <= ALLOWED_VOLUMES or not set(v) - {"name"}]


def privilege_escalation(spec: Spec) -> list[str]:
    """Restricted "Privilege Escalation (v1.8+)": allowPrivilegeEscalation false, set on
    every container."""
    return [f"{at}.securityContext.allowPrivilegeEscalation" for at, c in containers(spec)
            if _sc(c).get("allowPrivilegeEscalation") is not False]


def running_as_non_root(spec: Spec) -> list[str]:
    """Restricted "Running as Non-root": runAsNonRoot true on the pod, or on every
    container; no container sets it false."""
    pod = _sc(spec).get("runAsNonRoot")
    return [f"{at}.securityContext.runAsNonRoot" for at, c in containers(spec)
            if _sc(c).get("runAsNonRoot") is False or (pod is not True and _sc(c).get("runAsNonRoot") is not True)]


def running_as_non_root_user(spec: Spec) -> list[str]:
    """Restricted "Running as Non-root user (v1.23+)": runAsUser not 0."""
    return [f"{at}.securityContext.runAsUser" for at, obj in [("spec", spec), *containers(spec)]
            if _sc(obj).get("runAsUser") == 0]


def seccomp(spec: Spec) -> list[str]:
    """Restricted "Seccomp (v1.19+)": type RuntimeDefault or Localhost, on the pod or on
    every container; Unconfined nowhere."""
    allowed = ("RuntimeDefault", "Localhost")
    pod = (_sc(spec).get("seccompProfile") or {}).get("type")
    out = ["spec.securityContext.seccompProfile"] if pod is not None and pod not in allowed else []
    for at, c in containers(spec):
        own = (_sc(c).get("seccompProfile") or {}).get("type")
        if (own is not None and own not in allowed) or (own is None and pod not in allowed):
            out.append(f"{at}.securityContext.seccompProfile")
    return out


def capabilities(spec: Spec) -> list[str]:
    """Restricted "Capabilities (v1.22+)": drop ALL; add nothing but NET_BIND_SERVICE."""
    out = []
    for at, c in containers(spec):
        caps = _sc(c).get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{at}.securityContext.capabilities.drop")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            out.append(f"{at}.securityContext.capabilities.add")
    return out


CONTROLS: dict[str, Callable[[Spec], list[str]]] = {
    "HostProcess": host_process, "Host Namespaces": host_namespaces,
    "Privileged Containers": privileged_containers, "HostPath Volumes": hostpath_volumes,
    "Host Ports": host_ports, "AppArmor": apparmor, "SELinux": selinux, "/proc Mount Type": proc_mount,
    "Sysctls": sysctls, "Volume Types": volume_types, "Privilege Escalation": privilege_escalation,
    "Running as Non-root": running_as_non_root, "Running as Non-root user": running_as_non_root_user,
    "Seccomp": seccomp, "Capabilities": capabilities,
}


def violations(spec: Spec) -> list[str]:
    """Every field of a pod spec the restricted profile refuses, as ``control: field``."""
    return [f"{name}: {field}" for name, check in CONTROLS.items() for field in check(spec)]
