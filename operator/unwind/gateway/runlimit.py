"""``--max-runs``: at most so many distinct runs written per window, counted where checked.

A new run is **reserved** in the same step that checks the count, before the create that
makes its ledger is awaited: a hundred concurrent calls into new runs each see the
reservations of the others, so with ``--max-runs 3`` three ledgers are made, not a hundred.
A create that fails gives its reservation back.

The count survives a restart: the first time a gateway process needs it, it reads from the
ledger store the runs its actor created within the window (``Store.runs_created``, where the
store can say: the file store from its pages, the cluster store from the EffectLedgers'
metadata). A store that cannot say leaves the count to this process.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Protocol

log = logging.getLogger("unwind.gateway")


class CountsRuns(Protocol):
    async def runs_created(self, actor: str, since: datetime) -> dict[str, datetime]: ...


def span(window: timedelta) -> str:
    seconds = int(window.total_seconds())
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


class RunLimit:
    def __init__(self, limit: int | None, window: timedelta, clock: Callable[[], datetime]) -> None:
        self.limit, self.window, self.clock = limit, window, clock
        self.used: dict[str, datetime] = {}  # run -> its first write in the current window
        self._seeding: asyncio.Future[None] | None = None

    async def seed(self, read: Callable[[datetime], Awaitable[dict[str, datetime]]] | None) -> None:
        """Count the runs the store says this actor created within the window: read once,
        and every call that comes meanwhile waits for that one read (a burst right after a
        restart must not reserve past what the store already holds)."""
        if not self.limit or read is None:
            return
        if self._seeding is None:
            self._seeding = asyncio.ensure_future(self._read(read))
        await asyncio.shield(self._seeding)

    async def _read(self, read: Callable[[datetime], Awaitable[dict[str, datetime]]]) -> None:
        try:
            found = await read(self.clock() - self.window)
        except Exception as exc:  # the count stays this process's; the write decides the rest
            log.warning("could not count the runs already written (%s): --max-runs counts "
                        "from this start", exc)
            return
        for run, when in found.items():
            self.used.setdefault(run, when)

    def known(self, run: str) -> bool:
        return not self.limit or run in self.used

    def reserve(self, run: str) -> str | None:
        """Reserve ``run`` (None), or say why not when the window is full. No await between
        the count and the reservation: that is what makes the limit hold."""
        if not self.limit or run in self.used:
            return None
        moment = self.clock()
        since = moment - self.window
        for name, first in list(self.used.items()):
            if first <= since:
                del self.used[name]
        if len(self.used) >= self.limit:
            return (f"this gateway wrote {self.limit} runs in the last {span(self.window)}, the "
                    "most it may (--max-runs): write into a run in use, or try again later")
        self.used[run] = moment
        return None

    def give_back(self, run: str) -> None:
        self.used.pop(run, None)
