"""Standard Kubernetes conditions.

type/status/reason/message/lastTransitionTime/observedGeneration, as Argo CD and Flux
(kstatus) read them. ``set_condition`` is the one place conditions change: it keeps
lastTransitionTime unless the status flips, so a re-reconcile does not look like news.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: str = Field(description="Condition type, e.g. Ready.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason; the documented constants of each type.")
    message: str = Field("", description="What happened, and what to do about it.")
    lastTransitionTime: str = Field(description="When status last changed (RFC 3339).")
    observedGeneration: int | None = Field(None, description="The generation this condition describes.")


def now_rfc3339() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def set_condition(
    conditions: list[dict[str, object]],
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    generation: int | None,
    now: str | None = None,
) -> list[dict[str, object]]:
    """Return a new condition list with ``type_`` set; other conditions keep their order."""
    out: list[dict[str, object]] = []
    found = False
    for cond in conditions:
        if cond.get("type") == type_:
            found = True
            changed = cond.get("status") != status
            out.append({
                "type": type_, "status": status, "reason": reason, "message": message,
                "lastTransitionTime": (now or now_rfc3339()) if changed else cond.get("lastTransitionTime"),
                "observedGeneration": generation,
            })
        else:
            out.append(cond)
    if not found:
        out.append({"type": type_, "status": status, "reason": reason, "message": message,
                    "lastTransitionTime": now or now_rfc3339(), "observedGeneration": generation})
    return out


def get_condition(conditions: list[dict[str, object]], type_: str) -> dict[str, object] | None:
    return next((c for c in conditions if c.get("type") == type_), None)
