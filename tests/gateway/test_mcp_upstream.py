"""MCP upstreams as users run them: sessions kept open per server (both protocol eras), and
stdio servers the gateway starts from ``upstream.mcp.command`` in local mode.

The servers are real processes: tests/upstream/mcp_stdio_server.py (the SDK's MCPServer)
over stdio or streamable HTTP, and ``@modelcontextprotocol/server-memory`` from npm, which
its fixture installs (it skips, saying why, when npm cannot fetch it; under CI=true that
fails instead).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from unwind.manifest.validate import validate_manifest
from unwind.operator.admission import Refused, Request, validate_toolmanifest
from unwind.operator.identity import Identity
from unwind.upstream.client import Upstream, prepare
from unwind.upstream.mcp_client import MAX_OPEN, HttpServer, McpClients, McpFailure, StdioServer
from unwind.upstream.secrets import LocalSecrets

from .conftest import ROOT, env, free_port, start_gateway, stop, wait_for
from .installs import SERVER_MEMORY, npm_tool

STDIO = (sys.executable, "-m", "tests.upstream.mcp_stdio_server")
SERVER_ENV = (("PYTHONPATH", str(ROOT)),)
CAP = 1 << 20
SLOW_START = 60.0  # two shared cores: a Python MCP server can take seconds to import


def stdio_server() -> StdioServer:
    return StdioServer(STDIO, SERVER_ENV, str(ROOT))


def answer(result: Any) -> Any:
    """The tool's JSON answer (MCPServer sends it as text)."""
    if result.structured_content is not None:
        return result.structured_content
    return json.loads("".join(getattr(c, "text", "") for c in result.content))


@pytest.fixture
async def clients() -> AsyncIterator[McpClients]:
    c = McpClients(commands=True)
    try:
        yield c
    finally:
        await c.aclose()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purposes
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ")[1].startswith("Z"))


# ---- stdio servers -----------------------------------------------------------------------

async def test_one_stdio_server_process_answers_every_call_and_its_stderr_reaches_the_log(
        clients: McpClients, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="unwind.gateway.mcp")
    server = stdio_server()
    first = answer(await clients.call(server, "pid", {}, timeout_s=SLOW_START, cap=CAP))
    await clients.call(server, "remember", {"key": "k", "value": "v"}, timeout_s=10, cap=CAP)
    both = await asyncio.gather(
        clients.call(server, "pid", {}, timeout_s=10, cap=CAP),
        clients.call(server, "recall", {"key": "k"}, timeout_s=10, cap=CAP))
    assert answer(both[0]) == first
    assert answer(both[1])["value"] == "v"
    assert "unwind test MCP server ready" in caplog.text  # its stderr, in the gateway's log


async def test_a_stdio_server_that_dies_mid_call_leaves_the_call_uncertain_and_the_next_call_starts_it_again(
        clients: McpClients, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="unwind.gateway.mcp")
    server = stdio_server()
    before = answer(await clients.call(server, "pid", {}, timeout_s=SLOW_START, cap=CAP))["pid"]
    await clients.call(server, "remember", {"key": "k", "value": "v"}, timeout_s=10, cap=CAP)
    with pytest.raises(McpFailure) as lost:
        await clients.call(server, "crash", {}, timeout_s=10, cap=CAP)
    assert lost.value.kind == "lost"  # sent: the server may have acted
    after = answer(await clients.call(server, "pid", {}, timeout_s=SLOW_START, cap=CAP))["pid"]
    assert after != before and not pid_alive(before)
    recalled = answer(await clients.call(server, "recall", {"key": "k"}, timeout_s=10, cap=CAP))
    assert recalled["found"] is False  # a new process
    assert "exited" in caplog.text and "crashing on purpose" in caplog.text


async def test_a_command_that_does_not_exist_is_refused_before_anything_is_sent(
        clients: McpClients) -> None:
    with pytest.raises(McpFailure) as err:
        await clients.call(StdioServer(("unwind-no-such-mcp-server",)), "x", {}, timeout_s=10,
                           cap=CAP)
    assert err.value.kind == "not_sent"
    assert "cannot start it" in str(err.value) and "No such file" in str(err.value)


