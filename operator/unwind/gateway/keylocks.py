"""A call's idempotency key: its lock, held for as long as the call's effect may happen.

A rendered key is held by one entry at a time, within its scope (``lock_name``): taken by a
lock that exactly one process can create (a file made with O_EXCL, a Lease), recording its
holder's run and entry, when it was taken, and its **deadline**: until then the lock stands
even when its entry is not found, because its writer may still be capturing or writing
ahead (the capture's and the call's timeouts, retries included, plus ``lock_grace`` for the
write). Once the entry is stored its state decides (``lifecycle.HOLDING``): an entry that
awaits approval, is pending, succeeded, uncertain, or whose undo is not done holds it; a
lock whose entry no longer holds its key is broken by the next call that wants the key.

So a duplicate is refused at once, also while the first call waits for a human (an
``awaiting_approval`` entry takes the key before it is stored), and a slow capture never
loses its key to a retry. Where time passes between taking the lock and the write-ahead (a
capture, an approval), the lock is checked again right before the upstream is called (by
the clock while its deadline is ahead, by reading it once past): a call that lost it (its
deadline passed and another call broke it) is refused, not sent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import TypeVar

from ..ledger import decide
from ..ledger.entry import Entry, EntryError, parse_stamp, stamp
from ..ledger.handle import mask_text
from ..ledger.lifecycle import Expect, Write, holds_key
from ..ledger.store import Holder, Locks, Store, StoreUnavailable, lock_name
from ..manifest.model import Effect, ToolManifest
from ..upstream.client import DEFAULT_TIMEOUT_MS, Prepared
from ..upstream.errors import Refusal
from .callstate import Call, Settings
from .catalogue import Catalogue

log = logging.getLogger("unwind.gateway")
T = TypeVar("T")


def call_ms(p: Prepared) -> int:
    """The longest the upstream call may take: every attempt at its timeout, and the
    backoffs between them (``Upstream.send``)."""
    waits = sum(min(p.max_ms, p.base_ms * 2 ** (n - 1)) for n in range(1, p.attempts))
    return int(p.attempts * p.timeout_s * 1000) + int(waits)


def manifest_ms(m: ToolManifest) -> int:
    """``call_ms`` of a call of ``m`` (its capture's, say), from the manifest alone."""
    u = m.upstream
    timeout = (u.timeout_ms if u is not None else None) or m.timeout_ms or DEFAULT_TIMEOUT_MS
    retry = m.retry if m.effect in (Effect.read_only, Effect.idempotent) else None
    attempts = retry.attempts if retry else 1
    waits = sum(min(retry.max_ms, retry.base_ms * 2 ** (n - 1)) for n in range(1, attempts)) \
        if retry else 0
    return int(attempts * int(timeout)) + int(waits)


class KeyHolding:
    """The key-lock part of ``Gateway`` (a mixin: it uses the gateway's store, locks, clock
    and settings, and its write-ahead)."""

    store: Store
    locks: Locks
    settings: Settings
    catalogue: Catalogue
    clock: Callable[[], datetime]

    async def ledger(self, op: Awaitable[T]) -> T:
        raise NotImplementedError

    async def _write_ahead(self, c: Call) -> Entry:
        raise NotImplementedError

    # ---- deadlines ----

    def _lock_deadline(self, c: Call, p: Prepared | None) -> str:
        """Until when a lock taken now stands without its entry: the capture (if any), the
        write-ahead, the call, and the margin."""
        m = c.m
        assert m is not None
        spend = self.settings.lock_grace + self.settings.deadline_margin
        if p is not None:
            spend += timedelta(milliseconds=call_ms(p))
        cap = m.capture
        if cap is not None and not c.req.stage:
            served = self.catalogue.get(cap.tool)
            spend += timedelta(milliseconds=manifest_ms(served.manifest) if served
                               else DEFAULT_TIMEOUT_MS)
        return stamp(self.clock() + spend)

    def _call_deadline(self, p: Prepared) -> datetime:
        """When the call written ahead now is over: its attempts, backoffs and the margin."""
        return self.clock() + timedelta(milliseconds=call_ms(p)) + self.settings.deadline_margin

    # ---- who holds the key ----

    def _lock_name(self, c: Call) -> str:
        assert c.m is not None and c.m.idempotency is not None and c.key is not None
        return lock_name(c.m.idempotency.scope, run=c.req.run, actor=self.settings.actor,
                         tool=c.m.tool, key=c.key)

    def _holder(self, c: Call, p: Prepared | None) -> Holder:
        return Holder(c.req.run, c.req.entry_id, stamp(self.clock()), self._lock_deadline(c, p))

    def _stands(self, holder: Holder) -> bool:
        """A lock whose entry is not found: it stands until its deadline (an older lock
        without one: ``lock_grace`` from when it was taken)."""
        now = self.clock()
        if holder.deadline is not None:
            return now < parse_stamp(holder.deadline)
        return now - parse_stamp(holder.since) < self.settings.lock_grace

    async def _standing(self, c: Call, *, take: Holder | None = None,
                        held: Holder | None = None) -> Refusal | None:
        """Is the rendered key held by a call that still stands? With ``take``, also take
        the lock (race-free: exactly one process creates it); ``held``: the holder a first
        try at taking it answered."""
        m = c.m
        assert m is not None and m.idempotency is not None and c.key is not None
        name = self._lock_name(c)
        for attempt in range(3):
            if held is not None and attempt == 0:
                holder: Holder | None = held
            else:
                holder = (await self.ledger(self.locks.acquire(name, take)) if take
                          else await self.ledger(self.locks.peek(name)))
            if holder is None or self._ours(c, holder, take):
                return None
            entry = (await self.ledger(self.store.get(holder.run, holder.entry))
                     if holder.run else None)
            if entry is None:
                if self._stands(holder):
                    return self._duplicate(c, holder.entry or "(being recorded)", holder.run)
            elif entry.key == c.key and self._holds(holder.run, entry):
                return self._duplicate(c, entry.id, holder.run)
            if not take:
                return None  # stale: a real call would break it
            await self.ledger(self.locks.break_stale(name, holder))
        return Refusal("ledger_unavailable", f"could not take the lock of key {c.key!r}: it "
                       "kept changing hands; try again")

    @staticmethod
    def _ours(c: Call, holder: Holder, take: Holder | None) -> bool:
        """A lock naming this call's run and Idempotency-Key is this call's: the one it just
        took, or that of its entry (awaiting approval, or written by an earlier try with
        the same Idempotency-Key). Two calls with one Idempotency-Key may both hold it;
        only one of them writes the entry (its create, or its compare-and-set on the
        awaiting one), and the other gives nothing back (``_release``)."""
        return (holder.run, holder.entry) == (c.req.run, c.req.entry_id)

    def _holds(self, run: str, entry: Entry) -> bool:
        """Whether the entry holds its key now: an awaiting entry is tallied as of now (one
        whose approval timed out into a denial no longer does)."""
        if entry.state == "awaiting_approval" and entry.approval is not None:
            entry = decide.settle(run, entry, self.clock())
        return holds_key(entry)

    def _duplicate(self, c: Call, entry: str, run: str) -> Refusal:
        assert c.m is not None and c.m.idempotency is not None
        scope = c.m.idempotency.scope
        return Refusal("duplicate", f"duplicate call: {c.m.tool} with idempotency key {c.key!r} "
                       f"stands as entry {entry} of run {run} ({scope} scope); it is free again "
                       "once that call fails, is denied or is undone", {"entry": entry, "run": run})

    # ---- taking and giving it back ----

    async def _take_key(self, c: Call, p: Prepared | None) -> Holder | None:
        if c.key is None or c.req.stage:
            return None
        holder = self._holder(c, p)
        refusal = await self._standing(c, take=holder)
        if refusal is not None:
            raise refusal
        return holder

    async def _recheck_key(self, c: Call, entry: Entry, holder: Holder | None) -> None:
        """Right before the upstream: the lock still names this call. Time passed since it
        was taken (a capture, an approval); had its deadline passed, another call may have
        broken it. Before that deadline (less the margin for other clocks) nobody breaks
        it, and now that the pending entry is stored nobody will, so the time is the check
        and nothing is read; past it the lock is read again. One that lost it is refused
        (its pending entry becomes refused) and nothing is sent; one found free is taken
        again."""
        if holder is None:
            return
        if holder.deadline is not None and \
                self.clock() + self.settings.deadline_margin < parse_stamp(holder.deadline):
            return
        current = await self.ledger(self.locks.peek(self._lock_name(c)))
        if current is not None and (current.run, current.entry) == (c.req.run, c.req.entry_id):
            return
        try:
            refusal = await self._standing(c, take=holder)
        except Refusal as exc:
            refusal = exc
        if refusal is not None:
            await self._unrun(c, entry, refusal)
            raise refusal

    async def _take_key_writing_ahead(self, c: Call, p: Prepared) -> tuple[Holder, Entry]:
        """Take the key's lock and store the ``pending`` entry at once: one round trip to the
        ledger before the upstream instead of two. The upstream is called only when both
        are done. A key a standing call holds (or a lock that cannot be read) turns the
        pending entry just stored into ``refused`` with the refusal's code, and nothing is
        called; a pending entry that cannot be stored gives the lock back."""
        holder = self._holder(c, p)
        taking = asyncio.ensure_future(self.ledger(self.locks.acquire(self._lock_name(c), holder)))
        try:
            entry = await self._write_ahead(c)
        except BaseException:
            try:
                taken = await taking is None
            except Exception:  # a refusal of its own: the lock was not taken
                taken = False
            if taken:
                await self._release(c, holder)
            raise
        try:
            other = await taking
            refusal = None if other is None else await self._standing(c, take=holder, held=other)
        except Refusal as exc:
            refusal = exc
        if refusal is not None:
            await self._unrun(c, entry, refusal)
            raise refusal
        return holder, entry

    async def _unrun(self, c: Call, entry: Entry, refusal: Refusal) -> None:
        """Record the refusal of a call whose pending entry is stored but whose key was not
        taken: the entry becomes ``refused`` (as ``_record_refusal`` would have stored it).
        If even that cannot be written, the entry stays pending, and a rollback's planner
        reads from the key's lock that it never ran."""
        c.record = False
        error = EntryError(code=refusal.code, message=mask_text(refusal.message, c.secrets))
        finished = stamp(self.clock())

        def change(current: Entry) -> Entry:
            times = current.times.model_copy(update={"finished": finished})
            return current.model_copy(update={"state": "refused", "error": error,
                                              "handle": None, "times": times})
        try:
            await self.ledger(self.store.transition(c.req.run, entry.id, Write(
                "gateway", Expect("pending", len(entry.attempts)), change)))
        except Exception as exc:
            log.error("entry %s of run %s stays pending (nothing was called): its refusal "
                      "(%s) could not be recorded: %s", entry.id, c.req.run, refusal.code, exc)

    async def _release(self, c: Call, holder: Holder | None, *, free: bool = False) -> None:
        """Give the lock back after this call failed, unless its entry holds the key: the
        entry of another call with the same Idempotency-Key (its write won), or the one
        awaiting approval. ``free``: this call just recorded its entry as not holding it.
        When the store cannot say, the lock is kept (the safe side): it stands until its
        deadline, or until the entry is read and no longer holds it."""
        if holder is None:
            return
        if not free:
            try:
                entry = await self.store.get(c.req.run, c.req.entry_id)
            except (StoreUnavailable, OSError) as exc:  # it stays: a call that needs it breaks it later
                log.warning("the key lock of entry %s is kept: its entry cannot be read (%s)",
                            holder.entry, exc)
                return
            if entry is not None and entry.key == c.key and self._holds(c.req.run, entry):
                return
        try:
            await self.locks.release(self._lock_name(c), holder)
        except (StoreUnavailable, OSError) as exc:
            log.error("could not release the key lock of entry %s: %s", holder.entry, exc)
