"""Where registry versions are kept: the storage protocol and the folder storage.

A storage only reads and writes JSON documents; every rule (numbering, lifecycle, checksums,
signatures, the index's generation and signature, four-eyes) lives in
:mod:`unwind.registry.registry`, so a second storage (the cluster's ControllerRevisions)
only has to implement the methods of :class:`Storage` to pass the same contract table.

Folder layout::

    index.json                      the signed list of every tool's versions (written last)
    tools/<escaped tool>/v<N>.json  one immutable version each

Tool names may hold ``/ : . _ -``. A file name is made from a tool name by percent-encoding
(``%XX``, upper-case hex, per UTF-8 byte) every character outside ``[A-Za-z0-9_-]``; the dot
is encoded too, so no escaped name can be ``.`` or ``..`` or hold a separator, and distinct
tool names always give distinct file names: ``stripe.create_charge`` is stored under
``tools/stripe%2Ecreate_charge/``. (On a case-insensitive file system two tools differing
only in case would share a folder; tool names are compared case-sensitively everywhere else.)
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import tempfile
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from .errors import RegistryError

INDEX_FILE = "index.json"
_SAFE = re.compile(r"[A-Za-z0-9_-]")
_VERSION_FILE = re.compile(r"v([1-9][0-9]*)\.json")  # not .tmp-* files of a write under way


def escape_tool(tool: str) -> str:
    """The file-name form of a tool name (see the module docstring)."""
    return "".join(ch if _SAFE.fullmatch(ch) else "".join(f"%{b:02X}" for b in ch.encode("utf-8"))
                   for ch in tool)


def version_path(tool: str, version: int) -> str:
    """The relative path of a version file, with ``/`` separators (also used in URLs)."""
    return f"tools/{escape_tool(tool)}/v{int(version)}.json"


class Storage(Protocol):
    """The minimal operations a registry needs from where it keeps its documents."""

    def read_index(self) -> Any | None:
        """The parsed index, or None when the registry has never been written."""
        ...

    def read_version(self, tool: str, version: int) -> Any:
        """The parsed version record; RegistryError ``missing`` or ``tampered`` (unparsable)."""
        ...

    def write_version(self, tool: str, version: int, record: dict[str, Any]) -> None:
        """Create the version; never overwrite (``conflict`` if it exists)."""
        ...

    def update_index(self, change: Callable[[Any | None], dict[str, Any]]) -> None:
        """Replace the index with ``change(current index or None)``, as one step: no other
        writer's update may come between the read and the write (a lock, a compare-and-swap).
        Whatever ``change`` raises is raised, and the index is left as it was."""
        ...

    def list_versions(self) -> list[tuple[str, int, str]] | None:
        """(tool, version, where) for every version file present, listed or not; None when
        the storage cannot list (a static HTTP server)."""
        ...

    def location(self, tool: str | None = None, version: int | None = None) -> str:
        """Where a version (or, without arguments, the index) is kept, for messages."""
        ...


def dump_json(value: Any) -> bytes:
    """The on-disk form: pretty, key-sorted, so files diff well in git review."""
    return (json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


def parse_json(data: bytes, where: str) -> Any:
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise RegistryError("tampered", f"{where} is not valid JSON: {exc}") from exc


class FolderStorage:
    """A registry folder on the local file system (and, served statically, a remote one)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def location(self, tool: str | None = None, version: int | None = None) -> str:
        if tool is None or version is None:
            return str(self.root / INDEX_FILE)
        return str(self.root / version_path(tool, version))

    def read_index(self) -> Any | None:
        path = self.root / INDEX_FILE
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise RegistryError("missing", f"cannot read {path}: {exc.strerror or exc}") from exc
        return parse_json(data, str(path))

    def read_version(self, tool: str, version: int) -> Any:
        path = Path(self.location(tool, version))
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise RegistryError("missing", f"{tool} v{version}: cannot read {path}: "
                                f"{exc.strerror or exc}") from exc
        return parse_json(data, f"{tool} v{version}: {path}")

    def write_version(self, tool: str, version: int, record: dict[str, Any]) -> None:
        # The version is linked into place (os.link fails if the name exists), so two
        # writers racing for the same number cannot overwrite each other: one gets
        # `conflict`. The index is updated after (update_index), so a reader never sees an
        # index entry whose file is not there yet.
        final = Path(self.location(tool, version))
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._write_temp(final.parent, dump_json(record))
        try:
            os.link(tmp, final)
        except FileExistsError as exc:
            raise RegistryError("conflict", f"{tool} v{version} already exists at {final}: "
                                "another publish got there first; run the command again") from exc
        finally:
            os.unlink(tmp)

    def update_index(self, change: Callable[[Any | None], dict[str, Any]]) -> None:
        # Under a lock, so concurrent writers of other tools each re-read what the other
        # wrote (and its generation) before they add their own entry and sign.
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            document = change(self.read_index())
            index_tmp = self._write_temp(self.root, dump_json(document))
            os.replace(index_tmp, self.root / INDEX_FILE)

    def list_versions(self) -> list[tuple[str, int, str]]:
        found: list[tuple[str, int, str]] = []
        tools = self.root / "tools"
        for folder in sorted(tools.iterdir()) if tools.is_dir() else []:
            # A folder whose name is not the escaped form of a tool name is never read by
            # the registry; it is reported under a name no tool can have (spaces), so it
            # is never mistaken for a listed tool's folder.
            tool = urllib.parse.unquote(folder.name)
            if escape_tool(tool) != folder.name:
                tool = f"{folder.name} (a folder name that is not an escaped tool name)"
            for file in folder.iterdir() if folder.is_dir() else []:
                match = _VERSION_FILE.fullmatch(file.name)
                if match:
                    found.append((tool, int(match.group(1)), str(file)))
        return sorted(found)

    @staticmethod
    def _write_temp(folder: Path, data: bytes) -> str:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(name, 0o644)  # mkstemp makes 0600; a registry is meant to be read/served
        except BaseException:
            os.unlink(name)
            raise
        return name
