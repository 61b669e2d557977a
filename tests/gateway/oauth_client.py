"""An MCP client that authorizes itself as the MCP authorization spec says: the official
`mcp` SDK's OAuthClientProvider (discovery from WWW-Authenticate and RFC 9728 metadata,
authorization code with PKCE and the RFC 8707 resource, scope step-up on insufficient_scope),
with a headless user agent that follows the authorization redirect itself.

It is the client the MCP conformance suite judges (`conformance client --command "python
oauth_client.py"`: the suite's authorization server and resource server check every request
it makes), and the same client, unchanged, then runs against `unwind gateway --auth oauth`.

    python oauth_client.py URL            # the suite appends the server URL
    UNWIND_CALL='{"tool": ..., "arguments": {...}}' UNWIND_RUN=run-1 python oauth_client.py URL
    (UNWIND_CLIENT_ID: a pre-registered client; UNWIND_TOKEN: a token it already holds)

Prints one JSON line: {"tools": [...], "called": {...} | null}. Exits 1 on any failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx2
from mcp import Client
from mcp.client.auth import AuthorizationCodeResult, OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

REDIRECT = "http://127.0.0.1:9/callback"  # never served: the redirect is read, not followed


class Memory:
    def __init__(self, client: OAuthClientInformationFull | None) -> None:
        self.tokens: OAuthToken | None = None
        self.client = client

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


async def main(url: str) -> dict[str, Any]:
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    preset = None
    if context.get("client_id") or os.environ.get("UNWIND_CLIENT_ID"):
        preset = OAuthClientInformationFull(
            client_id=context.get("client_id") or os.environ["UNWIND_CLIENT_ID"],
            client_secret=context.get("client_secret"), redirect_uris=[REDIRECT],
            token_endpoint_auth_method="client_secret_basic" if context.get("client_secret")
            else "none", issuer=os.environ.get("UNWIND_CLIENT_ISSUER"))
    codes: list[AuthorizationCodeResult] = []

    async def redirect(authorization_url: str) -> None:
        async with httpx2.AsyncClient(timeout=10) as agent:
            r = await agent.get(authorization_url, follow_redirects=False)
        location = r.headers.get("location")
        if r.status_code not in (301, 302, 303, 307, 308) or not location:
            raise RuntimeError(f"the authorization endpoint answered {r.status_code}: {r.text[:200]}")
        query = parse_qs(urlsplit(location).query)
        codes.append(AuthorizationCodeResult(code=query["code"][0],
                                             state=(query.get("state") or [None])[0],
                                             iss=(query.get("iss") or [None])[0]))

    async def callback() -> AuthorizationCodeResult:
        return codes.pop()

    storage = Memory(preset)
    if os.environ.get("UNWIND_TOKEN"):  # a token held from before (UNWIND_TOKEN_SCOPE its scope)
        storage.tokens = OAuthToken(access_token=os.environ["UNWIND_TOKEN"], token_type="Bearer",
                                    scope=os.environ.get("UNWIND_TOKEN_SCOPE"), expires_in=3600)
    auth = OAuthClientProvider(
        url, OAuthClientMetadata(client_name="unwind-tests", redirect_uris=[REDIRECT],
                                 grant_types=["authorization_code", "refresh_token"],
                                 token_endpoint_auth_method="none"),
        storage, redirect_handler=redirect, callback_handler=callback)
    headers = {"X-Unwind-Run": os.environ["UNWIND_RUN"]} if os.environ.get("UNWIND_RUN") else {}
    wanted = json.loads(os.environ.get("UNWIND_CALL") or "null")
    async with httpx2.AsyncClient(auth=auth, headers=headers, timeout=30) as http, \
            Client(streamable_http_client(url, http_client=http)) as client:
        listed = await client.list_tools()
        names = [t.name for t in listed.tools]
        called = None
        target = wanted["tool"] if wanted else (names[0] if names else None)
        if target is not None:
            result = await client.call_tool(target, (wanted or {}).get("arguments") or {})
            called = {"tool": target, "is_error": result.is_error,
                      "structured": result.structured_content}
    return {"tools": names, "called": called}


if __name__ == "__main__":
    try:
        print(json.dumps(asyncio.run(main(sys.argv[-1]))))
    except Exception as exc:  # the suite reads the exit code; a person reads this
        print(f"oauth_client: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)
