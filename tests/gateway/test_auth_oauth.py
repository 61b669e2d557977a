"""The gateway as an OAuth resource server (MCP authorization, 2025-06-18 and 2025-11-25),
against a real issuer signing real JWTs (oauth2-mock-server) and `unwind gateway --auth
oauth` as a process."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from .auth_parts import Issuer, running_issuer
from .conftest import GatewayProc, UpstreamProc, start_gateway, stop

COMMENT = {"repo": "octo/hello", "issue": 7, "client_id": "c1", "body": "looks good"}
SCOPE_MAP = {"repo:read": ["repo.read"], "repo:write": ["repo.write"],
             "payments:write": ["payments.write"]}


@pytest.fixture(scope="module")
def issuer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Issuer]:
    with running_issuer(tmp_path_factory.mktemp("issuer")) as it:
        yield it


@pytest.fixture(scope="module")
def oauth_gateway(manifests: Path, issuer: Issuer,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProc]:
    base = tmp_path_factory.mktemp("oauth-gateway")
    config = {"issuer": issuer.url, "scopes": SCOPE_MAP}
    gw = start_gateway(manifests, base / "ledger", base, "--auth", "oauth", "--oauth-config",
                       json.dumps(config), scopes="")
    try:
        yield gw
    finally:
        stop(gw.proc)


def call(gw: GatewayProc, tool: str, token: str | None, arguments: dict[str, Any] | None = None,
         run: str = "run-1", host: str | None = None, **headers: str) -> httpx2.Response:
    sent = {"Content-Type": "application/json", "X-Unwind-Run": run, **headers}
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    if host is not None:
        sent["Host"] = host
    return httpx2.post(f"{gw.url}/call/{tool}", json={"arguments": arguments or {}},
                       headers=sent, timeout=30)


def challenge(response: httpx2.Response) -> dict[str, str]:
    """The parameters of a Bearer WWW-Authenticate header."""
    value = response.headers["WWW-Authenticate"]
    assert value.startswith("Bearer ")
    out: dict[str, str] = {}
    import re
    for name, quoted in re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', value):
        out[name] = quoted
    return out


def test_a_call_without_a_token_gets_401_pointing_at_the_resource_metadata(
        oauth_gateway: GatewayProc, upstream: UpstreamProc) -> None:
    r = call(oauth_gateway, "github.create_comment", None, COMMENT)
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "unauthorized"
    params = challenge(r)
    assert params["resource_metadata"] == f"{oauth_gateway.url}/.well-known/oauth-protected-resource"
    assert upstream.count("comments.create") == 0


def test_the_metadata_names_exactly_the_url_the_client_used_and_the_issuer(
        oauth_gateway: GatewayProc, issuer: Issuer) -> None:
    port = oauth_gateway.url.rsplit(":", 1)[1]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
        r = httpx2.post(f"{oauth_gateway.url}/mcp", json={}, headers={
            "Host": host, "Content-Type": "application/json"}, timeout=10)
        assert r.status_code == 401
        url = challenge(r)["resource_metadata"]
        assert url == f"http://{host}/.well-known/oauth-protected-resource/mcp"
        doc = httpx2.get(f"{oauth_gateway.url}/.well-known/oauth-protected-resource/mcp",
                         headers={"Host": host}, timeout=10).json()
        assert doc["resource"] == f"http://{host}/mcp"
        assert doc["authorization_servers"] == [issuer.url]
        assert doc["scopes_supported"] == ["payments.write", "repo.read", "repo.write"]
        root = httpx2.get(f"{oauth_gateway.url}/.well-known/oauth-protected-resource",
                          headers={"Host": host}, timeout=10).json()
        assert root["resource"] == f"http://{host}"


def test_a_token_for_this_resource_calls_and_the_ledger_records_its_subject_never_the_token(
        oauth_gateway: GatewayProc, issuer: Issuer, upstream: UpstreamProc) -> None:
    token = issuer.token(scope="repo.write", resource=oauth_gateway.url, client="ide-7")
    r = call(oauth_gateway, "github.create_comment", token, COMMENT, run="oauth-ok")
    assert r.status_code == 200, r.text
    entries = oauth_gateway.entries("oauth-ok")
    assert [(e["actor"], e["state"]) for e in entries] == [("oauth:ide-7", "succeeded")]
    sent = [q for q in upstream.admin("requests")["requests"] if q["route"] == "comments.create"]
    assert sent and all(token not in str(q.get("authorization")) for q in sent)


@pytest.mark.parametrize("why", ["wrong audience", "expired", "another key", "symmetric key",
                                 "another issuer", "not a jwt"])
def test_a_token_that_does_not_verify_is_401_invalid_token_and_nothing_is_called(
        oauth_gateway: GatewayProc, issuer: Issuer, upstream: UpstreamProc, why: str) -> None:
    good = issuer.token(scope="repo.write", resource=oauth_gateway.url)
    header = jwt.get_unverified_header(good)
    claims = jwt.decode(good, options={"verify_signature": False})
    own = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    token = {
        "wrong audience": lambda: issuer.token(scope="repo.write", resource="https://other.example"),
        "expired": lambda: issuer.token(scope="repo.write", resource=oauth_gateway.url,
                                        expires_in=-120),
        "another key": lambda: jwt.encode(claims, own, algorithm="RS256", headers=header),
        "symmetric key": lambda: jwt.encode(claims, "secret", algorithm="HS256",
                                            headers={"kid": header["kid"]}),
        "another issuer": lambda: jwt.encode({**claims, "iss": "https://evil.example"}, own,
                                             algorithm="RS256"),
        "not a jwt": lambda: base64.b64encode(b"opaque").decode(),
    }[why]()
    r = call(oauth_gateway, "github.create_comment", token, COMMENT, run="oauth-bad")
    assert r.status_code == 401, r.text
    assert challenge(r)["error"] == "invalid_token"
    assert upstream.count("comments.create") == 0
    assert oauth_gateway.entries("oauth-bad") == []


def test_a_scope_shortfall_is_403_insufficient_scope_naming_the_scope_and_is_recorded(
        oauth_gateway: GatewayProc, issuer: Issuer, upstream: UpstreamProc) -> None:
    token = issuer.token(scope="repo.read", resource=oauth_gateway.url)
    r = call(oauth_gateway, "github.create_comment", token, COMMENT, run="oauth-scope")
    assert r.status_code == 403
    assert r.json()["error"]["code"] == "permission_denied"
    params = challenge(r)
    assert params["error"] == "insufficient_scope"
    assert params["scope"].split() == ["repo.read", "repo.write"]
    assert [(e["state"], e["error"]["code"]) for e in oauth_gateway.entries("oauth-scope")] == [
        ("refused", "permission_denied")]
    assert upstream.count("comments.create") == 0


def test_mcp_answers_a_scope_shortfall_with_http_403_and_the_json_rpc_id(
        oauth_gateway: GatewayProc, issuer: Issuer) -> None:
    resource = f"{oauth_gateway.url}/mcp"
    token = issuer.token(scope="repo.read", resource=resource)
    body = {"jsonrpc": "2.0", "id": 41, "method": "tools/call",
            "params": {"name": "github__create_comment", "arguments": COMMENT}}
    r = httpx2.post(resource, json=body, timeout=10, headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream", "X-Unwind-Run": "oauth-mcp",
        "MCP-Protocol-Version": "2025-11-25"})
    assert r.status_code == 403
    assert r.json()["id"] == 41 and r.json()["error"]["data"]["error"]["code"] == "permission_denied"
    params = challenge(r)
    assert params["error"] == "insufficient_scope" and "repo.write" in params["scope"].split()
    assert params["resource_metadata"].endswith("/.well-known/oauth-protected-resource/mcp")
    assert [e["state"] for e in oauth_gateway.entries("oauth-mcp")] == ["refused"]


def test_a_token_for_the_rest_door_is_refused_at_mcp_its_audience_is_another_resource(
        oauth_gateway: GatewayProc, issuer: Issuer) -> None:
    token = issuer.token(scope="repo.read", resource=oauth_gateway.url)  # the root, not /mcp
    r = httpx2.post(f"{oauth_gateway.url}/mcp", json={"jsonrpc": "2.0", "id": 1,
                    "method": "tools/list"}, timeout=10, headers={
                        "Authorization": f"Bearer {token}", "Content-Type": "application/json",
                        "Accept": "application/json, text/event-stream"})
    assert r.status_code == 401 and challenge(r)["error"] == "invalid_token"


def test_a_web_page_cannot_call_even_with_a_valid_token(
        oauth_gateway: GatewayProc, issuer: Issuer, upstream: UpstreamProc) -> None:
    token = issuer.token(scope="repo.write", resource=oauth_gateway.url)
    r = call(oauth_gateway, "github.create_comment", token, COMMENT, run="oauth-origin",
             Origin="https://evil.example")
    assert r.status_code == 403
    assert upstream.count("comments.create") == 0


def test_the_probes_answer_without_a_token_and_metrics_need_one(
        oauth_gateway: GatewayProc) -> None:
    assert httpx2.get(f"{oauth_gateway.url}/healthz", timeout=5).status_code == 200
    assert httpx2.get(f"{oauth_gateway.url}/readyz", timeout=5).status_code == 200
    assert httpx2.get(f"{oauth_gateway.url}/metrics", timeout=5).status_code == 401
