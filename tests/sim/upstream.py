"""The recording fake upstream: the ground truth every invariant is checked against.

It serves the tools of ``tools.py`` as an upstream service would, in a process of its own
(``upstream``): a request sent is applied after its latency even if the caller died or
gave up (timed out) meanwhile, and its answer may be lost on the way back. It never
deduplicates an effect by its key (an upstream that did would hide exactly the double
calls Unwind promises to prevent); an undo carrying the key of the undo that already took
an effect back is a retry and is answered as done again.

What it records: every effect (its id, tool, key within its scope, the call that made it),
whether it stands or was undone and by which undo's key, and every breach it sees as it
happens: a second effect under a key whose first still stands (``at_most_once``), an
effect undone a second time by another undo (``undo_twice``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from unwind.upstream.client import Answer, Prepared, Upstream

from .loop import SimLoop
from .tools import EFFECT_TOOLS

ACTOR = "sim-agent"


@dataclass
class Effect:
    id: str
    tool: str
    key: str | None
    scope_key: tuple[str, ...] | None
    call: str  # the intent that made it: "<run>/<entry>/<n>"
    at: float
    undone_by: str | None = None
    undone_at: float | None = None
    before: Any = None

    @property
    def live(self) -> bool:
        return self.undone_by is None


@dataclass
class Breach:
    invariant: str
    message: str
    at: float
    tool: str = ""
    effects: tuple[str, ...] = ()
    key: str | None = None
    undo_keys: tuple[str, ...] = ()  # undo_twice: the first undo's key, then the second's
    entry: str = ""  # ledger_disagrees, stuck: "<run>/<entry>"


@dataclass
class Ground:
    """What really happened at the upstream."""

    effects: dict[str, Effect] = field(default_factory=dict)
    breaches: list[Breach] = field(default_factory=list)
    in_flight: dict[str, int] = field(default_factory=dict)  # effect requests by key, unanswered
    lookups_during_calls: list[tuple[float, str]] = field(default_factory=list)
    slow_captures: list[float] = field(default_factory=list)
    broken_locks: list[tuple[float, str, float]] = field(default_factory=list)  # (at, lock, age)
    undo_keys: list[tuple[str, str]] = field(default_factory=list)  # (effect, key) per undo
    values: dict[str, Any] = field(default_factory=dict)  # cfg ids -> value
    count: int = 0

    def live_under(self, scope_key: tuple[str, ...]) -> list[Effect]:
        return [e for e in self.effects.values() if e.scope_key == scope_key and e.live]


def scope_key(m_scope: str, tool: str, key: str, call: str) -> tuple[str, ...]:
    run = call.split("/", 1)[0]
    where = {"run": run, "actor": ACTOR, "global": ""}[m_scope]
    return (tool, m_scope, where, key)


class SimUpstream(Upstream):
    """The gateway's and the step runner's ``Upstream``, its HTTP replaced by the fake: the
    production ``send`` (attempts, backoff) runs as it is."""

    def __init__(self, world: Any, who: str) -> None:
        super().__init__()
        self.world, self.who = world, who

    async def _http(self, p: Prepared) -> Answer:
        loop: SimLoop = self.world.loop
        latency, lost = self.world.faults.upstream(p)
        answer: asyncio.Future[Answer] = loop.create_future()
        loop.spawn("upstream", self.world.server.serve(p, answer, latency, lost))
        try:
            return await asyncio.wait_for(answer, p.timeout_s)
        except TimeoutError:
            return Answer("timeout", text=f"{p.where}: no answer within {p.timeout_s:g}s")


class Server:
    """The upstream's side: applies each request after its latency."""

    def __init__(self, world: Any) -> None:
        self.world = world
        self.ground = Ground()

    async def serve(self, p: Prepared, answer: asyncio.Future[Answer], latency: tuple[float, float],
                    lost: bool) -> None:
        g, tool = self.ground, p.manifest.tool
        key = p.headers.get("Idempotency-Key")
        effectful = tool in EFFECT_TOOLS
        if effectful and key:
            g.in_flight[key] = g.in_flight.get(key, 0) + 1
        try:
            await asyncio.sleep(latency[0])
            status, data = self.apply(p, key)
            self.world.trace(f"upstream {tool} {_short(p.arguments)} key={key} -> {status} "
                             f"{_short(data)}{' (answer lost)' if lost else ''}")
            await asyncio.sleep(latency[1])
        finally:
            if effectful and key:
                g.in_flight[key] -= 1
        if answer.done():
            return  # the caller timed out: the effect stands all the same
        if lost:
            answer.set_result(Answer("lost", text=f"{p.where}: the connection was reset"))
        elif 200 <= status < 300:
            answer.set_result(Answer("ok", status, data))
        else:
            answer.set_result(Answer("error_status", status, data, str(data)))

    # ---- the tools ----

    def apply(self, p: Prepared, key: str | None) -> tuple[int, Any]:
        g, tool, args = self.ground, p.manifest.tool, p.arguments
        loop: SimLoop = self.world.loop
        if tool in EFFECT_TOOLS:
            return self._effect(p, key)
        if tool.endswith(".find"):
            wanted = {"vault.find": "vault.wire", "pay.find": "pay.charge", "box.find": "box.create",
                      "cfg.find": "cfg.set"}[tool]
            if g.in_flight.get(str(args.get("key")), 0):
                g.lookups_during_calls.append((loop.time(), str(args.get("key"))))
            live = [e for e in g.effects.values()
                    if e.tool == wanted and e.key == args.get("key") and e.live]
            if not live:
                return 404, {"error": "no such effect"}
            field_name = EFFECT_TOOLS[wanted] or "wire"
            return 200, {field_name: live[-1].id}
        if tool in ("pay.get", "box.get"):
            found = g.effects.get(str(args.get("id")))
            if found is None or (tool == "box.get" and not found.live):
                return 404, {"error": "not found"}
            return 200, {"id": found.id, "refunded": not found.live}
        if tool == "cfg.read":
            return 200, {"id": args.get("id"), "value": g.values.get(str(args.get("id")), "v0")}
        undo_of = {"pay.refund": "charge_id", "box.delete": "id", "cfg.restore": "change"}
        if tool in undo_of:
            return self._undo(p, str(args.get(undo_of[tool])), key)
        return 400, {"error": f"no tool {tool}"}

    def _effect(self, p: Prepared, key: str | None) -> tuple[int, Any]:
        g, m, tool, args = self.ground, p.manifest, p.manifest.tool, p.arguments
        loop: SimLoop = self.world.loop
        call = str(args.get("call"))
        sk = scope_key(m.idempotency.scope, tool, key, call) if m.idempotency and key else None
        g.count += 1
        effect = Effect(f"{tool.split('.')[0]}-{g.count}", tool, key, sk, call, loop.time())
        if sk is not None:
            standing = g.live_under(sk)
            if standing:
                g.breaches.append(Breach(
                    "at_most_once", f"{tool} applied again under key {key!r} ({sk[1]} scope) by "
                    f"call {call} while {standing[0].id} of call {standing[0].call} stands",
                    loop.time(), tool, (standing[0].id, effect.id), key))
        if tool == "cfg.set":
            effect.before = g.values.get(str(args.get("id")), "v0")
            g.values[str(args.get("id"))] = args.get("value")
        g.effects[effect.id] = effect
        field_name = EFFECT_TOOLS[tool] or "wire"
        return 200, {field_name: effect.id, "ok": True}

    def _undo(self, p: Prepared, effect_id: str, key: str | None) -> tuple[int, Any]:
        g, tool = self.ground, p.manifest.tool
        loop: SimLoop = self.world.loop
        effect = g.effects.get(effect_id)
        if effect is None:
            return 404, {"error": f"no effect {effect_id}"}
        g.undo_keys.append((effect_id, str(key)))
        if not effect.live:
            if key is not None and key == effect.undone_by:
                return 200, {"id": effect_id, "again": True}  # a retry of the same undo
            g.breaches.append(Breach(
                "undo_twice", f"{tool} undid {effect_id} (of call {effect.call}) a second time "
                f"with key {key}, after {effect.undone_by} undid it at {effect.undone_at:.3f}",
                loop.time(), effect.tool, (effect_id,), effect.key, (str(effect.undone_by), str(key))))
            return 200, {"id": effect_id}
        effect.undone_by, effect.undone_at = key or f"(no key) at {loop.time():.3f}", loop.time()
        if tool == "cfg.restore":
            g.values[str(p.arguments.get("id"))] = p.arguments.get("value")
        return 200, {"id": effect_id}


def _short(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{v}" for k, v in value.items() if k != "call") + "}"
    return str(value)