async def test_a_command_that_exits_at_start_is_refused_with_its_stderr_and_backs_off(
        clients: McpClients) -> None:
    server = StdioServer(("sh", "-c", "echo 'missing API_TOKEN' >&2; exit 2"))
    with pytest.raises(McpFailure) as first:
        await clients.call(server, "x", {}, timeout_s=10, cap=CAP)
    assert first.value.kind == "not_sent" and "missing API_TOKEN" in str(first.value)
    for _ in range(3):  # failing again and again: the wait doubles, then a call is refused
        with contextlib_suppress_mcp():
            await clients.call(server, "x", {}, timeout_s=1.5, cap=CAP)
    with pytest.raises(McpFailure) as later:
        await clients.call(server, "x", {}, timeout_s=0.5, cap=CAP)
    assert later.value.kind == "not_sent"
    assert "in a row, the next start is in" in str(later.value)
    assert "missing API_TOKEN" in str(later.value)


class contextlib_suppress_mcp:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, value: Any, tb: Any) -> bool:
        return kind is McpFailure


async def test_a_program_that_does_not_speak_mcp_is_refused_within_the_calls_timeout(
        clients: McpClients) -> None:
    server = StdioServer(("sh", "-c", "echo 'this is not JSON-RPC'; sleep 30"))
    started = asyncio.get_running_loop().time()
    with pytest.raises(McpFailure) as err:
        await clients.call(server, "x", {}, timeout_s=2, cap=CAP)
    assert err.value.kind == "not_sent"
    assert "did not complete its start" in str(err.value)
    assert asyncio.get_running_loop().time() - started < 10


async def test_a_gateway_in_a_cluster_never_runs_a_command_a_manifest_names() -> None:
    upstream = Upstream()  # as the pod's gateway and the undo Job build it
    try:
        m, issues = validate_manifest(memory_manifest_data(["sh", "-c", "touch /tmp/pwned"]))
        assert m is not None and not issues
        prepared = prepare(m, {"entities": []}, secrets=None, extra_headers={})  # type: ignore[arg-type]
        got = await upstream.send(prepared)
        assert got.kind == "not_sent" and not got.sent
        assert "only in local mode" in got.text and "memory.create_entities" in got.text
        assert not upstream.mcp.processes or not any(
            p.session for p in upstream.mcp.processes.values())
    finally:
        await upstream.aclose()


def test_the_admission_webhook_refuses_a_toolmanifest_that_names_a_command() -> None:
    spec = memory_manifest_data(["npx", "-y", "@modelcontextprotocol/server-memory"])
    obj = {"apiVersion": "unwind.dev/v1alpha1", "kind": "ToolManifest",
           "metadata": {"name": "memory-create", "namespace": "shop"}, "spec": spec}
    with pytest.raises(Refused) as err:
        validate_toolmanifest(Request("CREATE", "shop", obj, None,
                                      Identity("alice", ("dev",))))
    assert "spec.upstream.mcp.command" in str(err.value)
    assert "give upstream.mcp.url" in str(err.value)


async def test_shutdown_stops_every_stdio_server_the_gateway_started() -> None:
    clients = McpClients(commands=True)
    server = stdio_server()
    pid = answer(await clients.call(server, "pid", {}, timeout_s=SLOW_START, cap=CAP))["pid"]
    assert pid_alive(pid)
    await clients.aclose()
    for _ in range(50):
        if not pid_alive(pid):
            break
        await asyncio.sleep(0.1)
    assert not pid_alive(pid)
    with pytest.raises(McpFailure):
        await clients.call(server, "pid", {}, timeout_s=5, cap=CAP)


# ---- HTTP servers: the pool --------------------------------------------------------------

def serve_http(port: int, log: Path, *, stateful: bool) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        proc = subprocess.Popen([*STDIO, "--port", str(port), *(["--stateful"] if stateful else [])],
                                cwd=ROOT, env=env(), stdout=out, stderr=subprocess.STDOUT)
    wait_for(f"http://127.0.0.1:{port}/", proc, log, seconds=60)
    return proc


