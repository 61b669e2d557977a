"""The local ledger: a run's pages, one file each, and a journal of what changed since.

``<dir>/<run>.json`` is what ``kubectl get effectledger <run> -o json`` would print
(apiVersion, kind, metadata, spec, status), so every ledger command reads either. A run
that grows past ``page_bytes`` (256 KiB) continues in ``<run>.p2.json`` (linked from
``status.next``), as the cluster store pages long before the API server's size limit.

Writes are appended, not rewritten. Each entry a write creates or changes is one record
appended to ``<dir>/<run>.journal``; the journal is folded into the pages (each changed
page rewritten whole, atomically) once it passes ``fold_bytes``, once the run has been
quiet for half a second, when the gateway stops, and after every write of a CLI command.
A run's entries are its pages with the journal's records applied in order (a record is a
whole entry: it replaces the entry of its id, or joins the last page), and every reader
applies them: the gateway, ``unwind plan``, ``rollback``, ``approve`` (``read_run``). So
a call costs one append of its entry, not a rewrite of its page.

A record is one line: the CRC-32 of the entry's JSON (8 hex digits), a space, the JSON.
A line without its newline, or whose checksum does not match, ends the journal: a crash
mid-append leaves at most that, at the tail, and the next writer cuts it off. A damaged
line followed by good ones is no crash's doing: the run is refused (``StoreUnavailable``)
rather than its later records dropped.

Durability, since a call is written ahead:

- a record that leaves its entry ``pending`` (a call's write-ahead) is fsync'ed before the
  write returns, so the upstream is called only once the entry is on disk; the calls that
  arrive together share one append and one fsync (group commit: the operations queued
  for a run while a write is under way go in the next one);
- any other record (a call's outcome, a refusal, an approval) is written before the write
  returns, so it survives the gateway's process being killed, and is fsync'ed with the
  next write-ahead or fold (within half a second). A machine that loses power in between
  loses at most those: the entry stays ``pending`` and its lookup resolves it, as for a
  gateway that died mid-call;
- a page is written to a temporary file, fsync'ed, renamed over the page, and the folder
  fsync'ed: a crash leaves the old page or the new one. A fold writes the pages, then
  empties the journal; after a crash in between, the records are applied again to pages
  that already hold them, which changes nothing.

Concurrency, since two processes (a gateway and ``unwind rollback``, say) may share the
folder: every read-modify-write of a run holds ``fcntl.flock`` on
``<dir>/.locks/<run>.run``, and reads what another process wrote since (the pages' and the
journal's inode, mtime and size tell); readers without the lock (``read_run``, a get
answered from memory) check the pages did not change under them. Idempotency-key locks
(``FileLocks``) are files created with O_CREAT|O_EXCL, which exactly one process can win.
The first page, written by the run's first entry, records the run's owner (``spec.owner``)
and an identity of its own (``metadata.uid``, a random UUID, as the API server gives
every object); every later write checks the owner under the run's lock (see ``store.py``).

The blocking file work runs in a worker thread, so a slow disk does not stall other calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import secrets
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .. import API_GROUP, API_VERSION
from ..api.resources import LedgerSpec, LedgerStatus
from . import lifecycle
from .entry import Entry, now, stamp
from .fence import Fence, Fenced
from .fence import parse as parse_fence
from .ledger_dir import LOCKS, check_private, open_file, read_file
from .ledger_dir import LedgerDirError as LedgerDirError  # kept importable from here
from .store import (
    EntryExists,
    EntryMissing,
    Holder,
    StoreUnavailable,
    check_owner,
    check_room,
    page_name,
)

PAGE_BYTES = 256 << 10
FOLD_BYTES = 256 << 10
QUIET_SECONDS = 0.5
FAST_SYNC = 0.001  # seconds
log = logging.getLogger(__name__)
Stat = tuple[int, int, int]  # (inode, mtime_ns, size) of a file as last read or written


def check_writable(root: Path) -> float:
    """Create the folder if needed, refuse one other users can write, and prove a file can
    be written, synced and removed; the seconds the sync took."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        (root / LOCKS).mkdir(exist_ok=True)
        check_private(root)
        check_private(root / LOCKS)
        probe = root / f".probe-{secrets.token_hex(4)}"
        fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        try:
            os.write(fd, b"ok")
            started = time.perf_counter()
            os.fsync(fd)
            return time.perf_counter() - started
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
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    _sync_folder(path.parent)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _sync_folder(folder: Path) -> None:
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _stat(st: os.stat_result) -> Stat:
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def journal_path(root: Path, run: str) -> Path:
    return root / f"{run}.journal"


