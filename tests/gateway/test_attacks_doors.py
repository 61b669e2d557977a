"""Attacks on the gateway's doors and on its upstream client (issue 17: #1, #7, #9, #10, #13).

A hostile upstream runs in a thread of the test (aiohttp): it records each request's
method and raw path as it arrived, and its ``/bomb`` route answers a gzip bomb. The
gateway is a real ``unwind gateway`` process with a few tools pointed at it.
"""

from __future__ import annotations

import asyncio
import json
import threading
import zlib
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx2
import pytest
from aiohttp import web
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from unwind.gateway.trust import Policy, host_name, json_content_type
from unwind.manifest.model import ToolManifest
from unwind.undo.runner import parse_step, run_step
from unwind.upstream.client import Upstream, fill_url, prepare
from unwind.upstream.errors import Refusal
from unwind.upstream.limits import MAX_DEPTH, check_arguments, nesting_problem
from unwind.upstream.secrets import LocalSecrets

from .conftest import GatewayProc, free_port, start_gateway, stop

BOMB_BYTES = 400 * 1024 * 1024  # what the bomb decompresses to (the sidecar's limit is 128 Mi)
SECRET = "tok en/s3cret"  # a redacted argument: with a space and a slash, so it is encoded
RELEASE = "/repos/{{args.owner}}/{{args.repo}}/releases/{{args.release_id}}"


def gzip_bomb() -> bytes:
    """BOMB_BYTES of zeros, gzip-compressed (about 400 KiB), made a MiB at a time."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(1024 * 1024)
    parts = [z.compress(zeros) for _ in range(BOMB_BYTES // len(zeros))]
    return b"".join([*parts, z.flush()])


class Hostile:
    """An upstream in a thread: records (method, raw path) of each request; ``/bomb``
    answers a gzip bomb as JSON, ``/big`` 5 MiB of JSON, ``/loop`` redirects to itself,
    anything else ``{"ok": true}``."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.bomb = gzip_bomb()
        self.loop = asyncio.new_event_loop()
        self.started = threading.Event()
        self.port = free_port()
        self.runner: web.AppRunner | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _answer(self, request: web.Request) -> web.Response:
        self.seen.append((request.method, request.raw_path))
        if request.path.startswith("/loop"):  # redirects to itself until the client gives up
            raise web.HTTPFound(location=request.path_qs)
        if request.path.startswith("/big"):  # 5 MiB of JSON, uncompressed
            return web.Response(body=b" " * (5 * 1024 * 1024) + b"{}",
                                content_type="application/json")
        if request.path.startswith("/bomb"):
            return web.Response(body=self.bomb, headers={"Content-Encoding": "gzip",
                                                         "Content-Type": "application/json"})
        return web.json_response({"ok": True})

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._answer)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        self.loop.run_until_complete(web.TCPSite(self.runner, "127.0.0.1", self.port).start())
        self.started.set()
        self.loop.run_forever()

    def start(self) -> Hostile:
        self.thread.start()
        assert self.started.wait(10)
        return self

    def close(self) -> None:
        assert self.runner is not None
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def hostile() -> Iterator[Hostile]:
    h = Hostile().start()
    try:
        yield h
    finally:
        h.close()


@pytest.fixture(autouse=True)
def forget(request: pytest.FixtureRequest) -> None:
    if "hostile" in request.fixturenames:
        request.getfixturevalue("hostile").seen.clear()


def tools(up: str, down: str) -> list[dict[str, Any]]:
    def tool(name: str, effect: str, url: str, method: str = "POST", **extra: Any) -> dict[str, Any]:
        return {"tool": name, "effect": effect, "permission": "test:write", "owner": ["tests"],
                "upstream": {"url": url, "method": method, "timeout_ms": 2000}, **extra}
    return [
        tool("attack.delete_release", "idempotent", up + RELEASE, "DELETE"),
        tool("attack.create_bomb", "idempotent", up + "/bomb"),
        tool("attack.read_bomb", "read_only", up + "/bomb", "GET"),
        tool("attack.token_down", "idempotent", down + "/tokens/{{args.token}}",
             audit={"redaction": ["$args.token"]}),
        tool("attack.token_loop", "read_only", up + "/loop/{{args.token}}", "GET",
             audit={"redaction": ["$args.token"]}),
    ]


