"""The gateway's status port: a second listener, for the kubelet's probes only (issue 27, item 4).

The gateway serves the agent on 127.0.0.1 (the agent's door, inside the pod); a kubelet
``httpGet`` probe targets the pod's IP, so it cannot reach that. Before, the probes were
``exec`` of ``unwind probe URL``: a Python process of 0.5-0.6 s CPU every 5 s inside the
gateway's CPU limit, and under load the kubelet killed the gateway for probes that timed out.

This listener (``--status-listen``, the injection gives ``0.0.0.0:8788``) answers two paths
and nothing else, as Istio's status port does:

- ``GET /healthz``: 200 while the process's event loop runs (liveness);
- ``GET /readyz``: 200 once the agent's server listens and the bundle is loaded, else 503
  (readiness, and the native sidecar's startup probe).

Everything else is 404: no ``/call``, no ``/metrics``, no entry, no run, no manifest; the
bodies say only ``ok`` or ``not ready``, so anything in the cluster that can reach the pod
learns whether its gateway is up and no more. It is plain asyncio, not the gateway's app:
it shares nothing with the agent's routes, and a request costs one short read and one write.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

STATUS_PORT = 8788
_MAX_REQUEST = 4096  # a probe's request line and headers are a few hundred bytes
_READ_TIMEOUT_S = 2.0


def _answer(code: int, text: str) -> bytes:
    reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable",
              400: "Bad Request"}[code]
    body = text.encode()
    return (f"HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n").encode() + body


def respond(request_line: bytes, ready: Callable[[], bool]) -> bytes:
    """The answer to one request, from its request line. Pure."""
    parts = request_line.decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return _answer(400, "bad request\n")
    method, target = parts[0], parts[1].split("?", 1)[0]
    if target not in ("/healthz", "/readyz"):
        return _answer(404, "not found: this port answers /healthz and /readyz only\n")
    if method not in ("GET", "HEAD"):
        return _answer(405, "GET only\n")
    if target == "/healthz":
        return _answer(200, "ok\n")
    return _answer(200, "ok\n") if ready() else _answer(503, "not ready\n")


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                  ready: Callable[[], bool]) -> None:
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_TIMEOUT_S)
        writer.write(respond(head.split(b"\r\n", 1)[0], ready))
        await writer.drain()
    except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
            ConnectionError):
        pass  # a slow, cut or oversized request gets no answer: it is not the kubelet
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def start(host: str, port: int, ready: Callable[[], bool]) -> asyncio.Server:
    """Listen on ``host:port``; ``ready`` says whether ``/readyz`` is 200."""
    return await asyncio.start_server(lambda r, w: _handle(r, w, ready), host, port,
                                      limit=_MAX_REQUEST, reuse_address=True)
