"""OpenTelemetry traces of the gateway, exported over OTLP/HTTP when the standard variables
ask for it (``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``; also
``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``, the exporter's
headers and timeout). Without them nothing here is imported and nothing is traced.

Per call:

- a SERVER span, parented on the request's ``traceparent`` header (or, at ``/mcp``, the
  call's ``params._meta``, which the MCP SDK reads): at REST ``execute_tool <tool>`` made
  here; at ``/mcp`` the SDK's own ``tools/call <name>`` span, which this adds to. Both carry
  the MCP and gen_ai attributes (``mcp.method.name`` at /mcp, ``gen_ai.operation.name``,
  ``gen_ai.tool.name``: the name the caller used, ``error.type``: the refusal code), and
  Unwind's own (``unwind.tool``: the manifest's name, ``unwind.run``, ``unwind.entry.id``,
  ``unwind.actor``, ``unwind.effect_class``);
- a CLIENT span for each upstream call (``traceparent`` goes upstream with it, the caller's
  token never does) and one for each ledger write (``unwind.ledger create|update``).

Arguments and answers are never recorded. The entry a call creates keeps the call's
``traceparent`` (the SERVER span's); the undo Job of a rollback gets it as ``TRACEPARENT``
with the operator's ``OTEL_EXPORTER_OTLP_*`` endpoint, and ``unwind undo-step`` opens its
``undo_step <tool>`` span under it (``step``): the undo is part of the trace of the call it
undoes, its upstream call a CLIENT span of it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

from .trust import ASGIApp, Receive, Scope, Send

log = logging.getLogger("unwind.gateway")
ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
enabled = False  # set by configure(): the doors annotate spans only then
_tracer: Any = None  # tracer()'s, made after configure() installed the provider


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() in ("none", ""):
        return False
    return any(environ.get(name) for name in ENDPOINTS)


def configure(service: str = "unwind-gateway", environ: Mapping[str, str] = os.environ
              ) -> Callable[[], Awaitable[None]] | None:
    """Install the SDK's tracer provider with a batching OTLP/HTTP exporter; its closer
    (which flushes). None when the environment asks for no traces."""
    global enabled
    if not wanted(environ):
        return None
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    attributes = {} if environ.get("OTEL_SERVICE_NAME") else {"service.name": service}
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    global _tracer
    _tracer = None
    enabled = True
    log.info("traces: OTLP/HTTP to %s", next(environ[n] for n in reversed(ENDPOINTS)
                                              if environ.get(n)))

    async def close() -> None:
        provider.shutdown()
    return close


def tracer() -> Any:
    """The gateway's tracer: made once (``get_tracer`` builds a new one on every call, which
    was a fifth of the traced path's cost)."""
    global _tracer
    if _tracer is None:
        from opentelemetry import trace
        _tracer = trace.get_tracer("unwind.gateway")
    return _tracer


def annotate(tool: str, run: str, entry: str | None, status: int, body: Any,
             actor: str, effect: str | None = None) -> None:
    """Unwind's attributes on the current (SERVER) span; ``error.type`` is the refusal code."""
    if not enabled:
        return
    from opentelemetry import trace
    from opentelemetry.trace import StatusCode

    span = trace.get_current_span()
    if not span.is_recording():
        return
    span.set_attribute("unwind.tool", tool)
    span.set_attribute("unwind.run", run)
    span.set_attribute("unwind.actor", actor)
    if entry:
        span.set_attribute("unwind.entry.id", entry)
    if effect:
        span.set_attribute("unwind.effect_class", effect)
    if status >= 400:
        code = body.get("error", {}).get("code") if isinstance(body, dict) else None
        span.set_attribute("error.type", str(code or status))
        span.set_status(StatusCode.ERROR)


