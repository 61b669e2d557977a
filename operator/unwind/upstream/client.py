"""Calling the upstream a manifest names: a JSON HTTP endpoint or a tool of an MCP server.

``prepare`` turns a call into a request (URL placeholders filled and URL-encoded, the body
or query, header values read from secrets) and refuses what cannot be sent before the
ledger is touched. ``send`` makes the call with the manifest's timeout and, for read_only
and idempotent tools only, its retries; its answer says whether the upstream may have
acted: a request that never left (connection refused) did nothing, one whose answer timed
out or was lost may have.

A filled URL goes out exactly as filled: each placeholder is one percent-encoded path
segment (``/`` included), ``.``, ``..`` and empty values are refused (they would move the
call to another path with the tool's credentials), and nothing normalises the path after.
Messages name the tool and the URL *template*, never the filled URL: it carries argument
values, redacted ones included, percent-encoded where masking cannot see them.

An answer is read up to ``upstream.max_response_bytes`` after decompression (default
4 MiB) and nested at most ``limits.MAX_DEPTH`` deep; past that it is not read further and
the call's outcome is unknown (``too_large``: the upstream may have acted). A 2xx answer
with no body (204 No Content, or an empty 200) is a success whose result is ``null``; a
body that is not JSON is ``not_json`` (the upstream may have acted, its answer is unread).

An argument that fills a URL placeholder is not sent again in the body or the query,
unless ``upstream.send_placeholder_args`` is true (an API with filter syntax in its URL,
``?id=eq.{{args.id}}``, refuses the repeat).

HTTP goes through one aiohttp session; MCP through the ``mcp`` SDK's client, its sessions
kept open between calls and stdio servers started in local mode (``mcp_client.py``).
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote

import aiohttp
import yarl

from ..manifest.keys import plain_text
from ..manifest.model import Effect, HeaderValue, McpUpstream, ToolManifest
from . import relay as relays
from .errors import Refusal
from .limits import MAX_DEPTH, nesting_problem
from .mcp_client import HttpServer, McpClients, McpFailure, Server, StdioServer
from .secrets import SecretMissing, Secrets

DEFAULT_TIMEOUT_MS = 30_000
DEFAULT_MAX_RESPONSE_BYTES = 4 * 1024 * 1024
_READ_CHUNK = 64 * 1024
_PLACEHOLDER = re.compile(r"\{\{\s*args\.([A-Za-z0-9_-]+)\s*\}\}")
_MARK = "unwindarg{}x"  # stands in for a placeholder while the template is encoded
_MARKS = re.compile(r"unwindarg(\d+)x")
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")
_NOT_A_SEGMENT = {"": "empty", ".": "'.'", "..": "'..'"}
Kind = Literal["ok", "error_status", "tool_error", "not_sent", "timeout", "lost", "not_json",
               "too_large"]


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
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    template: str = ""  # the URL as the manifest writes it: what messages name
    call_headers: dict[str, str] = field(default_factory=dict)  # this call's own (in headers too)

    @property
    def where(self) -> str:
        """The call as messages name it: the tool and its method and URL template."""
        if self.mcp_tool is not None:
            return f"{self.manifest.tool} (MCP tool {self.mcp_tool} at {self.template})"
        return f"{self.manifest.tool} ({self.method} {self.template or '(its URL template)'})"


@dataclass(frozen=True)
class McpContent:
    """An MCP upstream's result as it sent it: its content blocks, and its structured
    content (None: it sent none), so the MCP door passes both on unchanged."""

    blocks: list[dict[str, Any]]
    structured: dict[str, Any] | None = None


@dataclass
class Answer:
    kind: Kind  # tool_error: an MCP tool's own error (isError, or a JSON-RPC refusal)
    status: int | None = None
    data: Any = None
    text: str = ""
    attempts: int = 1
    sent: bool = field(default=True)
    content: McpContent | None = None  # an MCP upstream's result, as sent
    code: str = "upstream_error"  # a tool_error's refusal code

    @property
    def may_have_acted(self) -> bool:
        """The upstream may have applied the call: the answer is lost, late or unreadable,
        or it failed on the server's side after receiving it."""
        if self.kind in ("timeout", "lost", "not_json", "too_large"):
            return True
        # a 301/302/303 may come after the upstream acted (post, then redirect to the result)
        return self.kind == "error_status" and ((self.status or 0) >= 500
                                                or self.status in (301, 302, 303))


