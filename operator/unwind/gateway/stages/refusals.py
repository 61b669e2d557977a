"""Refusals and dry runs: a refusal recorded as a ``refused`` entry (where it may be) and
answered with its report; a dry run answers what would happen and writes nothing.
"""

from __future__ import annotations

import logging

from ...ledger.entry import EntryError
from ...ledger.handle import build_handle, mask_text
from ...ledger.lifecycle import REUSABLE
from ...ledger.report import effect_report
from ...ledger.store import StoreUnavailable
from ...upstream.errors import Refusal
from ..callstate import Call as _Call
from ..callstate import CallResult
from .base import Stage

log = logging.getLogger("unwind.gateway")


class Refusals(Stage):
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
                entry = entry.model_copy(update={"id": self._new_id()})
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
        if not c.req.stage and c.plan is not None and c.plan.approval is not None:
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
