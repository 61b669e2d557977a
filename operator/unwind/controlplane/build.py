"""Get the binaries of the local control plane and its node, and the Debian packages they need.

Why this exists: the tests and ``unwind dev up`` need a *real*, current Kubernetes (RBAC,
admission webhooks and Pod Security, the Job controller, native sidecars on a real kubelet),
and no prebuilt binary can be downloaded here. The Go module proxy serves
``k8s.io/kubernetes`` though, so the binaries are built from Go modules: two small build
modules of the project's own (``gobuild/controlplane`` and ``gobuild/node``, shipped with
the package) each require one ``k8s.io/kubernetes`` version and pin every staging module
(which Kubernetes' own go.mod replaces with a local path) to the matching
``v0.<minor>.<patch>`` with replace lines; their ``tool`` lines name the commands. Two
modules because the node is older than the control plane (cgroup v1 and containerd 1.6
here, see docs/controlplane.md), and a module holds one version of ``k8s.io/kubernetes``.

- **control plane** (:data:`PARTS`): etcd (the ``go.etcd.io/etcd/server/v3`` that Kubernetes
  itself pins), kube-apiserver, kube-controller-manager, kube-scheduler and kubectl;
- **node**: kubelet and kube-proxy.

Each part is one ``go build`` of all its commands (they share the compile), static
(``CGO_ENABLED=0``), ``-trimpath -ldflags=-s -w`` and the version stamped as Kubernetes'
release build stamps it (``kubectl version`` and the Node's kubelet version show it). The
result goes to ``cache_root()/kube-go-<part>-<version>-<digest>/``, where the digest covers
the build module (go.mod, go.sum), the Go version and :data:`RECIPE`; the module and build
caches (``GOMODCACHE``, ``GOCACHE``) live under ``cache_root()/go`` so a warm machine builds
fast, but nothing depends on them. A build happens in a temporary directory that is renamed
into place, so an interrupted build never leaves a half cache; a file lock keeps two
processes from building at once.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .kubenode import NODE_PACKAGE_FILES, NODE_PACKAGES

GOBUILD = Path(__file__).resolve().parent / "gobuild"
GO_MIN = (1, 26)  # Kubernetes 1.37's go.mod says go 1.26.0
# Bump when the build below changes in a way go.mod, go.sum and the Go version do not show.
RECIPE = "go-build-1: CGO_ENABLED=0 -trimpath -ldflags=-s -w, version stamps"
# tool on PATH -> Debian package that provides it
TOOL_PACKAGES = {**NODE_PACKAGES,  # the node: container runtime and pod network
                 "buildah": "buildah", "debootstrap": "debootstrap",  # building the images
                 "skopeo": "skopeo",  # exporting them as docker-archives (image.py)
                 "promtool": "prometheus",  # checking charts/unwind/files/unwind-alerts.yaml
                 "redis-server": "redis-server"}  # the gateway's shared rate limits (tests)
FILE_PACKAGES = NODE_PACKAGE_FILES
# What the machine must bring: checked (go_version), never installed (Debian 12's Go is 1.19).
MACHINE_TOOLS = ("go",)
VERSION_PACKAGES = ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")


class BuildError(RuntimeError):
    """The control-plane binaries could not be installed or built."""


@dataclass(frozen=True)
class Part:
    """One build module and the commands built from it (package -> binary name)."""

    name: str
    commands: tuple[tuple[str, str], ...]

    @property
    def module(self) -> Path:
        return GOBUILD / self.name

    @property
    def kube_version(self) -> str:
        """The ``k8s.io/kubernetes`` version the module requires (``1.37.2``)."""
        return module_kube_version((self.module / "go.mod").read_text())


PARTS = (
    Part("controlplane", (("go.etcd.io/etcd/server/v3", "etcd"),
                          ("k8s.io/kubernetes/cmd/kube-apiserver", "kube-apiserver"),
                          ("k8s.io/kubernetes/cmd/kube-controller-manager", "kube-controller-manager"),
                          ("k8s.io/kubernetes/cmd/kube-scheduler", "kube-scheduler"),
                          ("k8s.io/kubernetes/cmd/kubectl", "kubectl"))),
    Part("node", (("k8s.io/kubernetes/cmd/kubelet", "kubelet"),
                  ("k8s.io/kubernetes/cmd/kube-proxy", "kube-proxy"))),
)


@dataclass(frozen=True)
class BinPaths:
    etcd: Path
    kubectl: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kubelet: Path
    kube_scheduler: Path
    kube_proxy: Path


_REQUIRE = re.compile(r"^(?:require)?\s+k8s\.io/kubernetes\s+v(\d+\.\d+\.\d+)\s*(?://.*)?$", re.M)
_STAGING = re.compile(r"^\s*(k8s\.io/[\w.-]+)\s*=>\s*\./staging/", re.M)
_REPLACE = re.compile(r"^\s*(k8s\.io/[\w.-]+)\s*=>\s*(\S+)\s+(\S+)\s*$", re.M)


def module_kube_version(go_mod: str) -> str:
    found = _REQUIRE.findall(go_mod)
    if len(found) != 1:
        raise BuildError("a build module's go.mod must require k8s.io/kubernetes once (vX.Y.Z)")
    return str(found[0])


def staging_pins(go_mod: str) -> dict[str, tuple[str, str]]:
    """The module's replace lines for k8s.io modules: name -> (replacement, version)."""
    return {name: (target, version) for name, target, version in _REPLACE.findall(go_mod)}


