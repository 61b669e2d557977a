"""MCP upstreams as users run them: open sessions kept per server, and stdio servers the
gateway starts itself (local mode).

**HTTP servers.** A pool per server identity (URL and the manifest's headers) keeps
initialized sessions between calls: at most ``MAX_OPEN`` open at once (one call each), each
kept while idle (``MAX_IDLE``, as many), none kept idle longer than ``IDLE_S``. The SDK's client
negotiates the protocol with ``mode="auto"``: a server speaking the stateless 2026-07-28
revision is adopted after one ``server/discover`` (each call then is one self-contained
POST; the pool saves the probe and the connection), an older one gets the ``initialize``
handshake and an ``Mcp-Session-Id`` (the pool saves the handshake). A server that forgot
the session (HTTP 404 to a request carrying its ``Mcp-Session-Id``: restarted, expired)
did not run the call: the session is dropped, a new one opened and the call sent once more,
whatever the tool's effect. Any other failure closes the session rather than return it.

**Stdio servers** (``upstream.mcp.command``, local mode only): one process per distinct
command, environment and directory, shared by every call (JSON-RPC carries many calls at
once). It starts with the gateway (listing its tools) or with the first call, its stderr
goes to the gateway's log (``unwind.gateway.mcp``), and a process that exits is started
again by the next call, after a backoff that doubles while it keeps failing (0.5 s to
30 s). A command that cannot start (not found, exits at start, no MCP handshake) refuses
the call naming the command and the last lines of its stderr. Shutdown stops them all.

**Streaming** (relay.py): a call made for an MCP client that asked for progress relays the
server's ``notifications/progress`` to it, and its log messages (an HTTP session carries
one call, so its messages are that call's; a stdio process's go to the call only while it
is the one call in flight). The client's cancellation cancels the upstream call: the SDK
sends ``notifications/cancelled`` (or, at 2026-07-28, closes the request's stream).

What a caller learns (``McpFailure.kind``): ``not_sent`` (nothing reached the server: no
session, no process, connection refused, cancelled before sending), ``timeout``, ``lost``
(sent, answer missing: the server may have acted), ``cancelled`` (sent, then cancelled by
the client: the server may have acted), ``too_large``, ``refused`` (the server answered the
call with a JSON-RPC error saying it did not run it: unknown tool, invalid parameters).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shlex
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, Literal

import anyio
import httpx2

from . import relay as relays
from .relay import Relay

log = logging.getLogger("unwind.gateway.mcp")

MAX_OPEN = 8          # sessions open at once to one HTTP server (each carries one call)
# Every session opened is kept while idle (up to IDLE_S): keeping fewer than MAX_OPEN closed
# and reopened sessions under load (10 in flight: a discover or a handshake, and a DELETE,
# for one call in four, 1.42 upstream requests per call instead of 1; issue 31).
MAX_IDLE = MAX_OPEN   # sessions kept open between calls
IDLE_S = 60.0         # an idle session older than this is closed, not reused
START_TIMEOUT_S = 60.0  # a stdio server's start and handshake (npx may fetch the package)
CLOSE_TIMEOUT_S = 10.0  # closing a session (the SDK stops a stdio server within ~6 s)
BACKOFF_S = (0.5, 30.0)  # first and longest wait before starting a failing command again
STABLE_S = 30.0       # a process that ran this long before exiting starts again at once
STDERR_TAIL = 20      # lines of a stdio server's stderr kept for error messages
# the JSON-RPC errors that say the server did not run the call
_REFUSED_CODES = {-32601: "method not found", -32602: "invalid params"}

# mcp_types.LOG_LEVEL_META_KEY, not imported: the SDK loads on the first MCP call (27 MB)
LOG_LEVEL_META_KEY = "io.modelcontextprotocol/logLevel"
DEFAULT_CAP = 4 * 1024 * 1024  # the manifest's default max_response_bytes
# One tools/list (issue 29, item 7): 30 pages of 3.5 MiB once took the gateway to 345 MiB,
# and the sidecar has 128 Mi. A page is parsed whole by the SDK, at about six times its size,
# so a page may hold LIST_PAGE_BYTES (real servers page far below it); the pages together,
# LIST_BYTES and LIST_TOOLS. Past a total the listing stops, keeping what it found.
LIST_PAGE_BYTES = 1024 * 1024
LIST_BYTES = 16 * 1024 * 1024
LIST_TOOLS = 5_000
FailureKind = Literal["not_sent", "timeout", "lost", "cancelled", "too_large", "refused"]


class McpFailure(Exception):
    def __init__(self, kind: FailureKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class HttpServer:
    """A streamable HTTP server as the pool knows it: its URL and headers (secrets included,
    kept in memory only)."""

    url: str
    headers: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        return self.url


@dataclass(frozen=True)
class StdioServer:
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None

    def describe(self) -> str:
        return "command " + shlex.join(self.command)


Server = HttpServer | StdioServer


def _first_line(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return _first_line(exc.exceptions[0])
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


class _Transport(httpx2.AsyncBaseTransport):
    """A pooled HTTP session's transport: it adds the current call's headers, reads an answer
    up to the call's cap and only uncompressed (the requests ask for identity, so the bytes
    counted are the bytes kept), and notes what the server did with the call's requests."""

    def __init__(self, cap: int) -> None:
        self.inner = httpx2.AsyncHTTPTransport()
        self.begin({}, cap)

    def begin(self, call_headers: dict[str, str], cap: int) -> None:
        self.call_headers, self.cap = call_headers, cap
        self.problem = ""           # too large or compressed: the answer was not read
        self.session_gone = False   # 404 to a request carrying Mcp-Session-Id
        self.reached = False        # a request of this call reached the server
        self.unreachable = ""       # a connection could not be made
        self.received = getattr(self, "received", 0)  # answer bytes, every call (a listing's total)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if request.method == "POST":
            request.headers.update(self.call_headers)
            try:
                request.content  # noqa: B018 (read, so _kind sees what a redirect sends again)
            except httpx2.RequestNotRead:
                await request.aread()  # a JSON-RPC message: bounded by the door's 64 KiB
        try:
            response = await self.inner.handle_async_request(request)
        except httpx2.ConnectError as exc:
            self.unreachable = _first_line(exc)
            raise
        except BaseException:
            self.reached = True
            raise
        self.reached = True
        if response.status_code == 404 and "mcp-session-id" in request.headers:
            self.session_gone = True
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            await response.aclose()
            self.problem = (f"answered with Content-Encoding {encoding!r} though the gateway "
                            "asks MCP upstreams for identity; the answer was not read")
            raise _AnswerRefused(self.problem)
        kind = _kind(request)
        cap = (self.cap if kind == "call" else
               LIST_PAGE_BYTES if kind == "list" else max(self.cap, DEFAULT_CAP))
        response.stream = _CappedStream(response.stream, self, cap)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