# ---- the journal's records ----

def record(text: str) -> bytes:
    """One journal line: the CRC-32 of the entry's JSON, a space, the JSON, a newline."""
    data = text.encode("utf-8")
    return b"%08x %s\n" % (zlib.crc32(data), data)


def parse_records(data: bytes, where: Path) -> tuple[list[str], int]:
    """The complete records of a journal's bytes, and the offset just past the last one.
    A torn tail (a crash mid-append) is left out; damage followed by a good record raises."""
    texts: list[str] = []
    end = 0
    while True:
        nl = data.find(b"\n", end)
        if nl < 0:
            return texts, end
        text = _good(data[end:nl])
        if text is None:
            if _any_good(data, nl + 1):
                raise StoreUnavailable(f"the ledger journal {where} is damaged at byte {end} and "
                                       "holds records after it: it was not a crash; move the "
                                       "run's files away or fix it")
            return texts, end
        texts.append(text)
        end = nl + 1


def _good(line: bytes) -> str | None:
    if len(line) < 10 or line[8:9] != b" ":
        return None
    body = line[9:]
    try:
        if int(line[:8], 16) != zlib.crc32(body):
            return None
        return body.decode("utf-8")
    except ValueError:
        return None


def _any_good(data: bytes, start: int) -> bool:
    while (nl := data.find(b"\n", start)) >= 0:
        if _good(data[start:nl]) is not None:
            return True
        start = nl + 1
    return False


# ---- pages ----

@dataclass
class _Page:
    name: str
    number: int
    # The object without its entries (they are spliced in from ``texts`` when written);
    # None: not held in memory (a full page, unchanged since written: read again if needed).
    obj: dict[str, Any] | None
    stat: Stat | None = None  # the file as last read or written (None: not on disk yet)
    index: dict[str, int] = field(default_factory=dict)
    texts: list[str] = field(default_factory=list)  # each entry's JSON
    models: list[Entry | None] = field(default_factory=list)  # each entry, once parsed
    size: int = 0  # the page's bytes, roughly: as read or written, plus what was added since
    next: str | None = None
    # The run's owner (first page only): spec.owner (recorded), else the actor of the first
    # entry of a ledger written before owners were recorded.
    owner: str | None = None
    recorded: bool = False
    fence: Fence | None = None  # first page only: the rollback's fence (kept when obj is dropped)

    def entry(self, at: int) -> Entry:
        model = self.models[at]
        if model is None:
            try:
                model = self.models[at] = Entry.model_validate_json(self.texts[at])
            except ValidationError as exc:
                err = exc.errors()[0]
                where = ".".join(str(x) for x in err["loc"])
                raise StoreUnavailable(f"the ledger {self.name} holds an entry that cannot be "
                                       f"read ({where}: {err['msg']}): move the run's files "
                                       "away or fix them") from None
        return model

    def put(self, at: int, text: str, model: Entry | None) -> None:
        self.size += len(text) - len(self.texts[at])
        self.texts[at], self.models[at] = text, model

    def add(self, entry_id: str, text: str, model: Entry | None) -> None:
        self.index[entry_id] = len(self.texts)
        self.texts.append(text)
        self.models.append(model)
        self.size += len(text) + 1

    def encode(self) -> bytes:
        """The page as compact JSON, its entries spliced in from their texts."""
        assert self.obj is not None, "load the page first"
        last = self.entry(len(self.texts) - 1).state if self.texts else None
        status = {**self.obj["status"], "entries": "\0entries\0", "entryCount": len(self.texts),
                  "lastState": last}
        if self.next is not None:
            status["next"] = self.next
        head = json.dumps({**self.obj, "status": status}, ensure_ascii=False,
                          separators=(",", ":"))
        return (head.replace('"\\u0000entries\\u0000"', "[" + ",".join(self.texts) + "]", 1)
                + "\n").encode("utf-8")

    def as_object(self) -> dict[str, Any]:
        obj: dict[str, Any] = json.loads(self.encode())
        return obj


