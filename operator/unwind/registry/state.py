"""The highest index generation a reader has accepted from each registry location.

A signed index cannot be forged, but an older signed copy can be served again (a
rollback, or a stale mirror) until it expires. A reader that remembers the generation it
last accepted refuses anything lower. Only generations read from an index whose signature
verified against a trusted key are remembered: an unsigned number could be set
arbitrarily high, and would then lock the reader out of the real registry.

:class:`MemoryGenerations` is for a long-running reader (a gateway that reloads);
:class:`FileGenerations` keeps them in a small JSON file (the CLI's
``~/.cache/unwind/registry-generations.json``), keyed by the registry's location: an
https URL as given, a folder by its absolute path.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from pathlib import Path
from typing import Protocol

from .errors import RegistryError

STATE_FILE_NAME = "registry-generations.json"


def default_state_file() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "unwind" / STATE_FILE_NAME


def location_key(location: str) -> str:
    """The key a registry is remembered by (its index URL, or its index file's absolute path)."""
    return location if "://" in location else os.path.abspath(location)


class Generations(Protocol):
    """Where a reader keeps the generations it accepted."""

    source: str  # says where the number came from, in a refusal

    def floor(self, location: str) -> int:
        """The highest generation accepted from ``location`` (0 when none)."""
        ...

    def accept(self, location: str, generation: int) -> None:
        """Remember ``generation`` for ``location`` if it is higher than the one kept."""
        ...


class MemoryGenerations:
    source = "by this process"

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}

    def floor(self, location: str) -> int:
        return self.seen.get(location_key(location), 0)

    def accept(self, location: str, generation: int) -> None:
        key = location_key(location)
        self.seen[key] = max(generation, self.seen.get(key, 0))


class FileGenerations:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.source = (f"recorded in {self.path}; if you went back on purpose, remove this "
                       "registry's entry there or pass --no-generation-state")

    def _read(self) -> dict[str, int]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise RegistryError("invalid", f"cannot read the generation state file {self.path}: "
                                f"{exc}; delete it to start again") from exc
        if not isinstance(data, dict) or not all(type(v) is int for v in data.values()):
            raise RegistryError("invalid", f"{self.path} is not a generation state file "
                                "({location: generation}); delete it to start again")
        return data

    def floor(self, location: str) -> int:
        return self._read().get(location_key(location), 0)

    def accept(self, location: str, generation: int) -> None:
        key = location_key(location)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(f".{self.path.name}.lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two commands at once must not lose a number
            data = self._read()
            if data.get(key, 0) >= generation:
                return
            data[key] = generation
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".tmp-", suffix=".json")
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(data, out, indent=2, sort_keys=True)
                out.write("\n")
            os.replace(tmp, self.path)
