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
  configuration (its files and ``PIP_*`` environment merged into one file mounted as
  ``/etc/pip.conf``), the local paths that configuration names, and the CA bundle, all
  mounted read-only: nothing of the host lands in the image. ``buildah bud -v`` mounts into
  every stage and leaves an empty mount point where the path did not exist (an empty
  ``/etc/pip.conf``, empty ``/opt/...`` directories): no content. Building the builder stage
  alone with the mounts and the rest without does not work in buildah 1.28 (a cached stage
  named in ``RUN --mount=from=`` is not found);
* **pause** ``localhost/unwind-pause:1``: a static Go program that waits for SIGINT/SIGTERM
  and reaps children.

Each result is keyed by a sha256 of its inputs (for unwind: the files the build context keeps
after ``.dockerignore``, plus the base's key) and exported to
``cache_root()/images/<name>-<key>.tar`` (``docker-archive``, written under a temporary name
and renamed), so an unchanged second call runs no command. buildah's storage is private
(``cache_root()/buildah``, vfs driver). A file lock keeps two builds apart; every command's
output goes to one log under ``cache_root()/logs`` and a failure names the step and the log.

:func:`import_images` loads the archives into containerd's ``k8s.io`` namespace, skipping
images that are already there with the same content.
"""

from __future__ import annotations

import argparse
import configparser
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

from .build import BuildError, cache_lock, cache_root

ROOT = Path(__file__).resolve().parents[3]

# Bump when a recipe below changes in a way the hashed inputs do not show.
RECIPE_VERSION = "1"

BASE_IMAGE = "localhost/python:3.11-debian"
UNWIND_IMAGE = "localhost/unwind:dev"
# What containerd calls the image a pod's `image: unwind:dev` asks for.
UNWIND_IMAGE_CONTAINERD = "docker.io/library/unwind:dev"
PAUSE_IMAGE = "localhost/unwind-pause:1"
KEY_LABEL = "io.unwind.inputs-digest"

SUITE = "bookworm"
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

CA_MOUNT = "/etc/ssl/certs"
PIP_CONF_MOUNT = "/etc/pip.conf"  # where the build's pip finds the host's merged settings

PAUSE_GO = """\
// pause: PID 1 of a pod sandbox. Waits for SIGINT/SIGTERM, reaps orphans on SIGCHLD.
package main

import (
\t"os"
\t"os/signal"
\t"syscall"
)

func main() {
\tsigs := make(chan os.Signal, 16)
\tsignal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
\tfor sig := range sigs {
\t\tif sig != syscall.SIGCHLD {
\t\t\tos.Exit(0)
\t\t}
\t\tvar status syscall.WaitStatus
\t\tfor {
\t\t\tif pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil); pid <= 0 || err != nil {
\t\t\t\tbreak
\t\t\t}
\t\t}
\t}
}
"""


class ImageError(BuildError):
    """An image could not be built, exported or imported."""


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


# --- the machine's Debian mirror -------------------------------------------------------

def _deb822_paragraphs(text: str) -> list[dict[str, str]]:
    paras: list[dict[str, str]] = []
    cur: dict[str, str] = {}
    key = ""
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        if not line.strip():
            if cur:
                paras.append(cur)
            cur, key = {}, ""
            continue
        if line[0] in " \t":
            if key:
                cur[key] += " " + line.strip()
            continue
        name, sep, value = line.partition(":")
        if sep:
            key = name.strip().lower()
            cur[key] = value.strip()
    if cur:
        paras.append(cur)
    return paras


def _sources_entries(path: Path) -> list[tuple[str, list[str]]]:
    """(uri, suites) of the binary ("deb") entries of one apt sources file, either format."""
    text = path.read_text(errors="replace")
    out: list[tuple[str, list[str]]] = []
    if path.name.endswith(".sources"):
        for p in _deb822_paragraphs(text):
            if "deb" not in p.get("types", "").split() or p.get("enabled", "yes").lower() == "no":
                continue
            suites = p.get("suites", "").split()
            out += [(uri, suites) for uri in p.get("uris", "").split()]
        return out
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line.startswith("deb ") and not line.startswith("deb\t"):
            continue
        rest = line[3:].strip()
        if rest.startswith("["):
            rest = rest.partition("]")[2].strip()
        words = rest.split()
        if len(words) >= 2:
            out.append((words[0], [words[1]]))
    return out


def debian_mirror(suite: str = SUITE, apt_dir: Path = Path("/etc/apt")) -> str:
    """The URI of the machine's Debian apt source for `suite`, read from its apt sources.

    Looks at sources.list, then sources.list.d/*.list and *.sources (apt's order). An entry
    for the suite itself wins; else one for a suite of the same release (e.g. -updates)
    that is not the security archive.
    """
    files = [apt_dir / "sources.list"]
    listd = apt_dir / "sources.list.d"
    if listd.is_dir():
        files += sorted(p for p in listd.iterdir() if p.name.endswith((".list", ".sources")))
    entries = [e for f in files if f.is_file() for e in _sources_entries(f)]
    for uri, suites in entries:
        if suite in suites:
            return uri.rstrip("/")
    for uri, suites in entries:
        if any(s.startswith(suite + "-") and "security" not in s for s in suites):
            return uri.rstrip("/")
    raise ImageError(f"no Debian apt source for {suite!r} in {apt_dir}: cannot debootstrap")


# --- .dockerignore and the inputs digest ----------------------------------------------

def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern (Go filepath.Match plus `**`) as a regex on a slash path."""
    out, i, n = "", 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            if pattern.startswith("**", i):
                i += 2
                if pattern.startswith("/", i):  # "**/": any number of directories, even none
                    i += 1
                    out += "(?:.*/)?"
                else:
                    out += ".*"
                continue
            out += "[^/]*"
        elif c == "?":
            out += "[^/]"
        elif c == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                out += re.escape(c)
            else:
                body = pattern[i + 1:end]
                if body.startswith("^") or body.startswith("!"):
                    body = "^" + body[1:]
                out += "[" + body.replace("\\", "\\\\") + "]"
                i = end
        elif c == "\\" and i + 1 < n:
            i += 1
            out += re.escape(pattern[i])
        else:
            out += re.escape(c)
        i += 1
    return re.compile(out)


