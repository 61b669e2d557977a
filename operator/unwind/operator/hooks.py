"""kopf admission handlers: thin wrappers that turn an AdmissionReview into admission.py's
pure decisions and their refusals into denials kubectl prints.

The webhook configurations themselves are installed by the Helm chart (and so by
`unwind dev up`): ``Fail`` for ToolManifests and Approvals, so nothing unchecked gets in;
the operator's own namespace excluded. Each handler's id is its URL path.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from .. import API_GROUP, API_VERSION
from . import admission
from .admission import Refused, Request
from .certs import Lifetimes
from .identity import Identity
from .kube import APPROVALS, PLURAL, Kube

LEDGERS = "effectledgers"


@dataclass(frozen=True)
class WebhookConfig:
    addr: str = "0.0.0.0"
    port: int = 9443
    names: tuple[str, ...] = ("127.0.0.1",)  # what the serving certificate is for
    configurations: tuple[str, ...] = ("unwind",)  # webhook configurations whose caBundle we keep
    lifetimes: Lifetimes = field(default_factory=Lifetimes)

    @staticmethod
    def service_names(service: str, namespace: str) -> tuple[str, ...]:
        base = f"{service}.{namespace}"
        return (f"{base}.svc", service, base, f"{base}.svc.cluster.local")


def _request(operation: str, namespace: str, new: Any, old: Any, userinfo: Any) -> Request:
    return Request(operation, namespace or "", dict(new) if new is not None else {},
                   dict(old) if old is not None else None, Identity.from_userinfo(userinfo))


def _set_annotations(patch: Any, body: Any, values: dict[str, str]) -> None:
    if values:
        patch.metadata["annotations"] = {**(body.get("metadata", {}).get("annotations") or {}), **values}


def register_admission(registry: kopf.OperatorRegistry, kube: Kube, operator_namespace: str,
                       four_eyes: bool, state: dict[str, Any]) -> None:
    """Register the four handlers; ``state`` gains the signer and trust at start-up."""

    def ours(namespace: str | None) -> bool:
        # the configurations exclude it already; this guards a hand-made configuration
        return namespace == operator_namespace

    def refuse(exc: Refused) -> kopf.AdmissionError:
        return kopf.AdmissionError(str(exc), code=exc.code)

    @kopf.on.validate(API_GROUP, API_VERSION, PLURAL, id="validate-toolmanifest",  # type: ignore[arg-type]
                      operations=["CREATE", "UPDATE"], registry=registry)
    def validate_toolmanifest(operation: str, namespace: str, new: Any, old: Any, userinfo: Any, **_: Any) -> None:
        if ours(namespace):
            return
        try:
            admission.validate_toolmanifest(_request(operation, namespace, new, old, userinfo))
        except Refused as exc:
            raise refuse(exc) from None

    @kopf.on.mutate(API_GROUP, API_VERSION, PLURAL, id="stamp-toolmanifest",  # type: ignore[arg-type]
                    operations=["CREATE", "UPDATE"], registry=registry)
    def stamp_toolmanifest(operation: str, namespace: str, new: Any, old: Any, userinfo: Any,
                           patch: kopf.Patch, body: Any, **_: Any) -> None:
        if ours(namespace):
            return
        try:
            values = admission.mutate_toolmanifest(_request(operation, namespace, new, old, userinfo),
                                                   state["signer"])
        except Refused as exc:
            raise refuse(exc) from None
        _set_annotations(patch, body, values)

    @kopf.on.mutate(API_GROUP, API_VERSION, APPROVALS, id="stamp-approval",  # type: ignore[arg-type]
                    operations=["CREATE"], registry=registry)
    async def stamp_approval(operation: str, namespace: str, new: Any, userinfo: Any,
                             patch: kopf.Patch, body: Any, **_: Any) -> None:
        if ours(namespace):
            return
        req = _request(operation, namespace, new, None, userinfo)
        try:
            target = await asyncio.to_thread(_target, kube, namespace, req.new.get("spec"))
            result = admission.mutate_approval(req, target, state["signer"], state["trust"], four_eyes)
        except Refused as exc:
            raise refuse(exc) from None
        if result is not None:
            _set_annotations(patch, body, result.annotations)
            owners: Sequence[Any] = body.get("metadata", {}).get("ownerReferences") or []
            if not any(o.get("uid") == result.owner["uid"] for o in owners):
                patch.metadata["ownerReferences"] = [*owners, result.owner]

    @kopf.on.validate(API_GROUP, API_VERSION, APPROVALS, id="validate-approval",  # type: ignore[arg-type]
                      operations=["CREATE", "UPDATE"], registry=registry)
    def validate_approval(operation: str, namespace: str, new: Any, old: Any, userinfo: Any, **_: Any) -> None:
        if ours(namespace):
            return
        try:
            admission.validate_approval(_request(operation, namespace, new, old, userinfo), state["trust"])
        except Refused as exc:
            raise refuse(exc) from None


def _target(kube: Kube, namespace: str, spec: Any) -> dict[str, Any] | None:
    """The object an Approval names, or None when it does not exist (a malformed target is
    left for admission.py to describe)."""
    target = spec.get("target") if isinstance(spec, dict) else None
    if not isinstance(target, dict):
        return None
    plural, name = ((PLURAL, target.get("toolManifest")) if target.get("toolManifest")
                    else (LEDGERS, target.get("effectLedger")))
    if not isinstance(name, str) or not name:
        return None
    try:
        found: dict[str, Any] = kube.custom.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace,
                                                                         plural, name)
        return found
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def parse_lifetime(value: str) -> dt.timedelta:
    from ..manifest.durations import parse_duration

    return dt.timedelta(milliseconds=parse_duration(value))
