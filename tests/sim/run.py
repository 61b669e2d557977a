"""One seeded run: an agent's calls through two gateways, approvals, rollbacks, kills and
lost writes, then the checks (``check.py``).

A run is one world, with the file store (local mode: ``unwind rollback --ledger``) or the
cluster store (the operator's rollback and lookups), chosen by the seed's parity. It has
three phases: ``chaos`` (random actions and faults, at random virtual moments), ``calls
over`` (no new action; what is in flight finishes; the first check), and ``settled``
(faults off, time past every lock grace and timeout, a final rollback of every run, at
most three times; the second check).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import random
import shutil
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

from unwind.gateway.enforce import CallRequest, CallResult
from unwind.ledger.entry import Entry
from unwind.ledger.entry import now as real_now
from unwind.ledger.stepinput import ledger_identity, step_key

from . import actors
from .check import agreement, summary
from .loop import EPOCH, SimLoop
from .upstream import Breach
from .world import NS, Rates, Script, World

RUNS = ["run-a", "run-b"]
ACTIONS = {"call": 30, "repeat": 10, "renew": 10, "repeat_approved": 6, "approve": 10,
           "rollback": 7, "kill_gateway": 5, "power_cut": 2, "kill_operator": 2,
           "kill_pod": 2, "kill_rollback": 2}


@dataclass
class Intent:
    run: str
    entry: str
    tool: str
    args: dict[str, Any]


@dataclass
class Result:
    seed: int
    kind: str
    breaches: list[dict[str, Any]]
    trace: list[str]
    steps: int = 0
    scripted: bool = False  # a scenario's own body: the seed alone does not replay it

    @property
    def ok(self) -> bool:
        return not self.breaches


class Agent:
    def __init__(self, world: World, gateways: list[actors.GatewayProcess]) -> None:
        self.world, self.gateways = world, gateways
        self.intents: list[Intent] = []
        self.awaiting: list[Intent] = []
        self.tasks: list[tuple[str, asyncio.Task[None]]] = []
        self.n = 0

    def fresh(self) -> Intent:
        rng = self.world.rng
        self.n += 1
        tool = rng.choices(["vault.wire", "pay.charge", "box.create", "cfg.set"], [2, 4, 2, 3])[0]
        run = rng.choice(RUNS)
        args: dict[str, Any] = {
            "vault.wire": lambda: {"order": rng.randint(1, 2), "amount": 100},
            "pay.charge": lambda: {"order": rng.randint(1, 2), "amount": 5},
            # a key scoped to a run reaches the upstream as it is: it names the run itself,
            # or two runs' boxes would be one key to the upstream (and to its lookup)
            "box.create": lambda: {"name": f"{run}-{rng.choice('xy')}"},
            "cfg.set": lambda: {"id": f"{run}-{rng.randint(1, 2)}", "value": f"v{self.n}"},
        }[tool]()
        return self._new(Intent(run, f"e{self.n}", tool, args))

    def renew(self, old: Intent) -> Intent:
        """The same call again under a new Idempotency-Key (a retry that forgot the key)."""
        self.n += 1
        return self._new(Intent(old.run, f"e{self.n}", old.tool, dict(old.args)))

    def _new(self, intent: Intent) -> Intent:
        intent.args["call"] = f"{intent.run}/{intent.entry}/{self.n}"
        self.intents.append(intent)
        return intent

    def send(self, intent: Intent) -> None:
        w = self.world
        alive = [g for g in self.gateways if g.gateway is not None]
        if not alive:
            return
        gw = w.rng.choice(alive)
        w.trace(f"agent -> {gw.proc}: {intent.tool} {intent.run}/{intent.entry} "
                f"{ {k: v for k, v in intent.args.items() if k != 'call'} }")

        def done(result: CallResult) -> None:
            error = result.body.get("error", {}) if isinstance(result.body, dict) else {}
            w.trace(f"agent <- {intent.run}/{intent.entry}: {result.status} {error.get('code', '')}")
            if result.status == 428 and intent not in self.awaiting:
                self.awaiting.append(intent)
            if result.status >= 500 and result.status != 503 and not error:
                w.crashes.append(f"{intent.run}/{intent.entry}: {result.status} {result.body}")
        task = gw.call(CallRequest(intent.tool, dict(intent.args), intent.run, intent.entry), done)
        if task is not None:
            self.tasks.append((gw.proc, task))

    def recent(self) -> Intent | None:
        if not self.intents:
            return None
        return self.world.rng.choice(self.intents[-4:])


class Driver:
    def __init__(self, world: World) -> None:
        self.world = world
        self.gateways = [actors.GatewayProcess(world, f"gw{i}") for i in (1, 2)]
        self.agent = Agent(world, self.gateways)
        self.operator = actors.Operator(world, RUNS) if world.kind == "cluster" else None
        self.rollbacks: list[tuple[str, asyncio.Task[Any]]] = []
        self.counter = itertools.count(1)

    def later(self, seconds: float, then: Any) -> None:
        self.world.loop.call_later(seconds, then)

    def start(self) -> None:
        for g in self.gateways:
            g.start()
        if self.operator is not None:
            self.operator.start()

    async def chaos(self, actions: int) -> None:
        rng = self.world.rng
        self.start()
        names = list(ACTIONS)
        weights = [ACTIONS[n] for n in names]
        for _ in range(actions):
            await asyncio.sleep(rng.expovariate(1 / 2.0))
            getattr(self, f"do_{rng.choices(names, weights)[0]}")()

    def do_call(self) -> None:
        self.agent.send(self.agent.fresh())

    def do_repeat(self) -> None:
        if (intent := self.agent.recent()) is not None:
            self.agent.send(intent)

    def do_renew(self) -> None:
        if (intent := self.agent.recent()) is not None:
            self.agent.send(self.agent.renew(intent))

    def do_repeat_approved(self) -> None:
        for intent in list(self.agent.awaiting):  # the agent repeats what it waited for at once
            self.agent.send(intent)

    def do_approve(self) -> None:
        if self.agent.awaiting:
            intent = self.world.rng.choice(self.agent.awaiting)
            n = next(self.counter)
            self.world.loop.spawn(f"approver.{n}", actors.approve(self.world, intent.run, intent.entry, n))

    def do_rollback(self) -> None:
        w, n = self.world, next(self.counter)
        run = w.rng.choice(RUNS)
        if w.kind == "file":
            proc = f"rollback.{n}"
            self.rollbacks.append((proc, w.loop.spawn(proc, actors.local_rollback(w, run, proc))))
        else:
            w.loop.spawn(f"kubectl.{n}", actors.request_rollback(w, run, n))

    def do_kill_gateway(self) -> None:
        alive = [g for g in self.gateways if g.gateway is not None]
        if alive:
            g = self.world.rng.choice(alive)
            g.kill()
            self.later(self.world.rng.uniform(1, 40), g.start)

    def do_power_cut(self) -> None:
        w = self.world
        if w.kind != "file":
            return self.do_kill_operator()
        w.trace("power cut")
        for g in self.gateways:
            if g.gateway is not None:
                g.kill()
        for proc, task in self.rollbacks:
            if not task.done():
                w.loop.kill(proc)
        w.power_cut()
        for g in self.gateways:
            self.later(w.rng.uniform(1, 20), g.start)

    def do_kill_operator(self) -> None:
        if self.operator is None:
            return self.do_kill_rollback()
        self.operator.kill()
        self.later(self.world.rng.uniform(1, 30), self.operator.start)

    def do_kill_pod(self) -> None:
        running = [n for n, j in self.world.jobs.items() if j["phase"] == "running"]
        if running:
            actors.kill_pod(self.world, self.world.rng.choice(running))

    def do_kill_rollback(self) -> None:
        running = [(p, t) for p, t in self.rollbacks if not t.done() and self.world.loop.alive(p)]
        if running:
            proc, _ = self.world.rng.choice(running)
            self.world.loop.kill(proc)
            self.world.trace(f"{proc} killed")

    async def calls_over(self) -> None:
        loop = self.world.loop
        for _ in range(100):
            busy = [t for p, t in self.agent.tasks + self.rollbacks if not t.done() and loop.alive(p)]
            if not busy:
                return
            await asyncio.sleep(5)

    async def settle(self) -> None:
        w = self.world
        w.faults.rates = Rates.none()
        for g in self.gateways:
            if g.gateway is None:
                g.start()
        if self.operator is not None and not w.loop.alive(self.operator.proc):
            self.operator.start()
        await asyncio.sleep(120)  # past every lock grace, capture and Job
        for attempt in range(3):
            if attempt and not self.unsettled():
                return
            for run in RUNS:
                if w.kind == "file":
                    proc = f"final-rollback.{run}.{attempt}"
                    await w.loop.spawn(proc, actors.local_rollback(w, run, proc))
                elif await actors.request_rollback(w, run, next(self.counter)):
                    await self.rolled_back(run)

    async def rolled_back(self, run: str) -> None:
        for _ in range(200):
            obj = self.world.api_server.ledger(run) or {}
            rb = (obj.get("status") or {}).get("rollback") or {}
            if rb.get("finished") and rb.get("generation") == obj["metadata"].get("generation"):
                return
            await asyncio.sleep(5)

    def ledgers(self) -> dict[str, list[Entry]]:
        w = self.world
        if w.kind == "cluster":
            return {run: w.api_server.entries(run) for run in RUNS}
        store = w.file_store()
        return {run: store.entries_sync(run) for run in RUNS if (w.root / f"{run}.json").exists()}

    def unsettled(self) -> bool:
        return any(e.state in ("pending", "uncertain", "undoing", "undo_failed")
                   for entries in self.ledgers().values() for e in entries)

    def owners(self) -> dict[str, str]:
        """Each undo step's idempotency key -> the entry it undoes (run/entry)."""
        w, out = self.world, {}
        for run, entries in self.ledgers().items():
            if w.kind == "cluster":
                uid = (w.api_server.ledger(run) or {}).get("metadata", {}).get("uid")
                identity = ledger_identity(NS, uid, entries)
            else:
                meta = json.loads((w.root / f"{run}.json").read_bytes()).get("metadata") or {}
                identity = ledger_identity(None, meta.get("uid"), entries)
            for e in entries:
                for action in ("inverse", "compensate", "discard"):
                    out[step_key(identity, e.id, action)] = f"{run}/{e.id}"
        return out

    def check(self, phase: str, *, final: bool) -> list[Breach]:
        return agreement(self.world.ground, self.ledgers(), phase, self.world.loop.time(),
                         final=final)