class Traced:
    """ASGI middleware: the request's ``traceparent`` becomes the current context, and a REST
    call gets its SERVER span (``/mcp`` gets the MCP SDK's, parented on that context)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        if scope.get("type") != "http" or not (path.startswith("/call/") or path.startswith("/mcp")):
            await self.app(scope, receive, send)
            return
        from opentelemetry import context, propagate
        from opentelemetry.trace import SpanKind

        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers") or [] if k.lower() in (b"traceparent",
                                                                         b"tracestate")}
        parent = propagate.extract(headers)
        if not path.startswith("/call/"):
            token = context.attach(parent)
            try:
                await self.app(scope, receive, send)
            finally:
                context.detach(token)
            return
        tool = path[len("/call/"):][:128]
        status = [0]

        async def sending(message: Any) -> None:
            if message.get("type") == "http.response.start":
                status[0] = int(message.get("status", 0))
            await send(message)
        with tracer().start_as_current_span(
                f"execute_tool {tool}", context=parent, kind=SpanKind.SERVER,
                attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool,
                            "http.request.method": str(scope.get("method")),
                            "url.path": "/call/{tool}"}) as span:
            await self.app(scope, receive, sending)
            span.set_attribute("http.response.status_code", status[0])


def traceparent() -> str | None:
    """The current span's W3C traceparent (what an entry keeps for its undo), or None."""
    if not enabled:
        return None
    from opentelemetry.propagate import inject

    carrier: dict[str, str] = {}
    inject(carrier)
    return carrier.get("traceparent")


@contextlib.contextmanager
def step(tool: str, action: str, entry: str, parent: str | None) -> Iterator[Any]:
    """The undo Job's span, continuing the undone call's trace (``parent``: its traceparent);
    nothing when traces are off."""
    if not enabled:
        yield None
        return
    from opentelemetry import propagate
    from opentelemetry.trace import SpanKind

    context = propagate.extract({"traceparent": parent} if parent else {})
    with tracer().start_as_current_span(
            f"undo_step {tool}", context=context, kind=SpanKind.INTERNAL,
            attributes={"unwind.tool": tool, "unwind.undo.action": action,
                        "unwind.entry.id": entry}) as span:
        yield span


def instrument(gateway: Any) -> None:
    """CLIENT spans around the gateway's upstream calls and ledger writes (shared by every
    per-caller view of the gateway: they hold the same upstream and store)."""
    instrument_upstream(gateway.upstream)
    _instrument_store(gateway.store)


def instrument_upstream(upstream: Any) -> None:
    """A CLIENT span around each of ``upstream``'s calls; ``traceparent`` goes with it."""
    from opentelemetry.propagate import inject
    from opentelemetry.trace import SpanKind, StatusCode

    send = upstream.send

    @functools.wraps(send)
    async def traced_send(p: Any) -> Any:
        parts = urlsplit(p.template or p.url)
        name = f"{p.method} {p.manifest.tool}" if not p.mcp_tool else f"tools/call {p.mcp_tool}"
        attributes = {"gen_ai.tool.name": p.manifest.tool, "server.address": parts.hostname or "",
                      "http.request.method": p.method}
        if p.mcp_tool:
            attributes["mcp.method.name"] = "tools/call"
        with tracer().start_as_current_span(name, kind=SpanKind.CLIENT,
                                            attributes=attributes) as span:
            carrier: dict[str, str] = {}
            inject(carrier)
            answer = await send(dataclasses.replace(p, headers={**p.headers, **carrier}))
            if answer.status is not None:
                span.set_attribute("http.response.status_code", answer.status)
            if answer.kind != "ok":
                span.set_attribute("error.type", str(answer.kind))
                span.set_status(StatusCode.ERROR)
            return answer
    upstream.send = traced_send


def _instrument_store(store: Any) -> None:
    from opentelemetry.trace import SpanKind, StatusCode

    for op in ("create", "transition"):  # every write of an entry is one of these
        original = getattr(store, op)

        def traced(original: Any = original, op: str = op) -> Any:
            @functools.wraps(original)
            async def write(run: str, *args: Any, **kwargs: Any) -> Any:
                entry = args[0] if args else None
                entry_id = entry if isinstance(entry, str) else getattr(entry, "id", "")
                with tracer().start_as_current_span(
                        f"unwind.ledger {op}", kind=SpanKind.CLIENT,
                        attributes={"unwind.run": run, "unwind.entry.id": str(entry_id),
                                    "db.operation.name": op}) as span:
                    try:
                        return await original(run, *args, **kwargs)
                    except Exception as exc:
                        span.set_attribute("error.type", type(exc).__name__)
                        span.set_status(StatusCode.ERROR)
                        raise
            return write
        setattr(store, op, traced())
