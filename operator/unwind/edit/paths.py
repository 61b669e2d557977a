"""Run an edit over files on disk: read, edit in memory, write all or nothing.

The operations never touch the disk; this layer is the filesystem storage for
them. Files are read and written with `newline=""` so CRLF files keep their
line endings byte for byte. Every changed file is first written to a temporary
file next to it (same filesystem, same mode), and only when all of those
writes succeeded are they moved into place with `os.replace`, so a refusal, a
validator error or a failed temp write leaves every file exactly as it was.

Folders are walked the way git sees them: hidden names and .gitignored paths are not
entered, so an edit from a repository root never reads `.venv/` or build output.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from unwind.edit.ignore import Rule, ignored, parse_gitignore
from unwind.edit.result import EditResult

YAML_SUFFIXES = (".yaml", ".yml")


def walk(root: Path) -> list[Path]:
    """The *.yaml / *.yml files under `root`, not entering hidden names (`.git`, `.venv`,
    `.dev`...) or what a .gitignore in the walked tree ignores (see `ignore`)."""
    found: list[Path] = []
    rules_by_dir: dict[str, list[Rule]] = {}
    for here, dirs, names in os.walk(root):
        rel_dir = Path(here).relative_to(root).as_posix()
        rel_dir = "" if rel_dir == "." else rel_dir
        rules = list(rules_by_dir.get(rel_dir, []))
        if ".gitignore" in names:
            with contextlib.suppress(OSError, UnicodeDecodeError):
                text = Path(here, ".gitignore").read_text(encoding="utf-8")
                rules += parse_gitignore(text, rel_dir)

        def keep(name: str, is_dir: bool, rel_dir: str = rel_dir, rules: list[Rule] = rules) -> bool:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            return not name.startswith(".") and not ignored(rules, rel, is_dir)

        dirs[:] = sorted(d for d in dirs if keep(d, True))
        for d in dirs:
            rules_by_dir[f"{rel_dir}/{d}" if rel_dir else d] = rules
        found += [Path(here, n) for n in names if n.endswith(YAML_SUFFIXES) and keep(n, False)]
    return found


def expand(paths: Iterable[str | os.PathLike[str]]) -> list[str]:
    """Files as given, and every *.yaml / *.yml under each folder (`walk`), sorted. A
    missing path raises FileNotFoundError naming it, before anything is read. A folder or
    file named here is read even if it is hidden or ignored: the person asked for it."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files += walk(path)
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"{path}: no such file or folder")
    return sorted({str(f) for f in files})


def read(paths: Iterable[str]) -> dict[str, str]:
    """The text of each file, line endings untouched."""
    texts: dict[str, str] = {}
    for path in paths:
        with open(path, encoding="utf-8", newline="") as handle:
            texts[path] = handle.read()
    return texts


def write_all(files: dict[str, str]) -> None:
    """Replace each file atomically, keeping its mode; all temp files first, then the moves."""
    staged: list[tuple[str, str]] = []
    try:
        for path, text in sorted(files.items()):
            directory = os.path.dirname(os.path.abspath(path))
            fd, temp = tempfile.mkstemp(prefix=".unwind-edit-", dir=directory)
            staged.append((temp, path))
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            with contextlib.suppress(FileNotFoundError):
                os.chmod(temp, stat.S_IMODE(os.stat(path).st_mode))
    except BaseException:
        for temp, _ in staged:
            with contextlib.suppress(OSError):
                os.unlink(temp)
        raise
    for temp, path in staged:
        os.replace(temp, path)


def apply_to_paths(
    paths: Iterable[str | os.PathLike[str]],
    op: Callable[..., EditResult],
    *args: Any,
    write: bool = True,
    **kwargs: Any,
) -> EditResult:
    """Read the files under `paths`, run `op(files, *args, **kwargs)`, write only on success.

    `write=False` is a dry run: the result (with the new texts in `files`) is
    returned and the disk is not touched. Revisions are computed over the
    expanded path strings, so pass the same paths when using `base_revision`.
    The given paths are passed on as `searched`, so a `not_found` names them.
    """
    paths = list(paths)
    files = read(expand(paths))
    kwargs.setdefault("searched", [os.fspath(p) for p in paths])
    result = op(files, *args, **kwargs)
    if write and result.success and result.files:
        write_all(result.files)
    return result
