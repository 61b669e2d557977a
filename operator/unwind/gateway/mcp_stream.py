"""Streaming ``/mcp``: progress and log messages to the client on an SSE stream, and the
client's cancellation to the upstream.

**Which answer.** A 2026-07-28 request goes to the SDK's streaming entry, which answers
JSON unless the call emits a notification (then it commits to ``text/event-stream``), so
a call without progress costs what it did; a client whose ``Accept`` names no
``text/event-stream`` gets the JSON-only entry, as before. A handshake-era request is answered as an SSE
stream when it is a ``tools/call`` that carries a ``progressToken`` and the client accepts
``text/event-stream``; every other one as one JSON body, as before (the cheaper answer,
and the one a client that accepts only ``application/json`` can read).

**Cancellation.** At 2026-07-28 a client cancels by closing the request's stream: the
SDK cancels the handler, and the door cancels the call's relay. A handshake-era client
sends ``notifications/cancelled`` in a POST of its own; with no sessions (the door is
stateless) the door finds the call by its run (``X-Unwind-Run``) and JSON-RPC id among
the calls in flight, and cancels it only when exactly one matches: an id two callers
share in one run cancels nothing (logged). A handshake-era client that only disconnects
has not cancelled (the spec says so): its call goes on.

Either way the call itself runs in a task of its own (relay.start_with), so the client
going away never cuts the enforcement path short: the outcome is recorded exactly as for
a JSON answer (a cancelled upstream call is ``uncertain``, the effect may have happened;
one cancelled before it was sent is ``failed``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import warnings
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from mcp_types import LOG_LEVEL_META_KEY
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from ..upstream.limits import MAX_BODY
from ..upstream.relay import Relay, start_with
from .enforce import CallResult

log = logging.getLogger("unwind.gateway")
Key = tuple[str, str]  # (run, JSON-RPC request id)
_MARKS = (b"notifications/cancelled", b"progressToken", b"tools/list")  # what the door reads


class InFlight:
    """The MCP calls running now, by run and request id, and the tasks that carry them."""

    def __init__(self) -> None:
        self.calls: dict[Key, list[Relay]] = {}
        self.tasks: set[asyncio.Task[Any]] = set()

    def cancel(self, run: str, request_id: str, why: str) -> bool:
        relays = self.calls.get((run, request_id), [])
        if len(relays) != 1:
            if relays:
                log.warning("notifications/cancelled for request %s of run %s matches %d calls "
                            "in flight: none is cancelled", request_id[:64], run, len(relays))
            return False
        relays[0].cancel(why)
        return True

    async def run(self, ctx: Any, run: str, work: Awaitable[CallResult]) -> CallResult:
        """``work`` (the gateway's call) with the client's relay, to the end whatever the
        client does; a 2026-07-28 client's cancellation cancels the relay."""
        relay = client_relay(ctx)
        task = start_with(relay, work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        key = (run, str(getattr(ctx, "request_id", "")))
        self.calls.setdefault(key, []).append(relay)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if getattr(ctx, "protocol_version", None) in MODERN_PROTOCOL_VERSIONS:
                relay.cancel("it closed the request's stream")
            raise
        finally:
            listed = self.calls.get(key, [])
            if relay in listed:
                listed.remove(relay)
            if not listed:
                self.calls.pop(key, None)


def client_relay(ctx: Any) -> Relay:
    """Progress (when the request carries a progressToken) and log messages, onto this
    request's own stream."""
    session = getattr(ctx, "session", None)
    meta = getattr(ctx, "meta", None)
    token = None  # the SDK hands _meta on parsed (progress_token) or as sent
    if isinstance(meta, Mapping):
        token = meta.get("progress_token", meta.get("progressToken"))
    if session is None:
        return Relay()

    async def progress(value: float, total: float | None, message: str | None) -> None:
        await session.report_progress(value, total, message)

    async def to_client(level: str, data: Any, logger: str | None) -> None:
        with warnings.catch_warnings():  # deprecated at 2026-07-28, still what clients read
            warnings.simplefilter("ignore")
            sent = session.send_log_message(level, data, logger,
                                            related_request_id=getattr(ctx, "request_id", None))
        await sent
    # The level asked of the upstream: the client's own (2026-07-28 asks per request), or
    # info for a handshake-era client, which cannot set one through a stateless gateway.
    level = meta.get(LOG_LEVEL_META_KEY) if isinstance(meta, Mapping) else None
    if getattr(ctx, "protocol_version", None) not in MODERN_PROTOCOL_VERSIONS:
        level = "info"
    return Relay(progress=progress if token is not None else None, log=to_client,
                 log_level=level if isinstance(level, str) else None)


class StreamingDoor:
    """The ASGI side of ``/mcp``: one SDK app answering JSON only, one that may stream, and
    the choice between them per request (see the module's docstring)."""

    def __init__(self, json_app: Any, stream_app: Any, inflight: InFlight,
                 default_run: str | None,
                 listed_fields: Callable[[], dict[str, dict[str, Any]]] | None = None) -> None:
        self.json_app, self.stream_app = json_app, stream_app
        self.inflight, self.default_run = inflight, default_run
        self.listed_fields = listed_fields

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or scope.get("method") != "POST":
            await self.json_app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        body, receive = await _buffered(receive)
        message = _peek(body)
        if message.get("method") == "tools/list" and self.listed_fields is not None:
            fields = self.listed_fields()
            send = _adding_fields(send, fields) if fields else send
        version = headers.get("mcp-protocol-version")
        sse = _accepts_sse(headers.get("accept", ""))
        if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
            # the streaming entry refuses (406) a client that cannot read a stream
            await (self.stream_app if sse else self.json_app)(scope, receive, send)
            return
        if message.get("method") == "notifications/cancelled":
            self._cancelled(message, headers)
        stream = message.get("method") == "tools/call" and _wants_progress(message) and sse
        await (self.stream_app if stream else self.json_app)(scope, receive, send)

    def _cancelled(self, message: dict[str, Any], headers: dict[str, str]) -> None:
        params = message.get("params")
        request_id = params.get("requestId") if isinstance(params, dict) else None
        run = headers.get("x-unwind-run", self.default_run)
        if isinstance(request_id, str | int) and not isinstance(request_id, bool) and run:
            reason = params.get("reason") if isinstance(params, dict) else None
            why = "notifications/cancelled" + (f": {str(reason)[:200]}" if reason else "")
            self.inflight.cancel(run, str(request_id), why)


async def _buffered(receive: Any) -> tuple[bytes, Any]:
    """The body (up to MAX_BODY and a chunk), and a ``receive`` that hands it on again."""
    chunks: list[bytes] = []
    size, more = 0, True
    first: dict[str, Any] = {}
    while more and size <= MAX_BODY:
        message = await receive()
        if message["type"] != "http.request":
            first = message
            break
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        more = bool(message.get("more_body"))
    body = b"".join(chunks)
    replayed = False

    async def replay() -> Any:
        nonlocal replayed
        if not replayed:
            replayed = True
            return first or {"type": "http.request", "body": body, "more_body": more}
        return await receive()
    return body, replay


def _peek(body: bytes) -> dict[str, Any]:
    """The JSON-RPC message, only when it may be one the door acts on (no parse otherwise)."""
    if not any(mark in body for mark in _MARKS):
        return {}
    try:
        message = json.loads(body)
    except (ValueError, RecursionError):
        return {}
    return message if isinstance(message, dict) else {}


def _wants_progress(message: dict[str, Any]) -> bool:
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    return isinstance(meta, dict) and meta.get("progressToken") is not None


def _accepts_sse(accept: str) -> bool:
    kinds = {part.split(";")[0].strip().lower() for part in accept.split(",")}
    return bool(kinds & {"text/event-stream", "text/*", "*/*"})


def _adding_fields(send: Any, fields: dict[str, dict[str, Any]]) -> Any:
    """A ``send`` that adds to a JSON tools/list answer the fields each tool's upstream
    listed and the SDK left out (a later revision's, which its models do not know)."""
    start: dict[str, Any] = {}
    chunks: list[bytes] = []

    async def patched(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            kind = dict(message.get("headers", [])).get(b"content-type", b"")
            if not kind.startswith(b"application/json"):
                await send(message)
                return
            start.update(message)
            return
        if not start:
            await send(message)
            return
        chunks.append(message.get("body", b""))
        if message.get("more_body"):
            return
        body = _with_fields(b"".join(chunks), fields)
        headers = [(k, v) for k, v in start.get("headers", []) if k != b"content-length"]
        await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
    return patched


def _with_fields(body: bytes, fields: dict[str, dict[str, Any]]) -> bytes:
    try:
        answer = json.loads(body)
        tools = answer["result"]["tools"]
    except (ValueError, KeyError, TypeError):
        return body
    for tool in tools if isinstance(tools, list) else []:
        if isinstance(tool, dict) and tool.get("name") in fields:
            for name, value in fields[tool["name"]].items():
                tool.setdefault(name, value)
    return json.dumps(answer, separators=(",", ":")).encode()