def _read_page(root: Path, name: str, run: str, number: int) -> _Page | None:
    path = root / f"{name}.json"
    try:
        raw, st = read_file(path)
        sig = _stat(st)
        data = json.loads(raw)
    except FileNotFoundError:
        if number == 1:
            return None
        raise StoreUnavailable(f"{path}: the page linked from page {number - 1} "
                               "is missing") from None
    except (OSError, ValueError) as exc:
        raise StoreUnavailable(f"cannot read the ledger {path}: {exc}") from None
    obj = _checked(path, data, run, number)
    entries = obj["status"].pop("entries")
    page = _Page(name, number, obj, sig, size=sig[2], next=obj["status"].pop("next", None))
    dump = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
    for item in entries:
        page.index[item["id"]] = len(page.texts)
        page.texts.append(dump(item))
        page.models.append(None)
    if number == 1:
        page.fence = parse_fence(obj["status"].get("fence"))
        owner = obj["spec"].get("owner")
        page.recorded = isinstance(owner, str)
        first = entries[0].get("actor") if entries else None
        page.owner = owner if page.recorded else first if isinstance(first, str) else None
    return page


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


def _new_page(run: str, number: int, owner: str | None = None) -> _Page:
    name = page_name(run, number)
    spec: dict[str, Any] = {"run": run, "page": number}
    if owner is not None:
        spec["owner"] = owner
    obj = {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": "EffectLedger",
           "metadata": {"name": name, "uid": str(uuid.uuid4()),
                        "labels": {f"{API_GROUP}/run": run},
                        "creationTimestamp": stamp(now().replace(microsecond=0)),
                        "generation": 1, "resourceVersion": "0"},
           "spec": spec, "status": {}}
    return _Page(name, number, obj, owner=owner, recorded=owner is not None)


@dataclass
class _Run:
    """A run as this process knows it: its pages with the journal's records applied."""

    name: str
    root: Path
    page_bytes: int
    pages: list[_Page]
    journal: Stat | None = None  # as last read or written (None: no journal file)
    offset: int = 0  # bytes of complete records in the journal
    dirty: list[_Page] = field(default_factory=list)  # pages the journal changed, or new
    unsynced: bool = False  # records written and not fsync'ed yet

    def __post_init__(self) -> None:  # paths as text: a call stats them a few times
        self.journal_file = str(journal_path(self.root, self.name))
        self.lock_file = os.path.join(self.root, LOCKS, f"{self.name}.run")

    def page_file(self, page: _Page) -> str:
        return os.path.join(self.root, f"{page.name}.json")

    @classmethod
    def read(cls, root: Path, run: str, page_bytes: int) -> _Run:
        pages: list[_Page] = []
        name: str | None = run
        while name is not None:
            page = _read_page(root, name, run, len(pages) + 1)
            if page is None:
                break
            pages.append(page)
            name = page.next
        return cls(run, root, page_bytes, pages)

    @property
    def count(self) -> int:
        return sum(len(p.index) for p in self.pages)

    def find(self, entry_id: str) -> tuple[_Page, int] | None:
        for page in reversed(self.pages):  # the latest entries are the likeliest
            if entry_id in page.index:
                return self.loaded(page), page.index[entry_id]
        return None

    def loaded(self, page: _Page) -> _Page:
        """The page with its entries in memory (read again if only its index was kept)."""
        if page.obj is None:
            fresh = _read_page(self.root, page.name, self.name, page.number)
            if fresh is None or fresh.obj is None:
                raise StoreUnavailable(f"the ledger page {page.name} disappeared")
            page.obj, page.texts, page.models, page.stat = (fresh.obj, fresh.texts,
                                                             fresh.models, fresh.stat)
        return page

    def apply(self, entry_id: str, text: str, model: Entry | None) -> None:
        """A record: replace the entry of its id, or add it to the last page (or to a new
        one, linked from it, once the last is full)."""
        found = self.find(entry_id)
        if found is not None:
            page, at = found
            page.put(at, text, model)
        else:
            if not self.pages:
                raise StoreUnavailable(f"the journal of run {self.name} in {self.root} holds "
                                       f"entries but the run has no page {self.name}.json: "
                                       "move the journal away or restore the page")
            page = self.loaded(self.pages[-1])
            if page.size >= self.page_bytes and page.texts:
                follow = _new_page(self.name, len(self.pages) + 1)
                page.next = follow.name
                self.mark(page)
                self.pages.append(follow)
                page = follow
            page.add(entry_id, text, model)
        self.mark(page)

    def mark(self, page: _Page) -> None:
        if page not in self.dirty:
            self.dirty.append(page)

    def replay(self, data: bytes) -> int:
        """Apply the journal's complete records in ``data``; the bytes they take."""
        texts, end = parse_records(data, Path(self.journal_file))
        for text in texts:
            try:
                entry_id = json.loads(text)["id"]
            except (ValueError, KeyError, TypeError):
                raise StoreUnavailable(f"the ledger journal {self.journal_file} "
                                       "holds a record that is not an entry: move the run's "
                                       "files away or fix it") from None
            self.apply(str(entry_id), text, None)
        return end

    def on_disk(self) -> bool:
        """Whether the pages and the journal are as this process last read or wrote them."""
        if not self.pages_on_disk():
            return False
        try:
            return _stat(os.stat(self.journal_file)) == self.journal
        except FileNotFoundError:
            return self.journal is None
        except OSError:
            return False

    def pages_on_disk(self) -> bool:
        if not self.pages:
            return not (self.root / f"{self.name}.json").exists()
        for page in self.pages:
            if page.stat is None:
                continue  # not written yet: were it written by another, the journal changed
            try:
                if _stat(os.stat(self.page_file(page))) != page.stat:
                    return False
            except OSError:
                return False
        return True


