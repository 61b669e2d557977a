"""A rollback's fence: the mark, stored with a run's ledger, that closes the run to new calls.

A rollback planned while the agent still calls would plan from a ledger that keeps growing
and look up entries whose calls are still in flight. So a rollback first fences its run:

- locally, ``unwind rollback`` writes the fence into the run's first page under the run's
  lock (``FileStore.fence_sync``); every gateway's write holds that lock and reads the page;
- in a cluster, the request itself (``spec.rollback.requested`` on the first page) fences
  the page it is on, and the operator writes the fence into the status of every page
  before it plans, so each gateway's write, conditional on the resourceVersion of the page
  it changes, sees it in the same write.

The store refuses a write that opens a call (``lifecycle.opens``: the write-ahead, a new
awaiting entry, the approved repeat) in a fenced run with ``Fenced``; the gateway answers
409 ``rolled_back`` naming the rollback. The calls already written ahead go on and record
their outcomes; the rollback waits for them to finish or pass their deadline, and only then
plans. A fenced run stays closed: the agent starts a new run.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Fence(BaseModel):
    """The fence of a run (``status.fence`` of each of its pages)."""

    model_config = ConfigDict(extra="forbid")

    since: str = Field(description="When the run was closed to new calls (RFC 3339).")
    by: str | None = Field(None, description="Who asked for the rollback, as recorded.")
    reason: str | None = Field(None, description="Why, as the request says.")
    generation: int | None = Field(None, description="In a cluster: the ledger's metadata.generation "
                                                     "of the rollback request that fenced it.")

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


class Fenced(Exception):
    """The run is fenced by a rollback: it takes no new calls."""

    def __init__(self, run: str, fence: Fence) -> None:
        self.run, self.fence = run, fence
        super().__init__(message(run, fence))


def message(run: str, fence: Fence) -> str:
    who = f" by {fence.by}" if fence.by else ""
    why = f" ({fence.reason})" if fence.reason else ""
    return (f"run {run} is being rolled back: a rollback{who}{why} closed it to new calls at "
            f"{fence.since}; nothing was called. Start a new run (another X-Unwind-Run) to go on")


def requested_fence(spec: Any, since: str) -> Fence | None:
    """The fence a first page's ``spec.rollback`` sets by itself (a cluster request, before
    the operator has written its own): None unless ``requested`` is true."""
    rollback = spec.get("rollback") if isinstance(spec, dict) else None
    if not isinstance(rollback, dict) or rollback.get("requested") is not True:
        return None
    reason = rollback.get("reason")
    return Fence(since=str(rollback.get("requestedAt") or since),
                 reason=reason if isinstance(reason, str) else None)


def parse(value: Any) -> Fence | None:
    """A stored fence, or None (absent, or not a fence: an unreadable one fences too)."""
    if value is None:
        return None
    try:
        return Fence.model_validate(value)
    except ValueError:
        return Fence(since="(unreadable)", reason="the stored fence cannot be read")
