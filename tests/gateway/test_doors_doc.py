"""The table "Answers of an authenticated door" in docs/gateway.md is what the gateway
answers: each row is made here (a real issuer, a real Redis, `unwind gateway --auth oauth
--rate-limits`) and its status, code and headers must be in the document as a row."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx2
import jwt
import pytest

from .auth_parts import Issuer, running_issuer, start_redis
from .conftest import ROOT, GatewayProc, start_gateway, stop

COMMENT = {"repo": "octo/hello", "issue": 7, "client_id": "doc", "body": "doc"}
HEADERS = ("RateLimit-Policy", "RateLimit", "Retry-After")


def row(r: httpx2.Response) -> str:
    """`| status | `code` | headers |` as the document writes it."""
    code = r.json().get("error", {}).get("code") or r.json()["error"]["data"]["error"]["code"]
    value = r.headers.get("WWW-Authenticate")
    if value is not None:
        params = re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', value)
        shown = "`WWW-Authenticate: Bearer " + ", ".join(
            f'{n}="{v if n == "error" else "…"}"' for n, v in params) + "`"
    else:
        shown = ", ".join(f"`{h}`" for h in HEADERS if h in r.headers)
    return f"| {r.status_code} | `{code}` | {shown} |"


@pytest.fixture(scope="module")
def issuer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Issuer]:
    with running_issuer(tmp_path_factory.mktemp("issuer")) as it:
        yield it


def test_every_row_of_the_authenticated_doors_table_is_an_answer_the_gateway_gives(
        manifests: Path, issuer: Issuer, tmp_path: Path) -> None:
    redis = start_redis(tmp_path)
    limits = {"store": redis.url, "tools": {"github.create_comment": {"requests": 2, "per": "1m"}}}
    oauth = {"issuer": issuer.url, "scopes": {"repo:read": ["repo.read"],
                                              "repo:write": ["repo.write"]}}
    dead = {"issuer": "http://127.0.0.1:9", "scopes": {"repo:write": ["repo.write"]}}
    gw = start_gateway(manifests, tmp_path / "ledger", tmp_path, "--auth", "oauth",
                       "--oauth-config", json.dumps(oauth), "--rate-limits", json.dumps(limits),
                       scopes="")
    cut_off = start_gateway(manifests, tmp_path / "ledger2", tmp_path, "--auth", "oauth",
                            "--oauth-config", json.dumps(dead), scopes="")
    made: list[str] = []

    def call(g: GatewayProc, token: str | None, args: dict[str, object] = COMMENT) -> httpx2.Response:
        headers = {"Content-Type": "application/json", "X-Unwind-Run": "doc"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return httpx2.post(f"{g.url}/call/github.create_comment", json={"arguments": args},
                           headers=headers, timeout=30)
    try:
        made.append(row(call(gw, None)))
        made.append(row(call(gw, issuer.token(scope="repo.write", resource="https://x.example"))))
        made.append(row(call(gw, issuer.token(scope="repo.read", resource=gw.url))))  # counts
        good = issuer.token(scope="repo.write", resource=gw.url)
        assert call(gw, good).status_code == 200
        made.append(row(call(gw, good, {**COMMENT, "client_id": "doc2"})))
        redis.stop()
        made.append(row(call(gw, good, {**COMMENT, "client_id": "doc3"})))
        # a token naming an issuer whose keys cannot be read: nothing can verify it now
        forged = jwt.encode({"iss": "http://127.0.0.1:9", "sub": "x", "aud": cut_off.url,
                             "exp": 4_000_000_000}, _rsa(), algorithm="RS256",
                            headers={"kid": "k1"})
        made.append(row(call(cut_off, forged)))
    finally:
        stop(gw.proc)
        stop(cut_off.proc)
        redis.stop()
    doc = (ROOT / "docs" / "gateway.md").read_text()
    section = doc[doc.index("### Answers of an authenticated door"):].split("\n\n")
    table = next(block for block in section if block.startswith("| status"))
    rows = [line for line in table.splitlines() if line.startswith(("| 4", "| 5"))]
    for wanted in made:
        assert any(line.startswith(wanted) for line in rows), (wanted, rows)
    assert len(rows) == len(made), "a row of the table that no answer produced"


def _rsa() -> object:
    from cryptography.hazmat.primitives.asymmetric import rsa
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)
