"""What the admission webhooks decide, as pure functions of an AdmissionReview's parts.

- ToolManifest, validating: the one validator's single-manifest rules and unknown fields,
  on create and whenever the spec changes. Set-level rules (references, cycles,
  duplicates) stay in status: a GitOps apply arrives in any order.
- ToolManifest, mutating: stamp who changed the spec (identity.py); refuse a client that
  writes the stamp annotations itself.
- Approval, mutating (create): check the shape and the target, apply four-eyes to
  ToolManifest approvals, stamp the approver, and make the target the owner (so the
  Approval is garbage-collected with it).
- Approval, validating: an Approval is a record; nothing of it changes after creation.

Every refusal is a ``Refused`` whose message names the field and says what to do; the
kopf handlers in handlers.py turn it into the AdmissionReview's denial.
"""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from .. import API_GROUP, API_VERSION
from ..api.resources import ApprovalSpec
from ..manifest.canonical import checksum
from ..manifest.issues import issues_from_validation_error
from ..manifest.validate import validate_manifest
from ..registry.signing import TrustStore
from .identity import (
    APPLIED,
    APPROVER,
    KEYS_OF_KIND,
    ROLLBACK_BY,
    Bound,
    Identity,
    Signer,
    rollback_stamped,
    stamp_annotations,
    stamped_identity,
)

MAX_LISTED = 30


class Refused(Exception):
    """The request must be refused; ``code`` is the HTTP status kubectl shows."""

    def __init__(self, message: str, code: int = 422) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Request:
    """The parts of an AdmissionReview request these decisions read."""

    operation: str  # CREATE | UPDATE | DELETE | CONNECT
    namespace: str
    new: Mapping[str, Any]
    old: Mapping[str, Any] | None
    who: Identity

    @property
    def name(self) -> str:
        return str(_meta(self.new).get("name") or _meta(self.new).get("generateName") or "")


