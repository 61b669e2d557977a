"""The local ledger: one file per run, holding exactly the EffectLedger object.

``<dir>/<run>.json`` is what ``kubectl get effectledger <run> -o json`` would print
(apiVersion, kind, metadata, spec, status), so every ledger command reads either. A run
that grows past ``page_bytes`` continues in ``<run>.p2.json`` (linked from
``status.next``), as the cluster store pages long before the API server's size limit.

Durability and concurrency, since two gateway processes may share the folder:

- every write goes to a temporary file in the same folder, is fsync'ed, renamed over the
  page, and the folder is fsync'ed: a crash leaves the old page or the new one, never half;
- every read-modify-write of a run holds ``fcntl.flock`` on ``<dir>/.locks/<run>.run``,
  so no update is lost between processes (or threads: each takes its own descriptor);
- idempotency-key locks (``FileLocks``) are files created with O_CREAT|O_EXCL, which
  exactly one process can win.

The blocking file work runs in a worker thread, so a slow disk does not stall other calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .. import API_GROUP, API_VERSION
from ..api.resources import LedgerSpec, LedgerStatus
from .entry import Entry, now, stamp
from .store import Change, EntryExists, EntryMissing, Holder, StoreUnavailable, page_name

PAGE_BYTES = 1 << 20
LOCKS = ".locks"


class LedgerDirError(Exception):
    """The ledger folder cannot be used; the message says why and what to do."""


def check_writable(root: Path) -> None:
    """Create the folder if needed and prove a file can be written, synced and removed."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        (root / LOCKS).mkdir(exist_ok=True)
        probe = root / f".probe-{secrets.token_hex(4)}"
        fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        try:
            os.write(fd, b"ok")
            os.fsync(fd)
        finally:
            os.close(fd)
            probe.unlink(missing_ok=True)
    except OSError as exc:
        raise LedgerDirError(f"the ledger folder {root} is not writable ({exc.strerror or exc}): "
                             "give --ledger-dir a folder this user can write") from None


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


@dataclass
class _Page:
    name: str
    obj: dict[str, Any]
    stat: tuple[int, int, int] | None = None  # (inode, mtime_ns, size) when read or written
    index: dict[str, int] = field(default_factory=dict)

    @property
    def entries(self) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = self.obj["status"]["entries"]
        return entries


