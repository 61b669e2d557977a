"""MCP clients outside the cluster: the gateway as an OAuth 2.1 resource server, as the MCP
authorization spec (2025-06-18, 2025-11-25) has it.

- A request without a valid token gets 401 with ``WWW-Authenticate: Bearer
  resource_metadata="<its metadata URL>"`` (plus ``error="invalid_token"`` for a bad one).
- The protected-resource metadata (RFC 9728) is served at the door's well-known URL:
  ``/.well-known/oauth-protected-resource/mcp`` for ``/mcp``, ``/.well-known/oauth-
  protected-resource`` for the REST door; its ``resource`` is exactly the URL the client
  used (the trusted Host it sent, or ``public_url`` behind a proxy), its
  ``authorization_servers`` the configured issuer.
- An access token is a JWT of that issuer (PyJWT), signed by one of its keys (the issuer's
  metadata names the JWKS; an unknown ``kid`` refetches it, at most every 30 s), with an
  ``exp``, and an ``aud`` naming this resource (RFC 8707) or one of the configured
  ``audiences``. Symmetric and ``none`` algorithms are never accepted.
- The actor is a declared claim (``sub`` by default) with a prefix (``oauth:``); the
  Unwind permissions are declared as a map from each permission to the token scopes that
  grant it. Nothing is guessed: a token scope the map does not name grants nothing.
- A scope shortfall is 403 with ``error="insufficient_scope"`` and the scopes that would
  grant the tool's permission, so a client can step up.

The caller's token is never sent anywhere: upstreams get the manifest's credentials.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from ...upstream.errors import Refusal
from ..settings_text import read_settings
from . import AuthFailure, Caller, peek_claims, quoted, unauthorized
from .tokenreview import TtlCache

log = logging.getLogger("unwind.gateway.auth")
WELL_KNOWN = "/.well-known/oauth-protected-resource"
ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512",
              "EdDSA")
REFETCH_S = 30.0
FETCH_TIMEOUT_S = 5.0
MAX_DOCUMENT = 256 * 1024


class OAuthConfigError(ValueError):
    """The OAuth configuration is wrong; the message names the field."""


@dataclass(frozen=True)
class OAuthConfig:
    issuer: str
    scopes: Mapping[str, tuple[str, ...]]  # Unwind permission -> token scopes granting it
    audiences: tuple[str, ...] = ()  # accepted besides the resource URL itself
    jwks_uri: str | None = None  # default: from the issuer's metadata
    actor_claim: str = "sub"
    actor_prefix: str = "oauth:"
    public_url: str | None = None  # the gateway's URL as clients know it (behind a proxy)
    leeway_s: int = 30
    resource_name: str = "Unwind gateway"

    @classmethod
    def parse(cls, data: Any, where: str = "the OAuth configuration") -> OAuthConfig:
        if not isinstance(data, dict):
            raise OAuthConfigError(f"{where}: give an object with issuer and scopes")
        known = {"issuer", "scopes", "audiences", "jwks_uri", "actor_claim", "actor_prefix",
                 "public_url", "leeway_s", "resource_name"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise OAuthConfigError(f"{where}: unknown field {', '.join(unknown)} (it takes "
                                   f"{', '.join(sorted(known))})")
        issuer = data.get("issuer")
        if not isinstance(issuer, str) or not _url_ok(issuer):
            raise OAuthConfigError(f"{where}: issuer must be the issuer's https URL (http only "
                                   "on loopback), e.g. https://login.example.com/realms/agents")
        raw = data.get("scopes")
        if not isinstance(raw, dict) or not raw:
            raise OAuthConfigError(f"{where}: scopes must map each Unwind permission to the "
                                   "token scopes that grant it, e.g. {\"payments:write\": "
                                   "[\"payments.write\"]}: nothing is granted otherwise")
        scopes: dict[str, tuple[str, ...]] = {}
        for permission, grants in raw.items():
            if isinstance(grants, str):
                grants = [grants]
            if not isinstance(grants, list) or not grants or \
                    not all(isinstance(g, str) and g and " " not in g for g in grants):
                raise OAuthConfigError(f"{where}: scopes.{permission} must be a token scope or "
                                       "a list of them (no spaces)")
            scopes[str(permission)] = tuple(grants)
        audiences = data.get("audiences", [])
        if isinstance(audiences, str):
            audiences = [audiences]
        if not isinstance(audiences, list) or not all(isinstance(a, str) for a in audiences):
            raise OAuthConfigError(f"{where}: audiences must be a list of strings")
        for name in ("jwks_uri", "public_url"):
            value = data.get(name)
            if value is not None and (not isinstance(value, str) or not _url_ok(value)):
                raise OAuthConfigError(f"{where}: {name} must be an https URL (http only on "
                                       "loopback)")
        leeway = data.get("leeway_s", 30)
        if not isinstance(leeway, int) or not 0 <= leeway <= 300:
            raise OAuthConfigError(f"{where}: leeway_s must be 0 to 300 seconds")
        for name in ("actor_claim", "actor_prefix", "resource_name"):
            if name in data and not isinstance(data[name], str):
                raise OAuthConfigError(f"{where}: {name} must be a string")
        public = data.get("public_url")
        return cls(issuer=issuer.rstrip("/"), scopes=scopes, audiences=tuple(audiences),
                   jwks_uri=data.get("jwks_uri"),
                   actor_claim=data.get("actor_claim", "sub") or "sub",
                   actor_prefix=data.get("actor_prefix", "oauth:"),
                   public_url=public.rstrip("/") if public else None, leeway_s=leeway,
                   resource_name=data.get("resource_name", "Unwind gateway"))

    @classmethod
    def load(cls, text_or_path: str) -> OAuthConfig:
        """From JSON text, or a JSON or YAML file's path."""
        data, where = read_settings(text_or_path, "UNWIND_OAUTH", "--oauth-config", OAuthConfigError)
        return cls.parse(data, where)

    @property
    def scopes_supported(self) -> list[str]:
        return sorted({g for grants in self.scopes.values() for g in grants})

    def permissions(self, granted: frozenset[str]) -> frozenset[str]:
        return frozenset(p for p, grants in self.scopes.items() if granted & set(grants))