class _AnswerRefused(httpx2.StreamError):
    """An answer past the cap, or compressed (the SDK turns a StreamError into a failed call)."""


def _kind(request: httpx2.Request) -> Literal["call", "list", "other"]:
    """What a request is: the tools/call itself (its answer is capped at the manifest's
    max_response_bytes), a page of tools/list (``LIST_PAGE_BYTES``), or what the SDK asks
    around them, a handshake (at least the default). The body of a request the SDK sends
    again after a redirect within the origin is read by then (``handle_async_request``)."""
    try:
        content = request.content
    except httpx2.RequestNotRead:
        return "call"  # unknown: the tightest the call allows
    if b'"tools/call"' in content:
        return "call"
    return "list" if b'"tools/list"' in content else "other"


class _CappedStream(httpx2.AsyncByteStream):
    def __init__(self, stream: Any, owner: _Transport, cap: int) -> None:
        self.stream, self.owner, self.cap = stream, owner, cap

    async def __aiter__(self) -> AsyncIterator[bytes]:
        size = 0
        async for chunk in self.stream:
            size += len(chunk)
            self.owner.received += len(chunk)
            if size > self.cap:
                self.owner.problem = (f"answered with more than {self.cap} bytes, so the "
                                      "answer was not read; if it is meant to be this large, "
                                      "raise upstream.max_response_bytes")
                raise _AnswerRefused(self.owner.problem)
            yield chunk

    async def aclose(self) -> None:
        await self.stream.aclose()


Opener = Callable[[AsyncExitStack, "_Session"], Awaitable[Any]]