def read_run(root: str | os.PathLike[str], run: str, *, attempts: int = 20) -> list[dict[str, Any]]:
    """The run's pages as objects, the journal's records applied, read without the run's
    lock (so a read-only folder will do): a page replaced while it was read (a fold) is read
    again. No pages: an empty list."""
    folder = Path(root)
    for _ in range(attempts):
        state = _Run.read(folder, run, PAGE_BYTES)
        try:
            data = read_file(journal_path(folder, run))[0]
        except FileNotFoundError:
            data = b""
        except OSError as exc:
            raise StoreUnavailable(f"cannot read the ledger journal of run {run} in {folder}: "
                                   f"{exc.strerror or exc}") from None
        if data:
            state.replay(data)
        if state.pages_on_disk():
            return [state.loaded(p).as_object() for p in state.pages]
    raise StoreUnavailable(f"the ledger of run {run} in {folder} kept changing while it was read; "
                           "try again")


def runs_created(root: Path, actor: str, since: datetime) -> dict[str, datetime]:
    """See ``FileStore.runs_created``. A page written by this store starts with its metadata
    and spec (the status, with the entries, comes last), so only a page's head is read."""
    out: dict[str, datetime] = {}
    for path in root.glob("*.json"):
        if ".p" in path.stem or path.name.endswith(".rollback.json"):
            continue  # a continuation page, a frozen plan
        try:
            with os.fdopen(open_file(path, os.O_RDONLY), "rb") as f:
                head = f.read(8192)
                cut = head.find(b',"status":')
                obj = json.loads(head[:cut] + b"}") if cut > 0 else json.loads(head + f.read())
            spec, meta = obj.get("spec") or {}, obj.get("metadata") or {}
            made = meta.get("creationTimestamp")
            if spec.get("owner") != actor or spec.get("page", 1) != 1 or not isinstance(made, str):
                continue
            when = datetime.fromisoformat(made.replace("Z", "+00:00"))
        except (OSError, ValueError, AttributeError, StoreUnavailable):
            continue  # not a ledger page this store wrote (or a link): not counted
        if when >= since:
            out[str(spec.get("run") or path.stem)] = when
    return out


