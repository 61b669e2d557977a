"""Rate limits per actor and per (actor, tool), shared by every replica through Redis.

Declared in the namespace's gateway configuration (``--rate-limits FILE``, or JSON in
``UNWIND_RATE_LIMITS``; the operator writes it from the chart's values)::

    store: redis://unwind-redis:6379/0   # or "memory": this process only (one replica)
    actor: {requests: 600, per: 1m}      # each actor, all its calls
    tool: {requests: 60, per: 1m}        # each (actor, tool), unless `tools` names the tool
    tools: {stripe.create_charge: {requests: 5, per: 1m}}
    actors: {"system:serviceaccount:ci:batch": {requests: 6000, per: 1m}}
    when_store_down: {reads: refuse}     # or allow; mutating calls are always refused

Each limit is a GCRA bucket (the generic cell rate algorithm: a bucket of ``requests``
that refills evenly over ``per``). One call checks every bucket it touches in **one atomic
step** (a Lua script in Redis): it passes only when all have room, and only then takes one
from each, so a call refused by its tool's limit does not spend its actor's. Keys carry a
hash tag of the actor, so a Redis Cluster keeps both in one slot.

Answers: 429 ``rate_limited`` with ``Retry-After`` (REST) or the JSON-RPC error with the
request's id (MCP), and ``RateLimit-Policy`` / ``RateLimit`` headers (the IETF draft's
structured fields) on refusals and passes alike. Other actors are unaffected: their
buckets are their own. When the store cannot be reached, mutating calls fail closed (503
``limiter_unavailable``) and read-only calls follow ``when_store_down.reads`` (default
``refuse``); both are counted on /metrics. A refused call is recorded as ``refused`` and
nothing of it runs. Redis is imported only when a Redis store is configured.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..manifest.durations import parse_duration
from ..upstream.errors import Refusal
from .settings_text import read_settings

log = logging.getLogger("unwind.gateway.ratelimit")
STORE_TIMEOUT_S = 0.25


class LimitsConfigError(ValueError):
    """The rate-limit configuration is wrong; the message names the field."""


@dataclass(frozen=True)
class Limit:
    requests: int
    per_ms: int

    @property
    def interval_ms(self) -> float:
        return self.per_ms / self.requests

    def policy(self, name: str) -> str:
        return f'"{name}";q={self.requests};w={max(1, self.per_ms // 1000)}'


@dataclass(frozen=True)
class Bucket:
    name: str  # "actor" or "tool": the policy's name in the headers
    key: str
    limit: Limit


@dataclass(frozen=True)
class LimitsConfig:
    store: str = "memory"
    actor: Limit | None = None
    tool: Limit | None = None
    tools: Mapping[str, Limit] = field(default_factory=dict)
    actors: Mapping[str, Limit] = field(default_factory=dict)
    reads_when_down: str = "refuse"

    @classmethod
    def parse(cls, data: Any, where: str = "the rate limits") -> LimitsConfig:
        if not isinstance(data, dict):
            raise LimitsConfigError(f"{where}: give an object (store, actor, tool, tools, "
                                    "actors, when_store_down)")
        known = {"store", "actor", "tool", "tools", "actors", "when_store_down"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise LimitsConfigError(f"{where}: unknown field {', '.join(unknown)} (it takes "
                                    f"{', '.join(sorted(known))})")
        store = data.get("store", "memory")
        if not isinstance(store, str) or not (store == "memory" or store.startswith(
                ("redis://", "rediss://", "unix://"))):
            raise LimitsConfigError(f"{where}: store must be memory or a redis://, rediss:// or "
                                    "unix:// URL")
        down = data.get("when_store_down", {})
        reads = down.get("reads", "refuse") if isinstance(down, dict) else None
        if reads not in ("refuse", "allow") or (isinstance(down, dict) and set(down) - {"reads"}):
            raise LimitsConfigError(f"{where}: when_store_down takes {{reads: refuse|allow}} "
                                    "(mutating calls are always refused when the store is down)")
        maps = {}
        for name in ("tools", "actors"):
            raw = data.get(name, {})
            if not isinstance(raw, dict):
                raise LimitsConfigError(f"{where}: {name} must map names to limits")
            maps[name] = {str(k): _limit(v, f"{where}: {name}.{k}") for k, v in raw.items()}
        return cls(store=store, actor=_limit(data["actor"], f"{where}: actor")
                   if data.get("actor") is not None else None,
                   tool=_limit(data["tool"], f"{where}: tool")
                   if data.get("tool") is not None else None,
                   tools=maps["tools"], actors=maps["actors"], reads_when_down=reads)

    @classmethod
    def load(cls, text_or_path: str) -> LimitsConfig:
        data, where = read_settings(text_or_path, "UNWIND_RATE_LIMITS", "--rate-limits",
                                    LimitsConfigError)
        return cls.parse(data, where)

    def buckets(self, namespace: str, actor: str, tool: str) -> list[Bucket]:
        tag = hashlib.sha256(f"{namespace}\0{actor}".encode()).hexdigest()[:32]
        out = []
        limit = self.actors.get(actor, self.actor)
        if limit is not None:
            out.append(Bucket("actor", f"unwind:rl:{{{tag}}}:a", limit))
        limit = self.tools.get(tool, self.tool)
        if limit is not None:
            digest = hashlib.sha256(tool.encode()).hexdigest()[:24]
            out.append(Bucket("tool", f"unwind:rl:{{{tag}}}:t:{digest}", limit))
        return out


def _limit(value: Any, where: str) -> Limit:
    if not isinstance(value, dict) or set(value) != {"requests", "per"}:
        raise LimitsConfigError(f"{where}: give {{requests: N, per: DURATION}}, e.g. "
                                "{requests: 60, per: 1m}")
    requests = value["requests"]
    if not isinstance(requests, int) or isinstance(requests, bool) or not 1 <= requests <= 10**7:
        raise LimitsConfigError(f"{where}.requests must be a whole number from 1 to 10000000")
    try:
        per = parse_duration(value["per"])
    except ValueError as exc:
        raise LimitsConfigError(f"{where}.per {exc}") from None
    if not 1000 <= per <= 86_400_000:
        raise LimitsConfigError(f"{where}.per must be from 1s to 1d")
    return Limit(requests, per)


@dataclass(frozen=True)
class Verdict:
    """What the store said: whether every bucket had room, how long until the tightest one
    has room again, and per bucket (remaining, ms until it is full again)."""

    allowed: bool
    retry_ms: float
    states: Sequence[tuple[int, float]]


def gcra(tats: Sequence[float | None], limits: Sequence[Limit], now: float
         ) -> tuple[Verdict, list[float] | None]:
    """One atomic check of several buckets (the Lua script below does exactly this): the
    verdict, and the buckets' new theoretical arrival times when the call passes."""
    current = [max(t if t is not None else now, now) for t in tats]
    retry = 0.0
    for tat, limit in zip(current, limits, strict=True):
        over = tat - now - (limit.per_ms - limit.interval_ms)
        retry = max(retry, over)
    if retry > 0:
        states = [(max(0, math.floor((lim.per_ms - (t - now)) / lim.interval_ms)), t - now)
                  for t, lim in zip(current, limits, strict=True)]
        return Verdict(False, retry, states), None
    new = [t + lim.interval_ms for t, lim in zip(current, limits, strict=True)]
    states = [(max(0, math.floor((lim.per_ms - (t - now)) / lim.interval_ms)), t - now)
              for t, lim in zip(new, limits, strict=True)]
    return Verdict(True, 0.0, states), new