def fill_url(template: str, arguments: dict[str, Any]) -> str:
    """The URL to send, already encoded: the template's own text encoded as a URL once, and
    each placeholder the argument's text percent-encoded whole (``/`` too). Send it as is
    (``yarl.URL(url, encoded=True)``): a client that normalised the path again would turn
    a ``..`` made of the template and the values into a move up."""
    encoded, names = _encoded_template(template)

    def one(match: re.Match[str]) -> str:
        name = names[int(match.group(1))]
        text = plain_text(arguments.get(name))
        if text is None:
            raise Refusal("validation_error", f"the upstream URL needs argument {name!r} as a "
                          "string, number or bool")
        if text in _NOT_A_SEGMENT:
            raise Refusal("validation_error", f"argument {name!r} is {_NOT_A_SEGMENT[text]}, and "
                          "it fills a part of the upstream URL: '.', '..' and empty values "
                          "would send the call to another path; send the real value")
        return quote(text, safe="")
    return _MARKS.sub(one, encoded)


@functools.lru_cache(maxsize=1024)
def _encoded_template(template: str) -> tuple[str, tuple[str, ...]]:
    """The template encoded as a URL with a mark for each placeholder, and their names."""
    names: list[str] = []

    def mark(match: re.Match[str]) -> str:
        names.append(match.group(1))
        return _MARK.format(len(names) - 1)
    marked = _PLACEHOLDER.sub(mark, template)
    try:
        encoded = str(yarl.URL(marked))
    except ValueError as exc:
        raise Refusal("upstream_error", f"the upstream URL template {template!r} is not a URL: "
                      f"{exc}") from None
    if sorted(int(i) for i in _MARKS.findall(encoded)) != list(range(len(names))):
        raise Refusal("upstream_error", f"the upstream URL template {template!r} loses a "
                      "placeholder when encoded (a '.' or '..' segment around it?): write the "
                      "path without dot segments")
    return encoded, tuple(names)


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
        method, url, mcp_tool, template = "MCP", u.mcp.url or "", u.mcp.tool, u.mcp.target
    else:
        assert u.url is not None  # the validator guarantees one of url or mcp
        method, url, mcp_tool, template = u.method, fill_url(u.url, arguments), None, u.url
        if not u.send_placeholder_args:  # in the URL already: not again in the body or query
            placed = set(_encoded_template(u.url)[1])
            arguments = {k: v for k, v in arguments.items() if k not in placed}
    return Prepared(m, method, url, arguments, headers, timeout_ms / 1000,
                    retry.attempts if retry else 1, retry.base_ms if retry else 0,
                    retry.max_ms if retry else 0, mcp_tool,
                    u.max_response_bytes or DEFAULT_MAX_RESPONSE_BYTES, template,
                    dict(extra_headers))


def mcp_server(mcp: McpUpstream, headers: dict[str, str]) -> Server:
    """The MCP server a manifest names, as the pool knows it (headers only for HTTP)."""
    if mcp.command is not None:
        return StdioServer(tuple(mcp.command), tuple(sorted(mcp.env.items())), mcp.cwd)
    return HttpServer(mcp.url or "", tuple(sorted(headers.items())))


