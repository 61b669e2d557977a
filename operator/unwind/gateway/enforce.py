"""The one enforcement path, shared by REST and MCP.

In order, as docs/gateway.md lists them: the tool is served and enforceable; the stage
form exists (for ``stage``); the permission is in scope; every ``requires`` tool succeeded
earlier in the run; the upstream's input schema has not drifted; the idempotency key
renders; the Idempotency-Key is free (or names a failed, refused, or now approved entry);
no standing call holds the rendered key; approval; the capture (a manifest's read-only
``capture`` call reads the state the call changes; one that fails refuses the call); then
write-ahead (the ``pending`` entry, with the captured state, is stored before the upstream
sees anything), the call, and the outcome. A keyed call with no approval and no capture
takes its key's lock together with its write-ahead (one round trip to a cluster ledger,
not two): the upstream is called once both are stored, and a key found held by a standing
call turns the pending entry just written into ``refused`` (``duplicate``).

A refusal is recorded as a ``refused`` entry with its code, except the answers that an
entry already records (a repeat of an awaiting or denied call) and dry runs, which write
nothing. Where a call's key lock is held, it is released when the call fails, so the key
is free again; a call whose outcome is unknown keeps it (the safe side).
"""

from __future__ import annotations

import copy
import difflib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import datetime
from typing import Any, TypeVar

from ..ledger import decide
from ..ledger.approvals import ApprovalRules
from ..ledger.entry import Attempt, Entry, EntryError, Handle, Staged, Times, now, stamp
from ..ledger.fence import Fenced
from ..ledger.handle import (
    HandleError,
    build_handle,
    mask_answer,
    mask_text,
    missing_captured,
    secret_texts,
    staged_handle,
)
from ..ledger.lifecycle import REUSABLE, Expect, TransitionRefused, Write
from ..ledger.report import Outcome, effect_report
from ..ledger.store import (
    EntryExists,
    EntryMissing,
    Holder,
    Locks,
    NotOwner,
    RunFull,
    Stale,
    Store,
    StoreUnavailable,
    probe,
)
from ..ledger.ulid import new_ulid
from ..manifest.keys import KeyRenderError, render_key, sent_key
from ..manifest.lint import schema_hash_of
from ..manifest.model import Effect, ToolManifest
from ..manifest.refs import resolve_map
from ..upstream.client import Answer, Prepared, Upstream, prepare
from ..upstream.errors import Refusal, upstream_refusal
from ..upstream.secrets import Secrets
from . import tracing
from .after_read import read_after, record_after, wants_read_after
from .callstate import Call, CallRequest, CallResult, Settings
from .catalogue import Catalogue
from .keylocks import KeyHolding
from .metrics import UNKNOWN_TOOL, Metrics
from .runlimit import RunLimit

log = logging.getLogger("unwind.gateway")
T = TypeVar("T")
# States of an entry whose Idempotency-Key a call may still use (the entry runs again, or
# is the approved call itself).
_MAY_RUN_AGAIN = REUSABLE | {"awaiting_approval", "denied"}


class _Reread(Exception):
    """The store's copy of the run said the Idempotency-Key was free, and the write found an
    entry under it that a fresh read could have let run: the call is decided again."""


_Call = Call
__all__ = ["CallRequest", "CallResult", "Gateway", "Settings"]


