"""Run one step of an undo plan: the call, then the read-back; or a lookup.

The same function runs a step in a Job (``unwind undo-step``) and in the local rollback
(``unwind rollback``), so both behave alike. It reaches upstreams through the gateway's
``prepare``/``Upstream.send`` (URL placeholders, header secrets, the undo tool's own
timeout and, for read_only and idempotent tools, its retries).

The step's idempotency key goes where the called tool declares a carrier
(``idempotency.carrier.header`` or ``.argument``), else in an ``Idempotency-Key`` header:
the key is Unwind's own, so sending it costs nothing where it is ignored, and lets an
upstream that honours the header deduplicate a retried undo. Lookups and read-backs are
reads and carry no key.

When the tool captured the state it changed (``capture``), the read-back says which fields
the call set and what it left there (``verification.left``): before restoring, the runner
reads the state with the verification tool, and if a field no longer holds what the call
left (someone changed it since), the step ends ``diverged`` and calls nothing, rather than
overwrite that later change. A state that already reads as expected (an undo applied
before its outcome was recorded) counts as undone without a second call.

The result is one JSON object (docs/rollback.md, "The step runner"): whether the step
succeeded, what the entry becomes, and why, with the first mismatch of a failed read-back
(or, for a diverged step, what it found).
It always fits a Job's termination message (4096 bytes).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from ..ledger.entry import now, stamp
from ..ledger.handle import build_handle
from ..ledger.stepinput import ReadBackInput, StepInput
from ..ledger.undo import absence_problem, first_mismatch
from ..upstream.client import Answer, Upstream
from ..upstream.secrets import Secrets
from .calls import call_record, failure, send
from .current import read_current

MESSAGE_LIMIT = 4096
Sleep = Callable[[float], Awaitable[None]]


def parse_step(data: Any) -> StepInput:
    """The runner's input, or ValueError naming the first wrong field."""
    try:
        return StepInput.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(the input)"
        raise ValueError(f"the step input is not valid: {where}: {first['msg']}") from None


async def run_step(spec: StepInput, upstream: Upstream, secrets: Secrets, *,
                   sleep: Sleep = asyncio.sleep,
                   clock: Callable[[], datetime] = now) -> dict[str, Any]:
    """Run the step; the result as a JSON object (never raises for an upstream's failure)."""
    started = stamp(clock())
    step = spec.step
    result: dict[str, Any] = {
        "ok": False, "ledger": spec.ledger, "entry": step.entry, "action": step.action,
        "tool": spec.manifest.tool, "idempotency_key": spec.idempotency_key,
        "outcome": "", "entry_state": None, "reason": "", "first_mismatch": None,
        "call": None, "verification": None, "started": started, "finished": started,
    }
    if step.action == "lookup":
        await _lookup(spec, upstream, secrets, result)
    elif step.action in ("inverse", "compensate", "discard"):
        try:
            await _undo(spec, upstream, secrets, result, sleep)
        except Exception as exc:  # the entry must never stay undoing
            # Whatever could not be evaluated (a manifest the validator never saw), the
            # step ends undo_failed with why; running the rollback again repeats the undo
            # call, if it was sent, with the same idempotency key.
            sent = ("the undo call was sent" if result["call"] is not None
                    else "nothing was called")
            result.update(ok=False, outcome="undo_failed", entry_state="undo_failed",
                          reason=f"the step could not be completed ({type(exc).__name__}: "
                                 f"{exc}); {sent}: roll back again once the cause is fixed "
                                 "(the same idempotency key is sent)")
    else:
        result.update(outcome="invalid_step", reason=f"a {step.action} step runs nothing")
    result["finished"] = stamp(clock())
    return result