@pytest.fixture(scope="module")
def doors(hostile: Hostile, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProc]:
    base = tmp_path_factory.mktemp("doors")
    (base / "manifests").mkdir()
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    (base / "manifests" / "attack.yaml").write_text(json.dumps(tools(hostile.url, down)))
    gw = start_gateway(base / "manifests", base / "ledger", base)
    try:
        yield gw
    finally:
        stop(gw.proc)


def error(r: httpx2.Response) -> dict[str, Any]:
    return dict(r.json()["error"])


def peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


@asynccontextmanager
async def mcp_client(gw: GatewayProc, run: str) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(headers={"X-Unwind-Run": run}, timeout=30) as http, \
            Client(streamable_http_client(f"{gw.url}/mcp", http_client=http)) as client:
        yield client


def deep(levels: int) -> Any:
    """``levels`` objects nested in one another."""
    value: Any = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


# ---- #1: dot segments ----

@pytest.mark.parametrize("release_id", ["..", ".", ""])
def test_a_release_id_of_dot_dot_does_not_delete_the_repository(
        doors: GatewayProc, hostile: Hostile, run_name: str, release_id: str) -> None:
    r = doors.call("attack.delete_release", {"owner": "acme", "repo": "app",
                                              "release_id": release_id}, run=run_name)
    assert r.status_code == 400 and error(r)["code"] == "validation_error"
    assert "'release_id'" in error(r)["message"] and "send the real value" in error(r)["message"]
    assert hostile.seen == []


def test_a_percent_encoded_slash_or_dot_in_an_argument_goes_out_still_encoded(
        doors: GatewayProc, hostile: Hostile, run_name: str) -> None:
    for key, release_id in (("s-1", "../x"), ("s-2", "%2e%2e"), ("s-3", "..."), ("s-4", "a/../..")):
        r = doors.call("attack.delete_release", {"owner": "acme", "repo": "app",
                                                  "release_id": release_id}, run=run_name, key=key)
        assert r.status_code == 200, r.text
    paths = [(method, path.split("?")[0]) for method, path in hostile.seen]
    assert paths == [("DELETE", "/repos/acme/app/releases/..%2Fx"),
                     ("DELETE", "/repos/acme/app/releases/%252e%252e"),
                     ("DELETE", "/repos/acme/app/releases/..."),
                     ("DELETE", "/repos/acme/app/releases/a%2F..%2F..")]


def test_fill_url_keeps_the_templates_own_encoding_and_refuses_dot_segments() -> None:
    template = "http://h:1/repos/{{args.owner}}/x%2Fy/releases/{{ args.id }}?v={{args.v}}"
    assert fill_url(template, {"owner": "a b", "id": 7, "v": True}) == \
        "http://h:1/repos/a%20b/x%2Fy/releases/7?v=true"
    for bad in ("..", ".", ""):
        with pytest.raises(Refusal, match="send the real value"):
            fill_url(template, {"owner": bad, "id": 7, "v": 1})


async def test_a_rollback_does_not_send_a_discard_for_an_upstream_answered_id_of_dot_dot(
        hostile: Hostile) -> None:
    step = {
        "version": 1, "ledger": "run-1",
        "step": {"entry": "draft-1", "tool": "attack.create_draft", "action": "discard",
                 "undo_tool": "attack.delete_release",
                 "arguments": {"owner": "acme", "repo": "app", "release_id": ".."},
                 "residue": [], "requires_approval": False, "reason": "test"},
        "idempotency_key": "unwind-discard-0123",
        "manifest": tools(hostile.url, hostile.url)[0], "verification": None,
        "timeout_ms": None, "effect": None}
    upstream = Upstream()
    try:
        result = await run_step(parse_step(step), upstream, LocalSecrets())
    finally:
        await upstream.aclose()
    assert result["ok"] is False and result["outcome"] == "undo_failed"
    assert result["entry_state"] == "undo_failed" and "'release_id'" in result["reason"]
    assert hostile.seen == []


# ---- #10: the doors and web pages ----

