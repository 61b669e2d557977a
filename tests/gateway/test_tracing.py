"""OpenTelemetry: `unwind gateway` with the standard OTEL_* variables exports its spans over
OTLP/HTTP to a receiver (tests/gateway/otlp_receiver.py decodes them): a SERVER span per call
parented on the caller's traceparent (header, or MCP params._meta), CLIENT spans for the
upstream call and the ledger writes, the entry id as an attribute, no argument values; the
entry keeps the call's traceparent for the undo Jobs (tests/rollback/test_undo_step.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from .conftest import GatewayProc, UpstreamProc, start_gateway, stop
from .otlp_receiver import Receiver

COMMENT = {"repo": "octo/hello", "issue": 7, "client_id": "trace-1", "body": "a secret-ish body"}
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.close()


@pytest.fixture(scope="module")
def traced(manifests: Path, receiver: Receiver,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProc]:
    base = tmp_path_factory.mktemp("traced")
    gw = start_gateway(manifests, base / "ledger", base, env_extra={
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_SERVICE_NAME": "gw-under-test"})
    try:
        yield gw
    finally:
        stop(gw.proc)


def test_a_rest_call_is_a_server_span_parented_on_traceparent_with_client_spans_under_it(
        traced: GatewayProc, receiver: Receiver, upstream: UpstreamProc) -> None:
    r = httpx2.post(f"{traced.url}/call/github.create_comment", json={"arguments": COMMENT},
                    headers={"Content-Type": "application/json", "X-Unwind-Run": "traced-1",
                             "Idempotency-Key": "t-entry-1",
                             "traceparent": f"00-{TRACE}-{PARENT}-01"}, timeout=30)
    assert r.status_code == 200
    server = receiver.wait(lambda s: s.kind == "SERVER" and s.trace_id == TRACE)[0]
    assert server.parent_id == PARENT and server.service == "gw-under-test"
    assert server.name == "execute_tool github.create_comment"
    assert server.attributes["gen_ai.tool.name"] == "github.create_comment"
    assert server.attributes["unwind.entry.id"] == "t-entry-1"
    assert server.attributes["unwind.run"] == "traced-1"
    children = receiver.wait(lambda s: s.parent_id == server.span_id and len(
        [c for c in receiver.spans if c.parent_id == server.span_id]) >= 3)
    names = sorted(s.name for s in children)
    assert "POST github.create_comment" in names
    assert names.count("unwind.ledger create") + names.count("unwind.ledger transition") >= 2
    assert all(s.kind == "CLIENT" for s in children)
    sent = [q for q in upstream.admin("requests")["requests"] if q["route"] == "comments.create"]
    assert sent  # the upstream call carried the trace on (the test upstream logs no headers)
    values = " ".join(str(v) for s in receiver.spans for v in s.attributes.values())
    assert "secret-ish" not in values  # arguments are not recorded
    [entry] = traced.entries("traced-1")  # what its undo Job continues (undojob.py)
    assert entry["traceparent"] == f"00-{TRACE}-{server.span_id}-01"


def test_a_refused_call_has_its_code_as_error_type(traced: GatewayProc, receiver: Receiver) -> None:
    trace = "5bf92f3577b34da6a3ce929d0e0e4736"
    r = httpx2.post(f"{traced.url}/call/no.such_tool", json={"arguments": {}}, timeout=30,
                    headers={"Content-Type": "application/json", "X-Unwind-Run": "traced-2",
                             "traceparent": f"00-{trace}-{PARENT}-01"})
    assert r.status_code == 404
    server = receiver.wait(lambda s: s.kind == "SERVER" and s.trace_id == trace)[0]
    assert server.attributes["error.type"] == "not_found" and server.error


@pytest.mark.parametrize("where", ["header", "_meta"])
def test_an_mcp_call_is_the_sdks_server_span_parented_on_traceparent_with_unwinds_attributes(
        traced: GatewayProc, receiver: Receiver, where: str) -> None:
    trace = ("6" if where == "header" else "7") + TRACE[1:]
    carrier = f"00-{trace}-{PARENT}-01"
    params = {"name": "github__create_comment",
              "arguments": {**COMMENT, "client_id": f"mcp-{where}"}}
    headers = {"Accept": "application/json, text/event-stream", "X-Unwind-Run": "traced-3"}
    if where == "header":
        headers["traceparent"] = carrier
    else:
        params["_meta"] = {"traceparent": carrier}
    r = httpx2.post(f"{traced.url}/mcp", json={"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                                                "params": params}, headers=headers, timeout=30)
    assert r.status_code == 200 and not r.json()["result"].get("isError"), r.text
    server = receiver.wait(lambda s: s.kind == "SERVER" and s.trace_id == trace)[0]
    assert server.parent_id == PARENT
    assert server.attributes["mcp.method.name"] == "tools/call"
    assert server.attributes["gen_ai.tool.name"] == "github__create_comment"  # as served
    assert server.attributes["unwind.tool"] == "github.create_comment"
    assert server.attributes["unwind.entry.id"]
