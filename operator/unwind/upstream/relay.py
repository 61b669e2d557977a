"""What one MCP ``tools/call`` streams back to the client that made it, and its cancellation.

The MCP door sets a ``Relay`` in the context of the task that runs one call, and the MCP
client (mcp_client.py) reads it when it calls the upstream: the upstream's
``notifications/progress`` and log messages go to the relay's callbacks (the door writes
them onto the client's SSE stream), and a cancelled relay cancels the upstream call (the
SDK then sends ``notifications/cancelled``, or closes the request's stream on a
2026-07-28 connection). A context variable rather than a parameter: the enforcement path
between the door and the upstream stays as it is, and a REST call has no relay at all.

Every upstream call of the task sees the relay, a manifest's ``capture`` too (cancelled
before its call is sent, the call is refused and nothing reaches the call's upstream).
Progress passes on only when it grows: MCP wants each progress value above the last, and
the capture and the call count from their own zero.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("unwind.gateway.mcp")

ProgressFn = Callable[[float, float | None, str | None], Awaitable[None]]
LogFn = Callable[[str, Any, str | None], Awaitable[None]]


@dataclass
class Relay:
    progress: ProgressFn | None = None  # None: the client asked for no progress
    log: LogFn | None = None
    log_level: str | None = None  # the level to ask the upstream for (2026-07-28 servers)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    why: str = ""
    _last: float | None = None

    def cancel(self, why: str) -> None:
        if not self.cancelled.is_set():
            self.why = why
            self.cancelled.set()

    async def on_progress(self, progress: float, total: float | None, message: str | None) -> None:
        if self.progress is None or (self._last is not None and progress <= self._last):
            return
        self._last = progress
        try:
            await self.progress(progress, total, message)
        except Exception as exc:  # the client went away: the call goes on, and is recorded
            log.debug("progress not relayed: %s", exc)

    async def on_log(self, level: str, data: Any, logger: str | None) -> None:
        if self.log is None:
            return
        try:
            await self.log(level, data, logger)
        except Exception as exc:
            log.debug("log message not relayed: %s", exc)


_CURRENT: contextvars.ContextVar[Relay | None] = contextvars.ContextVar("unwind_relay",
                                                                        default=None)


def current() -> Relay | None:
    return _CURRENT.get()


def start_with(relay: Relay, work: Awaitable[Any]) -> asyncio.Task[Any]:
    """Run ``work`` in a task of its own that sees ``relay``: the client's cancellation of
    the request never cancels it, so its outcome is always recorded."""
    token = _CURRENT.set(relay)
    try:
        return asyncio.ensure_future(work)
    finally:
        _CURRENT.reset(token)
