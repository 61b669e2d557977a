"""Build the project's container image, its base and a pause image without a Docker engine.

Why this exists: a real node (kubelet + containerd) needs the project's image, but this kind
of machine has no Docker engine and can reach no container registry, so neither
``python:3.11-slim`` nor ``registry.k8s.io/pause`` can be pulled. Everything is made locally
with Debian's tools:

* **base** ``localhost/python:3.11-debian``: ``debootstrap --variant=minbase`` of bookworm from
  the machine's own Debian apt source, trimmed, with a venv at ``/usr/local/py`` first on
  ``PATH`` (Debian's own pip is PEP 668-blocked), committed with ``buildah from scratch``;
* **unwind** ``localhost/unwind:dev`` (``docker.io/library/unwind:dev`` to containerd, the name
  ``image: unwind:dev`` resolves to): the Dockerfile *as written*, ``buildah bud`` with
  ``--build-arg PYTHON_IMAGE=`` the base. Its ``pip wheel`` step runs with the host's pip
  configuration, the local paths it names and the CA bundle mounted read-only (nothing of
  the host lands in the image; ``buildah bud -v`` leaves only empty mount points);
* **pause** ``localhost/unwind-pause:1``: a static Go program that waits for SIGINT/SIGTERM
  and reaps children.

Each result is keyed by a sha256 of its inputs (for unwind: the files the build context keeps
after ``.dockerignore``, plus the base's key) and exported to
``cache_root()/images/<name>-<key>.tar`` (``docker-archive``, written under a temporary name
and renamed), so an unchanged second call runs no command. buildah's storage is private
(``cache_root()/buildah``, vfs driver). A file lock keeps two builds apart; every command's
output goes to one log under ``cache_root()/logs`` and a failure names the step and the log.
What goes into the keys: :mod:`~unwind.controlplane.imageinputs`; loading the archives into
a node's containerd: :mod:`~unwind.controlplane.imageimport`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

from .build import cache_lock, cache_root
from .imageinputs import (
    CA_MOUNT,
    SUITE,
    _digest,
    _file_digest,
    context_files,
    debian_mirror,
    host_pip_config,
    pip_mounts,
    write_pip_conf,
)
from .imageinputs import ImageError as ImageError  # raised by every step here

ROOT = Path(__file__).resolve().parents[3]

# Bump when a recipe below changes in a way the hashed inputs do not show.
RECIPE_VERSION = "1"

BASE_IMAGE = "localhost/python:3.11-debian"
UNWIND_IMAGE = "localhost/unwind:dev"
# What containerd calls the image a pod's `image: unwind:dev` asks for.
UNWIND_IMAGE_CONTAINERD = "docker.io/library/unwind:dev"
PAUSE_IMAGE = "localhost/unwind-pause:1"
KEY_LABEL = "io.unwind.inputs-digest"

DEBOOTSTRAP_INCLUDE = ("python3", "python3-venv", "ca-certificates")
DEBOOTSTRAP_ARGS = ("--variant=minbase", f"--include={','.join(DEBOOTSTRAP_INCLUDE)}")
VENV = "/usr/local/py"
BASE_PATH = f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Removed from the debootstrapped tree: package lists and caches, docs, locales, logs, and the
# files that would carry this machine into the image (its apt source, hostname, resolver).
BASE_TRIM = (
    "var/lib/apt/lists/*", "var/cache/apt/*", "var/cache/debconf/*-old", "var/log/*",
    "usr/share/doc/*", "usr/share/man/*", "usr/share/info/*", "usr/share/locale/*",
    "usr/share/lintian/*", "usr/share/common-licenses/*", "etc/apt/sources.list",
    "etc/apt/sources.list.d/*", "etc/hostname", "etc/resolv.conf", "dev/*", "run/*", "tmp/*",
    "debootstrap",
)
BASE_ENV = ("LANG=C.UTF-8", f"PATH={BASE_PATH}")

PIP_CONF_MOUNT = "/etc/pip.conf"  # where the build's pip finds the host's merged settings

# pause: PID 1 of a pod sandbox (a Go file beside the build modules; its text is the key)
PAUSE_GO = (Path(__file__).resolve().parent / "gobuild" / "pause" / "pause.go").read_text()


@dataclass(frozen=True)
class BuiltImage:
    name: str                # "python", "unwind", "pause": the tar's file name prefix
    ref: str                 # the primary reference in buildah's storage
    tags: tuple[str, ...]    # every reference the docker-archive carries
    key: str                 # sha256 of the inputs (hex)
    tar: Path                # cache_root()/images/<name>-<key>.tar


@dataclass(frozen=True)
class Images:
    base: BuiltImage
    unwind: BuiltImage
    pause: BuiltImage
    built: tuple[str, ...] = field(default=())  # names built by this call (empty: all cached)

    @property
    def unwind_image(self) -> str:
        return UNWIND_IMAGE_CONTAINERD

    @property
    def pause_image(self) -> str:
        return PAUSE_IMAGE

    @property
    def tars(self) -> tuple[Path, ...]:
        """The archives a node needs (the base is only an input of the unwind image)."""
        return (self.unwind.tar, self.pause.tar)


def _say(msg: str) -> None:
    print(f"[unwind.controlplane.image] {msg}", file=sys.stderr, flush=True)


def images_dir() -> Path:
    return cache_root() / "images"


def buildah_storage() -> tuple[Path, Path]:
    """(root, runroot) of the private buildah storage."""
    return cache_root() / "buildah" / "root", cache_root() / "buildah" / "runroot"


def buildah_cmd(*args: str) -> list[str]:
    root, runroot = buildah_storage()
    return ["buildah", "--root", str(root), "--runroot", str(runroot), "--storage-driver", "vfs",
            *args]


def _storage_ref(ref: str) -> str:
    root, runroot = buildah_storage()
    return f"containers-storage:[vfs@{root}+{runroot}]{ref}"


def base_key() -> str:
    """The base image's key: the debootstrap arguments, suite, trims, venv and env."""
    return _digest(["base", RECIPE_VERSION, SUITE, *DEBOOTSTRAP_ARGS, VENV, *BASE_TRIM, *BASE_ENV])