class Upstream:
    """The HTTP client for JSON upstreams (aiohttp: its C parser costs a third of httpx's
    time per call, which is most of what the gateway adds); MCP upstreams through
    ``McpClients``: sessions kept open per server, and, when ``commands`` is true (local
    mode only), stdio servers started from ``upstream.mcp.command``."""

    def __init__(self, *, commands: bool = False, mcp: McpClients | None = None) -> None:
        self._session: aiohttp.ClientSession | None = None
        self.schemas: dict[tuple[str, str], dict[str, Any]] = {}
        self.mcp = mcp or McpClients(commands=commands)
        # (url, tool) -> the MCP upstream's tools/list entry: its outputSchema and annotations
        self.listed: dict[tuple[str, str], dict[str, Any]] = {}

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:  # created in the running loop, as aiohttp requires
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=200, enable_cleanup_closed=True),
                auto_decompress=True)
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
        await self.mcp.aclose()

    async def send(self, p: Prepared) -> Answer:
        answer = Answer("not_sent")
        for attempt in range(1, p.attempts + 1):
            answer = await (self._mcp(p) if p.mcp_tool else self._http(p))
            answer.attempts = attempt
            retryable = answer.kind in ("not_sent", "timeout", "lost") or (
                answer.kind == "error_status" and (answer.status or 0) in (429, 502, 503, 504))
            relay = relays.current()
            if relay is not None and relay.cancelled.is_set():  # the client gave up: no retry
                return answer
            if not retryable or attempt == p.attempts:
                return answer
            delay = min(p.max_ms, p.base_ms * 2 ** (attempt - 1)) / 1000
            await asyncio.sleep(delay)
        return answer

    async def _http(self, p: Prepared) -> Answer:
        method = p.method
        body = p.arguments if method in ("POST", "PUT", "PATCH") else None
        params = None if body is not None or not p.arguments else {
            k: _query_value(v) for k, v in p.arguments.items()}
        url = yarl.URL(p.url, encoded=True)
        deadline = asyncio.get_running_loop().time() + p.timeout_s
        try:
            for hops in range(MAX_REDIRECTS + 1):
                left = max(0.001, deadline - asyncio.get_running_loop().time())
                # Redirects are never followed by aiohttp: it would carry the tool's headers
                # (its Secrets) and the body to wherever the upstream points (it drops only
                # Authorization and cookies across origins). _redirect decides instead.
                async with self.session().request(method, url, json=body, params=params,
                                                  headers=p.headers, allow_redirects=False,
                                                  timeout=aiohttp.ClientTimeout(total=left)) as response:
                    status = response.status
                    if _is_redirect(status):
                        follow, said = _redirect(p, url, response.headers.get("Location"), hops)
                        if follow is None:
                            response.close()
                            return Answer("error_status", status, None, said)
                        url, params = follow, None  # the Location carries its own query
                        if status == 303 or (status in (301, 302) and method == "POST"):
                            method, body = "GET", None  # as every HTTP client does
                        continue
                    raw = await _read_capped(response, p.max_response_bytes)
                    break
            else:  # _redirect stops at MAX_REDIRECTS: never reached
                return Answer("error_status", None, None, f"{p.where}: too many redirects")
        except aiohttp.ClientConnectorError as exc:
            return Answer("not_sent", text=f"{p.where}: cannot connect: {_short(exc, p)}",
                          sent=False)
        except TimeoutError:
            return Answer("timeout", text=f"{p.where}: no answer within {p.timeout_s:g}s")
        except aiohttp.ClientError as exc:
            return Answer("lost", text=f"{p.where}: the connection failed: {_short(exc, p)}")
        if raw is None:
            too_large = (f"{p.where} answered {status} with more than {p.max_response_bytes} "
                         "bytes (after decompression), so the answer was not read; if it is "
                         "meant to be this large, raise upstream.max_response_bytes")
            if 200 <= status < 300:
                return Answer("too_large", status, None, too_large)
            return Answer("error_status", status, None, too_large)
        try:
            data = json.loads(raw) if raw.strip() else None
        except (ValueError, RecursionError):
            data = _NOT_JSON
        if data is not _NOT_JSON and nesting_problem(data, MAX_DEPTH) is not None:
            message = (f"{p.where} answered {status} with JSON nested deeper than {MAX_DEPTH} "
                       "levels, which the gateway does not keep or pass on")
            if 200 <= status < 300:
                return Answer("too_large", status, None, message)
            return Answer("error_status", status, None, message)
        if not 200 <= status < 300:
            return Answer("error_status", status, None if data is _NOT_JSON else data,
                          raw.decode("utf-8", "replace")[:2000])
        if data is None:  # 204 No Content, or a 2xx with an empty body: done, nothing said
            return Answer("ok", status, None, "")
        if data is _NOT_JSON:
            return Answer("not_json", status, None, raw.decode("utf-8", "replace")[:2000])
        return Answer("ok", status, data, "")

    async def _mcp(self, p: Prepared) -> Answer:
        mcp = p.manifest.upstream.mcp if p.manifest.upstream is not None else None
        assert mcp is not None  # prepare sets mcp_tool only for an MCP upstream
        own = {k: v for k, v in p.headers.items() if k not in p.call_headers}
        try:
            result = await self.mcp.call(mcp_server(mcp, own), p.mcp_tool or "", p.arguments,
                                         timeout_s=p.timeout_s, cap=p.max_response_bytes,
                                         call_headers=p.call_headers)
        except McpFailure as exc:
            text = f"{p.where}: {_short(exc, p)}" if exc.kind != "too_large" else f"{p.where} {exc}"
            if exc.kind == "refused":  # the server says it did not run the call
                return Answer("tool_error", None, None, text, code="upstream_rejected")
            if exc.kind == "cancelled":  # sent, then cancelled: the server may have acted
                return Answer("lost", text=text)
            return Answer(exc.kind, text=text, sent=exc.kind != "not_sent")
        return mcp_answer(result, p.where)

    async def list_mcp_tools(self, mcp: McpUpstream | str, headers: dict[str, str] | None = None,
                             timeout_s: float = 10.0,
                             keep: frozenset[str] | None = None) -> dict[str, dict[str, Any]]:
        """Every tool an MCP upstream lists (a URL, or a manifest's ``upstream.mcp``), as
        its tools/list entry (``inputSchema``, ``outputSchema``, ``annotations``...); with
        ``keep``, only those it names (``McpClients.list_tools``: the listing's budget)."""
        if isinstance(mcp, str):
            mcp = McpUpstream(url=mcp, tool="")
        tools = await self.mcp.list_tools(mcp_server(mcp, headers or {}), timeout_s, keep)
        return {t["name"]: t for t in tools}

    async def list_mcp_schemas(self, mcp: McpUpstream | str, headers: dict[str, str] | None = None,
                               timeout_s: float = 10.0) -> dict[str, dict[str, Any]]:
        """The input schema of every tool an MCP upstream lists (for schema drift)."""
        tools = await self.list_mcp_tools(mcp, headers, timeout_s)
        return {name: dict(tool.get("inputSchema") or {}) for name, tool in tools.items()}