@dataclass(frozen=True)
class DockerIgnore:
    """The patterns of a .dockerignore, matched as Docker's builder does: the last matching
    pattern decides, `!` re-includes, and a pattern that matches a directory matches all
    under it."""

    rules: tuple[tuple[bool, re.Pattern[str]], ...]  # (exclude?, regex)

    @classmethod
    def parse(cls, text: str) -> DockerIgnore:
        rules = []
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            exclude = not line.startswith("!")
            if not exclude:
                line = line[1:].strip()
            line = os.path.normpath(line).lstrip("/")
            if line in ("", "."):
                continue
            rules.append((exclude, _pattern_regex(line)))
        return cls(tuple(rules))

    @classmethod
    def load(cls, root: Path) -> DockerIgnore:
        path = root / ".dockerignore"
        return cls.parse(path.read_text()) if path.exists() else cls(())

    @property
    def has_exceptions(self) -> bool:
        return any(not exclude for exclude, _ in self.rules)

    def ignored(self, rel: str) -> bool:
        parts = rel.split("/")
        prefixes = ["/".join(parts[:k]) for k in range(1, len(parts) + 1)]
        result = False
        for exclude, rx in self.rules:
            if any(rx.fullmatch(p) for p in prefixes):
                result = exclude
        return result


def context_files(root: Path) -> list[str]:
    """The files (slash paths relative to root) the build context keeps after .dockerignore."""
    ignore = DockerIgnore.load(root)
    kept: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        reldir = os.path.relpath(dirpath, root)
        reldir = "" if reldir == "." else reldir.replace(os.sep, "/")
        if not ignore.has_exceptions:  # nothing under an ignored directory can come back
            dirnames[:] = [d for d in dirnames
                           if not ignore.ignored(f"{reldir}/{d}" if reldir else d)]
        dirnames.sort()
        for name in sorted(filenames):
            rel = f"{reldir}/{name}" if reldir else name
            if not ignore.ignored(rel):
                kept.append(rel)
        for d in dirnames:  # symlinks to directories are context entries, not walked
            full = Path(dirpath) / d
            if full.is_symlink():
                rel = f"{reldir}/{d}" if reldir else d
                if not ignore.ignored(rel):
                    kept.append(rel)
    return sorted(kept)