def pause_key() -> str:
    return _digest(["pause", RECIPE_VERSION, PAUSE_GO])


def image_inputs_digest(root: Path = ROOT, base: str | None = None) -> str:
    """The unwind image's key: the Dockerfile, every file the build context keeps, the base's key."""
    parts = ["unwind", RECIPE_VERSION, base if base is not None else base_key(), BASE_IMAGE,
             "Dockerfile", _file_digest(root / "Dockerfile")]
    for rel in context_files(root):
        parts += [rel, _file_digest(root / rel)]
    return _digest(parts)


# --- running the steps -------------------------------------------------------------

class _Log:
    def __init__(self, path: Path, redact: Sequence[str] = ()) -> None:
        self.path = path
        self.redact = [r for r in redact if r]

    def _show(self, cmd: Sequence[str]) -> str:
        text = " ".join(cmd)
        for secret in self.redact:
            text = text.replace(secret, "<mirror>")
        return text

    def note(self, text: str) -> None:
        with self.path.open("a") as fh:
            fh.write(f"# {text}\n")

    def run(self, step: str, cmd: Sequence[str], *, cwd: Path | None = None,
            env: dict[str, str] | None = None, capture: bool = False) -> str:
        """Run one command with its output in the log; raise ImageError naming step and log."""
        with self.path.open("a") as fh:
            fh.write(f"\n# step: {step}\n$ {self._show(cmd)}\n")
            fh.flush()
            try:
                proc = subprocess.run(list(cmd), stdout=subprocess.PIPE if capture else fh,
                                      stderr=fh, stdin=subprocess.DEVNULL, cwd=cwd, env=env,
                                      text=True, check=False)
            except OSError as exc:
                raise ImageError(f"step {step!r} could not start {cmd[0]}: {exc}; "
                                 f"see log {self.path}") from exc
            if capture and proc.stdout:
                fh.write(proc.stdout)
        if proc.returncode != 0:
            raise ImageError(f"step {step!r} failed (exit {proc.returncode}): "
                             f"{self._show(cmd)}; see log {self.path}")
        return proc.stdout if capture else ""


def _tar_path(name: str, key: str) -> Path:
    return images_dir() / f"{name}-{key}.tar"


