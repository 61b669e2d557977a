"""The admission webhooks' handlers: thin wrappers that turn an AdmissionReview into
admission.py's pure decisions, and refusals into denials kubectl prints.

The webhook configurations themselves are installed by the Helm chart (and so by
`unwind dev up`): ``Fail`` for ToolManifests and Approvals, so nothing unchecked gets in,
and for the pods labelled ``unwind.dev/inject=true`` (the only pods the injection webhook
selects), so none starts without its gateway; the operator's own namespace excluded. Each handler's name is its URL path.

Why not kopf's admission dispatch: it costs about 1.5 ms per review in bookkeeping our
handlers do not need (memos, diffs, handler progress), against ~0.1 ms for the decisions
themselves, and the webhooks are on the path of every `kubectl apply`.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kubernetes.client.exceptions import ApiException

from .. import API_GROUP, API_VERSION
from ..registry.signing import TrustStore
from . import admission
from .admission import Refused, Request, listed
from .certs import Lifetimes
from .identity import Identity, Signer
from .inject import (
    AUDIENCES_ENV,
    INJECT_LABEL,
    WHAT_TO_DO,
    Sidecar,
    api_audiences,
    inject,
    isolation_problems,
)
from .injected import completed, foreign_gateway, isolation_of, named_gateways
from .kube import PLURAL, Kube

LEDGERS = "effectledgers"
log = logging.getLogger("unwind.operator")
Handler = Callable[[Request, Mapping[str, Any]], Awaitable[list[dict[str, Any]]]]
Reader = Callable[[str, str, str], "dict[str, Any] | None"]  # (namespace, plural, name) -> object
# (namespace, service account) -> (its unwind.dev/scopes, the Secrets the namespace's manifests name)
PodContext = Callable[[str, str], "tuple[str | None, set[str]]"]


@dataclass(frozen=True)
class WebhookConfig:
    addr: str = "0.0.0.0"
    port: int = 9443
    names: tuple[str, ...] = ("127.0.0.1",)  # what the serving certificate is for
    configurations: tuple[str, ...] = ("unwind",)  # webhook configurations whose caBundle we keep
    lifetimes: Lifetimes = field(default_factory=Lifetimes)
    service: str = ""  # the webhooks' Service (the chart's): the exchange is at its address
    exchange_port: int = 9444  # the gateways' token exchange (exchange.py); 0: none
    exchange_url: str = ""  # where gateways reach it, when not the Service's address
    role_prefix: str = "unwind"  # the chart's fullname: ClusterRole <prefix>-gateway

    @staticmethod
    def service_names(service: str, namespace: str) -> tuple[str, ...]:
        base = f"{service}.{namespace}"
        return (f"{base}.svc", service, base, f"{base}.svc.cluster.local")


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def annotation_patch(obj: Mapping[str, Any], values: Mapping[str, str]) -> list[dict[str, Any]]:
    """JSON patch operations that set these annotations on obj."""
    if not values:
        return []
    if not (obj.get("metadata") or {}).get("annotations"):
        return [{"op": "add", "path": "/metadata/annotations", "value": dict(values)}]
    return [{"op": "add", "path": f"/metadata/annotations/{_escape(k)}", "value": v} for k, v in values.items()]


def owner_patch(obj: Mapping[str, Any], owner: Mapping[str, Any]) -> list[dict[str, Any]]:
    owners = (obj.get("metadata") or {}).get("ownerReferences")
    if not owners:
        return [{"op": "add", "path": "/metadata/ownerReferences", "value": [dict(owner)]}]
    if any(isinstance(o, dict) and o.get("uid") == owner.get("uid") for o in owners):
        return []
    return [{"op": "add", "path": "/metadata/ownerReferences/-", "value": dict(owner)}]


@dataclass
class Admission:
    """The handlers, by path; ``signer`` and ``trust`` arrive when the key is loaded."""

    read: Reader  # gets an Approval's target (None: it does not exist)
    operator_namespace: str
    four_eyes: bool
    signer: Signer | None = None
    trust: TrustStore = field(default_factory=TrustStore)
    sidecar: Sidecar | None = None  # None: labelled pods are refused (no gateway to give them)
    pod_context: PodContext | None = None
    # what the API server accepts as its audience: a projected token for one is refused
    api_audiences: frozenset[str] = field(default_factory=lambda: operator_api_audiences())
    # where injected gateways trade their token (ExchangeAddress): None, they act as the pod's
    # ServiceAccount
    exchange: Callable[[], tuple[str, str, str]] | None = None

    def handlers(self) -> dict[str, Handler]:
        return {"validate-toolmanifest": self.validate_toolmanifest, "stamp-toolmanifest": self.stamp_toolmanifest,
                "stamp-approval": self.stamp_approval, "validate-approval": self.validate_approval,
                "stamp-effectledger": self.stamp_effectledger,
                "inject-gateway": self.inject_gateway}

    async def review(self, path: str, review: Mapping[str, Any]) -> dict[str, Any]:
        """An AdmissionReview in, its answer out; never raises for a malformed request."""
        request = review.get("request")
        request = request if isinstance(request, Mapping) else {}
        answer: dict[str, Any] = {"uid": str(request.get("uid") or ""), "allowed": True}
        handler = self.handlers().get(path)
        try:
            if handler is None:
                raise Refused(f"the Unwind webhook has no handler {path!r}: check the webhook "
                              "configuration's clientConfig path", 404)
            if self.signer is None:
                raise Refused("the Unwind operator is starting and cannot stamp identities yet; "
                              "try again in a few seconds", 503)
            req = _request(request)
            if req.namespace == self.operator_namespace:  # excluded by the configurations too
                return _wrap(review, answer)
            ops = await handler(req, request)
            if ops:
                answer["patchType"] = "JSONPatch"
                answer["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
        except Refused as exc:
            answer = {"uid": answer["uid"], "allowed": False, "status": {"code": exc.code, "message": str(exc)}}
        except Exception as exc:  # API trouble reading a target: refuse, say so, never crash
            message = (f"the Unwind webhook could not check this request ({type(exc).__name__}: {exc}); "
                       "try again")
            answer = {"uid": answer["uid"], "allowed": False, "status": {"code": 500, "message": message[:1000]}}
        return _wrap(review, answer)

    async def validate_toolmanifest(self, req: Request, raw: Mapping[str, Any]) -> list[dict[str, Any]]:
        admission.validate_toolmanifest(req)
        return []

    async def stamp_toolmanifest(self, req: Request, raw: Mapping[str, Any]) -> list[dict[str, Any]]:
        assert self.signer is not None
        req, named = _named(req)
        return named + annotation_patch(req.new, admission.mutate_toolmanifest(req, self.signer))

    async def stamp_approval(self, req: Request, raw: Mapping[str, Any]) -> list[dict[str, Any]]:
        assert self.signer is not None
        req, named = _named(req)
        target = await asyncio.to_thread(_target, self.read, req.namespace, req.new.get("spec"))
        result = admission.mutate_approval(req, target, self.signer, self.trust, self.four_eyes)
        if result is None:
            return named
        return named + annotation_patch(req.new, result.annotations) + owner_patch(req.new, result.owner)

    async def stamp_effectledger(self, req: Request, raw: Mapping[str, Any]) -> list[dict[str, Any]]:
        assert self.signer is not None
        return annotation_patch(req.new, admission.mutate_effectledger(req, self.signer))

    async def validate_approval(self, req: Request, raw: Mapping[str, Any]) -> list[dict[str, Any]]:
        admission.validate_approval(req, self.trust)
        return []

    async def inject_gateway(self, req: Request, raw: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Fails closed: the webhook is called only for labelled pods, and a labelled pod is a
        request to be governed, so it is never admitted without its gateway (an operator
        without a gateway image, an unreadable bundle, an API error: refused, saying why).
        It is refused too when its own spec would hand the agent what the gateway keeps."""
        if req.operation != "CREATE":
            return []
        if self.sidecar is None or self.pod_context is None:
            raise Refused(f"this pod is labelled {INJECT_LABEL}=true but the Unwind operator injects no "
                          "gateway (it was started without --gateway-image, the chart's gateway.image); "
                          f"set it, or {WHAT_TO_DO}", 503)
        spec = req.new.get("spec") if isinstance(req.new.get("spec"), Mapping) else {}
        account = str((spec or {}).get("serviceAccountName") or "default")
        sidecar = self.sidecar
        try:
            scopes, secrets = await asyncio.to_thread(self.pod_context, req.namespace, account)
            if self.exchange is not None:
                sidecar = replace(sidecar, exchange=await asyncio.to_thread(self.exchange))
        except Refused:
            raise
        except Exception as exc:
            raise Refused(f"the Unwind webhook could not read what this pod's gateway needs "
                          f"({type(exc).__name__}: {str(exc)[:300]}), and a pod labelled {INJECT_LABEL}=true "
                          "is not admitted without its gateway; try again", 503) from None
        # A gateway already there counts only as exactly what this webhook writes (a second
        # call for the same pod); the isolation check runs on every labelled pod.
        foreign = foreign_gateway(req.new, req.namespace, scopes, secrets, sidecar)
        if foreign:
            raise Refused(listed(foreign, "this pod asks for an Unwind gateway but brings its own; "
                                          f"{WHAT_TO_DO}:"), 400)
        ours = bool(named_gateways(spec or {}))
        problems = (isolation_of(req.new, req.namespace, scopes, secrets, sidecar, self.api_audiences)
                    if ours else isolation_problems(req.new, secrets, self.api_audiences))
        if problems:
            raise Refused(listed(problems, "this pod asks for an Unwind gateway but its spec would let the "
                                           f"agent around it; {WHAT_TO_DO}:"), 400)
        if ours:
            return completed(req.new)
        return inject(req.new, req.namespace, scopes, secrets, sidecar)