async def _undo(spec: StepInput, upstream: Upstream, secrets: Secrets, result: dict[str, Any],
                sleep: Sleep) -> None:
    m, step = spec.manifest, spec.step
    guarded = spec.verification is not None and bool(spec.verification.left)
    if guarded and step.action != "discard" and not await _still_as_left(spec, upstream,
                                                                           secrets, result):
        return
    args = dict(step.arguments or {})
    headers: dict[str, str] = {k: str(v) for k, v in step.headers.items()}
    if spec.current is not None:
        read = await read_current(spec, upstream, secrets, args, headers, result)
        if read == "stop":
            return
        if read == "gone":  # already gone, as the read-back will confirm: nothing to call
            await _read_back(spec, upstream, secrets, result, sleep,
                             f"{spec.current.manifest.tool} found nothing to remove before the "
                             f"undo, so {m.tool} was not called")
            return
    carrier = m.idempotency.carrier if m.idempotency else None
    if spec.idempotency_key is not None:
        if carrier is not None and carrier.argument is not None:
            args[carrier.argument] = spec.idempotency_key
        else:
            headers[carrier.header if carrier and carrier.header else "Idempotency-Key"] = \
                spec.idempotency_key
    answer = await send(m, args, secrets, headers, upstream)
    result["call"] = call_record(answer)
    v = spec.verification
    # A declared status (a DELETE's 404: already gone) counts as done only once the
    # read-back confirms it; any other failure fails the step.
    done_by_status = (answer.kind == "error_status" and v is not None
                      and answer.status in v.done_statuses)
    if answer.kind != "ok" and not done_by_status:
        result.update(outcome="undo_failed", entry_state="undo_failed",
                      reason=f"{m.tool}: {failure(answer)}")
        return
    said = (f"{m.tool} answered {answer.status}, a status compensation.done_statuses counts "
            "as done once confirmed" if done_by_status else f"{m.tool} answered {answer.status}")
    if v is None:
        result.update(ok=True, outcome="undone", entry_state="undone",
                      reason=f"{m.tool} answered {answer.status}; no read-back is declared")
        return
    await _read_back(spec, upstream, secrets, result, sleep, said)


async def _read_back(spec: StepInput, upstream: Upstream, secrets: Secrets,
                     result: dict[str, Any], sleep: Sleep, said: str) -> None:
    """The verification after the undo call (or instead of it): the step is undone at the
    first answer that matches, else undo_failed with the first mismatch."""
    v = spec.verification
    assert v is not None
    first: str | None = None
    for attempt in range(1, v.retries + 1):
        read = await send(v.manifest, dict(v.arguments), secrets, {}, upstream)
        try:
            mismatch = _read_back_mismatch(v, read)
        except ValueError as exc:  # an expect path that does not parse: retrying cannot help
            why = f"the read-back {v.manifest.tool} cannot be evaluated: {exc}"
            result["verification"] = {"tool": v.manifest.tool, "attempts": attempt,
                                      "matched": False}
            result.update(outcome="undo_failed", entry_state="undo_failed", first_mismatch=why,
                          reason=f"{said}, but {why}; fix compensation.verification.expect "
                                 "and roll back again")
            return
        first = first or mismatch
        result["verification"] = {"tool": v.manifest.tool, "attempts": attempt,
                                  "matched": mismatch is None}
        if mismatch is None:
            seen = "confirmed it gone" if v.absent is not None else "read it back as expected"
            result.update(ok=True, outcome="undone", entry_state="undone",
                          reason=f"{said}; {v.manifest.tool} {seen} (attempt {attempt} of "
                                 f"{v.retries})")
            return
        if attempt < v.retries:
            await sleep(v.backoff_ms * 2 ** (attempt - 1) / 1000)
    result.update(outcome="undo_failed", entry_state="undo_failed", first_mismatch=first,
                  reason=f"{said}, but the read-back {v.manifest.tool} did not "
                         f"{'confirm it gone' if v.absent is not None else 'match'} in "
                         f"{v.retries} attempts: {first}")


def _read_back_mismatch(v: ReadBackInput, read: Answer) -> str | None:
    """None when the read-back's answer is what the verification expects, else why not:
    with ``absent``, a listed status or an empty/declared not-found answer proves the
    thing gone; otherwise a 2xx answer's fields must match ``expect``."""
    if v.absent is not None and read.kind in ("ok", "error_status"):
        return absence_problem(v.absent, read.status, read.data)
    if read.kind == "ok":
        return first_mismatch(v.expect, read.data)
    return f"the read-back {v.manifest.tool} failed: {failure(read)}"


