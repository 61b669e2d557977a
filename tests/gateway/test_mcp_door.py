"""The MCP door as model APIs and agent frameworks meet it (issue 19 #4, #5, #14): /mcp
without a redirect, tool names of the form model APIs accept, argument schemas served and
checked at both doors, the effect report in content for clients that drop _meta, an MCP
upstream's content blocks, output schema and annotations passed on, hints from the effect
class."""

from __future__ import annotations

import json
import re
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

from unwind.gateway.catalogue import LocalCatalogue
from unwind.gateway.mcp_server import (
    REPORT_PREFIX,
    report_in_content_default,
    wants_report_in_content,
)
from unwind.manifest.input_schema import (
    UPSTREAM_DIALECTS,
    SchemaUnusable,
    argument_problems,
    schema_problems,
)
from unwind.manifest.mcp_names import mcp_name
from upstream.mcp_blocks import LOOKUP_OUTPUT, PNG, SNAPSHOT_SCHEMA

from .conftest import ROOT, GatewayProc, UpstreamProc, env, free_port, start_gateway, stop, wait_for

MODEL_API_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
COMMENT = {"repo": "octo/hello", "issue": 3, "client_id": "door", "body": "via the door"}


@asynccontextmanager
async def mcp_client(gateway: GatewayProc, run: str | None,
                     **headers: str) -> AsyncIterator[Client]:
    sent = {"X-Unwind-Run": run} if run else {}
    async with httpx2.AsyncClient(headers={**sent, **headers}, timeout=30) as http, \
            Client(streamable_http_client(f"{gateway.url}/mcp", http_client=http)) as client:
        yield client


def error_of(result: Any) -> dict[str, Any]:
    assert result.is_error
    return dict(json.loads(result.content[0].text)["error"])


# ---- /mcp itself ----

def test_mcp_answers_at_mcp_itself_without_a_redirect(gateway: GatewayProc) -> None:
    for path in ("/mcp", "/mcp/"):
        r = httpx2.post(f"{gateway.url}{path}", json={"jsonrpc": "2.0", "id": 1,
                                                      "method": "tools/list"},
                        headers={"Accept": "application/json, text/event-stream"},
                        follow_redirects=False, timeout=10)
        assert r.status_code == 200, (path, r.status_code, r.text[:200])
        assert r.json()["result"]["tools"]


# ---- names, schemas, hints ----

async def test_every_tool_is_listed_under_a_model_api_name_with_its_schema_and_hints(
        gateway: GatewayProc) -> None:
    async with mcp_client(gateway, "run-list") as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert all(MODEL_API_NAME.match(name) for name in tools), sorted(tools)
    comment = tools["github__create_comment"]
    assert comment.meta is not None and comment.meta["unwind.dev/tool"] == "github.create_comment"
    schema = comment.input_schema
    assert schema["required"] == ["repo", "issue", "body", "client_id"]
    assert schema["properties"]["issue"]["type"] == "integer"
    hints = {name: t.annotations for name, t in tools.items()}
    assert (hints["github__create_comment"].read_only_hint,  # type: ignore[union-attr]
            hints["github__create_comment"].destructive_hint,  # type: ignore[union-attr]
            hints["github__create_comment"].idempotent_hint) == (False, False, False)  # type: ignore[union-attr]
    assert hints["github__get_comment"].read_only_hint is True  # type: ignore[union-attr]
    assert hints["github__get_comment"].idempotent_hint is True  # type: ignore[union-attr]
    assert hints["stripe__create_charge"].destructive_hint is True  # type: ignore[union-attr]
    assert hints["github__delete_comment"].idempotent_hint is True  # type: ignore[union-attr]
    assert hints["github__delete_comment"].destructive_hint is True  # type: ignore[union-attr]


async def test_a_tool_called_by_its_served_name_is_recorded_under_its_own_name(
        gateway: GatewayProc, upstream: UpstreamProc, run_name: str) -> None:
    async with mcp_client(gateway, run_name) as client:
        result = await client.call_tool("github__create_comment", COMMENT,
                                        meta={"idempotency_key": "served-1"})
    assert not result.is_error, result.content
    assert [(e["id"], e["tool"]) for e in gateway.entries(run_name)] == [
        ("served-1", "github.create_comment")]
    assert upstream.count() == 1


def test_model_api_names_map_dots_colons_and_slashes_and_bound_the_length() -> None:
    assert mcp_name("github.create_issue") == "github__create_issue"
    assert mcp_name("ns:tool/v2") == "ns__tool__v2"
    assert mcp_name("plain_name-1") == "plain_name-1"
    long = "a." * 60 + "b"
    served = mcp_name(long)
    assert len(served) == 64 and MODEL_API_NAME.match(served)
    assert served != mcp_name("a." * 60 + "c")


