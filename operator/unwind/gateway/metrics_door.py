"""``/metrics`` on a port of its own (``--metrics-listen 0.0.0.0:9464``), for Prometheus to
scrape from outside the pod, with authentication.

Why a second port: the gateway's own port answers agents (and, beyond loopback, needs their
tokens); a scraper is another kind of caller. The metrics port is authenticated the way
Kubernetes components authenticate scrapers (kube-rbac-proxy does the same): the scraper's
bearer token is reviewed by the API server (TokenReview, its default audience: a
Prometheus ServiceAccount's own token), and the user it names must be allowed ``get`` on the
non-resource URL ``/metrics`` (SubjectAccessReview) — the ClusterRole Prometheus already
holds in most clusters. Answers are cached per token for 10 s. A metrics port beyond loopback
without the API server (local mode) is refused at start; on loopback it needs no token.

It is a small aiohttp server on the gateway's event loop: nothing else is imported for it.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from .auth.tokenreview import TtlCache
from .kube import KubeClient, KubeUnreachable

log = logging.getLogger("unwind.gateway")
REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"


class Scrapers:
    """Who may read the metrics: a token the API server accepts, of a user allowed
    ``get /metrics``."""

    def __init__(self, kube: KubeClient, ttl: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.kube = kube
        self._answers = TtlCache(ttl, 1000, clock)

    async def allowed(self, token: str) -> tuple[int, str]:
        key = hashlib.sha256(token.encode()).hexdigest()
        known = self._answers.get(key)
        if known is not None:
            return tuple(known)
        try:
            answer = await self._ask(token)
        except KubeUnreachable as exc:
            return 503, f"the scraper's token cannot be checked now: {exc}"
        self._answers.put(key, answer)
        return answer

    async def _ask(self, token: str) -> tuple[int, str]:
        status, review = await self.kube.request("POST", REVIEWS, {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": token}})
        result = (review or {}).get("status") or {} if status < 400 else {}
        if not result.get("authenticated"):
            return 401, "the token is not accepted by the API server"
        user = result.get("user") or {}
        status, access = await self.kube.request("POST", ACCESS, {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": user.get("username"), "groups": user.get("groups") or [],
                     "uid": user.get("uid"), "extra": user.get("extra") or {},
                     "nonResourceAttributes": {"path": "/metrics", "verb": "get"}}})
        if status < 400 and ((access or {}).get("status") or {}).get("allowed"):
            return 200, str(user.get("username"))
        return 403, f"{user.get('username')} may not get /metrics (a ClusterRole with " \
            "nonResourceURLs: [/metrics], verbs: [get] grants it)"


class MetricsDoor:
    def __init__(self, registry: CollectorRegistry, host: str, port: int,
                 scrapers: Scrapers | None) -> None:
        self.registry, self.host, self.port, self.scrapers = registry, host, port, scrapers
        self._runner: web.AppRunner | None = None

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.scrapers is not None:
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                return web.json_response({"error": {"code": "unauthorized", "message": "send "
                                          "Authorization: Bearer <the scraper's token>"}},
                                         status=401, headers={"WWW-Authenticate": "Bearer"})
            status, why = await self.scrapers.allowed(token.strip())
            if status != 200:
                code = {401: "unauthorized", 403: "permission_denied"}.get(status,
                                                                             "auth_unavailable")
                return web.json_response({"error": {"code": code, "message": why}},
                                         status=status)
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        log.info("metrics on %s:%d%s", self.host, self.port,
                 " (scrapers authenticated by the API server)" if self.scrapers else "")

    async def aclose(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
