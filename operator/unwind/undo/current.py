"""The read right before an undo (``compensation.current``): the object as it is now, bound
as ``$current`` for the undo's arguments and headers.

An API with revisions (a CouchDB ``_rev``, an ETag, Kubernetes' resourceVersion) refuses a
write that names a stale one. The revision recorded at call time is stale as soon as an
earlier undo of the same object wrote it again, so the undo reads the object right before
it runs and names the revision it finds; sent as a precondition (``If-Match``), a record
changed between that read and the undo is refused by the API rather than overwritten.

What the read finds:

- a 2xx answer: ``$current`` is its data; each bound reference is resolved from it (a
  missing optional one is left out, a missing required one fails the step, nothing called);
- a status the read-back's ``absent`` lists (404, 410), when the undo removes the object:
  it is gone already (someone, or an earlier attempt of this step, removed it); the step
  goes to the read-back, which confirms it, and nothing is called;
- another 404 or 410: ``$current`` is absent (optional references are left out);
- anything else: the step fails, nothing called (the object's state is unknown).
"""

from __future__ import annotations

from typing import Any, Literal

from ..ledger.stepinput import StepInput
from ..manifest.refs import Missing, RefSyntaxError, parse_ref, resolve
from ..upstream.client import Upstream
from ..upstream.secrets import Secrets
from .calls import failure, send

Read = Literal["go", "gone", "stop"]


async def read_current(spec: StepInput, upstream: Upstream, secrets: Secrets,
                       args: dict[str, Any], headers: dict[str, str],
                       result: dict[str, Any]) -> Read:
    """Read the object, fill ``args`` and ``headers`` from its answer; ``stop`` when the
    step is settled here (``result`` says why), ``gone`` when it is removed already."""
    cur, m, v = spec.current, spec.manifest, spec.verification
    assert cur is not None
    answer = await send(cur.manifest, dict(cur.arguments), secrets, {}, upstream)
    result["read_before"] = {"tool": cur.manifest.tool, "status": answer.status,
                             "kind": answer.kind}
    current: Any = None
    if answer.kind == "ok":
        current = answer.data if answer.data is not None else {}
    elif answer.kind == "error_status" and answer.status in (404, 410):
        if v is not None and v.absent is not None and answer.status in v.absent.statuses:
            return "gone"
    else:
        result.update(outcome="undo_failed", entry_state="undo_failed",
                      reason=f"{cur.manifest.tool} could not read the object right before "
                             f"{m.tool}: {failure(answer)}; nothing was called")
        return "stop"
    missing: list[str] = []
    for place, raw in cur.binds.items():
        kind, _, name = place.partition(".")
        try:
            ref = parse_ref(raw)
        except RefSyntaxError as exc:
            missing.append(f"{place}: {exc}")
            continue
        value = resolve(ref, None, None, None, None, current)
        if isinstance(value, Missing):
            if not ref.optional:
                missing.append(f"{place} ({ref.text()}): {value.reason}")
            continue
        if kind == "headers":
            headers[name] = value if isinstance(value, str) else str(value)
        else:
            args[name] = value
    if missing:
        said = (f"answered {answer.status}" if answer.status is not None else "answered")
        result.update(outcome="undo_failed", entry_state="undo_failed",
                      reason=f"{cur.manifest.tool} {said} right before {m.tool}, without what "
                             f"the undo needs: {'; '.join(missing)}; nothing was called")
        return "stop"
    return "go"