def test_two_tools_served_under_one_mcp_name_refuse_the_catalogue(tmp_path: Path) -> None:
    (tmp_path / "tools.yaml").write_text(
        "- {tool: shop.get_order, effect: read_only, permission: shop:read}\n"
        "- {tool: shop__get_order, effect: read_only, permission: shop:read}\n")
    catalogue = LocalCatalogue([tmp_path])
    assert not catalogue.ready
    assert catalogue.problem is not None
    assert "would both be served over MCP as 'shop__get_order'" in catalogue.problem
    assert "shop.get_order" in catalogue.problem


# ---- arguments checked at both doors ----

async def test_arguments_the_schema_refuses_are_refused_at_both_doors_and_never_recorded(
        gateway: GatewayProc, upstream: UpstreamProc, run_name: str) -> None:
    missing = {k: v for k, v in COMMENT.items() if k != "body"}
    wrong = {**COMMENT, "issue": "three"}
    rest = gateway.call("github.create_comment", missing, run=run_name)
    assert rest.status_code == 400
    assert rest.json()["error"]["code"] == "validation_error"
    assert "arguments.body: 'body' is a required property" in rest.json()["error"]["message"]
    rest_wrong = gateway.call("github.create_comment", wrong, run=run_name)
    assert "arguments.issue: 'three' is not of type 'integer'" in \
        rest_wrong.json()["error"]["message"]
    async with mcp_client(gateway, run_name) as client:
        by_mcp = await client.call_tool("github__create_comment", missing)
        by_old_name = await client.call_tool("github.create_comment", wrong)
    assert error_of(by_mcp)["code"] == "validation_error"
    assert "arguments.body: 'body' is a required property" in error_of(by_mcp)["message"]
    assert "arguments.issue: 'three' is not of type 'integer'" in error_of(by_old_name)["message"]
    assert gateway.entries(run_name) == []
    assert upstream.count() == 0
    assert "'three'" not in gateway.log.read_text()  # the log names fields, not values


def test_an_argument_schema_fetches_nothing_and_a_ref_loop_is_the_schemas_fault() -> None:
    remote = {"type": "object", "properties": {"x": {"$ref": "http://127.0.0.1:9/x.json"}}}
    assert schema_problems(remote)[0][0] == "input_schema.properties.x.$ref"
    with pytest.raises(SchemaUnusable, match="cannot be resolved"):
        argument_problems(remote, {"x": 1})  # evaluated anyway: refused, not fetched
    loop = {"type": "object", "properties": {"x": {"$ref": "#/properties/x"}}}
    with pytest.raises(SchemaUnusable, match="recurses"):
        argument_problems(loop, {"x": 1})
    dangling = {"type": "object", "properties": {"x": {"$ref": "#/$defs/owner"}}}
    assert "points to nothing in the schema" in schema_problems(dangling)[0][1]
    anchored = {"type": "object", "properties": {"x": {"$ref": "#owner"}},
                "$defs": {"o": {"$anchor": "owner", "type": "string"}}}
    assert schema_problems(anchored) == []
    assert argument_problems(anchored, {"x": 1}) == [("arguments.x", "1 is not of type 'string'")]
    nested = {"type": "object", "properties": {"items": {"type": "array", "items": {
        "type": "object", "required": ["name"]}}}}
    assert argument_problems(nested, {"items": [{"name": "a"}, {}]}) == [
        ("arguments.items[1].name", "'name' is a required property")]


def test_an_mcp_upstreams_draft_07_schema_is_checked_with_its_own_dialect() -> None:
    zod = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
           "properties": {"entities": {"type": "array", "items": {"$ref": "#/definitions/e"}}},
           "definitions": {"e": {"type": "object", "required": ["name"]}},
           "required": ["entities"], "additionalProperties": False}
    assert "2020-12 only" in schema_problems(zod)[0][1]  # not in a manifest
    assert schema_problems(zod, "inputSchema", UPSTREAM_DIALECTS) == []
    assert argument_problems(zod, {"entities": [{}], "extra": 1}) == [
        ("arguments", "Additional properties are not allowed ('extra' was unexpected)"),
        ("arguments.entities[0].name", "'name' is a required property")]


# ---- the report in content ----

