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

import difflib
import logging
import time
from collections.abc import Callable
from datetime import datetime

from ..ledger.entry import now
from ..ledger.handle import secret_texts
from ..ledger.store import Locks, Store
from ..ledger.ulid import new_ulid
from ..upstream.client import Upstream, prepare
from ..upstream.errors import Refusal
from ..upstream.secrets import Secrets
from .callstate import Call, CallRequest, CallResult, Settings
from .catalogue import Catalogue
from .metrics import UNKNOWN_TOOL, Metrics
from .plan import Plans
from .runlimit import RunLimit
from .stages.after_call import AfterCall
from .stages.approval import Approval
from .stages.capture import Capture
from .stages.checks import Checks
from .stages.key import Key
from .stages.outcome import Outcomes
from .stages.ownership import Ownership
from .stages.refusals import Refusals
from .stages.write_ahead import WriteAhead, _Reread

log = logging.getLogger("unwind.gateway")
_Call = Call
__all__ = ["CallRequest", "CallResult", "Gateway", "Settings"]


class Gateway(Ownership, Checks, Key, Approval, Capture, WriteAhead, Outcomes, AfterCall,
              Refusals):
    """The call path, composed of its stages (gateway/stages/): each a mixin of one concern,
    sharing the gateway's services (stages/base.py)."""

    def __init__(self, catalogue: Catalogue, store: Store, locks: Locks, upstream: Upstream,
                 secrets: Secrets, settings: Settings, metrics: Metrics | None = None,
                 clock: Callable[[], datetime] = now) -> None:
        self.catalogue, self.store, self.locks = catalogue, store, locks
        self.upstream, self.secrets, self.settings = upstream, secrets, settings
        self.metrics = metrics or Metrics()
        self.clock = clock
        self._own_runs: set[str] = set()  # runs whose ledger records this actor as owner
        self.runs = RunLimit(settings.max_runs, settings.runs_window, clock)
        self.plans = Plans(catalogue)  # each served tool's call plan (plan.py)

    def _new_id(self) -> str:
        """An entry id this gateway draws (a refusal recorded beside the entry its key
        names): drawn here, in the composition, so one name decides them (the simulation,
        tests/sim, makes them deterministic through it)."""
        return new_ulid()

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

    async def _call(self, c: _Call) -> CallResult:
        req = c.req
        await self._run_is_ours(c)
        plan = c.plan = self.plans.get(req.tool)
        if plan is None or not plan.enforceable:
            if plan is None and not self.catalogue.ready:
                raise Refusal("not_found", f"no tool {req.tool!r}: the gateway serves no "
                              f"manifests ({self.catalogue.problem})")
            what = "is only a draft: approve it before calling" if plan else "is not served here"
            if plan is None:  # a misspelt name: only this refusal pays for the lookup
                known = [s.manifest.tool for s in self.catalogue.tools() if s.manifest.enforceable]
                close = difflib.get_close_matches(req.tool, known, n=1)
                what += f" (did you mean {close[0]}?)" if close else ""
            raise Refusal("not_found", f"tool {req.tool!r} {what}")
        m = c.m = plan.manifest
        c.checksum, c.version = plan.served.checksum, plan.served.version
        c.secrets = secret_texts(m, req.arguments)
        if plan.deprecated:
            c.warnings.append(plan.deprecated)
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
        rules = None if req.stage else plan.approval
        # A keyed call with no approval and no capture sends its key's lock and its pending
        # entry together (_take_key_writing_ahead); one with a capture, or one that will
        # wait for approval, takes the lock first (keylocks.py): an awaiting entry holds
        # its key, so a duplicate never waits for a human.
        together = plan.together and c.key is not None and not req.stage and not approved
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

