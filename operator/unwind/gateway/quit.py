"""``POST /quitquitquit``: how an agent ends its pod's gateway when the gateway is a plain
container.

Why: before Kubernetes 1.29 the gateway cannot be a native sidecar, and a pod ends only
when all its containers have; a pod (or Job) whose agent finished would stay Running
forever with its gateway. So the injection sets ``UNWIND_QUIT_ENDPOINT=1`` on the plain
container (never on the native sidecar: the kubelet stops that one), and the agent, as its
last act, posts here: the gateway takes no new call, waits for the calls in flight (their
ledger writes included), answers, and exits 0, so the pod's phase becomes Succeeded when
the agent's does. Istio's and Linkerd's proxies have the same endpoint.

Where it is safe:

- only in cluster mode with ``UNWIND_QUIT_ENDPOINT=1`` (``enabled``): a laptop's gateway
  (local mode) never has it, whatever its environment says;
- only with the header ``X-Unwind-Quit: 1`` and without an ``Origin`` header: a web page
  cannot send a custom header cross-site without a CORS preflight the gateway never
  grants, and a browser marks what it sends with an Origin;
- an agent that ends its gateway early only loses its own tools: no call passes the
  gateway after that.

``request_quit`` is the client (the demo agent's, and ``unwind gateway-quit``); with curl:
``curl -fsS -X POST -H 'X-Unwind-Quit: 1' http://127.0.0.1:8787/quitquitquit || true``.
A gateway without the endpoint (a native sidecar, an older image) answers 404 or nothing:
harmless, the caller goes on ending.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

ENV = "UNWIND_QUIT_ENDPOINT"
PATH = "/quitquitquit"
HEADER = "X-Unwind-Quit"
CALL_PREFIXES = ("/call/", "/mcp")  # what counts as a call in flight (probes and reads do not)

log = logging.getLogger("unwind.gateway")
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def enabled(cluster: bool, environ: Mapping[str, str]) -> bool:
    """Whether the gateway serves ``POST /quitquitquit``: in cluster mode, when the
    injection asked for it."""
    return cluster and environ.get(ENV, "") == "1"


def refusal(method: str, headers: Mapping[str, str]) -> tuple[int, str] | None:
    """Why a quit request is refused (status, message), or None. ``headers`` lower-case."""
    if method != "POST":
        return 405, f"{PATH} takes POST"
    if "origin" in headers:
        return 403, f"{PATH} is refused from a browser (the request has an Origin header)"
    if headers.get(HEADER.lower()) != "1":
        return 400, f"send the header {HEADER}: 1 to stop the gateway"
    return None


async def _answer(send: Send, status: int, body: dict[str, Any]) -> None:
    raw = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]})
    await send({"type": "http.response.body", "body": raw})


class Quit:
    """ASGI middleware: counts the calls in flight and serves ``POST /quitquitquit``, which
    stops taking calls, waits for those in flight, answers, then calls ``stop`` (the
    server's exit)."""

    def __init__(self, app: ASGIApp, stop: Callable[[], None]) -> None:
        self.app, self.stop = app, stop
        self.in_flight = 0
        self.quitting = False
        self._idle: asyncio.Event | None = None

    def _event(self) -> asyncio.Event:
        if self._idle is None:
            self._idle = asyncio.Event()
            if not self.in_flight:
                self._idle.set()
        return self._idle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
        elif path == PATH:
            await self._quit(scope, send)
        elif not path.startswith(CALL_PREFIXES):
            await self.app(scope, receive, send)
        elif self.quitting:
            await _answer(send, 503, {"error": {"code": "ledger_unavailable", "message":
                                                f"the gateway is stopping (POST {PATH}): it takes no new call"}})
        else:
            self.in_flight += 1
            self._event().clear()
            try:
                await self.app(scope, receive, send)
            finally:
                self.in_flight -= 1
                if not self.in_flight:
                    self._event().set()

    async def _quit(self, scope: Scope, send: Send) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
        refused = refusal(str(scope.get("method", "")), headers)
        if refused is not None:
            await _answer(send, refused[0], {"error": {"code": "validation_error" if refused[0] == 400 else
                                                       "permission_denied", "message": refused[1]}})
            return
        self.quitting = True
        waiting = self.in_flight
        log.info("%s: stopping once the %d call(s) in flight have finished", PATH, waiting)
        await self._event().wait()
        await _answer(send, 200, {"quitting": True, "waited_for": waiting})
        self.stop()


def request_quit(base: str = "http://127.0.0.1:8787", timeout: float = 120.0) -> str:
    """Ask the gateway at ``base`` to stop; what happened, in words. Never raises: a gateway
    without the endpoint (a native sidecar) or already gone is no error for a caller that
    is ending anyway."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(f"{base.rstrip('/')}{PATH}", data=b"", method="POST", headers={HEADER: "1"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as answer:
            return f"the gateway at {base} stops (HTTP {answer.status})"
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return f"the gateway at {base} has no {PATH} (a native sidecar is stopped by the kubelet)"
        return f"the gateway at {base} refused {PATH}: HTTP {exc.code}"
    except OSError as exc:
        return f"no gateway answered at {base} ({exc}): nothing to stop"