def _url_ok(url: str) -> bool:
    parts = urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return True
    return parts.scheme == "http" and parts.hostname in ("127.0.0.1", "localhost", "::1")


def door_path(path: str) -> str:
    """The protected resource a request path belongs to: ``/mcp``, else the root (REST)."""
    return "/mcp" if path in ("/mcp", "/mcp/") or path.startswith("/mcp/") else ""


@dataclass
class _Keys:
    keys: dict[str, Any] = field(default_factory=dict)  # kid -> PyJWK
    fetched: float = float("-inf")


class OAuthTokens:
    """Validates the configured issuer's JWT access tokens; serves the resource metadata."""

    def __init__(self, config: OAuthConfig, *, ttl: float = 60.0, size: int = 10_000,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        import jwt  # PyJWT: imported only when OAuth is configured

        self.jwt = jwt
        self.config, self.clock, self.wall = config, clock, wall
        self._verified = TtlCache(ttl, size, clock)
        self._callers: dict[tuple[str, str], tuple[float, Caller]] = {}  # (token, resource)
        self._keys = _Keys()
        self._fetching: asyncio.Future[None] | None = None
        self._jwks_uri = config.jwks_uri
        self.fetches = 0

    # ---- what a client discovers ----

    def resource(self, scope: Mapping[str, Any]) -> str:
        return self.base(scope) + door_path(str(scope.get("path", "")))

    def base(self, scope: Mapping[str, Any]) -> str:
        if self.config.public_url:
            return self.config.public_url
        host = ""
        for k, v in scope.get("headers") or []:
            if k.lower() == b"host":
                host = v.decode("latin-1")
                break
        return f"{scope.get('scheme', 'http')}://{host}"

    def metadata_url(self, scope: Mapping[str, Any]) -> str:
        return self.base(scope) + WELL_KNOWN + door_path(str(scope.get("path", "")))

    def metadata(self, scope: Mapping[str, Any], door: str) -> dict[str, Any]:
        """RFC 9728 protected-resource metadata of ``door`` ("/mcp" or "")."""
        return {"resource": self.base(scope) + door,
                "authorization_servers": [self.config.issuer],
                "scopes_supported": self.config.scopes_supported,
                "bearer_methods_supported": ["header"],
                "resource_name": self.config.resource_name}

    def challenge(self, scope: Mapping[str, Any], error: str | None = None, why: str = "",
                  needed: tuple[str, ...] = ()) -> str:
        text = f"Bearer resource_metadata={quoted(self.metadata_url(scope))}"
        if error:
            text += f", error={quoted(error)}"
        if why:
            text += f", error_description={quoted(why[:200])}"
        if needed:
            text += f", scope={quoted(' '.join(needed))}"
        elif not error:
            text += f", scope={quoted(' '.join(self.config.scopes_supported))}"
        return text

    def insufficient(self, scope: Mapping[str, Any], caller: Caller, permission: str) -> str:
        """The 403 challenge for a permission the caller's token scopes do not grant: the
        scopes it has and those that would grant it, so a step-up asks for both."""
        needed = tuple(sorted(caller.granted)) + tuple(
            g for g in self.config.scopes.get(permission, ()) if g not in caller.granted)
        return self.challenge(scope, "insufficient_scope",
                              f"{permission} needs one of the scopes "
                              f"{' '.join(self.config.scopes.get(permission, ())) or '(none mapped)'}",
                              needed)

    # ---- validation ----

    def accepts(self, token: str) -> bool:
        return (peek_claims(token) or {}).get("iss") in (self.config.issuer,
                                                         self.config.issuer + "/")

    async def authenticate_for(self, token: str, scope: Mapping[str, Any]) -> Caller:
        key = hashlib.sha256(token.encode()).hexdigest()
        resource = self.resource(scope)
        known = self._callers.get((key, resource))  # the cached path: one lookup
        if known is not None and known[0] > self.wall():
            return known[1]
        claims = self._verified.get(key)
        if claims is None:
            claims = await self._verify(token)
            exp = float(claims["exp"])
            self._verified.put(key, claims, self.clock() + (exp - self.wall()))
        elif float(claims["exp"]) + self.config.leeway_s <= self.wall():
            raise self._invalid(scope, "the token has expired")
        self._check_audience(claims, scope)
        caller = self._caller(claims, scope)
        if len(self._callers) >= 10_000:
            self._callers.clear()
        self._callers[(key, resource)] = (min(float(claims["exp"]) + self.config.leeway_s,
                                              self.wall() + 60), caller)
        return caller

    def _caller(self, claims: Mapping[str, Any], scope: Mapping[str, Any]) -> Caller:
        subject = claims.get(self.config.actor_claim)
        if not isinstance(subject, str) or not subject:
            raise self._invalid(scope, f"the token has no {self.config.actor_claim!r} claim to "
                                "name its caller by")
        granted = _token_scopes(claims)
        return Caller(actor=self.config.actor_prefix + subject,
                      scopes=self.config.permissions(granted), kind="oauth", granted=granted)

    def _check_audience(self, claims: Mapping[str, Any], scope: Mapping[str, Any]) -> None:
        aud = claims.get("aud")
        given = {aud} if isinstance(aud, str) else set(aud) if isinstance(aud, list) else set()
        wanted = {self.resource(scope), *self.config.audiences}
        if not given & wanted:
            raise self._invalid(scope, f"the token's audience {sorted(given)!r} is not this "
                                f"resource ({self.resource(scope)}): ask the issuer for a "
                                "token with resource=" + self.resource(scope))

    async def _verify(self, token: str) -> dict[str, Any]:
        jwt = self.jwt
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise self._invalid({}, f"not a JWT: {exc}") from None
        alg, kid = header.get("alg"), header.get("kid")
        if alg not in ALGORITHMS:
            raise self._invalid({}, f"the token is signed with {alg!r}, which this gateway "
                                f"does not accept ({', '.join(ALGORITHMS)})")
        key = await self._key(kid if isinstance(kid, str) else None)
        try:
            claims: dict[str, Any] = jwt.decode(
                token, key=key, algorithms=[alg], issuer=self.config.issuer,
                leeway=self.config.leeway_s,
                options={"require": ["exp", "iss", "aud"], "verify_aud": False})
        except jwt.ExpiredSignatureError:
            raise self._invalid({}, "the token has expired") from None
        except jwt.PyJWTError as exc:
            raise self._invalid({}, f"the token does not verify: {exc}") from None
        if not isinstance(claims.get("exp"), int | float):
            raise self._invalid({}, "the token has no numeric exp")
        return claims

    async def _key(self, kid: str | None) -> Any:
        for attempt in range(2):
            keys = self._keys.keys
            found = keys.get(kid) if kid else (next(iter(keys.values())) if len(keys) == 1
                                                else None)
            if found is not None:
                return found.key
            if attempt == 0 and self.clock() - self._keys.fetched >= REFETCH_S:
                await self._refresh()
        raise self._invalid({}, f"the token's key {kid!r} is not one of the issuer's keys")

    async def _refresh(self) -> None:
        if self._fetching is None or self._fetching.done():
            self._fetching = asyncio.ensure_future(self._fetch())
        await asyncio.shield(self._fetching)

    async def _fetch(self) -> None:
        self.fetches += 1
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(
                    total=FETCH_TIMEOUT_S)) as http:
                if self._jwks_uri is None:
                    self._jwks_uri = await self._discover(http)
                document = await _get_json(http, self._jwks_uri)
        except AuthFailure:
            raise
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            raise AuthFailure(Refusal("auth_unavailable", f"the issuer's keys cannot be read "
                                      f"now ({exc or type(exc).__name__}), so nothing is "
                                      "called: try again"), cacheable=False) from None
        keys: dict[str, Any] = {}
        for i, jwk in enumerate(document.get("keys") or [] if isinstance(document, dict) else []):
            if not isinstance(jwk, dict) or jwk.get("use", "sig") != "sig":
                continue
            try:
                parsed = self.jwt.PyJWK(jwk)
            except (self.jwt.PyJWTError, ValueError, TypeError) as exc:
                log.warning("key %s of %s is skipped: %s", jwk.get("kid", i), self._jwks_uri, exc)
                continue
            keys[str(jwk.get("kid", f"#{i}"))] = parsed
        self._keys = _Keys(keys, self.clock())

    async def _discover(self, http: aiohttp.ClientSession) -> str:
        issuer = self.config.issuer
        parts = urlsplit(issuer)
        root = f"{parts.scheme}://{parts.netloc}"
        for url in (f"{issuer}/.well-known/openid-configuration",
                    f"{root}/.well-known/oauth-authorization-server{parts.path}"):
            try:
                document = await _get_json(http, url)
            except ValueError:
                continue
            jwks = document.get("jwks_uri") if isinstance(document, dict) else None
            if isinstance(jwks, str) and _url_ok(jwks):
                return jwks
        raise AuthFailure(Refusal("auth_unavailable", f"the issuer {issuer} publishes no "
                                  "jwks_uri in its metadata: give jwks_uri in the OAuth "
                                  "configuration"), cacheable=False)

    def _invalid(self, scope: Mapping[str, Any], why: str) -> AuthFailure:
        failure = unauthorized(f"the access token is refused: {why}")
        failure.challenge = self.challenge(scope, "invalid_token", why) if scope else None
        return failure


async def _get_json(http: aiohttp.ClientSession, url: str) -> Any:
    async with http.get(url, allow_redirects=False, headers={"Accept": "application/json"}) as r:
        if r.status != 200:
            raise ValueError(f"{url} answered {r.status}")
        raw = await r.content.read(MAX_DOCUMENT + 1)
        if len(raw) > MAX_DOCUMENT:
            raise ValueError(f"{url} answered more than {MAX_DOCUMENT // 1024} KiB")
        return json.loads(raw)


def _token_scopes(claims: Mapping[str, Any]) -> frozenset[str]:
    """``scope`` (space-separated, RFC 9068) or ``scp`` (a list, as some issuers send)."""
    scope = claims.get("scope")
    if isinstance(scope, str):
        return frozenset(scope.split())
    scp = claims.get("scp")
    if isinstance(scp, list):
        return frozenset(s for s in scp if isinstance(s, str))
    if isinstance(scp, str):
        return frozenset(scp.split())
    return frozenset()