def _file_digest(path: Path) -> str:
    if path.is_symlink():
        return "link:" + os.readlink(path)
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    mode = "x" if os.access(path, os.X_OK) else "-"
    return f"{mode}{h.hexdigest()}"


def _digest(parts: Iterable[str]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


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


# --- the host's pip configuration, for the build's `pip wheel` -----------------------

PIP_PATH_KEYS = ("cert", "client-cert", "constraint", "requirement", "find-links", "index-url",
                 "extra-index-url")


def _pip_config_files(env: dict[str, str]) -> list[Path]:
    """pip's config files in its own order of precedence, lowest first."""
    if env.get("PIP_CONFIG_FILE") == os.devnull:
        return []
    xdg_dirs = env.get("XDG_CONFIG_DIRS", "/etc/xdg").split(":")
    files = [Path(d) / "pip" / "pip.conf" for d in xdg_dirs if d]
    files.append(Path("/etc/pip.conf"))
    home = Path(env.get("HOME", str(Path.home())))
    files.append(home / ".pip" / "pip.conf")
    files.append(Path(env.get("XDG_CONFIG_HOME", str(home / ".config"))) / "pip" / "pip.conf")
    if env.get("PIP_CONFIG_FILE"):
        files.append(Path(env["PIP_CONFIG_FILE"]))
    return files


def host_pip_config(env: dict[str, str] | None = None) -> dict[str, dict[str, str]]:
    """The host's effective pip settings: its config files merged in pip's order, then the
    PIP_* environment (into [global]). Site (virtualenv) config is the venv's, not the host's."""
    env = dict(os.environ if env is None else env)
    merged: dict[str, dict[str, str]] = {}
    for path in _pip_config_files(env):
        if not path.is_file():
            continue
        parser = configparser.RawConfigParser()
        parser.read(path)
        for section in parser.sections():
            merged.setdefault(section, {}).update(parser.items(section))
    for name, value in env.items():
        if name.startswith("PIP_") and name != "PIP_CONFIG_FILE":
            merged.setdefault("global", {})[name[4:].lower().replace("_", "-")] = value
    return merged


def pip_mounts(config: dict[str, dict[str, str]]) -> list[str]:
    """Host paths the pip settings name (CA file, constraints, local wheels and indexes), to
    mount read-only at the same place. A file:// index `.../simple` is mounted from its
    parent: its pages link to `../../files/...`."""
    paths: set[Path] = set()
    for section in config.values():
        for key in PIP_PATH_KEYS:
            for word in section.get(key, "").split():
                if word.startswith("file://"):
                    p = Path(word[len("file://"):])
                    paths.add(p.parent if p.name == "simple" else p)
                elif word.startswith("/"):
                    paths.add(Path(word))
    kept = sorted(p for p in paths if p.exists())
    # a path inside another mounted one (or the CA directory) needs no mount of its own
    out = [p for p in kept if not any(q != p and q in p.parents for q in kept)
           and Path(CA_MOUNT) not in p.parents and p != Path(CA_MOUNT)]
    return [str(p) for p in out]


def write_pip_conf(config: dict[str, dict[str, str]], path: Path) -> None:
    parser = configparser.RawConfigParser()
    for section, items in sorted(config.items()):
        parser[section] = dict(sorted(items.items()))
    with path.open("w") as fh:
        fh.write("# The host's pip settings, mounted read-only into `buildah bud`; not in the image.\n")
        parser.write(fh)


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


# --- containerd --------------------------------------------------------------------

def normalize_ref(ref: str) -> str:
    """A reference as containerd stores it (Docker's normalisation: unwind:dev ->
    docker.io/library/unwind:dev)."""
    name, at, digest = ref.partition("@")
    first = name.split("/", 1)[0]
    if "/" not in name or ("." not in first and ":" not in first and first != "localhost"):
        name = f"docker.io/{name}" if "/" in name else f"docker.io/library/{name}"
    last = name.rsplit("/", 1)[-1]
    if not at and ":" not in last:
        name += ":latest"
    return name + at + digest


def archive_info(tar: Path) -> tuple[list[str], str]:
    """(repo tags, config digest) of a docker-archive."""
    with tarfile.open(tar) as tf:
        member = tf.extractfile("manifest.json")
        if member is None:
            raise ImageError(f"{tar} has no manifest.json: not a docker-archive")
        manifest = json.load(member)[0]
        config = tf.extractfile(manifest["Config"])
        if config is None:
            raise ImageError(f"{tar}: config {manifest['Config']} missing")
        digest = "sha256:" + hashlib.sha256(config.read()).hexdigest()
    return list(manifest.get("RepoTags") or []), digest


def _ctr(address: str, namespace: str, *args: str) -> list[str]:
    return ["ctr", "--address", address, "-n", namespace, *args]


def _containerd_config_digest(address: str, namespace: str, manifest_digest: str) -> str | None:
    proc = subprocess.run(_ctr(address, namespace, "content", "get", manifest_digest),
                          capture_output=True, check=False)
    if proc.returncode != 0:
        return None
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return None
    config = doc.get("config") if isinstance(doc, dict) else None
    return config.get("digest") if isinstance(config, dict) else None


def containerd_images(address: str, namespace: str = "k8s.io") -> dict[str, str]:
    """ref -> manifest digest, from `ctr images ls`."""
    proc = subprocess.run(_ctr(address, namespace, "images", "ls"), capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        raise ImageError(f"ctr images ls at {address} failed: {proc.stderr.strip()}")
    out: dict[str, str] = {}
    for line in proc.stdout.splitlines()[1:]:
        words = line.split()
        if len(words) >= 3 and words[2].startswith("sha256:"):
            out[words[0]] = words[2]
    return out


def import_images(containerd_address: str, images: Images | Iterable[BuiltImage | Path],
                  *, namespace: str = "k8s.io", snapshotter: str | None = None,
                  log: Path | None = None) -> list[Path]:
    """Import docker-archives into containerd (`ctr -n k8s.io images import`), skipping an
    archive whose every tag is already there with the same image config. Returns the
    archives imported."""
    items = images.tars if isinstance(images, Images) else images
    tars = [i.tar if isinstance(i, BuiltImage) else Path(i) for i in items]
    if log is None:
        (cache_root() / "logs").mkdir(parents=True, exist_ok=True)
        log = cache_root() / "logs" / f"image-import-{time.strftime('%Y%m%d-%H%M%S')}.log"
    runner = _Log(log)
    present = containerd_images(containerd_address, namespace)
    imported: list[Path] = []
    for tar in tars:
        tags, config = archive_info(tar)
        refs = [normalize_ref(t) for t in tags]
        if refs and all(r in present and _containerd_config_digest(
                containerd_address, namespace, present[r]) == config for r in refs):
            runner.note(f"{tar.name}: {', '.join(refs)} already in containerd")
            continue
        extra = ["--snapshotter", snapshotter] if snapshotter else []
        runner.run(f"import {tar.name}", _ctr(containerd_address, namespace, "images", "import",
                                               *extra, str(tar)))
        imported.append(tar)
    return imported


# --- checks and the command line ---------------------------------------------------

def check_image(ref: str = UNWIND_IMAGE, user: str = "65532:65532") -> dict[str, str]:
    """Start `unwind --help`, `unwind gateway --help`, `unwind undo-step --help` in the image
    as `user` (buildah run, chroot isolation). Returns command -> first output line."""
    logs = cache_root() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = _Log(logs / f"image-check-{time.strftime('%Y%m%d-%H%M%S')}.log")
    ctr = log.run("check: from", buildah_cmd("from", "--pull=never", ref), capture=True).strip()
    out: dict[str, str] = {}
    try:
        for args in (["--help"], ["gateway", "--help"], ["undo-step", "--help"]):
            text = log.run(f"check: unwind {' '.join(args)}", buildah_cmd(
                "run", "--isolation", "chroot", "--user", user, ctr, "--", "unwind", *args),
                capture=True)
            out["unwind " + " ".join(args)] = (text.strip().splitlines() or [""])[0]
        out["id -u"] = log.run("check: id", buildah_cmd(
            "run", "--isolation", "chroot", "--user", user, ctr, "--", "id", "-u"),
            capture=True).strip()
    finally:
        subprocess.run(buildah_cmd("rm", ctr), capture_output=True, check=False)
    return out


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