# The same arithmetic as gcra(), in one script: Redis runs it atomically.
LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local n = #KEYS
local tats, retry = {}, 0
for i = 1, n do
  local per, interval = tonumber(ARGV[2*i-1]), tonumber(ARGV[2*i])
  local tat = tonumber(redis.call('GET', KEYS[i]) or now)
  if tat < now then tat = now end
  tats[i] = tat
  local over = tat - now - (per - interval)
  if over > retry then retry = over end
end
local out = {retry > 0 and 0 or 1, tostring(retry)}
for i = 1, n do
  local per, interval = tonumber(ARGV[2*i-1]), tonumber(ARGV[2*i])
  local tat = tats[i]
  if retry <= 0 then
    tat = tat + interval
    redis.call('SET', KEYS[i], tostring(tat), 'PX', math.max(1, math.ceil(tat - now)))
  end
  local left = math.floor((per - (tat - now)) / interval)
  if left < 0 then left = 0 end
  out[#out+1] = left
  out[#out+1] = tostring(tat - now)
end
return out
"""


class StoreDown(Exception):
    """The limiter's store did not answer."""


class Store(Protocol):
    async def take(self, buckets: Sequence[Bucket]) -> Verdict: ...

    async def aclose(self) -> None: ...


class MemoryStore:
    """The buckets in this process (a sidecar, one replica, tests)."""

    def __init__(self, clock: Callable[[], float] = lambda: time.time() * 1000) -> None:
        self.clock = clock
        self._tats: dict[str, tuple[float, float]] = {}  # key -> (tat, expires)

    async def take(self, buckets: Sequence[Bucket]) -> Verdict:
        now = self.clock()
        tats = []
        for b in buckets:
            found = self._tats.get(b.key)
            tats.append(found[0] if found is not None and found[1] > now else None)
        verdict, new = gcra(tats, [b.limit for b in buckets], now)
        if new is not None:
            for b, tat in zip(buckets, new, strict=True):
                self._tats[b.key] = (tat, tat)
            if len(self._tats) > 100_000:
                self._tats = {k: v for k, v in self._tats.items() if v[1] > now}
        return verdict

    async def aclose(self) -> None:
        return None


class RedisStore:
    """The buckets in Redis (``redis.asyncio``, imported here only): one EVALSHA per call."""

    def __init__(self, url: str, timeout_s: float = STORE_TIMEOUT_S) -> None:
        import redis.asyncio as redis

        self.redis = redis
        self.client = redis.Redis.from_url(url, socket_timeout=timeout_s,
                                           socket_connect_timeout=timeout_s,
                                           health_check_interval=0, decode_responses=False)
        self.script = self.client.register_script(LUA)

    async def take(self, buckets: Sequence[Bucket]) -> Verdict:
        argv: list[float] = []
        for b in buckets:
            argv += [b.limit.per_ms, b.limit.interval_ms]
        try:
            out = await self.script(keys=[b.key for b in buckets], args=argv)
        except (self.redis.RedisError, OSError, TimeoutError) as exc:
            raise StoreDown(str(exc) or type(exc).__name__) from None
        states = [(int(out[i]), float(out[i + 1])) for i in range(2, len(out), 2)]
        return Verdict(int(out[0]) == 1, float(out[1]), states)

    async def aclose(self) -> None:
        await self.client.aclose()


@dataclass(frozen=True)
class Decision:
    refusal: Refusal | None  # None: the call goes on
    policy: str
    state: str
    retry_after: int | None = None

    def headers(self) -> list[tuple[str, str]]:
        out = [("RateLimit-Policy", self.policy)] if self.policy else []
        if self.state:
            out.append(("RateLimit", self.state))
        if self.retry_after is not None:
            out.append(("Retry-After", str(self.retry_after)))
        return out


class Limiter:
    def __init__(self, config: LimitsConfig, namespace: str, store: Store | None = None,
                 registry: Any = None) -> None:
        from prometheus_client import Counter

        self.config, self.namespace = config, namespace
        self.store = store or (MemoryStore() if config.store == "memory"
                               else RedisStore(config.store))
        self.limited = Counter("unwind_gateway_rate_limited", "Calls refused by a rate limit, "
                               "by the policy that refused them (actor or tool).", ["policy"],
                               registry=registry)
        self.down = Counter("unwind_gateway_rate_limit_store_down", "Calls decided while the "
                            "limiter's store could not be reached, by decision (refused, "
                            "allowed).", ["decision"], registry=registry)

    async def check(self, actor: str, tool: str, *, read_only: bool) -> Decision | None:
        buckets = self.config.buckets(self.namespace, actor, tool)
        if not buckets:
            return None
        policy = ", ".join(b.limit.policy(b.name) for b in buckets)
        try:
            verdict = await self.store.take(buckets)
        except StoreDown as exc:
            if read_only and self.config.reads_when_down == "allow":
                self.down.labels("allowed").inc()
                return Decision(None, policy, "")
            self.down.labels("refused").inc()
            log.warning("the rate limiter's store is down (%s): %s refused", exc, tool)
            what = "a read-only call (when_store_down.reads: refuse)" if read_only else \
                "a call that changes things"
            return Decision(Refusal("limiter_unavailable", f"the rate limiter cannot be "
                                    f"reached ({exc}), and {what} is refused then: try again"),
                            policy, "", 1)
        tight = min(range(len(buckets)), key=lambda i: verdict.states[i][0])
        left, reset_ms = verdict.states[tight]
        state = f'"{buckets[tight].name}";r={left};t={max(0, math.ceil(reset_ms / 1000))}'
        if verdict.allowed:
            return Decision(None, policy, state)
        refusing = [b for b, s in zip(buckets, verdict.states, strict=True) if s[0] == 0] or \
            [buckets[tight]]
        for b in refusing:
            self.limited.labels(b.name).inc()
        retry = max(1, math.ceil(verdict.retry_ms / 1000))
        named = " and ".join(f"{b.name} limit ({b.limit.requests} per "
                             f"{b.limit.per_ms // 1000}s)" for b in refusing)
        return Decision(Refusal("rate_limited", f"{actor} is over its {named} for {tool}: "
                                f"try again in {retry}s (Retry-After)"), policy, state, retry)

    async def aclose(self) -> None:
        await self.store.aclose()
