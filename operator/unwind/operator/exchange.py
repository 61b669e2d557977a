"""The injected gateway's own identity (issue 29, item 10): the operator trades the token
the gateway's pod was given for a token of ServiceAccount ``unwind-gateway``.

Before, the sidecar acted as the pod's ServiceAccount, the one the agent runs as, which held
the gateway's rights: whoever could run a pod of that ServiceAccount *without* the label got
a token that wrote that namespace's ledgers. Now the agent's ServiceAccount holds no Unwind
right at all. The webhook projects into the gateway's container (only) a token of the pod's
ServiceAccount whose audience is ``unwind-operator``, which the API server does not accept;
the gateway posts it to the operator (``POST /v1/gateway-token``, on a port of its own) and
gets back a token of ``unwind-gateway``, the only holder of the ``unwind-gateway`` role in
the namespace, from the TokenRequest API, valid for ten minutes (the shortest the API
server issues) and renewed by the gateway at half its life. It cannot be bound to the pod:
the API server binds to a pod only tokens of the pod's own ServiceAccount ("cannot bind
token for serviceaccount ... to pod running with different serviceaccount name"), so a
deleted pod's gateway token outlives it by at most ten minutes, and is never renewed: the
pod's own token dies with it. Before it answers, the operator checks:

- the token, by TokenReview with the audience ``unwind-operator``: authenticated, that
  audience, a ServiceAccount, bound to a pod (``authentication.kubernetes.io/pod-name`` and
  ``pod-uid``): a token from ``kubectl create token`` is refused;
- the pod, read now: the one the token was made for (its uid), labelled
  ``unwind.dev/inject=true``, holding the gateway and the injected annotation, and nothing
  in it (an ephemeral container added since, too) that reaches the gateway's volumes or
  holds a token of this audience (``isolation_problems``).

A pod without the label can still get a token of this audience for its ServiceAccount (any
pod can project one): it is refused here, and with the API server it is worth nothing.

``caller_of`` and ``pod_refusal`` are pure; ``TokenExchange`` makes the API calls.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp.web
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .inject import (
    CONTAINER,
    INJECT_LABEL,
    INJECTED_ANNOTATION,
    _is_gateway_volume,
    isolation_problems,
)
from .kube import _message
from .shared_gateway import NAME as GATEWAY_ACCOUNT
from .shared_gateway import identity

log = logging.getLogger("unwind.operator")

AUDIENCE = "unwind-operator"
PATH = "/v1/gateway-token"
LIFETIME_S = 600  # the TokenRequest API's shortest
ENSURE_EVERY_S = 300.0  # the identity's objects read again (and made again if deleted) this often
POD_NAME, POD_UID = "authentication.kubernetes.io/pod-name", "authentication.kubernetes.io/pod-uid"
SA_PREFIX = "system:serviceaccount:"


@dataclass(frozen=True)
class Exchange:
    """What the injected gateway is told (its env): where to trade its token, the CA of the
    operator's certificate, and the name that certificate is for when ``url`` is an address."""

    url: str
    ca_pem: str
    server_name: str = ""


