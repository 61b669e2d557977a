"""What the MCP door passes on (issue 30 #5, #6): the report for a client that keeps only
structured content, an MCP upstream's result and tool listing as it sent them, and an
upstream's error named as what it is, at both doors.

The upstreams: tests/upstream/mcp_raw.py (plain JSON-RPC, so it can list a field no SDK
knows yet and answer structured content equal to its blocks), tests/upstream/mcp_blocks.py
(an output schema that takes more properties), server-everything from npm (``execution``
on a tool of its own) and the REST test upstream of conftest.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from unwind.gateway.mcp_server import REPORT_KEY, REPORT_PREFIX
from upstream.mcp_raw import BLOCKS_SCHEMA, LATER

from .conftest import ROOT, GatewayProc, env, free_port, start_gateway, stop, wait_for
from .installs import EVERYTHING, npm_tool

COMMENT = {"repo": "octo/hello", "issue": 3, "client_id": "answers", "body": "hello"}


def serve(module: str, folder: Path) -> Iterator[str]:
    port = free_port()
    log = folder / f"{module}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", f"tests.upstream.{module}", "--port",
                                 str(port)], cwd=ROOT, env=env(), stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        wait_for(f"http://127.0.0.1:{port}/", proc, log)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def mcp_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProc]:
    base = tmp_path_factory.mktemp("answers")
    everything = npm_tool(*EVERYTHING)
    raw, blocks = serve("mcp_raw", base), serve("mcp_blocks", base)
    raw_url, blocks_url = next(raw), next(blocks)
    (base / "m.yaml").write_text(f"""- tool: files.read_image
  effect: read_only
  permission: test:write
  upstream: {{ mcp: {{ url: "{raw_url}", tool: read_image }} }}
- tool: files.broken
  effect: idempotent
  permission: test:write
  upstream: {{ mcp: {{ url: "{raw_url}", tool: broken }} }}
- tool: kv.strict_lookup
  effect: read_only
  permission: test:write
  upstream: {{ mcp: {{ url: "{raw_url}", tool: strict_lookup }} }}
- tool: kv.lookup
  effect: read_only
  permission: test:write
  upstream: {{ mcp: {{ url: "{blocks_url}", tool: lookup }} }}
- tool: everything.research
  effect: read_only
  permission: test:write
  upstream: {{ mcp: {{ command: ["{everything}", stdio], tool: simulate-research-query }} }}