def _unchecked(client: Any) -> Any:
    """``client`` without the SDK's check of each result against the tool's listed
    ``outputSchema``: that check lists the server's tools first (once per session, outside
    the listing's budget) and evaluates a schema the upstream chose on the event loop, with
    Python's backtracking ``re`` (issue 29, item 4). The gateway passes a result on as the
    upstream sent it, and the agent's own client checks it against the schema the gateway
    serves."""
    session = getattr(client, "session", None)
    if session is not None and hasattr(session, "validate_tool_result"):
        async def passed(name: str, result: Any) -> None:
            return None
        session.validate_tool_result = passed
    return client


class _Session:
    """One open SDK client, owned by a task of its own: anyio's scopes must close in the task
    that opened them, and calls come from many request tasks."""

    def __init__(self, opener: Opener, label: str, start_timeout_s: float) -> None:
        self.label = label
        self.client: Any = None
        self.transport: _Transport | None = None
        self.ready = asyncio.Event()
        self.stopping = asyncio.Event()
        self.alive = False
        self.failure: BaseException | None = None
        self.exited = ""  # why the process went away (stdio)
        self.counted = False  # its end was counted for the backoff (stdio)
        self.timed_out = self.closed_early = False
        self.relay: Relay | None = None  # the call it carries now (HTTP: one at a time)
        loop = asyncio.get_running_loop()
        self.started_at = self.ended_at = self.idle_since = loop.time()
        self.task = asyncio.create_task(self._own(opener, start_timeout_s), name=f"mcp {label}")

    async def _own(self, opener: Opener, start_timeout_s: float) -> None:
        # The start is bounded by cancelling this task (a scope around the opener would close
        # before the client's own scopes, which anyio refuses).
        timer = asyncio.get_running_loop().call_later(start_timeout_s, self._start_timed_out)
        try:
            async with AsyncExitStack() as stack:
                try:
                    self.client = await opener(stack, self)
                finally:
                    timer.cancel()
                self.alive = True
                self.ready.set()
                await self.stopping.wait()
                self.alive = False
        except asyncio.CancelledError:
            if self.closed_early:
                self.failure = ConnectionAbortedError("closed before it was open")
            elif self.timed_out:
                self.failure = TimeoutError(f"did not complete its start and the MCP handshake "
                                            f"within {start_timeout_s:g}s")
            else:
                raise
        except BaseException as exc:  # kept to name in the refusal
            self.failure = exc
        finally:
            self.alive = False
            self.ended_at = asyncio.get_running_loop().time()
            self.ready.set()
            if self.failure is not None and self.client is not None:
                log.info("MCP session to %s ended: %s", self.label, _first_line(self.failure))

    def _start_timed_out(self) -> None:
        if not self.ready.is_set():
            self.timed_out = True
            self.task.cancel()

    async def opened(self, seconds: float, *, shared: bool = False) -> None:
        """Wait until the session is open; McpFailure(not_sent) when it cannot be. A shared
        session (a stdio process) goes on starting for the next call when this one gives up."""
        with anyio.move_on_after(seconds):
            await self.ready.wait()
        if self.alive:
            return
        if not self.ready.is_set():
            if not shared:
                self.close()
            raise McpFailure("not_sent", f"the MCP server did not complete its start within "
                             f"{seconds:.1f}s")
        raise McpFailure("not_sent", self.why_not())

    def why_not(self) -> str:
        if isinstance(self.failure, FileNotFoundError | PermissionError):
            return f"cannot start it: {_first_line(self.failure)}"
        if self.exited:
            return self.exited
        if self.failure is None:
            return "the MCP session closed"
        return f"cannot open an MCP session: {_first_line(self.failure)}"

    def close(self) -> None:
        if self.alive:
            self.ended_at = asyncio.get_running_loop().time()
        self.alive = False
        self.stopping.set()
        if not self.ready.is_set() and not self.task.done():  # still starting: stop that
            self.closed_early = True
            self.task.cancel()

    async def wait_closed(self, seconds: float) -> None:
        self.close()
        done, _ = await asyncio.wait({self.task}, timeout=seconds)
        if not done:
            self.task.cancel()
            with contextlib.suppress(BaseException):
                await self.task


