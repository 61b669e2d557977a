"""The ASGI app: the REST routes, ``/mcp``, and the lifespan that starts and stops them;
with ``stop``, ``POST /quitquitquit`` too (quit.py: a plain-container gateway in a pod).
Every request first passes one Host/Origin/Content-Type policy (trust.py)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Route

from ..upstream.limits import MAX_BODY
from . import rest
from .enforce import Gateway
from .mcp_guard import McpGuard
from .quit import Quit
from .trust import Policy, Trust

if TYPE_CHECKING:
    from .auth.doors import Doors
    from .ratelimit import Limiter

log = logging.getLogger("unwind.gateway")


def build_app(gateway: Gateway, *, default_run: str | None = None, host: str = "127.0.0.1",
              closers: Sequence[Callable[[], Awaitable[None]]] = (),
              stop: Callable[[], None] | None = None, policy: Policy | None = None,
              report_in_content: bool | None = None, doors: Doors | None = None,
              limiter: Limiter | None = None, services: Sequence[Any] = ()) -> Starlette:
    """The gateway's app; ``stop`` (the server's exit) adds ``POST /quitquitquit``.
    ``report_in_content`` (default ``UNWIND_REPORT_IN_CONTENT``): MCP answers carry the
    effect report as a last text block too. ``policy``
    (default: loopback, ``host`` and ``UNWIND_ALLOWED_HOSTS``) decides which Host and Origin
    every route answers. ``doors`` (gateway/auth): every route but the probes needs an
    authenticated caller; ``limiter`` (ratelimit.py): calls are rate limited; ``services``
    (``start``/``aclose``, e.g. the metrics port) live as long as the app."""
    door = McpDoor(gateway, default_run, report_in_content)
    guarded = McpGuard(door, gateway, default_run, limiter)

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        c = gateway.catalogue
        await c.start()
        await learn_schemas(gateway)
        gateway.metrics.serving(c.generation, c.ready)
        for service in services:
            await service.start()
        if not c.ready:
            log.error("not ready: %s", c.problem)
        # What startup built (the modules, the catalogue) lives as long as the server: frozen,
        # the collector's full passes skip it (they walked all of it every few thousand calls).
        gc.freeze()
        async with door.running():
            try:
                yield
            finally:
                gc.unfreeze()
                await c.aclose()
                await gateway.upstream.aclose()
                if limiter is not None:
                    await limiter.aclose()
                for service in services:
                    await service.aclose()
                for close in closers:
                    await close()

    middleware = [Middleware(Trust, policy=policy or Policy.from_environ(host))]
    if stop is not None:
        middleware.append(Middleware(Quit, stop=stop))
    from . import tracing
    if tracing.enabled:
        middleware.append(Middleware(tracing.Traced))
    if doors is not None:
        from .auth.doors import Authenticate
        middleware.append(Middleware(Authenticate, doors=doors))
    # A Route, not a Mount: /mcp itself answers (a Mount answers only under /mcp/, and the
    # 307 from /mcp to /mcp/ is more than one client SDK follows); /mcp/ answers too.
    return Starlette(routes=[*rest.routes(gateway, default_run, limiter),
                             Route("/mcp", guarded), Route("/mcp/", guarded)],
                     lifespan=lifespan, middleware=middleware)


class McpDoor:
    """``/mcp``, built on its first request: the MCP SDK takes about 27 MB of the sidecar's
    memory, which a gateway whose agent speaks only REST never needs. The SDK's session
    manager runs in a task of its own from then until the server stops."""

    def __init__(self, gateway: Gateway, default_run: str | None,
                 report_in_content: bool | None) -> None:
        self.gateway, self.default_run, self.report_in_content = (gateway, default_run,
                                                                 report_in_content)
        self.app: Any = None

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        self._wanted, self._stopping = asyncio.Event(), asyncio.Event()
        self._ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(self._serve())
        try:
            yield
        finally:
            self._stopping.set()
            self._wanted.set()
            await task

    async def _serve(self) -> None:
        await self._wanted.wait()
        if self._stopping.is_set():
            return
        try:
            from mcp.server.streamable_http_manager import (
                StreamableHTTPASGIApp,
                StreamableHTTPSessionManager,
            )
            from mcp.server.transport_security import TransportSecuritySettings

            from .mcp_server import build_server, unknown_fields
            from .mcp_stream import InFlight, StreamingDoor

            inflight = InFlight()
            server = build_server(self.gateway, self.default_run, self.report_in_content,
                                  inflight)
            # The SDK's own Host/Origin check is off: Trust applies one policy to every route.
            security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
            # Two stateless managers of one server: JSON answers, and answers that may stream
            # (progress); the door picks per request (mcp_stream.py).
            plain, streams = (StreamableHTTPSessionManager(
                app=server, stateless=True, json_response=json_only, security_settings=security,
                max_request_body_size=MAX_BODY) for json_only in (True, False))
            async with plain.run(), streams.run():
                self.app = StreamingDoor(StreamableHTTPASGIApp(plain),
                                         StreamableHTTPASGIApp(streams), inflight,
                                         self.default_run,
                                         lambda: unknown_fields(self.gateway))
                self._ready.set_result(None)
                await self._stopping.wait()
        except Exception as exc:
            log.exception("the MCP endpoint could not start")
            if not self._ready.done():
                self._ready.set_exception(exc)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self.app is None:
            self._wanted.set()
            await asyncio.shield(self._ready)
        await self.app(scope, receive, send)


async def learn_schemas(gateway: Gateway) -> None:
    """Ask each MCP upstream for its tools (input schemas for schema drift and the door's
    check; output schemas and annotations for tools/list). An upstream that does not answer
    leaves its schemas unknown: nothing to compare, logged."""
    servers = {s.manifest.upstream.mcp.target: s.manifest.upstream.mcp  # URL or command
               for s in gateway.catalogue.tools()
               if s.manifest.upstream is not None and s.manifest.upstream.mcp is not None}
    named: dict[str, set[str]] = {}  # server -> the tools some manifest routes to there
    for s in gateway.catalogue.tools():
        mcp_of = s.manifest.upstream.mcp if s.manifest.upstream is not None else None
        if mcp_of is not None:
            named.setdefault(mcp_of.target, set()).add(mcp_of.tool)
    for url, mcp in sorted(servers.items(), key=lambda item: item[0]):
        try:  # only what some manifest names is kept: a huge listing costs one page at a time
            listed = await gateway.upstream.list_mcp_tools(mcp, keep=frozenset(named[url]))
        except Exception as exc:
            log.warning("cannot list the tools of MCP upstream %s: %s; schema drift is not "
                        "checked for its tools", url, str(exc).splitlines()[0] if str(exc) else exc)
            continue
        for name, tool in listed.items():
            gateway.upstream.schemas[(url, name)] = dict(tool.get("inputSchema") or {})
            gateway.upstream.listed[(url, name)] = tool