@contextlib.contextmanager
def deterministic(seed: int) -> Iterator[None]:
    """What production code draws from the machine (the time, ids, jitter) drawn from the
    run instead, so that a seed replays exactly."""
    ids = random.Random(seed)

    def now() -> Any:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return EPOCH
        return loop.now() if isinstance(loop, SimLoop) else real_now()
    counter = itertools.count(1)
    fake_uuid = mock.Mock(uuid4=lambda: uuid.UUID(int=ids.getrandbits(128)))
    logging.disable(logging.CRITICAL)  # the gateways' errors are the simulation's daily bread
    with mock.patch("unwind.ledger.entry.now", now), mock.patch("unwind.ledger.filestore.now", now), \
            mock.patch("unwind.ledger.clusterstore.now", now), \
            mock.patch("unwind.ledger.clusterstore.random", random.Random(seed)), \
            mock.patch("unwind.ledger.filestore.uuid", fake_uuid), \
            mock.patch("unwind.gateway.enforce.new_ulid", lambda: f"ULID{next(counter):06d}"):
        try:
            yield
        finally:
            logging.disable(logging.NOTSET)


def shm() -> str | None:
    """A memory-backed folder for the file store, where there is one: fsync costs nothing."""
    return "/dev/shm" if Path("/dev/shm").is_dir() else None


