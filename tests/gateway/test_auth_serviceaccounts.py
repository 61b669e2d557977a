"""ServiceAccount tokens proved by TokenReview: what is accepted, what is refused, and how
often the API server is asked (a fake API client here; tests/cluster/test_shared_gateway.py
runs the real API server's TokenReview)."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest

from unwind.gateway.auth import AuthFailure
from unwind.gateway.auth.tokenreview import ServiceAccountTokens
from unwind.gateway.kube import KubeUnreachable

NS = "payments"


def sa_token(name: str = "agent", namespace: str = NS, exp: float = 4e9) -> str:
    claims = {"sub": f"system:serviceaccount:{namespace}:{name}", "exp": exp,
              "aud": ["unwind-gateway"]}
    body = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    return f"eyJhbGciOiJSUzI1NiJ9.{body}.c2ln"


class FakeApi:
    """Answers TokenReviews from ``reviews`` (token -> status) and ServiceAccounts' scopes."""

    def __init__(self) -> None:
        self.reviews: dict[str, dict[str, Any]] = {}
        self.scopes = {"agent": "repo:read,repo:write"}
        self.asked: list[str] = []
        self.down = False
        self.delay = 0.0

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> tuple[int, Any]:
        assert method == "POST" and path.endswith("/tokenreviews")
        if self.down:
            raise KubeUnreachable("connection refused")
        self.asked.append(body["spec"]["token"])
        await asyncio.sleep(self.delay)
        assert body["spec"]["audiences"] == ["unwind-gateway"]
        return 201, {"status": self.reviews.get(body["spec"]["token"], {"authenticated": False,
                                                                       "error": "invalid"})}

    async def get(self, path: str, **_: Any) -> Any:
        name = path.rsplit("/", 1)[1]
        return {"metadata": {"annotations": {"unwind.dev/scopes": self.scopes.get(name, "")}}}


def accepted(token: str, user: str = f"system:serviceaccount:{NS}:agent",
             audiences: list[str] | None = None, pod: str | None = "agent-7f9c") -> dict[str, Any]:
    extra = {"authentication.kubernetes.io/pod-name": [pod]} if pod else {}
    return {"authenticated": True, "audiences": audiences or ["unwind-gateway"],
            "user": {"username": user, "extra": extra}}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def tokens(api: FakeApi, clock: Clock | None = None) -> ServiceAccountTokens:
    clock = clock or Clock()
    return ServiceAccountTokens(api, NS, clock=clock, wall=lambda: 1.7e9 + clock.now)  # type: ignore[arg-type]


async def test_a_reviewed_token_names_its_serviceaccount_pod_and_the_serviceaccounts_scopes() -> None:
    api, token = FakeApi(), sa_token()
    api.reviews[token] = accepted(token)
    caller = await tokens(api).authenticate(token)
    assert (caller.actor, caller.pod, caller.kind) == (
        f"system:serviceaccount:{NS}:agent", "agent-7f9c", "serviceaccount")
    assert caller.scopes == {"repo:read", "repo:write"}


async def test_one_review_per_token_per_ttl_however_many_calls_and_concurrent_calls_share_it() -> None:
    api, token, clock = FakeApi(), sa_token(), Clock()
    api.reviews[token] = accepted(token)
    api.delay = 0.05
    sa = tokens(api, clock)
    await asyncio.gather(*(sa.authenticate(token) for _ in range(50)))
    for _ in range(100):
        await sa.authenticate(token)
    assert len(api.asked) == 1
    clock.now += 10.5
    await sa.authenticate(token)
    assert len(api.asked) == 2


async def test_a_deleted_pods_token_is_refused_once_its_cached_review_expires() -> None:
    api, token, clock = FakeApi(), sa_token(), Clock()
    api.reviews[token] = accepted(token)
    sa = tokens(api, clock)
    await sa.authenticate(token)
    api.reviews[token] = {"authenticated": False, "error": "pod agent-7f9c not found"}
    clock.now += 5
    await sa.authenticate(token)  # within the TTL the answer stands
    clock.now += 6
    with pytest.raises(AuthFailure) as refused:
        await sa.authenticate(token)
    assert refused.value.refusal.status == 401 and "not found" in refused.value.refusal.message


@pytest.mark.parametrize(("review", "status", "words"), [
    ({"authenticated": True, "audiences": ["https://kubernetes.default.svc"],
      "user": {"username": f"system:serviceaccount:{NS}:agent"}}, 401, "not for this gateway"),
    ({"authenticated": True, "audiences": ["unwind-gateway"],
      "user": {"username": "system:serviceaccount:other:agent"}}, 403, "another namespace"),
    ({"authenticated": True, "audiences": ["unwind-gateway"],
      "user": {"username": "alice"}}, 403, "not a ServiceAccount"),
    ({"authenticated": False, "error": "token has expired"}, 401, "expired"),
])
async def test_a_token_the_gateway_must_not_take_is_refused_naming_why(
        review: dict[str, Any], status: int, words: str) -> None:
    api, token = FakeApi(), sa_token()
    api.reviews[token] = review
    with pytest.raises(AuthFailure) as refused:
        await tokens(api).authenticate(token)
    assert refused.value.refusal.status == status and words in refused.value.refusal.message


async def test_an_api_server_that_cannot_be_asked_is_503_and_not_remembered() -> None:
    api, token = FakeApi(), sa_token()
    api.reviews[token] = accepted(token)
    api.down = True
    sa = tokens(api)
    with pytest.raises(AuthFailure) as refused:
        await sa.authenticate(token)
    assert refused.value.refusal.status == 503 and refused.value.refusal.code == "auth_unavailable"
    api.down = False
    assert (await sa.authenticate(token)).actor.endswith(":agent")


async def test_a_cached_answer_never_outlives_the_tokens_own_expiry() -> None:
    api, clock = FakeApi(), Clock()
    token = sa_token(exp=1.7e9 + clock.now + 2)  # expires in 2 s
    api.reviews[token] = accepted(token)
    sa = tokens(api, clock)
    await sa.authenticate(token)
    clock.now += 3
    api.reviews[token] = {"authenticated": False, "error": "token has expired"}
    with pytest.raises(AuthFailure):
        await sa.authenticate(token)
    assert len(api.asked) == 2