class _Batch:
    """One locked read-modify-write of a run: the records its operations wrote, whether one
    of them must be on disk before it returns, and whether to fold the journal."""

    def __init__(self, run: _Run, *, fold: bool = False) -> None:
        self.run = run
        self.records: list[str] = []
        self.durable = False
        self.fold = fold

    def get(self, entry_id: str) -> Entry | None:
        found = self.run.find(entry_id)
        return None if found is None else found[0].entry(found[1])

    def entries(self) -> list[Entry]:
        out: list[Entry] = []
        for page in self.run.pages:
            page = self.run.loaded(page)
            out += (page.entry(i) for i in range(len(page.texts)))
        return out

    def owner(self) -> str | None:
        return self.run.pages[0].owner if self.run.pages else None

    def fence(self) -> Fence | None:
        return self.run.pages[0].fence if self.run.pages else None

    def create(self, entry: Entry, max_entries: int | None = None) -> Entry:
        run = self.run
        check_owner(run.name, self.owner(), entry.actor)
        row = lifecycle.admit(entry)
        found = run.find(entry.id)
        if found is not None:
            raise EntryExists(found[0].entry(found[1]))
        fence = self.fence()
        if row.opens and fence is not None:
            raise Fenced(run.name, fence)
        check_room(run.name, run.count, max_entries)
        stored = entry.model_copy(update={"seq": run.count + 1})
        if not run.pages:  # the run's first page is written at once: it records the owner
            run.pages.append(_new_page(run.name, 1, owner=entry.actor))
            self.fold = True
        elif run.pages[0].owner is None:  # an older ledger, empty: its first entry owns it
            run.pages[0].owner = entry.actor
        self._put(stored)
        return stored

    def transition(self, entry_id: str, write: lifecycle.AnyWrite) -> Entry:
        found = self.run.find(entry_id)
        if found is None:
            raise EntryMissing(f"no entry {entry_id} in run {self.run.name}")
        page, at = found
        old = page.entry(at)
        new = write(old)  # the lifecycle: the writer's expectation, then the table
        fence = self.fence()
        if fence is not None and lifecycle.opens(old, new, write):
            raise Fenced(self.run.name, fence)
        first = self.run.pages[0]
        if first.recorded:
            check_owner(self.run.name, first.owner, new.actor)
        self._put(new)
        return new

    def close(self, fence: Fence) -> Fence:
        """Fence the run (its first page, written at once); a fence already there stays."""
        run = self.run
        if not run.pages:
            raise EntryMissing(f"no ledger of run {run.name}: nothing to roll back")
        first = run.loaded(run.pages[0])
        if first.fence is not None:
            return first.fence
        assert first.obj is not None
        first.obj["status"]["fence"] = fence.to_json()
        first.fence = fence
        run.mark(first)
        self.fold = True  # the page is written (and synced) before the fence counts
        return fence

    def _put(self, entry: Entry) -> None:
        text = entry.model_dump_json(exclude_none=True)
        self.run.apply(entry.id, text, entry)
        self.records.append(text)
        self.durable = self.durable or entry.state == "pending"


Op = Callable[[_Batch], Any]


def _fold(batch: _Batch) -> None:
    batch.fold = True