Body = Callable[[Driver], Awaitable[None]]


def run(seed: int, *, actions: int = 24, rates: Rates | None = None, kind: str | None = None,
        body: Body | None = None, script: Script | None = None) -> Result:
    """Run one world; ``body`` (default: ``Driver.chaos``) acts, then the checks run. A
    scenario test gives its own body and ``script`` (fixed latencies), with no random fault."""
    kind = kind or ("file" if seed % 2 == 0 else "cluster")
    root = Path(tempfile.mkdtemp(prefix=f"unwind-sim-{seed}-", dir=shm()))
    loop = SimLoop(seed)
    world = World(seed, loop, kind, root / "ledgers", rates or (Rates.none() if body else Rates()))
    world.faults.script = script or Script()
    driver = Driver(world)
    breaches: list[Breach] = []
    owners: dict[str, str] = {}

    async def main() -> None:
        await (body(driver) if body is not None else driver.chaos(actions))
        await driver.calls_over()
        breaches.extend(driver.check("after the calls", final=False))
        await driver.settle()
        breaches.extend(driver.check("after the final rollback", final=True))
        owners.update(driver.owners())

    try:
        with deterministic(seed):
            loop.run_until_complete(loop.create_task(main()))
    except Exception as exc:  # a crash of an actor or of the harness is a finding too
        world.crashes.append(f"{type(exc).__name__}: {exc}")
    finally:
        loop.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    grace = actors.SETTINGS.lock_grace.total_seconds()
    found = summary(world.ground.breaches + breaches, world.ground, owners, grace)
    found += [{"invariant": "crash", "bug": "other", "at": loop.time(), "message": c}
              for c in world.crashes]
    return Result(seed, kind, found, world.lines, loop.steps, body is not None)
