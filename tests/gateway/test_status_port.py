"""The probes' status port (gateway/status.py): health and readiness, nothing else."""

from __future__ import annotations

import asyncio

import pytest

from unwind.gateway.status import respond, start


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def test_healthz_is_200_and_readyz_follows_readiness() -> None:
    assert status_of(respond(b"GET /healthz HTTP/1.1", lambda: False)) == 200
    assert status_of(respond(b"GET /readyz HTTP/1.1", lambda: False)) == 503
    assert status_of(respond(b"GET /readyz?x=1 HTTP/1.1", lambda: True)) == 200


@pytest.mark.parametrize("line", [b"POST /call/payments.refund HTTP/1.1", b"GET /call/x HTTP/1.1",
                                  b"GET /metrics HTTP/1.1", b"GET /calls/run/entry HTTP/1.1",
                                  b"GET /mcp HTTP/1.1", b"GET / HTTP/1.1", b"GET /healthz/../call HTTP/1.1"])
def test_the_status_port_answers_nothing_but_health(line: bytes) -> None:
    answer = respond(line, lambda: True)
    assert status_of(answer) == 404
    assert answer.endswith(b"this port answers /healthz and /readyz only\n")


def test_a_request_that_is_not_http_or_changes_something_is_refused() -> None:
    assert status_of(respond(b"\x16\x03\x01 garbage", lambda: True)) == 400
    assert status_of(respond(b"DELETE /readyz HTTP/1.1", lambda: True)) == 405


async def test_the_listener_answers_a_real_get_and_drops_an_oversized_request() -> None:
    ready = {"now": False}
    server = await start("127.0.0.1", 0, lambda: ready["now"])
    port = server.sockets[0].getsockname()[1]

    async def get(raw: bytes) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(raw)
        await writer.drain()
        out = await reader.read()
        writer.close()
        return out

    try:
        assert status_of(await get(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")) == 503
        ready["now"] = True
        assert status_of(await get(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")) == 200
        assert await get(b"GET /readyz HTTP/1.1\r\nX: " + b"a" * 10000 + b"\r\n\r\n") == b""
    finally:
        server.close()
        await server.wait_closed()
