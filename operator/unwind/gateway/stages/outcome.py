"""The upstream call and its outcome: the answer judged (succeeded, failed, uncertain), the
handle and report built, and the outcome written as a compare-and-set on the pending
entry this call wrote (a rollback that took it meanwhile is never overwritten).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ...ledger.entry import Entry, EntryError, Handle, Staged, Times, stamp
from ...ledger.handle import (
    HandleError,
    build_handle,
    mask_answer,
    mask_text,
    secret_texts,
    staged_handle,
)
from ...ledger.lifecycle import Expect, TransitionRefused, Write
from ...ledger.report import Outcome, effect_report
from ...ledger.store import Holder
from ...manifest.model import Effect
from ...upstream.client import Answer, Prepared
from ...upstream.errors import Refusal, upstream_refusal
from ..after_read import wants_read_after
from ..callstate import Call as _Call
from ..callstate import CallResult
from .base import Stage

log = logging.getLogger("unwind.gateway")


class Outcomes(Stage):
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
