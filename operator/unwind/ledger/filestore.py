"""The local ledger: one file per run, holding exactly the EffectLedger object.

``<dir>/<run>.json`` is what ``kubectl get effectledger <run> -o json`` would print
(apiVersion, kind, metadata, spec, status), so every ledger command reads either. A run
that grows past ``page_bytes`` (256 KiB) continues in ``<run>.p2.json`` (linked from
``status.next``): every write rewrites a whole page, so small pages keep writes cheap, as
the cluster store pages long before the API server's size limit.

Durability and concurrency, since two gateway processes may share the folder:

- every write goes to a temporary file in the same folder, is fsync'ed, renamed over the
  page, and the folder is fsync'ed: a crash leaves the old page or the new one, never half;
- every read-modify-write of a run holds ``fcntl.flock`` on ``<dir>/.locks/<run>.run``,
  so no update is lost between processes (or threads: each takes its own descriptor);
- idempotency-key locks (``FileLocks``) are files created with O_CREAT|O_EXCL, which
  exactly one process can win;
- the first page, written by the run's first entry, records the run's owner
  (``spec.owner``: that entry's actor) and an identity of its own (``metadata.uid``, a
  random UUID, as the API server gives every object); every later write checks the owner
  under the run's lock (see ``store.py``).

The blocking file work runs in a worker thread, so a slow disk does not stall other calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import json
import os
import secrets
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .. import API_GROUP, API_VERSION
from ..api.resources import LedgerSpec, LedgerStatus
from .entry import Entry, now, stamp
from .store import (
    Change,
    EntryExists,
    EntryMissing,
    Holder,
    StoreUnavailable,
    check_owner,
    check_room,
    page_name,
)

PAGE_BYTES = 256 << 10
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
    obj: dict[str, Any] | None  # None: not held in memory (a full page: read again when needed)
    stat: tuple[int, int, int] | None = None  # (inode, mtime_ns, size) when read or written
    index: dict[str, int] = field(default_factory=dict)
    # Each entry's JSON text as last written (None: changed since), so a write encodes only
    # the entries that changed and splices in the others.
    texts: list[str | None] = field(default_factory=list)

    number: int = 1
    next: str | None = None
    # The run's owner (first page only): spec.owner (recorded), else the actor of the first
    # entry of a ledger written before owners were recorded.
    owner: str | None = None
    recorded: bool = False

    @property
    def entries(self) -> list[dict[str, Any]]:
        assert self.obj is not None, "load the page first"
        entries: list[dict[str, Any]] = self.obj["status"]["entries"]
        return entries


class _Batch:
    """One locked read-modify-write of a run: its pages as read, and the ones changed."""

    def __init__(self, store: FileStore, run: str) -> None:
        self.store, self.run = store, run
        self.chain = store._chain(run)
        self.dirty: list[_Page] = []

    def _mark(self, page: _Page) -> None:
        if page not in self.dirty:
            self.dirty.append(page)

    def _find(self, entry_id: str) -> tuple[_Page, int] | None:
        for page in self.chain:
            if entry_id in page.index:
                return self.store._loaded(page, self.run), page.index[entry_id]
        return None

    def get(self, entry_id: str) -> Entry | None:
        found = self._find(entry_id)
        return None if found is None else self.store._entry(*found)

    def entries(self) -> list[Entry]:
        pages = [self.store._loaded(p, self.run) for p in self.chain]
        return [self.store._entry(p, i) for p in pages for i in range(len(p.entries))]

    def owner(self) -> str | None:
        return self.chain[0].owner if self.chain else None

    def create(self, entry: Entry, max_entries: int | None = None) -> Entry:
        check_owner(self.run, self.owner(), entry.actor)
        found = self._find(entry.id)
        if found is not None:
            raise EntryExists(self.store._entry(*found))
        check_room(self.run, sum(len(p.index) for p in self.chain), max_entries)
        if not self.chain:
            self.chain.append(self.store._new_page(self.run, 1, owner=entry.actor))
        elif self.chain[0].owner is None:  # an older ledger, empty: its first entry owns it
            self.chain[0].owner = entry.actor
        last = self.store._loaded(self.chain[-1], self.run)
        stored = entry.model_copy(update={"seq": sum(len(p.index) for p in self.chain) + 1})
        if last.stat is not None and last.stat[2] >= self.store.page_bytes and last.entries:
            follow = self.store._new_page(self.run, len(self.chain) + 1)
            self.chain.append(follow)
            assert last.obj is not None
            last.obj["status"]["next"] = last.next = follow.name
            self._mark(follow)  # written first: a link never points at a missing page
            self._mark(last)
            last = follow
        self.store._append(last, stored)
        self._mark(last)
        return stored

    def update(self, entry_id: str, change: Change) -> Entry:
        found = self._find(entry_id)
        if found is None:
            raise EntryMissing(f"no entry {entry_id} in run {self.run}")
        page, at = found
        new = change(self.store._entry(page, at))
        if new.id != entry_id:
            raise ValueError("a change may not alter an entry's id")
        if self.chain[0].recorded:
            check_owner(self.run, self.chain[0].owner, new.actor)
        page.entries[at] = new.to_json()
        page.texts[at] = None
        self.store._summarize(page)
        self._mark(page)
        return new


Op = Callable[[_Batch], Any]


class FileStore:
    """Store entries in ``<root>/<run>.json`` (see the module docstring).

    Calls that arrive together are batched: the operations queued for a run while a
    write is under way are applied together in the next locked read-modify-write, with one
    write (and fsync) per changed page, so many concurrent calls cost a few writes.
    """

    def __init__(self, root: str | os.PathLike[str], *, page_bytes: int = PAGE_BYTES) -> None:
        self.root = Path(root)
        self.page_bytes = page_bytes
        check_writable(self.root)
        self._cache: dict[str, _Page] = {}
        self._queued: dict[str, list[tuple[Op, asyncio.Future[Any]]]] = {}
        self._draining: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    # ---- the Store protocol (async, batched, the file work in a thread) ----

    async def get(self, run: str, entry_id: str) -> Entry | None:
        peeked = self._peek(run, entry_id)
        if peeked is not None:
            return peeked[0]
        result: Entry | None = await self._submit(run, lambda b: b.get(entry_id))
        return result

    async def create(self, run: str, entry: Entry, *, max_entries: int | None = None) -> Entry:
        result: Entry = await self._submit(run, lambda b: b.create(entry, max_entries))
        return result

    async def update(self, run: str, entry_id: str, change: Change) -> Entry:
        result: Entry = await self._submit(run, lambda b: b.update(entry_id, change))
        return result

    async def entries(self, run: str) -> list[Entry]:
        result: list[Entry] = await self._submit(run, lambda b: b.entries())
        return result

    async def owner(self, run: str) -> str | None:
        result: str | None = await self._submit(run, lambda b: b.owner())
        return result

    async def _submit(self, run: str, op: Op) -> Any:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queued.setdefault(run, []).append((op, future))
        if run not in self._draining:
            self._draining.add(run)
            task = loop.create_task(self._drain(run))
            self._tasks.add(task)  # held until done: the loop keeps only weak references
            task.add_done_callback(self._tasks.discard)
        return await future

    async def _drain(self, run: str) -> None:
        try:
            while self._queued.get(run):
                batch = self._queued.pop(run)
                try:
                    results = await asyncio.to_thread(self._apply, run, [op for op, _ in batch])
                except Exception as exc:  # the lock or the read failed: every call hears it
                    results = [(False, exc)] * len(batch)
                for (_, future), (ok, value) in zip(batch, results, strict=True):
                    if not future.done():
                        (future.set_result if ok else future.set_exception)(value)
        finally:
            self._draining.discard(run)

    def _apply(self, run: str, ops: list[Op]) -> list[tuple[bool, Any]]:
        with self._locked(run):
            batch = _Batch(self, run)
            results: list[tuple[bool, Any]] = []
            for op in ops:
                try:
                    results.append((True, op(batch)))
                except Exception as exc:
                    results.append((False, exc))
            try:
                for page in batch.dirty:
                    self._write(page)
            except StoreUnavailable as exc:
                for page in batch.chain:
                    self._cache.pop(page.name, None)  # the disk is the truth again
                return [(False, exc)] * len(ops)
            for page in batch.chain[:-1]:  # full pages: keep their index, not their entries
                page.obj, page.texts = None, []
            return results

    def _peek(self, run: str, entry_id: str) -> tuple[Entry | None] | None:
        """Answer a get from memory when every page of the run is unchanged on disk (a few
        stat calls, no lock): ``(entry or None,)``, or None to ask the disk."""
        name: str | None = run
        while name is not None:
            page = self._cache.get(name)
            try:
                st = (self.root / f"{name}.json").stat()
            except OSError:
                return None
            if page is None or page.stat != (st.st_ino, st.st_mtime_ns, st.st_size):
                return None
            if entry_id in page.index:
                return (self._entry(page, page.index[entry_id]),) if page.obj is not None else None
            name = page.next
        return (None,)

    def _one(self, run: str, op: Op) -> Any:
        [(ok, value)] = self._apply(run, [op])
        if not ok:
            raise value
        return value

    # ---- the same, synchronous (the CLI uses these) ----

    def path(self, run: str, page: int = 1) -> Path:
        return self.root / f"{page_name(run, page)}.json"

    def get_sync(self, run: str, entry_id: str) -> Entry | None:
        result: Entry | None = self._one(run, lambda b: b.get(entry_id))
        return result

    def entries_sync(self, run: str) -> list[Entry]:
        result: list[Entry] = self._one(run, lambda b: b.entries())
        return result

    def create_sync(self, run: str, entry: Entry, *, max_entries: int | None = None) -> Entry:
        result: Entry = self._one(run, lambda b: b.create(entry, max_entries))
        return result

    def update_sync(self, run: str, entry_id: str, change: Change) -> Entry:
        result: Entry = self._one(run, lambda b: b.update(entry_id, change))
        return result

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
            name = page.next
        return pages

    def _loaded(self, page: _Page, run: str) -> _Page:
        """The page with its entries in memory (read again if only its index was kept)."""
        if page.obj is not None:
            return page
        self._cache.pop(page.name, None)
        fresh = self._read(page.name, run, page.number)
        if fresh is None or fresh.obj is None:
            raise StoreUnavailable(f"the ledger page {page.name} disappeared")
        page.obj, page.texts, page.index, page.stat = fresh.obj, fresh.texts, fresh.index, fresh.stat
        self._cache[page.name] = page
        return page

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
        obj = self._checked(path, data, run, number)
        page = _Page(name, obj, sig, number=number, next=obj["status"].get("next"))
        page.index = {e["id"]: i for i, e in enumerate(page.entries)}
        owner = obj["spec"].get("owner")
        if number == 1:
            page.recorded = isinstance(owner, str)
            first = page.entries[0].get("actor") if page.entries else None
            page.owner = owner if page.recorded else first if isinstance(first, str) else None
        page.texts = [None] * len(page.entries)
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

    def _new_page(self, run: str, number: int, owner: str | None = None) -> _Page:
        name = page_name(run, number)
        spec: dict[str, Any] = {"run": run, "page": number}
        if owner is not None:
            spec["owner"] = owner
        obj = {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": "EffectLedger",
               "metadata": {"name": name, "uid": str(uuid.uuid4()),
                            "labels": {f"{API_GROUP}/run": run},
                            "creationTimestamp": stamp(now().replace(microsecond=0)),
                            "generation": 1, "resourceVersion": "0"},
               "spec": spec,
               "status": {"entries": [], "entryCount": 0}}
        return _Page(name, obj, number=number, owner=owner, recorded=owner is not None)

    def _append(self, page: _Page, entry: Entry) -> None:
        page.index[entry.id] = len(page.entries)
        page.entries.append(entry.to_json())
        page.texts.append(None)
        self._summarize(page)

    @staticmethod
    def _summarize(page: _Page) -> None:
        assert page.obj is not None
        status = page.obj["status"]
        status["entryCount"] = len(page.entries)
        status["lastState"] = page.entries[-1]["state"] if page.entries else None

    @staticmethod
    def _entry(page: _Page, at: int) -> Entry:
        return Entry.model_validate(page.entries[at])

    def _write(self, page: _Page) -> None:
        assert page.obj is not None
        meta = page.obj["metadata"]
        meta["resourceVersion"] = str(int(meta.get("resourceVersion", "0")) + 1)
        data = _encode(page).encode("utf-8")
        path = self.root / f"{page.name}.json"
        try:
            write_atomic(path, data)
            st = path.stat()
        except OSError as exc:
            self._cache.pop(page.name, None)  # what is on disk is the truth again
            raise StoreUnavailable(f"cannot write the ledger {path}: {exc.strerror or exc}") from None
        page.stat = (st.st_ino, st.st_mtime_ns, st.st_size)
        self._cache[page.name] = page


_SPLICE = "\0entries\0"


def _encode(page: _Page) -> str:
    """The page as compact JSON (json's C encoder; indenting is ten times slower), with
    unchanged entries spliced in from their last text instead of encoded again."""
    dump = functools.partial(json.dumps, ensure_ascii=False, separators=(",", ":"))
    for i, text in enumerate(page.texts):
        if text is None:
            page.texts[i] = dump(page.entries[i])
    assert page.obj is not None
    status = {**page.obj["status"], "entries": _SPLICE}
    head = dump({**page.obj, "status": status})
    return head.replace(dump(_SPLICE), "[" + ",".join(t or "" for t in page.texts) + "]", 1) + "\n"


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

    def release_entry_sync(self, name: str, run: str, entry: str) -> bool:
        """Remove the lock if the entry ``entry`` of ``run`` holds it, whatever its ``since``
        (a rollback frees the key of an entry it undid, or found never ran)."""
        holder = self._holder(name)
        if holder is None or (holder.run, holder.entry) != (run, entry):
            return False
        return self._remove_if(name, holder)

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