class Denied(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Caller:
    namespace: str
    account: str
    pod: str
    pod_uid: str


def _one(extra: Mapping[str, Any], key: str) -> str:
    value = extra.get(key)
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        return value[0]
    return ""


def caller_of(status: Mapping[str, Any]) -> Caller:
    """Who the TokenReview's ``status`` says presented the token; ``Denied`` (401, 403) when
    it is not the projected token of a pod's ServiceAccount with the audience
    ``unwind-operator``."""
    if not status.get("authenticated"):
        why = str(status.get("error") or "not authenticated")
        raise Denied(401, f"the API server did not accept the token ({why[:200]}): send the token the "
                          f"injection projects for the gateway (audience {AUDIENCE})")
    if AUDIENCE not in (status.get("audiences") or []):
        raise Denied(401, f"the token is not for the audience {AUDIENCE}: send the gateway's projected token")
    user = status.get("user") if isinstance(status.get("user"), Mapping) else {}
    assert isinstance(user, Mapping)
    name = str(user.get("username") or "")
    parts = name[len(SA_PREFIX):].split(":") if name.startswith(SA_PREFIX) else []
    if len(parts) != 2 or not all(parts):
        raise Denied(403, f"the token names {name or 'nobody'}, not a ServiceAccount: only a gateway's pod "
                          "trades a token here")
    extra = user.get("extra") if isinstance(user.get("extra"), Mapping) else {}
    assert isinstance(extra, Mapping)
    pod, uid = _one(extra, POD_NAME), _one(extra, POD_UID)
    if not pod or not uid:
        raise Denied(403, "the token is not bound to a pod (one from `kubectl create token` or a Secret): only "
                          "the token projected into an injected gateway's container is traded")
    return Caller(parts[0], parts[1], pod, uid)


def pod_refusal(pod: Mapping[str, Any], caller: Caller, audiences: frozenset[str]) -> str | None:
    """Why ``pod`` (read now) gets no gateway token for ``caller``, or None.
    ``audiences``: those the API server accepts (a token for one in the pod is refused too)."""
    meta = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
    spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
    assert isinstance(meta, Mapping) and isinstance(spec, Mapping)
    where = f"pod {caller.namespace}/{caller.pod}"
    if meta.get("uid") != caller.pod_uid:
        return f"{where} is not the pod the token was made for (that one is gone)"
    account = str(spec.get("serviceAccountName") or "default")
    if account != caller.account:
        return f"{where} runs as ServiceAccount {account}, the token names {caller.account}"
    if (meta.get("labels") or {}).get(INJECT_LABEL) != "true":
        return f"{where} is not labelled {INJECT_LABEL}=true: only an injected gateway gets the gateway's token"
    if (meta.get("annotations") or {}).get(INJECTED_ANNOTATION) != CONTAINER:
        return f"{where} was not injected by the Unwind webhook (no {INJECTED_ANNOTATION} annotation)"
    kinds = ("initContainers", "containers")
    gateways = [c for kind in kinds for c in spec.get(kind) or []
                if isinstance(c, Mapping) and c.get("name") == CONTAINER]
    if len(gateways) != 1:
        return f"{where} holds {len(gateways)} containers named {CONTAINER}, not the one the webhook wrote"
    own = {**spec, **{kind: [c for c in spec.get(kind) or [] if not (isinstance(c, Mapping)
                                                                     and c.get("name") == CONTAINER)]
                      for kind in kinds},
           "volumes": [v for v in spec.get("volumes") or []
                       if not (isinstance(v, Mapping) and _is_gateway_volume(v.get("name")))]}
    problems = isolation_problems({**pod, "spec": own}, (), audiences | {AUDIENCE})
    if problems:
        return f"{where} lets its own containers reach the gateway's token: {'; '.join(problems)}"
    return None


@dataclass
class TokenExchange:
    """``POST /v1/gateway-token`` with ``Authorization: Bearer <the gateway's projected
    token>``: 200 and ``{token, expiresAt, serviceAccount}``; 401 for a token the API server
    does not accept for this audience, 403 for a pod that is not an injected gateway's, 503
    when the API server did not answer."""

    api: client.ApiClient
    audiences: frozenset[str]  # what the API server accepts: such a token in the pod is refused
    role_prefix: str = "unwind"  # the chart's fullname: ClusterRole <prefix>-gateway
    lifetime_s: int = LIFETIME_S

    def __post_init__(self) -> None:
        self._ensured: dict[str, float] = {}  # namespace -> when this process last saw its identity
        self.core: Any = client.CoreV1Api(self.api)
        self.rbac: Any = client.RbacAuthorizationV1Api(self.api)
        self.authn: Any = client.AuthenticationV1Api(self.api)

    def review(self, token: str) -> Caller:
        body = client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token, audiences=[AUDIENCE]))
        answer = json.loads(self.authn.create_token_review(body, _preload_content=False).data)
        return caller_of(answer.get("status") or {})

    def pod(self, caller: Caller) -> Mapping[str, Any]:
        try:
            raw = self.core.read_namespaced_pod(caller.pod, caller.namespace, _preload_content=False)
        except ApiException as exc:
            if exc.status == 404:
                raise Denied(403, f"pod {caller.namespace}/{caller.pod} does not exist (any more)") from None
            raise
        return dict(json.loads(raw.data))

    def ensure_identity(self, namespace: str) -> None:
        """ServiceAccount unwind-gateway and its RoleBinding, made when missing (the shared
        gateway's reconcile keeps the same two: ``shared_gateway.identity``). Read at most every
        ``ENSURE_EVERY_S`` per namespace: a renewal costs a TokenReview, a pod read and the
        TokenRequest."""
        if time.monotonic() - self._ensured.get(namespace, -ENSURE_EVERY_S) < ENSURE_EVERY_S:
            return
        for obj in identity(namespace, self.role_prefix):
            kind, name = obj["kind"], obj["metadata"]["name"]
            read, create = ((self.core.read_namespaced_service_account, self.core.create_namespaced_service_account)
                            if kind == "ServiceAccount" else
                            (self.rbac.read_namespaced_role_binding, self.rbac.create_namespaced_role_binding))
            try:
                read(name, namespace)
                continue
            except ApiException as exc:
                if exc.status != 404:
                    raise
            try:
                create(namespace, obj)
                log.info("namespace %s: gateway identity: created %s %s", namespace, kind, name)
            except ApiException as exc:
                if exc.status != 409:
                    raise
        self._ensured[namespace] = time.monotonic()

    def issue(self, caller: Caller) -> tuple[str, str]:
        """A token of unwind-gateway for the caller's gateway: (token, expiry RFC 3339)."""
        request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
            audiences=[], expiration_seconds=self.lifetime_s))
        answer = self.core.create_namespaced_service_account_token(GATEWAY_ACCOUNT, caller.namespace, request)
        expires = answer.status.expiration_timestamp
        when = expires.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if isinstance(expires, dt.datetime) \
            else str(expires)
        return str(answer.status.token), when

    def trade(self, token: str) -> dict[str, str]:
        caller = self.review(token)
        why = pod_refusal(self.pod(caller), caller, self.audiences)
        if why:
            raise Denied(403, why)
        self.ensure_identity(caller.namespace)
        try:
            issued, expires = self.issue(caller)
        except ApiException as exc:
            if exc.status != 404:
                raise
            self._ensured.pop(caller.namespace, None)  # deleted since: made again
            self.ensure_identity(caller.namespace)
            issued, expires = self.issue(caller)
        log.info("gateway token for pod %s/%s (ServiceAccount %s) until %s", caller.namespace, caller.pod,
                 caller.account, expires)
        return {"token": issued, "expiresAt": expires,
                "serviceAccount": f"{SA_PREFIX}{caller.namespace}:{GATEWAY_ACCOUNT}"}

    async def handle(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip() or len(token) > 16384:
            return _error(401, "send the gateway's projected token as Authorization: Bearer <token>")
        try:
            return aiohttp.web.json_response(await asyncio.to_thread(self.trade, token.strip()))
        except Denied as exc:
            log.warning("gateway token refused to %s: %s", request.remote, exc)
            return _error(exc.status, str(exc))
        except ApiException as exc:
            log.warning("gateway token for %s not issued: the API server answered %s %s: %s", request.remote,
                        exc.status, exc.reason, _message(exc))
            return _error(503, f"the API server answered {exc.status} {exc.reason}: {_message(exc)[:300]}; "
                               "try again")
        except Exception as exc:  # the API server unreachable: the gateway retries
            return _error(503, f"the operator could not reach the API server ({type(exc).__name__}); try again")


def _error(status: int, message: str) -> aiohttp.web.Response:
    headers = {"WWW-Authenticate": f'Bearer realm="{AUDIENCE}"'} if status == 401 else None
    return aiohttp.web.json_response({"error": message}, status=status, headers=headers)