""")
    gw = start_gateway(base / "m.yaml", base / "ledger", base)
    try:
        yield gw
    finally:
        stop(gw.proc)
        for server in (raw, blocks):
            server.close()


@asynccontextmanager
async def client(gateway: GatewayProc, run: str, mode: str = "auto",
                 **headers: str) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(headers={"X-Unwind-Run": run, **headers}, timeout=30) as http, \
            Client(streamable_http_client(f"{gateway.url}/mcp", http_client=http),
                   mode=mode) as c:
        yield c


def raw_tools(gateway: GatewayProc, version: str) -> dict[str, dict[str, Any]]:
    headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": version,
               "Content-Type": "application/json"}
    params: dict[str, Any] = {}
    if version == "2026-07-28":
        headers["Mcp-Method"] = "tools/list"
        params = {"_meta": {"io.modelcontextprotocol/protocolVersion": version,
                            "io.modelcontextprotocol/clientCapabilities": {}}}
    r = httpx2.post(f"{gateway.url}/mcp", headers=headers, timeout=10,
                    json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": params})
    assert r.status_code == 200, r.text
    return {t["name"]: t for t in r.json()["result"]["tools"]}


# ---- tools/list as the upstream listed it ----

@pytest.mark.parametrize("version", ["2025-11-25", "2026-07-28"])
def test_tools_list_passes_on_fields_the_sdk_does_not_know_and_execution(
        mcp_gateway: GatewayProc, version: str) -> None:
    tools = raw_tools(mcp_gateway, version)
    image = tools["files__read_image"]
    assert image["x-later-field"] == LATER["x-later-field"]
    assert image["execution"] == {"taskSupport": "optional"}
    assert image["outputSchema"] == BLOCKS_SCHEMA
    assert image["_meta"]["unwind.dev/tool"] == "files.read_image"  # the door's own stays
    assert tools["everything__research"]["execution"] == {"taskSupport": "required"}


# ---- results as the upstream sent them ----

@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_structured_content_equal_to_the_blocks_reaches_the_official_client_as_sent(
        mcp_gateway: GatewayProc, run_name: str, mode: str) -> None:
    async with client(mcp_gateway, f"{run_name}-{mode}", mode) as c:
        await c.list_tools()  # so the client checks the result against the output schema
        result = await c.call_tool("files__read_image", {"path": "/tmp/a.png"})
    assert not result.is_error, result
    assert [b.type for b in result.content] == ["image", "text"]
    blocks = [b.model_dump(mode="json", by_alias=True, exclude_none=True) for b in result.content]
    assert result.structured_content == {"content": blocks}


async def test_an_mcp_tool_error_is_named_as_one_at_both_doors(
        mcp_gateway: GatewayProc, run_name: str) -> None:
    async with client(mcp_gateway, run_name) as c:
        result = await c.call_tool("files__broken", {})
    assert result.is_error
    error = json.loads(result.content[0].text)["error"]
    rest = mcp_gateway.call("files.broken", {}, run=run_name).json()["error"]
    for said in (error, rest):
        assert "answered with an error (isError): the disk is full" in said["message"], said
        assert "400" not in said["message"] and "upstream_status" not in said
    assert [e["state"] for e in mcp_gateway.entries(run_name)] == ["failed", "failed"]


# ---- the report for a client that keeps only structured content ----

def report_of(result: Any) -> dict[str, Any]:
    last = result.content[-1]
    assert last.type == "text" and last.text.startswith(REPORT_PREFIX)
    return dict(json.loads(last.text[len(REPORT_PREFIX):]))


async def test_a_tool_without_an_output_schema_answers_without_structured_content_when_the_report_is_asked_in_content(
        gateway: GatewayProc, run_name: str) -> None:
    async with client(gateway, run_name, **{"X-Unwind-Report": "content"}) as c:
        asked = await c.call_tool("github__create_comment", COMMENT)
    async with client(gateway, run_name) as c:
        plain = await c.call_tool("github__create_comment", {**COMMENT, "client_id": "p"})
    assert asked.structured_content is None  # so a client reads the text blocks: both
    assert json.loads(asked.content[0].text)["body"] == "hello"  # type: ignore[union-attr]
    assert report_of(asked)["undo"]["tool"] == "github.delete_comment"
    assert plain.structured_content is not None and plain.structured_content["body"] == "hello"


async def test_an_output_schema_that_takes_more_properties_gets_the_report_under_its_key(
        mcp_gateway: GatewayProc, run_name: str) -> None:
    async with client(mcp_gateway, run_name, **{"X-Unwind-Report": "content"}) as c:
        await c.list_tools()  # the official client then checks the result against the schema
        result = await c.call_tool("kv__lookup", {"key": "k"})
    assert not result.is_error, result
    assert result.structured_content is not None
    assert result.structured_content["value"] == 7
    assert result.structured_content[REPORT_KEY] == report_of(result) == result.meta["effect"]  # type: ignore[index]


async def test_an_output_schema_that_takes_no_more_properties_keeps_the_structured_content_as_sent(
        mcp_gateway: GatewayProc, run_name: str) -> None:
    async with client(mcp_gateway, run_name, **{"X-Unwind-Report": "content"}) as c:
        await c.list_tools()
        result = await c.call_tool("kv__strict_lookup", {})
    assert not result.is_error, result
    assert result.structured_content == {"key": "k"}
    assert report_of(result)["class"] == "read_only"  # in the last text block only