class FileStore:
    """Store entries in ``<root>/<run>.json`` and ``<root>/<run>.journal`` (see the module
    docstring).

    Calls that arrive together are batched: the operations queued for a run while a
    write is under way are applied together in the next locked read-modify-write, with one
    append (and at most one fsync) for all of them.
    """

    def __init__(self, root: str | os.PathLike[str], *, page_bytes: int = PAGE_BYTES,
                 fold_bytes: int = FOLD_BYTES, quiet_seconds: float = QUIET_SECONDS) -> None:
        self.root = Path(root)
        self.page_bytes, self.fold_bytes, self.quiet_seconds = page_bytes, fold_bytes, quiet_seconds
        # How long a journal sync takes (a moving average, from the folder's probe on): a
        # disk that syncs faster than a worker thread is woken is synced from the event loop,
        # a slower one from a thread, so that a slow disk never stalls the other calls.
        self.sync_seconds = check_writable(self.root)
        self.fsyncs = 0  # since start: the benchmark and /metrics read it
        self._runs: dict[str, _Run] = {}
        self._queued: dict[str, list[tuple[Op, asyncio.Future[Any]]]] = {}
        self._draining: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._last: dict[str, float] = {}

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

    async def transition(self, run: str, entry_id: str, write: lifecycle.AnyWrite) -> Entry:
        result: Entry = await self._submit(run, lambda b: b.transition(entry_id, write))
        return result

    async def fence(self, run: str, fence: Fence) -> Fence:
        result: Fence = await self._submit(run, lambda b: b.close(fence))
        return result

    async def entries(self, run: str) -> list[Entry]:
        result: list[Entry] = await self._submit(run, lambda b: b.entries())
        return result

    async def owner(self, run: str) -> str | None:
        result: str | None = await self._submit(run, lambda b: b.owner())
        return result

    async def runs_created(self, actor: str, since: datetime) -> dict[str, datetime]:
        """The runs of this folder whose first page ``actor`` created at or after ``since``
        (``metadata.creationTimestamp``, ``spec.owner``): ``--max-runs`` after a restart."""
        return await asyncio.to_thread(runs_created, self.root, actor, since)

    async def aclose(self) -> None:
        """Fold every run's journal into its pages (the gateway stops)."""
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        for run, state in list(self._runs.items()):
            if state.offset or state.unsynced or state.dirty:
                try:
                    await self._submit(run, _fold)
                except StoreUnavailable as exc:
                    log.error("could not fold the journal of run %s: %s", run, exc)

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
                ops = [op for op, _ in batch]
                try:
                    here = await self._apply_here(run, ops)
                    results = here if here is not None else await asyncio.to_thread(
                        self._apply, run, ops)
                except Exception as exc:  # the lock or the read failed: every call hears it
                    results = [(False, exc)] * len(batch)
                for (_, future), (ok, value) in zip(batch, results, strict=True):
                    if not future.done():
                        (future.set_result if ok else future.set_exception)(value)
        finally:
            self._draining.discard(run)
        self._fold_when_quiet(run)

    def _fold_when_quiet(self, run: str) -> None:
        """Fold the run's journal once no write came for ``quiet_seconds``."""
        state = self._runs.get(run)
        if state is None or not (state.offset or state.unsynced or state.dirty):
            return
        loop = asyncio.get_running_loop()
        self._last[run] = loop.time()
        if run not in self._timers:
            self._timers[run] = loop.call_later(self.quiet_seconds, self._quiet, run)

    def _quiet(self, run: str) -> None:
        loop = asyncio.get_running_loop()
        del self._timers[run]
        left = self._last.get(run, 0.0) + self.quiet_seconds - loop.time()
        if left > 0:  # written to since the timer was set
            self._timers[run] = loop.call_later(left, self._quiet, run)
            return
        task = loop.create_task(self._fold_now(run))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _fold_now(self, run: str) -> None:
        try:
            await self._submit(run, _fold)
        except StoreUnavailable as exc:  # the next write, or the next quiet moment, tries again
            log.warning("could not fold the journal of run %s: %s", run, exc)

    def _apply(self, run: str, ops: list[Op], *, fold: bool = False) -> list[tuple[bool, Any]]:
        with self._locked(run):
            try:
                state = self._current(run)
            except StoreUnavailable:
                self._runs.pop(run, None)
                raise
            batch, results = self._run_ops(state, ops, fold)
            try:
                self._persist(state, batch)
            except StoreUnavailable as exc:
                self._runs.pop(run, None)  # the disk is the truth again
                return [(False, exc)] * len(ops)
            return results

    async def _apply_here(self, run: str, ops: list[Op]) -> list[tuple[bool, Any]] | None:
        """``_apply`` without a worker thread where one is not needed: when the run's lock
        is free, nothing changed on disk and no fold is due, the operations run in the
        event loop and their records are appended from it (an append without fsync takes
        microseconds); only an fsync goes to a thread. None: not here, use ``_apply``."""
        state = self._runs.get(run)
        if state is None or _fold in ops:
            return None
        try:
            fd = open_file(state.lock_file, os.O_RDWR)
        except (OSError, StoreUnavailable):
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return None  # another process writes: wait for it in a thread
            if not state.on_disk():
                return None
            batch, results = self._run_ops(state, ops, False)
            try:
                if self._folds(state, batch) or (batch.durable and self.sync_seconds > FAST_SYNC):
                    await asyncio.to_thread(self._persist, state, batch)
                else:
                    self._persist(state, batch)
            except StoreUnavailable as exc:
                self._runs.pop(run, None)
                return [(False, exc)] * len(ops)
            return results
        finally:
            os.close(fd)

    @staticmethod
    def _run_ops(state: _Run, ops: list[Op], fold: bool) -> tuple[_Batch, list[tuple[bool, Any]]]:
        batch = _Batch(state, fold=fold)
        results: list[tuple[bool, Any]] = []
        for op in ops:
            try:
                results.append((True, op(batch)))
            except Exception as exc:
                results.append((False, exc))
        return batch, results

    def _peek(self, run: str, entry_id: str) -> tuple[Entry | None] | None:
        """Answer a get from memory when the run is unchanged on disk (a few stat calls, no
        lock): ``(entry or None,)``, or None to ask the disk."""
        state = self._runs.get(run)
        if state is None or run in self._draining or not state.on_disk():
            return None
        for page in reversed(state.pages):
            if entry_id in page.index:
                return (page.entry(page.index[entry_id]),) if page.obj is not None else None
        return (None,)

    def _one(self, run: str, op: Op, *, fold: bool = False) -> Any:
        [(ok, value)] = self._apply(run, [op], fold=fold)
        if not ok:
            raise value
        return value

    # ---- the same, synchronous (the CLI uses these; its writes leave the pages current) ----

    def path(self, run: str, page: int = 1) -> Path:
        return self.root / f"{page_name(run, page)}.json"

    def get_sync(self, run: str, entry_id: str) -> Entry | None:
        result: Entry | None = self._one(run, lambda b: b.get(entry_id))
        return result

    def entries_sync(self, run: str) -> list[Entry]:
        result: list[Entry] = self._one(run, lambda b: b.entries())
        return result

    def create_sync(self, run: str, entry: Entry, *, max_entries: int | None = None) -> Entry:
        result: Entry = self._one(run, lambda b: b.create(entry, max_entries), fold=True)
        return result

    def transition_sync(self, run: str, entry_id: str, write: lifecycle.AnyWrite) -> Entry:
        result: Entry = self._one(run, lambda b: b.transition(entry_id, write), fold=True)
        return result

    def fence_sync(self, run: str, fence: Fence) -> Fence:
        """Close the run to new calls (``unwind rollback``): under the run's lock, so a
        gateway's next write-ahead, which holds the same lock, sees it."""
        result: Fence = self._one(run, lambda b: b.close(fence), fold=True)
        return result

    def fenced_sync(self, run: str) -> Fence | None:
        result: Fence | None = self._one(run, lambda b: b.fence())
        return result

    # ---- the files ----

    @contextlib.contextmanager
    def _locked(self, run: str) -> Iterator[None]:
        try:
            fd = open_file(os.path.join(self.root, LOCKS, f"{run}.run"), os.O_CREAT | os.O_RDWR)
        except OSError as exc:
            raise StoreUnavailable(f"cannot lock the ledger of run {run} in {self.root}: "
                                   f"{exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the flock

    def _current(self, run: str) -> _Run:
        """The run as on disk now: from memory when nothing changed, with only the journal's
        new records read when only they are new, else read again."""
        state = self._runs.get(run)
        if state is not None and state.on_disk():
            return state
        if state is not None and state.journal is not None and state.pages_on_disk():
            try:
                st = os.stat(state.journal_file)
            except OSError:
                st = None
            if st is not None and st.st_ino == state.journal[0] and st.st_size >= state.offset:
                self._catch_up(state, state.offset)
                return state
        state = _Run.read(self.root, run, self.page_bytes)
        self._runs[run] = state
        self._catch_up(state, 0)
        return state

    def _catch_up(self, state: _Run, start: int) -> None:
        """Apply the journal's records from ``start``; cut off a torn tail (the run is locked:
        nobody is appending)."""
        path = state.journal_file
        try:
            data, st = read_file(path, start)
        except FileNotFoundError:
            state.journal, state.offset = None, 0
            return
        except OSError as exc:
            raise StoreUnavailable(f"cannot read the ledger journal {path}: "
                                   f"{exc.strerror or exc}") from None
        end = start + state.replay(data)
        if end < st.st_size:
            try:
                fd = open_file(path, os.O_WRONLY)
                try:
                    os.ftruncate(fd, end)
                    st = os.fstat(fd)
                finally:
                    os.close(fd)
            except OSError as exc:
                raise StoreUnavailable(f"cannot cut the torn tail off the ledger journal {path}: "
                                       f"{exc.strerror or exc}") from None
        state.offset, state.journal = end, _stat(st)

    def _folds(self, state: _Run, batch: _Batch) -> bool:
        return batch.fold or state.offset + sum(len(t) + 10 for t in batch.records) >= self.fold_bytes

    def _persist(self, state: _Run, batch: _Batch) -> None:
        try:
            if self._folds(state, batch):
                self._fold(state)
            elif batch.records:
                self._append(state, batch.records, sync=batch.durable)
        except OSError as exc:
            raise StoreUnavailable(f"cannot write the ledger of run {state.name} in {self.root}: "
                                   f"{exc.strerror or exc}") from None

    def _append(self, state: _Run, texts: list[str], *, sync: bool) -> None:
        created = state.journal is None
        fd = open_file(state.journal_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            _write_all(fd, b"".join(record(t) for t in texts))
            if sync or created:
                started = time.perf_counter()
                os.fdatasync(fd)  # the data and the size: what a later read needs
                self.fsyncs += 1
                self.sync_seconds += (time.perf_counter() - started - self.sync_seconds) / 5
            st = os.fstat(fd)
        finally:
            os.close(fd)
        if created:  # the journal's name must be on disk too
            _sync_folder(self.root)
            self.fsyncs += 1
        state.unsynced = not (sync or created)
        state.offset, state.journal = st.st_size, _stat(st)

    def _fold(self, state: _Run) -> None:
        """Write the pages the journal changed (a new page before the page linking to it),
        then empty the journal."""
        for page in sorted(state.dirty, key=lambda p: p.number, reverse=True):
            self._write(page)
        state.dirty.clear()
        if state.journal is not None and state.journal[2] > 0:
            fd = open_file(state.journal_file, os.O_WRONLY)
            try:
                os.ftruncate(fd, 0)
                os.fsync(fd)
                self.fsyncs += 1
                state.journal = _stat(os.fstat(fd))
            finally:
                os.close(fd)
        state.offset, state.unsynced = 0, False
        for page in state.pages[:-1]:  # full pages: keep their index, not their entries
            page.obj, page.texts, page.models = None, [], []

    def _write(self, page: _Page) -> None:
        assert page.obj is not None
        meta = page.obj["metadata"]
        meta["resourceVersion"] = str(int(meta.get("resourceVersion", "0")) + 1)
        data = page.encode()
        path = self.root / f"{page.name}.json"
        write_atomic(path, data)
        self.fsyncs += 2
        page.stat, page.size = _stat(path.stat()), len(data)


class FileLocks:
    """Idempotency-key locks as files ``<root>/.locks/<name>.key`` created with O_EXCL."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.dir = Path(root) / LOCKS
        self.dir.mkdir(parents=True, exist_ok=True)
        check_private(Path(root))
        check_private(self.dir)

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
        data = json.dumps({"run": holder.run, "entry": holder.entry, "since": holder.since,
                           **({"deadline": holder.deadline} if holder.deadline else {})}).encode()
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

    def peek_sync(self, name: str) -> Holder | None:
        return self._holder(name)

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
            data = json.loads(read_file(path)[0])
            deadline = data.get("deadline")
            return Holder(str(data["run"]), str(data["entry"]), str(data["since"]),
                          str(deadline) if deadline else None)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, StoreUnavailable):
            return holder_being_written(path)

    def _remove_if(self, name: str, holder: Holder) -> bool:
        """Remove the lock if ``holder`` has it, serialized by a mutex so that a check and
        a removal by one process never interleave with another's."""
        fd = open_file(self.dir / ".mutex", os.O_CREAT | os.O_RDWR)
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
