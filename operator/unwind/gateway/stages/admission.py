"""The doors' stage around enforcement: before it, the caller's rate limits (ratelimit.py);
after it, the call's attributes on its trace (tracing.py). Both doors run it, the REST route
(rest.py) and ``/mcp`` (mcp_guard.py before the MCP SDK, mcp_server.py after), so a limit or
a span means the same at either.

Why at the doors, not among the gateway's stages: a call over its limit is answered with an
HTTP 429 and ``Retry-After`` (at ``/mcp`` before the SDK reads the call, whose answers are
all 200s), counted whether it then runs or is refused, and before its body is read. What it
needs of the tool, its name and whether it is read-only, comes from the tool's call plan
(plan.py), shared by every caller's view of the gateway. A call refused here is recorded as
``refused`` through the gateway's refusal path (``Gateway.reject``): nothing of it ran.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...upstream.errors import Refusal
from .. import tracing
from ..callstate import CallRequest, CallResult
from ..metrics import UNKNOWN_TOOL

if TYPE_CHECKING:
    from ..enforce import Gateway
    from ..ratelimit import Decision, Limiter


class Admission:
    def __init__(self, limiter: Limiter | None) -> None:
        self.limiter = limiter

    async def limit(self, gw: Gateway, tool: str) -> Decision | None:
        """The caller's buckets for ``tool`` (the name as called), taken; None without limits.
        A tool not served is limited as ``UNKNOWN_TOOL``: a caller cannot dodge its limits
        with names that do not exist."""
        if self.limiter is None:
            return None
        plan = gw.plans.get(tool)
        return await self.limiter.check(gw.settings.actor, plan.tool if plan else UNKNOWN_TOOL,
                                        read_only=plan is not None and plan.read_only)

    @staticmethod
    async def refuse(gw: Gateway, tool: str, run: str, entry_id: str,
                     refusal: Refusal) -> CallResult:
        """A call refused at the door (over its limit): recorded as refused, never run."""
        return await gw.reject(CallRequest(tool=tool, arguments={}, run=run, entry_id=entry_id),
                               refusal)


def annotate(gw: Gateway, tool: str, run: str, result: CallResult) -> None:
    """Unwind's attributes on the call's SERVER span (tracing.annotate), whichever stage
    answered it, the doors' refusals included; nothing when traces are off."""
    if not tracing.enabled:
        return
    plan = gw.plans.get(tool)
    tracing.annotate(tool[:128], run, result.entry, result.status, result.body,
                     gw.settings.actor, plan.effect if plan else None)