@pytest.fixture
def http_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Any]]:
    """(URL, restart) of the test server over HTTP; ``param``: stateful (Mcp-Session-Id)."""
    port = free_port()
    log = tmp_path / "mcp-http.log"
    stateful = bool(getattr(request, "param", False))
    procs = [serve_http(port, log, stateful=stateful)]

    def restart() -> None:
        stop(procs[-1])
        procs.append(serve_http(port, log, stateful=stateful))
    try:
        yield f"http://127.0.0.1:{port}/mcp", restart
    finally:
        stop(procs[-1])


@pytest.mark.parametrize("http_server", [False, True], indirect=True, ids=["stateless", "stateful"])
async def test_calls_reuse_one_open_session_and_the_2026_07_28_protocol_is_negotiated(
        http_server: tuple[str, Any]) -> None:
    url, _ = http_server
    clients = McpClients()
    try:
        server = HttpServer(url)
        for i in range(5):
            assert answer(await clients.call(server, "echo", {"text": str(i)}, timeout_s=10,
                                             cap=CAP)) == {"echo": str(i)}
        [pool] = clients.pools.values()
        [session] = pool.idle
        assert len(clients.sessions) == 1
        assert session.client.protocol_version == "2026-07-28"
    finally:
        await clients.aclose()


@pytest.mark.parametrize("http_server", [False, True], indirect=True, ids=["stateless", "stateful"])
async def test_ten_calls_in_flight_keep_the_sessions_they_opened_and_open_no_more(
        http_server: tuple[str, Any]) -> None:
    """Issue 31: a pool that kept fewer idle sessions than it opened closed and reopened
    sessions under 10 calls in flight (a discover or a handshake, and a DELETE, for a
    quarter of the calls: 1.42 upstream requests per call)."""
    url, _ = http_server
    clients = McpClients()
    server = HttpServer(url)

    async def wave(n: int) -> None:
        answers = await asyncio.gather(*(clients.call(server, "echo", {"text": f"{n}-{i}"},
                                                      timeout_s=10, cap=CAP) for i in range(10)))
        assert [answer(a) for a in answers] == [{"echo": f"{n}-{i}"} for i in range(10)]
    try:
        await wave(0)
        [pool] = clients.pools.values()
        opened = set(pool.idle)
        assert len(opened) == MAX_OPEN  # 10 in flight, at most MAX_OPEN at once: all kept
        for n in range(1, 5):
            await wave(n)
            assert set(pool.idle) == opened
        assert clients.sessions == opened
    finally:
        await clients.aclose()


