"""The cluster ledger: a run's EffectLedger objects, and a Lease per idempotency key.

``ClusterStore`` keeps a run's entries in the **status** of its EffectLedger in the pod's
namespace (``spec`` holds only the run and the page; the rollback request is someone
else's to write). Every write is conditional on the ``resourceVersion`` it was computed
from: a JSON patch of the status subresource that sets ``metadata.resourceVersion`` and
adds or replaces only the entries it changed (a PUT of the whole status for a page's
first entries and for the link to a next page). The API server refuses it with 409 when
anyone (another gateway, the operator writing approval decisions) wrote in between, and
the store then reads the page again and applies the same operations to the fresh pages:
each write is checked against the fresh entry again (``lifecycle.apply``: the state its
writer read, the table), so a retry never lands on an entry someone else moved. Change
functions must be pure functions of the entry they get (the ``Store`` contract).
A rollback's fence (``fence.py``) rides in each page's ``status.fence``, and the request
itself in the first page's ``spec.rollback``: a write-ahead conditional on the page's
resourceVersion sees it in the same write.

What a call sends, once its run's ledger is loaded (docs/gateway.md, "The ledger"): the
check that its Idempotency-Key is free is answered from the store's copy of the page
(``probe``: the write that follows is conditional on that copy, so it, not the read,
decides), a keyed call's Lease create goes out together with the write of its ``pending``
entry, and the upstream is called once both returned: one round trip before the upstream,
then the outcome's write. An id the copy holds is read fresh (its state may have moved).

- The EffectLedger is created (spec only: a create ignores status) when the run's first
  entry comes, with that entry's actor as ``spec.owner``; 409 means it exists already
  (another gateway's first call may have won: its owner is then read back, and an entry
  of another actor is refused, ``NotOwner``). The owner never changes (the gateway may
  only create ledgers, and the admission webhook refuses a spec change), so checking it
  in each batch, whose PUTs carry the page's resourceVersion, is checking it in the write.
- Operations on one run that arrive while a write is under way are applied together in
  the next write: many concurrent calls cost a few PUTs.
- The API server stores the whole page at each write, so a run continues in a linked
  page (``<run>.p2``, ``status.next`` on the previous one) once a page passes
  ``page_bytes``: long before the API server's 1.5 MiB limit, and small enough that each
  write stays cheap for etcd (the benchmark reports the bytes sent per call). The next page is created before the
  link to it is written, so a link never points at nothing.
- Anything that stops a read or a write (the API server unreachable, 401/403, 5xx, a
  refused object) raises ``StoreUnavailable``: the gateway answers 503 and calls nothing.

``LeaseLocks`` holds an idempotency key with a ``coordination.k8s.io/v1`` Lease named
``unwind-key-<hash>``: creating an object is atomic, so exactly one gateway, in any pod,
wins a key. The holder's entry is the Lease's ``holderIdentity``; its run and the time it
was taken ride in annotations. Releasing deletes it with a uid and resourceVersion
precondition, so a lock taken again meanwhile is never removed by mistake.

Pure of any HTTP library: the requests go through an ``Api`` (the gateway's aiohttp
client), so this module stays in the ledger layer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol
from urllib.parse import quote

from .. import API_GROUP, API_VERSION
from . import lifecycle
from .entry import Entry, now, parse_stamp, stamp
from .fence import Fence, Fenced, requested_fence
from .fence import parse as parse_fence
from .store import (
    EntryExists,
    EntryMissing,
    Holder,
    StoreUnavailable,
    check_owner,
    check_room,
    page_name,
)

log = logging.getLogger("unwind.ledger")
PAGE_BYTES = 16 << 10
MAX_ATTEMPTS = 30
RUN_LABEL = f"{API_GROUP}/run"
# Whose gateway created a run (spec.owner, in the metadata, so that a restarted gateway
# counts its runs from the ledgers' metadata alone: runs_created).
OWNER_ANNOTATION = f"{API_GROUP}/owner"


class Api(Protocol):
    async def request(self, method: str, path: str, body: Any = None, *,
                      content_type: str = "application/json",
                      accept: str = "application/json") -> tuple[int, Any]:
        """(status, decoded JSON). Raises ConnectionError (an OSError) when nothing answered."""
        ...


class _Conflict(Exception):
    """Someone wrote the page since it was read (409): read it again and re-apply."""


def _problem(status: int, body: Any) -> str:
    message = body.get("message", "") if isinstance(body, dict) else ""
    if status in (401, 403):
        return (f"the API server refused the gateway's ServiceAccount ({status}: {message}); "
                "bind it to the ClusterRole unwind-gateway in this namespace")
    return f"the API server answered {status}: {message}"


async def _call(api: Api, method: str, path: str, body: Any = None, *,
                ok: tuple[int, ...] = (200, 201), content_type: str = "application/json"
                ) -> tuple[int, Any]:
    """A request whose status is in ``ok``, 404 or 409; anything else is StoreUnavailable."""
    try:
        status, answer = await api.request(method, path, body, content_type=content_type)
    except OSError as exc:
        raise StoreUnavailable(str(exc) or type(exc).__name__) from None
    if status in ok or status in (404, 409):
        return status, answer
    raise StoreUnavailable(_problem(status, answer))


@dataclass
class _Page:
    name: str
    number: int
    rv: str = ""
    entries: list[dict[str, Any]] | None = field(default_factory=list)  # None: not held
    index: dict[str, int] = field(default_factory=dict)
    next: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # status fields others write
    size: int = 0  # bytes of the status as last read or written
    count: int = 0
    # The run's owner (first page only): spec.owner (recorded), else the actor of the first
    # entry of a ledger made before owners were recorded.
    owner: str | None = None
    recorded: bool = False
    # The rollback's fence as this page holds it: its status.fence (the operator's), or on
    # the first page the request itself (spec.rollback.requested).
    fence: Fence | None = None

    def absorb(self, obj: dict[str, Any]) -> None:
        status = dict(obj.get("status") or {})
        entries = status.pop("entries", None) or []
        if self.number == 1:
            self.owner, self.recorded = owner_of(obj)
        self.fence = parse_fence(status.get("fence")) or (
            requested_fence(obj.get("spec"), stamp(now())) if self.number == 1 else None)
        self.rv = str(obj["metadata"].get("resourceVersion", ""))
        self.entries = list(entries)
        self.index = {str(e.get("id")): i for i, e in enumerate(self.entries)}
        self.next = status.pop("next", None)
        for key in ("entryCount", "lastState"):
            status.pop(key, None)
        self.extra = status
        self.count = len(self.entries)
        self.size = len(_dump(self.status(self.entries)))

    def status(self, entries: list[dict[str, Any]], next_page: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {**self.extra, "entries": entries, "entryCount": len(entries),
                               "lastState": entries[-1].get("state") if entries else None}
        link = next_page or self.next
        if link:
            out["next"] = link
        return out


@dataclass
class _Run:
    pages: list[_Page] = field(default_factory=list)
    loaded: bool = False

    def find(self, entry_id: str) -> _Page | None:
        return next((p for p in self.pages if entry_id in p.index), None)


@dataclass
class _Op:
    apply: Callable[[_Work], Awaitable[tuple[_Page, Any]]]
    future: asyncio.Future[Any]
    creates: str | None = None  # the actor of the entry it creates


def owner_of(obj: dict[str, Any]) -> tuple[str | None, bool]:
    """A first page's owner, and whether it is recorded (else its first entry's actor)."""
    owner = (obj.get("spec") or {}).get("owner")
    if isinstance(owner, str):
        return owner, True
    entries = (obj.get("status") or {}).get("entries") or []
    first = entries[0].get("actor") if entries and isinstance(entries[0], dict) else None
    return (first if isinstance(first, str) else None), False


def _dump(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _changes(page: _Page, entries: list[dict[str, Any]], rv: str,
             status: dict[str, Any]) -> list[dict[str, Any]] | None:
    """A JSON patch from the page as held at ``rv`` to ``entries``: the entries added or
    replaced (a batch's working copy shares the dicts it left alone), the count and last
    state. Its first operation sets ``metadata.resourceVersion`` to ``rv``, which makes the
    API server's update conditional exactly like a PUT's: 409 when anyone wrote since.
    None when the page as held is not the one at ``rv`` or holds no entries yet (the
    status may not exist): the whole status is PUT then."""
    held = page.entries
    if held is None or page.rv != rv or not held or len(entries) < len(held):
        return None
    ops: list[dict[str, Any]] = [{"op": "replace", "path": "/metadata/resourceVersion",
                                  "value": rv}]
    for i, entry in enumerate(entries):
        if i >= len(held):
            ops.append({"op": "add", "path": "/status/entries/-", "value": entry})
        elif entry is not held[i]:
            ops.append({"op": "replace", "path": f"/status/entries/{i}", "value": entry})
    ops.append({"op": "add", "path": "/status/entryCount", "value": status["entryCount"]})
    ops.append({"op": "add", "path": "/status/lastState", "value": status["lastState"]})
    return ops


def _newer(rv: str, than: str) -> bool:
    if rv.isdigit() and than.isdigit():
        return int(rv) >= int(than)
    return True


class ClusterStore:
    """A run's entries in its EffectLedger pages in ``namespace`` (see the module docstring)."""

    def __init__(self, api: Api, namespace: str, *, page_bytes: int = PAGE_BYTES) -> None:
        self.api, self.namespace, self.page_bytes = api, namespace, page_bytes
        self.base = (f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{quote(namespace, safe='')}"
                     "/effectledgers")
        self._runs: dict[str, _Run] = {}
        self._queued: dict[str, list[_Op]] = {}
        self._draining: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.writes = 0  # PUTs and POSTs made, for the benchmark

    # ---- the Store protocol ----

    async def get(self, run: str, entry_id: str) -> Entry | None:
        """Read from the API server every time: someone else (the operator writing approval
        decisions, another gateway) may have changed the entry since this process saw it.
        Reads leave the write path's pages alone (a batch may be between its reads and its
        PUTs); they only use what it knows to go straight to the right page."""
        state = self._runs.get(run)
        known = state.find(entry_id) if state is not None and state.loaded else None
        if known is not None and state is not None and known is not state.pages[-1]:
            name: str | None = known.name  # a full page: its entries stay on it
        else:
            name = state.pages[-1].name if state is not None and state.loaded and state.pages else run
        while name is not None:
            obj = await self._read(name)
            if obj is None:
                return None
            status = obj.get("status") or {}
            for entry in status.get("entries") or []:
                if entry.get("id") == entry_id:
                    return Entry.model_validate(entry)
            name = status.get("next")
        return None

    async def probe(self, run: str, entry_id: str) -> Entry | None:
        """``get`` for the Idempotency-Key of a call about to be written ahead, with no request
        when this process's copy of the run's tail lacks the id: the create that follows is
        written on the resourceVersion that copy holds, so an entry anyone else stored
        since makes that write fail (409; the page is read again and the create raises
        ``EntryExists``) rather than go unseen. An id the copy holds, or a run not loaded
        yet, is read from the API server: the entry may have moved (an approval written
        by the operator, another gateway's outcome)."""
        state = self._runs.get(run)
        if state is None or not state.loaded or not state.pages or state.pages[-1].entries is None \
                or state.find(entry_id) is not None:
            return await self.get(run, entry_id)
        return None

    async def create(self, run: str, entry: Entry, *, max_entries: int | None = None) -> Entry:
        async def apply(work: _Work) -> tuple[_Page, Any]:
            return await work.create(entry, max_entries)
        result: Entry = await self._submit(run, apply, creates=entry.actor)
        return result

    async def transition(self, run: str, entry_id: str, write: lifecycle.AnyWrite) -> Entry:
        async def apply(work: _Work) -> tuple[_Page, Any]:
            return await work.transition(entry_id, write)
        result: Entry = await self._submit(run, apply)
        return result

    async def entries(self, run: str) -> list[Entry]:
        selector = quote(f"{RUN_LABEL}={run}", safe="")
        status, body = await _call(self.api, "GET", f"{self.base}?labelSelector={selector}")
        if status != 200:
            raise StoreUnavailable(_problem(status, body))
        pages = [o for o in body.get("items", []) if (o.get("spec") or {}).get("run") == run]
        pages.sort(key=lambda o: int((o.get("spec") or {}).get("page", 1)))
        return [Entry.model_validate(e) for o in pages for e in (o.get("status") or {}).get("entries", [])]

    async def runs_created(self, actor: str, since: datetime) -> dict[str, datetime]:
        """The runs whose ledger ``actor``'s gateways created at or after ``since`` (their
        first page's creationTimestamp), for ``--max-runs`` after a restart: read from the
        ledgers' metadata only (a few hundred bytes each; ``OWNER_ANNOTATION`` says whose,
        so a ledger created before it is not counted)."""
        selector = quote(RUN_LABEL, safe="")
        try:
            status, body = await self.api.request(
                "GET", f"{self.base}?labelSelector={selector}",
                accept="application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,"
                       "application/json")
        except OSError as exc:
            raise StoreUnavailable(str(exc) or type(exc).__name__) from None
        if status != 200 or not isinstance(body, dict):
            raise StoreUnavailable(_problem(status, body))
        out: dict[str, datetime] = {}
        for item in body.get("items") or []:
            meta = item.get("metadata") or {}
            run = (meta.get("labels") or {}).get(RUN_LABEL)
            made = meta.get("creationTimestamp")
            if (meta.get("annotations") or {}).get(OWNER_ANNOTATION) != actor \
                    or meta.get("name") != run or not isinstance(made, str):
                continue
            when = parse_stamp(made)
            if when >= since:
                out[str(run)] = when
        return out

    async def owner(self, run: str) -> str | None:
        """Read from the API server (page 1), never from what this process saw earlier."""
        obj = await self._read(run)
        return None if obj is None else owner_of(obj)[0]

    async def aclose(self) -> None:
        for task in list(self._tasks):
            await task

    # ---- pages ----

    def _path(self, name: str, status: bool = False) -> str:
        return f"{self.base}/{quote(name, safe='')}" + ("/status" if status else "")

    async def _read(self, name: str) -> dict[str, Any] | None:
        status, body = await _call(self.api, "GET", self._path(name))
        if status == 404:
            return None
        if status != 200 or not isinstance(body, dict):
            raise StoreUnavailable(_problem(status, body))
        return body

    async def _loaded(self, run: str) -> _Run:
        """The run's pages, read by following ``next`` from page 1 the first time."""
        state = self._runs.setdefault(run, _Run())
        if not state.loaded:
            state.pages = []
            name: str | None = run
            while name is not None:
                obj = await self._read(name)
                if obj is None:
                    if state.pages:
                        raise StoreUnavailable(f"the ledger page {name}, linked from "
                                               f"{state.pages[-1].name}, is missing")
                    break
                page = _Page(name, len(state.pages) + 1)
                page.absorb(obj)
                state.pages.append(page)
                name = page.next
            for page in state.pages[:-1]:
                page.entries = None  # full pages: their index is enough until needed
            state.loaded = True
        return state

    async def _refresh(self, run: str, state: _Run, page: _Page) -> None:
        obj = await self._read(page.name)
        if obj is None:  # deleted under us: start from page 1 again
            state.loaded = False
            await self._loaded(run)
            return
        if _newer(str(obj["metadata"].get("resourceVersion", "")), page.rv):
            page.absorb(obj)
        if page is not state.pages[-1]:
            return
        while page.next is not None:  # the tail grew a page since: follow the chain
            obj = await self._read(page.next)
            if obj is None:
                raise StoreUnavailable(f"the ledger page {page.next}, linked from {page.name}, "
                                       "is missing")
            page.entries = None
            follow = _Page(page.next, page.number + 1)
            follow.absorb(obj)
            state.pages.append(follow)
            page = follow

    async def _entries_of(self, run: str, state: _Run, page: _Page) -> list[dict[str, Any]]:
        if page.entries is None:
            await self._refresh(run, state, page)
        assert page.entries is not None
        return page.entries

    async def _create_page(self, run: str, number: int, owner: str | None = None) -> _Page:
        """Create the page object (spec only), or read the one someone else created."""
        name = page_name(run, number)
        spec: dict[str, Any] = {"run": run, "page": number}
        if owner is not None:
            spec["owner"] = owner
        meta: dict[str, Any] = {"name": name, "labels": {RUN_LABEL: run}}
        if owner is not None:
            meta["annotations"] = {OWNER_ANNOTATION: owner}
        body = {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": "EffectLedger",
                "metadata": meta, "spec": spec}
        status, obj = await _call(self.api, "POST", self.base, body)
        self.writes += 1
        if status == 409:
            obj = await self._read(name)
            if obj is None:
                raise StoreUnavailable(f"the ledger page {name} exists and does not")
        elif status == 404:
            raise StoreUnavailable(f"cannot create EffectLedger {name}: the namespace "
                                   f"{self.namespace} or the EffectLedger CRD is missing")
        page = _Page(name, number)
        page.absorb(obj)
        return page

    async def _put(self, page: _Page, entries: list[dict[str, Any]], rv: str, run: str,
                   next_page: str | None = None) -> None:
        """Write the page's status as computed from the version ``rv`` (409: it changed)."""
        status_obj = page.status(entries, next_page)
        ops = _changes(page, entries, rv, status_obj) if next_page is None else None
        if ops is not None:  # only the entries that changed, on the same precondition
            status, obj = await _call(self.api, "PATCH", self._path(page.name, status=True), ops,
                                      content_type="application/json-patch+json")
        else:
            body = {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": "EffectLedger",
                    "metadata": {"name": page.name, "namespace": self.namespace,
                                 "resourceVersion": rv},
                    "spec": {"run": run, "page": page.number}, "status": status_obj}
            status, obj = await _call(self.api, "PUT", self._path(page.name, status=True), body)
        self.writes += 1
        if status in (404, 409):
            raise _Conflict(page.name)
        page.rv = str(obj["metadata"]["resourceVersion"])
        page.entries = entries
        page.index = {str(e.get("id")): i for i, e in enumerate(entries)}
        page.count = len(entries)
        page.next = status_obj.get("next")
        page.size = len(_dump(status_obj))

    async def _roll(self, run: str, state: _Run) -> bool:
        """Continue the run in a new page: create it, then link it from the tail. False
        when the tail changed meanwhile (read again and retry)."""
        tail = state.pages[-1]
        follow = await self._create_page(run, tail.number + 1)
        entries = await self._entries_of(run, state, tail)
        try:
            await self._put(tail, entries, tail.rv, run, next_page=follow.name)
        except _Conflict:
            await self._refresh(run, state, tail)
            return False
        tail.entries = None
        state.pages.append(follow)
        return True

    # ---- batched writes ----

    async def _submit(self, run: str, apply: Callable[[_Work], Awaitable[tuple[_Page, Any]]],
                      *, creates: str | None = None) -> Any:
        loop = asyncio.get_running_loop()
        op = _Op(apply, loop.create_future(), creates)
        self._queued.setdefault(run, []).append(op)
        if run not in self._draining:
            self._draining.add(run)
            task = loop.create_task(self._drain(run))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await op.future

    async def _drain(self, run: str) -> None:
        try:
            while self._queued.get(run):
                batch = self._queued.pop(run)
                try:
                    await self._write(run, batch)
                except Exception as exc:  # every waiting call hears it
                    failure = exc if isinstance(exc, StoreUnavailable) else StoreUnavailable(
                        f"the ledger write failed: {exc}")
                    if not isinstance(exc, StoreUnavailable):
                        log.exception("ledger write of run %s failed", run)
                    for op in batch:
                        if not op.future.done():
                            op.future.set_exception(failure)
                    self._runs.pop(run, None)  # read everything again next time
        finally:
            self._draining.discard(run)

    async def _write(self, run: str, ops: list[_Op]) -> None:
        todo = ops
        for attempt in range(MAX_ATTEMPTS):
            if attempt:  # another writer won the page: let it finish before trying again
                await asyncio.sleep(random.uniform(0, min(0.2, 0.01 * attempt)))
            state = await self._loaded(run)
            creator = next((op.creates for op in todo if op.creates), None)
            if creator is not None:
                if not state.pages:
                    state.pages.append(await self._create_page(run, 1, owner=creator))
                elif state.pages[-1].size >= self.page_bytes and state.pages[-1].count \
                        and state.pages[-1].fence is None and not await self._roll(run, state):
                    continue  # (a fenced tail is not continued: its write-ahead is refused)
            work = _Work(self, run, state)
            touched: dict[str, list[tuple[_Op, Any]]] = {}
            for op in todo:
                try:
                    page, value = await op.apply(work)
                except Exception as exc:  # EntryExists, EntryMissing, Stale, a bad change
                    if not op.future.done():
                        op.future.set_exception(exc)
                    continue
                touched.setdefault(page.name, []).append((op, value))
            todo = []
            for name, done in touched.items():
                page = next(p for p in state.pages if p.name == name)
                try:
                    await self._put(page, work.copies[name], work.rvs[name], run)
                except _Conflict:
                    await self._refresh(run, state, page)
                    todo.extend(op for op, _ in done)
                    continue
                for op, value in done:
                    if not op.future.done():
                        op.future.set_result(value)
            for page in state.pages[:-1]:
                page.entries = None
            if not todo:
                return
        for op in todo:
            if not op.future.done():
                op.future.set_exception(StoreUnavailable(
                    f"the ledger of run {run} kept changing under the write ({MAX_ATTEMPTS} "
                    "conflicts in a row); try again"))


class _Work:
    """One batch's working copies of the pages it changes, each with the resourceVersion it
    was copied from (the PUT's precondition): written only if nobody wrote in between."""

    def __init__(self, store: ClusterStore, run: str, state: _Run) -> None:
        self.store, self.run, self.state = store, run, state
        self.copies: dict[str, list[dict[str, Any]]] = {}
        self.rvs: dict[str, str] = {}

    async def _copy(self, page: _Page) -> list[dict[str, Any]]:
        if page.name not in self.copies:
            entries = await self.store._entries_of(self.run, self.state, page)
            # no await between reading the entries and their version: they belong together
            self.copies[page.name], self.rvs[page.name] = list(entries), page.rv
        return self.copies[page.name]

    def _fence(self, page: _Page) -> Fence | None:
        """The fence a write to ``page`` must honour: the page's own (its status.fence, or on
        the first page the request itself). The write is conditional on that page's
        resourceVersion, so this is the fence as of the write; the operator fences every
        page before it plans."""
        return page.fence

    async def create(self, entry: Entry, max_entries: int | None = None) -> tuple[_Page, Entry]:
        head = self.state.pages[0]
        check_owner(self.run, head.owner, entry.actor)
        row = lifecycle.admit(entry)
        held = self.state.find(entry.id)
        tail = self.state.pages[-1]
        if held is not None and held is not tail:
            entries = await self.store._entries_of(self.run, self.state, held)
            raise EntryExists(Entry.model_validate(entries[held.index[entry.id]]))
        entries = await self._copy(tail)
        for existing in entries:
            if existing.get("id") == entry.id:
                raise EntryExists(Entry.model_validate(existing))
        fence = self._fence(tail)
        if row.opens and fence is not None:
            raise Fenced(self.run, fence)
        before = sum(p.count for p in self.state.pages[:-1])
        check_room(self.run, before + len(entries), max_entries)
        if head.owner is None:  # an older ledger, empty: its first entry owns it
            head.owner = entry.actor
        stored = entry.model_copy(update={"seq": before + len(entries) + 1})
        entries.append(compact_entry(stored.to_json()))
        return tail, stored

    async def transition(self, entry_id: str, write: lifecycle.AnyWrite) -> tuple[_Page, Entry]:
        page = self.state.find(entry_id)
        if page is None:
            tail = self.state.pages[-1] if self.state.pages else None
            copy = self.copies.get(tail.name) if tail else None
            if tail is None or copy is None or not any(e.get("id") == entry_id for e in copy):
                raise EntryMissing(f"no entry {entry_id} in run {self.run}")
            page = tail
        entries = await self._copy(page)
        at = next((i for i, e in enumerate(entries) if e.get("id") == entry_id), None)
        if at is None:
            raise EntryMissing(f"no entry {entry_id} in run {self.run}")
        # Checked again on every attempt: after a 409 this is the fresh entry, and a write
        # whose expectation is gone fails rather than being applied blindly.
        old = Entry.model_validate(entries[at])
        new = write(old)
        fence = self._fence(page)
        if fence is not None and lifecycle.opens(old, new, write):
            raise Fenced(self.run, fence)
        if self.state.pages[0].recorded:
            check_owner(self.run, self.state.pages[0].owner, new.actor)
        entries[at] = compact_entry(new.to_json())
        return page, new


# Parts of an entry whose schema is open (x-kubernetes-preserve-unknown-fields): their values
# are the caller's data and are written exactly as they are.
_OPEN = frozenset({"handle", "report", "undo"})


def compact_entry(value: Any) -> Any:
    """The entry without empty-string fields in its typed parts. The local API server (1.20
    built with a newer Go) refuses an empty string in a typed property of an array item as
    ``null``; every such field of an entry has the empty string as its default, so leaving
    it out reads back the same."""
    if isinstance(value, dict):
        return {k: v if k in _OPEN else compact_entry(v) for k, v in value.items() if v != ""}
    if isinstance(value, list):
        return [compact_entry(v) for v in value]
    return value


# ---- idempotency-key locks ----

LEASE_PREFIX = "unwind-key-"
RUN_ANNOTATION = f"{API_GROUP}/run"
SINCE_ANNOTATION = f"{API_GROUP}/since"
DEADLINE_ANNOTATION = f"{API_GROUP}/deadline"


def lease_name(name: str) -> str:
    return LEASE_PREFIX + name


def _micro(text: str) -> str:
    """RFC 3339 with microseconds, the form a Lease's acquireTime takes."""
    return parse_stamp(text).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseLocks:
    """Idempotency-key locks as Leases in ``namespace`` (see the module docstring)."""

    def __init__(self, api: Api, namespace: str) -> None:
        self.api, self.namespace = api, namespace
        self.base = f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace, safe='')}/leases"

    async def acquire(self, name: str, holder: Holder) -> Holder | None:
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": lease_name(name), "labels": {f"{API_GROUP}/key-lock": "true"},
                             "annotations": {RUN_ANNOTATION: holder.run,
                                             SINCE_ANNOTATION: holder.since,
                                             **({DEADLINE_ANNOTATION: holder.deadline}
                                                if holder.deadline else {})}},
                "spec": {"holderIdentity": holder.entry, "acquireTime": _micro(holder.since)}}
        for _ in range(3):
            status, answer = await _call(self.api, "POST", self.base, body)
            if status in (200, 201):
                return None
            if status == 404:
                raise StoreUnavailable(f"cannot create Lease {lease_name(name)}: "
                                       f"{_problem(status, answer)}")
            current = await self._read(name)
            if current is not None:
                return current[0]
            # released between our create and our read: try to take it again
        return Holder(run="", entry="", since=stamp(now()))  # changing hands: it stands, young

    async def release(self, name: str, holder: Holder) -> None:
        await self._remove_if(name, holder)

    async def break_stale(self, name: str, stale: Holder) -> bool:
        return await self._remove_if(name, stale)

    async def peek(self, name: str) -> Holder | None:
        current = await self._read(name)
        return None if current is None else current[0]

    async def _read(self, name: str) -> tuple[Holder, dict[str, Any]] | None:
        status, obj = await _call(self.api, "GET", f"{self.base}/{lease_name(name)}")
        if status == 404:
            return None
        if status != 200 or not isinstance(obj, dict):
            raise StoreUnavailable(_problem(status, obj))
        return lease_holder(obj), obj.get("metadata") or {}

    async def _remove_if(self, name: str, holder: Holder) -> bool:
        current = await self._read(name)
        if current is None or current[0] != holder:
            return False
        meta = current[1]
        body = {"apiVersion": "v1", "kind": "DeleteOptions",
                "preconditions": {"uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion")}}
        status, _ = await _call(self.api, "DELETE", f"{self.base}/{lease_name(name)}", body)
        return status in (200, 201, 202)


def lease_holder(obj: dict[str, Any]) -> Holder:
    """The holder a key's Lease names (the gateway's locks, and the operator's planner)."""
    meta = obj.get("metadata") or {}
    notes = meta.get("annotations") or {}
    spec = obj.get("spec") or {}
    since = notes.get(SINCE_ANNOTATION) or meta.get("creationTimestamp") or stamp(now())
    deadline = notes.get(DEADLINE_ANNOTATION)
    return Holder(str(notes.get(RUN_ANNOTATION, "")), str(spec.get("holderIdentity") or ""),
                  str(since), str(deadline) if deadline else None)