class _Pool:
    """The open sessions of one HTTP server; each call has one to itself."""

    def __init__(self, server: HttpServer, owner: McpClients) -> None:
        self.server, self.owner = server, owner
        self.idle: list[_Session] = []
        self.slots = asyncio.Semaphore(MAX_OPEN)

    async def checkout(self, seconds: float, fresh: bool) -> _Session:
        with anyio.move_on_after(seconds) as waited:
            await self.slots.acquire()
        if waited.cancelled_caught:
            raise McpFailure("not_sent", f"all {MAX_OPEN} sessions to it stayed busy for "
                             f"{seconds:g}s")
        try:
            now = asyncio.get_running_loop().time()
            while self.idle and not fresh:
                session = self.idle.pop()
                if session.alive and now - session.idle_since < IDLE_S:
                    return session
                self.owner.retire(session)
            session = _Session(self._open, self.server.url, self.owner.start_timeout_s)
            self.owner.sessions.add(session)
            try:
                await session.opened(seconds)
            except McpFailure:
                if session.transport is not None and session.transport.problem:
                    raise McpFailure("not_sent", f"{session.transport.problem} (its answer to the "
                                     "MCP handshake: the call was not sent)") from None
                raise
            return session
        except BaseException:
            self.slots.release()
            raise

    def checkin(self, session: _Session, healthy: bool) -> None:
        self.slots.release()
        if healthy and session.alive and len(self.idle) < MAX_IDLE and not self.owner.closing:
            session.idle_since = asyncio.get_running_loop().time()
            self.idle.append(session)
        else:
            self.owner.retire(session)

    async def _open(self, stack: AsyncExitStack, session: _Session) -> Any:
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client

        transport = _Transport(self.owner.default_cap)
        session.transport = transport
        http = await stack.enter_async_context(httpx2.AsyncClient(
            headers={**dict(self.server.headers), "Accept-Encoding": "identity"},
            timeout=httpx2.Timeout(30.0, read=300.0), transport=transport))
        async def to_call(params: Any) -> None:
            if session.relay is not None:
                await session.relay.on_log(params.level, params.data, params.logger)
        return _unchecked(await stack.enter_async_context(Client(
            streamable_http_client(self.server.url, http_client=http), mode=self.owner.mode,
            cache=None, logging_callback=to_call)))


class _Process:
    """One stdio server: its current session (the process), its stderr and its restarts."""

    def __init__(self, server: StdioServer, owner: McpClients) -> None:
        self.server, self.owner = server, owner
        self.label = server.describe()
        self.session: _Session | None = None
        self.failures = 0
        self.retry_at = 0.0
        self.last = ""
        self.tail: deque[str] = deque(maxlen=STDERR_TAIL)
        self.in_flight: list[Relay | None] = []  # the calls it carries now

    async def current(self, deadline: float) -> _Session:
        """The running session, or a new one once the backoff allows (waiting for it when it
        ends before ``deadline``); McpFailure otherwise."""
        s = self.session
        loop = asyncio.get_running_loop()
        if s is not None and (s.alive or not s.ready.is_set()):
            return s
        if s is not None:
            self.session_ended(s)
        if loop.time() < self.retry_at < deadline - 0.1:
            await asyncio.sleep(self.retry_at - loop.time())
            if self.session is not s:  # another call started it meanwhile
                return await self.current(deadline)
        now = loop.time()
        if now < self.retry_at:
            raise McpFailure("not_sent", f"{self.last}; it failed {self.failures} time"
                             f"{'' if self.failures == 1 else 's'} in a row, the next start is "
                             f"in {self.retry_at - now:.1f}s")
        self.tail.clear()
        s = self.session = _Session(self._open, self.label, self.owner.start_timeout_s)
        self.owner.sessions.add(s)
        return s

    def session_ended(self, s: _Session) -> None:
        """Count a process that went away (once) and set the backoff."""
        if s.counted:
            return
        s.counted = True
        self.last = s.why_not() + ("" if s.exited else self.stderr_said())
        if s.ended_at - s.started_at >= STABLE_S and s.client is not None:
            self.failures = 0  # it ran a while: start again at once
            self.retry_at = 0.0
            return
        self.failures += 1
        first, longest = BACKOFF_S
        self.retry_at = s.ended_at + min(longest, first * 2 ** (self.failures - 1))

    def stderr_said(self) -> str:
        lines = [line for line in self.tail if line.strip()][-3:]
        return f" (its stderr: {' | '.join(lines)[:500]})" if lines else ""

    def worked(self) -> None:
        self.failures = 0

    async def _open(self, stack: AsyncExitStack, session: _Session) -> Any:
        from mcp import Client
        from mcp.client.stdio import StdioServerParameters, stdio_client

        read_fd, write_fd = os.pipe()
        errlog = os.fdopen(write_fd, "w")
        stack.callback(errlog.close)  # the child keeps its copy; ours closes in any case
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        pipe, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                               os.fdopen(read_fd, "rb", 0))
        stack.callback(pipe.close)
        watcher = asyncio.create_task(self._watch(reader, session))
        stack.callback(watcher.cancel)
        command = self.server.command
        params = StdioServerParameters(command=command[0], args=list(command[1:]),
                                       env=dict(self.server.env) or None, cwd=self.server.cwd)
        async def to_call(params: Any) -> None:  # one call in flight: its message
            if len(self.in_flight) == 1 and self.in_flight[0] is not None:
                await self.in_flight[0].on_log(params.level, params.data, params.logger)
        try:
            client = _unchecked(await stack.enter_async_context(
                Client(stdio_client(params, errlog=errlog), mode=self.owner.mode, cache=None,
                       logging_callback=to_call)))
        except BaseException:
            errlog.close()
            await asyncio.sleep(0.05)  # let the watcher log what the process said
            raise
        errlog.close()
        log.info("started MCP server %s", self.label)
        return client

    async def _watch(self, reader: asyncio.StreamReader, session: _Session) -> None:
        """The server's stderr into the gateway's log; its end means the process exited."""
        while True:
            line = await reader.readline()
            if not line:
                break
            text = line.decode("utf-8", "replace").rstrip()
            self.tail.append(text)
            log.info("%s: %s", self.label, text)
        if self.owner.closing:
            return
        session.exited = session.exited or f"the MCP server exited{self.stderr_said()}"
        if session.client is not None:  # one that dies while starting fails its handshake
            log.warning("MCP server %s exited%s; the next call starts it again", self.label,
                        self.stderr_said())
            session.close()