def _meta(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    meta = (obj or {}).get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _annotations(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    ann = _meta(obj).get("annotations")
    return ann if isinstance(ann, Mapping) else {}


def listed(lines: list[str], heading: str) -> str:
    shown = lines[:MAX_LISTED]
    more = [f"- ... and {len(lines) - MAX_LISTED} more"] if len(lines) > MAX_LISTED else []
    return "\n".join([heading, *(f"- {line}" for line in shown), *more])


def bound(req: Request, now: dt.datetime | None = None) -> Bound:
    """The object a stamp made for this request is bound to: on a create, its name and the
    time (the API server gives it a uid only after the mutating webhooks); on a change, its
    name and uid, which every real update carries."""
    meta = _meta(req.new)
    name = str(meta.get("name") or "")
    if req.operation == "CREATE":
        if not name:
            raise Refused("metadata.name: the Unwind webhook names the object before stamping it; "
                          "give it a name (or generateName)", 400)
        return Bound(name, "", int((now or dt.datetime.now(dt.UTC)).timestamp()))
    uid = str(meta.get("uid") or _meta(req.old).get("uid") or "")
    if not uid:
        raise Refused("metadata.uid: an update of an object names its uid; this request names none", 400)
    return Bound(name, uid)


NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # the API server's own for generateName


def generated_name(req: Request) -> str | None:
    """The name the webhook gives a created object that has only ``generateName`` (the API
    server would name it only after the webhooks, too late for a stamp to name it)."""
    meta = _meta(req.new)
    prefix = meta.get("generateName")
    if req.operation != "CREATE" or meta.get("name") or not isinstance(prefix, str) or not prefix:
        return None
    return prefix[:58] + "".join(secrets.choice(NAME_ALPHABET) for _ in range(5))


def _refuse_forged(req: Request, kind: str) -> None:
    """The stamp annotations are written only by the webhook: a client may leave them out
    or send back exactly what is stored, never a value of its own."""
    stored = _annotations(req.old) if req.old is not None else {}
    sent = _annotations(req.new)
    for key in KEYS_OF_KIND[kind].all():
        if key in sent and sent[key] != stored.get(key):
            raise Refused(f"metadata.annotations[{key}]: is written by the Unwind admission webhook from "
                          "the identity the API server authenticated; remove it from your "
                          f"{kind} (you are {req.who.user!r})", 403)


# ---- ToolManifest ---------------------------------------------------------------------

def _spec_changed(req: Request) -> bool:
    return req.old is None or req.operation == "CREATE" or req.new.get("spec") != req.old.get("spec")


def validate_toolmanifest(req: Request) -> None:
    """Single-manifest rules on create and on every spec change (metadata-only updates, such
    as the operator's finalizer patches, pass: the spec they carry was checked before)."""
    if req.operation not in ("CREATE", "UPDATE") or not _spec_changed(req):
        return
    spec = req.new.get("spec")
    manifest, issues = validate_manifest(spec)
    mcp = manifest.upstream.mcp if manifest is not None and manifest.upstream is not None else None
    if mcp is not None and mcp.command is not None:
        raise Refused(f"spec.upstream.mcp.command: ToolManifest {req.name} names a command to run; a "
                      "gateway in a cluster never starts processes a manifest names (only local mode, "
                      "unwind gateway --manifests, does): run the MCP server as a Service or a "
                      "sidecar and give upstream.mcp.url")
    if issues:
        tool = spec.get("tool") if isinstance(spec, Mapping) else None
        lines = [f"spec.{i.path}: {i.message}" if i.path else f"spec: {i.message}" for i in issues]
        noun = "error" if len(lines) == 1 else "errors"
        raise Refused(listed(lines, f"ToolManifest {req.name}{f' ({tool})' if tool else ''} is invalid, "
                                     f"{len(lines)} {noun}; fix the spec and apply it again:"))


def mutate_toolmanifest(req: Request, signer: Signer) -> dict[str, str]:
    """The annotations to write: a fresh stamp when the spec changed, else the stored one
    (a client that drops the annotations, e.g. `kubectl replace`, does not erase them)."""
    if req.operation not in ("CREATE", "UPDATE"):
        return {}
    _refuse_forged(req, "ToolManifest")
    if _spec_changed(req):
        return stamp_annotations("ToolManifest", req.namespace, req.new.get("spec"), req.who, signer, bound(req))
    stored, sent = _annotations(req.old), _annotations(req.new)
    return {k: str(stored[k]) for k in APPLIED.all() if k in stored and k not in sent}


# ---- EffectLedger ---------------------------------------------------------------------


def mutate_effectledger(req: Request, signer: Signer) -> dict[str, str]:
    """Stamp who asked for a rollback: a fresh stamp when an update changes
    ``spec.rollback``, else the stored one kept. The stamp covers the ledger's name and its
    ``spec.rollback`` (:func:`rollback_stamped`), so it is neither copied to another
    ledger nor kept for another request. The gateway's writes (creates, status) never come
    here. What the ledger records (``spec.run``, ``spec.page``, ``spec.owner``) never changes: someone
    allowed to ask for a rollback may not make a run's ledger look like another's."""
    if req.operation != "UPDATE":
        return {}
    _refuse_forged(req, "EffectLedger")
    new, old = req.new.get("spec"), (req.old or {}).get("spec")
    for field, default in (("run", None), ("page", 1), ("owner", None)):
        before = old.get(field, default) if isinstance(old, Mapping) else default
        after = new.get(field, default) if isinstance(new, Mapping) else default
        if before != after:
            raise Refused(f"spec.{field}: is written by the gateway when it creates the ledger and never "
                          f"changes (it is {before!r}); to undo the run, set spec.rollback "
                          "(`kubectl unwind rollback`)", 422)
    rollback = new.get("rollback") if isinstance(new, Mapping) else None
    if rollback and (not isinstance(old, Mapping) or old.get("rollback") != rollback):
        return stamp_annotations("EffectLedger", req.namespace, rollback_stamped(req.name, rollback),
                                 req.who, signer, bound(req))
    stored, sent = _annotations(req.old), _annotations(req.new)
    return {k: str(stored[k]) for k in ROLLBACK_BY.all() if k in stored and k not in sent}


# ---- Approval -------------------------------------------------------------------------

def parse_approval_spec(spec: Any) -> ApprovalSpec:
    try:
        return ApprovalSpec.model_validate(spec)
    except ValidationError as exc:
        issues = issues_from_validation_error(exc, spec, None, ApprovalSpec)
        lines = [f"spec.{i.path}: {i.message}" if i.path else f"spec: {i.message}" for i in issues]
        raise Refused(listed(lines, "the Approval is invalid; fix it and create it again:")) from None


@dataclass(frozen=True)
class ApprovalPatch:
    annotations: dict[str, str]
    owner: dict[str, Any]  # the ownerReference to the target


def mutate_approval(req: Request, target: Mapping[str, Any] | None, signer: Signer,
                    trust: TrustStore, four_eyes: bool) -> ApprovalPatch | None:
    """Check a new Approval against its target (read by the caller: the ToolManifest or
    EffectLedger it names, or None when it does not exist) and stamp the approver."""
    if req.operation != "CREATE":
        return None
    _refuse_forged(req, "Approval")
    spec = parse_approval_spec(req.new.get("spec"))
    t = spec.target
    kind, name = ("ToolManifest", t.toolManifest) if t.toolManifest else ("EffectLedger", t.effectLedger)
    if target is None:
        raise Refused(f"spec.target: {kind} {name!r} does not exist in namespace {req.namespace}: "
                      "an Approval names an object of its own namespace", 404)
    if _meta(target).get("deletionTimestamp"):
        raise Refused(f"spec.target: {kind} {name!r} is being deleted: there is nothing left to decide")
    if kind == "ToolManifest":
        _check_manifest_target(req, spec, target, trust, four_eyes)
    meta = _meta(target)
    owner = {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": kind, "name": str(meta.get("name")),
             "uid": str(meta.get("uid")), "blockOwnerDeletion": False}
    annotations = stamp_annotations("Approval", req.namespace, req.new.get("spec"), req.who, signer, bound(req))
    return ApprovalPatch(annotations, owner)


def _check_manifest_target(req: Request, spec: ApprovalSpec, target: Mapping[str, Any],
                           trust: TrustStore, four_eyes: bool) -> None:
    name = spec.target.toolManifest
    model, issues = validate_manifest(target.get("spec"))
    if model is None or issues:
        raise Refused(f"spec.target: ToolManifest {name!r} is invalid (see its Valid condition): "
                      "fix it before deciding on it")
    current = checksum(model)
    if spec.target.checksum != current:
        raise Refused(f"spec.target.checksum: {spec.target.checksum} is not the current version of "
                      f"ToolManifest {name!r}, which is {current}; decide on what is there now "
                      f"(kubectl unwind {spec.decision} tm/{name} fills it in)", 409)
    if four_eyes and spec.decision == "approve":
        author, _ = stamped_identity("ToolManifest", req.namespace, target.get("spec"),
                                     _annotations(target), trust, _meta(target))
        if author is not None and author.user == req.who.user:
            raise Refused(f"four-eyes: you ({req.who.user}) last changed the spec of ToolManifest "
                          f"{name!r}; someone else must approve it", 403)


def validate_approval(req: Request, trust: TrustStore) -> None:
    """An Approval never changes after creation (labels and owner references excepted,
    which record nothing of the decision); on create the stamp must be ours."""
    if req.operation == "UPDATE":
        old = req.old or {}
        if req.new.get("spec") != old.get("spec"):
            raise Refused("spec: an Approval is a record and cannot be changed after creation; "
                          "create a new Approval (a deny is final)", 403)
        stored, sent = _annotations(old), _annotations(req.new)
        for key in APPROVER.all():
            if sent.get(key) != stored.get(key):
                raise Refused(f"metadata.annotations[{key}]: the recorded approver cannot be changed", 403)
    elif req.operation == "CREATE":
        # the API server has given the object its uid and creationTimestamp by now
        who, why = stamped_identity("Approval", req.namespace, req.new.get("spec"), _annotations(req.new), trust,
                                    _meta(req.new))
        if who is None or who.user != req.who.user:
            raise Refused("the approver was not stamped by the Unwind mutating webhook "
                          f"({why or 'the identity differs from the requester'}): check that the "
                          "MutatingWebhookConfiguration is installed", 403)
