"""An OTLP/HTTP trace receiver for the tests: an aiohttp server in a thread that decodes each
``POST /v1/traces`` (protobuf, as the SDK's exporter sends it) and keeps the spans."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from .conftest import free_port

KINDS = {1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


@dataclass
class Span:
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    service: str
    error: bool


def _value(v: Any) -> Any:
    which = v.WhichOneof("value")
    return getattr(v, which) if which else None


@dataclass
class Receiver:
    port: int = field(default_factory=free_port)
    spans: list[Span] = field(default_factory=list)
    host: str = "127.0.0.1"  # the real-node tests bind the node's bridge address

    def __post_init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, self.host, self.port).start()

    async def _traces(self, request: web.Request) -> web.Response:
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.read())
        for rs in message.resource_spans:
            service = next((_value(a.value) for a in rs.resource.attributes
                            if a.key == "service.name"), "")
            for ss in rs.scope_spans:
                for s in ss.spans:
                    self.spans.append(Span(s.name, KINDS.get(s.kind, str(s.kind)),
                                           s.trace_id.hex(), s.span_id.hex(),
                                           s.parent_span_id.hex(),
                                           {a.key: _value(a.value) for a in s.attributes},
                                           service, s.status.code == 2))
        return web.Response(status=200, content_type="application/x-protobuf")

    def wait(self, check: Any, seconds: float = 15) -> list[Span]:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            found = [s for s in list(self.spans) if check(s)]
            if found:
                return found
            time.sleep(0.1)
        raise AssertionError(f"no such span in {[(s.name, s.kind) for s in self.spans]}")

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
