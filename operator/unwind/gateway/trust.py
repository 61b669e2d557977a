"""Who may knock: one Host, Origin and Content-Type policy for every route of the gateway
(REST, ``/mcp``, the probes, the metrics, ``/quitquitquit``).

Why: the gateway holds an agent's tools and their credentials, and it listens where a web
browser can reach it (a laptop's loopback, a pod's). A page the user opens must not run a
tool or read an answer through it:

- **DNS rebinding.** A page from ``evil.example`` whose name the attacker re-points at
  127.0.0.1 talks to the gateway as its own origin; its requests carry
  ``Host: evil.example``. So the ``Host`` (its name; any port) must be a trusted name:
  ``127.0.0.1``, ``localhost``, ``::1``, the address the gateway listens on (unless it
  is a wildcard such as ``0.0.0.0``), and the names in ``UNWIND_ALLOWED_HOSTS``
  (comma-separated, for a gateway reached by another name). Else **421** ``untrusted_host``.
- **Cross-site requests.** A browser marks them with an ``Origin``; one whose host is not a
  trusted name (``null`` included) is refused: **403** ``permission_denied``. A request
  without ``Origin`` (curl, an SDK, the agent) passes.
- **Simple requests.** A page may POST ``text/plain`` or a form to any address without a
  CORS preflight (which the gateway never grants). So every POST must say
  ``Content-Type: application/json`` (a ``charset``, if given, ``utf-8``), or it is refused
  with **415** ``unsupported_media_type`` before its body is read. ``POST /quitquitquit``
  keeps its own rules (quit.py: a custom header, and no ``Origin`` at all) and needs no
  body.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ..upstream.errors import Refusal
from .quit import PATH as QUIT_PATH

log = logging.getLogger("unwind.gateway")
ENV = "UNWIND_ALLOWED_HOSTS"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
WILDCARDS = ("", "0.0.0.0", "::")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def host_name(value: str) -> str:
    """The name of a ``Host`` value or an address, lower-case, without port, brackets or a
    trailing dot: ``[::1]:8787`` is ``::1``, ``LocalHost.:80`` is ``localhost``."""
    value = value.strip().lower()
    if value.startswith("["):
        value = value[1:value.find("]")] if "]" in value else value[1:]
    elif value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")


def json_content_type(value: str | None) -> bool:
    """Whether a Content-Type says JSON: ``application/json``, and a charset only utf-8."""
    if value is None:
        return False
    kind, *params = value.split(";")
    if kind.strip().lower() != "application/json":
        return False
    for param in params:
        name, _, given = param.partition("=")
        if name.strip().lower() == "charset" and \
                given.strip().strip('"').lower() not in ("utf-8", "utf8"):
            return False
    return True


@dataclass(frozen=True)
class Policy:
    hosts: frozenset[str]

    @classmethod
    def for_listen(cls, listen_host: str, extra: Iterable[str] = ()) -> Policy:
        """Loopback, the address the gateway listens on (unless a wildcard), and ``extra``."""
        names = {*LOOPBACK, *(host_name(e) for e in extra if e.strip())}
        if host_name(listen_host) not in WILDCARDS:
            names.add(host_name(listen_host))
        return cls(frozenset(names))

    @classmethod
    def from_environ(cls, listen_host: str, environ: Mapping[str, str] = os.environ) -> Policy:
        return cls.for_listen(listen_host, environ.get(ENV, "").split(","))

    def refusal(self, method: str, path: str, headers: Mapping[str, str]) -> Refusal | None:
        """Why a request is refused, or None. ``headers`` lower-case."""
        host = headers.get("host")
        if not host or host_name(host) not in self.hosts:
            return Refusal("untrusted_host", f"the Host header {host!r} is not a name this "
                           "gateway answers to: call it as 127.0.0.1 or localhost, or give the "
                           f"name it is reached by in {ENV}")
        origin = headers.get("origin")
        if origin is not None and not self._trusted_origin(origin):
            return Refusal("permission_denied", f"the request comes from a web page ({origin!r}, "
                           "the Origin header): the gateway answers no page but its own host's")
        if method == "POST" and path != QUIT_PATH and not json_content_type(
                headers.get("content-type")):
            return Refusal("unsupported_media_type", "send the body as JSON with the header "
                           "Content-Type: application/json (got "
                           f"{headers.get('content-type', 'none')!r})")
        return None

    def _trusted_origin(self, origin: str) -> bool:
        try:
            parts = urlsplit(origin.strip())
        except ValueError:
            return False
        return parts.scheme in ("http", "https") and (parts.hostname or "") in self.hosts


class Trust:
    """ASGI middleware: every HTTP request passes ``Policy.refusal`` or is answered with its
    error envelope (the request's body is never read)."""

    def __init__(self, app: ASGIApp, policy: Policy) -> None:
        self.app, self.policy = app, policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers") or []}
        refused = self.policy.refusal(str(scope.get("method", "")), str(scope.get("path", "")),
                                      headers)
        if refused is None:
            await self.app(scope, receive, send)
            return
        log.warning("refused %s %s: %d %s: %s", scope.get("method"), str(scope.get("path"))[:200],
                    refused.status, refused.code, refused.message)
        raw = json.dumps(refused.envelope()).encode()
        await send({"type": "http.response.start", "status": refused.status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(raw)).encode())]})
        await send({"type": "http.response.body", "body": raw})
