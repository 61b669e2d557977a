"""The ASGI middleware that authenticates every request on a door that is not loopback-only.

Open without a token: ``/healthz``, ``/readyz`` (the kubelet's probes) and the OAuth
protected-resource metadata (a client reads it to learn where to get a token). Everything
else (``/call``, ``/calls``, ``/mcp``, ``/metrics``) needs ``Authorization: Bearer <token>``,
which one of the configured authenticators proves (chosen by the token's unverified issuer;
the chosen one verifies everything). What it proves rides in the request's scope:
``unwind.caller`` (the ``Caller``) and ``unwind.gateway`` (the gateway acting as that
caller: ``Gateway.acting_as``), which the doors hand to enforcement.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

from ...upstream.errors import Refusal
from ..trust import ASGIApp, Receive, Scope, Send
from . import MAX_TOKEN_BYTES, AuthFailure, Caller, unauthorized
from .oauth import WELL_KNOWN, OAuthTokens
from .tokenreview import ServiceAccountTokens

if TYPE_CHECKING:
    from ..enforce import Gateway

log = logging.getLogger("unwind.gateway.auth")
OPEN = frozenset({"/healthz", "/readyz"})
CALLER, GATEWAY, DOORS = "unwind.caller", "unwind.gateway", "unwind.doors"


class Doors:
    """The configured authenticators and the per-caller views of one gateway."""

    def __init__(self, gateway: Gateway, *, serviceaccounts: ServiceAccountTokens | None = None,
                 oauth: OAuthTokens | None = None, views: int = 4096) -> None:
        if serviceaccounts is None and oauth is None:
            raise ValueError("no authenticator: give ServiceAccount tokens, OAuth, or both")
        self.gateway, self.serviceaccounts, self.oauth = gateway, serviceaccounts, oauth
        self._views: OrderedDict[tuple[str, frozenset[str]], Gateway] = OrderedDict()
        self._size = views

    def view(self, caller: Caller) -> Gateway:
        """The gateway acting as ``caller``; kept per (actor, scopes), so what a gateway
        remembers per actor (its own runs, the runs it wrote this window) stays the actor's."""
        key = (caller.actor, caller.scopes)
        found = self._views.get(key)
        if found is None:
            found = self._views[key] = self.gateway.acting_as(caller.actor, caller.scopes)
            while len(self._views) > self._size:
                self._views.popitem(last=False)
        else:
            self._views.move_to_end(key)
        return found

    def challenge(self, scope: Mapping[str, Any], error: str | None = None, why: str = "") -> str:
        if self.oauth is not None:
            return self.oauth.challenge(scope, error, why)
        assert self.serviceaccounts is not None
        return self.serviceaccounts.challenge(error, why)

    async def authenticate(self, headers: Mapping[str, str], scope: Mapping[str, Any]) -> Caller:
        value = headers.get("authorization")
        if value is None:
            raise unauthorized("this door needs a caller: send Authorization: Bearer <token> "
                               "(in a pod, the projected ServiceAccount token with the "
                               "gateway's audience; outside, an OAuth access token)",
                               self.challenge(scope))
        scheme, _, token = value.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise unauthorized("the Authorization header must be 'Bearer <token>'",
                               self.challenge(scope, "invalid_request", "not a bearer token"))
        if len(token) > MAX_TOKEN_BYTES:
            raise unauthorized(f"the bearer token is larger than {MAX_TOKEN_BYTES // 1024} KiB",
                               self.challenge(scope, "invalid_token", "too large"))
        if self.oauth is not None and self.oauth.accepts(token):
            return await self.oauth.authenticate_for(token, scope)
        if self.serviceaccounts is not None and self.serviceaccounts.accepts(token):
            return await self.serviceaccounts.authenticate(token)
        raise unauthorized("the bearer token is of no issuer this gateway trusts"
                           + (f" (OAuth: {self.oauth.config.issuer})" if self.oauth else "")
                           + (" nor a ServiceAccount token" if self.serviceaccounts else ""),
                           self.challenge(scope, "invalid_token", "unknown issuer"))

    def insufficient_scope(self, scope: Mapping[str, Any], permission: str) -> str | None:
        """The ``WWW-Authenticate`` of a 403 for an OAuth caller lacking ``permission``."""
        caller = scope.get(CALLER)
        if self.oauth is None or not isinstance(caller, Caller) or caller.kind != "oauth":
            return None
        return self.oauth.insufficient(scope, caller, permission)


class Authenticate:
    """ASGI middleware: every HTTP request but the open ones proves a caller, or is answered
    here with the refusal and its ``WWW-Authenticate`` (never recorded: no actor)."""

    def __init__(self, app: ASGIApp, doors: Doors) -> None:
        self.app, self.doors = app, doors

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        if path in OPEN:
            await self.app(scope, receive, send)
            return
        if path == WELL_KNOWN or path.startswith(WELL_KNOWN + "/"):
            await self._metadata(scope, send, path[len(WELL_KNOWN):])
            return
        given = next((v.decode("latin-1") for k, v in scope.get("headers") or []
                      if k.lower() == b"authorization"), None)
        headers = {"authorization": given} if given is not None else {}
        try:
            caller = await self.doors.authenticate(headers, scope)
        except AuthFailure as failure:
            refusal = failure.refusal
            challenge = failure.challenge
            if refusal.status == 401 and challenge is None:
                challenge = self.doors.challenge(scope, "invalid_token", refusal.message[:120])
            log.info("refused %s %s: %d %s: %s", scope.get("method"), path[:200],
                     refusal.status, refusal.code, refusal.message)
            extra = [(b"www-authenticate", challenge.encode("latin-1", "replace"))] \
                if challenge else []
            if refusal.status == 503:
                extra.append((b"retry-after", b"1"))
            await answer(send, refusal.status, refusal.envelope(), extra)
            return
        scope[CALLER] = caller
        scope[GATEWAY] = self.doors.view(caller)
        scope[DOORS] = self.doors
        await self.app(scope, receive, send)

    async def _metadata(self, scope: Scope, send: Send, door: str) -> None:
        oauth = self.doors.oauth
        if oauth is None or door not in ("", "/mcp"):
            await answer(send, 404, Refusal("not_found", "no protected-resource metadata here: "
                         "this gateway takes no OAuth tokens" if oauth is None else
                         "the protected resources are / and /mcp").envelope())
            return
        await answer(send, 200, oauth.metadata(scope, door),
                     [(b"cache-control", b"max-age=300")])


async def answer(send: Send, status: int, body: Any,
                 headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    raw = json.dumps(body).encode()
    start: MutableMapping[str, Any] = {
        "type": "http.response.start", "status": status,
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", str(len(raw)).encode()), *headers]}
    await send(start)
    await send({"type": "http.response.body", "body": raw})
