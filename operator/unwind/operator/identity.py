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

Pure code: the webhook stamps, the operator verifies; neither needs the other's state.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..manifest.canonical import canonical_json
from ..registry.signing import Signature, TrustStore

STAMP_PREFIX = b"unwind-stamp:v1:"


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


def stamp_message(kind: str, namespace: str, spec: Any, who: Identity) -> bytes:
    return STAMP_PREFIX + canonical_json([kind, namespace, spec_digest(spec), who.user, list(who.groups)])


def stamp_annotations(kind: str, namespace: str, spec: Any, who: Identity, signer: Signer) -> dict[str, str]:
    keys = KEYS_OF_KIND[kind]
    sig = signer(stamp_message(kind, namespace, spec, who))
    return {keys.user: who.user, keys.groups: json.dumps(list(who.groups)),
            keys.stamp: f"{sig.key_id}:{sig.value}"}


def stamped_identity(kind: str, namespace: str, spec: Any, annotations: Mapping[str, str],
                     trust: TrustStore) -> tuple[Identity | None, str]:
    """The identity the annotations name, when their stamp verifies; else None and why."""
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
    key_id, _, value = (stamp or "").partition(":")
    who = Identity(str(user or ""), tuple(groups))
    problem = trust.check(stamp_message(kind, namespace, spec, who), Signature(key_id, value) if value else None)
    if problem:
        return None, (f"the recorded identity {who.user!r} is not stamped by the Unwind admission "
                      f"webhook ({problem}): it was written by hand, copied, or the spec changed "
                      "without the webhook; apply the object again")
    return who, ""