def pin_problems(go_mod: str) -> list[str]:
    """What is wrong with the staging pins: each must be replaced by itself at
    ``v0.<minor>.<patch>`` of the required Kubernetes (a path replacement, as Kubernetes'
    own go.mod has, does not build outside its tree)."""
    _, minor, patch = module_kube_version(go_mod).split(".")
    want = f"v0.{minor}.{patch}"
    pins = staging_pins(go_mod)
    out = [f"{name} => {target} {version}: expected {name} {want}"
           for name, (target, version) in sorted(pins.items()) if (target, version) != (name, want)]
    for required in ("k8s.io/api", "k8s.io/apimachinery", "k8s.io/client-go", "k8s.io/apiserver",
                     "k8s.io/component-base", "k8s.io/kubelet"):
        if required not in pins:
            out.append(f"{required} is not pinned (expected {required} => {required} {want})")
    return out


def module_text(part: Part, version: str, kubernetes_go_mod: str) -> str:
    """A build module's go.mod before ``go mod tidy``: Kubernetes ``version`` required, each
    staging module that its own go.mod (``kubernetes_go_mod``) replaces with a local path
    pinned to ``v0.<minor>.<patch>``, and the part's commands as tools."""
    _, minor, patch = version.split(".")
    staging = sorted(set(_STAGING.findall(kubernetes_go_mod)))
    if not staging:
        raise BuildError(f"Kubernetes {version}'s go.mod replaces no staging module: not a go.mod of k8s.io/kubernetes?")
    lines = [f"// Unwind's build module for the local {part.name}: Kubernetes {version}, with each staging",
             "// module (which Kubernetes' own go.mod replaces with a local path) pinned to its",
             f"// v0.{minor}.{patch}. Written by `python -m unwind.controlplane.build --write-module "
             f"{part.name} {version}`.",
             f"module unwind.dev/gobuild/{part.name}", "", f"go {'.'.join(map(str, GO_MIN))}.0", "",
             f"require k8s.io/kubernetes v{version}", "", "replace (",
             *(f"\t{name} => {name} v0.{minor}.{patch}" for name in staging), ")", "",
             *(f"tool {pkg}" for pkg, _ in part.commands)]
    return "\n".join(lines) + "\n"


def write_module(name: str, version: str) -> Path:
    """Point the build module ``name`` at Kubernetes ``version`` (to move to a new release):
    read that release's go.mod from the module proxy, write ours, ``go mod tidy``."""
    part = next((p for p in PARTS if p.name == name), None)
    if part is None or not re.fullmatch(r"\d+\.\d+\.\d+", version):
        raise BuildError(f"usage: --write-module {{{','.join(p.name for p in PARTS)}}} X.Y.Z")
    env = go_env()
    got = subprocess.run(["go", "mod", "download", "-json", f"k8s.io/kubernetes@v{version}"],
                         capture_output=True, text=True, env=env, check=False)
    try:
        go_mod = Path(json.loads(got.stdout)["GoMod"]).read_text()
    except (ValueError, KeyError, OSError) as exc:
        raise BuildError(f"k8s.io/kubernetes v{version} could not be had: {got.stdout}{got.stderr}") from exc
    (part.module / "go.mod").write_text(module_text(part, version, go_mod))
    env["GOFLAGS"] = "-mod=mod"
    tidy = subprocess.run(["go", "mod", "tidy"], cwd=part.module, env=env, capture_output=True, text=True)
    if tidy.returncode != 0:
        raise BuildError(f"go mod tidy failed in {part.module}: {tidy.stderr.strip()}")
    return part.module