@dataclass
class ExchangeAddress:
    """What an injected gateway is told of the token exchange: (url, CA PEM, TLS name). The
    url is ``url`` when given (``--exchange-url``), else the webhooks' Service's cluster IP
    and port ``exchange`` (pods here may have no DNS; the TLS name is then the Service's DNS
    name, which the certificate is for), else the webhooks' own address (an operator run
    beside the API server, as the local control plane's tests run it)."""

    read_service: Callable[[str], Any]  # name -> V1Service in the operator's namespace
    ca_pem: Callable[[], str]
    config: WebhookConfig
    _found: str = ""

    def _url(self) -> str:
        c = self.config
        if c.exchange_url:
            return c.exchange_url.rstrip("/")
        if not c.service:
            host = c.addr if c.addr not in ("0.0.0.0", "::", "") else "127.0.0.1"
            return f"https://{host}:{c.exchange_port}"
        if not self._found:
            svc = self.read_service(c.service)
            ip = svc.spec.cluster_ip
            if not ip or ip == "None":
                raise Refused(f"Service {c.service} has no cluster IP, so gateways cannot reach the token "
                              "exchange; give the operator --exchange-url", 503)
            port = next((p.port for p in svc.spec.ports or [] if p.name == "exchange"), c.exchange_port)
            self._found = f"https://{ip}:{port}" if ":" not in ip else f"https://[{ip}]:{port}"
        return self._found

    def __call__(self) -> tuple[str, str, str]:
        ca = self.ca_pem()
        if not ca:
            raise Refused("the operator's certificate is not ready yet, so its gateways could not check the "
                          "token exchange; try again in a few seconds", 503)
        url, c = self._url(), self.config
        # the certificate is for the Service's names (WebhookConfig.service_names), not for
        # the address the gateway dials
        name = "" if not c.service else next(
            (n for n in c.names if n.startswith(f"{c.service}.") and n.endswith(".svc")), "")
        return url, ca, name