class FileStore:
    """Store entries in ``<root>/<run>.json`` (see the module docstring)."""

    def __init__(self, root: str | os.PathLike[str], *, page_bytes: int = PAGE_BYTES) -> None:
        self.root = Path(root)
        self.page_bytes = page_bytes
        check_writable(self.root)
        self._cache: dict[str, _Page] = {}

    # ---- the Store protocol (async, the work in a thread) ----

    async def get(self, run: str, entry_id: str) -> Entry | None:
        return await asyncio.to_thread(self.get_sync, run, entry_id)

    async def create(self, run: str, entry: Entry) -> Entry:
        return await asyncio.to_thread(self.create_sync, run, entry)

    async def update(self, run: str, entry_id: str, change: Change) -> Entry:
        return await asyncio.to_thread(self.update_sync, run, entry_id, change)

    async def entries(self, run: str) -> list[Entry]:
        return await asyncio.to_thread(self.entries_sync, run)

    # ---- the same, synchronous (the CLI uses these) ----

    def path(self, run: str, page: int = 1) -> Path:
        return self.root / f"{page_name(run, page)}.json"

    def get_sync(self, run: str, entry_id: str) -> Entry | None:
        with self._locked(run):
            for page in self._chain(run):
                if entry_id in page.index:
                    return self._entry(page, page.index[entry_id])
        return None

    def entries_sync(self, run: str) -> list[Entry]:
        with self._locked(run):
            return [self._entry(p, i) for p in self._chain(run) for i in range(len(p.entries))]

    def create_sync(self, run: str, entry: Entry) -> Entry:
        with self._locked(run):
            chain = self._chain(run)
            for page in chain:
                if entry.id in page.index:
                    raise EntryExists(self._entry(page, page.index[entry.id]))
            last = chain[-1] if chain else self._new_page(run, 1)
            seq = sum(len(p.entries) for p in chain) + 1
            stored = entry.model_copy(update={"seq": seq})
            if chain and last.stat is not None and last.stat[2] >= self.page_bytes:
                follow = self._new_page(run, len(chain) + 1)
                self._append(follow, stored)
                self._write(follow)
                last.obj["status"]["next"] = follow.name
                self._write(last)
            else:
                self._append(last, stored)
                self._write(last)
            return stored

    def update_sync(self, run: str, entry_id: str, change: Change) -> Entry:
        with self._locked(run):
            for page in self._chain(run):
                if entry_id in page.index:
                    at = page.index[entry_id]
                    new = change(self._entry(page, at))
                    if new.id != entry_id:
                        raise ValueError("a change may not alter an entry's id")
                    page.entries[at] = new.to_json()
                    self._summarize(page)
                    self._write(page)
                    return new
        raise EntryMissing(f"no entry {entry_id} in run {run}")

    # ---- pages ----

    @contextlib.contextmanager
    def _locked(self, run: str) -> Iterator[None]:
        try:
            fd = os.open(self.root / LOCKS / f"{run}.run", os.O_CREAT | os.O_RDWR, 0o644)
        except OSError as exc:
            raise StoreUnavailable(f"cannot lock the ledger of run {run} in {self.root}: "
                                   f"{exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the flock

    def _chain(self, run: str) -> list[_Page]:
        pages: list[_Page] = []
        name: str | None = run
        while name is not None:
            page = self._read(name, run, len(pages) + 1)
            if page is None:
                break
            pages.append(page)
            name = page.obj["status"].get("next")
        return pages

    def _read(self, name: str, run: str, number: int) -> _Page | None:
        path = self.root / f"{name}.json"
        try:
            st = path.stat()
            sig = (st.st_ino, st.st_mtime_ns, st.st_size)
            cached = self._cache.get(name)
            if cached is not None and cached.stat == sig:
                return cached
            data = json.loads(path.read_bytes())
        except FileNotFoundError:
            if number == 1:
                return None
            raise StoreUnavailable(f"{path}: the page linked from page {number - 1} "
                                   "is missing") from None
        except (OSError, ValueError) as exc:
            raise StoreUnavailable(f"cannot read the ledger {path}: {exc}") from None
        page = _Page(name, self._checked(path, data, run, number), sig)
        page.index = {e["id"]: i for i, e in enumerate(page.entries)}
        self._cache[name] = page
        return page

    @staticmethod
    def _checked(path: Path, data: Any, run: str, number: int) -> dict[str, Any]:
        problem = None
        if not isinstance(data, dict) or data.get("kind") != "EffectLedger":
            problem = "it is not an EffectLedger object"
        else:
            try:
                spec = LedgerSpec.model_validate(data.get("spec"))
                LedgerStatus.model_validate(data.get("status") or {})
            except ValidationError as exc:
                problem = str(exc).splitlines()[0] + ": " + str(exc.errors()[0]["loc"])
            else:
                if spec.run != run or spec.page != number:
                    problem = f"it holds page {spec.page} of run {spec.run}"
        if problem:
            raise StoreUnavailable(f"the ledger {path} cannot be used: {problem}; move it away "
                                   "or fix it")
        checked: dict[str, Any] = data
        checked.setdefault("status", {}).setdefault("entries", [])
        return checked

    def _new_page(self, run: str, number: int) -> _Page:
        name = page_name(run, number)
        obj = {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": "EffectLedger",
               "metadata": {"name": name, "labels": {f"{API_GROUP}/run": run},
                            "creationTimestamp": stamp(now().replace(microsecond=0)),
                            "generation": 1, "resourceVersion": "0"},
               "spec": {"run": run, "page": number},
               "status": {"entries": [], "entryCount": 0}}
        return _Page(name, obj)

    def _append(self, page: _Page, entry: Entry) -> None:
        page.index[entry.id] = len(page.entries)
        page.entries.append(entry.to_json())
        self._summarize(page)

    @staticmethod
    def _summarize(page: _Page) -> None:
        status = page.obj["status"]
        status["entryCount"] = len(page.entries)
        status["lastState"] = page.entries[-1]["state"] if page.entries else None

    @staticmethod
    def _entry(page: _Page, at: int) -> Entry:
        return Entry.model_validate(page.entries[at])

    def _write(self, page: _Page) -> None:
        meta = page.obj["metadata"]
        meta["resourceVersion"] = str(int(meta.get("resourceVersion", "0")) + 1)
        data = (json.dumps(page.obj, indent=1, ensure_ascii=False) + "\n").encode("utf-8")
        path = self.root / f"{page.name}.json"
        try:
            write_atomic(path, data)
            st = path.stat()
        except OSError as exc:
            self._cache.pop(page.name, None)  # what is on disk is the truth again
            raise StoreUnavailable(f"cannot write the ledger {path}: {exc.strerror or exc}") from None
        page.stat = (st.st_ino, st.st_mtime_ns, st.st_size)
        self._cache[page.name] = page


class FileLocks:
    """Idempotency-key locks as files ``<root>/.locks/<name>.key`` created with O_EXCL."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.dir = Path(root) / LOCKS
        self.dir.mkdir(parents=True, exist_ok=True)

    async def acquire(self, name: str, holder: Holder) -> Holder | None:
        return await asyncio.to_thread(self.acquire_sync, name, holder)

    async def release(self, name: str, holder: Holder) -> None:
        await asyncio.to_thread(self._remove_if, name, holder)

    async def break_stale(self, name: str, stale: Holder) -> bool:
        return await asyncio.to_thread(self._remove_if, name, stale)

    async def peek(self, name: str) -> Holder | None:
        return await asyncio.to_thread(self._holder, name)

    def acquire_sync(self, name: str, holder: Holder) -> Holder | None:
        path = self.dir / f"{name}.key"
        data = json.dumps({"run": holder.run, "entry": holder.entry, "since": holder.since}).encode()
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return self._holder(name) or holder_being_written(path)
        except OSError as exc:
            raise StoreUnavailable(f"cannot create the key lock {path}: {exc.strerror or exc}") from None
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        return None

    def _holder(self, name: str) -> Holder | None:
        path = self.dir / f"{name}.key"
        try:
            data = json.loads(path.read_bytes())
            return Holder(str(data["run"]), str(data["entry"]), str(data["since"]))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):
            return holder_being_written(path)

    def _remove_if(self, name: str, holder: Holder) -> bool:
        """Remove the lock if ``holder`` has it, serialized by a mutex so that a check and
        a removal by one process never interleave with another's."""
        fd = os.open(self.dir / ".mutex", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if self._holder(name) != holder:
                return False
            (self.dir / f"{name}.key").unlink(missing_ok=True)
            return True
        finally:
            os.close(fd)


def holder_being_written(path: Path) -> Holder:
    """A lock file created an instant ago whose holder is not written yet: it stands, and
    is young (its file time), so nobody breaks it before its writer is done."""
    try:
        since = stamp(datetime.fromtimestamp(path.stat().st_mtime, UTC))
    except OSError:
        since = stamp()
    return Holder(run="", entry="", since=since)
