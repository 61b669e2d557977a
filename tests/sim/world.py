"""One simulated world: the loop, the faults, the stores' backends, the upstream, the trace.

Faults, each drawn from the world's seeded generator:

- upstream: latency before and after the effect is applied (sometimes past the caller's
  timeout: the effect lands after the caller gave up), a lost answer (applied, the answer
  never arrives), and a slow capture read (``cfg.read``, past the gateway's lock_grace);
- API server (cluster store, operator): a request that fails before it is applied, or
  whose answer is lost after it was applied, and latency on both legs;
- file store: a write that fails before it is applied, a delayed write, and the power
  cut (``power_cut``): every record not yet synced is lost, as the file store's
  durability rules allow;
- processes: a kill at any await (``SimLoop.kill``), then a restart with empty memory.
"""

from __future__ import annotations

import asyncio
import copy
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.fake_apiserver import FakeApiServer
from unwind.ledger.entry import Entry
from unwind.ledger.filestore import FileStore
from unwind.ledger.lifecycle import AnyWrite
from unwind.ledger.store import StoreUnavailable
from unwind.upstream.client import Prepared

from .loop import SimLoop
from .tools import Catalogue, manifests, versions
from .upstream import Server

NS = "agents"


@dataclass
class Rates:
    """How often each fault strikes (per request, per write)."""

    lost_answer: float = 0.06
    late_answer: float = 0.06  # past the caller's timeout
    slow_capture: float = 0.2
    api_fails: float = 0.03  # before it is applied
    api_lost: float = 0.03  # applied, answer lost
    store_fails: float = 0.02
    store_slow: float = 0.03  # a write that takes tens of seconds

    @classmethod
    def none(cls) -> Rates:
        return cls(0, 0, 0, 0, 0, 0, 0)


@dataclass
class Script:
    """Fixed latencies for a scenario test: an upstream tool's (before, after) its effect,
    and a store write's (by what it writes, "update run-b/e2"), in virtual seconds."""

    upstream: dict[str, tuple[float, float]] = field(default_factory=dict)
    store: dict[str, float] = field(default_factory=dict)


class Faults:
    def __init__(self, rng: random.Random, rates: Rates, world: World) -> None:
        self.rng, self.rates, self.world = rng, rates, world
        self.script = Script()

    def _hit(self, rate: float) -> bool:
        return rate > 0 and self.rng.random() < rate

    def upstream(self, p: Prepared) -> tuple[tuple[float, float], bool]:
        r = self.rates
        first, second = self.rng.expovariate(1 / 0.2), self.rng.expovariate(1 / 0.1)
        if p.manifest.tool == "cfg.read" and self._hit(r.slow_capture):
            first = self.rng.uniform(25, 44)
            if first + second > 30:
                self.world.ground.slow_captures.append(self.world.loop.time())
        elif self._hit(r.late_answer):
            first = p.timeout_s * self.rng.uniform(0.5, 1.5)
            second = p.timeout_s * self.rng.uniform(0, 1)
        lost = p.manifest.effect != "read_only" and self._hit(r.lost_answer)
        scripted = self.script.upstream.get(p.manifest.tool)
        return (scripted or (first, second)), lost

    def api(self) -> str | None:
        if self._hit(self.rates.api_fails):
            return "before"
        if self._hit(self.rates.api_lost):
            return "after"
        return None

    def store(self, what: str) -> tuple[bool, float]:
        """(fails before it is applied, seconds it takes)."""
        slow = self.rng.uniform(5, 40) if self._hit(self.rates.store_slow) else \
            self.rng.expovariate(1 / 0.005)
        return self._hit(self.rates.store_fails), self.script.store.get(what, slow)


