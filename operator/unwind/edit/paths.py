"""Run an edit over files on disk: read, edit in memory, write all or nothing.

The operations never touch the disk; this layer is the filesystem storage for
them. Files are read and written with `newline=""` so CRLF files keep their
line endings byte for byte. Every changed file is first written to a temporary
file next to it (same filesystem, same mode), and only when all of those
writes succeeded are they moved into place with `os.replace`, so a refusal, a
validator error or a failed temp write leaves every file exactly as it was.

Folders are walked the way git sees them (`unwind.workspace.walk`, shared with `unwind
validate`): hidden names and .gitignored paths are not entered, so an edit from a
repository root never reads `.venv/` or build output.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from unwind.edit.result import EditResult
from unwind.workspace.walk import walk as _walk

YAML_SUFFIXES = (".yaml", ".yml")


def walk(root: Path) -> list[Path]:
    """The *.yaml / *.yml files under `root`, as git sees the tree (`workspace.walk`)."""
    return _walk(root, YAML_SUFFIXES)


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
