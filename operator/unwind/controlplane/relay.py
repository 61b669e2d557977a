"""A TCP relay on the dev node's address to the operator's token exchange.

Why: on the dev node a pod reaches the host's addresses and, through kube-proxy, Services
whose endpoints are the host, but not a Service whose endpoints are other pods: that would
be forwarding, and ``net.ipv4.ip_forward`` stays 0 here (docs/controlplane.md). The
operator's pods are such endpoints. So ``unwind dev up`` runs this relay on the node's
address (port ``EXCHANGE_PORT``), where the gateways of the node's pods reach it, to the
webhook Service's cluster IP, which this machine reaches through kube-proxy's rules; the
chart is told the relay's address (``webhook.exchangeURL``). TLS passes through untouched:
the gateway checks the operator's own certificate. On a real cluster gateways use the
Service's cluster IP and there is no relay.

``python -m unwind.controlplane.relay LISTEN_HOST:PORT TARGET_HOST:PORT``
"""

from __future__ import annotations

import asyncio
import contextlib
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def serve(listen: tuple[str, int], target: tuple[str, int]) -> None:
    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(*target), 10)
        except (OSError, TimeoutError):
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    server = await asyncio.start_server(one, *listen)
    async with server:
        await server.serve_forever()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


if __name__ == "__main__":
    asyncio.run(serve(_address(sys.argv[1]), _address(sys.argv[2])))
