"""Streaming /mcp (issue 30 #4): an upstream's progress and log messages reach the client on
an SSE stream, the client's cancellation reaches the upstream, and the ledger records the
call exactly as it does for a JSON answer; over HTTP and stdio upstreams alike.

The upstreams are real servers: ``@modelcontextprotocol/server-everything`` from npm (its
``trigger-long-running-operation`` tool reports progress), over streamable HTTP and over
stdio, and tests/upstream/mcp_stdio_server.py's ``slow`` tool (the Python SDK's MCPServer;
it logs each step and says on stderr, which reaches the gateway's log, when it is
cancelled). The caller is the official ``mcp`` client, in both protocol eras.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from .conftest import ROOT, GatewayProc, free_port, start_gateway, stop
from .installs import EVERYTHING, npm_tool

ERAS = ["auto", "legacy"]  # 2026-07-28 (the client's default against this gateway), handshake


@pytest.fixture(scope="module")
def everything() -> Path:
    return npm_tool(*EVERYTHING)


@pytest.fixture(scope="module")
def everything_http(everything: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """server-everything over streamable HTTP on a free port; its /mcp URL."""
    port = free_port()
    log = tmp_path_factory.mktemp("everything") / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([str(everything), "streamableHttp"], env={**os.environ,
                                "PORT": str(port)}, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while b"listening on port" not in log.read_bytes():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(10)


def manifests(folder: Path, everything: Path, http_url: str) -> Path:
    path = folder / "streaming.yaml"
    python = json.dumps([sys.executable, "-m", "tests.upstream.mcp_stdio_server"])
    path.write_text(f"""- tool: everything.long_http
  effect: read_only
  permission: test:write
  upstream:
    mcp: {{ url: "{http_url}", tool: trigger-long-running-operation }}
    timeout_ms: 20s
- tool: everything.long_stdio
  effect: read_only
  permission: test:write
  upstream:
    mcp: {{ command: ["{everything}", stdio], tool: trigger-long-running-operation }}
    timeout_ms: 20s
# idempotent, as a stand-in for a slow write: a cancelled call may have acted
- tool: notes.slow
  effect: idempotent
  permission: test:write
  upstream:
    mcp: {{ command: {python}, env: {{ PYTHONPATH: "{ROOT}" }}, cwd: "{ROOT}", tool: slow }}
    timeout_ms: 30s
