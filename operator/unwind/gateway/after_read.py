"""The read right after a call (``compensation.verification.after_call``), recorded in its entry.

Before an undo restores captured state, the step runner reads the state and compares it
with what the call left, so that a later change is not overwritten (docs/rollback.md,
Diverged). Compared with the call's *answer* that is unlike with unlike: an MCP tool answers
prose ("Files staged successfully"), an API with revisions answers ``{ok, id, rev}``. A tool
that declares ``after_call`` has its verification read made here, right after the call
succeeded, with the same tool and arguments the runner reads with before the undo; what it
finds at the ``expect`` paths is kept in the entry (``handle.after``) by a second write of
the gateway (``succeeded`` to ``succeeded``, a lifecycle row), so the two reads compare like
with like.

The call has already succeeded and is recorded: a read that fails, or a write a rollback
beat, changes nothing about it. The caller's report says so, and the plan then says plainly
that this entry's undo has no divergence check.
"""

from __future__ import annotations

from typing import Any

from ..ledger.entry import Entry, Handle
from ..ledger.handle import HandleError, after_tree
from ..ledger.lifecycle import Expect, TransitionRefused, Write
from ..ledger.store import Store
from ..manifest.model import Effect, ToolManifest
from ..manifest.refs import resolve_map
from ..upstream.client import Upstream, prepare
from ..upstream.errors import Refusal
from ..upstream.secrets import Secrets
from .catalogue import Catalogue


def wants_read_after(m: ToolManifest) -> bool:
    v = m.compensation.verification if m.compensation else None
    return v is not None and bool(v.after_call) and m.capture is not None


async def read_after(catalogue: Catalogue, upstream: Upstream, secrets: Secrets,
                     m: ToolManifest, args: Any, result: Any, before: Any) -> tuple[Any, str | None]:
    """(what the verification read finds at the expect paths, None) or (None, why not)."""
    v = m.compensation.verification if m.compensation else None
    assert v is not None
    served = catalogue.get(v.tool)
    if served is None or served.manifest.effect != Effect.read_only:
        return None, f"its read-back {v.tool} is not served here as a read_only tool"
    read_args, missing = resolve_map(v.arguments, args, result, None, before)
    if missing:
        return None, "its arguments cannot be filled: " + "; ".join(missing)
    try:
        answer = await upstream.send(prepare(served.manifest, read_args, secrets, {}))
    except Refusal as exc:
        return None, exc.message
    if answer.kind != "ok":
        return None, f"{v.tool} answered {answer.status or answer.kind}"
    try:
        return after_tree(m, answer.data), None
    except HandleError as exc:
        return None, exc.reason


async def record_after(store: Store, run: str, entry: Entry, handle: Handle, after: Any) -> str | None:
    """Keep ``after`` in the succeeded entry; why not, when a rollback took it meanwhile."""
    def change(current: Entry) -> Entry:
        kept = (current.handle or handle).model_copy(update={"after": after})
        return current.model_copy(update={"handle": kept})
    try:
        await store.transition(run, entry.id, Write("gateway", Expect("succeeded",
                                                                      len(entry.attempts)), change))
    except TransitionRefused as exc:
        return f"the entry changed before the read after the call was recorded ({exc})"
    return None
