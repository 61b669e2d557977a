"""The MCP conformance suite (npm @modelcontextprotocol/conformance 0.1.16) as the external
judge of authorization.

Its authorization scenarios are client scenarios: the suite stands up an authorization server
and a resource server of its own and checks every request a client makes (discovery from
WWW-Authenticate and RFC 9728 metadata, PKCE, the RFC 8707 resource, scope selection and
step-up). So the judgment comes in two steps, both run here:

1. the suite's whole `auth` suite passes for the client these tests use (the official `mcp`
   SDK's OAuthClientProvider, tests/gateway/oauth_client.py), against the suite's reference
   resource server;
2. that same client, unchanged, authorizes itself at `unwind gateway --auth oauth` against a
   real issuer and calls a tool, including a scope step-up after the gateway's 403
   insufficient_scope: what the suite's resource server announces, the gateway announces too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .auth_parts import Issuer, node22, running_issuer
from .conftest import ROOT, GatewayProc, env, start_gateway, stop
from .installs import CONFORMANCE, npm_tool

HERE = Path(__file__).parent
CLIENT = HERE / "oauth_client.py"
COMMENT = {"repo": "octo/hello", "issue": 7, "client_id": "c9", "body": "via oauth"}


def conformance() -> list[str]:
    launcher = npm_tool(*CONFORMANCE)
    return [str(node22()), str(launcher.resolve())]


def test_the_conformance_suites_authorization_scenarios_pass_for_the_tested_client(
        tmp_path: Path) -> None:
    done = subprocess.run([*conformance(), "client", "--command", f"{sys.executable} {CLIENT}",
                           "--suite", "auth", "--expected-failures",
                           str(HERE / "conformance-baseline.yml"), "-o", str(tmp_path)],
                          cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "Baseline check passed" in done.stdout
    checks = [json.loads(p.read_text()) for p in tmp_path.rglob("checks.json")]
    assert len(checks) >= 13  # one folder per scenario
    assert not [c["id"] for run in checks for c in run if c["status"] == "FAILURE"]


@pytest.fixture(scope="module")
def issuer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Issuer]:
    with running_issuer(tmp_path_factory.mktemp("issuer")) as it:
        yield it


@pytest.fixture(scope="module")
def oauth_gateway(manifests: Path, issuer: Issuer,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProc]:
    base = tmp_path_factory.mktemp("oauth-conformance")
    config = {"issuer": issuer.url, "scopes": {"repo:read": ["repo.read"],
                                               "repo:write": ["repo.write"]}}
    gw = start_gateway(manifests, base / "ledger", base, "--auth", "oauth", "--oauth-config",
                       json.dumps(config), scopes="")
    try:
        yield gw
    finally:
        stop(gw.proc)


def client(gw: GatewayProc, issuer: Issuer, run: str, **extra: str) -> dict[str, object]:
    variables = {**env(), "UNWIND_RUN": run, "UNWIND_CLIENT_ID": "ide-1",
                 "UNWIND_CLIENT_ISSUER": issuer.url,
                 "UNWIND_CALL": json.dumps({"tool": "github__create_comment",
                                            "arguments": COMMENT}), **extra}
    done = subprocess.run([sys.executable, str(CLIENT), f"{gw.url}/mcp"], cwd=ROOT,
                          env=variables, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_the_same_client_authorizes_itself_at_the_gateway_and_calls_a_tool(
        oauth_gateway: GatewayProc, issuer: Issuer) -> None:
    out = client(oauth_gateway, issuer, "conf-1")
    assert "github__create_comment" in out["tools"]  # type: ignore[operator]
    assert out["called"] == {"tool": "github__create_comment", "is_error": False,
                             "structured": out["called"]["structured"]}  # type: ignore[index]
    assert [(e["actor"], e["state"]) for e in oauth_gateway.entries("conf-1")] == [
        ("oauth:johndoe", "succeeded")]


def test_the_client_steps_up_after_the_gateways_insufficient_scope_and_the_call_then_runs(
        oauth_gateway: GatewayProc, issuer: Issuer) -> None:
    resource = f"{oauth_gateway.url}/mcp"
    narrow = issuer.token(scope="repo.read", resource=resource, client="johndoe")
    out = client(oauth_gateway, issuer, "conf-2", UNWIND_TOKEN=narrow,
                 UNWIND_TOKEN_SCOPE="repo.read")
    assert out["called"]["is_error"] is False  # type: ignore[index]
    states = [(e["state"], (e.get("error") or {}).get("code")) for e in
              oauth_gateway.entries("conf-2")]
    assert states == [("refused", "permission_denied"), ("succeeded", None)]