class Gateway(KeyHolding):
    def __init__(self, catalogue: Catalogue, store: Store, locks: Locks, upstream: Upstream,
                 secrets: Secrets, settings: Settings, metrics: Metrics | None = None,
                 clock: Callable[[], datetime] = now) -> None:
        self.catalogue, self.store, self.locks = catalogue, store, locks
        self.upstream, self.secrets, self.settings = upstream, secrets, settings
        self.metrics = metrics or Metrics()
        self.clock = clock
        self._own_runs: set[str] = set()  # runs whose ledger records this actor as owner
        self.runs = RunLimit(settings.max_runs, settings.runs_window, clock)

    def acting_as(self, actor: str, scopes: frozenset[str]) -> Gateway:
        """This gateway for one authenticated caller (gateway/auth): everything shared but
        the actor, its scopes, and what the gateway remembers per actor."""
        view = copy.copy(self)
        view.settings = replace(self.settings, actor=actor, scopes=scopes)
        view._own_runs = set()
        view.runs = RunLimit(self.settings.max_runs, self.settings.runs_window, self.clock)
        return view

    # ---- the entry point ----

    async def call(self, req: CallRequest) -> CallResult:
        started = time.perf_counter()
        c = _Call(req)
        try:
            try:
                result = await self._call(c)
            except _Reread:  # the store's copy said "no entry" and the write found one
                c = _Call(req, fresh=True)
                result = await self._call(c)
        except Refusal as refusal:
            result = await self._refused(c, refusal)
        m = c.m
        tool = m.tool if m else UNKNOWN_TOOL
        error = result.body["error"] if result.status >= 400 else {}
        outcome = error.get("code")
        state = outcome or ("dry_run" if req.dry_run else "succeeded")
        self.metrics.called(tool, str(m.effect) if m else "", state, time.perf_counter() - started)
        message = error.get("message", "")
        log.info("call run=%s entry=%s tool=%s status=%d outcome=%s ms=%.1f%s", req.run,
                 result.entry or req.entry_id, req.tool[:128], result.status, state,
                 (time.perf_counter() - started) * 1000, f" message={message!r}" if message else "")
        return result

    async def reject(self, req: CallRequest, refusal: Refusal) -> CallResult:
        """Answer (and record) a request refused before enforcement: a body too large or not
        JSON, a bad Idempotency-Key. The run is known; the arguments are not."""
        c = _Call(req)
        served = self.catalogue.get(req.tool)
        if served is not None:
            c.m, c.checksum, c.version = served.manifest, served.checksum, served.version
        try:
            await self._run_is_ours(c)
        except Refusal as problem:  # not ours, or the ledger cannot say: record nothing
            c.record = False
            if problem.code == "permission_denied":
                refusal = problem
        result = await self._refused(c, refusal)
        tool = c.m.tool if c.m else UNKNOWN_TOOL
        self.metrics.calls.labels(tool, str(c.m.effect) if c.m else "", refusal.code).inc()
        log.info("call run=%s entry=%s tool=%s status=%d outcome=%s message=%r", req.run,
                 result.entry, req.tool[:128], result.status, refusal.code, refusal.message)
        return result

    async def _run_is_ours(self, c: _Call) -> None:
        """A gateway writes only runs its actor owns: an agent must not hide its calls in
        another agent's run (whose rollback would then undo them while its own missed
        them), nor write refusals there. This read answers early and clearly; what decides
        is the store, which checks the owner in the same locked (or conditional) write as
        each entry. Only an owner recorded as this actor is remembered: a run with no
        ledger yet (a dry run's, say) belongs to whoever writes it first."""
        run = c.req.run
        if run in self._own_runs:
            return
        owner = await self.ledger(self.store.owner(run))
        if owner is not None and owner != self.settings.actor:
            c.record = False
            raise self._not_ours(run, owner)
        if owner is not None:
            self._own_runs.add(run)

    def _not_ours(self, run: str, owner: str) -> Refusal:
        return Refusal("permission_denied", f"run {run} is recorded as {owner}'s and this gateway "
                       f"acts as {self.settings.actor}: a gateway writes (and reads) only its own "
                       "runs; send another X-Unwind-Run")

    async def _room_for_run(self, c: _Call) -> bool:
        """At most ``max_runs`` distinct runs written per window by this gateway: 2000 run
        names must not make 2000 ledgers (runlimit.py). True: this call reserved the run,
        and gives it back if its create fails."""
        run = c.req.run
        if self.runs.known(run):
            return False
        counted = getattr(self.store, "runs_created", None)
        await self.runs.seed(None if counted is None else
                             lambda since: counted(self.settings.actor, since))
        if self.runs.known(run):
            return False
        why = self.runs.reserve(run)
        if why is not None:
            c.record = False
            raise Refusal("rate_limited", why)
        return True

    async def read_entry(self, run: str, entry_id: str) -> Entry | None:
        """``GET /calls/<run>/<entry>``: the same ownership rule as writes, so one agent's
        gateway never shows another's calls (their arguments' handles and answers)."""
        owner = await self.ledger(self.store.owner(run))
        if owner is not None and owner != self.settings.actor:
            raise self._not_ours(run, owner)
        entry = await self.ledger(self.store.get(run, entry_id))
        if entry is not None and entry.actor != self.settings.actor:
            raise self._not_ours(run, entry.actor)
        return entry

    async def _call(self, c: _Call) -> CallResult:
        req = c.req
        await self._run_is_ours(c)
        served = self.catalogue.get(req.tool)
        if served is None or not served.manifest.enforceable:
            if served is None and not self.catalogue.ready:
                raise Refusal("not_found", f"no tool {req.tool!r}: the gateway serves no "
                              f"manifests ({self.catalogue.problem})")
            what = "is only a draft: approve it before calling" if served else "is not served here"
            if served is None:  # a misspelt name: only this refusal pays for the lookup
                known = [s.manifest.tool for s in self.catalogue.tools() if s.manifest.enforceable]
                close = difflib.get_close_matches(req.tool, known, n=1)
                what += f" (did you mean {close[0]}?)" if close else ""
            raise Refusal("not_found", f"tool {req.tool!r} {what}")
        m = c.m = served.manifest
        c.checksum, c.version = served.checksum, served.version
        c.secrets = secret_texts(m, req.arguments)
        if m.lifecycle == "deprecated":
            c.warnings.append(f"{m.tool} is deprecated: use {m.replaced_by}" if m.replaced_by
                              else f"{m.tool} is deprecated")
        call_m, args = self._stage_form(c) if req.stage else (m, dict(req.arguments))
        checks: list[Refusal] = []
        for check in (self._permission, self._requires, self._schema_drift):
            refusal = await check(c)
            if refusal is not None:
                if req.dry_run:
                    checks.append(refusal)
                elif self.catalogue.observe:
                    self._observed(c, refusal)
                else:
                    raise refusal
        if not req.stage:
            self._render_key(c, args)
        if req.dry_run:
            return await self._dry_run(c, checks)
        await self._idempotency_key_is_free(c)
        approved = c.existing is not None and c.existing.state == "awaiting_approval"
        rules = None if req.stage else ApprovalRules.from_manifest(m)
        # A keyed call with no approval and no capture sends its key's lock and its pending
        # entry together (_take_key_writing_ahead); one with a capture, or one that will
        # wait for approval, takes the lock first (keylocks.py): an awaiting entry holds
        # its key, so a duplicate never waits for a human.
        together = (c.key is not None and not req.stage and rules is None and not approved
                    and m.capture is None)
        if rules is not None and not approved and self.catalogue.observe:
            self._observed(c, Refusal("approval_required", f"{m.tool} needs approval"))
        elif rules is not None and not approved:
            return await self._await_approval(c, rules)
        prepared = prepare(call_m, args, self.secrets, self._key_headers(c))
        c.deadline = self._call_deadline(prepared)
        if together:
            taken, entry = await self._take_key_writing_ahead(c, prepared)
            return await self._run(c, entry, prepared, taken)
        holder = await self._take_key(c, prepared)
        try:
            await self._capture(c)
            c.deadline = self._call_deadline(prepared)  # the capture took its time
            entry = await self._write_ahead(c)
        except BaseException:
            await self._release(c, holder)
            raise
        await self._recheck_key(c, entry, holder)
        return await self._run(c, entry, prepared, holder)

    # ---- the checks ----

    def _observed(self, c: _Call, refusal: Refusal) -> None:
        """Observe mode: the violation goes into the entry's warnings and the metrics, and
        the call goes on (the write-ahead ledger and duplicate refusal stay in force)."""
        assert c.m is not None
        c.warnings.append(f"observed {refusal.code}: {refusal.message}")
        self.metrics.observed.labels(c.m.tool, refusal.code).inc()

    def _stage_form(self, c: _Call) -> tuple[ToolManifest, dict[str, Any]]:
        m = c.m
        assert m is not None
        if m.draft is None:
            raise Refusal("unsupported_operation", f"{m.tool} has no draft form, so it cannot be "
                          "staged: call it without stage (the real effect) or not at all")
        served = self.catalogue.get(m.draft.tool)
        if served is None or not served.manifest.enforceable:
            raise Refusal("unsupported_operation", f"the draft tool {m.draft.tool} of {m.tool} "
                          "is not served here")
        args, missing = resolve_map(m.draft.arguments, c.req.arguments, None)
        if missing:
            raise Refusal("validation_error", "the draft cannot be filled: " + "; ".join(missing))
        return served.manifest, args

    async def _permission(self, c: _Call) -> Refusal | None:
        m = c.m
        assert m is not None
        scopes = self.settings.scopes
        if "*" in scopes or m.permission in scopes:
            return None
        held = ", ".join(sorted(scopes)) or "none"
        return Refusal("permission_denied", f"{m.tool} needs permission {m.permission}; this "
                       f"gateway's scopes are {held}")

    async def _requires(self, c: _Call) -> Refusal | None:
        m = c.m
        assert m is not None
        if not m.requires:
            return None
        entries = await self.ledger(self.store.entries(c.req.run))
        done = {e.tool for e in entries if e.state == "succeeded"}
        missing = [r.tool for r in m.requires if r.tool not in done]
        if not missing:
            return None
        return Refusal("requires_not_met", f"{m.tool} requires {', '.join(missing)} to have "
                       f"succeeded earlier in run {c.req.run}: call it first")

    async def _schema_drift(self, c: _Call) -> Refusal | None:
        m = c.m
        assert m is not None
        if not m.schema_hash or m.upstream is None or m.upstream.mcp is None:
            return None
        schema = self.upstream.schemas.get((m.upstream.mcp.target, m.upstream.mcp.tool))
        if schema is None:
            return None  # not known: nothing to compare
        seen = schema_hash_of(schema)
        if seen == m.schema_hash:
            return None
        return Refusal("schema_drift", f"the input schema of {m.tool} changed since its manifest "
                       f"was approved ({m.schema_hash} then, {seen} now): review the manifest "
                       "again")

    def _render_key(self, c: _Call, args: dict[str, Any]) -> None:
        m = c.m
        assert m is not None
        if m.idempotency is None:
            return
        try:
            c.key = render_key(m.idempotency.key, c.req.arguments)
        except KeyRenderError as exc:
            raise Refusal("validation_error", exc.reason) from None
        carrier = m.idempotency.carrier
        if carrier is None:
            return
        c.key_sent = sent_key(m, c.req.run, c.key)  # scope run, header: the run is in it
        if carrier.argument is not None:
            given = args.get(carrier.argument)
            if given is not None and given != c.key_sent:
                raise Refusal("validation_error", f"argument {carrier.argument} carries the "
                              "idempotency key, and the call gives a different one: leave it "
                              "out (the gateway fills it in) or make it match")
            args[carrier.argument] = c.key_sent

    def _key_headers(self, c: _Call) -> dict[str, str]:
        m = c.m
        carrier = m.idempotency.carrier if m and m.idempotency else None
        if carrier is None or carrier.header is None or c.key_sent is None or c.req.stage:
            return {}
        return {carrier.header: c.key_sent}

    async def _idempotency_key_is_free(self, c: _Call) -> None:
        """The caller's Idempotency-Key (the entry id): unused, or naming an entry that may
        run again: failed, refused, or awaiting approval (then tallied here)."""
        req = c.req
        if c.fresh:
            existing = await self.ledger(self.store.get(req.run, req.entry_id))
        else:
            existing = await self.ledger(probe(self.store, req.run, req.entry_id))
            c.probed = existing is None
        if existing is None or existing.state in REUSABLE:
            c.existing = existing
            return
        same = existing.arguments_sha256 == c.digest() and existing.tool == req.tool
        if existing.state in ("awaiting_approval", "denied") and same:
            c.record = False  # the entry itself records the approval's course
            settled = decide.settle(req.run, existing, self.clock())
            if settled.state != existing.state:
                settled = await self.ledger(self.store.transition(
                    req.run, existing.id, decide.settling(req.run, self.clock())))
            if settled.state == "denied":
                message = settled.approval.message if settled.approval else "denied"
                raise Refusal("denied", f"entry {existing.id} was denied: {message}",
                              {"entry": existing.id})
            if settled.approval is not None and settled.approval.state == "awaiting_approval":
                raise Refusal("approval_required", f"entry {existing.id} awaits approval: "
                              f"{settled.approval.message}", {"entry": existing.id})
            c.existing = settled
            return
        why = ("with other arguments" if not same else f"and is {existing.state}")
        raise Refusal("duplicate", f"Idempotency-Key {existing.id} names an entry of run "
                      f"{req.run} already ({existing.tool}, {why}): a call runs once; use a new "
                      "key for a new call", {"entry": existing.id})

    # ---- entries ----

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

    async def _capture(self, c: _Call) -> None:
        """The manifest's ``capture``: read the state the call changes, after the key is
        taken and before the write-ahead, so the pending entry holds it. A capture that
        cannot be read (its tool not served or not read_only, not sent, a timeout, an answer
        that is not 2xx JSON, or one without a ``$before`` path the undo needs) refuses the
        call: 502 upstream_error, and nothing reaches the call's upstream. A staged call
        makes a draft, whose undo is its discard: it captures nothing."""
        m = c.m
        assert m is not None
        cap = m.capture
        if cap is None or c.req.stage:
            return

        def failed(why: str) -> Refusal:
            return Refusal("upstream_error", f"the capture {cap.tool} of {m.tool} {why}, so "
                           f"nothing was sent to {m.tool}'s upstream (the undo would have "
                           "nothing to restore): try again once the capture answers",
                           {"capture": cap.tool})
        served = self.catalogue.get(cap.tool)
        if served is None or not served.manifest.enforceable:
            raise failed("is not served here")
        if served.manifest.effect != Effect.read_only:
            raise failed(f"is {served.manifest.effect}, not read_only")
        args, missing = resolve_map(cap.arguments, c.req.arguments, None)
        if missing:
            raise Refusal("validation_error", f"the capture {cap.tool} of {m.tool} cannot be "
                          "filled from the call's arguments: " + "; ".join(missing))
        try:
            prepared = prepare(served.manifest, args, self.secrets, {})
        except Refusal as exc:
            raise failed(f"could not be sent ({exc.message})") from None
        answer = await self.upstream.send(prepared)
        if answer.kind != "ok":
            why = {"error_status": f"answered {answer.status}",
                   "timeout": "timed out",
                   "not_json": f"answered {answer.status} with a body that is not JSON"}.get(
                       answer.kind, f"failed ({answer.text or answer.kind})")
            raise failed(why)
        before = answer.data if answer.data is not None else {}
        gaps = missing_captured(m, before)
        if gaps:
            raise failed("answered without a value the undo needs: " + "; ".join(gaps))
        c.before = before
        c.secrets = secret_texts(m, c.req.arguments, None, before)

    async def _await_approval(self, c: _Call, rules: ApprovalRules) -> CallResult:
        """The call waits for a human as an ``awaiting_approval`` entry, which holds its key:
        the lock is taken first (a duplicate is refused at once, no human asked), and given
        back if the entry cannot be stored."""
        entry = self._entry(c, "awaiting_approval",
                            approval=decide.record(rules, self.settings.identities))
        entry = decide.settle(c.req.run, entry, self.clock())
        holder = await self._take_key(c, None)
        try:
            stored = await self._store_new(c, entry, reread=True)
        except BaseException:
            await self._release(c, holder)
            raise
        c.record = False
        assert stored.approval is not None
        refusal = Refusal("approval_required", f"{stored.tool} needs approval: "
                          f"{stored.approval.message}; repeat the call with Idempotency-Key "
                          f"{stored.id} once it is approved", {"entry": stored.id})
        return self._answer_refusal(c, refusal)

    async def ledger(self, op: Awaitable[T]) -> T:
        started = time.perf_counter()
        try:
            return await op
        except (EntryExists, EntryMissing, Stale, NotOwner, RunFull, Fenced):
            raise  # answers of the store protocol, for the caller to handle
        except Exception as exc:  # StoreUnavailable, or a store that broke in another way
            self.metrics.ledger_failures.inc()
            if not isinstance(exc, StoreUnavailable):
                log.exception("the ledger store failed")
            raise Refusal("ledger_unavailable", f"the ledger cannot be written, so nothing is "
                          f"called: {exc}") from None
        finally:
            self.metrics.ledger_writes.observe(time.perf_counter() - started)

    # ---- the call and its outcome ----

    async def _run(self, c: _Call, entry: Entry, p: Prepared, holder: Holder | None) -> CallResult:
        m = c.m
        assert m is not None
        started = stamp(self.clock())
        answer = await self.upstream.send(p)
        finished = stamp(self.clock())
        state, refusal = self._outcome(c, p, answer)
        kept = entry.handle or Handle()  # the arguments' half, stored by the write-ahead
        staged = None
        handle = kept
        if state == "succeeded":
            try:
                c.secrets = secret_texts(m, c.req.arguments, answer.data, c.before)  # $result too
                handle = build_handle(m, c.req.arguments, answer.data, staged=c.req.stage,
                                      strict=True, before=c.before)
                if c.req.stage and m.draft is not None:
                    staged = Staged(draft_tool=m.draft.tool, promote=m.draft.promote,
                                    handle=staged_handle(m, c.req.arguments, answer.data,
                                                         c.secrets),
                                    discard=m.draft.discard)
            except (HandleError, RecursionError) as exc:
                why = exc.reason if isinstance(exc, HandleError) else "nested too deep to copy"
                state, refusal = self._unrecordable(c, entry, why)
                handle, staged = kept, None

        def recorded(state: str, refusal: Refusal | None, handle: Handle,
                     staged: Staged | None) -> tuple[dict[str, Any], Callable[[Entry], Entry]]:
            outcome: Outcome = state  # type: ignore[assignment]
            report = effect_report(m, outcome=outcome, handle=handle, key_sent=c.key_sent,
                                   key=c.key, ledger=c.req.run, entry=entry.id, staged=staged,
                                   warnings=c.warnings, finished=finished)
            error = EntryError(code=refusal.code, message=refusal.message) if refusal else None

            def finish(current: Entry) -> Entry:
                times = Times(requested=current.times.requested, started=started,
                              finished=finished)
                return current.model_copy(update={"state": state, "handle": handle,
                                                  "report": report, "error": error,
                                                  "staged": staged, "times": times})
            return report, finish

        report, finish = recorded(state, refusal, handle, staged)
        # A compare-and-set on the pending entry this call wrote: a rollback that took it
        # meanwhile (looked it up, undid it) is never overwritten.
        outcome = Expect("pending", len(entry.attempts))
        try:
            await self.ledger(self.store.transition(c.req.run, entry.id,
                                                    Write("gateway", outcome, finish)))
        except TransitionRefused as exc:
            return self._taken(c, entry, state, report, exc)
        except Exception as exc:  # the effect may have happened: never a 500
            problem = exc.message if isinstance(exc, Refusal) else f"{type(exc).__name__}: {exc}"
            log.error("entry %s of run %s: its outcome (%s) could not be recorded: %s",
                      entry.id, c.req.run, state, problem)
            if refusal is None:  # succeeded: record uncertain, with only what was kept before
                state, refusal = self._unrecordable(c, entry, "the ledger could not store "
                                                    f"it ({mask_text(problem, c.secrets)})")
                report, finish = recorded(state, refusal, kept, None)
                try:
                    await self.ledger(self.store.transition(c.req.run, entry.id,
                                                            Write("gateway", outcome, finish)))
                except TransitionRefused as taken:
                    return self._taken(c, entry, state, report, taken)
                except Exception as again:
                    log.error("entry %s of run %s stays pending: %s", entry.id, c.req.run, again)
                    state = "pending"
            else:
                state = "pending"
            if state == "pending":
                report["warnings"].append("the ledger could not record the outcome: the entry "
                                          "stays pending (its key stays taken)")
        if state == "failed":
            await self._release(c, holder, free=True)
        if state == "succeeded" and not c.req.stage and wants_read_after(m):
            await self._read_after(c, entry, handle, answer.data, report)
        if refusal is not None:
            return CallResult(refusal.status, refusal.envelope(), report, entry.id)
        return CallResult(200, answer.data, report, entry.id, answer.content)

    async def _read_after(self, c: _Call, entry: Entry, handle: Handle, data: Any,
                          report: dict[str, Any]) -> None:
        """verification.after_call: the read the divergence check compares with (after_read.py)."""
        assert c.m is not None
        after, why = await read_after(self.catalogue, self.upstream, self.secrets, c.m,
                                      c.req.arguments, data, c.before)
        if after is not None:
            try:
                why = await self.ledger(record_after(self.store, c.req.run, entry, handle, after))
            except Refusal as exc:
                why = exc.message
        if why is not None:
            report["warnings"].append(f"the read after the call was not recorded ({why}): its "
                                      "undo will have no divergence check")

    def _taken(self, c: _Call, entry: Entry, state: str, report: dict[str, Any],
               exc: TransitionRefused) -> CallResult:
        """The outcome write found its pending entry taken by a rollback (looked up, or
        undone, while the call was still under way): the rollback's record stands, the key
        stays taken (the effect may be live), and the caller hears why, with 502."""
        log.error("entry %s of run %s: its outcome (%s) is not recorded: %s", entry.id,
                  c.req.run, state, exc)
        found = exc.found or "changed"
        report["warnings"].append(f"a rollback took the entry while its call was in flight "
                                  f"(it is {found}): the outcome was not recorded over it")
        refusal = Refusal("upstream_error", f"a rollback took entry {entry.id} of run "
                          f"{c.req.run} while its call was in flight (the entry is {found} "
                          f"now): the call's outcome ({state}) is not recorded over the "
                          "rollback's; its key stays taken. Look at the run's rollback before "
                          "doing anything again", {"entry": entry.id, "taken_by": "rollback",
                                                   "entry_state": found})
        return CallResult(refusal.status, refusal.envelope(), report, entry.id)

    def _unrecordable(self, c: _Call, entry: Entry, why: str) -> tuple[str, Refusal]:
        """The upstream answered, but the outcome cannot be kept: the entry is recorded
        ``uncertain`` (``failed`` for a read_only tool, which cannot have acted) and the
        caller gets 502, never a 200 whose effect the ledger cannot undo."""
        m = c.m
        assert m is not None
        state = "failed" if m.effect == Effect.read_only else "uncertain"
        find = (", find it with the lookup" if m.lookup else "") if state == "uncertain" else ""
        return state, Refusal("upstream_error", f"the upstream of {m.tool} answered, but the "
                              f"outcome cannot be recorded in the ledger: {why}; the entry is "
                              f"{state} (the effect may have happened{find}): do not repeat "
                              "the call blindly", {"entry": entry.id})

    def _outcome(self, c: _Call, p: Prepared, a: Answer) -> tuple[str, Refusal | None]:
        m = c.m
        assert m is not None
        if a.kind == "ok":
            return "succeeded", None
        text = mask_text(a.text, c.secrets) or f"the upstream of {m.tool}: {a.kind}"
        acted = a.may_have_acted and m.effect != Effect.read_only
        state = "uncertain" if acted else "failed"
        tried = f" after {a.attempts} attempts" if a.attempts > 1 else ""
        if a.kind == "timeout":
            return state, Refusal("upstream_timeout", f"{text}{tried}: the call's outcome is "
                                  "unknown" + (", find it with the lookup" if m.lookup else ""))
        if a.kind == "tool_error":  # an MCP tool's own error: no HTTP status to name
            extra = {"upstream": mask_answer(m, a.data, c.secrets)} if a.data is not None else {}
            return state, Refusal(a.code, f"{text}{tried}", extra)
        if a.kind == "error_status":
            detail = mask_answer(m, a.data, c.secrets) if a.data is not None else text
            return state, Refusal(upstream_refusal(a.status), f"{p.method} {m.tool}: the "
                                  f"upstream answered {a.status}{tried}",
                                  {"upstream_status": a.status, "upstream": detail})
        if a.kind == "not_json":
            return state, Refusal("upstream_error", f"the upstream of {m.tool} answered "
                                  f"{a.status} with a body that is not JSON: {text[:200]}")
        return state, Refusal("upstream_error", f"{text}{tried}")

    # ---- refusals and dry runs ----

    async def _refused(self, c: _Call, refusal: Refusal) -> CallResult:
        refusal.message = mask_text(refusal.message, c.secrets)
        if c.record and not c.req.dry_run and refusal.code != "ledger_unavailable":
            await self._record_refusal(c, refusal)
        return self._answer_refusal(c, refusal)

    async def _record_refusal(self, c: _Call, refusal: Refusal) -> None:
        error = EntryError(code=refusal.code, message=refusal.message)
        entry = self._entry(c, "refused", error=error)
        entry.times.finished = entry.times.requested
        try:
            existing = c.existing or await self.store.get(c.req.run, entry.id)
            if existing is not None and existing.state not in REUSABLE:
                entry = entry.model_copy(update={"id": new_ulid()})
                existing = None
            c.existing = existing
            await self._store_new(c, entry)
        except (Refusal, StoreUnavailable) as exc:
            log.error("the refusal of entry %s (%s) could not be recorded: %s", entry.id,
                      refusal.code, exc)

    def _answer_refusal(self, c: _Call, refusal: Refusal) -> CallResult:
        report = None
        if c.m is not None:
            report = effect_report(c.m, outcome="refused", handle=build_handle(c.m, c.req.arguments, {}),
                                   key_sent=None, key=c.key, ledger=c.req.run,
                                   entry=str(refusal.extra.get("entry", c.req.entry_id)),
                                   warnings=c.warnings)
        return CallResult(refusal.status, refusal.envelope(), report,
                          str(refusal.extra.get("entry", c.req.entry_id)))

    async def _dry_run(self, c: _Call, checks: list[Refusal]) -> CallResult:
        m = c.m
        assert m is not None
        existing = await self.ledger(self.store.get(c.req.run, c.req.entry_id))
        if existing is not None and existing.state not in REUSABLE:
            checks.append(Refusal("duplicate", f"Idempotency-Key {existing.id} names an entry "
                                  f"already ({existing.state})", {"entry": existing.id}))
        if c.key is not None:
            standing = await self._standing(c)
            if standing is not None:
                checks.append(standing)
        if not c.req.stage and ApprovalRules.from_manifest(m) is not None:
            checks.append(Refusal("approval_required", f"{m.tool} needs approval: the call "
                                  "would wait as an awaiting_approval entry"))
        report = effect_report(m, outcome="planned",
                               handle=build_handle(m, c.req.arguments, {}), key_sent=c.key_sent,
                               key=c.key, ledger=c.req.run, entry=c.req.entry_id,
                               warnings=c.warnings)
        body = {"dry_run": True, "would_run": not checks,
                "refusals": [{"code": r.code, "message": mask_text(r.message, c.secrets), **r.extra}
                             for r in checks],
                "report": report}
        return CallResult(200, body, report, c.req.entry_id)
