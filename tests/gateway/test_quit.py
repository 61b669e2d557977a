"""POST /quitquitquit: a plain-container gateway ends once its calls in flight are done,
only in cluster mode, never for a browser."""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest

from unwind.controlplane import demo_agent
from unwind.gateway.quit import ENV, HEADER, PATH, Quit, enabled, refusal, request_quit

from .conftest import GatewayProc, UpstreamProc, free_port, start_gateway, stop

QUIT = {HEADER: "1"}


def test_only_a_gateway_in_a_pod_that_the_injection_asked_has_the_endpoint() -> None:
    assert enabled(True, {ENV: "1"}) is True
    assert enabled(False, {ENV: "1"}) is False  # local mode: a web page must not stop a laptop's gateway
    assert enabled(True, {}) is False and enabled(True, {ENV: "0"}) is False


def test_a_quit_needs_post_the_header_and_no_origin() -> None:
    assert refusal("POST", {"x-unwind-quit": "1"}) is None
    assert refusal("GET", {"x-unwind-quit": "1"}) == (405, "/quitquitquit takes POST")
    assert refusal("POST", {"x-unwind-quit": "1", "origin": "https://evil.example"})[0] == 403  # type: ignore[index]
    status, message = refusal("POST", {}) or (0, "")
    assert status == 400 and "X-Unwind-Quit: 1" in message


async def test_the_quit_waits_for_the_calls_in_flight_and_refuses_new_ones() -> None:
    release, entered = asyncio.Event(), asyncio.Event()
    stops: list[float] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:  # a call that takes its time
        if scope["path"].startswith("/call/"):
            entered.set()
            await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    quit_app = Quit(app, lambda: stops.append(time.monotonic()))
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=quit_app), base_url="http://gw") as http:
        assert (await http.post(PATH, headers={**QUIT, "Origin": "http://page.example"})).status_code == 403
        assert (await http.post(PATH)).status_code == 400
        assert not quit_app.quitting and not stops
        call = asyncio.create_task(http.post("/call/shop.refund"))
        await entered.wait()
        quitting = asyncio.create_task(http.post(PATH, headers=QUIT))
        await asyncio.sleep(0.05)
        assert not quitting.done() and not stops  # the call is still in flight
        late = await http.post("/mcp/", json={})
        assert late.status_code == 503 and late.json()["error"]["code"] == "ledger_unavailable"
        assert (await http.get("/healthz")).status_code == 200  # probes still answer
        release.set()
        assert (await call).status_code == 200
        answer = await quitting
        assert answer.status_code == 200 and answer.json() == {"quitting": True, "waited_for": 1}
        assert len(stops) == 1


def test_a_local_gateway_has_no_quit_endpoint_whatever_its_environment(
        manifests: Path, tmp_path: Path) -> None:
    gw = start_gateway(manifests, tmp_path / "ledger", tmp_path, env_extra={ENV: "1"})
    try:
        assert httpx2.post(f"{gw.url}{PATH}", headers=QUIT, timeout=5).status_code == 404
        assert gw.proc.poll() is None
        assert "is ignored in local mode" in gw.log.read_text()
    finally:
        stop(gw.proc)


def test_in_a_pod_the_gateway_drains_a_slow_call_writes_its_entry_and_exits_0(
        manifests: Path, upstream: UpstreamProc, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """cmd_gateway as in a pod, with local parts standing in for the API server's."""
    from unwind.cli import gateway_cmds
    from unwind.cli.main import build_parser

    real_local = gateway_cmds._local_parts

    def as_in_a_pod(args: argparse.Namespace, metrics: Any) -> Any:
        args.manifests, args.ledger_dir = [str(manifests)], str(tmp_path / "ledger")
        parts = real_local(args, metrics)
        parts.identities = "kubernetes"
        return parts

    monkeypatch.setattr(gateway_cmds, "_cluster_parts", as_in_a_pod)
    monkeypatch.setenv(ENV, "1")
    port = free_port()
    args = build_parser("gateway").parse_args(["gateway", "--cluster", "--listen", f"127.0.0.1:{port}",
                                               "--scopes", "*", "--actor", "agent", "--log-level", "warning"])
    codes: list[int] = []
    server = threading.Thread(target=lambda: codes.append(args.func(args)), daemon=True)
    server.start()
    gw = GatewayProc(f"http://127.0.0.1:{port}", None, tmp_path / "ledger", tmp_path)  # type: ignore[arg-type]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx2.get(f"{gw.url}/readyz", timeout=1).status_code == 200:
                break
        except httpx2.HTTPError:
            time.sleep(0.1)
    upstream.behave("comments.create", "slow", delay=1.0)
    answers: list[httpx2.Response] = []
    call = threading.Thread(target=lambda: answers.append(gw.call(
        "github.create_comment", {"repo": "octo/hello", "issue": 7, "client_id": "q1", "body": "bye"},
        run="quit-run", key="q-1")))
    call.start()
    time.sleep(0.4)
    quit_answer = httpx2.post(f"{gw.url}{PATH}", headers=QUIT, timeout=30)
    call.join(10)
    assert quit_answer.status_code == 200 and quit_answer.json()["waited_for"] == 1
    assert answers[0].status_code == 200
    assert [e["state"] for e in gw.entries("quit-run")] == ["succeeded"]  # its ledger write finished
    server.join(15)
    assert not server.is_alive() and codes == [0]


def test_request_quit_never_raises_and_says_what_happened() -> None:
    assert "nothing to stop" in request_quit(f"http://127.0.0.1:{free_port()}", timeout=2)


def test_the_demo_agent_quits_its_gateway_whether_its_calls_succeeded_or_not(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    quits: list[str] = []
    monkeypatch.setattr(demo_agent, "request_quit", lambda base: quits.append(base) or "stopped")
    monkeypatch.setenv("UNWIND_GATEWAY", "http://127.0.0.1:9/")
    monkeypatch.setenv("UNWIND_DEMO_CALLS", "not json")
    assert demo_agent.main() == 2
    monkeypatch.setenv("UNWIND_DEMO_CALLS", json.dumps([{"tool": "a.b"}]))
    monkeypatch.setattr(demo_agent, "wait_ready", lambda base: True)
    monkeypatch.setattr(demo_agent, "call", lambda base, spec: (502, {}, {"error": {"code": "upstream_error"}}))
    assert demo_agent.main() == 1
    monkeypatch.setattr(demo_agent, "call", lambda base, spec: (200, {}, {}))
    assert demo_agent.main() == 0
    assert quits == ["http://127.0.0.1:9"] * 3
    assert capsys.readouterr().err.count("stopped") == 3


def test_the_demo_agent_ends_fine_against_a_gateway_without_the_endpoint(
        gateway: GatewayProc, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNWIND_GATEWAY", gateway.url)
    monkeypatch.setenv("UNWIND_DEMO_CALLS", "[]")
    assert demo_agent.main() == 0  # a local gateway (as a native sidecar) answers 404: harmless
    assert "has no /quitquitquit" in request_quit(gateway.url)
    assert gateway.proc.poll() is None


def test_unwind_gateway_quit_exits_0_with_nothing_to_stop(capsys: pytest.CaptureFixture[str]) -> None:
    from unwind.cli.main import main

    assert main(["gateway-quit", "--gateway", f"http://127.0.0.1:{free_port()}"]) == 0
    assert "nothing to stop" in capsys.readouterr().err