@pytest.mark.parametrize("http_server", [True], indirect=True, ids=["stateful"])
async def test_a_server_that_forgot_the_session_gets_a_new_one_and_the_call_goes_through_once(
        http_server: tuple[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    url, restart = http_server
    caplog.set_level(logging.INFO, logger="unwind.gateway.mcp")
    clients = McpClients(mode="legacy")  # the session-based protocol: Mcp-Session-Id
    try:
        server = HttpServer(url)
        await clients.call(server, "remember", {"key": "a", "value": "1"}, timeout_s=10, cap=CAP)
        [old] = clients.pools[server].idle
        assert old.client.protocol_version != "2026-07-28"
        restart()  # the new process knows no session: it answers 404
        stored = await clients.call(server, "remember", {"key": "b", "value": "2"}, timeout_s=10,
                                    cap=CAP)
        assert answer(stored) == {"key": "b", "stored": True}
        assert "forgot its session" in caplog.text
        recalled = await clients.call(server, "recall", {"key": "b"}, timeout_s=10, cap=CAP)
        assert answer(recalled)["value"] == "2"
        assert clients.pools[server].idle[0] is not old
    finally:
        await clients.aclose()


@pytest.mark.parametrize("http_server", [False], indirect=True, ids=["stateless"])
async def test_an_answer_lost_after_sending_is_uncertain_and_a_down_server_is_not_sent(
        http_server: tuple[str, Any]) -> None:
    url, _ = http_server
    clients = McpClients()
    try:
        server = HttpServer(url)
        await clients.call(server, "echo", {"text": "x"}, timeout_s=10, cap=CAP)
        with pytest.raises(McpFailure) as lost:
            await clients.call(server, "crash", {}, timeout_s=10, cap=CAP)
        assert lost.value.kind == "lost"
        assert not clients.pools[server].idle  # a failed session is not reused
        with pytest.raises(McpFailure) as down:
            await clients.call(server, "echo", {"text": "x"}, timeout_s=10, cap=CAP)
        assert down.value.kind == "not_sent"
    finally:
        await clients.aclose()


@pytest.mark.parametrize("http_server", [False], indirect=True, ids=["stateless"])
async def test_a_calls_answer_past_its_cap_is_not_read_and_the_call_is_uncertain(
        http_server: tuple[str, Any]) -> None:
    url, _ = http_server
    upstream = Upstream()
    m, issues = validate_manifest({
        "tool": "notes.echo", "effect": "idempotent", "permission": "p",
        "upstream": {"mcp": {"url": url, "tool": "echo"}, "max_response_bytes": 1024}})
    assert m is not None and not issues
    try:
        small = await upstream.send(prepare(m, {"text": "x"}, LocalSecrets(), {}))
        assert small.kind == "ok" and small.data == {"echo": "x"}
        big = await upstream.send(prepare(m, {"text": "x" * 5000}, LocalSecrets(), {}))
    finally:
        await upstream.aclose()
    assert big.kind == "too_large" and big.may_have_acted and big.data is None, big.text
    assert "more than 1024 bytes" in big.text


@pytest.mark.parametrize("http_server", [False], indirect=True, ids=["stateless"])
async def test_an_unknown_tool_is_the_servers_refusal_and_the_session_stays_usable(
        http_server: tuple[str, Any]) -> None:
    url, _ = http_server
    clients = McpClients()
    try:
        server = HttpServer(url)
        try:
            result = await clients.call(server, "no_such_tool", {}, timeout_s=10, cap=CAP)
        except McpFailure as exc:
            assert exc.kind == "refused"
        else:
            assert result.is_error  # MCPServer answers an unknown tool with isError
        assert answer(await clients.call(server, "echo", {"text": "y"}, timeout_s=10,
                                         cap=CAP)) == {"echo": "y"}
        assert len(clients.sessions) == 1
    finally:
        await clients.aclose()


# ---- through the gateway, in local mode --------------------------------------------------

def stdio_manifests(tmp_path: Path) -> Path:
    path = tmp_path / "stdio.yaml"
    command = json.dumps(list(STDIO))
    path.write_text(f"""- tool: notes.remember
  effect: idempotent
  permission: test:write
  upstream:
    mcp: {{ command: {command}, env: {{ PYTHONPATH: "{ROOT}" }}, cwd: "{ROOT}", tool: remember }}
- tool: notes.recall
  effect: read_only
  permission: test:write
  upstream:
    mcp: {{ command: {command}, env: {{ PYTHONPATH: "{ROOT}" }}, cwd: "{ROOT}", tool: recall }}
- tool: notes.broken
  effect: read_only
  permission: test:write
  upstream:
    mcp: {{ command: [unwind-no-such-mcp-server, --flag], tool: anything }}
""")
    return path


def test_local_mode_starts_the_stdio_server_a_manifest_names_and_lists_its_schemas(
        tmp_path: Path) -> None:
    gw = start_gateway(stdio_manifests(tmp_path), tmp_path / "ledger", tmp_path)
    try:
        r = gw.call("notes.remember", {"key": "k", "value": "v"})
        assert r.status_code == 200, r.text
        r = gw.call("notes.recall", {"key": "k"})
        assert r.status_code == 200, r.text
        assert r.json()["value"] == "v"
        listed = httpx2.post(f"{gw.url}/mcp", json={
            "jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
            headers={"Accept": "application/json, text/event-stream",
                     "Content-Type": "application/json", "MCP-Protocol-Version": "2025-06-18"},
            timeout=30)
        schemas = {t["name"]: t["inputSchema"] for t in listed.json()["result"]["tools"]}
        assert set(schemas[next(n for n in schemas if n.endswith("remember"))]["properties"]) \
            == {"key", "value"}
        broken = gw.call("notes.broken", {})
        assert broken.status_code >= 400
        message = broken.json()["error"]["message"]
        assert "notes.broken" in message and "unwind-no-such-mcp-server --flag" in message
        assert "cannot start it" in message
    finally:
        stop(gw.proc)
    log = gw.log.read_text()
    assert "unwind test MCP server ready" in log  # the server's stderr in the gateway's log


# ---- a published server from npm ---------------------------------------------------------

def memory_manifest_data(command: list[str]) -> dict[str, Any]:
    return {"tool": "memory.create_entities", "effect": "idempotent",
            "permission": "memory:write",
            "upstream": {"mcp": {"command": command, "tool": "create_entities"}}}


# Pinned (installs.py): the tests read its tools' arguments and its store's lines.


@pytest.fixture(scope="session")
def server_memory() -> Path:
    """``@modelcontextprotocol/server-memory`` installed from npm into a cache folder."""
    return npm_tool(*SERVER_MEMORY, "mcp-server-memory")


def test_server_memory_from_npm_runs_as_a_stdio_upstream_and_keeps_what_unwind_created(
        server_memory: Path, tmp_path: Path) -> None:
    store = tmp_path / "memory.jsonl"
    path = tmp_path / "memory.yaml"
    path.write_text(f"""- tool: memory.create_entities
  effect: idempotent
  permission: memory:write
  upstream:
    mcp: {{ command: ["{server_memory}"], env: {{ MEMORY_FILE_PATH: "{store}" }}, tool: create_entities }}
- tool: memory.read_graph
  effect: read_only
  permission: memory:write
  upstream:
    mcp: {{ command: ["{server_memory}"], env: {{ MEMORY_FILE_PATH: "{store}" }}, tool: read_graph }}
""")
    gw = start_gateway(path, tmp_path / "ledger", tmp_path, scopes="memory:write")
    try:
        entities = [{"name": "unwind", "entityType": "project", "observations": ["undoes calls"]},
                    {"name": "gateway", "entityType": "component", "observations": []}]
        r = gw.call("memory.create_entities", {"entities": entities})
        assert r.status_code == 200, r.text
        graph = gw.call("memory.read_graph", {})
        assert graph.status_code == 200, graph.text
        assert {"unwind", "gateway"} <= {e["name"] for e in graph.json()["entities"]}
    finally:
        stop(gw.proc)
    # the server wrote what Unwind sent, read straight from its store
    names = {json.loads(line).get("name") for line in store.read_text().splitlines() if line}
    assert {"unwind", "gateway"} <= names


def test_entities_created_through_unwind_on_server_memory_are_gone_after_unwind_rollback(
        server_memory: Path, tmp_path: Path) -> None:
    import contextlib
    import io

    from unwind.cli.main import main

    store = tmp_path / "memory.jsonl"
    server = f'command: ["{server_memory}"], env: {{ MEMORY_FILE_PATH: "{store}" }}'
    path = tmp_path / "memory.yaml"
    path.write_text(f"""- tool: memory.create_entities
  effect: reversible
  permission: memory:write
  upstream:
    mcp: {{ {server}, tool: create_entities }}
  compensation:
    tool: memory.delete_entities
    kind: inverse
    argument_map:
      entityNames: "$args.entities[*].name"
- tool: memory.delete_entities
  effect: idempotent
  permission: memory:write
  upstream:
    mcp: {{ {server}, tool: delete_entities }}
""")
    gw = start_gateway(path, tmp_path / "ledger", tmp_path, scopes="memory:write")
    try:
        entities = [{"name": "unwind", "entityType": "project", "observations": []},
                    {"name": "gateway", "entityType": "component", "observations": []}]
        r = gw.call("memory.create_entities", {"entities": entities}, run="run-mem")
        assert r.status_code == 200, r.text
    finally:
        stop(gw.proc)
    names = {json.loads(line).get("name") for line in store.read_text().splitlines() if line}
    assert {"unwind", "gateway"} <= names
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["rollback", "--ledger", str(tmp_path / "ledger" / "run-mem.json"), "-m",
                     str(path), "--yes"])
    assert code == 0, out.getvalue() + err.getvalue()
    names = {json.loads(line).get("name") for line in store.read_text().splitlines() if line}
    assert not names & {"unwind", "gateway"}, store.read_text()  # read straight from its store