async def _still_as_left(spec: StepInput, upstream: Upstream, secrets: Secrets,
                         result: dict[str, Any]) -> bool:
    """Before restoring captured state: True when every field the call set still holds what
    the call left. Otherwise the step is settled here, nothing called: ``diverged`` (someone
    changed a field since), ``undone`` (it already reads as restored), or ``undo_failed``
    (the state could not be read)."""
    m, v = spec.manifest, spec.verification
    assert v is not None and v.left
    read = await send(v.manifest, dict(v.arguments), secrets, {}, upstream)
    result["verification"] = {"tool": v.manifest.tool, "attempts": 0, "matched": False,
                              "before_undo": True}
    if read.kind != "ok":
        result.update(outcome="undo_failed", entry_state="undo_failed",
                      reason=f"{v.manifest.tool} could not read the state before {m.tool} "
                             f"restores it: {failure(read)}; nothing was called")
        return False
    found = first_mismatch(v.left, read.data)
    if found is None:
        return True
    if first_mismatch(v.expect, read.data) is None:
        result["verification"]["matched"] = True
        result.update(ok=True, outcome="undone", entry_state="undone",
                      reason=f"{v.manifest.tool} reads the state from before the call already "
                             f"(an earlier undo was applied): {m.tool} was not called again")
        return False
    result.update(outcome="diverged", entry_state="undo_failed",
                  first_mismatch=found.replace(", expected ", ", the call left "),
                  reason=f"{v.manifest.tool} reads a state the call did not leave "
                         f"({found.replace(', expected ', ', the call left ')}): it was changed "
                         f"after the call, so {m.tool} was not called (restoring would "
                         "overwrite that later change); decide by hand and record it with "
                         "settle (the entry is then left alone), or undo the later change and "
                         "roll back again")
    return False


async def _lookup(spec: StepInput, upstream: Upstream, secrets: Secrets,
                  result: dict[str, Any]) -> None:
    m, step = spec.manifest, spec.step
    answer = await send(m, dict(step.arguments or {}), secrets, {}, upstream)
    result["call"] = call_record(answer)
    if answer.kind == "ok":
        if spec.effect is None:
            result.update(outcome="invalid_step", reason="a lookup step needs effect (the "
                          "entry's manifest and handle) to complete the handle")
            return
        e = spec.effect
        handle = build_handle(e.manifest, e.handle.args, answer.data, before=e.handle.before)
        result.update(ok=True, outcome="found", entry_state="succeeded",
                      handle=handle.model_dump(mode="json", exclude_none=True),
                      reason=f"{m.tool} found the effect ({answer.status}): the call did act; "
                             "its handle is completed from the answer")
    elif answer.kind == "error_status" and answer.status == 404:
        result.update(ok=True, outcome="not_found", entry_state="failed",
                      reason=f"{m.tool} answered 404: the call never acted, the entry is failed")
    else:
        result.update(outcome="lookup_failed", entry_state="uncertain",
                      reason=f"{m.tool}: {failure(answer)}; the entry stays uncertain")


def fit(result: dict[str, Any], limit: int = MESSAGE_LIMIT) -> str:
    """The result as one JSON line of at most ``limit`` bytes: long texts are cut first; a
    lookup's handle that still does not fit fails the step (it cannot be reported)."""
    line = _dump(result)
    if len(line.encode()) <= limit:
        return line
    cut = dict(result)
    for name in ("reason", "first_mismatch"):
        if isinstance(cut.get(name), str):
            cut[name] = cut[name][:400] + "..."
    line = _dump(cut)
    if len(line.encode()) <= limit:
        return line
    if "handle" in cut:
        cut.pop("handle")
        cut.update(ok=False, outcome="lookup_failed", entry_state="uncertain",
                   reason="the effect was found, but its handle is larger than a termination "
                          f"message ({limit} bytes): the entry stays uncertain")
    line = _dump(cut)
    if len(line.encode()) <= limit:
        return line
    keep = ("ok", "ledger", "entry", "action", "tool", "outcome", "entry_state", "started",
            "finished")
    short = {k: cut.get(k) for k in keep}
    short["reason"] = str(cut.get("reason") or "")[:200]
    return _dump(short)


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=False)
