"""The reconcile's data: what the operator gathers about a namespace, what it plans, and
the state of one manifest while its plan is made. Plain values, no logic beyond naming."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..bundle import BundleData
from ..manifest.issues import Issue
from ..manifest.model import ToolManifest
from ..registry.signing import Signature, TrustStore
from .approval import Decision, Verdict
from .identity import Identity


class Reason:
    """Condition reasons (CamelCase constants, documented in docs/operator.md)."""

    VALID = "ValidationPassed"
    INVALID = "ValidationFailed"
    SET_INVALID = "SetValidationFailed"
    DUPLICATE = "DuplicateTool"
    TRUSTED = "TrustedApplier"
    APPROVED = "Approved"
    AWAITING = "AwaitingApproval"
    DENIED = "Denied"
    DRAFT = "Draft"
    SIGNED = "Signed"
    NO_KEY = "NoSigningKey"
    NOT_ENFORCEABLE = "NotEnforceable"
    PUBLISHED = "Published"
    LAST_GOOD = "LastGoodVersionPublished"
    LAST_APPROVED = "LastApprovedVersionPublished"
    NOT_PUBLISHED = "NotPublished"
    READY = "Ready"
    DRAFT_RECORDED = "DraftRecorded"
    DELETION_BLOCKED = "DeletionBlocked"
    REVISION_IGNORED = "RevisionIgnored"
    WRITE_FAILED = "WriteFailed"
    REVISION_RESTORED = "RevisionRestored"


@dataclass(frozen=True)
class ManifestObject:
    name: str
    uid: str
    generation: int
    spec: Any
    status: dict[str, Any]
    annotations: dict[str, str] = field(default_factory=dict)
    created: str = ""
    deleting: bool = False
    finalizers: tuple[str, ...] = ()
    resource_version: str = ""


@dataclass(frozen=True)
class Revision:
    name: str
    owner: str  # the ToolManifest's name
    owner_uid: str
    version: int
    checksum: str
    data: dict[str, Any]
    author: str = ""  # who applied the spec that made this version (stamped identity)


@dataclass(frozen=True)
class Event:
    name: str  # the object's name
    type: str  # Normal | Warning
    reason: str
    message: str
    kind: str = "ToolManifest"  # or ConfigMap, for the bundle


@dataclass(frozen=True)
class Settings:
    trusted_appliers: tuple[str, ...] = ()
    four_eyes: bool = True
    # The operator's own public keys (current and retired): identity stamps and the current
    # bundle count only when they verify with one of these. None counts nothing.
    trust: TrustStore | None = None


@dataclass
class Plan:
    new_revisions: list[Revision] = field(default_factory=list)
    statuses: dict[str, dict[str, Any]] = field(default_factory=dict)  # only changed ones
    bundle: BundleData | None = None  # None: the current bundle is already right
    events: list[Event] = field(default_factory=list)
    published: int = 0
    finalizers: dict[str, tuple[str, list[str]]] = field(default_factory=dict)  # name -> (rv, list)
    signed_by: str | None = None  # the key the namespace's bundle is signed with once written


Signer = Callable[[bytes], Signature] | None


def revision_name(manifest_name: str, digest: str) -> str:
    """``<manifest>-<12 hex of the checksum>``, always a valid object name: a name too long
    for the suffix is cut, its end stripped of ``.``/``-`` and a hash of the whole added."""
    suffix = "-" + digest.removeprefix("sha256:")[:12]
    if len(manifest_name) + len(suffix) <= 253:
        return manifest_name + suffix
    whole = hashlib.sha256(manifest_name.encode()).hexdigest()[:8]
    return manifest_name[:253 - len(suffix) - 9].rstrip(".-") + "-" + whole + suffix


@dataclass
class State:
    obj: ManifestObject
    model: ToolManifest | None = None  # the current spec, when valid alone
    issues: list[Issue] = field(default_factory=list)
    version: int | None = None
    digest: str | None = None
    author: Identity | None = None  # who last changed the spec (stamped), if known
    author_problem: str = ""
    verdict: Verdict = field(default_factory=lambda: Verdict("none"))
    approved: bool = False  # the current version may be enforced
    decisions: list[Decision] = field(default_factory=list)  # stamped Approvals naming this object
    four_eyes: bool = True
    chosen: ToolManifest | None = None  # what goes to the bundle: current or last approved
    chosen_version: int | None = None
    chosen_digest: str | None = None
    chosen_lifecycle: str = "approved"
    set_reason: str = ""

    @property
    def waiting(self) -> bool:
        """Valid, asks to be enforced, and is not (yet) approved."""
        return self.model is not None and not self.issues and not self.approved \
            and self.model.lifecycle != "draft"

    @property
    def current_chosen(self) -> bool:
        return self.chosen is not None and self.chosen is self.model


