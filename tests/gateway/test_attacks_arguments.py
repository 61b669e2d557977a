"""Issue 29, items 2, 3 and 4, each attack as the review reproduced it in local mode: a real
``unwind gateway`` process, real aiohttp upstreams on loopback in a thread of the test.

- undeclared arguments (``role: admin`` beside ``id, email``) never reach the upstream, at
  the REST door and at the MCP door;
- a redirect never carries the tool's Secret or the call's body to another origin (the
  gateway and the undo runner share the client); a manifest may follow same-origin ones;
- a hostile argument against a schema that backtracks or recurses without end is refused
  in bounded time while ``/healthz`` keeps answering.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from aiohttp import web

from unwind.undo.runner import parse_step, run_step
from unwind.upstream.client import Upstream
from unwind.upstream.secrets import LocalSecrets

from .conftest import GatewayProc, free_port, start_gateway, stop
from .test_attacks_doors import mcp_client

API_KEY = "sk-live-do-not-leak"


class Recorder:
    """An HTTP server in a thread that records every request (method, path, headers, body).
    ``/moved/...`` answers 307 to ``elsewhere`` + the same path; ``/same/...`` answers 307
    to ``/target/...`` of itself; anything else ``{"ok": true, "id": "c1"}``."""

    def __init__(self, elsewhere: str = "") -> None:
        self.seen: list[dict[str, Any]] = []
        self.elsewhere = elsewhere
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.started = threading.Event()
        self.runner: web.AppRunner | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.seen.append({"method": request.method, "path": request.path,
                          "headers": dict(request.headers), "body": body.decode()})
        if request.path.startswith("/moved"):
            raise web.HTTPTemporaryRedirect(self.elsewhere + request.path_qs)
        if request.path.startswith("/same"):
            raise web.HTTPTemporaryRedirect("/target" + request.path_qs[len("/same"):])
        return web.json_response({"ok": True, "id": "c1"})

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._answer)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        self.loop.run_until_complete(web.TCPSite(self.runner, "127.0.0.1", self.port).start())
        self.started.set()
        self.loop.run_forever()

    def __enter__(self) -> Recorder:
        self.thread.start()
        assert self.started.wait(10)
        return self

    def __exit__(self, *_: Any) -> None:
        assert self.runner is not None
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[Recorder, Recorder]]:
    with Recorder() as other, Recorder(elsewhere=other.url) as up:
        yield up, other


@pytest.fixture(autouse=True)
def forget(request: pytest.FixtureRequest) -> None:
    if "servers" in request.fixturenames:
        for server in request.getfixturevalue("servers"):
            server.seen.clear()


def deep_array(levels: int) -> Any:
    value: Any = "leaf"
    for _ in range(levels):
        value = [value]
    return value


# Recursion that branches at every level: each of 40 levels tries two ways, 2^40 in all.
BRANCHING: dict[str, Any] = {
    "type": "object", "properties": {"tree": {"$ref": "#/$defs/t"}},
    "$defs": {"t": {"anyOf": [{"type": "array", "items": {"$ref": "#/$defs/t"}},
                              {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/t"}}]}}}


def manifests(up: str) -> list[dict[str, Any]]:
    key = {"X-Api-Key": {"secretKeyRef": {"name": "crm", "key": "api-key"}}}
    return [
        {"tool": "customers.update_email", "effect": "idempotent", "permission": "crm:write",
         "owner": ["tests"],
         "input_schema": {"type": "object", "required": ["id", "email"], "properties": {
             "id": {"type": "string"}, "email": {"type": "string"}}},
         "upstream": {"url": up + "/customers/{{args.id}}", "method": "PATCH", "headers": key,
                      "timeout_ms": 3000}},
        {"tool": "customers.moved", "effect": "idempotent", "permission": "crm:write",
         "upstream": {"url": up + "/moved/customers", "method": "POST", "headers": key,
                      "timeout_ms": 3000}},
        {"tool": "customers.moved_opted_in", "effect": "idempotent", "permission": "crm:write",
         "upstream": {"url": up + "/moved/customers", "method": "POST", "headers": key,
                      "redirects": "same_origin", "timeout_ms": 3000}},
        {"tool": "customers.same_origin", "effect": "idempotent", "permission": "crm:write",
         "upstream": {"url": up + "/same/customers", "method": "POST", "headers": key,
                      "redirects": "same_origin", "timeout_ms": 3000}},
        {"tool": "notes.check", "effect": "read_only", "permission": "crm:write",
         "input_schema": {"type": "object", "properties": {
             "word": {"type": "string", "pattern": "^(a+)+$"}}},
         "upstream": {"url": up + "/notes", "method": "POST", "timeout_ms": 3000}},
        {"tool": "notes.tree", "effect": "read_only", "permission": "crm:write",
         "input_schema": BRANCHING, "upstream": {"url": up + "/tree", "method": "POST",
                                                  "timeout_ms": 3000}},
    ]


@pytest.fixture(scope="module")
def gw(servers: tuple[Recorder, Recorder], tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProc]:
    base = tmp_path_factory.mktemp("arguments")
    (base / "manifests").mkdir()
    (base / "manifests" / "crm.yaml").write_text(json.dumps(manifests(servers[0].url)))
    (base / "secrets" / "crm").mkdir(parents=True)
    (base / "secrets" / "crm" / "api-key").write_text(API_KEY)
    proc = start_gateway(base / "manifests", base / "ledger", base, "--secrets-dir",
                         str(base / "secrets"), scopes="crm:write")
    try:
        yield proc
    finally:
        stop(proc.proc)


def error(r: httpx2.Response) -> dict[str, Any]:
    return dict(r.json()["error"])


# ---- item 2: undeclared arguments --------------------------------------------------------

ESCALATION = {"id": "c1", "email": "new@example.com", "role": "admin"}


def test_an_undeclared_role_beside_the_declared_email_never_reaches_the_upstream_at_the_rest_door(
        gw: GatewayProc, servers: tuple[Recorder, Recorder], run_name: str) -> None:
    r = gw.call("customers.update_email", ESCALATION, run=run_name)
    assert r.status_code == 400 and error(r)["code"] == "validation_error"
    assert "arguments.role: is not declared by its manifest's input_schema" in error(r)["message"]
    assert "leave it out, or declare it" in error(r)["message"]
    assert servers[0].seen == [] and gw.entries(run_name) == []  # not sent, not recorded
    ok = gw.call("customers.update_email", {"id": "c1", "email": "new@example.com"}, run=run_name)
    assert ok.status_code == 200, ok.text
    assert [json.loads(s["body"]) for s in servers[0].seen] == [{"email": "new@example.com"}]


async def test_an_undeclared_role_never_reaches_the_upstream_at_the_mcp_door(
        gw: GatewayProc, servers: tuple[Recorder, Recorder], run_name: str) -> None:
    async with mcp_client(gw, run_name) as client:
        result = await client.call_tool("customers.update_email", ESCALATION)
    assert result.is_error
    text = "".join(getattr(c, "text", "") for c in result.content)
    assert "arguments.role: is not declared" in text and "validation_error" in text
    assert servers[0].seen == []


# ---- item 3: redirects -------------------------------------------------------------------

def test_a_307_to_another_origin_receives_neither_the_api_key_nor_the_body(
        gw: GatewayProc, servers: tuple[Recorder, Recorder], run_name: str) -> None:
    up, other = servers
    r = gw.call("customers.moved", {"email": "victim@example.com"}, run=run_name)
    assert r.status_code == 502 and error(r)["code"] == "upstream_error"
    assert "answered 307" in error(r)["message"]
    assert f"a redirect to {other.url}" in r.text and "does not follow redirects" in r.text
    assert other.seen == []  # nothing went there: no key, no body
    assert len(up.seen) == 1 and up.seen[0]["headers"]["X-Api-Key"] == API_KEY
    assert [e["state"] for e in gw.entries(run_name)] == ["failed"]  # a 307 did not act


def test_even_a_manifest_that_follows_redirects_never_follows_one_to_another_origin(
        gw: GatewayProc, servers: tuple[Recorder, Recorder], run_name: str) -> None:
    r = gw.call("customers.moved_opted_in", {"email": "victim@example.com"}, run=run_name)
    assert r.status_code == 502 and "another origin: a redirect there is never followed" in r.text
    assert servers[1].seen == []


def test_a_manifest_may_follow_a_redirect_within_its_own_origin(
        gw: GatewayProc, servers: tuple[Recorder, Recorder], run_name: str) -> None:
    r = gw.call("customers.same_origin", {"email": "a@example.com"}, run=run_name)
    assert r.status_code == 200, r.text
    up = servers[0]
    assert [(s["method"], s["path"]) for s in up.seen] == [("POST", "/same/customers"),
                                                          ("POST", "/target/customers")]
    assert json.loads(up.seen[1]["body"]) == {"email": "a@example.com"}  # 307 keeps the body
    assert up.seen[1]["headers"]["X-Api-Key"] == API_KEY


async def test_an_undo_step_does_not_follow_a_redirect_to_another_origin_either(
        servers: tuple[Recorder, Recorder], tmp_path: Path) -> None:
    up, other = servers
    (tmp_path / "crm").mkdir()
    (tmp_path / "crm" / "api-key").write_text(API_KEY)
    undo = manifests(up.url)[1]
    step = {"version": 1, "ledger": "run-1",
            "step": {"entry": "e1", "tool": "customers.create", "action": "compensate",
                     "undo_tool": undo["tool"], "arguments": {"id": "c1"}, "residue": [],
                     "requires_approval": False, "reason": "test"},
            "idempotency_key": "unwind-compensate-0123", "manifest": undo,
            "verification": None, "timeout_ms": None, "effect": None}
    upstream = Upstream()
    try:
        result = await run_step(parse_step(step), upstream, LocalSecrets(tmp_path))
    finally:
        await upstream.aclose()
    assert result["ok"] is False and result["outcome"] == "undo_failed"
    assert other.seen == [] and len(up.seen) == 1


# ---- item 4: bounded work, /healthz answers ----------------------------------------------

def healthz_while(gw: GatewayProc, call: Any) -> tuple[httpx2.Response, list[float]]:
    """Run ``call`` in a thread and time /healthz meanwhile."""
    answer: list[httpx2.Response] = []
    thread = threading.Thread(target=lambda: answer.append(call()), daemon=True)
    thread.start()
    waits: list[float] = []
    while thread.is_alive() and len(waits) < 40:
        started = time.monotonic()
        assert httpx2.get(f"{gw.url}/healthz", timeout=5).status_code == 200
        waits.append(time.monotonic() - started)
        time.sleep(0.05)
    thread.join(30)
    assert answer, "the call did not come back"
    return answer[0], waits


def test_a_recursion_that_branches_at_every_level_is_refused_while_healthz_answers(
        gw: GatewayProc, servers: tuple[Recorder, Recorder], run_name: str) -> None:
    r, waits = healthz_while(gw, lambda: gw.call("notes.tree", {"tree": deep_array(40)},
                                                 run=run_name))
    assert r.status_code == 400 and error(r)["code"] == "validation_error"
    assert "more work than the gateway allows" in error(r)["message"]
    assert waits and max(waits) < 1.0, waits  # the loop was never held for long
    assert servers[0].seen == []


def test_a_backtracking_pattern_is_matched_in_linear_time(
        gw: GatewayProc, servers: tuple[Recorder, Recorder], run_name: str) -> None:
    r, _ = healthz_while(gw, lambda: gw.call("notes.check", {"word": "a" * 40 + "!"},
                                             run=run_name))
    assert r.status_code == 400 and "does not match '^(a+)+$'" in error(r)["message"]
    assert gw.call("notes.check", {"word": "aaa"}, run=run_name).status_code == 200