class McpClients:
    """Every MCP server the gateway calls: HTTP pools and stdio processes. ``commands``
    allows starting stdio servers (local mode only); ``pooled=False`` opens a session per
    call and closes it after (the old behaviour, kept for the benchmark)."""

    def __init__(self, *, commands: bool = False, pooled: bool = True, mode: str = "auto",
                 start_timeout_s: float = START_TIMEOUT_S,
                 default_cap: int = DEFAULT_CAP) -> None:
        self.commands, self.pooled, self.mode = commands, pooled, mode
        self.start_timeout_s, self.default_cap = start_timeout_s, default_cap
        self.pools: dict[HttpServer, _Pool] = {}
        self.processes: dict[StdioServer, _Process] = {}
        self.sessions: set[_Session] = set()
        self.closing = False

    def retire(self, session: _Session) -> None:
        session.close()
        session.task.add_done_callback(lambda _: self.sessions.discard(session))

    async def call(self, server: Server, tool: str, arguments: dict[str, Any], *,
                   timeout_s: float, cap: int, call_headers: dict[str, str] | None = None) -> Any:
        """The tool's CallToolResult, or McpFailure saying what is known of the call."""
        if self.closing:
            raise McpFailure("not_sent", "the gateway is shutting down")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        relay = relays.current()
        if relay is not None and relay.cancelled.is_set():
            raise McpFailure("not_sent", f"the client cancelled the call ({relay.why}) before "
                             "it was sent")
        if isinstance(server, StdioServer):
            return await self._call_stdio(server, tool, arguments, deadline, timeout_s, cap,
                                          relay)
        pool = self._pool(server)
        for fresh in (False, True):  # a session the server forgot is opened again, once
            session = await pool.checkout(max(0.0, deadline - loop.time()), fresh or not self.pooled)
            healthy = False
            try:
                assert session.transport is not None
                t = session.transport
                t.begin(call_headers or {}, cap)
                session.relay = relay
                try:
                    result = await _call_tool(session.client, tool, arguments, relay,
                                              max(0.0, deadline - loop.time()))
                except McpFailure:  # cancelled by the client: a new session for the next call
                    raise
                except TimeoutError:
                    if t.problem:
                        raise McpFailure("too_large", t.problem) from None
                    raise McpFailure("timeout", f"no answer within {timeout_s:g}s") from None
                except Exception as exc:  # the SDK raises many kinds
                    if t.problem:
                        raise McpFailure("too_large", t.problem) from None
                    if t.session_gone and not fresh:
                        log.info("MCP server %s forgot its session; opening a new one",
                                 server.url)
                        continue
                    if t.unreachable and not t.reached:
                        raise McpFailure("not_sent", f"cannot connect: {t.unreachable}") from None
                    refused = _refused(exc)
                    if refused:
                        healthy = True
                        raise McpFailure("refused", refused) from None
                    raise McpFailure("lost", f"the MCP call failed: {_first_line(exc)}") from None
                healthy = self.pooled
                return result
            finally:
                session.relay = None
                pool.checkin(session, healthy)
        raise McpFailure("not_sent", "the MCP server forgot a session it had just opened")

    async def _call_stdio(self, server: StdioServer, tool: str, arguments: dict[str, Any],
                          deadline: float, timeout_s: float, cap: int,
                          relay: Relay | None) -> Any:
        if not self.commands:
            raise McpFailure("not_sent", "a gateway starts an MCP server from a command only "
                             "in local mode (unwind gateway --manifests): in a cluster, run the "
                             "server as a service and give upstream.mcp.url")
        process = self.processes.get(server)
        if process is None:
            process = self.processes[server] = _Process(server, self)
        loop = asyncio.get_running_loop()
        session = await process.current(deadline)
        try:
            await session.opened(max(0.0, deadline - loop.time()), shared=True)
        except McpFailure as exc:
            if session.ready.is_set():  # it ended: count it and name why
                process.session_ended(session)
                raise McpFailure("not_sent", process.last) from None
            raise McpFailure("not_sent", f"{exc}{process.stderr_said()}") from None
        process.in_flight.append(relay)
        try:
            result = await _call_tool(session.client, tool, arguments, relay,
                                      max(0.0, deadline - loop.time()))
        except McpFailure:
            raise
        except TimeoutError:
            raise McpFailure("timeout", f"no answer within {timeout_s:g}s") from None
        except Exception as exc:
            refused = _refused(exc)
            if refused:
                raise McpFailure("refused", refused) from None
            why = session.exited or f"the MCP call failed: {_first_line(exc)}"
            session.close()  # its connection is broken: the next call starts the server again
            raise McpFailure("lost", why) from None
        finally:
            process.in_flight.remove(relay)
        process.worked()
        size = len(result.model_dump_json(by_alias=True))
        if size > cap:
            raise McpFailure("too_large", f"answered with more than {cap} bytes, so the answer "
                             "was not kept; if it is meant to be this large, raise "
                             "upstream.max_response_bytes")
        return result

    async def list_tools(self, server: Server, timeout_s: float = 10.0,
                         keep: frozenset[str] | None = None) -> list[dict[str, Any]]:
        """The server's tools as it listed them (JSON objects), every page within the
        listing's budget (``LIST_BYTES``, ``LIST_TOOLS``); with ``keep``, only the tools it
        names (the others are dropped page by page: memory holds one page and what is kept)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        if isinstance(server, StdioServer):
            if not self.commands:
                raise McpFailure("not_sent", "MCP servers are started from a command only in "
                                 "local mode")
            process = self.processes.setdefault(server, _Process(server, self))
            session = await process.current(deadline)
            try:
                await session.opened(max(0.0, deadline - loop.time()), shared=True)
            except McpFailure:
                if session.ready.is_set():
                    process.session_ended(session)
                    raise McpFailure("not_sent", process.last) from None
                raise
            with anyio.fail_after(max(0.0, deadline - loop.time())):
                return await _all_tools(session.client, server.describe(), keep, None)
        pool = self._pool(server)
        session = await pool.checkout(timeout_s, not self.pooled)
        healthy = False
        try:
            assert session.transport is not None
            transport, start = session.transport, session.transport.received
            with anyio.fail_after(max(0.0, deadline - loop.time())):
                tools = await _all_tools(session.client, server.describe(), keep,
                                         lambda: transport.received - start)
            healthy = self.pooled
            return tools
        finally:
            pool.checkin(session, healthy)

    def _pool(self, server: HttpServer) -> _Pool:
        pool = self.pools.get(server)
        if pool is None:
            pool = self.pools[server] = _Pool(server, self)
        now = asyncio.get_running_loop().time()
        for other in self.pools.values():  # idle sessions past IDLE_S close, in every pool
            keep = [s for s in other.idle if s.alive and now - s.idle_since < IDLE_S]
            for s in other.idle:
                if s not in keep:
                    self.retire(s)
            other.idle = keep
        return pool

    async def aclose(self) -> None:
        """Close every session and stop every process the gateway started."""
        self.closing = True
        sessions = list(self.sessions)
        for pool in self.pools.values():
            pool.idle.clear()
        await asyncio.gather(*(s.wait_closed(CLOSE_TIMEOUT_S) for s in sessions))
        self.sessions.clear()


async def _call_tool(client: Any, tool: str, arguments: dict[str, Any], relay: Relay | None,
                     seconds: float) -> Any:
    """``client.call_tool`` within ``seconds``; with a relay, the server's progress goes to
    it, and its cancellation cancels the call (the SDK tells the server) and raises
    McpFailure(cancelled)."""
    if relay is None:
        with anyio.fail_after(seconds):
            return await client.call_tool(tool, arguments)
    progress = relay.on_progress if relay.progress is not None else None
    meta = {LOG_LEVEL_META_KEY: relay.log_level} if relay.log_level else None
    with anyio.fail_after(seconds), anyio.CancelScope() as scope:
        async def cancel_when_asked() -> None:
            await relay.cancelled.wait()
            scope.cancel()
        watcher = asyncio.ensure_future(cancel_when_asked())
        try:
            return await client.call_tool(tool, arguments, progress_callback=progress,
                                          meta=meta)
        finally:
            watcher.cancel()
    raise McpFailure("cancelled", f"the client cancelled the call ({relay.why}) after it was "
                     "sent; the cancellation went on to the MCP server, which may have acted")


async def _all_tools(client: Any, label: str, keep: frozenset[str] | None,
                     received: Callable[[], int] | None) -> list[dict[str, Any]]:
    """Every tool the server lists, as it listed it: the raw entries (the SDK's Tool drops
    the fields it does not know, which the MCP door passes on), each one that is a Tool;
    with ``keep``, only those it names. Within the listing's budget (issue 29, item 7):
    ``received`` gives the bytes the answers took so far (an HTTP session counts them as
    they arrive); without it (stdio) each page's entries are measured as JSON."""
    import mcp_types as types
    from pydantic import TypeAdapter, ValidationError

    raw = TypeAdapter(dict[str, Any])
    tools: list[dict[str, Any]] = []
    cursor: str | None = None
    seen = size = 0
    for page in range(1, 101):  # a paginator that never ends cannot hang the start
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        try:
            listed = await client.session.send_request(types.ListToolsRequest(params=params), raw)
        except Exception as exc:  # a page too large (or broken) ends the listing there
            if page == 1:
                raise
            log.warning("MCP server %s: page %d of its tools/list cannot be read (%s): the "
                        "listing stops there", label, page, _first_line(exc))
            break
        entries = listed.get("tools") if isinstance(listed.get("tools"), list) else []
        seen += len(entries)
        size = received() if received is not None else size + len(json.dumps(entries))
        for tool in entries:
            if keep is not None and not (isinstance(tool, dict) and tool.get("name") in keep):
                continue
            try:
                types.Tool.model_validate(tool)
            except ValidationError:
                log.warning("an MCP server listed a tool that is not one: %s", str(tool)[:200])
                continue
            tools.append(tool)
        cursor = listed.get("nextCursor")
        del listed, entries  # a page is dropped before the next is read
        if not isinstance(cursor, str) or not cursor:
            break
        if size > LIST_BYTES or seen > LIST_TOOLS:
            log.warning("MCP server %s lists more than the gateway reads (%d tools, %d bytes "
                        "after %d pages; at most %d tools and %d MiB): the listing stops here, "
                        "and a tool it has not reached is served without its listed schema",
                        label, seen, size, page, LIST_TOOLS, LIST_BYTES // (1024 * 1024))
            break
    return tools


def _refused(exc: BaseException) -> str:
    """The server's word that it did not run the call (a JSON-RPC error it sent), or ''."""
    from mcp.shared.exceptions import MCPError

    if isinstance(exc, MCPError) and exc.code in _REFUSED_CODES:
        return f"the MCP server refused the call ({_REFUSED_CODES[exc.code]}): {exc.message}"
    return ""