def cache_root() -> Path:
    env = os.environ.get("UNWIND_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "unwind"


def go_dirs() -> dict[str, Path]:
    """The Go module and build caches, shared by every part (and the pause image)."""
    root = cache_root() / "go"
    return {"GOMODCACHE": root / "mod", "GOCACHE": root / "build", "GOPATH": root / "path"}


def _say(msg: str) -> None:
    print(f"[unwind.controlplane.build] {msg}", file=sys.stderr, flush=True)


@functools.cache  # one toolchain per process; a failure is not cached (it raises)
def go_version() -> str:
    """``go1.26.8``; BuildError when Go is missing or older than :data:`GO_MIN`."""
    if shutil.which("go") is None:
        raise BuildError("no `go` on PATH: the control plane is built with Go "
                         f"{'.'.join(map(str, GO_MIN))} or newer (these machines have it in /usr/local/go)")
    out = subprocess.run(["go", "env", "GOVERSION"], capture_output=True, text=True, check=False,
                         env={**os.environ, "GOTOOLCHAIN": "local"}).stdout.strip()
    found = re.match(r"go(\d+)\.(\d+)", out)
    if not found or (int(found[1]), int(found[2])) < GO_MIN:
        raise BuildError(f"`go` is {out or 'unknown'}; the control plane needs Go "
                         f"{'.'.join(map(str, GO_MIN))} or newer")
    return out


def part_digest(part: Part, go: str) -> str:
    h = hashlib.sha256()
    for item in (RECIPE, go, (part.module / "go.mod").read_text(), (part.module / "go.sum").read_text()):
        h.update(item.encode())
        h.update(b"\0")
    return h.hexdigest()


def part_dir(part: Part, go: str) -> Path:
    """``kube-go-...``: never the name of the 1.20 cache (``kube-1.20.2``)."""
    return cache_root() / f"kube-go-{part.name}-{part.kube_version}-{part_digest(part, go)[:12]}"


def _complete(part: Part, directory: Path) -> bool:
    return all(os.access(directory / binary, os.X_OK) for _, binary in part.commands)


def cached_binaries() -> BinPaths | None:
    """The binaries if every part is already built, else None. Never builds."""
    try:
        go = go_version()
    except BuildError:
        return None
    dirs = [part_dir(part, go) for part in PARTS]
    if not all(_complete(part, d) for part, d in zip(PARTS, dirs, strict=True)):
        return None
    return _bin_paths(dirs)


def kubectl_binary() -> str:
    """The kubectl built with the control plane (its version, so ``kubectl events`` and the
    rest of a current client are there), else the one on PATH."""
    found = cached_binaries()
    return str(found.kubectl) if found else "kubectl"


def _bin_paths(dirs: list[Path]) -> BinPaths:
    cp, node = dirs
    return BinPaths(cp / "etcd", cp / "kubectl", cp / "kube-apiserver", cp / "kube-controller-manager",
                    node / "kubelet", cp / "kube-scheduler", node / "kube-proxy")


def _run(cmd: list[str], log: Path, *, cwd: Path | None = None,
         env: dict[str, str] | None = None) -> None:
    with log.open("a") as fh:
        fh.write(f"\n$ {' '.join(cmd)}\n")
        fh.flush()
        rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            cwd=cwd, env=env, check=False).returncode
    if rc != 0:
        raise BuildError(f"command failed (exit {rc}): {' '.join(cmd)}; see log {log}")


def version_ldflags(version: str) -> str:
    """What Kubernetes' release build stamps (hack/lib/version.sh), so ``--version``, the
    Node's kubeletVersion and ``kubectl version`` say ``v1.37.2`` (not ``v0.0.0-master``)."""
    _, minor, _ = version.split(".")
    flags = ["-s", "-w"]
    for pkg in VERSION_PACKAGES:
        flags += [f"-X {pkg}.{var}={value}" for var, value in (
            ("gitVersion", f"v{version}"), ("gitMajor", "1"), ("gitMinor", minor),
            ("gitTreeState", "clean"), ("buildDate", "1970-01-01T00:00:00Z"))]
    return " ".join(flags)


def go_env() -> dict[str, str]:
    dirs = go_dirs()
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    return {**os.environ, **{k: str(v) for k, v in dirs.items()},
            "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOWORK": "off",
            "GOFLAGS": "-trimpath -mod=readonly -buildvcs=false"}