def _unmount_under(path: Path) -> None:
    """Unmount whatever a killed debootstrap left mounted inside `path` (deepest first)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return
    prefix = str(path.resolve()) + "/"
    points = [ln.split()[4] for ln in lines if len(ln.split()) > 4]
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)


def _clean_stale() -> None:
    for stale in images_dir().glob("tmp-*"):  # left by a killed build; we hold the lock
        if stale.is_dir():
            _unmount_under(stale)
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)


def _export(log: _Log, img: BuiltImage, seconds: dict[str, float]) -> None:
    """docker-archive of `img` with all its tags, written to a temporary name, then renamed."""
    t0 = time.monotonic()
    tmp = images_dir() / f"tmp-{img.name}-{os.getpid()}.tar"
    tmp.unlink(missing_ok=True)
    extra = [a for t in img.tags[1:] for a in ("--additional-tag", t)]
    log.run(f"export {img.name}", ["skopeo", "copy", "--quiet", *extra, _storage_ref(img.ref),
                                   f"docker-archive:{tmp}:{img.tags[0]}"])
    seconds[f"export_{img.name}"] = round(time.monotonic() - t0, 1)
    meta = {"ref": img.ref, "tags": list(img.tags), "key": img.key, "bytes": tmp.stat().st_size,
            "seconds": seconds, "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    img.tar.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
    os.rename(tmp, img.tar)
    _prune_archives(img)


def _prune_archives(img: BuiltImage, keep: int = 2) -> None:
    """Keep the newest `keep` archives of img.name (the current one among them): a process
    that planned the previous one a moment ago may still be importing it."""
    tars = sorted(images_dir().glob(f"{img.name}-*.tar"), key=lambda p: p.stat().st_mtime,
                  reverse=True)
    kept = [img.tar, *[t for t in tars if t != img.tar][:keep - 1]]
    for tar in tars:
        if tar not in kept:
            tar.unlink(missing_ok=True)
    for meta in images_dir().glob(f"{img.name}-*.json"):
        if meta.with_suffix(".tar") not in kept:
            meta.unlink(missing_ok=True)


def _prune_storage(log: _Log, img: BuiltImage) -> None:
    """Drop older builds of `img` from buildah's storage (vfs keeps full copies of each)."""
    current = img.tags[-1]  # the content-addressed tag: <repo>:<...><key[:12]>
    prefix = current[:-12]
    try:  # best effort: the archive is written already
        listing = log.run(f"prune {img.name}",
                          buildah_cmd("images", "--format", "{{.Name}}:{{.Tag}}"), capture=True)
        for ref in listing.split():
            stale_key = ref[len(prefix):]
            if ref != current and ref.startswith(prefix) and re.fullmatch(r"[0-9a-f]{12}", stale_key):
                log.run(f"prune {img.name}", buildah_cmd("rmi", ref))
        log.run(f"prune {img.name}", buildah_cmd("rmi", "--prune"))
    except ImageError as exc:
        log.note(f"pruning buildah storage failed, ignored: {exc}")


