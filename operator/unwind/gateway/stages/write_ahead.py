"""The write-ahead: the ``pending`` entry (with the arguments' half of its handle and the
captured state) stored before the upstream sees anything, as a create or a
compare-and-set on the reusable entry it replaces (ledger/lifecycle.py).
"""

from __future__ import annotations

from typing import Any

from ...ledger.entry import Attempt, Entry, Times, stamp
from ...ledger.fence import Fenced
from ...ledger.handle import HandleError, build_handle
from ...ledger.lifecycle import REUSABLE, Expect, Write
from ...ledger.store import EntryExists, EntryMissing, NotOwner, RunFull, Stale
from ...upstream.errors import Refusal
from .. import tracing
from ..callstate import Call as _Call
from .base import Stage

# States of an entry whose Idempotency-Key a call may still use (the entry runs again, or
# is the approved call itself).
_MAY_RUN_AGAIN = REUSABLE | {"awaiting_approval", "denied"}


class _Reread(Exception):
    """The store's copy of the run said the Idempotency-Key was free, and the write found an
    entry under it that a fresh read could have let run: the call is decided again."""


class WriteAhead(Stage):
    def _entry(self, c: _Call, state: Any, **fields: Any) -> Entry:
        m, req = c.m, c.req
        return Entry(
            id=req.entry_id, tool=m.tool if m else req.tool[:128], version=c.version,
            checksum=c.checksum, effect=str(m.effect) if m else None, key=c.key,
            key_sent=c.key_sent if c.key_sent != c.key else None,
            scope=m.idempotency.scope if m and m.idempotency and c.key else None,
            actor=self.settings.actor, state=state, arguments_sha256=c.digest(),
            warnings=list(c.warnings), times=Times(requested=stamp(self.clock())),
            deadline=stamp(c.deadline) if c.deadline and state == "pending" else None,
            traceparent=tracing.traceparent(), **fields)  # its undo continues the trace

    async def _store_new(self, c: _Call, entry: Entry, *, reread: bool = False) -> Entry:
        """Create the entry, or turn the reusable (or approved) one it replaces into it.
        ``reread``: an entry found by the create that a fresh read would have let run again
        (failed, refused, awaiting approval) raises _Reread, to decide the call afresh."""
        old = c.existing
        if old is None:
            reserved = await self._room_for_run(c)
            try:
                stored = await self.ledger(self.store.create(
                    c.req.run, entry, max_entries=self.settings.max_entries or None))
            except BaseException as exc:
                if reserved:  # no ledger was written for it here: the run does not count
                    self.runs.give_back(c.req.run)
                if isinstance(exc, EntryExists):
                    if reread and c.probed and not c.fresh and exc.entry.state in _MAY_RUN_AGAIN:
                        raise _Reread from None
                    raise Refusal("duplicate", f"Idempotency-Key {entry.id} was just used by "
                                  "another call: a call runs once", {"entry": entry.id}) from None
                raise self._store_refusal(c, exc) from None
            self._own_runs.add(c.req.run)  # the create checked the owner: this actor
            return stored

        def change(current: Entry) -> Entry:
            history = list(current.attempts)
            keep: dict[str, Any] = {"seq": current.seq, "attempts": history}
            if current.state in REUSABLE:
                # A reused id is a new call: its approval (if it needs one) starts afresh,
                # and the old one stays with the attempt it approved.
                history.append(Attempt(state=current.state, error=current.error,
                                       finished=current.times.finished,
                                       arguments_sha256=current.arguments_sha256,
                                       approval=current.approval))
            if current.state == "awaiting_approval":  # the approved call itself, now running
                keep["times"] = Times(requested=current.times.requested)
                keep["approval"] = current.approval
            return entry.model_copy(update=keep)
        try:
            return await self.ledger(self.store.transition(
                c.req.run, entry.id, Write("gateway", Expect.of(old), change)))
        except (Stale, EntryMissing):
            raise Refusal("duplicate", f"Idempotency-Key {entry.id} was just used by another "
                          "call: a call runs once", {"entry": entry.id}) from None
        except BaseException as exc:
            raise self._store_refusal(c, exc) from None

    def _store_refusal(self, c: _Call, exc: BaseException) -> BaseException:
        """What the caller hears when the store refused a new entry: not the run's owner, the
        run full, the run fenced by a rollback (none of them recorded: the write is what was
        refused); anything else as it came."""
        if isinstance(exc, NotOwner):
            c.record = False
            return self._not_ours(c.req.run, exc.owner)
        if isinstance(exc, RunFull):
            c.record = False
            return Refusal("rate_limited", f"run {c.req.run} holds {exc.limit} entries, the "
                           "most one run may hold (--max-entries-per-run): start another run")
        if isinstance(exc, Fenced):
            c.record = False
            return Refusal("rolled_back", str(exc), {"run": exc.run, "fence": exc.fence.to_json()})
        return exc

    async def _write_ahead(self, c: _Call) -> Entry:
        """Store the ``pending`` entry with the arguments' half of its handle, built (and
        bounded) first: arguments the ledger cannot keep refuse the call before anything is
        stored or sent, and an entry whose answer is lost still holds what its lookup
        reads from the arguments."""
        assert c.m is not None
        try:
            kept = build_handle(c.m, c.req.arguments, {}, staged=c.req.stage, strict=True,
                                before=c.before)
        except HandleError as exc:
            raise Refusal("validation_error", f"the ledger cannot keep this call's arguments, "
                          f"so nothing is called: {exc.reason}: send smaller, flatter "
                          "arguments") from None
        entry = self._entry(c, "pending", handle=kept)
        return await self._store_new(c, entry, reread=True)