def build_part(part: Part, go: str, log: Path) -> Path:
    """One ``go build`` of the part's commands into its cache directory; returns it."""
    final = part_dir(part, go)
    root = cache_root()
    for stale in root.glob(f"build-go-{part.name}-*"):  # left by a killed build; we hold the lock
        shutil.rmtree(stale, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=f"build-go-{part.name}-", dir=root))
    try:
        t0 = time.monotonic()
        version = part.kube_version
        _say(f"building {' '.join(b for _, b in part.commands)} {version} from Go modules "
             f"(minutes when cold; log: {log})")
        out = work / "out"
        out.mkdir()
        _run(["go", "build", f"-ldflags={version_ldflags(version)}", "-o", f"{work / 'bin'}/",
              *(pkg for pkg, _ in part.commands)], log, cwd=part.module, env=go_env())
        for pkg, binary in part.commands:
            # `go build -o DIR/` names a binary after its package's last element ("v3" is a
            # major-version suffix, so etcd's is "server")
            parts = pkg.split("/")
            built = work / "bin" / (parts[-2] if re.fullmatch(r"v\d+", parts[-1]) else parts[-1])
            if not built.exists():
                raise BuildError(f"go build finished but {built.name} is missing; see log {log}")
            shutil.move(built, out / binary)
        seconds = round(time.monotonic() - t0)
        (out / "build.json").write_text(json.dumps({
            "part": part.name, "kubernetes": version, "go": go, "recipe": RECIPE,
            "binaries": [b for _, b in part.commands], "seconds": seconds,
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, indent=2) + "\n")
        if final.exists():  # an incomplete one: _complete said no
            shutil.rmtree(final)
        os.rename(out, final)  # atomic: same filesystem
        _say(f"{part.name} cached in {final} after {seconds}s")
        return final
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextmanager
def cache_lock(name: str = "build") -> Iterator[None]:
    """One process at a time builds into the cache (``cache_root()/.NAME.lock``)."""
    cache_root().mkdir(parents=True, exist_ok=True)
    with (cache_root() / f".{name}.lock").open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _apt_install(packages: list[str], log: Path) -> None:
    if os.geteuid() != 0:
        raise BuildError(f"need root to install Debian packages {packages}; install them and retry")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    wait = ["-o", "DPkg::Lock::Timeout=600"]  # another install may hold dpkg's lock for a while
    _run(["apt-get", *wait, "update", "-q"], log, env=env)
    _run(["apt-get", *wait, "install", "-y", "-q", "--no-install-recommends", *packages], log, env=env)


def missing_packages() -> list[str]:
    missing = {pkg for tool, pkg in TOOL_PACKAGES.items() if not shutil.which(tool)}
    missing |= {pkg for path, pkg in FILE_PACKAGES.items() if not Path(path).exists()}
    return sorted(missing)


def ensure_packages(log: Path) -> None:
    """Install the Debian packages that are missing (checked with shutil.which)."""
    if missing := missing_packages():
        _say(f"installing Debian packages: {' '.join(missing)}")
        _apt_install(missing, log)


def _log_file(stem: str) -> Path:
    logs = cache_root() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    return logs / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}.log"


def ensure_binaries() -> BinPaths:
    """Return the binaries, building only the parts that are missing.

    Raises BuildError (naming the build log) when that fails.
    """
    found = cached_binaries()
    if found:
        return found
    with cache_lock("build-go"):  # not the 1.20 build's lock: the two never share a file
        found = cached_binaries()  # another process may have built them meanwhile
        if found:
            return found
        go = go_version()
        log = _log_file("build-kube-go")
        try:
            dirs = []
            for part in PARTS:
                d = part_dir(part, go)
                dirs.append(d if _complete(part, d) else build_part(part, go, log))
        except BuildError:
            raise
        except Exception as exc:  # keep the log in the message whatever failed
            raise BuildError(f"{type(exc).__name__}: {exc}; see log {log}") from exc
        return _bin_paths(dirs)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("-h", "--help"):
        print("usage: python -m unwind.controlplane.build [--packages-only]  # install packages, "
              "build and cache\n       python -m unwind.controlplane.build --write-module "
              "{controlplane,node} X.Y.Z  # move a build module to another Kubernetes")
        return 0
    try:
        if args and args[0] == "--write-module":
            print(write_module(*args[1:3]) if len(args) == 3 else write_module("", ""))
            return 0
        if args and args[0] == "--packages-only":
            with cache_lock("packages"):
                ensure_packages(_log_file("packages"))
            return 0
        bins = ensure_binaries()
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for field, path in vars(bins).items():
        print(f"{field}={path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
