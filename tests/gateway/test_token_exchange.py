"""The gateway's side of the token exchange (gateway/kube.py ``ExchangedToken``), against a
real HTTPS server with a certificate of the operator's own making: the operator's
certificate is checked by the CA and name the injection gives, the token is renewed at half
its life, a failed renewal keeps the token held while it has a minute left, and a gateway
without one says what to check."""

from __future__ import annotations

import datetime as dt
import os
import ssl
import tempfile
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import aiohttp.web
import pytest

from unwind.gateway.kube import (
    ExchangedToken,
    InClusterConfig,
    KubeClient,
    KubeConfigError,
    KubeUnreachable,
)
from unwind.operator.certs import CA_CERT, TLS_CERT, TLS_KEY, Lifetimes, plan_tls

NAME = "unwind-webhook.unwind-system.svc"


class Operator:
    def __init__(self) -> None:
        self.answers: list[tuple[int, dict[str, Any]]] = []
        self.seen: list[str] = []

    async def handle(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        self.seen.append(request.headers.get("Authorization", ""))
        status, body = self.answers.pop(0) if self.answers else (503, {"error": "down"})
        return aiohttp.web.json_response(body, status=status)


def issued(seconds: float, token: str = "gw-token") -> tuple[int, dict[str, Any]]:
    when = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds)
    return 200, {"token": token, "expiresAt": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
                 "serviceAccount": "system:serviceaccount:shop:unwind-gateway"}


@pytest.fixture
async def operator() -> AsyncIterator[tuple[Operator, str, str]]:
    data, _ = plan_tls(None, [NAME], dt.datetime.now(dt.UTC), Lifetimes())
    assert data is not None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    with tempfile.NamedTemporaryFile("w", suffix=".pem", delete=False) as f:
        f.write(data[TLS_CERT] + data[TLS_KEY])
    context.load_cert_chain(f.name)
    os.unlink(f.name)
    op = Operator()
    app = aiohttp.web.Application()
    app.add_routes([aiohttp.web.post("/v1/gateway-token", op.handle)])
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield op, f"https://127.0.0.1:{port}", data[CA_CERT]
    await runner.cleanup()


async def test_the_token_is_traded_for_checked_against_the_operators_ca_and_renewed_at_half_its_life(
        operator: tuple[Operator, str, str]) -> None:
    op, url, ca = operator
    exchange = ExchangedToken(url, ca, NAME)
    op.answers += [issued(600, "first"), issued(600, "second")]
    async with aiohttp.ClientSession() as session:
        await exchange.renew(session, "projected", 1000.0)
        assert exchange.token == "first" and op.seen == ["Bearer projected"]
        assert 1000 + 290 < exchange.renew_at <= 1000 + 300
        assert not exchange.due(1000 + 200) and exchange.due(1000 + 301)
        await exchange.renew(session, "projected-2", 1301.0)
    assert exchange.token == "second" and op.seen[-1] == "Bearer projected-2"


async def test_a_certificate_for_another_name_is_refused(operator: tuple[Operator, str, str]) -> None:
    op, url, ca = operator
    op.answers.append(issued(600))
    async with aiohttp.ClientSession() as session:
        with pytest.raises(KubeUnreachable, match="did not answer"):
            await ExchangedToken(url, ca, "someone-else.svc").renew(session, "projected", 0.0)
    assert op.seen == []  # the handshake failed: the projected token was never sent


async def test_a_failed_renewal_keeps_the_token_held_while_it_has_a_minute_and_then_says_what_to_check(
        operator: tuple[Operator, str, str]) -> None:
    op, url, ca = operator
    exchange = ExchangedToken(url, ca, NAME, retry_s=5)
    refused = (403, {"error": "pod shop/agent-1 is not labelled"})
    op.answers += [issued(600, "held"), refused, refused]
    async with aiohttp.ClientSession() as session:
        await exchange.renew(session, "projected", 0.0)
        await exchange.renew(session, "projected", 301.0)  # refused: the held token stays
        assert exchange.token == "held"
        assert not exchange.due(303.0)  # tried again only after retry_s
        exchange.expires_at = 0.0  # the held token is at its end
        with pytest.raises(KubeUnreachable, match=r"answered 403: pod shop/agent-1 is not labelled.*the operator's "
                                                  r"log says why"):
            await exchange.renew(session, "projected", 400.0)


async def test_the_client_sends_the_traded_token_to_the_api_server_never_the_projected_one(
        operator: tuple[Operator, str, str], tmp_path: Any) -> None:
    op, url, ca = operator
    op.answers.append(issued(600, "gw-token"))
    seen: list[str] = []

    async def api(request: aiohttp.web.Request) -> aiohttp.web.Response:
        seen.append(request.headers["Authorization"])
        return aiohttp.web.json_response({"kind": "ConfigMap"})

    app = aiohttp.web.Application()
    app.add_routes([aiohttp.web.get("/api/v1/namespaces/shop/configmaps/unwind-bundle", api)])
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    data, _ = plan_tls(None, ["127.0.0.1"], dt.datetime.now(dt.UTC), Lifetimes())
    assert data is not None
    (tmp_path / "server.pem").write_text(data[TLS_CERT] + data[TLS_KEY])
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(tmp_path / "server.pem"))
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    (tmp_path / "token").write_text("projected-for-the-operator")
    (tmp_path / "ca.crt").write_text(data[CA_CERT])
    config = InClusterConfig(f"https://127.0.0.1:{port}", tmp_path / "token", tmp_path / "ca.crt")
    kube = KubeClient(config, exchange=ExchangedToken(url, ca, NAME))
    try:
        assert await kube.get("/api/v1/namespaces/shop/configmaps/unwind-bundle") == {"kind": "ConfigMap"}
        assert await kube.get("/api/v1/namespaces/shop/configmaps/unwind-bundle") == {"kind": "ConfigMap"}
    finally:
        await kube.aclose()
        await runner.cleanup()
    assert seen == ["Bearer gw-token", "Bearer gw-token"]
    assert op.seen == ["Bearer projected-for-the-operator"]  # traded once, not per request


def test_an_exchange_without_the_operators_ca_is_a_setup_error() -> None:
    assert ExchangedToken.from_env({}) is None
    with pytest.raises(KubeConfigError, match="UNWIND_EXCHANGE_CA holds no PEM certificate"):
        ExchangedToken.from_env({"UNWIND_TOKEN_EXCHANGE": "https://10.0.0.9:9444"})