def _named(req: Request) -> tuple[Request, list[dict[str, Any]]]:
    """A created object with only ``generateName`` is named here, so its stamp can name it."""
    name = admission.generated_name(req)
    if name is None:
        return req, []
    meta = dict(req.new.get("metadata") or {})
    meta["name"] = name
    new = {**req.new, "metadata": meta}
    return replace(req, new=new), [{"op": "add", "path": "/metadata/name", "value": name}]


OWN_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


def operator_api_audiences(token_file: str = OWN_TOKEN) -> frozenset[str]:
    """The API server's audiences as the operator knows them: the defaults,
    ``$UNWIND_API_AUDIENCES``, and the ``aud``/``iss`` of its own token (in a pod)."""
    try:
        with open(token_file, encoding="utf-8") as f:
            token = f.read()
    except OSError:
        token = ""
    return api_audiences(os.environ.get(AUDIENCES_ENV, ""), token)


def _request(request: Mapping[str, Any]) -> Request:
    new, old = request.get("object"), request.get("oldObject")
    if request.get("operation") == "DELETE":
        new = new or old
    if not isinstance(new, Mapping):
        raise Refused("the AdmissionReview carries no object", 400)
    return Request(str(request.get("operation") or ""), str(request.get("namespace") or ""), new,
                   old if isinstance(old, Mapping) else None,
                   Identity.from_userinfo(request.get("userInfo") if isinstance(request.get("userInfo"), Mapping)
                                          else None))


def _wrap(review: Mapping[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": str(review.get("apiVersion") or "admission.k8s.io/v1"), "kind": "AdmissionReview",
            "response": answer}


def reader(kube: Kube) -> Reader:
    def read(namespace: str, plural: str, name: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = kube.custom.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace,
                                                                             plural, name)
            return found
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
    return read


def _target(read: Reader, namespace: str, spec: Any) -> dict[str, Any] | None:
    """The object an Approval names, or None when it does not exist (a malformed target is
    left for admission.py to describe)."""
    target = spec.get("target") if isinstance(spec, dict) else None
    if not isinstance(target, dict):
        return None
    plural, name = ((PLURAL, target.get("toolManifest")) if target.get("toolManifest")
                    else (LEDGERS, target.get("effectLedger")))
    if not isinstance(name, str) or not name:
        return None
    return read(namespace, plural, name)


def parse_lifetime(value: str) -> dt.timedelta:
    from ..manifest.durations import parse_duration

    return dt.timedelta(milliseconds=parse_duration(value))
