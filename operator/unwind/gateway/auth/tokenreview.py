"""In-cluster agents: projected ServiceAccount tokens with the gateway's own audience, proved
by the API server's TokenReview.

Why TokenReview rather than checking the token's signature against the cluster's keys:
the API server also checks what the token is bound to, so the token of a deleted pod (or
of a deleted ServiceAccount) stops working as soon as its review does, not when it
expires. Each review is cached per token for ``ttl`` seconds (10 by default), so a replica
asks at most once per token per ten seconds, however many calls the token makes, and a
deleted pod's token is refused within that time. Concurrent calls with one token share one
review. A token the review refuses is remembered as refused for the same time (a bad token
does not make every call a round trip); an API server that cannot be asked is not
remembered: the call gets 503 and the next one asks again.

What a token must be: ``status.authenticated``, ``status.audiences`` containing the
gateway's audience (the API server checks the token's ``aud`` against the audiences asked
for), and a ServiceAccount of the gateway's namespace (``system:serviceaccount:NS:NAME``).
The actor is that ServiceAccount, exactly as the sidecar records it; the pod the token is
bound to rides along (``authentication.kubernetes.io/pod-name``). The scopes are the
ServiceAccount's ``unwind.dev/scopes`` annotation, read through the API (cached the same
time): never anything the caller says.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ...upstream.errors import Refusal
from ..kube import ApiError, KubeClient, KubeUnreachable
from . import AuthFailure, Caller, peek_claims, quoted, unauthorized

log = logging.getLogger("unwind.gateway.auth")
SCOPES_ANNOTATION = "unwind.dev/scopes"
DEFAULT_AUDIENCE = "unwind-gateway"
PREFIX = "system:serviceaccount:"
POD_NAME = "authentication.kubernetes.io/pod-name"


def parse_scopes(text: str | None) -> frozenset[str]:
    return frozenset(s.strip() for s in (text or "").split(",") if s.strip())


class TtlCache:
    """A bounded map whose entries expire: the oldest is dropped past ``size``."""

    def __init__(self, ttl: float, size: int, clock: Callable[[], float]) -> None:
        self.ttl, self.size, self.clock = ttl, size, clock
        self._items: OrderedDict[str, tuple[float, Any]] = OrderedDict()

    def get(self, key: str) -> Any | None:
        item = self._items.get(key)
        if item is None:
            return None
        if item[0] <= self.clock():
            del self._items[key]
            return None
        return item[1]

    def put(self, key: str, value: Any, until: float | None = None) -> None:
        expires = self.clock() + self.ttl
        self._items[key] = (min(expires, until) if until is not None else expires, value)
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)


class ServiceAccountTokens:
    """Authenticates ServiceAccount tokens by TokenReview (``kube`` is the gateway's own
    API client: its identity needs ``create`` on ``tokenreviews`` and ``get`` on the
    namespace's ``serviceaccounts``)."""

    def __init__(self, kube: KubeClient, namespace: str, audience: str = DEFAULT_AUDIENCE, *,
                 issuer: str | None = None, ttl: float = 10.0, size: int = 10_000,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.kube, self.namespace, self.audience, self.issuer = kube, namespace, audience, issuer
        self.clock, self.wall = clock, wall
        self._reviews = TtlCache(ttl, size, clock)
        self._scopes = TtlCache(ttl, 1000, clock)
        self._flying: dict[str, asyncio.Future[Caller]] = {}
        self.reviews = 0  # TokenReviews asked (for tests and the metrics)

    def accepts(self, token: str) -> bool:
        """A JWT whose (unverified) subject is a ServiceAccount, or of the configured issuer."""
        claims = peek_claims(token) or {}
        sub, iss = claims.get("sub"), claims.get("iss")
        if self.issuer is not None and iss == self.issuer:
            return True
        return isinstance(sub, str) and sub.startswith(PREFIX)

    def challenge(self, error: str | None = None, why: str = "") -> str:
        text = "Bearer realm=" + quoted(f"unwind-gateway {self.namespace}")
        if error:
            text += f", error={quoted(error)}"
            if why:
                text += f", error_description={quoted(why[:200])}"
        return text

    async def authenticate(self, token: str) -> Caller:
        key = hashlib.sha256(token.encode()).hexdigest()
        known = self._reviews.get(key)
        if isinstance(known, Caller):
            return known
        if isinstance(known, AuthFailure):
            raise known
        flying = self._flying.get(key)
        if flying is None:
            flying = self._flying[key] = asyncio.ensure_future(self._review(key, token))
            flying.add_done_callback(lambda _: self._flying.pop(key, None))
        return await asyncio.shield(flying)

    async def _review(self, key: str, token: str) -> Caller:
        try:
            caller = await self._ask(token)
        except AuthFailure as failure:
            if failure.cacheable:
                self._reviews.put(key, failure)
            raise
        exp = (peek_claims(token) or {}).get("exp")
        until = None
        if isinstance(exp, int | float):
            until = self.clock() + (float(exp) - self.wall())  # never past the token's expiry
        self._reviews.put(key, caller, until)
        return caller

    async def _ask(self, token: str) -> Caller:
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                "spec": {"token": token, "audiences": [self.audience]}}
        self.reviews += 1
        try:
            status, answer = await self.kube.request(
                "POST", "/apis/authentication.k8s.io/v1/tokenreviews", body)
        except KubeUnreachable as exc:
            raise self._unavailable(str(exc)) from None
        if status >= 400:
            message = answer.get("message", "") if isinstance(answer, dict) else ""
            raise self._unavailable(f"the API server answered the TokenReview with {status}: "
                                    f"{message}")
        review = (answer or {}).get("status") or {}
        if not review.get("authenticated"):
            why = str(review.get("error") or "the API server does not accept it")
            raise unauthorized(f"the ServiceAccount token is refused: {why[:300]} (is it the "
                               f"pod's projected token with audience {self.audience!r}, not "
                               "expired, and is its pod still there?)",
                               self.challenge("invalid_token", "token refused"))
        audiences = review.get("audiences")
        if not isinstance(audiences, list) or self.audience not in audiences:
            raise unauthorized(f"the ServiceAccount token is not for this gateway: its review "
                               f"names audiences {audiences!r}, not {self.audience!r}; mount "
                               f"a projected token with audience {self.audience}",
                               self.challenge("invalid_token", "wrong audience"))
        user = review.get("user") or {}
        username = str(user.get("username") or "")
        namespace, _, name = username.removeprefix(PREFIX).partition(":")
        if not username.startswith(PREFIX) or not name:
            raise AuthFailure(Refusal("permission_denied", f"{username!r} is not a "
                                      "ServiceAccount: this gateway takes ServiceAccount "
                                      "tokens of its namespace (or OAuth tokens, if set up)"))
        if namespace != self.namespace:
            raise AuthFailure(Refusal("permission_denied", f"ServiceAccount {namespace}/{name} "
                                      f"is of another namespace: this gateway serves "
                                      f"{self.namespace}'s tools and ledgers"))
        extra = user.get("extra") or {}
        pods = extra.get(POD_NAME) if isinstance(extra, dict) else None
        pod = str(pods[0]) if isinstance(pods, list) and pods else None
        return Caller(actor=username, scopes=await self._scopes_of(name), kind="serviceaccount",
                      pod=pod)

    async def _scopes_of(self, name: str) -> frozenset[str]:
        cached = self._scopes.get(name)
        if cached is not None:
            return frozenset(cached)
        path = f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{name}"
        try:
            sa = await self.kube.get(path, metadata_only=True)
        except (KubeUnreachable, ApiError) as exc:
            raise self._unavailable(f"cannot read ServiceAccount {name}'s scopes: {exc}") from None
        annotations = ((sa or {}).get("metadata") or {}).get("annotations") or {}
        scopes = parse_scopes(annotations.get(SCOPES_ANNOTATION))
        self._scopes.put(name, scopes)
        return scopes

    def _unavailable(self, why: str) -> AuthFailure:
        log.warning("cannot check a ServiceAccount token: %s", why)
        return AuthFailure(Refusal("auth_unavailable", f"the caller's token cannot be checked "
                                   f"now ({why}), so nothing is called: try again"),
                           cacheable=False)
