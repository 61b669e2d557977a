"""Calling the upstream a manifest names: a JSON HTTP endpoint or a tool of an MCP server.

``prepare`` turns a call into a request (URL placeholders filled and URL-encoded, the body
or query, header values read from secrets) and refuses what cannot be sent before the
ledger is touched. ``send`` makes the call with the manifest's timeout and, for read_only
and idempotent tools only, its retries; its answer says whether the upstream may have
acted: a request that never left (connection refused) did nothing, one whose answer timed
out or was lost may have.

HTTP goes through one aiohttp session; MCP through the ``mcp`` SDK's client.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote

import aiohttp
import httpx2

from ..manifest.keys import plain_text
from ..manifest.model import Effect, HeaderValue, ToolManifest
from .errors import Refusal
from .secrets import SecretMissing, Secrets

DEFAULT_TIMEOUT_MS = 30_000
_PLACEHOLDER = re.compile(r"\{\{\s*args\.([A-Za-z0-9_-]+)\s*\}\}")
Kind = Literal["ok", "error_status", "not_sent", "timeout", "lost", "not_json"]


@dataclass
class Prepared:
    manifest: ToolManifest
    method: str
    url: str
    arguments: dict[str, Any]
    headers: dict[str, str]
    timeout_s: float
    attempts: int
    base_ms: int
    max_ms: int
    mcp_tool: str | None = None


@dataclass
class Answer:
    kind: Kind
    status: int | None = None
    data: Any = None
    text: str = ""
    attempts: int = 1
    sent: bool = field(default=True)

    @property
    def may_have_acted(self) -> bool:
        """The upstream may have applied the call: the answer is lost, late or unreadable,
        or it failed on the server's side after receiving it."""
        if self.kind in ("timeout", "lost", "not_json"):
            return True
        return self.kind == "error_status" and (self.status or 0) >= 500


def fill_url(template: str, arguments: dict[str, Any]) -> str:
    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        text = plain_text(arguments.get(name))
        if text is None:
            raise Refusal("validation_error", f"the upstream URL needs argument {name!r} as a "
                          "string, number or bool")
        return quote(text, safe="")
    return _PLACEHOLDER.sub(one, template)


def prepare(m: ToolManifest, arguments: dict[str, Any], secrets: Secrets,
            extra_headers: dict[str, str]) -> Prepared:
    u = m.upstream
    if u is None:
        raise Refusal("upstream_error", f"{m.tool} declares no upstream: add upstream.url or "
                      "upstream.mcp to its manifest")
    headers: dict[str, str] = {}
    for name, value in u.headers.items():
        if isinstance(value, HeaderValue):
            try:
                headers[name] = secrets.get(value.secretKeyRef.name, value.secretKeyRef.key)
            except SecretMissing as exc:
                raise Refusal("upstream_error", f"{m.tool}: header {name}: {exc}") from None
        else:
            headers[name] = value
    headers.update(extra_headers)
    timeout_ms = u.timeout_ms or m.timeout_ms or DEFAULT_TIMEOUT_MS
    safe = m.effect in (Effect.read_only, Effect.idempotent)
    retry = m.retry if safe else None
    if u.mcp is not None:
        method, url, mcp_tool = "MCP", u.mcp.url, u.mcp.tool
    else:
        assert u.url is not None  # the validator guarantees one of url or mcp
        method, url, mcp_tool = u.method, fill_url(u.url, arguments), None
    return Prepared(m, method, url, arguments, headers, timeout_ms / 1000,
                    retry.attempts if retry else 1, retry.base_ms if retry else 0,
                    retry.max_ms if retry else 0, mcp_tool)


