"""Who is calling: callers proved by a ServiceAccount token (TokenReview) or an OAuth access
token (a JWT of the configured issuer), on every door that is not loopback-only.

Why a package of its own: the enforcement path (enforce.py) knows an actor and its scopes,
and nothing of tokens. What this package establishes, a ``Caller``, reaches enforcement as
a per-caller view of the gateway (``Gateway.acting_as``): its actor is recorded in the
ledger, its scopes are checked, and a run belongs to it as before. A request that proves
no caller is answered here (401, or 503 when the proof cannot be checked) and recorded
nowhere: there is no actor to write it as.

The JOSE code (PyJWT) and the OAuth metadata are imported only when OAuth is configured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

from ...upstream.errors import Refusal


@dataclass(frozen=True)
class Caller:
    """An authenticated caller: the actor the ledger records, the Unwind permissions it
    holds, and where it came from."""

    actor: str
    scopes: frozenset[str]
    kind: Literal["serviceaccount", "oauth", "local"]
    pod: str | None = None  # a ServiceAccount token bound to a pod names it
    granted: frozenset[str] = field(default_factory=frozenset)  # an OAuth token's own scopes


class AuthFailure(Exception):
    """The request is answered here: ``refusal`` (401 unauthorized, 403 permission_denied,
    503 auth_unavailable) with ``challenge`` as its ``WWW-Authenticate`` header."""

    def __init__(self, refusal: Refusal, challenge: str | None = None, *,
                 cacheable: bool = True) -> None:
        super().__init__(refusal.message)
        self.refusal, self.challenge, self.cacheable = refusal, challenge, cacheable


class Authenticator(Protocol):
    """One kind of proof. ``accepts`` says from the token alone (its unverified issuer)
    whether this authenticator is the one to verify it."""

    def accepts(self, token: str) -> bool: ...

    async def authenticate(self, token: str) -> Caller: ...


def unauthorized(message: str, challenge: str | None = None) -> AuthFailure:
    return AuthFailure(Refusal("unauthorized", message), challenge)


def quoted(value: str) -> str:
    """A value as an RFC 9110 quoted-string (for WWW-Authenticate parameters)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


MAX_TOKEN_BYTES = 16 * 1024  # a bearer token larger than this is refused unread


def peek_claims(token: str) -> dict[str, object] | None:
    """A JWT's claims, **unverified**: only to choose which authenticator verifies it and to
    bound a cache entry by ``exp`` once it is verified. None when it is no JWT."""
    import base64
    import json

    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        raw = base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4))
        claims = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return claims if isinstance(claims, dict) else None