def _in_storage(log: _Log, ref: str, key: str) -> bool:
    """Whether buildah's storage holds `ref` built from `key` (read from its label)."""
    proc = subprocess.run(buildah_cmd("inspect", "--type", "image", ref),
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return False
    try:  # buildah 1.28's --format has no `json` function: read the whole document
        labels = json.loads(proc.stdout)["OCIv1"]["config"].get("Labels") or {}
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
        return False
    found = labels.get(KEY_LABEL) == key
    log.note(f"{ref} in buildah storage, key {labels.get(KEY_LABEL)}: {'current' if found else 'stale'}")
    return bool(found)


def _commit_scratch(log: _Log, img: BuiltImage, step: str, *, add: list[tuple[str, str]],
                    config: list[str]) -> None:
    """`buildah from scratch`, add files, config, commit as img.ref, tag with the rest."""
    ctr = log.run(f"{step}: from scratch", buildah_cmd("from", "scratch"), capture=True).strip()
    try:
        for src, dest in add:
            log.run(f"{step}: add", buildah_cmd("add", ctr, src, dest))
        log.run(f"{step}: config", buildah_cmd("config", "--label", f"{KEY_LABEL}={img.key}",
                                               *config, ctr))
        log.run(f"{step}: commit", buildah_cmd("commit", "--quiet", "--rm", ctr, img.ref))
    except BaseException:
        subprocess.run(buildah_cmd("rm", ctr), capture_output=True, check=False)
        raise
    for tag in img.tags:
        if tag != img.ref:
            log.run(f"{step}: tag", buildah_cmd("tag", img.ref, tag))


def _build_base(log: _Log, img: BuiltImage, seconds: dict[str, float]) -> None:
    mirror = debian_mirror()
    log.redact.append(mirror)
    work = Path(tempfile.mkdtemp(prefix="tmp-base-", dir=images_dir()))
    rootfs = work / "rootfs"
    try:
        t0 = time.monotonic()
        _say("debootstrap of the base image (about two minutes)")
        log.run("base: debootstrap", ["debootstrap", *DEBOOTSTRAP_ARGS, SUITE, str(rootfs), mirror],
                env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        seconds["debootstrap"] = round(time.monotonic() - t0, 1)
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": "/root"}
        version = log.run("base: python version", ["chroot", str(rootfs), "python3", "-c",
                          "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
                          env=env, capture=True).strip()
        if tuple(int(x) for x in version.split(".")[:2]) < (3, 11):
            raise ImageError(f"debootstrap gave Python {version}; the project needs >= 3.11; "
                             f"see log {log.path}")
        log.run("base: venv", ["chroot", str(rootfs), "python3", "-m", "venv", VENV], env=env)
        for pattern in BASE_TRIM:
            for p in rootfs.glob(pattern):
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p)
                else:
                    p.unlink()
        (rootfs / "etc" / "hostname").write_text("localhost\n")
        tar = work / "rootfs.tar"
        log.run("base: tar", ["tar", "--numeric-owner", "--xattrs", "-C", str(rootfs), "-cf",
                              str(tar), "."])
        _commit_scratch(log, img, "base", add=[(str(tar), "/")], config=[
            *(a for e in BASE_ENV for a in ("--env", e)), "--cmd", '["python3"]',
            "--label", f"io.unwind.python={version}",
        ])
        seconds["base"] = round(time.monotonic() - t0, 1)
        log.note(f"base: Python {version}, {seconds['base']}s")
    finally:
        _unmount_under(work)
        shutil.rmtree(work, ignore_errors=True)


def _ensure_base_in_storage(log: _Log, base: BuiltImage, seconds: dict[str, float]) -> bool:
    """The base in buildah storage, loading its archive or building it. True if built."""
    if _in_storage(log, base.ref, base.key):
        return False
    if base.tar.exists():
        log.run("base: load archive", buildah_cmd("pull", "--quiet", f"docker-archive:{base.tar}"))
        for tag in base.tags:
            log.run("base: tag", buildah_cmd("tag", base.tags[0], tag))
        return False
    _build_base(log, base, seconds)
    _export(log, base, seconds)
    _prune_storage(log, base)
    return True


def _build_unwind(log: _Log, img: BuiltImage, root: Path, seconds: dict[str, float]) -> None:
    t0 = time.monotonic()
    conf = host_pip_config()
    pip_dir = Path(tempfile.mkdtemp(prefix="tmp-pip-", dir=images_dir()))
    try:
        pip_conf = pip_dir / "pip.conf"
        write_pip_conf(conf, pip_conf)
        mounts = [f"{CA_MOUNT}:{CA_MOUNT}:ro", f"{pip_conf}:{PIP_CONF_MOUNT}:ro",
                  *(f"{p}:{p}:ro" for p in pip_mounts(conf))]
        log.note(f"pip settings for the build: {sorted((s, sorted(v)) for s, v in conf.items())}")
        _say("buildah bud of the unwind image (minutes)")
        log.run("unwind: buildah bud", buildah_cmd(
            "bud", "--isolation", "chroot", "--pull=never", "--layers=false",
            "--build-arg", f"PYTHON_IMAGE={BASE_IMAGE}", "--label", f"{KEY_LABEL}={img.key}",
            *(a for m in mounts for a in ("-v", m)),
            *(a for t in img.tags for a in ("-t", t)),
            "-f", str(root / "Dockerfile"), str(root)), cwd=root)
    finally:
        shutil.rmtree(pip_dir, ignore_errors=True)
    seconds["build"] = round(time.monotonic() - t0, 1)


def _build_pause(log: _Log, img: BuiltImage, seconds: dict[str, float]) -> None:
    t0 = time.monotonic()
    gohome = cache_root() / "go"
    work = Path(tempfile.mkdtemp(prefix="tmp-pause-", dir=images_dir()))
    try:
        (work / "pause.go").write_text(PAUSE_GO)
        env = {**os.environ, "CGO_ENABLED": "0", "GO111MODULE": "off", "GOFLAGS": "",
               "GOPATH": str(gohome / "path"), "GOCACHE": str(gohome / "cache"),
               "HOME": str(gohome / "home")}
        for d in ("path", "cache", "home"):
            (gohome / d).mkdir(parents=True, exist_ok=True)
        log.run("pause: go build", ["go", "build", "-trimpath", "-ldflags=-s -w", "-o",
                                    str(work / "pause"), "pause.go"], cwd=work, env=env)
        _commit_scratch(log, img, "pause", add=[(str(work / "pause"), "/pause")], config=[
            "--entrypoint", '["/pause"]', "--user", "65535:65535"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    seconds["pause"] = round(time.monotonic() - t0, 1)


def _lock() -> AbstractContextManager[None]:
    return cache_lock("image")  # apart from the kube build's: neither waits for the other


def planned_images(root: Path = ROOT) -> Images:
    """What ensure_images() would return, computed from the inputs alone (runs no command)."""
    bkey = base_key()
    ukey = image_inputs_digest(root, bkey)
    pkey = pause_key()
    base = BuiltImage("python", BASE_IMAGE, (BASE_IMAGE, f"localhost/python:3.11-debian-{bkey[:12]}"),
                      bkey, _tar_path("python", bkey))
    unwind = BuiltImage("unwind", UNWIND_IMAGE,
                        (UNWIND_IMAGE_CONTAINERD, UNWIND_IMAGE, f"localhost/unwind:{ukey[:12]}"),
                        ukey, _tar_path("unwind", ukey))
    pause = BuiltImage("pause", PAUSE_IMAGE, (PAUSE_IMAGE, f"localhost/unwind-pause:{pkey[:12]}"),
                       pkey, _tar_path("pause", pkey))
    return Images(base, unwind, pause)


def ensure_images(root: Path = ROOT) -> Images:
    """Build (or find in the cache) the base, unwind and pause images and their archives.

    A call whose inputs are unchanged runs no command. Raises ImageError naming the step and
    the log when something fails.
    """
    plan = planned_images(root)
    if plan.unwind.tar.exists() and plan.pause.tar.exists():
        return plan
    with _lock():
        if plan.unwind.tar.exists() and plan.pause.tar.exists():  # built meanwhile
            return plan
        images_dir().mkdir(parents=True, exist_ok=True)
        _clean_stale()
        logs = cache_root() / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log = _Log(logs / f"image-{time.strftime('%Y%m%d-%H%M%S')}.log")
        built: list[str] = []
        try:
            for store in buildah_storage():
                store.mkdir(parents=True, exist_ok=True)
            if not plan.unwind.tar.exists():
                seconds: dict[str, float] = {}
                if _ensure_base_in_storage(log, plan.base, seconds):
                    built.append("python")
                _build_unwind(log, plan.unwind, root, seconds)
                _export(log, plan.unwind, seconds)
                _prune_storage(log, plan.unwind)
                built.append("unwind")
            if not plan.pause.tar.exists():
                seconds = {}
                _build_pause(log, plan.pause, seconds)
                _export(log, plan.pause, seconds)
                _prune_storage(log, plan.pause)
                built.append("pause")
        except ImageError:
            raise
        except Exception as exc:  # keep the log in the message whatever failed
            raise ImageError(f"{type(exc).__name__}: {exc}; see log {log.path}") from exc
        _say(f"built {', '.join(built)}; log: {log.path}")
        return Images(plan.base, plan.unwind, plan.pause, tuple(built))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m unwind.controlplane.image",
                                     description="Build and cache the unwind, base and pause images.")
    parser.add_argument("--print-tars", action="store_true",
                        help="print only the archives a node imports, one a line")
    parser.add_argument("--check", action="store_true",
                        help="also start `unwind --help` and two subcommands in the image as UID 65532")
    parser.add_argument("--import", dest="address", metavar="SOCKET",
                        help="import the archives into the containerd at SOCKET (k8s.io namespace)")
    args = parser.parse_args(argv)
    from .imageimport import check_image, import_images

    try:
        imgs = ensure_images()
        imported = import_images(args.address, imgs) if args.address else []
        checks = check_image() if args.check else {}
    except ImageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.print_tars:
        for tar in imgs.tars:
            print(tar)
        return 0
    print(f"unwind_image={imgs.unwind_image}")
    print(f"pause_image={imgs.pause_image}")
    print(f"base_image={imgs.base.ref}")
    print(f"unwind_tar={imgs.unwind.tar}")
    print(f"pause_tar={imgs.pause.tar}")
    print(f"built={','.join(imgs.built) or 'nothing (cached)'}")
    if args.address:
        print(f"imported={','.join(str(t) for t in imported) or 'nothing (already there)'}")
    for cmd, first in checks.items():
        print(f"check[{cmd}]={first}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