def test_a_cross_site_text_plain_post_does_not_run_a_tool(
        doors: GatewayProc, hostile: Hostile, run_name: str) -> None:
    body = json.dumps({"arguments": {"owner": "acme", "repo": "app", "release_id": "7"}})
    for content_type in ("text/plain", "application/x-www-form-urlencoded",
                         "multipart/form-data; boundary=x", None,
                         "application/json; charset=latin-1"):
        headers = {"X-Unwind-Run": run_name, **({"Content-Type": content_type} if content_type else {})}
        r = httpx2.post(f"{doors.url}/call/attack.delete_release", content=body, headers=headers)
        assert r.status_code == 415, (content_type, r.text)
        assert error(r)["code"] == "unsupported_media_type"
        assert "Content-Type: application/json" in error(r)["message"]
    assert hostile.seen == [] and doors.entries(run_name) == []
    ok = httpx2.post(f"{doors.url}/call/attack.delete_release", content=body,
                     headers={"X-Unwind-Run": run_name,
                              "Content-Type": "Application/JSON; charset=UTF-8"})
    assert ok.status_code == 200, ok.text


def test_a_dns_rebinding_host_is_refused_on_every_route(
        doors: GatewayProc, hostile: Hostile, run_name: str) -> None:
    assert doors.call("attack.delete_release", {"owner": "acme", "repo": "app", "release_id": "1"},
                      run=run_name, key="r-1").status_code == 200
    rebound = {"Host": "evil.example:8787", "X-Unwind-Run": run_name,
               "Content-Type": "application/json"}
    read = httpx2.get(f"{doors.url}/calls/{run_name}/r-1", headers=rebound)
    assert read.status_code == 421 and error(read)["code"] == "untrusted_host"
    assert "r-1" not in read.text
    call = httpx2.post(f"{doors.url}/call/attack.delete_release", headers=rebound,
                       json={"arguments": {"owner": "acme", "repo": "app", "release_id": "2"}})
    assert call.status_code == 421
    mcp = httpx2.post(f"{doors.url}/mcp", headers={**rebound, "Accept": "application/json"},
                      json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert mcp.status_code == 421
    assert httpx2.get(f"{doors.url}/metrics", headers=rebound).status_code == 421
    assert len(hostile.seen) == 1 and len(doors.entries(run_name)) == 1
    local = {"Host": f"localhost:{doors.url.rsplit(':', 1)[1]}"}
    assert httpx2.get(f"{doors.url}/calls/{run_name}/r-1", headers=local).status_code == 200


def test_a_post_with_an_origin_from_a_web_page_is_refused(
        doors: GatewayProc, hostile: Hostile, run_name: str) -> None:
    for origin in ("https://evil.example", "null", "http://127.0.0.1.evil.example"):
        headers = {"Origin": origin, "X-Unwind-Run": run_name}
        r = httpx2.post(f"{doors.url}/call/attack.delete_release", headers=headers,
                        json={"arguments": {"owner": "acme", "repo": "app", "release_id": "3"}})
        assert r.status_code == 403 and error(r)["code"] == "permission_denied", origin
        mcp = httpx2.post(f"{doors.url}/mcp", headers={**headers, "Accept": "application/json"},
                          json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert mcp.status_code == 403, origin
    assert hostile.seen == [] and doors.entries(run_name) == []
    # a page on the machine's own loopback (an MCP inspector) stays trusted, as /mcp had it
    inspector = httpx2.post(f"{doors.url}/mcp/", json={"jsonrpc": "2.0", "id": 1,
                                                       "method": "tools/list"},
                            headers={"Origin": "http://localhost:6274",
                                     "Accept": "application/json, text/event-stream"})
    assert inspector.status_code == 200, inspector.text


def test_the_policy_trusts_loopback_the_listen_address_and_the_named_hosts_only() -> None:
    assert host_name("[::1]:8787") == "::1" and host_name("LocalHost.:80") == "localhost"
    assert host_name("::1") == "::1" and host_name("10.0.0.5") == "10.0.0.5"
    wildcard = Policy.for_listen("0.0.0.0")
    assert wildcard.hosts == {"127.0.0.1", "localhost", "::1"}
    named = Policy.from_environ("10.1.2.3", {"UNWIND_ALLOWED_HOSTS": "gateway, Agent.local "})
    assert named.hosts == {"127.0.0.1", "localhost", "::1", "10.1.2.3", "gateway", "agent.local"}
    get = {"host": "gateway:8787"}
    assert named.refusal("GET", "/healthz", get) is None
    assert wildcard.refusal("GET", "/healthz", get) is not None
    assert wildcard.refusal("GET", "/healthz", {}) is not None  # no Host at all
    quit_ = {"host": "127.0.0.1:8787"}
    assert wildcard.refusal("POST", "/quitquitquit", quit_) is None  # quit.py has its own rules
    assert json_content_type("application/json") and json_content_type("application/json;charset=utf8")
    assert not json_content_type("application/jsonx") and not json_content_type("text/json")


# ---- #13: unbounded answers ----

def test_a_gzip_bomb_from_an_effectful_tool_is_refused_unread_and_the_entry_is_uncertain(
        doors: GatewayProc, hostile: Hostile, run_name: str) -> None:
    before = peak_rss_kib(doors.proc.pid)
    r = doors.call("attack.create_bomb", {"n": 1}, run=run_name, key="bomb-1")
    assert r.status_code == 502 and error(r)["code"] == "upstream_error", r.text
    assert "more than 4194304 bytes" in error(r)["message"]
    assert "upstream.max_response_bytes" in error(r)["message"]
    [entry] = doors.entries(run_name)
    assert entry["state"] == "uncertain"
    read = doors.call("attack.read_bomb", {}, run=run_name, key="bomb-2")
    assert read.status_code == 502
    assert [e["state"] for e in doors.entries(run_name)] == ["uncertain", "failed"]
    grown_mib = (peak_rss_kib(doors.proc.pid) - before) / 1024
    assert grown_mib < 64, f"the gateway's peak memory grew by {grown_mib:.0f} MiB"


async def test_the_undo_client_reads_a_gzip_bomb_no_further_than_its_cap(hostile: Hostile) -> None:
    m = ToolManifest.model_validate(
        {"tool": "attack.refund", "effect": "idempotent", "permission": "p",
         "upstream": {"url": hostile.url + "/bomb", "max_response_bytes": 65536}})
    upstream = Upstream()
    try:
        answer = await upstream.send(prepare(m, {}, LocalSecrets(), {}))
        step = {"version": 1, "ledger": "run-1",
                "step": {"entry": "e-1", "tool": "attack.charge", "action": "compensate",
                         "undo_tool": "attack.refund", "arguments": {}, "residue": [],
                         "requires_approval": False, "reason": "test"},
                "idempotency_key": "unwind-compensate-1", "manifest": m.canonical_dict(),
                "verification": None, "timeout_ms": None, "effect": None}
        result = await run_step(parse_step(step), upstream, LocalSecrets())
    finally:
        await upstream.aclose()
    assert answer.kind == "too_large" and answer.may_have_acted and answer.data is None
    assert "more than 65536 bytes" in answer.text
    assert result["ok"] is False and result["outcome"] == "undo_failed"


@pytest.mark.parametrize("path", ["/big", "/bomb"])
async def test_an_mcp_upstream_answering_too_much_or_compressed_is_not_read(
        hostile: Hostile, path: str) -> None:
    m = ToolManifest.model_validate(
        {"tool": "attack.mcp", "effect": "idempotent", "permission": "p",
         "upstream": {"mcp": {"url": hostile.url + path, "tool": "x"}, "timeout_ms": 5000}})
    upstream = Upstream()
    try:
        answer = await upstream.send(prepare(m, {}, LocalSecrets(), {}))
    finally:
        await upstream.aclose()
    # It answers the handshake so: the session is never opened and the call never sent (the
    # call's own answer past the cap: test_mcp_upstream.py).
    assert answer.kind == "not_sent" and answer.data is None, answer.text
    assert ("more than 4194304 bytes" if path == "/big" else "Content-Encoding 'gzip'") \
        in answer.text
    assert "the call was not sent" in answer.text


def test_max_response_bytes_is_bounded_in_the_manifest() -> None:
    base = {"tool": "t.x", "effect": "read_only", "permission": "p"}
    for bad in (0, 1023, 16 * 1024 * 1024 + 1, "4Mi"):
        with pytest.raises(ValueError, match="max_response_bytes"):
            ToolManifest.model_validate({**base, "upstream": {"url": "http://h/",
                                                              "max_response_bytes": bad}})


# ---- #7: filled URLs in messages and logs ----

@pytest.mark.parametrize(("tool", "method"), [("attack.token_down", "POST"),
                                             ("attack.token_loop", "GET")])
def test_a_redacted_argument_in_the_url_appears_nowhere_when_the_upstream_is_down_or_loops(
        doors: GatewayProc, run_name: str, tool: str, method: str) -> None:
    r = doors.call(tool, {"token": SECRET}, run=run_name, key="down-1")
    assert r.status_code == 502 and error(r)["code"] == "upstream_error"
    # named by its template (the redirect, never followed now, says so in the details)
    assert f"{tool} ({method} http://127.0.0.1:" in r.text
    assert "/{{args.token}}" in r.text
    encoded = quote(SECRET, safe="")
    seen = {"answer": r.text, "report": r.headers.get("X-Unwind-Effect", ""),
            "ledger": json.dumps(doors.entries(run_name)), "log": doors.log.read_text()}
    for where, text in seen.items():
        for form in (SECRET, encoded, "s3cret"):
            assert form not in text, f"{form!r} is in the {where}"


# ---- #9 (the doors' part): nesting and size of arguments ----

def test_an_argument_300_levels_deep_is_refused_at_the_rest_door_and_nothing_is_recorded(
        doors: GatewayProc, hostile: Hostile, run_name: str) -> None:
    r = doors.call("attack.create_bomb", {"x": deep(300)}, run=run_name, key="deep-1")
    assert r.status_code == 400 and error(r)["code"] == "validation_error"
    assert f"deeper than {MAX_DEPTH} levels" in error(r)["message"]
    far = doors.call("attack.create_bomb", raw=b'{"arguments": {"x": ' + b"[" * 20000 +
                     b"]" * 20000 + b"}}", run=run_name, key="deep-2")
    assert far.status_code == 400 and f"deeper than {MAX_DEPTH}" in error(far)["message"]
    assert doors.entries(run_name) == [] and hostile.seen == []
    assert not (doors.ledger / f"{run_name}.json").exists()


async def test_an_argument_300_levels_deep_is_refused_at_the_mcp_door_and_nothing_is_recorded(
        doors: GatewayProc, hostile: Hostile, run_name: str) -> None:
    def post(levels: int, key: str) -> httpx2.Response:
        # the SDK's client will not even serialise such arguments: the request is by hand
        call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "attack.create_bomb", "arguments": {"x": "PLACE"},
                           "_meta": {"idempotency_key": key}}}
        nested = '{"a": ' * (levels - 1) + "{}" + "}" * (levels - 1)
        raw = json.dumps(call).replace('"PLACE"', nested).encode()
        return httpx2.post(f"{doors.url}/mcp/", content=raw, timeout=30,
                           headers={"X-Unwind-Run": run_name, "Content-Type": "application/json",
                                    "Accept": "application/json, text/event-stream"})
    far = post(300, "deep-300")  # the SDK's JSON parser stops first (its own depth bound)
    assert far.status_code == 400 and far.json()["error"]["code"] == -32700, far.text
    r = post(150, "deep-150")  # past the gateway's bound, within the parser's
    assert r.status_code == 200, r.text
    result = r.json()["result"]
    assert result["isError"] is True
    assert result["structuredContent"]["error"]["code"] == "validation_error"
    assert f"deeper than {MAX_DEPTH}" in result["structuredContent"]["error"]["message"]
    async with mcp_client(doors, run_name) as client:
        flat = await client.call_tool("attack.create_bomb", {"x": deep(MAX_DEPTH - 1)},
                                      meta={"idempotency_key": "flat-mcp"})
    assert flat.is_error  # the bomb: refused for its answer, not for its arguments
    assert "bytes" in json.loads(flat.content[0].text)["error"]["message"]  # type: ignore[union-attr]
    assert [e["id"] for e in doors.entries(run_name)] == ["flat-mcp"]


def test_the_bounds_count_the_arguments_object_as_level_one_and_bytes_as_compact_json() -> None:
    assert nesting_problem(deep(MAX_DEPTH)) is None
    assert nesting_problem(deep(MAX_DEPTH + 1)) is not None
    assert nesting_problem([[[]]], limit=3) is None and nesting_problem([[[[]]]], limit=3)
    check_arguments({"a": "x" * 60_000})
    with pytest.raises(Refusal, match="64 KiB"):
        check_arguments({"a": "x" * 70_000})
