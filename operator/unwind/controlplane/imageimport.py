"""Using the images built by :mod:`unwind.controlplane.image`: importing their archives into
a node's containerd (``ctr -n k8s.io images import``, skipping an image already there with
the same content) and checking that the project's image starts its commands as UID 65532.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import tarfile
import time
from collections.abc import Iterable
from pathlib import Path

from .build import cache_root
from .image import UNWIND_IMAGE, BuiltImage, ImageError, Images, _Log, buildah_cmd

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