def mcp_answer(result: Any, where: str = "the MCP tool") -> Answer:
    """An MCP upstream's ``tools/call`` result as an Answer. Its data (``$result``) is the
    structured content, else the text blocks read as JSON, else ``{"content": [blocks]}``
    (an image, plain text: an MCP answer is always readable). The result is kept as sent
    (McpContent), so the MCP door passes its blocks and structured content on unchanged.
    An ``isError`` result is a tool_error that says so (there was no HTTP status)."""
    blocks = [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in result.content]
    sent = McpContent(blocks, result.structured_content)
    data = result.structured_content
    text = "".join(getattr(c, "text", "") for c in result.content)
    if data is None and text:
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            data = None
    if result.is_error:
        said = f": {text[:1000]}" if text else ""
        return Answer("tool_error", None, data, f"{where}: the MCP tool answered with an error "
                      f"(isError){said}", content=sent)
    if data is None:
        data = {"content": blocks}
    return Answer("ok", 200, data, "", content=sent)


_NOT_JSON = object()
MAX_REDIRECTS = 5  # with upstream.redirects: same_origin


def _is_redirect(status: int) -> bool:
    return 300 <= status < 400 and status != 304


def _redirect(p: Prepared, url: yarl.URL, location: str | None,
              hops: int) -> tuple[yarl.URL | None, str]:
    """Where to go next for a 3xx, or (None, why it is the answer). Only with
    ``upstream.redirects: same_origin``, to the same scheme, host and port, and at most
    ``MAX_REDIRECTS`` times; a redirect elsewhere is never followed."""
    try:
        target = url.join(yarl.URL(location)) if location else None
    except ValueError:
        target = None
    where = f"a redirect to {target.origin()}" if target is not None and target.absolute \
        else "a redirect with no usable Location"
    opted = p.manifest.upstream is not None and p.manifest.upstream.redirects == "same_origin"
    if target is not None and target.absolute and opted and target.origin() == url.origin() \
            and hops < MAX_REDIRECTS:
        return target, ""
    if opted and (target is None or not target.absolute):
        why = "there is nowhere to follow it to"
    elif opted and target is not None and target.origin() != url.origin():
        why = ("another origin: a redirect there is never followed, since it would carry the "
               "tool's headers and the call's body; if the API moved, change upstream.url")
    elif opted:
        why = f"more than {MAX_REDIRECTS} redirects in a row"
    else:
        why = ("the gateway does not follow redirects (they would carry the tool's headers and "
               "the call's body wherever the upstream points): if the API moved, change "
               "upstream.url; to follow redirects within its scheme, host and port, set "
               "upstream.redirects: same_origin")
    return None, f"{p.where} answered with {where}: {why}"


def _query_value(value: Any) -> str:
    text = plain_text(value)
    return text if text is not None else json.dumps(value, separators=(",", ":"))


async def _read_capped(response: aiohttp.ClientResponse, cap: int) -> bytes | None:
    """The answer's body, decompressed, or None once it passes ``cap`` bytes: read in
    chunks (aiohttp decompresses each as it is read), so a compressed bomb costs at most
    ``cap`` plus a chunk; the connection is dropped, not drained."""
    declared = response.content_length
    chunks: list[bytes] = []
    size = 0
    if declared is None or declared <= cap:
        async for chunk in response.content.iter_chunked(_READ_CHUNK):
            size += len(chunk)
            if size > cap:
                break
            chunks.append(chunk)
        else:
            return b"".join(chunks)
    response.close()
    return None


def _short(exc: BaseException, p: Prepared) -> str:
    """An exception's first line, with any URL in it (a client may name the filled one,
    query included) replaced by the template."""
    text = (str(exc) or type(exc).__name__).splitlines()[0]
    return _URL.sub(lambda _: p.template or "(the URL)", text)[:300]
