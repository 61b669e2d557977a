"""Who changed a ToolManifest's spec, who decided an Approval, who asked for a rollback
(an EffectLedger's spec.rollback): identity stamps.

The admission webhook writes the requester's username and groups (from the API server's
AdmissionReview, never from a field the client types) into annotations, together with a
*stamp*: an Ed25519 signature by the operator's key over the kind, namespace, a digest of
the spec and the identity. The operator counts an identity only when its stamp verifies.

Why a signature and not just "the webhook refuses forged annotations": the webhook only
sees what is written while it is installed and reachable. An object written before the
webhooks were installed, while they were removed, or restored from a backup could carry
any annotation; a stamp binds the identity to the exact spec it was given for, so a copied
or hand-written stamp never counts, and any spec change needs a fresh stamp.

A stamp is bound to one object too (``Bound``), so a stamp made for one object never
verifies on another, even one of the same name and spec: a stamp made when an object
changes names its uid; a stamp made when it is created (the API server gives it a uid only
after the mutating webhooks ran) names its name and the time it was made, and verifies
only on the object of that name created within ``CREATE_WINDOW`` of it. Stamps written
before stamps were bound (``unwind-stamp:v1``, no binding in the annotation) still count:
the webhook no longer makes any, and applying or approving again replaces them.

Pure code: the webhook stamps, the operator verifies; neither needs the other's state.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..manifest.canonical import canonical_json
from ..registry.signing import Signature, TrustStore

STAMP_PREFIX = b"unwind-stamp:v1:"  # unbound stamps, from before v2: verified, never made
BOUND_PREFIX = b"unwind-stamp:v2:"
CREATED = "created@"  # a stamp made at creation: "created@<unix seconds>;<key id>:<signature>"
UID = "uid;"  # a stamp made on a change: "uid;<key id>:<signature>"
# How far an object's creationTimestamp (the API server's clock) may lie from the time its
# creation was stamped (the operator's clock): the webhooks' time plus clock differences.
CREATE_WINDOW = dt.timedelta(minutes=5)


@dataclass(frozen=True)
class Identity:
    """A Kubernetes user as the API server authenticated it."""

    user: str
    groups: tuple[str, ...] = ()

    @classmethod
    def from_userinfo(cls, info: Mapping[str, Any] | None) -> Identity:
        info = info or {}
        groups = info.get("groups") or ()
        return cls(str(info.get("username") or ""), tuple(sorted(str(g) for g in groups)))

    def __str__(self) -> str:
        return self.user or "an unknown user"


@dataclass(frozen=True)
class StampKeys:
    """The three annotations one kind of object carries."""

    user: str
    groups: str
    stamp: str

    def all(self) -> tuple[str, str, str]:
        return (self.user, self.groups, self.stamp)


APPLIED = StampKeys("unwind.dev/applied-by", "unwind.dev/applied-by-groups", "unwind.dev/applied-by-stamp")
APPROVER = StampKeys("unwind.dev/approver", "unwind.dev/approver-groups", "unwind.dev/approver-stamp")
ROLLBACK_BY = StampKeys("unwind.dev/rollback-by", "unwind.dev/rollback-by-groups", "unwind.dev/rollback-by-stamp")
KEYS_OF_KIND = {"ToolManifest": APPLIED, "Approval": APPROVER, "EffectLedger": ROLLBACK_BY}

Signer = Callable[[bytes], Signature]


def spec_digest(spec: Any) -> str:
    """sha256 of the spec as the API server stores it (canonical JSON, keys sorted)."""
    try:
        return hashlib.sha256(canonical_json(spec)).hexdigest()
    except (TypeError, ValueError):  # NaN or a non-JSON value: nothing to bind a stamp to
        return ""


def rollback_stamped(ledger: str, rollback: Any) -> dict[str, Any]:
    """What a rollback request's stamp signs in place of a spec: the ledger's name and its
    spec.rollback (so it is neither copied to another ledger nor kept for another request)."""
    return {"ledger": ledger, "rollback": rollback}


@dataclass(frozen=True)
class Bound:
    """The object a stamp is for: its name and uid (a change), or its name and the time its
    creation was stamped (``uid`` empty: the API server has not given it one yet)."""

    name: str
    uid: str = ""
    at: int = 0  # unix seconds, for a stamp made at creation

    @classmethod
    def of(cls, obj: Mapping[str, Any] | None, now: dt.datetime | None = None) -> Bound:
        """The binding of a stamp made now for ``obj`` as the webhook sees it."""
        meta = (obj or {}).get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        uid = str(meta.get("uid") or "")
        at = 0 if uid else int((now or dt.datetime.now(dt.UTC)).timestamp())
        return cls(str(meta.get("name") or ""), uid, at)


def stamp_message(kind: str, namespace: str, spec: Any, who: Identity, bound: Bound | None = None) -> bytes:
    if bound is None:  # v1: what stamps signed before they were bound to their object
        return STAMP_PREFIX + canonical_json([kind, namespace, spec_digest(spec), who.user, list(who.groups)])
    return BOUND_PREFIX + canonical_json([kind, namespace, bound.name, bound.uid, bound.at, spec_digest(spec),
                                          who.user, list(who.groups)])


def stamp_annotations(kind: str, namespace: str, spec: Any, who: Identity, signer: Signer,
                      bound: Bound) -> dict[str, str]:
    keys = KEYS_OF_KIND[kind]
    sig = signer(stamp_message(kind, namespace, spec, who, bound))
    how = f"{CREATED}{bound.at};" if not bound.uid else UID
    return {keys.user: who.user, keys.groups: json.dumps(list(who.groups)),
            keys.stamp: f"{how}{sig.key_id}:{sig.value}"}


def _created(meta: Mapping[str, Any]) -> dt.datetime | None:
    try:
        when = dt.datetime.fromisoformat(str(meta.get("creationTimestamp") or "").replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def _binding(stamp: str, meta: Mapping[str, Any]) -> tuple[Bound | None, str, str]:
    """(the binding a stamp claims, checked against the object; the signature part; why not)."""
    name, uid = str(meta.get("name") or ""), str(meta.get("uid") or "")
    if stamp.startswith(UID):
        return Bound(name, uid), stamp[len(UID):], "" if uid else "the object has no uid"
    if stamp.startswith(CREATED):
        at_text, _, signature = stamp[len(CREATED):].partition(";")
        try:
            at = int(at_text)
        except ValueError:
            return None, signature, "the stamp's time is not a number"
        created = _created(meta)
        if created is None:
            return None, signature, "the object has no creationTimestamp"
        if abs(created - dt.datetime.fromtimestamp(at, dt.UTC)) > CREATE_WINDOW:
            return None, signature, (f"the stamp was made for an object created at {at} (unix), this one "
                                     f"was created at {created:%Y-%m-%dT%H:%M:%SZ}: it was copied")
        return Bound(name, "", at), signature, ""
    return None, stamp, ""  # v1, unbound


def stamped_identity(kind: str, namespace: str, spec: Any, annotations: Mapping[str, str],
                     trust: TrustStore, meta: Mapping[str, Any] | None = None) -> tuple[Identity | None, str]:
    """The identity the annotations of an object name, when their stamp verifies for that
    object (``meta``: its metadata, for the name, uid and creationTimestamp a bound stamp
    names); else None and why."""
    keys = KEYS_OF_KIND[kind]
    user, stamp = annotations.get(keys.user), annotations.get(keys.stamp)
    if not user and not stamp:
        return None, "no identity was recorded (it was written before the admission webhooks were installed)"
    try:
        groups = json.loads(annotations.get(keys.groups) or "[]")
    except ValueError:
        groups = None
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        return None, f"annotation {keys.groups} is not a JSON list of group names"
    who = Identity(str(user or ""), tuple(groups))
    bound, signed, why = _binding(str(stamp or ""), meta or {})
    key_id, _, value = signed.partition(":")
    problem = why or trust.check(stamp_message(kind, namespace, spec, who, bound),
                                 Signature(key_id, value) if value else None)
    if problem:
        return None, (f"the recorded identity {who.user!r} is not stamped by the Unwind admission "
                      f"webhook ({problem}) for this object: it was written by hand, copied from "
                      "another object, or the spec changed without the webhook; apply the object again")
    return who, ""