class World:
    def __init__(self, seed: int, loop: SimLoop, kind: str, root: Path, rates: Rates) -> None:
        self.seed, self.loop, self.kind, self.root = seed, loop, kind, root
        self.rng = random.Random(seed * 7919 + 1)
        self.faults = Faults(self.rng, rates, self)
        self.tools = manifests()
        self.catalogue = Catalogue(self.tools)
        self.versions = versions(self.tools)
        self.api_server = FakeApiServer(delay=0, namespace=NS)
        self.server = Server(self)
        self.ground = self.server.ground
        self.lines: list[str] = []
        self.durable: dict[str, int] = {}  # journal -> bytes synced (the file store)
        self.jobs: dict[str, dict[str, Any]] = {}  # the cluster's undo Jobs
        self.crashes: list[str] = []  # an actor raised what it must not

    def now(self) -> datetime:
        return self.loop.now()

    def trace(self, line: str) -> None:
        from .loop import PROCESS
        self.lines.append(f"{self.loop.time():9.3f} {PROCESS.get():<12} {line}")

    # ---- the stores' backends ----

    def file_store(self) -> SimFileStore:
        return SimFileStore(self.root, self.durable)

    def power_cut(self) -> None:
        """Every record not yet synced is lost (the processes are killed by the caller)."""
        for path in sorted(self.root.glob("*.journal")):
            keep = self.durable.get(str(path), 0)
            if path.stat().st_size > keep:
                self.trace(f"power cut: {path.name} loses {path.stat().st_size - keep} bytes")
                os.truncate(path, keep)


class SimFileStore(FileStore):
    """The file store as it is, telling the world how much of each journal is synced."""

    def __init__(self, root: Path, durable: dict[str, int]) -> None:
        super().__init__(root)
        self.durable = durable

    def _append(self, state: Any, texts: list[str], *, sync: bool) -> None:
        created = state.journal is None
        super()._append(state, texts, sync=sync)
        if sync or created:
            self.durable[state.journal_file] = state.offset

    def _fold(self, state: Any) -> None:
        super()._fold(state)
        self.durable[state.journal_file] = 0


class FaultyStore:
    """A file store's writes, some failing before they are applied, some delayed."""

    def __init__(self, world: World, inner: FileStore) -> None:
        self.world, self.inner = world, inner

    async def _fault(self, what: str) -> None:
        fails, seconds = self.world.faults.store(what)
        await asyncio.sleep(seconds)
        if fails:
            self.world.trace(f"store {what} fails (nothing written)")
            raise StoreUnavailable("simulated: the disk refused the write")

    async def get(self, run: str, entry_id: str) -> Entry | None:
        return await self.inner.get(run, entry_id)

    async def create(self, run: str, entry: Entry, *, max_entries: int | None = None) -> Entry:
        await self._fault(f"create {run}/{entry.id}")
        return await self.inner.create(run, entry, max_entries=max_entries)

    async def transition(self, run: str, entry_id: str, write: AnyWrite) -> Entry:
        await self._fault(f"update {run}/{entry_id}")
        return await self.inner.transition(run, entry_id, write)

    async def entries(self, run: str) -> list[Entry]:
        return await self.inner.entries(run)

    async def owner(self, run: str) -> str | None:
        return await self.inner.owner(run)


class SimApi:
    """An ``Api`` whose requests are served by the fake API server in its own process
    (``apiserver``): applied after a latency even if the caller died meanwhile."""

    def __init__(self, world: World) -> None:
        self.world = world

    async def request(self, method: str, path: str, body: Any = None, *,
                      content_type: str = "application/json",
                      accept: str = "application/json") -> tuple[int, Any]:
        w = self.world
        fault = w.faults.api()
        there, back = w.rng.expovariate(1 / 0.002), w.rng.expovariate(1 / 0.002)
        if fault == "before":
            await asyncio.sleep(there)
            w.trace(f"api {method} {_tail(path)}: connection refused (not applied)")
            raise ConnectionRefusedError("simulated: the API server did not answer")
        answer: asyncio.Future[tuple[int, Any]] = w.loop.create_future()
        w.loop.spawn("apiserver", self._serve(answer, method, path, copy.deepcopy(body), there,
                                                  back))
        status, data = await answer
        if fault == "after":
            w.trace(f"api {method} {_tail(path)}: applied ({status}), answer lost")
            raise ConnectionResetError("simulated: the answer was lost")
        return status, data

    async def _serve(self, answer: asyncio.Future[tuple[int, Any]], method: str, path: str,
                     body: Any, there: float, back: float) -> None:
        await asyncio.sleep(there)
        result = self.world.api_server.handle(method, path, body)
        await asyncio.sleep(back)
        if not answer.done():
            answer.set_result(result)


def _tail(path: str) -> str:
    return "/".join(path.split("?")[0].split("/")[-2:])


Actor = Callable[..., Any]
