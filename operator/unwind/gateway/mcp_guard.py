"""What ``/mcp`` checks before the MCP SDK reads a ``tools/call``: the OAuth caller's scope
(HTTP 403 ``insufficient_scope``, as the MCP authorization spec asks, so a client can step
up) and the rate limits (HTTP 429 with ``Retry-After``: stages/admission.py, as at REST).
Both answers carry a JSON-RPC error with the request's id, and the refused call is recorded
as ``refused`` in the run's ledger through the gateway's refusal path (``Gateway.reject``):
nothing of it ran.

Why at the HTTP layer: the SDK answers a tool call inside a 200 response, and these two
answers are HTTP statuses a client acts on. The body is read once here (at most the door's
64 KiB, as the SDK would) and handed on unchanged.
"""

from __future__ import annotations

import json
import logging
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

from ..ledger.ulid import new_ulid
from ..manifest.mcp_names import mcp_name
from ..manifest.model import ToolManifest
from ..upstream.errors import Refusal
from ..upstream.limits import MAX_BODY
from .auth.doors import CALLER, DOORS, GATEWAY, answer
from .enforce import Gateway
from .rest import choose_run
from .stages.admission import Admission
from .trust import ASGIApp, Receive, Scope, Send

if TYPE_CHECKING:
    from .ratelimit import Limiter

log = logging.getLogger("unwind.gateway")
FORBIDDEN, RATE_LIMITED, UNAVAILABLE = -32003, -32029, -32053  # JSON-RPC error codes


class McpGuard:
    def __init__(self, app: ASGIApp, gateway: Gateway, default_run: str | None,
                 limiter: Limiter | None = None) -> None:
        self.app, self.gateway, self.default_run, self.limiter = app, gateway, default_run, limiter
        self.admission = Admission(limiter)
        self._names: tuple[str, dict[str, str]] = ("", {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        guarded = scope.get(DOORS) is not None or self.limiter is not None
        if scope.get("type") != "http" or scope.get("method") != "POST" or not guarded:
            await self.app(scope, receive, send)
            return
        body, more = await _read(receive)
        replay = _replay(body, more, receive)
        message = _parse(body) if not more else None
        if message is None or message.get("method") != "tools/call":
            await self.app(scope, replay, send)
            return
        params = message.get("params") if isinstance(message.get("params"), dict) else {}
        name = params.get("name") if isinstance(params, dict) else None
        m = self._manifest(name) if isinstance(name, str) else None
        if m is None:
            await self.app(scope, replay, send)  # the SDK and enforcement refuse it
            return
        refused = await self._check(scope, m)
        if refused is None:
            await self.app(scope, replay, send)
            return
        refusal, code, headers = refused
        await self._record(scope, m, refusal)
        error = {"jsonrpc": "2.0", "id": message.get("id"),
                 "error": {"code": code, "message": refusal.message, "data": refusal.envelope()}}
        await answer(send, refusal.status, error, headers)

    async def _check(self, scope: Scope, m: ToolManifest
                     ) -> tuple[Refusal, int, list[tuple[bytes, bytes]]] | None:
        """The rate limits first, as at REST (a call counts whether it then runs or is
        refused), then an OAuth caller's scope."""
        gw: Gateway = scope.get(GATEWAY) or self.gateway
        decision = await self.admission.limit(gw, m.tool)
        if decision is not None and decision.refusal is not None:
            code = RATE_LIMITED if decision.refusal.code == "rate_limited" else UNAVAILABLE
            return (decision.refusal, code,
                    [(k.encode(), v.encode()) for k, v in decision.headers()])
        doors = scope.get(DOORS)
        scopes = gw.settings.scopes
        if doors is not None and not self.gateway.catalogue.observe \
                and "*" not in scopes and m.permission not in scopes:
            challenge = doors.insufficient_scope(scope, m.permission)
            if challenge is not None:  # an OAuth caller: step up
                return (Refusal("permission_denied", f"{m.tool} needs permission "
                                f"{m.permission}, which this token's scopes do not grant"),
                        FORBIDDEN, [(b"www-authenticate", challenge.encode("latin-1", "replace"))])
        return None

    async def _record(self, scope: Scope, m: ToolManifest, refusal: Refusal) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers") or []}
        try:
            run = choose_run(headers.get("x-unwind-run"), self.default_run)
        except Refusal:
            return  # no run to record it in
        gw: Gateway = scope.get(GATEWAY) or self.gateway
        await self.admission.refuse(gw, m.tool, run, new_ulid(), refusal)
        caller = scope.get(CALLER)
        log.info("mcp tools/call %s refused before the SDK: %s (%s)", m.tool, refusal.code,
                 getattr(caller, "actor", gw.settings.actor))

    def _manifest(self, name: str) -> ToolManifest | None:
        c = self.gateway.catalogue
        generation, names = self._names
        if generation != c.generation or not names:
            names = {mcp_name(s.manifest.tool): s.manifest.tool for s in c.tools()}
            self._names = (c.generation, names)
        served = c.get(names.get(name, name))
        return served.manifest if served is not None and served.manifest.enforceable else None


async def _read(receive: Receive) -> tuple[bytes, bool]:
    """The body up to MAX_BODY; ``more``: it goes on past that (the SDK refuses it)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        event = await receive()
        if event.get("type") != "http.request":
            return b"".join(chunks), False
        chunk = event.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        if not event.get("more_body"):
            return b"".join(chunks), False
        if size > MAX_BODY:
            return b"".join(chunks), True


def _replay(body: bytes, more: bool, receive: Receive) -> Receive:
    sent = False

    async def again() -> MutableMapping[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": more}
        return await receive()
    return again


def _parse(body: bytes) -> dict[str, Any] | None:
    try:
        message = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return message if isinstance(message, dict) else None