async def test_the_effect_report_reaches_a_client_that_drops_meta_when_it_asks(
        gateway: GatewayProc, run_name: str) -> None:
    async with mcp_client(gateway, run_name, **{"X-Unwind-Report": "content"}) as client:
        asked = await client.call_tool("github__create_comment", {**COMMENT, "client_id": "r1"})
    async with mcp_client(gateway, run_name) as client:
        plain = await client.call_tool("github__create_comment", {**COMMENT, "client_id": "r2"})
    assert not asked.is_error and asked.meta is not None
    last = asked.content[-1]
    assert last.type == "text" and last.text.startswith(REPORT_PREFIX)
    report = json.loads(last.text[len(REPORT_PREFIX):])
    assert report == asked.meta["effect"]
    assert report["undo"]["tool"] == "github.delete_comment"
    assert len(plain.content) == 1 and not plain.content[0].text.startswith(REPORT_PREFIX)


async def test_a_gateway_started_with_the_report_in_content_adds_it_to_every_answer(
        manifests: Path, tmp_path: Path, upstream: UpstreamProc) -> None:
    gw = start_gateway(manifests, tmp_path / "ledger", tmp_path, "--report-in-content")
    try:
        async with mcp_client(gw, "run-content") as client:
            result = await client.call_tool("github__create_comment", COMMENT)
            declined = await client.call_tool("github__create_comment",
                                              {**COMMENT, "client_id": "x"})
        async with mcp_client(gw, "run-content", **{"X-Unwind-Report": "meta"}) as client:
            meta_only = await client.call_tool("github__create_comment",
                                               {**COMMENT, "client_id": "y"})
    finally:
        stop(gw.proc)
    assert result.content[-1].text.startswith(REPORT_PREFIX)  # type: ignore[union-attr]
    assert declined.content[-1].text.startswith(REPORT_PREFIX)  # type: ignore[union-attr]
    assert len(meta_only.content) == 1


def test_the_environment_turns_the_report_in_content_on_for_every_request(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNWIND_REPORT_IN_CONTENT", "1")
    assert report_in_content_default() is True
    assert wants_report_in_content({}, True) is True
    assert wants_report_in_content({"x-unwind-report": "meta"}, True) is False
    monkeypatch.delenv("UNWIND_REPORT_IN_CONTENT")
    assert report_in_content_default() is False
    assert wants_report_in_content({"x-unwind-report": "content"}, False) is True


# ---- an MCP upstream's blocks, output schema and annotations ----

@pytest.fixture
def blocks_upstream(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    log = tmp_path / "mcp-blocks.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tests.upstream.mcp_blocks", "--port",
                                 str(port)], cwd=ROOT, env=env(), stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        wait_for(f"http://127.0.0.1:{port}/", proc, log)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop(proc)


async def test_an_mcp_upstreams_blocks_output_schema_and_annotations_pass_through(
        blocks_upstream: str, tmp_path: Path) -> None:
    path = tmp_path / "blocks.yaml"
    path.write_text(f"""- tool: media.snapshot
  effect: read_only
  permission: test:write
  upstream: {{ mcp: {{ url: "{blocks_upstream}", tool: snapshot }} }}
- tool: kv.lookup
  effect: read_only
  permission: test:write
  upstream: {{ mcp: {{ url: "{blocks_upstream}", tool: lookup }} }}
""")
    gw = start_gateway(path, tmp_path / "ledger", tmp_path)
    try:
        async with mcp_client(gw, "run-blocks") as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            image = await client.call_tool("media__snapshot", {"name": "home"})
            looked = await client.call_tool("kv__lookup", {"key": "k"})
            refused = await client.call_tool("media__snapshot", {})
    finally:
        stop(gw.proc)
    snapshot, lookup = tools["media__snapshot"], tools["kv__lookup"]
    assert snapshot.input_schema == SNAPSHOT_SCHEMA and snapshot.title == "Take a snapshot"
    assert snapshot.annotations is not None and snapshot.annotations.title == "Snapshot"
    assert lookup.output_schema == LOOKUP_OUTPUT
    assert lookup.annotations is not None and lookup.annotations.open_world_hint is True
    assert lookup.annotations.read_only_hint is True  # from the effect class
    assert not image.is_error, image.content
    assert [c.type for c in image.content] == ["image", "text"]
    assert image.content[0].data == PNG and image.content[0].mime_type == "image/png"  # type: ignore[union-attr]
    assert image.structured_content is None
    assert [c.text for c in looked.content] == ["key = 7"]  # type: ignore[union-attr]
    assert looked.structured_content == {"key": "k", "value": 7}
    assert error_of(refused)["code"] == "validation_error"  # the upstream's own schema
    assert "arguments.name: 'name' is a required property" in error_of(refused)["message"]
    entries = gw.entries("run-blocks")
    assert [e["tool"] for e in entries] == ["media.snapshot", "kv.lookup"]
