"""What an image is made from: the machine's Debian mirror (for the base), the build
context as ``.dockerignore`` leaves it and its digest (the unwind image's cache key), and the
host's pip configuration (mounted into the build's ``pip wheel``, never copied).

The pip configuration (its files and ``PIP_*`` environment merged into one file mounted as
``/etc/pip.conf``, the local paths it names, and the CA bundle) is mounted read-only into the
build. ``buildah bud -v`` mounts into every stage and leaves an empty mount point where the
path did not exist (an empty ``/etc/pip.conf``, empty ``/opt/...`` directories): no content.
Building the builder stage alone with the mounts and the rest without does not work in
buildah 1.28 (a cached stage named in ``RUN --mount=from=`` is not found).

Why a module of its own: these are pure reads of files and settings, tested without buildah
(tests/controlplane_image/test_image.py); :mod:`unwind.controlplane.image` builds with them.
"""

from __future__ import annotations

import configparser
import hashlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .build import BuildError

SUITE = "bookworm"
CA_MOUNT = "/etc/ssl/certs"  # the host's CA bundle, mounted read-only into the build


class ImageError(BuildError):
    """An image could not be built, exported or imported."""


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