""")
    return folder


@pytest.fixture(scope="module")
def gateway(everything: Path, everything_http: str,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProc]:
    base = tmp_path_factory.mktemp("streaming")
    gw = start_gateway(manifests(base, everything, everything_http), base / "ledger", base)
    try:
        yield gw
    finally:
        stop(gw.proc)


@asynccontextmanager
async def client(gateway: GatewayProc, run: str, mode: str = "auto",
                 **options: Any) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(headers={"X-Unwind-Run": run}, timeout=60) as http, \
            Client(streamable_http_client(f"{gateway.url}/mcp", http_client=http), mode=mode,
                   **options) as c:
        yield c


def entry_of(gateway: GatewayProc, run: str) -> dict[str, Any]:
    [entry] = gateway.entries(run)
    return entry


async def wait_for_entry(gateway: GatewayProc, run: str, state: str,
                         seconds: float = 20) -> dict[str, Any]:
    deadline = time.monotonic() + seconds
    while True:
        entries = gateway.entries(run)
        if entries and entries[0]["state"] == state:
            return entries[0]
        assert time.monotonic() < deadline, entries
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("mode", ERAS)
@pytest.mark.parametrize("tool", ["everything__long_http", "everything__long_stdio"])
async def test_server_everythings_progress_reaches_the_official_client_through_the_gateway(
        gateway: GatewayProc, run_name: str, mode: str, tool: str) -> None:
    seen: list[tuple[float, float | None]] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append((value, total))
    run = f"{run_name}-{mode}"
    async with client(gateway, run, mode) as c:
        result = await c.call_tool(tool, {"duration": 1, "steps": 4}, progress_callback=progress)
    assert not result.is_error, result
    assert "Long running operation completed" in result.content[0].text
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert entry_of(gateway, run)["state"] == "succeeded"


async def test_a_call_that_streams_is_recorded_exactly_as_the_same_call_answered_as_json(
        gateway: GatewayProc, run_name: str) -> None:
    async def progress(value: float, total: float | None, message: str | None) -> None:
        pass
    args = {"duration": 0.4, "steps": 2}
    async with client(gateway, f"{run_name}-json", "legacy") as c:
        plain = await c.call_tool("everything__long_http", args)
    async with client(gateway, f"{run_name}-sse", "legacy") as c:
        streamed = await c.call_tool("everything__long_http", args, progress_callback=progress)
    assert plain.content == streamed.content

    def comparable(entry: dict[str, Any]) -> dict[str, Any]:
        report = {k: v for k, v in entry["report"].items() if k not in ("ledger", "finished")}
        return {"state": entry["state"], "tool": entry["tool"], "handle": entry["handle"],
                "error": entry.get("error"), "report": report}
    assert comparable(entry_of(gateway, f"{run_name}-json")) == comparable(
        entry_of(gateway, f"{run_name}-sse"))


@pytest.mark.parametrize("mode", ERAS)
async def test_the_upstreams_log_messages_reach_the_client_with_its_progress(
        gateway: GatewayProc, run_name: str, mode: str) -> None:
    logs: list[str] = []
    seen: list[str | None] = []

    async def on_log(params: Any) -> None:
        logs.append(str(params.data))

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append(message)
    run = f"{run_name}-{mode}"
    async with client(gateway, run, mode, logging_callback=on_log, log_level="info") as c:
        result = await c.call_tool("notes__slow", {"steps": 3, "step_s": 0.05, "tag": run},
                                   progress_callback=progress)
    assert not result.is_error, result
    assert seen == ["step 1 of 3", "step 2 of 3", "step 3 of 3"]
    assert [line for line in logs if run in line] == [
        f"slow {run} reached step {i}" for i in (1, 2, 3)], logs


@pytest.mark.parametrize("mode", ERAS)
async def test_a_client_that_cancels_cancels_the_upstream_call_and_the_entry_is_uncertain(
        gateway: GatewayProc, run_name: str, mode: str) -> None:
    run = f"{run_name}-{mode}"
    steps: list[float] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        steps.append(value)
    async with client(gateway, run, mode) as c:
        with anyio.move_on_after(8):  # cancelled once the upstream is under way
            async def cancel_after_two_steps(scope: anyio.CancelScope) -> None:
                while len(steps) < 2:
                    await asyncio.sleep(0.05)
                scope.cancel()
            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel_after_two_steps, tg.cancel_scope)
                await c.call_tool("notes__slow", {"steps": 50, "step_s": 0.2, "tag": run},
                                  progress_callback=progress)
                raise AssertionError("the call ended before it was cancelled")
        entry = await wait_for_entry(gateway, run, "uncertain")  # the client still open
    assert "cancelled" in entry["error"]["message"], entry
    deadline = time.monotonic() + 10
    while f"slow {run} was cancelled" not in gateway.log.read_text():
        assert time.monotonic() < deadline, gateway.log.read_text()[-3000:]
        await asyncio.sleep(0.1)
    assert f"slow {run} finished" not in gateway.log.read_text()


async def test_a_handshake_era_client_cancels_a_call_answered_as_json_too(
        gateway: GatewayProc, run_name: str) -> None:
    async with client(gateway, run_name, "legacy") as c:
        with anyio.move_on_after(1.5):  # no progress asked: the answer would be one JSON body
            await c.call_tool("notes__slow", {"steps": 50, "step_s": 0.2, "tag": run_name})
            raise AssertionError("the call ended before it was cancelled")
        entry = await wait_for_entry(gateway, run_name, "uncertain")
    assert "notifications/cancelled" in entry["error"]["message"], entry


def cancel_post(gateway: GatewayProc, run: str, request_id: int) -> httpx2.Response:
    return httpx2.post(f"{gateway.url}/mcp", headers={
        "X-Unwind-Run": run, "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"},
        json={"jsonrpc": "2.0", "method": "notifications/cancelled",
              "params": {"requestId": request_id, "reason": "not mine"}}, timeout=10)


async def test_a_cancellation_naming_another_runs_request_cancels_nothing(
        gateway: GatewayProc, run_name: str) -> None:
    async with client(gateway, run_name, "legacy") as c:
        call = asyncio.ensure_future(c.call_tool(
            "notes__slow", {"steps": 4, "step_s": 0.25, "tag": run_name}))
        await asyncio.sleep(0.5)
        for request_id in range(1, 5):  # whatever id the client gave it, from another run
            assert (await asyncio.to_thread(cancel_post, gateway, f"{run_name}-other",
                                            request_id)).status_code == 202
        result = await call
    assert not result.is_error, result
    assert entry_of(gateway, run_name)["state"] == "succeeded"


def test_the_log_level_key_the_mcp_client_sends_is_the_sdks() -> None:
    import mcp_types

    from unwind.upstream import mcp_client
    assert mcp_client.LOG_LEVEL_META_KEY == mcp_types.LOG_LEVEL_META_KEY


def raw_call(gateway: GatewayProc, run: str, version: str, accept: str,
             meta: dict[str, Any]) -> httpx2.Response:
    headers = {"X-Unwind-Run": run, "Content-Type": "application/json", "Accept": accept,
               "MCP-Protocol-Version": version}
    params: dict[str, Any] = {"name": "notes__slow", "arguments": {"steps": 2, "step_s": 0.05,
                                                                  "tag": run}, "_meta": meta}
    if version == "2026-07-28":
        headers.update({"Mcp-Method": "tools/call", "Mcp-Name": "notes__slow"})
        params["_meta"] = {**meta, "io.modelcontextprotocol/protocolVersion": version,
                           "io.modelcontextprotocol/clientCapabilities": {}}
    return httpx2.post(f"{gateway.url}/mcp", headers=headers, timeout=30, json={
        "jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params})


@pytest.mark.parametrize("version", ["2025-11-25", "2026-07-28"])
def test_a_client_that_accepts_only_json_gets_json_even_when_it_asks_for_progress(
        gateway: GatewayProc, run_name: str, version: str) -> None:
    r = raw_call(gateway, f"{run_name}-{version[:4]}", version, "application/json",
                 {"progressToken": "p1"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert r.json()["result"]["isError"] is False, r.text


def test_a_handshake_era_client_that_only_disconnects_has_not_cancelled_its_call(
        gateway: GatewayProc, run_name: str) -> None:
    headers = {"X-Unwind-Run": run_name, "Content-Type": "application/json",
               "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2025-11-25"}
    body = {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {
        "name": "notes__slow", "arguments": {"steps": 6, "step_s": 0.25, "tag": run_name},
        "_meta": {"progressToken": "p9"}}}
    with httpx2.stream("POST", f"{gateway.url}/mcp", headers=headers, json=body,
                       timeout=30) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if "notifications/progress" in line:
                break  # one progress event seen: hang up without a cancellation
    deadline = time.monotonic() + 20
    while not gateway.entries(run_name) or gateway.entries(run_name)[0]["state"] == "pending":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert gateway.entries(run_name)[0]["state"] == "succeeded"
    assert f"slow {run_name} finished" in gateway.log.read_text()
