"""/mcp driven by the official MCP client: the same enforcement as REST, the report in _meta."""

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

from unwind.manifest.lint import schema_hash_of
from upstream.mcp_server import SCHEMA  # tests/ is on the path (its packages are top-level)

from .conftest import ROOT, GatewayProc, UpstreamProc, env, free_port, start_gateway, stop, wait_for

COMMENT = {"repo": "octo/hello", "issue": 3, "client_id": "mcp", "body": "via mcp"}


@asynccontextmanager
async def mcp_client(gateway: GatewayProc, run: str | None) -> AsyncIterator[Client]:
    headers = {"X-Unwind-Run": run} if run else {}
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http, \
            Client(streamable_http_client(f"{gateway.url}/mcp", http_client=http)) as client:
        yield client


def structured(result: Any) -> dict[str, Any]:
    return dict(json.loads(result.content[0].text))


async def test_tools_list_gives_each_tools_effect_class_and_contract(gateway: GatewayProc) -> None:
    async with mcp_client(gateway, "run-list") as client:
        listed = (await client.list_tools()).tools
    # keyed by the manifest's name (served as github__create_comment: test_mcp_door.py)
    tools = {t.meta["unwind.dev/tool"]: t for t in listed if t.meta is not None}
    assert len(tools) == len(listed)
    assert "test.draft_only" not in tools  # a draft is not served
    comment = tools["github.create_comment"]
    assert comment.meta is not None
    assert comment.meta["unwind.dev/effect_class"] == "reversible"
    contract = comment.meta["unwind.dev/effect_contract"]
    assert contract["undo"]["kind"] == "inverse" and contract["undo"]["tool"] == "github.delete_comment"
    assert tools["github.create_release"].meta["unwind.dev/effect_contract"]["draft"]["promote"] \
        == "github.publish_release"  # type: ignore[index]


async def test_a_tools_call_runs_once_and_answers_with_the_effect_report(
        gateway: GatewayProc, upstream: UpstreamProc, run_name: str) -> None:
    async with mcp_client(gateway, run_name) as client:
        result = await client.call_tool("github.create_comment", COMMENT,
                                        meta={"idempotency_key": "mcp-1"})
        again = await client.call_tool("github.create_comment", COMMENT,
                                       meta={"idempotency_key": "mcp-2"})
    assert not result.is_error
    assert structured(result)["body"] == "via mcp"
    assert result.meta is not None
    effect = result.meta["effect"]
    assert effect["ledger"] == {"name": run_name, "entry": "mcp-1"}
    assert effect["undo"]["tool"] == "github.delete_comment"
    assert again.is_error and structured(again)["error"]["code"] == "duplicate"
    assert structured(again)["error"]["entry"] == "mcp-1"
    assert upstream.count() == 1
    assert gateway.entries(run_name)[0]["state"] == "succeeded"


async def test_a_malformed_meta_an_unknown_tool_and_a_missing_run_are_refused(
        gateway: GatewayProc, upstream: UpstreamProc, run_name: str) -> None:
    async with mcp_client(gateway, run_name) as client:
        bad_stage = await client.call_tool("github.create_comment", COMMENT, meta={"stage": "yes"})
        bad_key = await client.call_tool("github.create_comment", COMMENT,
                                         meta={"idempotency_key": 42})
        unknown = await client.call_tool("github.nope", {})
        staged = await client.call_tool("github.publish_release", {"release_id": 1},
                                        meta={"stage": True})
    assert structured(bad_stage)["error"] == {"code": "validation_error",
                                              "message": "_meta.stage must be a boolean"}
    assert structured(bad_key)["error"]["message"] == "_meta.idempotency_key must be a string"
    assert structured(unknown)["error"]["code"] == "not_found"
    assert structured(staged)["error"]["code"] == "unsupported_operation"
    assert upstream.count() == 0
    async with mcp_client(gateway, None) as client:
        no_run = await client.call_tool("github.create_comment", COMMENT)
    assert no_run.is_error and "X-Unwind-Run" in structured(no_run)["error"]["message"]


async def test_staging_and_dry_run_over_mcp(gateway: GatewayProc, upstream: UpstreamProc,
                                            run_name: str) -> None:
    async with mcp_client(gateway, run_name) as client:
        dry = await client.call_tool("github.create_issue", {"repo": "o/r", "title": "d"},
                                     meta={"dry_run": True})
        staged = await client.call_tool("github.create_release", {"repo": "o/r", "tag": "v2"},
                                        meta={"stage": True})
    assert structured(dry)["dry_run"] is True and upstream.count("issues.create") == 0
    assert staged.meta is not None and staged.meta["effect"]["staged"]["promote"] == \
        "github.publish_release"


@pytest.fixture
def mcp_upstream(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    log = tmp_path / "mcp-upstream.log"
    flags = ["--changed"] if getattr(request, "param", False) else []
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tests.upstream.mcp_server", "--port",
                                 str(port), *flags], cwd=ROOT, env=env(), stdout=out,
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        wait_for(f"http://127.0.0.1:{port}/", proc, log)
        yield url
    finally:
        stop(proc)


def echo_manifest(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "echo.yaml"
    path.write_text(f"""- tool: test.echo
  effect: read_only
  permission: test:write
  schema_hash: "{schema_hash_of(SCHEMA)}"
  upstream: {{ mcp: {{ url: "{url}", tool: echo }} }}
""")
    return path


@pytest.mark.parametrize("mcp_upstream", [False], indirect=True)
async def test_an_mcp_upstream_is_called_and_its_input_schema_is_listed(
        mcp_upstream: str, tmp_path: Path) -> None:
    gw = start_gateway(echo_manifest(tmp_path, mcp_upstream), tmp_path / "ledger", tmp_path)
    try:
        async with mcp_client(gw, "run-echo") as client:
            [tool] = (await client.list_tools()).tools
            result = await client.call_tool("test.echo", {"text": "hi"})
        assert tool.input_schema == SCHEMA
        assert result.structured_content == {"echo": "hi"}
        assert [c.text for c in result.content] == ["hi"]  # type: ignore[union-attr]  # its own blocks
    finally:
        stop(gw.proc)


@pytest.mark.parametrize("mcp_upstream", [True], indirect=True)
def test_a_changed_upstream_schema_refuses_the_call_as_schema_drift(
        mcp_upstream: str, tmp_path: Path) -> None:
    gw = start_gateway(echo_manifest(tmp_path, mcp_upstream), tmp_path / "ledger", tmp_path)
    try:
        r = gw.call("test.echo", {"text": "hi", "loud": True})
        assert r.status_code == 403
        assert r.json()["error"]["code"] == "schema_drift"
        assert "review the manifest again" in r.json()["error"]["message"]
    finally:
        stop(gw.proc)
