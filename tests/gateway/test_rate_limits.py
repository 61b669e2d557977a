"""Rate limits per actor and per (actor, tool), through a real Redis (Debian's
redis-server): the arithmetic (the Lua script agrees with the pure GCRA step), one atomic
check of every bucket a call touches, the answers (429 with Retry-After and RateLimit
headers, the MCP JSON-RPC error), two gateway processes sharing one limit, and the store
down (mutating calls 503, reads as declared)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from unwind.gateway.ratelimit import (
    Bucket,
    Limit,
    Limiter,
    LimitsConfig,
    LimitsConfigError,
    MemoryStore,
    RedisStore,
    gcra,
)

from .auth_parts import Redis, running_redis, start_redis
from .conftest import GatewayProc, UpstreamProc, start_gateway, stop

COMMENT = {"repo": "octo/hello", "issue": 7, "client_id": "c1", "body": "looks good"}


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Redis]:
    with running_redis(tmp_path_factory.mktemp("redis")) as r:
        yield r


def test_a_limit_lets_its_requests_through_then_refuses_until_one_has_refilled() -> None:
    limit = Limit(3, 3000)
    tats: list[float | None] = [None]
    answers = []
    for now in (0, 1, 2, 3, 1000, 1001):
        verdict, new = gcra(tats, [limit], now)
        answers.append((verdict.allowed, round(verdict.retry_ms)))
        if new is not None:
            tats = list(new)
    assert answers == [(True, 0), (True, 0), (True, 0), (False, 997), (True, 0), (False, 999)]


async def test_the_redis_script_decides_exactly_as_the_pure_step(redis: Redis) -> None:
    store = RedisStore(redis.url)
    buckets = [Bucket("actor", "unwind:rl:{t1}:a", Limit(5, 60_000)),
               Bucket("tool", "unwind:rl:{t1}:t:x", Limit(2, 60_000))]
    try:
        seen = [(await store.take(buckets)).allowed for _ in range(4)]
        assert seen == [True, True, False, False]
        # the refusals by the tool's bucket spent nothing of the actor's: 3 left of 5
        other = [Bucket("actor", "unwind:rl:{t1}:a", Limit(5, 60_000))]
        assert [(await store.take(other)).allowed for _ in range(4)] == [True, True, True, False]
    finally:
        await store.aclose()


async def test_a_call_refused_by_one_bucket_spends_none_of_the_others() -> None:
    store = MemoryStore(clock=lambda: 0.0)
    actor = Bucket("actor", "a", Limit(10, 60_000))
    tool = Bucket("tool", "t", Limit(1, 60_000))
    assert (await store.take([actor, tool])).allowed
    for _ in range(5):
        assert not (await store.take([actor, tool])).allowed
    assert (await store.take([actor])).states[0][0] == 8  # 10 - the one call that ran - this one


def test_a_configuration_with_a_typo_is_refused_naming_the_field() -> None:
    with pytest.raises(LimitsConfigError, match="unknown field actr"):
        LimitsConfig.parse({"actr": {"requests": 1, "per": "1m"}})
    with pytest.raises(LimitsConfigError, match=r"tools\.x\.per"):
        LimitsConfig.parse({"tools": {"x": {"requests": 1, "per": "soon"}}})
    with pytest.raises(LimitsConfigError, match="when_store_down"):
        LimitsConfig.parse({"when_store_down": {"writes": "allow"}})


async def test_other_actors_keep_their_own_buckets() -> None:
    limiter = Limiter(LimitsConfig.parse({"actor": {"requests": 1, "per": "1m"}}), "ns")
    assert (await limiter.check("alice", "t", read_only=False)).refusal is None  # type: ignore[union-attr]
    refused = await limiter.check("alice", "t", read_only=False)
    assert refused is not None and refused.refusal is not None
    assert refused.refusal.code == "rate_limited" and refused.retry_after == 60
    assert (await limiter.check("bob", "t", read_only=False)).refusal is None  # type: ignore[union-attr]


async def test_with_the_store_down_changes_are_refused_and_reads_follow_the_declared_choice(
        tmp_path: Path) -> None:
    dead = "redis://127.0.0.1:9/0"  # nothing listens on the discard port
    for reads, read_refused in (("refuse", True), ("allow", False)):
        limiter = Limiter(LimitsConfig.parse({"store": dead, "actor": {"requests": 9, "per": "1m"},
                                              "when_store_down": {"reads": reads}}), "ns")
        write = await limiter.check("a", "t", read_only=False)
        read = await limiter.check("a", "t", read_only=True)
        assert write is not None and write.refusal is not None
        assert write.refusal.code == "limiter_unavailable" and write.refusal.status == 503
        assert read is not None and (read.refusal is not None) is read_refused
        await limiter.aclose()


# ---- the doors, two gateway processes, one Redis ----

def limits(redis_url: str) -> str:
    return json.dumps({"store": redis_url, "actor": {"requests": 100, "per": "1m"},
                       "tools": {"github.create_comment": {"requests": 3, "per": "1m"}}})


@pytest.fixture
def two_gateways(manifests: Path, redis: Redis, tmp_path: Path) -> Iterator[list[GatewayProc]]:
    import uuid
    config = limits(redis.url)
    actor = f"agent-{uuid.uuid4().hex[:6]}"  # fresh buckets for each test
    gws = [start_gateway(manifests, tmp_path / "ledger", tmp_path, "--rate-limits", config,
                         "--actor", actor) for _ in range(2)]
    try:
        yield gws
    finally:
        for gw in gws:
            stop(gw.proc)


def test_two_gateways_enforce_one_limit_and_answer_429_with_retry_after_and_ratelimit_headers(
        two_gateways: list[GatewayProc], upstream: UpstreamProc) -> None:
    answers = [gw.call("github.create_comment", {**COMMENT, "client_id": f"c{i}"}, run="rl-1")
               for i, gw in enumerate([*two_gateways, *two_gateways])]
    assert [r.status_code for r in answers] == [200, 200, 200, 429]
    refused = answers[3]
    assert refused.json()["error"]["code"] == "rate_limited"
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    assert refused.headers["RateLimit-Policy"] == '"actor";q=100;w=60, "tool";q=3;w=60'
    assert refused.headers["RateLimit"].startswith('"tool";r=0;t=')
    assert answers[0].headers["RateLimit"].startswith('"tool";r=2;')
    assert upstream.count("comments.create") == 3
    states = [(e["state"], (e.get("error") or {}).get("code"))
              for e in two_gateways[0].entries("rl-1")]
    assert states.count(("refused", "rate_limited")) == 1 and states.count(("succeeded", None)) == 3


def test_mcp_answers_over_the_limit_with_http_429_and_the_json_rpc_error_of_the_request(
        two_gateways: list[GatewayProc]) -> None:
    gw = two_gateways[0]
    codes = []
    for i in range(4):
        body = {"jsonrpc": "2.0", "id": 100 + i, "method": "tools/call",
                "params": {"name": "github__create_comment",
                           "arguments": {**COMMENT, "client_id": f"m{i}"}}}
        r = httpx2.post(f"{gw.url}/mcp", json=body, timeout=30, headers={
            "Accept": "application/json, text/event-stream", "X-Unwind-Run": "rl-mcp"})
        codes.append(r.status_code)
    assert codes == [200, 200, 200, 429]
    assert r.json()["id"] == 103 and r.json()["error"]["data"]["error"]["code"] == "rate_limited"
    assert int(r.headers["Retry-After"]) >= 1


def test_with_redis_gone_a_change_is_503_and_nothing_is_called(
        manifests: Path, tmp_path: Path, upstream: UpstreamProc) -> None:
    r = start_redis(tmp_path)
    gw = start_gateway(manifests, tmp_path / "ledger", tmp_path, "--rate-limits", limits(r.url))
    try:
        assert gw.call("github.create_comment", COMMENT, run="rl-down").status_code == 200
        r.stop()
        down = gw.call("github.create_comment", {**COMMENT, "client_id": "c2"}, run="rl-down")
        assert down.status_code == 503 and down.json()["error"]["code"] == "limiter_unavailable"
        assert upstream.count("comments.create") == 1
        metrics = httpx2.get(f"{gw.url}/metrics", timeout=5).text
        assert 'unwind_gateway_rate_limit_store_down_total{decision="refused"} 1.0' in metrics
    finally:
        stop(gw.proc)
        r.stop()
