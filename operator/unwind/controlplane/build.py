"""Get the binaries of the local control plane and its node: etcd, kubectl, kube-apiserver,
kube-controller-manager, kubelet, kube-scheduler, kube-proxy (and the node's Debian packages).

Why this exists: the tests and ``unwind dev up`` need a *real* API server (RBAC, admission
webhooks, the Job controller), but the only registries we can reach are PyPI and Debian.
Debian ships etcd and kubectl as packages and ships Kubernetes 1.20.2 as *source* (with a
vendor tree), so we build the five server binaries from that source with one ``make`` (they
share its compile cache) once and cache them under ``~/.cache/unwind/kube-<version>/``.

The build is idempotent and atomic: binaries are built in a temporary directory and the
finished cache directory is moved into place with one ``rename``, so an interrupted build
never leaves a half cache. A file lock keeps two processes from building at once.

One fix is applied to the source: the vendored ``github.com/modern-go/reflect2`` v1.0.1
crashes the API server under Go >= 1.18 (fault in map iteration on the first custom
resource write); it is replaced by Debian's v1.0.2.
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
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

KUBE_VERSION = "1.20.2"
COMPONENTS = ("kube-apiserver", "kube-controller-manager", "kubelet", "kube-scheduler", "kube-proxy")
REFLECT2_DEBIAN = Path("/usr/share/gocode/src/github.com/modern-go/reflect2")
# tool on PATH -> Debian package that provides it
TOOL_PACKAGES = {"go": "golang-go", "etcd": "etcd-server", "kubectl": "kubernetes-client",
                 **NODE_PACKAGES,  # the node: container runtime and pod network
                 "buildah": "buildah", "debootstrap": "debootstrap",  # building the images
                 "skopeo": "skopeo",  # exporting them as docker-archives (image.py)
                 "promtool": "prometheus"}  # checking charts/unwind/files/unwind-alerts.yaml
BUILD_PACKAGES = ("rsync", "jq", "make")
FILE_PACKAGES = NODE_PACKAGE_FILES


class BuildError(RuntimeError):
    """The control-plane binaries could not be installed or built."""


@dataclass(frozen=True)
class BinPaths:
    etcd: Path
    kubectl: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kubelet: Path
    kube_scheduler: Path
    kube_proxy: Path


def cache_root() -> Path:
    env = os.environ.get("UNWIND_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "unwind"


def cache_dir(version: str = KUBE_VERSION) -> Path:
    return cache_root() / f"kube-{version}"


def _say(msg: str) -> None:
    print(f"[unwind.controlplane.build] {msg}", file=sys.stderr, flush=True)


def cached_binaries(version: str = KUBE_VERSION) -> BinPaths | None:
    """The binaries if everything is already there, else None. Never installs or builds."""
    d = cache_dir(version)
    etcd, kubectl = shutil.which("etcd"), shutil.which("kubectl")
    built = [d / name for name in COMPONENTS]
    if not (etcd and kubectl and all(os.access(p, os.X_OK) for p in built)):
        return None
    return BinPaths(Path(etcd), Path(kubectl), *built)


def _run(cmd: list[str], log: Path, *, cwd: Path | None = None,
         env: dict[str, str] | None = None) -> None:
    with log.open("a") as fh:
        fh.write(f"\n$ {' '.join(cmd)}\n")
        fh.flush()
        rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            cwd=cwd, env=env, check=False).returncode
    if rc != 0:
        raise BuildError(f"command failed (exit {rc}): {' '.join(cmd)}; see log {log}")


def _apt_env() -> dict[str, str]:
    return {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}


def _enable_deb_src(log: Path) -> bool:
    """Add deb-src entries mirroring the existing deb ones. True if anything changed."""
    changed = False
    for f in glob.glob("/etc/apt/sources.list.d/*.sources"):
        text = Path(f).read_text()
        new = "\n".join(
            "Types: deb deb-src" if line.strip() == "Types: deb" else line
            for line in text.split("\n")
        )
        if new != text:
            Path(f).write_text(new)
            changed = True
    main = Path("/etc/apt/sources.list")
    if main.exists():
        lines = main.read_text().splitlines()
        have = {ln.strip() for ln in lines}
        extra = [
            "deb-src" + ln.strip()[3:]
            for ln in lines
            if ln.strip().startswith("deb ") and "deb-src" + ln.strip()[3:] not in have
        ]
        if extra:
            main.write_text("\n".join([*lines, *extra]) + "\n")
            changed = True
    with log.open("a") as fh:
        fh.write(f"\n# deb-src entries added: {changed}\n")
    return changed


def _apt_updated_marker() -> Path:
    return cache_root() / ".apt-updated"


def _apt_install(packages: list[str], log: Path) -> None:
    if os.geteuid() != 0:
        raise BuildError(f"need root to install Debian packages {packages}; install them and retry")
    _run(["apt-get", "update", "-q"], log, env=_apt_env())
    _run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages], log, env=_apt_env())


def ensure_packages(log: Path) -> None:
    """Install the Debian packages that are missing (checked with shutil.which)."""
    missing = [pkg for tool, pkg in TOOL_PACKAGES.items() if not shutil.which(tool)]
    missing += [pkg for pkg in BUILD_PACKAGES if not shutil.which(pkg)]
    missing += [pkg for path, pkg in FILE_PACKAGES.items() if not Path(path).exists()]
    if not (REFLECT2_DEBIAN / "reflect2.go").exists():
        missing.append("golang-github-modern-go-reflect2-dev")
    if missing:
        _say(f"installing Debian packages: {' '.join(missing)}")
        _apt_install(missing, log)


def _download_source(dest: Path, log: Path) -> Path:
    """``apt-get source --download-only kubernetes`` into dest; returns the .orig tarball."""
    cmd = ["apt-get", "source", "--download-only", "kubernetes"]
    try:
        _run(cmd, log, cwd=dest)
    except BuildError:
        if os.geteuid() != 0:
            raise
        _say("no deb-src entries? adding them and retrying")
        _enable_deb_src(log)
        _run(["apt-get", "update", "-q"], log, env=_apt_env())
        _run(cmd, log, cwd=dest)
    origs = sorted(dest.glob("kubernetes_*.orig.tar.*"))
    if not origs:
        raise BuildError(f"apt-get source gave no kubernetes .orig tarball; see log {log}")
    return origs[0]


def _build(version: str, log: Path) -> None:
    final = cache_dir(version)
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob("build-kube-*"):  # left by a killed build; we hold the lock
        shutil.rmtree(stale, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=f"build-kube-{version}-", dir=root))
    try:
        t0 = time.monotonic()
        orig = _download_source(work, log)
        if version not in orig.name:
            raise BuildError(f"Debian's kubernetes source is {orig.name}, expected version {version}")
        _run(["tar", "xf", str(orig), "-C", str(work)], log)
        src = next(p for p in work.iterdir() if p.is_dir() and p.name.startswith("kubernetes"))
        vendored = src / "vendor/github.com/modern-go/reflect2"
        shutil.rmtree(vendored)
        shutil.copytree(REFLECT2_DEBIAN, vendored, symlinks=False)
        (vendored / "go.mod").unlink(missing_ok=True)
        home, gopath = work / "home", work / "gopath"
        home.mkdir()
        gopath.mkdir()
        env = {
            **os.environ,
            "HOME": str(home),
            "GOPATH": str(gopath),
            "CGO_ENABLED": "0",
            "GOFLAGS": "-mod=vendor",
            "GO111MODULE": "on",
            "KUBE_VERBOSE": "1",
        }
        _say(f"building {' '.join(COMPONENTS)} {version} (minutes; log: {log})")
        what = " ".join(f"cmd/{c}" for c in COMPONENTS)
        _run(["make", f"WHAT={what}"], log, cwd=src, env=env)
        staged = work / "out"
        staged.mkdir()
        for name in COMPONENTS:
            built = src / "_output/bin" / name
            if not built.exists():
                raise BuildError(f"build finished but {built} is missing; see log {log}")
            shutil.copy2(built, staged / name)
        go_version = subprocess.run(["go", "version"], capture_output=True, text=True).stdout.strip()
        (staged / "build.json").write_text(json.dumps({
            "version": version, "source": orig.name, "go": go_version,
            "seconds": round(time.monotonic() - t0), "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }, indent=2) + "\n")
        if final.exists():  # a stale, incomplete cache from an older layout
            shutil.rmtree(final)
        os.rename(staged, final)  # atomic: same filesystem
        _say(f"cached in {final} after {round(time.monotonic() - t0)}s")
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


def ensure_binaries(version: str = KUBE_VERSION) -> BinPaths:
    """Return the control-plane binaries, installing packages and building only what is missing.

    Raises BuildError (naming the build log) when that fails.
    """
    found = cached_binaries(version)
    if found:
        return found
    with cache_lock():
        found = cached_binaries(version)  # another process may have built it meanwhile
        if found:
            return found
        logs = cache_root() / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log = logs / f"build-kube-{version}-{time.strftime('%Y%m%d-%H%M%S')}.log"
        try:
            ensure_packages(log)
            if not all(os.access(cache_dir(version) / c, os.X_OK) for c in COMPONENTS):
                _build(version, log)
        except BuildError:
            raise
        except Exception as exc:  # keep the log in the message whatever failed
            raise BuildError(f"{type(exc).__name__}: {exc}; see log {log}") from exc
        found = cached_binaries(version)
        if not found:
            raise BuildError(f"binaries still missing after install/build; see log {log}")
        return found


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("-h", "--help"):
        print("usage: python -m unwind.controlplane.build [--packages-only]  # install packages, "
              "build and cache")
        return 0
    if args and args[0] == "--packages-only":
        logs = cache_root() / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        try:
            with cache_lock():
                ensure_packages(logs / f"packages-{time.strftime('%Y%m%d-%H%M%S')}.log")
        except BuildError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return 0
    try:
        bins = ensure_binaries()
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for field, path in vars(bins).items():
        print(f"{field}={path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
