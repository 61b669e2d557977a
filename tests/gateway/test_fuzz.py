"""Whatever a caller sends, the gateway answers with JSON: data, or a documented error envelope."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from unwind.gateway.mcp_server import read_meta
from unwind.gateway.rest import parse_body
from unwind.upstream.errors import STATUS, Refusal

from .conftest import GatewayProc, UpstreamProc

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12)
bodies = st.one_of(
    st.binary(max_size=200),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({}, optional={"arguments": json_values, "stage": json_values,
                                        "dry_run": json_values, "extra": json_values})
    .map(lambda v: json.dumps(v).encode()),
)
metas = st.dictionaries(st.sampled_from(["idempotency_key", "stage", "dry_run", "example.com/note",
                                         "other"]), json_values, max_size=4)
TOOLS = ["github.create_comment", "github.create_issue", "stripe.create_charge", "github.nope",
         "test.draft_only", "a/b/../c", "%00", "x" * 200]
LIVE = settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])


def assert_envelope(status: int, body: Any) -> None:
    if status >= 400:
        error = body["error"]
        assert STATUS[error["code"]] == status
        assert isinstance(error["message"], str) and error["message"]


@given(bodies)
def test_parse_body_refuses_anything_malformed_with_a_validation_error(raw: bytes) -> None:
    try:
        arguments, stage, dry_run = parse_body(raw)
    except Refusal as refusal:
        assert refusal.code == "validation_error"
    else:
        assert isinstance(arguments, dict) and isinstance(stage, bool) and isinstance(dry_run, bool)


@given(metas)
def test_read_meta_accepts_only_well_typed_keys(meta: dict[str, Any]) -> None:
    try:
        key, stage, dry_run = read_meta(meta)
    except Refusal as refusal:
        assert refusal.code == "validation_error" and refusal.message.startswith("_meta.")
    else:
        assert key is None or isinstance(key, str)
        assert isinstance(stage, bool) and isinstance(dry_run, bool)


@LIVE
@given(tool=st.sampled_from(TOOLS), raw=bodies,
       key=st.none() | st.text(max_size=30).filter(
           # a value HTTP clients can send: no surrounding blanks (httpx refuses b" " itself)
           lambda s: s.isprintable() and s.isascii() and s == s.strip()))
def test_any_rest_body_gets_json_data_or_a_documented_error(
        gateway: GatewayProc, upstream: UpstreamProc, tool: str, raw: bytes, key: str | None) -> None:
    headers = {"X-Unwind-Run": "fuzz", "Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    r = httpx2.post(f"{gateway.url}/call/{tool}", content=raw, headers=headers, timeout=30)
    assert r.status_code != 500, r.text
    assert_envelope(r.status_code, r.json())


@settings(max_examples=15, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(meta=metas, arguments=st.dictionaries(st.text(max_size=8), json_values, max_size=3))
def test_any_meta_over_mcp_gets_a_result_never_a_crash(
        gateway: GatewayProc, upstream: UpstreamProc, meta: dict[str, Any],
        arguments: dict[str, Any]) -> None:
    async def call() -> Any:
        async with httpx2.AsyncClient(headers={"X-Unwind-Run": "fuzz-mcp"}, timeout=30) as http, \
                Client(streamable_http_client(f"{gateway.url}/mcp", http_client=http)) as client:
            return await client.call_tool("github.create_issue", arguments, meta=meta)

    result = asyncio.run(call())
    body = json.loads(result.content[0].text)
    if result.is_error:
        assert body["error"]["code"] in STATUS