class Upstream:
    """The HTTP client for JSON upstreams (aiohttp: its C parser costs a third of httpx's
    time per call, which is most of what the gateway adds); MCP upstreams open a short
    session per call through the SDK's own client."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None
        self.schemas: dict[tuple[str, str], dict[str, Any]] = {}

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:  # created in the running loop, as aiohttp requires
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=200, enable_cleanup_closed=True),
                auto_decompress=True)
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def send(self, p: Prepared) -> Answer:
        answer = Answer("not_sent")
        for attempt in range(1, p.attempts + 1):
            answer = await (self._mcp(p) if p.mcp_tool else self._http(p))
            answer.attempts = attempt
            retryable = answer.kind in ("not_sent", "timeout", "lost") or (
                answer.kind == "error_status" and (answer.status or 0) in (429, 502, 503, 504))
            if not retryable or attempt == p.attempts:
                return answer
            delay = min(p.max_ms, p.base_ms * 2 ** (attempt - 1)) / 1000
            await asyncio.sleep(delay)
        return answer

    async def _http(self, p: Prepared) -> Answer:
        body = p.arguments if p.method in ("POST", "PUT", "PATCH") else None
        params = None if body is not None else {k: _query_value(v) for k, v in p.arguments.items()}
        timeout = aiohttp.ClientTimeout(total=p.timeout_s)
        try:
            async with self.session().request(p.method, p.url, json=body, params=params,
                                              headers=p.headers, timeout=timeout) as response:
                raw = await response.read()
                status = response.status
        except aiohttp.ClientConnectorError as exc:
            return Answer("not_sent", text=f"cannot connect to {p.url}: {_short(exc)}", sent=False)
        except TimeoutError:
            return Answer("timeout", text=f"no answer from {p.url} within {p.timeout_s:g}s")
        except aiohttp.ClientError as exc:
            return Answer("lost", text=f"the connection to {p.url} failed: {_short(exc)}")
        text = raw.decode("utf-8", "replace")
        try:
            data = json.loads(raw) if raw.strip() else None
        except ValueError:
            data = _NOT_JSON
        if not 200 <= status < 300:
            return Answer("error_status", status, None if data is _NOT_JSON else data, text[:2000])
        if data is _NOT_JSON or data is None:
            return Answer("not_json", status, None, text[:2000])
        return Answer("ok", status, data, "")

    async def _mcp(self, p: Prepared) -> Answer:
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client

        try:
            async with httpx2.AsyncClient(headers=p.headers, timeout=p.timeout_s) as http, \
                    Client(streamable_http_client(p.url, http_client=http)) as client:
                with anyio_fail_after(p.timeout_s):
                    result = await client.call_tool(p.mcp_tool or "", p.arguments)
        except TimeoutError:
            return Answer("timeout", text=f"no answer from {p.url} within {p.timeout_s:g}s")
        except Exception as exc:  # the SDK raises many kinds; all mean the answer is missing
            return Answer("lost", text=f"the MCP call to {p.url} failed: {_short(exc)}")
        data = result.structured_content
        text = "".join(getattr(c, "text", "") for c in result.content)
        if data is None and text:
            try:
                data = json.loads(text)
            except ValueError:
                data = None
        if result.is_error:
            return Answer("error_status", 400, data, text[:2000])
        if data is None:
            return Answer("not_json", 200, None, text[:2000])
        return Answer("ok", 200, data, "")

    async def list_mcp_schemas(self, url: str, timeout_s: float = 10.0) -> dict[str, dict[str, Any]]:
        """The input schema of every tool an MCP upstream lists (for schema drift)."""
        from mcp import Client

        with anyio_fail_after(timeout_s):
            async with Client(url) as client:
                listed = await client.list_tools()
        return {t.name: dict(t.input_schema) for t in listed.tools}


_NOT_JSON = object()


def anyio_fail_after(seconds: float) -> Any:
    import anyio

    return anyio.fail_after(seconds if math.isfinite(seconds) else None)


def _query_value(value: Any) -> str:
    text = plain_text(value)
    return text if text is not None else json.dumps(value, separators=(",", ":"))


def _short(exc: BaseException) -> str:
    return (str(exc) or type(exc).__name__).splitlines()[0][:300]
