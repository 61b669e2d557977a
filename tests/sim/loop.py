"""An asyncio event loop with virtual time and a seeded choice of who runs next.

Every actor of the simulation (a gateway, an approver, a rollback, the operator, the
upstream, the API server) is a *process*: a contextvar set on the tasks it starts, which
every callback they schedule inherits. Within one process callbacks run in the order they
were scheduled, as in a real loop; between processes the loop picks, with its seeded
random generator, which process runs its next callback. That is every interleaving of
single-threaded processes, and only those.

Time is virtual: when nothing is ready, the clock jumps to the next timer, so a 30 s
``lock_grace`` or a 45 s timeout costs nothing. Executor work (``asyncio.to_thread``, which
the file store uses for its syncs) runs inline, at once: the file store's locked
read-modify-write then never yields with its ``flock`` held, and nothing runs in a thread.

A killed process never runs again: its ready callbacks are dropped and its tasks are kept
(not collected) until the run ends, so no ``finally`` or ``except BaseException`` of a
killed gateway runs — a kill is SIGKILL, not a cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import gc
import heapq
import random
import sys
import warnings
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

PROCESS: contextvars.ContextVar[str] = contextvars.ContextVar("sim_process", default="main")
EPOCH = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
T = TypeVar("T")


class Deadlock(Exception):
    """Nothing is ready and no timer is set, but the run is not over."""


class SimLoop(asyncio.SelectorEventLoop):
    def __init__(self, seed: int, *, max_steps: int = 2_000_000) -> None:
        super().__init__()
        self.rng = random.Random(seed)
        self._now = 0.0
        self.dead: set[str] = set()
        self.tasks: dict[str, list[asyncio.Task[Any]]] = {}
        self.dropped: list[asyncio.Handle] = []
        self.steps = 0
        self.max_steps = max_steps
        self.set_exception_handler(lambda loop, context: None)  # a killed task's noise

    def time(self) -> float:
        return self._now

    def now(self) -> datetime:
        return EPOCH + timedelta(seconds=self._now)

    def run_in_executor(self, executor: Any, func: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        future: asyncio.Future[T] = self.create_future()
        try:
            future.set_result(func(*args))
        except Exception as exc:
            future.set_exception(exc)
        return future

    def create_task(self, coro: Coroutine[Any, Any, T], *, name: str | None = None,
                    context: contextvars.Context | None = None) -> asyncio.Task[T]:
        task = super().create_task(coro, name=name, context=context)
        owner = context.get(PROCESS, "main") if context is not None else PROCESS.get()
        self.tasks.setdefault(owner, []).append(task)
        return task

    def spawn(self, process: str, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Start ``coro`` as (part of) process ``process``."""
        self.dead.discard(process)
        context = contextvars.copy_context()
        context.run(PROCESS.set, process)
        return self.create_task(coro, context=context)

    def kill(self, process: str) -> None:
        self.dead.add(process)

    def alive(self, process: str) -> bool:
        return process not in self.dead

    def _owner(self, handle: asyncio.Handle) -> str:
        context = getattr(handle, "_context", None)
        return context.get(PROCESS, "main") if context is not None else "main"

    def _run_once(self) -> None:
        self.steps += 1
        if self.steps > self.max_steps:
            raise Deadlock(f"more than {self.max_steps} steps: a livelock?")
        scheduled = self._scheduled
        while scheduled and scheduled[0]._cancelled:
            self._timer_cancelled_count -= 1
            heapq.heappop(scheduled)._scheduled = False
        ready = self._ready
        if not ready:
            if not scheduled:
                raise Deadlock("nothing is ready and no timer is set")
            self._now = max(self._now, scheduled[0]._when)
        while scheduled and scheduled[0]._when <= self._now:
            handle = heapq.heappop(scheduled)
            handle._scheduled = False
            if handle._cancelled:
                self._timer_cancelled_count -= 1
            else:
                ready.append(handle)
        owners: list[str] = []
        firsts: dict[str, int] = {}
        for at, handle in enumerate(ready):
            owner = self._owner(handle)
            if owner not in firsts:
                firsts[owner] = at
                owners.append(owner)
        if not owners:
            return
        owner = owners[self.rng.randrange(len(owners))] if len(owners) > 1 else owners[0]
        handle = ready[firsts[owner]]
        del ready[firsts[owner]]
        if owner in self.dead:
            self.dropped.append(handle)  # held, never run
            return
        if not handle._cancelled:
            handle._run()

    def shutdown(self) -> None:
        """Close the loop and every task left, the killed processes' among them: their
        handlers run now, against a world that is gone, and whatever they raise is dropped."""
        self._ready.clear()
        self._scheduled.clear()
        self.close()
        hook, sys.unraisablehook = sys.unraisablehook, lambda unraisable: None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for tasks in self.tasks.values():
                    for task in tasks:
                        if not task.done():
                            with contextlib.suppress(BaseException):
                                task.get_coro().close()
                self.tasks.clear()
                self.dropped.clear()
                gc.collect()
        finally:
            sys.unraisablehook = hook
